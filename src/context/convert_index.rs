//! Serialisation of the indexing steps (`plan::IndexStep`, issue #12).

use super::convert::{buf, buf_ref, dims, dtype, shape, usize_of};
use super::proto::{self, step_info::Kind as K, ScatterReductionKind as R};
use crate::error::Result;
use crate::kernels::index::ScatterReduction;
use crate::plan::IndexStep;

pub(super) fn index_info(step: &IndexStep) -> K {
    match step {
        IndexStep::GatherElements {
            dtype,
            idx_dtype,
            data_dims,
            idx_dims,
            axis,
            data,
            indices,
            dst,
        } => K::GatherElements(proto::GatherElementsStep {
            dtype: dtype.onnx_code(),
            idx_dtype: idx_dtype.onnx_code(),
            data_dims: dims(data_dims),
            idx_dims: dims(idx_dims),
            axis: *axis as u64,
            data: Some(buf(*data)),
            indices: Some(buf(*indices)),
            dst: Some(buf(*dst)),
        }),
        IndexStep::GatherNd {
            dtype,
            idx_dtype,
            batch,
            dims: d,
            slice,
            data,
            indices,
            dst,
        } => K::GatherNd(proto::GatherNdStep {
            dtype: dtype.onnx_code(),
            idx_dtype: idx_dtype.onnx_code(),
            batch: *batch as u64,
            dims: dims(d),
            slice: *slice as u64,
            data: Some(buf(*data)),
            indices: Some(buf(*indices)),
            dst: Some(buf(*dst)),
        }),
        IndexStep::ScatterNd {
            dtype,
            idx_dtype,
            reduction,
            dims: d,
            slice,
            data,
            indices,
            updates,
            dst,
        } => K::ScatterNd(proto::ScatterNdStep {
            dtype: dtype.onnx_code(),
            idx_dtype: idx_dtype.onnx_code(),
            reduction: reduction_kind(*reduction) as i32,
            dims: dims(d),
            slice: *slice as u64,
            data: Some(buf(*data)),
            indices: Some(buf(*indices)),
            updates: Some(buf(*updates)),
            dst: Some(buf(*dst)),
        }),
        IndexStep::CumSum {
            dtype,
            outer,
            len,
            inner,
            exclusive,
            reverse,
            src,
            dst,
        } => K::CumSum(proto::CumSumStep {
            dtype: dtype.onnx_code(),
            outer: *outer as u64,
            len: *len as u64,
            inner: *inner as u64,
            exclusive: *exclusive,
            reverse: *reverse,
            src: Some(buf(*src)),
            dst: Some(buf(*dst)),
        }),
        IndexStep::OneHot {
            dtype,
            idx_dtype,
            outer,
            depth,
            inner,
            indices,
            values,
            dst,
        } => K::OneHot(proto::OneHotStep {
            dtype: dtype.onnx_code(),
            idx_dtype: idx_dtype.onnx_code(),
            outer: *outer as u64,
            depth: *depth as u64,
            inner: *inner as u64,
            indices: Some(buf(*indices)),
            values: Some(buf(*values)),
            dst: Some(buf(*dst)),
        }),
    }
}

/// The step of an indexing kind (the caller dispatches only those).
pub(super) fn index_step(kind: &K) -> Result<IndexStep> {
    Ok(match kind {
        K::GatherElements(g) => IndexStep::GatherElements {
            dtype: dtype(g.dtype)?,
            idx_dtype: dtype(g.idx_dtype)?,
            data_dims: shape(&g.data_dims)?,
            idx_dims: shape(&g.idx_dims)?,
            axis: usize_of(g.axis, "axis")?,
            data: buf_ref(&g.data)?,
            indices: buf_ref(&g.indices)?,
            dst: buf_ref(&g.dst)?,
        },
        K::GatherNd(g) => IndexStep::GatherNd {
            dtype: dtype(g.dtype)?,
            idx_dtype: dtype(g.idx_dtype)?,
            batch: usize_of(g.batch, "batch size")?,
            dims: shape(&g.dims)?,
            slice: usize_of(g.slice, "slice size")?,
            data: buf_ref(&g.data)?,
            indices: buf_ref(&g.indices)?,
            dst: buf_ref(&g.dst)?,
        },
        K::ScatterNd(g) => IndexStep::ScatterNd {
            dtype: dtype(g.dtype)?,
            idx_dtype: dtype(g.idx_dtype)?,
            reduction: reduction(g.reduction)?,
            dims: shape(&g.dims)?,
            slice: usize_of(g.slice, "slice size")?,
            data: buf_ref(&g.data)?,
            indices: buf_ref(&g.indices)?,
            updates: buf_ref(&g.updates)?,
            dst: buf_ref(&g.dst)?,
        },
        K::CumSum(c) => IndexStep::CumSum {
            dtype: dtype(c.dtype)?,
            outer: usize_of(c.outer, "outer size")?,
            len: usize_of(c.len, "length")?,
            inner: usize_of(c.inner, "inner size")?,
            exclusive: c.exclusive,
            reverse: c.reverse,
            src: buf_ref(&c.src)?,
            dst: buf_ref(&c.dst)?,
        },
        K::OneHot(o) => IndexStep::OneHot {
            dtype: dtype(o.dtype)?,
            idx_dtype: dtype(o.idx_dtype)?,
            outer: usize_of(o.outer, "outer size")?,
            depth: usize_of(o.depth, "depth")?,
            inner: usize_of(o.inner, "inner size")?,
            indices: buf_ref(&o.indices)?,
            values: buf_ref(&o.values)?,
            dst: buf_ref(&o.dst)?,
        },
        _ => crate::bail!(InvalidGraph, "not an indexing step"),
    })
}

fn reduction_kind(r: ScatterReduction) -> R {
    match r {
        ScatterReduction::None => R::None,
        ScatterReduction::Add => R::Add,
        ScatterReduction::Mul => R::Mul,
        ScatterReduction::Max => R::Max,
        ScatterReduction::Min => R::Min,
    }
}

fn reduction(code: i32) -> Result<ScatterReduction> {
    Ok(match R::try_from(code) {
        Ok(R::None) => ScatterReduction::None,
        Ok(R::Add) => ScatterReduction::Add,
        Ok(R::Mul) => ScatterReduction::Mul,
        Ok(R::Max) => ScatterReduction::Max,
        Ok(R::Min) => ScatterReduction::Min,
        _ => crate::bail!(InvalidGraph, "unknown ScatterND reduction {code}"),
    })
}
