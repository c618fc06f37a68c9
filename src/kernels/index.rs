//! Indexing kernels: GatherElements, GatherND, ScatterND, CumSum, OneHot.
//!
//! Indices come from run-time data, so every one is checked against the
//! axis it indexes before it is used; an out-of-range index is an
//! `InvalidArgument` error naming the op, never a wild read or write.

use crate::error::{Error, Result};

/// How ScatterND combines an update with the value already there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ScatterReduction {
    None,
    Add,
    Mul,
    Max,
    Min,
}

impl ScatterReduction {
    pub fn onnx_name(self) -> &'static str {
        match self {
            ScatterReduction::None => "none",
            ScatterReduction::Add => "add",
            ScatterReduction::Mul => "mul",
            ScatterReduction::Max => "max",
            ScatterReduction::Min => "min",
        }
    }
}

/// Numbers the arithmetic kernels run on (f32, i64, i32).
pub trait Num: Copy + PartialOrd + std::ops::Add<Output = Self> + std::ops::Mul<Output = Self> {
    const ZERO: Self;
    fn wrapping_add(self, o: Self) -> Self;
    fn wrapping_mul(self, o: Self) -> Self;
}

impl Num for f32 {
    const ZERO: Self = 0.0;
    fn wrapping_add(self, o: Self) -> Self {
        self + o
    }
    fn wrapping_mul(self, o: Self) -> Self {
        self * o
    }
}

macro_rules! int_num {
    ($t:ty) => {
        impl Num for $t {
            const ZERO: Self = 0;
            fn wrapping_add(self, o: Self) -> Self {
                <$t>::wrapping_add(self, o)
            }
            fn wrapping_mul(self, o: Self) -> Self {
                <$t>::wrapping_mul(self, o)
            }
        }
    };
}
int_num!(i64);
int_num!(i32);

/// Index `i` (negative counts from the end) into an axis of `len`.
pub(super) fn fix_index(op: &str, i: i64, len: usize) -> Result<usize> {
    let j = if i < 0 { i.saturating_add(len as i64) } else { i };
    if j < 0 || j >= len as i64 {
        return Err(Error::invalid_argument(format!(
            "{op} index {i} is out of range for an axis of {len}"
        )));
    }
    Ok(j as usize)
}

/// Row-major element strides of `dims`.
fn strides(dims: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; dims.len()];
    for i in (0..dims.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * dims[i + 1];
    }
    s
}

/// `dst[p] = data[p with p[axis] = idx[p]]`; `dst` and `idx` have
/// `idx_dims`, `data` has `data_dims` (same rank, each dim but `axis` no
/// larger than data's).
pub fn gather_elements<T: Copy>(
    data_dims: &[usize],
    idx_dims: &[usize],
    axis: usize,
    idx: &[i64],
    data: &[T],
    dst: &mut [T],
) -> Result<()> {
    let ds = strides(data_dims);
    let rank = idx_dims.len();
    let mut pos = vec![0usize; rank];
    for (k, (&i, d)) in idx.iter().zip(dst.iter_mut()).enumerate() {
        let j = fix_index("GatherElements", i, data_dims[axis])?;
        let mut off = 0;
        for a in 0..rank {
            off += if a == axis { j } else { pos[a] } * ds[a];
        }
        *d = data[off];
        if k + 1 < idx.len() {
            next_pos(&mut pos, idx_dims);
        }
    }
    Ok(())
}

/// Advances a row-major position in `dims` by one.
fn next_pos(pos: &mut [usize], dims: &[usize]) {
    for a in (0..pos.len()).rev() {
        pos[a] += 1;
        if pos[a] < dims[a] {
            return;
        }
        pos[a] = 0;
    }
}

/// Element offset (in slices) of index tuple `t` into a block of `dims`.
fn tuple_offset(op: &str, t: &[i64], dims: &[usize], st: &[usize]) -> Result<usize> {
    let mut off = 0;
    for ((&i, &d), &s) in t.iter().zip(dims).zip(st) {
        off += fix_index(op, i, d)? * s;
    }
    Ok(off)
}

