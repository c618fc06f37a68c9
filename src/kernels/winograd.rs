//! Winograd F(2×2, 3×3) convolution (issue #13): a 3×3, stride-1 convolution
//! computes each 2×2 block of output pixels (a *tile*) from the 4×4 input
//! patch around it with 16 multiplications per channel pair instead of 36.
//!
//! - The weights are transformed once at compile time (`U = G g Gᵀ`, a 4×4
//!   matrix per input/output channel pair) and packed as 16 GEMM B
//!   matrices `[Ci, Co]`, one per position of the 4×4 ([`pack`]).
//! - At run time, for a chunk of tiles that stays in L2: the input patches
//!   are transformed (`V = Bᵀ d B`) into 16 matrices `[tiles, Ci]`, the 16
//!   products `M = V · U` run on the packed GEMM, and the output transform
//!   (`Y = Aᵀ M A`) gives each tile's 2×2 pixels, to which the epilogue
//!   (bias, activation, residual, activation after) is applied as they are
//!   stored.
//!
//! Multiplications drop 2.25×; the transforms are additions only (and the
//! weight transform's halves), so the results differ from the direct
//! convolution's by a few roundings (relative ~1e-6 at ResNet's sizes).
//! Which convolutions use it is [`pays`]'s rule.

use std::cell::RefCell;

use super::conv::Conv;
use super::gemm::{self, activate, Epilogue, PackedB};
use super::parallel::{try_for_each_block, Blocks, Parallel, Serial};
use super::spatial::{Axis, Window};
use super::Isa;
use crate::error::{Error, Result};
use crate::target::Target;

/// Positions of the 4×4 transformed tile: one GEMM each.
pub const POSITIONS: usize = 16;

/// Channels the transforms handle at once (one AVX2 register).
const LANES: usize = 8;

/// Whether the kernel can run this convolution: 3×3, stride 1, no
/// dilation, one group, channel counts in whole vectors of the transforms.
pub fn eligible(w: &Window, ci: usize, co: usize, groups: usize) -> bool {
    let axis_ok = |a: &Axis| a.kernel == 3 && a.stride == 1 && a.dilation == 1;
    axis_ok(&w.h)
        && axis_ok(&w.w)
        && groups == 1
        && ci > 0
        && co > 0
        && ci.is_multiple_of(LANES)
        && co.is_multiple_of(LANES)
}

/// Whether the compiler should choose this kernel over the direct
/// convolution. Measured on a Zen 3 (AVX2, one thread, the kernel alone
/// against the direct convolution at 91–97% of the FMA peak; best of 25):
/// ResNet-50's 3×3 layers 1.13–1.38× faster at 56² × 64, 1.6× at 28² ×
/// 128, 1.4× at 14² × 256; 20² × 64 1.25×, 13² × 64 → 256 1.31×, 27² ×
/// 32 → 128 1.22×, 56² × 128 → 32 1.36×. Not where it loses: few tiles
/// (7² × 512: 0.6–0.7×, its 16/9 more weight bytes are read for 16 tiles),
/// or narrow channels (32 → 32 at 40² and 80² 0.83–0.88×, 16 → 64 0.9×:
/// the transforms cost more than the products save). AVX-512 has not been
/// measured: its direct convolution stays.
pub fn pays(target: Target, w: &Window, ci: usize, co: usize, groups: usize) -> bool {
    target == Target::Avx2
        && eligible(w, ci, co, groups)
        && ci.min(co) >= 32
        && ci + co >= 128
        && w.output_pixels() >= 12 * 12
}

