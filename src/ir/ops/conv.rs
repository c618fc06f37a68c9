//! Convolutions (issue #13): `Conv`, 1-D and 2-D, run channels-last.
//!
//! The node becomes `Transpose` (NCHW → NHWC) → `Op::Conv` → `Transpose`
//! back; the compiler cancels the transposes between consecutive spatial
//! ops. The weights must be constants (they are packed at compile time);
//! 1-D weights `[Co, Ci/g, k]` are viewed as `[Co, Ci/g, 1, k]`.

use super::attrs::{attr_int, attr_str};
use super::spatial::{channels_first, channels_last, window};
use super::OpFamily;
use crate::ir::desc::NodeDesc;
use crate::ir::import::{Importer, Why};
use crate::ir::{Activation, ConvAttrs, Op};

pub(super) const OPS: &[OpFamily] = &[OpFamily::new(&["Conv"], conv)];

fn conv(imp: &mut Importer, n: &NodeDesc, out: &str) -> Result<(), Why> {
    let x = imp.input(n, 0)?;
    let w = imp.input(n, 1)?;
    let xs = imp.ty(x).shape.clone();
    let ws = imp.ty(w).shape.clone();
    let rank = xs.len();
    if !(3..=4).contains(&rank) {
        return Err(format!(
            "Conv input of rank {rank}: kiln runs 1-D and 2-D convolutions only"
        ));
    }
    if ws.len() != rank {
        return Err(format!("Conv weights of rank {} for an input of rank {rank}", ws.len()));
    }
    if !imp.is_constant(w) {
        let name = &n.inputs[1];
        return Err(format!(
            "the Conv weights (input 1 '{name}') are not a constant: kiln packs convolution weights when it compiles"
        ));
    }
    let groups = attr_int(n, "group", 1)?;
    if groups < 1 {
        return Err(format!("Conv group {groups} is not positive"));
    }
    let groups = groups as usize;
    let (ci, co) = (xs[1], ws[0]);
    if !ci.is_multiple_of(groups) || !co.is_multiple_of(groups) || ws[1] * groups != ci {
        return Err(format!(
            "Conv weights [{co}, {}, ...] do not fit {ci} input channels in {groups} group(s)",
            ws[1]
        ));
    }
    let win = window(n, &xs[2..], Some(&ws[2..]), false)?;
    let same = matches!(attr_str(n, "auto_pad", "NOTSET")?, "SAME_UPPER" | "SAME_LOWER");
    if same && (win.h.dilation > 1 || win.w.dilation > 1) {
        // ORT's CPU EP refuses this combination; kiln does not guess a meaning.
        return Err("Conv with dilations and auto_pad SAME_*: ORT's CPU EP does not run it".into());
    }
    let w4 = if rank == 3 {
        imp.emit(n, Op::Reshape, &[w], None, Some(&[ws[0], ws[1], 1, ws[2]]))?
    } else {
        w
    };
    let xl = channels_last(imp, n, x)?;
    let mut ins = vec![xl, w4];
    let bias = n.inputs.get(2).is_some_and(|s| !s.is_empty());
    if bias {
        ins.push(imp.input(n, 2)?);
    }
    let attrs = ConvAttrs {
        window: win,
        groups,
        bias,
        activation: Activation::None,
        residual: false,
        after: Activation::None,
    };
    let y = imp.emit(n, Op::Conv(Box::new(attrs)), &ins, None, None)?;
    channels_first(imp, n, y, rank, Some(out))?;
    Ok(())
}
