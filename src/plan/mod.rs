//! A compiled program: plain data (steps over numbered buffers plus a static
//! memory plan), and the interpreter that runs it.
//!
//! Nothing here holds code pointers, so a `Program` can be serialised as is
//! (see `context`); kernels are chosen from `target` each time a step runs.
//! Constants are [`Weight`]s, which can point into a memory-mapped file;
//! GEMM weights are stored already packed for the target ([`Packing`]).
//! [`Program::from_parts`] rebuilds a program from untrusted data and
//! validates it, so that running it can never read out of bounds. Buffers
//! are bytes; each step views them as its element types.

mod validate;
// Normalisation and selection steps (issue #13).
mod norm;

pub use norm::NormStep;

use std::fmt;
use std::sync::{Arc, Mutex};

use crate::tensor::InlineVec;

pub use crate::kernels::{TensorMut, TensorRef};
pub use crate::tensor::DType;
pub use crate::tensor::{AlignedBytes, HugePageBytes, Storage, Weight, STORAGE_ALIGN};

use crate::error::{Error, Result};
pub use crate::kernels::attention::{AttentionShape, Qkv};
use crate::kernels::chain::{Access, ChainOp};
use crate::kernels::gemm::{self, Activation, Bias, Epilogue, PackedB};
use crate::kernels::parallel::Parallel;
use crate::kernels::recurrent::{self, RnnArgs, RnnDims, RnnSpec};
use crate::kernels::{self, half, movement, BinaryOp, CopyPlan, Isa, Layout, ReduceKind, UnaryOp, Where3};
use crate::target::Target;
use crate::tensor::ShapeDisplay;

/// A graph input or output: name, ONNX element type and static shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorSpec {
    pub name: String,
    /// ONNX `TensorProto.DataType` code.
    pub elem_type: i32,
    pub shape: Vec<usize>,
}

impl TensorSpec {
    pub fn new(name: &str, dtype: DType, shape: &[usize]) -> TensorSpec {
        TensorSpec {
            name: name.to_string(),
            elem_type: dtype.onnx_code(),
            shape: shape.to_vec(),
        }
    }

    /// Element count; saturates instead of overflowing (validation rejects such shapes).
    pub fn numel(&self) -> usize {
        self.shape.iter().fold(1usize, |n, &d| n.saturating_mul(d))
    }

    pub fn dtype(&self) -> Option<DType> {
        DType::from_onnx(self.elem_type)
    }
}

/// How a constant's bytes are laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Packing {
    /// Row-major, the constant's dtype and shape.
    None,
    /// A `[k, n]` f32 GEMM B operand packed for the program's target
    /// (`kernels::gemm::PackedB`); its shape is `[k, n]`.
    GemmB { k: usize, n: usize },
}

/// A program constant: type, shape, layout and data. Cheap to clone (a
/// hostile file may reference one weight many times).
#[derive(Clone, Debug)]
pub struct Constant {
    pub dtype: DType,
    pub shape: Arc<[usize]>,
    pub data: Weight,
    pub packing: Packing,
}

impl Constant {
    pub fn plain(dtype: DType, shape: &[usize], data: Weight) -> Constant {
        Constant {
            dtype,
            shape: shape.into(),
            data,
            packing: Packing::None,
        }
    }
}

/// Where a step reads or writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BufRef {
    /// The caller's input `i`.
    Input(usize),
    /// The program's constant `i`.
    Constant(usize),
    /// The caller's output `i`.
    Output(usize),
    /// `len` bytes of the scratch arena starting at byte `offset`.
    Scratch { offset: usize, len: usize },
}

/// The B operand of a matrix product.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MatB {
    /// A constant packed at compile time ([`Packing::GemmB`]).
    Packed(usize),
    /// Three such constants side by side, read as one B of their summed
    /// width (Q, K and V's projections as one product; see
    /// `kernels::gemm::gemm_packed_parts`).
    PackedParts([usize; 3]),
    /// Row-major `[k, n]` blocks (`[n, k]` when `trans_b`).
    Buf { buf: BufRef, trans_b: bool },
}

/// The bias a matrix product adds before its activation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum MatBias {
    None,
    /// `n` values, one per column.
    Row(BufRef),
    /// `beta ·` a tensor of the output's size.
    Full {
        buf: BufRef,
        beta: f32,
    },
}

/// `dst[i] = act(alpha · A_i · B_i + bias_i) + residual_i` for each batch
/// `i`, where `A_i` is the `m×k` block (`k×m` when `trans_a`) at element
/// `batches[i][0]` of `a`, `B_i` the `k×n` block at `batches[i][1]` of `b`
/// (always 0 when packed), and output block `i` starts at `i·m·n`.
#[derive(Clone, Debug, PartialEq)]
pub struct MatMulStep {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub trans_a: bool,
    pub a: BufRef,
    pub b: MatB,
    pub batches: Vec<[usize; 2]>,
    pub alpha: f32,
    pub bias: MatBias,
    pub activation: Activation,
    pub residual: Option<BufRef>,
    pub dst: BufRef,
}

/// A recurrent layer over a whole sequence (`kernels::recurrent`): `w` and
/// `r` are constants packed at compile time ([`Packing::GemmB`]): `w` all
/// directions' `W` (`k = input`, `n = dirs * gates * hidden`), `r` each
/// direction's parts of `R` (`RnnCell::r_part_rows`). `dst` holds the
/// outputs and the workspace (`RnnDims::out_len`).
#[derive(Clone, Debug, PartialEq)]
pub struct RnnStep {
    pub spec: RnnSpec,
    pub dims: RnnDims,
    pub x: BufRef,
    pub w: usize,
    pub r: Vec<usize>,
    pub bias: Option<BufRef>,
    pub rbh: Option<BufRef>,
    /// int32.
    pub seq_lens: Option<BufRef>,
    pub initial_h: Option<BufRef>,
    pub initial_c: Option<BufRef>,
    pub p: Option<BufRef>,
    pub dst: BufRef,
}

impl RnnStep {
    /// The optional f32 inputs and `seq_lens`, in [`recurrent::RnnLens`] order.
    fn optional(&self) -> [(Option<BufRef>, DType); 6] {
        [
            (self.bias, DType::F32),
            (self.rbh, DType::F32),
            (self.seq_lens, DType::I32),
            (self.initial_h, DType::F32),
            (self.initial_c, DType::F32),
            (self.p, DType::F32),
        ]
    }
}

/// How a convolution step holds its weights (issue #13).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConvWeightsRef {
    /// One constant per group, packed ([`Packing::GemmB`]) as `[kh·kw·Ci/g, Co/g]`
    /// (`kernels::conv::pack_groups`).
    Packed(Vec<usize>),
    /// Depthwise: a plain f32 constant `[kh·kw, C]`.
    Depthwise(BufRef),
    /// A 3×3 stride-1 convolution's Winograd weights (format 12): 16
    /// constants packed as `[Ci, Co]` (`kernels::winograd::pack`).
    Winograd(Vec<usize>),
}

/// Where a convolution's residual is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ConvResidual {
    /// A buffer of its own, of the output's size.
    Buf(BufRef),
    /// The destination, which holds the residual when the step starts
    /// (format 9): the planner gives the output the residual's buffer when
    /// nothing reads the residual afterwards (`kernels::conv::conv_onto`).
    InDst,
}

