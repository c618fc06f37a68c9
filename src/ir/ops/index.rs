//! Shape and indexing ops (issue #12): Range, Tile, Pad, Trilu (built from
//! the movement ops), GatherElements, GatherND, ScatterND, CumSum and
//! OneHot (their own kernels).
//!
//! An output shape that depends on an input's *values* (Range's bounds,
//! Tile's repeats, Pad's pads, OneHot's depth) needs that input known while
//! importing: a constant, or shape arithmetic the importer folds. Otherwise
//! the node is refused with that reason, at every probe size alike.

use super::attrs::{attr_float, attr_int, attr_ints, attr_str, norm_axes, norm_axis};
use super::OpFamily;
use crate::ir::desc::NodeDesc;
use crate::ir::import::{Importer, Why};
use crate::ir::{DType, Op, ScatterReduction, Tensor, TensorData, TensorType, ValueId};

pub(super) const OPS: &[OpFamily] = &[
    OpFamily::new(&["Range"], range),
    OpFamily::new(&["Tile"], tile),
    OpFamily::new(&["Pad"], pad),
    OpFamily::new(&["Trilu"], trilu),
    OpFamily::new(&["GatherElements"], gather_elements),
    OpFamily::new(&["GatherND"], gather_nd),
    OpFamily::new(&["ScatterND"], scatter_nd),
    OpFamily::new(&["CumSum"], cumsum),
    OpFamily::new(&["OneHot"], one_hot),
];

/// Largest Range kiln makes into a constant (elements).
const RANGE_LIMIT: usize = 1 << 26;

/// The one element of a known input, which must be a scalar or `[1]`.
fn known_scalar(imp: &mut Importer, n: &NodeDesc, k: usize, what: &str) -> Result<Tensor, Why> {
    let t = imp
        .const_input(n, k, what)?
        .ok_or_else(|| format!("{} has no {what}", n.op_type))?;
    if t.numel() != 1 {
        return Err(format!(
            "{what} of {} has {} elements, expected one",
            n.op_type,
            t.numel()
        ));
    }
    Ok(t)
}

/// Range: a constant, so start, limit and delta must be known.
fn range(imp: &mut Importer, n: &NodeDesc, out: &str) -> Result<(), Why> {
    let start = known_scalar(imp, n, 0, "start")?;
    let limit = known_scalar(imp, n, 1, "limit")?;
    let delta = known_scalar(imp, n, 2, "delta")?;
    let t = match (&start.data, &limit.data, &delta.data) {
        (TensorData::F32(s), TensorData::F32(l), TensorData::F32(d)) => {
            let (s, l, d) = (s[0], l[0], d[0]);
            let count = range_count(f64::from(l - s), f64::from(d))?;
            // Accumulated in f32, as ORT computes it.
            let mut v = Vec::with_capacity(count);
            let mut x = s;
            for _ in 0..count {
                v.push(x);
                x += d;
            }
            Tensor::f32(&[count], v)
        }
        (TensorData::I64(s), TensorData::I64(l), TensorData::I64(d)) => {
            let count = range_count(l[0].wrapping_sub(s[0]) as f64, d[0] as f64)?;
            Tensor::i64(
                &[count],
                (0..count as i64)
                    .map(|i| s[0].wrapping_add(i.wrapping_mul(d[0])))
                    .collect(),
            )
        }
        (TensorData::I32(s), TensorData::I32(l), TensorData::I32(d)) => {
            let count = range_count(f64::from(l[0].wrapping_sub(s[0])), f64::from(d[0]))?;
            let v = (0..count as i32)
                .map(|i| s[0].wrapping_add(i.wrapping_mul(d[0])))
                .collect();
            Tensor {
                shape: vec![count],
                data: TensorData::I32(v),
            }
        }
        _ => {
            return Err(format!(
                "Range of {}, {} and {} is not supported (f32, int64 or int32 alike)",
                start.dtype(),
                limit.dtype(),
                delta.dtype()
            ))
        }
    };
    let c = imp.constant("range", t);
    imp.bind(n, out, c)
}

