//! Normalisations: Softmax (with the pre-13 flattening rule),
//! LayerNormalization and BatchNormalization (inference form).

use super::attrs::{attr_float, attr_int, norm_axis};
use super::OpFamily;
use crate::ir::desc::NodeDesc;
use crate::ir::import::{Importer, Why};
use crate::ir::{BinaryOp, DType, Op, Tensor, UnaryOp, ValueId};

pub(super) const OPS: &[OpFamily] = &[
    OpFamily::new(&["Softmax"], softmax),
    OpFamily::new(&["LayerNormalization"], layer_norm),
    // Layout and BatchNormalization (issue #13). Its training outputs are
    // refused by the importer ("output 1 ('m') of BatchNormalization is not
    // supported"), like every op's unsupported extra outputs.
    OpFamily::new(&["BatchNormalization"], batch_norm),
];

fn softmax(imp: &mut Importer, n: &NodeDesc, out: &str) -> Result<(), Why> {
    let x = imp.input(n, 0)?;
    let shape = imp.ty(x).shape.clone();
    let rank = shape.len();
    let opset = n.since_version;
    let default = if opset < 13 { 1 } else { -1 };
    let axis = norm_axis(attr_int(n, "axis", default)?, rank, "Softmax axis")?;
    if opset >= 13 || axis == rank - 1 {
        imp.emit(n, Op::Softmax { axis, unshifted: false }, &[x], Some(out), None)?;
        return Ok(());
    }
    // Opsets < 13: softmax of the 2-D flattening at `axis`.
    let flat = [shape[..axis].iter().product(), shape[axis..].iter().product()];
    let f = imp.emit(n, Op::Reshape, &[x], None, Some(&flat))?;
    let sm = Op::Softmax {
        axis: 1,
        unshifted: false,
    };
    let s = imp.emit(n, sm, &[f], None, None)?;
    imp.emit(n, Op::Reshape, &[s], Some(out), Some(&shape))?;
    Ok(())
}

fn layer_norm(imp: &mut Importer, n: &NodeDesc, out: &str) -> Result<(), Why> {
    let x = imp.input(n, 0)?;
    let rank = imp.ty(x).shape.len();
    let axis = norm_axis(attr_int(n, "axis", -1)?, rank, "LayerNormalization axis")?;
    let epsilon = attr_float(n, "epsilon", 1e-5)?;
    let norm = imp.ty(x).shape[axis..].to_vec();
    let mut ins = vec![x];
    for k in 1..3 {
        if n.inputs.get(k).is_some_and(|s| !s.is_empty()) {
            let v = imp.input(n, k)?;
            // Scale/bias broadcast over the normalised dims: give them those dims.
            let v = if imp.ty(v).shape != norm && imp.ty(v).numel() == norm.iter().product::<usize>() {
                imp.emit(n, Op::Reshape, &[v], None, Some(&norm))?
            } else {
                v
            };
            ins.push(v);
        }
    }
    if ins.len() < 2 {
        return Err("LayerNormalization needs a scale".into());
    }
    let ln = Op::LayerNorm {
        axis,
        epsilon,
        decomposed: false,
    };
    imp.emit(n, ln, &ins, Some(out), None)?;
    Ok(())
}

/// `BatchNormalization` in inference form: `y = x·scale + shift` per channel
/// (axis 1), with `scale = γ / √(var + ε)` and `shift = β − mean·scale`
/// computed in f32 as ORT's CPU kernel does. Constant parameters are folded
/// here into two `[C, 1, …]` constants (the `Mul` + `Add` a convolution's
/// epilogue absorbs); computed ones get the same formula as elementwise ops.
fn batch_norm(imp: &mut Importer, n: &NodeDesc, out: &str) -> Result<(), Why> {
    if n.since_version < 9 {
        return Err(format!(
            "BatchNormalization-{} (before opset 9) is not supported",
            n.since_version
        ));
    }
    if attr_int(n, "training_mode", 0)? != 0 {
        return Err("BatchNormalization with training_mode=1 is not supported: kiln runs the inference form".into());
    }
    let epsilon = attr_float(n, "epsilon", 1e-5)?;
    let x = imp.input(n, 0)?;
    let shape = imp.ty(x).shape.clone();
    if shape.len() < 2 {
        return Err(format!(
            "BatchNormalization input of rank {} is not [N, C, ...]",
            shape.len()
        ));
    }
    let channels = shape[1];
    // [C, 1, ...]: broadcasts over the dims after the channel.
    let mut per_channel = vec![channels];
    per_channel.resize(shape.len() - 1, 1);
    let mut params = Vec::with_capacity(4);
    for (k, what) in [(1, "scale"), (2, "B"), (3, "mean"), (4, "var")] {
        let v = imp.input(n, k)?;
        let ty = imp.ty(v);
        if ty.dtype != DType::F32 || ty.shape != [channels] {
            return Err(format!(
                "BatchNormalization {what} is {ty}, expected float[{channels}] (one per channel)"
            ));
        }
        params.push(v);
    }
    let (scale, shift) = match known_params(imp, &params)? {
        Some([g, b, m, v]) => {
            let (scale, shift) = fold_params(&g, &b, &m, &v, epsilon);
            (
                imp.constant("bn_scale", Tensor::f32(&per_channel, scale)),
                imp.constant("bn_shift", Tensor::f32(&per_channel, shift)),
            )
        }
        None => computed_params(imp, n, &params, epsilon, &per_channel)?,
    };
    let y = imp.emit(n, Op::Binary(BinaryOp::Mul), &[x, scale], None, None)?;
    imp.emit(n, Op::Binary(BinaryOp::Add), &[y, shift], Some(out), None)?;
    Ok(())
}

