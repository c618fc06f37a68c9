//! Resize of channels-last `[N, H, W, C]` activations along H and W:
//! nearest, linear and cubic interpolation with ONNX's coordinate
//! transformations, computed in f32 as ORT's CPU EP computes them.
//!
//! Each axis becomes a table of taps (source index, weight) per output
//! index; an output pixel is the weighted sum of its taps' channel vectors.

use super::parallel::Parallel;
use super::Isa;

/// How ONNX's `nearest_mode` rounds a source coordinate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NearestMode {
    RoundPreferFloor,
    RoundPreferCeil,
    Floor,
    Ceil,
    /// Resize-10 and Upsample: ceil when downsampling, else truncate.
    Simple,
}

/// The interpolation (`mode`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Interp {
    Nearest(NearestMode),
    Linear,
    Cubic { a: f32, exclude_outside: bool },
}

/// ONNX's `coordinate_transformation_mode` (tf_crop_and_resize excepted).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CoordMode {
    HalfPixel,
    HalfPixelSymmetric,
    PytorchHalfPixel,
    AlignCorners,
    Asymmetric,
    TfHalfPixelForNn,
}

/// One resized axis: lengths and the scale the coordinates use.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ResizeAxis {
    pub input: usize,
    pub output: usize,
    pub scale: f32,
}

/// A resize of H and W.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ResizeAttrs {
    pub interp: Interp,
    pub coord: CoordMode,
    pub h: ResizeAxis,
    pub w: ResizeAxis,
}

impl ResizeAttrs {
    /// Whether `run` can execute it (non-empty input to read from; finite,
    /// positive scales).
    pub fn is_valid(&self) -> bool {
        let ok = |a: &ResizeAxis| (a.input > 0 || a.output == 0) && a.scale.is_finite() && a.scale > 0.0;
        let interp_ok = match self.interp {
            Interp::Cubic { a, .. } => a.is_finite(),
            _ => true,
        };
        ok(&self.h) && ok(&self.w) && interp_ok
    }
}

/// The source coordinate of output index `x` (ORT's f32 formulas).
fn source_coord(mode: CoordMode, x: usize, a: &ResizeAxis) -> f32 {
    let (x, scale) = (x as f32, a.scale);
    let (len_in, len_out) = (a.input as f32, a.output as f32);
    match mode {
        CoordMode::HalfPixel => (x + 0.5) / scale - 0.5,
        CoordMode::HalfPixelSymmetric => {
            let adjustment = len_out / (scale * len_in);
            let offset = len_in / 2.0 * (1.0 - adjustment);
            // Where ORT 1.31 rounds to f32 and where it keeps double, found
            // by comparing its nearest indices near ties (test_ops_resize).
            let shifted = (f64::from(offset) + (f64::from(x) + 0.5) / f64::from(scale)) as f32;
            shifted - 0.5
        }
        CoordMode::PytorchHalfPixel if a.output > 1 => (x + 0.5) / scale - 0.5,
        CoordMode::PytorchHalfPixel => 0.0,
        CoordMode::AlignCorners if a.output == 1 => 0.0,
        CoordMode::AlignCorners => x * (len_in - 1.0) / (len_out - 1.0),
        CoordMode::Asymmetric => x / scale,
        CoordMode::TfHalfPixelForNn => (x + 0.5) / scale,
    }
}

fn nearest(mode: NearestMode, x: f32, downsample: bool) -> i64 {
    match mode {
        NearestMode::RoundPreferFloor if x == (x as i64) as f32 + 0.5 => x as i64,
        NearestMode::RoundPreferFloor | NearestMode::RoundPreferCeil => x.round() as i64,
        NearestMode::Floor => x.floor() as i64,
        NearestMode::Ceil => x.ceil() as i64,
        NearestMode::Simple if downsample => x.ceil() as i64,
        NearestMode::Simple => x as i64,
    }
}

/// ONNX's cubic convolution weights of the taps at `floor(x) - 1 + i`.
fn cubic_coeffs(s: f32, a: f32) -> [f32; 4] {
    let (s1, t, t1) = (s + 1.0, 1.0 - s, 2.0 - s);
    [
        ((a * s1 - 5.0 * a) * s1 + 8.0 * a) * s1 - 4.0 * a,
        ((a + 2.0) * s - (a + 3.0)) * s * s + 1.0,
        ((a + 2.0) * t - (a + 3.0)) * t * t + 1.0,
        ((a * t1 - 5.0 * a) * t1 + 8.0 * a) * t1 - 4.0 * a,
    ]
}

