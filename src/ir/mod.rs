//! kiln's graph IR: typed tensors with static shapes, ops with their
//! attributes resolved, nodes in topological order. It knows nothing of ORT:
//! [`import`] builds it from an ORT-neutral [`GraphDesc`], and tests build it
//! directly.

mod check;
pub mod desc;
mod import;
mod ops;
mod tensor;

use std::fmt;

pub use crate::kernels::chain::{Access, ChainOp, Operand};
pub use crate::kernels::channel_norm::Lrn;
pub use crate::kernels::gemm::Activation;
pub use crate::kernels::index::ScatterReduction;
pub use crate::kernels::pool::PoolKind;
pub use crate::kernels::recurrent::{RnnActivation, RnnCell, RnnDirection, RnnSpec};
pub use crate::kernels::resize::{CoordMode, Interp, NearestMode, ResizeAttrs, ResizeAxis};
pub use crate::kernels::select::{ArgRule, TopKRule};
pub use crate::kernels::spatial::{Axis, Window};
pub use crate::kernels::{BinaryOp, ReduceKind, UnaryOp};
pub use desc::{AttrValue, ConstantSource, GraphDesc, NodeDesc, TensorValue, ValueDesc, NO_CONSTANTS};
pub use import::{check_support, import, Fold};
pub use ops::SUPPORTED_OPS;
pub use tensor::{Tensor, TensorData};

pub(crate) use crate::tensor::ShapeDisplay;
pub use crate::tensor::{broadcast_shapes, onnx_type_name, DType};

use crate::error::{Error, Result};
use crate::plan::Weight;

/// A tensor's element type and static shape.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorType {
    pub dtype: DType,
    pub shape: Vec<usize>,
}

impl TensorType {
    pub fn new(dtype: DType, shape: &[usize]) -> Self {
        TensorType {
            dtype,
            shape: shape.to_vec(),
        }
    }

    pub fn f32(shape: &[usize]) -> Self {
        TensorType::new(DType::F32, shape)
    }

    /// Element count; saturates instead of overflowing (validate rejects such shapes).
    pub fn numel(&self) -> usize {
        self.shape.iter().fold(1usize, |n, &d| n.saturating_mul(d))
    }

    pub fn byte_len(&self) -> usize {
        self.numel().saturating_mul(self.dtype.size())
    }

    /// Element count, or `None` if the tensor could not fit in memory.
    pub fn checked_numel(&self) -> Option<usize> {
        let n = self.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d))?;
        let bytes = n.checked_mul(self.dtype.size())?;
        (bytes <= isize::MAX as usize).then_some(n)
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.dtype, ShapeDisplay(&self.shape))
    }
}

/// The bias a fused matrix product adds before its activation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum BiasKind {
    None,
    /// One value per output column (`[n]`).
    Row,
    /// A full `[..., m, n]` tensor (the output's shape), times `beta`.
    Full {
        beta: f32,
    },
}

/// A (batched, broadcasting) matrix product with a fused epilogue:
/// `y = act(alpha · op(A) · op(B) + bias) + residual`, `op` transposing the
/// last two dims when asked. Inputs: `a`, `b`, then the bias when
/// `bias != None`, then the residual when `residual`.
///
/// With `b_parts > 1` (`compiler::qkv`), `b` is that many 2-D constants of
/// one K, side by side: the product of A with their concatenation along N.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MatMulAttrs {
    pub trans_a: bool,
    pub trans_b: bool,
    pub b_parts: usize,
    pub alpha: f32,
    pub bias: BiasKind,
    pub activation: Activation,
    pub residual: bool,
}

impl Default for MatMulAttrs {
    fn default() -> Self {
        MatMulAttrs {
            trans_a: false,
            trans_b: false,
            b_parts: 1,
            alpha: 1.0,
            bias: BiasKind::None,
            activation: Activation::None,
            residual: false,
        }
    }
}

impl MatMulAttrs {
    pub fn num_inputs(&self) -> usize {
        1 + self.b_parts + usize::from(self.bias != BiasKind::None) + usize::from(self.residual)
    }

