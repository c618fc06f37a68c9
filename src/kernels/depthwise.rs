//! Depthwise convolution (`group == channels`, one filter per channel) over
//! channels-last `[N, H, W, C]` activations, with the convolution's fused
//! epilogue: `y = act(conv(x) + bias) + residual`.
//!
//! Weights are tap-major, `[kh * kw, C]`, so each tap is one contiguous
//! channel vector.
//!
//! # Speed
//! Channels are the SIMD dimension. The AVX-512 and AVX2 + FMA builds
//! (`simd`, one generic kernel over a register type: 16 or 8 lanes, the
//! last partial register of a row masked) compute every pixel of an output
//! row, border pixels included, in groups of `P` pixels (8; a row's last
//! 5–7 pixels one group of 8 that stores only them; else 4, 2, 1)
//! × one register of channels, with the `P` accumulators in registers:
//! for 3×3 and 5×5 windows without dilation, the group loads each input
//! column once and feeds it to every pixel whose taps read it (stride 1: a
//! row of 8 pixels × 3 taps needs 10 loads, not 24), and the kernel row's
//! weights once per group. Columns in the padding read as zeros (groups
//! wholly inside the input skip the tests); kernel rows in the padding are
//! skipped. Bias is the accumulators' start; ReLU, Clip and LeakyRelu and
//! the residual are applied in registers before the store (the other
//! activations after, over the row). Other windows (dilation, 7×7,
//! non-square) go pixel by pixel, tap by tap, still vectorized over
//! channels. The portable build keeps the reference loop on border pixels
//! and blocks of 4 pixels × 16, 8, 1 channels inside. FMA builds fuse the
//! multiply-adds, so results differ from the portable path in the last
//! bits. In NHWC a group's input columns are `C` values apart, an order
//! the hardware prefetchers follow poorly once the rows come from L3 or
//! memory (as they do in a model, right after the layer that wrote them):
//! so each full group prefetches the next group's new columns, one line per
//! 16 channels, in the kernel rows the previous output row did not read;
//! stride 2 always, stride 1 from 64 channels (narrower rows lost 3-10%
//! to it while in cache). On a Zen 3 (`examples`-style microbench, 32 MiB
//! read between runs) stride 2 at 112²×96 and 56²×144 went 1.65-1.7x
//! faster, stride 1 at 56²×144 1.4x, and in cache 3-8% faster; in a
//! MobileNet-style net the 112²×96 stride-2 layer went from 450 to 280 µs.
//! Threads get whole output rows: one convolution under
//! `MIN_PARALLEL_WORK` multiply-adds runs on the caller alone. Rows run in
//! blocks of one image; for stride 1 with pixels of at most 24 channels or
//! rows shorter than a pixel group, a block runs one channel register at a
//! time over all its rows, so that the input rows that register reads stay
//! in L1 from one output row to the next (`simd::channel_outer` has the
//! measurements).
//!
//! Measured with `cargo bench --bench conv_kernels -- dw` (the kernel
//! alone, 64-byte-aligned activations as ORT allocates, bias + ReLU,
//! medians of 3 interleaved runs of 15) on an AMD EPYC (Zen 4/5 class,
//! AVX-512, FMA ceiling ~263 GFLOP/s per core), one thread, GFLOP/s
//! before → after this kernel: AVX-512: 3×3/1 at 112²×32 44 → 104, 56²×144
//! 47 → 100, 28²×192 46 → 89, 14²×576 47 → 74, 7²×960 43 → 59; 3×3/2 at
//! 112²×96 38 → 51, 56²×144 38 → 54; 5×5/1 14²×384 45 → 98; 5×5/2
//! 40²×120 40 → 72; 3×3/1 80²×24 28 → 73. AVX2 (`KILN_MAX_TARGET`):
//! 3×3/1 56²×144 40 → 60, 80²×24 26 → 63; 3×3/2 112²×96 35 → 40; 5×5/1
//! 45 → 77. ORT's CPU EP (MLAS, NCHWc) runs these layers at 28–64 GFLOP/s
//! including its layout reorders (`bench/results/conv.md`). Stride 2
//! stays ~50 (AVX-512) / ~40 (AVX2): each output reads 4 input vectors'
//! worth of fresh data. Two threads on this shared 2-core machine gained
//! 1.2–1.6× at 56² and larger, little below (`ScopedThreads` starts a
//! thread per call, which costs about as much as a 14² layer).
//!
//! On a Zen 3 (AVX2, 16 registers) a group first held all its input
//! columns (10 for 8 pixels) beside the accumulators and weights: LLVM
//! spilled accumulators and recomputed the columns' offsets for every
//! kernel row, and each pixel's store reloaded the row's operands. Now each
//! column is loaded through a pointer stepped by one pixel and used at once
//! (one live column, so stride 2 also takes 8-pixel groups), and a group's
//! stores match the activation once. Kernel alone, best of 6 alternating
//! runs (this VM's speed halves for seconds at a time): 3×3/1 1.23–1.51×
//! faster (112²×32 39 → 58 GFLOP/s, 56²×144 35 → 46), 3×3/2 1.18–1.28×;
//! callgrind counts 56²×144 2.47M → 1.56M instructions, 3×3/2 at 112²×96
//! 2.87M → 1.30M. Results are the same bits (the taps of a pixel still
//! accumulate in order). Rows of 7 pixels (7²×960) ran as groups of 4, 2
//! and 1; as one group of 8 storing 7: 451K → 257K instructions, 1.38×.

use super::activate_isa;
use super::gemm::Activation;
use super::parallel::Parallel;
use super::spatial::Window;
use super::Isa;
use crate::target::Target;
use std::ops::Range;
use std::sync::Mutex;

/// One depthwise convolution's operands.
pub struct Depthwise<'a> {
    /// Which kernel build runs (the program's target).
    pub isa: Isa,
    pub window: &'a Window,
    pub batch: usize,
    pub channels: usize,
    /// `[batch, h.input, w.input, channels]`.
    pub x: &'a [f32],
    /// `[kh * kw, channels]`.
    pub weights: &'a [f32],
    /// `[channels]`.
    pub bias: Option<&'a [f32]>,
    pub activation: Activation,
    /// `[batch, h.output, w.output, channels]`, added after the activation.
    pub residual: Option<&'a [f32]>,
    /// Applied after the residual; `None` without one.
    pub after: Activation,
}

/// Multiply-adds below which a convolution runs on the caller alone: about
/// 5 µs at this kernel's rate, a few times what handing tasks to a pool
/// costs.
const MIN_PARALLEL_WORK: usize = 1 << 19;

/// The least multiply-adds per task (under 1 µs).
const MIN_TASK_WORK: usize = 1 << 16;

