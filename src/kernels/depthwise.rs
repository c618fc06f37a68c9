//! Depthwise convolution (`group == channels`, one filter per channel) over
//! channels-last `[N, H, W, C]` activations, with the convolution's fused
//! epilogue: `y = act(conv(x) + bias) + residual`.
//!
//! Weights are tap-major, `[kh * kw, C]`, so each tap is one contiguous
//! channel vector.
//!
//! # Speed
//! Channels are the SIMD dimension. Each output row splits into border
//! pixels (some tap in the padding: the reference loop, which tests every
//! tap) and interior pixels, whose taps all read inside the image: there
//! the loops have no padding tests and keep 4 pixels × 16 channels of
//! accumulators in registers across all taps (one weight load serves 4
//! pixels): AVX-512 and AVX2 + FMA intrinsics (`simd`), then blocks of 8
//! channels and a scalar tail. The code around them is compiled three
//! times: plain (SSE2), AVX2 + FMA and AVX-512 + FMA, chosen by the
//! program's target ([`Isa`]); FMA targets use fused multiply-adds, so
//! results differ from the portable path in the last bits. On an AMD EPYC
//! (Zen 4), one thread, MobileNet-v2 shapes (3×3 s1 at 56²×144, 28²×192,
//! 14²×576; 5×5 at 14²×384): ~40 GFLOP/s with AVX-512 or AVX2 against ~30
//! for the same loops without the intrinsics (LLVM keeps the portable
//! accumulator arrays in memory) and ~20 for the portable build.

use super::gemm::{activate, Activation};
use super::parallel::Parallel;
use super::spatial::Window;
use super::Isa;
use crate::target::Target;

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
}

/// Which build a kernel function is inlined into (its `SIMD` parameter).
const PORTABLE: u8 = 0;
const AVX2: u8 = 1;
const AVX512: u8 = 2;

/// Interior pixels computed together (sharing each weight load; 8 ran no
/// faster with AVX-512).
const PIXELS: usize = 4;

/// `y` (`[batch, h.output, w.output, channels]`) = the convolution, one
/// task per output row.
pub fn depthwise(d: &Depthwise<'_>, y: &mut [f32], par: &dyn Parallel) {
    let (win, c) = (d.window, d.channels);
    let row_len = win.w.output * c;
    let rows = d.batch * win.h.output;
    assert_eq!(y.len(), rows * row_len, "depthwise output size");
    super::par_rows(par, rows, row_len, y, &|range, chunk| {
        for (r, row) in range.zip(chunk.chunks_mut(row_len.max(1))) {
            output_row(d, r / win.h.output, r % win.h.output, row);
        }
    });
}

/// Output row `oh` of image `n`, by the build of `d.isa`.
#[allow(unsafe_code)] // calls the target_feature builds, see SAFETY below
fn output_row(d: &Depthwise<'_>, n: usize, oh: usize, row: &mut [f32]) {
    match d.isa.target() {
        // SAFETY: an `Isa` for AVX-512 exists only if this CPU has AVX-512F/BW/VL and FMA.
        #[cfg(target_arch = "x86_64")]
        Target::Avx512 => unsafe { isa_builds::avx512(d, n, oh, row) },
        // SAFETY: an `Isa` for AVX2 exists only if this CPU has AVX2 and FMA.
        #[cfg(target_arch = "x86_64")]
        Target::Avx2 => unsafe { isa_builds::avx2(d, n, oh, row) },
        _ => row_impl::<false, PORTABLE>(d, n, oh, row),
    }
}

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)] // target_feature functions are unsafe to call
mod isa_builds {
    use super::*;

