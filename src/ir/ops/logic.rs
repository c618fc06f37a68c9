//! Comparisons and boolean logic (Equal, Greater, Less, GreaterOrEqual,
//! LessOrEqual, And, Or, Xor, Not) on values known while importing: shape
//! arithmetic such as `Where(Equal(shape, -1), 1, shape)` is evaluated
//! here. kiln has no run-time kernel for them yet, so a node over run-time
//! values is not supported.

use super::{not_implemented, OpFamily};
use crate::ir::desc::NodeDesc;
use crate::ir::import::{Importer, Why, FETCH_LIMIT};
use crate::ir::{broadcast_shapes, DType, ShapeDisplay, Tensor};

pub(super) const OPS: &[OpFamily] = &[OpFamily::new(
    &[
        "Equal",
        "Greater",
        "Less",
        "GreaterOrEqual",
        "LessOrEqual",
        "And",
        "Or",
        "Xor",
        "Not",
    ],
    fold_logic,
)];

/// A binary comparison or connective over f64 views of the inputs.
type Compare = fn(f64, f64) -> bool;

fn compare(op_type: &str) -> Option<Compare> {
    Some(match op_type {
        "Equal" => |a, b| a == b,
        "Greater" => |a, b| a > b,
        "Less" => |a, b| a < b,
        "GreaterOrEqual" => |a, b| a >= b,
        "LessOrEqual" => |a, b| a <= b,
        "And" => |a, b| a != 0.0 && b != 0.0,
        "Or" => |a, b| a != 0.0 || b != 0.0,
        "Xor" => |a, b| (a != 0.0) != (b != 0.0),
        _ => return None,
    })
}

fn fold_logic(imp: &mut Importer, n: &NodeDesc, out: &str) -> Result<(), Why> {
    let op = n.op_type.as_str();
    let f = compare(op);
    if f.is_none() && op != "Not" {
        return Err(not_implemented(op));
    }
    let arity = if op == "Not" { 1 } else { 2 };
    let mut known = Vec::with_capacity(arity);
    for k in 0..arity {
        let id = imp.input(n, k)?;
        let t = imp
            .known(id, false)?
            .ok_or_else(|| format!("{op} of run-time values is not supported (only of constants and shapes)"))?;
        known.push(t);
    }
    let logic = matches!(op, "And" | "Or" | "Xor" | "Not");
    if logic && known.iter().any(|t| t.dtype() != DType::Bool) {
        return Err(format!("{op} of non-bool inputs"));
    }
    if !logic && known[0].dtype() != known[1].dtype() {
        return Err(format!("{op} of {} and {}", known[0].dtype(), known[1].dtype()));
    }
    let t = match f {
        Some(f) => broadcast_map(&known[0], &known[1], f)?,
        None => {
            let v = known[0].as_f64s().iter().map(|&x| u8::from(x == 0.0)).collect();
            Tensor::bool(&known[0].shape, v)
        }
    };
    let c = imp.constant("logic", t);
    imp.bind(n, out, c)
}

/// `f(a[i], b[j])` over the broadcast of two small host tensors, as bool.
fn broadcast_map(a: &Tensor, b: &Tensor, f: Compare) -> Result<Tensor, Why> {
    let shape = broadcast_shapes(&a.shape, &b.shape).ok_or_else(|| {
        format!(
            "input shapes {} and {} do not broadcast",
            ShapeDisplay(&a.shape),
            ShapeDisplay(&b.shape)
        )
    })?;
    let n: usize = shape.iter().product();
    if n > FETCH_LIMIT {
        return Err(format!("{} elements are too many to evaluate while importing", n));
    }
    let (va, vb) = (a.as_f64s(), b.as_f64s());
    let out = (0..n)
        .map(|i| {
            u8::from(f(
                va[broadcast_index(&shape, &a.shape, i)],
                vb[broadcast_index(&shape, &b.shape, i)],
            ))
        })
        .collect();
    Ok(Tensor::bool(&shape, out))
}

/// The row-major index into `s` (right-aligned against `shape`, its 1s
/// broadcast) of flat index `flat` of `shape`.
fn broadcast_index(shape: &[usize], s: &[usize], mut flat: usize) -> usize {
    let mut at = 0;
    let mut stride = 1;
    for d in (0..shape.len()).rev() {
        let i = flat % shape[d];
        flat /= shape[d];
        let Some(sd) = (d + s.len()).checked_sub(shape.len()) else {
            continue;
        };
        if s[sd] != 1 {
            at += i * stride;
        }
        stride *= s[sd];
    }
    at
}
