//! Convolution over channels-last `[N, H, W, C]` activations (issue #13),
//! as GEMMs with the weights packed at compile time:
//!
//! - on x86 targets (AVX2, AVX-512), every non-depthwise convolution is a
//!   direct one, [`super::conv_direct`]: no im2col, A read in place;
//!   the paths below serve the generic target (and the tests compare all);
//! - pointwise (1×1, stride 1, no padding): the input *is* the GEMM's A
//!   (`M = N·H·W` rows of `Ci` values), no copy;
//! - depthwise (`groups == Ci == Co`): [`super::depthwise`];
//! - weights transformed for Winograd F(2×2, 3×3) or F(4×4, 3×3) (the compiler's choice
//!   for wide 3×3 stride-1 convolutions on AVX2): [`super::winograd`];
//! - otherwise im2col, a block of output pixels at a time: each pixel's
//!   row holds its `kh·kw` taps, each a contiguous run of the group's
//!   `Ci / groups` channels (zeros in the padding), then one GEMM per group
//!   against `B = [kh·kw·Ci/g, Co/g]`. The block stays in cache and its
//!   buffer is reused from run to run (one per thread).
//!
//! The epilogue (`bias`, activation, residual) is the GEMM's, applied while
//! each tile is in cache.

use std::cell::RefCell;
use std::marker::PhantomData;
use std::ops::Range;

use super::depthwise::{depthwise, Depthwise};
use super::gemm::{self, activate, Activation, Bias, Blocking, Epilogue, PackedB};
use super::parallel::{try_for_each_block, Blocks, Parallel, Serial};
use super::spatial::{output_len, Axis, Window};
use super::Isa;
use crate::error::{Error, Result};
use crate::target::Target;

/// The weights as the kernels hold them.
#[derive(Clone, Copy)]
pub enum ConvWeights<'a> {
    /// One packed `[kh·kw·Ci/g, Co/g]` B per group ([`pack_groups`]).
    Packed(&'a [&'a PackedB]),
    /// Depthwise, tap-major `[kh·kw, C]` ([`depthwise_weights`]).
    Depthwise(&'a [f32]),
    /// A 3×3 stride-1 convolution's weights transformed for
    /// [`super::winograd`]: its 16 (F(2×2)) or 36 (F(4×4)) packed `[Ci, Co]`
    /// matrices.
    Winograd(&'a [&'a PackedB]),
}

/// One convolution's operands.
#[derive(Clone, Copy)]
pub struct Conv<'a> {
    pub window: &'a Window,
    pub batch: usize,
    pub in_channels: usize,
    pub out_channels: usize,
    pub groups: usize,
    /// `[batch, h.input, w.input, in_channels]`.
    pub x: &'a [f32],
    pub weights: ConvWeights<'a>,
    /// `[out_channels]`.
    pub bias: Option<&'a [f32]>,
    pub activation: Activation,
    /// `[batch, h.output, w.output, out_channels]`, added after the activation.
    pub residual: Option<&'a [f32]>,
    /// Applied after the residual (ResNet's Relu after the skip
    /// connection's Add); `None` without a residual.
    pub after: Activation,
}

/// Whether every axis of `w` is a valid window whose output length is the
/// one its sizes give (what the kernels rely on to stay in bounds).
pub fn window_ok(w: &Window) -> bool {
    let small = |v: usize| v <= u32::MAX as usize; // no overflow below, even from a hostile file
    let ok = |a: &Axis| {
        [
            a.input,
            a.output,
            a.kernel,
            a.stride,
            a.dilation,
            a.pad_begin,
            a.pad_end,
        ]
        .into_iter()
        .all(small)
            && a.kernel >= 1
            && a.stride >= 1
            && a.dilation >= 1
            && output_len(a.input, a.kernel, a.stride, a.dilation, (a.pad_begin, a.pad_end), false) == Some(a.output)
    };
    ok(&w.h) && ok(&w.w)
}

/// Whether the window is a 1×1 kernel, stride 1, no padding: the output
/// pixels are the input pixels.
pub fn is_pointwise(w: &Window) -> bool {
    let one = |a: &Axis| a.kernel == 1 && a.stride == 1 && a.pad_begin == 0 && a.pad_end == 0;
    one(&w.h) && one(&w.w)
}

