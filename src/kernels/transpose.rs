//! 2-D transposes: the inner loop of the strided copies that swap two dims,
//! above all the layout changes NCHW <-> NHWC at the edges of kiln's
//! channels-last partitions (`[N, C, HW] -> [N, HW, C]` once merged), and
//! the GEMM's packing of row-major A and transposed B into micro-panels.
//!
//! The matrix is walked in `B`×`B` blocks transposed in registers: 8×8 for
//! 4-byte elements with AVX2 (AVX-512 machines run it too), 8×8 for 2-byte
//! and 2×2 for 8-byte elements with SSE2 (x86-64's baseline); other element
//! sizes and other CPUs element by element. The order of the blocks keeps
//! the cache lines of the side with the far-apart runs from waiting in cache
//! ([`tiled`]). When one side is only 2 to 4 elements wide and dense
//! (`[1, 3, H, W]` images), the 4-byte path interleaves (or de-interleaves)
//! whole vectors instead.
//!
//! Bounds are proven once per call ([`Transpose2::fits`]): every access of
//! the loops below is at `s + j·sld + i` / `d + i·dld + j` for `i < rows`,
//! `j < cols`, which those checks bound, so the loops use raw pointers.

use bytemuck::Pod;

use super::Isa;
#[cfg(target_arch = "x86_64")]
use crate::target::Target;

/// Tile edge in elements across the far side's runs (see [`tiled`]).
const TILE: usize = 64;
/// Most elements of each far-side run per step (see [`tiled`]).
const WIDE: usize = 128;
/// Most near-side lines waiting in one L1 set (see [`tiled`]).
const PER_SET: usize = 8;

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// `dst[d + i·dld + j] = src[s + j·sld + i]` for `i < rows`, `j < cols`:
/// `src` holds the matrix as `cols` runs of `rows` contiguous elements
/// `sld` apart, `dst` as `rows` runs of `cols` contiguous elements `dld`
/// apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Transpose2 {
    pub rows: usize,
    pub cols: usize,
    pub s: usize,
    pub sld: usize,
    pub d: usize,
    pub dld: usize,
}

impl Transpose2 {
    /// The two innermost dims of a strided copy (`dst[d + i·ds[0] + j·ds[1]]
    /// = src[s + i·ss[0] + j·ss[1]]`) as a transpose: one side contiguous
    /// along one dim, the other along the other, positive strides.
    pub fn of(dims: [usize; 2], s: isize, ss: [isize; 2], d: isize, ds: [isize; 2]) -> Option<Transpose2> {
        let (s, d) = (usize::try_from(s).ok()?, usize::try_from(d).ok()?);
        let ld = |x: isize| usize::try_from(x).ok().filter(|&x| x > 0);
        if ss[0] == 1 && ds[1] == 1 {
            Some(Transpose2 {
                rows: dims[0],
                cols: dims[1],
                s,
                sld: ld(ss[1])?,
                d,
                dld: ld(ds[0])?,
            })
        } else if ss[1] == 1 && ds[0] == 1 {
            Some(Transpose2 {
                rows: dims[1],
                cols: dims[0],
                s,
                sld: ld(ss[0])?,
                d,
                dld: ld(ds[1])?,
            })
        } else {
            None
        }
    }

    fn is_empty(&self) -> bool {
        self.rows == 0 || self.cols == 0
    }

    /// Whether every element read and written lies inside slices of these
    /// lengths (the loops' only bound check), and `dst`'s runs do not
    /// overlap (so the order of the writes does not matter).
    pub fn fits(&self, src_len: usize, dst_len: usize) -> bool {
        if self.is_empty() {
            return true;
        }
        // The largest index of each side: `at + (n - 1)·ld + (m - 1)`.
        let last =
            |at: usize, n: usize, ld: usize, m: usize| (n - 1).checked_mul(ld)?.checked_add(m - 1)?.checked_add(at);
        let src_ok = last(self.s, self.cols, self.sld, self.rows).is_some_and(|x| x < src_len);
        let dst_ok = last(self.d, self.rows, self.dld, self.cols).is_some_and(|x| x < dst_len);
        src_ok && dst_ok && self.dld >= self.cols
    }
}

