//! The op registry: one entry per ONNX op family, naming the op types it
//! handles and the function that imports them.
//!
//! An import function is also the op's shape inference and its support
//! check: it reads the node's attributes and inputs through the
//! [`Importer`], rejects what kiln cannot run exactly with a reason, and
//! emits IR ops whose output types `ir::infer` computes. GetCapability and
//! Compile run it over probe sizes for unknown dims (`check_support`), and
//! a shape-generic partition runs it again with the real dims, so all three
//! agree by construction.
//!
//! Adding an op: write its import function in the family's file and list
//! its name in that file's `OPS`; a new family file also gets one line in
//! [`REGISTRY`]. `SUPPORTED_OPS` (the `disabled_ops` option) follows.

mod activation;
mod attrs;
// Normalisation and selection ops (issue #13).
mod channel_norm;
// Transposed convolution (issue #13).
mod conv_transpose;
mod elementwise;
mod index;
mod logic;
mod math;
mod matmul;
mod movement;
mod norm;
mod recurrent;
mod reduce;
mod select;
mod shape;
// Pools and resize (issue #13).
mod pool;
mod resize;
// Shared by the convolution and pool families of issue #13.
#[allow(dead_code)]
mod spatial;
// Convolution (issue #13).
mod conv;

use std::sync::LazyLock;

use super::desc::NodeDesc;
use super::import::{Importer, Why};

/// Imports one node whose first output is `out` (present: the importer
/// checks that before dispatching).
pub(super) type ImportFn = fn(&mut Importer<'_>, &NodeDesc, &str) -> Result<(), Why>;

/// One registry entry: the ONNX op types (default domain) one import
/// function handles.
pub(super) struct OpFamily {
    pub names: &'static [&'static str],
    pub import: ImportFn,
    /// Whether outputs after the first may be read (Split's parts,
    /// Dropout's mask); other ops' extra outputs make the node unsupported.
    pub multi_output: bool,
    /// Whether every output, the first included, may be absent (LSTM, GRU).
    pub optional_outputs: bool,
}

impl OpFamily {
    const fn new(names: &'static [&'static str], import: ImportFn) -> Self {
        OpFamily {
            names,
            import,
            multi_output: false,
            optional_outputs: false,
        }
    }

    const fn multi_output(mut self) -> Self {
        self.multi_output = true;
        self
    }

    const fn optional_outputs(mut self) -> Self {
        self.optional_outputs = true;
        self
    }
}

/// Every op kiln imports: one line per family file.
static REGISTRY: &[&[OpFamily]] = &[
    elementwise::OPS,
    matmul::OPS,
    norm::OPS,
    reduce::OPS,
    shape::OPS,
    movement::OPS,
    logic::OPS,
    // Shape and indexing ops (issue #12).
    index::OPS,
    recurrent::OPS,
    // Elementwise math of issue #12.
    math::OPS,
    // Convolution (issue #13).
    conv::OPS,
    // Activations and Sum (issue #13).
    activation::OPS,
    // Pools and resize (issue #13).
    pool::OPS,
    resize::OPS,
    // Normalisation and selection ops (issue #13).
    channel_norm::OPS,
    select::OPS,
    // Transposed convolution (issue #13).
    conv_transpose::OPS,
];

fn families() -> impl Iterator<Item = &'static OpFamily> {
    REGISTRY.iter().flat_map(|file| file.iter())
}

/// The registry entry that imports ONNX op `op_type` (default domain).
pub(super) fn lookup(op_type: &str) -> Option<&'static OpFamily> {
    families().find(|f| f.names.contains(&op_type))
}

/// The ONNX op types (default domain) kiln may claim, sorted; the
/// `disabled_ops` option takes these names. Derived from [`REGISTRY`], so
/// it cannot disagree with what the importer dispatches.
pub static SUPPORTED_OPS: LazyLock<Vec<&'static str>> = LazyLock::new(|| {
    let mut names: Vec<&str> = families().flat_map(|f| f.names.iter().copied()).collect();
    names.sort_unstable();
    names
});

/// The error for an op type a family's function was not written for (a
/// name listed in `OPS` without its match arm; the registry test catches it).
fn not_implemented(op_type: &str) -> Why {
    format!("kiln does not implement {op_type}")
}

#[cfg(test)]
mod tests;