/// A channels-last convolution (`kernels::conv`): `x [batch, H, W, Ci]` to
/// `dst [batch, Ho, Wo, Co]` = `after(act(conv(x) + bias) + residual)`;
/// with `dst_stride > Co`, `dst` is `[batch, Ho, Wo, dst_stride]` of which
/// the step writes the first `Co` values of each pixel (its channels of a
/// concat's output, written in place; never with a residual).
#[derive(Clone, Debug, PartialEq)]
pub struct ConvStep {
    pub window: crate::kernels::spatial::Window,
    pub batch: usize,
    pub in_channels: usize,
    pub out_channels: usize,
    pub groups: usize,
    pub x: BufRef,
    pub weights: ConvWeightsRef,
    pub bias: Option<BufRef>,
    pub activation: Activation,
    pub residual: Option<ConvResidual>,
    /// After the residual; `None` without one.
    pub after: Activation,
    pub dst: BufRef,
    /// Values between output pixels: `out_channels`, or more (format 8).
    pub dst_stride: usize,
}

/// A channels-last transposed convolution (`kernels::conv_transpose`): `x`
/// `[batch, h.input, w.input, ci]`, `w` one constant per group packed at
/// compile time ([`Packing::GemmB`], `k = ci / groups`, `n = kh · kw · co /
/// groups`, tap-major columns), optional `bias` `[co]`, `dst` `[batch,
/// h.output, w.output, co]`.
#[derive(Clone, Debug, PartialEq)]
pub struct ConvTransposeStep {
    pub window: kernels::spatial::Window,
    pub batch: usize,
    pub groups: usize,
    pub ci: usize,
    pub co: usize,
    pub x: BufRef,
    pub w: Vec<usize>,
    pub bias: Option<BufRef>,
    pub dst: BufRef,
}

/// Fused multi-head attention (`kernels::attention`, issue #14): `q` and
/// `dst` `[batch, q_len, heads·head_dim]`, `k` and `v` `[batch, kv_len,
/// heads·head_dim]` (f32), and an optional additive f32 `mask` read with
/// `mask_strides` (batch, head, query row; keys contiguous: see
/// `kernels::attention::Mask`). With `packed_qkv`, `q` (= `k` = `v`) is
/// one `[batch, len, 3·heads·head_dim]` tensor: Q, K and V side by side.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionStep {
    pub shape: AttentionShape,
    pub packed_qkv: bool,
    pub q: BufRef,
    pub k: BufRef,
    pub v: BufRef,
    pub mask: Option<BufRef>,
    pub mask_strides: [usize; 3],
    pub dst: BufRef,
}

/// f32 elementwise ops in one pass (`kernels::chain`, issue #14): `dst`
/// gets the last op's result; each input is read as its [`Access`] says.
#[derive(Clone, Debug, PartialEq)]
pub struct ChainStep {
    pub ops: Vec<ChainOp>,
    pub inputs: Vec<(BufRef, Access)>,
    pub dst: BufRef,
}

/// Embeddings summed and layer-normalised (`kernels::embed`, issue #14):
/// `dst` is `[lead.., width]` (f32); each row the sum of its terms' rows in
/// order, normalised with `scale` and `bias` (`width` values each).
#[derive(Clone, Debug, PartialEq)]
pub struct EmbedStep {
    pub lead: Vec<usize>,
    pub width: usize,
    pub epsilon: f32,
    /// As `Step::LayerNorm`'s.
    pub decomposed: bool,
    pub scale: BufRef,
    pub bias: Option<BufRef>,
    pub terms: Vec<EmbedTermStep>,
    pub dst: BufRef,
}

/// One summand of an [`EmbedStep`]: where its rows come from, and per dim
/// of `lead` the step between them in rows (0 where it broadcasts).
#[derive(Clone, Debug, PartialEq)]
pub struct EmbedTermStep {
    pub src: EmbedSrc,
    pub strides: Vec<usize>,
}

/// See [`EmbedTermStep`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum EmbedSrc {
    /// Rows of `table` (`[rows, width]` f32) at `indices` (`idx_dtype`).
    Gathered {
        table: BufRef,
        indices: BufRef,
        idx_dtype: DType,
    },
    /// Rows of an f32 value.
    Added(BufRef),
}

/// One instruction of a program.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    /// f32 elementwise.
    Unary {
        op: UnaryOp,
        src: BufRef,
        dst: BufRef,
    },
    /// Broadcasting, on `dtype` elements.
    Binary {
        op: BinaryOp,
        dtype: DType,
        layout: Layout,
        a: BufRef,
        b: BufRef,
        dst: BufRef,
    },
    /// Byte copy of equal-sized buffers.
    Copy {
        src: BufRef,
        dst: BufRef,
    },
    MatMul(Box<MatMulStep>),
    /// Softmax along `len` of `[outer, len, inner]` (f32); `unshifted`:
    /// without subtracting the maximum (see `ir::Op::Softmax`).
    Softmax {
        len: usize,
        inner: usize,
        unshifted: bool,
        src: BufRef,
        dst: BufRef,
    },
    /// Layer normalisation of rows of `len` (f32); `decomposed`: with the
    /// decomposed ops' statistics (see `ir::Op::LayerNorm`).
    LayerNorm {
        len: usize,
        epsilon: f32,
        decomposed: bool,
        src: BufRef,
        scale: BufRef,
        bias: Option<BufRef>,
        dst: BufRef,
    },
    /// `[outer, len, inner]` reduced along `len` (f32).
    Reduce {
        kind: ReduceKind,
        outer: usize,
        len: usize,
        inner: usize,
        src: BufRef,
        dst: BufRef,
    },
    /// Transpose, slice, concat part, split part, expand: a strided copy of
    /// `dtype` elements. Several steps may write parts of one destination.
    Strided {
        dtype: DType,
        plan: CopyPlan,
        src: BufRef,
        dst: BufRef,
    },
    /// `data` `[outer, axis_len, inner]` gathered by `indices` (`idx_dtype`).
    Gather {
        dtype: DType,
        idx_dtype: DType,
        outer: usize,
        axis_len: usize,
        inner: usize,
        data: BufRef,
        indices: BufRef,
        dst: BufRef,
    },
    Cast {
        from: DType,
        to: DType,
        src: BufRef,
        dst: BufRef,
    },
    /// `dst = cond ? x : y` on `dtype` elements.
    Where {
        dtype: DType,
        layout: Where3,
        cond: BufRef,
        x: BufRef,
        y: BufRef,
        dst: BufRef,
    },
    // Shape and indexing ops (issue #12).
    /// GatherElements, GatherND, ScatterND, CumSum, OneHot.
    Index(Box<IndexStep>),
    // Recurrent layers (issue #12).
    Rnn(Box<RnnStep>),
    // Convolution (issue #13).
    Conv(Box<ConvStep>),
    // Pools and resize (issue #13).
    /// MaxPool, AveragePool, MaxPool's indices, Resize (channels-last).
    Pool(Box<PoolStep>),
    // Normalisation and selection ops (issue #13).
    /// GroupNorm (InstanceNorm), LRN, ArgMax / ArgMin, TopK.
    Norm(Box<NormStep>),
    // Transposed convolution (issue #13).
    ConvTranspose(Box<ConvTransposeStep>),
    /// Fused attention (issue #14).
    Attention(Box<AttentionStep>),
    /// Embeddings + LayerNorm (issue #14).
    EmbedLayerNorm(Box<EmbedStep>),
    /// Elementwise ops in one pass (issue #14).
    Chain(Box<ChainStep>),
}

