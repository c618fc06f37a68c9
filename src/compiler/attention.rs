//! Attention fusion (issue #14): the multi-head attention of HF-style
//! BERT/MiniLM/DistilBERT/RoBERTa/ViT exports, as kiln's IR holds it after
//! the epilogue pass, becomes one [`Op::Attention`]:
//!
//! ```text
//! q = Transpose(Reshape(Q [B,Sq,H·D] → [B,Sq,H,D]), [0,2,1,3])   [· or / scalar]
//! k = Transpose(Reshape(K [B,Sk,H·D] → [B,Sk,H,D]), [0,2,3,1])   (or [0,2,1,3] read transposed)
//! v = Transpose(Reshape(V [B,Sk,H·D] → [B,Sk,H,D]), [0,2,1,3])
//! s = MatMul(q, k) (alpha: the scale)   [· or / scalar]   [+ mask]
//! p = Softmax(s, axis 3)                [Dropout / same-shape Reshape]
//! y = Reshape(Transpose(MatMul(p, v), [0,2,1,3]) → [B,Sq,H·D])
//! ```
//!
//! The fused op reads Q, K and V in place and writes `y` (see
//! `kernels::attention`). Every intermediate must be read only inside the
//! pattern and not be a graph output; the products must have no bias,
//! activation or residual; the mask must be f32, broadcast to `[B,H,Sq,Sk]`
//! and have `Sk` as its last dim (`[B,1,1,Sk]` from an attention mask,
//! `[B,1,Sq,Sk]`, ...); the softmax must shift by the maximum (the op, or
//! the decomposed form written with `ReduceMax`). Anything else stays as it
//! is.

use super::patterns::{apply, replaced, Rewrite, View};
use crate::ir::{AttentionAttrs, BinaryOp, DType, Graph, MatMulAttrs, Op, ValueId};

/// Fuses every attention it finds; returns how many.
pub(crate) fn fuse(g: &mut Graph) -> usize {
    apply(g, attention)
}

/// Anchored at the Softmax node `si`.
fn attention(v: &View<'_>, si: usize, _: &mut Graph) -> Option<Rewrite> {
    let sm = &v.g.nodes[si];
    if sm.op
        != (Op::Softmax {
            axis: 3,
            unshifted: false,
        })
    {
        return None;
    }
    let mut remove = vec![si];
    let (scores, p) = (sm.inputs[0], sm.outputs[0]);
    // P, possibly through a Dropout (an alias of the same shape), into P·V.
    let mut pv_i = v.sole_use(p)?;
    let mut probs = p;
    if v.g.nodes[pv_i].op == Op::Reshape && v.g.values[v.g.nodes[pv_i].outputs[0]].ty == v.g.values[p].ty {
        remove.push(pv_i);
        probs = v.g.nodes[pv_i].outputs[0];
        pv_i = v.sole_use(probs)?;
    }
    let pv = &v.g.nodes[pv_i];
    if pv.op != Op::MatMul(MatMulAttrs::default()) || pv.inputs[0] != probs {
        return None;
    }
    remove.push(pv_i);
    // Mask and scale on the scores, back to Q·Kᵀ: the mask is added after
    // any scaling (a scale after it would scale the mask too).
    let (mut cur, mut mask, mut scale, mut scaled) = (scores, None, 1.0f64, false);
    loop {
        let (i, n) = v.producer(cur)?;
        v.sole_use(cur)?;
        if let Some(x) = scalar_factor(v, n, &mut scale) {
            remove.push(i);
            cur = x;
            scaled = true;
            continue;
        }
        if n.op == Op::Binary(BinaryOp::Add) && mask.is_none() && !scaled {
            let (x, m) = scores_and_mask(v, n, cur)?;
            mask = Some(m);
            remove.push(i);
            cur = x;
            continue;
        }
        if let Op::MatMul(attrs) = n.op {
            let plain = MatMulAttrs {
                alpha: attrs.alpha,
                trans_b: attrs.trans_b,
                ..MatMulAttrs::default()
            };
            if attrs != plain {
                return None;
            }
            scale *= attrs.alpha as f64;
            remove.push(i);
            return finish(v, i, pv_i, mask, scale, remove);
        }
        return None;
    }
}

/// The operands of the mask's `Add` (output `sum`): the scores (the sum's
/// shape, from the product or its scaling) and the mask.
fn scores_and_mask(v: &View<'_>, n: &crate::ir::Node, sum: ValueId) -> Option<(ValueId, ValueId)> {
    let [a, b] = n.inputs[..] else { return None };
    let from_scores = |x: ValueId| {
        v.g.values[x].ty.shape == v.g.values[sum].ty.shape
            && v.producer(x).is_some_and(|(_, p)| {
                matches!(
                    p.op,
                    Op::MatMul(_) | Op::Binary(BinaryOp::Mul) | Op::Binary(BinaryOp::Div)
                )
            })
    };
    let is_product = |x: ValueId| v.producer(x).is_some_and(|(_, p)| matches!(p.op, Op::MatMul(_)));
    [(a, b), (b, a)]
        .into_iter()
        .filter(|&(x, _)| from_scores(x))
        .max_by_key(|&(x, _)| is_product(x))
}

