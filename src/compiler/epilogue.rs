//! Epilogue fusion: folds what follows a matrix product into the GEMM's
//! epilogue, `y = act(alpha·A·B + bias) + residual`, so the product's output
//! is written once, already finished:
//!
//! 1. `Mul`/`Div` by a scalar constant (nothing fused yet) → `alpha`;
//! 2. `Add` of a constant row of `n` values (no activation or residual
//!    yet) → per-column bias;
//! 3. an activation (Relu, LeakyRelu, Sigmoid, Tanh, Gelu, Clip,
//!    HardSigmoid, HardSwish, SiLU; no residual yet) → `activation`;
//! 4. `Add` of a tensor of the output's shape (no residual yet) → residual.
//!
//! Each step needs the product's current output to have exactly one reader
//! and not be a graph output. The fused node takes the place of the last
//! node it absorbs, where all its inputs are already defined.
//!
//! Before that, [`see_through_reshapes`] turns `Reshape → MatMul → Reshape`
//! (how ORT's MatMulAddFusion rewrites a 3-D `MatMul + Add` into a 2-D
//! `Gemm`) back into the batched product it is, so that what follows the
//! second Reshape (GELU, the residual) can fuse.

use super::patterns::{strip_ones, View};
use crate::ir::{Activation, BiasKind, BinaryOp, DType, Graph, MatMulAttrs, Node, Op, UnaryOp, ValueId};

/// Fuses epilogues into every matrix product; returns how many ops were absorbed
/// (a see-through of the Reshapes around a product counts as one).
pub(crate) fn fuse(g: &mut Graph) -> usize {
    let mut fused = see_through_reshapes(g);
    // Each round absorbs at most one op per product; repeat to a fixpoint.
    loop {
        let n = round(g);
        if n == 0 {
            return fused;
        }
        fused += n;
    }
}

fn round(g: &mut Graph) -> usize {
    let snapshot = g.clone();
    let v = View::new(&snapshot);
    let mut dead = vec![false; g.nodes.len()];
    let mut taken = vec![false; g.nodes.len()];
    let mut count = 0;
    for (i, node) in snapshot.nodes.iter().enumerate() {
        let Op::MatMul(attrs) = &node.op else { continue };
        if taken[i] {
            continue;
        }
        let out = node.outputs[0];
        let Some(j) = v.sole_use(out) else { continue };
        if taken[j] {
            continue;
        }
        if let Some(new) = absorb(&v, node, attrs, &snapshot.nodes[j], out) {
            g.nodes[j] = new;
            dead[i] = true;
            taken[i] = true;
            taken[j] = true;
            count += 1;
        }
    }
    let mut k = 0;
    g.nodes.retain(|_| {
        k += 1;
        !dead[k - 1]
    });
    count
}

/// Rewrites `z = Reshape(MatMul(Reshape(x), w, …))` into `z = MatMul(x, w, …)`
/// where that is the same product: `x` is `[d…, k]`, the inner Reshape makes it
/// `[prod(d), k]`, the 2-D product (no `trans_a`, a 2-D `w`, no bias other
/// than a row, no residual) gives `[prod(d), n]` and the outer Reshape makes
/// that `[d…, n]`. The product's output must be read only by the outer
/// Reshape and not be a graph output; the inner Reshape stays if something
/// else reads it (dead-code removal drops it otherwise). Returns how many
/// products were rewritten.
pub(crate) fn see_through_reshapes(g: &mut Graph) -> usize {
    let snapshot = g.clone();
    let v = View::new(&snapshot);
    let mut dead = vec![false; g.nodes.len()];
    let mut count = 0;
    for (i, node) in snapshot.nodes.iter().enumerate() {
        let Op::MatMul(attrs) = &node.op else { continue };
        if attrs.trans_a || attrs.residual || !matches!(attrs.bias, BiasKind::None | BiasKind::Row) {
            continue;
        }
        let (r, w, y) = (node.inputs[0], node.inputs[1], node.outputs[0]);
        let Some((_, inner)) = v.producer(r) else { continue };
        let Some(j) = v.sole_use(y) else { continue };
        let outer = &snapshot.nodes[j];
        if inner.op != Op::Reshape || outer.op != Op::Reshape || outer.inputs[0] != y {
            continue;
        }
        let (x, z) = (inner.inputs[0], outer.outputs[0]);
        let ty = |id: ValueId| &snapshot.values[id].ty;
        let (xs, rs, ys, zs) = (&ty(x).shape, &ty(r).shape, &ty(y).shape, &ty(z).shape);
        if ty(x).dtype != DType::F32 || rs.len() != 2 || ty(w).shape.len() != 2 || xs.len() < 2 || zs.len() != xs.len()
        {
            continue;
        }
        let (lead, k) = (&xs[..xs.len() - 1], xs[xs.len() - 1]);
        let rows: usize = lead.iter().product();
        let n = ys[1];
        if rs[..] != [rows, k] || ys[0] != rows || zs[..zs.len() - 1] != *lead || zs[zs.len() - 1] != n {
            continue;
        }
        let mut inputs = node.inputs.clone();
        inputs[0] = x;
        g.nodes[j] = Node {
            name: node.name.clone(),
            op: node.op.clone(),
            inputs,
            outputs: vec![z],
        };
        dead[i] = true;
        count += 1;
    }
    let mut k = 0;
    g.nodes.retain(|_| {
        k += 1;
        !dead[k - 1]
    });
    count
}

