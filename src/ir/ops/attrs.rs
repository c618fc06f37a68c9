//! Reading a node's attributes and axes, shared by the op families.

use crate::ir::desc::{AttrValue, NodeDesc};
use crate::ir::import::Why;

pub(super) fn attr<'n>(n: &'n NodeDesc, name: &str) -> Option<&'n AttrValue> {
    n.attrs.get(name)
}

pub(super) fn attr_int(n: &NodeDesc, name: &str, default: i64) -> Result<i64, Why> {
    match attr(n, name) {
        None => Ok(default),
        Some(AttrValue::Int(v)) => Ok(*v),
        Some(other) => Err(format!("attribute {name} is {other:?}, expected an int")),
    }
}

pub(super) fn attr_float(n: &NodeDesc, name: &str, default: f32) -> Result<f32, Why> {
    match attr(n, name) {
        None => Ok(default),
        Some(AttrValue::Float(v)) => Ok(*v),
        Some(other) => Err(format!("attribute {name} is {other:?}, expected a float")),
    }
}

pub(super) fn attr_ints(n: &NodeDesc, name: &str) -> Result<Option<Vec<i64>>, Why> {
    match attr(n, name) {
        None => Ok(None),
        Some(AttrValue::Ints(v)) => Ok(Some(v.clone())),
        Some(other) => Err(format!("attribute {name} is {other:?}, expected ints")),
    }
}

pub(super) fn attr_str<'n>(n: &'n NodeDesc, name: &str, default: &'n str) -> Result<&'n str, Why> {
    match attr(n, name) {
        None => Ok(default),
        Some(AttrValue::String(s)) => Ok(s),
        Some(other) => Err(format!("attribute {name} is {other:?}, expected a string")),
    }
}

/// `axis` (possibly negative) as an index into `rank` dims.
pub(super) fn norm_axis(axis: i64, rank: usize, what: &str) -> Result<usize, Why> {
    let a = if axis < 0 { axis + rank as i64 } else { axis };
    if a < 0 || a >= rank as i64 {
        return Err(format!("{what} attribute {axis} out of range for rank {rank}"));
    }
    Ok(a as usize)
}

/// Several axes, normalised and sorted; a repeated axis is an error.
pub(super) fn norm_axes(axes: &[i64], rank: usize, what: &str) -> Result<Vec<usize>, Why> {
    let mut v = axes
        .iter()
        .map(|&a| norm_axis(a, rank, what))
        .collect::<Result<Vec<_>, _>>()?;
    v.sort_unstable();
    if v.windows(2).any(|w| w[0] == w[1]) {
        return Err(format!("{what} {axes:?} repeats an axis"));
    }
    Ok(v)
}

/// Non-negative dims from a shape tensor's values.
pub(super) fn to_dims(spec: &[i64]) -> Result<Vec<usize>, Why> {
    spec.iter()
        .map(|&d| usize::try_from(d).map_err(|_| format!("negative dim {d}")))
        .collect()
}

// Pools and resize (issue #13).
pub(super) fn attr_floats(n: &NodeDesc, name: &str) -> Result<Option<Vec<f32>>, Why> {
    match attr(n, name) {
        None => Ok(None),
        Some(AttrValue::Floats(v)) => Ok(Some(v.clone())),
        Some(other) => Err(format!("attribute {name} is {other:?}, expected floats")),
    }
}
