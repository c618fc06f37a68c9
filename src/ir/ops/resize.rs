//! Resize (opsets 10 to 19) and Upsample (7, 9) of the H and W of 3-D and
//! 4-D tensors, run channels-last (issue #13). Scales and sizes must be
//! known at compile time: constants, or folded from shape arithmetic on
//! the (probed or real) input sizes.

use super::attrs::{attr_float, attr_floats, attr_int, attr_ints, attr_str, norm_axes, norm_axis};
use super::spatial::{channels_first, channels_last};
use super::OpFamily;
use crate::ir::desc::NodeDesc;
use crate::ir::import::{Importer, Why};
use crate::ir::{CoordMode, DType, Interp, NearestMode, Op, ResizeAttrs, ResizeAxis};

pub(super) const OPS: &[OpFamily] = &[OpFamily::new(&["Resize", "Upsample"], resize)];

fn resize(imp: &mut Importer, n: &NodeDesc, out: &str) -> Result<(), Why> {
    let x = match fixed_batch_and_channels(imp, n)? {
        Some(dims) => imp.input_shaped(n, 0, &dims)?,
        None => imp.input(n, 0)?,
    };
    let dims = imp.ty(x).shape.clone();
    let rank = dims.len();
    if !(3..=4).contains(&rank) {
        return Err(format!(
            "{} of a rank-{rank} tensor: kiln resizes the H and W of 3-D and 4-D tensors only",
            n.op_type
        ));
    }
    // Resize-10 and Upsample have neither coordinate modes nor nearest modes.
    let modern = n.op_type == "Resize" && n.since_version >= 11;
    let interp = interp(n, modern)?;
    let coord = match modern {
        true => coord_mode(attr_str(n, "coordinate_transformation_mode", "half_pixel")?)?,
        false => CoordMode::Asymmetric,
    };
    if attr_int(n, "antialias", 0)? != 0 {
        return Err("antialias = 1 is not supported: kiln leaves anti-aliased Resize to ORT".into());
    }
    let (scales, sizes) = scales_and_sizes(imp, n, &dims)?;
    for i in 0..2 {
        if scales[i] != 1.0 || sizes[i] != dims[i] {
            return Err(format!(
                "{} scales axis {i} by {}: kiln resizes H and W only",
                n.op_type, scales[i]
            ));
        }
    }
    let axis = |i: usize| ResizeAxis {
        input: dims[i],
        output: sizes[i],
        scale: scales[i],
    };
    let unit = ResizeAxis {
        input: 1,
        output: 1,
        scale: 1.0,
    };
    if rank == 3 && matches!(interp, Interp::Cubic { .. }) {
        // As ORT's CPU EP, whose cubic Resize is 2-D or 4-D only.
        return Err("cubic Resize of a 3-D tensor is not supported (ORT's CPU EP refuses it too)".into());
    }
    let (h, w) = if rank == 4 { (axis(2), axis(3)) } else { (unit, axis(2)) };
    for a in [&h, &w] {
        if a.input == 0 && a.output != 0 {
            return Err(format!("{} of an empty axis to {} elements", n.op_type, a.output));
        }
    }
    let attrs = ResizeAttrs { interp, coord, h, w };
    let xl = channels_last(imp, n, x)?;
    let y = imp.emit(n, Op::Resize(attrs), &[xl], None, None)?;
    channels_first(imp, n, y, rank, Some(out))?;
    Ok(())
}

/// Constant `sizes` (without `axes`) fix N and C: a symbolic N or C is
/// only valid at those sizes, so it is taken at them (rather than at a
/// probe size the node would be refused at).
fn fixed_batch_and_channels(imp: &mut Importer, n: &NodeDesc) -> Result<Option<Vec<Option<usize>>>, Why> {
    if n.op_type != "Resize" || n.since_version < 11 || attr_ints(n, "axes")?.is_some() || floats(imp, n, 2)?.is_some()
    {
        return Ok(None);
    }
    let Some(sizes) = imp.const_ints(n, 3, "the sizes")? else {
        return Ok(None);
    };
    if sizes.len() < 3 || sizes.iter().any(|&s| s < 0) {
        return Ok(None);
    }
    let mut dims = vec![None; sizes.len()];
    dims[0] = Some(sizes[0] as usize);
    dims[1] = Some(sizes[1] as usize);
    Ok(Some(dims))
}

fn interp(n: &NodeDesc, modern: bool) -> Result<Interp, Why> {
    let mode = attr_str(n, "mode", "nearest")?;
    let exclude_outside = attr_int(n, "exclude_outside", 0)? != 0;
    if exclude_outside && mode != "cubic" {
        return Err(format!(
            "exclude_outside = 1 with mode {mode}: ONNX allows it for cubic only"
        ));
    }
    Ok(match mode {
        "nearest" if !modern => Interp::Nearest(NearestMode::Simple),
        "nearest" => Interp::Nearest(match attr_str(n, "nearest_mode", "round_prefer_floor")? {
            "round_prefer_floor" => NearestMode::RoundPreferFloor,
            "round_prefer_ceil" => NearestMode::RoundPreferCeil,
            "floor" => NearestMode::Floor,
            "ceil" => NearestMode::Ceil,
            other => return Err(format!("nearest_mode {other} is not a mode ONNX defines")),
        }),
        "linear" => Interp::Linear,
        "cubic" if n.op_type == "Resize" => Interp::Cubic {
            a: attr_float(n, "cubic_coeff_a", -0.75)?,
            exclude_outside,
        },
        other => return Err(format!("{} mode {other} is not nearest, linear or cubic", n.op_type)),
    })
}

