//! Winograd F(2×2, 3×3) and F(4×4, 3×3) convolutions (issue #13): a 3×3,
//! stride-1 convolution computes each 2×2 (4×4) block of output pixels (a
//! *tile*) from the 4×4 (6×6) input patch around it with 16 (36)
//! multiplications per channel pair instead of 36 (144).
//!
//! - The weights are transformed once at compile time (`U = G g Gᵀ`, a 4×4
//!   or 6×6 matrix per input/output channel pair) and packed as 16 or 36
//!   GEMM B matrices `[Ci, Co]`, one per position ([`pack`]); the count
//!   tells the kernel which variant it runs ([`tile_size`] chooses).
//! - At run time, for a chunk of tiles that stays in L2: the input patches
//!   are transformed (`V = Bᵀ d B`) into 16 (36) matrices `[tiles, Ci]`, the
//!   products `M = V · U` run on the packed GEMM, and the output transform
//!   (`Y = Aᵀ M A`) gives each tile's 2×2 pixels, to which the epilogue
//!   (bias, activation, residual, activation after) is applied as they are
//!   stored.
//!
//! Multiplications drop 2.25× (4×); F(2×2)'s transforms are additions
//! only (and the weight transform's halves), so its results differ from
//! the direct convolution's by a few roundings (relative ~2e-7 at ResNet's
//! sizes); F(4×4)'s factors up to 8 make that ~3e-6.
//! Which convolutions use it is [`pays`]'s rule.

use std::cell::RefCell;

use super::conv::{Conv, Out};
use super::gemm::{self, activate, Epilogue, PackedB};
use super::parallel::{try_for_each, Parallel, Serial};
use super::spatial::{Axis, Window};
use super::Isa;
use crate::error::{Error, Result};
use crate::target::Target;

/// The output tile sides kiln runs: F(2×2, 3×3) and F(4×4, 3×3).
pub const TILE_SIZES: [usize; 2] = [2, 4];

/// The output tile's side for a convolution that [`pays`]: 4
/// (F(4×4, 3×3), 36 products per 16 pixels instead of 16 per 4) where
/// the output has 12 rows and columns or more, else 2 (the partial tiles
/// at the edges compute pixels that are thrown away). Kernel alone, Zen 3,
/// one thread, against the direct convolution, F(2×2) → F(4×4): 56² × 64
/// 1.28 → 2.01×, 28² × 128 1.56 → 2.29×, 14² × 256 1.70 → 1.79×, 13² × 64
/// → 256 1.38 → 1.55×, 20² × 64 1.29 → 1.91×; 7² × 512 1.22 → 0.92×.
pub fn tile_size(w: &Window) -> usize {
    if w.h.output >= 12 && w.w.output >= 12 {
        4
    } else {
        2
    }
}