/// ONNX weights `[co, ci, 3, 3]` transformed (`G g Gᵀ`) and packed as
/// [`POSITIONS`] B matrices `[ci, co]` for `target`.
pub fn pack(target: Target, w: &[f32], co: usize, ci: usize) -> Result<Vec<PackedB>> {
    if w.len() != co * ci * 9 {
        return Err(Error::invalid_graph(format!(
            "Winograd weights of {} values are not [{co}, {ci}, 3, 3]",
            w.len()
        )));
    }
    let mut u = vec![0.0f32; POSITIONS * ci * co];
    for o in 0..co {
        for i in 0..ci {
            let g = &w[(o * ci + i) * 9..][..9];
            // G · g (4 × 3), column by column.
            let gg: [[f32; 3]; 4] = {
                let col = |c: usize| weight_rows([g[c], g[3 + c], g[6 + c]]);
                let cols = [col(0), col(1), col(2)];
                std::array::from_fn(|r| [cols[0][r], cols[1][r], cols[2][r]])
            };
            // (G · g) · Gᵀ, row by row.
            for (r, row) in gg.iter().enumerate() {
                for (c, v) in weight_rows(*row).into_iter().enumerate() {
                    u[((r * 4 + c) * ci + i) * co + o] = v;
                }
            }
        }
    }
    u.chunks_exact(ci * co)
        .map(|m| PackedB::try_pack(target, m, ci, co, false))
        .collect()
}

/// `G · [g0, g1, g2]`: the weight transform of one column (or row).
fn weight_rows([g0, g1, g2]: [f32; 3]) -> [f32; 4] {
    [g0, 0.5 * (g0 + g1 + g2), 0.5 * (g0 - g1 + g2), g2]
}

/// Whether `packs` are this convolution's: [`POSITIONS`] of `[ci, co]`.
pub fn packs_fit(packs: &[&PackedB], ci: usize, co: usize) -> bool {
    packs.len() == POSITIONS && packs.iter().all(|p| p.k() == ci && p.n() == co)
}

/// Most values a chunk's transformed input and products hold together:
/// 256 KiB, half a Zen 3's L2, so that they and one position's packed
/// weights stay there (twice that ran slower at 56² × 64; not tuned
/// further).
const CHUNK_VALUES: usize = 1 << 16;

/// The convolution into `y` (output pixels `ldo` values apart), with
/// `c.residual`, or with `y`'s own values as the residual if `onto`.
/// The caller checked the sizes (`conv::check`) and that the window is
/// [`eligible`] and `packs` [`packs_fit`].
pub fn conv(
    isa: Isa,
    c: &Conv<'_>,
    packs: &[&PackedB],
    y: &mut [f32],
    ldo: usize,
    onto: bool,
    par: &dyn Parallel,
) -> Result<()> {
    let w = c.window;
    let grid = Grid {
        rows: w.h.output.div_ceil(2),
        cols: w.w.output.div_ceil(2),
    };
    let image = w.output_pixels() * ldo;
    // Whole tile rows per task: one task per image on one thread, else
    // about two per thread.
    let tasks_per_image = if par.threads() > 1 {
        (2 * par.threads()).div_ceil(c.batch).min(grid.rows)
    } else {
        1
    };
    let rows_per_task = grid.rows.div_ceil(tasks_per_image.max(1));
    let block = rows_per_task * 2 * w.w.output * ldo;
    let run = Run {
        isa,
        c,
        packs,
        ldo,
        onto,
        grid,
    };
    try_for_each_block(par, y, Blocks::new(y.len(), image, block), &|i, out| {
        let per_image = grid.rows.div_ceil(rows_per_task);
        let (n, first) = (i / per_image, i % per_image * rows_per_task);
        let rows = first..(first + rows_per_task).min(grid.rows);
        super::with_thread_buffer(&SCRATCH, |buf| run.tile_rows(n, rows, out, buf))
    })
}

thread_local! {
    /// A task's transformed input, products and one tile's pixels, kept
    /// between runs.
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// The grid of 2×2 output tiles of one image.
#[derive(Clone, Copy)]
struct Grid {
    rows: usize,
    cols: usize,
}

/// One convolution's operands for its tasks.
struct Run<'a> {
    isa: Isa,
    c: &'a Conv<'a>,
    packs: &'a [&'a PackedB],
    ldo: usize,
    onto: bool,
    grid: Grid,
}

