//! kiln's EPContext node, in one place: its schema (op, domain, attribute
//! names, types and defaults: `schema`), the compiled ONNX models that carry
//! it (which node names which binary, the checksum stamp: `models`), loading
//! the programs it points at (`reader`) and generating it with its binary
//! (`writer`). The context binary itself is `crate::context`'s.
//!
//! It sees the session through [`Session`], not `KilnEp`: the EP uses this
//! module, never the other way round.

pub mod models;
pub mod names;
pub mod reader;
pub mod schema;
pub mod writer;

pub use reader::{is_ep_context, source_of};

use std::sync::atomic::AtomicBool;

use parking_lot::Mutex;

use super::options::SessionConfig;
use crate::ffi::logger::Logger;
use crate::target::Target;

/// What the reader and the writer need of a session (borrowed from the EP).
pub struct Session<'a> {
    pub config: &'a SessionConfig,
    pub logger: &'a Logger,
    /// The target this session compiles for.
    pub target: Target,
    /// The best target the host runs.
    pub host: Target,
    /// Context binaries this session opened (each read once).
    pub binaries: &'a Mutex<reader::LoadedBinaries>,
    /// Context binaries written but not yet in place.
    pub context_files: &'a writer::ContextFiles,
    /// Set once Compile ran.
    pub compiled: &'a AtomicBool,
}
