//! Data movement: strided copies (transpose, slice, concat, split, expand),
//! gather, cast and `Where`. These are memory-bound, so they are built once
//! (no per-ISA variants) and are generic over the element's bit pattern: the
//! plan hands them `u8`/`u16`/`u32`/`u64` views for 1-, 2-, 4- and 8-byte
//! elements. A large strided copy runs on the intra-op threads
//! ([`strided_copy_par`]): two cores stream it faster than one.

use bytemuck::Pod;

use super::parallel::{for_each_block, Blocks, Parallel};
use super::transpose::{transpose, Transpose2};
use super::Isa;
use crate::error::{Error, Result};

/// `dst[dst_offset + Σ i_d·dst_strides[d]] = src[src_offset + Σ i_d·src_strides[d]]`
/// for every index `i` in `dims`. Strides may be negative (Slice with
/// negative steps) or zero (Expand). Built by [`CopyPlan::new`], which drops
/// size-1 dims and merges dims contiguous in both tensors.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CopyPlan {
    pub dims: Vec<usize>,
    pub src_offset: usize,
    pub src_strides: Vec<isize>,
    pub dst_offset: usize,
    pub dst_strides: Vec<isize>,
}

/// Tile edge of the blocked two-innermost-dims loop (transposes).
const TILE: usize = 32;

impl CopyPlan {
    pub fn new(dims: &[usize], src_offset: usize, src: &[isize], dst_offset: usize, dst: &[isize]) -> CopyPlan {
        let (dims, src_strides, dst_strides) = if dims.contains(&0) {
            (vec![0], vec![0], vec![0])
        } else {
            super::layout::merge_dims(dims, src, dst, |n| n as isize)
        };
        CopyPlan {
            dims,
            src_offset,
            src_strides,
            dst_offset,
            dst_strides,
        }
    }

    /// Elements copied.
    pub fn numel(&self) -> Option<usize> {
        self.dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d))
    }

    /// Whether every index stays inside slices of these lengths.
    pub fn fits(&self, src_len: usize, dst_len: usize) -> bool {
        let rank = self.dims.len();
        if self.src_strides.len() != rank || self.dst_strides.len() != rank || self.numel().is_none() {
            return false;
        }
        if self.numel() == Some(0) {
            return true;
        }
        range_ok(&self.dims, self.src_offset, &self.src_strides, src_len)
            && range_ok(&self.dims, self.dst_offset, &self.dst_strides, dst_len)
    }
}

/// Whether `offset + Σ i_d·strides[d]` stays in `0..len` for all indices.
fn range_ok(dims: &[usize], offset: usize, strides: &[isize], len: usize) -> bool {
    let (mut lo, mut hi) = (offset as i128, offset as i128);
    for (&d, &s) in dims.iter().zip(strides) {
        let reach = (d as i128 - 1) * s as i128;
        if reach < 0 {
            lo += reach;
        } else {
            hi += reach;
        }
    }
    lo >= 0 && hi < len as i128 && offset < len.max(1)
}

/// When a copy swaps two dims that are not the innermost two (the dim
/// contiguous in `src` and the one contiguous in `dst` differ, at least one
/// of them further out), those two dims `(ks, kd)`: moved innermost, the
/// inner loop is a 2-D transpose.
fn transpose_innermost(p: &CopyPlan) -> Option<(usize, usize)> {
    let rank = p.dims.len();
    if rank < 3 {
        return None;
    }
    let ks = p.src_strides.iter().position(|&s| s == 1)?;
    let kd = p.dst_strides.iter().rposition(|&s| s == 1)?;
    let innermost = (ks == rank - 2 && kd == rank - 1) || (kd == rank - 2 && ks == rank - 1);
    // Not when the pair is no transpose (a broadcast, a reversal) either.
    if ks == kd || innermost || p.dst_strides[ks] <= 0 || p.src_strides[kd] <= 0 {
        return None;
    }
    Some((ks, kd))
}

/// Ranks up to this are copied with their loop state on the stack.
const INLINE_RANK: usize = 8;

/// Runs a copy plan that `fits` the slices (panics where it does not).
/// `isa` picks the build of the transpose blocks.
pub fn strided_copy<T: Pod>(isa: Isa, p: &CopyPlan, src: &[T], dst: &mut [T]) {
    let all = p.dims.first().map_or(0..1, |&n| 0..n);
    copy_part(isa, p, 0, all, p.dst_offset, src, dst);
}

