//! Attention fusion (issue #14): the multi-head attention of HF-style
//! BERT/MiniLM/DistilBERT/RoBERTa/ViT exports, eager or through PyTorch's
//! `scaled_dot_product_attention` (SDPA), as kiln's IR holds it after the
//! epilogue pass, becomes one [`Op::Attention`]:
//!
//! ```text
//! q = Transpose(Reshape(Q [B,Sq,H·D] → [B,Sq,H,D]), [0,2,1,3])   [· or / scalar]
//! k = Transpose(Reshape(K [B,Sk,H·D] → [B,Sk,H,D]), [0,2,3,1])   [· or / scalar]
//!     (or [0,2,1,3] read transposed)
//! v = Transpose(Reshape(V [B,Sk,H·D] → [B,Sk,H,D]), [0,2,1,3])
//! s = MatMul(q, k) (alpha: the scale)   [· or / scalar]   [+ mask | masked fill]
//! p = Softmax(s, axis 3)                [Dropout / same-shape Reshape]
//! y = Reshape(Transpose(MatMul(p, v), [0,2,1,3]) → [B,Sq,H·D])
//! ```
//!
//! Every scalar on Q, K (either side of the head transpose: the layout pass
//! may move it; SDPA scales both Q and Kᵀ by √scale) or the scores folds
//! into the op's scale. The fused op reads Q, K and V in place and writes
//! `y` (see `kernels::attention`). Every intermediate must be read only
//! inside the pattern and not be a graph output; the products must have no
//! bias, activation or residual; the mask must be f32, broadcast to
//! `[B,H,Sq,Sk]` and have `Sk` as its last dim (`[B,1,1,Sk]` from an
//! attention mask, `[B,1,Sq,Sk]`, ...); the softmax must shift by the maximum
//! (the op, or the decomposed form written with `ReduceMax`). Anything else
//! stays as it is.
//!
//! A masked fill (DistilBERT's `scores.masked_fill(mask, finfo.min)`) is
//! `Where(c, f, s)` (or `Where(c, s, f)`), `c` bool and usually
//! `Expand(c0, Shape(s))`, with `f` exactly `f32::MIN` or `-inf`. It becomes
//! the additive mask `Where(c0, f, 0)`, a new node at `c0`'s (broadcast)
//! shape. The softmax sees the same scores for finite `s`: where `c` is
//! false both give `s` (`s + 0`); where it is true, `s + f32::MIN` rounds to
//! `f32::MIN` for |s| < 2¹⁰³ (half an ulp of it) and `s + -inf` is `-inf`, so
//! both give `f`. A row that keeps a key then has a finite maximum and
//! `exp(f - max) = 0` at the masked keys either way; a fully masked row is
//! all `f32::MIN` (uniform weights) or all `-inf` (NaN: `-inf - -inf`) in
//! both forms, which is what ORT's CPU EP computes for the unfused graph
//! (`python/tests/test_attention_fusion.py`). Only a non-finite score at a
//! masked key differs (NaN or ±inf in K's padded rows: `Where` hides it, the
//! sum does not). Another fill (-10000, -1e9) is not absorbed by the sum, and
//! would not give a fully masked row uniform weights, so it is not fused.

use super::patterns::{apply, replaced, Rewrite, View};
use crate::ir::{infer, AttentionAttrs, BinaryOp, DType, Graph, MatMulAttrs, Node, Op, TensorType, ValueId};

/// Fuses every attention it finds; returns how many.
pub(crate) fn fuse(g: &mut Graph) -> usize {
    apply(g, attention)
}

/// Where the fused op's mask comes from.
#[derive(Clone, Copy)]
enum MaskSource {
    /// An f32 value added to the scores.
    Added(ValueId),
    /// A masked fill (see the module doc): the `Where`'s condition, the same
    /// before an `Expand` (if there is one), the fill constant, and whether
    /// the scores are the `Where`'s second operand (kept where `cond`).
    Filled {
        cond: ValueId,
        unexpanded: ValueId,
        fill: ValueId,
        keep: bool,
    },
}

