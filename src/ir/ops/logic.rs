//! Comparisons, boolean logic and float tests: Equal, Greater, Less,
//! GreaterOrEqual, LessOrEqual (f32, int64, int32; Equal also bool), And,
//! Or, Xor, Not (bool), IsNaN and IsInf (f32). All write bool and run at run
//! time; on values known while importing (shape arithmetic such as
//! `Where(Equal(shape, -1), 1, shape)`) `emit` evaluates them on the spot.

use super::attrs::attr_int;
use super::{not_implemented, OpFamily};
use crate::ir::desc::NodeDesc;
use crate::ir::import::{Importer, Why};
use crate::ir::{BinaryOp, Op, UnaryOp};

pub(super) const OPS: &[OpFamily] = &[
    OpFamily::new(
        &[
            "Equal",
            "Greater",
            "Less",
            "GreaterOrEqual",
            "LessOrEqual",
            "And",
            "Or",
            "Xor",
        ],
        binary_logic,
    ),
    OpFamily::new(&["Not", "IsNaN", "IsInf"], unary_logic),
];

fn binary_logic(imp: &mut Importer, n: &NodeDesc, out: &str) -> Result<(), Why> {
    let op = match n.op_type.as_str() {
        "Equal" => BinaryOp::Equal,
        "Greater" => BinaryOp::Greater,
        "Less" => BinaryOp::Less,
        "GreaterOrEqual" => BinaryOp::GreaterOrEqual,
        "LessOrEqual" => BinaryOp::LessOrEqual,
        "And" => BinaryOp::And,
        "Or" => BinaryOp::Or,
        "Xor" => BinaryOp::Xor,
        other => return Err(not_implemented(other)),
    };
    let a = imp.input(n, 0)?;
    let b = imp.input(n, 1)?;
    imp.emit(n, Op::Binary(op), &[a, b], Some(out), None)?;
    Ok(())
}

fn unary_logic(imp: &mut Importer, n: &NodeDesc, out: &str) -> Result<(), Why> {
    let op = match n.op_type.as_str() {
        "Not" => UnaryOp::Not,
        "IsNaN" => UnaryOp::IsNaN,
        "IsInf" => UnaryOp::IsInf {
            negative: flag(n, "detect_negative")?,
            positive: flag(n, "detect_positive")?,
        },
        other => return Err(not_implemented(other)),
    };
    let x = imp.input(n, 0)?;
    imp.emit(n, Op::Unary(op), &[x], Some(out), None)?;
    Ok(())
}

/// IsInf's 0/1 attributes (default 1).
fn flag(n: &NodeDesc, name: &str) -> Result<bool, Why> {
    match attr_int(n, name, 1)? {
        0 => Ok(false),
        1 => Ok(true),
        v => Err(format!("IsInf {name} is {v}, not 0 or 1")),
    }
}