/// Per output index of one axis, `per` taps of (source index, weight).
pub(super) struct Taps {
    per: usize,
    index: Vec<usize>,
    weight: Vec<f32>,
}

fn clamp(i: i64, len: usize) -> usize {
    i.clamp(0, len as i64 - 1) as usize
}

fn axis_taps(r: &ResizeAttrs, a: &ResizeAxis) -> Taps {
    let per = match r.interp {
        Interp::Nearest(_) => 1,
        Interp::Linear => 2,
        Interp::Cubic { .. } => 4,
    };
    let mut t = Taps {
        per,
        index: Vec::with_capacity(a.output * per),
        weight: Vec::with_capacity(a.output * per),
    };
    for o in 0..a.output {
        let x = source_coord(r.coord, o, a);
        match r.interp {
            Interp::Nearest(mode) => {
                t.index.push(clamp(nearest(mode, x, a.scale < 1.0), a.input));
                t.weight.push(1.0);
            }
            Interp::Linear => {
                let x = x.clamp(0.0, (a.input - 1) as f32);
                let x1 = (x as usize).min(a.input - 1);
                let x2 = (x1 + 1).min(a.input - 1);
                let (d1, d2) = if x1 == x2 {
                    (0.5, 0.5)
                } else {
                    ((x - x1 as f32).abs(), (x - x2 as f32).abs())
                };
                t.index.extend([x1, x2]);
                t.weight.extend([d2, d1]);
            }
            Interp::Cubic {
                a: coeff,
                exclude_outside,
            } => {
                let base = x.floor();
                let mut w = cubic_coeffs(x - base, coeff);
                let first = base as i64 - 1;
                let inside = |i: usize| (0..a.input as i64).contains(&(first + i as i64));
                if exclude_outside {
                    (0..4).filter(|&i| !inside(i)).for_each(|i| w[i] = 0.0);
                    let sum: f32 = w.iter().sum();
                    if sum != 0.0 {
                        w.iter_mut().for_each(|v| *v /= sum);
                    }
                }
                t.index.extend((0..4).map(|i| clamp(first + i as i64, a.input)));
                t.weight.extend(w);
            }
        }
    }
    t
}

/// `y` (`[batch, h.output, w.output, channels]`, pixels `ldo >= channels`
/// values apart: more when the resize writes its channels of a concat's
/// output, YOLOv8's upsampling before each neck concat) = the resize of `x`
/// (`[batch, h.input, w.input, channels]`), one task per output row, in
/// `isa`'s build of the loops. Values between a pixel's channels and the
/// next pixel are left alone.
#[allow(clippy::too_many_arguments)]
pub fn resize(
    isa: Isa,
    r: &ResizeAttrs,
    batch: usize,
    channels: usize,
    x: &[f32],
    y: &mut [f32],
    ldo: usize,
    par: &dyn Parallel,
) {
    let row_len = r.w.output * ldo;
    let rows = batch * r.h.output;
    let pixels = rows * r.w.output;
    assert!(ldo >= channels, "resize output pixel stride");
    assert_eq!(
        Some(y.len()),
        super::conv::strided_len(pixels, ldo, channels),
        "resize output size"
    );
    assert_eq!(x.len(), batch * r.h.input * r.w.input * channels, "resize input size");
    if y.is_empty() {
        return;
    }
    let taps = [axis_taps(r, &r.h), axis_taps(r, &r.w)];
    super::par_rows(par, rows, row_len, y, &|range, chunk| {
        super::resize_rows_isa(isa, r, &taps, (channels, ldo), x, range.start, chunk)
    });
}