impl Step {
    pub fn dst(&self) -> BufRef {
        match self {
            Step::Unary { dst, .. }
            | Step::Binary { dst, .. }
            | Step::Copy { dst, .. }
            | Step::Softmax { dst, .. }
            | Step::LayerNorm { dst, .. }
            | Step::Reduce { dst, .. }
            | Step::Strided { dst, .. }
            | Step::Gather { dst, .. }
            | Step::Cast { dst, .. }
            | Step::Where { dst, .. } => *dst,
            Step::MatMul(m) => m.dst,
            Step::Index(x) => x.dst(),
            Step::Rnn(r) => r.dst,
            Step::Conv(c) => c.dst,
            Step::Pool(p) => p.dst(),
            Step::Norm(x) => x.dst(),
            Step::ConvTranspose(c) => c.dst,
            Step::Attention(a) => a.dst,
            Step::EmbedLayerNorm(e) => e.dst,
            Step::Chain(c) => c.dst,
        }
    }

    /// Every buffer the step reads.
    pub fn srcs(&self) -> Vec<BufRef> {
        self.typed_srcs().into_iter().map(|(r, _)| r).collect()
    }

    /// Every buffer read with the element type it is read as (`None`: raw bytes).
    pub(crate) fn typed_srcs(&self) -> Vec<(BufRef, Option<DType>)> {
        use DType::*;
        match self {
            Step::Unary { op, src, .. } => vec![(*src, Some(op.src_dtype()))],
            Step::Softmax { src, .. } | Step::Reduce { src, .. } => vec![(*src, Some(F32))],
            Step::Binary { a, b, dtype, .. } => vec![(*a, Some(*dtype)), (*b, Some(*dtype))],
            Step::Copy { src, .. } => vec![(*src, None)],
            Step::MatMul(m) => {
                let mut v = vec![(m.a, Some(F32))];
                if let MatB::Buf { buf, .. } = m.b {
                    v.push((buf, Some(F32)));
                }
                match m.bias {
                    MatBias::None => {}
                    MatBias::Row(b) | MatBias::Full { buf: b, .. } => v.push((b, Some(F32))),
                }
                v.extend(m.residual.map(|r| (r, Some(F32))));
                v
            }
            Step::LayerNorm { src, scale, bias, .. } => {
                let mut v = vec![(*src, Some(F32)), (*scale, Some(F32))];
                v.extend(bias.map(|b| (b, Some(F32))));
                v
            }
            Step::Strided { src, dtype, .. } => vec![(*src, Some(*dtype))],
            Step::Gather {
                data,
                indices,
                dtype,
                idx_dtype,
                ..
            } => vec![(*data, Some(*dtype)), (*indices, Some(*idx_dtype))],
            Step::Cast { src, from, .. } => vec![(*src, Some(*from))],
            Step::Where { cond, x, y, dtype, .. } => vec![(*cond, Some(Bool)), (*x, Some(*dtype)), (*y, Some(*dtype))],
            Step::Index(x) => x.typed_srcs(),
            Step::Norm(x) => x.typed_srcs(),
            Step::Rnn(r) => {
                let mut v = vec![(r.x, Some(F32))];
                v.extend(r.optional().iter().filter_map(|(b, t)| b.map(|b| (b, Some(*t)))));
                v
            }
            Step::Conv(c) => {
                let mut v = vec![(c.x, Some(F32))];
                if let ConvWeightsRef::Depthwise(w) = c.weights {
                    v.push((w, Some(F32)));
                }
                v.extend(c.bias.map(|b| (b, Some(F32))));
                if let Some(ConvResidual::Buf(r)) = c.residual {
                    v.push((r, Some(F32)));
                }
                v
            }
            Step::Pool(p) => p.typed_srcs(),
            Step::ConvTranspose(c) => {
                let mut v = vec![(c.x, Some(F32))];
                v.extend(c.bias.map(|b| (b, Some(F32))));
                v
            }
            Step::Attention(a) => {
                let mut v = vec![(a.q, Some(F32)), (a.k, Some(F32)), (a.v, Some(F32))];
                v.extend(a.mask.map(|m| (m, Some(F32))));
                v
            }
            Step::Chain(c) => c.inputs.iter().map(|&(b, _)| (b, Some(F32))).collect(),
            Step::EmbedLayerNorm(e) => {
                let mut v = vec![(e.scale, Some(F32))];
                v.extend(e.bias.map(|b| (b, Some(F32))));
                for t in &e.terms {
                    match t.src {
                        EmbedSrc::Gathered {
                            table,
                            indices,
                            idx_dtype,
                        } => v.extend([(table, Some(F32)), (indices, Some(idx_dtype))]),
                        EmbedSrc::Added(b) => v.push((b, Some(F32))),
                    }
                }
                v
            }
        }
    }

    /// The element type the destination is written as (`None`: raw bytes).
    pub(crate) fn dst_dtype(&self) -> Option<DType> {
        match self {
            Step::Unary { op, .. } => Some(op.dst_dtype()),
            Step::Binary { op, dtype, .. } => Some(op.dst_dtype(*dtype)),
            Step::MatMul(_)
            | Step::Softmax { .. }
            | Step::LayerNorm { .. }
            | Step::Reduce { .. }
            | Step::Rnn(_)
            | Step::Conv(_)
            | Step::ConvTranspose(_)
            | Step::Attention(_)
            | Step::EmbedLayerNorm(_)
            | Step::Chain(_) => Some(DType::F32),
            Step::Strided { dtype, .. } | Step::Gather { dtype, .. } | Step::Where { dtype, .. } => Some(*dtype),
            Step::Cast { to, .. } => Some(*to),
            Step::Copy { .. } => None,
            Step::Index(x) => Some(x.dst_dtype()),
            Step::Pool(p) => Some(p.dst_dtype()),
            Step::Norm(x) => Some(x.dst_dtype()),
        }
    }

    /// Short kind name for messages.
    pub fn kind(&self) -> String {
        match self {
            Step::Unary { op, .. } => format!("{op:?}"),
            Step::Binary { op, dtype, .. } => format!("{op:?} on {dtype}"),
            Step::Copy { .. } => "Copy".into(),
            Step::MatMul(_) => "MatMul".into(),
            Step::Softmax { .. } => "Softmax".into(),
            Step::LayerNorm { .. } => "LayerNorm".into(),
            Step::Reduce { kind, .. } => format!("{kind:?}"),
            Step::Strided { .. } => "StridedCopy".into(),
            Step::Gather { .. } => "Gather".into(),
            Step::Cast { from, to, .. } => format!("Cast {from}->{to}"),
            Step::Where { .. } => "Where".into(),
            Step::Index(x) => x.kind().into(),
            Step::Rnn(r) => r.spec.cell.onnx_name().into(),
            Step::Conv(_) => "Conv".into(),
            Step::Pool(p) => p.kind().into(),
            Step::Norm(x) => x.kind().into(),
            Step::ConvTranspose(_) => "ConvTranspose".into(),
            Step::Attention(_) => "Attention".into(),
            Step::EmbedLayerNorm(_) => "EmbedLayerNorm".into(),
            Step::Chain(c) => {
                let names: Vec<&str> = c.ops.iter().map(ChainOp::onnx_name).collect();
                format!("Chain({})", names.join("+"))
            }
        }
    }
}