/// `y` (`[batch, h.output, w.output, channels]`) = the convolution, in
/// tasks of whole output rows when it is worth `MIN_PARALLEL_WORK`: one
/// row each for up to 8 rows per thread, else 4 tasks per thread, each at
/// least `MIN_TASK_WORK`.
pub fn depthwise(d: &Depthwise<'_>, y: &mut [f32], par: &dyn Parallel) {
    let (win, c) = (d.window, d.channels);
    let row_len = win.w.output * c;
    let rows = d.batch * win.h.output;
    assert_eq!(y.len(), rows * row_len, "depthwise output size");
    // The SIMD builds index through raw pointers: these bounds are what
    // their SAFETY comments rely on.
    assert!(d.x.len() >= d.batch * win.input_pixels() * c, "depthwise input size");
    assert!(d.weights.len() >= win.taps() * c, "depthwise weights size");
    assert!(d.bias.is_none_or(|b| b.len() >= c), "depthwise bias size");
    assert!(d.residual.is_none_or(|r| r.len() >= y.len()), "depthwise residual size");
    if rows == 0 || row_len == 0 {
        return;
    }
    let work = rows * row_len * win.taps();
    let threads = par.threads();
    let tasks = if threads <= 1 || work < MIN_PARALLEL_WORK {
        1
    } else if rows <= 8 * threads {
        rows.min(work / MIN_TASK_WORK)
    } else {
        (4 * threads).min(work / MIN_TASK_WORK)
    };
    if tasks <= 1 {
        return output_rows(d, 0, y);
    }
    let per = rows.div_ceil(tasks);
    let chunks: Vec<Mutex<(usize, &mut [f32])>> = y
        .chunks_mut(per * row_len)
        .enumerate()
        .map(|(t, chunk)| Mutex::new((t * per, chunk)))
        .collect();
    par.for_each(chunks.len(), &|t| {
        // Each task locks its own chunk once: never contended.
        let mut guard = chunks[t].lock().unwrap_or_else(|e| e.into_inner());
        let (first, chunk) = &mut *guard;
        output_rows(d, *first, chunk);
    });
}

/// Output bytes a block of rows holds at most (see [`output_rows`]).
const BLOCK_BYTES: usize = 256 << 10;

/// Output rows `first..` (as many as `y` holds, counted over the batch),
/// in blocks of rows of one image. Where `simd::channel_outer` says so, the
/// SIMD builds run a block one channel register at a time over all its
/// rows, so that the input rows a register reads (three rows of one line
/// per pixel for a 3×3 window) stay in L1 from one output row to the next;
/// row by row, each output row loads its three input rows from L2 again.
fn output_rows(d: &Depthwise<'_>, first: usize, y: &mut [f32]) {
    let (win, c) = (d.window, d.channels);
    let row_len = win.w.output * c;
    let per_block = (BLOCK_BYTES / (row_len * size_of::<f32>()).max(1)).max(1);
    let mut r = first;
    let mut rest = y;
    while !rest.is_empty() {
        let (n, oh) = (r / win.h.output, r % win.h.output);
        let count = per_block.min(win.h.output - oh).min(rest.len() / row_len);
        let (block, tail) = rest.split_at_mut(count * row_len);
        row_block(d, n, oh..oh + count, block);
        (r, rest) = (r + count, tail);
    }
}

/// Output rows `ohs` of image `n` (`rows` holds them), by the build of `d.isa`.
#[allow(unsafe_code)] // calls the target_feature builds, see SAFETY below
fn row_block(d: &Depthwise<'_>, n: usize, ohs: Range<usize>, rows: &mut [f32]) {
    match d.isa.target() {
        // SAFETY: an `Isa` for AVX-512 exists only if this CPU has
        // AVX-512F/BW/VL and FMA; `depthwise` checked the operands' sizes.
        #[cfg(target_arch = "x86_64")]
        Target::Avx512 => unsafe { isa_builds::avx512(d, n, ohs, rows) },
        // SAFETY: likewise for AVX2 and FMA.
        #[cfg(target_arch = "x86_64")]
        Target::Avx2 => unsafe { isa_builds::avx2(d, n, ohs, rows) },
        _ => {
            let row_len = rows.len() / ohs.len().max(1);
            for (oh, row) in ohs.zip(rows.chunks_mut(row_len)) {
                row_impl::<false>(d, n, oh, row);
            }
        }
    }
    // A second pass while the rows are in L2: residuals after depthwise
    // convolutions are rare, and this keeps the builds' stores simple.
    if d.after != Activation::None {
        activate_isa(d.isa, d.after, rows);
    }
}

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)] // target_feature functions are unsafe to call
mod isa_builds {
    use super::*;
    use std::arch::x86_64::{__m256, __m512};

    /// # Safety
    /// The CPU must have AVX-512F/BW/VL and FMA; `d`'s operands must have
    /// the sizes `depthwise` asserts and `rows` be output rows `ohs` of image `n`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
    pub(super) unsafe fn avx512(d: &Depthwise<'_>, n: usize, ohs: Range<usize>, rows: &mut [f32]) {
        // SAFETY: this function's contract.
        unsafe { simd::rows::<__m512>(d, n, ohs, rows) }
    }

    /// # Safety
    /// The CPU must have AVX2 and FMA; operands as for [`avx512`].
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn avx2(d: &Depthwise<'_>, n: usize, ohs: Range<usize>, rows: &mut [f32]) {
        // SAFETY: this function's contract.
        unsafe { simd::rows::<__m256>(d, n, ohs, rows) }
    }
}

/// `a + x·w`, fused when the build has FMA.
#[inline(always)]
fn madd<const FMA: bool>(a: f32, x: f32, w: f32) -> f32 {
    if FMA {
        x.mul_add(w, a)
    } else {
        a + x * w
    }
}

/// The portable build of one output row (the SIMD builds: [`simd::rows`]).
fn row_impl<const FMA: bool>(d: &Depthwise<'_>, n: usize, oh: usize, row: &mut [f32]) {
    let (win, c) = (d.window, d.channels);
    let image = &d.x[n * win.input_pixels() * c..][..win.input_pixels() * c];
    let (lo, hi) = if win.h.interior(oh) {
        win.w.interior_outputs()
    } else {
        (0, 0)
    };
    for ow in (0..lo).chain(hi..win.w.output) {
        border_pixel::<FMA>(d, image, oh, ow, &mut row[ow * c..][..c]);
    }
    let mut ow = lo;
    while ow + PIXELS <= hi {
        interior::<FMA, PIXELS>(d, image, oh, ow, &mut row[ow * c..][..PIXELS * c]);
        ow += PIXELS;
    }
    for ow in ow..hi {
        interior::<FMA, 1>(d, image, oh, ow, &mut row[ow * c..][..c]);
    }
    epilogue(d, n, oh, row);
}

/// The activation, then the residual, over a whole output row.
fn epilogue(d: &Depthwise<'_>, n: usize, oh: usize, row: &mut [f32]) {
    if d.activation != Activation::None {
        activate_isa(d.isa, d.activation, row);
    }
    if let Some(res) = d.residual {
        let win = d.window;
        let (base, len) = ((n * win.h.output + oh) * win.w.output * d.channels, row.len());
        for (a, &r) in row.iter_mut().zip(&res[base..base + len]) {
            *a += r;
        }
    }
}

/// Interior pixels the portable build computes together (sharing each
/// weight load).
const PIXELS: usize = 4;

