//! What the spatial ops (convolutions, pools, resize) share at import: the
//! window attributes (`kernel_shape`, `strides`, `dilations`, `pads`,
//! `auto_pad`) resolved against the input's sizes, and the move between
//! ONNX's channels-first tensors and kiln's channels-last `[N, H, W, C]`
//! (see `kernels::spatial`).

use super::attrs::{attr_int, attr_ints, attr_str};
use crate::ir::desc::NodeDesc;
use crate::ir::import::{Importer, Why};
use crate::ir::{Op, ValueId};
use crate::kernels::spatial::{output_len, Axis, Window};

/// The window of a 1-D or 2-D op over spatial sizes `input` (one or two),
/// with `kernel` taken from the weights (convolutions) or the
/// `kernel_shape` attribute (pools, `None` here).
pub(crate) fn window(n: &NodeDesc, input: &[usize], kernel: Option<&[usize]>, ceil_mode: bool) -> Result<Window, Why> {
    let rank = input.len();
    let kernel_from_weights = kernel.is_some();
    if !(1..=2).contains(&rank) {
        return Err(format!("kiln runs 1-D and 2-D {} only, not {rank}-D", n.op_type));
    }
    let kernel = match (attr_ints(n, "kernel_shape")?, kernel) {
        (Some(k), Some(w)) if !same(&k, w) => {
            return Err(format!("kernel_shape {k:?} disagrees with the weights' {w:?}"))
        }
        (Some(k), _) => positive(&k, rank, "kernel_shape")?,
        (None, Some(w)) => w.to_vec(),
        (None, None) => return Err("kernel_shape is missing".into()),
    };
    let strides = per_axis(n, "strides", rank)?;
    let dilations = per_axis(n, "dilations", rank)?;
    let pads = pads(n, input, &kernel, &strides, &dilations)?;
    let axis = |i: usize| -> Result<Axis, Why> {
        let p = (pads[i], pads[i + rank]);
        let exact = output_len(input[i], kernel[i], strides[i], dilations[i], p, ceil_mode);
        // Pools only: a convolution's kernels need every window inside the padded input.
        let overhang = || match kernel_from_weights {
            true => None,
            false => overhanging_output(input[i], kernel[i], strides[i], dilations[i], p, ceil_mode),
        };
        let output = exact.or_else(overhang).ok_or_else(|| {
            format!(
                "{} window of {} (dilation {}) is longer than the padded input {}",
                n.op_type,
                kernel[i],
                dilations[i],
                input[i] + p.0 + p.1
            )
        })?;
        Ok(Axis {
            input: input[i],
            output,
            kernel: kernel[i],
            stride: strides[i],
            dilation: dilations[i],
            pad_begin: p.0,
            pad_end: p.1,
        })
    };
    let unit = Axis {
        input: 1,
        output: 1,
        kernel: 1,
        stride: 1,
        dilation: 1,
        pad_begin: 0,
        pad_end: 0,
    };
    Ok(match rank {
        1 => Window { h: unit, w: axis(0)? },
        _ => Window {
            h: axis(0)?,
            w: axis(1)?,
        },
    })
}

/// A pool's output length when its window is longer than the padded input,
/// as ORT computes it (the C++ integer division truncates toward zero): 1,
/// one window over what there is, when the overhang is under a stride,
/// else 0 (an empty output); `None` (ORT's "negative output dimension")
/// beyond that.
fn overhanging_output(
    input: usize,
    kernel: usize,
    stride: usize,
    dilation: usize,
    pads: (usize, usize),
    ceil_mode: bool,
) -> Option<usize> {
    let extent = (kernel.checked_sub(1)? * dilation + 1) as i64;
    let span = (input + pads.0 + pads.1) as i64 - extent;
    let stride = stride.max(1) as i64;
    let out = if ceil_mode {
        let out = (span as f64 / stride as f64 + 1.0).ceil() as i64;
        if (out - 1) * stride >= (input + pads.0) as i64 {
            out - 1
        } else {
            out
        }
    } else {
        span / stride + 1
    };
    usize::try_from(out).ok()
}