/// A compiled subgraph, ready to run on any host that supports its target.
/// Cloning shares the constants' storage.
#[derive(Clone)]
pub struct Program {
    pub(crate) target: Target,
    pub(crate) inputs: Vec<TensorSpec>,
    pub(crate) outputs: Vec<TensorSpec>,
    pub(crate) constants: Vec<Constant>,
    /// For each constant with [`Packing::GemmB`], its kernel view (made
    /// from the stored bytes, never re-packed).
    pub(crate) packed: Vec<Option<Arc<PackedB>>>,
    pub(crate) steps: Vec<Step>,
    pub(crate) arena_bytes: usize,
    /// How many nodes of each op the optimised graph had.
    pub(crate) op_counts: Vec<(String, usize)>,
    /// Run-time cache, not part of the program's meaning; shared by the
    /// programs of one shape-generic partition (`share_scratch`).
    pub(crate) scratch: Arc<ScratchPool>,
}

/// Everything a [`Program`] is made of, e.g. as read back from a file.
#[derive(Clone, Debug)]
pub struct ProgramParts {
    pub target: Target,
    pub inputs: Vec<TensorSpec>,
    pub outputs: Vec<TensorSpec>,
    pub constants: Vec<Constant>,
    pub steps: Vec<Step>,
    /// Scratch arena size in bytes.
    pub arena_bytes: usize,
    pub op_counts: Vec<(String, usize)>,
}

impl Program {
    /// Rebuilds a program from (possibly corrupt or hostile) parts, checking
    /// everything a run relies on; `Err(InvalidGraph)` says what is wrong.
    /// Packed weights are adopted as stored: no packing happens here.
    pub fn from_parts(parts: ProgramParts) -> Result<Program> {
        let mut packed = Vec::with_capacity(parts.constants.len());
        for (i, c) in parts.constants.iter().enumerate() {
            packed.push(match c.packing {
                Packing::None => None,
                Packing::GemmB { k, n } => Some(Arc::new(
                    PackedB::from_parts(parts.target, k, n, c.data.clone())
                        .map_err(|e| e.context(format_args!("corrupt kiln program: constant {i}")))?,
                )),
            });
        }
        let p = Program {
            target: parts.target,
            inputs: parts.inputs,
            outputs: parts.outputs,
            constants: parts.constants,
            packed,
            steps: parts.steps,
            arena_bytes: parts.arena_bytes,
            op_counts: parts.op_counts,
            scratch: Arc::default(),
        };
        p.validate()?;
        Ok(p)
    }

    /// Checks buffer references, types, lengths, layouts and sizes: a program
    /// that passes cannot make `run` read or write out of bounds.
    pub fn validate(&self) -> Result<()> {
        validate::check(self).map_err(|e| e.context("corrupt kiln program"))
    }

    pub fn target(&self) -> Target {
        self.target
    }

    pub fn inputs(&self) -> &[TensorSpec] {
        &self.inputs
    }

    pub fn outputs(&self) -> &[TensorSpec] {
        &self.outputs
    }

    pub fn steps(&self) -> &[Step] {
        &self.steps
    }

    pub fn constants(&self) -> &[Constant] {
        &self.constants
    }

    /// Ops of the optimised graph and how often each occurs.
    pub fn op_counts(&self) -> &[(String, usize)] {
        &self.op_counts
    }

    pub fn num_steps(&self) -> usize {
        self.steps.len()
    }

    /// Takes the scratch arenas from `pool`, which other programs of the
    /// same partition share: a run at a new input shape then reuses the
    /// memory (already faulted in) that the last shape's runs left.
    pub(crate) fn share_scratch(&mut self, pool: Arc<ScratchPool>) {
        self.scratch = pool;
    }

    /// Scratch memory one run needs.
    pub fn arena_bytes(&self) -> usize {
        self.arena_bytes
    }

    pub fn constant_bytes(&self) -> usize {
        self.constants.iter().map(|c| c.data.byte_len()).sum()
    }

    /// Constants stored packed for the GEMM.
    pub fn packed_constants(&self) -> usize {
        self.packed.iter().filter(|p| p.is_some()).count()
    }

    /// e.g. "MatMul+Bias x2, Add x1"; "none" for a program with no ops.
    pub fn op_summary(&self) -> String {
        if self.op_counts.is_empty() {
            return "none".to_string();
        }
        let parts: Vec<String> = self.op_counts.iter().map(|(op, n)| format!("{op} x{n}")).collect();
        parts.join(", ")
    }

    /// Runs the program. Safe to call from several threads at once; big
    /// steps are split over `par`.
    pub fn run(
        &self,
        host: Target,
        inputs: &[TensorRef<'_>],
        outputs: &mut [TensorMut<'_>],
        par: &dyn Parallel,
    ) -> Result<()> {
        let isa = self.check_target(host)?;
        self.check_io(inputs, outputs)?;
        let mut arena = self.scratch.take(self.arena_bytes)?;
        // Inline lists: a Run allocates nothing in steady state (issue #14).
        let ins: InlineVec<&[u8], 16> = inputs.iter().map(|t| t.bytes()).collect();
        let mut outs: InlineVec<&mut [u8], 16> = outputs.iter_mut().map(|t| t.bytes_mut()).collect();
        let result = self.execute(isa, &ins, &mut outs, arena.bytes_mut(), par);
        self.scratch.give(arena);
        result
    }

    /// Refuses a target newer than `host` (the caller's view, which may be
    /// capped by `KILN_MAX_TARGET`) or than this CPU really supports.
    fn check_target(&self, host: Target) -> Result<Isa> {
        let cpu = Target::cpu_best();
        for (limit, what) in [(host, "the host"), (cpu, "this CPU")] {
            if !self.target.can_run_on(limit) {
                crate::bail!(
                    InvalidGraph,
                    "kiln program was compiled for {} ({}) but {what} supports only {} ({}); \
                     recompile it for {}",
                    self.target,
                    self.target.description(),
                    limit,
                    limit.description(),
                    limit
                );
            }
        }
        Isa::new(self.target).ok_or_else(|| Error::fail("CPU support check disagrees"))
    }

    fn check_io(&self, inputs: &[TensorRef<'_>], outputs: &[TensorMut<'_>]) -> Result<()> {
        check_count("input", &self.inputs, inputs.len())?;
        check_count("output", &self.outputs, outputs.len())?;
        for (spec, t) in self.inputs.iter().zip(inputs) {
            check_tensor("input", spec, t.elem_type(), t.len())?;
        }
        for (spec, t) in self.outputs.iter().zip(outputs) {
            check_tensor("output", spec, t.elem_type(), t.len())?;
        }
        Ok(())
    }

    fn execute(
        &self,
        isa: Isa,
        inputs: &[&[u8]],
        outputs: &mut [&mut [u8]],
        arena: &mut [u8],
        par: &dyn Parallel,
    ) -> Result<()> {
        let mut mem = Memory {
            inputs,
            constants: &self.constants,
            packed: &self.packed,
            outputs,
            arena,
        };
        for (i, step) in self.steps.iter().enumerate() {
            mem.run_step(isa, step, par)
                .map_err(|e| e.context(format_args!("kiln step {i} ({})", step.kind())))?;
        }
        Ok(())
    }
}

fn check_count(what: &str, specs: &[TensorSpec], got: usize) -> Result<()> {
    if specs.len() != got {
        crate::bail!(
            InvalidArgument,
            "kiln program takes {} {what}(s), got {got}",
            specs.len()
        );
    }
    Ok(())
}

fn check_tensor(what: &str, spec: &TensorSpec, elem_type: i32, got: usize) -> Result<()> {
    if spec.elem_type != elem_type {
        crate::bail!(
            InvalidArgument,
            "{what} '{}' is {}, got {}",
            spec.name,
            crate::tensor::onnx_type_name(spec.elem_type),
            crate::tensor::onnx_type_name(elem_type)
        );
    }
    if spec.numel() != got {
        crate::bail!(
            InvalidArgument,
            "{what} '{}' of shape {} needs {} elements, got {got}",
            spec.name,
            ShapeDisplay(&spec.shape),
            spec.numel()
        );
    }
    Ok(())
}

impl fmt::Debug for Program {
    // By hand, so that constants print as sizes rather than every value.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Program")
            .field("target", &self.target)
            .field("inputs", &self.inputs)
            .field("outputs", &self.outputs)
            .field("constant_bytes", &self.constant_bytes())
            .field("arena_bytes", &self.arena_bytes)
            .field("steps", &self.steps)
            .finish()
    }
}

/// The buffers one run works on.
struct Memory<'r, 'i, 'o> {
    inputs: &'r [&'i [u8]],
    constants: &'r [Constant],
    packed: &'r [Option<Arc<PackedB>>],
    outputs: &'r mut [&'o mut [u8]],
    arena: &'r mut [u8],
}

