//! The context binary's metadata, as protobuf messages (hand-written prost
//! derives; `docs/context-format.md` has the same schema in `.proto` syntax).
//!
//! Tags are the format: never reuse or renumber one. Enum value 0 means
//! "unspecified" and is always refused, so a missing field cannot pass as
//! a real op.

/// Everything but the weights' bytes.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Metadata {
    /// Version of the kiln that wrote the file (`CARGO_PKG_VERSION`).
    #[prost(string, tag = "1")]
    pub kiln_version: String,
    /// Target name, e.g. `x86_64-avx2`; every graph is compiled for it.
    #[prost(string, tag = "2")]
    pub target: String,
    #[prost(message, repeated, tag = "3")]
    pub weights: Vec<WeightInfo>,
    #[prost(message, repeated, tag = "4")]
    pub graphs: Vec<GraphInfo>,
}

/// One stored weight. Identical weights are stored once per file.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WeightInfo {
    /// Byte offset within the data region (a multiple of 64).
    #[prost(uint64, tag = "1")]
    pub offset: u64,
    #[prost(uint64, tag = "2")]
    pub byte_length: u64,
    /// ONNX `TensorProto.DataType` code (1 = float, the only one today).
    #[prost(int32, tag = "3")]
    pub dtype: i32,
    #[prost(uint64, repeated, tag = "4")]
    pub shape: Vec<u64>,
    /// xxh3-128 of the weight's bytes, little-endian (16 bytes).
    #[prost(bytes = "vec", tag = "5")]
    pub content_hash: Vec<u8>,
}

/// One compiled graph (an EPContext node's subgraph).
#[derive(Clone, PartialEq, prost::Message)]
pub struct GraphInfo {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(message, repeated, tag = "2")]
    pub inputs: Vec<TensorInfo>,
    #[prost(message, repeated, tag = "3")]
    pub outputs: Vec<TensorInfo>,
    /// `Constant(i)` of the program is weight `weight_ids[i]` of the file.
    #[prost(uint32, repeated, tag = "4")]
    pub weight_ids: Vec<u32>,
    #[prost(message, optional, tag = "5")]
    pub program: Option<ProgramInfo>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorInfo {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(int32, tag = "2")]
    pub dtype: i32,
    #[prost(uint64, repeated, tag = "3")]
    pub shape: Vec<u64>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ProgramInfo {
    /// Scratch arena size in elements.
    #[prost(uint64, tag = "1")]
    pub arena_len: u64,
    #[prost(message, repeated, tag = "2")]
    pub steps: Vec<StepInfo>,
    #[prost(message, repeated, tag = "3")]
    pub op_counts: Vec<OpCount>,
}

/// Live nodes of one ONNX op in the source graph (for summaries).
#[derive(Clone, PartialEq, prost::Message)]
pub struct OpCount {
    /// ONNX op type, e.g. `Add`.
    #[prost(string, tag = "1")]
    pub op: String,
    #[prost(uint64, tag = "2")]
    pub count: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct StepInfo {
    #[prost(oneof = "step_info::Kind", tags = "1, 2, 3")]
    pub kind: Option<step_info::Kind>,
}

pub mod step_info {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Kind {
        #[prost(message, tag = "1")]
        Unary(super::UnaryStep),
        #[prost(message, tag = "2")]
        Binary(super::BinaryStep),
        #[prost(message, tag = "3")]
        Copy(super::CopyStep),
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct UnaryStep {
    #[prost(enumeration = "UnaryOpKind", tag = "1")]
    pub op: i32,
    #[prost(message, optional, tag = "2")]
    pub src: Option<BufInfo>,
    #[prost(message, optional, tag = "3")]
    pub dst: Option<BufInfo>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct BinaryStep {
    #[prost(enumeration = "BinaryOpKind", tag = "1")]
    pub op: i32,
    #[prost(message, optional, tag = "2")]
    pub layout: Option<LayoutInfo>,
    #[prost(message, optional, tag = "3")]
    pub a: Option<BufInfo>,
    #[prost(message, optional, tag = "4")]
    pub b: Option<BufInfo>,
    #[prost(message, optional, tag = "5")]
    pub dst: Option<BufInfo>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CopyStep {
    #[prost(message, optional, tag = "1")]
    pub src: Option<BufInfo>,
    #[prost(message, optional, tag = "2")]
    pub dst: Option<BufInfo>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum UnaryOpKind {
    Unspecified = 0,
    Relu = 1,
    Sigmoid = 2,
    Tanh = 3,
    Neg = 4,
    Abs = 5,
    Sqrt = 6,
    Exp = 7,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum BinaryOpKind {
    Unspecified = 0,
    Add = 1,
    Sub = 2,
    Mul = 3,
    Div = 4,
}

/// Where a step reads or writes (`plan::BufRef`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct BufInfo {
    #[prost(oneof = "buf_info::Kind", tags = "1, 2, 3, 4")]
    pub kind: Option<buf_info::Kind>,
}

pub mod buf_info {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Kind {
        #[prost(uint64, tag = "1")]
        Input(u64),
        #[prost(uint64, tag = "2")]
        Constant(u64),
        #[prost(uint64, tag = "3")]
        Output(u64),
        #[prost(message, tag = "4")]
        Scratch(super::ScratchRange),
    }
}

/// `len` elements of the arena from `offset`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ScratchRange {
    #[prost(uint64, tag = "1")]
    pub offset: u64,
    #[prost(uint64, tag = "2")]
    pub len: u64,
}

/// A binary step's broadcast layout (`kernels::Layout`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct LayoutInfo {
    #[prost(oneof = "layout_info::Kind", tags = "1, 2, 3, 4, 5, 6")]
    pub kind: Option<layout_info::Kind>,
}

pub mod layout_info {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Kind {
        #[prost(message, tag = "1")]
        Same(super::Empty),
        #[prost(message, tag = "2")]
        ScalarA(super::Empty),
        #[prost(message, tag = "3")]
        ScalarB(super::Empty),
        /// Row length.
        #[prost(uint64, tag = "4")]
        RowA(u64),
        #[prost(uint64, tag = "5")]
        RowB(u64),
        #[prost(message, tag = "6")]
        Strided(super::StridedLayout),
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Empty {}

#[derive(Clone, PartialEq, prost::Message)]
pub struct StridedLayout {
    #[prost(uint64, repeated, tag = "1")]
    pub dims: Vec<u64>,
    #[prost(uint64, repeated, tag = "2")]
    pub a_strides: Vec<u64>,
    #[prost(uint64, repeated, tag = "3")]
    pub b_strides: Vec<u64>,
}