/// `max(ceil(diff / delta), 0)` elements, refused when delta is 0 or the
/// result too large to hold.
fn range_count(diff: f64, delta: f64) -> Result<usize, Why> {
    if delta == 0.0 {
        return Err("Range delta is 0".into());
    }
    let count = (diff / delta).ceil().max(0.0);
    if !count.is_finite() || count > RANGE_LIMIT as f64 {
        return Err(format!("Range of {count} elements is too large"));
    }
    Ok(count as usize)
}

/// Tile: `[d0, d1]` viewed as `[1, d0, 1, d1]`, broadcast to
/// `[r0, d0, r1, d1]` and viewed as `[r0·d0, r1·d1]`.
fn tile(imp: &mut Importer, n: &NodeDesc, out: &str) -> Result<(), Why> {
    let x = imp.input(n, 0)?;
    let s = imp.ty(x).shape.clone();
    let reps = imp.const_ints(n, 1, "the Tile repeats")?.ok_or("Tile has no repeats")?;
    if reps.len() != s.len() {
        return Err(format!("Tile has {} repeats for rank {}", reps.len(), s.len()));
    }
    let reps: Vec<usize> = reps
        .iter()
        .map(|&r| usize::try_from(r).map_err(|_| format!("negative Tile repeat {r}")))
        .collect::<Result<_, _>>()?;
    let spread: Vec<usize> = s.iter().flat_map(|&d| [1, d]).collect();
    let full: Vec<usize> = s.iter().zip(&reps).flat_map(|(&d, &r)| [r, d]).collect();
    let shape: Vec<usize> = s.iter().zip(&reps).map(|(&d, &r)| d.saturating_mul(r)).collect();
    let v = imp.emit(n, Op::Reshape, &[x], None, Some(&spread))?;
    let v = imp.emit(n, Op::Expand, &[v], None, Some(&full))?;
    imp.emit(n, Op::Reshape, &[v], Some(out), Some(&shape))?;
    Ok(())
}

/// Pad's mode; the constant mode holds its scalar value.
#[derive(Clone, Copy, PartialEq)]
enum PadMode {
    Constant(ValueId),
    Reflect,
    Edge,
    Wrap,
}

/// Pad: per padded axis, negative pads crop first (as ORT does), then the
/// axis is the concatenation of the begin part, the rest and the end part,
/// each a slice or broadcast of the input (or of the constant value).
fn pad(imp: &mut Importer, n: &NodeDesc, out: &str) -> Result<(), Why> {
    let x = imp.input(n, 0)?;
    let TensorType { dtype, shape } = imp.ty(x).clone();
    let mode = match attr_str(n, "mode", "constant")? {
        "constant" => PadMode::Constant(pad_value(imp, n, dtype)?),
        "reflect" => PadMode::Reflect,
        "edge" => PadMode::Edge,
        "wrap" if n.since_version >= 19 => PadMode::Wrap,
        other => return Err(format!("Pad mode '{other}' is not supported")),
    };
    let (pads, axes) = pad_spec(imp, n, shape.len())?;
    let mut v = x;
    for (k, &axis) in axes.iter().enumerate() {
        let (begin, end) = (pads[k], pads[k + axes.len()]);
        v = crop(imp, n, v, axis, begin.min(0).unsigned_abs(), end.min(0).unsigned_abs())?;
        let (begin, end) = (begin.max(0) as usize, end.max(0) as usize);
        if begin == 0 && end == 0 {
            continue;
        }
        let pieces = pad_pieces(imp, n, v, axis, (begin, end), mode)?;
        let pieces: Vec<ValueId> = pieces.into_iter().filter(|&p| imp.ty(p).shape[axis] > 0).collect();
        v = match pieces[..] {
            [one] => one,
            _ => imp.emit(n, Op::Concat { axis }, &pieces, None, None)?,
        };
    }
    imp.bind(n, out, v)
}