/// Read-only view of everything but the step's destination.
struct Sources<'v> {
    inputs: &'v [&'v [u8]],
    constants: &'v [Constant],
    outputs_before: &'v [&'v mut [u8]],
    outputs_after: &'v [&'v mut [u8]],
    /// Output index of the destination, or `outputs.len()` when it is scratch.
    hole: usize,
    arena_before: &'v [u8],
    arena_after: &'v [u8],
    /// Arena range of the destination (empty at the end when it is an output).
    arena_hole: (usize, usize),
}

fn cast_err() -> Error {
    Error::runtime("corrupt kiln program: a buffer is misaligned or mis-sized for its element type")
}

fn as_f32_mut(b: &mut [u8]) -> Result<&mut [f32]> {
    bytemuck::try_cast_slice_mut(b).map_err(|_| cast_err())
}

/// Runs `f` with `src`/`dst` viewed as elements of `size` bytes' bit patterns.
macro_rules! by_size {
    ($size:expr, $src:expr, $dst:expr, |$s:ident, $d:ident| $body:expr) => {
        match $size {
            1 => {
                let ($s, $d) = ($src, $dst);
                $body
            }
            2 => {
                let $s: &[u16] = bytemuck::try_cast_slice($src).map_err(|_| cast_err())?;
                let $d: &mut [u16] = bytemuck::try_cast_slice_mut($dst).map_err(|_| cast_err())?;
                $body
            }
            4 => {
                let $s: &[u32] = bytemuck::try_cast_slice($src).map_err(|_| cast_err())?;
                let $d: &mut [u32] = bytemuck::try_cast_slice_mut($dst).map_err(|_| cast_err())?;
                $body
            }
            _ => {
                let $s: &[u64] = bytemuck::try_cast_slice($src).map_err(|_| cast_err())?;
                let $d: &mut [u64] = bytemuck::try_cast_slice_mut($dst).map_err(|_| cast_err())?;
                $body
            }
        }
    };
}

mod index;
pub use index::IndexStep;
mod pool;
pub use pool::PoolStep;

impl Memory<'_, '_, '_> {
    fn run_step(&mut self, isa: Isa, step: &Step, par: &dyn Parallel) -> Result<()> {
        let packed = self.packed;
        let (src, dst) = self.split(step.dst())?;
        match step {
            Step::Unary { op, src: s, .. } => match (op.src_dtype(), op.dst_dtype()) {
                (DType::F32, DType::F32) => kernels::unary(isa, *op, src.f32(*s)?, as_f32_mut(dst)?, par),
                (DType::F32, DType::Bool) => kernels::unary_to_bool(isa, *op, src.f32(*s)?, dst, par),
                _ => kernels::not(src.get(*s)?, dst),
            },
            Step::Binary {
                op,
                dtype,
                layout,
                a,
                b,
                ..
            } if op.dst_dtype(*dtype) == DType::Bool => {
                kernels::binary_to_bool(isa, *op, *dtype, layout, src.get(*a)?, src.get(*b)?, dst, par)
            }
            Step::Binary {
                op,
                dtype,
                layout,
                a,
                b,
                ..
            } => match dtype {
                DType::F32 => kernels::binary(isa, *op, layout, src.f32(*a)?, src.f32(*b)?, as_f32_mut(dst)?, par),
                DType::I64 => kernels::binary_i64(isa, *op, layout, src.typed(*a)?, src.typed(*b)?, typed_mut(dst)?),
                DType::I32 => kernels::binary_i32(isa, *op, layout, src.typed(*a)?, src.typed(*b)?, typed_mut(dst)?),
                DType::Bool | DType::F16 => Err(cast_err()),
            },
            Step::Copy { src: s, .. } => {
                let s = src.get(*s)?;
                if s.len() != dst.len() {
                    return Err(cast_err());
                }
                dst.copy_from_slice(s);
                Ok(())
            }
            Step::MatMul(m) => matmul(isa, m, &src, packed, as_f32_mut(dst)?, par),
            Step::Softmax {
                len,
                inner,
                unshifted,
                src: s,
                ..
            } => kernels::softmax(isa, *len, *inner, !*unshifted, src.f32(*s)?, as_f32_mut(dst)?, par),
            Step::LayerNorm {
                len,
                epsilon,
                decomposed,
                src: s,
                scale,
                bias,
                ..
            } => {
                let bias = bias.map(|b| src.f32(b)).transpose()?;
                kernels::layer_norm(
                    isa,
                    *len,
                    *epsilon,
                    *decomposed,
                    src.f32(*s)?,
                    src.f32(*scale)?,
                    bias,
                    as_f32_mut(dst)?,
                    par,
                )
            }
            Step::Reduce {
                kind,
                outer,
                len,
                inner,
                src: s,
                ..
            } => kernels::reduce(isa, *kind, *outer, *len, *inner, src.f32(*s)?, as_f32_mut(dst)?, par),
            Step::Strided {
                dtype, plan, src: s, ..
            } => {
                let s = src.get(*s)?;
                let size = dtype.size();
                if !plan.fits(s.len() / size, dst.len() / size) {
                    return Err(cast_err());
                }
                by_size!(size, s, dst, |s, d| movement::strided_copy_par(isa, plan, s, d, par));
                Ok(())
            }
            Step::Gather {
                dtype,
                idx_dtype,
                outer,
                axis_len,
                inner,
                data,
                indices,
                ..
            } => {
                // The indices as they are: no per-run i64 copy.
                let (idx64, idx32) = match idx_dtype {
                    DType::I64 => (src.typed::<i64>(*indices)?, &[][..]),
                    DType::I32 => (&[][..], src.typed::<i32>(*indices)?),
                    _ => return Err(cast_err()),
                };
                let s = src.get(*data)?;
                let size = dtype.size();
                let want_src = outer * axis_len * inner * size;
                let want_dst = outer * (idx64.len() + idx32.len()) * inner * size;
                if s.len() != want_src || dst.len() != want_dst {
                    return Err(cast_err());
                }
                if *idx_dtype == DType::I64 {
                    by_size!(size, s, dst, |s, d| movement::gather(*axis_len, *inner, idx64, s, d))
                } else {
                    by_size!(size, s, dst, |s, d| movement::gather(*axis_len, *inner, idx32, s, d))
                }
            }
            Step::Cast { from, to, src: s, .. } => cast(*from, *to, src.get(*s)?, dst),
            Step::Where {
                dtype,
                layout,
                cond,
                x,
                y,
                ..
            } => {
                let (c, xs, ys) = (src.get(*cond)?, src.get(*x)?, src.get(*y)?);
                let size = dtype.size();
                if !layout.fits(c.len(), xs.len() / size, ys.len() / size, dst.len() / size) {
                    return Err(cast_err());
                }
                match size {
                    1 => movement::where_select(layout, c, xs, ys, dst),
                    2 => movement::where_select::<u16>(layout, c, cast_ref(xs)?, cast_ref(ys)?, typed_mut(dst)?),
                    4 => movement::where_select::<u32>(layout, c, cast_ref(xs)?, cast_ref(ys)?, typed_mut(dst)?),
                    _ => movement::where_select::<u64>(layout, c, cast_ref(xs)?, cast_ref(ys)?, typed_mut(dst)?),
                }
                Ok(())
            }
            Step::Index(x) => x.run(&src, dst),
            Step::Rnn(r) => rnn(isa, r, &src, packed, as_f32_mut(dst)?, par),
            Step::Conv(c) => conv(isa, c, &src, packed, as_f32_mut(dst)?, par),
            Step::Pool(p) => p.run(isa, &src, dst, par),
            Step::Norm(x) => x.run(&src, dst, par),
            Step::ConvTranspose(c) => conv_transpose(isa, c, &src, packed, as_f32_mut(dst)?, par),
            Step::Attention(a) => attention(isa, a, &src, as_f32_mut(dst)?, par),
            Step::EmbedLayerNorm(e) => embed_layer_norm(isa, e, &src, as_f32_mut(dst)?, par),
            Step::Chain(c) => chain(isa, c, &src, as_f32_mut(dst)?, par),
        }
    }

    /// Splits off `dst` mutably and leaves the rest readable: the borrow
    /// checker then proves that no step reads the buffer it writes.
    fn split(&mut self, dst: BufRef) -> Result<(Sources<'_>, &mut [u8])> {
        let n_out = self.outputs.len();
        let arena_len = self.arena.len();
        let (hole, arena_hole) = match dst {
            BufRef::Output(i) if i < n_out => (i, (arena_len, arena_len)),
            BufRef::Scratch { offset, len } => match offset.checked_add(len) {
                Some(end) if end <= arena_len => (n_out, (offset, end)),
                _ => return Err(bad_ref(dst)),
            },
            _ => return Err(bad_ref(dst)),
        };
        let (outputs_before, rest) = self.outputs.split_at_mut(hole);
        let (out_dst, outputs_after) = match rest {
            [d, after @ ..] => (Some(d), &*after),
            [] => (None, &[][..]),
        };
        let (arena_before, rest) = self.arena.split_at_mut(arena_hole.0);
        let (arena_dst, arena_after) = rest.split_at_mut(arena_hole.1 - arena_hole.0);
        let dst: &mut [u8] = match out_dst {
            Some(d) => d,
            None => arena_dst,
        };
        let src = Sources {
            inputs: self.inputs,
            constants: self.constants,
            outputs_before,
            outputs_after,
            hole,
            arena_before,
            arena_after,
            arena_hole,
        };
        Ok((src, dst))
    }
}