/// Anchored at the Softmax node `si`.
fn attention(v: &View<'_>, si: usize, g: &mut Graph) -> Option<Rewrite> {
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
        if mask.is_none() && !scaled {
            let found = match n.op {
                Op::Binary(BinaryOp::Add) => scores_and_mask(v, n, cur),
                Op::Where => masked_fill(v, n, cur),
                _ => None,
            };
            if let Some((x, m)) = found {
                mask = Some(m);
                remove.push(i);
                cur = x;
                continue;
            }
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
            return finish(v, g, i, pv_i, mask, scale, remove);
        }
        return None;
    }
}

/// The operands of the mask's `Add` (output `sum`): the scores (the sum's
/// shape, from the product or its scaling) and the mask.
fn scores_and_mask(v: &View<'_>, n: &Node, sum: ValueId) -> Option<(ValueId, MaskSource)> {
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
        .map(|(x, m)| (x, MaskSource::Added(m)))
}

/// `Where(cond, fill, s)` or `Where(cond, s, fill)` (output `out`, of the
/// scores' type) with `fill` `f32::MIN` or `-inf`: the scores and the mask.
fn masked_fill(v: &View<'_>, n: &Node, out: ValueId) -> Option<(ValueId, MaskSource)> {
    let [cond, a, b] = n.inputs[..] else { return None };
    let is_fill = |x: ValueId| {
        v.scalar(x)
            .is_some_and(|c| c == f32::MIN as f64 || c == f64::NEG_INFINITY)
    };
    let is_scores = |x: ValueId| v.g.values[x].ty == v.g.values[out].ty;
    let (s, fill, keep) = if is_fill(a) && is_scores(b) {
        (b, a, false)
    } else if is_fill(b) && is_scores(a) {
        (a, b, true)
    } else {
        return None;
    };
    let unexpanded = match v.producer(cond) {
        Some((_, e)) if e.op == Op::Expand => e.inputs[0],
        _ => cond,
    };
    Some((
        s,
        MaskSource::Filled {
            cond,
            unexpanded,
            fill,
            keep,
        },
    ))
}

