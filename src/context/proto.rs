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
    /// File names of the compiled models (`_ctx.onnx`, in the binary's
    /// folder) this binary was written for. A writer replaces an existing
    /// binary only if it was written for the model being written.
    #[prost(string, repeated, tag = "5")]
    pub context_models: Vec<String>,
}

/// One stored weight. Identical weights are stored once per file.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WeightInfo {
    /// Byte offset within the data region (a multiple of 64).
    #[prost(uint64, tag = "1")]
    pub offset: u64,
    #[prost(uint64, tag = "2")]
    pub byte_length: u64,
    /// ONNX `TensorProto.DataType` code: 1 float, 6 int32, 7 int64, 9 bool, 10 float16.
    #[prost(int32, tag = "3")]
    pub dtype: i32,
    #[prost(uint64, repeated, tag = "4")]
    pub shape: Vec<u64>,
    /// xxh3-128 of the weight's bytes, little-endian (16 bytes).
    #[prost(bytes = "vec", tag = "5")]
    pub content_hash: Vec<u8>,
    /// Set when the bytes are a GEMM B operand packed for the file's target.
    #[prost(message, optional, tag = "6")]
    pub gemm_packed: Option<GemmPacking>,
}

/// A `[k, n]` f32 weight in the target's packed GEMM layout.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GemmPacking {
    #[prost(uint64, tag = "1")]
    pub k: u64,
    #[prost(uint64, tag = "2")]
    pub n: u64,
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
    /// A static partition's compiled program; exactly one of `program` and `generic`.
    #[prost(message, optional, tag = "5")]
    pub program: Option<ProgramInfo>,
    /// A shape-generic partition (format 2); `inputs`, `outputs` and
    /// `weight_ids` are then empty (the graph names its own).
    #[prost(message, optional, tag = "6")]
    pub generic: Option<GenericInfo>,
}

/// A shape-generic partition (`compiler::generic::GenericGraph`): the graph
/// as ORT described it, with symbolic dims, and its constants and packed
/// GEMM weights (weights of the file's weight table).
#[derive(Clone, PartialEq, prost::Message)]
pub struct GenericInfo {
    /// Topological order.
    #[prost(message, repeated, tag = "1")]
    pub nodes: Vec<NodeInfo>,
    /// Every value's type, sorted by name.
    #[prost(message, repeated, tag = "2")]
    pub values: Vec<ValueInfo>,
    #[prost(string, repeated, tag = "3")]
    pub inputs: Vec<String>,
    #[prost(string, repeated, tag = "4")]
    pub outputs: Vec<String>,
    #[prost(message, repeated, tag = "5")]
    pub constants: Vec<NamedWeight>,
    #[prost(message, repeated, tag = "6")]
    pub packed: Vec<PackedWeight>,
    /// Compiled with the `winograd=off` option: specialisations keep the
    /// direct convolution. Absent (false) before; readers that predate it
    /// ignore it and use Winograd where it pays.
    #[prost(bool, tag = "7")]
    pub no_winograd: bool,
}

/// An ONNX node (`ir::NodeDesc`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct NodeInfo {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(string, tag = "2")]
    pub domain: String,
    #[prost(string, tag = "3")]
    pub op_type: String,
    #[prost(int32, tag = "4")]
    pub since_version: i32,
    /// `""` = an omitted optional input.
    #[prost(string, repeated, tag = "5")]
    pub inputs: Vec<String>,
    #[prost(string, repeated, tag = "6")]
    pub outputs: Vec<String>,
    /// Sorted by name, each name once.
    #[prost(message, repeated, tag = "7")]
    pub attrs: Vec<AttrInfo>,
}

/// A node attribute (`ir::AttrValue`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct AttrInfo {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(oneof = "attr_info::Value", tags = "2, 3, 4, 5, 6, 7, 8, 9")]
    pub value: Option<attr_info::Value>,
}

