//! Max and average pools over channels-last `[N, H, W, C]` activations:
//! every tap is one contiguous channel vector, so the inner loops run over
//! channels (vectorised by the compiler), one task per output row.

use std::ops::Range;

use super::parallel::Parallel;
use super::spatial::{Axis, Window};
use super::Isa;

/// What a pool computes per window.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PoolKind {
    Max,
    /// Divides by every tap inside the explicitly padded input when
    /// `count_include_pad`, else by the taps inside the input.
    Average {
        count_include_pad: bool,
    },
    /// MaxPool's `Indices` output (int64): the first maximum's flat index
    /// into the NCHW input, row-major, or with H and W swapped when
    /// `column_major` (ONNX `storage_order = 1`).
    MaxIndex {
        column_major: bool,
    },
}

/// One pool's shape: `batch` images of `window.h.input × window.w.input`
/// pixels of `channels`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PoolShape {
    pub window: Window,
    pub batch: usize,
    pub channels: usize,
}

impl PoolShape {
    pub fn src_len(&self) -> Option<usize> {
        let w = &self.window;
        [w.h.input, w.w.input, self.channels]
            .iter()
            .try_fold(self.batch, |n, &d| n.checked_mul(d))
    }

    pub fn dst_len(&self) -> Option<usize> {
        let w = &self.window;
        [w.h.output, w.w.output, self.channels]
            .iter()
            .try_fold(self.batch, |n, &d| n.checked_mul(d))
    }

    /// Whether the window is one `run` can execute without reading out of
    /// bounds (positive kernel, stride and dilation).
    pub fn is_valid(&self) -> bool {
        let ok = |a: &Axis| a.kernel > 0 && a.stride > 0 && a.dilation > 0 && a.input > 0;
        ok(&self.window.h) && ok(&self.window.w) && self.src_len().is_some() && self.dst_len().is_some()
    }
}

/// `y` = the pool of `x` (f32 max or average), in `isa`'s build of the loops.
pub fn pool(isa: Isa, kind: PoolKind, s: &PoolShape, x: &[f32], y: &mut [f32], par: &dyn Parallel) {
    let row_len = s.window.w.output * s.channels;
    let rows = s.batch * s.window.h.output;
    assert_eq!(y.len(), rows * row_len, "pool output size");
    assert_eq!(Some(x.len()), s.src_len(), "pool input size");
    super::par_rows(par, rows, row_len, y, &|range, chunk| {
        super::pool_rows_isa(isa, kind, s, x, range.start, chunk)
    });
}

/// Output rows `first..` (as many as `y` holds) of a max or average pool.
#[inline(always)]
pub(super) fn pool_rows(kind: PoolKind, s: &PoolShape, x: &[f32], first: usize, y: &mut [f32]) {
    let (win, c) = (&s.window, s.channels);
    let image_len = win.input_pixels() * c;
    for (r, row) in (first..).zip(y.chunks_mut(win.w.output * c)) {
        let image = &x[(r / win.h.output) * image_len..][..image_len];
        let oh = r % win.h.output;
        match c {
            64.. => pool_row::<64>(kind, win, c, image, oh, row),
            32.. => pool_row::<32>(kind, win, c, image, oh, row),
            16.. => pool_row::<16>(kind, win, c, image, oh, row),
            8.. => pool_row::<8>(kind, win, c, image, oh, row),
            _ => pool_row::<1>(kind, win, c, image, oh, row),
        }
    }
}

/// The taps `k` of output `o` that read inside the input.
#[inline(always)]
fn tap_range(a: &Axis, o: usize) -> Range<usize> {
    let start = o * a.stride;
    let lo = a.pad_begin.saturating_sub(start).div_ceil(a.dilation);
    let hi = (a.input + a.pad_begin).saturating_sub(start).div_ceil(a.dilation);
    lo.min(a.kernel)..hi.min(a.kernel)
}

/// The input index of tap `k` of output `o` (inside [`tap_range`]).
#[inline(always)]
fn tap(a: &Axis, o: usize, k: usize) -> usize {
    o * a.stride + k * a.dilation - a.pad_begin
}