    /// Whether anything beyond a plain product is fused in.
    pub fn has_epilogue(&self) -> bool {
        self.alpha != 1.0 || self.bias != BiasKind::None || self.activation != Activation::None || self.residual
    }
}

/// Which optional inputs a recurrent layer ([`Op::Rnn`]) has.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RnnInputs {
    /// `[dirs * gates * hidden]`, added to the input projections.
    pub bias: bool,
    /// GRU with `linear_before_reset`: `Rbh [dirs * hidden]`.
    pub rbh: bool,
    /// int32 `[batch]`.
    pub seq_lens: bool,
    pub initial_h: bool,
    pub initial_c: bool,
    /// LSTM peepholes `[dirs * 3 * hidden]`.
    pub p: bool,
}

impl RnnInputs {
    /// Presence of each optional input, in input order.
    pub fn flags(&self) -> [bool; 6] {
        [
            self.bias,
            self.rbh,
            self.seq_lens,
            self.initial_h,
            self.initial_c,
            self.p,
        ]
    }

    pub fn count(&self) -> usize {
        self.flags().iter().filter(|&&f| f).count()
    }
}

/// A recurrent layer: inputs `x [seq, batch, input]`, constant `w [dirs,
/// gates * hidden, input]` and `r [dirs, gates * hidden, hidden]`, then the
/// optional inputs `has` names, in [`RnnInputs::flags`] order. Its one
/// output is the kernel's destination (`kernels::recurrent`): `Y`, `Y_h`,
/// `Y_c` and workspace, flat; the importer slices the outputs out.
#[derive(Clone, Debug, PartialEq)]
pub struct RnnAttrs {
    pub spec: RnnSpec,
    pub has: RnnInputs,
}

/// A convolution over channels-last activations (issue #13): inputs `x
/// [N, H, W, Ci]`, constant weights in ONNX's layout `[Co, Ci / groups, kh,
/// kw]`, then the bias `[Co]` when `bias`, then the residual `[N, Ho, Wo,
/// Co]` when `residual`. Output `[N, Ho, Wo, Co]` = `after(act(conv(x) +
/// bias) + residual)`. 1-D convolutions have `H = kh = 1`.
#[derive(Clone, Debug, PartialEq)]
pub struct ConvAttrs {
    pub window: Window,
    pub groups: usize,
    pub bias: bool,
    pub activation: Activation,
    pub residual: bool,
    /// Applied after the residual (ResNet's Relu after the skip connection's
    /// Add); `None` without a residual.
    pub after: Activation,
}

impl ConvAttrs {
    pub fn num_inputs(&self) -> usize {
        2 + usize::from(self.bias) + usize::from(self.residual)
    }

    /// e.g. `Conv+Bias+Relu+Residual`.
    pub fn name(&self) -> String {
        let mut s = String::from("Conv");
        if self.bias {
            s.push_str("+Bias");
        }
        if self.activation != Activation::None {
            s.push('+');
            s.push_str(activation_name(self.activation));
        }
        if self.residual {
            s.push_str("+Residual");
        }
        if self.after != Activation::None {
            s.push('+');
            s.push_str(activation_name(self.after));
        }
        s
    }
}

/// A channels-last transposed convolution (issue #13). Inputs: `x`
/// `[N, H, W, Ci]`, the constant weights in ONNX's layout
/// `[Ci, Co / groups, kh, kw]` (1-D: `[Ci, Co / groups, kw]`, `kh = 1`), then the bias `[Co]` when
/// `bias`. Output `[N, Ho, Wo, Co]`. The window's axes are read the
/// transposed way (`kernels::conv_transpose`): `input`/`output` are this
/// op's, `pad_begin` shifts the output.
#[derive(Clone, Debug, PartialEq)]
pub struct ConvTransposeAttrs {
    pub window: crate::kernels::spatial::Window,
    pub groups: usize,
    pub bias: bool,
}