/// Runs `t` on the slices; panics unless it [`Transpose2::fits`] them.
pub fn transpose<T: Pod>(isa: Isa, t: &Transpose2, src: &[T], dst: &mut [T]) {
    assert!(
        t.fits(src.len(), dst.len()),
        "transpose {t:?} out of bounds of {} -> {} elements",
        src.len(),
        dst.len()
    );
    if t.is_empty() {
        return;
    }
    #[cfg(target_arch = "x86_64")]
    {
        let size = std::mem::size_of::<T>();
        if size == 4 && isa.target() >= Target::Avx2 {
            if let (Ok(s), Ok(d)) = (bytemuck::try_cast_slice(src), bytemuck::try_cast_slice_mut(dst)) {
                return x86::u32_avx2(isa, t, s, d);
            }
        } else if size == 2 {
            if let (Ok(s), Ok(d)) = (bytemuck::try_cast_slice(src), bytemuck::try_cast_slice_mut(dst)) {
                return x86::u16_sse2(t, s, d);
            }
        } else if size == 8 {
            if let (Ok(s), Ok(d)) = (bytemuck::try_cast_slice(src), bytemuck::try_cast_slice_mut(dst)) {
                return x86::u64_sse2(t, s, d);
            }
        }
    }
    let _ = isa;
    scalar(t, src, dst);
}

/// Element by element, in tiles.
#[allow(unsafe_code)] // raw-pointer loops, see SAFETY below
fn scalar<T: Copy>(t: &Transpose2, src: &[T], dst: &mut [T]) {
    assert!(t.fits(src.len(), dst.len()));
    // SAFETY: `t` fits the slices, which is what `tiled` asks; `B` = 1
    // blocks are single elements, which `tiled` hands in bounds.
    unsafe {
        tiled::<T, 1>(t, src.as_ptr(), dst.as_mut_ptr(), |s, d| *d = *s);
    }
}