/// GatherND: for each of `batch` blocks, each tuple of `dims.len()` (> 0)
/// indices picks one slice of `slice` elements from that block of `data`
/// (`dims` then the slice); `dst` holds the picked slices in order.
pub fn gather_nd<T: Copy>(
    batch: usize,
    dims: &[usize],
    slice: usize,
    idx: &[i64],
    data: &[T],
    dst: &mut [T],
) -> Result<()> {
    let k = dims.len();
    let st = strides(dims);
    let block = dims.iter().product::<usize>() * slice;
    if batch == 0 || k == 0 {
        return Ok(());
    }
    let tuples = idx.len() / k / batch;
    for b in 0..batch {
        for t in 0..tuples {
            let at = (b * tuples + t) * k;
            let off = b * block + tuple_offset("GatherND", &idx[at..at + k], dims, &st)? * slice;
            let to = (b * tuples + t) * slice;
            dst[to..to + slice].copy_from_slice(&data[off..off + slice]);
        }
    }
    Ok(())
}

/// Checks every ScatterND index tuple, returning the slice offsets.
pub fn scatter_nd_offsets(dims: &[usize], idx: &[i64]) -> Result<Vec<usize>> {
    let k = dims.len();
    if k == 0 {
        return Ok(vec![0; usize::from(!idx.is_empty())]);
    }
    let st = strides(dims);
    idx.chunks_exact(k)
        .map(|t| tuple_offset("ScatterND", t, dims, &st))
        .collect()
}

/// ScatterND without reduction: `dst` (already a copy of data) gets each
/// update slice at its tuple's place, in order.
pub fn scatter_nd<T: Copy>(offsets: &[usize], slice: usize, updates: &[T], dst: &mut [T]) {
    for (t, &off) in offsets.iter().enumerate() {
        dst[off * slice..(off + 1) * slice].copy_from_slice(&updates[t * slice..(t + 1) * slice]);
    }
}

/// ScatterND with a reduction, on numbers.
pub fn scatter_nd_reduce<T: Num>(r: ScatterReduction, offsets: &[usize], slice: usize, updates: &[T], dst: &mut [T]) {
    for (t, &off) in offsets.iter().enumerate() {
        let d = &mut dst[off * slice..(off + 1) * slice];
        for (d, &u) in d.iter_mut().zip(&updates[t * slice..(t + 1) * slice]) {
            *d = match r {
                ScatterReduction::None => u,
                ScatterReduction::Add => d.wrapping_add(u),
                ScatterReduction::Mul => d.wrapping_mul(u),
                ScatterReduction::Max => {
                    if u > *d {
                        u
                    } else {
                        *d
                    }
                }
                ScatterReduction::Min => {
                    if u < *d {
                        u
                    } else {
                        *d
                    }
                }
            };
        }
    }
}

/// Running sums along `len` of `[outer, len, inner]`; `exclusive` leaves
/// out the element itself, `reverse` sums from the end.
pub fn cumsum<T: Num>(len: usize, inner: usize, exclusive: bool, reverse: bool, src: &[T], dst: &mut [T]) {
    if len == 0 || inner == 0 {
        return;
    }
    for (s, d) in src.chunks_exact(len * inner).zip(dst.chunks_exact_mut(len * inner)) {
        for i in 0..inner {
            let mut acc = T::ZERO;
            for step in 0..len {
                let j = if reverse { len - 1 - step } else { step };
                let x = s[j * inner + i];
                if exclusive {
                    d[j * inner + i] = acc;
                    acc = acc.wrapping_add(x);
                } else {
                    acc = acc.wrapping_add(x);
                    d[j * inner + i] = acc;
                }
            }
        }
    }
}

