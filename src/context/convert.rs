//! `Program` <-> metadata messages. Encoding cannot fail; decoding refuses
//! anything malformed (missing fields, unknown enum values, numbers that do
//! not fit) and leaves the semantic checks to `Program::from_parts`.

use super::proto::{self, buf_info, layout_info, step_info};
use crate::error::{Error, Result};
use crate::ir::{Activation, DType};
use crate::kernels::chain::{Access, ChainOp, Operand};
use crate::kernels::recurrent::{RnnActivation, RnnCell, RnnDims, RnnDirection, RnnSpec};
use crate::kernels::spatial::{Axis, Window};
use crate::kernels::{BinaryOp, CopyPlan, Layout, ReduceKind, Strided, UnaryOp, Where3};
use crate::plan::{
    AttentionShape, AttentionStep, BufRef, ChainStep, Constant, ConvResidual, ConvStep, ConvTransposeStep,
    ConvWeightsRef, EmbedSrc, EmbedStep, EmbedTermStep, MatB, MatBias, MatMulStep, Program, ProgramParts, RnnStep,
    Step, TensorSpec,
};
use crate::target::Target;

// ---- encoding ----

pub(crate) fn graph_info(name: &str, program: &Program, weight_ids: Vec<u32>) -> proto::GraphInfo {
    proto::GraphInfo {
        name: name.to_string(),
        inputs: program.inputs().iter().map(tensor_info).collect(),
        outputs: program.outputs().iter().map(tensor_info).collect(),
        weight_ids,
        program: Some(proto::ProgramInfo {
            arena_bytes: program.arena_bytes() as u64,
            steps: program.steps().iter().map(step_info).collect(),
            op_counts: program
                .op_counts()
                .iter()
                .map(|(op, n)| proto::OpCount {
                    op: op.clone(),
                    count: *n as u64,
                })
                .collect(),
        }),
        generic: None,
    }
}

pub(crate) fn dims(shape: &[usize]) -> Vec<u64> {
    shape.iter().map(|&d| d as u64).collect()
}

fn signed(v: &[isize]) -> Vec<i64> {
    v.iter().map(|&d| d as i64).collect()
}

fn tensor_info(spec: &TensorSpec) -> proto::TensorInfo {
    proto::TensorInfo {
        name: spec.name.clone(),
        dtype: spec.elem_type,
        shape: dims(&spec.shape),
    }
}

fn step_info(step: &Step) -> proto::StepInfo {
    use step_info::Kind as K;
    let kind = match step {
        Step::Unary { op, src, dst } => K::Unary(proto::UnaryStep {
            src: Some(buf(*src)),
            dst: Some(buf(*dst)),
            ..unary_info(*op)
        }),
        Step::Binary {
            op,
            dtype,
            layout,
            a,
            b,
            dst,
        } => K::Binary(proto::BinaryStep {
            op: binary_kind(*op) as i32,
            layout: Some(layout_info(layout)),
            a: Some(buf(*a)),
            b: Some(buf(*b)),
            dst: Some(buf(*dst)),
            dtype: dtype.onnx_code(),
        }),
        Step::Copy { src, dst } => K::Copy(proto::CopyStep {
            src: Some(buf(*src)),
            dst: Some(buf(*dst)),
        }),
        Step::MatMul(m) => {
            let (b, trans_b, packed_b, packed_b_parts) = match m.b {
                MatB::Packed(c) => (None, false, Some(c as u64), Vec::new()),
                MatB::PackedParts(cs) => (None, false, None, cs.map(|c| c as u64).to_vec()),
                MatB::Buf { buf: r, trans_b } => (Some(buf(r)), trans_b, None, Vec::new()),
            };
            let (bias_kind, bias, beta) = match m.bias {
                MatBias::None => (proto::BiasKindInfo::NoBias, None, 0.0),
                MatBias::Row(r) => (proto::BiasKindInfo::Row, Some(buf(r)), 0.0),
                MatBias::Full { buf: r, beta } => (proto::BiasKindInfo::Full, Some(buf(r)), beta),
            };
            K::MatMul(proto::MatMulStep {
                m: m.m as u64,
                n: m.n as u64,
                k: m.k as u64,
                trans_a: m.trans_a,
                a: Some(buf(m.a)),
                b,
                trans_b,
                packed_b,
                packed_b_parts,
                batch_offsets: m.batches.iter().flat_map(|[a, b]| [*a as u64, *b as u64]).collect(),
                alpha: m.alpha,
                bias_kind: bias_kind as i32,
                bias,
                beta,
                activation: Some(activation_info(m.activation)),
                residual: m.residual.map(buf),
                dst: Some(buf(m.dst)),
            })
        }
        Step::Softmax {
            len,
            inner,
            unshifted,
            src,
            dst,
        } => K::Softmax(proto::SoftmaxStep {
            len: *len as u64,
            inner: *inner as u64,
            src: Some(buf(*src)),
            dst: Some(buf(*dst)),
            unshifted: *unshifted,
        }),
        Step::LayerNorm {
            len,
            epsilon,
            decomposed,
            src,
            scale,
            bias,
            dst,
        } => K::LayerNorm(proto::LayerNormStep {
            len: *len as u64,
            epsilon: *epsilon,
            src: Some(buf(*src)),
            scale: Some(buf(*scale)),
            bias: bias.map(buf),
            dst: Some(buf(*dst)),
            decomposed: *decomposed,
        }),
        Step::Reduce {
            kind,
            outer,
            len,
            inner,
            src,
            dst,
        } => K::Reduce(proto::ReduceStep {
            kind: match kind {
                ReduceKind::Sum => proto::ReduceKindInfo::Sum,
                ReduceKind::Mean => proto::ReduceKindInfo::Mean,
                ReduceKind::Max => proto::ReduceKindInfo::Max,
            } as i32,
            outer: *outer as u64,
            len: *len as u64,
            inner: *inner as u64,
            src: Some(buf(*src)),
            dst: Some(buf(*dst)),
        }),
        Step::Strided { dtype, plan, src, dst } => K::Strided(proto::StridedStep {
            dtype: dtype.onnx_code(),
            dims: dims(&plan.dims),
            src_offset: plan.src_offset as u64,
            src_strides: signed(&plan.src_strides),
            dst_offset: plan.dst_offset as u64,
            dst_strides: signed(&plan.dst_strides),
            src: Some(buf(*src)),
            dst: Some(buf(*dst)),
        }),
        Step::Gather {
            dtype,
            idx_dtype,
            outer,
            axis_len,
            inner,
            data,
            indices,
            dst,
        } => K::Gather(proto::GatherStep {
            dtype: dtype.onnx_code(),
            idx_dtype: idx_dtype.onnx_code(),
            outer: *outer as u64,
            axis_len: *axis_len as u64,
            inner: *inner as u64,
            data: Some(buf(*data)),
            indices: Some(buf(*indices)),
            dst: Some(buf(*dst)),
        }),
        Step::Cast { from, to, src, dst } => K::Cast(proto::CastStep {
            from: from.onnx_code(),
            to: to.onnx_code(),
            src: Some(buf(*src)),
            dst: Some(buf(*dst)),
        }),
        Step::Where {
            dtype,
            layout,
            cond,
            x,
            y,
            dst,
        } => K::Where(proto::WhereStep {
            dtype: dtype.onnx_code(),
            dims: dims(&layout.dims),
            c_strides: dims(&layout.c_strides),
            x_strides: dims(&layout.x_strides),
            y_strides: dims(&layout.y_strides),
            cond: Some(buf(*cond)),
            x: Some(buf(*x)),
            y: Some(buf(*y)),
            dst: Some(buf(*dst)),
        }),
        Step::Index(x) => super::convert_index::index_info(x),
        Step::Rnn(r) => K::Rnn(rnn_info(r)),
        Step::Conv(c) => K::Conv(conv_info(c)),
        Step::Pool(p) => super::convert_pool::pool_info(p),
        Step::Norm(x) => super::convert_norm::norm_info(x),
        Step::ConvTranspose(c) => K::ConvTranspose(conv_transpose_info(c)),
        Step::Attention(a) => K::Attention(attention_info(a)),
        Step::EmbedLayerNorm(e) => K::EmbedLayerNorm(embed_info(e)),
        Step::Chain(c) => K::Chain(chain_info(c)),
    };
    proto::StepInfo { kind: Some(kind) }
}

