//! Elementwise math of issue #12: Floor, Ceil, Round, Sin, Cos, Softplus,
//! Mish (f32), Sign (f32, int64, int32), Mod (both `fmod` modes), and the variadic,
//! broadcasting Max, Min (f32, int64, int32) and Mean (f32).

use super::attrs::attr_int;
use super::{not_implemented, OpFamily};
use crate::ir::desc::NodeDesc;
use crate::ir::import::{Importer, Why};
use crate::ir::{BinaryOp, DType, Op, Tensor, TensorType, UnaryOp, ValueId};

pub(super) const OPS: &[OpFamily] = &[
    OpFamily::new(
        &["Floor", "Ceil", "Round", "Sin", "Cos", "Sign", "Softplus", "Mish"],
        unary_math,
    ),
    OpFamily::new(&["Mod"], modulo),
    OpFamily::new(&["Max", "Min", "Mean"], variadic),
];

fn unary_math(imp: &mut Importer, n: &NodeDesc, out: &str) -> Result<(), Why> {
    let op = match n.op_type.as_str() {
        "Floor" => UnaryOp::Floor,
        "Ceil" => UnaryOp::Ceil,
        "Round" => UnaryOp::Round,
        "Sin" => UnaryOp::Sin,
        "Cos" => UnaryOp::Cos,
        "Sign" => UnaryOp::Sign,
        "Softplus" => UnaryOp::Softplus,
        "Mish" => UnaryOp::Mish,
        other => return Err(not_implemented(other)),
    };
    let x = imp.input(n, 0)?;
    let dtype = imp.ty(x).dtype;
    if op == UnaryOp::Sign && dtype.is_int() {
        return int_sign(imp, n, x, dtype, out);
    }
    imp.emit(n, Op::Unary(op), &[x], Some(out), None)?;
    Ok(())
}

/// `Sign` of integers as `(x > 0) - (x < 0)`, from the comparison, cast and
/// subtraction kernels.
fn int_sign(imp: &mut Importer, n: &NodeDesc, x: ValueId, dtype: DType, out: &str) -> Result<(), Why> {
    let zero = imp.constant("zero", Tensor::filled(&TensorType::new(dtype, &[]), 0.0));
    let mut sides = [0; 2];
    for (side, cmp) in sides.iter_mut().zip([BinaryOp::Greater, BinaryOp::Less]) {
        let b = imp.emit(n, Op::Binary(cmp), &[x, zero], None, None)?;
        *side = imp.emit(n, Op::Cast { to: dtype }, &[b], None, None)?;
    }
    imp.emit(n, Op::Binary(BinaryOp::Sub), &sides, Some(out), None)?;
    Ok(())
}

fn modulo(imp: &mut Importer, n: &NodeDesc, out: &str) -> Result<(), Why> {
    let a = imp.input(n, 0)?;
    let b = imp.input(n, 1)?;
    let op = match attr_int(n, "fmod", 0)? {
        0 if imp.ty(a).dtype == DType::F32 => {
            // ORT refuses this too ("fmod attribute must be true for floating point types").
            return Err("Mod of floats needs fmod=1".into());
        }
        0 => BinaryOp::Mod,
        1 => BinaryOp::Fmod,
        v => return Err(format!("Mod fmod is {v}, not 0 or 1")),
    };
    imp.emit(n, Op::Binary(op), &[a, b], Some(out), None)?;
    Ok(())
}

/// `Max`/`Min`: a left-to-right chain of binary ops (ORT's order, which
/// decides which NaN or signed zero wins); `Mean`: the sum chain over the
/// count. One input is the input itself.
fn variadic(imp: &mut Importer, n: &NodeDesc, out: &str) -> Result<(), Why> {
    let op = match n.op_type.as_str() {
        "Max" => BinaryOp::Max,
        "Min" => BinaryOp::Min,
        "Mean" => BinaryOp::Add,
        other => return Err(not_implemented(other)),
    };
    let count = n.inputs.len();
    let mut acc = imp.input(n, 0)?;
    if op == BinaryOp::Add && imp.ty(acc).dtype != DType::F32 {
        return Err(format!("Mean of {} (kiln runs float Mean)", imp.ty(acc).dtype));
    }
    for k in 1..count {
        let next = imp.input(n, k)?;
        let last = k + 1 == count && op != BinaryOp::Add;
        acc = imp.emit(n, Op::Binary(op), &[acc, next], last.then_some(out), None)?;
    }
    if op == BinaryOp::Add && count > 1 {
        let c = imp.constant("count", Tensor::f32(&[], vec![count as f32]));
        imp.emit(n, Op::Binary(BinaryOp::Div), &[acc, c], Some(out), None)?;
    } else if count == 1 {
        imp.bind(n, out, acc)?;
    }
    Ok(())
}