/// The four parameters' values when all are known at compile time.
fn known_params(imp: &mut Importer, params: &[ValueId]) -> Result<Option<[Vec<f32>; 4]>, Why> {
    let mut vals = Vec::with_capacity(4);
    for &p in params {
        match imp.known(p, true)? {
            Some(Tensor {
                data: crate::ir::TensorData::F32(v),
                ..
            }) => vals.push(v),
            _ => return Ok(None),
        }
    }
    Ok(vals.try_into().ok())
}

/// Per channel `scale = γ · (1 / √(var + ε))` and `shift = β − mean·scale`,
/// in f32 and in that order (ORT's CPU kernel's rounding).
fn fold_params(gamma: &[f32], beta: &[f32], mean: &[f32], var: &[f32], epsilon: f32) -> (Vec<f32>, Vec<f32>) {
    let scale: Vec<f32> = gamma
        .iter()
        .zip(var)
        .map(|(&g, &v)| 1.0 / (v + epsilon).sqrt() * g)
        .collect();
    let shift = beta
        .iter()
        .zip(mean)
        .zip(&scale)
        .map(|((&b, &m), &s)| b - m * s)
        .collect();
    (scale, shift)
}

/// [`fold_params`] as IR ops, for parameters computed at run time.
fn computed_params(
    imp: &mut Importer,
    n: &NodeDesc,
    params: &[ValueId],
    epsilon: f32,
    per_channel: &[usize],
) -> Result<(ValueId, ValueId), Why> {
    let (gamma, beta, mean, var) = (params[0], params[1], params[2], params[3]);
    let eps = imp.constant("bn_epsilon", Tensor::f32(&[], vec![epsilon]));
    let v = imp.emit(n, Op::Binary(BinaryOp::Add), &[var, eps], None, None)?;
    let v = imp.emit(n, Op::Unary(UnaryOp::Sqrt), &[v], None, None)?;
    let inv = imp.emit(n, Op::Unary(UnaryOp::Reciprocal), &[v], None, None)?;
    let scale = imp.emit(n, Op::Binary(BinaryOp::Mul), &[inv, gamma], None, None)?;
    let ms = imp.emit(n, Op::Binary(BinaryOp::Mul), &[mean, scale], None, None)?;
    let shift = imp.emit(n, Op::Binary(BinaryOp::Sub), &[beta, ms], None, None)?;
    let scale = imp.emit(n, Op::Reshape, &[scale], None, Some(per_channel))?;
    let shift = imp.emit(n, Op::Reshape, &[shift], None, Some(per_channel))?;
    Ok((scale, shift))
}

#[cfg(test)]
mod tests {
    use super::fold_params;

    #[test]
    fn folded_parameters_follow_the_formula() {
        let (s, b) = fold_params(&[2.0, 1.0], &[0.5, -1.0], &[1.0, 3.0], &[3.0, 0.0], 1.0);
        assert_eq!(s, vec![1.0, 1.0]);
        assert_eq!(b, vec![-0.5, -4.0]);
        // ε = 0 and var = 0: an infinite scale, as ORT computes it.
        let (s, _) = fold_params(&[1.0], &[0.0], &[0.0], &[0.0], 0.0);
        assert!(s[0].is_infinite());
    }
}