/// Copies smaller than this run on the caller: a copy is memory-bound, and
/// at 256 KiB (~10 µs) handing half of it to a pool thread pays for itself.
const PAR_MIN_BYTES: usize = 1 << 18;

/// [`strided_copy`] over `par`: a large copy runs as tasks of index ranges
/// of one dim ([`split_dim`]), each writing its own contiguous part of `dst`.
/// At partition edges (NCHW to NHWC and back) and in channel `Split`s and
/// `Concat`s these copies stream megabytes, which one core alone does at
/// about half the speed of two.
pub fn strided_copy_par<T: Pod + Send + Sync>(isa: Isa, p: &CopyPlan, src: &[T], dst: &mut [T], par: &dyn Parallel) {
    copy_in_parts(isa, p, src, dst, par, PAR_MIN_BYTES);
}

/// [`strided_copy_par`] for copies of at least `min_bytes`.
fn copy_in_parts<T: Pod + Send + Sync>(
    isa: Isa,
    p: &CopyPlan,
    src: &[T],
    dst: &mut [T],
    par: &dyn Parallel,
    min_bytes: usize,
) {
    let bytes = p.numel().unwrap_or(0).saturating_mul(size_of::<T>());
    let split = split_dim(p).filter(|_| par.threads() > 1 && bytes >= min_bytes.max(1));
    let Some((k, window)) = split else {
        return strided_copy(isa, p, src, dst);
    };
    let extent = p.dims[k];
    let per = extent.div_ceil((2 * par.threads()).min(extent));
    // Task `t` writes indices `t·per..` of dim `k`: inside its block of `dst`
    // from the plan's offset, `per` windows long (the last may be shorter).
    let dst = &mut dst[p.dst_offset..];
    let blocks = Blocks::new(dst.len(), dst.len(), per * window);
    for_each_block(par, dst, blocks, &|t, block| {
        let first = t * per;
        if first < extent {
            copy_part(isa, p, k, first..(first + per).min(extent), 0, src, block);
        }
    });
}

/// The dim whose index ranges write disjoint runs of the destination, and
/// its window (its stride): every destination stride is positive and all
/// the other dims together reach less than one step of the one with the
/// largest, so index `i` of that dim writes only within `[i·window,
/// (i + 1)·window)` from the plan's offset. None otherwise (a broadcast or
/// reversed destination, a single dim of one element).
fn split_dim(p: &CopyPlan) -> Option<(usize, usize)> {
    let strides = &p.dst_strides;
    let k = (0..strides.len()).max_by_key(|&k| strides[k])?;
    let window = usize::try_from(strides[k]).ok()?;
    let mut reach = 1usize;
    for (j, (&d, &s)) in p.dims.iter().zip(strides).enumerate() {
        let s = usize::try_from(s).ok().filter(|&s| s > 0)?;
        if j != k {
            reach = reach.checked_add(d.checked_sub(1)?.checked_mul(s)?)?;
        }
    }
    (reach <= window && p.dims[k] > 1).then_some((k, window))
}

/// Indices `range` of dim `k` of `p`, the first of them written at
/// `dst_offset` in `dst` (the plan's own offset for the whole copy).
fn copy_part<T: Pod>(
    isa: Isa,
    p: &CopyPlan,
    k: usize,
    range: std::ops::Range<usize>,
    dst_offset: usize,
    src: &[T],
    dst: &mut [T],
) {
    if p.numel() == Some(0) || range.is_empty() {
        return;
    }
    let rank = p.dims.len();
    if rank == 0 {
        dst[dst_offset] = src[p.src_offset];
        return;
    }
    // The plan's dims, possibly reordered, and an odometer: on the stack
    // unless the rank is unusually high.
    let mut inline = (
        [0usize; INLINE_RANK],
        [0isize; INLINE_RANK],
        [0isize; INLINE_RANK],
        [0usize; INLINE_RANK],
    );
    let mut heap;
    let (dims, ss, ds, index): (&mut [usize], &mut [isize], &mut [isize], &mut [usize]) = if rank <= INLINE_RANK {
        (
            &mut inline.0[..rank],
            &mut inline.1[..rank],
            &mut inline.2[..rank],
            &mut inline.3[..rank],
        )
    } else {
        heap = (vec![0; rank], vec![0; rank], vec![0; rank], vec![0; rank]);
        (&mut heap.0, &mut heap.1, &mut heap.2, &mut heap.3)
    };
    // (rank, rank): no dim moved.
    let (ks, kd) = transpose_innermost(p).unwrap_or((rank, rank));
    let moved = [ks, kd].into_iter().filter(|&j| j < rank);
    for (i, j) in (0..rank).filter(|&j| j != ks && j != kd).chain(moved).enumerate() {
        let len = if j == k { range.len() } else { p.dims[j] };
        (dims[i], ss[i], ds[i]) = (len, p.src_strides[j], p.dst_strides[j]);
    }
    // In range: the plan fits `src`, and index `range.start` is one of its.
    let src_offset = (p.src_offset as isize + range.start as isize * p.src_strides[k]) as usize;
    copy_nd(isa, dims, [src_offset, dst_offset], ss, ds, index, src, dst);
}

