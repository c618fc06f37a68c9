//! Activations of convolutional networks (issue #13): HardSigmoid,
//! HardSwish, Elu, Selu, Celu, ThresholdedRelu, Softsign (f32 unary ops with
//! their attributes), PRelu (a slope broadcast to the input) and the
//! variadic, broadcasting Sum (f32).

use super::attrs::attr_float;
use super::{not_implemented, OpFamily};
use crate::ir::desc::NodeDesc;
use crate::ir::import::{Importer, Why};
use crate::ir::{BinaryOp, DType, Op, UnaryOp};

pub(super) const OPS: &[OpFamily] = &[
    OpFamily::new(
        &[
            "Celu",
            "Elu",
            "HardSigmoid",
            "HardSwish",
            "Selu",
            "Softsign",
            "ThresholdedRelu",
        ],
        unary,
    ),
    OpFamily::new(&["PRelu"], prelu),
    OpFamily::new(&["Sum"], sum),
];

/// Selu's defaults, as the ONNX spec writes them (exactly representable in f32).
#[allow(clippy::excessive_precision)]
const SELU_ALPHA: f32 = 1.673_263_192_176_818_847_656_25;
#[allow(clippy::excessive_precision)]
const SELU_GAMMA: f32 = 1.050_701_022_148_132_324_218_75;

fn unary(imp: &mut Importer, n: &NodeDesc, out: &str) -> Result<(), Why> {
    let op = match n.op_type.as_str() {
        "HardSigmoid" => UnaryOp::HardSigmoid(attr_float(n, "alpha", 0.2)?, attr_float(n, "beta", 0.5)?),
        "HardSwish" => UnaryOp::HardSwish,
        "Elu" => UnaryOp::Elu(attr_float(n, "alpha", 1.0)?),
        "Selu" => UnaryOp::Selu(attr_float(n, "alpha", SELU_ALPHA)?, attr_float(n, "gamma", SELU_GAMMA)?),
        "Celu" => UnaryOp::Celu(attr_float(n, "alpha", 1.0)?),
        "ThresholdedRelu" => UnaryOp::ThresholdedRelu(attr_float(n, "alpha", 1.0)?),
        "Softsign" => UnaryOp::Softsign,
        other => return Err(not_implemented(other)),
    };
    let x = imp.input(n, 0)?;
    imp.emit(n, Op::Unary(op), &[x], Some(out), None)?;
    Ok(())
}

/// `PRelu(x, slope)`: the slope broadcasts to x's shape (ONNX's
/// unidirectional broadcasting: a CNN's per-channel `[C, 1, 1]`, a scalar,
/// or x's own shape), never the other way round.
fn prelu(imp: &mut Importer, n: &NodeDesc, out: &str) -> Result<(), Why> {
    let x = imp.input(n, 0)?;
    let slope = imp.input(n, 1)?;
    let y = imp.emit(n, Op::Binary(BinaryOp::PRelu), &[x, slope], Some(out), None)?;
    let (xs, ys) = (&imp.ty(x).shape, &imp.ty(y).shape);
    if xs != ys {
        return Err(format!(
            "PRelu slope of shape {:?} does not broadcast to the input's {xs:?}",
            imp.ty(slope).shape
        ));
    }
    Ok(())
}

/// `Sum`: the left-to-right chain of broadcasting Adds (ORT's order); one
/// input is the input itself.
fn sum(imp: &mut Importer, n: &NodeDesc, out: &str) -> Result<(), Why> {
    let count = n.inputs.len();
    let mut acc = imp.input(n, 0)?;
    if imp.ty(acc).dtype != DType::F32 {
        return Err(format!("Sum of {} (kiln runs float Sum)", imp.ty(acc).dtype));
    }
    for k in 1..count {
        let next = imp.input(n, k)?;
        let last = k + 1 == count;
        acc = imp.emit(n, Op::Binary(BinaryOp::Add), &[acc, next], last.then_some(out), None)?;
    }
    if count == 1 {
        imp.bind(n, out, acc)?;
    }
    Ok(())
}
