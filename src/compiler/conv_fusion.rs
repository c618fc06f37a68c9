//! Convolution epilogue fusion (issue #13): folds what follows a `Conv`
//! (channels-last, so its channels are the last dim) into it, repeatedly:
//!
//! 1. `Mul` by a per-channel (`[Co]`, leading 1s allowed) or scalar
//!    constant, before any activation or residual → the weights (and a
//!    constant bias) scaled per output channel;
//! 2. `Add` of such a constant, before any activation or residual → the bias
//!    (BatchNormalization, imported as exactly this scale and shift, ends
//!    up in the convolution's weights and bias);
//! 3. an activation (the mapping the GEMM epilogue fusion uses), before any
//!    residual;
//! 4. `Add` of a tensor of the output's shape → the residual;
//! 5. an activation after the residual (ResNet's Relu after each skip
//!    connection) → `after`.
//!
//! As in [`super::epilogue`], the convolution's current output must have
//! exactly one reader and not be a graph output, and the fused node takes
//! the place of the last node it absorbs. Reshapes may stand between the
//! convolution and what it absorbs (not a residual) when the last one ends
//! with the channels: the fused convolution then keeps its place and
//! output, and the last Reshape writes the absorbed node's output.

use super::epilogue::activation;
use super::patterns::{strip_ones, View};
use crate::ir::{Activation, BinaryOp, ConvAttrs, DType, Graph, Node, Op, TensorType, ValueId};
use crate::plan::Weight;