/// ONNX weights `[co, cig, kh, kw]` (`taps = kh·kw`) as one B `[taps·cig,
/// co/groups]` per group, rows in the order im2col writes (tap, then
/// channel), packed for `target`.
pub fn pack_groups(
    target: Target,
    w: &[f32],
    co: usize,
    cig: usize,
    taps: usize,
    groups: usize,
) -> Result<Vec<PackedB>> {
    if groups == 0 || !co.is_multiple_of(groups) || w.len() != co * cig * taps {
        return Err(Error::invalid_graph(format!(
            "convolution weights of {} values are not [{co}, {cig}, {taps} taps] in {groups} group(s)",
            w.len()
        )));
    }
    let (cog, k) = (co / groups, taps * cig);
    (0..groups)
        .map(|g| {
            // `[n, k]` (row per output channel): packed with trans_b.
            let mut bt = vec![0.0f32; cog * k];
            for o in 0..cog {
                let src = &w[(g * cog + o) * k..][..k];
                for ci in 0..cig {
                    for t in 0..taps {
                        bt[o * k + t * cig + ci] = src[ci * taps + t];
                    }
                }
            }
            PackedB::try_pack(target, &bt, k, cog, true)
        })
        .collect()
}

/// Depthwise weights `[c, 1, kh, kw]` as tap-major `[kh·kw, c]`.
pub fn depthwise_weights(w: &[f32], c: usize, taps: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; c * taps];
    for ch in 0..c {
        for t in 0..taps {
            out[t * c + ch] = w[ch * taps + t];
        }
    }
    out
}

/// `y` (`[batch, h.output, w.output, out_channels]`) = the convolution.
pub fn conv(isa: Isa, c: &Conv<'_>, y: &mut [f32], par: &dyn Parallel) -> Result<()> {
    conv_strided(isa, c, y, c.out_channels, par)
}

/// Whether a convolution can write output pixels more than `out_channels`
/// values apart on `target` ([`conv_strided`]): the direct kernels can, for
/// packed (not depthwise) weights; a residual keeps its own dense pixels.
pub fn writes_strided(target: Target, depthwise: bool) -> bool {
    matches!(target, Target::Avx2 | Target::Avx512) && !depthwise
}

/// [`conv`] whose residual is `y` itself: on entry `y` holds the residual
/// (`c.residual` must be `None`), on return `after(act(conv(x) + bias) +
/// y)`. The planner gives a convolution the residual's buffer when nothing
/// reads the residual afterwards (ResNet's, YOLOv8's and MobileNet's skip
/// connections): the output's lines are then the residual's, read and
/// written once, not a third stream, as ORT's NCHWc convolution does with
/// its `Sum` input. The direct kernels read each residual value in the
/// store that overwrites it; the other paths copy `y` aside first.
pub fn conv_onto(isa: Isa, c: &Conv<'_>, y: &mut [f32], par: &dyn Parallel) -> Result<()> {
    if let Some(w) = along_rows(c.window) {
        return conv_onto(isa, &Conv { window: &w, ..*c }, y, par);
    }
    if c.residual.is_some() {
        return Err(size_error("a residual in its own buffer and in the output at once"));
    }
    check(c, y.len(), c.out_channels)?;
    match c.weights {
        ConvWeights::Packed(groups) if super::conv_direct::usable(isa, groups) => {
            return super::conv_direct::conv_onto(isa, c, groups, y, par);
        }
        ConvWeights::Winograd(packs) => {
            return super::winograd::conv(isa, c, packs, y, c.out_channels, true, par);
        }
        _ => {}
    }
    super::with_thread_buffer(&RESIDUAL, |copy| conv_with_copy(isa, c, y, par, copy))
}