/// An operator with its attributes resolved against static shapes.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// f32 elementwise.
    Unary(UnaryOp),
    /// Broadcasting; f32, or int64/int32 for Add/Sub/Mul/Div.
    Binary(BinaryOp),
    MatMul(MatMulAttrs),
    /// Normalises along one axis (f32). `unshifted`: `exp(x) / Σ exp(x)`
    /// without subtracting the maximum, as a decomposed softmax written that
    /// way computes it (it overflows to NaN above 88.7, like ORT does).
    Softmax {
        axis: usize,
        unshifted: bool,
    },
    /// Normalises over dims `axis..`; inputs x, scale, optional bias.
    /// `decomposed`: fused from `ReduceMean → Sub → Pow → …`, so computed with
    /// those ops' f32 statistics rather than the `LayerNormalization` op's
    /// (they differ only where the f32 sums overflow, e.g. rows of 1e38).
    LayerNorm {
        axis: usize,
        epsilon: f32,
        decomposed: bool,
    },
    /// `axes` sorted and unique.
    Reduce {
        kind: ReduceKind,
        axes: Vec<usize>,
        keepdims: bool,
    },
    Transpose {
        perm: Vec<usize>,
    },
    /// Same elements under the output's shape (also Squeeze, Unsqueeze,
    /// Flatten, Identity, Dropout): an alias, never a copy.
    Reshape,
    Concat {
        axis: usize,
    },
    /// `out[i] = in[starts + i·steps]` per axis; the output type gives the counts.
    Slice {
        starts: Vec<usize>,
        steps: Vec<isize>,
    },
    /// `data`, `indices` (int64/int32, negative counts from the end).
    Gather {
        axis: usize,
    },
    Cast {
        to: DType,
    },
    /// `cond` (bool), `x`, `y`, broadcasting.
    Where,
    /// Broadcast to the output's shape.
    Expand,
    /// int64 dims `start..end` of the input's static shape.
    Shape {
        start: usize,
        end: usize,
    },
    // Shape and indexing ops (issue #12).
    /// `data`, `indices` of data's rank (int64/int32): the output has the
    /// indices' shape and reads data along `axis` at each index.
    GatherElements {
        axis: usize,
    },
    /// `data`, `indices` (int64/int32, last dim ≥ 1 indexes data's dims
    /// after the first `batch_dims`).
    GatherNd {
        batch_dims: usize,
    },
    /// `data`, `indices`, `updates`: a copy of data with the updates
    /// written (or combined) at the indexed slices.
    ScatterNd {
        reduction: ScatterReduction,
    },
    /// Running sums along `axis` (f32, int64, int32).
    CumSum {
        axis: usize,
        exclusive: bool,
        reverse: bool,
    },
    /// `indices` (int64/int32), `values` `[off, on]`: the output (its shape
    /// given, depth at `axis`) is `on` where the index is.
    OneHot {
        axis: usize,
    },
    // Recurrent layers (issue #12).
    Rnn(Box<RnnAttrs>),
    // Convolution (issue #13).
    /// Channels-last convolution (see [`ConvAttrs`]).
    Conv(Box<ConvAttrs>),
    // Pools and resize (issue #13).
    /// A max or average pool (f32), or MaxPool's int64 indices, over
    /// channels-last `[N, H, W, C]` (see `kernels::pool`).
    Pool {
        kind: PoolKind,
        window: Window,
    },
    /// Resize of channels-last `[N, H, W, C]` along H and W (f32).
    Resize(ResizeAttrs),
    // Normalisation and selection ops (issue #13).
    /// Channels-last `x [N, H, W, C]`, `scale [C]`, `bias [C]`: group
    /// normalisation over `groups` groups of adjacent channels
    /// (InstanceNormalization: one channel per group).
    GroupNorm {
        groups: usize,
        epsilon: f32,
    },
    /// Channels-last `x [N, H, W, C]`: ONNX `LRN` across channels.
    Lrn(Lrn),
    /// ArgMax / ArgMin along `axis` (f32 or int64 in, int64 out).
    ArgReduce {
        axis: usize,
        keepdims: bool,
        rule: ArgRule,
    },
    /// TopK's int64 indices along `axis` (values come from a
    /// GatherElements of them), sorted by [`crate::kernels::select`]'s order.
    TopK {
        axis: usize,
        rule: TopKRule,
    },
    // Transposed convolution (issue #13).
    ConvTranspose(Box<ConvTransposeAttrs>),
    /// Fused multi-head attention (issue #14, `compiler::attention`): `q
    /// [B, Sq, H·D]`, `k` and `v` `[B, Sk, H·D]`, then an f32 mask
    /// broadcastable to `[B, H, Sq, Sk]` (its last dim `Sk`) when `mask`.
    /// Output `[B, Sq, H·D]`: per head `softmax(scale · Q·Kᵀ + mask) · V`.
    /// With `packed_qkv` (`compiler::qkv`) the first input is instead one
    /// `[B, S, 3·H·D]` value, Q, K and V side by side in each row.
    Attention(AttentionAttrs),
    /// Embeddings summed and layer-normalised (issue #14, `compiler::embed`):
    /// inputs `scale [W]`, `bias [W]` when `bias`, then per term a table
    /// `[V, W]` and its indices (int64/int32) for [`EmbedTerm::Gathered`],
    /// or one f32 value whose last dim is `W` for [`EmbedTerm::Added`].
    /// Terms broadcast to the output like `Add`s; the output is
    /// `LayerNorm(((t0 + t1) + t2) …)` over its last axis, `W`.
    EmbedLayerNorm(EmbedAttrs),
    /// f32 elementwise ops in one pass (issue #14, `compiler::chain`): the
    /// inputs are the chain's, each the output's size, one value, or one
    /// row repeated ([`Access`]); every op's result has the output's shape;
    /// the output is the last op's.
    Chain(Vec<ChainOp>),
}

