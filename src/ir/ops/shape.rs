//! Ops that change only a tensor's shape or type, or make constants:
//! Reshape, Flatten, Squeeze, Unsqueeze, Expand, Shape, Constant,
//! ConstantOfShape, Identity, Dropout (inference), Cast. Their shape inputs
//! must be known while importing (constants or folded shape arithmetic).

use super::attrs::{attr, attr_int, attr_ints, norm_axes, to_dims};
use super::OpFamily;
use crate::ir::desc::{AttrValue, NodeDesc};
use crate::ir::import::{tensor_of, Importer, Why, FETCH_LIMIT};
use crate::ir::{broadcast_shapes, onnx_type_name, DType, Op, ShapeDisplay, Tensor, TensorType};

pub(super) const OPS: &[OpFamily] = &[
    OpFamily::new(&["Reshape"], reshape),
    OpFamily::new(&["Flatten"], flatten),
    OpFamily::new(&["Squeeze", "Unsqueeze"], squeeze),
    OpFamily::new(&["Expand"], expand),
    OpFamily::new(&["Shape"], shape),
    OpFamily::new(&["Constant"], constant),
    OpFamily::new(&["ConstantOfShape"], constant_of_shape),
    OpFamily::new(&["Identity"], identity),
    OpFamily::new(&["Dropout"], dropout).multi_output(),
    OpFamily::new(&["Cast"], cast),
];

fn reshape(imp: &mut Importer, n: &NodeDesc, out: &str) -> Result<(), Why> {
    let x = imp.input(n, 0)?;
    let spec = imp
        .const_ints(n, 1, "the Reshape shape")?
        .ok_or("Reshape has no shape")?;
    let allowzero = attr_int(n, "allowzero", 0)? != 0;
    let shape = reshape_target(&imp.ty(x).shape, &spec, allowzero)?;
    imp.emit(n, Op::Reshape, &[x], Some(out), Some(&shape))?;
    Ok(())
}

/// The shape a Reshape produces: 0 copies the input dim (unless
/// `allowzero`), one -1 takes what is left.
fn reshape_target(input: &[usize], spec: &[i64], allowzero: bool) -> Result<Vec<usize>, Why> {
    let total: usize = input.iter().product();
    let mut out = Vec::with_capacity(spec.len());
    let mut infer_at = None;
    for (i, &d) in spec.iter().enumerate() {
        match d {
            -1 if infer_at.is_none() => {
                infer_at = Some(i);
                out.push(1);
            }
            0 if !allowzero => out.push(*input.get(i).ok_or("Reshape 0 beyond the input's rank")?),
            d if d >= 0 => out.push(d as usize),
            _ => return Err(format!("Reshape shape {spec:?} is invalid")),
        }
    }
    if let Some(i) = infer_at {
        let known: usize = out.iter().product();
        if known == 0 || !total.is_multiple_of(known) {
            return Err(format!("cannot reshape {} into {spec:?}", ShapeDisplay(input)));
        }
        out[i] = total / known;
    }
    if out.iter().product::<usize>() != total {
        return Err(format!("cannot reshape {} into {spec:?}", ShapeDisplay(input)));
    }
    Ok(out)
}

fn flatten(imp: &mut Importer, n: &NodeDesc, out: &str) -> Result<(), Why> {
    let x = imp.input(n, 0)?;
    let s = imp.ty(x).shape.clone();
    let a = attr_int(n, "axis", 1)?;
    let a = if a < 0 { a + s.len() as i64 } else { a };
    if a < 0 || a > s.len() as i64 {
        return Err(format!("Flatten axis attribute {a} out of range for rank {}", s.len()));
    }
    let a = a as usize;
    let shape = [s[..a].iter().product(), s[a..].iter().product()];
    imp.emit(n, Op::Reshape, &[x], Some(out), Some(&shape))?;
    Ok(())
}

/// Squeeze and Unsqueeze: a Reshape once the axes are known.
fn squeeze(imp: &mut Importer, n: &NodeDesc, out: &str) -> Result<(), Why> {
    let x = imp.input(n, 0)?;
    let s = imp.ty(x).shape.clone();
    // The axes moved from an attribute to an input at opset 13.
    let axes = if n.since_version < 13 {
        attr_ints(n, "axes")?
    } else {
        imp.const_ints(n, 1, "the axes")?
    };
    let shape = if n.op_type == "Squeeze" {
        squeezed(&s, axes)?
    } else {
        unsqueezed(&s, axes.ok_or("Unsqueeze has no axes")?)?
    };
    imp.emit(n, Op::Reshape, &[x], Some(out), Some(&shape))?;
    Ok(())
}

/// `s` without the size-1 dims at `axes` (all of them when absent).
fn squeezed(s: &[usize], axes: Option<Vec<i64>>) -> Result<Vec<usize>, Why> {
    let Some(axes) = axes else {
        return Ok(s.iter().copied().filter(|&d| d != 1).collect());
    };
    let axes = norm_axes(&axes, s.len(), "Squeeze axes")?;
    if let Some(&a) = axes.iter().find(|&&a| s[a] != 1) {
        return Err(format!("Squeeze axis {a} has size {}", s[a]));
    }
    Ok((0..s.len()).filter(|d| !axes.contains(d)).map(|d| s[d]).collect())
}

