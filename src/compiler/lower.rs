//! Lowering: turns the folded, live nodes into plan steps with a static
//! memory plan.
//!
//! Every buffer gets a home: graph inputs and constants are read in place,
//! the first graph output naming a value owns it (its producer writes
//! straight into the caller's output), and all other intermediates live in
//! the scratch arena laid out by `memplan`.

use super::alias::Folded;
use super::memplan::{plan_arena, Lifetime};
use crate::error::{Error, Result};
use crate::ir::{Graph, Node, Op, ValueId};
use crate::kernels::{BinaryOp, Layout, UnaryOp};
use crate::plan::{BufRef, Constant, Program, ScratchPool, Step, TensorSpec};
use crate::target::Target;

/// Where a representative value lives at run time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Home {
    Input(usize),
    /// Index into `graph.constants`.
    Constant(usize),
    Output(usize),
    /// Index into the arena plan.
    Temp(usize),
}

/// Builds the program for a validated graph.
pub(crate) fn lower(graph: &Graph, target: Target, live: &[usize], folded: &Folded) -> Result<Program> {
    let mut homes = vec![None; graph.values.len()];
    let copies = assign_io_homes(graph, &folded.rep, &mut homes);
    let temps = assign_temps(graph, folded, &mut homes);
    let arena = plan_arena(&temps)?;
    let mut ctx = Lowering {
        graph,
        rep: &folded.rep,
        homes: &homes,
        temps: &temps,
        offsets: &arena.offsets,
        constant_index: vec![None; graph.constants.len()],
        constants: Vec::new(),
    };
    let mut steps = Vec::with_capacity(folded.nodes.len() + copies.len());
    for &i in &folded.nodes {
        let step = ctx
            .node_step(&graph.nodes[i])
            .map_err(|e| e.context(graph.node_label(i)))?;
        steps.push(step);
    }
    for (j, root) in copies {
        steps.push(Step::Copy {
            src: ctx.buf(root)?,
            dst: BufRef::Output(j),
        });
    }
    Ok(Program {
        target,
        inputs: specs(graph, &graph.inputs),
        outputs: specs(graph, &graph.outputs),
        constants: ctx.constants,
        steps,
        arena_len: arena.len,
        op_counts: op_counts(graph, live),
        scratch: ScratchPool::default(),
    })
}

/// Homes for inputs, constants and outputs. Returns the outputs that need a
/// copy (their data already lives elsewhere) as (output index, representative).
fn assign_io_homes(graph: &Graph, rep: &[ValueId], homes: &mut [Option<Home>]) -> Vec<(usize, ValueId)> {
    for (i, &v) in graph.inputs.iter().enumerate() {
        homes[v] = Some(Home::Input(i));
    }
    for (k, (v, _)) in graph.constants.iter().enumerate() {
        homes[*v] = Some(Home::Constant(k));
    }
    let mut copies = Vec::new();
    for (j, &v) in graph.outputs.iter().enumerate() {
        let root = rep[v];
        match homes[root] {
            None => homes[root] = Some(Home::Output(j)),
            Some(_) => copies.push((j, root)),
        }
    }
    copies
}

/// Arena lifetimes for node outputs without a home yet; step `t` is
/// `folded.nodes[t]`.
fn assign_temps(graph: &Graph, folded: &Folded, homes: &mut [Option<Home>]) -> Vec<Lifetime> {
    let mut temps: Vec<Lifetime> = Vec::new();
    for (t, &i) in folded.nodes.iter().enumerate() {
        let node = &graph.nodes[i];
        for &v in &node.inputs {
            if let Some(Home::Temp(k)) = homes[folded.rep[v]] {
                temps[k].last = t;
            }
        }
        for &v in &node.outputs {
            if homes[v].is_none() {
                homes[v] = Some(Home::Temp(temps.len()));
                temps.push(Lifetime {
                    len: graph.values[v].ty.numel(),
                    first: t,
                    last: t,
                });
            }
        }
    }
    temps
}

struct Lowering<'g> {
    graph: &'g Graph,
    rep: &'g [ValueId],
    homes: &'g [Option<Home>],
    temps: &'g [Lifetime],
    offsets: &'g [usize],
    /// Program index of each graph constant, assigned on first use so that
    /// constants only dead code read are dropped.
    constant_index: Vec<Option<usize>>,
    constants: Vec<Constant>,
}

impl Lowering<'_> {
    fn node_step(&mut self, node: &Node) -> Result<Step> {
        let (ins, out) = (&node.inputs, node.outputs.first());
        let dst = self.buf(*out.ok_or_else(|| internal("node without output"))?)?;
        if let Some(op) = UnaryOp::from_op(node.op) {
            let src = self.buf(ins[0])?;
            return Ok(Step::Unary { op, src, dst });
        }
        if let Some(op) = BinaryOp::from_op(node.op) {
            let (a, b) = (ins[0], ins[1]);
            let layout = Layout::for_shapes(self.shape(a), self.shape(b))
                .ok_or_else(|| internal("validated shapes do not broadcast"))?;
            let (a, b) = (self.buf(a)?, self.buf(b)?);
            return Ok(Step::Binary { op, layout, a, b, dst });
        }
        Err(internal(format!("{} has no kernel", node.op)))
    }

    fn shape(&self, v: ValueId) -> &[usize] {
        &self.graph.values[v].ty.shape
    }

    /// The buffer holding value `v`'s data.
    fn buf(&mut self, v: ValueId) -> Result<BufRef> {
        let root = self.rep[v];
        let home =
            self.homes[root].ok_or_else(|| internal(format!("value '{}' has no buffer", self.graph.values[v].name)))?;
        Ok(match home {
            Home::Input(i) => BufRef::Input(i),
            Home::Output(j) => BufRef::Output(j),
            Home::Constant(k) => BufRef::Constant(self.constant(k)),
            Home::Temp(k) => BufRef::Scratch {
                offset: self.offsets[k],
                len: self.temps[k].len,
            },
        })
    }

    fn constant(&mut self, k: usize) -> usize {
        if let Some(index) = self.constant_index[k] {
            return index;
        }
        let (v, data) = &self.graph.constants[k];
        self.constants.push(Constant {
            shape: self.graph.values[*v].ty.shape.clone().into(),
            data: data.clone(),
        });
        self.constant_index[k] = Some(self.constants.len() - 1);
        self.constants.len() - 1
    }
}

