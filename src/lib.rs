//! kiln: an ONNX Runtime plugin execution provider that compiles the
//! subgraphs it claims for a CPU target and runs them.
//!
//! Data flows one way: ORT graph → [`ir`] → [`compiler`] passes → a
//! [`plan`] → [`kernels`] at run time. Only [`ffi`] touches ORT (and holds
//! every `unsafe`); [`ep`] is the glue between ORT's callbacks and the
//! ORT-free modules.
#![deny(unsafe_code)]
#![deny(unsafe_op_in_unsafe_fn)]

#[macro_use]
pub mod error;
pub mod compiler;
pub mod context;
pub mod ep;
#[allow(unsafe_code)]
pub mod ffi;
#[doc(hidden)]
pub mod fuzzing;
pub mod ir;
pub mod kernels;
pub mod plan;
pub mod stats;
pub mod target;
pub mod tensor;
