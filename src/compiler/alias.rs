//! Aliasing: layout-only ops (`Op::Reshape`, which import also uses for
//! Squeeze, Unsqueeze, Flatten, Identity and Dropout) never run; their output
//! becomes another name for their input's bytes.
//!
//! Each value gets a representative (the value whose buffer holds its data).
//! Lowering later lets the first graph output that names a representative
//! own it, so `x -> MatMul -> t -> Reshape -> y(output)` writes the product
//! straight into `y`; only outputs that must hold a second copy (an input or
//! constant returned as an output, or a value returned twice) cost a copy.

use crate::ir::{Graph, ValueId};

pub(crate) struct Folded {
    /// Nodes that do work (everything but aliases), in graph order.
    pub nodes: Vec<usize>,
    /// For every value, the value whose buffer holds its data.
    pub rep: Vec<ValueId>,
}

/// Folds the alias nodes of `graph` (topologically ordered).
pub(crate) fn fold_aliases(graph: &Graph) -> Folded {
    let mut rep: Vec<ValueId> = (0..graph.values.len()).collect();
    let mut nodes = Vec::with_capacity(graph.nodes.len());
    for (i, node) in graph.nodes.iter().enumerate() {
        match (node.op.is_alias(), &node.inputs[..], &node.outputs[..]) {
            (true, [x], [y]) => {
                // `x` came earlier, so `rep[x]` is already final.
                rep[*y] = rep[*x];
            }
            _ => nodes.push(i),
        }
    }
    Folded { nodes, rep }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{Op, TensorType, UnaryOp};

    #[test]
    fn alias_chains_resolve_to_the_source() {
        let mut g = Graph::new("g");
        let v: Vec<usize> = [
            ("x", vec![6]),
            ("r", vec![6]),
            ("i1", vec![2, 3]),
            ("i2", vec![3, 2]),
            ("z", vec![3, 2]),
        ]
        .iter()
        .map(|(n, s)| g.add_value(n, TensorType::f32(s)).unwrap())
        .collect();
        g.inputs.push(v[0]);
        g.add_node("relu", Op::Unary(UnaryOp::Relu), vec![v[0]], vec![v[1]]);
        g.add_node("r1", Op::Reshape, vec![v[1]], vec![v[2]]);
        g.add_node("r2", Op::Reshape, vec![v[2]], vec![v[3]]);
        g.add_node("neg", Op::Unary(UnaryOp::Neg), vec![v[3]], vec![v[4]]);
        let folded = fold_aliases(&g);
        assert_eq!(folded.nodes, vec![0, 3]);
        assert_eq!(folded.rep, vec![v[0], v[1], v[1], v[1], v[4]]);
    }
}