/// One output pixel with some taps in the padding (tested per tap).
fn border_pixel<const FMA: bool>(d: &Depthwise<'_>, image: &[f32], oh: usize, ow: usize, acc: &mut [f32]) {
    let (win, c) = (d.window, d.channels);
    match d.bias {
        Some(b) => acc.copy_from_slice(&b[..c]),
        None => acc.fill(0.0),
    }
    for kh in 0..win.h.kernel {
        let Some(ih) = win.h.source(oh, kh) else { continue };
        for kw in 0..win.w.kernel {
            let Some(iw) = win.w.source(ow, kw) else { continue };
            let xs = &image[(ih * win.w.input + iw) * c..][..c];
            let ws = &d.weights[(kh * win.w.kernel + kw) * c..][..c];
            for ((a, &x), &w) in acc.iter_mut().zip(xs).zip(ws) {
                *a = madd::<FMA>(*a, x, w);
            }
        }
    }
}

/// `P` consecutive interior pixels from column `ow` (`out` is their `P·c`
/// values): channel blocks of 16 and 8, then one at a time.
#[inline(always)]
fn interior<const FMA: bool, const P: usize>(d: &Depthwise<'_>, image: &[f32], oh: usize, ow: usize, out: &mut [f32]) {
    let c0 = blocks::<FMA, P, 16>(d, image, oh, ow, out, 0);
    let c0 = blocks::<FMA, P, 8>(d, image, oh, ow, out, c0);
    blocks::<FMA, P, 1>(d, image, oh, ow, out, c0);
}

/// Channels `c0..` in blocks of `L` while whole blocks fit; returns where
/// it stopped.
#[inline(always)]
fn blocks<const FMA: bool, const P: usize, const L: usize>(
    d: &Depthwise<'_>,
    image: &[f32],
    oh: usize,
    ow: usize,
    out: &mut [f32],
    mut c0: usize,
) -> usize {
    let (win, c) = (d.window, d.channels);
    let (h, w) = (&win.h, &win.w);
    // Interior: these never underflow (checked by the caller's ranges).
    let ih0 = oh * h.stride - h.pad_begin;
    let iw0 = ow * w.stride - w.pad_begin;
    let pixel_step = w.stride * c;
    // Every tap of the P pixels reads this span of each input row.
    let span = (P - 1) * pixel_step + (w.kernel - 1) * w.dilation * c + c;
    while c0 + L <= c {
        let mut acc = [[0.0f32; L]; P];
        if let Some(b) = d.bias {
            let b = &b[c0..c0 + L];
            for a in acc.iter_mut() {
                a.copy_from_slice(b);
            }
        }
        for kh in 0..h.kernel {
            let start = ((ih0 + kh * h.dilation) * w.input + iw0) * c;
            let xrow = &image[start..start + span];
            let wrow = &d.weights[kh * w.kernel * c + c0..];
            for kw in 0..w.kernel {
                let wt = &wrow[kw * c..kw * c + L];
                for (p, a) in acc.iter_mut().enumerate() {
                    let at = p * pixel_step + kw * w.dilation * c + c0;
                    let x = &xrow[at..at + L];
                    for j in 0..L {
                        a[j] = madd::<FMA>(a[j], x[j], wt[j]);
                    }
                }
            }
        }
        for (p, a) in acc.iter().enumerate() {
            out[p * c + c0..][..L].copy_from_slice(a);
        }
        c0 += L;
    }
    c0
}

/// The AVX-512 and AVX2 builds: every pixel of a row, channels in
/// registers of 16 (8), the last partial register masked.
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)] // SIMD intrinsics on raw pointers, bounds proven per function
mod simd {
    use super::{epilogue, Activation, Depthwise, Range};
    use crate::kernels::spatial::{Axis, Window};
    use std::arch::x86_64::*;

    /// One SIMD register of f32 lanes. Every method is `unsafe`: the CPU
    /// must have the register's features, and pointers must be valid for
    /// the lanes read or written (all, or those of the mask).
    pub(super) trait Vector: Copy {
        const LANES: usize;
        type Mask: Copy;
        /// Lanes `0..n`, `0 < n <= LANES`.
        unsafe fn mask(n: usize) -> Self::Mask;
        /// All lanes when `FULL`, else those of `m` (the others read 0).
        unsafe fn load<const FULL: bool>(p: *const f32, m: Self::Mask) -> Self;
        unsafe fn store<const FULL: bool>(self, p: *mut f32, m: Self::Mask);
        unsafe fn splat(v: f32) -> Self;
        /// `self·w + acc`, fused.
        unsafe fn fma(self, w: Self, acc: Self) -> Self;
        unsafe fn add(self, o: Self) -> Self;
        /// `o > self ? o : self` (NaN in `self` stays).
        unsafe fn at_least(self, o: Self) -> Self;
        /// `o < self ? o : self` (NaN in `self` stays).
        unsafe fn at_most(self, o: Self) -> Self;
        /// `self < 0 ? alpha·self : self`.
        unsafe fn leaky(self, alpha: Self) -> Self;
    }

    impl Vector for __m512 {
        const LANES: usize = 16;
        type Mask = __mmask16;
        #[inline(always)]
        unsafe fn mask(n: usize) -> __mmask16 {
            ((1u32 << n) - 1) as __mmask16
        }
        #[inline(always)]
        unsafe fn load<const FULL: bool>(p: *const f32, m: __mmask16) -> Self {
            // SAFETY: the caller's (AVX-512F; `p` valid for the lanes read).
            unsafe {
                if FULL {
                    _mm512_loadu_ps(p)
                } else {
                    _mm512_maskz_loadu_ps(m, p)
                }
            }
        }
        #[inline(always)]
        unsafe fn store<const FULL: bool>(self, p: *mut f32, m: __mmask16) {
            // SAFETY: the caller's (AVX-512F; `p` valid for the lanes written).
            unsafe {
                if FULL {
                    _mm512_storeu_ps(p, self)
                } else {
                    _mm512_mask_storeu_ps(p, m, self)
                }
            }
        }
        #[inline(always)]
        unsafe fn splat(v: f32) -> Self {
            // SAFETY: AVX-512F (the caller's).
            unsafe { _mm512_set1_ps(v) }
        }
        #[inline(always)]
        unsafe fn fma(self, w: Self, acc: Self) -> Self {
            // SAFETY: AVX-512F (the caller's).
            unsafe { _mm512_fmadd_ps(self, w, acc) }
        }
        #[inline(always)]
        unsafe fn add(self, o: Self) -> Self {
            // SAFETY: AVX-512F (the caller's).
            unsafe { _mm512_add_ps(self, o) }
        }
        #[inline(always)]
        unsafe fn at_least(self, o: Self) -> Self {
            // SAFETY: AVX-512F (the caller's). max(a, b) = a > b ? a : b.
            unsafe { _mm512_max_ps(o, self) }
        }
        #[inline(always)]
        unsafe fn at_most(self, o: Self) -> Self {
            // SAFETY: AVX-512F (the caller's). min(a, b) = a < b ? a : b.
            unsafe { _mm512_min_ps(o, self) }
        }
        #[inline(always)]
        unsafe fn leaky(self, alpha: Self) -> Self {
            // SAFETY: AVX-512F (the caller's).
            unsafe {
                let neg = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(self, _mm512_setzero_ps());
                _mm512_mask_mul_ps(self, neg, self, alpha)
            }
        }
    }

