//! Direct convolution over channels-last `[N, H, W, C]` input (issue #13):
//! the packed-weight GEMM without im2col.
//!
//! In NHWC, the inputs that one kernel tap `(kh, kw)` reads for a run of
//! consecutive output pixels of one output row are themselves a strided
//! matrix: pixel `i` reads the `Ci` contiguous channels at `base + i·sw·Ci`.
//! So a tile of `MR` pixels × `NR` output channels accumulates, in
//! registers, over every tap and every input channel (`K = taps·Ci/g`),
//! broadcasting A values straight from the input and streaming the packed
//! weight panel (rows in tap, channel order: [`super::conv::pack_groups`]),
//! and is stored once, with the bias. Nothing is copied: im2col wrote every
//! input value `kh·kw` times and the GEMM packed it again.
//!
//! Taps in the padding: a tap whose input row is outside the image is left
//! out of the whole output row's tap list; the output columns with a tap
//! outside the input row (at most `extent / stride` on each side) are
//! im2col'd, the padding as zeros, and those patches of a block of rows go
//! through the same kernel in whole tiles. Tiles are balanced (57 pixels
//! as 12 + 12 + 11 + 11 + 11), so that no short tile runs at a fraction of
//! the kernel's speed. Rows are processed in blocks whose input stays in
//! L2, one weight panel after the other.
//!
//! The bias, a Relu/Clip clamp, HardSigmoid or HardSwish, and the residual
//! are applied in registers at the store; other activations run over each
//! tile right after it.
//!
//! Measured on an AMD EPYC (Zen 4/5 class, AVX-512), one thread, `cargo bench
//! --bench conv_kernels`: 3×3 convolutions at ResNet-50 shapes (56² to 7²)
//! at 94–101% of the GEMM microkernel's in-cache rate and 1×1 at 79–97%
//! (im2col + GEMM: 44–87%).

use std::cell::RefCell;
use std::ops::Range;

use super::activate_isa;
use super::conv::{is_pointwise, Conv, Out};
use super::gemm::{by_rows, prefetch_share, Activation, Blocking, PackedB};
use super::parallel::Parallel;
use super::spatial::{Axis, Window};
use super::Isa;
use crate::error::Result;
use crate::target::Target;

/// One run of `len` consecutive K rows: A at `a` (from the tile's first
/// pixel, in the image), B at `b` (from the panel's start).
#[derive(Clone, Copy, Debug)]
struct Seg {
    a: usize,
    b: usize,
    len: usize,
}

/// Appends `seg`, or lengthens the last segment if `seg` continues it in
/// both A and B (the taps of a kernel row with dilation 1, and a whole
/// patch, are one run: fewer, longer loops).
fn push_seg(segs: &mut Vec<Seg>, seg: Seg, nr: usize) {
    match segs.last_mut() {
        Some(last) if last.a + last.len == seg.a && last.b + last.len * nr == seg.b => last.len += seg.len,
        _ => segs.push(seg),
    }
}

/// What one microkernel call computes: `mr` pixels × `nc <= NR` output
/// channels (in a run of tiles, the first tile; [`TileArgs::nth`] the others).
#[derive(Clone, Copy)]
struct TileArgs<'a> {
    segs: &'a [Seg],
    /// The image and, in it, where the tile's first pixel's offsets start.
    image: &'a [f32],
    a0: usize,
    /// Elements between consecutive pixels' inputs (`stride_w · Ci`).
    pixel_step: usize,
    /// The B panel: `K` rows of `NR`.
    panel: &'a [f32],
    bias: Option<&'a [f32]>,
    /// The activation, when the kernel applies it in registers.
    act: Option<RegAct>,
    /// The residual's rows for the tile (`res_ld` apart), when the
    /// kernel adds it: after the clamp, or with no activation.
    residual: Option<&'a [f32]>,
    /// Values between the residual's rows: C's `ldc` when C holds it
    /// (`onto`), the output channels when it has a buffer of its own
    /// (then C may be a concat's output, its pixels further apart).
    res_ld: usize,
    /// The residual is C's own values, which the store reads before it
    /// overwrites them ([`super::conv::conv_onto`]); `residual` is `None`.
    onto: bool,
    /// The clamp after the residual (ResNet's Relu after the skip
    /// connection), when the kernel adds the residual.
    after: Option<(f32, f32)>,
    /// Weights to prefetch into L2 meanwhile, up to a cache line per K row.
    prefetch: &'a [f32],
}

impl TileArgs<'_> {
    /// Tile `i` of a run of tiles of `mr` pixels: its pixels and residual
    /// rows `i·mr` on; only the first prefetches.
    #[inline(always)]
    fn nth(&self, i: usize, mr: usize) -> Self {
        Self {
            a0: self.a0 + i * mr * self.pixel_step,
            residual: self.residual.map(|r| &r[i * mr * self.res_ld..]),
            prefetch: if i == 0 { self.prefetch } else { &[] },
            ..*self
        }
    }
}

/// Whether the kernel's store can finish the epilogue: no activation but
/// one it applies in registers, and a clamp or nothing after the residual,
/// so the residual may be added in registers too.
fn kernel_finishes(isa: Isa, c: &Conv<'_>) -> bool {
    (c.activation == Activation::None || in_registers(isa, c.activation).is_some())
        && (c.after == Activation::None || clamp_of(c.after).is_some())
}

/// An activation the kernels apply to each vector before they store it,
/// with the same roundings as `gemm::activate` (so every path gives the
/// same bits): cheap ones, of a few instructions and no table or `exp`.
/// Others run over the stored tile.
#[derive(Clone, Copy, Debug, PartialEq)]
enum RegAct {
    /// `min(hi, max(lo, v))`, NaN staying NaN: Relu and Clip.
    Clamp(f32, f32),
    /// `max(0, min(1, alpha·v + beta))`, the product rounded before the sum.
    HardSigmoid(f32, f32),
    /// `v · HardSigmoid(1/6, 1/2)(v)`: MobileNetV3's and PP-LCNet's
    /// activation, until now a pass over each stored tile.
    HardSwish,
    /// `v / (1 + e^-v)` and `1 / (1 + e^-v)`, as the AVX2 unary kernels
    /// compute them (`avx2_math`): YOLO's SiLU after every convolution.
    Silu,
    Sigmoid,
}

/// `act` as the kernels of `isa` apply it in registers, if they do: on
/// both x86 targets (since 2026-11-29 on AVX-512 too: YOLOv8n's SiLU in its
/// store, 16 lanes at a time, took its one-thread time on a Sapphire Rapids
/// class Xeon from 1.10 to 0.96 of ORT's).
fn in_registers(isa: Isa, act: Activation) -> Option<RegAct> {
    let any = matches!(isa.target(), Target::Avx2 | Target::Avx512);
    match act {
        Activation::HardSigmoid(alpha, beta) if any => Some(RegAct::HardSigmoid(alpha, beta)),
        Activation::HardSwish if any => Some(RegAct::HardSwish),
        Activation::Silu if any => Some(RegAct::Silu),
        Activation::Sigmoid if any => Some(RegAct::Sigmoid),
        _ => clamp_of(act).map(|(lo, hi)| RegAct::Clamp(lo, hi)),
    }
}

/// Relu and Clip as the `[lo, hi]` clamp the kernels apply before they
/// store (NaN stays NaN, as in `gemm::activate`).
fn clamp_of(act: Activation) -> Option<(f32, f32)> {
    match act {
        Activation::Relu => Some((0.0, f32::INFINITY)),
        Activation::Clip(lo, hi) => Some((lo, hi)),
        _ => None,
    }
}

/// Whether the direct kernels serve these packed weights on `isa` (the
/// x86 targets; the generic one keeps im2col + GEMM).
pub fn usable(isa: Isa, packed: &[&PackedB]) -> bool {
    matches!(isa.target(), Target::Avx512 | Target::Avx2) && packed.iter().all(|p| p.target() == isa.target())
}

/// Input bytes a block of output rows may read: the block's rows run one
/// weight panel after the other, so a panel is loaded into L2 once per
/// block, not once per row (deep layers at 7×7 or 14×14 have panels of
/// several hundred KiB), while the input rows stay in L2 as well.
const BLOCK_INPUT_BYTES: usize = 384 * 1024;