/// The packs' count for output tiles of `m`×`m`: `(m + 2)²` positions of
/// the transformed tile, one GEMM each.
pub const fn positions(m: usize) -> usize {
    (m + 2) * (m + 2)
}

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
/// convolution. Measured with F(2×2) on a Zen 3 (AVX2, one thread, the kernel alone
/// against the direct convolution at 91–97% of the FMA peak; best of 25):
/// ResNet-50's 3×3 layers 1.13–1.38× faster at 56² × 64, 1.6× at 28² ×
/// 128, 1.4× at 14² × 256; 20² × 64 1.25×, 13² × 64 → 256 1.31×, 27² ×
/// 32 → 128 1.22×, 56² × 128 → 32 1.36×. Not where it loses: few tiles
/// (7² × 512 with chunks of 3–8 tiles: 0.6–0.7×, its 16/9 more weight bytes
/// read for 16 tiles; see below),
/// or narrow channels (32 → 32 at 40² and 80² 0.83–0.88×, 16 → 64 0.9×:
/// the transforms cost more than the products save).
///
/// F(4×4, 3×3) pays from fewer channels: 32 → 32 at 40² and 80² 1.43× and
/// 1.40× (F(2×2) 0.88×, 0.84×); 16 → 64 at 55² only 1.08×.
///
/// Since chunks hold at least [`MIN_CHUNK_TILES`] tiles, few tiles with
/// 512 channels pay too: 7² × 512 F(2×2) kernel alone 1.22× the direct
/// convolution's speed, ResNet-50's two such layers 2.49 → 1.75 ms at one
/// thread and 1.29 → 0.95 ms at two (cut by channels, `Split::choose`),
/// the model 78.5 → 75.6 and 44.1 → 43.2 ms (Zen 3, step timer). Narrower
/// layers at 7² were not measured.
///
/// AVX-512 (Zen 5, `bench/conv.py` shapes against ORT, kiln's direct
/// convolution at 93–98% of the FMA peak): the same rule pays 1.3–2.3× at
/// one thread (64² … 512² channels, 7² to 80² pixels; 32 → 128 at 27²
/// 1.28×), but not into 32 output channels: 128 → 32 at 56², 28², 14²
/// 0.86×, 0.94×, 0.69× the direct convolution's speed (DenseNet's 3×3
/// layers), its products two vectors wide for transforms as wide as ever.
pub fn pays(target: Target, w: &Window, ci: usize, co: usize, groups: usize) -> bool {
    let wide_enough = match target {
        Target::Avx2 => true,
        Target::Avx512 => co >= 48,
        Target::Generic => false,
    };
    wide_enough
        && eligible(w, ci, co, groups)
        && ci.min(co) >= 32
        && (ci + co >= 128 || tile_size(w) == 4)
        && (w.output_pixels() >= 12 * 12 || ci.min(co) >= 512)
}

/// ONNX weights `[co, ci, 3, 3]` transformed (`G g Gᵀ`) for output tiles
/// of `m`×`m` (2 or 4, [`tile_size`]) and packed as [`positions`]`(m)` B
/// matrices `[ci, co]` for `target`.
pub fn pack(target: Target, w: &[f32], co: usize, ci: usize, m: usize) -> Result<Vec<PackedB>> {
    if w.len() != co * ci * 9 {
        return Err(Error::invalid_graph(format!(
            "Winograd weights of {} values are not [{co}, {ci}, 3, 3]",
            w.len()
        )));
    }
    let u = match m {
        2 => transform_weights::<F2, 2, 4>(w, co, ci),
        4 => transform_weights::<F4, 4, 6>(w, co, ci),
        _ => return Err(Error::invalid_graph(format!("no Winograd F({m}×{m}, 3×3)"))),
    };
    u.chunks_exact(ci * co)
        .map(|m| PackedB::try_pack(target, m, ci, co, false))
        .collect()
}

/// `U = G g Gᵀ` of every channel pair, as `[N·N][ci][co]`.
fn transform_weights<T: Tile<M, N>, const M: usize, const N: usize>(w: &[f32], co: usize, ci: usize) -> Vec<f32> {
    let mut u = vec![0.0f32; N * N * ci * co];
    for o in 0..co {
        for i in 0..ci {
            let g = &w[(o * ci + i) * 9..][..9];
            // G · g (N × 3), column by column.
            let gg: [[f32; 3]; N] = {
                let col = |c: usize| T::weight_rows([g[c], g[3 + c], g[6 + c]]);
                let cols = [col(0), col(1), col(2)];
                std::array::from_fn(|r| [cols[0][r], cols[1][r], cols[2][r]])
            };
            // (G · g) · Gᵀ, row by row.
            for (r, row) in gg.iter().enumerate() {
                for (c, v) in T::weight_rows(*row).into_iter().enumerate() {
                    u[((r * N + c) * ci + i) * co + o] = v;
                }
            }
        }
    }
    u
}

/// One Winograd variant F(M×M, 3×3): output tiles of `M`×`M` from input
/// patches of `N`×`N` (`N = M + 2`), by its three transforms along one
/// column (or row).
trait Tile<const M: usize, const N: usize> {
    /// `G · g`.
    fn weight_rows(g: [f32; 3]) -> [f32; N];
    /// `Bᵀ · d`.
    fn input_rows(d: [Lanes; N]) -> [Lanes; N];
    /// `Aᵀ · m`.
    fn output_rows(m: [Lanes; N]) -> [Lanes; M];
}