    /// # Safety
    /// The CPU must have AVX-512F/BW/VL and FMA.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
    pub(super) unsafe fn avx512(d: &Depthwise<'_>, n: usize, oh: usize, row: &mut [f32]) {
        row_impl::<true, AVX512>(d, n, oh, row)
    }

    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn avx2(d: &Depthwise<'_>, n: usize, oh: usize, row: &mut [f32]) {
        row_impl::<true, AVX2>(d, n, oh, row)
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

/// The first and one-past-last output columns whose taps all read inside
/// the input (an empty range when there are none).
fn interior_columns(win: &Window) -> (usize, usize) {
    let a = &win.w;
    let lo = a.pad_begin.div_ceil(a.stride);
    // Largest o with o·stride + extent − pad_begin <= input.
    let hi = match (a.input + a.pad_begin).checked_sub(a.extent()) {
        Some(span) => (span / a.stride + 1).min(a.output),
        None => 0,
    };
    (lo.min(hi), hi)
}

#[inline(always)]
fn row_impl<const FMA: bool, const SIMD: u8>(d: &Depthwise<'_>, n: usize, oh: usize, row: &mut [f32]) {
    let (win, c) = (d.window, d.channels);
    let image = &d.x[n * win.input_pixels() * c..][..win.input_pixels() * c];
    let (lo, hi) = if win.h.interior(oh) {
        interior_columns(win)
    } else {
        (0, 0)
    };
    for ow in (0..lo).chain(hi..win.w.output) {
        border_pixel::<FMA>(d, image, oh, ow, &mut row[ow * c..][..c]);
    }
    let ow = interior_run::<FMA, SIMD, PIXELS>(d, image, oh, (lo, hi), row);
    for ow in ow..hi {
        interior::<FMA, SIMD, 1>(d, image, oh, ow, &mut row[ow * c..][..c]);
    }
    if d.activation != Activation::None {
        activate(d.activation, row);
    }
    if let Some(res) = d.residual {
        let (base, len) = ((n * win.h.output + oh) * win.w.output * c, row.len());
        for (a, &r) in row.iter_mut().zip(&res[base..base + len]) {
            *a += r;
        }
    }
}

/// Interior columns `lo..hi` in groups of `P`; returns the first column
/// left over (fewer than `P`).
#[inline(always)]
fn interior_run<const FMA: bool, const SIMD: u8, const P: usize>(
    d: &Depthwise<'_>,
    image: &[f32],
    oh: usize,
    (lo, hi): (usize, usize),
    row: &mut [f32],
) -> usize {
    let c = d.channels;
    let mut ow = lo;
    while ow + P <= hi {
        interior::<FMA, SIMD, P>(d, image, oh, ow, &mut row[ow * c..][..P * c]);
        ow += P;
    }
    ow
}

/// One output pixel with some taps in the padding (tested per tap).
#[inline(always)]
fn border_pixel<const FMA: bool>(d: &Depthwise<'_>, image: &[f32], oh: usize, ow: usize, acc: &mut [f32]) {
    let (win, c) = (d.window, d.channels);
    match d.bias {
        Some(b) => acc.copy_from_slice(b),
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
#[allow(unsafe_code)] // calls the intrinsic blocks, see SAFETY below
fn interior<const FMA: bool, const SIMD: u8, const P: usize>(
    d: &Depthwise<'_>,
    image: &[f32],
    oh: usize,
    ow: usize,
    out: &mut [f32],
) {
    let c0 = match SIMD {
        // SAFETY: SIMD is AVX512 only in the build `isa_builds::avx512`,
        // which runs only on CPUs with AVX-512F and FMA.
        #[cfg(target_arch = "x86_64")]
        AVX512 => unsafe { simd::blocks16_avx512::<P>(&Tile::new::<P>(d, image, oh, ow), out) },
        // SAFETY: likewise for AVX2 and FMA (`isa_builds::avx2`).
        #[cfg(target_arch = "x86_64")]
        AVX2 => unsafe { simd::blocks16_avx2::<P>(&Tile::new::<P>(d, image, oh, ow), out) },
        _ => blocks::<FMA, P, 16>(d, image, oh, ow, out, 0),
    };
    let c0 = blocks::<FMA, P, 8>(d, image, oh, ow, out, c0);
    blocks::<FMA, P, 1>(d, image, oh, ow, out, c0);
}

/// Channels `c0..` in blocks of `L` while whole blocks fit; returns where
/// it stopped. `P × L` accumulators live in registers across every tap.
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

/// Where `P` interior pixels from column `ow` of output row `oh` read.
struct Tile<'a> {
    image: &'a [f32],
    weights: &'a [f32],
    bias: Option<&'a [f32]>,
    c: usize,
    window: &'a Window,
    /// Input row and column of the first pixel's first tap.
    ih0: usize,
    iw0: usize,
    /// Elements between consecutive pixels' inputs.
    pixel_step: usize,
    /// Elements of an input row the `P` pixels' taps span (all channels).
    span: usize,
}

impl<'a> Tile<'a> {
    #[inline(always)]
    fn new<const P: usize>(d: &Depthwise<'a>, image: &'a [f32], oh: usize, ow: usize) -> Tile<'a> {
        let (win, c) = (d.window, d.channels);
        let pixel_step = win.w.stride * c;
        Tile {
            image,
            weights: d.weights,
            bias: d.bias,
            c,
            window: win,
            // Interior: these never underflow (the caller's ranges).
            ih0: oh * win.h.stride - win.h.pad_begin,
            iw0: ow * win.w.stride - win.w.pad_begin,
            pixel_step,
            span: (P - 1) * pixel_step + (win.w.kernel - 1) * win.w.dilation * c + c,
        }
    }

    /// Input row `kh` of the tile (bounds-checked once per kernel row).
    #[inline(always)]
    fn row(&self, kh: usize) -> &'a [f32] {
        let h = &self.window.h;
        let start = ((self.ih0 + kh * h.dilation) * self.window.w.input + self.iw0) * self.c;
        &self.image[start..start + self.span]
    }
}

/// Interior blocks of 16 channels with explicit AVX-512 / AVX2 registers:
/// `P` pixels' accumulators stay in registers across every tap (LLVM does
/// not keep the portable version's arrays in registers).
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)] // SIMD intrinsics on raw pointers, each load justified below
mod simd {
    use super::Tile;
    use std::arch::x86_64::*;

