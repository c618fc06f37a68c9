//! Serialisation of the normalisation and selection steps
//! (`plan::NormStep`, issue #13).

use super::convert::{buf, buf_ref, dtype, usize_of};
use super::proto::{self, step_info::Kind as K};
use crate::error::Result;
use crate::kernels::channel_norm::{GroupNormDims, Lrn};
use crate::kernels::select::{ArgRule, Lanes, TopKRule};
use crate::plan::NormStep;

pub(super) fn norm_info(step: &NormStep) -> K {
    match step {
        NormStep::GroupNorm {
            dims,
            src,
            scale,
            bias,
            dst,
        } => K::GroupNorm(proto::GroupNormStep {
            batch: dims.batch as u64,
            spatial: dims.spatial as u64,
            channels: dims.channels as u64,
            groups: dims.groups as u64,
            epsilon: dims.epsilon,
            src: Some(buf(*src)),
            scale: Some(buf(*scale)),
            bias: Some(buf(*bias)),
            dst: Some(buf(*dst)),
        }),
        NormStep::Lrn {
            lrn,
            channels,
            src,
            dst,
        } => K::Lrn(proto::LrnStep {
            size: lrn.size as u64,
            alpha: lrn.alpha,
            beta: lrn.beta,
            bias: lrn.bias,
            channels: *channels as u64,
            src: Some(buf(*src)),
            dst: Some(buf(*dst)),
        }),
        NormStep::ArgReduce {
            dtype,
            rule,
            lanes,
            src,
            dst,
        } => K::ArgReduce(proto::ArgReduceStep {
            dtype: dtype.onnx_code(),
            min: rule.min,
            last: rule.last,
            outer: lanes.outer as u64,
            len: lanes.len as u64,
            inner: lanes.inner as u64,
            src: Some(buf(*src)),
            dst: Some(buf(*dst)),
        }),
        NormStep::TopK {
            dtype,
            rule,
            lanes,
            src,
            dst,
        } => K::TopK(proto::TopKStep {
            dtype: dtype.onnx_code(),
            k: rule.k as u64,
            largest: rule.largest,
            outer: lanes.outer as u64,
            len: lanes.len as u64,
            inner: lanes.inner as u64,
            src: Some(buf(*src)),
            dst: Some(buf(*dst)),
        }),
    }
}

fn lanes(outer: u64, len: u64, inner: u64) -> Result<Lanes> {
    Ok(Lanes {
        outer: usize_of(outer, "outer size")?,
        len: usize_of(len, "length")?,
        inner: usize_of(inner, "inner size")?,
    })
}

/// The step of a normalisation or selection kind (the caller dispatches only those).
pub(super) fn norm_step(kind: &K) -> Result<NormStep> {
    Ok(match kind {
        K::GroupNorm(g) => NormStep::GroupNorm {
            dims: GroupNormDims {
                batch: usize_of(g.batch, "batch size")?,
                spatial: usize_of(g.spatial, "spatial size")?,
                channels: usize_of(g.channels, "channels")?,
                groups: usize_of(g.groups, "groups")?,
                epsilon: g.epsilon,
            },
            src: buf_ref(&g.src)?,
            scale: buf_ref(&g.scale)?,
            bias: buf_ref(&g.bias)?,
            dst: buf_ref(&g.dst)?,
        },
        K::Lrn(l) => NormStep::Lrn {
            lrn: Lrn {
                size: usize_of(l.size, "LRN size")?,
                alpha: l.alpha,
                beta: l.beta,
                bias: l.bias,
            },
            channels: usize_of(l.channels, "channels")?,
            src: buf_ref(&l.src)?,
            dst: buf_ref(&l.dst)?,
        },
        K::ArgReduce(a) => NormStep::ArgReduce {
            dtype: dtype(a.dtype)?,
            rule: ArgRule {
                min: a.min,
                last: a.last,
            },
            lanes: lanes(a.outer, a.len, a.inner)?,
            src: buf_ref(&a.src)?,
            dst: buf_ref(&a.dst)?,
        },
        K::TopK(t) => NormStep::TopK {
            dtype: dtype(t.dtype)?,
            rule: TopKRule {
                k: usize_of(t.k, "k")?,
                largest: t.largest,
            },
            lanes: lanes(t.outer, t.len, t.inner)?,
            src: buf_ref(&t.src)?,
            dst: buf_ref(&t.dst)?,
        },
        _ => crate::bail!(InvalidGraph, "kiln bug: not a normalisation or selection step"),
    })
}