// Convolution (issue #13).
fn conv_info(c: &ConvStep) -> proto::ConvStep {
    let axis = |a: &Axis| {
        [
            a.input,
            a.output,
            a.kernel,
            a.stride,
            a.dilation,
            a.pad_begin,
            a.pad_end,
        ]
    };
    let window = axis(&c.window.h)
        .into_iter()
        .chain(axis(&c.window.w))
        .map(|v| v as u64)
        .collect();
    let ids = |ids: &[usize]| ids.iter().map(|&i| i as u64).collect();
    let (packed_w, depthwise_w) = match &c.weights {
        ConvWeightsRef::Packed(v) | ConvWeightsRef::Winograd(v) => (ids(v), None),
        ConvWeightsRef::Depthwise(w) => (Vec::new(), Some(buf(*w))),
    };
    proto::ConvStep {
        window,
        batch: c.batch as u64,
        in_channels: c.in_channels as u64,
        out_channels: c.out_channels as u64,
        groups: c.groups as u64,
        x: Some(buf(c.x)),
        packed_w,
        depthwise_w,
        bias: c.bias.map(buf),
        activation: Some(activation_info(c.activation)),
        residual: match c.residual {
            Some(ConvResidual::Buf(r)) => Some(buf(r)),
            _ => None,
        },
        residual_in_dst: c.residual == Some(ConvResidual::InDst),
        winograd: matches!(c.weights, ConvWeightsRef::Winograd(_)),
        dst: Some(buf(c.dst)),
        after: (c.after != Activation::None).then(|| activation_info(c.after)),
        dst_stride: stride_info(c.dst_stride, c.out_channels),
    }
}

/// An output pixel stride as the format stores it: 0 when it is `dense`
/// (the channel count, what files before format 8 and 10 meant).
pub(super) fn stride_info(stride: usize, dense: usize) -> u64 {
    if stride == dense {
        0
    } else {
        stride as u64
    }
}

/// [`stride_info`]'s inverse: 0 is `dense`.
pub(super) fn stride_of(stored: u64, dense: usize) -> Result<usize> {
    match stored {
        0 => Ok(dense),
        s => usize_of(s, "output pixel stride"),
    }
}

fn conv(c: &proto::ConvStep) -> Result<ConvStep> {
    let v: Vec<usize> = c
        .window
        .iter()
        .map(|&x| usize_of(x, "window size"))
        .collect::<Result<_>>()?;
    let [hi, ho, hk, hs, hd, hb, he, wi, wo, wk, ws, wd, wb, we] = v[..] else {
        crate::bail!(InvalidGraph, "a convolution window has {} values, not 14", v.len());
    };
    let axis = |input, output, kernel, stride, dilation, pad_begin, pad_end| Axis {
        input,
        output,
        kernel,
        stride,
        dilation,
        pad_begin,
        pad_end,
    };
    let ids = || -> Result<Vec<usize>> { c.packed_w.iter().map(|&i| usize_of(i, "packed constant")).collect() };
    let weights = match (&c.depthwise_w, c.packed_w.is_empty()) {
        (None, false) if c.winograd => ConvWeightsRef::Winograd(ids()?),
        (None, false) => ConvWeightsRef::Packed(ids()?),
        (Some(_), true) if !c.winograd => ConvWeightsRef::Depthwise(buf_ref(&c.depthwise_w)?),
        _ => crate::bail!(InvalidGraph, "a convolution needs exactly one of packed_w, depthwise_w"),
    };
    let opt = |b: &Option<proto::BufInfo>| b.as_ref().map(|_| buf_ref(b)).transpose();
    let out_channels = usize_of(c.out_channels, "output channels")?;
    Ok(ConvStep {
        window: Window {
            h: axis(hi, ho, hk, hs, hd, hb, he),
            w: axis(wi, wo, wk, ws, wd, wb, we),
        },
        batch: usize_of(c.batch, "batch")?,
        in_channels: usize_of(c.in_channels, "input channels")?,
        out_channels,
        groups: usize_of(c.groups, "groups")?,
        x: buf_ref(&c.x)?,
        weights,
        bias: opt(&c.bias)?,
        activation: activation(c.activation.as_ref().ok_or_else(|| missing("activation"))?)?,
        residual: match (opt(&c.residual)?, c.residual_in_dst) {
            (None, false) => None,
            (Some(r), false) => Some(ConvResidual::Buf(r)),
            (None, true) => Some(ConvResidual::InDst),
            (Some(_), true) => crate::bail!(InvalidGraph, "a convolution's residual is both a buffer and its output"),
        },
        after: c
            .after
            .as_ref()
            .map(activation)
            .transpose()?
            .unwrap_or(Activation::None),
        dst: buf_ref(&c.dst)?,
        dst_stride: stride_of(c.dst_stride, out_channels)?,
    })
}