    /// Channels `0..` of the tile in blocks of 16 while whole blocks fit;
    /// returns where it stopped.
    ///
    /// # Safety
    /// The CPU must have AVX-512F and FMA.
    #[target_feature(enable = "avx512f,fma")]
    pub(super) unsafe fn blocks16_avx512<const P: usize>(t: &Tile<'_>, out: &mut [f32]) -> usize {
        let (c, w) = (t.c, &t.window.w);
        let mut c0 = 0;
        while c0 + 16 <= c {
            let init = match t.bias {
                Some(b) => load16(&b[c0..c0 + 16]),
                None => _mm512_setzero_ps(),
            };
            let mut acc = [init; P];
            for kh in 0..t.window.h.kernel {
                let xrow = t.row(kh);
                for kw in 0..w.kernel {
                    let at = (kh * w.kernel + kw) * c + c0;
                    let wv = load16(&t.weights[at..at + 16]);
                    let base = kw * w.dilation * c + c0;
                    for (p, a) in acc.iter_mut().enumerate() {
                        // Pixel p's tap: (P-1)·pixel_step + (k-1)·dilation·c + c0 + 16 <= span.
                        let x = &xrow[base + p * t.pixel_step..][..16];
                        *a = _mm512_fmadd_ps(load16(x), wv, *a);
                    }
                }
            }
            for (p, a) in acc.iter().enumerate() {
                let o = &mut out[p * c + c0..p * c + c0 + 16];
                // SAFETY: `o` holds exactly 16 floats.
                unsafe { _mm512_storeu_ps(o.as_mut_ptr(), *a) };
            }
            c0 += 16;
        }
        c0
    }

    #[inline(always)]
    fn load16(s: &[f32]) -> __m512 {
        assert!(s.len() >= 16);
        // SAFETY: `s` holds at least 16 floats; callers run with AVX-512F.
        unsafe { _mm512_loadu_ps(s.as_ptr()) }
    }

    /// [`blocks16_avx512`] with two 8-lane registers per pixel.
    ///
    /// # Safety
    /// The CPU must have AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn blocks16_avx2<const P: usize>(t: &Tile<'_>, out: &mut [f32]) -> usize {
        let (c, w) = (t.c, &t.window.w);
        let mut c0 = 0;
        while c0 + 16 <= c {
            let init = match t.bias {
                Some(b) => [load8(&b[c0..c0 + 8]), load8(&b[c0 + 8..c0 + 16])],
                None => [_mm256_setzero_ps(); 2],
            };
            let mut acc = [init; P];
            for kh in 0..t.window.h.kernel {
                let xrow = t.row(kh);
                for kw in 0..w.kernel {
                    let at = (kh * w.kernel + kw) * c + c0;
                    let (w0, w1) = (load8(&t.weights[at..at + 8]), load8(&t.weights[at + 8..at + 16]));
                    let base = kw * w.dilation * c + c0;
                    for (p, a) in acc.iter_mut().enumerate() {
                        let x = &xrow[base + p * t.pixel_step..][..16];
                        a[0] = _mm256_fmadd_ps(load8(&x[..8]), w0, a[0]);
                        a[1] = _mm256_fmadd_ps(load8(&x[8..]), w1, a[1]);
                    }
                }
            }
            for (p, a) in acc.iter().enumerate() {
                let o = &mut out[p * c + c0..p * c + c0 + 16];
                // SAFETY: `o` holds exactly 16 floats.
                unsafe {
                    _mm256_storeu_ps(o.as_mut_ptr(), a[0]);
                    _mm256_storeu_ps(o.as_mut_ptr().add(8), a[1]);
                }
            }
            c0 += 16;
        }
        c0
    }

    #[inline(always)]
    fn load8(s: &[f32]) -> __m256 {
        assert!(s.len() >= 8);
        // SAFETY: `s` holds at least 8 floats; callers run with AVX2.
        unsafe { _mm256_loadu_ps(s.as_ptr()) }
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
                    activate(d.activation, &mut acc);
                    if let Some(r) = d.residual {
                        let base = ((n * win.h.output + oh) * win.w.output + ow) * c;
                        for (a, &v) in acc.iter_mut().zip(&r[base..]) {
                            *a += v;
                        }
                    }
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
        ];
        let channels = [1, 7, 8, 16, 19, 32, 40, 53, 96];
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

    #[test]
    fn every_activation_on_interior_and_border() {
        let win = Window {
            h: axis(6, 3, 1, 1, (1, 1)),
            w: axis(10, 3, 1, 1, (1, 1)),
        };
        let c = 35;
        let x = values(win.input_pixels() * c, 5);
        let weights = values(win.taps() * c, 6);
        for isa in Target::ALL.into_iter().filter_map(Isa::new) {
            for act in ACTIVATIONS {
                let d = Depthwise {
                    isa,
                    window: &win,
                    batch: 1,
                    channels: c,
                    x: &x,
                    weights: &weights,
                    bias: None,
                    activation: act,
                    residual: None,
                };
                let mut y = vec![f32::NAN; win.output_pixels() * c];
                depthwise(&d, &mut y, &Serial);
                for (a, b) in y.iter().zip(&reference(&d)) {
                    assert!((a - b).abs() <= 2e-5 * (1.0 + b.abs()), "{act:?}: {a} vs {b}");
                }
            }
        }
    }
}
