//! Transposed convolution (ONNX `ConvTranspose`) over channels-last
//! `[N, H, W, C]` activations.
//!
//! Each input pixel's contribution to the output is one GEMM row:
//! `cols[N·H·W, kh·kw·Co/g] = x[N·H·W, Ci/g] · W[Ci/g, kh·kw·Co/g]` per
//! group, with `W` packed at compile time. The output then *gathers* its
//! taps from `cols` (col2im written per output pixel rather than as a
//! scatter), so output rows are independent tasks and need no locking.
//!
//! The window's axes are read the transposed way: `input` and `output` are
//! the ConvTranspose's, and input pixel `i`'s tap `k` lands on output
//! `i·stride + k·dilation − pad_begin` (`pad_end` is not needed: the output
//! length says where the output stops).

use super::gemm::{gemm_packed, Epilogue, PackedB};
use super::parallel::Parallel;
use super::spatial::{Axis, Window};
use super::Isa;
use crate::error::{Error, Result};

/// One transposed convolution's operands.
pub struct ConvTransposeArgs<'a> {
    pub window: &'a Window,
    pub batch: usize,
    pub groups: usize,
    /// Input channels (all groups).
    pub ci: usize,
    /// Output channels (all groups).
    pub co: usize,
    /// `[batch, h.input, w.input, ci]`.
    pub x: &'a [f32],
    /// Per group: `[ci / groups, kh · kw · co / groups]`, columns tap-major.
    pub w: &'a [&'a PackedB],
    /// `[co]`.
    pub bias: Option<&'a [f32]>,
}

impl ConvTransposeArgs<'_> {
    /// Columns of one group's GEMM: every tap's output channels.
    fn cols_per_group(&self) -> usize {
        self.window.taps() * (self.co / self.groups)
    }
}

/// Input index whose tap `k` lands on output `o`, if any.
#[inline]
fn source(a: &Axis, o: usize, k: usize) -> Option<usize> {
    let t = (o + a.pad_begin).checked_sub(k * a.dilation)?;
    if t % a.stride != 0 {
        return None;
    }
    let i = t / a.stride;
    (i < a.input).then_some(i)
}

/// `y` (`[batch, h.output, w.output, co]`) = the transposed convolution.
pub fn conv_transpose(isa: Isa, a: &ConvTransposeArgs<'_>, y: &mut [f32], par: &dyn Parallel) -> Result<()> {
    let win = a.window;
    let (g, ci, co) = (a.groups, a.ci, a.co);
    let bad = || Error::fail("kiln bug: ConvTranspose operands do not fit its parameters");
    if g == 0 || !ci.is_multiple_of(g) || !co.is_multiple_of(g) || a.w.len() != g {
        return Err(bad());
    }
    let (pixels, out_pixels) = (win.input_pixels(), win.output_pixels());
    let cols_n = a.cols_per_group();
    if a.x.len() != a.batch * pixels * ci
        || y.len() != a.batch * out_pixels * co
        || a.bias.is_some_and(|b| b.len() != co)
        || a.w.iter().any(|w| w.k() != ci / g || w.n() != cols_n)
    {
        return Err(bad());
    }
    let mut cols = vec![0.0f32; g * pixels * cols_n];
    for n in 0..a.batch {
        let image = &a.x[n * pixels * ci..][..pixels * ci];
        for (gi, w) in a.w.iter().enumerate() {
            let part = &mut cols[gi * pixels * cols_n..][..pixels * cols_n];
            if pixels > 0 {
                gemm_packed(
                    isa,
                    pixels,
                    &image[gi * (ci / g)..],
                    ci,
                    w,
                    part,
                    cols_n,
                    &Epilogue::PLAIN,
                    par,
                )?;
            }
        }
        let out = &mut y[n * out_pixels * co..][..out_pixels * co];
        gather(a, &cols, out, par);
    }
    Ok(())
}

/// One image's output from its `cols`, one task per output row.
fn gather(a: &ConvTransposeArgs<'_>, cols: &[f32], out: &mut [f32], par: &dyn Parallel) {
    let win = a.window;
    let row_len = win.w.output * a.co;
    super::par_rows(par, win.h.output, row_len, out, &|range, chunk| {
        for (oh, row) in range.zip(chunk.chunks_mut(row_len.max(1))) {
            output_row(a, cols, oh, row);
        }
    });
}

fn output_row(a: &ConvTransposeArgs<'_>, cols: &[f32], oh: usize, row: &mut [f32]) {
    let win = a.window;
    let (g, co) = (a.groups, a.co);
    let cog = co / g;
    let cols_n = a.cols_per_group();
    let group_len = win.input_pixels() * cols_n;
    for ow in 0..win.w.output {
        let acc = &mut row[ow * co..][..co];
        match a.bias {
            Some(b) => acc.copy_from_slice(b),
            None => acc.fill(0.0),
        }
        for kh in 0..win.h.kernel {
            let Some(ih) = source(&win.h, oh, kh) else { continue };
            for kw in 0..win.w.kernel {
                let Some(iw) = source(&win.w, ow, kw) else { continue };
                let at = (ih * win.w.input + iw) * cols_n + (kh * win.w.kernel + kw) * cog;
                for gi in 0..g {
                    let src = &cols[gi * group_len + at..][..cog];
                    for (d, &s) in acc[gi * cog..][..cog].iter_mut().zip(src) {
                        *d += s;
                    }
                }
            }
        }
    }
}