/// Copies `t` (`src`, `dst`: the slices' starts) in `B`×`B` blocks by
/// `block(src at the block's first element, dst likewise)`.
///
/// The side whose runs are further apart (`H·W` apart in NCHW, often near a
/// multiple of 4 KiB, so that its runs share a few cache sets) is walked a
/// whole cache line of each run at a time: `LINE` / `B` blocks side by side
/// along its runs, then the next blocks across them, so no line of it waits
/// in cache for a later block. The other side's lines are finished by the
/// next step. Across the far side's runs, the walk goes in tiles of `TILE`,
/// so that the prefetchers see that many streams.
///
/// At the edges the last block of a row or column of blocks moves back to
/// end at the edge, overlapping its neighbour (it rewrites the same values:
/// `dst` does not alias `src`); a matrix narrower than `B` goes element by
/// element.
///
/// # Safety
/// `t` must fit the slices `src` and `dst` point to (their lengths as in
/// [`Transpose2::fits`]). `block` is then called only with pointers whose
/// block (`B` runs of `B` elements, `t.sld` / `t.dld` apart) lies inside them.
#[allow(unsafe_code)]
#[inline(always)]
unsafe fn tiled<T: Copy, const B: usize>(t: &Transpose2, src: *const T, dst: *mut T, block: impl Fn(*const T, *mut T)) {
    let (rows, cols, sld, dld) = (t.rows, t.cols, t.sld, t.dld);
    // SAFETY (every `add` below): offsets `t.s + j·sld + i` and `t.d + i·dld + j`
    // with `i < rows`, `j < cols` are in bounds by `fits`; a block starting at
    // (i, j) with `i + B <= rows`, `j + B <= cols` stays in those ranges.
    let (src, dst) = unsafe { (src.add(t.s), dst.add(t.d)) };
    if rows < B || cols < B {
        for j in 0..cols {
            for i in 0..rows {
                // SAFETY: i < rows, j < cols.
                unsafe { *dst.add(i * dld + j) = *src.add(j * sld + i) };
            }
        }
        return;
    }
    // SAFETY: callers pass i <= rows - B, j <= cols - B (`steps` clamps).
    let at = |i: usize, j: usize| block(unsafe { src.add(j * sld + i) }, unsafe { dst.add(i * dld + j) });
    // Elements of a cache line, whole blocks of them.
    let line = (64 / std::mem::size_of::<T>().max(1)).max(B) / B * B;
    // `f(x)` for x = lo, lo + w, … below hi, the last clamped to end at n (hi <= n, w <= n).
    let steps = |lo: usize, hi: usize, n: usize, w: usize, f: &mut dyn FnMut(usize)| {
        let mut x = lo;
        while x < hi {
            f(x.min(n - w));
            x += w;
        }
    };
    // How far along the far side's runs each step goes: as far as the near
    // side's runs (`near` elements apart) allow, up to `WIDE`. The near
    // side's lines wait for the next step, one per run of `w`: at most
    // `PER_SET` of them in any of the 64 sets of a 4 KiB-way L1 cache (runs
    // a multiple of 64 bytes apart land on every `64 / gcd(lines apart, 64)`-th
    // set). Short steps alone are slow (too many far streams, too short).
    let width = |n: usize, near: usize| {
        let bytes = near * std::mem::size_of::<T>();
        let sets = if !bytes.is_multiple_of(64) {
            64
        } else {
            64 / gcd(bytes / 64 % 64, 64)
        };
        let w = (PER_SET * sets).min(WIDE).min(n) / line * line;
        if n < line {
            B
        } else {
            w.max(line)
        }
    };
    if sld >= dld {
        // `src`'s runs (columns j, along i) are the far ones.
        let w = width(rows, dld);
        for j0 in (0..cols).step_by(TILE) {
            let j1 = (j0 + TILE).min(cols);
            steps(0, rows, rows, w, &mut |i| {
                steps(j0, j1, cols, B, &mut |j| {
                    for i in (i..i + w).step_by(B) {
                        at(i, j);
                    }
                })
            });
        }
    } else {
        // `dst`'s runs (rows i, along j) are the far ones.
        let w = width(cols, sld);
        for i0 in (0..rows).step_by(TILE) {
            let i1 = (i0 + TILE).min(rows);
            steps(0, cols, cols, w, &mut |j| {
                steps(i0, i1, rows, B, &mut |i| {
                    for j in (j..j + w).step_by(B) {
                        at(i, j);
                    }
                })
            });
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)] // SIMD intrinsics on raw pointers; each block's bounds come from `tiled`
mod x86 {
    use super::{tiled, Isa, Transpose2};
    use crate::target::Target;
    use std::arch::x86_64::*;

    /// 4-byte elements with AVX2 (and AVX-512 machines).
    pub(super) fn u32_avx2(isa: Isa, t: &Transpose2, src: &[u32], dst: &mut [u32]) {
        assert!(isa.target() >= Target::Avx2 && t.fits(src.len(), dst.len()));
        // SAFETY: an `Isa` for AVX2 or above exists only if this CPU has AVX2;
        // `t` fits the slices (asserted).
        unsafe { u32_avx2_impl(t, src.as_ptr(), dst.as_mut_ptr()) }
    }

    /// # Safety
    /// The CPU must have AVX2; `t` must fit the slices `src` and `dst` start.
    #[target_feature(enable = "avx2")]
    unsafe fn u32_avx2_impl(t: &Transpose2, src: *const u32, dst: *mut u32) {
        let (s, d) = (src as *const f32, dst as *mut f32);
        // SAFETY (all four): `t` fits, and the kernels stay inside the
        // matrix (see each).
        unsafe {
            match (t.rows, t.cols) {
                (_, 2) if t.dld == 2 => interleave::<2>(t, s, d),
                (_, 3) if t.dld == 3 => interleave::<3>(t, s, d),
                (_, 4) if t.dld == 4 => interleave::<4>(t, s, d),
                (2, _) if t.sld == 2 => deinterleave::<2>(t, s, d),
                (3, _) if t.sld == 3 => deinterleave::<3>(t, s, d),
                (4, _) if t.sld == 4 => deinterleave::<4>(t, s, d),
                _ => {
                    let (sld, dld) = (t.sld, t.dld);
                    tiled::<f32, 8>(t, s, d, |s, d| block8x8(s, sld, d, dld));
                }
            }
        }
    }

    /// Transposes the 8×8 block: 8 runs of 8 at `s`, `sld` apart, to 8 runs
    /// at `d`, `dld` apart. The 128-bit halves are paired as they load (run
    /// k with run k + 4), so two shuffle stages finish it.
    ///
    /// # Safety
    /// AVX2; the block's runs are readable / writable.
    #[target_feature(enable = "avx2")]
    #[inline]
    unsafe fn block8x8(s: *const f32, sld: usize, d: *mut f32, dld: usize) {
        // SAFETY: run k of the block is `s + k·sld .. + 8`, in bounds by the caller.
        let half = |k: usize, h: usize| unsafe { _mm_loadu_ps(s.add(k * sld + 4 * h)) };
        let pair = |a: usize, h: usize| _mm256_insertf128_ps::<1>(_mm256_castps128_ps256(half(a, h)), half(a + 4, h));
        for h in 0..2 {
            let (t0, t1, t2, t3) = (pair(0, h), pair(1, h), pair(2, h), pair(3, h));
            let u0 = _mm256_unpacklo_ps(t0, t1);
            let u1 = _mm256_unpackhi_ps(t0, t1);
            let u2 = _mm256_unpacklo_ps(t2, t3);
            let u3 = _mm256_unpackhi_ps(t2, t3);
            let o = [
                _mm256_shuffle_ps::<0x44>(u0, u2),
                _mm256_shuffle_ps::<0xEE>(u0, u2),
                _mm256_shuffle_ps::<0x44>(u1, u3),
                _mm256_shuffle_ps::<0xEE>(u1, u3),
            ];
            for (c, v) in o.into_iter().enumerate() {
                // SAFETY: run 4h + c of the destination block, in bounds by the caller.
                unsafe { _mm256_storeu_ps(d.add((4 * h + c) * dld), v) };
            }
        }
    }

    /// `t.cols == C`, `t.dld == C`: each 8 rows' `8·C` contiguous outputs
    /// are `C` vectors, each blended from the `C` input vectors permuted.
    ///
    /// # Safety
    /// AVX2; `t` fits the slices `s` and `d` start.
    #[target_feature(enable = "avx2")]
    unsafe fn interleave<const C: usize>(t: &Transpose2, s: *const f32, d: *mut f32) {
        // Output vector k, lane e: flat index p = 8k + e is row p / C, column p % C.
        let idx: [__m256i; C] = std::array::from_fn(|k| lanes(|e| (8 * k + e) / C));
        let mask: [[__m256; C]; C] = std::array::from_fn(|k| {
            std::array::from_fn(|j| _mm256_castsi256_ps(lanes(|e| flag((8 * k + e) % C == j))))
        });
        // SAFETY: `t` fits; every access below is at row < rows, column < C.
        let (s, d) = unsafe { (s.add(t.s), d.add(t.d)) };
        let mut i = 0;
        while i + 8 <= t.rows {
            let v: [__m256; C] = std::array::from_fn(|j| unsafe { _mm256_loadu_ps(s.add(j * t.sld + i)) });
            for k in 0..C {
                let mut out = _mm256_permutevar8x32_ps(v[0], idx[k]);
                for j in 1..C {
                    out = _mm256_blendv_ps(out, _mm256_permutevar8x32_ps(v[j], idx[k]), mask[k][j]);
                }
                // SAFETY: elements `(i + 8)·C` and below of the dense output.
                unsafe { _mm256_storeu_ps(d.add(i * C + 8 * k), out) };
            }
            i += 8;
        }
        for i in i..t.rows {
            for j in 0..C {
                // SAFETY: row < rows, column < C.
                unsafe { *d.add(i * C + j) = *s.add(j * t.sld + i) };
            }
        }
    }

    /// `t.rows == R`, `t.sld == R`: each 8 columns' `8·R` contiguous inputs
    /// are `R` vectors; output row i is blended from them permuted.
    ///
    /// # Safety
    /// AVX2; `t` fits the slices `s` and `d` start.
    #[target_feature(enable = "avx2")]
    unsafe fn deinterleave<const R: usize>(t: &Transpose2, s: *const f32, d: *mut f32) {
        // Output row i, lane e (column j + e) is input p = e·R + i: vector p / 8, lane p % 8.
        let idx: [__m256i; R] = std::array::from_fn(|i| lanes(|e| (e * R + i) % 8));
        let mask: [[__m256; R]; R] = std::array::from_fn(|i| {
            std::array::from_fn(|k| _mm256_castsi256_ps(lanes(|e| flag((e * R + i) / 8 == k))))
        });
        // SAFETY: `t` fits; every access below is at row < R, column < cols.
        let (s, d) = unsafe { (s.add(t.s), d.add(t.d)) };
        let mut j = 0;
        while j + 8 <= t.cols {
            let v: [__m256; R] = std::array::from_fn(|k| unsafe { _mm256_loadu_ps(s.add(j * R + 8 * k)) });
            for i in 0..R {
                let mut out = _mm256_permutevar8x32_ps(v[0], idx[i]);
                for k in 1..R {
                    out = _mm256_blendv_ps(out, _mm256_permutevar8x32_ps(v[k], idx[i]), mask[i][k]);
                }
                // SAFETY: row i < R, columns j..j + 8 <= cols.
                unsafe { _mm256_storeu_ps(d.add(i * t.dld + j), out) };
            }
            j += 8;
        }
        for j in j..t.cols {
            for i in 0..R {
                // SAFETY: row < R, column < cols.
                unsafe { *d.add(i * t.dld + j) = *s.add(j * R + i) };
            }
        }
    }

    #[target_feature(enable = "avx2")]
    #[inline]
    fn lanes(f: impl Fn(usize) -> usize) -> __m256i {
        let a: [i32; 8] = std::array::from_fn(|e| f(e) as i32);
        // SAFETY: reads the 8 i32 of `a`.
        unsafe { _mm256_loadu_si256(a.as_ptr().cast()) }
    }

    fn flag(b: bool) -> usize {
        if b {
            usize::MAX
        } else {
            0
        }
    }

    /// 2-byte elements: 8×8 blocks with SSE2.
    pub(super) fn u16_sse2(t: &Transpose2, src: &[u16], dst: &mut [u16]) {
        assert!(t.fits(src.len(), dst.len()));
        // SAFETY: SSE2 is part of x86-64; `t` fits the slices (asserted).
        unsafe { u16_sse2_impl(t, src.as_ptr(), dst.as_mut_ptr()) }
    }

    /// # Safety
    /// `t` must fit the slices `src` and `dst` start.
    #[target_feature(enable = "sse2")]
    unsafe fn u16_sse2_impl(t: &Transpose2, src: *const u16, dst: *mut u16) {
        let (sld, dld) = (t.sld, t.dld);
        // SAFETY: `t` fits; `tiled` hands `block8x8_u16` whole blocks inside the slices.
        unsafe { tiled::<u16, 8>(t, src, dst, |s, d| block8x8_u16(s, sld, d, dld)) }
    }

    /// # Safety
    /// The block's runs (8 of 8 elements at `s` / `d`, `sld` / `dld` apart) are in bounds.
    #[target_feature(enable = "sse2")]
    #[inline]
    unsafe fn block8x8_u16(s: *const u16, sld: usize, d: *mut u16, dld: usize) {
        // SAFETY: run k is `s + k·sld .. + 8`, in bounds by the caller.
        let a: [__m128i; 8] = std::array::from_fn(|k| unsafe { _mm_loadu_si128(s.add(k * sld).cast()) });
        let b = [
            _mm_unpacklo_epi16(a[0], a[1]),
            _mm_unpackhi_epi16(a[0], a[1]),
            _mm_unpacklo_epi16(a[2], a[3]),
            _mm_unpackhi_epi16(a[2], a[3]),
            _mm_unpacklo_epi16(a[4], a[5]),
            _mm_unpackhi_epi16(a[4], a[5]),
            _mm_unpacklo_epi16(a[6], a[7]),
            _mm_unpackhi_epi16(a[6], a[7]),
        ];
        let c = [
            _mm_unpacklo_epi32(b[0], b[2]),
            _mm_unpackhi_epi32(b[0], b[2]),
            _mm_unpacklo_epi32(b[1], b[3]),
            _mm_unpackhi_epi32(b[1], b[3]),
            _mm_unpacklo_epi32(b[4], b[6]),
            _mm_unpackhi_epi32(b[4], b[6]),
            _mm_unpacklo_epi32(b[5], b[7]),
            _mm_unpackhi_epi32(b[5], b[7]),
        ];
        let o = [
            _mm_unpacklo_epi64(c[0], c[4]),
            _mm_unpackhi_epi64(c[0], c[4]),
            _mm_unpacklo_epi64(c[1], c[5]),
            _mm_unpackhi_epi64(c[1], c[5]),
            _mm_unpacklo_epi64(c[2], c[6]),
            _mm_unpackhi_epi64(c[2], c[6]),
            _mm_unpacklo_epi64(c[3], c[7]),
            _mm_unpackhi_epi64(c[3], c[7]),
        ];
        for (k, v) in o.into_iter().enumerate() {
            // SAFETY: run k of the destination block, in bounds by the caller.
            unsafe { _mm_storeu_si128(d.add(k * dld).cast(), v) };
        }
    }

    /// 8-byte elements: 2×2 blocks with SSE2.
    pub(super) fn u64_sse2(t: &Transpose2, src: &[u64], dst: &mut [u64]) {
        assert!(t.fits(src.len(), dst.len()));
        // SAFETY: SSE2 is part of x86-64; `t` fits the slices (asserted).
        unsafe { u64_sse2_impl(t, src.as_ptr(), dst.as_mut_ptr()) }
    }

    /// # Safety
    /// `t` must fit the slices `src` and `dst` start.
    #[target_feature(enable = "sse2")]
    unsafe fn u64_sse2_impl(t: &Transpose2, src: *const u64, dst: *mut u64) {
        let (sld, dld) = (t.sld, t.dld);
        let block = |s: *const u64, d: *mut u64| {
            // SAFETY: runs 0 and 1 of the block (2 elements each), in bounds by `tiled`.
            unsafe {
                let (a0, a1) = (_mm_loadu_si128(s.cast()), _mm_loadu_si128(s.add(sld).cast()));
                _mm_storeu_si128(d.cast(), _mm_unpacklo_epi64(a0, a1));
                _mm_storeu_si128(d.add(dld).cast(), _mm_unpackhi_epi64(a0, a1));
            }
        };
        // SAFETY: `t` fits; `tiled` hands `block` whole 2×2 blocks inside the slices.
        unsafe { tiled::<u64, 2>(t, src, dst, block) }
    }
}
