//! Selection along an axis: ArgMax, ArgMin (int64 indices) and TopK
//! (values and int64 indices; the values are a GatherElements of the
//! indices, so they are exactly the input's elements).

use super::attrs::{attr_int, norm_axis};
use super::OpFamily;
use crate::ir::desc::NodeDesc;
use crate::ir::import::{Importer, Why};
use crate::ir::{ArgRule, Op, TopKRule};

pub(super) const OPS: &[OpFamily] = &[
    OpFamily::new(&["ArgMax", "ArgMin"], arg_reduce),
    OpFamily::new(&["TopK"], top_k).multi_output(),
];

fn arg_reduce(imp: &mut Importer, n: &NodeDesc, out: &str) -> Result<(), Why> {
    let x = imp.input(n, 0)?;
    let rank = imp.ty(x).shape.len();
    let axis = norm_axis(attr_int(n, "axis", 0)?, rank, &format!("{} axis", n.op_type))?;
    let rule = ArgRule {
        min: n.op_type == "ArgMin",
        last: attr_int(n, "select_last_index", 0)? != 0,
    };
    let keepdims = attr_int(n, "keepdims", 1)? != 0;
    imp.emit(n, Op::ArgReduce { axis, keepdims, rule }, &[x], Some(out), None)?;
    Ok(())
}

fn top_k(imp: &mut Importer, n: &NodeDesc, out: &str) -> Result<(), Why> {
    let x = imp.input(n, 0)?;
    let shape = imp.ty(x).shape.clone();
    let axis = norm_axis(attr_int(n, "axis", -1)?, shape.len(), "TopK axis")?;
    // k moved from an attribute to an input at opset 10.
    let k = if n.since_version < 10 {
        Some(vec![attr_int(n, "k", -1)?])
    } else {
        imp.const_ints(n, 1, "k")?
    };
    let k = match k.as_deref() {
        Some(&[k]) => usize::try_from(k).map_err(|_| format!("TopK k = {k} is negative"))?,
        _ => return Err("TopK's k is not one integer".into()),
    };
    if k > shape[axis] {
        return Err(format!(
            "TopK k = {k} is larger than axis {axis}'s {} values",
            shape[axis]
        ));
    }
    // sorted = 0 leaves the order to the implementation: kiln sorts anyway.
    let rule = TopKRule {
        k,
        largest: attr_int(n, "largest", 1)? != 0,
    };
    let indices_out = n.outputs.get(1).map(|s| s.as_str()).filter(|s| !s.is_empty());
    let idx = imp.emit(n, Op::TopK { axis, rule }, &[x], indices_out, None)?;
    imp.emit(n, Op::GatherElements { axis }, &[x, idx], Some(out), None)?;
    Ok(())
}
