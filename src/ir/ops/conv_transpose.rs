//! ConvTranspose (issue #13): 1-D and 2-D, f32, groups, strides,
//! dilations, pads, `auto_pad`, `output_padding`, `output_shape`, optional
//! bias; constant weights (packed for the GEMM at compile time).
//!
//! The output length per axis is `stride·(in−1) + output_padding +
//! (k−1)·dilation + 1 − pads`. Where the pads come from follows ORT's CPU
//! EP (checked by `test_ops_conv_transpose.py`): with `output_shape` (or
//! `auto_pad` SAME_*, whose output is `in·stride`) the total padding is the
//! difference, split with the odd one at the start except for SAME_UPPER;
//! `output_shape` overrides `pads`.

use super::attrs::{attr_int, attr_ints, attr_str};
use super::spatial::{channels_first, channels_last};
use super::OpFamily;
use crate::ir::desc::NodeDesc;
use crate::ir::import::{Importer, Why};
use crate::ir::{ConvTransposeAttrs, DType, Op};
use crate::kernels::spatial::{Axis, Window};

pub(super) const OPS: &[OpFamily] = &[OpFamily::new(&["ConvTranspose"], conv_transpose)];

/// The attributes of one spatial axis, before resolving the padding.
struct AxisAttrs {
    input: usize,
    kernel: usize,
    stride: usize,
    dilation: usize,
    output_padding: usize,
}

impl AxisAttrs {
    /// The output length without padding.
    fn full(&self) -> usize {
        self.stride * (self.input - 1) + self.output_padding + (self.kernel - 1) * self.dilation + 1
    }

    fn axis(&self, output: usize, pad_begin: usize) -> Axis {
        Axis {
            input: self.input,
            output,
            kernel: self.kernel,
            stride: self.stride,
            dilation: self.dilation,
            pad_begin,
            pad_end: self.full() - output - pad_begin,
        }
    }
}

fn conv_transpose(imp: &mut Importer, n: &NodeDesc, out: &str) -> Result<(), Why> {
    let x = imp.input(n, 0)?;
    let w = imp.input(n, 1)?;
    let xs = imp.ty(x).shape.clone();
    let ws = imp.ty(w).shape.clone();
    let rank = xs.len();
    if !(3..=4).contains(&rank) || ws.len() != rank {
        return Err(format!(
            "kiln runs 1-D and 2-D ConvTranspose only (x of rank {rank}, weights of rank {})",
            ws.len()
        ));
    }
    if imp.ty(x).dtype != DType::F32 || imp.ty(w).dtype != DType::F32 {
        return Err(format!("ConvTranspose of {}: kiln runs f32 only", imp.ty(x).dtype));
    }
    if !imp.is_constant(w) {
        return Err("the weights are not a constant (kiln packs them at compile time)".into());
    }
    let groups = usize::try_from(attr_int(n, "group", 1)?)
        .ok()
        .filter(|&g| g > 0)
        .ok_or("group must be positive")?;
    if ws[0] != xs[1] || !xs[1].is_multiple_of(groups) {
        return Err(format!(
            "weights {ws:?} do not fit {} input channels in {groups} group(s)",
            xs[1]
        ));
    }
    let window = window(n, &xs[2..], &ws[2..])?;
    let co = ws[1] * groups;
    let mut ins = vec![channels_last(imp, n, x)?, w];
    let bias = n.inputs.get(2).is_some_and(|s| !s.is_empty());
    if bias {
        let b = imp.input(n, 2)?;
        if imp.ty(b).shape != [co] {
            return Err(format!("bias {:?} is not [{co}]", imp.ty(b).shape));
        }
        ins.push(b);
    }
    let op = Op::ConvTranspose(Box::new(ConvTransposeAttrs { window, groups, bias }));
    let y = imp.emit(n, op, &ins, None, None)?;
    channels_first(imp, n, y, rank, Some(out))?;
    Ok(())
}