/// For `x · c` or `x / c` with a scalar constant `c`, folds `c` into
/// `scale` and returns `x`.
fn scalar_factor(v: &View<'_>, n: &Node, scale: &mut f64) -> Option<ValueId> {
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
    g: &mut Graph,
    qk_i: usize,
    pv_i: usize,
    mask: Option<MaskSource>,
    mut scale: f64,
    mut remove: Vec<usize>,
) -> Option<Rewrite> {
    let qk = &v.g.nodes[qk_i];
    let Op::MatMul(attrs) = qk.op else { return None };
    let k_perm: &[usize] = if attrs.trans_b { &[0, 2, 1, 3] } else { &[0, 2, 3, 1] };
    let (q, heads) = head_view(v, qk.inputs[0], qk_i, &[0, 2, 1, 3], Some(&mut scale), &mut remove)?;
    let (k, k_heads) = head_view(v, qk.inputs[1], qk_i, k_perm, Some(&mut scale), &mut remove)?;
    let pv = &v.g.nodes[pv_i];
    // No factor on V: it would scale the output, not the scores.
    let (val, v_heads) = head_view(v, pv.inputs[1], pv_i, &[0, 2, 1, 3], None, &mut remove)?;
    let (qs, ks) = (&v.g.values[q].ty.shape, &v.g.values[k].ty.shape);
    if heads != k_heads || heads != v_heads || ks != &v.g.values[val].ty.shape || qs[0] != ks[0] || qs[2] != ks[2] {
        return None;
    }
    if !(scale as f32).is_finite() {
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
    let mut before = Vec::new();
    if let Some(m) = mask {
        let full = [qs[0], heads, qs[1], ks[1]];
        let (m, node) = mask_value(v, g, m, &full, &r.name)?;
        inputs.push(m);
        before.extend(node);
    }
    let op = Op::Attention(AttentionAttrs {
        heads,
        scale: scale as f32,
        mask: mask.is_some(),
        packed_qkv: false,
    });
    remove.retain(|&k| k != ri);
    Some(Rewrite {
        at: ri,
        node: replaced(r, op, inputs),
        remove,
        before,
    })
}

/// Whether a mask of type `ty` broadcasts to `full` (`[B, H, Sq, Sk]`) with
/// `Sk` its last dim, as the kernel reads it.
fn fits(ty: &TensorType, dtype: DType, full: &[usize; 4]) -> bool {
    ty.dtype == dtype
        && ty.shape.len() <= 4
        && ty.shape.last() == Some(&full[3])
        && crate::ir::broadcast_shapes(&ty.shape, full).as_deref() == Some(&full[..])
}

/// The fused op's f32 mask, and for a masked fill the new node computing it
/// (`Where(cond, fill, 0)`, from the condition before its `Expand` when that
/// fits). Only called once the match is certain: it adds values to `g`.
fn mask_value(
    v: &View<'_>,
    g: &mut Graph,
    m: MaskSource,
    full: &[usize; 4],
    name: &str,
) -> Option<(ValueId, Option<Node>)> {
    let (cond, unexpanded, fill, keep) = match m {
        MaskSource::Added(m) => return fits(&v.g.values[m].ty, DType::F32, full).then_some((m, None)),
        MaskSource::Filled {
            cond,
            unexpanded,
            fill,
            keep,
        } => (cond, unexpanded, fill, keep),
    };
    let cond = [unexpanded, cond]
        .into_iter()
        .find(|&c| fits(&v.g.values[c].ty, DType::Bool, full))?;
    let zero = g.fresh_value("attention_mask_zero", TensorType::f32(&[]));
    g.add_constant(zero, vec![0.0]).ok()?;
    let inputs = if keep {
        vec![cond, zero, fill]
    } else {
        vec![cond, fill, zero]
    };
    let tys: Vec<&TensorType> = inputs.iter().map(|&x| &g.values[x].ty).collect();
    let ty = infer(&Op::Where, &tys, None).ok()?.remove(0);
    if !fits(&ty, DType::F32, full) {
        return None;
    }
    let out = g.fresh_value("attention_mask", ty);
    let node = Node {
        name: format!("{name}/mask"),
        op: Op::Where,
        inputs,
        outputs: vec![out],
    };
    Some((out, Some(node)))
}

/// `Transpose(Reshape(x [B, S, H·D] → [B, S, H, D]), perm)` read only by
/// node `user`: returns `x` and `H`. With `scale`, scalar factors on either
/// side of the transpose fold into it.
fn head_view(
    v: &View<'_>,
    t: ValueId,
    user: usize,
    perm: &[usize],
    mut scale: Option<&mut f64>,
    remove: &mut Vec<usize>,
) -> Option<(ValueId, usize)> {
    let (t, user) = through_factor(v, t, user, scale.as_deref_mut(), remove);
    let (ti, tn) = v.producer(t)?;
    if v.sole_use(t)? != user || tn.op != (Op::Transpose { perm: perm.to_vec() }) {
        return None;
    }
    let (r, r_user) = through_factor(v, tn.inputs[0], ti, scale, remove);
    let (ri, rn) = v.producer(r)?;
    if v.sole_use(r)? != r_user || rn.op != Op::Reshape {
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

/// `x` and its node if `t` is `x · c` or `x / c` (scalar `c`, folded into
/// `scale`) read only by `user`; else `t` and `user`.
fn through_factor(
    v: &View<'_>,
    t: ValueId,
    user: usize,
    scale: Option<&mut f64>,
    remove: &mut Vec<usize>,
) -> (ValueId, usize) {
    let (Some(scale), Some((i, n))) = (scale, v.producer(t)) else {
        return (t, user);
    };
    if v.sole_use(t) != Some(user) {
        return (t, user);
    }
    match scalar_factor(v, n, scale) {
        Some(x) => {
            remove.push(i);
            (x, i)
        }
        None => (t, user),
    }
}
