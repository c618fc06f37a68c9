//! kiln's EPContext node, in one place: its schema (op, domain, attribute
//! names, types and defaults: `schema`), the compiled ONNX models that carry
//! it (which node names which binary, the checksum stamp: `models`), loading
//! the programs it points at (`reader`) and generating it with its binary
//! (`writer`). The context binary itself is `crate::context`'s.

pub mod models;
pub mod reader;
pub mod schema;
pub mod writer;

pub use reader::{is_ep_context, source_of};
