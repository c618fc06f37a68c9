//! The indexing steps (GatherElements, GatherND, ScatterND, CumSum,
//! OneHot): their parameters, the buffers they read, the consistency
//! checks `validate` makes of them, and how `run` executes them.

use super::{cast_err, cast_ref, typed_mut, BufRef, DType, Sources};
use crate::error::Result;
use crate::kernels::index::{self as k, ScatterReduction};

/// One indexing step; indices are int64 or int32 (`idx_dtype`).
#[derive(Clone, Debug, PartialEq)]
pub enum IndexStep {
    /// `dst` (of `idx_dims`) gathers `data` (of `data_dims`) along `axis`.
    GatherElements {
        dtype: DType,
        idx_dtype: DType,
        data_dims: Vec<usize>,
        idx_dims: Vec<usize>,
        axis: usize,
        data: BufRef,
        indices: BufRef,
        dst: BufRef,
    },
    /// For each of `batch` blocks of `data` (`dims` then `slice`
    /// elements), tuples of `dims.len()` indices pick slices.
    GatherNd {
        dtype: DType,
        idx_dtype: DType,
        batch: usize,
        dims: Vec<usize>,
        slice: usize,
        data: BufRef,
        indices: BufRef,
        dst: BufRef,
    },
    /// `dst = data`, then each update slice written (or combined) at the
    /// slice its index tuple names in `data` (`dims` then `slice`).
    ScatterNd {
        dtype: DType,
        idx_dtype: DType,
        reduction: ScatterReduction,
        dims: Vec<usize>,
        slice: usize,
        data: BufRef,
        indices: BufRef,
        updates: BufRef,
        dst: BufRef,
    },
    /// Running sums along `len` of `[outer, len, inner]`.
    CumSum {
        dtype: DType,
        outer: usize,
        len: usize,
        inner: usize,
        exclusive: bool,
        reverse: bool,
        src: BufRef,
        dst: BufRef,
    },
    /// `dst` `[outer, depth, inner]` from indices `[outer, inner]` and
    /// `values` `[off, on]`.
    OneHot {
        dtype: DType,
        idx_dtype: DType,
        outer: usize,
        depth: usize,
        inner: usize,
        indices: BufRef,
        values: BufRef,
        dst: BufRef,
    },
}

impl IndexStep {
    pub fn dst(&self) -> BufRef {
        match self {
            IndexStep::GatherElements { dst, .. }
            | IndexStep::GatherNd { dst, .. }
            | IndexStep::ScatterNd { dst, .. }
            | IndexStep::CumSum { dst, .. }
            | IndexStep::OneHot { dst, .. } => *dst,
        }
    }

    pub(crate) fn dst_dtype(&self) -> DType {
        match self {
            IndexStep::GatherElements { dtype, .. }
            | IndexStep::GatherNd { dtype, .. }
            | IndexStep::ScatterNd { dtype, .. }
            | IndexStep::CumSum { dtype, .. }
            | IndexStep::OneHot { dtype, .. } => *dtype,
        }
    }

    pub(crate) fn typed_srcs(&self) -> Vec<(BufRef, Option<DType>)> {
        match self {
            IndexStep::GatherElements {
                dtype,
                idx_dtype,
                data,
                indices,
                ..
            }
            | IndexStep::GatherNd {
                dtype,
                idx_dtype,
                data,
                indices,
                ..
            } => vec![(*data, Some(*dtype)), (*indices, Some(*idx_dtype))],
            IndexStep::ScatterNd {
                dtype,
                idx_dtype,
                data,
                indices,
                updates,
                ..
            } => vec![
                (*data, Some(*dtype)),
                (*indices, Some(*idx_dtype)),
                (*updates, Some(*dtype)),
            ],
            IndexStep::CumSum { dtype, src, .. } => vec![(*src, Some(*dtype))],
            IndexStep::OneHot {
                dtype,
                idx_dtype,
                indices,
                values,
                ..
            } => vec![(*indices, Some(*idx_dtype)), (*values, Some(*dtype))],
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            IndexStep::GatherElements { .. } => "GatherElements",
            IndexStep::GatherNd { .. } => "GatherND",
            IndexStep::ScatterNd { .. } => "ScatterND",
            IndexStep::CumSum { .. } => "CumSum",
            IndexStep::OneHot { .. } => "OneHot",
        }
    }

