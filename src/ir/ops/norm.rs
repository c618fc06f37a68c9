//! Normalisations: Softmax (with the pre-13 flattening rule) and
//! LayerNormalization.

use super::attrs::{attr_float, attr_int, norm_axis};
use super::OpFamily;
use crate::ir::desc::NodeDesc;
use crate::ir::import::{Importer, Why};
use crate::ir::Op;

pub(super) const OPS: &[OpFamily] = &[
    OpFamily::new(&["Softmax"], softmax),
    OpFamily::new(&["LayerNormalization"], layer_norm),
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