thread_local! {
    /// The residual's copy for [`conv_onto`]'s paths that cannot read it
    /// from the output, kept between runs.
    static RESIDUAL: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// [`conv_onto`] by way of a copy of `y` as the residual.
fn conv_with_copy(isa: Isa, c: &Conv<'_>, y: &mut [f32], par: &dyn Parallel, copy: &mut Vec<f32>) -> Result<()> {
    copy.clear();
    copy.extend_from_slice(y);
    let c = Conv {
        residual: Some(&copy[..]),
        ..*c
    };
    conv(isa, &c, y, par)
}

/// [`conv`] with output pixels `ldo` values apart: `y` is `[batch, h.output,
/// w.output, ldo]` of which the convolution writes the first `out_channels`
/// of each pixel and leaves the others alone. This is how a convolution
/// writes its channels of a concat's output in place (`ldo` the concat's
/// channels, `y` starting at this input's first one).
pub fn conv_strided(isa: Isa, c: &Conv<'_>, y: &mut [f32], ldo: usize, par: &dyn Parallel) -> Result<()> {
    if let Some(w) = along_rows(c.window) {
        return conv_strided(isa, &Conv { window: &w, ..*c }, y, ldo, par);
    }
    check(c, y.len(), ldo)?;
    if let ConvWeights::Winograd(packs) = c.weights {
        return super::winograd::conv(isa, c, packs, y, ldo, false, par);
    }
    if ldo != c.out_channels {
        return match c.weights {
            ConvWeights::Packed(groups)
                if writes_strided(isa.target(), false) && super::conv_direct::usable(isa, groups) =>
            {
                super::conv_direct::conv(isa, c, groups, y, ldo, par)
            }
            _ => Err(size_error(
                "an output pixel stride other than the output channels needs packed weights and an AVX2 or \
                 AVX-512 target",
            )),
        };
    }
    match c.weights {
        ConvWeights::Depthwise(w) => {
            let d = Depthwise {
                isa,
                window: c.window,
                batch: c.batch,
                channels: c.in_channels,
                x: c.x,
                weights: w,
                bias: c.bias,
                activation: c.activation,
                residual: c.residual,
                after: c.after,
            };
            depthwise(&d, y, par);
            Ok(())
        }
        ConvWeights::Winograd(_) => unreachable!("run above"),
        ConvWeights::Packed(groups) => {
            if super::conv_direct::usable(isa, groups) {
                super::conv_direct::conv(isa, c, groups, y, c.out_channels, par)
            } else if is_pointwise(c.window) {
                pointwise(isa, c, groups, y, par)
            } else {
                im2col_gemm(isa, c, groups, y, par)
            }
        }
    }
}

/// `w` with its axes swapped when every column is one pixel wide (input,
/// output and kernel width 1, no padding) and the rows are not: a 1-D
/// convolution exported over H (`[N, C, L, 1]`, as jax2tf's and TF's are).
/// Channels-last, `[N, L, 1, C]` and `[N, 1, L, C]` are the same memory and
/// the taps keep their order, but the kernels tile an output row: one row
/// of `L` pixels, not `L` rows of one (Magika's 5×1 convolution took 1.4×
/// ORT's time before).
fn along_rows(w: &Window) -> Option<Window> {
    let one = |a: &Axis| a.input == 1 && a.output == 1 && a.kernel == 1 && a.pad_begin == 0 && a.pad_end == 0;
    (one(&w.w) && !one(&w.h)).then_some(Window { h: w.w, w: w.h })
}

fn size_error(what: impl std::fmt::Display) -> Error {
    Error::runtime(format!("convolution: {what}"))
}

/// Every length and size the kernels index with (output pixels `ldo`
/// values apart).
fn check(c: &Conv<'_>, y_len: usize, ldo: usize) -> Result<()> {
    let w = c.window;
    let (ci, co, g) = (c.in_channels, c.out_channels, c.groups);
    if !window_ok(w) || g == 0 || !ci.is_multiple_of(g) || !co.is_multiple_of(g) {
        return Err(size_error(format_args!(
            "bad window or groups ({g}, {ci} -> {co} channels)"
        )));
    }
    // Checked: a product that wrapped could match a short slice (sizes come
    // from a context binary, each below 2^32 but not their product).
    let size = |a: usize, b: usize, c: usize, d: usize| a.checked_mul(b)?.checked_mul(c)?.checked_mul(d);
    let x_len = size(c.batch, w.h.input, w.w.input, ci);
    let y_want = size(c.batch, w.h.output, w.w.output, co);
    let y_span = c
        .batch
        .checked_mul(w.output_pixels())
        .and_then(|pixels| strided_len(pixels, ldo, co));
    let (Some(x_len), Some(y_want), Some(y_span)) = (x_len, y_want, y_span) else {
        return Err(size_error("tensor sizes overflow"));
    };
    if ldo < co {
        return Err(size_error(format_args!(
            "output pixel stride {ldo} under {co} channels"
        )));
    }
    if c.x.len() != x_len || y_len != y_span {
        return Err(size_error(format_args!(
            "input of {} values (want {x_len}) or output of {y_len} (want {y_span})",
            c.x.len()
        )));
    }
    if c.bias.is_some_and(|b| b.len() != co) || c.residual.is_some_and(|r| r.len() != y_want) {
        return Err(size_error("bias or residual of the wrong size"));
    }
    let (cig, cog) = (ci / g, co / g);
    let taps_times = |n: usize| w.h.kernel.checked_mul(w.w.kernel)?.checked_mul(n);
    let ok = match c.weights {
        ConvWeights::Depthwise(wt) => g == ci && ci == co && Some(wt.len()) == taps_times(ci),
        ConvWeights::Packed(p) => p.len() == g && p.iter().all(|b| Some(b.k()) == taps_times(cig) && b.n() == cog),
        ConvWeights::Winograd(p) => super::winograd::eligible(w, ci, co, g) && super::winograd::packs_fit(p, ci, co),
    };
    if !ok {
        return Err(size_error("weights do not fit the window and channels"));
    }
    Ok(())
}

/// Values that `pixels` output pixels `ldo` apart span, the last one's
/// `co` channels ending it (0 without pixels); `None` on overflow.
pub fn strided_len(pixels: usize, ldo: usize, co: usize) -> Option<usize> {
    match pixels {
        0 => Some(0),
        _ => (pixels - 1).checked_mul(ldo)?.checked_add(co),
    }
}

/// The epilogue of group `g`'s GEMM over output pixels `rows` (the
/// residual only with one group: a group's columns are not dense).
fn epilogue<'a>(c: &Conv<'a>, g: usize, rows: Range<usize>) -> Epilogue<'a> {
    let cog = c.out_channels / c.groups;
    Epilogue {
        alpha: 1.0,
        bias: match c.bias {
            Some(b) => Bias::PerColumn(&b[g * cog..][..cog]),
            None => Bias::None,
        },
        activation: c.activation,
        residual: match c.residual {
            Some(r) if c.groups == 1 => Some(&r[rows.start * cog..rows.end * cog]),
            _ => None,
        },
    }
}