/// The parts that, concatenated on `axis`, pad `v` by `begin` and `end`.
fn pad_pieces(
    imp: &mut Importer,
    n: &NodeDesc,
    v: ValueId,
    axis: usize,
    (begin, end): (usize, usize),
    mode: PadMode,
) -> Result<Vec<ValueId>, Why> {
    let dim = imp.ty(v).shape[axis];
    Ok(match mode {
        PadMode::Constant(value) => vec![
            filled(imp, n, value, v, axis, begin)?,
            v,
            filled(imp, n, value, v, axis, end)?,
        ],
        PadMode::Edge => {
            if dim == 0 {
                return Err(format!("Pad 'edge' of axis {axis} of size 0"));
            }
            let first = slice_axis(imp, n, v, axis, 0, 1, 1)?;
            let last = slice_axis(imp, n, v, axis, dim - 1, 1, 1)?;
            vec![
                broadcast_axis(imp, n, first, axis, begin)?,
                v,
                broadcast_axis(imp, n, last, axis, end)?,
            ]
        }
        PadMode::Reflect => {
            if dim < 2 || begin > dim - 1 || end > dim - 1 {
                return Err(format!(
                    "Pad 'reflect' of {begin} and {end} on axis {axis} of size {dim} (at most {})",
                    dim.saturating_sub(1)
                ));
            }
            vec![
                slice_axis(imp, n, v, axis, begin, begin, -1)?,
                v,
                slice_axis(imp, n, v, axis, dim - 2, end, -1)?,
            ]
        }
        PadMode::Wrap => {
            if dim == 0 {
                return Err(format!("Pad 'wrap' of axis {axis} of size 0"));
            }
            let mut pieces = wrap_runs(imp, n, v, axis, dim, (dim - begin % dim) % dim, begin)?;
            pieces.push(v);
            pieces.extend(wrap_runs(imp, n, v, axis, dim, 0, end)?);
            pieces
        }
    })
}

/// The pads (begin values then end values) and the axes they apply to.
fn pad_spec(imp: &mut Importer, n: &NodeDesc, rank: usize) -> Result<(Vec<i64>, Vec<usize>), Why> {
    let pads = if n.since_version < 11 {
        attr_ints(n, "pads")?
    } else {
        imp.const_ints(n, 1, "the Pad pads")?
    }
    .ok_or("Pad has no pads")?;
    let axes: Vec<usize> = match imp.const_ints(n, 3, "the Pad axes")? {
        Some(a) if n.since_version >= 18 => {
            // Checked for repeats; the pads follow the axes' given order.
            norm_axes(&a, rank, "Pad axes")?;
            a.iter()
                .map(|&x| norm_axis(x, rank, "Pad axes"))
                .collect::<Result<_, _>>()?
        }
        _ => (0..rank).collect(),
    };
    if pads.len() != 2 * axes.len() {
        return Err(format!("Pad has {} pads for {} axes", pads.len(), axes.len()));
    }
    Ok((pads, axes))
}

/// The constant mode's value: a scalar value (run-time input or constant).
fn pad_value(imp: &mut Importer, n: &NodeDesc, dtype: DType) -> Result<ValueId, Why> {
    if n.since_version < 11 {
        let v = attr_float(n, "value", 0.0)?;
        return Ok(imp.constant("pad_value", Tensor::filled(&TensorType::new(dtype, &[]), f64::from(v))));
    }
    match n.inputs.get(2).filter(|s| !s.is_empty()) {
        None => Ok(imp.constant("pad_value", Tensor::filled(&TensorType::new(dtype, &[]), 0.0))),
        Some(_) => {
            let v = imp.input(n, 2)?;
            let t = imp.ty(v);
            if t.numel() != 1 || t.shape.len() > 1 || t.dtype != dtype {
                return Err(format!("Pad constant_value {t} is not one {dtype}"));
            }
            Ok(v)
        }
    }
}