pub mod attr_info {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Value {
        #[prost(sint64, tag = "2")]
        Int(i64),
        #[prost(message, tag = "3")]
        Ints(super::Ints),
        #[prost(float, tag = "4")]
        Float(f32),
        #[prost(message, tag = "5")]
        Floats(super::Floats),
        #[prost(string, tag = "6")]
        String(String),
        #[prost(message, tag = "7")]
        Strings(super::Strings),
        #[prost(message, tag = "8")]
        Tensor(super::TensorValueInfo),
        /// An attribute kind kiln does not read, described.
        #[prost(string, tag = "9")]
        Unsupported(String),
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Ints {
    #[prost(sint64, repeated, tag = "1")]
    pub values: Vec<i64>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Floats {
    #[prost(float, repeated, tag = "1")]
    pub values: Vec<f32>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Strings {
    #[prost(string, repeated, tag = "1")]
    pub values: Vec<String>,
}

/// A tensor attribute (`ir::TensorValue`), inline: they are small.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TensorValueInfo {
    /// ONNX `TensorProto.DataType` of fixed size.
    #[prost(int32, tag = "1")]
    pub elem_type: i32,
    #[prost(uint64, repeated, tag = "2")]
    pub shape: Vec<u64>,
    /// Row-major little-endian bytes: element count * element size.
    #[prost(bytes = "vec", tag = "3")]
    pub data: Vec<u8>,
}

/// A value's type as ORT inferred it (`ir::ValueDesc`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ValueInfo {
    #[prost(string, tag = "1")]
    pub name: String,
    /// ONNX element type; 0 = unknown.
    #[prost(int32, tag = "2")]
    pub elem_type: i32,
    /// Set when the rank is unknown (`dims` and `dim_params` are then empty).
    #[prost(bool, tag = "3")]
    pub unknown_rank: bool,
    /// -1 = an unknown dim.
    #[prost(sint64, repeated, tag = "4")]
    pub dims: Vec<i64>,
    /// Empty, or one per dim (`""` = unnamed).
    #[prost(string, repeated, tag = "5")]
    pub dim_params: Vec<String>,
}

/// A constant the graph reads (`NamedConstant`): a plain weight of the file.
#[derive(Clone, PartialEq, prost::Message)]
pub struct NamedWeight {
    #[prost(string, tag = "1")]
    pub name: String,
    #[prost(uint32, tag = "2")]
    pub weight_id: u32,
}

/// A constant packed as a GEMM B operand (`PackedConstant`): a weight of
/// the file with `gemm_packed { k, n }`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PackedWeight {
    /// The `NamedWeight` it packs: `[k, n]`, or `[n, k]` with `trans_b`.
    #[prost(string, tag = "1")]
    pub source: String,
    #[prost(bool, tag = "2")]
    pub trans_b: bool,
    #[prost(uint32, tag = "3")]
    pub weight_id: u32,
    /// Convolution weights (issue #13): group `conv_group` of `[Co, Ci/g, kh(, kw)]`
    /// packed as `[kh * kw * Ci/g, Co/g]` (taps, then channels).
    #[prost(uint64, optional, tag = "4")]
    pub conv_group: Option<u64>,
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
    /// Scratch arena size in bytes.
    #[prost(uint64, tag = "1")]
    pub arena_bytes: u64,
    #[prost(message, repeated, tag = "2")]
    pub steps: Vec<StepInfo>,
    #[prost(message, repeated, tag = "3")]
    pub op_counts: Vec<OpCount>,
}

/// Nodes of one op in the optimised graph (for summaries).
#[derive(Clone, PartialEq, prost::Message)]
pub struct OpCount {
    /// Op name, e.g. `Add` or `MatMul+Bias+Gelu`.
    #[prost(string, tag = "1")]
    pub op: String,
    #[prost(uint64, tag = "2")]
    pub count: u64,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct StepInfo {
    #[prost(
        oneof = "step_info::Kind",
        tags = "1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 30, 31, 32, 33, 34, 40, 50, 65, 66, 75, 76, 77, 78, 55, 85, 86, 87"
    )]
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
        #[prost(message, tag = "4")]
        MatMul(super::MatMulStep),
        #[prost(message, tag = "5")]
        Softmax(super::SoftmaxStep),
        #[prost(message, tag = "6")]
        LayerNorm(super::LayerNormStep),
        #[prost(message, tag = "7")]
        Reduce(super::ReduceStep),
        #[prost(message, tag = "8")]
        Strided(super::StridedStep),
        #[prost(message, tag = "9")]
        Gather(super::GatherStep),
        #[prost(message, tag = "10")]
        Cast(super::CastStep),
        #[prost(message, tag = "11")]
        Where(super::WhereStep),
        // Shape and indexing ops (issue #12): tags 30-39.
        #[prost(message, tag = "30")]
        GatherElements(super::GatherElementsStep),
        #[prost(message, tag = "31")]
        GatherNd(super::GatherNdStep),
        #[prost(message, tag = "32")]
        ScatterNd(super::ScatterNdStep),
        #[prost(message, tag = "33")]
        CumSum(super::CumSumStep),
        #[prost(message, tag = "34")]
        OneHot(super::OneHotStep),
        // Recurrent layers (issue #12): tags 40-49.
        #[prost(message, tag = "40")]
        Rnn(super::RnnStep),
        // Convolution (issue #13): tags 50-54.
        #[prost(message, tag = "50")]
        Conv(super::ConvStep),
        // Pools and resize (issue #13): tags 65-69.
        #[prost(message, tag = "65")]
        Pool(super::PoolStep),
        #[prost(message, tag = "66")]
        Resize(super::ResizeStep),
        // Normalisation and selection ops (issue #13): tags 75-79.
        #[prost(message, tag = "75")]
        GroupNorm(super::GroupNormStep),
        #[prost(message, tag = "76")]
        Lrn(super::LrnStep),
        #[prost(message, tag = "77")]
        ArgReduce(super::ArgReduceStep),
        #[prost(message, tag = "78")]
        TopK(super::TopKStep),
        // Transposed convolution (issue #13): tags 55-59.
        #[prost(message, tag = "55")]
        ConvTranspose(super::ConvTransposeStep),
        // Fused attention (issue #14, format 4): tags 85-89.
        #[prost(message, tag = "85")]
        Attention(super::AttentionStep),
        // Embeddings + LayerNorm (issue #14, format 7).
        #[prost(message, tag = "86")]
        EmbedLayerNorm(super::EmbedLayerNormStep),
        // Elementwise chains (issue #14, format 11).
        #[prost(message, tag = "87")]
        Chain(super::ChainStep),
    }
}