/// F(2×2, 3×3): transforms of additions only (and the weights' halves).
struct F2;

impl Tile<2, 4> for F2 {
    fn weight_rows([g0, g1, g2]: [f32; 3]) -> [f32; 4] {
        [g0, 0.5 * (g0 + g1 + g2), 0.5 * (g0 - g1 + g2), g2]
    }

    #[inline(always)]
    fn input_rows(d: [Lanes; 4]) -> [Lanes; 4] {
        [sub(d[0], d[2]), add(d[1], d[2]), sub(d[2], d[1]), sub(d[1], d[3])]
    }

    #[inline(always)]
    fn output_rows(m: [Lanes; 4]) -> [Lanes; 2] {
        [add(add(m[0], m[1]), m[2]), sub(sub(m[1], m[2]), m[3])]
    }
}

/// F(4×4, 3×3), on the points 0, ±1, ±2 and ∞ (Lavin and Gray, 2016):
/// 2.25 products per output pixel instead of F(2×2)'s 4, for transforms
/// with small integer factors and roundings a few times larger.
struct F4;

impl Tile<4, 6> for F4 {
    fn weight_rows([g0, g1, g2]: [f32; 3]) -> [f32; 6] {
        [
            g0 / 4.0,
            -(g0 + g1 + g2) / 6.0,
            -(g0 - g1 + g2) / 6.0,
            g0 / 24.0 + g1 / 12.0 + g2 / 6.0,
            g0 / 24.0 - g1 / 12.0 + g2 / 6.0,
            g2,
        ]
    }

    #[inline(always)]
    fn input_rows(d: [Lanes; 6]) -> [Lanes; 6] {
        let (d42, d31) = (sub(d[4], d[2]), sub(d[3], d[1]));
        [
            add(axpy(4.0, d[0], d[4]), scale(-5.0, d[2])),
            axpy(-4.0, add(d[1], d[2]), add(d[3], d[4])),
            axpy(4.0, sub(d[1], d[2]), sub(d[4], d[3])),
            axpy(2.0, d31, d42),
            axpy(-2.0, d31, d42),
            add(axpy(4.0, d[1], d[5]), scale(-5.0, d[3])),
        ]
    }

    #[inline(always)]
    fn output_rows(m: [Lanes; 6]) -> [Lanes; 4] {
        let (p12, m12, p34, m34) = (add(m[1], m[2]), sub(m[1], m[2]), add(m[3], m[4]), sub(m[3], m[4]));
        [
            add(add(m[0], p12), p34),
            axpy(2.0, m34, m12),
            axpy(4.0, p34, p12),
            add(axpy(8.0, m34, m12), m[5]),
        ]
    }
}

/// Whether `packs` are this convolution's: [`positions`]`(m)` of `[ci,
/// co]` for `m` in [`TILE_SIZES`].
pub fn packs_fit(packs: &[&PackedB], ci: usize, co: usize) -> bool {
    TILE_SIZES.iter().any(|&m| positions(m) == packs.len()) && packs.iter().all(|p| p.k() == ci && p.n() == co)
}

/// Most values a chunk's transformed input and products hold together:
/// 256 KiB, half a Zen 3's L2, so that they and one position's packed
/// weights stay there (twice that ran slower at 56² × 64; not tuned
/// further).
const CHUNK_VALUES: usize = 1 << 16;

/// Fewest tiles per chunk, whatever its size: every chunk streams all
/// the positions' weights (9 MiB for F(4×4) at 256 → 256 channels), and
/// with wide channels the 256 KiB held 3 to 8 tiles. At least 24 (kernel
/// alone, Zen 3, one thread): 14² × 256 F(2×2) 1.44 → 1.70× the direct
/// convolution's speed, F(4×4) 1.12 → 1.79×; 7² × 512 F(2×2) 0.61 → 1.22×;
/// 56² × 64 F(4×4) 1.73 → 2.01× (48 was no better).
const MIN_CHUNK_TILES: usize = 24;

