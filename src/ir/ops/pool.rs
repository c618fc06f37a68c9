//! Pools (MaxPool, AveragePool, GlobalAveragePool, GlobalMaxPool) and
//! DepthToSpace / SpaceToDepth, run channels-last (issue #13).

use super::attrs::{attr_int, attr_str};
use super::spatial::{self, channels_first, channels_last};
use super::{not_implemented, OpFamily};
use crate::ir::desc::NodeDesc;
use crate::ir::import::{Importer, Why};
use crate::ir::{Op, PoolKind, ReduceKind};

pub(super) const OPS: &[OpFamily] = &[
    // MaxPool's second output is its Indices.
    OpFamily::new(&["MaxPool"], pool).multi_output(),
    OpFamily::new(&["AveragePool"], pool),
    OpFamily::new(&["GlobalAveragePool", "GlobalMaxPool"], global_pool),
    OpFamily::new(&["DepthToSpace", "SpaceToDepth"], depth_space),
];

fn pool(imp: &mut Importer, n: &NodeDesc, out: &str) -> Result<(), Why> {
    let kind = match n.op_type.as_str() {
        "MaxPool" => PoolKind::Max,
        "AveragePool" => PoolKind::Average {
            count_include_pad: attr_int(n, "count_include_pad", 0)? != 0,
        },
        other => return Err(not_implemented(other)),
    };
    let x = imp.input(n, 0)?;
    let shape = imp.ty(x).shape.clone();
    if !(3..=4).contains(&shape.len()) {
        return Err(format!(
            "{} input of rank {}: kiln runs 1-D and 2-D pools only",
            n.op_type,
            shape.len()
        ));
    }
    let window = spatial::window(n, &shape[2..], None, spatial::ceil_mode(n)?)?;
    for a in [&window.h, &window.w] {
        // ORT refuses these pads too ("Pad should be smaller than kernel").
        if a.pad_begin >= a.kernel || a.pad_end >= a.kernel {
            return Err(format!(
                "{} pads ({}, {}) are not smaller than the kernel {}",
                n.op_type, a.pad_begin, a.pad_end, a.kernel
            ));
        }
    }
    let xl = channels_last(imp, n, x)?;
    let y = imp.emit(n, Op::Pool { kind, window }, &[xl], None, None)?;
    channels_first(imp, n, y, shape.len(), Some(out))?;
    let indices = n.outputs.get(1).filter(|s| !s.is_empty());
    if let Some(name) = indices {
        let kind = PoolKind::MaxIndex {
            column_major: attr_int(n, "storage_order", 0)? != 0,
        };
        let i = imp.emit(n, Op::Pool { kind, window }, &[xl], None, None)?;
        channels_first(imp, n, i, shape.len(), Some(name))?;
    }
    if n.outputs.len() > 2 {
        return Err(format!(
            "{} has {} outputs, at most 2 are defined",
            n.op_type,
            n.outputs.len()
        ));
    }
    Ok(())
}

/// The mean or max over H and W of channels-last `[N, H, W, C]`.
fn global_pool(imp: &mut Importer, n: &NodeDesc, out: &str) -> Result<(), Why> {
    let kind = match n.op_type.as_str() {
        "GlobalAveragePool" => ReduceKind::Mean,
        "GlobalMaxPool" => ReduceKind::Max,
        other => return Err(not_implemented(other)),
    };
    let x = imp.input(n, 0)?;
    let rank = imp.ty(x).shape.len();
    if !(3..=4).contains(&rank) {
        return Err(format!(
            "{} input of rank {rank}: kiln runs 1-D and 2-D pools only",
            n.op_type
        ));
    }
    let xl = channels_last(imp, n, x)?;
    let reduce = Op::Reduce {
        kind,
        axes: vec![1, 2],
        keepdims: true,
    };
    let y = imp.emit(n, reduce, &[xl], None, None)?;
    channels_first(imp, n, y, rank, Some(out))?;
    Ok(())
}

/// DepthToSpace / SpaceToDepth as a reshape, a transpose and a reshape of
/// channels-last `[N, H, W, C]`.
fn depth_space(imp: &mut Importer, n: &NodeDesc, out: &str) -> Result<(), Why> {
    let x = imp.input(n, 0)?;
    let s = imp.ty(x).shape.clone();
    let [batch, c, h, w] = s[..] else {
        return Err(format!("{} needs a 4-D input, got rank {}", n.op_type, s.len()));
    };
    let b = usize::try_from(attr_int(n, "blocksize", 0)?)
        .ok()
        .filter(|&b| b > 0)
        .ok_or("blocksize must be positive")?;
    let (split, perm, joined) = match n.op_type.as_str() {
        "DepthToSpace" => {
            if c % (b * b) != 0 {
                return Err(format!("{c} channels are not a multiple of blocksize² {}", b * b));
            }
            let cb = c / (b * b);
            let (split, perm) = match attr_str(n, "mode", "DCR")? {
                // Channel (b1 · b + b2) · C' + c'.
                "DCR" => (vec![batch, h, w, b, b, cb], vec![0, 1, 3, 2, 4, 5]),
                // Channel c' · b² + b1 · b + b2.
                "CRD" => (vec![batch, h, w, cb, b, b], vec![0, 1, 4, 2, 5, 3]),
                other => return Err(format!("DepthToSpace mode {other} is not DCR or CRD")),
            };
            (split, perm, vec![batch, h * b, w * b, cb])
        }
        "SpaceToDepth" => {
            if h % b != 0 || w % b != 0 {
                // Symbolic H and W are probed with primes: claimed only when static.
                return Err(format!(
                    "H {h} and W {w} are not multiples of blocksize {b} (kiln claims SpaceToDepth \
                     only where H and W are known to be)"
                ));
            }
            let split = vec![batch, h / b, b, w / b, b, c];
            (split, vec![0, 1, 3, 2, 4, 5], vec![batch, h / b, w / b, b * b * c])
        }
        other => return Err(not_implemented(other)),
    };
    let xl = channels_last(imp, n, x)?;
    let parts = imp.emit(n, Op::Reshape, &[xl], None, Some(&split))?;
    let moved = imp.emit(n, Op::Transpose { perm }, &[parts], None, None)?;
    let y = imp.emit(n, Op::Reshape, &[moved], None, Some(&joined))?;
    channels_first(imp, n, y, 4, Some(out))?;
    Ok(())
}