    /// Whether the parameters fit buffers of `s` source and `d`
    /// destination elements (what `run` relies on).
    pub(crate) fn fits(&self, s: &[usize], d: usize) -> bool {
        let prod = |v: &[usize]| v.iter().try_fold(1usize, |n, &x| n.checked_mul(x));
        let idx_ok = |t: &DType| matches!(t, DType::I64 | DType::I32);
        match self {
            IndexStep::GatherElements {
                idx_dtype,
                data_dims,
                idx_dims,
                axis,
                ..
            } => {
                idx_ok(idx_dtype)
                    && data_dims.len() == idx_dims.len()
                    && *axis < data_dims.len()
                    && (0..data_dims.len()).all(|a| a == *axis || idx_dims[a] <= data_dims[a])
                    && prod(data_dims) == Some(s[0])
                    && prod(idx_dims) == Some(s[1])
                    && s[1] == d
            }
            IndexStep::GatherNd {
                idx_dtype,
                batch,
                dims,
                slice,
                ..
            } => {
                let block = prod(dims).and_then(|n| n.checked_mul(*slice));
                let data_ok = block.and_then(|b| b.checked_mul(*batch)) == Some(s[0]);
                let kk = dims.len();
                let tuples_ok = if *batch == 0 {
                    s[1] == 0 && d == 0
                } else {
                    kk > 0
                        && s[1].is_multiple_of(kk)
                        && (s[1] / kk).is_multiple_of(*batch)
                        && (s[1] / kk).checked_mul(*slice) == Some(d)
                };
                idx_ok(idx_dtype) && kk > 0 && data_ok && tuples_ok
            }
            IndexStep::ScatterNd {
                idx_dtype,
                reduction,
                dtype,
                dims,
                slice,
                ..
            } => {
                let kk = dims.len();
                let tuples = s[1].checked_div(kk);
                idx_ok(idx_dtype)
                    && kk > 0
                    && s[1].is_multiple_of(kk)
                    && (*reduction == ScatterReduction::None || *dtype != DType::Bool)
                    && prod(dims).and_then(|n| n.checked_mul(*slice)) == Some(s[0])
                    && s[0] == d
                    && tuples.and_then(|t| t.checked_mul(*slice)) == Some(s[2])
            }
            IndexStep::CumSum {
                dtype,
                outer,
                len,
                inner,
                ..
            } => *dtype != DType::Bool && prod(&[*outer, *len, *inner]) == Some(s[0]) && s[0] == d,
            IndexStep::OneHot {
                idx_dtype,
                outer,
                depth,
                inner,
                ..
            } => {
                idx_ok(idx_dtype)
                    && prod(&[*outer, *inner]) == Some(s[0])
                    && s[1] == 2
                    && prod(&[*outer, *depth, *inner]) == Some(d)
            }
        }
    }

