//! Identity folding: an `Identity` never runs; its output becomes another
//! name for its input's buffer.
//!
//! Each value gets a representative (the value whose buffer holds its data).
//! Lowering later lets the first graph output that names a representative
//! own it, so `x -> Relu -> t -> Identity -> y(output)` writes Relu's result
//! straight into `y`; only outputs that must hold a second copy (an input or
//! constant returned as an output, or a value returned twice) cost a copy.

use crate::ir::{Graph, Op, ValueId};

pub(crate) struct Folded {
    /// Live nodes that do work (everything but `Identity`), in graph order.
    pub nodes: Vec<usize>,
    /// For every value, the value whose buffer holds its data.
    pub rep: Vec<ValueId>,
}

/// Folds the `Identity` nodes among `live` (topologically ordered).
pub(crate) fn fold_identities(graph: &Graph, live: &[usize]) -> Folded {
    let mut rep: Vec<ValueId> = (0..graph.values.len()).collect();
    let mut nodes = Vec::with_capacity(live.len());
    for &i in live {
        let node = &graph.nodes[i];
        match (node.op, &node.inputs[..], &node.outputs[..]) {
            (Op::Identity, [x], [y]) => {
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
    use crate::ir::TensorType;

    #[test]
    fn identity_chains_resolve_to_the_source() {
        let mut g = Graph::new("g");
        let t = TensorType::f32(&[3]);
        let v: Vec<usize> = ["x", "r", "i1", "i2", "z"]
            .iter()
            .map(|n| g.add_value(n, t.clone()).unwrap())
            .collect();
        g.inputs.push(v[0]);
        g.add_node("relu", Op::Relu, vec![v[0]], vec![v[1]]);
        g.add_node("id1", Op::Identity, vec![v[1]], vec![v[2]]);
        g.add_node("id2", Op::Identity, vec![v[2]], vec![v[3]]);
        g.add_node("neg", Op::Neg, vec![v[3]], vec![v[4]]);
        let folded = fold_identities(&g, &[0, 1, 2, 3]);
        assert_eq!(folded.nodes, vec![0, 3]);
        assert_eq!(folded.rep, vec![v[0], v[1], v[1], v[1], v[4]]);
    }

    #[test]
    fn identity_of_input_aliases_the_input() {
        let mut g = Graph::new("g");
        let t = TensorType::f32(&[3]);
        let x = g.add_value("x", t.clone()).unwrap();
        let y = g.add_value("y", t).unwrap();
        g.inputs.push(x);
        g.add_node("id", Op::Identity, vec![x], vec![y]);
        let folded = fold_identities(&g, &[0]);
        assert!(folded.nodes.is_empty());
        assert_eq!(folded.rep[y], x);
    }
}
