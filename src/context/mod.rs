//! kiln's context binary: compiled graphs plus their weights in one file, so
//! that a later session loads them instead of compiling (ORT's EPContext).
//!
//! ORT-free: `ep`/`ffi` decide where the bytes live (an EPContext node
//! attribute or a file next to the model) and hand them over as a
//! [`Storage`](crate::plan::Storage). The format is described field by field
//! in `docs/context-format.md`:
//!
//! - a 64-byte header ([`header`]): magic, version, section offsets and an
//!   xxh3-128 checksum;
//! - prost-encoded metadata ([`proto`]): kiln version, target, weight table,
//!   graphs, each a compiled program or (format 2) a shape-generic graph;
//! - the weights, each 64-byte aligned and stored once per file.
//!
//! [`ContextBinary::parse`] checks all of it, so a corrupt or hostile file
//! gives an `InvalidGraph` error, never a panic or an out-of-bounds read.

mod compat;
mod convert;
mod convert_index;
// Pools and resize (issue #13).
mod convert_norm;
mod convert_pool;
mod generic;
mod header;
mod inspect;
mod peek;
pub mod proto;
mod reader;
mod writer;

#[cfg(test)]
mod generic_tests;
#[cfg(test)]
mod props;
#[cfg(test)]
mod proto_doc;
#[cfg(test)]
mod tests;

pub use compat::{check_compatibility, compatibility_info, Compatibility};
pub use generic::MAX_RANK;
pub use inspect::{inspect, GraphSummary, Inspection};
pub use peek::{peek, peek_checksum, Peek};
pub use reader::{ContextBinary, StoredGraph};
pub use writer::ContextBuilder;

use crate::plan::Program;

/// Fixes the checksum of a (possibly mutated) context binary in place so the
/// parser behind it is reached; `false` if the header's sections do not fit
/// the bytes. For fuzzing and property tests only.
#[doc(hidden)]
pub fn recompute_checksum(file: &mut [u8]) -> bool {
    header::recompute_checksum(file)
}

/// First 8 bytes of every kiln context binary.
pub const MAGIC: [u8; 8] = *b"KILNCTX\0";
/// The format version this kiln writes.
pub const FORMAT_VERSION: u32 = 13;
/// The oldest format version this kiln reads.
pub const MIN_READ_VERSION: u32 = 1;
/// This kiln's version, recorded in every binary it writes.
pub const KILN_VERSION: &str = env!("CARGO_PKG_VERSION");

/// What [`ContextBuilder::write_to`] wrote.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WriteStats {
    pub graphs: usize,
    /// Distinct weights stored.
    pub weights: usize,
    /// Weight bytes the graphs use, counting shared weights once per graph.
    pub weight_bytes_referenced: u64,
    /// Weight bytes stored, each distinct weight once.
    pub weight_bytes_stored: u64,
    pub file_bytes: u64,
    /// The header's checksum: identifies the file's contents.
    pub checksum: u128,
}

/// One line about a compiled program, e.g. for an EPContext node's notes:
/// `target x86_64-avx2; ops Add x1, Relu x1; 2 steps; arena 16 bytes; 1 constant(s) of 8 bytes`.
pub fn describe_program(p: &Program) -> String {
    format!(
        "target {}; ops {}; {} steps; arena {} bytes; {} constant(s) of {} bytes",
        p.target(),
        p.op_summary(),
        p.num_steps(),
        p.arena_bytes(),
        p.constants().len(),
        p.constant_bytes()
    )
}