/// Packed weights from which a convolution's weights come from memory at
/// every run, not the caches (a Zen 3 has 512 KiB of L2 per core and an
/// L3 shared with other tenants on a VM): then two threads each streaming
/// all of them costs more than cutting the channels between them.
const STREAMED_WEIGHT_BYTES: usize = 4 << 20;

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
    match packs.len() {
        n if n == positions(4) => conv_tiles::<F4, 4, 6>(isa, c, packs, y, (ldo, onto), par),
        _ => conv_tiles::<F2, 2, 4>(isa, c, packs, y, (ldo, onto), par),
    }
}

fn conv_tiles<T: Tile<M, N>, const M: usize, const N: usize>(
    isa: Isa,
    c: &Conv<'_>,
    packs: &[&PackedB],
    y: &mut [f32],
    (ldo, onto): (usize, bool),
    par: &dyn Parallel,
) -> Result<()> {
    let w = c.window;
    let grid = Grid {
        rows: w.h.output.div_ceil(M),
        cols: w.w.output.div_ceil(M),
    };
    let nr = packs.first().map_or(LANES, |p| p.nr());
    let weights = packs.iter().map(|p| p.data().byte_len()).sum();
    let panels = (c.out_channels.div_ceil(nr), nr);
    let split = Split::choose(c.batch, grid, panels, weights, par.threads());
    let run = Run::<T, M, N> {
        isa,
        c,
        packs,
        grid,
        tile: std::marker::PhantomData,
    };
    let out = Out::new(y, ldo, onto);
    try_for_each(par, split.tasks(), &|i| {
        let (n, rows, panels) = split.task(i);
        let chans = panels.start * nr..(panels.end * nr).min(c.out_channels);
        let task = Task { n, rows, panels, chans };
        super::with_thread_buffer(&SCRATCH, |buf| run.tile_rows(&task, &out, buf))
    })
}

/// How a convolution's tiles are cut into tasks: runs of `rows_per_task`
/// tile rows of one image, times `groups` runs of weight panels (output
/// channels).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Split {
    batch: usize,
    tile_rows: usize,
    rows_per_task: usize,
    panels: usize,
    groups: usize,
}

impl Split {
    /// Runs of whole tile rows per task: the length whose tasks load the
    /// busiest thread least, the longest of those (fewest tasks, longest
    /// GEMMs; about two tasks per thread had cut F(4×4)'s 14 tile rows at
    /// 56² as 4 + 4 + 4 + 2, one thread computing 8 of them).
    ///
    /// Every task streams all the weights it multiplies by: where those
    /// come from memory ([`STREAMED_WEIGHT_BYTES`]) and a thread gets
    /// fewer than two chunks of tiles ([`MIN_CHUNK_TILES`]), the threads
    /// share the output channels instead (`nr`-wide panels in whole
    /// vectors of the transforms), each image whole: each streams its
    /// share of the weights, and transforms the input all of them read.
    /// ResNet-50's 14² × 256 layers (F(4×4), 16 tiles, 9 MiB of weights),
    /// two threads, Zen 3: 0.89–1.20 → 0.69–0.86 ms. Not with weights
    /// that stay in the caches: SqueezeNet's 13² × 48–64 → 192–256 (1.3
    /// and 2.4 MiB) and ResNet-50's 28² × 128 (2.4 MiB, 7 tile rows cut
    /// 4 + 3) ran 0–10% slower cut by channels (their input transformed
    /// twice).
    fn choose(batch: usize, grid: Grid, (panels, nr): (usize, usize), weights: usize, threads: usize) -> Split {
        let threads = threads.max(1);
        let busiest = |r: usize| (batch * grid.rows.div_ceil(r)).div_ceil(threads) * r;
        let rows_per_task = (1..=grid.rows.max(1))
            .min_by_key(|&r| (busiest(r), std::cmp::Reverse(r)))
            .unwrap_or(1);
        let by_rows = Split {
            batch,
            tile_rows: grid.rows,
            rows_per_task,
            panels,
            groups: 1,
        };
        let few_tiles = busiest(rows_per_task) * grid.cols < 2 * MIN_CHUNK_TILES;
        let streamed = weights >= STREAMED_WEIGHT_BYTES || cut_channels_always();
        if threads == 1 || !few_tiles || !streamed || panels < threads || !nr.is_multiple_of(LANES) {
            return by_rows;
        }
        Split {
            rows_per_task: grid.rows.max(1),
            groups: threads,
            ..by_rows
        }
    }