/// For `x · c` or `x / c` with a scalar constant `c`, folds `c` into
/// `scale` and returns `x`.
fn scalar_factor(v: &View<'_>, n: &crate::ir::Node, scale: &mut f64) -> Option<ValueId> {
    let [a, b] = n.inputs[..] else { return None };
    match n.op {
        Op::Binary(BinaryOp::Mul) => {
            let (x, c) = if v.scalar(b).is_some() {
                (a, v.scalar(b)?)
            } else {
                (b, v.scalar(a)?)
            };
            *scale *= c;
            Some(x)
        }
        Op::Binary(BinaryOp::Div) => {
            let c = v.scalar(b)?;
            *scale /= c;
            Some(a)
        }
        _ => None,
    }
}

/// The head views and the output side around the products `qk_i` and `pv_i`.
fn finish(
    v: &View<'_>,
    qk_i: usize,
    pv_i: usize,
    mask: Option<ValueId>,
    mut scale: f64,
    mut remove: Vec<usize>,
) -> Option<Rewrite> {
    let qk = &v.g.nodes[qk_i];
    let Op::MatMul(attrs) = qk.op else { return None };
    let (mut qt, kt) = (qk.inputs[0], qk.inputs[1]);
    let mut q_user = qk_i;
    // A scale on Q's heads (DistilBERT divides q by √d).
    if let Some((i, n)) = v.producer(qt) {
        if v.sole_use(qt) == Some(qk_i) {
            if let Some(x) = scalar_factor(v, n, &mut scale) {
                remove.push(i);
                qt = x;
                q_user = i;
            }
        }
    }
    let k_perm: &[usize] = if attrs.trans_b { &[0, 2, 1, 3] } else { &[0, 2, 3, 1] };
    let (q, heads) = head_view(v, qt, q_user, &[0, 2, 1, 3], &mut remove)?;
    let (k, k_heads) = head_view(v, kt, qk_i, k_perm, &mut remove)?;
    let pv = &v.g.nodes[pv_i];
    let (val, v_heads) = head_view(v, pv.inputs[1], pv_i, &[0, 2, 1, 3], &mut remove)?;
    let (qs, ks) = (&v.g.values[q].ty.shape, &v.g.values[k].ty.shape);
    if heads != k_heads || heads != v_heads || ks != &v.g.values[val].ty.shape || qs[0] != ks[0] || qs[2] != ks[2] {
        return None;
    }
    // Back to [B, Sq, H·D].
    let c = pv.outputs[0];
    let ti = v.sole_use(c)?;
    let t = &v.g.nodes[ti];
    let ct = t.outputs[0];
    let ri = v.sole_use(ct)?;
    let r = &v.g.nodes[ri];
    if t.op != (Op::Transpose { perm: vec![0, 2, 1, 3] })
        || r.op != Op::Reshape
        || v.g.values[r.outputs[0]].ty.shape != *qs
    {
        return None;
    }
    remove.push(ti);
    let mut inputs = vec![q, k, val];
    if let Some(m) = mask {
        let full = [qs[0], heads, qs[1], ks[1]];
        let mt = &v.g.values[m].ty;
        let fits = mt.dtype == DType::F32
            && mt.shape.len() <= 4
            && mt.shape.last() == Some(&ks[1])
            && crate::ir::broadcast_shapes(&mt.shape, &full).as_deref() == Some(&full[..]);
        if !fits {
            return None;
        }
        inputs.push(m);
    }
    let op = Op::Attention(AttentionAttrs {
        heads,
        scale: scale as f32,
        mask: mask.is_some(),
    });
    remove.retain(|&k| k != ri);
    Some(Rewrite {
        at: ri,
        node: replaced(r, op, inputs),
        remove,
    })
}

/// `Transpose(Reshape(x [B, S, H·D] → [B, S, H, D]), perm)` read only by
/// node `user`: returns `x` and `H`.
fn head_view(
    v: &View<'_>,
    t: ValueId,
    user: usize,
    perm: &[usize],
    remove: &mut Vec<usize>,
) -> Option<(ValueId, usize)> {
    let (ti, tn) = v.producer(t)?;
    if v.sole_use(t)? != user || tn.op != (Op::Transpose { perm: perm.to_vec() }) {
        return None;
    }
    let r = tn.inputs[0];
    let (ri, rn) = v.producer(r)?;
    if v.sole_use(r)? != ti || rn.op != Op::Reshape {
        return None;
    }
    let x = rn.inputs[0];
    let (xs, rs) = (&v.g.values[x].ty.shape, &v.g.values[r].ty.shape);
    let split = xs.len() == 3 && rs.len() == 4 && xs[..2] == rs[..2] && rs[2] * rs[3] == xs[2] && rs[2] > 0;
    if !split || v.g.values[x].ty.dtype != DType::F32 {
        return None;
    }
    remove.extend([ti, ri]);
    Some((x, rs[2]))
}