/// `v` without `lo` leading and `hi` trailing elements on `axis`.
fn crop(imp: &mut Importer, n: &NodeDesc, v: ValueId, axis: usize, lo: u64, hi: u64) -> Result<ValueId, Why> {
    if lo == 0 && hi == 0 {
        return Ok(v);
    }
    let dim = imp.ty(v).shape[axis] as u64;
    let keep = dim
        .checked_sub(lo.saturating_add(hi))
        .ok_or_else(|| format!("Pad crops {} from axis {axis} of size {dim}", lo.saturating_add(hi)))?;
    slice_axis(imp, n, v, axis, lo as usize, keep as usize, 1)
}

/// `count` elements of `v` on `axis` from `start`, every `step`.
fn slice_axis(
    imp: &mut Importer,
    n: &NodeDesc,
    v: ValueId,
    axis: usize,
    start: usize,
    count: usize,
    step: isize,
) -> Result<ValueId, Why> {
    let mut shape = imp.ty(v).shape.clone();
    let rank = shape.len();
    let mut starts = vec![0; rank];
    let mut steps = vec![1; rank];
    shape[axis] = count;
    starts[axis] = if count == 0 { 0 } else { start };
    steps[axis] = step;
    imp.emit(n, Op::Slice { starts, steps }, &[v], None, Some(&shape))
}

/// `v` (size 1 on `axis`) repeated `count` times along it.
fn broadcast_axis(imp: &mut Importer, n: &NodeDesc, v: ValueId, axis: usize, count: usize) -> Result<ValueId, Why> {
    let mut shape = imp.ty(v).shape.clone();
    shape[axis] = count;
    imp.emit(n, Op::Expand, &[v], None, Some(&shape))
}

/// The scalar `value` broadcast to `like`'s shape with `count` on `axis`.
fn filled(
    imp: &mut Importer,
    n: &NodeDesc,
    value: ValueId,
    like: ValueId,
    axis: usize,
    count: usize,
) -> Result<ValueId, Why> {
    let mut shape = imp.ty(like).shape.clone();
    shape[axis] = count;
    imp.emit(n, Op::Expand, &[value], None, Some(&shape))
}

/// `count` elements of `v` on `axis` read cyclically from `from`, as slices.
fn wrap_runs(
    imp: &mut Importer,
    n: &NodeDesc,
    v: ValueId,
    axis: usize,
    dim: usize,
    from: usize,
    count: usize,
) -> Result<Vec<ValueId>, Why> {
    let mut runs = Vec::new();
    let (mut at, mut left) = (from, count);
    while left > 0 {
        let take = left.min(dim - at);
        runs.push(slice_axis(imp, n, v, axis, at, take, 1)?);
        left -= take;
        at = 0;
    }
    Ok(runs)
}

/// Trilu: `Where(mask, x, 0)` with the constant triangle mask of the last
/// two dims.
fn trilu(imp: &mut Importer, n: &NodeDesc, out: &str) -> Result<(), Why> {
    let x = imp.input(n, 0)?;
    let t = imp.ty(x).clone();
    let r = t.shape.len();
    if r < 2 {
        return Err(format!("Trilu of rank {r} (needs 2 or more)"));
    }
    let k = match imp.const_ints(n, 1, "the Trilu k")? {
        None => 0,
        Some(v) if v.len() == 1 => v[0],
        Some(v) => return Err(format!("Trilu k has {} elements", v.len())),
    };
    let upper = attr_int(n, "upper", 1)? != 0;
    let (rows, cols) = (t.shape[r - 2], t.shape[r - 1]);
    let mut mask = Vec::with_capacity(rows.saturating_mul(cols));
    for i in 0..rows as i64 {
        for j in 0..cols as i64 {
            let keep = if upper { j - i >= k } else { j - i <= k };
            mask.push(u8::from(keep));
        }
    }
    let mask = imp.constant("trilu_mask", Tensor::bool(&[rows, cols], mask));
    let zero = imp.constant("trilu_zero", Tensor::filled(&TensorType::new(t.dtype, &[]), 0.0));
    imp.emit(n, Op::Where, &[mask, x, zero], Some(out), None)?;
    Ok(())
}