    impl Vector for __m256 {
        const LANES: usize = 8;
        type Mask = __m256i;
        #[inline(always)]
        unsafe fn mask(n: usize) -> __m256i {
            // SAFETY: AVX2 (the caller's).
            unsafe { _mm256_cmpgt_epi32(_mm256_set1_epi32(n as i32), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)) }
        }
        #[inline(always)]
        unsafe fn load<const FULL: bool>(p: *const f32, m: __m256i) -> Self {
            // SAFETY: the caller's (AVX2; `p` valid for the lanes read).
            unsafe {
                if FULL {
                    _mm256_loadu_ps(p)
                } else {
                    _mm256_maskload_ps(p, m)
                }
            }
        }
        #[inline(always)]
        unsafe fn store<const FULL: bool>(self, p: *mut f32, m: __m256i) {
            // SAFETY: the caller's (AVX2; `p` valid for the lanes written).
            unsafe {
                if FULL {
                    _mm256_storeu_ps(p, self)
                } else {
                    _mm256_maskstore_ps(p, m, self)
                }
            }
        }
        #[inline(always)]
        unsafe fn splat(v: f32) -> Self {
            // SAFETY: AVX (the caller's).
            unsafe { _mm256_set1_ps(v) }
        }
        #[inline(always)]
        unsafe fn fma(self, w: Self, acc: Self) -> Self {
            // SAFETY: FMA (the caller's).
            unsafe { _mm256_fmadd_ps(self, w, acc) }
        }
        #[inline(always)]
        unsafe fn add(self, o: Self) -> Self {
            // SAFETY: AVX (the caller's).
            unsafe { _mm256_add_ps(self, o) }
        }
        #[inline(always)]
        unsafe fn at_least(self, o: Self) -> Self {
            // SAFETY: AVX (the caller's). max(a, b) = a > b ? a : b.
            unsafe { _mm256_max_ps(o, self) }
        }
        #[inline(always)]
        unsafe fn at_most(self, o: Self) -> Self {
            // SAFETY: AVX (the caller's). min(a, b) = a < b ? a : b.
            unsafe { _mm256_min_ps(o, self) }
        }
        #[inline(always)]
        unsafe fn leaky(self, alpha: Self) -> Self {
            // SAFETY: AVX (the caller's).
            unsafe {
                let neg = _mm256_cmp_ps::<_CMP_LT_OQ>(self, _mm256_setzero_ps());
                _mm256_blendv_ps(self, _mm256_mul_ps(self, alpha), neg)
            }
        }
    }

    /// Channels from which stride-1 rows prefetch (see [`rows`]).
    const PREFETCH_CHANNELS: usize = 64;

    /// The most input columns a [`group`] reads: (P − 1)·S + K (its
    /// `columns!` lists this many column numbers).
    const MAX_COLUMNS: usize = 20;

    /// The activations applied in registers before the store.
    #[derive(Clone, Copy, PartialEq, Eq)]
    enum Fused {
        None,
        Relu,
        Clip,
        Leaky,
    }

    /// One output row's operands as raw pointers (bounds: [`rows`]'s contract).
    #[derive(Clone, Copy)]
    struct Row<'a, V: Vector> {
        win: &'a Window,
        c: usize,
        oh: usize,
        /// Image `n`'s first element.
        image: *const f32,
        weights: *const f32,
        bias: Option<*const f32>,
        /// The output row and, when fused, the residual's same row.
        out: *mut f32,
        residual: Option<*const f32>,
        fused: Fused,
        lo: V,
        hi: V,
    }

    impl<V: Vector> Row<'_, V> {
        /// The row `i` rows further down (`row_len` values each).
        ///
        /// # Safety
        /// That row is one of [`rows`]'s.
        #[inline(always)]
        unsafe fn down(&self, i: usize, row_len: usize) -> Self {
            // SAFETY: the caller's (the output and the residual hold that row).
            unsafe {
                Row {
                    oh: self.oh + i,
                    out: self.out.add(i * row_len),
                    residual: self.residual.map(|r| r.add(i * row_len)),
                    ..*self
                }
            }
        }
    }

    /// Output rows `ohs` of image `n`, activation and residual included.
    ///
    /// # Safety
    /// The CPU must have `V`'s features (AVX-512F, or AVX2 and FMA); `d`'s
    /// operands must have the sizes `depthwise` asserts and `out` be output
    /// rows `ohs` of image `n`: then every pointer below stays inside its
    /// slice (input rows `ih < h.input`, columns `iw < w.input`, channels `< c`).
    #[inline(always)]
    pub(super) unsafe fn rows<V: Vector>(d: &Depthwise<'_>, n: usize, ohs: Range<usize>, out: &mut [f32]) {
        let (win, c) = (d.window, d.channels);
        let row_len = win.w.output * c;
        assert!(ohs.end <= win.h.output && out.len() == ohs.len() * row_len);
        if ohs.is_empty() {
            return;
        }
        let (fused, lo, hi, after) = match d.activation {
            Activation::None => (Fused::None, 0.0, 0.0, false),
            Activation::Relu => (Fused::Relu, 0.0, 0.0, false),
            Activation::Clip(lo, hi) => (Fused::Clip, lo, hi, false),
            Activation::LeakyRelu(a) => (Fused::Leaky, a, 0.0, false),
            _ => (Fused::None, 0.0, 0.0, true),
        };
        let row_start = (n * win.h.output + ohs.start) * row_len;
        // SAFETY: the function's contract (`x` holds `batch` images, the
        // residual the whole output); the CPU has V's features.
        let t = unsafe {
            Row::<V> {
                win,
                c,
                oh: ohs.start,
                image: d.x.as_ptr().add(n * win.input_pixels() * c),
                weights: d.weights.as_ptr(),
                bias: d.bias.map(|b| b.as_ptr()),
                out: out.as_mut_ptr(),
                residual: d.residual.filter(|_| !after).map(|r| r.as_ptr().add(row_start)),
                fused,
                lo: V::splat(lo),
                hi: V::splat(hi),
            }
        };
        let (h, w) = (&win.h, &win.w);
        let square = h.kernel == w.kernel && h.dilation == 1 && w.dilation == 1;
        // Software prefetch of the next group's new input lines (see [`group`]):
        // stride 2 always; stride 1 only with wide rows, where the hardware
        // prefetcher falls behind. Narrow stride-1 rows lost time to it.
        let prefetch = w.stride == 2 || c >= PREFETCH_CHANNELS;
        let count = ohs.len();
        // SAFETY: the function's contract.
        unsafe {
            match (square, w.kernel, w.stride, prefetch) {
                (true, 3, 1, false) => block::<V, 3, 1, 8, false>(&t, count),
                (true, 3, 1, true) => block::<V, 3, 1, 8, true>(&t, count),
                (true, 3, 2, _) => block::<V, 3, 2, 8, true>(&t, count),
                (true, 5, 1, false) => block::<V, 5, 1, 8, false>(&t, count),
                (true, 5, 1, true) => block::<V, 5, 1, 8, true>(&t, count),
                (true, 5, 2, _) => block::<V, 5, 2, 8, true>(&t, count),
                _ => block::<V, 0, 1, 1, false>(&t, count),
            }
        }
        if after {
            for (oh, row) in ohs.zip(out.chunks_mut(row_len)) {
                epilogue(d, n, oh, row);
            }
        }
    }

    /// Whether a block of rows runs one channel register at a time over all
    /// its rows (see `output_rows`) rather than row by row with every
    /// channel of a pixel group at once. Measured in-process against each
    /// other on a Sapphire Rapids class Xeon (3×3, stride 1, one thread,
    /// three runs): the register-outer order won at 80²×24 (+24–48%,
    /// AVX-512 and AVX2) and 7²×960 (+13–30%), and lost at 112²×32 and
    /// 56²×144 (−4% to −30%), where a pass over one register reads a line in
    /// every pixel, which the hardware prefetchers follow worse than the
    /// contiguous rows; elsewhere the two were within noise. So: pixels of
    /// at most 24 channels, or rows shorter than a pixel group.
    fn channel_outer(stride: usize, k: usize, c: usize, out_w: usize) -> bool {
        stride == 1 && k > 0 && (c <= 24 || out_w < 8)
    }

    /// `count` output rows from `t`'s: one channel register at a time over
    /// all of them where [`channel_outer`] says so, else row by row.
    ///
    /// # Safety
    /// [`rows`]'s, for rows `t.oh..t.oh + count`.
    #[inline(always)]
    unsafe fn block<V: Vector, const K: usize, const S: usize, const P: usize, const PF: bool>(
        t: &Row<'_, V>,
        count: usize,
    ) {
        let c = t.c;
        let row_len = t.win.w.output * c;
        if !channel_outer(S, K, c, t.win.w.output) {
            for i in 0..count {
                // SAFETY: the caller's, row i of its rows.
                unsafe { pixels::<V, K, S, P, PF>(&t.down(i, row_len)) };
            }
            return;
        }
        let full = c - c % V::LANES;
        // SAFETY (this block): the caller's; channels c0..c0 + LANES <= c,
        // or the mask's lanes full..c; rows inside the caller's.
        unsafe {
            let mut c0 = 0;
            while c0 < full {
                for i in 0..count {
                    channel::<V, true, K, S, P, PF>(&t.down(i, row_len), c0, None);
                }
                c0 += V::LANES;
            }
            if c > full {
                let m = V::mask(c - full);
                for i in 0..count {
                    channel::<V, false, K, S, P, PF>(&t.down(i, row_len), full, Some(m));
                }
            }
        }
    }

    /// Every pixel of `t`'s row for channels `c0..` (one register, all
    /// lanes when `FULL`, else those of `m`): a K×K window (`K > 0`),
    /// dilation 1, width stride `S`, in groups of `P` pixels (then 4, 2, 1),
    /// see [`group`].
    ///
    /// # Safety
    /// [`group`]'s for each group of the row.
    #[inline(always)]
    unsafe fn channel<V: Vector, const FULL: bool, const K: usize, const S: usize, const P: usize, const PF: bool>(
        t: &Row<'_, V>,
        c0: usize,
        m: Option<V::Mask>,
    ) {
        let out_w = t.win.w.output;
        let rows: [Option<usize>; K] = core::array::from_fn(|kh| t.win.h.source(t.oh, kh));
        // SAFETY (each call): the caller's; ow + the group's pixels <= out_w.
        unsafe {
            let mut ow = 0;
            while ow + P <= out_w {
                group_at::<V, FULL, K, S, P, PF>(t, &rows, ow, c0, m, P);
                ow += P;
            }
            if out_w - ow > P / 2 && P > 4 {
                // More than half a group left: one group that stores
                // only those pixels.
                group_at::<V, FULL, K, S, P, false>(t, &rows, ow, c0, m, out_w - ow);
                ow = out_w;
            }
            if ow + 4 <= out_w && P > 4 {
                group_at::<V, FULL, K, S, 4, false>(t, &rows, ow, c0, m, 4);
                ow += 4;
            }
            if ow + 2 <= out_w && P > 2 {
                group_at::<V, FULL, K, S, 2, false>(t, &rows, ow, c0, m, 2);
                ow += 2;
            }
            if ow < out_w {
                group_at::<V, FULL, K, S, 1, false>(t, &rows, ow, c0, m, 1);
            }
        }
    }

    /// Every pixel and channel of the row. `K > 0`: a K×K window, dilation
    /// 1, width stride `S`: groups of `P` pixels (then 4, 2, 1) over all
    /// channels, see [`group`]. `K == 0`: any window, pixel by pixel, tap by
    /// tap ([`pixel`]).
    ///
    /// # Safety
    /// [`rows`]'s, for `t`'s row.
    #[inline(always)]
    unsafe fn pixels<V: Vector, const K: usize, const S: usize, const P: usize, const PF: bool>(t: &Row<'_, V>) {
        let (c, out_w) = (t.c, t.win.w.output);
        let full = c - c % V::LANES;
        let tail = (c > full).then(|| {
            // SAFETY: the CPU has V's features ([`rows`]'s contract).
            unsafe { V::mask(c - full) }
        });
        if K == 0 {
            for ow in 0..out_w {
                for c0 in (0..full).step_by(V::LANES) {
                    // SAFETY: [`rows`]'s contract; channels c0..c0 + LANES <= c.
                    unsafe { pixel::<V, true>(t, c0, None, ow) };
                }
                if let Some(m) = tail {
                    // SAFETY: likewise, the mask's lanes full..c.
                    unsafe { pixel::<V, false>(t, full, Some(m), ow) };
                }
            }
            return;
        }
        let rows: [Option<usize>; K] = core::array::from_fn(|kh| t.win.h.source(t.oh, kh));
        // SAFETY (each call): [`rows`]'s contract; ow + the group's pixels
        // <= out_w; channels as above.
        unsafe {
            let mut ow = 0;
            while ow + P <= out_w {
                group_channels::<V, K, S, P, PF>(t, &rows, ow, full, tail, P);
                ow += P;
            }
            if out_w - ow > P / 2 && P > 4 {
                // More than half a group left: one group that stores
                // only those pixels.
                group_channels::<V, K, S, P, false>(t, &rows, ow, full, tail, out_w - ow);
                ow = out_w;
            }
            if ow + 4 <= out_w && P > 4 {
                group_channels::<V, K, S, 4, false>(t, &rows, ow, full, tail, 4);
                ow += 4;
            }
            if ow + 2 <= out_w && P > 2 {
                group_channels::<V, K, S, 2, false>(t, &rows, ow, full, tail, 2);
                ow += 2;
            }
            if ow < out_w {
                group_channels::<V, K, S, 1, false>(t, &rows, ow, full, tail, 1);
            }
        }
    }

    /// Whether every column a group of `P` pixels from `ow` reads is inside the input.
    #[inline(always)]
    fn inside<const K: usize, const S: usize, const P: usize>(w: &Axis, ow: usize) -> bool {
        ow * S >= w.pad_begin && (ow + P - 1) * S + K <= w.input + w.pad_begin
    }

    /// [`group_channels_at`], with or without column tests.
    ///
    /// # Safety
    /// [`group`]'s, for every channel.
    #[inline(always)]
    unsafe fn group_channels<V: Vector, const K: usize, const S: usize, const P: usize, const PF: bool>(
        t: &Row<'_, V>,
        rows: &[Option<usize>; K],
        ow: usize,
        full: usize,
        tail: Option<V::Mask>,
        n: usize,
    ) {
        // SAFETY: the caller's.
        unsafe {
            if inside::<K, S, P>(&t.win.w, ow) {
                group_channels_at::<V, true, K, S, P, PF>(t, rows, ow, full, tail, n)
            } else {
                group_channels_at::<V, false, K, S, P, PF>(t, rows, ow, full, tail, n)
            }
        }
    }

    /// [`group`] over every channel: whole registers, then a masked one.
    ///
    /// # Safety
    /// [`group`]'s, for every channel.
    #[inline(always)]
    unsafe fn group_channels_at<
        V: Vector,
        const INSIDE: bool,
        const K: usize,
        const S: usize,
        const P: usize,
        const PF: bool,
    >(
        t: &Row<'_, V>,
        rows: &[Option<usize>; K],
        ow: usize,
        full: usize,
        tail: Option<V::Mask>,
        n: usize,
    ) {
        let mut c0 = 0;
        while c0 < full {
            // SAFETY: the caller's; channels c0..c0 + LANES <= c.
            unsafe { group::<V, true, INSIDE, K, S, P, PF>(t, rows, ow, c0, None, n) };
            c0 += V::LANES;
        }
        if tail.is_some() {
            // SAFETY: the caller's; the mask's lanes full..c.
            unsafe { group::<V, false, INSIDE, K, S, P, PF>(t, rows, ow, c0, tail, n) };
        }
    }

    /// [`group`], with or without column tests.
    ///
    /// # Safety
    /// [`group`]'s.
    #[inline(always)]
    unsafe fn group_at<V: Vector, const FULL: bool, const K: usize, const S: usize, const P: usize, const PF: bool>(
        t: &Row<'_, V>,
        rows: &[Option<usize>; K],
        ow: usize,
        c0: usize,
        m: Option<V::Mask>,
        n: usize,
    ) {
        // SAFETY: the caller's.
        unsafe {
            if inside::<K, S, P>(&t.win.w, ow) {
                group::<V, FULL, true, K, S, P, PF>(t, rows, ow, c0, m, n)
            } else {
                group::<V, FULL, false, K, S, P, PF>(t, rows, ow, c0, m, n)
            }
        }
    }

    /// Channels `c0..` (one register: all lanes when `FULL`, else those of
    /// `m`) of output pixels `ow..ow + P`, accumulators in registers, of
    /// which the first `n` are stored (a row's last pixels: the others'
    /// columns past the input read as padding unless `INSIDE`).
    /// Input column `j` of the group feeds pixel `p` through tap `j − p·S`,
    /// so each input register is loaded once for all pixels that use it;
    /// unless `INSIDE` (every column inside the input), columns in the
    /// padding read as zeros, kernel
    /// rows in it too (`rows[kh]` is `None`). With `PF`, it also prefetches
    /// the next group's new input columns (the module's notes on speed).
    ///
    /// # Safety
    /// [`rows`]'s; `n <= P`, `ow + n <= w.output`, and when `INSIDE` every
    /// column the `P` pixels read inside the input; channels `c0..c0 + LANES <= c`
    /// when `FULL`, else the lanes of `m` from `c0` are `< c`.
    #[inline(always)]
    unsafe fn group<
        V: Vector,
        const FULL: bool,
        const INSIDE: bool,
        const K: usize,
        const S: usize,
        const P: usize,
        const PF: bool,
    >(
        t: &Row<'_, V>,
        rows: &[Option<usize>; K],
        ow: usize,
        c0: usize,
        m: Option<V::Mask>,
        n: usize,
    ) {
        let (w, c) = (&t.win.w, t.c);
        const { assert!((P - 1) * S + K <= MAX_COLUMNS) };
        let m = match m {
            Some(m) => m,
            // SAFETY: the CPU has V's features (the contract).
            None => unsafe { V::mask(V::LANES) },
        };
        // SAFETY (this block): every offset is a kernel tap `< K·K`, a row
        // `ih < h.input` (`source`), a column `iw < w.input` (tested) or an
        // output pixel `< w.output`, times `c`, plus channels inside c0..c:
        // inside the operands by the contract.
        unsafe {
            let bias = match t.bias {
                Some(b) => V::load::<FULL>(b.add(c0), m),
                None => V::splat(0.0),
            };
            let mut acc = [bias; P];
            for (kh, &ih) in rows.iter().enumerate() {
                let Some(ih) = ih else { continue };
                let mut wt = [bias; K];
                for (kw, v) in wt.iter_mut().enumerate() {
                    *v = V::load::<FULL>(t.weights.add((kh * K + kw) * c + c0), m);
                }
                let x0 = t.image.add(ih * w.input * c + c0);
                // PF: the next group's new columns, one line per 16
                // channels, of the kernel rows the previous output row did
                // not read (those are still in L2).
                if PF && c0.is_multiple_of(16) && kh + t.win.h.stride >= K {
                    let first = (ow * S + (P - 1) * S + K).wrapping_sub(w.pad_begin);
                    for j in 0..P * S {
                        let iw = first + j;
                        if iw < w.input {
                            _mm_prefetch::<_MM_HINT_T0>(x0.add(iw * c) as *const i8);
                        }
                    }
                }
                // Column j of the group (input column ow·S + j − pad) feeds
                // pixel p through tap j − p·S: each is loaded once, through
                // a pointer stepped by one pixel, and used at once, so that
                // one column is live beside the P accumulators and K
                // weights. Holding every column (AVX2 has 16 registers)
                // spilled accumulators and column offsets, and the offsets'
                // multiplications by `c` were redone for each kernel row.
                // `columns!` unrolls with literal column numbers, so that
                // each FMA's accumulator is a fixed register.
                let first = (ow * S).wrapping_sub(w.pad_begin);
                let mut xp = x0.wrapping_add(first.wrapping_mul(c));
                macro_rules! columns {
                    ($($j:literal)*) => {$(
                        if $j < (P - 1) * S + K {
                            let x = if INSIDE || first.wrapping_add($j) < w.input {
                                V::load::<FULL>(xp, m)
                            } else {
                                // The padding's zeros (as ONNX defines it).
                                V::splat(0.0)
                            };
                            xp = xp.wrapping_add(c);
                            for (kw, &wv) in wt.iter().enumerate() {
                                if $j >= kw && ($j - kw) % S == 0 && ($j - kw) / S < P {
                                    let a = &mut acc[($j - kw) / S];
                                    *a = x.fma(wv, *a);
                                }
                            }
                        }
                    )*};
                }
                columns!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19);
            }
            store_pixels::<V, FULL, P>(t, acc, ow * c + c0, m, n);
        }
    }

    /// One pixel, tap by tap (any window; taps in the padding skipped).
    ///
    /// # Safety
    /// [`group`]'s; `ow < w.output`.
    #[inline(always)]
    unsafe fn pixel<V: Vector, const FULL: bool>(t: &Row<'_, V>, c0: usize, m: Option<V::Mask>, ow: usize) {
        let (h, w, c) = (&t.win.h, &t.win.w, t.c);
        // SAFETY: [`group`]'s (V's features; the bias has `c` channels).
        let (m, mut acc) = unsafe {
            let m = m.unwrap_or_else(|| V::mask(V::LANES));
            let bias = match t.bias {
                Some(b) => V::load::<FULL>(b.add(c0), m),
                None => V::splat(0.0),
            };
            (m, bias)
        };
        for kh in 0..h.kernel {
            let Some(ih) = h.source(t.oh, kh) else { continue };
            // SAFETY: [`group`]'s: row ih < h.input, tap kh·kw < taps.
            let (xrow, wrow) = unsafe {
                (
                    t.image.add(ih * w.input * c + c0),
                    t.weights.add(kh * w.kernel * c + c0),
                )
            };
            for kw in 0..w.kernel {
                let Some(iw) = w.source(ow, kw) else { continue };
                // SAFETY: likewise, column iw < w.input, channels in c0..c.
                unsafe {
                    let x = V::load::<FULL>(xrow.add(iw * c), m);
                    acc = x.fma(V::load::<FULL>(wrow.add(kw * c), m), acc);
                }
            }
        }
        // SAFETY: [`group`]'s, pixel ow of the row.
        unsafe { store::<V, FULL>(t, acc, ow * c + c0, m) };
    }

    /// The first `n` of a group's `P` accumulators (pixels `at`, `at + c`, …) + the fused
    /// activation and residual, the activation chosen once per group. `t`
    /// is copied first: through the reference every store to the row could
    /// have changed its fields, so they were loaded again (and the
    /// activation matched again) for every pixel — a quarter of the
    /// instructions of a 3×3 layer.
    ///
    /// # Safety
    /// [`group`]'s; `n <= P`, `at + (n − 1)·c` + the lanes `<=` the row's length.
    #[inline(always)]
    unsafe fn store_pixels<V: Vector, const FULL: bool, const P: usize>(
        t: &Row<'_, V>,
        acc: [V; P],
        at: usize,
        m: V::Mask,
        n: usize,
    ) {
        let t = *t;
        // SAFETY: the CPU has V's features (the contract).
        let zero = unsafe { V::splat(0.0) };
        macro_rules! each {
            (|$v:ident| $f:expr) => {
                for (p, $v) in acc.into_iter().enumerate() {
                    if p >= n {
                        break;
                    }
                    let at = at + p * t.c;
                    // SAFETY: the function's contract (pixel p of the group).
                    unsafe {
                        let mut v = $f;
                        if let Some(r) = t.residual {
                            v = v.add(V::load::<FULL>(r.add(at), m));
                        }
                        v.store::<FULL>(t.out.add(at), m);
                    }
                }
            };
        }
        match t.fused {
            Fused::None => each!(|a| a),
            Fused::Relu => each!(|a| a.at_least(zero)),
            Fused::Clip => each!(|a| a.at_least(t.lo).at_most(t.hi)),
            Fused::Leaky => each!(|a| a.leaky(t.lo)),
        }
    }

    /// `acc` + the fused activation and residual, stored at element `at` of
    /// the row.
    ///
    /// # Safety
    /// [`group`]'s; `at` + the lanes `<=` the row's length.
    #[inline(always)]
    unsafe fn store<V: Vector, const FULL: bool>(t: &Row<'_, V>, acc: V, at: usize, m: V::Mask) {
        // SAFETY: the function's contract, for one pixel.
        unsafe { store_pixels::<V, FULL, 1>(t, [acc], at, m, 1) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::parallel::Serial;
    use crate::kernels::spatial::{output_len, Axis};

    fn axis(input: usize, kernel: usize, stride: usize, dilation: usize, pads: (usize, usize)) -> Axis {
        Axis {
            input,
            output: output_len(input, kernel, stride, dilation, pads, false).unwrap(),
            kernel,
            stride,
            dilation,
            pad_begin: pads.0,
            pad_end: pads.1,
        }
    }

    /// Straight from the definition, in f64.
    fn reference(d: &Depthwise<'_>) -> Vec<f32> {
        let (win, c) = (d.window, d.channels);
        let mut y = Vec::new();
        for n in 0..d.batch {
            for oh in 0..win.h.output {
                for ow in 0..win.w.output {
                    let mut acc: Vec<f32> = (0..c)
                        .map(|ch| {
                            let mut s = d.bias.map_or(0.0, |b| b[ch] as f64);
                            for kh in 0..win.h.kernel {
                                for kw in 0..win.w.kernel {
                                    let ih =
                                        (oh * win.h.stride + kh * win.h.dilation) as isize - win.h.pad_begin as isize;
                                    let iw =
                                        (ow * win.w.stride + kw * win.w.dilation) as isize - win.w.pad_begin as isize;
                                    if ih < 0 || iw < 0 || ih as usize >= win.h.input || iw as usize >= win.w.input {
                                        continue;
                                    }
                                    let xi = ((n * win.h.input + ih as usize) * win.w.input + iw as usize) * c + ch;
                                    s += d.x[xi] as f64 * d.weights[(kh * win.w.kernel + kw) * c + ch] as f64;
                                }
                            }
                            s as f32
                        })
                        .collect();
                    activate_isa(d.isa, d.activation, &mut acc);
                    if let Some(r) = d.residual {
                        let base = ((n * win.h.output + oh) * win.w.output + ow) * c;
                        for (a, &v) in acc.iter_mut().zip(&r[base..]) {
                            *a += v;
                        }
                    }
                    activate_isa(d.isa, d.after, &mut acc);
                    y.extend(acc);
                }
            }
        }
        y
    }

    fn values(len: usize, seed: usize) -> Vec<f32> {
        (0..len)
            .map(|i| (((i * 7 + seed * 13) % 29) as f32 - 14.0) / 9.0)
            .collect()
    }

    const ACTIVATIONS: [Activation; 10] = [
        Activation::None,
        Activation::Relu,
        Activation::LeakyRelu(0.1),
        Activation::Sigmoid,
        Activation::Tanh,
        Activation::GeluErf,
        Activation::GeluTanh,
        Activation::GeluErfWritten,
        Activation::GeluTanhWritten,
        Activation::Clip(-0.5, 6.0),
    ];

    /// Every ISA this CPU runs (the portable build always) against the
    /// definition: 3×3 and 5×5, strides 1 and 2, dilations, symmetric and
    /// asymmetric pads, 1-D, channel counts off every vector width, with
    /// and without bias and residual, every activation.
    #[test]
    fn matches_the_definition() {
        let windows = [
            Window {
                h: axis(9, 3, 1, 1, (1, 1)),
                w: axis(11, 3, 1, 1, (1, 1)),
            },
            Window {
                h: axis(10, 3, 2, 1, (1, 1)),
                w: axis(13, 3, 2, 1, (0, 1)),
            },
            Window {
                h: axis(9, 5, 1, 1, (2, 2)),
                w: axis(12, 5, 1, 1, (2, 2)),
            },
            Window {
                h: axis(11, 5, 2, 1, (2, 2)),
                w: axis(14, 5, 2, 1, (1, 2)),
            },
            Window {
                h: axis(8, 3, 1, 2, (2, 2)),
                w: axis(12, 3, 2, 3, (3, 1)),
            },
            Window {
                h: axis(1, 1, 1, 1, (0, 0)),
                w: axis(17, 3, 1, 1, (0, 0)),
            },
            Window {
                h: axis(3, 3, 1, 1, (0, 0)),
                w: axis(2, 2, 1, 1, (1, 1)),
            },
            // Rows wide enough for every group size (8, 4, 2, 1 pixels).
            Window {
                h: axis(5, 3, 1, 1, (1, 1)),
                w: axis(23, 3, 1, 1, (1, 1)),
            },
            Window {
                h: axis(6, 3, 2, 1, (1, 1)),
                w: axis(40, 3, 2, 1, (1, 1)),
            },
            Window {
                h: axis(7, 5, 1, 1, (2, 2)),
                w: axis(27, 5, 1, 1, (2, 2)),
            },
            Window {
                h: axis(9, 5, 2, 1, (2, 2)),
                w: axis(33, 5, 2, 1, (2, 2)),
            },
            // Asymmetric pads; an image smaller than the kernel.
            Window {
                h: axis(4, 3, 1, 1, (2, 0)),
                w: axis(19, 3, 1, 1, (0, 2)),
            },
            Window {
                h: axis(3, 5, 1, 1, (2, 2)),
                w: axis(3, 5, 1, 1, (2, 2)),
            },
            // The tap-by-tap path: dilation, 7×7.
            Window {
                h: axis(6, 3, 1, 2, (2, 2)),
                w: axis(21, 3, 1, 2, (2, 2)),
            },
            Window {
                h: axis(8, 7, 2, 1, (3, 3)),
                w: axis(9, 7, 2, 1, (3, 3)),
            },
        ];
        let channels = [1, 7, 8, 16, 19, 24, 32, 40, 53, 72, 96, 120];
        for isa in Target::ALL.into_iter().filter_map(Isa::new) {
            for (wi, win) in windows.iter().enumerate() {
                for (ci, &c) in channels.iter().enumerate() {
                    let k = wi * channels.len() + ci;
                    let batch = 1 + k % 2;
                    let x = values(batch * win.input_pixels() * c, k);
                    let weights = values(win.taps() * c, k + 1);
                    let bias = values(c, k + 2);
                    let residual = values(batch * win.output_pixels() * c, k + 3);
                    let act = ACTIVATIONS[k % ACTIVATIONS.len()];
                    let d = Depthwise {
                        isa,
                        window: win,
                        batch,
                        channels: c,
                        x: &x,
                        weights: &weights,
                        bias: (k % 3 != 0).then_some(&bias[..]),
                        activation: act,
                        residual: (k % 4 == 1).then_some(&residual[..]),
                        after: if k % 8 == 1 { Activation::Relu } else { Activation::None },
                    };
                    let mut y = vec![f32::NAN; residual.len()];
                    depthwise(&d, &mut y, &Serial);
                    let want = reference(&d);
                    for (i, (a, b)) in y.iter().zip(&want).enumerate() {
                        assert!(
                            (a - b).abs() <= 2e-5 * (1.0 + b.abs()),
                            "{:?} window {wi} c={c} {act:?} at {i}: {a} vs {b}",
                            isa.target()
                        );
                    }
                }
            }
        }
    }

    /// Every activation (fused in registers or applied after), with and
    /// without bias and residual, on the 3×3 and 5×5 paths.
    #[test]
    fn every_activation_on_interior_and_border() {
        let windows = [
            Window {
                h: axis(6, 3, 1, 1, (1, 1)),
                w: axis(10, 3, 1, 1, (1, 1)),
            },
            Window {
                h: axis(7, 5, 2, 1, (2, 2)),
                w: axis(21, 5, 2, 1, (2, 2)),
            },
        ];
        let c = 35;
        let activations = ACTIVATIONS.into_iter().chain([
            Activation::HardSwish,
            Activation::LeakyRelu(-2.0),
            Activation::Clip(0.0, 6.0),
        ]);
        for (win, (isa, act)) in windows.iter().flat_map(|w| {
            Target::ALL
                .into_iter()
                .filter_map(Isa::new)
                .flat_map(|i| activations.clone().map(move |a| (i, a)))
                .map(move |ia| (w, ia))
        }) {
            let x = values(win.input_pixels() * c, 5);
            let weights = values(win.taps() * c, 6);
            let bias = values(c, 7);
            let residual = values(win.output_pixels() * c, 8);
            for with in [false, true] {
                let d = Depthwise {
                    isa,
                    window: win,
                    batch: 1,
                    channels: c,
                    x: &x,
                    weights: &weights,
                    bias: with.then_some(&bias[..]),
                    activation: act,
                    residual: with.then_some(&residual[..]),
                    after: if with {
                        Activation::Clip(0.0, 1.5)
                    } else {
                        Activation::None
                    },
                };
                let mut y = vec![f32::NAN; win.output_pixels() * c];
                depthwise(&d, &mut y, &Serial);
                for (a, b) in y.iter().zip(&reference(&d)) {
                    assert!((a - b).abs() <= 2e-5 * (1.0 + b.abs()), "{act:?}: {a} vs {b}");
                }
            }
        }
    }

    /// Tasks of whole rows over 2 and 3 threads (rows not a multiple of
    /// either, batch 2) give exactly the serial result.
    #[test]
    fn threads_match_serial() {
        use crate::kernels::parallel::ScopedThreads;
        let win = Window {
            h: axis(13, 3, 1, 1, (1, 1)),
            w: axis(20, 3, 1, 1, (1, 1)),
        };
        let (batch, c) = (2, 136);
        let x = values(batch * win.input_pixels() * c, 1);
        let weights = values(win.taps() * c, 2);
        for isa in Target::ALL.into_iter().filter_map(Isa::new) {
            let d = Depthwise {
                isa,
                window: &win,
                batch,
                channels: c,
                x: &x,
                weights: &weights,
                bias: None,
                activation: Activation::Relu,
                residual: None,
                after: Activation::None,
            };
            let mut want = vec![f32::NAN; batch * win.output_pixels() * c];
            depthwise(&d, &mut want, &Serial);
            for threads in [2, 3] {
                let mut y = vec![f32::NAN; want.len()];
                depthwise(&d, &mut y, &ScopedThreads(threads));
                assert!(y.iter().zip(&want).all(|(a, b)| a.to_bits() == b.to_bits()));
            }
        }
    }
}
