//! Matrix products: MatMul (NumPy rules, 1-D operands included) and Gemm
//! (transposes, alpha, and its C input folded into the product's bias).

use super::attrs::{attr_float, attr_int};
use super::OpFamily;
use crate::ir::desc::NodeDesc;
use crate::ir::import::{Importer, Why};
use crate::ir::{broadcast_shapes, matmul_dims, strip_ones, BiasKind, DType, MatMulAttrs, Op, Tensor, ValueId};

pub(super) const OPS: &[OpFamily] = &[OpFamily::new(&["MatMul"], matmul), OpFamily::new(&["Gemm"], gemm)];

fn matmul(imp: &mut Importer, n: &NodeDesc, out: &str) -> Result<(), Why> {
    let mut a = imp.input(n, 0)?;
    let mut b = imp.input(n, 1)?;
    let (sa, sb) = (imp.ty(a).shape.clone(), imp.ty(b).shape.clone());
    if sa.is_empty() || sb.is_empty() {
        return Err("MatMul of a scalar".into());
    }
    // NumPy rules for 1-D operands: promote, then drop the added dim.
    if sa.len() == 1 {
        a = imp.emit(n, Op::Reshape, &[a], None, Some(&[1, sa[0]]))?;
    }
    if sb.len() == 1 {
        b = imp.emit(n, Op::Reshape, &[b], None, Some(&[sb[0], 1]))?;
    }
    if sa.len() > 1 && sb.len() > 1 {
        imp.emit(n, Op::MatMul(MatMulAttrs::default()), &[a, b], Some(out), None)?;
        return Ok(());
    }
    let y = imp.emit(n, Op::MatMul(MatMulAttrs::default()), &[a, b], None, None)?;
    let mut shape = imp.ty(y).shape.clone();
    let r = shape.len();
    if sb.len() == 1 {
        shape.remove(r - 1);
    }
    if sa.len() == 1 {
        shape.remove(r - 2);
    }
    imp.emit(n, Op::Reshape, &[y], Some(out), Some(&shape))?;
    Ok(())
}

fn gemm(imp: &mut Importer, n: &NodeDesc, out: &str) -> Result<(), Why> {
    let a = imp.input(n, 0)?;
    let b = imp.input(n, 1)?;
    let mut attrs = MatMulAttrs {
        trans_a: attr_int(n, "transA", 0)? != 0,
        trans_b: attr_int(n, "transB", 0)? != 0,
        alpha: attr_float(n, "alpha", 1.0)?,
        ..MatMulAttrs::default()
    };
    let beta = attr_float(n, "beta", 1.0)?;
    if imp.ty(a).shape.len() != 2 || imp.ty(b).shape.len() != 2 {
        return Err("Gemm operands must be 2-D".into());
    }
    let d = matmul_dims(&imp.ty(a).shape, &imp.ty(b).shape, &attrs)?;
    let mut ins = vec![a, b];
    if n.inputs.get(2).is_some_and(|s| !s.is_empty()) && beta != 0.0 {
        let (c, bias) = gemm_c(imp, n, beta, [d.m, d.n])?;
        ins.push(c);
        attrs.bias = bias;
    }
    imp.emit(n, Op::MatMul(attrs), &ins, Some(out), None)?;
    Ok(())
}

/// Gemm's `beta · C` as the product's bias input, for an `[m, n]` output:
/// a row bias when C is one value per column, else a full one.
fn gemm_c(imp: &mut Importer, n: &NodeDesc, beta: f32, [m, nn]: [usize; 2]) -> Result<(ValueId, BiasKind), Why> {
    let c = imp.input(n, 2)?;
    let cs = imp.ty(c).shape.clone();
    if imp.ty(c).dtype != DType::F32 {
        return Err(format!("Gemm C is {}", imp.ty(c).dtype));
    }
    let row = strip_ones(&cs) == [nn] || (cs.is_empty() && nn == 1);
    match imp.known(c, false)? {
        Some(t) => {
            // Fold beta (and any broadcast) into the constant.
            let vals: Vec<f32> = t.as_f64s().iter().map(|&v| (v * beta as f64) as f32).collect();
            if row {
                return Ok((imp.constant("gemm_bias", Tensor::f32(&[nn], vals)), BiasKind::Row));
            }
            let full = broadcast_shapes(&cs, &[m, nn])
                .filter(|s| s == &[m, nn])
                .ok_or("Gemm C does not broadcast")?;
            let scaled = imp.constant("gemm_c", Tensor::f32(&cs, vals));
            let e = imp.emit(n, Op::Expand, &[scaled], None, Some(&full))?;
            Ok((e, BiasKind::Full { beta: 1.0 }))
        }
        None if row && beta == 1.0 => Ok((c, BiasKind::Row)),
        None => {
            let c = if cs == [m, nn] {
                c
            } else {
                imp.emit(n, Op::Expand, &[c], None, Some(&[m, nn]))?
            };
            Ok((c, BiasKind::Full { beta }))
        }
    }
}