/// Adds the residual of output pixels `rows` after a grouped GEMM, then
/// applies `after` (the GEMM epilogue has no step after its residual).
fn add_residual(isa: Isa, c: &Conv<'_>, rows: Range<usize>, y: &mut [f32]) {
    if let (Some(r), true) = (c.residual, c.groups > 1) {
        let co = c.out_channels;
        for (a, &b) in y.iter_mut().zip(&r[rows.start * co..rows.end * co]) {
            *a += b;
        }
    }
    if c.after != Activation::None {
        super::activate_isa(isa, c.after, y);
    }
}

/// 1×1, stride 1, no padding: A is the input itself (a group's channels
/// are columns `g·cig ..` of it, row stride `Ci`).
fn pointwise(isa: Isa, c: &Conv<'_>, packed: &[&PackedB], y: &mut [f32], par: &dyn Parallel) -> Result<()> {
    let m = c.batch * c.window.output_pixels();
    let (ci, co) = (c.in_channels, c.out_channels);
    let (cig, cog) = (ci / c.groups, co / c.groups);
    if m == 0 {
        return Ok(());
    }
    for (g, pb) in packed.iter().enumerate() {
        let a = &c.x[g * cig..];
        gemm::gemm_packed(isa, m, a, ci, pb, &mut y[g * cog..], co, &epilogue(c, g, 0..m), par)?;
    }
    add_residual(isa, c, 0..m, y);
    Ok(())
}

/// Bytes of one im2col block: at least `mc` rows, more while it fits.
const BLOCK_BYTES: usize = 256 * 1024;

