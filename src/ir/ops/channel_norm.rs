//! The normalisations of CNNs: InstanceNormalization, GroupNormalization
//! and LRN. Each runs channels-last (`spatial::channels_last` before,
//! `channels_first` after), so that a layout pass can drop the transposes
//! between it and its neighbours; inputs of rank above 4 flatten their
//! spatial dims first.

use super::attrs::{attr_float, attr_int};
use super::spatial::{channels_first, channels_last};
use super::{not_implemented, OpFamily};
use crate::ir::desc::NodeDesc;
use crate::ir::import::{Importer, Why};
use crate::ir::{Lrn, Op, ValueId};

pub(super) const OPS: &[OpFamily] = &[
    OpFamily::new(&["InstanceNormalization", "GroupNormalization"], group_norm),
    OpFamily::new(&["LRN"], lrn),
];

/// `x` (`[N, C, D1, ...]`, rank >= 3) as channels-last `[N, H, W, C]`.
fn to_channels_last(imp: &mut Importer, n: &NodeDesc, x: ValueId) -> Result<ValueId, Why> {
    let s = imp.ty(x).shape.clone();
    if s.len() < 3 {
        return Err(format!(
            "{} input of rank {} (kiln needs [N, C, ...])",
            n.op_type,
            s.len()
        ));
    }
    let x4 = if s.len() > 4 {
        let flat = [s[0], s[1], 1, s[2..].iter().product()];
        imp.emit(n, Op::Reshape, &[x], None, Some(&flat))?
    } else {
        x
    };
    channels_last(imp, n, x4)
}

/// Channels-last `y` back to `shape` (the input's), bound to `out`.
fn to_channels_first(imp: &mut Importer, n: &NodeDesc, y: ValueId, shape: &[usize], out: &str) -> Result<(), Why> {
    if shape.len() <= 4 {
        channels_first(imp, n, y, shape.len(), Some(out))?;
        return Ok(());
    }
    let t = channels_first(imp, n, y, 4, None)?;
    imp.emit(n, Op::Reshape, &[t], Some(out), Some(shape))?;
    Ok(())
}

/// Input `k` as a `[len]` vector (a `[len, 1, 1]` scale reshaped).
fn vector(imp: &mut Importer, n: &NodeDesc, k: usize, len: usize, what: &str) -> Result<ValueId, Why> {
    let v = imp.input(n, k)?;
    let s = imp.ty(v).shape.clone();
    if s == [len] {
        return Ok(v);
    }
    if s.iter().product::<usize>() != len {
        return Err(format!("{what} of shape {s:?} does not hold {len} values"));
    }
    imp.emit(n, Op::Reshape, &[v], None, Some(&[len]))
}

/// InstanceNormalization (one group per channel) and GroupNormalization
/// (opset 18: scale and bias per group; 21: per channel).
fn group_norm(imp: &mut Importer, n: &NodeDesc, out: &str) -> Result<(), Why> {
    let x = imp.input(n, 0)?;
    let shape = imp.ty(x).shape.clone();
    let c = *shape
        .get(1)
        .ok_or_else(|| format!("{} input of rank {}", n.op_type, shape.len()))?;
    let epsilon = attr_float(n, "epsilon", 1e-5)?;
    let (groups, scale, bias) = match n.op_type.as_str() {
        "InstanceNormalization" => (c, vector(imp, n, 1, c, "scale")?, vector(imp, n, 2, c, "B")?),
        "GroupNormalization" => {
            let groups = attr_int(n, "num_groups", 0)?;
            let groups = usize::try_from(groups)
                .ok()
                .filter(|&g| g > 0 && c % g == 0)
                .ok_or_else(|| format!("num_groups {groups} does not divide {c} channels"))?;
            // stash_type: the statistics' precision; kiln's (f64 sums) is at least float's.
            match attr_int(n, "stash_type", 1)? {
                1 | 11 => {}
                t => {
                    return Err(format!(
                        "stash_type {t} (kiln computes the statistics in float or better)"
                    ))
                }
            }
            let (scale, bias) = if n.since_version < 21 {
                (per_channel(imp, n, 1, groups, c)?, per_channel(imp, n, 2, groups, c)?)
            } else {
                (vector(imp, n, 1, c, "scale")?, vector(imp, n, 2, c, "bias")?)
            };
            (groups, scale, bias)
        }
        other => return Err(not_implemented(other)),
    };
    let xl = to_channels_last(imp, n, x)?;
    let y = imp.emit(n, Op::GroupNorm { groups, epsilon }, &[xl, scale, bias], None, None)?;
    to_channels_first(imp, n, y, &shape, out)
}

/// Opset 18's per-group scale or bias (`[groups]`) repeated per channel.
fn per_channel(imp: &mut Importer, n: &NodeDesc, k: usize, groups: usize, c: usize) -> Result<ValueId, Why> {
    let v = vector(imp, n, k, groups, if k == 1 { "scale" } else { "bias" })?;
    let col = imp.emit(n, Op::Reshape, &[v], None, Some(&[groups, 1]))?;
    let e = imp.emit(n, Op::Expand, &[col], None, Some(&[groups, c / groups]))?;
    imp.emit(n, Op::Reshape, &[e], None, Some(&[c]))
}

fn lrn(imp: &mut Importer, n: &NodeDesc, out: &str) -> Result<(), Why> {
    let x = imp.input(n, 0)?;
    let shape = imp.ty(x).shape.clone();
    let size = attr_int(n, "size", 0)?;
    let size = usize::try_from(size)
        .ok()
        .filter(|&s| s > 0)
        .ok_or_else(|| format!("LRN size {size} is not a positive integer"))?;
    let p = Lrn {
        size,
        alpha: attr_float(n, "alpha", 1e-4)?,
        beta: attr_float(n, "beta", 0.75)?,
        bias: attr_float(n, "bias", 1.0)?,
    };
    let xl = to_channels_last(imp, n, x)?;
    let y = imp.emit(n, Op::Lrn(p), &[xl], None, None)?;
    to_channels_first(imp, n, y, &shape, out)
}