/// f32 elementwise ops in one pass (`plan::ChainStep`, format 11).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ChainStep {
    #[prost(message, repeated, tag = "1")]
    pub ops: Vec<ChainOpInfo>,
    #[prost(message, repeated, tag = "2")]
    pub inputs: Vec<ChainInputInfo>,
    #[prost(message, optional, tag = "3")]
    pub dst: Option<BufInfo>,
}

/// One op of a [`ChainStep`].
#[derive(Clone, PartialEq, prost::Message)]
pub struct ChainOpInfo {
    /// A unary op (its buffers unset); absent for a binary op.
    #[prost(message, optional, tag = "1")]
    pub unary: Option<UnaryStep>,
    /// The binary op, when `unary` is absent.
    #[prost(enumeration = "BinaryOpKind", tag = "2")]
    pub binary: i32,
    /// Operands: an input's index, or an earlier op's when `*_result`.
    #[prost(uint32, tag = "3")]
    pub a: u32,
    #[prost(bool, tag = "4")]
    pub a_result: bool,
    #[prost(uint32, tag = "5")]
    pub b: u32,
    #[prost(bool, tag = "6")]
    pub b_result: bool,
}

/// One input of a [`ChainStep`] and how it lines up with the output.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ChainInputInfo {
    #[prost(message, optional, tag = "1")]
    pub src: Option<BufInfo>,
    /// 0: the output's size, 1: one value, 2: one row of `inner` values,
    /// 3: `count` values, each for a run of `inner` output elements.
    #[prost(uint32, tag = "2")]
    pub access: u32,
    #[prost(uint64, tag = "3")]
    pub inner: u64,
    #[prost(uint64, tag = "4")]
    pub count: u64,
}

/// Embeddings summed and layer-normalised (`plan::EmbedStep`, format 7).
#[derive(Clone, PartialEq, prost::Message)]
pub struct EmbedLayerNormStep {
    /// The output's dims but the last.
    #[prost(uint64, repeated, tag = "1")]
    pub lead: Vec<u64>,
    #[prost(uint64, tag = "2")]
    pub width: u64,
    #[prost(float, tag = "3")]
    pub epsilon: f32,
    #[prost(bool, tag = "4")]
    pub decomposed: bool,
    #[prost(message, optional, tag = "5")]
    pub scale: Option<BufInfo>,
    /// Absent: no bias.
    #[prost(message, optional, tag = "6")]
    pub bias: Option<BufInfo>,
    /// In the order they are added.
    #[prost(message, repeated, tag = "7")]
    pub terms: Vec<EmbedTermInfo>,
    #[prost(message, optional, tag = "8")]
    pub dst: Option<BufInfo>,
}

/// One summand of an [`EmbedLayerNormStep`]: a table's rows at indices
/// (`table` present), or an added value's rows (`src` alone).
#[derive(Clone, PartialEq, prost::Message)]
pub struct EmbedTermInfo {
    /// The indices, or the added value.
    #[prost(message, optional, tag = "1")]
    pub src: Option<BufInfo>,
    #[prost(message, optional, tag = "2")]
    pub table: Option<BufInfo>,
    /// The indices' element type (ONNX code); 0 for an added value.
    #[prost(int32, tag = "3")]
    pub idx_dtype: i32,
    /// Per dim of `lead`, the step between rows (0: broadcast).
    #[prost(uint64, repeated, tag = "4")]
    pub strides: Vec<u64>,
}

/// Fused multi-head attention (`plan::AttentionStep`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct AttentionStep {
    #[prost(uint64, tag = "1")]
    pub batch: u64,
    #[prost(uint64, tag = "2")]
    pub heads: u64,
    #[prost(uint64, tag = "3")]
    pub q_len: u64,
    #[prost(uint64, tag = "4")]
    pub kv_len: u64,
    #[prost(uint64, tag = "5")]
    pub head_dim: u64,
    #[prost(float, tag = "6")]
    pub scale: f32,
    #[prost(message, optional, tag = "7")]
    pub q: Option<BufInfo>,
    #[prost(message, optional, tag = "8")]
    pub k: Option<BufInfo>,
    #[prost(message, optional, tag = "9")]
    pub v: Option<BufInfo>,
    /// Absent: no mask.
    #[prost(message, optional, tag = "10")]
    pub mask: Option<BufInfo>,
    /// The mask's strides over batch, head and query row.
    #[prost(uint64, repeated, tag = "11")]
    pub mask_strides: Vec<u64>,
    #[prost(message, optional, tag = "12")]
    pub dst: Option<BufInfo>,
    /// Format 6: `q` is Q, K and V side by side (`k` and `v` name it too).
    #[prost(bool, tag = "13")]
    pub packed_qkv: bool,
}

