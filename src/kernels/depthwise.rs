//! Depthwise convolution (`group == channels`, one filter per channel) over
//! channels-last `[N, H, W, C]` activations, with the convolution's fused
//! epilogue: `y = act(conv(x) + bias) + residual`.
//!
//! Weights are tap-major, `[kh * kw, C]`, so each tap is one contiguous
//! channel vector.

use super::gemm::{activate, Activation};
use super::parallel::Parallel;
use super::spatial::Window;

/// One depthwise convolution's operands.
pub struct Depthwise<'a> {
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

/// `y` (`[batch, h.output, w.output, channels]`) = the convolution, one
/// task per output row.
pub fn depthwise(d: &Depthwise<'_>, y: &mut [f32], par: &dyn Parallel) {
    let (win, c) = (d.window, d.channels);
    let row_len = win.w.output * c;
    let rows = d.batch * win.h.output;
    assert_eq!(y.len(), rows * row_len, "depthwise output size");
    super::par_rows(par, rows, row_len, y, &|range, chunk| {
        for (r, row) in range.zip(chunk.chunks_mut(row_len)) {
            output_row(d, r / win.h.output, r % win.h.output, row);
        }
    });
}

/// Output row `oh` of image `n` (reference loops; `c`-contiguous inner loop).
fn output_row(d: &Depthwise<'_>, n: usize, oh: usize, row: &mut [f32]) {
    let (win, c) = (d.window, d.channels);
    let image = &d.x[n * win.input_pixels() * c..][..win.input_pixels() * c];
    for ow in 0..win.w.output {
        let acc = &mut row[ow * c..][..c];
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
                    *a += x * w;
                }
            }
        }
        activate(d.activation, acc);
        if let Some(res) = d.residual {
            let base = ((n * win.h.output + oh) * win.w.output + ow) * c;
            for (a, &r) in acc.iter_mut().zip(&res[base..base + c]) {
                *a += r;
            }
        }
    }
}