pub(super) fn activation(op: &Op) -> Option<Activation> {
    Some(match op {
        Op::Unary(UnaryOp::Relu) => Activation::Relu,
        Op::Unary(UnaryOp::LeakyRelu(a)) => Activation::LeakyRelu(*a),
        Op::Unary(UnaryOp::Sigmoid) => Activation::Sigmoid,
        Op::Unary(UnaryOp::Tanh) => Activation::Tanh,
        Op::Unary(UnaryOp::Gelu) => Activation::GeluErf,
        Op::Unary(UnaryOp::GeluTanh) => Activation::GeluTanh,
        Op::Unary(UnaryOp::GeluWritten) => Activation::GeluErfWritten,
        Op::Unary(UnaryOp::GeluTanhWritten) => Activation::GeluTanhWritten,
        Op::Unary(UnaryOp::Clip(lo, hi)) => Activation::Clip(*lo, *hi),
        // Activations (issue #13).
        Op::Unary(UnaryOp::HardSigmoid(alpha, beta)) => Activation::HardSigmoid(*alpha, *beta),
        Op::Unary(UnaryOp::HardSwish) => Activation::HardSwish,
        Op::Unary(UnaryOp::Silu) => Activation::Silu,
        _ => return None,
    })
}

/// The product `mm` (with `attrs`, output `out`) extended by `next`, if possible.
fn absorb(v: &View<'_>, mm: &Node, attrs: &MatMulAttrs, next: &Node, out: ValueId) -> Option<Node> {
    let g = v.g;
    let out_ty = &g.values[out].ty;
    if g.values[next.outputs[0]].ty != *out_ty {
        return None; // broadcasting would change the shape
    }
    let mut a = *attrs;
    let mut inputs = mm.inputs[..2].to_vec();
    let mut bias = (attrs.bias != BiasKind::None).then(|| mm.inputs[2]);
    let mut residual = attrs.residual.then(|| mm.inputs[mm.inputs.len() - 1]);
    let plain = a.bias == BiasKind::None && a.activation == Activation::None && !a.residual;
    let n = *out_ty.shape.last()?;
    if let Some(act) = activation(&next.op) {
        if a.activation != Activation::None || a.residual {
            return None;
        }
        a.activation = act;
    } else if let Some(c) = v
        .other(next, BinaryOp::Mul, out)
        .or_else(|| (next.op == Op::Binary(BinaryOp::Div) && next.inputs[0] == out).then(|| next.inputs[1]))
    {
        let s = v.scalar(c)?;
        if !plain {
            return None;
        }
        a.alpha = if next.op == Op::Binary(BinaryOp::Div) {
            (a.alpha as f64 / s) as f32
        } else {
            (a.alpha as f64 * s) as f32
        };
    } else if let Some(o) = v.other(next, BinaryOp::Add, out) {
        if o == out || g.values[o].ty.dtype != DType::F32 {
            return None;
        }
        let row = g.constant(o).is_some() && strip_ones(&g.values[o].ty.shape) == [n];
        if row && a.bias == BiasKind::None && a.activation == Activation::None && !a.residual {
            a.bias = BiasKind::Row;
            bias = Some(o);
        } else if !a.residual && g.values[o].ty == *out_ty {
            a.residual = true;
            residual = Some(o);
        } else {
            return None;
        }
    } else {
        return None;
    }
    inputs.extend(bias);
    inputs.extend(residual);
    Some(Node {
        name: next.name.clone(),
        op: Op::MatMul(a),
        inputs,
        outputs: next.outputs.clone(),
    })
}
