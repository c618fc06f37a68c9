//! Shape-generic partitions: what Compile keeps of a partition whose graph
//! has symbolic dims, so that one compiled model serves every input shape.
//!
//! A [`GenericGraph`] holds the partition as ORT described it (with its
//! symbolic dims), the constants it reads, and its GEMM weights packed once
//! for the target. A concrete [`Program`](crate::plan::Program) is built from
//! it for each new input shape signature at run time (see `ep::compile`),
//! reusing the packed weights.

use crate::ir::{DType, GraphDesc};
use crate::plan::Weight;
use crate::target::Target;

/// A constant initializer the partition reads, by its ONNX name.
#[derive(Clone, Debug)]
pub struct NamedConstant {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// Row-major bytes in `dtype`.
    pub data: Weight,
}

/// A constant packed once as a GEMM B operand (`kernels::gemm::PackedB`
/// for `target`): `source` names the [`NamedConstant`] it packs, `trans_b`
/// whether that constant is `[n, k]` rather than `[k, n]`.
#[derive(Clone, Debug)]
pub struct PackedConstant {
    pub source: String,
    pub trans_b: bool,
    pub k: usize,
    pub n: usize,
    pub data: Weight,
}

/// A partition compiled for every input shape its graph accepts.
#[derive(Clone, Debug)]
pub struct GenericGraph {
    /// The partition (topological nodes, value types with symbolic dims and
    /// their `dim_params`, inputs and outputs in the fused node's order).
    pub desc: GraphDesc,
    pub constants: Vec<NamedConstant>,
    pub packed: Vec<PackedConstant>,
    pub target: Target,
}