/// See [`Op::EmbedLayerNorm`].
#[derive(Clone, Debug, PartialEq)]
pub struct EmbedAttrs {
    pub epsilon: f32,
    /// As `Op::LayerNorm`'s: the decomposed ops' statistics.
    pub decomposed: bool,
    pub bias: bool,
    /// In the order they are added.
    pub terms: Vec<EmbedTerm>,
}

/// One summand of [`Op::EmbedLayerNorm`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EmbedTerm {
    /// Rows of a table picked by indices (a `Gather` on axis 0).
    Gathered,
    /// A value added as it is.
    Added,
}

impl EmbedTerm {
    /// Inputs the term takes.
    pub fn inputs(self) -> usize {
        match self {
            EmbedTerm::Gathered => 2,
            EmbedTerm::Added => 1,
        }
    }
}

impl EmbedAttrs {
    /// Inputs before the terms': scale and the optional bias.
    pub fn norm_inputs(&self) -> usize {
        1 + usize::from(self.bias)
    }

    pub fn num_inputs(&self) -> usize {
        self.norm_inputs() + self.terms.iter().map(|t| t.inputs()).sum::<usize>()
    }
}

/// See [`Op::Attention`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionAttrs {
    pub heads: usize,
    pub scale: f32,
    pub mask: bool,
    pub packed_qkv: bool,
}

impl AttentionAttrs {
    /// Inputs before the mask: Q, K and V, or the one packed value.
    pub fn qkv_inputs(&self) -> usize {
        if self.packed_qkv {
            1
        } else {
            3
        }
    }
}