fn specs(graph: &Graph, ids: &[ValueId]) -> Vec<TensorSpec> {
    ids.iter()
        .map(|&v| TensorSpec {
            name: graph.values[v].name.clone(),
            shape: graph.values[v].ty.shape.clone(),
        })
        .collect()
}

/// Live nodes per op, in `Op::ALL` order.
fn op_counts(graph: &Graph, live: &[usize]) -> Vec<(Op, usize)> {
    Op::ALL
        .iter()
        .map(|&op| (op, live.iter().filter(|&&i| graph.nodes[i].op == op).count()))
        .filter(|&(_, n)| n > 0)
        .collect()
}

/// A broken compiler invariant, reported instead of panicking.
fn internal(what: impl std::fmt::Display) -> Error {
    Error::fail(format!("kiln compiler bug: {what}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compiler::{alias, dce};
    use crate::ir::TensorType;

    fn lowered(g: &Graph) -> Program {
        g.validate().unwrap();
        let live = dce::live_nodes(g);
        let folded = alias::fold_identities(g, &live);
        lower(g, Target::Generic, &live, &folded).unwrap()
    }

    fn values(g: &mut Graph, names: &[&str], shape: &[usize]) -> Vec<ValueId> {
        names
            .iter()
            .map(|n| g.add_value(n, TensorType::f32(shape)).unwrap())
            .collect()
    }

    #[test]
    fn outputs_are_written_in_place_and_temps_use_the_arena() {
        let mut g = Graph::new("g");
        let v = values(&mut g, &["x", "t", "y", "z"], &[4]);
        g.inputs.push(v[0]);
        g.add_node("a", Op::Exp, vec![v[0]], vec![v[1]]);
        g.add_node("b", Op::Neg, vec![v[1]], vec![v[2]]);
        g.add_node("c", Op::Add, vec![v[2], v[1]], vec![v[3]]);
        g.outputs.extend([v[3], v[2]]);
        let p = lowered(&g);
        let t = BufRef::Scratch { offset: 0, len: 4 };
        assert_eq!(
            p.steps,
            vec![
                Step::Unary {
                    op: UnaryOp::Exp,
                    src: BufRef::Input(0),
                    dst: t
                },
                Step::Unary {
                    op: UnaryOp::Neg,
                    src: t,
                    dst: BufRef::Output(1)
                },
                Step::Binary {
                    op: BinaryOp::Add,
                    layout: Layout::Same,
                    a: BufRef::Output(1),
                    b: t,
                    dst: BufRef::Output(0)
                },
            ]
        );
        assert_eq!(p.arena_len, 4);
        // Step 3 writes output 0 while reading output 1 (after the hole).
        let (mut z, mut y) = (vec![0.0; 4], vec![0.0; 4]);
        let x = [0.0, 1.0, -1.0, 2.0];
        p.run(Target::Generic, &[&x], &mut [&mut z, &mut y]).unwrap();
        assert_eq!(y, x.map(|v: f32| -v.exp()));
        assert_eq!(z, [0.0; 4]);
    }

    #[test]
    fn returned_inputs_constants_and_duplicates_are_copied() {
        let mut g = Graph::new("g");
        let v = values(&mut g, &["x", "c", "y", "r"], &[2]);
        g.inputs.push(v[0]);
        g.add_constant(v[1], vec![1.0, 2.0]).unwrap();
        g.add_node("id", Op::Identity, vec![v[0]], vec![v[2]]);
        g.add_node("relu", Op::Relu, vec![v[0]], vec![v[3]]);
        g.outputs.extend([v[2], v[1], v[3], v[3]]);
        let p = lowered(&g);
        let copies: Vec<(BufRef, BufRef)> = p
            .steps
            .iter()
            .filter_map(|s| match s {
                Step::Copy { src, dst } => Some((*src, *dst)),
                _ => None,
            })
            .collect();
        assert_eq!(
            copies,
            vec![
                (BufRef::Input(0), BufRef::Output(0)),
                (BufRef::Constant(0), BufRef::Output(1)),
                (BufRef::Output(2), BufRef::Output(3)),
            ]
        );
        assert_eq!(p.steps.len(), 4);
        assert_eq!(p.constants.len(), 1);
        assert_eq!(p.op_counts, vec![(Op::Relu, 1), (Op::Identity, 1)]);
    }

    #[test]
    fn constants_only_dead_code_reads_are_dropped() {
        let mut g = Graph::new("g");
        let v = values(&mut g, &["x", "c", "dead", "y"], &[2]);
        g.inputs.push(v[0]);
        g.add_constant(v[1], vec![1.0, 2.0]).unwrap();
        g.add_node("dead", Op::Mul, vec![v[0], v[1]], vec![v[2]]);
        g.add_node("live", Op::Abs, vec![v[0]], vec![v[3]]);
        g.outputs.push(v[3]);
        let p = lowered(&g);
        assert!(p.constants.is_empty());
        assert_eq!(p.steps.len(), 1);
    }
}
