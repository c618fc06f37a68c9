//! Constant folding: a node whose inputs are all constants is evaluated at
//! compile time and its outputs become constants. `Shape` always folds
//! (shapes are static). Evaluation compiles the single node for the
//! baseline target and runs it, so folding uses exactly the run-time
//! kernels. A `Reshape` of a constant shares the constant's bytes.

use super::{alias, lower};
use crate::error::Result;
use crate::ir::{Graph, Node, Op, Tensor, TensorData, TensorType};
use crate::kernels::parallel::Serial;
use crate::plan::TensorMut;
use crate::target::Target;

/// Outputs larger than this (elements) are not folded unless no larger
/// than an input (folding must not blow up the program's size).
pub(crate) const FOLD_LIMIT: usize = 1 << 16;

/// Folds every foldable node of `g` (in order, so chains fold completely);
/// with `all == false` only `Shape` nodes.
pub(crate) fn fold_constants_where(g: &mut Graph, all: bool) -> Result<()> {
    let mut is_const = vec![false; g.values.len()];
    for (v, _) in &g.constants {
        is_const[*v] = true;
    }
    let nodes = std::mem::take(&mut g.nodes);
    let mut kept = Vec::with_capacity(nodes.len());
    for node in nodes {
        if !foldable(g, &node, &is_const) || !all && !matches!(node.op, Op::Shape { .. }) {
            kept.push(node);
            continue;
        }
        let label = format!("folding node '{}' ({})", node.name, node.op);
        if let (Op::Reshape, Some(w)) = (&node.op, g.constant(node.inputs[0]).cloned()) {
            g.add_constant_weight(node.outputs[0], w)?;
        } else {
            let outs = evaluate(g, &node).map_err(|e| e.context(&label))?;
            for (&v, t) in node.outputs.iter().zip(&outs) {
                g.add_constant_tensor(v, t).map_err(|e| e.context(&label))?;
            }
        }
        for &v in &node.outputs {
            is_const[v] = true;
        }
    }
    g.nodes = kept;
    Ok(())
}

fn foldable(g: &Graph, node: &Node, is_const: &[bool]) -> bool {
    if matches!(node.op, Op::Shape { .. }) {
        return true;
    }
    if node.inputs.is_empty() || !node.inputs.iter().all(|&v| is_const[v]) {
        return false;
    }
    let biggest_in = node.inputs.iter().map(|&v| g.values[v].ty.numel()).max().unwrap_or(0);
    node.outputs
        .iter()
        .all(|&v| g.values[v].ty.numel() <= FOLD_LIMIT.max(biggest_in))
}

/// Runs one node whose inputs are constants of `g`.
pub(crate) fn evaluate(g: &Graph, node: &Node) -> Result<Vec<Tensor>> {
    if let Op::Shape { start, end } = node.op {
        let dims = g.values[node.inputs[0]].ty.shape[start..end]
            .iter()
            .map(|&d| d as i64)
            .collect();
        return Ok(vec![Tensor::i64(&[end - start], dims)]);
    }
    let mut ins = Vec::with_capacity(node.inputs.len());
    for &v in &node.inputs {
        let t = g
            .constant_tensor(v)
            .ok_or_else(|| lower::internal(format_args!("'{}' is not a constant", g.values[v].name)))?;
        ins.push(t);
    }
    let outs: Vec<TensorType> = node.outputs.iter().map(|&v| g.values[v].ty.clone()).collect();
    let refs: Vec<&Tensor> = ins.iter().collect();
    eval_op(&node.op, &refs, &outs)
}

/// The importer's folding ([`crate::ir::Fold`]) with [`eval_op`].
pub struct KernelFold;

impl crate::ir::Fold for KernelFold {
    fn eval(&self, op: &Op, inputs: &[&Tensor], outputs: &[TensorType]) -> Result<Vec<Tensor>> {
        eval_op(op, inputs, outputs)
    }
}

/// Evaluates `op` on host tensors: compiles the single node for the
/// baseline target and runs it (the run-time kernels, so folding and
/// running agree bit for bit).
pub fn eval_op(op: &Op, inputs: &[&Tensor], outputs: &[TensorType]) -> Result<Vec<Tensor>> {
    if let Op::Shape { start, end } = *op {
        let dims = inputs[0].shape[start..end].iter().map(|&d| d as i64).collect();
        return Ok(vec![Tensor::i64(&[end - start], dims)]);
    }
    let mut m = Graph::new("fold");
    let mut ins = Vec::with_capacity(inputs.len());
    for (k, t) in inputs.iter().enumerate() {
        let id = m.add_value(&format!("in{k}"), t.ty())?;
        m.add_constant_tensor(id, t)?;
        ins.push(id);
    }
    let mut outs = Vec::with_capacity(outputs.len());
    for (k, ty) in outputs.iter().enumerate() {
        outs.push(m.add_value(&format!("out{k}"), ty.clone())?);
    }
    m.add_node("fold", op.clone(), ins, outs.clone());
    m.outputs = outs.clone();
    m.validate()?;
    let program = lower::lower(&m, Target::Generic, &alias::fold_aliases(&m), None, false)?;
    let mut results: Vec<Tensor> = outputs.iter().map(|ty| Tensor::filled(ty, 0.0)).collect();
    let mut views: Vec<TensorMut<'_>> = results
        .iter_mut()
        .map(|t| match &mut t.data {
            TensorData::F32(v) => TensorMut::F32(v),
            TensorData::I64(v) => TensorMut::I64(v),
            TensorData::I32(v) => TensorMut::I32(v),
            TensorData::Bool(v) => TensorMut::Bool(v),
            TensorData::F16(v) => TensorMut::F16(v),
        })
        .collect();
    program.run(Target::Generic, &[], &mut views, &Serial)?;
    drop(views);
    Ok(results)
}
