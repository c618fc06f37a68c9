//! Reductions: ReduceMean, ReduceSum, ReduceMax over adjacent axes.

use super::attrs::{attr_int, attr_ints, norm_axes};
use super::{not_implemented, OpFamily};
use crate::ir::desc::NodeDesc;
use crate::ir::import::{Importer, Why};
use crate::ir::{Op, ReduceKind};

pub(super) const OPS: &[OpFamily] = &[OpFamily::new(&["ReduceMean", "ReduceSum", "ReduceMax"], reduce)];

fn reduce(imp: &mut Importer, n: &NodeDesc, out: &str) -> Result<(), Why> {
    let kind = match n.op_type.as_str() {
        "ReduceMean" => ReduceKind::Mean,
        "ReduceSum" => ReduceKind::Sum,
        "ReduceMax" => ReduceKind::Max,
        other => return Err(not_implemented(other)),
    };
    let x = imp.input(n, 0)?;
    let s = imp.ty(x).shape.clone();
    // The axes moved from an attribute to an input: ReduceSum at 13, the others at 18.
    let axes_from_input = match kind {
        ReduceKind::Sum => n.since_version >= 13,
        _ => n.since_version >= 18,
    };
    let axes = if axes_from_input {
        imp.const_ints(n, 1, "the axes")?
    } else {
        attr_ints(n, "axes")?
    };
    let keepdims = attr_int(n, "keepdims", 1)? != 0;
    let axes = match axes.filter(|a| !a.is_empty()) {
        Some(a) => norm_axes(&a, s.len(), "axes")?,
        None if attr_int(n, "noop_with_empty_axes", 0)? != 0 => {
            return imp.bind(n, out, x);
        }
        None => (0..s.len()).collect(),
    };
    // The kernel reduces one contiguous run of dims; size-1 dims between do not break it.
    let real: Vec<usize> = axes.iter().copied().filter(|&a| s[a] != 1).collect();
    if let (Some(&lo), Some(&hi)) = (real.first(), real.last()) {
        if (lo..=hi).any(|d| s[d] != 1 && !axes.contains(&d)) {
            return Err(format!(
                "{} over non-adjacent axes {axes:?} is not supported",
                n.op_type
            ));
        }
    }
    imp.emit(n, Op::Reduce { kind, axes, keepdims }, &[x], Some(out), None)?;
    Ok(())
}
