//! Embeddings + LayerNorm as one op (issue #14; ORT's own
//! `EmbedLayerNormalization` fusion runs only inside the CPU EP). A BERT
//! embedding layer is
//!
//! ```text
//! x = Gather(word, ids) + Gather(type, token_types) + Gather(position, positions)
//! y = LayerNorm(x)
//! ```
//!
//! and becomes one `EmbedLayerNorm` whose kernel sums each row's terms and
//! normalises it while it is in cache, instead of one pass per gather, per
//! add and for the norm. A term whose gather folded to a constant (the
//! positions and token types of a static shape) is added as it is.
//!
//! Conditions: a LayerNorm over the last axis reads a chain of f32 `Add`s,
//! each read only by the next (the last only by the norm, none a graph
//! output), with at least one `Gather` on axis 0 of a 2-D f32 table among
//! its operands. A gather read only by the chain becomes a gathered term;
//! any other operand is added as it is, if its last dim is the row width.
//! The sum keeps the graph's order (`(t0 + t1) + t2`; `a + b` and `b + a`
//! are the same in floating point), so results are unchanged bit for bit.

use super::patterns::{apply, replaced, Rewrite, View};
use crate::ir::{infer, BinaryOp, DType, EmbedAttrs, EmbedTerm, Graph, Op, ValueId};

/// Fuses every embedding layer norm that qualifies; returns how many.
pub(crate) fn fuse(g: &mut Graph) -> usize {
    apply(g, embed_layer_norm)
}

/// Anchored at a LayerNorm node `li`.
fn embed_layer_norm(v: &View<'_>, li: usize, _: &mut Graph) -> Option<Rewrite> {
    let ln = &v.g.nodes[li];
    let Op::LayerNorm {
        axis,
        epsilon,
        decomposed,
    } = ln.op
    else {
        return None;
    };
    let x = ln.inputs[0];
    if axis + 1 != v.g.ty(x).shape.len() {
        return None;
    }
    let (leaves, adds) = sum_chain(v, x, li)?;
    let mut terms = Vec::with_capacity(leaves.len());
    let mut inputs = ln.inputs[1..].to_vec();
    let mut remove = adds;
    for (leaf, user) in leaves {
        match gathered(v, leaf, user) {
            Some((gi, table, idx)) => {
                terms.push(EmbedTerm::Gathered);
                inputs.extend([table, idx]);
                remove.push(gi);
            }
            None => {
                terms.push(EmbedTerm::Added);
                inputs.push(leaf);
            }
        }
    }
    if !terms.contains(&EmbedTerm::Gathered) {
        return None;
    }
    let op = Op::EmbedLayerNorm(EmbedAttrs {
        epsilon,
        decomposed,
        bias: ln.inputs.len() == 3,
        terms,
    });
    // The op's own rule decides the rest (widths, broadcasting, dtypes).
    let types: Vec<_> = inputs.iter().map(|&i| v.g.ty(i)).collect();
    let out = infer(&op, &types, None).ok()?;
    if out.first() != Some(v.g.ty(ln.outputs[0])) {
        return None;
    }
    Some(Rewrite {
        at: li,
        node: replaced(ln, op, inputs),
        remove,
        before: Vec::new(),
    })
}

/// A summand and the node (an Add) that reads it.
type Leaf = (ValueId, usize);

/// The summands of the `Add` chain ending in `x` (read by node `user`), in
/// the order they are added; and the chain's Adds. None if `x` is not an
/// f32 Add read only by `user`.
fn sum_chain(v: &View<'_>, x: ValueId, user: usize) -> Option<(Vec<Leaf>, Vec<usize>)> {
    let (mut cur, mut user) = (x, user);
    let mut leaves = Vec::new();
    let mut adds = Vec::new();
    while let Some((ai, a, b)) = add_read_by(v, cur, user) {
        adds.push(ai);
        // The operand that is itself such an Add continues the chain.
        let (next, leaf) = if add_read_by(v, a, ai).is_some() {
            (a, b)
        } else {
            (b, a)
        };
        leaves.push((leaf, ai));
        (cur, user) = (next, ai);
    }
    let &last = adds.last()?;
    // The innermost Add's other operand is the first term.
    leaves.push((cur, last));
    leaves.reverse();
    Some((leaves, adds))
}

/// The f32 `Add` producing `x` and its operands, if `x` is read only by
/// node `user` and the operands differ.
fn add_read_by(v: &View<'_>, x: ValueId, user: usize) -> Option<(usize, ValueId, ValueId)> {
    let (ai, add) = v.producer(x)?;
    let ok = add.op == Op::Binary(BinaryOp::Add) && v.g.ty(x).dtype == DType::F32 && v.sole_use(x) == Some(user);
    match add.inputs[..] {
        [a, b] if ok && a != b => Some((ai, a, b)),
        _ => None,
    }
}

/// The `Gather` on axis 0 of a 2-D table producing `leaf`, if only `user`
/// reads it: (node, table, indices).
fn gathered(v: &View<'_>, leaf: ValueId, user: usize) -> Option<(usize, ValueId, ValueId)> {
    let (gi, gather) = v.producer(leaf)?;
    let [table, indices] = gather.inputs[..] else {
        return None;
    };
    let ok = gather.op == (Op::Gather { axis: 0 }) && v.g.ty(table).shape.len() == 2 && v.sole_use(leaf) == Some(user);
    ok.then_some((gi, table, indices))
}