fn cast_ref<T: bytemuck::Pod>(b: &[u8]) -> Result<&[T]> {
    bytemuck::try_cast_slice(b).map_err(|_| cast_err())
}

fn typed_mut<T: bytemuck::Pod>(b: &mut [u8]) -> Result<&mut [T]> {
    bytemuck::try_cast_slice_mut(b).map_err(|_| cast_err())
}

fn matmul(
    isa: Isa,
    m: &MatMulStep,
    src: &Sources<'_>,
    packed: &[Option<Arc<PackedB>>],
    dst: &mut [f32],
    par: &dyn Parallel,
) -> Result<()> {
    let (mm, n, k) = (m.m, m.n, m.k);
    let block = mm * n;
    let a = src.f32(m.a)?;
    let bias = match m.bias {
        MatBias::None => None,
        MatBias::Row(b) | MatBias::Full { buf: b, .. } => Some(src.f32(b)?),
    };
    let residual = m.residual.map(|r| src.f32(r)).transpose()?;
    let b = match m.b {
        MatB::Buf { buf, .. } => Some(src.f32(buf)?),
        MatB::Packed(_) | MatB::PackedParts(_) => None,
    };
    if dst.len() != block * m.batches.len() {
        return Err(cast_err());
    }
    let lda = if m.trans_a { mm } else { k };
    let packed_b = |c: usize| packed.get(c).and_then(|p| p.as_deref()).ok_or_else(cast_err);
    let one = |i: usize, out: &mut [f32], par: &dyn Parallel| -> Result<()> {
        let [ao, bo] = m.batches[i];
        let a_i = a.get(ao..ao + mm * k).ok_or_else(cast_err)?;
        let bias = match (m.bias, bias) {
            (MatBias::Row(_), Some(row)) => Bias::PerColumn(row),
            (MatBias::Full { beta, .. }, Some(full)) => Bias::Full {
                c: block_of(full, i, block)?,
                beta,
            },
            _ => Bias::None,
        };
        let epi = Epilogue {
            alpha: m.alpha,
            bias,
            activation: m.activation,
            residual: residual.map(|r| block_of(r, i, block)).transpose()?,
        };
        match (m.b, b) {
            (MatB::Packed(c), _) => gemm::gemm_packed(isa, mm, a_i, lda, packed_b(c)?, out, n, &epi, par)?,
            (MatB::PackedParts(cs), _) => {
                let parts = [packed_b(cs[0])?, packed_b(cs[1])?, packed_b(cs[2])?];
                gemm::gemm_packed_parts(isa, mm, a_i, lda, &parts, out, n, &epi, par)?;
            }
            (MatB::Buf { trans_b, .. }, Some(b)) => {
                let b_i = b.get(bo..bo + k * n).ok_or_else(cast_err)?;
                let ldb = if trans_b { k } else { n };
                gemm::gemm(isa, mm, n, k, a_i, lda, m.trans_a, b_i, ldb, trans_b, out, n, &epi, par)?;
            }
            _ => return Err(cast_err()),
        }
        Ok(())
    };
    let batches = m.batches.len();
    let flops = 2 * mm * n * k;
    if block > 0 && batches >= 2 && par.threads() > 1 && batches >= par.threads() && flops < BATCH_PARALLEL_MAX_FLOPS {
        // Many small products (attention's per-head Q·Kᵀ and P·V): one task
        // per product, each on one thread, instead of splitting each product
        // (a dispatch per product). Same results: a GEMM's results do not
        // depend on its `Parallel`.
        let blocks = kernels::parallel::Blocks::new(dst.len(), block, block);
        return kernels::parallel::try_for_each_block(par, dst, blocks, &|i, out| {
            one(i, out, &kernels::parallel::Serial)
        });
    }
    for i in 0..batches {
        one(i, &mut dst[i * block..(i + 1) * block], par)?;
    }
    Ok(())
}