    fn tasks(&self) -> usize {
        self.batch * self.tile_rows.div_ceil(self.rows_per_task) * self.groups
    }

    /// Task `i`'s image, tile rows and weight panels.
    fn task(&self, i: usize) -> (usize, std::ops::Range<usize>, std::ops::Range<usize>) {
        let (i, g) = (i / self.groups, i % self.groups);
        let per_image = self.tile_rows.div_ceil(self.rows_per_task);
        let (n, first) = (i / per_image, i % per_image * self.rows_per_task);
        let rows = first..(first + self.rows_per_task).min(self.tile_rows);
        let panels = g * self.panels / self.groups..(g + 1) * self.panels / self.groups;
        (n, rows, panels)
    }
}

/// One task's share: tile rows `rows` of image `n`, output channels
/// `chans` (weight panels `panels`).
struct Task {
    n: usize,
    rows: std::ops::Range<usize>,
    panels: std::ops::Range<usize>,
    chans: std::ops::Range<usize>,
}

thread_local! {
    /// A task's transformed input, products and one tile's pixels, kept
    /// between runs.
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// The grid of output tiles of one image.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Grid {
    rows: usize,
    cols: usize,
}

/// One convolution's operands for its tasks, in variant `T`.
struct Run<'a, T, const M: usize, const N: usize> {
    isa: Isa,
    c: &'a Conv<'a>,
    packs: &'a [&'a PackedB],
    grid: Grid,
    tile: std::marker::PhantomData<fn() -> T>,
}