/// `y = conv(x)` for sizes [`super::conv`] has checked and weights for which
/// [`usable`] holds. Output pixels are `ldo >= out_channels` values apart
/// (more when the convolution writes its channels of a concat's output);
/// a residual's are `out_channels` apart either way.
pub fn conv(isa: Isa, c: &Conv<'_>, packed: &[&PackedB], y: &mut [f32], ldo: usize, par: &dyn Parallel) -> Result<()> {
    assert!(ldo >= c.out_channels);
    run(isa, c, packed, y, (ldo, false), par)
}

/// [`conv`] with `y` holding the residual on entry ([`super::conv::conv_onto`]).
pub fn conv_onto(isa: Isa, c: &Conv<'_>, packed: &[&PackedB], y: &mut [f32], par: &dyn Parallel) -> Result<()> {
    assert!(
        c.residual.is_none(),
        "a residual in its own buffer and in the output at once"
    );
    run(isa, c, packed, y, (c.out_channels, true), par)
}

/// [`conv`] or [`conv_onto`] (`onto`: `y` holds the residual).
fn run(
    isa: Isa,
    c: &Conv<'_>,
    packed: &[&PackedB],
    y: &mut [f32],
    out: (usize, bool),
    par: &dyn Parallel,
) -> Result<()> {
    if is_pointwise(c.window) {
        return pointwise(isa, c, packed, y, out, par);
    }
    rows(isa, c, packed, y, out, par)
}

/// The values from output pixel `start`, `pixels` of them, `ldo` apart:
/// the last pixel's row ends after `co` values.
fn pixel_span(start: usize, pixels: usize, ldo: usize, co: usize) -> Range<usize> {
    start * ldo..(start + pixels - 1) * ldo + co
}

/// Pixels per row of a pointwise convolution seen as a 2-D one: 8 tiles.
const POINTWISE_ROW: usize = 112;

/// The row length for `pixels`: a divisor between 28 and twice
/// [`POINTWISE_ROW`] if there is one (14×14 = 196 as 2 rows of 98), so that
/// one pass streams the weights once; else [`POINTWISE_ROW`] and a rest.
fn pointwise_row(pixels: usize) -> usize {
    (28..=2 * POINTWISE_ROW)
        .rev()
        .find(|&d| pixels.is_multiple_of(d))
        .unwrap_or(POINTWISE_ROW)
}

/// 1×1, stride 1, no padding: every pixel of every image is one long row,
/// cut into rows of [`pointwise_row`] pixels (so small images, 7×7 or
/// 14×14, get whole tiles, and rows to share among threads) and a rest.
fn pointwise(
    isa: Isa,
    c: &Conv<'_>,
    packed: &[&PackedB],
    y: &mut [f32],
    (ldo, onto): (usize, bool),
    par: &dyn Parallel,
) -> Result<()> {
    let pixels = c.batch * c.window.output_pixels();
    let (ci, co) = (c.in_channels, c.out_channels);
    let row = pointwise_row(pixels);
    let (full, rest) = (pixels / row, pixels % row);
    let split = full * row;
    for (rows, start, len) in [(full, 0, row), (1, split, rest)] {
        if rows == 0 || len == 0 {
            continue;
        }
        let line = |n: usize| Axis {
            input: n,
            output: n,
            kernel: 1,
            stride: 1,
            dilation: 1,
            pad_begin: 0,
            pad_end: 0,
        };
        let window = Window {
            h: line(rows),
            w: line(len),
        };
        let part = Conv {
            window: &window,
            batch: 1,
            x: &c.x[start * ci..(start + rows * len) * ci],
            residual: c.residual.map(|r| &r[start * co..(start + rows * len) * co]),
            ..*c
        };
        self::rows(
            isa,
            &part,
            packed,
            &mut y[pixel_span(start, rows * len, ldo, co)],
            (ldo, onto),
            par,
        )?;
    }
    Ok(())
}

/// The general case: tasks of output rows × weight panels.
fn rows(
    isa: Isa,
    c: &Conv<'_>,
    packed: &[&PackedB],
    y: &mut [f32],
    (ldo, onto): (usize, bool),
    par: &dyn Parallel,
) -> Result<()> {
    let w = c.window;
    let row_len = w.w.output * c.out_channels;
    let rows = c.batch * w.h.output;
    let nr = packed.first().map_or(1, |p| p.nr());
    let panels = c.groups * (c.out_channels / c.groups).div_ceil(nr);
    if row_len == 0 || rows == 0 || panels == 0 {
        return Ok(());
    }
    // Input rows one output row reads, in bytes.
    let row_bytes = (w.h.stride.max(w.h.extent()) * w.w.input * c.in_channels * 4).max(1);
    let (row_tasks, panel_tasks) = split(isa, c, packed, (rows, panels), row_bytes, par.threads());
    let block = (BLOCK_INPUT_BYTES / row_bytes).clamp(1, rows.div_ceil(row_tasks));
    let out = Out::new(y, ldo, onto);
    par.for_each(row_tasks * panel_tasks, &|t| {
        let (r, p) = (t / panel_tasks, t % panel_tasks);
        let task_rows = share(rows, row_tasks, r);
        let task_panels = share(panels, panel_tasks, p);
        let run = |scratch: &mut Scratch| {
            for start in task_rows.clone().step_by(block) {
                let block_rows = start..(start + block).min(task_rows.end);
                row_block(isa, c, packed, block_rows, task_panels.clone(), &out, scratch);
            }
        };
        super::with_thread_buffer(&SCRATCH, run);
    });
    Ok(())
}

/// Tasks as (row parts, panel parts) for `threads`: one task for one
/// thread; else about 4 per thread, cut the way that moves the fewest bytes.
/// Every row part streams all its panels' weights, and every panel part
/// reads its rows' input and builds their border patches: a deep layer's
/// weights (9 MiB for 3×3 512→512 at 7×7) are cut by panels, a wide map's
/// input by rows.
fn split(
    isa: Isa,
    c: &Conv<'_>,
    packed: &[&PackedB],
    (rows, panels): (usize, usize),
    row_bytes: usize,
    threads: usize,
) -> (usize, usize) {
    if threads <= 1 {
        return (1, 1);
    }
    let want = 4 * threads;
    let w = c.window;
    // Balanced: 14 rows in 8 tasks as 2 2 2 2 2 2 1 1, not 7 tasks of 2
    // (which two threads share 4 : 3).
    // And at least a tile of pixels per task: a 4×6 map in 4 row tasks ran
    // tiles of 6 (or 4 interior) pixels at a third of the kernel's rate.
    let max_rows = rows.min(want).min((rows * w.w.output).div_ceil(mr_max(isa)).max(1));
    let weights: usize = packed.iter().map(|p| p.data().byte_len()).sum();
    let (lo, hi) = interior_columns(isa, w);
    let patches = rows * (w.w.output - (hi - lo)) * w.taps() * c.in_channels * 4;
    // Building a patch writes and reads it again: counted twice.
    let input = rows * row_bytes + 2 * patches;
    let enough = want.min(max_rows * panels) / 2;
    (1..=max_rows)
        .map(|r| (r, want.div_ceil(r).min(panels)))
        .filter(|&(r, p)| r * p >= enough)
        .min_by_key(|&(r, p)| r * weights + p * input)
        .unwrap_or((max_rows, want.div_ceil(max_rows).min(panels)))
}

/// Part `i` of `n` near-equal parts of `0..len`.
fn share(len: usize, n: usize, i: usize) -> Range<usize> {
    i * len / n..(i + 1) * len / n
}