/// Output rows `first..` (as many as `y` holds; the last may end after its
/// last pixel's `c` values) of a resize with the H and W tap tables `taps`,
/// output pixels `ldo` values apart.
#[inline(always)]
pub(super) fn resize_rows(
    r: &ResizeAttrs,
    taps: &[Taps; 2],
    (c, ldo): (usize, usize),
    x: &[f32],
    first: usize,
    y: &mut [f32],
) {
    let [th, tw] = taps;
    let (hin, win) = (r.h.input, r.w.input);
    let mut line = vec![0f32; c];
    for (row_i, row) in (first..).zip(y.chunks_mut(r.w.output * ldo)) {
        let (n, oh) = (row_i / r.h.output, row_i % r.h.output);
        let image = &x[n * hin * win * c..][..hin * win * c];
        for (ow, pixel) in row.chunks_mut(ldo).enumerate() {
            let out = &mut pixel[..c];
            if th.per == 1 && tw.per == 1 {
                let (ih, iw) = (th.index[oh], tw.index[ow]);
                out.copy_from_slice(&image[(ih * win + iw) * c..][..c]);
                continue;
            }
            out.fill(0.0);
            for i in 0..th.per {
                let (ih, wh) = (th.index[oh * th.per + i], th.weight[oh * th.per + i]);
                line.fill(0.0);
                for j in 0..tw.per {
                    let (iw, ww) = (tw.index[ow * tw.per + j], tw.weight[ow * tw.per + j]);
                    let xs = &image[(ih * win + iw) * c..][..c];
                    for (l, &v) in line.iter_mut().zip(xs) {
                        *l += ww * v;
                    }
                }
                for (o, &l) in out.iter_mut().zip(&line) {
                    *o += wh * l;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::parallel::Serial;

    fn attrs(interp: Interp, coord: CoordMode, input: usize, output: usize) -> ResizeAttrs {
        let unit = ResizeAxis {
            input: 1,
            output: 1,
            scale: 1.0,
        };
        ResizeAttrs {
            interp,
            coord,
            h: unit,
            w: ResizeAxis {
                input,
                output,
                scale: output as f32 / input as f32,
            },
        }
    }

    fn run(r: &ResizeAttrs, x: &[f32]) -> Vec<f32> {
        let mut y = vec![0.0; r.w.output];
        resize(
            Isa::new(crate::target::Target::Generic).unwrap(),
            r,
            1,
            1,
            x,
            &mut y,
            1,
            &Serial,
        );
        y
    }

    #[test]
    fn nearest_and_linear_upsampling() {
        let x = [1.0, 2.0, 4.0];
        let r = attrs(Interp::Nearest(NearestMode::Floor), CoordMode::Asymmetric, 3, 6);
        assert_eq!(run(&r, &x), [1.0, 1.0, 2.0, 2.0, 4.0, 4.0]);
        let r = attrs(Interp::Linear, CoordMode::AlignCorners, 3, 5);
        assert_eq!(run(&r, &x), [1.0, 1.5, 2.0, 3.0, 4.0]);
        // half_pixel: edges clamp, the middle interpolates.
        let r = attrs(Interp::Linear, CoordMode::HalfPixel, 3, 6);
        assert_eq!(run(&r, &x), [1.0, 1.25, 1.75, 2.5, 3.5, 4.0]);
    }

    /// Pixels `ldo` apart (a resize writing its channels of a concat's
    /// output) hold the dense result's values, on one and two threads, and
    /// the values between them are left alone.
    #[test]
    fn strided_output_matches_dense() {
        let (batch, c, ldo) = (2, 3, 7);
        let axis = |input, output| ResizeAxis {
            input,
            output,
            scale: output as f32 / input as f32,
        };
        for interp in [Interp::Nearest(NearestMode::Floor), Interp::Linear] {
            let r = ResizeAttrs {
                interp,
                coord: CoordMode::HalfPixel,
                h: axis(5, 10),
                w: axis(4, 8),
            };
            let x: Vec<f32> = (0..batch * 5 * 4 * c).map(|i| (i as f32 * 0.37).sin()).collect();
            let pixels = batch * 10 * 8;
            let isa = Isa::new(crate::target::Target::Generic).unwrap();
            let mut dense = vec![0.0; pixels * c];
            resize(isa, &r, batch, c, &x, &mut dense, c, &Serial);
            let threads = crate::kernels::parallel::ScopedThreads(2);
            for par in [&Serial as &dyn Parallel, &threads] {
                let mut y = vec![-9.0; (pixels - 1) * ldo + c];
                resize(isa, &r, batch, c, &x, &mut y, ldo, par);
                for (i, &v) in y.iter().enumerate() {
                    let (p, j) = (i / ldo, i % ldo);
                    let want = if j < c { dense[p * c + j] } else { -9.0 };
                    assert_eq!(v, want, "{interp:?} value {i}");
                }
            }
        }
    }

    #[test]
    fn cubic_at_integer_coordinates_copies() {
        let x = [1.0, 2.0, 4.0, 8.0];
        let r = attrs(
            Interp::Cubic {
                a: -0.75,
                exclude_outside: false,
            },
            CoordMode::Asymmetric,
            4,
            4,
        );
        assert_eq!(run(&r, &x), x);
    }

    #[test]
    fn round_prefer_floor_breaks_ties_down() {
        assert_eq!(nearest(NearestMode::RoundPreferFloor, 1.5, false), 1);
        assert_eq!(nearest(NearestMode::RoundPreferCeil, 1.5, false), 2);
        assert_eq!(nearest(NearestMode::Simple, 1.2, true), 2);
        assert_eq!(nearest(NearestMode::Simple, 1.7, false), 1);
    }
}