impl<T: Tile<M, N>, const M: usize, const N: usize> Run<'_, T, M, N> {
    /// Task `task`'s tiles and channels into `out`.
    fn tile_rows(&self, task: &Task, out: &Out<'_>, buf: &mut Vec<f32>) -> Result<()> {
        let (ci, cw) = (self.c.in_channels, task.chans.len());
        let tiles = task.rows.len() * self.grid.cols;
        let positions = N * N;
        let chunk = (CHUNK_VALUES / (positions * (ci + cw)))
            .max(MIN_CHUNK_TILES)
            .min(tiles.max(1));
        let need = positions * chunk * (ci + cw) + M * M * cw;
        if buf.len() < need {
            buf.resize(need, 0.0);
        }
        let (v, rest) = buf.split_at_mut(positions * chunk * ci);
        let (m, pixel) = rest.split_at_mut(positions * chunk * cw);
        let first = task.rows.start * self.grid.cols;
        let epi = Epilogue::default();
        for start in (first..first + tiles).step_by(chunk) {
            let t = start..(start + chunk).min(first + tiles);
            let (v, m) = (&mut v[..positions * t.len() * ci], &mut m[..positions * t.len() * cw]);
            self.input(task.n, t.clone(), v);
            for (p, pack) in self.packs.iter().enumerate() {
                let a = &v[p * t.len() * ci..][..t.len() * ci];
                let dst = &mut m[p * t.len() * cw..][..t.len() * cw];
                gemm::gemm_packed_panels(
                    self.isa,
                    t.len(),
                    a,
                    ci,
                    pack,
                    task.panels.clone(),
                    dst,
                    cw,
                    &epi,
                    &Serial,
                )?;
            }
            self.output(task, t, m, out, &mut pixel[..M * M * cw]);
        }
        Ok(())
    }

    /// The input transform of tiles `t` of image `n` into `v`
    /// (`[N·N][t.len()][ci]`).
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

    /// The output transform of tiles `t` from `m` (`[N·N][t.len()][cw]`,
    /// the task's `cw` channels) with the epilogue, into `out`.
    fn output(&self, task: &Task, t: std::ops::Range<usize>, m: &[f32], out: &Out<'_>, pixel: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if self.isa.target() != Target::Generic {
            // SAFETY: as in `input`.
            #[allow(unsafe_code)]
            unsafe {
                return output_avx2(self, task, t, m, out, pixel);
            }
        }
        output_transform(self, task, t, m, out, pixel)
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn input_avx2<T: Tile<M, N>, const M: usize, const N: usize>(
    r: &Run<'_, T, M, N>,
    n: usize,
    t: std::ops::Range<usize>,
    v: &mut [f32],
) {
    input_transform(r, n, t, v)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn output_avx2<T: Tile<M, N>, const M: usize, const N: usize>(
    r: &Run<'_, T, M, N>,
    task: &Task,
    t: std::ops::Range<usize>,
    m: &[f32],
    out: &Out<'_>,
    pixel: &mut [f32],
) {
    output_transform(r, task, t, m, out, pixel)
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

/// `s · x + y`.
#[inline(always)]
fn axpy(s: f32, x: Lanes, mut y: Lanes) -> Lanes {
    for l in 0..LANES {
        y[l] = s.mul_add(x[l], y[l]);
    }
    y
}

#[inline(always)]
fn scale(s: f32, mut x: Lanes) -> Lanes {
    for v in &mut x {
        *v *= s;
    }
    x
}

/// Column `j` of `R` rows of `C` lanes each (a plain loop: see [`add`]).
#[inline(always)]
fn column<const R: usize, const C: usize>(m: &[[Lanes; C]; R], j: usize) -> [Lanes; R] {
    let mut c = [[0.0; LANES]; R];
    for (v, row) in c.iter_mut().zip(m) {
        *v = row[j];
    }
    c
}

#[inline(always)]
fn load(src: &[f32]) -> Lanes {
    let mut v = [0.0; LANES];
    v.copy_from_slice(&src[..LANES]);
    v
}

#[inline(always)]
fn input_transform<T: Tile<M, N>, const M: usize, const N: usize>(
    r: &Run<'_, T, M, N>,
    n: usize,
    t: std::ops::Range<usize>,
    v: &mut [f32],
) {
    let (w, ci) = (r.c.window, r.c.in_channels);
    let (ih, iw) = (w.h.input, w.w.input);
    let x = &r.c.x[n * ih * iw * ci..][..ih * iw * ci];
    let count = t.len();
    for (k, tile) in t.enumerate() {
        let (ty, tx) = (tile / r.grid.cols, tile % r.grid.cols);
        // The patch's input rows and columns, None in the padding.
        let at = |o: usize, pad: usize, len: usize| o.checked_sub(pad).filter(|&i| i < len);
        let ys: [Option<usize>; N] = std::array::from_fn(|i| at(M * ty + i, w.h.pad_begin, ih));
        let xs: [Option<usize>; N] = std::array::from_fn(|j| at(M * tx + j, w.w.pad_begin, iw));
        for c0 in (0..ci).step_by(LANES) {
            let mut d = [[[0.0; LANES]; N]; N];
            for (i, row) in d.iter_mut().enumerate() {
                for (j, vals) in row.iter_mut().enumerate() {
                    if let (Some(y), Some(x0)) = (ys[i], xs[j]) {
                        *vals = load(&x[(y * iw + x0) * ci + c0..]);
                    }
                }
            }
            let mut cols = [[[0.0; LANES]; N]; N];
            for (j, col) in cols.iter_mut().enumerate() {
                *col = T::input_rows(column(&d, j));
            }
            for i in 0..N {
                for (j, vals) in T::input_rows(column(&cols, i)).iter().enumerate() {
                    v[((i * N + j) * count + k) * ci + c0..][..LANES].copy_from_slice(vals);
                }
            }
        }
    }
}

#[inline(always)]
fn output_transform<T: Tile<M, N>, const M: usize, const N: usize>(
    r: &Run<'_, T, M, N>,
    task: &Task,
    t: std::ops::Range<usize>,
    m: &[f32],
    out: &Out<'_>,
    pixels: &mut [f32],
) {
    let (w, cw) = (r.c.window, task.chans.len());
    let (oh, ow) = (w.h.output, w.w.output);
    let count = t.len();
    for (k, tile) in t.enumerate() {
        let (ty, tx) = (tile / r.grid.cols, tile % r.grid.cols);
        // The tile's M×M pixels, `cw` values each, into `pixels`.
        for c0 in (0..cw).step_by(LANES) {
            let g = |p: usize| load(&m[(p * count + k) * cw + c0..]);
            // Aᵀ · M (M × N), column by column, then its rows times A.
            let mut cols = [[[0.0; LANES]; M]; N];
            for (q, col) in cols.iter_mut().enumerate() {
                let mut c = [[0.0; LANES]; N];
                for (i, v) in c.iter_mut().enumerate() {
                    *v = g(i * N + q);
                }
                *col = T::output_rows(c);
            }
            for i in 0..M {
                for (j, vals) in T::output_rows(column(&cols, i)).iter().enumerate() {
                    pixels[(i * M + j) * cw + c0..][..LANES].copy_from_slice(vals);
                }
            }
        }
        // The tile's pixels inside the image: (index in `pixels`, output
        // pixel of the batch).
        let inside = (0..M * M).filter_map(|q| {
            let (oy, ox) = (M * ty + q / M, M * tx + q % M);
            (oy < oh && ox < ow).then(|| (q, (task.n * oh + oy) * ow + ox))
        });
        finish_tile(r, task, pixels, inside, out);
    }
}

/// `out`'s pixels = `after(act(pixel + bias) + residual)` for a tile's
/// `pixels` (M × M × the task's channels; the residual `out`'s own values
/// with `onto`): each activation over the whole tile at once, the residual
/// and the store only for the pixels `inside` the image.
#[inline(always)]
fn finish_tile<T, const M: usize, const N: usize>(
    r: &Run<'_, T, M, N>,
    task: &Task,
    pixels: &mut [f32],
    inside: impl Iterator<Item = (usize, usize)> + Clone,
    out: &Out<'_>,
) {
    let (c, co, chans) = (r.c, r.c.out_channels, task.chans.clone());
    let cw = chans.len();
    if let Some(b) = c.bias {
        for px in pixels.chunks_exact_mut(cw) {
            px.iter_mut().zip(&b[chans.clone()]).for_each(|(v, b)| *v += b);
        }
    }
    activate(c.activation, pixels);
    // The task's run of output pixel `p`: channels `chans`.
    let at = |p: usize| p * out.ldo + chans.start;
    #[allow(unsafe_code)]
    for (q, p) in inside.clone() {
        let px = &mut pixels[q * cw..][..cw];
        if out.onto {
            // SAFETY: the task owns channels `chans` of its tiles' pixels
            // (`Split::task` gives other tasks other tile rows or other
            // panels), and the reference ends with this block.
            let own = unsafe { out.run(at(p), cw) };
            px.iter_mut().zip(own.iter()).for_each(|(v, r)| *v += r);
        } else if let Some(res) = c.residual {
            px.iter_mut()
                .zip(&res[p * co + chans.start..][..cw])
                .for_each(|(v, r)| *v += r);
        }
    }
    activate(c.after, pixels);
    #[allow(unsafe_code)]
    for (q, p) in inside {
        // SAFETY: as above.
        let dst = unsafe { out.run(at(p), cw) };
        dst.copy_from_slice(&pixels[q * cw..][..cw]);
    }
}

/// Whether a test switched on cutting small convolutions by channels too.
fn cut_channels_always() -> bool {
    #[cfg(test)]
    return tests::CUT_CHANNELS.get();
    #[cfg(not(test))]
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    thread_local! {
        /// Set by a test on its thread: `Split::choose` cuts by channels
        /// whatever the weights' size (the tests' weights are small).
        pub static CUT_CHANNELS: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
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
            for m in [2, 4] {
                let wino = pack(target, &wt, co, ci, m).unwrap();
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
                        "{target} F({m}, 3) {threads} threads, value {i}: {g} vs {w} (h {} w {} pad {:?} {ci}->{co})",
                        case.h,
                        case.w,
                        case.pad
                    );
                    }
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
    fn matches_with_the_channels_cut_between_threads() {
        // Few tiles (F(4×4) at 12² and 13²: 9 and 16; F(2×2) at 9×10: 25
        // for two images) and 2+ weight panels: the threads share the
        // output channels (`Split::choose`; as if the weights were large).
        CUT_CHANNELS.set(true);
        check(&case(13, 13, 16, 48));
        check(&Case {
            residual: true,
            ..case(12, 12, 16, 48)
        });
        check(&Case {
            batch: 2,
            residual: true,
            onto: true,
            ..case(9, 10, 8, 64)
        });
        check(&Case {
            ldo_extra: 8,
            act: Activation::Silu,
            ..case(13, 13, 8, 48)
        });
        CUT_CHANNELS.set(false);
    }

    #[test]
    fn tasks_cut_tile_rows_or_few_tiles_by_channels() {
        let grid = |side: usize| Grid { rows: side, cols: side };
        // ResNet-50's 14² × 256 F(4×4) weights: 9 MiB.
        let big = 36 * 256 * 256 * 4;
        let split = |batch, g, panels, weights, threads| {
            let s = Split::choose(batch, g, panels, weights, threads);
            (s.rows_per_task, s.groups, s.tasks())
        };
        // 56² F(4×4): 14 tile rows as 7 + 7.
        assert_eq!(split(1, grid(14), (4, 16), big, 2), (7, 1, 2));
        assert_eq!(split(1, grid(14), (4, 16), big, 1), (14, 1, 1));
        // 14²: 16 tiles, the channels in two; 28²: 7 rows would go 4 + 3.
        assert_eq!(split(1, grid(4), (16, 16), big, 2), (4, 2, 2));
        assert_eq!(split(1, grid(7), (16, 16), big, 2), (7, 2, 2));
        // Not with weights that stay in the caches.
        assert_eq!(split(1, grid(4), (16, 16), big / 4, 2), (2, 1, 2));
        // Eight such images are enough tiles to cut by images.
        assert_eq!(split(8, grid(4), (16, 16), big, 2), (4, 1, 8));
        // Not with fewer panels than threads, nor panels that cut the
        // transforms' vectors.
        assert_eq!(split(1, grid(4), (1, 16), big, 2), (2, 1, 2));
        assert_eq!(split(1, grid(4), (16, 4), big, 2), (2, 1, 2));
        let s = Split::choose(2, grid(3), (5, 16), big, 2);
        let tasks: Vec<_> = (0..s.tasks()).map(|i| s.task(i)).collect();
        assert_eq!(
            tasks,
            [(0, 0..3, 0..2), (0, 0..3, 2..5), (1, 0..3, 0..2), (1, 0..3, 2..5)]
        );
    }

    /// A `side`² input, 3×3 with pads of 1 (the same size out).
    fn square(side: usize) -> Window {
        Window {
            h: axis(side, (1, 1)),
            w: axis(side, (1, 1)),
        }
    }

    #[test]
    fn pays_from_12x12_pixels_or_512_channels() {
        assert!(pays(Target::Avx2, &square(14), 256, 256, 1));
        assert!(!pays(Target::Avx2, &square(7), 256, 256, 1), "7² × 256: not measured");
        assert!(pays(Target::Avx2, &square(7), 512, 512, 1), "ResNet-50's 7² × 512");
        assert!(pays(Target::Avx512, &square(7), 512, 512, 1));
        assert!(pays(Target::Avx512, &square(27), 32, 128, 1));
        assert!(
            !pays(Target::Avx512, &square(56), 128, 32, 1),
            "into 32 channels on AVX-512"
        );
        assert!(pays(Target::Avx2, &square(56), 128, 32, 1));
        assert!(!pays(Target::Generic, &square(14), 256, 256, 1));
        assert!(!pays(Target::Avx2, &square(56), 16, 64, 1), "narrow");
    }

    #[test]
    fn rejects_what_it_cannot_run() {
        let w = square(8);
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
        assert!(pack(Target::Generic, &[0.0; 10], 2, 2, 2).is_err());
        assert!(
            pack(Target::Generic, &values(8 * 8 * 9, 0), 8, 8, 3).is_err(),
            "F(3x3, 3x3)"
        );
        // Weights for other channels fail the convolution's checks, not the kernel.
        let wino = pack(Target::Generic, &values(8 * 8 * 9, 0), 8, 8, 2).unwrap();
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