impl Op {
    /// Short name for summaries, e.g. `MatMul+Bias+Gelu`.
    pub fn name(&self) -> String {
        match self {
            Op::Unary(UnaryOp::GeluTanh | UnaryOp::GeluTanhWritten) => "Gelu(tanh)".into(),
            Op::Unary(u) => u.onnx_name().into(),
            Op::Binary(b) => b.onnx_name().into(),
            Op::MatMul(m) => {
                let mut s = String::from("MatMul");
                if m.b_parts > 1 {
                    s.push_str(&format!("({} weights)", m.b_parts));
                }
                if m.alpha != 1.0 {
                    s.push_str("+Scale");
                }
                match m.bias {
                    BiasKind::None => {}
                    BiasKind::Row => s.push_str("+Bias"),
                    BiasKind::Full { .. } => s.push_str("+C"),
                }
                if m.activation != Activation::None {
                    s.push('+');
                    s.push_str(activation_name(m.activation));
                }
                if m.residual {
                    s.push_str("+Residual");
                }
                s
            }
            Op::Softmax { .. } => "Softmax".into(),
            Op::LayerNorm { .. } => "LayerNormalization".into(),
            Op::Reduce { kind, .. } => kind.onnx_name().into(),
            Op::Transpose { .. } => "Transpose".into(),
            Op::Reshape => "Reshape".into(),
            Op::Concat { .. } => "Concat".into(),
            Op::Slice { .. } => "Slice".into(),
            Op::Gather { .. } => "Gather".into(),
            Op::Cast { .. } => "Cast".into(),
            Op::Where => "Where".into(),
            Op::Expand => "Expand".into(),
            Op::Shape { .. } => "Shape".into(),
            Op::GatherElements { .. } => "GatherElements".into(),
            Op::GatherNd { .. } => "GatherND".into(),
            Op::ScatterNd { .. } => "ScatterND".into(),
            Op::CumSum { .. } => "CumSum".into(),
            Op::OneHot { .. } => "OneHot".into(),
            Op::Rnn(r) => r.spec.cell.onnx_name().into(),
            Op::Conv(c) => c.name(),
            Op::Pool { kind, .. } => match kind {
                PoolKind::Max => "MaxPool",
                PoolKind::Average { .. } => "AveragePool",
                PoolKind::MaxIndex { .. } => "MaxPool(Indices)",
            }
            .into(),
            Op::Resize(_) => "Resize".into(),
            Op::GroupNorm { .. } => "GroupNormalization".into(),
            Op::Lrn(_) => "LRN".into(),
            Op::ArgReduce { rule, .. } => (if rule.min { "ArgMin" } else { "ArgMax" }).into(),
            Op::TopK { .. } => "TopK".into(),
            Op::ConvTranspose(_) => "ConvTranspose".into(),
            Op::Attention(a) => {
                let packed = if a.packed_qkv { "(QKV)" } else { "" };
                format!("Attention{packed}{}", if a.mask { "+Mask" } else { "" })
            }
            Op::EmbedLayerNorm(e) => format!("EmbedLayerNormalization({} terms)", e.terms.len()),
            Op::Chain(ops) => {
                let names: Vec<&str> = ops.iter().map(ChainOp::onnx_name).collect();
                format!("Chain({})", names.join("+"))
            }
        }
    }

    /// Whether the op only reinterprets its input's bytes.
    pub fn is_alias(&self) -> bool {
        matches!(self, Op::Reshape)
    }
}