    pub(super) fn run(&self, src: &Sources<'_>, dst: &mut [u8]) -> Result<()> {
        match self {
            IndexStep::GatherElements {
                dtype,
                idx_dtype,
                data_dims,
                idx_dims,
                axis,
                data,
                indices,
                ..
            } => {
                let idx = indices_of(src, *indices, *idx_dtype)?;
                let s = src.get(*data)?;
                check_len(s, data_dims.iter().product(), *dtype)?;
                check_len(dst, idx.len(), *dtype)?;
                by_size!(dtype.size(), s, dst, |s, d| k::gather_elements(
                    data_dims, idx_dims, *axis, &idx, s, d
                ))
            }
            IndexStep::GatherNd {
                dtype,
                idx_dtype,
                batch,
                dims,
                slice,
                data,
                indices,
                ..
            } => {
                let idx = indices_of(src, *indices, *idx_dtype)?;
                let s = src.get(*data)?;
                check_len(s, batch * dims.iter().product::<usize>() * slice, *dtype)?;
                if dims.is_empty() {
                    return Err(cast_err());
                }
                check_len(dst, idx.len() / dims.len() * slice, *dtype)?;
                by_size!(dtype.size(), s, dst, |s, d| k::gather_nd(
                    *batch, dims, *slice, &idx, s, d
                ))
            }
            IndexStep::ScatterNd {
                dtype,
                idx_dtype,
                reduction,
                dims,
                slice,
                data,
                indices,
                updates,
                ..
            } => {
                let idx = indices_of(src, *indices, *idx_dtype)?;
                let offsets = k::scatter_nd_offsets(dims, &idx)?;
                let (s, u) = (src.get(*data)?, src.get(*updates)?);
                check_len(u, offsets.len() * slice, *dtype)?;
                check_len(s, dims.iter().product::<usize>() * slice, *dtype)?;
                if s.len() != dst.len() {
                    return Err(cast_err());
                }
                dst.copy_from_slice(s);
                match (reduction, dtype) {
                    (ScatterReduction::None, _) => {
                        by_size!(dtype.size(), u, dst, |u, d| {
                            k::scatter_nd(&offsets, *slice, u, d);
                            Ok(())
                        })
                    }
                    (r, DType::F32) => {
                        k::scatter_nd_reduce::<f32>(*r, &offsets, *slice, cast_ref(u)?, typed_mut(dst)?);
                        Ok(())
                    }
                    (r, DType::I64) => {
                        k::scatter_nd_reduce::<i64>(*r, &offsets, *slice, cast_ref(u)?, typed_mut(dst)?);
                        Ok(())
                    }
                    (r, DType::I32) => {
                        k::scatter_nd_reduce::<i32>(*r, &offsets, *slice, cast_ref(u)?, typed_mut(dst)?);
                        Ok(())
                    }
                    _ => Err(cast_err()),
                }
            }
            IndexStep::CumSum {
                dtype,
                outer,
                len,
                inner,
                exclusive,
                reverse,
                src: s,
                ..
            } => {
                let s = src.get(*s)?;
                check_len(s, outer * len * inner, *dtype)?;
                if s.len() != dst.len() {
                    return Err(cast_err());
                }
                let (l, i, e, r) = (*len, *inner, *exclusive, *reverse);
                match dtype {
                    DType::F32 => k::cumsum::<f32>(l, i, e, r, cast_ref(s)?, typed_mut(dst)?),
                    DType::I64 => k::cumsum::<i64>(l, i, e, r, cast_ref(s)?, typed_mut(dst)?),
                    DType::I32 => k::cumsum::<i32>(l, i, e, r, cast_ref(s)?, typed_mut(dst)?),
                    DType::Bool | DType::F16 => return Err(cast_err()),
                }
                Ok(())
            }
            IndexStep::OneHot {
                dtype,
                idx_dtype,
                outer,
                depth,
                inner,
                indices,
                values,
                ..
            } => {
                let idx = indices_of(src, *indices, *idx_dtype)?;
                if idx.len() != outer * inner {
                    return Err(cast_err());
                }
                let v = src.get(*values)?;
                check_len(v, 2, *dtype)?;
                check_len(dst, outer * depth * inner, *dtype)?;
                by_size!(dtype.size(), v, dst, |v, d| {
                    k::one_hot(*depth, *inner, &idx, v[0], v[1], d);
                    Ok(())
                })
            }
        }
    }
}

/// The indices as int64, whichever integer type they are stored as.
fn indices_of(src: &Sources<'_>, r: BufRef, dtype: DType) -> Result<Vec<i64>> {
    Ok(match dtype {
        DType::I64 => src.typed::<i64>(r)?.to_vec(),
        DType::I32 => src.typed::<i32>(r)?.iter().map(|&i| i64::from(i)).collect(),
        _ => return Err(cast_err()),
    })
}

/// `b` must hold exactly `n` elements of `dtype`.
fn check_len(b: &[u8], n: usize, dtype: DType) -> Result<()> {
    if n.checked_mul(dtype.size()) != Some(b.len()) {
        return Err(cast_err());
    }
    Ok(())
}