fn gather_elements(imp: &mut Importer, n: &NodeDesc, out: &str) -> Result<(), Why> {
    let x = imp.input(n, 0)?;
    let idx = imp.input(n, 1)?;
    let axis = norm_axis(attr_int(n, "axis", 0)?, imp.ty(x).shape.len(), "GatherElements axis")?;
    imp.emit(n, Op::GatherElements { axis }, &[x, idx], Some(out), None)?;
    Ok(())
}

fn gather_nd(imp: &mut Importer, n: &NodeDesc, out: &str) -> Result<(), Why> {
    let x = imp.input(n, 0)?;
    let idx = imp.input(n, 1)?;
    let batch_dims = usize::try_from(attr_int(n, "batch_dims", 0)?).map_err(|_| "negative GatherND batch_dims")?;
    if imp.ty(idx).shape.last() == Some(&0) {
        return Err("GatherND with index tuples of length 0 is not supported".into());
    }
    imp.emit(n, Op::GatherNd { batch_dims }, &[x, idx], Some(out), None)?;
    Ok(())
}

fn scatter_nd(imp: &mut Importer, n: &NodeDesc, out: &str) -> Result<(), Why> {
    let x = imp.input(n, 0)?;
    let idx = imp.input(n, 1)?;
    let upd = imp.input(n, 2)?;
    let reduction = match attr_str(n, "reduction", "none")? {
        "none" => ScatterReduction::None,
        "add" => ScatterReduction::Add,
        "mul" => ScatterReduction::Mul,
        "max" => ScatterReduction::Max,
        "min" => ScatterReduction::Min,
        other => return Err(format!("ScatterND reduction '{other}' is not supported")),
    };
    if imp.ty(idx).shape.last() == Some(&0) {
        return Err("ScatterND with index tuples of length 0 is not supported".into());
    }
    imp.emit(n, Op::ScatterNd { reduction }, &[x, idx, upd], Some(out), None)?;
    Ok(())
}

fn cumsum(imp: &mut Importer, n: &NodeDesc, out: &str) -> Result<(), Why> {
    let x = imp.input(n, 0)?;
    let axis = match imp.const_ints(n, 1, "the CumSum axis")? {
        Some(v) if v.len() == 1 => v[0],
        Some(v) => return Err(format!("CumSum axis has {} elements", v.len())),
        None => return Err("CumSum has no axis".into()),
    };
    let axis = norm_axis(axis, imp.ty(x).shape.len(), "CumSum axis")?;
    let op = Op::CumSum {
        axis,
        exclusive: attr_int(n, "exclusive", 0)? != 0,
        reverse: attr_int(n, "reverse", 0)? != 0,
    };
    imp.emit(n, op, &[x], Some(out), None)?;
    Ok(())
}

/// OneHot: the depth must be known (it is the output's size); float
/// indices are truncated to int64 first, as ORT does.
fn one_hot(imp: &mut Importer, n: &NodeDesc, out: &str) -> Result<(), Why> {
    let mut idx = imp.input(n, 0)?;
    let depth = known_scalar(imp, n, 1, "depth")?;
    let depth = depth.as_f64s()[0];
    if !(depth >= 1.0 && depth <= RANGE_LIMIT as f64) {
        return Err(format!("OneHot depth {depth} is not supported"));
    }
    let depth = depth as usize;
    let values = imp.input(n, 2)?;
    if imp.ty(idx).dtype == DType::F32 {
        idx = imp.emit(n, Op::Cast { to: DType::I64 }, &[idx], None, None)?;
    }
    let s = imp.ty(idx).shape.clone();
    let axis = norm_axis(attr_int(n, "axis", -1)?, s.len() + 1, "OneHot axis")?;
    let mut shape = s;
    shape.insert(axis, depth);
    imp.emit(n, Op::OneHot { axis }, &[idx, values], Some(out), Some(&shape))?;
    Ok(())
}