pub(crate) fn activation_name(a: Activation) -> &'static str {
    match a {
        Activation::None => "None",
        Activation::Relu => "Relu",
        Activation::LeakyRelu(_) => "LeakyRelu",
        Activation::Sigmoid => "Sigmoid",
        Activation::Tanh => "Tanh",
        Activation::GeluErf | Activation::GeluErfWritten => "Gelu",
        Activation::GeluTanh | Activation::GeluTanhWritten => "Gelu(tanh)",
        Activation::Clip(..) => "Clip",
        Activation::HardSigmoid(..) => "HardSigmoid",
        Activation::HardSwish => "HardSwish",
        Activation::Silu => "Silu",
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// Index of a value in [`Graph::values`].
pub type ValueId = usize;

#[derive(Clone, Debug, PartialEq)]
pub struct Value {
    pub name: String,
    pub ty: TensorType,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub name: String,
    pub op: Op,
    pub inputs: Vec<ValueId>,
    pub outputs: Vec<ValueId>,
}

/// A subgraph with static types. Nodes must be in topological order.
#[derive(Clone, Debug)]
pub struct Graph {
    pub name: String,
    pub values: Vec<Value>,
    pub nodes: Vec<Node>,
    pub inputs: Vec<ValueId>,
    pub outputs: Vec<ValueId>,
    /// Constant values and their bytes (little-endian, the value's dtype).
    pub constants: Vec<(ValueId, Weight)>,
}

/// Where a value comes from; used by `validate`.
#[derive(Clone, Copy)]
enum Source {
    Input,
    Constant,
    Node(usize),
}

impl Graph {
    pub fn new(name: impl Into<String>) -> Self {
        Graph {
            name: name.into(),
            values: Vec::new(),
            nodes: Vec::new(),
            inputs: Vec::new(),
            outputs: Vec::new(),
            constants: Vec::new(),
        }
    }

    /// Declares a value; declaring the same name again with the same type
    /// returns the same id.
    pub fn add_value(&mut self, name: &str, ty: TensorType) -> Result<ValueId> {
        if name.is_empty() {
            crate::bail!(InvalidGraph, "graph '{}': a value has an empty name", self.name);
        }
        if let Some(id) = self.value_id(name) {
            let old = &self.values[id].ty;
            if *old != ty {
                crate::bail!(
                    InvalidGraph,
                    "graph '{}': value '{name}' declared as {old} and as {ty}",
                    self.name
                );
            }
            return Ok(id);
        }
        Ok(self.push_value(name.to_string(), ty))
    }

    /// A new value whose name starts with `hint` and is unique in the graph.
    pub fn fresh_value(&mut self, hint: &str, ty: TensorType) -> ValueId {
        let mut name = format!("{hint}#kiln");
        let mut k = 0;
        while self.value_id(&name).is_some() {
            k += 1;
            name = format!("{hint}#kiln{k}");
        }
        self.push_value(name, ty)
    }

    fn push_value(&mut self, name: String, ty: TensorType) -> ValueId {
        self.values.push(Value { name, ty });
        self.values.len() - 1
    }

    pub fn value_id(&self, name: &str) -> Option<ValueId> {
        // Linear, but only tests and small graphs call it; import keeps a map.
        self.values.iter().position(|v| v.name == name)
    }

    pub fn add_node(&mut self, name: &str, op: Op, inputs: Vec<ValueId>, outputs: Vec<ValueId>) {
        self.nodes.push(Node {
            name: name.to_string(),
            op,
            inputs,
            outputs,
        });
    }

    /// Gives f32 value `id` constant contents (row-major, `numel` elements).
    pub fn add_constant(&mut self, id: ValueId, data: Vec<f32>) -> Result<()> {
        self.add_constant_weight(id, Weight::from_vec(data))
    }

    /// Gives value `id` the contents of `t` (whose type must match).
    pub fn add_constant_tensor(&mut self, id: ValueId, t: &Tensor) -> Result<()> {
        let value = self.value(id)?;
        if value.ty != t.ty() {
            crate::bail!(
                InvalidGraph,
                "constant '{}' of type {} given data of type {}",
                value.name,
                value.ty,
                t.ty()
            );
        }
        self.add_constant_weight(id, t.to_weight())
    }

    /// Like [`Graph::add_constant`], for data that already lives in shared
    /// storage (kept in place, not copied); bytes in the value's dtype.
    pub fn add_constant_weight(&mut self, id: ValueId, data: Weight) -> Result<()> {
        let value = self.value(id)?;
        if data.byte_len() != value.ty.byte_len() {
            crate::bail!(
                InvalidGraph,
                "constant '{}' of type {} has {} bytes, expected {}",
                value.name,
                value.ty,
                data.byte_len(),
                value.ty.byte_len()
            );
        }
        if self.constants.iter().any(|(c, _)| *c == id) {
            crate::bail!(InvalidGraph, "constant '{}' is given twice", value.name);
        }
        self.constants.push((id, data));
        Ok(())
    }

    /// The constant data of `id`, if it is a constant.
    pub fn constant(&self, id: ValueId) -> Option<&Weight> {
        self.constants.iter().find(|(c, _)| *c == id).map(|(_, w)| w)
    }

    /// The constant `id` as a host tensor.
    pub fn constant_tensor(&self, id: ValueId) -> Option<Tensor> {
        let w = self.constant(id)?;
        Tensor::from_bytes(self.values[id].ty.dtype, &self.values[id].ty.shape, w.as_bytes()).ok()
    }

    /// For every value, the nodes that read it (a node reading twice is listed twice).
    pub fn consumers(&self) -> Vec<Vec<usize>> {
        let mut c = vec![Vec::new(); self.values.len()];
        for (i, n) in self.nodes.iter().enumerate() {
            for &v in &n.inputs {
                c[v].push(i);
            }
        }
        c
    }

    /// For every value, the node that writes it.
    pub fn producers(&self) -> Vec<Option<usize>> {
        let mut p = vec![None; self.values.len()];
        for (i, n) in self.nodes.iter().enumerate() {
            for &v in &n.outputs {
                p[v] = Some(i);
            }
        }
        p
    }

    pub fn ty(&self, id: ValueId) -> &TensorType {
        &self.values[id].ty
    }

    /// Checks that the graph is well formed and that kiln supports every node.
    pub fn validate(&self) -> Result<()> {
        self.validate_inner()
            .map_err(|e| e.context(format_args!("graph '{}'", self.name)))
    }

    fn validate_inner(&self) -> Result<()> {
        for v in &self.values {
            if v.ty.checked_numel().is_none() {
                crate::bail!(InvalidGraph, "value '{}' of type {} is too large", v.name, v.ty);
            }
        }
        let mut source: Vec<Option<Source>> = vec![None; self.values.len()];
        for &id in &self.inputs {
            self.define(&mut source, id, Source::Input, "graph input")?;
        }
        for (id, data) in &self.constants {
            self.define(&mut source, *id, Source::Constant, "constant")?;
            let v = &self.values[*id];
            if data.byte_len() != v.ty.byte_len() {
                crate::bail!(
                    InvalidGraph,
                    "constant '{}' has {} bytes, its type {} needs {}",
                    v.name,
                    data.byte_len(),
                    v.ty,
                    v.ty.byte_len()
                );
            }
        }
        for i in 0..self.nodes.len() {
            self.validate_node(&mut source, i)
                .map_err(|e| e.context(self.node_label(i)))?;
        }
        for &id in &self.outputs {
            let v = self.value(id)?;
            if source[id].is_none() {
                crate::bail!(
                    InvalidGraph,
                    "graph output '{}' is not produced by any node, input or constant",
                    v.name
                );
            }
        }
        Ok(())
    }

    fn validate_node(&self, source: &mut [Option<Source>], i: usize) -> Result<()> {
        let node = &self.nodes[i];
        let mut in_types = Vec::with_capacity(node.inputs.len());
        for (k, &id) in node.inputs.iter().enumerate() {
            let v = self.value(id)?;
            if source[id].is_none() {
                crate::bail!(
                    InvalidGraph,
                    "input {k} '{}' is not a graph input, a constant or an earlier node's output",
                    v.name
                );
            }
            in_types.push(&v.ty);
        }
        let mut out_types = Vec::with_capacity(node.outputs.len());
        for &id in &node.outputs {
            out_types.push(&self.value(id)?.ty);
        }
        check::check(&node.op, &in_types, &out_types).map_err(Error::invalid_graph)?;
        for &id in &node.outputs {
            self.define(source, id, Source::Node(i), "node output")?;
        }
        Ok(())
    }

    /// Records where `id` comes from, refusing a second producer.
    fn define(&self, source: &mut [Option<Source>], id: ValueId, src: Source, what: &str) -> Result<()> {
        let name = &self.value(id)?.name;
        if let Some(old) = source[id] {
            let old = match old {
                Source::Input => "a graph input".to_string(),
                Source::Constant => "a constant".to_string(),
                Source::Node(n) => format!("the output of {}", self.node_label(n)),
            };
            crate::bail!(
                InvalidGraph,
                "value '{name}' is both {old} and a {what}; each value needs exactly one producer"
            );
        }
        source[id] = Some(src);
        Ok(())
    }

    fn value(&self, id: ValueId) -> Result<&Value> {
        self.values.get(id).ok_or_else(|| {
            Error::invalid_graph(format!("value id {id} is out of range ({} values)", self.values.len()))
        })
    }

    /// "node 'name' (Op)", or "node #i (Op)" for unnamed nodes.
    pub fn node_label(&self, i: usize) -> String {
        match self.nodes.get(i) {
            Some(n) if !n.name.is_empty() => format!("node '{}' ({})", n.name, n.op),
            Some(n) => format!("node #{i} ({})", n.op),
            None => format!("node #{i}"),
        }
    }
}

pub use check::{infer, matmul_dims, MatMulDims};

/// Drops leading 1s: `[1, 1, 768]` → `[768]`.
pub(crate) fn strip_ones(s: &[usize]) -> &[usize] {
    let k = s.iter().take_while(|&&d| d == 1).count();
    &s[k..]
}

#[cfg(test)]
pub(crate) mod tests;
