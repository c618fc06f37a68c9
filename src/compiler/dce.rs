//! Dead-code removal: keep only nodes whose results reach a graph output.
//!
//! ORT may hand kiln a fused subgraph with side branches whose results are
//! not among the fused node's outputs; computing them would be wasted work.

use crate::ir::Graph;

/// Indices of the nodes that contribute to some graph output, in graph order.
/// Assumes a validated graph (topological order, ids in range).
pub(crate) fn live_nodes(graph: &Graph) -> Vec<usize> {
    // A node lives if any of its outputs is needed.
    let mut needed = vec![false; graph.values.len()];
    for &v in &graph.outputs {
        needed[v] = true;
    }
    let mut live = Vec::new();
    // Walking backwards, a node's consumers have been decided before it.
    for (i, node) in graph.nodes.iter().enumerate().rev() {
        if node.outputs.iter().any(|&v| needed[v]) {
            live.push(i);
            for &v in &node.inputs {
                needed[v] = true;
            }
        }
    }
    live.reverse();
    live
}

/// Drops the nodes that reach no graph output.
pub(crate) fn remove_dead(graph: &mut Graph) {
    let live = live_nodes(graph);
    if live.len() == graph.nodes.len() {
        return;
    }
    let mut keep = vec![false; graph.nodes.len()];
    for i in live {
        keep[i] = true;
    }
    let mut i = 0;
    graph.nodes.retain(|_| {
        i += 1;
        keep[i - 1]
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::{BinaryOp, Op, TensorType, UnaryOp};

    #[test]
    fn drops_nodes_not_reaching_outputs() {
        let mut g = Graph::new("g");
        let t = TensorType::f32(&[2]);
        let v: Vec<usize> = ["x", "a", "b", "c", "d"]
            .iter()
            .map(|n| g.add_value(n, t.clone()).unwrap())
            .collect();
        g.inputs.push(v[0]);
        g.add_node("n0", Op::Unary(UnaryOp::Relu), vec![v[0]], vec![v[1]]); // feeds the output
        g.add_node("n1", Op::Unary(UnaryOp::Exp), vec![v[0]], vec![v[2]]); // dead branch
        g.add_node("n2", Op::Unary(UnaryOp::Neg), vec![v[2]], vec![v[3]]); // dead, consumes dead
        g.add_node("n3", Op::Binary(BinaryOp::Add), vec![v[1], v[0]], vec![v[4]]);
        g.outputs.push(v[4]);
        assert_eq!(live_nodes(&g), vec![0, 3]);
        g.outputs.push(v[3]);
        assert_eq!(live_nodes(&g), vec![0, 1, 2, 3]);
        g.outputs.clear();
        assert!(live_nodes(&g).is_empty());
    }
}