fn coord_mode(name: &str) -> Result<CoordMode, Why> {
    Ok(match name {
        "half_pixel" => CoordMode::HalfPixel,
        "half_pixel_symmetric" => CoordMode::HalfPixelSymmetric,
        "pytorch_half_pixel" => CoordMode::PytorchHalfPixel,
        "align_corners" => CoordMode::AlignCorners,
        "asymmetric" => CoordMode::Asymmetric,
        "tf_half_pixel_for_nn" => CoordMode::TfHalfPixelForNn,
        "tf_crop_and_resize" => {
            return Err("coordinate_transformation_mode tf_crop_and_resize is not supported: \
                        kiln leaves crop-and-resize (roi, extrapolation_value) to ORT"
                .into())
        }
        other => {
            return Err(format!(
                "coordinate_transformation_mode {other} is not a mode ONNX defines"
            ))
        }
    })
}

/// Per axis of `dims`: the scale the coordinates use and the output size,
/// computed in f32 as ORT does.
fn scales_and_sizes(imp: &mut Importer, n: &NodeDesc, dims: &[usize]) -> Result<(Vec<f32>, Vec<usize>), Why> {
    let rank = dims.len();
    let axes: Vec<usize> = match attr_ints(n, "axes")? {
        Some(a) if n.since_version >= 18 => {
            // In the given order: scales and sizes follow it.
            norm_axes(&a, rank, "axes")?;
            a.iter()
                .map(|&x| norm_axis(x, rank, "axes"))
                .collect::<Result<_, _>>()?
        }
        _ => (0..rank).collect(),
    };
    // Upsample-7 has scales as an attribute; Upsample-9 and Resize-10 as
    // input 1; Resize-11 on as input 2 (or sizes as input 3).
    let given = match (n.op_type.as_str(), n.since_version) {
        ("Upsample", v) if v < 9 => Some(attr_floats(n, "scales")?.ok_or("Upsample needs scales")?),
        ("Upsample", _) | ("Resize", 10) => floats(imp, n, 1)?,
        _ => floats(imp, n, 2)?,
    };
    if let Some(s) = given {
        let scales = spread(&s, &axes, rank, 1.0, "scales")?;
        if scales.iter().any(|&s| !(s.is_finite() && s > 0.0)) {
            return Err(format!("scales {scales:?} are not all positive"));
        }
        if n.op_type == "Upsample" && scales.iter().any(|&s| s < 1.0) {
            return Err(format!("Upsample scales {scales:?} must be >= 1"));
        }
        let sizes = dims
            .iter()
            .zip(&scales)
            .map(|(&d, &s)| (s * d as f32) as usize)
            .collect();
        return Ok((scales, sizes));
    }
    let sizes = imp
        .const_ints(n, 3, "the sizes")?
        .ok_or_else(|| format!("{} has neither scales nor sizes", n.op_type))?;
    if sizes.iter().any(|&s| s < 0) {
        return Err(format!("sizes {sizes:?} are negative"));
    }
    let given: Vec<usize> = sizes.iter().map(|&s| s as usize).collect();
    let mut sizes = spread(&given, &axes, rank, 0, "sizes")?;
    for (i, s) in sizes.iter_mut().enumerate() {
        if !axes.contains(&i) {
            *s = dims[i];
        }
    }
    let mut scales: Vec<f32> = (0..rank)
        .map(|i| {
            if dims[i] == 0 {
                1.0
            } else {
                sizes[i] as f32 / dims[i] as f32
            }
        })
        .collect();
    keep_aspect_ratio(n, &axes, dims, &mut scales, &mut sizes)?;
    Ok((scales, sizes))
}

/// The non-empty f32 tensor of input `k`, if given.
fn floats(imp: &mut Importer, n: &NodeDesc, k: usize) -> Result<Option<Vec<f32>>, Why> {
    let Some(t) = imp.const_input(n, k, "the scales")? else {
        return Ok(None);
    };
    if t.dtype() != DType::F32 {
        return Err(format!("the scales are {}, expected float", t.dtype()));
    }
    Ok((t.numel() > 0).then(|| t.as_f64s().into_iter().map(|v| v as f32).collect()))
}

/// Values given for `axes` (or for every axis) as one per axis of `rank`.
fn spread<T: Copy>(v: &[T], axes: &[usize], rank: usize, fill: T, what: &str) -> Result<Vec<T>, Why> {
    if v.len() != axes.len() {
        return Err(format!("{} {what} for {} axes", v.len(), axes.len().min(rank)));
    }
    let mut out = vec![fill; rank];
    for (&a, &x) in axes.iter().zip(v) {
        out[a] = x;
    }
    Ok(out)
}

/// `keep_aspect_ratio_policy` (opset 18): one scale for every resized axis.
fn keep_aspect_ratio(
    n: &NodeDesc,
    axes: &[usize],
    dims: &[usize],
    scales: &mut [f32],
    sizes: &mut [usize],
) -> Result<(), Why> {
    let policy = attr_str(n, "keep_aspect_ratio_policy", "stretch")?;
    let picked = axes.iter().map(|&a| scales[a]);
    let scale = match policy {
        "stretch" => return Ok(()),
        "not_larger" => picked.fold(f32::MAX, f32::min),
        "not_smaller" => picked.fold(f32::MIN_POSITIVE, f32::max),
        other => return Err(format!("keep_aspect_ratio_policy {other} is not a policy ONNX defines")),
    };
    for &a in axes {
        scales[a] = scale;
        sizes[a] = (scale * dims[a] as f32).round() as usize;
    }
    Ok(())
}