/// `y` = MaxPool's indices (int64, see [`PoolKind::MaxIndex`]).
pub fn max_indices(column_major: bool, s: &PoolShape, x: &[f32], y: &mut [i64], par: &dyn Parallel) {
    let (win, c) = (&s.window, s.channels);
    let row_len = win.w.output * c;
    let rows = s.batch * win.h.output;
    assert_eq!(y.len(), rows * row_len, "pool output size");
    assert_eq!(Some(x.len()), s.src_len(), "pool input size");
    let (ih, iw) = (win.h.input, win.w.input);
    let pixel = |h: i64, w: i64| {
        if column_major {
            w * ih as i64 + h
        } else {
            h * iw as i64 + w
        }
    };
    super::par_rows(par, rows, row_len, y, &|range, chunk| {
        let mut best = vec![0f32; c];
        for (r, row) in range.zip(chunk.chunks_mut(row_len)) {
            let (n, oh) = (r / win.h.output, r % win.h.output);
            let image = &x[n * win.input_pixels() * c..][..win.input_pixels() * c];
            for (ow, out) in row.chunks_mut(c).enumerate() {
                best.fill(f32::MIN);
                out.fill(pixel(-1, -1));
                for (i, (h, w)) in taps(win, oh, ow).enumerate() {
                    let at = pixel(h as i64, w as i64);
                    let xs = &image[(h * iw + w) * c..][..c];
                    for ((b, o), &v) in best.iter_mut().zip(out.iter_mut()).zip(xs) {
                        // The first tap starts the maximum, NaN or not (as ORT).
                        if i == 0 || v > *b {
                            *b = v;
                            *o = at;
                        }
                    }
                }
                for (ch, o) in out.iter_mut().enumerate() {
                    *o += ((n * c + ch) * ih * iw) as i64;
                }
            }
        }
    });
}

/// The input pixels (h, w) output pixel (oh, ow) reads, padding skipped.
fn taps(win: &Window, oh: usize, ow: usize) -> impl Iterator<Item = (usize, usize)> + '_ {
    (0..win.h.kernel)
        .filter_map(move |kh| win.h.source(oh, kh))
        .flat_map(move |h| {
            (0..win.w.kernel)
                .filter_map(move |kw| win.w.source(ow, kw))
                .map(move |w| (h, w))
        })
}

/// One output pixel's window: `rows × cols` taps, `row_step` and
/// `col_step` floats apart, the first at `first`.
struct Taps {
    first: usize,
    rows: usize,
    cols: usize,
    row_step: usize,
    col_step: usize,
}

/// One output row of a max or average pool, `W` channels at a time: a
/// fixed width keeps the accumulator in registers (accumulating in memory
/// stalls each tap on the previous tap's store). The last group of
/// channels overlaps the one before when `W` does not divide `c`.
#[inline(always)]
fn pool_row<const W: usize>(kind: PoolKind, win: &Window, c: usize, image: &[f32], oh: usize, row: &mut [f32]) {
    let (hs, iw) = (tap_range(&win.h, oh), win.w.input);
    let (lo, hi) = win.w.interior_outputs();
    for (ow, out) in row.chunks_mut(c).enumerate() {
        // Only border windows pay for the divisions of tap_range.
        let ws = if (lo..hi).contains(&ow) {
            0..win.w.kernel
        } else {
            tap_range(&win.w, ow)
        };
        if hs.is_empty() || ws.is_empty() {
            // A window of padding only (none with pads smaller than the kernel)
            // gives the lowest value or a zero sum.
            out.fill(if kind == PoolKind::Max { f32::MIN } else { 0.0 });
            continue;
        }
        let taps = Taps {
            first: (tap(&win.h, oh, hs.start) * iw + tap(&win.w, ow, ws.start)) * c,
            rows: hs.len(),
            cols: ws.len(),
            row_step: win.h.dilation * iw * c,
            col_step: win.w.dilation * c,
        };
        let divisor = match kind {
            PoolKind::Average {
                count_include_pad: true,
            } => padded_taps(&win.h, oh) * padded_taps(&win.w, ow),
            _ => hs.len() * ws.len(),
        } as f32;
        for c0 in (0..c).step_by(W) {
            let c0 = c0.min(c - W);
            let group: &mut [f32; W] = (&mut out[c0..c0 + W]).try_into().expect("W channels");
            *group = match kind {
                PoolKind::Average { .. } => sum_window(image, &taps, c0).map(|a| a / divisor),
                _ => max_window(image, &taps, c0),
            };
        }
    }
}