fn same(a: &[i64], b: &[usize]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(&x, &y)| x == y as i64)
}

fn positive(v: &[i64], rank: usize, what: &str) -> Result<Vec<usize>, Why> {
    if v.len() != rank || v.iter().any(|&x| x < 1) {
        return Err(format!("{what} {v:?} is not {rank} positive values"));
    }
    Ok(v.iter().map(|&x| x as usize).collect())
}

/// `strides` or `dilations`: default 1 per axis.
fn per_axis(n: &NodeDesc, name: &str, rank: usize) -> Result<Vec<usize>, Why> {
    match attr_ints(n, name)? {
        None => Ok(vec![1; rank]),
        Some(v) => positive(&v, rank, name),
    }
}

/// Begin pads then end pads, from `pads` or `auto_pad`.
fn pads(
    n: &NodeDesc,
    input: &[usize],
    kernel: &[usize],
    strides: &[usize],
    dilations: &[usize],
) -> Result<Vec<usize>, Why> {
    let rank = input.len();
    match attr_str(n, "auto_pad", "NOTSET")? {
        "NOTSET" => match attr_ints(n, "pads")? {
            None => Ok(vec![0; 2 * rank]),
            Some(p) if p.len() == 2 * rank && p.iter().all(|&x| x >= 0) => Ok(p.iter().map(|&x| x as usize).collect()),
            Some(p) => Err(format!("pads {p:?} is not {} non-negative values", 2 * rank)),
        },
        "VALID" => Ok(vec![0; 2 * rank]),
        mode @ ("SAME_UPPER" | "SAME_LOWER") => {
            let mut out = vec![0; 2 * rank];
            for i in 0..rank {
                let extent = (kernel[i] - 1) * dilations[i] + 1;
                let len = input[i].div_ceil(strides[i]);
                let total = ((len - 1) * strides[i] + extent).saturating_sub(input[i]);
                let small = total / 2;
                let (begin, end) = if mode == "SAME_UPPER" {
                    (small, total - small)
                } else {
                    (total - small, small)
                };
                out[i] = begin;
                out[i + rank] = end;
            }
            Ok(out)
        }
        other => Err(format!("auto_pad {other} is not a mode ONNX defines")),
    }
}

/// Whether the node sets `ceil_mode` (pools).
pub(crate) fn ceil_mode(n: &NodeDesc) -> Result<bool, Why> {
    Ok(attr_int(n, "ceil_mode", 0)? != 0)
}

/// `x` (`[N, C, L]` or `[N, C, H, W]`) as channels-last `[N, H, W, C]`
/// (`H = 1` for 1-D).
pub(crate) fn channels_last(imp: &mut Importer, n: &NodeDesc, x: ValueId) -> Result<ValueId, Why> {
    let shape = imp.ty(x).shape.clone();
    let x4 = match shape.len() {
        3 => imp.emit(n, Op::Reshape, &[x], None, Some(&[shape[0], shape[1], 1, shape[2]]))?,
        4 => x,
        r => return Err(format!("{} input of rank {r}: kiln runs 1-D and 2-D only", n.op_type)),
    };
    imp.emit(n, Op::Transpose { perm: vec![0, 2, 3, 1] }, &[x4], None, None)
}

/// Channels-last `y` back to ONNX's layout of rank `rank` (3 or 4), bound
/// to output `out` when given.
pub(crate) fn channels_first(
    imp: &mut Importer,
    n: &NodeDesc,
    y: ValueId,
    rank: usize,
    out: Option<&str>,
) -> Result<ValueId, Why> {
    let perm = Op::Transpose { perm: vec![0, 3, 1, 2] };
    if rank == 4 {
        return imp.emit(n, perm, &[y], out, None);
    }
    let t = imp.emit(n, perm, &[y], None, None)?;
    let s = imp.ty(t).shape.clone();
    imp.emit(n, Op::Reshape, &[t], out, Some(&[s[0], s[1], s[3]]))
}