/// Fuses into every convolution; returns how many ops were absorbed.
pub(crate) fn fuse(g: &mut Graph) -> usize {
    let mut fused = 0;
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
        let Op::Conv(attrs) = &node.op else { continue };
        let Some(j) = v.sole_use(node.outputs[0]) else { continue };
        if taken[i] || taken[j] {
            continue;
        }
        if let Some((last, r, k)) = reshape_between(&v, node, j) {
            // conv → Reshape(s) → next: the convolution absorbs `next` and
            // keeps its own output; the last Reshape then writes next's.
            if taken[last] || taken[k] {
                continue;
            }
            let Some(mut new) = absorb(g, &v, node, attrs, &snapshot.nodes[k], r) else {
                continue;
            };
            new.outputs = node.outputs.clone();
            g.nodes[i] = new;
            g.nodes[last].outputs = snapshot.nodes[k].outputs.clone();
            dead[k] = true;
            taken[i] = true;
            taken[j] = true;
            taken[last] = true;
            taken[k] = true;
            count += 1;
            continue;
        }
        if let Some(new) = absorb(g, &v, node, attrs, &snapshot.nodes[j], node.outputs[0]) {
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

/// The per-channel values of constant `c` for `co` channels: a scalar is
/// repeated, `[co]` (with leading 1s) taken as is.
fn per_channel(g: &Graph, c: ValueId, co: usize) -> Option<Vec<f32>> {
    let ty = &g.values[c].ty;
    let w = g.constant(c)?;
    if ty.dtype != DType::F32 {
        return None;
    }
    match strip_ones(&ty.shape) {
        [] => Some(vec![w.as_slice()[0]; co]),
        [n] if *n == co => Some(w.as_slice().to_vec()),
        _ => None,
    }
}

/// When node `j`, the sole reader of `conv`'s output, starts a chain of
/// Reshapes, each read only by the next, the last of which ends with the
/// channels (Magika's `[N, L, 1, C] → [N, L, C, 1] → [N, L, C]`, the
/// Squeeze of a 1-D convolution's unit width in channels-last): the last
/// Reshape, its output and that output's one reader. A Reshape keeps the
/// values' order, so value `i` is still channel `i % C`.
fn reshape_between(v: &View<'_>, conv: &Node, mut j: usize) -> Option<(usize, ValueId, usize)> {
    let channels = v.g.values[conv.outputs[0]].ty.shape.last();
    loop {
        let r = &v.g.nodes[j];
        if r.op != Op::Reshape {
            return None;
        }
        let k = v.sole_use(r.outputs[0])?;
        if v.g.nodes[k].op != Op::Reshape {
            let ends_with_channels = v.g.values[r.outputs[0]].ty.shape.last() == channels;
            return ends_with_channels.then_some((j, r.outputs[0], k));
        }
        j = k;
    }
}

/// The convolution `conv` extended by `next`, which reads its output as
/// `out` (the output itself, or the last of [`reshape_between`]'s
/// Reshapes: then no residual), if possible (adding the new weight and
/// bias constants to `g`).
fn absorb(g: &mut Graph, v: &View<'_>, conv: &Node, attrs: &ConvAttrs, next: &Node, out: ValueId) -> Option<Node> {
    let s = v.g;
    let reshaped = out != conv.outputs[0];
    let out_ty = s.values[out].ty.clone();
    if s.values[next.outputs[0]].ty != out_ty {
        return None; // broadcasting would change the shape
    }
    let co = *out_ty.shape.last()?;
    let mut a = attrs.clone();
    let mut w = conv.inputs[1];
    let mut bias = attrs.bias.then(|| conv.inputs[2]);
    let mut residual = attrs.residual.then(|| conv.inputs[conv.inputs.len() - 1]);
    let open = a.activation == Activation::None && !a.residual;
    if let Some(act) = activation(&next.op) {
        if a.after != Activation::None {
            return None;
        } else if a.residual {
            a.after = act;
        } else if a.activation == Activation::None {
            a.activation = act;
        } else {
            return None;
        }
    } else if let Some(c) = v.other(next, BinaryOp::Mul, out) {
        let scale = per_channel(s, c, co).filter(|_| open)?;
        let old_bias = match bias {
            Some(b) => Some(s.constant(b)?.as_slice().to_vec()),
            None => None,
        };
        w = scaled_weights(g, w, &scale)?;
        if let Some(b) = old_bias {
            let vals = b.iter().zip(&scale).map(|(x, k)| x * k).collect();
            bias = Some(add_constant(g, "conv_bias", &[co], vals)?);
        }
    } else if let Some(c) = v.other(next, BinaryOp::Add, out) {
        if c == out {
            return None;
        }
        match per_channel(s, c, co).filter(|_| open) {
            Some(shift) => {
                let vals = match bias {
                    Some(b) => s
                        .constant(b)?
                        .as_slice()
                        .iter()
                        .zip(&shift)
                        .map(|(x, d)| x + d)
                        .collect(),
                    None => shift,
                };
                bias = Some(add_constant(g, "conv_bias", &[co], vals)?);
                a.bias = true;
            }
            None if !a.residual && !reshaped && s.values[c].ty == out_ty => {
                a.residual = true;
                residual = Some(c);
            }
            None => return None,
        }
    } else {
        return None;
    }
    let mut inputs = vec![conv.inputs[0], w];
    inputs.extend(bias);
    inputs.extend(residual);
    Some(Node {
        name: next.name.clone(),
        op: Op::Conv(Box::new(a)),
        inputs,
        outputs: next.outputs.clone(),
    })
}

/// A new constant: weights `w` (`[Co, ...]`) times `scale[o]` per output channel.
fn scaled_weights(g: &mut Graph, w: ValueId, scale: &[f32]) -> Option<ValueId> {
    let shape = g.values[w].ty.shape.clone();
    let data = g.constant(w)?.as_slice();
    let per = data.len() / scale.len().max(1);
    let vals: Vec<f32> = data.iter().enumerate().map(|(i, x)| x * scale[i / per]).collect();
    add_constant(g, "conv_weights", &shape, vals)
}

fn add_constant(g: &mut Graph, hint: &str, shape: &[usize], vals: Vec<f32>) -> Option<ValueId> {
    let id = g.fresh_value(hint, TensorType::f32(shape));
    g.add_constant_weight(id, Weight::from_vec(vals)).ok()?;
    Some(id)
}