thread_local! {
    /// The im2col block of the convolutions this thread runs, kept between runs.
    static COLUMNS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// General convolution: output pixels in blocks, each im2col'd once per
/// group and multiplied by the group's packed weights.
fn im2col_gemm(isa: Isa, c: &Conv<'_>, packed: &[&PackedB], y: &mut [f32], par: &dyn Parallel) -> Result<()> {
    let m = c.batch * c.window.output_pixels();
    let k = c.window.taps() * (c.in_channels / c.groups);
    let co = c.out_channels;
    if m == 0 || co == 0 {
        return Ok(());
    }
    let blk = Blocking::of(isa.target());
    let rows = (BLOCK_BYTES / (4 * k.max(1))).max(blk.mc).min(m);
    let blocks = m.div_ceil(rows);
    if par.threads() > 1 && blocks >= 2 * par.threads() {
        // Enough blocks to go round: tasks of whole blocks, their GEMMs serial.
        let tasks = (4 * par.threads()).min(blocks);
        let per = blocks.div_ceil(tasks) * rows;
        let chunks = Blocks::new(y.len(), y.len(), per * co);
        return try_for_each_block(par, y, chunks, &|t, chunk| {
            let first = t * per;
            blocks_serial(isa, c, packed, first..first + chunk.len() / co, rows, chunk, &Serial)
        });
    }
    blocks_serial(isa, c, packed, 0..m, rows, y, par)
}

/// Output pixels `pixels` (their output rows in `y`), `rows` at a time,
/// each block's GEMMs split over `par`, in this thread's im2col buffer.
fn blocks_serial(
    isa: Isa,
    c: &Conv<'_>,
    packed: &[&PackedB],
    pixels: Range<usize>,
    rows: usize,
    y: &mut [f32],
    par: &dyn Parallel,
) -> Result<()> {
    super::with_thread_buffer(&COLUMNS, |cols| blocks_in(isa, c, packed, pixels, rows, y, par, cols))
}

#[allow(clippy::too_many_arguments)]
fn blocks_in(
    isa: Isa,
    c: &Conv<'_>,
    packed: &[&PackedB],
    pixels: Range<usize>,
    rows: usize,
    y: &mut [f32],
    par: &dyn Parallel,
    cols: &mut Vec<f32>,
) -> Result<()> {
    let co = c.out_channels;
    let cog = co / c.groups;
    let k = c.window.taps() * (c.in_channels / c.groups);
    if cols.len() < rows * k {
        cols.resize(rows * k, 0.0);
    }
    let mut start = pixels.start;
    while start < pixels.end {
        let end = (start + rows).min(pixels.end);
        let out = &mut y[(start - pixels.start) * co..(end - pixels.start) * co];
        for (g, pb) in packed.iter().enumerate() {
            let a = &mut cols[..(end - start) * k];
            im2col(c, g, start..end, a);
            let epi = epilogue(c, g, start..end);
            gemm::gemm_packed(isa, end - start, a, k, pb, &mut out[g * cog..], co, &epi, par)?;
        }
        add_residual(isa, c, start..end, out);
        start = end;
    }
    Ok(())
}

/// Rows of group `g`'s im2col for output pixels `pixels` (flat over batch,
/// output rows, output columns): per pixel, its taps in (kh, kw) order,
/// each the group's `cig` input channels, or zeros in the padding.
fn im2col(c: &Conv<'_>, g: usize, pixels: Range<usize>, a: &mut [f32]) {
    let w = c.window;
    let ci = c.in_channels;
    let cig = ci / c.groups;
    let k = w.taps() * cig;
    let per_image = w.output_pixels();
    for (p, row) in pixels.zip(a.chunks_exact_mut(k)) {
        let (n, q) = (p / per_image, p % per_image);
        let (oh, ow) = (q / w.w.output, q % w.w.output);
        let image = &c.x[n * w.input_pixels() * ci..][..w.input_pixels() * ci];
        for kh in 0..w.h.kernel {
            let dst = &mut row[kh * w.w.kernel * cig..][..w.w.kernel * cig];
            let Some(ih) = w.h.source(oh, kh) else {
                dst.fill(0.0);
                continue;
            };
            // One group, dilation 1, all taps inside: the row's taps are one
            // contiguous run of the input (NHWC), one copy.
            let start = (ow * w.w.stride).wrapping_sub(w.w.pad_begin);
            if cig == ci && w.w.dilation == 1 && w.w.interior(ow) {
                dst.copy_from_slice(&image[(ih * w.w.input + start) * ci..][..w.w.kernel * ci]);
                continue;
            }
            for (kw, tap) in dst.chunks_exact_mut(cig).enumerate() {
                match w.w.source(ow, kw) {
                    Some(iw) => tap.copy_from_slice(&image[(ih * w.w.input + iw) * ci + g * cig..][..cig]),
                    None => tap.fill(0.0),
                }
            }
        }
    }
}

/// The convolution by its definition, for tests: ONNX weights `[co, cig,
/// kh, kw]`, channels-last input and output.
pub fn reference(c: &Conv<'_>, onnx_w: &[f32], y: &mut [f32]) {
    let w = c.window;
    let (ci, co, g) = (c.in_channels, c.out_channels, c.groups);
    let (cig, cog) = (ci / g, co / g);
    for n in 0..c.batch {
        for oh in 0..w.h.output {
            for ow in 0..w.w.output {
                let base = ((n * w.h.output + oh) * w.w.output + ow) * co;
                for o in 0..co {
                    let gi = o / cog;
                    let mut acc = c.bias.map_or(0.0, |b| b[o]) as f64;
                    for kh in 0..w.h.kernel {
                        let Some(ih) = w.h.source(oh, kh) else { continue };
                        for kw in 0..w.w.kernel {
                            let Some(iw) = w.w.source(ow, kw) else { continue };
                            for i in 0..cig {
                                let xv = c.x[((n * w.h.input + ih) * w.w.input + iw) * ci + gi * cig + i];
                                let wv = onnx_w[((o * cig + i) * w.h.kernel + kh) * w.w.kernel + kw];
                                acc += xv as f64 * wv as f64;
                            }
                        }
                    }
                    y[base + o] = acc as f32;
                }
                activate(c.activation, &mut y[base..base + co]);
                if let Some(r) = c.residual {
                    for o in 0..co {
                        y[base + o] += r[base + o];
                    }
                }
                activate(c.after, &mut y[base..base + co]);
            }
        }
    }
}

/// The output, shared by the tasks that each write their own block of rows
/// × output channels, as raw parts: one task's block interleaves with
/// another's pixel by pixel, so no task may hold a `&mut` spanning it
/// (the direct and Winograd convolutions' tasks cut by channels).
pub(super) struct Out<'a> {
    /// Read by the direct kernels that store through raw pointers, after
    /// checking their tile's extent against `len`.
    pub ptr: *mut f32,
    pub len: usize,
    /// Values between consecutive output pixels.
    pub ldo: usize,
    /// The output holds the residual on entry ([`conv_onto`]).
    pub onto: bool,
    _y: PhantomData<&'a mut [f32]>,
}