/// The window over spatial sizes `input` (one or two) with kernel `kernel`
/// (the weights' spatial dims).
fn window(n: &NodeDesc, input: &[usize], kernel: &[usize]) -> Result<Window, Why> {
    let rank = input.len();
    if let Some(k) = attr_ints(n, "kernel_shape")? {
        if k.len() != rank || k.iter().zip(kernel).any(|(&a, &b)| a != b as i64) {
            return Err(format!("kernel_shape {k:?} disagrees with the weights' {kernel:?}"));
        }
    }
    if input.contains(&0) || kernel.contains(&0) {
        return Err("ConvTranspose of an empty input or kernel".into());
    }
    let strides = ints(n, "strides", rank, 1, 1)?;
    let dilations = ints(n, "dilations", rank, 1, 1)?;
    let output_padding = ints(n, "output_padding", rank, 0, 0)?;
    let attrs: Vec<AxisAttrs> = (0..rank)
        .map(|i| AxisAttrs {
            input: input[i],
            kernel: kernel[i],
            stride: strides[i],
            dilation: dilations[i],
            output_padding: output_padding[i],
        })
        .collect();
    for a in &attrs {
        // ONNX allows up to max(stride, dilation) - 1, but ORT's CPU EP
        // fails at run time unless it is below the stride: leave it to ORT.
        if a.output_padding >= a.stride {
            return Err(format!(
                "output_padding {} is not less than the stride {} (ORT's CPU EP refuses it too)",
                a.output_padding, a.stride
            ));
        }
    }
    let axes = axes(n, &attrs)?;
    let unit = AxisAttrs {
        input: 1,
        kernel: 1,
        stride: 1,
        dilation: 1,
        output_padding: 0,
    }
    .axis(1, 0);
    match axes[..] {
        [w] => Ok(Window { h: unit, w }),
        [h, w] => Ok(Window { h, w }),
        _ => Err(format!("kiln runs 1-D and 2-D ConvTranspose only, not {rank}-D")),
    }
}

/// Each axis with its output length and padding resolved.
fn axes(n: &NodeDesc, attrs: &[AxisAttrs]) -> Result<Vec<Axis>, Why> {
    let rank = attrs.len();
    let mode = attr_str(n, "auto_pad", "NOTSET")?;
    if !["NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"].contains(&mode) {
        return Err(format!("auto_pad {mode} is not a mode ONNX defines"));
    }
    let upper = mode == "SAME_UPPER";
    let targets: Option<Vec<usize>> = match attr_ints(n, "output_shape")? {
        Some(s) if s.len() == rank && s.iter().all(|&d| d > 0) => Some(s.iter().map(|&d| d as usize).collect()),
        Some(s) => return Err(format!("output_shape {s:?} is not {rank} positive sizes")),
        None if mode.starts_with("SAME") => Some(attrs.iter().map(|a| a.input * a.stride).collect()),
        None => None,
    };
    if let Some(targets) = targets {
        return attrs
            .iter()
            .zip(targets)
            .map(|(a, out)| {
                let total = a.full().checked_sub(out).ok_or_else(|| {
                    format!(
                        "output size {out} is larger than ConvTranspose can produce ({})",
                        a.full()
                    )
                })?;
                let begin = if upper { total / 2 } else { total - total / 2 };
                Ok(a.axis(out, begin))
            })
            .collect();
    }
    let pads = match (mode, attr_ints(n, "pads")?) {
        ("VALID", _) | (_, None) => vec![0; 2 * rank],
        (_, Some(p)) if p.len() == 2 * rank && p.iter().all(|&x| x >= 0) => p.iter().map(|&x| x as usize).collect(),
        (_, Some(p)) => return Err(format!("pads {p:?} is not {} non-negative values", 2 * rank)),
    };
    attrs
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let out = a
                .full()
                .checked_sub(pads[i] + pads[i + rank])
                .filter(|&o| o > 0)
                .ok_or_else(|| format!("pads {pads:?} leave no output"))?;
            Ok(a.axis(out, pads[i]))
        })
        .collect()
}

/// A per-axis int attribute (`default` when absent), each at least `min`.
fn ints(n: &NodeDesc, name: &str, rank: usize, default: usize, min: i64) -> Result<Vec<usize>, Why> {
    match attr_ints(n, name)? {
        None => Ok(vec![default; rank]),
        Some(v) if v.len() == rank && v.iter().all(|&x| x >= min) => Ok(v.iter().map(|&x| x as usize).collect()),
        Some(v) => Err(format!("{name} {v:?} is not {rank} values of at least {min}")),
    }
}