fn attention(isa: Isa, a: &AttentionStep, src: &Sources<'_>, dst: &mut [f32], par: &dyn Parallel) -> Result<()> {
    let mask = a
        .mask
        .map(|m| -> Result<_> {
            Ok(kernels::attention::Mask {
                data: src.f32(m)?,
                strides: a.mask_strides,
            })
        })
        .transpose()?;
    let qkv = if a.packed_qkv {
        Qkv::Packed(src.f32(a.q)?)
    } else {
        Qkv::Separate {
            q: src.f32(a.q)?,
            k: src.f32(a.k)?,
            v: src.f32(a.v)?,
        }
    };
    kernels::attention::attention(isa, &a.shape, qkv, mask, dst, par)
}

fn chain(isa: Isa, c: &ChainStep, src: &Sources<'_>, dst: &mut [f32], par: &dyn Parallel) -> Result<()> {
    // Inline: no allocation per run.
    let mut inputs: InlineVec<(Access, &[f32]), { kernels::chain::MAX_CHAIN_INPUTS }> = InlineVec::default();
    for &(b, access) in &c.inputs {
        inputs.push((access, src.f32(b)?));
    }
    kernels::chain::run(isa, &c.ops, &inputs, dst, par)
}

fn embed_layer_norm(isa: Isa, e: &EmbedStep, src: &Sources<'_>, dst: &mut [f32], par: &dyn Parallel) -> Result<()> {
    use kernels::embed::{Indices, Rows, Term};
    // Inline: no allocation per run for up to four terms.
    let mut terms: InlineVec<Term<'_>, 4> = InlineVec::default();
    for t in &e.terms {
        let rows = match t.src {
            EmbedSrc::Gathered {
                table,
                indices,
                idx_dtype,
            } => {
                let indices = match idx_dtype {
                    DType::I64 => Indices::I64(src.typed(indices)?),
                    DType::I32 => Indices::I32(src.typed(indices)?),
                    _ => return Err(cast_err()),
                };
                Rows::Gathered {
                    table: src.f32(table)?,
                    indices,
                }
            }
            EmbedSrc::Added(b) => Rows::Added(src.f32(b)?),
        };
        terms.push(Term {
            rows,
            strides: &t.strides,
        });
    }
    let shape = kernels::embed::EmbedShape {
        lead: &e.lead,
        width: e.width,
        epsilon: e.epsilon,
        decomposed: e.decomposed,
    };
    let bias = e.bias.map(|b| src.f32(b)).transpose()?;
    kernels::embed_layer_norm(isa, &shape, &terms, src.f32(e.scale)?, bias, dst, par)
}

fn conv_transpose(
    isa: Isa,
    c: &ConvTransposeStep,
    src: &Sources<'_>,
    packed: &[Option<Arc<PackedB>>],
    dst: &mut [f32],
    par: &dyn Parallel,
) -> Result<()> {
    let w =
        c.w.iter()
            .map(|&i| packed.get(i).and_then(|p| p.as_deref()).ok_or_else(cast_err))
            .collect::<Result<Vec<_>>>()?;
    let args = kernels::conv_transpose::ConvTransposeArgs {
        window: &c.window,
        batch: c.batch,
        groups: c.groups,
        ci: c.ci,
        co: c.co,
        x: src.f32(c.x)?,
        w: &w,
        bias: c.bias.map(|b| src.f32(b)).transpose()?,
    };
    kernels::conv_transpose::conv_transpose(isa, &args, dst, par)
}

fn rnn(
    isa: Isa,
    r: &RnnStep,
    src: &Sources<'_>,
    packed: &[Option<Arc<PackedB>>],
    dst: &mut [f32],
    par: &dyn Parallel,
) -> Result<()> {
    let pack = |c: usize| packed.get(c).and_then(|p| p.as_deref()).ok_or_else(cast_err);
    let f32_of = |b: Option<BufRef>| b.map(|b| src.f32(b)).transpose();
    let args = RnnArgs {
        x: src.f32(r.x)?,
        w: pack(r.w)?,
        r: r.r.iter().map(|&c| pack(c)).collect::<Result<_>>()?,
        bias: f32_of(r.bias)?,
        rbh: f32_of(r.rbh)?,
        seq_lens: r.seq_lens.map(|b| src.typed::<i32>(b)).transpose()?,
        initial_h: f32_of(r.initial_h)?,
        initial_c: f32_of(r.initial_c)?,
        p: f32_of(r.p)?,
    };
    recurrent::rnn(isa, &r.spec, &r.dims, &args, dst, par)
}

/// A convolution step (issue #13).
fn conv(
    isa: Isa,
    c: &ConvStep,
    src: &Sources<'_>,
    packed: &[Option<Arc<PackedB>>],
    dst: &mut [f32],
    par: &dyn Parallel,
) -> Result<()> {
    use kernels::conv::{Conv, ConvWeights};
    let pack = |i: usize| packed.get(i).and_then(|p| p.as_deref()).ok_or_else(cast_err);
    let groups: Vec<&PackedB> = match &c.weights {
        ConvWeightsRef::Packed(ids) | ConvWeightsRef::Winograd(ids) => {
            ids.iter().map(|&i| pack(i)).collect::<Result<_>>()?
        }
        ConvWeightsRef::Depthwise(_) => Vec::new(),
    };
    let weights = match c.weights {
        ConvWeightsRef::Packed(_) => ConvWeights::Packed(&groups),
        ConvWeightsRef::Winograd(_) => ConvWeights::Winograd(&groups),
        ConvWeightsRef::Depthwise(w) => ConvWeights::Depthwise(src.f32(w)?),
    };
    let args = Conv {
        window: &c.window,
        batch: c.batch,
        in_channels: c.in_channels,
        out_channels: c.out_channels,
        groups: c.groups,
        x: src.f32(c.x)?,
        weights,
        bias: c.bias.map(|b| src.f32(b)).transpose()?,
        activation: c.activation,
        residual: match c.residual {
            Some(ConvResidual::Buf(r)) => Some(src.f32(r)?),
            _ => None,
        },
        after: c.after,
    };
    if c.residual == Some(ConvResidual::InDst) {
        return kernels::conv::conv_onto(isa, &args, dst, par);
    }
    kernels::conv::conv_strided(isa, &args, dst, c.dst_stride, par)
}

/// Batched products of at most this many flops each run one product per
/// task when there are at least as many products as threads.
const BATCH_PARALLEL_MAX_FLOPS: usize = 1 << 24;

fn block_of(t: &[f32], i: usize, block: usize) -> Result<&[f32]> {
    t.get(i * block..(i + 1) * block).ok_or_else(cast_err)
}

