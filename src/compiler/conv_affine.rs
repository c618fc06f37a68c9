//! Per-channel scales and shifts after a convolution, folded into its
//! weights and bias once, when a shape-generic partition is built.
//!
//! `compiler::conv_fusion` does the same fold on the IR, but a shape-generic
//! partition runs the IR passes again for every new input shape: each fold
//! then makes new weight constants, which must be scaled and packed again
//! (PP-OCR's learnable `Mul`/`Add` after every convolution made that 40% of
//! a specialisation). The fold does not depend on the input's shape, so
//! [`GenericGraph::build`](super::generic::GenericGraph::build) applies it
//! to the partition's description first, and the packed weights are the
//! folded ones.
//!
//! Folded: `Conv(x, w[, b]) → Mul(·, s)` and `→ Add(·, d)` (either operand
//! order), `s`/`d` f32 constants that broadcast along the channel axis only
//! (a scalar, `[Co, 1, 1]`, `[1, Co, 1, 1]`, ...), when the convolution's
//! output has no other reader and is not a partition output.

use std::collections::HashSet;

use super::generic::NamedConstant;
use crate::ir::{DType, GraphDesc, ValueDesc};
use crate::plan::Weight;

/// Folds every such `Mul`/`Add` into its convolution; returns how many.
pub(crate) fn fold(desc: &mut GraphDesc, constants: &mut Vec<NamedConstant>) -> usize {
    let mut names: HashSet<String> = constants.iter().map(|c| c.name.clone()).collect();
    names.extend(desc.values.keys().cloned());
    let mut folded = 0;
    while let Some(f) = find(desc, constants) {
        apply(desc, constants, &mut names, &f);
        folded += 1;
    }
    if folded > 0 {
        let read: HashSet<&String> = desc.nodes.iter().flat_map(|n| &n.inputs).chain(&desc.outputs).collect();
        constants.retain(|c| read.contains(&c.name));
    }
    folded
}

/// One fold [`find`] found: the convolution, the `Mul`/`Add` after it,
/// the convolution's weights and bias (copies of the constants) and the
/// follower's constant per output channel.
struct Fold {
    conv: usize,
    next: usize,
    weights: NamedConstant,
    bias: Option<NamedConstant>,
    per_channel: Vec<f32>,
}

/// The first convolution followed by a foldable `Mul`/`Add`.
fn find(desc: &GraphDesc, constants: &[NamedConstant]) -> Option<Fold> {
    let links = desc.links();
    let constant = |name: &str| constants.iter().find(|c| c.name == name && c.dtype == DType::F32);
    for (i, n) in desc.nodes.iter().enumerate() {
        if n.op_type != "Conv" || !n.domain.is_empty() {
            continue;
        }
        let (Some(w), Some(y)) = (n.inputs.get(1).and_then(|w| constant(w)), n.outputs.first()) else {
            continue;
        };
        let bias = n.inputs.get(2).filter(|b| !b.is_empty()).map(|b| constant(b));
        let bias_ok = bias.is_none_or(|b| b.is_some_and(|b| b.shape.len() == 1));
        let (Some(&co), &[j]) = (w.shape.first(), links.consumers_of(y)) else {
            continue;
        };
        if !bias_ok || desc.outputs.contains(y) {
            continue;
        }
        let next = &desc.nodes[j];
        if !matches!(next.op_type.as_str(), "Mul" | "Add") || !next.domain.is_empty() || next.inputs.len() != 2 {
            continue;
        }
        let other = if next.inputs[0] == *y {
            &next.inputs[1]
        } else {
            &next.inputs[0]
        };
        // The output's rank is the weights' ([Co, Ci/g, kernel...]).
        let rank = w.shape.len();
        let per_channel = constant(other).and_then(|c| channel_values(c, co, rank));
        if let (true, Some(per_channel)) = (other != y, per_channel) {
            return Some(Fold {
                conv: i,
                next: j,
                weights: w.clone(),
                bias: bias.flatten().cloned(),
                per_channel,
            });
        }
    }
    None
}

/// `c`'s values per output channel, if it broadcasts against a rank-`rank`
/// `[N, Co, ...]` output along the channel axis only.
fn channel_values(c: &NamedConstant, co: usize, rank: usize) -> Option<Vec<f32>> {
    if rank < 3 || c.shape.len() > rank {
        return None;
    }
    let lead = rank - c.shape.len();
    let mut channels = 1;
    for (axis, &d) in (lead..rank).zip(&c.shape) {
        match (axis, d) {
            (_, 1) => {}
            (1, d) if d == co => channels = co,
            _ => return None,
        }
    }
    let v = c.data.as_slice();
    Some(if channels == co {
        v.to_vec()
    } else {
        vec![*v.first()?; co]
    })
}

/// Rewrites the convolution to compute what the follower did.
fn apply(desc: &mut GraphDesc, constants: &mut Vec<NamedConstant>, names: &mut HashSet<String>, f: &Fold) {
    let (conv, next, per_channel) = (f.conv, f.next, &f.per_channel[..]);
    let (w, bias) = (&f.weights, &f.bias);
    let co = per_channel.len();
    let mut new_w = None;
    let new_bias: Vec<f32> = if desc.nodes[next].op_type == "Mul" {
        let per = w.data.as_slice().len() / co.max(1);
        let scaled = w
            .data
            .as_slice()
            .iter()
            .enumerate()
            .map(|(k, x)| x * per_channel[k / per]);
        new_w = Some(scaled.collect::<Vec<f32>>());
        match &bias {
            Some(b) => b.data.as_slice().iter().zip(per_channel).map(|(x, s)| x * s).collect(),
            None => Vec::new(),
        }
    } else {
        match &bias {
            Some(b) => b.data.as_slice().iter().zip(per_channel).map(|(x, d)| x + d).collect(),
            None => per_channel.to_vec(),
        }
    };
    if let Some(data) = new_w {
        let name = add(desc, constants, names, &w.name, w.shape.clone(), data);
        desc.nodes[conv].inputs[1] = name;
    }
    if !new_bias.is_empty() {
        let base = bias.as_ref().map_or(w.name.as_str(), |b| b.name.as_str()).to_string();
        let name = add(desc, constants, names, &base, vec![co], new_bias);
        let inputs = &mut desc.nodes[conv].inputs;
        inputs.resize(inputs.len().max(3), String::new());
        inputs[2] = name;
    }
    let out = desc.nodes[next].outputs[0].clone();
    let old = std::mem::replace(&mut desc.nodes[conv].outputs[0], out);
    desc.values.remove(&old);
    desc.nodes.remove(next);
}

/// A new f32 constant named after `base`, unique in the partition.
fn add(
    desc: &mut GraphDesc,
    constants: &mut Vec<NamedConstant>,
    names: &mut HashSet<String>,
    base: &str,
    shape: Vec<usize>,
    data: Vec<f32>,
) -> String {
    let name = (0..)
        .map(|k| format!("{base}.kiln_folded{k}"))
        .find(|n| !names.contains(n))
        .expect("an unused name");
    names.insert(name.clone());
    let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    desc.values
        .insert(name.clone(), ValueDesc::new(DType::F32.onnx_code(), &dims));
    constants.push(NamedConstant {
        name: name.clone(),
        dtype: DType::F32,
        shape,
        data: Weight::from_vec(data),
    });
    name
}
