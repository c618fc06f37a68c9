//! The leaf of kiln: element types, dimensions and shapes, aligned and
//! mapped storage, weights. It imports nothing of kiln but `crate::error`,
//! so every other module (ir, compiler, plan, kernels, context, ffi) can use
//! it without making a cycle; `tests/layering.rs` enforces that.

pub mod dim;
mod dtype;
mod inline_vec;
mod shape;
mod storage;

pub use dim::{broadcast_dims, numel, Dim};
pub use dtype::{onnx_type_name, DType};
pub use inline_vec::InlineVec;
pub use shape::{broadcast_shapes, DimsDisplay, ShapeDisplay};
pub use storage::{AlignedBytes, HugePageBytes, Storage, Weight, STORAGE_ALIGN};