/// The maximum over a window of channels `c0..c0 + W`. The first tap
/// starts the maximum, NaN or not, as ORT's indices path does.
#[inline(always)]
fn max_window<const W: usize>(image: &[f32], t: &Taps, c0: usize) -> [f32; W] {
    let first = image[t.first + c0..][..W].try_into().expect("W channels");
    fold_window(image, t, c0, first, |a, v| if v > a { v } else { a })
}

/// The sum over a window of channels `c0..c0 + W`, taps in row-major order.
#[inline(always)]
fn sum_window<const W: usize>(image: &[f32], t: &Taps, c0: usize) -> [f32; W] {
    fold_window(image, t, c0, [0.0; W], |a, v| a + v)
}

/// `acc` folded with `step` over every tap of a window, channels
/// `c0..c0 + W`, taps in row-major order.
#[inline(always)]
fn fold_window<const W: usize>(
    image: &[f32],
    t: &Taps,
    c0: usize,
    mut acc: [f32; W],
    step: impl Fn(f32, f32) -> f32,
) -> [f32; W] {
    for i in 0..t.rows {
        let line = t.first + c0 + i * t.row_step;
        for j in 0..t.cols {
            let xs = &image[line + j * t.col_step..][..W];
            for (a, &v) in acc.iter_mut().zip(xs) {
                *a = step(*a, v);
            }
        }
    }
    acc
}

