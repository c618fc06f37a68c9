//! Data movement: Transpose, Concat, Slice, Split, Gather, Where.

use super::attrs::{attr_int, attr_ints, norm_axis};
use super::OpFamily;
use crate::ir::desc::NodeDesc;
use crate::ir::import::{Importer, Why};
use crate::ir::Op;

pub(super) const OPS: &[OpFamily] = &[
    OpFamily::new(&["Transpose"], transpose),
    OpFamily::new(&["Concat"], concat),
    OpFamily::new(&["Slice"], slice),
    OpFamily::new(&["Split"], split).multi_output(),
    OpFamily::new(&["Gather"], gather),
    OpFamily::new(&["Where"], where_),
];

fn transpose(imp: &mut Importer, n: &NodeDesc, out: &str) -> Result<(), Why> {
    let x = imp.input(n, 0)?;
    let rank = imp.ty(x).shape.len();
    let perm = match attr_ints(n, "perm")? {
        Some(p) => p
            .iter()
            .map(|&a| norm_axis(a, rank, "Transpose perm"))
            .collect::<Result<Vec<_>, _>>()?,
        None => (0..rank).rev().collect(),
    };
    imp.emit(n, Op::Transpose { perm }, &[x], Some(out), None)?;
    Ok(())
}

fn concat(imp: &mut Importer, n: &NodeDesc, out: &str) -> Result<(), Why> {
    let mut ins = Vec::new();
    for k in 0..n.inputs.len() {
        ins.push(imp.input(n, k)?);
    }
    let rank = ins
        .first()
        .map(|&v| imp.ty(v).shape.len())
        .ok_or("Concat has no inputs")?;
    let axis = norm_axis(attr_int(n, "axis", 0)?, rank, "Concat axis")?;
    imp.emit(n, Op::Concat { axis }, &ins, Some(out), None)?;
    Ok(())
}

fn gather(imp: &mut Importer, n: &NodeDesc, out: &str) -> Result<(), Why> {
    let x = imp.input(n, 0)?;
    let idx = imp.input(n, 1)?;
    let rank = imp.ty(x).shape.len();
    let axis = norm_axis(attr_int(n, "axis", 0)?, rank, "Gather axis")?;
    imp.emit(n, Op::Gather { axis }, &[x, idx], Some(out), None)?;
    Ok(())
}

fn where_(imp: &mut Importer, n: &NodeDesc, out: &str) -> Result<(), Why> {
    let c = imp.input(n, 0)?;
    let x = imp.input(n, 1)?;
    let y = imp.input(n, 2)?;
    imp.emit(n, Op::Where, &[c, x, y], Some(out), None)?;
    Ok(())
}

/// Split: one strided slice per output.
fn split(imp: &mut Importer, n: &NodeDesc, _out: &str) -> Result<(), Why> {
    let x = imp.input(n, 0)?;
    let s = imp.ty(x).shape.clone();
    let axis = norm_axis(attr_int(n, "axis", 0)?, s.len(), "Split axis")?;
    let parts = n.outputs.len();
    // The sizes moved from an attribute to an input at opset 13.
    let sizes = if n.since_version < 13 {
        attr_ints(n, "split")?
    } else {
        imp.const_ints(n, 1, "the split sizes")?
    };
    let dim = s[axis];
    let sizes: Vec<usize> = match sizes {
        Some(v) => v
            .iter()
            .map(|&d| usize::try_from(d).map_err(|_| format!("negative split {d}")))
            .collect::<Result<_, _>>()?,
        None => even_split(dim, parts, n.since_version),
    };
    if sizes.len() != parts || sizes.iter().sum::<usize>() != dim {
        return Err(format!("Split sizes {sizes:?} do not cover {dim} in {parts} parts"));
    }
    let mut at = 0;
    for (k, &size) in sizes.iter().enumerate() {
        let mut starts = vec![0; s.len()];
        starts[axis] = if size == 0 { 0 } else { at };
        let mut shape = s.clone();
        shape[axis] = size;
        at += size;
        let name = imp.out(n, k)?;
        let op = Op::Slice {
            starts,
            steps: vec![1; s.len()],
        };
        imp.emit(n, op, &[x], Some(name), Some(&shape))?;
    }
    Ok(())
}