impl Run<'_> {
    /// Tile rows `rows` of image `n` into `out`, the output from the first
    /// of those rows' pixels on.
    fn tile_rows(&self, n: usize, rows: std::ops::Range<usize>, out: &mut [f32], buf: &mut Vec<f32>) -> Result<()> {
        let (ci, co) = (self.c.in_channels, self.c.out_channels);
        let tiles = rows.len() * self.grid.cols;
        let chunk = (CHUNK_VALUES / (POSITIONS * (ci + co))).clamp(1, tiles.max(1));
        let need = POSITIONS * chunk * (ci + co) + 4 * co;
        if buf.len() < need {
            buf.resize(need, 0.0);
        }
        let (v, rest) = buf.split_at_mut(POSITIONS * chunk * ci);
        let (m, pixel) = rest.split_at_mut(POSITIONS * chunk * co);
        let first = rows.start * self.grid.cols;
        for start in (first..first + tiles).step_by(chunk) {
            let t = start..(start + chunk).min(first + tiles);
            let (v, m) = (&mut v[..POSITIONS * t.len() * ci], &mut m[..POSITIONS * t.len() * co]);
            self.input(n, t.clone(), v);
            for (p, pack) in self.packs.iter().enumerate() {
                let a = &v[p * t.len() * ci..][..t.len() * ci];
                let dst = &mut m[p * t.len() * co..][..t.len() * co];
                gemm::gemm_packed(self.isa, t.len(), a, ci, pack, dst, co, &Epilogue::default(), &Serial)?;
            }
            self.output(n, t, rows.start, m, out, &mut pixel[..4 * co]);
        }
        Ok(())
    }

    /// The input transform of tiles `t` of image `n` into `v`
    /// (`[POSITIONS][t.len()][ci]`).
    fn input(&self, n: usize, t: std::ops::Range<usize>, v: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if self.isa.target() != Target::Generic {
            // SAFETY: AVX2 and FMA: `Isa::new` checked that the CPU runs this
            // target, and every target above the generic one needs both
            // (`Target::cpu_best`).
            #[allow(unsafe_code)]
            unsafe {
                return input_avx2(self, n, t, v);
            }
        }
        input_transform(self, n, t, v)
    }

    /// The output transform of tiles `t` from `m` (`[POSITIONS][t.len()][co]`)
    /// with the epilogue, into `out` (from tile row `row0`'s first pixel).
    fn output(&self, n: usize, t: std::ops::Range<usize>, row0: usize, m: &[f32], out: &mut [f32], pixel: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if self.isa.target() != Target::Generic {
            // SAFETY: as in `input`.
            #[allow(unsafe_code)]
            unsafe {
                return output_avx2(self, n, t, row0, m, out, pixel);
            }
        }
        output_transform(self, n, t, row0, m, out, pixel)
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn input_avx2(r: &Run<'_>, n: usize, t: std::ops::Range<usize>, v: &mut [f32]) {
    input_transform(r, n, t, v)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn output_avx2(
    r: &Run<'_>,
    n: usize,
    t: std::ops::Range<usize>,
    row0: usize,
    m: &[f32],
    out: &mut [f32],
    pixel: &mut [f32],
) {
    output_transform(r, n, t, row0, m, out, pixel)
}

type Lanes = [f32; LANES];

// Plain loops, not `array::from_fn`: LLVM left those calls out of line,
// outside the AVX2 functions (a fifth of the kernel's time).
#[inline(always)]
fn add(mut a: Lanes, b: Lanes) -> Lanes {
    for l in 0..LANES {
        a[l] += b[l];
    }
    a
}

#[inline(always)]
fn sub(mut a: Lanes, b: Lanes) -> Lanes {
    for l in 0..LANES {
        a[l] -= b[l];
    }
    a
}

#[inline(always)]
fn load(src: &[f32]) -> Lanes {
    let mut v = [0.0; LANES];
    v.copy_from_slice(&src[..LANES]);
    v
}

/// `Bᵀ · d` over one column (or row) of a patch.
#[inline(always)]
fn input_rows(d: [Lanes; 4]) -> [Lanes; 4] {
    [sub(d[0], d[2]), add(d[1], d[2]), sub(d[2], d[1]), sub(d[1], d[3])]
}

/// `Aᵀ · m` over one column (or row) of a transformed tile.
#[inline(always)]
fn output_rows(m: [Lanes; 4]) -> [Lanes; 2] {
    [add(add(m[0], m[1]), m[2]), sub(sub(m[1], m[2]), m[3])]
}

#[inline(always)]
fn input_transform(r: &Run<'_>, n: usize, t: std::ops::Range<usize>, v: &mut [f32]) {
    let (w, ci) = (r.c.window, r.c.in_channels);
    let (ih, iw) = (w.h.input, w.w.input);
    let x = &r.c.x[n * ih * iw * ci..][..ih * iw * ci];
    let count = t.len();
    for (k, tile) in t.enumerate() {
        let (ty, tx) = (tile / r.grid.cols, tile % r.grid.cols);
        // The patch's input rows and columns, None in the padding.
        let at = |o: usize, pad: usize, len: usize| o.checked_sub(pad).filter(|&i| i < len);
        let ys = [0, 1, 2, 3].map(|i| at(2 * ty + i, w.h.pad_begin, ih));
        let xs = [0, 1, 2, 3].map(|j| at(2 * tx + j, w.w.pad_begin, iw));
        for c0 in (0..ci).step_by(LANES) {
            let mut d = [[[0.0; LANES]; 4]; 4];
            for (i, row) in d.iter_mut().enumerate() {
                for (j, vals) in row.iter_mut().enumerate() {
                    if let (Some(y), Some(x0)) = (ys[i], xs[j]) {
                        *vals = load(&x[(y * iw + x0) * ci + c0..]);
                    }
                }
            }
            let mut cols = [[[0.0; LANES]; 4]; 4];
            for (j, col) in cols.iter_mut().enumerate() {
                *col = input_rows([d[0][j], d[1][j], d[2][j], d[3][j]]);
            }
            for i in 0..4 {
                let row = input_rows([cols[0][i], cols[1][i], cols[2][i], cols[3][i]]);
                for (j, vals) in row.iter().enumerate() {
                    v[((i * 4 + j) * count + k) * ci + c0..][..LANES].copy_from_slice(vals);
                }
            }
        }
    }
}

#[inline(always)]
fn output_transform(
    r: &Run<'_>,
    n: usize,
    t: std::ops::Range<usize>,
    row0: usize,
    m: &[f32],
    out: &mut [f32],
    pixels: &mut [f32],
) {
    let (w, co, ldo) = (r.c.window, r.c.out_channels, r.ldo);
    let (oh, ow) = (w.h.output, w.w.output);
    let count = t.len();
    for (k, tile) in t.enumerate() {
        let (ty, tx) = (tile / r.grid.cols, tile % r.grid.cols);
        // The tile's 2×2 pixels, `co` values each, into `pixels`.
        for c0 in (0..co).step_by(LANES) {
            let g = |p: usize| load(&m[(p * count + k) * co + c0..]);
            // Aᵀ · M (2 × 4), column by column, then its rows times A.
            let mut cols = [[[0.0; LANES]; 2]; 4];
            for (q, col) in cols.iter_mut().enumerate() {
                *col = output_rows([g(q), g(4 + q), g(8 + q), g(12 + q)]);
            }
            for i in 0..2 {
                let y = output_rows([cols[0][i], cols[1][i], cols[2][i], cols[3][i]]);
                for (j, vals) in y.iter().enumerate() {
                    pixels[(i * 2 + j) * co + c0..][..LANES].copy_from_slice(vals);
                }
            }
        }
        // The tile's pixels inside the image: (index in `pixels`, output
        // pixel of the batch, offset in `out`).
        let inside = (0..4).filter_map(|q| {
            let (oy, ox) = (2 * ty + q / 2, 2 * tx + q % 2);
            (oy < oh && ox < ow).then(|| (q, (n * oh + oy) * ow + ox, ((oy - 2 * row0) * ow + ox) * ldo))
        });
        finish_tile(r, pixels, inside, out);
    }
}

/// `out`'s pixels = `after(act(pixel + bias) + residual)` for a tile's
/// `pixels` (4 × `co`; the residual `out`'s own values with `onto`): each
/// activation over the whole tile at once, the residual and the store
/// only for the pixels `inside` the image.
#[inline(always)]
fn finish_tile(
    r: &Run<'_>,
    pixels: &mut [f32],
    inside: impl Iterator<Item = (usize, usize, usize)> + Clone,
    out: &mut [f32],
) {
    let (c, co) = (r.c, r.c.out_channels);
    if let Some(b) = c.bias {
        for px in pixels.chunks_exact_mut(co) {
            px.iter_mut().zip(b).for_each(|(v, b)| *v += b);
        }
    }
    activate(c.activation, pixels);
    for (q, p, at) in inside.clone() {
        let px = &mut pixels[q * co..][..co];
        if r.onto {
            px.iter_mut().zip(&out[at..at + co]).for_each(|(v, r)| *v += r);
        } else if let Some(res) = c.residual {
            px.iter_mut().zip(&res[p * co..][..co]).for_each(|(v, r)| *v += r);
        }
    }
    activate(c.after, pixels);
    for (q, _, at) in inside {
        out[at..at + co].copy_from_slice(&pixels[q * co..][..co]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::conv::{self, ConvWeights};
    use crate::kernels::gemm::Activation;
    use crate::kernels::parallel::ScopedThreads;
    use crate::kernels::spatial::output_len;

    fn axis(input: usize, pad: (usize, usize)) -> Axis {
        Axis {
            input,
            output: output_len(input, 3, 1, 1, pad, false).unwrap(),
            kernel: 3,
            stride: 1,
            dilation: 1,
            pad_begin: pad.0,
            pad_end: pad.1,
        }
    }

    fn values(n: usize, seed: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 7919 + seed * 104729) % 97) as f32 / 48.0 - 1.0)
            .collect()
    }

    struct Case {
        batch: usize,
        h: usize,
        w: usize,
        pad: (usize, usize),
        ci: usize,
        co: usize,
        bias: bool,
        act: Activation,
        residual: bool,
        onto: bool,
        ldo_extra: usize,
    }

    /// The Winograd kernel against the packed direct (or im2col) path on
    /// the same target, every thread count.
    fn check(case: &Case) {
        let window = Window {
            h: axis(case.h, case.pad),
            w: axis(case.w, case.pad),
        };
        let (ci, co) = (case.ci, case.co);
        let x = values(case.batch * case.h * case.w * ci, 1);
        let wt = values(co * ci * 9, 2);
        let bias = values(co, 3);
        let pixels = case.batch * window.output_pixels();
        let res = values(pixels * co, 4);
        let ldo = co + case.ldo_extra;
        for target in Target::ALL {
            let Some(isa) = Isa::new(target) else { continue };
            let direct = conv::pack_groups(target, &wt, co, ci, 9, 1).unwrap();
            let direct: Vec<&PackedB> = direct.iter().collect();
            let wino = pack(target, &wt, co, ci).unwrap();
            let wino: Vec<&PackedB> = wino.iter().collect();
            let make = |weights| conv::Conv {
                window: &window,
                batch: case.batch,
                in_channels: ci,
                out_channels: co,
                groups: 1,
                x: &x,
                weights,
                bias: case.bias.then_some(&bias[..]),
                activation: case.act,
                residual: (case.residual && !case.onto).then_some(&res[..]),
                after: if case.residual {
                    Activation::Relu
                } else {
                    Activation::None
                },
            };
            let len = conv::strided_len(pixels, ldo, co).unwrap();
            let mut want = vec![0.5f32; len];
            if case.onto {
                want.copy_from_slice(&res);
                conv::conv_onto(isa, &make(ConvWeights::Packed(&direct)), &mut want, &Serial).unwrap();
            } else if ldo == co {
                conv::conv(isa, &make(ConvWeights::Packed(&direct)), &mut want, &Serial).unwrap();
            } else {
                // The reference writes dense pixels; spread them out.
                let mut dense = vec![0.0f32; pixels * co];
                conv::conv(isa, &make(ConvWeights::Packed(&direct)), &mut dense, &Serial).unwrap();
                for (p, px) in dense.chunks_exact(co).enumerate() {
                    want[p * ldo..p * ldo + co].copy_from_slice(px);
                }
            }
            let scale = want.iter().fold(1.0f32, |m, v| m.max(v.abs()));
            for threads in [1, 2, 3] {
                let mut got = vec![0.5f32; len];
                let c = make(ConvWeights::Winograd(&wino));
                let par: &dyn Parallel = if threads == 1 { &Serial } else { &ScopedThreads(threads) };
                if case.onto {
                    got.copy_from_slice(&res);
                    conv::conv_onto(isa, &c, &mut got, par).unwrap();
                } else {
                    conv::conv_strided(isa, &c, &mut got, ldo, par).unwrap();
                }
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (g - w).abs() <= 2e-6 * scale * (ci as f32).sqrt(),
                        "{target} {threads} threads, value {i}: {g} vs {w} (h {} w {} pad {:?} {ci}->{co})",
                        case.h,
                        case.w,
                        case.pad
                    );
                }
            }
        }
    }

    fn case(h: usize, w: usize, ci: usize, co: usize) -> Case {
        Case {
            batch: 1,
            h,
            w,
            pad: (1, 1),
            ci,
            co,
            bias: true,
            act: Activation::Relu,
            residual: false,
            onto: false,
            ldo_extra: 0,
        }
    }

    #[test]
    fn matches_the_direct_convolution_at_even_and_odd_sizes() {
        for (h, w) in [(8, 8), (7, 9), (1, 1), (2, 3), (15, 6), (5, 1)] {
            check(&case(h, w, 8, 16));
        }
        check(&case(6, 10, 24, 8));
    }

    #[test]
    fn matches_with_other_pads_batches_and_epilogues() {
        check(&Case {
            pad: (0, 0),
            ..case(9, 7, 8, 8)
        });
        check(&Case {
            pad: (2, 2),
            ..case(4, 5, 8, 8)
        });
        check(&Case {
            pad: (0, 2),
            ..case(6, 6, 16, 8)
        });
        check(&Case {
            batch: 3,
            ..case(5, 6, 8, 16)
        });
        check(&Case {
            bias: false,
            act: Activation::None,
            ..case(6, 7, 16, 16)
        });
        check(&Case {
            residual: true,
            ..case(7, 7, 8, 8)
        });
        check(&Case {
            batch: 2,
            residual: true,
            onto: true,
            ..case(6, 5, 8, 16)
        });
        check(&Case {
            batch: 2,
            ldo_extra: 8,
            ..case(5, 8, 8, 16)
        });
    }

    #[test]
    fn rejects_what_it_cannot_run() {
        let w = Window {
            h: axis(8, (1, 1)),
            w: axis(8, (1, 1)),
        };
        assert!(eligible(&w, 8, 16, 1));
        assert!(!eligible(&w, 12, 16, 1), "channels not in whole vectors");
        assert!(!eligible(&w, 8, 16, 2), "groups");
        let strided = Window {
            h: Axis {
                stride: 2,
                output: 4,
                ..w.h
            },
            w: w.w,
        };
        assert!(!eligible(&strided, 8, 16, 1));
        assert!(pack(Target::Generic, &[0.0; 10], 2, 2).is_err());
        // Weights for other channels fail the convolution's checks, not the kernel.
        let wino = pack(Target::Generic, &values(8 * 8 * 9, 0), 8, 8).unwrap();
        let wino: Vec<&PackedB> = wino.iter().collect();
        let x = values(64 * 16, 1);
        let c = conv::Conv {
            window: &w,
            batch: 1,
            in_channels: 16,
            out_channels: 8,
            groups: 1,
            x: &x,
            weights: ConvWeights::Winograd(&wino),
            bias: None,
            activation: Activation::None,
            residual: None,
            after: Activation::None,
        };
        let mut y = vec![0.0; 64 * 8];
        let err = conv::conv(Isa::new(Target::Generic).unwrap(), &c, &mut y, &Serial).unwrap_err();
        assert!(err.to_string().contains("weights do not fit"), "{err}");
    }
}