// Fused attention (issue #14).
fn attention_info(a: &AttentionStep) -> proto::AttentionStep {
    let sh = &a.shape;
    proto::AttentionStep {
        batch: sh.batch as u64,
        heads: sh.heads as u64,
        q_len: sh.q_len as u64,
        kv_len: sh.kv_len as u64,
        head_dim: sh.head_dim as u64,
        scale: sh.scale,
        packed_qkv: a.packed_qkv,
        q: Some(buf(a.q)),
        k: Some(buf(a.k)),
        v: Some(buf(a.v)),
        mask: a.mask.map(buf),
        mask_strides: dims(&a.mask_strides),
        dst: Some(buf(a.dst)),
    }
}

fn attention(a: &proto::AttentionStep) -> Result<AttentionStep> {
    let strides = shape(&a.mask_strides)?;
    let mask_strides: [usize; 3] = strides
        .try_into()
        .map_err(|_| Error::invalid_graph("an Attention step's mask strides are not 3"))?;
    Ok(AttentionStep {
        packed_qkv: a.packed_qkv,
        shape: AttentionShape {
            batch: usize_of(a.batch, "batch size")?,
            heads: usize_of(a.heads, "head count")?,
            q_len: usize_of(a.q_len, "query length")?,
            kv_len: usize_of(a.kv_len, "key length")?,
            head_dim: usize_of(a.head_dim, "head size")?,
            scale: a.scale,
        },
        q: buf_ref(&a.q)?,
        k: buf_ref(&a.k)?,
        v: buf_ref(&a.v)?,
        mask: a.mask.as_ref().map(|m| buf_ref(&Some(m.clone()))).transpose()?,
        mask_strides,
        dst: buf_ref(&a.dst)?,
    })
}

// Embeddings + LayerNorm (issue #14).
fn embed_info(e: &EmbedStep) -> proto::EmbedLayerNormStep {
    let term = |t: &EmbedTermStep| {
        let (src, table, idx_dtype) = match t.src {
            EmbedSrc::Gathered {
                table,
                indices,
                idx_dtype,
            } => (indices, Some(buf(table)), idx_dtype.onnx_code()),
            EmbedSrc::Added(b) => (b, None, 0),
        };
        proto::EmbedTermInfo {
            src: Some(buf(src)),
            table,
            idx_dtype,
            strides: dims(&t.strides),
        }
    };
    proto::EmbedLayerNormStep {
        lead: dims(&e.lead),
        width: e.width as u64,
        epsilon: e.epsilon,
        decomposed: e.decomposed,
        scale: Some(buf(e.scale)),
        bias: e.bias.map(buf),
        terms: e.terms.iter().map(term).collect(),
        dst: Some(buf(e.dst)),
    }
}

fn embed(e: &proto::EmbedLayerNormStep) -> Result<EmbedStep> {
    let term = |t: &proto::EmbedTermInfo| -> Result<EmbedTermStep> {
        let src = buf_ref(&t.src)?;
        let src = match &t.table {
            Some(table) => EmbedSrc::Gathered {
                table: buf_ref(&Some(table.clone()))?,
                indices: src,
                idx_dtype: dtype(t.idx_dtype)?,
            },
            None => EmbedSrc::Added(src),
        };
        Ok(EmbedTermStep {
            src,
            strides: shape(&t.strides)?,
        })
    };
    Ok(EmbedStep {
        lead: shape(&e.lead)?,
        width: usize_of(e.width, "row width")?,
        epsilon: e.epsilon,
        decomposed: e.decomposed,
        scale: buf_ref(&e.scale)?,
        bias: e.bias.as_ref().map(|b| buf_ref(&Some(b.clone()))).transpose()?,
        terms: e.terms.iter().map(term).collect::<Result<_>>()?,
        dst: buf_ref(&e.dst)?,
    })
}

fn conv_transpose_info(c: &ConvTransposeStep) -> proto::ConvTransposeStep {
    let axis = |a: &Axis| proto::ConvTransposeAxis {
        input: a.input as u64,
        output: a.output as u64,
        kernel: a.kernel as u64,
        stride: a.stride as u64,
        dilation: a.dilation as u64,
        pad_begin: a.pad_begin as u64,
        pad_end: a.pad_end as u64,
    };
    proto::ConvTransposeStep {
        h: Some(axis(&c.window.h)),
        w: Some(axis(&c.window.w)),
        batch: c.batch as u64,
        groups: c.groups as u64,
        ci: c.ci as u64,
        co: c.co as u64,
        x: Some(buf(c.x)),
        packed_w: c.w.iter().map(|&i| i as u64).collect(),
        bias: c.bias.map(buf),
        dst: Some(buf(c.dst)),
    }
}

fn rnn_info(r: &RnnStep) -> proto::RnnStep {
    let (cell, input_forget, peepholes, lbr) = match r.spec.cell {
        RnnCell::Lstm {
            input_forget,
            peepholes,
        } => (proto::RnnCellKind::Lstm, input_forget, peepholes, false),
        RnnCell::Gru { linear_before_reset } => (proto::RnnCellKind::Gru, false, false, linear_before_reset),
    };
    proto::RnnStep {
        cell: cell as i32,
        input_forget,
        peepholes,
        linear_before_reset: lbr,
        direction: match r.spec.direction {
            RnnDirection::Forward => proto::RnnDirectionKind::Forward,
            RnnDirection::Reverse => proto::RnnDirectionKind::Reverse,
            RnnDirection::Bidirectional => proto::RnnDirectionKind::Bidirectional,
        } as i32,
        hidden: r.spec.hidden as u64,
        activations: r.spec.activations.iter().map(|&a| rnn_activation_info(a)).collect(),
        clip: r.spec.clip,
        seq: r.dims.seq as u64,
        batch: r.dims.batch as u64,
        input: r.dims.input as u64,
        x: Some(buf(r.x)),
        packed_w: r.w as u64,
        packed_r: r.r.iter().map(|&c| c as u64).collect(),
        bias: r.bias.map(buf),
        rbh: r.rbh.map(buf),
        seq_lens: r.seq_lens.map(buf),
        initial_h: r.initial_h.map(buf),
        initial_c: r.initial_c.map(buf),
        p: r.p.map(buf),
        dst: Some(buf(r.dst)),
    }
}