/// Split sizes without a `split` input: equal parts, the last one smaller
/// from opset 18 on (before, `dim` must divide evenly).
fn even_split(dim: usize, parts: usize, opset: i32) -> Vec<usize> {
    let each = if opset >= 18 {
        dim.div_ceil(parts.max(1))
    } else {
        dim / parts.max(1)
    };
    (0..parts).map(|k| each.min(dim.saturating_sub(k * each))).collect()
}

/// Slice's starts, ends, axes and steps (attributes before opset 10,
/// constant inputs after).
struct SliceSpec {
    starts: Vec<i64>,
    ends: Vec<i64>,
    axes: Option<Vec<i64>>,
    steps: Option<Vec<i64>>,
}

fn slice_spec(imp: &mut Importer, n: &NodeDesc) -> Result<SliceSpec, Why> {
    if n.since_version < 10 {
        return Ok(SliceSpec {
            starts: attr_ints(n, "starts")?.ok_or("Slice has no starts")?,
            ends: attr_ints(n, "ends")?.ok_or("Slice has no ends")?,
            axes: attr_ints(n, "axes")?,
            steps: None,
        });
    }
    Ok(SliceSpec {
        starts: imp.const_ints(n, 1, "the starts")?.ok_or("Slice has no starts")?,
        ends: imp.const_ints(n, 2, "the ends")?.ok_or("Slice has no ends")?,
        axes: imp.const_ints(n, 3, "the axes")?,
        steps: imp.const_ints(n, 4, "the steps")?,
    })
}

fn slice(imp: &mut Importer, n: &NodeDesc, out: &str) -> Result<(), Why> {
    let x = imp.input(n, 0)?;
    let s = imp.ty(x).shape.clone();
    let rank = s.len();
    let SliceSpec {
        starts,
        ends,
        axes,
        steps,
    } = slice_spec(imp, n)?;
    let axes = axes.unwrap_or_else(|| (0..starts.len() as i64).collect());
    let steps = steps.unwrap_or_else(|| vec![1; starts.len()]);
    if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
        return Err("Slice starts, ends, axes and steps differ in length".into());
    }
    let mut st = vec![0usize; rank];
    let mut sp = vec![1isize; rank];
    let mut shape = s.clone();
    let mut seen = vec![false; rank];
    for k in 0..starts.len() {
        let a = norm_axis(axes[k], rank, "Slice axes")?;
        if std::mem::replace(&mut seen[a], true) {
            return Err(format!("Slice repeats axis {a}"));
        }
        let (start, count) = slice_axis(s[a] as i64, starts[k], ends[k], steps[k])?;
        shape[a] = count as usize;
        st[a] = if count > 0 { start as usize } else { 0 };
        sp[a] = steps[k] as isize;
    }
    // A Slice that keeps every element in order (jax2tf writes `x[:, :]` as
    // one) is another name for its input, not a copy.
    let op = if shape == s && sp.iter().all(|&k| k == 1) {
        Op::Reshape
    } else {
        Op::Slice { starts: st, steps: sp }
    };
    imp.emit(n, op, &[x], Some(out), Some(&shape))?;
    Ok(())
}

/// ONNX's clamping of one axis's start and end to a dim of size `dim`:
/// the first index read and how many are read.
fn slice_axis(dim: i64, start: i64, end: i64, step: i64) -> Result<(i64, i64), Why> {
    if step == 0 {
        return Err("Slice step 0".into());
    }
    if dim == 0 {
        // Nothing to read (and no valid index to clamp a backward start to).
        return Ok((0, 0));
    }
    let fix = |v: i64| if v < 0 { v.saturating_add(dim) } else { v };
    let (start, end) = (fix(start), fix(end));
    let (start, end) = if step > 0 {
        (start.clamp(0, dim), end.clamp(0, dim))
    } else {
        (start.clamp(0, dim - 1), end.clamp(-1, dim - 1))
    };
    let count = if step > 0 {
        if end > start {
            (end - start + step - 1) / step
        } else {
            0
        }
    } else if start > end {
        (start - end + (-step) - 1) / (-step)
    } else {
        0
    };
    Ok((start, count))
}

#[cfg(test)]
mod slice_tests {
    use super::slice_axis;

    #[test]
    fn a_backward_slice_of_an_empty_axis_reads_nothing() {
        assert_eq!(slice_axis(0, -1, i64::MIN, -1), Ok((0, 0)));
        assert_eq!(slice_axis(0, 0, 10, 1), Ok((0, 0)));
        assert_eq!(slice_axis(5, -1, i64::MIN, -1), Ok((4, 5)));
    }
}