/// `s` with size-1 dims inserted at `axes` (axes of the result).
fn unsqueezed(s: &[usize], axes: Vec<i64>) -> Result<Vec<usize>, Why> {
    let r = s.len() + axes.len();
    let axes = norm_axes(&axes, r, "Unsqueeze axes")?;
    let mut it = s.iter();
    Ok((0..r)
        .map(|d| if axes.contains(&d) { 1 } else { *it.next().unwrap_or(&1) })
        .collect())
}

fn expand(imp: &mut Importer, n: &NodeDesc, out: &str) -> Result<(), Why> {
    let x = imp.input(n, 0)?;
    let spec = imp.const_ints(n, 1, "the Expand shape")?.ok_or("Expand has no shape")?;
    let spec = to_dims(&spec)?;
    let shape = broadcast_shapes(&imp.ty(x).shape, &spec).ok_or_else(|| {
        format!(
            "cannot expand {} to {}",
            ShapeDisplay(&imp.ty(x).shape),
            ShapeDisplay(&spec)
        )
    })?;
    imp.emit(n, Op::Expand, &[x], Some(out), Some(&shape))?;
    Ok(())
}

/// Shape (with opset 15's start/end); always known while importing.
fn shape(imp: &mut Importer, n: &NodeDesc, out: &str) -> Result<(), Why> {
    let x = imp.input(n, 0)?;
    let r = imp.ty(x).shape.len() as i64;
    let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
    let start = clamp(attr_int(n, "start", 0)?);
    let end = clamp(attr_int(n, "end", r)?).max(start);
    imp.emit(n, Op::Shape { start, end }, &[x], Some(out), None)?;
    Ok(())
}

fn constant(imp: &mut Importer, n: &NodeDesc, out: &str) -> Result<(), Why> {
    let t = match n.attrs.iter().next() {
        Some((k, AttrValue::Tensor(t))) if k == "value" => tensor_of(t)?,
        Some((k, AttrValue::Float(v))) if k == "value_float" => Tensor::f32(&[], vec![*v]),
        Some((k, AttrValue::Floats(v))) if k == "value_floats" => Tensor::f32(&[v.len()], v.clone()),
        Some((k, AttrValue::Int(v))) if k == "value_int" => Tensor::i64(&[], vec![*v]),
        Some((k, AttrValue::Ints(v))) if k == "value_ints" => Tensor::i64(&[v.len()], v.clone()),
        other => {
            return Err(format!(
                "Constant attribute {:?} is not supported",
                other.map(|(k, _)| k)
            ))
        }
    };
    let c = imp.constant("constant", t);
    imp.bind(n, out, c)
}

/// Folded into a constant when small; a large one (its size may depend on
/// the input shapes) is an `Expand` of its value at run time, so no input
/// size turns a claimed node into a failing one.
fn constant_of_shape(imp: &mut Importer, n: &NodeDesc, out: &str) -> Result<(), Why> {
    let shape = imp
        .const_ints(n, 0, "the shape")?
        .ok_or("ConstantOfShape has no shape")?;
    let shape = to_dims(&shape)?;
    let value = match attr(n, "value") {
        None => Tensor::f32(&[1], vec![0.0]),
        Some(AttrValue::Tensor(t)) => tensor_of(t)?,
        Some(other) => return Err(format!("ConstantOfShape value {other:?} is not a tensor")),
    };
    let v = value.scalar().ok_or("ConstantOfShape value is not one element")?;
    let ty = TensorType::new(value.dtype(), &shape);
    match ty.checked_numel() {
        None => Err(format!("ConstantOfShape of {ty} is too large")),
        Some(numel) if numel <= FETCH_LIMIT * 16 => {
            let c = imp.constant("constant_of_shape", Tensor::filled(&ty, v));
            imp.bind(n, out, c)
        }
        Some(_) => {
            let one = imp.constant(
                "constant_of_shape_value",
                Tensor::filled(&TensorType::new(ty.dtype, &[]), v),
            );
            imp.emit(n, Op::Expand, &[one], Some(out), Some(&shape))?;
            Ok(())
        }
    }
}

fn identity(imp: &mut Importer, n: &NodeDesc, out: &str) -> Result<(), Why> {
    let x = imp.input(n, 0)?;
    imp.bind(n, out, x)
}

/// Dropout in inference: the input itself, and an all-true mask.
fn dropout(imp: &mut Importer, n: &NodeDesc, out: &str) -> Result<(), Why> {
    if let Some(t) = imp.const_input(n, 2, "training_mode").ok().flatten() {
        if t.as_f64s().iter().any(|&v| v != 0.0) {
            return Err("Dropout in training mode is not supported".into());
        }
    } else if n.inputs.get(2).is_some_and(|s| !s.is_empty()) {
        return Err("Dropout training_mode is not a constant".into());
    }
    let x = imp.input(n, 0)?;
    imp.bind(n, out, x)?;
    if let Some(mask) = n.outputs.get(1).filter(|s| !s.is_empty()) {
        let shape = imp.ty(x).shape.clone();
        let ones = Tensor::filled(&TensorType::new(DType::Bool, &shape), 1.0);
        let c = imp.constant("dropout_mask", ones);
        imp.bind(n, mask, c)?;
    }
    Ok(())
}

fn cast(imp: &mut Importer, n: &NodeDesc, out: &str) -> Result<(), Why> {
    let to = attr_int(n, "to", 0)? as i32;
    let to = DType::from_onnx(to).ok_or_else(|| format!("Cast to {} is not supported", onnx_type_name(to)))?;
    let x = imp.input(n, 0)?;
    imp.emit(n, Op::Cast { to }, &[x], Some(out), None)?;
    Ok(())
}