/// `dst[o, d, i] = on if idx[o, i] (negative counts from the end) == d
/// else off`, for `dst` `[outer, depth, inner]`; an index outside
/// `-depth..depth` gives a row of `off` (as ONNX specifies).
pub fn one_hot<T: Copy>(depth: usize, inner: usize, idx: &[i64], off: T, on: T, dst: &mut [T]) {
    dst.fill(off);
    if inner == 0 || depth == 0 {
        return;
    }
    for (k, &i) in idx.iter().enumerate() {
        let j = if i < 0 { i.saturating_add(depth as i64) } else { i };
        if j >= 0 && j < depth as i64 {
            let (o, inn) = (k / inner, k % inner);
            dst[(o * depth + j as usize) * inner + inn] = on;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    #[test]
    fn gather_elements_reads_along_the_axis_with_negative_indices() {
        // data [2, 3]; indices [2, 2] along axis 1.
        let data = [1, 2, 3, 4, 5, 6];
        let mut out = [0; 4];
        gather_elements(&[2, 3], &[2, 2], 1, &[0, -1, 2, 1], &data, &mut out).unwrap();
        assert_eq!(out, [1, 3, 6, 5]);
        let e = gather_elements(&[2, 3], &[2, 2], 1, &[0, 3, 0, 0], &data, &mut out).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        assert!(
            e.message
                .contains("GatherElements index 3 is out of range for an axis of 3"),
            "{e}"
        );
    }

    #[test]
    fn gather_nd_picks_slices_per_batch() {
        // data [2 batches, 2, 2]: tuples of 1 index pick rows of 2.
        let data = [1, 2, 3, 4, 5, 6, 7, 8];
        let mut out = [0; 4];
        gather_nd(2, &[2], 2, &[1, -2], &data, &mut out).unwrap();
        assert_eq!(out, [3, 4, 5, 6]);
        assert!(gather_nd(2, &[2], 2, &[2, 0], &data, &mut out).is_err());
    }

    #[test]
    fn scatter_nd_reductions_combine_in_order() {
        let offsets = scatter_nd_offsets(&[3], &[0, -1, 0]).unwrap();
        assert_eq!(offsets, [0, 2, 0]);
        let mut d = [1.0f32, 1.0, 1.0];
        scatter_nd_reduce(ScatterReduction::Add, &offsets, 1, &[2.0, 3.0, 4.0], &mut d);
        assert_eq!(d, [7.0, 1.0, 4.0]);
        let mut d = [5i64, 5, 5];
        scatter_nd_reduce(ScatterReduction::Max, &offsets, 1, &[9, 3, 7], &mut d);
        assert_eq!(d, [9, 5, 5]);
        let mut d = [5i32, 5, 5];
        scatter_nd_reduce(ScatterReduction::Min, &offsets, 1, &[9, 3, 7], &mut d);
        assert_eq!(d, [5, 5, 3]);
        assert!(scatter_nd_offsets(&[3], &[3]).is_err());
    }

    #[test]
    fn cumsum_exclusive_and_reverse() {
        let x = [1, 2, 3];
        let mut y = [0i64; 3];
        cumsum(3, 1, false, false, &x, &mut y);
        assert_eq!(y, [1, 3, 6]);
        cumsum(3, 1, true, false, &x, &mut y);
        assert_eq!(y, [0, 1, 3]);
        cumsum(3, 1, false, true, &x, &mut y);
        assert_eq!(y, [6, 5, 3]);
        cumsum(3, 1, true, true, &x, &mut y);
        assert_eq!(y, [5, 3, 0]);
    }

    #[test]
    fn one_hot_counts_negatives_from_the_end_and_skips_out_of_range() {
        let mut y = [0u32; 9];
        one_hot(3, 1, &[-1, 3, 1], 0, 7, &mut y);
        assert_eq!(y, [0, 0, 7, 0, 0, 0, 0, 7, 0]);
    }
}