fn cast(from: DType, to: DType, src: &[u8], dst: &mut [u8]) -> Result<()> {
    if src.len() / from.size() != dst.len() / to.size() {
        return Err(cast_err());
    }
    match (from, to) {
        (DType::F16, DType::F16) => dst.copy_from_slice(src),
        (DType::F16, DType::F32) => half::f16_to_f32_slice(cast_ref(src)?, typed_mut(dst)?),
        (DType::F32, DType::F16) => half::f32_to_f16_slice(cast_ref(src)?, typed_mut(dst)?),
        (DType::F16, _) | (_, DType::F16) => cast_through_f32(from, to, src, dst)?,
        (DType::I64, _) => {
            let s = cast_ref::<i64>(src)?;
            match to {
                DType::I64 => typed_mut::<i64>(dst)?.copy_from_slice(s),
                DType::I32 => s.iter().zip(typed_mut::<i32>(dst)?).for_each(|(&x, d)| *d = x as i32),
                DType::F32 => s.iter().zip(typed_mut::<f32>(dst)?).for_each(|(&x, d)| *d = x as f32),
                DType::Bool => s.iter().zip(dst.iter_mut()).for_each(|(&x, d)| *d = u8::from(x != 0)),
                DType::F16 => return Err(cast_err()), // matched above
            }
        }
        (DType::F32, DType::F32) => dst.copy_from_slice(src),
        (DType::F32, DType::I64) => kernels::cast_f32_i64(cast_ref(src)?, typed_mut(dst)?),
        (DType::F32, DType::I32) => kernels::cast_f32_i32(cast_ref(src)?, typed_mut(dst)?),
        (DType::F32, DType::Bool) => convert(src, dst, |x: f32| u8::from(x != 0.0))?,
        (DType::I32, DType::F32) => convert(src, dst, |x: i32| x as f32)?,
        (DType::I32, DType::I32) => dst.copy_from_slice(src),
        (DType::I32, DType::I64) => convert(src, dst, |x: i32| i64::from(x))?,
        (DType::I32, DType::Bool) => convert(src, dst, |x: i32| u8::from(x != 0))?,
        (DType::Bool, DType::F32) => convert(src, dst, |x: u8| f32::from(u8::from(x != 0)))?,
        (DType::Bool, DType::I32) => convert(src, dst, |x: u8| i32::from(x != 0))?,
        (DType::Bool, DType::I64) => convert(src, dst, |x: u8| i64::from(x != 0))?,
        (DType::Bool, DType::Bool) => convert(src, dst, |x: u8| u8::from(x != 0))?,
    }
    Ok(())
}

/// Element-by-element conversion of equal-length typed buffers (one pass,
/// no temporary: a bool mask cast to float runs at memory speed).
fn convert<S: bytemuck::Pod, D: bytemuck::Pod>(src: &[u8], dst: &mut [u8], f: impl Fn(S) -> D) -> Result<()> {
    let s = cast_ref::<S>(src)?;
    s.iter().zip(typed_mut::<D>(dst)?).for_each(|(&x, d)| *d = f(x));
    Ok(())
}

/// A cast between float16 and a type other than float goes through float,
/// as ORT's CPU EP casts (int64 -> float -> float16; float16 -> float ->
/// int32, NaN and inf giving i32::MIN), a block at a time.
fn cast_through_f32(from: DType, to: DType, src: &[u8], dst: &mut [u8]) -> Result<()> {
    const BLOCK: usize = 256;
    let mut buf = [0f32; BLOCK];
    let n = src.len() / from.size();
    for start in (0..n).step_by(BLOCK) {
        let len = BLOCK.min(n - start);
        let f = &mut buf[..len];
        let s = &src[start * from.size()..(start + len) * from.size()];
        let d = &mut dst[start * to.size()..(start + len) * to.size()];
        cast(from, DType::F32, s, bytemuck::cast_slice_mut(f))?;
        cast(DType::F32, to, bytemuck::cast_slice(f), d)?;
    }
    Ok(())
}

impl Sources<'_> {
    fn get(&self, r: BufRef) -> Result<&[u8]> {
        let found = match r {
            BufRef::Input(i) => self.inputs.get(i).map(|s| &**s),
            BufRef::Constant(i) => self.constants.get(i).map(|c| c.data.as_bytes()),
            BufRef::Output(i) if i < self.hole => self.outputs_before.get(i).map(|s| &**s),
            BufRef::Output(i) if i > self.hole => self.outputs_after.get(i - self.hole - 1).map(|s| &**s),
            BufRef::Output(_) => None,
            BufRef::Scratch { offset, len } => self.scratch(offset, len),
        };
        found.ok_or_else(|| bad_ref(r))
    }

    fn f32(&self, r: BufRef) -> Result<&[f32]> {
        cast_ref(self.get(r)?)
    }

    fn typed<T: bytemuck::Pod>(&self, r: BufRef) -> Result<&[T]> {
        cast_ref(self.get(r)?)
    }

    fn scratch(&self, offset: usize, len: usize) -> Option<&[u8]> {
        let end = offset.checked_add(len)?;
        let (hole_start, hole_end) = self.arena_hole;
        if end <= hole_start {
            self.arena_before.get(offset..end)
        } else if offset >= hole_end {
            self.arena_after.get(offset - hole_end..end - hole_end)
        } else {
            None // overlaps the destination
        }
    }
}

fn bad_ref(r: BufRef) -> Error {
    Error::runtime(format!(
        "corrupt kiln program: {r:?} is out of range or overlaps the step's destination"
    ))
}

/// Scratch arenas kept between runs, one per concurrent caller at most.
#[derive(Default)]
pub(crate) struct ScratchPool {
    free: Mutex<Vec<Arena>>,
}

/// Arenas kept at most; more only happens under heavy concurrency.
const MAX_POOLED: usize = 16;

/// One run's scratch memory. Arenas of a huge page or more are mapped with
/// transparent huge pages where the system offers them: the first run at a
/// new image size faulted a PP-OCRv4 det arena (54 MB) in 4 KiB at a time,
/// which took longer than the run itself.
pub(crate) enum Arena {
    Small(AlignedBytes),
    Huge(HugePageBytes),
}

impl Arena {
    fn zeroed(len: usize) -> Result<Arena> {
        if len >= HugePageBytes::HUGE_PAGE {
            if let Ok(b) = HugePageBytes::zeroed(len) {
                return Ok(Arena::Huge(b));
            }
        }
        let blocks = len.div_ceil(STORAGE_ALIGN);
        let mut probe: Vec<u8> = Vec::new();
        // Fail cleanly rather than abort when the arena cannot be allocated.
        probe
            .try_reserve_exact(blocks * STORAGE_ALIGN)
            .map_err(|_| Error::runtime(format!("kiln could not allocate {len} bytes of scratch memory")))?;
        drop(probe);
        Ok(Arena::Small(AlignedBytes::zeroed(len)))
    }

    fn len(&self) -> usize {
        match self {
            Arena::Small(b) => b.len(),
            Arena::Huge(b) => b.bytes().len(),
        }
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            Arena::Small(b) => b.bytes_mut(),
            Arena::Huge(b) => b.bytes_mut(),
        }
    }
}

impl ScratchPool {
    /// An arena of at least `len` bytes: a kept one if it is large enough
    /// (another shape's program may have left it), else a new one; one that
    /// replaces a smaller kept arena (the input grew) gets a quarter more,
    /// so that the next few larger sizes fit it too.
    fn take(&self, len: usize) -> Result<Arena> {
        if len == 0 {
            return Ok(Arena::Small(AlignedBytes::zeroed(0)));
        }
        let kept = self.lock().pop();
        match kept {
            Some(v) if v.len() >= len => Ok(v),
            Some(v) => Arena::zeroed(len.max(v.len().saturating_add(v.len() / 4))),
            None => Arena::zeroed(len),
        }
    }

    fn give(&self, v: Arena) {
        let mut free = self.lock();
        if v.len() > 0 && free.len() < MAX_POOLED {
            free.push(v);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Arena>> {
        // A panic elsewhere cannot leave the pool inconsistent: it only holds buffers.
        self.free.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Clone for ScratchPool {
    fn clone(&self) -> Self {
        ScratchPool::default()
    }
}

#[cfg(test)]
mod tests;