/// `w` in ONNX's layout `[ci, co / groups, kh, kw]` as each group's GEMM B
/// operand `[ci / groups, kh · kw · co / groups]` (row-major, tap-major
/// columns), ready for [`PackedB::pack`].
pub fn weight_matrices(w: &[f32], groups: usize, ci: usize, cog: usize, taps: usize) -> Vec<Vec<f32>> {
    let cig = ci / groups;
    (0..groups)
        .map(|gi| {
            let mut b = vec![0.0f32; cig * taps * cog];
            for c in 0..cig {
                for o in 0..cog {
                    for t in 0..taps {
                        b[(c * taps + t) * cog + o] = w[(((gi * cig + c) * cog) + o) * taps + t];
                    }
                }
            }
            b
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::parallel::Serial;
    use crate::target::Target;

    fn axis(input: usize, kernel: usize, stride: usize, dilation: usize, pad: usize, extra: usize) -> Axis {
        let output = stride * (input - 1) + (kernel - 1) * dilation + 1 + extra - 2 * pad;
        Axis {
            input,
            output,
            kernel,
            stride,
            dilation,
            pad_begin: pad,
            pad_end: pad,
        }
    }

    /// Scatter form straight from ONNX's definition, on ONNX-layout weights.
    #[allow(clippy::too_many_arguments)]
    fn reference(
        win: &Window,
        batch: usize,
        g: usize,
        ci: usize,
        co: usize,
        x: &[f32],
        w: &[f32],
        bias: &[f32],
    ) -> Vec<f32> {
        let (cig, cog) = (ci / g, co / g);
        let (ho, wo) = (win.h.output, win.w.output);
        let mut y = vec![0.0f32; batch * ho * wo * co];
        for n in 0..batch {
            for ih in 0..win.h.input {
                for iw in 0..win.w.input {
                    for c in 0..ci {
                        let xv = x[((n * win.h.input + ih) * win.w.input + iw) * ci + c];
                        let gi = c / cig;
                        for o in 0..cog {
                            for kh in 0..win.h.kernel {
                                for kw in 0..win.w.kernel {
                                    let oh =
                                        (ih * win.h.stride + kh * win.h.dilation) as isize - win.h.pad_begin as isize;
                                    let ow =
                                        (iw * win.w.stride + kw * win.w.dilation) as isize - win.w.pad_begin as isize;
                                    if oh < 0 || ow < 0 || oh as usize >= ho || ow as usize >= wo {
                                        continue;
                                    }
                                    let wv = w[((c * cog + o) * win.h.kernel + kh) * win.w.kernel + kw];
                                    y[((n * ho + oh as usize) * wo + ow as usize) * co + gi * cog + o] += xv * wv;
                                }
                            }
                        }
                    }
                }
            }
            for p in 0..ho * wo {
                for o in 0..co {
                    y[(n * ho * wo + p) * co + o] += bias[o];
                }
            }
        }
        y
    }

    fn values(len: usize, seed: usize) -> Vec<f32> {
        (0..len)
            .map(|i| (((i * 7 + seed * 13) % 23) as f32 - 11.0) / 8.0)
            .collect()
    }

    #[test]
    fn matches_the_definition() {
        let cases = [
            // (h axis, w axis, groups, ci, co)
            (axis(3, 2, 2, 1, 0, 0), axis(4, 2, 2, 1, 0, 0), 1, 3, 5),
            (axis(4, 3, 2, 1, 1, 1), axis(3, 3, 1, 2, 1, 0), 2, 4, 6),
            (axis(5, 4, 2, 1, 1, 0), axis(5, 4, 2, 1, 1, 0), 1, 2, 17),
            (axis(1, 1, 1, 1, 0, 0), axis(6, 5, 3, 1, 2, 2), 3, 3, 3),
        ];
        for isa in Target::ALL.into_iter().filter_map(Isa::new) {
            let target = isa.target();
            for (i, (h, w, g, ci, co)) in cases.iter().enumerate() {
                let win = Window { h: *h, w: *w };
                let batch = 2;
                let x = values(batch * win.input_pixels() * ci, i);
                let wt = values(ci * (co / g) * win.taps(), i + 1);
                let bias = values(*co, i + 2);
                let mats = weight_matrices(&wt, *g, *ci, co / g, win.taps());
                let packed: Vec<PackedB> = mats
                    .iter()
                    .map(|b| PackedB::pack(target, b, ci / g, win.taps() * (co / g), false))
                    .collect();
                let refs: Vec<&PackedB> = packed.iter().collect();
                let args = ConvTransposeArgs {
                    window: &win,
                    batch,
                    groups: *g,
                    ci: *ci,
                    co: *co,
                    x: &x,
                    w: &refs,
                    bias: Some(&bias),
                };
                let mut y = vec![f32::NAN; batch * win.output_pixels() * co];
                conv_transpose(isa, &args, &mut y, &Serial).unwrap();
                let want = reference(&win, batch, *g, *ci, *co, &x, &wt, &bias);
                for (k, (a, b)) in y.iter().zip(&want).enumerate() {
                    assert!(
                        (a - b).abs() <= 1e-4 * (1.0 + b.abs()),
                        "{target:?} case {i} at {k}: {a} vs {b}"
                    );
                }
            }
        }
    }
}