/// A channels-last convolution (`plan::ConvStep`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ConvStep {
    /// Per axis (h, then w): input, output, kernel, stride, dilation, pad_begin, pad_end.
    #[prost(uint64, repeated, tag = "1")]
    pub window: Vec<u64>,
    #[prost(uint64, tag = "2")]
    pub batch: u64,
    #[prost(uint64, tag = "3")]
    pub in_channels: u64,
    #[prost(uint64, tag = "4")]
    pub out_channels: u64,
    #[prost(uint64, tag = "5")]
    pub groups: u64,
    #[prost(message, optional, tag = "6")]
    pub x: Option<BufInfo>,
    /// One packed constant per group, or ...
    #[prost(uint64, repeated, tag = "7")]
    pub packed_w: Vec<u64>,
    /// ... depthwise weights `[kh * kw, C]`.
    #[prost(message, optional, tag = "8")]
    pub depthwise_w: Option<BufInfo>,
    #[prost(message, optional, tag = "9")]
    pub bias: Option<BufInfo>,
    #[prost(message, optional, tag = "10")]
    pub activation: Option<ActivationInfo>,
    #[prost(message, optional, tag = "11")]
    pub residual: Option<BufInfo>,
    #[prost(message, optional, tag = "12")]
    pub dst: Option<BufInfo>,
    /// The activation after the residual (format 5); absent: none.
    #[prost(message, optional, tag = "13")]
    pub after: Option<ActivationInfo>,
    /// Values between output pixels when more than `out_channels` (format
    /// 8: a convolution writing its channels of a concat); 0: dense.
    #[prost(uint64, tag = "14")]
    pub dst_stride: u64,
    /// The residual is `dst`'s own values when the step starts (format 9);
    /// `residual` is then absent.
    #[prost(bool, tag = "15")]
    pub residual_in_dst: bool,
    /// `packed_w` holds the 16 Winograd F(2×2, 3×3) matrices `[Ci, Co]`
    /// (format 12, `kernels::winograd`).
    #[prost(bool, tag = "16")]
    pub winograd: bool,
}

/// A channels-last transposed convolution (`plan::ConvTransposeStep`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ConvTransposeStep {
    #[prost(message, optional, tag = "1")]
    pub h: Option<ConvTransposeAxis>,
    #[prost(message, optional, tag = "2")]
    pub w: Option<ConvTransposeAxis>,
    #[prost(uint64, tag = "3")]
    pub batch: u64,
    #[prost(uint64, tag = "4")]
    pub groups: u64,
    #[prost(uint64, tag = "5")]
    pub ci: u64,
    #[prost(uint64, tag = "6")]
    pub co: u64,
    #[prost(message, optional, tag = "7")]
    pub x: Option<BufInfo>,
    #[prost(uint64, repeated, tag = "8")]
    pub packed_w: Vec<u64>,
    #[prost(message, optional, tag = "9")]
    pub bias: Option<BufInfo>,
    #[prost(message, optional, tag = "10")]
    pub dst: Option<BufInfo>,
}

/// One spatial axis of a transposed convolution (`kernels::spatial::Axis`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct ConvTransposeAxis {
    #[prost(uint64, tag = "1")]
    pub input: u64,
    #[prost(uint64, tag = "2")]
    pub output: u64,
    #[prost(uint64, tag = "3")]
    pub kernel: u64,
    #[prost(uint64, tag = "4")]
    pub stride: u64,
    #[prost(uint64, tag = "5")]
    pub dilation: u64,
    #[prost(uint64, tag = "6")]
    pub pad_begin: u64,
    #[prost(uint64, tag = "7")]
    pub pad_end: u64,
}