/// The loop of [`strided_copy`] over `dims` (rank >= 1), `index` its
/// odometer over the outer dims (zeros).
#[allow(clippy::too_many_arguments)]
fn copy_nd<T: Pod>(
    isa: Isa,
    dims: &[usize],
    offsets: [usize; 2],
    src_strides: &[isize],
    dst_strides: &[isize],
    index: &mut [usize],
    src: &[T],
    dst: &mut [T],
) {
    let rank = dims.len();
    // The last one or two dims run in a tight (tiled) loop; the rest by odometer.
    let inner = rank.min(2);
    let outer = rank - inner;
    let (mut s, mut d) = (offsets[0] as isize, offsets[1] as isize);
    loop {
        if inner == 1 {
            copy_run(
                dims[rank - 1],
                src,
                s,
                src_strides[rank - 1],
                dst,
                d,
                dst_strides[rank - 1],
            );
        } else if let Some(t) = Transpose2::of(
            [dims[rank - 2], dims[rank - 1]],
            s,
            [src_strides[rank - 2], src_strides[rank - 1]],
            d,
            [dst_strides[rank - 2], dst_strides[rank - 1]],
        )
        .filter(|t| t.fits(src.len(), dst.len()))
        {
            transpose(isa, &t, src, dst);
        } else {
            copy_tile2(
                [dims[rank - 2], dims[rank - 1]],
                src,
                s,
                [src_strides[rank - 2], src_strides[rank - 1]],
                dst,
                d,
                [dst_strides[rank - 2], dst_strides[rank - 1]],
            );
        }
        let mut k = outer;
        loop {
            if k == 0 {
                return;
            }
            k -= 1;
            index[k] += 1;
            s += src_strides[k];
            d += dst_strides[k];
            if index[k] < dims[k] {
                break;
            }
            index[k] = 0;
            s -= src_strides[k] * dims[k] as isize;
            d -= dst_strides[k] * dims[k] as isize;
        }
    }
}

#[inline(always)]
fn copy_run<T: Copy>(n: usize, src: &[T], s: isize, ss: isize, dst: &mut [T], d: isize, ds: isize) {
    if ss == 1 && ds == 1 {
        let (s, d) = (s as usize, d as usize);
        dst[d..d + n].copy_from_slice(&src[s..s + n]);
    } else if ss == 0 && ds == 1 {
        let d = d as usize;
        dst[d..d + n].fill(src[s as usize]);
    } else {
        for i in 0..n as isize {
            dst[(d + i * ds) as usize] = src[(s + i * ss) as usize];
        }
    }
}

/// Two dims in `TILE`×`TILE` blocks, so that a transpose touches each cache
/// line of both sides once per tile.
fn copy_tile2<T: Copy>(dims: [usize; 2], src: &[T], s: isize, ss: [isize; 2], dst: &mut [T], d: isize, ds: [isize; 2]) {
    if ds[1] == 1 && (ss[1] == 1 || ss[1] == 0) {
        for i in 0..dims[0] as isize {
            copy_run(dims[1], src, s + i * ss[0], ss[1], dst, d + i * ds[0], ds[1]);
        }
        return;
    }
    for i0 in (0..dims[0]).step_by(TILE) {
        for j0 in (0..dims[1]).step_by(TILE) {
            for i in i0..(i0 + TILE).min(dims[0]) {
                let (si, di) = (s + i as isize * ss[0], d + i as isize * ds[0]);
                for j in j0..(j0 + TILE).min(dims[1]) {
                    dst[(di + j as isize * ds[1]) as usize] = src[(si + j as isize * ss[1]) as usize];
                }
            }
        }
    }
}

