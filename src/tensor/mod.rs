//! The leaf of kiln: element types, dimensions and shapes, aligned and
//! mapped storage, weights. Imports nothing of kiln but `crate::error`, so
//! every other module (ir, compiler, plan, kernels, context, ffi) can use it
//! without creating a cycle; `tests/layering.rs` enforces that.

pub mod dim;

pub use dim::{broadcast_dims, numel, Dim};