thread_local! {
    /// The buffers of the convolutions this thread runs, kept between runs
    /// (a deep layer's border patches are a few hundred KiB: allocated per
    /// task, they were mapped and faulted in at every run).
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Per-task buffers, reused from block to block.
#[derive(Default)]
struct Scratch {
    segs: Vec<Seg>,
    /// The border pixels of a block: (row in the block, column).
    border: Vec<(usize, usize)>,
    /// Their im2col patches: per pixel, `taps` runs of `Ci` (zeros in the padding).
    patches: Vec<f32>,
    /// One tile of C for the border pixels, before it is scattered.
    tile: Vec<f32>,
}

/// Output rows `rows` (flat over batch and output rows), weight panels
/// `panels` (flat over groups), one panel at a time.
fn row_block(
    isa: Isa,
    c: &Conv<'_>,
    packed: &[&PackedB],
    rows: Range<usize>,
    panels: Range<usize>,
    out: &Out<'_>,
    s: &mut Scratch,
) {
    let w = c.window;
    let ci = c.in_channels;
    let row_len = w.w.output * out.ldo;
    let (lo, hi) = interior_columns(isa, w);
    let cog = c.out_channels / c.groups;
    let nr = packed.first().map_or(1, |p| p.nr());
    let per_group = cog.div_ceil(nr);
    border_patches(c, rows.clone(), (lo, hi), s);
    // Panel `panel` (flat over groups) as (group, first column, its weights).
    let locate = |panel: usize| {
        let (g, p) = (panel / per_group, panel % per_group);
        (g, p * nr, packed[g].panel(p))
    };
    let mut panel = panels.start;
    while panel < panels.end {
        let (g, j0, _) = locate(panel);
        let pb = packed[g];
        // Two whole panels of one group at once, in tiles of 64 channels.
        let wide = lo < hi
            && panel + 1 < panels.end
            && (panel + 1) / per_group == g
            && cog - j0 >= 2 * nr
            && wide_tiles(isa, c);
        let step = if wide { 2 } else { 1 };
        // The next panels, fetched into L2 a share per row while these
        // are computed: a deep layer's weights (9 MiB for 3×3 512→512)
        // stream from memory once per run, and the first row of each
        // panel waited for them (147 GFLOP/s at 7×7, against 250 warm).
        let next = if panel + step < panels.end {
            let (g2, p2) = ((panel + step) / per_group, (panel + step) % per_group);
            let count = step.min(per_group - p2).min(panels.end - panel - step);
            packed[g2].panels(p2, count)
        } else {
            &[][..]
        };
        for (r, row) in rows.clone().enumerate() {
            let (n, oh) = (row / w.h.output, row % w.h.output);
            let image = &c.x[n * w.input_pixels() * ci..][..w.input_pixels() * ci];
            let prefetch = prefetch_share(next, r, rows.len());
            if lo < hi {
                row_taps(c, g, nr, oh, lo, &mut s.segs);
                tiles(
                    isa,
                    c,
                    (g, pb, j0, step),
                    image,
                    &s.segs,
                    lo..hi,
                    out,
                    row * row_len,
                    prefetch,
                );
            }
        }
        for (i, j0) in (j0..).step_by(nr).take(step).enumerate() {
            // Without an interior (small maps), the border tiles fetch it.
            let next = if lo < hi || i > 0 { &[][..] } else { next };
            border_tiles(isa, c, (g, pb, j0), rows.start, s, out, next);
        }
        panel += step;
    }
}

/// Whether [`tiles`] may run tiles of two panels (64 channels) at once: on
/// AVX-512, when the kernel's store finishes the epilogue. Each broadcast
/// input then feeds four FMAs, not two, and a tile's 6 row pointers stay
/// in registers (the 14-row tile reloads some from the stack every K row).
/// Measured on a Sapphire Rapids class Xeon, one thread, in-process against
/// the CPU EP: chains of 1×1 64↔256 at 56² 1.34 → 1.19 of ORT's time, of
/// 3×3 64→64 at 56² 1.25 → 1.12; ResNet-50 and YOLOv8n within noise.
fn wide_tiles(isa: Isa, c: &Conv<'_>) -> bool {
    isa.target() == Target::Avx512 && kernel_finishes(isa, c)
}

/// Pixels per tile of two panels.
const WIDE_MR: usize = 6;

/// Finishes `tile`, rows of `nc` values one after the other as the kernel
/// stored them (bias and an activation of [`in_registers`] applied), and
/// writes row `i` to `out` at flat index `at(i)`, which the residual
/// shares: the other activation, the residual (read from `out` itself when
/// it holds it), the activation after it. Each pass runs over the whole
/// tile: row by row, a row of 16 values fell to the activation loop's
/// 4-lane remainder (HardSwish after each convolution took 12% of
/// PP-LCNet's time on a Zen 3).
fn finish(isa: Isa, c: &Conv<'_>, tile: &mut [f32], nc: usize, out: &Out<'_>, at: impl Fn(usize) -> usize) {
    if c.activation != Activation::None && in_registers(isa, c.activation).is_none() {
        activate_isa(isa, c.activation, tile);
    }
    if out.onto || c.residual.is_some() {
        for (i, row) in tile.chunks_exact_mut(nc).enumerate() {
            // SAFETY: this task's row and panel; the run is dropped at once.
            #[allow(unsafe_code)]
            let res: &[f32] = match c.residual {
                Some(r) => &r[out.res_at(at(i), c.out_channels)..][..nc],
                None => unsafe { out.run(at(i), nc) },
            };
            row.iter_mut().zip(res).for_each(|(v, &r)| *v += r);
        }
    }
    if c.after != Activation::None {
        activate_isa(isa, c.after, tile);
    }
    for (i, row) in tile.chunks_exact(nc).enumerate() {
        // SAFETY: as above.
        #[allow(unsafe_code)]
        copy_run(unsafe { out.run(at(i), nc) }, row);
    }
}

/// Group `g`'s segments for interior column `ow0` of output row `oh`: every
/// kernel row inside the image, every kernel column.
fn row_taps(c: &Conv<'_>, g: usize, nr: usize, oh: usize, ow0: usize, segs: &mut Vec<Seg>) {
    let (w, ci, cig) = (c.window, c.in_channels, c.in_channels / c.groups);
    segs.clear();
    // Interior: the first tap's column is inside the row.
    let iw0 = ow0 * w.w.stride - w.w.pad_begin;
    for kh in 0..w.h.kernel {
        let Some(ih) = w.h.source(oh, kh) else { continue };
        for kw in 0..w.w.kernel {
            let iw = iw0 + kw * w.w.dilation;
            let seg = Seg {
                a: (ih * w.w.input + iw) * ci + g * cig,
                b: (kh * w.w.kernel + kw) * cig * nr,
                len: cig,
            };
            push_seg(segs, seg, nr);
        }
    }
}

/// The block's border pixels (a tap outside the input row) and their
/// im2col patches, so that they too go through the kernel in whole tiles
/// (one pixel at a time, the kernel does 2 FMAs per broadcast, a quarter of
/// its speed), with the padding read as zeros.
fn border_patches(c: &Conv<'_>, rows: Range<usize>, (lo, hi): (usize, usize), s: &mut Scratch) {
    let (w, ci) = (c.window, c.in_channels);
    s.border.clear();
    for r in 0..rows.len() {
        for ow in (0..lo).chain(hi.max(lo)..w.w.output) {
            s.border.push((r, ow));
        }
    }
    let patch = w.taps() * ci;
    s.patches.clear();
    s.patches.resize(s.border.len() * patch, 0.0);
    for (&(r, ow), dst) in s.border.iter().zip(s.patches.chunks_exact_mut(patch.max(1))) {
        let row = rows.start + r;
        let (n, oh) = (row / w.h.output, row % w.h.output);
        let image = &c.x[n * w.input_pixels() * ci..][..w.input_pixels() * ci];
        for kh in 0..w.h.kernel {
            let Some(ih) = w.h.source(oh, kh) else { continue };
            for kw in 0..w.w.kernel {
                let Some(iw) = w.w.source(ow, kw) else { continue };
                let t = kh * w.w.kernel + kw;
                dst[t * ci..][..ci].copy_from_slice(&image[(ih * w.w.input + iw) * ci..][..ci]);
            }
        }
    }
}

/// Group `g`'s panel from `j0` for the border pixels: tiles of their
/// patches into `s.tile`, scattered to their places in `out`; `next` (the
/// next panel, when no interior tile fetches it) into L2, a share per tile.
fn border_tiles(
    isa: Isa,
    c: &Conv<'_>,
    (g, pb, j0): (usize, &PackedB, usize),
    first_row: usize,
    s: &mut Scratch,
    out: &Out<'_>,
    next: &[f32],
) {
    if s.border.is_empty() {
        return;
    }
    let (w, ci, cig, cog) = (
        c.window,
        c.in_channels,
        c.in_channels / c.groups,
        c.out_channels / c.groups,
    );
    let nr = pb.nr();
    let patch = w.taps() * ci;
    s.segs.clear();
    for t in 0..w.taps() {
        let seg = Seg {
            a: t * ci + g * cig,
            b: t * cig * nr,
            len: cig,
        };
        push_seg(&mut s.segs, seg, nr);
    }
    let (nc, col0) = (nr.min(cog - j0), g * cog + j0);
    let panel = pb.panel(j0 / nr);
    s.tile.resize(mr_max(isa) * nc, 0.0);
    let row_len = w.w.output * out.ldo;
    let act = in_registers(isa, c.activation);
    let mut at = 0;
    let tiles = s.border.len().div_ceil(mr_max(isa));
    for (i, mr) in balanced(s.border.len(), mr_max(isa)).enumerate() {
        let t = TileArgs {
            segs: &s.segs,
            image: &s.patches,
            a0: at * patch,
            pixel_step: patch,
            panel,
            bias: c.bias.map(|b| &b[col0..col0 + nc]),
            act,
            residual: None,
            res_ld: nc,
            onto: false,
            after: None,
            prefetch: prefetch_share(next, i, tiles),
        };
        // Rows of nc values one after the other, as `finish` takes them.
        tile(isa, (mr, 1), nc, &t, &Out::new(&mut s.tile, nc, false), 0, nc);
        let pixels = &s.border[at..at + mr];
        let pos = |i: usize| (first_row + pixels[i].0) * row_len + pixels[i].1 * out.ldo + col0;
        finish(isa, c, &mut s.tile[..mr * nc], nc, out, pos);
        at += mr;
    }
}

/// Sizes of tiles of at most `max` covering `len`, as even as possible
/// (57 as 12, 12, 11, 11, 11, not 14, 14, 14, 14, 1).
fn balanced(len: usize, max: usize) -> impl Iterator<Item = usize> {
    balanced_runs(len, max)
        .into_iter()
        .flat_map(|(mr, n)| std::iter::repeat_n(mr, n))
}

/// Pixels per tile: the target's GEMM tile height (14 on AVX-512, 6 on AVX2).
/// The output columns a row runs in place: the interior, unless it fills
/// less than half a tile (the deep layers of small maps: a 7×7 map leaves
/// 5 interior pixels per row), when every pixel is im2col'd with the
/// border ones and the block's pixels run in whole tiles across its rows.
fn interior_columns(isa: Isa, w: &Window) -> (usize, usize) {
    let (lo, hi) = w.w.interior_outputs();
    if 2 * (hi - lo) < mr_max(isa) {
        (0, 0)
    } else {
        (lo, hi)
    }
}

/// The least K from which an AVX2 1×1 tile prefetches the next tile's inputs.
const PREFETCH_A_MIN_K: usize = 64;

fn mr_max(isa: Isa) -> usize {
    Blocking::of(isa.target()).mr
}

/// Columns `cols` of one output row (`out`), group `g`, the panel of
/// output channels from `j0`: tiles of at most `MR` pixels × `NR` channels.
/// `segs` are the taps of the first column; the others are `pixel_step`
/// further each.
#[allow(clippy::too_many_arguments)]
fn tiles(
    isa: Isa,
    c: &Conv<'_>,
    (g, pb, j0, width): (usize, &PackedB, usize, usize),
    image: &[f32],
    segs: &[Seg],
    cols: Range<usize>,
    out: &Out<'_>,
    row_at: usize,
    prefetch: &[f32],
) {
    let cog = c.out_channels / c.groups;
    let nr = pb.nr();
    let (nc, col0) = ((width * nr).min(cog - j0), g * cog + j0);
    let panel = pb.panels(j0 / nr, width);
    let pixel_step = c.window.w.stride * c.in_channels;
    let res_ld = out.res_ld(c.out_channels);
    let finishes = kernel_finishes(isa, c);
    let mr_max = if width == 2 { WIDE_MR } else { mr_max(isa) };
    let act = in_registers(isa, c.activation);
    // Where the kernel stores a tile that [`finish`] then completes, when
    // its store cannot: rows of `nc` values.
    let mut buf = (!finishes).then_some([0f32; TILE_MAX]);
    let mut ow = cols.start;
    // When the kernel finishes its tiles, each run of equal tiles is one
    // call (a 1×1 layer with K = 64 spent 15-20% of its time between
    // tiles); else one tile at a time, each followed by its epilogue.
    let runs = balanced_runs(cols.len(), mr_max);
    let runs = runs.iter().filter(|&&(_, n)| n > 0).flat_map(|&(mr, n)| {
        let calls = if finishes { 1 } else { n };
        std::iter::repeat_n((mr, n / calls), calls)
    });
    for (i, (mr, count)) in runs.enumerate() {
        let at = row_at + ow * out.ldo + col0;
        let pixels = mr * count;
        let t = TileArgs {
            segs,
            image,
            a0: (ow - cols.start) * pixel_step,
            pixel_step,
            panel,
            bias: c.bias.map(|b| &b[col0..col0 + nc]),
            act,
            residual: c.residual.filter(|_| finishes).map(|r| {
                let from = out.res_at(at, c.out_channels);
                &r[from..from + (pixels - 1) * res_ld + nc]
            }),
            res_ld,
            onto: out.onto && finishes,
            after: clamp_of(c.after).filter(|_| finishes),
            prefetch: if i == 0 { prefetch } else { &[] },
        };
        match buf.as_mut() {
            // One tile (`count` is 1 without `finishes`).
            Some(buf) => {
                tile(isa, (mr, 1), nc, &t, &Out::new(buf, nc, false), 0, nc);
                finish(isa, c, &mut buf[..mr * nc], nc, out, |i| at + i * out.ldo);
            }
            None if nc > nr => tile_wide(isa, (mr, count), &t, out, at, out.ldo),
            None => tile(isa, (mr, count), nc, &t, out, at, out.ldo),
        }
        ow += pixels;
    }
}

/// [`balanced`]'s tiles as (size, how many) runs, the larger tiles first;
/// a run may be empty.
fn balanced_runs(len: usize, max: usize) -> [(usize, usize); 2] {
    let tiles = len.div_ceil(max);
    let (small, large) = len.checked_div(tiles).map_or((0, 0), |small| (small, len % tiles));
    [(small + 1, large), (small, tiles - large)]
}

/// Most values of one tile: 14 pixels x 32 channels (AVX-512).
const TILE_MAX: usize = 14 * 32;

/// `dst.copy_from_slice(src)` in 8-value steps of fixed size, which compile
/// to vector moves: a tile row is 16 or 32 values, too short to pay for a
/// call to `memcpy`.
#[inline(always)]
fn copy_run(dst: &mut [f32], src: &[f32]) {
    let mut d = dst.chunks_exact_mut(8);
    let mut s = src.chunks_exact(8);
    for (d, s) in (&mut d).zip(&mut s) {
        let s: &[f32; 8] = s.try_into().expect("8 values");
        d.copy_from_slice(s);
    }
    for (d, s) in d.into_remainder().iter_mut().zip(s.remainder()) {
        *d = *s;
    }
}

/// Checks every offset the microkernel will touch, then runs it on `count`
/// consecutive tiles of `mr` pixels (the next tile's first pixel is `mr`
/// pixels on): C rows `at + i·ldc`, `i < mr·count`, `nc` values each, of
/// `out` (the calling task's).
#[allow(unsafe_code)] // calls the target_feature microkernels, see SAFETY below
fn tile(isa: Isa, (mr, count): (usize, usize), nc: usize, t: &TileArgs<'_>, out: &Out<'_>, at: usize, ldc: usize) {
    let nr = Blocking::of(isa.target()).nr;
    check_tiles(t, (mr, count), mr_max(isa), (nc, nr, 1), out, at, ldc);
    #[cfg(target_arch = "x86_64")]
    match isa.target() {
        // SAFETY: the Isa token proves the CPU has AVX-512F and FMA; the
        // assert above proves every A offset (segment + pixel + channel),
        // every B row and every C element the kernel touches is in bounds;
        // those C elements are the calling task's (the caller's contract)
        // and no reference to them is alive.
        Target::Avx512 => unsafe { by_rows!(mr, x86::avx512_tiles, (t, count, nc, ldc, out.ptr.add(at))) },
        // SAFETY: likewise, AVX2 and FMA.
        Target::Avx2 => unsafe { by_rows!(mr, x86::avx2_tiles, (t, count, nc, ldc, out.ptr.add(at))) },
        Target::Generic => unreachable!("direct convolution on the generic target"),
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("direct convolution without x86 kernels")
}

/// Panics unless every A offset, every B row (of each of the `panels`
/// panels of `nr` columns, one after the other in `t.panel`) and every C
/// element that `count` tiles of `mr <= max_mr` pixels × `nc` columns touch
/// is in bounds; two panels are always whole (the wide kernel stores all 64).
fn check_tiles(
    t: &TileArgs<'_>,
    (mr, count): (usize, usize),
    max_mr: usize,
    (nc, nr, panels): (usize, usize, usize),
    out: &Out<'_>,
    at: usize,
    ldc: usize,
) {
    let pixels = mr * count;
    let a_end = t.segs.iter().map(|s| s.a + s.len).max().unwrap_or(0) + t.a0 + (pixels - 1) * t.pixel_step;
    let b_end = t.segs.iter().map(|s| s.b + s.len * nr).max().unwrap_or(0);
    let panel_len = t.panel.len() / panels;
    let cols = if panels == 1 {
        (1..=nr).contains(&nc)
    } else {
        nc == panels * nr
    };
    assert!(
        (1..=max_mr).contains(&mr)
            && count >= 1
            && cols
            && t.panel.len() == panels * panel_len
            && a_end <= t.image.len()
            && b_end <= panel_len
            && at + (pixels - 1) * ldc + nc <= out.len
            && t.bias.is_none_or(|b| b.len() == nc)
            && t.residual
                .is_none_or(|r| r.len() == (pixels - 1) * t.res_ld + nc && !t.onto)
            && (!t.onto || t.res_ld == ldc),
        "direct convolution tiles out of bounds: {count} x {mr} x {nc}"
    );
}

/// [`tile`] for tiles of two panels (64 channels; `t.panel` holds both),
/// on AVX-512: `count` tiles of `mr <= WIDE_MR` pixels.
#[allow(unsafe_code)] // calls the target_feature microkernel, see SAFETY below
fn tile_wide(isa: Isa, (mr, count): (usize, usize), t: &TileArgs<'_>, out: &Out<'_>, at: usize, ldc: usize) {
    const NC: usize = 64;
    assert_eq!(isa.target(), Target::Avx512, "tiles of two panels on {}", isa.target());
    check_tiles(t, (mr, count), WIDE_MR, (NC, 32, 2), out, at, ldc);
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the Isa token proves the CPU has AVX-512F and FMA (asserted
    // to be that target above); `check_tiles` proved every A offset, every
    // row of both panels and every C element the kernel touches is in
    // bounds; those C elements are the calling task's and no reference to
    // them is alive.
    unsafe {
        let c = out.ptr.add(at);
        match mr {
            1 => x86::avx512_wide_tiles::<1>(t, count, NC, ldc, c),
            2 => x86::avx512_wide_tiles::<2>(t, count, NC, ldc, c),
            3 => x86::avx512_wide_tiles::<3>(t, count, NC, ldc, c),
            4 => x86::avx512_wide_tiles::<4>(t, count, NC, ldc, c),
            5 => x86::avx512_wide_tiles::<5>(t, count, NC, ldc, c),
            _ => x86::avx512_wide_tiles::<6>(t, count, NC, ldc, c),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    unreachable!("direct convolution without x86 kernels")
}

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)] // SIMD intrinsics on raw pointers, bounds checked by `tile`
mod x86 {
    use std::arch::x86_64::*;

    use crate::kernels::gemm::RowBases;
    use crate::kernels::{avx2, avx2_math};

    use super::{RegAct, TileArgs, PREFETCH_A_MIN_K};

    /// Where a tile's residual rows start (`t.res_ld` apart): its own
    /// buffer, or C itself with [`TileArgs::onto`].
    #[inline(always)]
    fn residual_rows(t: &TileArgs<'_>, c: *mut f32) -> Option<*const f32> {
        match t.residual {
            Some(r) => Some(r.as_ptr()),
            None if t.onto => Some(c as *const f32),
            None => None,
        }
    }

    fn mask16(n: usize) -> __mmask16 {
        if n >= 16 {
            0xffff
        } else {
            ((1u32 << n) - 1) as __mmask16
        }
    }

    /// `$name::<MR>`: `count` tiles of `MR` pixels in one call, each by
    /// `$kernel`, the next `MR` pixels on each time.
    macro_rules! run_of_tiles {
        ($name:ident, $features:literal, $kernel:ident) => {
            /// `count` tiles of `MR` pixels in one call, the next `MR`
            /// pixels on each time.
            ///
            /// # Safety
            /// As the kernel's, for `MR·count` pixels (which `tile` checked).
            #[target_feature(enable = $features)]
            pub(super) unsafe fn $name<const MR: usize>(
                t: &TileArgs<'_>,
                count: usize,
                nc: usize,
                ldc: usize,
                c: *mut f32,
            ) {
                for i in 0..count {
                    // SAFETY: tile i of the run the caller checked.
                    unsafe { $kernel::<MR>(&t.nth(i, MR), nc, ldc, c.add(i * MR * ldc)) }
                }
            }
        };
    }
    run_of_tiles!(avx512_tiles, "avx512f,avx512bw,avx512vl,fma", avx512);
    run_of_tiles!(avx512_wide_tiles, "avx512f,avx512bw,avx512vl,fma", avx512_wide);
    run_of_tiles!(avx2_tiles, "avx2,fma", avx2);

    /// # Safety
    /// AVX-512F and FMA available; `tile` checked every A and B offset for
    /// `MR` pixels and `nc` columns; `c.add(i * ldc + j)`, `i < MR`, `j <
    /// nc`, is the caller's to write and nothing else refers to it.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
    unsafe fn avx512<const MR: usize>(t: &TileArgs<'_>, nc: usize, ldc: usize, c: *mut f32) {
        // SAFETY: `tile` checked every offset either loop reads.
        let acc = unsafe { accumulate_avx512::<MR>(t, nc <= 16) };
        // SAFETY: the caller's contract.
        unsafe { store_tile_avx512::<MR>(t, acc, nc, ldc, c) }
    }

    /// A tile of 64 channels from two panels (`t.panel` holds both):
    /// each broadcast input feeds four FMAs, not two, and 6 pixels keep
    /// their row pointers in registers (14 did not).
    ///
    /// # Safety
    /// AVX-512F and FMA available; `tile_wide` checked every A offset and
    /// both panels' rows for `MR` pixels; `c.add(i * ldc + j)`, `i < MR`,
    /// `j < 64`, is the caller's to write and nothing else refers to it.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
    unsafe fn avx512_wide<const MR: usize>(t: &TileArgs<'_>, _nc: usize, ldc: usize, c: *mut f32) {
        if let Some(r) = residual_rows(t, c) {
            // The next tile's residual (and output) rows, four lines each,
            // as the AVX2 tile does: in-process on a Sapphire Rapids class
            // Xeon, ResNet-50's 1×1 64→256 expansions at 56² with their
            // residual 10% faster (2.60 → 2.33 ms summed), the
            // other layers unchanged. The 32-channel tile gained nothing.
            for i in MR..2 * MR {
                for line in 0..4 {
                    // Hints only: prefetching never faults, even past the rows.
                    _mm_prefetch::<_MM_HINT_T0>(r.wrapping_add(i * t.res_ld + 16 * line) as *const i8);
                    if !t.onto {
                        _mm_prefetch::<_MM_HINT_T0>(c.wrapping_add(i * ldc + 16 * line) as *const i8);
                    }
                }
            }
        }
        // SAFETY: `tile_wide` checked every offset the loop reads.
        let acc = unsafe { accumulate_wide::<MR>(t) };
        let first: [[__m512; 2]; MR] = std::array::from_fn(|i| [acc[i][0], acc[i][1]]);
        let second: [[__m512; 2]; MR] = std::array::from_fn(|i| [acc[i][2], acc[i][3]]);
        let t1 = TileArgs {
            bias: t.bias.map(|b| &b[..32]),
            ..*t
        };
        let t2 = TileArgs {
            bias: t.bias.map(|b| &b[32..]),
            residual: t.residual.map(|r| &r[32..]),
            ..*t
        };
        // SAFETY: the caller's contract: columns 0..32 and 32..64 of each row.
        unsafe {
            store_tile_avx512::<MR>(&t1, first, 32, ldc, c);
            store_tile_avx512::<MR>(&t2, second, 32, ldc, c.add(32));
        }
    }

    /// The K loop of [`avx512_wide`].
    ///
    /// # Safety
    /// As [`avx512_wide`]'s.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
    unsafe fn accumulate_wide<const MR: usize>(t: &TileArgs<'_>) -> [[__m512; 4]; MR] {
        let mut acc = [[_mm512_setzero_ps(); 4]; MR];
        let (img, panel) = (t.image.as_ptr(), t.panel.as_ptr());
        // The second panel's rows, K rows of 32 after the first's.
        let second = t.panel.len() / 2;
        // The next panel's share, paced as in `accumulate_avx512` (written
        // out in each loop: as a struct with a step method, the same logic
        // cost both kernels 20-30%, kernel alone, in cache).
        let (pf, lines, mut line) = (t.prefetch.as_ptr(), t.prefetch.len().div_ceil(16), 0);
        let every = (t.segs.iter().map(|s| s.len).sum::<usize>() / lines.max(1)).max(1);
        let mut tick = 0;
        for s in t.segs {
            // SAFETY: in bounds, see `tile_wide`.
            unsafe {
                let a = img.add(t.a0 + s.a);
                let b = panel.add(s.b);
                let b2 = panel.add(second + s.b);
                for k in 0..s.len {
                    tick += 1;
                    if tick == every && line < lines {
                        // A hint only: prefetching never faults.
                        _mm_prefetch::<_MM_HINT_T1>(pf.wrapping_add(16 * line) as *const i8);
                        line += 1;
                        tick = 0;
                    }
                    let w = [
                        _mm512_loadu_ps(b.add(32 * k)),
                        _mm512_loadu_ps(b.add(32 * k + 16)),
                        _mm512_loadu_ps(b2.add(32 * k)),
                        _mm512_loadu_ps(b2.add(32 * k + 16)),
                    ];
                    for (i, acc) in acc.iter_mut().enumerate() {
                        let ai = _mm512_set1_ps(*a.add(i * t.pixel_step + k));
                        for v in 0..4 {
                            acc[v] = _mm512_fmadd_ps(ai, w[v], acc[v]);
                        }
                    }
                }
            }
        }
        acc
    }

    /// The store of a tile of `nc <= 32` channels, by the epilogue it needs.
    /// The AVX2 kernel writes the same dispatch out in its own body: routed
    /// through a shared `#[inline(always)]` helper (a macro for both, tried
    /// 2026-11-29), `store_any_avx2` was inlined into the AVX2 tiles despite
    /// its `#[inline(never)]`, which is what once made PP-LCNet 2x slower.
    ///
    /// # Safety
    /// As [`avx512`]'s.
    #[inline(always)]
    unsafe fn store_tile_avx512<const MR: usize>(
        t: &TileArgs<'_>,
        acc: [[__m512; 2]; MR],
        nc: usize,
        ldc: usize,
        c: *mut f32,
    ) {
        // SAFETY: the caller's contract.
        unsafe {
            match (t.act, t.after.is_some()) {
                (None | Some(RegAct::Clamp(..)), false) => store_avx512::<MR, false, false>(t, acc, nc, ldc, c),
                (None | Some(RegAct::Clamp(..)), true) => store_avx512::<MR, false, true>(t, acc, nc, ldc, c),
                _ => store_any_avx512::<MR>(t, acc, nc, ldc, c),
            }
        }
    }

    /// [`store_avx512`] for the activations other than clamps, out of line
    /// (as [`store_any_avx2`], whose constants inline changed the K loop).
    ///
    /// # Safety
    /// As [`avx512`]'s.
    #[inline(never)]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
    unsafe fn store_any_avx512<const MR: usize>(
        t: &TileArgs<'_>,
        acc: [[__m512; 2]; MR],
        nc: usize,
        ldc: usize,
        c: *mut f32,
    ) {
        // SAFETY: the caller's contract.
        unsafe {
            match t.after {
                None => store_avx512::<MR, true, false>(t, acc, nc, ldc, c),
                Some(_) => store_avx512::<MR, true, true>(t, acc, nc, ldc, c),
            }
        }
    }

    /// `min(hi, max(lo, v))`, NaN staying NaN (max/min return their second
    /// operand, v, when either is NaN).
    ///
    /// # Safety
    /// AVX-512F available.
    #[inline(always)]
    unsafe fn clamp16(v: __m512, lo: f32, hi: f32) -> __m512 {
        // SAFETY: the caller's CPU; register operations only.
        unsafe { _mm512_min_ps(_mm512_set1_ps(hi), _mm512_max_ps(_mm512_set1_ps(lo), v)) }
    }

    /// `act` on `v` (`ANY`: any of `RegAct`, else a clamp or nothing).
    ///
    /// # Safety
    /// AVX-512F, AVX2 and FMA available.
    #[inline(always)]
    unsafe fn act16<const ANY: bool>(v: __m512, act: Option<RegAct>) -> __m512 {
        // SAFETY: the caller's CPU; register operations only.
        unsafe {
            let hard_sigmoid = |alpha: f32, beta: f32| {
                let y = _mm512_add_ps(_mm512_mul_ps(_mm512_set1_ps(alpha), v), _mm512_set1_ps(beta));
                clamp16(y, 0.0, 1.0)
            };
            match act {
                None => v,
                Some(RegAct::Clamp(lo, hi)) => clamp16(v, lo, hi),
                _ if !ANY => v,
                Some(RegAct::HardSigmoid(alpha, beta)) => hard_sigmoid(alpha, beta),
                Some(RegAct::HardSwish) => _mm512_mul_ps(v, hard_sigmoid(1.0 / 6.0, 0.5)),
                Some(RegAct::Silu) => avx2_math::silu_store(v),
                Some(RegAct::Sigmoid) => avx2_math::sigmoid_store(v),
            }
        }
    }

    /// The tile's epilogue and store, as [`store_avx2`]'s: bias, the
    /// activation (`ANY`: any of `RegAct`, else a clamp or nothing), the
    /// residual, the clamp after it (`AFTER`).
    ///
    /// # Safety
    /// As [`avx512`]'s.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
    unsafe fn store_avx512<const MR: usize, const ANY: bool, const AFTER: bool>(
        t: &TileArgs<'_>,
        acc: [[__m512; 2]; MR],
        nc: usize,
        ldc: usize,
        c: *mut f32,
    ) {
        let (m0, m1) = (mask16(nc), mask16(nc.saturating_sub(16)));
        // SAFETY: masked loads and stores touch the first nc values of the
        // bias and of each of the MR rows of C (see `tile`).
        unsafe {
            let (bias0, bias1) = match t.bias {
                Some(b) => (
                    _mm512_maskz_loadu_ps(m0, b.as_ptr()),
                    _mm512_maskz_loadu_ps(m1, b.as_ptr().add(16.min(nc))),
                ),
                None => (_mm512_setzero_ps(), _mm512_setzero_ps()),
            };
            // The residual's tile rows (`tile` checked their length),
            // or C's own, each read before the store that overwrites it.
            let res = residual_rows(t, c);
            let plus = |v: __m512, at: usize, m: __mmask16| match res {
                Some(r) => _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, r.add(at))),
                None => v,
            };
            let (after_lo, after_hi) = t.after.unwrap_or((f32::NEG_INFINITY, f32::INFINITY));
            let last = |v: __m512| if AFTER { clamp16(v, after_lo, after_hi) } else { v };
            let fix = |v: __m512| act16::<ANY>(v, t.act);
            for (i, acc) in acc.iter().enumerate() {
                let row = c.add(i * ldc);
                _mm512_mask_storeu_ps(row, m0, last(plus(fix(_mm512_add_ps(acc[0], bias0)), i * t.res_ld, m0)));
                if m1 != 0 {
                    let v1 = last(plus(fix(_mm512_add_ps(acc[1], bias1)), i * t.res_ld + 16, m1));
                    _mm512_mask_storeu_ps(row.add(16), m1, v1);
                }
            }
        }
    }

    /// The K loop of [`avx512`]: every segment into the accumulators, all
    /// 32 columns of each B row, or the first 16 (`half`). One K row per
    /// iteration: unrolled four times, as the AVX2 loop is, the 14-row
    /// tile's pointers spilled (3×3 64→64 at 56² 1.3x slower).
    ///
    /// # Safety
    /// As [`avx512`]'s.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
    unsafe fn accumulate_avx512<const MR: usize>(t: &TileArgs<'_>, half: bool) -> [[__m512; 2]; MR] {
        let mut acc = [[_mm512_setzero_ps(); 2]; MR];
        let (img, panel) = (t.image.as_ptr(), t.panel.as_ptr());
        // One line of the prefetch every `every` K rows, spread over the tile
        // so that the requests do not queue up at its start.
        let (pf, lines, mut line) = (t.prefetch.as_ptr(), t.prefetch.len().div_ceil(16), 0);
        let every = (t.segs.iter().map(|s| s.len).sum::<usize>() / lines.max(1)).max(1);
        let mut tick = 0;
        for s in t.segs {
            // SAFETY: in bounds, see `tile`: a_end covers a + i * step + k
            // for i < MR, k < len; b_end covers b + 32 k + 32.
            unsafe {
                let a = img.add(t.a0 + s.a);
                let b = panel.add(s.b);
                if half {
                    for k in 0..s.len {
                        let b0 = _mm512_loadu_ps(b.add(32 * k));
                        for (i, acc) in acc.iter_mut().enumerate() {
                            let ai = _mm512_set1_ps(*a.add(i * t.pixel_step + k));
                            acc[0] = _mm512_fmadd_ps(ai, b0, acc[0]);
                        }
                    }
                } else {
                    // The pixels' rows through `RowBases`: with a register
                    // per row offset the 14-row tile spilled them (a chain
                    // of 3×3 128 → 32 at 28², DenseNet's, 310 → 262-271 µs
                    // per layer on an Intel Xeon, family 6 model 167).
                    let mut rows = RowBases::<MR>::new(a, t.pixel_step);
                    for k in 0..s.len {
                        tick += 1;
                        if tick == every && line < lines {
                            // A hint only: prefetching never faults.
                            _mm_prefetch::<_MM_HINT_T1>(pf.wrapping_add(16 * line) as *const i8);
                            line += 1;
                            tick = 0;
                        }
                        let b0 = _mm512_loadu_ps(b.add(32 * k));
                        let b1 = _mm512_loadu_ps(b.add(32 * k + 16));
                        for (i, acc) in acc.iter_mut().enumerate() {
                            let ai = _mm512_set1_ps(rows.get(i, 0));
                            acc[0] = _mm512_fmadd_ps(ai, b0, acc[0]);
                            acc[1] = _mm512_fmadd_ps(ai, b1, acc[1]);
                        }
                        rows.advance(1);
                    }
                }
            }
        }
        acc
    }

    /// # Safety
    /// AVX2 and FMA available; `tile` checked every A and B offset for
    /// `MR` pixels and `nc <= 16` columns; `c.add(i * ldc + j)`, `i < MR`,
    /// `j < nc`, is the caller's to write and nothing else refers to it.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn avx2<const MR: usize>(t: &TileArgs<'_>, nc: usize, ldc: usize, c: *mut f32) {
        if let Some(r) = residual_rows(t, c) {
            // The next tile's residual and output rows, one line each, into
            // L1 while this tile computes: in a model they come from L3 or
            // memory, MR lines at a stride of the output channels, which
            // the hardware prefetchers did not fetch in time (ResNet-50's
            // 1×1/2 256→512 at 56² with a residual 1.16x faster, 1×1
            // expansions with one 3-5%). Only with a residual: without one,
            // the output's lines alone gained nothing. Spread over the K
            // loop instead, the hints made LLVM compile that loop worse.
            for i in MR..2 * MR {
                // Hints only: prefetching never faults, even past the rows.
                _mm_prefetch::<_MM_HINT_T0>(r.wrapping_add(i * t.res_ld) as *const i8);
                _mm_prefetch::<_MM_HINT_T0>(c.wrapping_add(i * ldc) as *const i8);
            }
        }
        // A half panel (the last 8 of 24, 40, 72 or 120 channels, common
        // in MobileNets and PP-OCR) accumulates one vector per pixel, not
        // two of which one is thrown away. The accumulators come back by
        // value: passed by reference, LLVM kept them in memory through the
        // K loop (2-4x slower).
        // SAFETY: `tile` checked every offset either loop reads.
        let acc = unsafe {
            if nc > 8 {
                accumulate_avx2::<MR, 2>(t)
            } else {
                accumulate_avx2::<MR, 1>(t)
            }
        };
        // SAFETY: the caller's contract.
        unsafe {
            match (t.act, t.after.is_some()) {
                (None | Some(RegAct::Clamp(..)), false) => store_avx2::<MR, false, false>(t, acc, nc, ldc, c),
                (None | Some(RegAct::Clamp(..)), true) => store_avx2::<MR, false, true>(t, acc, nc, ldc, c),
                _ => store_any_avx2::<MR>(t, acc, nc, ldc, c),
            }
        }
    }

    /// [`store_avx2`] for the activations other than clamps, out of line:
    /// inline, their constants changed how LLVM compiled the K loop
    /// (PP-LCNet 2x slower); out of line for every tile, the call cost
    /// short-K tiles 10-15% (MobileNet's 16→96, 24→144).
    ///
    /// # Safety
    /// As [`avx2`]'s.
    #[inline(never)]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn store_any_avx2<const MR: usize>(
        t: &TileArgs<'_>,
        acc: [[__m256; 2]; MR],
        nc: usize,
        ldc: usize,
        c: *mut f32,
    ) {
        // SAFETY: the caller's contract.
        unsafe {
            match t.after {
                None => store_avx2::<MR, true, false>(t, acc, nc, ldc, c),
                Some(_) => store_avx2::<MR, true, true>(t, acc, nc, ldc, c),
            }
        }
    }

    /// The tile's epilogue and store: bias, the activation (`ANY`: any of
    /// `RegAct`, else a clamp or nothing), the residual, the clamp after
    /// (`AFTER`; in registers since the K loop returns its accumulators by
    /// value, rather than in a pass of its own over the stored tile).
    ///
    /// # Safety
    /// As [`avx2`]'s.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn store_avx2<const MR: usize, const ANY: bool, const AFTER: bool>(
        t: &TileArgs<'_>,
        acc: [[__m256; 2]; MR],
        nc: usize,
        ldc: usize,
        c: *mut f32,
    ) {
        let (n0, n1) = (nc, nc.saturating_sub(8));
        // SAFETY: the loads and stores touch the first nc values of the
        // bias and of each of the MR rows of C (see `tile`).
        unsafe {
            let (bias0, bias1) = match t.bias {
                Some(b) => (avx2::load(b.as_ptr(), n0), avx2::load(b.as_ptr().add(8.min(nc)), n1)),
                None => (_mm256_setzero_ps(), _mm256_setzero_ps()),
            };
            // max(lo, v), min(hi, v): the second operand (v) when either is NaN.
            let clamp =
                |v: __m256, lo: f32, hi: f32| _mm256_min_ps(_mm256_set1_ps(hi), _mm256_max_ps(_mm256_set1_ps(lo), v));
            let hard_sigmoid = |v: __m256, alpha: f32, beta: f32| {
                let y = _mm256_add_ps(_mm256_mul_ps(_mm256_set1_ps(alpha), v), _mm256_set1_ps(beta));
                clamp(y, 0.0, 1.0)
            };
            // The residual's tile rows (`tile` checked their length),
            // or C's own, each read before the store that overwrites it.
            let res = residual_rows(t, c).map(|r| (r, t.res_ld));
            // The clamp after the residual, in registers too.
            let (after_lo, after_hi) = t.after.unwrap_or((f32::NEG_INFINITY, f32::INFINITY));
            let last = |v: __m256| if AFTER { clamp(v, after_lo, after_hi) } else { v };
            // The activation is chosen once per tile, not per vector: the
            // branches had cost a 1×1 16→32 layer with HardSwish at 112² 12%.
            let (bias, out) = ((bias0, bias1), (c, ldc, nc));
            match t.act {
                Some(RegAct::Clamp(lo, hi)) => store_rows::<MR>(acc, bias, res, out, |v| clamp(v, lo, hi), last),
                Some(RegAct::HardSigmoid(alpha, beta)) if ANY => {
                    store_rows::<MR>(acc, bias, res, out, |v| hard_sigmoid(v, alpha, beta), last)
                }
                Some(RegAct::HardSwish) if ANY => store_rows::<MR>(
                    acc,
                    bias,
                    res,
                    out,
                    |v| _mm256_mul_ps(v, hard_sigmoid(v, 1.0 / 6.0, 0.5)),
                    last,
                ),
                Some(RegAct::Silu) if ANY => store_rows::<MR>(acc, bias, res, out, |v| avx2_math::silu8_store(v), last),
                Some(RegAct::Sigmoid) if ANY => {
                    store_rows::<MR>(acc, bias, res, out, |v| avx2_math::sigmoid8_store(v), last)
                }
                _ => store_rows::<MR>(acc, bias, res, out, |v| v, last),
            }
        }
    }

    /// Stores `MR` rows of `nc <= 16` values, `last(fix(acc + bias) +
    /// residual)`, `ldc` apart from `c`; the residual's rows `res_ld` apart
    /// (read before the store, which may overwrite them). A whole panel
    /// (`nc == 16`, the common tile) without lane masks, so that the 2·MR
    /// vectors' epilogues overlap.
    ///
    /// # Safety
    /// AVX2 and FMA; `c.add(i * ldc + j)`, `i < MR`, `j < nc`, writable, and
    /// the residual's `r.add(i * res_ld + j)` readable.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn store_rows<const MR: usize>(
        acc: [[__m256; 2]; MR],
        (bias0, bias1): (__m256, __m256),
        res: Option<(*const f32, usize)>,
        (c, ldc, nc): (*mut f32, usize, usize),
        fix: impl Fn(__m256) -> __m256,
        last: impl Fn(__m256) -> __m256,
    ) {
        // SAFETY: the caller's contract.
        unsafe {
            let row = |i: usize| c.add(i * ldc);
            match res {
                None if nc == 16 => {
                    for (i, acc) in acc.iter().enumerate() {
                        _mm256_storeu_ps(row(i), last(fix(_mm256_add_ps(acc[0], bias0))));
                        _mm256_storeu_ps(row(i).add(8), last(fix(_mm256_add_ps(acc[1], bias1))));
                    }
                }
                Some((r, res_ld)) if nc == 16 => {
                    for (i, acc) in acc.iter().enumerate() {
                        let r = r.add(i * res_ld);
                        let v0 = _mm256_add_ps(fix(_mm256_add_ps(acc[0], bias0)), _mm256_loadu_ps(r));
                        let v1 = _mm256_add_ps(fix(_mm256_add_ps(acc[1], bias1)), _mm256_loadu_ps(r.add(8)));
                        _mm256_storeu_ps(row(i), last(v0));
                        _mm256_storeu_ps(row(i).add(8), last(v1));
                    }
                }
                _ => {
                    let (n0, n1) = (nc, nc.saturating_sub(8));
                    let plus = |v: __m256, at: usize, n: usize| match res {
                        Some((r, _)) => _mm256_add_ps(v, avx2::load(r.add(at), n)),
                        None => v,
                    };
                    let res_ld = res.map_or(0, |(_, ld)| ld);
                    for (i, acc) in acc.iter().enumerate() {
                        avx2::store(
                            row(i),
                            n0,
                            last(plus(fix(_mm256_add_ps(acc[0], bias0)), i * res_ld, n0)),
                        );
                        if nc > 8 {
                            let v1 = last(plus(fix(_mm256_add_ps(acc[1], bias1)), i * res_ld + 8, n1));
                            avx2::store(row(i).add(8), n1, v1);
                        }
                    }
                }
            }
        }
    }

    /// The K loop of [`avx2`]: every segment into `acc`, `V` vectors of
    /// each B row (2: all 16 columns; 1: the first 8).
    ///
    /// # Safety
    /// As [`avx2`]'s.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn accumulate_avx2<const MR: usize, const V: usize>(t: &TileArgs<'_>) -> [[__m256; 2]; MR] {
        let mut acc = [[_mm256_setzero_ps(); 2]; MR];
        let (img, panel) = (t.image.as_ptr(), t.panel.as_ptr());
        // The next panel's share, one line per four K rows (two registers:
        // a counter per line, as in the AVX-512 kernel, made LLVM spill).
        let (mut pf, pf_end) = (t.prefetch.as_ptr(), t.prefetch.as_ptr_range().end);
        // A 1×1 stride-1 tile reads MR·K contiguous inputs, and the next
        // tile the MR·K after them: fetched into L1 meanwhile, two lines per
        // four K rows (MR/4 lines would do), since a model's activations
        // come from L3 or memory and the streams of MR rows at once were
        // not prefetched in time (1×1 144→24 at 56² from memory 1.37x
        // faster). Not below K = 64, where the hints cost more than they
        // gained (16→96 at 112² 4% slower).
        let contiguous = matches!(t.segs, [s] if s.len == t.pixel_step && s.len >= PREFETCH_A_MIN_K);
        let mut next_a = img.wrapping_add(t.a0 + t.segs.first().map_or(0, |s| s.a) + MR * t.pixel_step);
        for s in t.segs {
            // SAFETY: in bounds, see `tile` (b rows of 16).
            unsafe {
                let a = img.add(t.a0 + s.a);
                let rows: [*const f32; MR] = std::array::from_fn(|i| a.add(i * t.pixel_step));
                let b = panel.add(s.b);
                let step = |k: usize, acc: &mut [[__m256; 2]; MR]| {
                    let bk: [__m256; V] = std::array::from_fn(|v| _mm256_loadu_ps(b.add(16 * k + 8 * v)));
                    for (row, acc) in rows.iter().zip(acc.iter_mut()) {
                        let ai = _mm256_broadcast_ss(&*row.add(k));
                        for v in 0..V {
                            acc[v] = _mm256_fmadd_ps(ai, bk[v], acc[v]);
                        }
                    }
                };
                // Four k per iteration, as in the GEMM microkernel: the loop's
                // own instructions no longer hold back the FMAs.
                let whole = s.len / 4 * 4;
                for k in (0..whole).step_by(4) {
                    if pf < pf_end {
                        // A hint only: prefetching never faults.
                        _mm_prefetch::<_MM_HINT_T1>(pf as *const i8);
                        pf = pf.wrapping_add(16);
                    }
                    if contiguous {
                        // Hints too: past the image's end they fetch nothing useful, harmlessly.
                        _mm_prefetch::<_MM_HINT_T0>(next_a as *const i8);
                        _mm_prefetch::<_MM_HINT_T0>(next_a.wrapping_add(16) as *const i8);
                        next_a = next_a.wrapping_add(32);
                    }
                    for u in 0..4 {
                        step(k + u, &mut acc);
                    }
                }
                for k in whole..s.len {
                    step(k, &mut acc);
                }
            }
        }
        acc
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::conv::{pack_groups, ConvWeights};
    use crate::kernels::spatial::output_len;

    /// The tasks `split` cuts a `size`² 3×3 convolution `ci` → `co` into.
    fn tasks(size: usize, ci: usize, co: usize, threads: usize) -> Option<(usize, usize)> {
        let target = Target::detect_host().ok().filter(|t| *t != Target::Generic)?;
        let isa = Isa::new(target)?;
        let axis = Axis {
            input: size,
            output: output_len(size, 3, 1, 1, (1, 1), false).unwrap(),
            kernel: 3,
            stride: 1,
            dilation: 1,
            pad_begin: 1,
            pad_end: 1,
        };
        let window = Window { h: axis, w: axis };
        let w = vec![0.0; co * ci * 9];
        let packs = pack_groups(target, &w, co, ci, 9, 1).unwrap();
        let refs: Vec<&PackedB> = packs.iter().collect();
        let c = Conv {
            window: &window,
            batch: 1,
            in_channels: ci,
            out_channels: co,
            groups: 1,
            x: &[],
            weights: ConvWeights::Packed(&refs),
            bias: None,
            activation: Activation::None,
            residual: None,
            after: Activation::None,
        };
        let panels = co.div_ceil(refs[0].nr());
        let row_bytes = 3 * size * ci * 4;
        Some(split(isa, &c, &refs, (size, panels), row_bytes, threads))
    }

    #[test]
    fn balanced_tiles_cover_evenly_in_as_few_tiles_as_fit() {
        for max in [6, 14] {
            for len in 0..200 {
                let tiles: Vec<usize> = balanced(len, max).collect();
                assert_eq!(tiles.iter().sum::<usize>(), len, "{len} by {max}: {tiles:?}");
                assert_eq!(tiles.len(), len.div_ceil(max), "{len} by {max}: {tiles:?}");
                assert!(
                    tiles.iter().all(|&t| (1..=max).contains(&t)),
                    "{len} by {max}: {tiles:?}"
                );
                // Larger first, and at most one apart.
                assert!(tiles.windows(2).all(|w| w[0] >= w[1]), "{len} by {max}: {tiles:?}");
                assert!(
                    tiles.first().zip(tiles.last()).is_none_or(|(a, b)| a - b <= 1),
                    "{tiles:?}"
                );
            }
        }
        assert_eq!(balanced(57, 14).collect::<Vec<_>>(), [12, 12, 11, 11, 11]);
    }

    #[test]
    fn tasks_cut_whatever_moves_fewer_bytes() {
        let Some(one) = tasks(7, 512, 512, 1) else { return };
        assert_eq!(one, (1, 1), "one thread, one task");
        // ResNet-50's last 3×3: 9 MiB of weights, 100 KiB of input.
        let (rows, panels) = tasks(7, 512, 512, 2).unwrap();
        assert_eq!(rows, 1, "weights streamed once: {rows} x {panels}");
        assert!(panels >= 4);
        // Its first: 147 KiB of weights, a 56×56 map.
        let (rows, panels) = tasks(56, 64, 64, 2).unwrap();
        assert_eq!(panels, 1, "input read once: {rows} x {panels}");
        assert!(rows >= 4);
    }
}