/// `dst[o, j, i] = src[o, idx[j], i]` for `src` `[outer, axis_len, inner]`;
/// negative indices count from the end. An index out of range is an error.
pub fn gather<T: Copy, I: Copy + Into<i64> + std::fmt::Display>(
    axis_len: usize,
    inner: usize,
    indices: &[I],
    src: &[T],
    dst: &mut [T],
) -> Result<()> {
    let n = indices.len();
    // Checked once up front, resolved again per use: no per-run list.
    let fixed = |i: I| {
        let i: i64 = i.into();
        if i < 0 {
            i + axis_len as i64
        } else {
            i
        }
    };
    if let Some(i) = indices.iter().find(|&&i| !(0..axis_len as i64).contains(&fixed(i))) {
        return Err(Error::invalid_argument(format!(
            "Gather index {i} is out of range for an axis of {axis_len}"
        )));
    }
    if inner == 0 || n == 0 {
        return Ok(());
    }
    for (s, d) in src.chunks_exact(axis_len * inner).zip(dst.chunks_exact_mut(n * inner)) {
        for (k, &i) in indices.iter().enumerate() {
            let j = fixed(i) as usize;
            d[k * inner..(k + 1) * inner].copy_from_slice(&s[j * inner..(j + 1) * inner]);
        }
    }
    Ok(())
}

/// Three-way broadcast of `Where(cond, x, y)`: output `dims`, element strides
/// of each input (0 = broadcast).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Where3 {
    pub dims: Vec<usize>,
    pub c_strides: Vec<usize>,
    pub x_strides: Vec<usize>,
    pub y_strides: Vec<usize>,
}

impl Where3 {
    pub fn for_shapes(c: &[usize], x: &[usize], y: &[usize], out: &[usize]) -> Where3 {
        Where3 {
            dims: out.to_vec(),
            c_strides: broadcast_strides(c, out),
            x_strides: broadcast_strides(x, out),
            y_strides: broadcast_strides(y, out),
        }
    }

    pub fn numel(&self) -> Option<usize> {
        self.dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d))
    }

    pub fn fits(&self, c: usize, x: usize, y: usize, out: usize) -> bool {
        let r = self.dims.len();
        if [&self.c_strides, &self.x_strides, &self.y_strides]
            .iter()
            .any(|s| s.len() != r)
            || self.numel() != Some(out)
        {
            return false;
        }
        let ok = |s: &[usize], len: usize| range_ok(&self.dims, 0, &to_isize(s), len);
        out == 0 || (ok(&self.c_strides, c) && ok(&self.x_strides, x) && ok(&self.y_strides, y))
    }
}

fn to_isize(s: &[usize]) -> Vec<isize> {
    s.iter().map(|&v| v as isize).collect()
}

/// Element strides of `shape` right-aligned into `out`; 0 where it broadcasts.
pub fn broadcast_strides(shape: &[usize], out: &[usize]) -> Vec<usize> {
    let pad = out.len() - shape.len();
    let mut strides = vec![0; out.len()];
    let mut step = 1;
    for i in (0..shape.len()).rev() {
        if shape[i] != 1 {
            strides[pad + i] = step;
        }
        step *= shape[i];
    }
    strides
}

/// `dst = cond ? x : y`, broadcast as `w` says (which `fits`).
pub fn where_select<T: Copy>(w: &Where3, cond: &[u8], x: &[T], y: &[T], dst: &mut [T]) {
    let rank = w.dims.len();
    if dst.is_empty() {
        return;
    }
    let mut index = vec![0usize; rank];
    let (mut c, mut xi, mut yi) = (0usize, 0usize, 0usize);
    for o in dst.iter_mut() {
        *o = if cond[c] != 0 { x[xi] } else { y[yi] };
        let mut k = rank;
        while k > 0 {
            k -= 1;
            index[k] += 1;
            c += w.c_strides[k];
            xi += w.x_strides[k];
            yi += w.y_strides[k];
            if index[k] < w.dims[k] {
                break;
            }
            index[k] = 0;
            c -= w.c_strides[k] * w.dims[k];
            xi -= w.x_strides[k] * w.dims[k];
            yi -= w.y_strides[k] * w.dims[k];
        }
    }
}