/// Taps of output `o` inside the explicitly padded input (a `ceil_mode`
/// window may hang past the end padding; those taps do not count).
fn padded_taps(a: &Axis, o: usize) -> usize {
    let end = a.input + a.pad_begin + a.pad_end;
    (0..a.kernel).filter(|&k| o * a.stride + k * a.dilation < end).count()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::parallel::Serial;
    use crate::kernels::spatial::output_len;
    use crate::target::Target;

    fn isa() -> Isa {
        Isa::new(Target::Generic).unwrap()
    }

    fn axis(input: usize, kernel: usize, stride: usize, pads: (usize, usize), ceil: bool) -> Axis {
        Axis {
            input,
            output: output_len(input, kernel, stride, 1, pads, ceil).unwrap(),
            kernel,
            stride,
            dilation: 1,
            pad_begin: pads.0,
            pad_end: pads.1,
        }
    }

    fn shape(h: Axis, w: Axis, channels: usize) -> PoolShape {
        PoolShape {
            window: Window { h, w },
            batch: 1,
            channels,
        }
    }

    #[test]
    fn max_and_average_over_channels_last() {
        // 1x3 image, 2 channels: [[1, 10], [2, 20], [3, 30]], k2 s1 pad (1, 0).
        let unit = axis(1, 1, 1, (0, 0), false);
        let s = shape(unit, axis(3, 2, 1, (1, 0), false), 2);
        let x = [1.0, 10.0, 2.0, 20.0, 3.0, 30.0];
        let mut y = [0.0; 6];
        pool(isa(), PoolKind::Max, &s, &x, &mut y, &Serial);
        assert_eq!(y, [1.0, 10.0, 2.0, 20.0, 3.0, 30.0]);
        pool(
            isa(),
            PoolKind::Average {
                count_include_pad: true,
            },
            &s,
            &x,
            &mut y,
            &Serial,
        );
        assert_eq!(y, [0.5, 5.0, 1.5, 15.0, 2.5, 25.0]);
        pool(
            isa(),
            PoolKind::Average {
                count_include_pad: false,
            },
            &s,
            &x,
            &mut y,
            &Serial,
        );
        assert_eq!(y, [1.0, 10.0, 1.5, 15.0, 2.5, 25.0]);
    }

    #[test]
    fn indices_are_nchw_flat() {
        // 2x2 image of 2 channels, one 2x2 window: channel 0's max at (1, 0),
        // channel 1's at (0, 1).
        let s = shape(axis(2, 2, 1, (0, 0), false), axis(2, 2, 1, (0, 0), false), 2);
        let x = [0.0, 0.0, 1.0, 5.0, 7.0, 1.0, 2.0, 2.0];
        let mut y = [0i64; 2];
        max_indices(false, &s, &x, &mut y, &Serial);
        assert_eq!(y, [2, 4 + 1]);
        max_indices(true, &s, &x, &mut y, &Serial);
        assert_eq!(y, [1, 4 + 2]);
    }

    #[test]
    fn ceil_mode_overhang_is_not_counted() {
        // Length 5, k2 s2 ceil: the last window covers index 4 and one tap past the end.
        let unit = axis(1, 1, 1, (0, 0), false);
        let s = shape(unit, axis(5, 2, 2, (0, 0), true), 1);
        let x = [1.0, 3.0, 5.0, 7.0, 9.0];
        let mut y = [0.0; 3];
        pool(
            isa(),
            PoolKind::Average {
                count_include_pad: true,
            },
            &s,
            &x,
            &mut y,
            &Serial,
        );
        assert_eq!(y, [2.0, 6.0, 9.0]);
    }

    /// A pool straight from the definition, one output value at a time.
    fn reference(kind: PoolKind, s: &PoolShape, x: &[f32]) -> Vec<f32> {
        let (win, c) = (&s.window, s.channels);
        let mut y = Vec::new();
        for oh in 0..win.h.output {
            for ow in 0..win.w.output {
                for ch in 0..c {
                    let vals: Vec<f32> = taps(win, oh, ow)
                        .map(|(h, w)| x[(h * win.w.input + w) * c + ch])
                        .collect();
                    y.push(match kind {
                        PoolKind::Average { count_include_pad } => {
                            let n = if count_include_pad {
                                padded_taps(&win.h, oh) * padded_taps(&win.w, ow)
                            } else {
                                vals.len()
                            };
                            vals.iter().sum::<f32>() / n.max(1) as f32
                        }
                        _ => vals
                            .into_iter()
                            .reduce(|a, v| if v > a { v } else { a })
                            .unwrap_or(f32::MIN),
                    });
                }
            }
        }
        y
    }

    #[test]
    fn every_target_matches_the_definition() {
        let isas: Vec<Isa> = Target::ALL.into_iter().filter_map(Isa::new).collect();
        let kinds = [
            PoolKind::Max,
            PoolKind::Average {
                count_include_pad: false,
            },
            PoolKind::Average {
                count_include_pad: true,
            },
        ];
        // (size, kernel, stride, dilation, pads, ceil): padded, strided, dilated and ceil_mode windows.
        let windows = [
            (9, 3, 2, 1, (0, 0), false),
            (8, 3, 2, 1, (1, 1), false),
            (7, 3, 1, 2, (2, 1), false),
            (6, 2, 2, 1, (0, 1), true),
            (5, 5, 1, 1, (2, 2), false),
        ];
        // Channel counts for every vector width, with and without an overlapping last group.
        for channels in [1, 5, 8, 19, 32, 64, 70, 130] {
            for &(n, k, st, d, pads, ceil) in &windows {
                let mut a = axis(n, k, st, pads, ceil);
                a.dilation = d;
                a.output = output_len(n, k, st, d, pads, ceil).unwrap();
                let s = shape(a, a, channels);
                let x: Vec<f32> = (0..s.src_len().unwrap())
                    .map(|i| ((i * 7919) % 211) as f32 - 100.0)
                    .collect();
                for kind in kinds {
                    let want = reference(kind, &s, &x);
                    for &isa in &isas {
                        let mut y = vec![f32::NAN; s.dst_len().unwrap()];
                        pool(isa, kind, &s, &x, &mut y, &Serial);
                        assert_eq!(y, want, "{isa:?} {kind:?} c{channels} {n}/{k}/{st}/{d} {pads:?} {ceil}");
                    }
                }
            }
        }
    }
}