// SAFETY: an `Out` is an exclusive borrow of f32 values, like `&mut [f32]`;
// the tasks that share it write disjoint elements through `Out::run`
// (`conv_direct::rows` gives each its own rows × panels,
// `winograd::Split::task` its own tile rows × panels).
#[allow(unsafe_code)]
unsafe impl Sync for Out<'_> {}

impl<'a> Out<'a> {
    pub fn new(y: &'a mut [f32], ldo: usize, onto: bool) -> Out<'a> {
        Out {
            ptr: y.as_mut_ptr(),
            len: y.len(),
            ldo,
            onto,
            _y: PhantomData,
        }
    }

    /// Values between the residual's pixels: the output's own when it
    /// holds the residual, else the residual buffer's dense `co`.
    pub fn res_ld(&self, co: usize) -> usize {
        if self.onto {
            self.ldo
        } else {
            co
        }
    }

    /// Where the residual value of output element `at` (pixel `at / ldo`,
    /// channel `at % ldo`) is, its pixels `res_ld` apart.
    pub fn res_at(&self, at: usize, co: usize) -> usize {
        at / self.ldo * self.res_ld(co) + at % self.ldo
    }

    /// The `len` elements from `at`.
    ///
    /// # Safety
    /// The calling task owns them (they are in its rows × panels), and no
    /// other reference to them lives while the result does.
    #[allow(unsafe_code, clippy::mut_from_ref)]
    pub unsafe fn run(&self, at: usize, len: usize) -> &mut [f32] {
        assert!(
            at.checked_add(len).is_some_and(|end| end <= self.len),
            "output run out of bounds"
        );
        // SAFETY: in bounds (checked), exclusive (the caller's contract).
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(at), len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::parallel::ScopedThreads;

    fn data(n: usize, seed: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 7919 + seed * 104_729) % 1000) as f32 / 500.0 - 1.0)
            .collect()
    }

    fn axis(input: usize, kernel: usize, stride: usize, dilation: usize, pads: (usize, usize)) -> Axis {
        let output = output_len(input, kernel, stride, dilation, pads, false).unwrap();
        Axis {
            input,
            output,
            kernel,
            stride,
            dilation,
            pad_begin: pads.0,
            pad_end: pads.1,
        }
    }

    struct Case {
        batch: usize,
        ci: usize,
        co: usize,
        groups: usize,
        window: Window,
    }

    /// Every path on every runnable target, serial and on two threads,
    /// with and without the epilogue, against the definition.
    fn check(case: &Case) {
        let w = &case.window;
        let (ci, co, g) = (case.ci, case.co, case.groups);
        let x = data(case.batch * w.input_pixels() * ci, 1);
        let wt = data(co * (ci / g) * w.taps(), 2);
        let bias = data(co, 3);
        let out_len = case.batch * w.output_pixels() * co;
        let res = data(out_len, 4);
        // After the residual: a clamp (in the direct kernels' registers)
        // alone or after one, and an activation that runs after the store.
        for (epi, act, after) in [
            (false, Activation::None, Activation::None),
            (true, Activation::Relu, Activation::None),
            (true, Activation::Silu, Activation::None),
            (true, Activation::None, Activation::Relu),
            (true, Activation::Relu, Activation::Clip(0.5, 6.0)),
            (true, Activation::None, Activation::Silu),
            // Applied in the direct kernels' registers too.
            (true, Activation::HardSwish, Activation::None),
            (true, Activation::HardSigmoid(0.2, 0.5), Activation::Relu),
            (true, Activation::Sigmoid, Activation::None),
        ] {
            let base = Conv {
                window: w,
                batch: case.batch,
                in_channels: ci,
                out_channels: co,
                groups: g,
                x: &x,
                weights: ConvWeights::Depthwise(&[]),
                bias: epi.then_some(&bias[..]),
                activation: act,
                residual: epi.then_some(&res[..]),
                after,
            };
            let mut want = vec![0.0; out_len];
            reference(&base, &wt, &mut want);
            for target in Target::ALL {
                let Some(isa) = Isa::new(target) else { continue };
                let packs = pack_groups(target, &wt, co, ci / g, w.taps(), g).unwrap();
                let refs: Vec<&PackedB> = packs.iter().collect();
                let dw = depthwise_weights(&wt, co, w.taps());
                let mut ways = vec![ConvWeights::Packed(&refs)];
                if g == ci && ci == co {
                    ways.push(ConvWeights::Depthwise(&dw));
                }
                for weights in ways {
                    let c = Conv { weights, ..base };
                    for par in [&Serial as &dyn Parallel, &ScopedThreads(2)] {
                        let mut y = vec![f32::NAN; out_len];
                        conv(isa, &c, &mut y, par).unwrap();
                        for (i, (a, b)) in y.iter().zip(&want).enumerate() {
                            assert!((a - b).abs() <= 1e-4 * b.abs() + 1e-4, "{target} [{i}]: {a} vs {b}");
                        }
                        if epi {
                            // The residual in the output buffer: the same values.
                            let mut y = res.clone();
                            let onto = Conv { residual: None, ..c };
                            conv_onto(isa, &onto, &mut y, par).unwrap();
                            for (i, (a, b)) in y.iter().zip(&want).enumerate() {
                                assert!(
                                    (a - b).abs() <= 1e-4 * b.abs() + 1e-4,
                                    "{target} onto [{i}]: {a} vs {b}"
                                );
                            }
                        }
                    }
                }
                if writes_strided(target, false) {
                    let c = Conv {
                        weights: ConvWeights::Packed(&refs),
                        ..base
                    };
                    check_strided(isa, &c, &wt);
                }
            }
        }
    }

    /// `conv_strided` writes each output pixel's channels `ldo` values apart,
    /// from channel 3 of a wider buffer, and leaves every other value alone
    /// (a convolution writing its channels of a concat's output); its
    /// residual, if any, stays dense (YOLOv8's bottlenecks).
    fn check_strided(isa: Isa, c: &Conv<'_>, wt: &[f32]) {
        let (co, pixels) = (c.out_channels, c.batch * c.window.output_pixels());
        let mut want = vec![0.0; pixels * co];
        reference(c, wt, &mut want);
        let (first, ldo) = (3, co + 5);
        for par in [&Serial as &dyn Parallel, &ScopedThreads(2)] {
            let mut buf = vec![-7.5f32; pixels * ldo];
            let span = strided_len(pixels, ldo, co).unwrap();
            conv_strided(isa, c, &mut buf[first..first + span], ldo, par).unwrap();
            for (i, &v) in buf.iter().enumerate() {
                let (p, j) = (i / ldo, (i % ldo).wrapping_sub(first));
                if j < co {
                    let b = want[p * co + j];
                    assert!((v - b).abs() <= 1e-4 * b.abs() + 1e-4, "strided [{p}, {j}]: {v} vs {b}");
                } else {
                    assert_eq!(v, -7.5, "strided: value {i} outside the channels was written");
                }
            }
        }
    }

    fn case(batch: usize, ci: usize, co: usize, groups: usize, h: Axis, w: Axis) -> Case {
        Case {
            batch,
            ci,
            co,
            groups,
            window: Window { h, w },
        }
    }

    #[test]
    fn paths_match_the_definition() {
        let unit = axis(1, 1, 1, 1, (0, 0));
        let cases = [
            // 3×3 pad 1, dense.
            case(2, 5, 7, 1, axis(6, 3, 1, 1, (1, 1)), axis(7, 3, 1, 1, (1, 1))),
            // Pointwise, dense and grouped.
            case(2, 12, 20, 1, axis(5, 1, 1, 1, (0, 0)), axis(3, 1, 1, 1, (0, 0))),
            case(1, 12, 9, 3, axis(4, 1, 1, 1, (0, 0)), axis(5, 1, 1, 1, (0, 0))),
            // 1×1 stride 2 (im2col path).
            case(1, 6, 4, 1, axis(7, 1, 2, 1, (0, 0)), axis(8, 1, 2, 1, (0, 0))),
            // Strides, dilations, asymmetric pads, groups.
            case(1, 8, 6, 2, axis(9, 3, 2, 1, (0, 2)), axis(10, 2, 1, 3, (1, 0))),
            // Depthwise and a channel multiplier.
            case(2, 9, 9, 9, axis(7, 3, 1, 1, (1, 1)), axis(6, 3, 2, 1, (1, 1))),
            case(1, 4, 8, 4, axis(5, 3, 1, 2, (2, 2)), axis(5, 3, 1, 1, (1, 1))),
            // 1-D.
            case(2, 3, 5, 1, unit, axis(17, 5, 2, 1, (2, 2))),
            // 1-D over H (columns of one pixel, run as their transpose):
            // dense, strided and dilated, depthwise.
            case(2, 6, 40, 1, axis(37, 5, 1, 1, (2, 2)), unit),
            case(1, 16, 24, 1, axis(29, 3, 2, 2, (1, 2)), unit),
            case(1, 8, 8, 8, axis(30, 3, 1, 1, (1, 1)), unit),
            // Enough pixels for one task per block on two threads.
            case(2, 3, 8, 1, axis(64, 3, 1, 1, (1, 1)), axis(64, 3, 1, 1, (1, 1))),
            // A deep K (several K blocks) and a block of fewer rows.
            case(1, 96, 16, 1, axis(7, 3, 1, 1, (1, 1)), axis(6, 3, 1, 1, (1, 1))),
            // Direct kernels: pointwise as 2 rows of 117 pixels, output channels in a full, a partial
            // and a half panel; grouped pointwise.
            case(2, 20, 40, 1, axis(9, 1, 1, 1, (0, 0)), axis(13, 1, 1, 1, (0, 0))),
            case(1, 24, 72, 2, axis(15, 1, 1, 1, (0, 0)), axis(16, 1, 1, 1, (0, 0))),
            // No divisor of 229 pixels in 28..=224: rows of 112 and a rest.
            case(1, 8, 12, 1, unit, axis(229, 1, 1, 1, (0, 0))),
            // 337 = 3 · 112 + 1: a rest of one pixel, which runs as a border patch.
            case(1, 8, 40, 1, unit, axis(337, 1, 1, 1, (0, 0))),
            // Interior tiles of 14, 14 and a rest between border columns;
            // dilation and stride; a 7×7 stem-like window on 3 channels.
            case(1, 24, 48, 1, axis(5, 3, 1, 1, (1, 1)), axis(33, 3, 1, 1, (1, 1))),
            case(1, 16, 20, 1, axis(11, 3, 2, 2, (2, 1)), axis(37, 3, 2, 2, (2, 2))),
            case(1, 3, 64, 1, axis(12, 7, 2, 1, (3, 3)), axis(20, 7, 2, 1, (3, 3))),
            // Narrow maps: rows of at most 7 interior pixels, strided too.
            case(2, 24, 40, 1, axis(6, 3, 1, 1, (1, 1)), axis(7, 3, 1, 1, (1, 1))),
            case(1, 16, 24, 1, axis(13, 3, 2, 1, (1, 1)), axis(9, 3, 2, 1, (1, 1))),
            // Fewer rows than tasks: tasks split the weight panels too.
            case(1, 16, 100, 1, axis(3, 3, 1, 1, (1, 1)), axis(7, 3, 1, 1, (1, 1))),
            // Weights outweigh the input (a deep layer on a small map): on two
            // threads, tasks split the panels only.
            case(1, 64, 96, 1, axis(7, 3, 1, 1, (1, 1)), axis(7, 3, 1, 1, (1, 1))),
            // Several row blocks per task (each block runs every panel).
            case(1, 128, 16, 1, axis(16, 3, 1, 1, (1, 1)), axis(40, 3, 1, 1, (1, 1))),
            // AVX-512's tiles of two panels: 3 panels (a pair and a single
            // one), 2 groups of 2 panels each, pointwise pairs and a rest.
            case(1, 16, 96, 1, axis(6, 3, 1, 1, (1, 1)), axis(23, 3, 1, 1, (1, 1))),
            case(1, 16, 128, 2, axis(5, 3, 1, 1, (1, 1)), axis(19, 3, 1, 1, (1, 1))),
            case(2, 8, 160, 1, axis(5, 1, 1, 1, (0, 0)), axis(9, 1, 1, 1, (0, 0))),
        ];
        for c in &cases {
            check(c);
        }
    }

    #[test]
    fn bad_sizes_are_errors() {
        let win = Window {
            h: axis(4, 3, 1, 1, (1, 1)),
            w: axis(4, 3, 1, 1, (1, 1)),
        };
        let isa = Isa::new(Target::Generic).unwrap();
        let packs = pack_groups(Target::Generic, &data(2 * 2 * 9, 1), 2, 2, 9, 1).unwrap();
        let refs: Vec<&PackedB> = packs.iter().collect();
        let x = data(16 * 2, 2);
        let c = Conv {
            window: &win,
            batch: 1,
            in_channels: 2,
            out_channels: 2,
            groups: 1,
            x: &x,
            weights: ConvWeights::Packed(&refs),
            bias: None,
            activation: Activation::None,
            residual: None,
            after: Activation::None,
        };
        let mut y = vec![0.0; 31];
        assert!(conv(isa, &c, &mut y, &Serial).is_err());
        let mut bad = win;
        bad.h.output = 5;
        assert!(!window_ok(&bad));
        assert!(pack_groups(Target::Generic, &[0.0; 5], 2, 2, 9, 1).is_err());
    }
}
