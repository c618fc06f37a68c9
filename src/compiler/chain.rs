//! Elementwise chains into one op (issue #14): f32 unary and binary nodes
//! that feed one another, all of one output shape, become one `Chain` whose
//! kernel (`kernels::chain`) runs them block by block in L1 — one pass over
//! memory instead of one per op. DenseNet's pre-activation
//! `BatchNormalization → Mul → Add → Relu` after a concat is five passes
//! unfused; what the other fusions leave of a model's arithmetic
//! (unmatched activations, scalings, box arithmetic of detectors) too.
//!
//! Runs after every other fusion, so that it takes only what they left.
//! Chains grow from a model's last node back: a node joins the chain that
//! all the readers of its result are in (so that result never reaches
//! memory) if it has the chain's shape and each of its inputs lines up with
//! it as a whole tensor, one value, a repeated row or per-channel runs
//! ([`Access`]); at most
//! [`MAX_CHAIN_OPS`] ops and [`MAX_CHAIN_INPUTS`] inputs. Each op computes
//! exactly what its own step would, so results are unchanged bit for bit.

use super::patterns::{apply_rewrites, replaced, Rewrite, View};
use crate::ir::{infer, Access, ChainOp, DType, Graph, Op, Operand, ValueId};
use crate::kernels::chain::{chain_binary, chain_unary, MAX_CHAIN_INPUTS, MAX_CHAIN_OPS};

/// Fuses every chain of two or more ops; returns how many.
pub(crate) fn fuse(g: &mut Graph) -> usize {
    let rewrites: Vec<Rewrite> = {
        let v = View::new(g);
        chains(&v).iter().filter_map(|c| rewrite(&v, c)).collect()
    };
    apply_rewrites(g, rewrites)
}

/// Whether node `i` is an f32 elementwise op a chain may hold, each of its
/// inputs lining up with its output.
fn fits(g: &Graph, i: usize) -> bool {
    let n = &g.nodes[i];
    let op_ok = match n.op {
        Op::Unary(u) => chain_unary(u),
        Op::Binary(b) => chain_binary(b),
        _ => false,
    };
    let [out] = n.outputs[..] else {
        return false;
    };
    let out = &g.ty(out).shape;
    op_ok
        && out.iter().product::<usize>() > 0
        && n.inputs.iter().all(|&v| {
            let t = g.ty(v);
            t.dtype == DType::F32 && Access::for_shapes(out, &t.shape).is_some()
        })
}

/// The chains, each its nodes in graph order, built from the last node
/// back: a node joins the chain that all the readers of its result are in
/// (so no other node sees that result) if it has the chain's shape and the
/// chain stays one the kernel runs; otherwise it starts a chain of its own.
fn chains(v: &View<'_>) -> Vec<Vec<usize>> {
    let mut chain_of: Vec<Option<usize>> = vec![None; v.g.nodes.len()];
    let mut chains: Vec<Vec<usize>> = Vec::new();
    for i in (0..v.g.nodes.len()).rev() {
        if !fits(v.g, i) {
            continue;
        }
        let out = v.g.nodes[i].outputs[0];
        let readers = &v.cons[out];
        let c = match (v.is_out[out], readers.first()) {
            (false, Some(&r)) => chain_of[r],
            _ => None,
        };
        let joins = c.filter(|&c| {
            let tail = v.g.nodes[chains[c][0]].outputs[0];
            readers.iter().all(|&r| chain_of[r] == Some(c))
                && chains[c].len() < MAX_CHAIN_OPS
                && v.g.ty(tail).shape == v.g.ty(out).shape
                && chain_op(v, &with(&chains[c], i)).is_some()
        });
        let c = joins.unwrap_or_else(|| {
            chains.push(Vec::new());
            chains.len() - 1
        });
        chains[c].push(i);
        chain_of[i] = Some(c);
    }
    chains
        .into_iter()
        .filter(|c| c.len() >= 2)
        .map(|c| c.into_iter().rev().collect())
        .collect()
}

/// `chain` (last node first) and `i`, in graph order.
fn with(chain: &[usize], i: usize) -> Vec<usize> {
    let mut members: Vec<usize> = chain.iter().rev().copied().collect();
    members.insert(0, i);
    members
}

/// The `Chain` op of `members` (in graph order) and its inputs, if the
/// op's own rule accepts it (row lengths, full operands, input count).
fn chain_op(v: &View<'_>, members: &[usize]) -> Option<(Op, Vec<ValueId>)> {
    let mut inputs: Vec<ValueId> = Vec::new();
    let mut ops = Vec::with_capacity(members.len());
    for &m in members {
        let node = &v.g.nodes[m];
        let mut operand = |x: ValueId| match members.iter().position(|&p| v.g.nodes[p].outputs[0] == x) {
            Some(r) => Operand::Result(r),
            None => Operand::Input(inputs.iter().position(|&i| i == x).unwrap_or_else(|| {
                inputs.push(x);
                inputs.len() - 1
            })),
        };
        ops.push(match node.op {
            Op::Unary(u) => ChainOp::Unary(u, operand(node.inputs[0])),
            Op::Binary(b) => {
                let a = operand(node.inputs[0]);
                ChainOp::Binary(b, a, operand(node.inputs[1]))
            }
            _ => return None,
        });
    }
    if inputs.len() > MAX_CHAIN_INPUTS {
        return None;
    }
    let op = Op::Chain(ops);
    let types: Vec<_> = inputs.iter().map(|&i| v.g.ty(i)).collect();
    let last = v.g.nodes[*members.last()?].outputs[0];
    let out = infer(&op, &types, None).ok()?;
    (out.first() == Some(v.g.ty(last))).then_some((op, inputs))
}

/// The chain as one node in place of its last.
fn rewrite(v: &View<'_>, members: &[usize]) -> Option<Rewrite> {
    let (op, inputs) = chain_op(v, members)?;
    let (&tail, rest) = members.split_last()?;
    Some(Rewrite {
        at: tail,
        node: replaced(&v.g.nodes[tail], op, inputs),
        remove: rest.to_vec(),
        before: Vec::new(),
    })
}