fn rnn_activation_info(a: RnnActivation) -> proto::RnnActivationInfo {
    use proto::RnnActivationKind as K;
    let (kind, alpha, beta) = match a {
        RnnActivation::Sigmoid => (K::Sigmoid, 0.0, 0.0),
        RnnActivation::Tanh => (K::Tanh, 0.0, 0.0),
        RnnActivation::Relu => (K::Relu, 0.0, 0.0),
        RnnActivation::Affine(al, be) => (K::Affine, al, be),
        RnnActivation::LeakyRelu(al) => (K::LeakyRelu, al, 0.0),
        RnnActivation::ThresholdedRelu(al) => (K::ThresholdedRelu, al, 0.0),
        RnnActivation::ScaledTanh(al, be) => (K::ScaledTanh, al, be),
        RnnActivation::HardSigmoid(al, be) => (K::HardSigmoid, al, be),
        RnnActivation::Elu(al) => (K::Elu, al, 0.0),
        RnnActivation::Softsign => (K::Softsign, 0.0, 0.0),
        RnnActivation::Softplus => (K::Softplus, 0.0, 0.0),
    };
    proto::RnnActivationInfo {
        kind: kind as i32,
        alpha,
        beta,
    }
}

fn activation_info(a: Activation) -> proto::ActivationInfo {
    use proto::ActivationKind as K;
    let (kind, x, y) = match a {
        Activation::None => (K::NoActivation, 0.0, 0.0),
        Activation::Relu => (K::Relu, 0.0, 0.0),
        Activation::LeakyRelu(al) => (K::LeakyRelu, al, 0.0),
        Activation::Sigmoid => (K::Sigmoid, 0.0, 0.0),
        Activation::Tanh => (K::Tanh, 0.0, 0.0),
        Activation::GeluErf => (K::GeluErf, 0.0, 0.0),
        Activation::GeluTanh => (K::GeluTanh, 0.0, 0.0),
        Activation::GeluErfWritten => (K::GeluErfWritten, 0.0, 0.0),
        Activation::GeluTanhWritten => (K::GeluTanhWritten, 0.0, 0.0),
        Activation::Clip(lo, hi) => (K::Clip, lo, hi),
        // Activations (issue #13).
        Activation::HardSigmoid(al, be) => (K::HardSigmoid, al, be),
        Activation::HardSwish => (K::HardSwish, 0.0, 0.0),
        Activation::Silu => (K::Silu, 0.0, 0.0),
    };
    proto::ActivationInfo {
        kind: kind as i32,
        a: x,
        b: y,
    }
}

pub(super) fn buf(r: BufRef) -> proto::BufInfo {
    let kind = match r {
        BufRef::Input(i) => buf_info::Kind::Input(i as u64),
        BufRef::Constant(i) => buf_info::Kind::Constant(i as u64),
        BufRef::Output(i) => buf_info::Kind::Output(i as u64),
        BufRef::Scratch { offset, len } => buf_info::Kind::Scratch(proto::ScratchRange {
            offset: offset as u64,
            len: len as u64,
        }),
    };
    proto::BufInfo { kind: Some(kind) }
}

fn layout_info(layout: &Layout) -> proto::LayoutInfo {
    let kind = match layout {
        Layout::Same => layout_info::Kind::Same(proto::Empty {}),
        Layout::ScalarA => layout_info::Kind::ScalarA(proto::Empty {}),
        Layout::ScalarB => layout_info::Kind::ScalarB(proto::Empty {}),
        Layout::RowA { inner } => layout_info::Kind::RowA(*inner as u64),
        Layout::RowB { inner } => layout_info::Kind::RowB(*inner as u64),
        Layout::Strided(s) => layout_info::Kind::Strided(proto::StridedLayout {
            dims: dims(&s.dims),
            a_strides: dims(&s.a_strides),
            b_strides: dims(&s.b_strides),
        }),
    };
    proto::LayoutInfo { kind: Some(kind) }
}

/// A unary op's fields (its buffers unset).
fn unary_info(op: UnaryOp) -> proto::UnaryStep {
    let (alpha, lo, hi) = match op {
        UnaryOp::LeakyRelu(a) => (a, 0.0, 0.0),
        UnaryOp::Clip(lo, hi) => (0.0, lo, hi),
        _ => (0.0, 0.0, 0.0),
    };
    let (alpha, beta) = unary_params(op).unwrap_or((alpha, 0.0));
    proto::UnaryStep {
        op: unary_kind(op) as i32,
        src: None,
        dst: None,
        alpha,
        lo,
        hi,
        beta,
    }
}

fn chain_info(c: &ChainStep) -> proto::ChainStep {
    let operand = |o: Operand| match o {
        Operand::Input(k) => (k as u32, false),
        Operand::Result(r) => (r as u32, true),
    };
    let ops = c
        .ops
        .iter()
        .map(|op| {
            let (unary, binary, a, b) = match *op {
                ChainOp::Unary(u, a) => (Some(unary_info(u)), 0, a, None),
                ChainOp::Binary(k, a, b) => (None, binary_kind(k) as i32, a, Some(b)),
            };
            let (a, a_result) = operand(a);
            let (b, b_result) = b.map_or((0, false), operand);
            proto::ChainOpInfo {
                unary,
                binary,
                a,
                a_result,
                b,
                b_result,
            }
        })
        .collect();
    let inputs = c
        .inputs
        .iter()
        .map(|&(r, access)| {
            let (access, inner, count) = match access {
                Access::Full => (0, 0, 0),
                Access::Scalar => (1, 0, 0),
                Access::Row(inner) => (2, inner as u64, 0),
                Access::Channel { count, inner } => (3, inner as u64, count as u64),
            };
            proto::ChainInputInfo {
                src: Some(buf(r)),
                access,
                inner,
                count,
            }
        })
        .collect();
    proto::ChainStep {
        ops,
        inputs,
        dst: Some(buf(c.dst)),
    }
}