/// `Cast` f32 -> i64 as ORT's CPU EP does it on x86-64: truncation toward
/// zero, and `i64::MIN` (the instruction's "integer indefinite") for NaN,
/// ±inf and values outside the i64 range, where Rust's `as` would saturate.
pub fn cast_f32_i64(src: &[f32], dst: &mut [i64]) {
    const LIMIT: f32 = 9_223_372_036_854_775_808.0; // 2^63
    for (d, &x) in dst.iter_mut().zip(src) {
        *d = if (-LIMIT..LIMIT).contains(&x) {
            x as i64
        } else {
            i64::MIN
        };
    }
}

/// `Cast` f32 -> i32, see [`cast_f32_i64`]: `i32::MIN` for NaN, ±inf and
/// values outside the i32 range.
pub fn cast_f32_i32(src: &[f32], dst: &mut [i32]) {
    const LIMIT: f32 = 2_147_483_648.0; // 2^31
    for (d, &x) in dst.iter_mut().zip(src) {
        *d = if (-LIMIT..LIMIT).contains(&x) {
            x as i32
        } else {
            i32::MIN
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::parallel::ScopedThreads;
    use crate::target::Target;
    use std::fmt::Debug;

    fn generic() -> Isa {
        Isa::new(Target::Generic).unwrap()
    }

    /// Every target this CPU runs.
    fn isas() -> Vec<Isa> {
        Target::ALL.into_iter().filter_map(Isa::new).collect()
    }

    /// The plan run index by index, bounds-checked.
    fn naive<T: Copy>(p: &CopyPlan, src: &[T], dst: &mut [T]) {
        let n = p.numel().unwrap();
        let rank = p.dims.len();
        for flat in 0..n {
            let (mut rem, mut s, mut d) = (flat, p.src_offset as isize, p.dst_offset as isize);
            for k in (0..rank).rev() {
                let i = (rem % p.dims[k]) as isize;
                rem /= p.dims[k];
                s += i * p.src_strides[k];
                d += i * p.dst_strides[k];
            }
            dst[d as usize] = src[s as usize];
        }
    }

    /// `strided_copy` by every target against [`naive`], into a `dst`
    /// prefilled with a sentinel (so writes outside the plan show).
    fn check<T: Pod + Send + Sync + PartialEq + Debug>(
        p: &CopyPlan,
        src_len: usize,
        dst_len: usize,
        make: impl Fn(usize) -> T,
    ) {
        assert!(p.fits(src_len, dst_len), "{p:?}");
        let src: Vec<T> = (0..src_len).map(&make).collect();
        let mut want = vec![make(usize::MAX); dst_len];
        naive(p, &src, &mut want);
        for isa in isas() {
            let mut got = vec![make(usize::MAX); dst_len];
            strided_copy(isa, p, &src, &mut got);
            assert_eq!(got, want, "{isa:?} {p:?}");
            // In parts however small, the parts run backwards.
            let mut got = vec![make(usize::MAX); dst_len];
            copy_in_parts(isa, p, &src, &mut got, &Backwards, 0);
            assert_eq!(got, want, "{isa:?} {p:?} in parts");
        }
    }

    /// Three threads' worth of tasks, run on the caller last to first.
    struct Backwards;

    // SAFETY: runs f(n - 1), ..., f(0) in order on the caller.
    #[allow(unsafe_code)]
    unsafe impl Parallel for Backwards {
        fn threads(&self) -> usize {
            3
        }

        fn for_each(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
            (0..n).rev().for_each(f)
        }
    }

    /// The copies a model's layout changes make (a channel slice of NHWC
    /// out and in, NCHW to NHWC, a broadcast), big enough to run in parts,
    /// on two threads, and the plans that must not be split.
    #[test]
    fn large_copies_in_parts_match_naive() {
        let ii = |x: usize| x as isize;
        let (px, c, total) = (24_000usize, 16usize, 48usize);
        let plans = [
            // A Split's second slice of 16 channels of 48.
            (
                CopyPlan::new(&[px, c], 16, &[ii(total), 1], 0, &[ii(c), 1]),
                px * total,
                px * c,
            ),
            // A Concat's input into channels 32.. of 48.
            (
                CopyPlan::new(&[px, c], 0, &[ii(c), 1], 32, &[ii(total), 1]),
                px * c,
                px * total,
            ),
            // NCHW to NHWC: [3, px] to [px, 3].
            (CopyPlan::new(&[3, px], 0, &[ii(px), 1], 0, &[1, 3]), 3 * px, 3 * px),
            // Expand of a row.
            (CopyPlan::new(&[px, c], 0, &[0, 1], 0, &[ii(c), 1]), c, px * c),
        ];
        for (p, src_len, dst_len) in &plans {
            assert!(split_dim(p).is_some(), "{p:?}");
            assert!(p.numel().unwrap() * 4 >= PAR_MIN_BYTES, "{p:?}");
            check(p, *src_len, *dst_len, |i| i as u32);
            let src: Vec<u32> = (0..*src_len).map(|i| i as u32).collect();
            let mut want = vec![u32::MAX; *dst_len];
            naive(p, &src, &mut want);
            let mut got = vec![u32::MAX; *dst_len];
            strided_copy_par(generic(), p, &src, &mut got, &ScopedThreads(2));
            assert_eq!(got, want, "{p:?} on two threads");
        }
        // Reversed, and two dims writing into each other's windows: not split.
        let reversed = CopyPlan {
            dims: vec![px],
            src_offset: 0,
            src_strides: vec![1],
            dst_offset: px - 1,
            dst_strides: vec![-1],
        };
        assert_eq!(split_dim(&reversed), None);
        let interleaved = CopyPlan {
            dims: vec![4, 8],
            src_offset: 0,
            src_strides: vec![8, 1],
            dst_offset: 0,
            dst_strides: vec![2, 1],
        };
        assert_eq!(split_dim(&interleaved), None);
        assert_eq!(split_dim(&CopyPlan::new(&[1], 0, &[1], 0, &[1])), None);
    }

    /// `[outer, rows, cols]`: `dst[o, i, j] = src[o, j, i]` with the given
    /// offsets and paddings of both leading dims, in both dim orders
    /// (`Transpose2::of`'s two cases), for every element size.
    #[test]
    fn transposes_match_naive() {
        let sizes = [0usize, 1, 2, 3, 4, 5, 7, 8, 9, 15, 16, 17, 33, 70];
        for &rows in &sizes {
            for &cols in &sizes {
                for (outer, off, pad) in [(1usize, 0usize, 0usize), (3, 5, 0), (2, 1, 3)] {
                    let (sld, dld) = (rows + pad, cols + pad);
                    let (so, dso) = (cols * sld + pad, rows * dld + 2 * pad);
                    let (src_len, dst_len) = (off + outer * so, off + outer * dso);
                    let ii = |x: usize| x as isize;
                    let plans = [
                        CopyPlan {
                            dims: vec![outer, rows, cols],
                            src_offset: off,
                            src_strides: vec![ii(so), 1, ii(sld)],
                            dst_offset: off,
                            dst_strides: vec![ii(dso), ii(dld), 1],
                        },
                        CopyPlan {
                            dims: vec![outer, cols, rows],
                            src_offset: off,
                            src_strides: vec![ii(so), ii(sld), 1],
                            dst_offset: off,
                            dst_strides: vec![ii(dso), 1, ii(dld)],
                        },
                    ];
                    for p in &plans {
                        check(p, src_len, dst_len, |i| i as u8);
                        check(p, src_len, dst_len, |i| i as u16);
                        check(p, src_len, dst_len, |i| i as u32);
                        check(p, src_len, dst_len, |i| i as u64);
                    }
                }
            }
        }
    }

    /// Transposes whose swapped dims are not the innermost two once merged
    /// (moved there by `transpose_innermost`), and ordinary strided copies.
    #[test]
    fn permutations_match_naive() {
        for (shape, perm) in [
            (vec![5usize, 6, 7], vec![2usize, 1, 0]),
            (vec![2, 9, 3, 17], vec![3, 1, 0, 2]),
            (vec![2, 3, 16, 17], vec![0, 2, 3, 1]),
            (vec![2, 16, 17, 3], vec![0, 3, 1, 2]),
            (vec![3, 8, 9, 4], vec![1, 0, 3, 2]),
            (vec![2, 3, 4, 5], vec![2, 0, 3, 1]),
            (vec![4, 0, 3], vec![2, 0, 1]),
        ] {
            let n: usize = shape.iter().product();
            let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
            let ss = strides(&shape);
            let src_strides: Vec<isize> = perm.iter().map(|&p| ss[p]).collect();
            let plan = CopyPlan::new(&out_shape, 0, &src_strides, 0, &strides(&out_shape));
            check(&plan, n, n, |i| i as u32);
            check(&plan, n, n, |i| i as u16);
            check(&plan, n, n, |i| i as u64);
            check(&plan, n, n, |i| i as u8);
        }
        // Slice with a negative step, Expand, and a concat-like offset copy.
        check(&CopyPlan::new(&[4, 3], 9, &[-3, 1], 0, &[3, 1]), 12, 12, |i| i as u32);
        check(&CopyPlan::new(&[4, 3], 0, &[1, 0], 0, &[3, 1]), 4, 12, |i| i as u32);
        check(&CopyPlan::new(&[3, 5], 0, &[1, 3], 2, &[7, 1]), 15, 23, |i| i as u32);
    }

    /// Row-major strides of a shape.
    fn strides(shape: &[usize]) -> Vec<isize> {
        let mut s = vec![0isize; shape.len()];
        let mut step = 1;
        for i in (0..shape.len()).rev() {
            s[i] = step;
            step *= shape[i] as isize;
        }
        s
    }

    #[test]
    fn transpose_by_plan_matches_naive() {
        for (shape, perm) in [
            (vec![3usize, 70, 45], vec![0usize, 2, 1]),
            (vec![2, 3, 4, 5], vec![0, 2, 1, 3]),
            (vec![2, 3, 4, 5], vec![3, 2, 1, 0]),
            (vec![5], vec![0]),
            (vec![], vec![]),
        ] {
            let n: usize = shape.iter().product();
            let src: Vec<u32> = (0..n as u32).collect();
            let out_shape: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
            let ss = strides(&shape);
            let src_strides: Vec<isize> = perm.iter().map(|&p| ss[p]).collect();
            let plan = CopyPlan::new(&out_shape, 0, &src_strides, 0, &strides(&out_shape));
            assert!(plan.fits(n, n));
            let mut dst = vec![0u32; n];
            strided_copy(generic(), &plan, &src, &mut dst);
            // naive
            let os = strides(&out_shape);
            for (flat, &got) in dst.iter().enumerate() {
                let mut rem = flat as isize;
                let mut at = 0isize;
                for d in 0..out_shape.len() {
                    let i = rem / os[d];
                    rem %= os[d];
                    at += i * src_strides[d];
                }
                assert_eq!(got, src[at as usize], "{shape:?} {perm:?} at {flat}");
            }
        }
    }

    #[test]
    fn negative_strides_zero_strides_and_bounds() {
        let src = [1u32, 2, 3, 4, 5];
        let plan = CopyPlan::new(&[3], 4, &[-2], 0, &[1]);
        let mut dst = [0u32; 3];
        assert!(plan.fits(5, 3));
        strided_copy(generic(), &plan, &src, &mut dst);
        assert_eq!(dst, [5, 3, 1]);
        let plan = CopyPlan::new(&[2, 3], 0, &[1, 0], 0, &[3, 1]);
        let mut dst = [0u32; 6];
        strided_copy(generic(), &plan, &src, &mut dst);
        assert_eq!(dst, [1, 1, 1, 2, 2, 2]);
        assert!(!CopyPlan::new(&[3], 4, &[-2], 0, &[1]).fits(4, 3));
        assert!(!CopyPlan::new(&[3], 0, &[1], 1, &[1]).fits(3, 3));
        assert!(CopyPlan::new(&[0, 3], 9, &[1, 1], 9, &[1, 1]).fits(0, 0));
    }

    #[test]
    fn gather_checks_indices() {
        let src = [0u32, 1, 2, 3, 4, 5];
        let mut dst = [0u32; 6];
        gather(3, 2, &[2, -3, 1], &src, &mut dst).unwrap();
        assert_eq!(dst, [4, 5, 0, 1, 2, 3]);
        let e = gather(3, 2, &[3], &src, &mut dst[..2]).unwrap_err();
        assert!(e.message.contains("out of range"), "{e}");
        assert!(gather(3, 2, &[-4], &src, &mut dst[..2]).is_err());
    }

    #[test]
    fn where_broadcasts() {
        let w = Where3::for_shapes(&[2, 1], &[3], &[], &[2, 3]);
        assert!(w.fits(2, 3, 1, 6));
        let mut dst = [0u32; 6];
        where_select(&w, &[1, 0], &[1, 2, 3], &[9], &mut dst);
        assert_eq!(dst, [1, 2, 3, 9, 9, 9]);
        assert!(!w.fits(1, 3, 1, 6));
    }
}
