//! Q, K and V's projections as one product (issue #14). After the attention
//! fusion, a self-attention reads three products of the same activations:
//!
//! ```text
//! Q = X · Wq (+ bq)    K = X · Wk (+ bk)    V = X · Wv (+ bv)
//! y = Attention(Q, K, V[, mask])
//! ```
//!
//! They become one product whose B is the three weights side by side, read
//! as three packed parts (`plan::MatB::PackedParts`: each weight is packed
//! once, as before, and a shape-generic partition shares it between input
//! shapes), and an attention that reads Q, K and V from its rows:
//!
//! ```text
//! QKV = X · [Wq | Wk | Wv] (+ [bq | bk | bv])     [B, S, 3·H·D]
//! y = Attention(QKV[, mask])   (packed_qkv)
//! ```
//!
//! X is packed for the GEMM once instead of three times, and the product
//! splits over threads as one. Every column is computed as before (the
//! same K blocking and kernels), so results are unchanged bit for bit.
//!
//! Conditions: the three products read the same A, are not transposed on
//! A, have the same attributes (alpha, `trans_b`) with no activation or
//! residual, and either all a per-column bias or none; each B is a 2-D
//! constant of the same shape whose N is a multiple of 32 (every target's
//! panel width divides it, so each part is whole panels); Q, K and V are
//! distinct, read only by the attention, and not graph outputs.

use super::patterns::{apply, replaced, Rewrite, View};
use crate::ir::{AttentionAttrs, BiasKind, Graph, MatMulAttrs, Node, Op, TensorType, ValueId};

/// Widest panel of any target (`kernels::gemm::Blocking::nr`): a part's N
/// must be a multiple of it.
const PANEL_MAX: usize = 32;

/// Merges the projections of every attention that qualifies; returns how many.
pub(crate) fn fuse(g: &mut Graph) -> usize {
    apply(g, qkv)
}

/// Anchored at an (unpacked) attention node `ai`.
fn qkv(v: &View<'_>, ai: usize, g: &mut Graph) -> Option<Rewrite> {
    let at = &v.g.nodes[ai];
    let Op::Attention(attrs) = at.op else { return None };
    if attrs.packed_qkv {
        return None;
    }
    let (q, k, val) = (at.inputs[0], at.inputs[1], at.inputs[2]);
    if q == k || k == val || q == val {
        return None;
    }
    let mut products = Vec::new();
    for x in [q, k, val] {
        let (pi, p) = v.producer(x)?;
        if v.sole_use(x) != Some(ai) {
            return None;
        }
        products.push((pi, p));
    }
    let Op::MatMul(mm) = products[0].1.op else { return None };
    let a = products[0].1.inputs[0];
    let same = products.iter().all(|(_, p)| p.op == Op::MatMul(mm) && p.inputs[0] == a);
    if !same || !mergeable(&mm) {
        return None;
    }
    let weights: Vec<ValueId> = products.iter().map(|(_, p)| p.inputs[1]).collect();
    let w_ty = v.g.ty(weights[0]);
    let n = w_ty.shape.get(usize::from(!mm.trans_b)).copied()?;
    let fits = w_ty.shape.len() == 2 && weights.iter().all(|&w| v.g.constant(w).is_some() && v.g.ty(w) == w_ty);
    if !fits || n == 0 || n % PANEL_MAX != 0 {
        return None;
    }
    // The product's output: Q's type with three times its last dim.
    let mut shape = v.g.ty(q).shape.clone();
    *shape.last_mut()? *= 3;
    let mut inputs = vec![a];
    inputs.extend(&weights);
    if mm.bias == BiasKind::Row {
        let biases: Vec<ValueId> = products.iter().map(|(_, p)| p.inputs[2]).collect();
        inputs.push(concat_biases(v, g, &biases, &at.name)?);
    }
    let packed = g.fresh_value(&format!("{}_qkv", at.name), TensorType::f32(&shape));
    let product = Node {
        name: format!("{}_qkv", at.name),
        op: Op::MatMul(MatMulAttrs { b_parts: 3, ..mm }),
        inputs,
        outputs: vec![packed],
    };
    let mut att_inputs = vec![packed];
    att_inputs.extend(at.inputs.get(3));
    let op = Op::Attention(AttentionAttrs {
        packed_qkv: true,
        ..attrs
    });
    Some(Rewrite {
        at: ai,
        node: replaced(at, op, att_inputs),
        remove: products.iter().map(|&(pi, _)| pi).collect(),
        before: vec![product],
    })
}

/// A product the merge can take: one B, A not transposed, nothing after
/// the per-column bias.
fn mergeable(mm: &MatMulAttrs) -> bool {
    mm.b_parts == 1
        && !mm.trans_a
        && matches!(mm.bias, BiasKind::None | BiasKind::Row)
        && mm.activation == crate::ir::Activation::None
        && !mm.residual
}

/// A new constant: the three per-column biases one after another.
fn concat_biases(v: &View<'_>, g: &mut Graph, biases: &[ValueId], name: &str) -> Option<ValueId> {
    let mut data = Vec::new();
    for &b in biases {
        data.extend_from_slice(v.g.constant(b)?.as_slice());
    }
    let id = g.fresh_value(&format!("{name}_qkv_bias"), TensorType::f32(&[data.len()]));
    g.add_constant(id, data).ok()?;
    Some(id)
}