fn chain(c: &proto::ChainStep) -> Result<ChainStep> {
    let operand = |k: u32, result: bool| {
        let k = k as usize;
        if result {
            Operand::Result(k)
        } else {
            Operand::Input(k)
        }
    };
    let ops = c
        .ops
        .iter()
        .map(|o| {
            let a = operand(o.a, o.a_result);
            Ok(match &o.unary {
                Some(u) => ChainOp::Unary(unary_op(u)?, a),
                None => ChainOp::Binary(binary_op(o.binary)?, a, operand(o.b, o.b_result)),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let inputs = c
        .inputs
        .iter()
        .map(|i| {
            let access = match i.access {
                0 => Access::Full,
                1 => Access::Scalar,
                2 => Access::Row(usize_of(i.inner, "chain row length")?),
                3 => Access::Channel {
                    count: usize_of(i.count, "chain channel count")?,
                    inner: usize_of(i.inner, "chain channel run")?,
                },
                n => return Err(Error::invalid_graph(format!("unknown chain input access {n}"))),
            };
            Ok((buf_ref(&i.src)?, access))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(ChainStep {
        ops,
        inputs,
        dst: buf_ref(&c.dst)?,
    })
}

fn unary_kind(op: UnaryOp) -> proto::UnaryOpKind {
    use proto::UnaryOpKind as K;
    match op {
        UnaryOp::Relu => K::Relu,
        UnaryOp::Sigmoid => K::Sigmoid,
        UnaryOp::Tanh => K::Tanh,
        UnaryOp::Neg => K::Neg,
        UnaryOp::Abs => K::Abs,
        UnaryOp::Sqrt => K::Sqrt,
        UnaryOp::Exp => K::Exp,
        UnaryOp::Log => K::Log,
        UnaryOp::Erf => K::Erf,
        UnaryOp::Reciprocal => K::Reciprocal,
        UnaryOp::LeakyRelu(_) => K::LeakyRelu,
        UnaryOp::Clip(..) => K::Clip,
        UnaryOp::Gelu => K::Gelu,
        UnaryOp::GeluTanh => K::GeluTanh,
        UnaryOp::GeluWritten => K::GeluWritten,
        UnaryOp::GeluTanhWritten => K::GeluTanhWritten,
        UnaryOp::Floor => K::Floor,
        UnaryOp::Ceil => K::Ceil,
        UnaryOp::Round => K::Round,
        UnaryOp::Sin => K::Sin,
        UnaryOp::Cos => K::Cos,
        UnaryOp::Sign => K::Sign,
        UnaryOp::Softplus => K::Softplus,
        UnaryOp::Mish => K::Mish,
        UnaryOp::Not => K::Not,
        UnaryOp::IsNaN => K::IsNan,
        UnaryOp::IsInf { negative, positive } => match (negative, positive) {
            (true, true) => K::IsInf,
            (false, true) => K::IsInfPositive,
            (true, false) => K::IsInfNegative,
            (false, false) => K::IsInfNone,
        },
        UnaryOp::HardSigmoid(..) => K::HardSigmoid,
        UnaryOp::HardSwish => K::HardSwish,
        UnaryOp::Silu => K::Silu,
        UnaryOp::Elu(_) => K::Elu,
        UnaryOp::Selu(..) => K::Selu,
        UnaryOp::Celu(_) => K::Celu,
        UnaryOp::ThresholdedRelu(_) => K::ThresholdedRelu,
        UnaryOp::Softsign => K::Softsign,
    }
}

/// The (alpha, beta) step fields of the activations of issue #13.
fn unary_params(op: UnaryOp) -> Option<(f32, f32)> {
    Some(match op {
        UnaryOp::HardSigmoid(alpha, beta) => (alpha, beta),
        UnaryOp::Selu(alpha, gamma) => (alpha, gamma),
        UnaryOp::Elu(alpha) | UnaryOp::Celu(alpha) | UnaryOp::ThresholdedRelu(alpha) => (alpha, 0.0),
        _ => return None,
    })
}

fn binary_kind(op: BinaryOp) -> proto::BinaryOpKind {
    use proto::BinaryOpKind as K;
    match op {
        BinaryOp::Add => K::Add,
        BinaryOp::Sub => K::Sub,
        BinaryOp::Mul => K::Mul,
        BinaryOp::Div => K::Div,
        BinaryOp::Pow => K::Pow,
        BinaryOp::Max => K::Max,
        BinaryOp::Min => K::Min,
        BinaryOp::Mod => K::Mod,
        BinaryOp::Fmod => K::Fmod,
        BinaryOp::Equal => K::Equal,
        BinaryOp::Greater => K::Greater,
        BinaryOp::Less => K::Less,
        BinaryOp::GreaterOrEqual => K::GreaterOrEqual,
        BinaryOp::LessOrEqual => K::LessOrEqual,
        BinaryOp::And => K::And,
        BinaryOp::Or => K::Or,
        BinaryOp::Xor => K::Xor,
        BinaryOp::PRelu => K::PRelu,
    }
}

// ---- decoding ----

/// The parts of graph `g`'s program; `constants` are the file's weights by id.
pub(crate) fn program_parts(g: &proto::GraphInfo, target: Target, constants: &[Constant]) -> Result<ProgramParts> {
    let program = g.program.as_ref().ok_or_else(|| missing("program"))?;
    let mut steps = Vec::with_capacity(program.steps.len());
    for (i, s) in program.steps.iter().enumerate() {
        steps.push(step(s).map_err(|e| e.context(format_args!("step {i}")))?);
    }
    Ok(ProgramParts {
        target,
        inputs: specs("input", &g.inputs)?,
        outputs: specs("output", &g.outputs)?,
        constants: graph_constants(&g.weight_ids, constants)?,
        steps,
        arena_bytes: usize_of(program.arena_bytes, "arena size")?,
        op_counts: program.op_counts.iter().map(op_count).collect::<Result<_>>()?,
    })
}

fn graph_constants(ids: &[u32], constants: &[Constant]) -> Result<Vec<Constant>> {
    ids.iter()
        .map(|&id| {
            constants.get(id as usize).cloned().ok_or_else(|| {
                Error::invalid_graph(format!("weight id {id} is out of range ({} weights)", constants.len()))
            })
        })
        .collect()
}

fn specs(what: &str, infos: &[proto::TensorInfo]) -> Result<Vec<TensorSpec>> {
    infos
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let dtype = dtype(t.dtype).map_err(|e| e.context(format_args!("{what} {i} '{}'", t.name)))?;
            Ok(TensorSpec::new(&t.name, dtype, &shape(&t.shape)?))
        })
        .collect()
}

/// An element type this kiln holds.
pub(crate) fn dtype(code: i32) -> Result<DType> {
    DType::from_onnx(code).ok_or_else(|| {
        Error::invalid_graph(format!(
            "element type {} (code {code}) is not one this kiln reads (float, int64, int32, bool)",
            crate::ir::onnx_type_name(code)
        ))
    })
}

pub(crate) fn shape(dims: &[u64]) -> Result<Vec<usize>> {
    dims.iter().map(|&d| usize_of(d, "dimension")).collect()
}

fn strides(v: &[i64]) -> Result<Vec<isize>> {
    v.iter()
        .map(|&d| isize::try_from(d).map_err(|_| Error::invalid_graph(format!("stride {d} does not fit"))))
        .collect()
}

pub(crate) fn usize_of(n: u64, what: &str) -> Result<usize> {
    usize::try_from(n).map_err(|_| Error::invalid_graph(format!("{what} {n} does not fit in memory")))
}

fn op_count(c: &proto::OpCount) -> Result<(String, usize)> {
    if c.op.is_empty() {
        crate::bail!(InvalidGraph, "an op count has no op name");
    }
    Ok((c.op.clone(), usize_of(c.count, "op count")?))
}

fn step(s: &proto::StepInfo) -> Result<Step> {
    use step_info::Kind as K;
    let kind = s.kind.as_ref().ok_or_else(|| missing("step kind"))?;
    Ok(match kind {
        K::GatherElements(_) | K::GatherNd(_) | K::ScatterNd(_) | K::CumSum(_) | K::OneHot(_) => {
            Step::Index(Box::new(super::convert_index::index_step(kind)?))
        }
        K::Pool(_) | K::Resize(_) => Step::Pool(Box::new(super::convert_pool::pool_step(kind)?)),
        K::GroupNorm(_) | K::Lrn(_) | K::ArgReduce(_) | K::TopK(_) => {
            Step::Norm(Box::new(super::convert_norm::norm_step(kind)?))
        }
        K::Chain(c) => Step::Chain(Box::new(chain(c)?)),
        K::Unary(u) => Step::Unary {
            op: unary_op(u)?,
            src: buf_ref(&u.src)?,
            dst: buf_ref(&u.dst)?,
        },
        K::Binary(b) => Step::Binary {
            op: binary_op(b.op)?,
            dtype: dtype(b.dtype)?,
            layout: layout(&b.layout)?,
            a: buf_ref(&b.a)?,
            b: buf_ref(&b.b)?,
            dst: buf_ref(&b.dst)?,
        },
        K::Copy(c) => Step::Copy {
            src: buf_ref(&c.src)?,
            dst: buf_ref(&c.dst)?,
        },
        K::MatMul(m) => Step::MatMul(Box::new(matmul(m)?)),
        K::Softmax(s) => Step::Softmax {
            len: usize_of(s.len, "length")?,
            inner: usize_of(s.inner, "inner size")?,
            unshifted: s.unshifted,
            src: buf_ref(&s.src)?,
            dst: buf_ref(&s.dst)?,
        },
        K::LayerNorm(l) => Step::LayerNorm {
            len: usize_of(l.len, "length")?,
            epsilon: l.epsilon,
            decomposed: l.decomposed,
            src: buf_ref(&l.src)?,
            scale: buf_ref(&l.scale)?,
            bias: l.bias.as_ref().map(|b| buf_ref(&Some(b.clone()))).transpose()?,
            dst: buf_ref(&l.dst)?,
        },
        K::Reduce(r) => Step::Reduce {
            kind: match proto::ReduceKindInfo::try_from(r.kind) {
                Ok(proto::ReduceKindInfo::Sum) => ReduceKind::Sum,
                Ok(proto::ReduceKindInfo::Mean) => ReduceKind::Mean,
                Ok(proto::ReduceKindInfo::Max) => ReduceKind::Max,
                _ => crate::bail!(InvalidGraph, "unknown reduce kind {}", r.kind),
            },
            outer: usize_of(r.outer, "outer size")?,
            len: usize_of(r.len, "length")?,
            inner: usize_of(r.inner, "inner size")?,
            src: buf_ref(&r.src)?,
            dst: buf_ref(&r.dst)?,
        },
        K::Strided(s) => Step::Strided {
            dtype: dtype(s.dtype)?,
            plan: CopyPlan {
                dims: shape(&s.dims)?,
                src_offset: usize_of(s.src_offset, "offset")?,
                src_strides: strides(&s.src_strides)?,
                dst_offset: usize_of(s.dst_offset, "offset")?,
                dst_strides: strides(&s.dst_strides)?,
            },
            src: buf_ref(&s.src)?,
            dst: buf_ref(&s.dst)?,
        },
        K::Gather(g) => Step::Gather {
            dtype: dtype(g.dtype)?,
            idx_dtype: dtype(g.idx_dtype)?,
            outer: usize_of(g.outer, "outer size")?,
            axis_len: usize_of(g.axis_len, "axis length")?,
            inner: usize_of(g.inner, "inner size")?,
            data: buf_ref(&g.data)?,
            indices: buf_ref(&g.indices)?,
            dst: buf_ref(&g.dst)?,
        },
        K::Cast(c) => Step::Cast {
            from: dtype(c.from)?,
            to: dtype(c.to)?,
            src: buf_ref(&c.src)?,
            dst: buf_ref(&c.dst)?,
        },
        K::Where(w) => Step::Where {
            dtype: dtype(w.dtype)?,
            layout: Where3 {
                dims: shape(&w.dims)?,
                c_strides: shape(&w.c_strides)?,
                x_strides: shape(&w.x_strides)?,
                y_strides: shape(&w.y_strides)?,
            },
            cond: buf_ref(&w.cond)?,
            x: buf_ref(&w.x)?,
            y: buf_ref(&w.y)?,
            dst: buf_ref(&w.dst)?,
        },
        K::Rnn(r) => Step::Rnn(Box::new(rnn(r)?)),
        K::Conv(c) => Step::Conv(Box::new(conv(c)?)),
        K::ConvTranspose(c) => Step::ConvTranspose(Box::new(conv_transpose(c)?)),
        K::Attention(a) => Step::Attention(Box::new(attention(a)?)),
        K::EmbedLayerNorm(e) => Step::EmbedLayerNorm(Box::new(embed(e)?)),
    })
}

fn matmul(m: &proto::MatMulStep) -> Result<MatMulStep> {
    let b = match (m.packed_b, &m.b, &m.packed_b_parts[..]) {
        (Some(c), None, []) => MatB::Packed(usize_of(c, "packed constant")?),
        (None, Some(b), []) => MatB::Buf {
            buf: buf_ref(&Some(b.clone()))?,
            trans_b: m.trans_b,
        },
        (None, None, &[q, k, v]) => MatB::PackedParts([
            usize_of(q, "packed constant")?,
            usize_of(k, "packed constant")?,
            usize_of(v, "packed constant")?,
        ]),
        _ => crate::bail!(
            InvalidGraph,
            "matrix product needs exactly one of b, packed_b and three packed_b_parts"
        ),
    };
    if !m.batch_offsets.len().is_multiple_of(2) {
        crate::bail!(InvalidGraph, "matrix product batch offsets come in pairs");
    }
    let batches = m
        .batch_offsets
        .chunks_exact(2)
        .map(|p| Ok([usize_of(p[0], "batch offset")?, usize_of(p[1], "batch offset")?]))
        .collect::<Result<Vec<_>>>()?;
    let bias = match proto::BiasKindInfo::try_from(m.bias_kind) {
        Ok(proto::BiasKindInfo::NoBias) => MatBias::None,
        Ok(proto::BiasKindInfo::Row) => MatBias::Row(buf_ref(&m.bias)?),
        Ok(proto::BiasKindInfo::Full) => MatBias::Full {
            buf: buf_ref(&m.bias)?,
            beta: m.beta,
        },
        _ => crate::bail!(InvalidGraph, "unknown bias kind {}", m.bias_kind),
    };
    Ok(MatMulStep {
        m: usize_of(m.m, "m")?,
        n: usize_of(m.n, "n")?,
        k: usize_of(m.k, "k")?,
        trans_a: m.trans_a,
        a: buf_ref(&m.a)?,
        b,
        batches,
        alpha: m.alpha,
        bias,
        activation: activation(m.activation.as_ref().ok_or_else(|| missing("activation"))?)?,
        residual: m.residual.as_ref().map(|r| buf_ref(&Some(r.clone()))).transpose()?,
        dst: buf_ref(&m.dst)?,
    })
}

fn activation(a: &proto::ActivationInfo) -> Result<Activation> {
    use proto::ActivationKind as K;
    Ok(match K::try_from(a.kind) {
        Ok(K::NoActivation) => Activation::None,
        Ok(K::Relu) => Activation::Relu,
        Ok(K::LeakyRelu) => Activation::LeakyRelu(a.a),
        Ok(K::Sigmoid) => Activation::Sigmoid,
        Ok(K::Tanh) => Activation::Tanh,
        Ok(K::GeluErf) => Activation::GeluErf,
        Ok(K::GeluTanh) => Activation::GeluTanh,
        Ok(K::GeluErfWritten) => Activation::GeluErfWritten,
        Ok(K::GeluTanhWritten) => Activation::GeluTanhWritten,
        Ok(K::Clip) => Activation::Clip(a.a, a.b),
        // Activations (issue #13).
        Ok(K::HardSigmoid) => Activation::HardSigmoid(a.a, a.b),
        Ok(K::HardSwish) => Activation::HardSwish,
        Ok(K::Silu) => Activation::Silu,
        Ok(K::Unspecified) | Err(_) => crate::bail!(InvalidGraph, "unknown activation code {}", a.kind),
    })
}

fn conv_transpose(c: &proto::ConvTransposeStep) -> Result<ConvTransposeStep> {
    let axis = |a: &Option<proto::ConvTransposeAxis>| -> Result<Axis> {
        let a = a
            .as_ref()
            .ok_or_else(|| Error::invalid_graph("a ConvTranspose step has no window axis"))?;
        Ok(Axis {
            input: usize_of(a.input, "input size")?,
            output: usize_of(a.output, "output size")?,
            kernel: usize_of(a.kernel, "kernel size")?,
            stride: usize_of(a.stride, "stride")?,
            dilation: usize_of(a.dilation, "dilation")?,
            pad_begin: usize_of(a.pad_begin, "padding")?,
            pad_end: usize_of(a.pad_end, "padding")?,
        })
    };
    Ok(ConvTransposeStep {
        window: Window {
            h: axis(&c.h)?,
            w: axis(&c.w)?,
        },
        batch: usize_of(c.batch, "batch size")?,
        groups: usize_of(c.groups, "group count")?,
        ci: usize_of(c.ci, "input channels")?,
        co: usize_of(c.co, "output channels")?,
        x: buf_ref(&c.x)?,
        w: c.packed_w
            .iter()
            .map(|&i| usize_of(i, "packed constant index"))
            .collect::<Result<_>>()?,
        bias: c.bias.as_ref().map(|b| buf_ref(&Some(b.clone()))).transpose()?,
        dst: buf_ref(&c.dst)?,
    })
}

fn rnn(r: &proto::RnnStep) -> Result<RnnStep> {
    let cell = match proto::RnnCellKind::try_from(r.cell) {
        Ok(proto::RnnCellKind::Lstm) => RnnCell::Lstm {
            input_forget: r.input_forget,
            peepholes: r.peepholes,
        },
        Ok(proto::RnnCellKind::Gru) => RnnCell::Gru {
            linear_before_reset: r.linear_before_reset,
        },
        _ => crate::bail!(InvalidGraph, "unknown recurrent cell code {}", r.cell),
    };
    let direction = match proto::RnnDirectionKind::try_from(r.direction) {
        Ok(proto::RnnDirectionKind::Forward) => RnnDirection::Forward,
        Ok(proto::RnnDirectionKind::Reverse) => RnnDirection::Reverse,
        Ok(proto::RnnDirectionKind::Bidirectional) => RnnDirection::Bidirectional,
        _ => crate::bail!(InvalidGraph, "unknown recurrent direction code {}", r.direction),
    };
    let opt = |b: &Option<proto::BufInfo>| b.as_ref().map(|b| buf_ref(&Some(b.clone()))).transpose();
    Ok(RnnStep {
        spec: RnnSpec {
            cell,
            direction,
            hidden: usize_of(r.hidden, "hidden size")?,
            activations: r.activations.iter().map(rnn_activation).collect::<Result<_>>()?,
            clip: r.clip,
        },
        dims: RnnDims {
            seq: usize_of(r.seq, "sequence length")?,
            batch: usize_of(r.batch, "batch size")?,
            input: usize_of(r.input, "input size")?,
        },
        x: buf_ref(&r.x)?,
        w: usize_of(r.packed_w, "packed constant index")?,
        r: r.packed_r
            .iter()
            .map(|&c| usize_of(c, "packed constant index"))
            .collect::<Result<_>>()?,
        bias: opt(&r.bias)?,
        rbh: opt(&r.rbh)?,
        seq_lens: opt(&r.seq_lens)?,
        initial_h: opt(&r.initial_h)?,
        initial_c: opt(&r.initial_c)?,
        p: opt(&r.p)?,
        dst: buf_ref(&r.dst)?,
    })
}

fn rnn_activation(a: &proto::RnnActivationInfo) -> Result<RnnActivation> {
    use proto::RnnActivationKind as K;
    let (al, be) = (a.alpha, a.beta);
    Ok(match K::try_from(a.kind) {
        Ok(K::Sigmoid) => RnnActivation::Sigmoid,
        Ok(K::Tanh) => RnnActivation::Tanh,
        Ok(K::Relu) => RnnActivation::Relu,
        Ok(K::Affine) => RnnActivation::Affine(al, be),
        Ok(K::LeakyRelu) => RnnActivation::LeakyRelu(al),
        Ok(K::ThresholdedRelu) => RnnActivation::ThresholdedRelu(al),
        Ok(K::ScaledTanh) => RnnActivation::ScaledTanh(al, be),
        Ok(K::HardSigmoid) => RnnActivation::HardSigmoid(al, be),
        Ok(K::Elu) => RnnActivation::Elu(al),
        Ok(K::Softsign) => RnnActivation::Softsign,
        Ok(K::Softplus) => RnnActivation::Softplus,
        Ok(K::Unspecified) | Err(_) => crate::bail!(InvalidGraph, "unknown recurrent activation code {}", a.kind),
    })
}

fn unary_op(u: &proto::UnaryStep) -> Result<UnaryOp> {
    use proto::UnaryOpKind as K;
    let code = u.op;
    Ok(match K::try_from(code) {
        Ok(K::Relu) => UnaryOp::Relu,
        Ok(K::Sigmoid) => UnaryOp::Sigmoid,
        Ok(K::Tanh) => UnaryOp::Tanh,
        Ok(K::Neg) => UnaryOp::Neg,
        Ok(K::Abs) => UnaryOp::Abs,
        Ok(K::Sqrt) => UnaryOp::Sqrt,
        Ok(K::Exp) => UnaryOp::Exp,
        Ok(K::Log) => UnaryOp::Log,
        Ok(K::Erf) => UnaryOp::Erf,
        Ok(K::Reciprocal) => UnaryOp::Reciprocal,
        Ok(K::LeakyRelu) => UnaryOp::LeakyRelu(u.alpha),
        Ok(K::Clip) => UnaryOp::Clip(u.lo, u.hi),
        Ok(K::Gelu) => UnaryOp::Gelu,
        Ok(K::GeluTanh) => UnaryOp::GeluTanh,
        Ok(K::GeluWritten) => UnaryOp::GeluWritten,
        Ok(K::GeluTanhWritten) => UnaryOp::GeluTanhWritten,
        Ok(K::Floor) => UnaryOp::Floor,
        Ok(K::Ceil) => UnaryOp::Ceil,
        Ok(K::Round) => UnaryOp::Round,
        Ok(K::Sin) => UnaryOp::Sin,
        Ok(K::Cos) => UnaryOp::Cos,
        Ok(K::Sign) => UnaryOp::Sign,
        Ok(K::Softplus) => UnaryOp::Softplus,
        Ok(K::Mish) => UnaryOp::Mish,
        Ok(K::Not) => UnaryOp::Not,
        Ok(K::IsNan) => UnaryOp::IsNaN,
        Ok(K::IsInf) => is_inf(true, true),
        Ok(K::IsInfPositive) => is_inf(false, true),
        Ok(K::IsInfNegative) => is_inf(true, false),
        Ok(K::IsInfNone) => is_inf(false, false),
        // Activations (issue #13).
        Ok(K::HardSigmoid) => UnaryOp::HardSigmoid(u.alpha, u.beta),
        Ok(K::HardSwish) => UnaryOp::HardSwish,
        Ok(K::Silu) => UnaryOp::Silu,
        Ok(K::Elu) => UnaryOp::Elu(u.alpha),
        Ok(K::Selu) => UnaryOp::Selu(u.alpha, u.beta),
        Ok(K::Celu) => UnaryOp::Celu(u.alpha),
        Ok(K::ThresholdedRelu) => UnaryOp::ThresholdedRelu(u.alpha),
        Ok(K::Softsign) => UnaryOp::Softsign,
        Ok(K::Unspecified) | Err(_) => crate::bail!(InvalidGraph, "unknown unary op code {code}"),
    })
}

fn is_inf(negative: bool, positive: bool) -> UnaryOp {
    UnaryOp::IsInf { negative, positive }
}

fn binary_op(code: i32) -> Result<BinaryOp> {
    use proto::BinaryOpKind as K;
    Ok(match K::try_from(code) {
        Ok(K::Add) => BinaryOp::Add,
        Ok(K::Sub) => BinaryOp::Sub,
        Ok(K::Mul) => BinaryOp::Mul,
        Ok(K::Div) => BinaryOp::Div,
        Ok(K::Pow) => BinaryOp::Pow,
        Ok(K::Max) => BinaryOp::Max,
        Ok(K::Min) => BinaryOp::Min,
        Ok(K::Mod) => BinaryOp::Mod,
        Ok(K::Fmod) => BinaryOp::Fmod,
        Ok(K::Equal) => BinaryOp::Equal,
        Ok(K::Greater) => BinaryOp::Greater,
        Ok(K::Less) => BinaryOp::Less,
        Ok(K::GreaterOrEqual) => BinaryOp::GreaterOrEqual,
        Ok(K::LessOrEqual) => BinaryOp::LessOrEqual,
        Ok(K::And) => BinaryOp::And,
        Ok(K::Or) => BinaryOp::Or,
        Ok(K::Xor) => BinaryOp::Xor,
        Ok(K::PRelu) => BinaryOp::PRelu,
        Ok(K::Unspecified) | Err(_) => crate::bail!(InvalidGraph, "unknown binary op code {code}"),
    })
}

pub(super) fn buf_ref(b: &Option<proto::BufInfo>) -> Result<BufRef> {
    let kind = b
        .as_ref()
        .and_then(|b| b.kind.as_ref())
        .ok_or_else(|| missing("buffer"))?;
    Ok(match kind {
        buf_info::Kind::Input(i) => BufRef::Input(usize_of(*i, "input index")?),
        buf_info::Kind::Constant(i) => BufRef::Constant(usize_of(*i, "constant index")?),
        buf_info::Kind::Output(i) => BufRef::Output(usize_of(*i, "output index")?),
        buf_info::Kind::Scratch(s) => BufRef::Scratch {
            offset: usize_of(s.offset, "scratch offset")?,
            len: usize_of(s.len, "scratch length")?,
        },
    })
}

fn layout(l: &Option<proto::LayoutInfo>) -> Result<Layout> {
    let kind = l
        .as_ref()
        .and_then(|l| l.kind.as_ref())
        .ok_or_else(|| missing("layout"))?;
    Ok(match kind {
        layout_info::Kind::Same(_) => Layout::Same,
        layout_info::Kind::ScalarA(_) => Layout::ScalarA,
        layout_info::Kind::ScalarB(_) => Layout::ScalarB,
        layout_info::Kind::RowA(n) => Layout::RowA {
            inner: usize_of(*n, "row length")?,
        },
        layout_info::Kind::RowB(n) => Layout::RowB {
            inner: usize_of(*n, "row length")?,
        },
        layout_info::Kind::Strided(s) => Layout::Strided(Strided {
            dims: shape(&s.dims)?,
            a_strides: shape(&s.a_strides)?,
            b_strides: shape(&s.b_strides)?,
        }),
    })
}

fn missing(what: &str) -> Error {
    Error::invalid_graph(format!("{what} is missing"))
}
