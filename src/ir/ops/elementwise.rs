//! Elementwise ops: unary functions (LeakyRelu's alpha and Gelu's
//! approximation are attributes), binary arithmetic with Pow, and Clip.

use super::attrs::{attr_float, attr_str};
use super::{not_implemented, OpFamily};
use crate::ir::desc::NodeDesc;
use crate::ir::import::{Importer, Why};
use crate::ir::{BinaryOp, DType, Op, Tensor, UnaryOp};

pub(super) const OPS: &[OpFamily] = &[
    OpFamily::new(
        &[
            "Abs",
            "Erf",
            "Exp",
            "Gelu",
            "LeakyRelu",
            "Log",
            "Neg",
            "Reciprocal",
            "Relu",
            "Sigmoid",
            "Sqrt",
            "Tanh",
        ],
        unary,
    ),
    OpFamily::new(&["Add", "Sub", "Mul", "Div", "Pow"], binary),
    OpFamily::new(&["Clip"], clip),
];

fn unary(imp: &mut Importer, n: &NodeDesc, out: &str) -> Result<(), Why> {
    let u = unary_op(n)?;
    let x = imp.input(n, 0)?;
    imp.emit(n, Op::Unary(u), &[x], Some(out), None)?;
    Ok(())
}

/// The kernel op of a unary node, its attributes resolved.
fn unary_op(n: &NodeDesc) -> Result<UnaryOp, Why> {
    Ok(match n.op_type.as_str() {
        "Relu" => UnaryOp::Relu,
        "Sigmoid" => UnaryOp::Sigmoid,
        "Tanh" => UnaryOp::Tanh,
        "Neg" => UnaryOp::Neg,
        "Abs" => UnaryOp::Abs,
        "Sqrt" => UnaryOp::Sqrt,
        "Exp" => UnaryOp::Exp,
        "Log" => UnaryOp::Log,
        "Erf" => UnaryOp::Erf,
        "Reciprocal" => UnaryOp::Reciprocal,
        "LeakyRelu" => UnaryOp::LeakyRelu(attr_float(n, "alpha", 0.01)?),
        "Gelu" => match attr_str(n, "approximate", "none")? {
            "none" => UnaryOp::Gelu,
            "tanh" => UnaryOp::GeluTanh,
            other => return Err(format!("Gelu approximate attribute '{other}' is not none or tanh")),
        },
        other => return Err(not_implemented(other)),
    })
}

fn binary(imp: &mut Importer, n: &NodeDesc, out: &str) -> Result<(), Why> {
    let b = match n.op_type.as_str() {
        "Add" => BinaryOp::Add,
        "Sub" => BinaryOp::Sub,
        "Mul" => BinaryOp::Mul,
        "Div" => BinaryOp::Div,
        "Pow" => BinaryOp::Pow,
        other => return Err(not_implemented(other)),
    };
    let x = imp.input(n, 0)?;
    let mut y = imp.input(n, 1)?;
    if b == BinaryOp::Pow && imp.ty(y).dtype != DType::F32 && imp.ty(x).dtype == DType::F32 {
        // An integer exponent: kiln computes it as float.
        let t = imp
            .const_input(n, 1, "an integer exponent")?
            .ok_or("exponent missing")?;
        let f = Tensor::f32(&t.shape, t.as_f64s().iter().map(|&v| v as f32).collect());
        y = imp.constant("exponent", f);
    }
    imp.emit(n, Op::Binary(b), &[x, y], Some(out), None)?;
    Ok(())
}

fn clip(imp: &mut Importer, n: &NodeDesc, out: &str) -> Result<(), Why> {
    // An absent bound is ±FLT_MAX (Clip-6's defaults, which ORT also
    // uses for Clip-11+), not ±inf: Clip(inf) with no max is FLT_MAX.
    let (lo, hi) = if n.since_version < 11 {
        (attr_float(n, "min", f32::MIN)?, attr_float(n, "max", f32::MAX)?)
    } else {
        let lo = imp.const_input(n, 1, "Clip min")?;
        let hi = imp.const_input(n, 2, "Clip max")?;
        (clip_bound(lo, f32::MIN)?, clip_bound(hi, f32::MAX)?)
    };
    let x = imp.input(n, 0)?;
    imp.emit(n, Op::Unary(UnaryOp::Clip(lo, hi)), &[x], Some(out), None)?;
    Ok(())
}

/// A Clip-11+ bound input: absent means `default`, else a scalar.
fn clip_bound(t: Option<Tensor>, default: f32) -> Result<f32, Why> {
    match t {
        None => Ok(default),
        Some(t) => t
            .scalar()
            .map(|v| v as f32)
            .ok_or_else(|| "Clip min/max is not a scalar".to_string()),
    }
}