/// A recurrent layer (`plan::RnnStep`).
#[derive(Clone, PartialEq, prost::Message)]
pub struct RnnStep {
    #[prost(enumeration = "RnnCellKind", tag = "1")]
    pub cell: i32,
    #[prost(bool, tag = "2")]
    pub input_forget: bool,
    #[prost(bool, tag = "3")]
    pub peepholes: bool,
    #[prost(bool, tag = "4")]
    pub linear_before_reset: bool,
    #[prost(enumeration = "RnnDirectionKind", tag = "5")]
    pub direction: i32,
    #[prost(uint64, tag = "6")]
    pub hidden: u64,
    #[prost(message, repeated, tag = "7")]
    pub activations: Vec<RnnActivationInfo>,
    #[prost(float, optional, tag = "8")]
    pub clip: Option<f32>,
    #[prost(uint64, tag = "9")]
    pub seq: u64,
    #[prost(uint64, tag = "10")]
    pub batch: u64,
    #[prost(uint64, tag = "11")]
    pub input: u64,
    #[prost(message, optional, tag = "12")]
    pub x: Option<BufInfo>,
    #[prost(uint64, tag = "13")]
    pub packed_w: u64,
    #[prost(uint64, repeated, tag = "14")]
    pub packed_r: Vec<u64>,
    #[prost(message, optional, tag = "15")]
    pub bias: Option<BufInfo>,
    #[prost(message, optional, tag = "16")]
    pub rbh: Option<BufInfo>,
    #[prost(message, optional, tag = "17")]
    pub seq_lens: Option<BufInfo>,
    #[prost(message, optional, tag = "18")]
    pub initial_h: Option<BufInfo>,
    #[prost(message, optional, tag = "19")]
    pub initial_c: Option<BufInfo>,
    #[prost(message, optional, tag = "20")]
    pub p: Option<BufInfo>,
    #[prost(message, optional, tag = "21")]
    pub dst: Option<BufInfo>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct RnnActivationInfo {
    #[prost(enumeration = "RnnActivationKind", tag = "1")]
    pub kind: i32,
    #[prost(float, tag = "2")]
    pub alpha: f32,
    #[prost(float, tag = "3")]
    pub beta: f32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum RnnCellKind {
    Unspecified = 0,
    Lstm = 1,
    Gru = 2,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum RnnDirectionKind {
    Unspecified = 0,
    Forward = 1,
    Reverse = 2,
    Bidirectional = 3,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum RnnActivationKind {
    Unspecified = 0,
    Sigmoid = 1,
    Tanh = 2,
    Relu = 3,
    Affine = 4,
    LeakyRelu = 5,
    ThresholdedRelu = 6,
    ScaledTanh = 7,
    HardSigmoid = 8,
    Elu = 9,
    Softsign = 10,
    Softplus = 11,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct UnaryStep {
    #[prost(enumeration = "UnaryOpKind", tag = "1")]
    pub op: i32,
    #[prost(message, optional, tag = "2")]
    pub src: Option<BufInfo>,
    #[prost(message, optional, tag = "3")]
    pub dst: Option<BufInfo>,
    /// LeakyRelu's alpha.
    #[prost(float, tag = "4")]
    pub alpha: f32,
    /// Clip's bounds.
    #[prost(float, tag = "5")]
    pub lo: f32,
    #[prost(float, tag = "6")]
    pub hi: f32,
    /// Activations (issue #13): HardSigmoid's beta, Selu's gamma (`alpha`
    /// holds their alpha, and Elu's, Celu's and ThresholdedRelu's).
    #[prost(float, tag = "7")]
    pub beta: f32,
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
    #[prost(int32, tag = "6")]
    pub dtype: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CopyStep {
    #[prost(message, optional, tag = "1")]
    pub src: Option<BufInfo>,
    #[prost(message, optional, tag = "2")]
    pub dst: Option<BufInfo>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct MatMulStep {
    #[prost(uint64, tag = "1")]
    pub m: u64,
    #[prost(uint64, tag = "2")]
    pub n: u64,
    #[prost(uint64, tag = "3")]
    pub k: u64,
    #[prost(bool, tag = "4")]
    pub trans_a: bool,
    #[prost(message, optional, tag = "5")]
    pub a: Option<BufInfo>,
    /// B as a buffer (with `trans_b`), or ...
    #[prost(message, optional, tag = "6")]
    pub b: Option<BufInfo>,
    #[prost(bool, tag = "7")]
    pub trans_b: bool,
    /// ... the index of a packed constant.
    #[prost(uint64, optional, tag = "8")]
    pub packed_b: Option<u64>,
    /// Element offsets into A and B per batch, as pairs.
    #[prost(uint64, repeated, tag = "9")]
    pub batch_offsets: Vec<u64>,
    #[prost(float, tag = "10")]
    pub alpha: f32,
    #[prost(enumeration = "BiasKindInfo", tag = "11")]
    pub bias_kind: i32,
    #[prost(message, optional, tag = "12")]
    pub bias: Option<BufInfo>,
    #[prost(float, tag = "13")]
    pub beta: f32,
    #[prost(message, optional, tag = "14")]
    pub activation: Option<ActivationInfo>,
    #[prost(message, optional, tag = "15")]
    pub residual: Option<BufInfo>,
    #[prost(message, optional, tag = "16")]
    pub dst: Option<BufInfo>,
    /// Format 6: B as three packed constants side by side (instead of
    /// `b` or `packed_b`).
    #[prost(uint64, repeated, tag = "17")]
    pub packed_b_parts: Vec<u64>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ActivationInfo {
    #[prost(enumeration = "ActivationKind", tag = "1")]
    pub kind: i32,
    /// LeakyRelu's and HardSigmoid's alpha, Clip's lo.
    #[prost(float, tag = "2")]
    pub a: f32,
    /// Clip's hi, HardSigmoid's beta.
    #[prost(float, tag = "3")]
    pub b: f32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct SoftmaxStep {
    #[prost(uint64, tag = "1")]
    pub len: u64,
    #[prost(uint64, tag = "2")]
    pub inner: u64,
    #[prost(message, optional, tag = "3")]
    pub src: Option<BufInfo>,
    #[prost(message, optional, tag = "4")]
    pub dst: Option<BufInfo>,
    /// `exp(x) / Σ exp(x)` without the max subtraction (absent in binaries
    /// written before it existed: those always subtracted it).
    #[prost(bool, tag = "5")]
    pub unshifted: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct LayerNormStep {
    #[prost(uint64, tag = "1")]
    pub len: u64,
    #[prost(float, tag = "2")]
    pub epsilon: f32,
    #[prost(message, optional, tag = "3")]
    pub src: Option<BufInfo>,
    #[prost(message, optional, tag = "4")]
    pub scale: Option<BufInfo>,
    /// Absent: no bias.
    #[prost(message, optional, tag = "5")]
    pub bias: Option<BufInfo>,
    #[prost(message, optional, tag = "6")]
    pub dst: Option<BufInfo>,
    /// Statistics of the decomposed ops it was fused from (see `ir::Op::LayerNorm`).
    #[prost(bool, tag = "7")]
    pub decomposed: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ReduceStep {
    #[prost(enumeration = "ReduceKindInfo", tag = "1")]
    pub kind: i32,
    #[prost(uint64, tag = "2")]
    pub outer: u64,
    #[prost(uint64, tag = "3")]
    pub len: u64,
    #[prost(uint64, tag = "4")]
    pub inner: u64,
    #[prost(message, optional, tag = "5")]
    pub src: Option<BufInfo>,
    #[prost(message, optional, tag = "6")]
    pub dst: Option<BufInfo>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct StridedStep {
    #[prost(int32, tag = "1")]
    pub dtype: i32,
    #[prost(uint64, repeated, tag = "2")]
    pub dims: Vec<u64>,
    #[prost(uint64, tag = "3")]
    pub src_offset: u64,
    #[prost(sint64, repeated, tag = "4")]
    pub src_strides: Vec<i64>,
    #[prost(uint64, tag = "5")]
    pub dst_offset: u64,
    #[prost(sint64, repeated, tag = "6")]
    pub dst_strides: Vec<i64>,
    #[prost(message, optional, tag = "7")]
    pub src: Option<BufInfo>,
    #[prost(message, optional, tag = "8")]
    pub dst: Option<BufInfo>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct GatherStep {
    #[prost(int32, tag = "1")]
    pub dtype: i32,
    #[prost(int32, tag = "2")]
    pub idx_dtype: i32,
    #[prost(uint64, tag = "3")]
    pub outer: u64,
    #[prost(uint64, tag = "4")]
    pub axis_len: u64,
    #[prost(uint64, tag = "5")]
    pub inner: u64,
    #[prost(message, optional, tag = "6")]
    pub data: Option<BufInfo>,
    #[prost(message, optional, tag = "7")]
    pub indices: Option<BufInfo>,
    #[prost(message, optional, tag = "8")]
    pub dst: Option<BufInfo>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CastStep {
    #[prost(int32, tag = "1")]
    pub from: i32,
    #[prost(int32, tag = "2")]
    pub to: i32,
    #[prost(message, optional, tag = "3")]
    pub src: Option<BufInfo>,
    #[prost(message, optional, tag = "4")]
    pub dst: Option<BufInfo>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct WhereStep {
    #[prost(int32, tag = "1")]
    pub dtype: i32,
    #[prost(uint64, repeated, tag = "2")]
    pub dims: Vec<u64>,
    #[prost(uint64, repeated, tag = "3")]
    pub c_strides: Vec<u64>,
    #[prost(uint64, repeated, tag = "4")]
    pub x_strides: Vec<u64>,
    #[prost(uint64, repeated, tag = "5")]
    pub y_strides: Vec<u64>,
    #[prost(message, optional, tag = "6")]
    pub cond: Option<BufInfo>,
    #[prost(message, optional, tag = "7")]
    pub x: Option<BufInfo>,
    #[prost(message, optional, tag = "8")]
    pub y: Option<BufInfo>,
    #[prost(message, optional, tag = "9")]
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
    Log = 8,
    Erf = 9,
    Reciprocal = 10,
    LeakyRelu = 11,
    Clip = 12,
    Gelu = 13,
    GeluTanh = 14,
    GeluWritten = 15,
    GeluTanhWritten = 16,
    // Elementwise math, comparisons and logic (issue #12): 20-39.
    Floor = 20,
    Ceil = 21,
    Round = 22,
    Sin = 23,
    Cos = 24,
    Sign = 25,
    Softplus = 26,
    Mish = 27,
    Not = 28,
    IsNan = 29,
    IsInf = 30,
    IsInfPositive = 31,
    IsInfNegative = 32,
    IsInfNone = 33,
    // Activations (issue #13): 40-49.
    HardSigmoid = 40,
    HardSwish = 41,
    Silu = 42,
    Elu = 43,
    Selu = 44,
    Celu = 45,
    ThresholdedRelu = 46,
    Softsign = 47,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum BinaryOpKind {
    Unspecified = 0,
    Add = 1,
    Sub = 2,
    Mul = 3,
    Div = 4,
    Pow = 5,
    // Elementwise math, comparisons and logic (issue #12): 10-29.
    Max = 10,
    Min = 11,
    Mod = 12,
    Fmod = 13,
    Equal = 14,
    Greater = 15,
    Less = 16,
    GreaterOrEqual = 17,
    LessOrEqual = 18,
    And = 19,
    Or = 20,
    Xor = 21,
    // Activations (issue #13): 40-49.
    PRelu = 40,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum BiasKindInfo {
    Unspecified = 0,
    NoBias = 1,
    Row = 2,
    Full = 3,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum ActivationKind {
    Unspecified = 0,
    NoActivation = 1,
    Relu = 2,
    LeakyRelu = 3,
    Sigmoid = 4,
    Tanh = 5,
    GeluErf = 6,
    GeluTanh = 7,
    Clip = 8,
    GeluErfWritten = 9,
    GeluTanhWritten = 10,
    // Activations (issue #13): 20 and up.
    HardSigmoid = 20,
    HardSwish = 21,
    Silu = 22,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum ReduceKindInfo {
    Unspecified = 0,
    Sum = 1,
    Mean = 2,
    Max = 3,
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

/// `len` bytes of the arena from byte `offset`.
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

// ---- Shape and indexing ops (issue #12) ----

/// `plan::IndexStep::GatherElements`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GatherElementsStep {
    #[prost(int32, tag = "1")]
    pub dtype: i32,
    #[prost(int32, tag = "2")]
    pub idx_dtype: i32,
    #[prost(uint64, repeated, tag = "3")]
    pub data_dims: Vec<u64>,
    #[prost(uint64, repeated, tag = "4")]
    pub idx_dims: Vec<u64>,
    #[prost(uint64, tag = "5")]
    pub axis: u64,
    #[prost(message, optional, tag = "6")]
    pub data: Option<BufInfo>,
    #[prost(message, optional, tag = "7")]
    pub indices: Option<BufInfo>,
    #[prost(message, optional, tag = "8")]
    pub dst: Option<BufInfo>,
}

/// `plan::IndexStep::GatherNd`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct GatherNdStep {
    #[prost(int32, tag = "1")]
    pub dtype: i32,
    #[prost(int32, tag = "2")]
    pub idx_dtype: i32,
    #[prost(uint64, tag = "3")]
    pub batch: u64,
    #[prost(uint64, repeated, tag = "4")]
    pub dims: Vec<u64>,
    #[prost(uint64, tag = "5")]
    pub slice: u64,
    #[prost(message, optional, tag = "6")]
    pub data: Option<BufInfo>,
    #[prost(message, optional, tag = "7")]
    pub indices: Option<BufInfo>,
    #[prost(message, optional, tag = "8")]
    pub dst: Option<BufInfo>,
}

/// `plan::IndexStep::ScatterNd`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ScatterNdStep {
    #[prost(int32, tag = "1")]
    pub dtype: i32,
    #[prost(int32, tag = "2")]
    pub idx_dtype: i32,
    #[prost(enumeration = "ScatterReductionKind", tag = "3")]
    pub reduction: i32,
    #[prost(uint64, repeated, tag = "4")]
    pub dims: Vec<u64>,
    #[prost(uint64, tag = "5")]
    pub slice: u64,
    #[prost(message, optional, tag = "6")]
    pub data: Option<BufInfo>,
    #[prost(message, optional, tag = "7")]
    pub indices: Option<BufInfo>,
    #[prost(message, optional, tag = "8")]
    pub updates: Option<BufInfo>,
    #[prost(message, optional, tag = "9")]
    pub dst: Option<BufInfo>,
}

/// `plan::IndexStep::CumSum`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct CumSumStep {
    #[prost(int32, tag = "1")]
    pub dtype: i32,
    #[prost(uint64, tag = "2")]
    pub outer: u64,
    #[prost(uint64, tag = "3")]
    pub len: u64,
    #[prost(uint64, tag = "4")]
    pub inner: u64,
    #[prost(bool, tag = "5")]
    pub exclusive: bool,
    #[prost(bool, tag = "6")]
    pub reverse: bool,
    #[prost(message, optional, tag = "7")]
    pub src: Option<BufInfo>,
    #[prost(message, optional, tag = "8")]
    pub dst: Option<BufInfo>,
}

/// `plan::IndexStep::OneHot`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct OneHotStep {
    #[prost(int32, tag = "1")]
    pub dtype: i32,
    #[prost(int32, tag = "2")]
    pub idx_dtype: i32,
    #[prost(uint64, tag = "3")]
    pub outer: u64,
    #[prost(uint64, tag = "4")]
    pub depth: u64,
    #[prost(uint64, tag = "5")]
    pub inner: u64,
    #[prost(message, optional, tag = "6")]
    pub indices: Option<BufInfo>,
    #[prost(message, optional, tag = "7")]
    pub values: Option<BufInfo>,
    #[prost(message, optional, tag = "8")]
    pub dst: Option<BufInfo>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum ScatterReductionKind {
    Unspecified = 0,
    None = 1,
    Add = 2,
    Mul = 3,
    Max = 4,
    Min = 5,
}

// ---- Pools and resize (issue #13) ----

/// `plan::PoolStep::Pool`: a pool over channels-last `[batch, h, w, channels]`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct PoolStep {
    #[prost(enumeration = "PoolKindInfo", tag = "1")]
    pub kind: i32,
    #[prost(message, optional, tag = "2")]
    pub h: Option<WindowAxis>,
    #[prost(message, optional, tag = "3")]
    pub w: Option<WindowAxis>,
    #[prost(uint64, tag = "4")]
    pub batch: u64,
    #[prost(uint64, tag = "5")]
    pub channels: u64,
    #[prost(message, optional, tag = "6")]
    pub src: Option<BufInfo>,
    #[prost(message, optional, tag = "7")]
    pub dst: Option<BufInfo>,
}

/// `kernels::spatial::Axis`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct WindowAxis {
    #[prost(uint64, tag = "1")]
    pub input: u64,
    #[prost(uint64, tag = "2")]
    pub output: u64,
    #[prost(uint64, tag = "3")]
    pub kernel: u64,
    #[prost(uint64, tag = "4")]
    pub stride: u64,
    #[prost(uint64, tag = "5")]
    pub dilation: u64,
    #[prost(uint64, tag = "6")]
    pub pad_begin: u64,
    #[prost(uint64, tag = "7")]
    pub pad_end: u64,
}

/// `plan::PoolStep::Resize`: a resize of channels-last `[batch, h, w, channels]`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ResizeStep {
    #[prost(enumeration = "ResizeModeInfo", tag = "1")]
    pub mode: i32,
    #[prost(float, tag = "2")]
    pub cubic_coeff_a: f32,
    #[prost(bool, tag = "3")]
    pub exclude_outside: bool,
    #[prost(enumeration = "CoordModeInfo", tag = "4")]
    pub coord: i32,
    #[prost(message, optional, tag = "5")]
    pub h: Option<ResizeAxisInfo>,
    #[prost(message, optional, tag = "6")]
    pub w: Option<ResizeAxisInfo>,
    #[prost(uint64, tag = "7")]
    pub batch: u64,
    #[prost(uint64, tag = "8")]
    pub channels: u64,
    #[prost(message, optional, tag = "9")]
    pub src: Option<BufInfo>,
    #[prost(message, optional, tag = "10")]
    pub dst: Option<BufInfo>,
    /// Values between output pixels when more than `channels` (format 10:
    /// a resize writing its channels of a concat); 0: dense.
    #[prost(uint64, tag = "11")]
    pub dst_stride: u64,
}

/// `kernels::resize::ResizeAxis`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ResizeAxisInfo {
    #[prost(uint64, tag = "1")]
    pub input: u64,
    #[prost(uint64, tag = "2")]
    pub output: u64,
    #[prost(float, tag = "3")]
    pub scale: f32,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum PoolKindInfo {
    Unspecified = 0,
    Max = 1,
    Average = 2,
    AverageIncludePad = 3,
    MaxIndex = 4,
    MaxIndexColumnMajor = 5,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum ResizeModeInfo {
    Unspecified = 0,
    NearestRoundPreferFloor = 1,
    NearestRoundPreferCeil = 2,
    NearestFloor = 3,
    NearestCeil = 4,
    NearestSimple = 5,
    Linear = 6,
    Cubic = 7,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, prost::Enumeration)]
#[repr(i32)]
pub enum CoordModeInfo {
    Unspecified = 0,
    HalfPixel = 1,
    HalfPixelSymmetric = 2,
    PytorchHalfPixel = 3,
    AlignCorners = 4,
    Asymmetric = 5,
    TfHalfPixelForNn = 6,
}

// Normalisation and selection ops (issue #13).

/// `plan::NormStep::GroupNorm` (also InstanceNormalization).
#[derive(Clone, PartialEq, prost::Message)]
pub struct GroupNormStep {
    #[prost(uint64, tag = "1")]
    pub batch: u64,
    #[prost(uint64, tag = "2")]
    pub spatial: u64,
    #[prost(uint64, tag = "3")]
    pub channels: u64,
    #[prost(uint64, tag = "4")]
    pub groups: u64,
    #[prost(float, tag = "5")]
    pub epsilon: f32,
    #[prost(message, optional, tag = "6")]
    pub src: Option<BufInfo>,
    #[prost(message, optional, tag = "7")]
    pub scale: Option<BufInfo>,
    #[prost(message, optional, tag = "8")]
    pub bias: Option<BufInfo>,
    #[prost(message, optional, tag = "9")]
    pub dst: Option<BufInfo>,
}

/// `plan::NormStep::Lrn`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct LrnStep {
    #[prost(uint64, tag = "1")]
    pub size: u64,
    #[prost(float, tag = "2")]
    pub alpha: f32,
    #[prost(float, tag = "3")]
    pub beta: f32,
    #[prost(float, tag = "4")]
    pub bias: f32,
    #[prost(uint64, tag = "5")]
    pub channels: u64,
    #[prost(message, optional, tag = "6")]
    pub src: Option<BufInfo>,
    #[prost(message, optional, tag = "7")]
    pub dst: Option<BufInfo>,
}

/// `plan::NormStep::ArgReduce`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct ArgReduceStep {
    #[prost(int32, tag = "1")]
    pub dtype: i32,
    #[prost(bool, tag = "2")]
    pub min: bool,
    #[prost(bool, tag = "3")]
    pub last: bool,
    #[prost(uint64, tag = "4")]
    pub outer: u64,
    #[prost(uint64, tag = "5")]
    pub len: u64,
    #[prost(uint64, tag = "6")]
    pub inner: u64,
    #[prost(message, optional, tag = "7")]
    pub src: Option<BufInfo>,
    #[prost(message, optional, tag = "8")]
    pub dst: Option<BufInfo>,
}

/// `plan::NormStep::TopK`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct TopKStep {
    #[prost(int32, tag = "1")]
    pub dtype: i32,
    #[prost(uint64, tag = "2")]
    pub k: u64,
    #[prost(bool, tag = "3")]
    pub largest: bool,
    #[prost(uint64, tag = "4")]
    pub outer: u64,
    #[prost(uint64, tag = "5")]
    pub len: u64,
    #[prost(uint64, tag = "6")]
    pub inner: u64,
    #[prost(message, optional, tag = "7")]
    pub src: Option<BufInfo>,
    #[prost(message, optional, tag = "8")]
    pub dst: Option<BufInfo>,
}
