//! The compiler: IR graph in, [`Program`] out, as a short pipeline of passes.
//!
//! 1. `Graph::validate` — refuse anything kiln cannot run, with a reason.
//! 2. [`dce`] — drop nodes whose results reach no graph output.
//! 3. [`alias`] — fold `Identity` nodes into buffer aliases.
//! 4. [`lower`] — pick kernels and broadcast layouts, give every value a
//!    buffer (inputs/constants in place, outputs in the caller's slices,
//!    intermediates in one arena laid out by [`memplan`]).

mod alias;
mod dce;
mod lower;
mod memplan;

use crate::error::Result;
use crate::ir::Graph;
use crate::plan::Program;
use crate::target::Target;

/// Compiles `graph` for `target`. The target need not be this host's: a
/// program is only refused when it is run somewhere that cannot run it.
pub fn compile(graph: &Graph, target: Target) -> Result<Program> {
    graph.validate()?;
    let live = dce::live_nodes(graph);
    let folded = alias::fold_identities(graph, &live);
    lower::lower(graph, target, &live, &folded).map_err(|e| e.context(format_args!("graph '{}'", graph.name)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;
    use crate::ir::{broadcast_shapes, Op, TensorType, ValueId};
    use crate::plan::{BufRef, Step};

    /// Small builder so tests read like the graphs they build.
    struct Builder {
        g: Graph,
    }

    impl Builder {
        fn new() -> Self {
            Builder { g: Graph::new("test") }
        }

        fn value(&mut self, name: &str, shape: &[usize]) -> ValueId {
            self.g.add_value(name, TensorType::f32(shape)).unwrap()
        }

        fn input(&mut self, name: &str, shape: &[usize]) -> ValueId {
            let v = self.value(name, shape);
            self.g.inputs.push(v);
            v
        }

        fn constant(&mut self, name: &str, shape: &[usize], data: Vec<f32>) -> ValueId {
            let v = self.value(name, shape);
            self.g.add_constant(v, data).unwrap();
            v
        }

        /// Adds `op(inputs)` with an inferred output shape.
        fn node(&mut self, op: Op, inputs: &[ValueId], out: &str) -> ValueId {
            let shapes: Vec<&[usize]> = inputs.iter().map(|&v| &self.g.values[v].ty.shape[..]).collect();
            let shape = match shapes[..] {
                [a, b] => broadcast_shapes(a, b).unwrap(),
                _ => shapes[0].to_vec(),
            };
            let y = self.value(out, &shape);
            self.g.add_node(out, op, inputs.to_vec(), vec![y]);
            y
        }

        fn output(&mut self, v: ValueId) {
            self.g.outputs.push(v);
        }
    }

    /// Reference interpreter over the IR: naive broadcasting, f64 math.
    fn reference(g: &Graph, inputs: &[Vec<f32>]) -> Vec<Vec<f32>> {
        let mut vals: Vec<Option<Vec<f32>>> = vec![None; g.values.len()];
        for (&v, data) in g.inputs.iter().zip(inputs) {
            vals[v] = Some(data.clone());
        }
        for (v, data) in &g.constants {
            vals[*v] = Some(data.to_vec());
        }
        for n in &g.nodes {
            let arg = |k: usize| vals[n.inputs[k]].clone().unwrap();
            let out = if n.op.is_binary() {
                let shape = |k: usize| g.values[n.inputs[k]].ty.shape.clone();
                broadcast_ref(n.op, &shape(0), &arg(0), &shape(1), &arg(1))
            } else {
                arg(0).iter().map(|&x| unary_ref(n.op, x)).collect()
            };
            vals[n.outputs[0]] = Some(out);
        }
        g.outputs.iter().map(|&v| vals[v].clone().unwrap()).collect()
    }

    fn unary_ref(op: Op, x: f32) -> f32 {
        let x = x as f64;
        (match op {
            Op::Relu => x.max(0.0),
            Op::Sigmoid => 1.0 / (1.0 + (-x).exp()),
            Op::Tanh => x.tanh(),
            Op::Neg => -x,
            Op::Abs => x.abs(),
            Op::Sqrt => x.sqrt(),
            Op::Exp => x.exp(),
            Op::Identity => x,
            _ => unreachable!("{op:?} is binary"),
        }) as f32
    }

    fn broadcast_ref(op: Op, sa: &[usize], a: &[f32], sb: &[usize], b: &[f32]) -> Vec<f32> {
        let out = broadcast_shapes(sa, sb).unwrap();
        let n: usize = out.iter().product();
        let src = |shape: &[usize], mut flat: usize| {
            let pad = out.len() - shape.len();
            let (mut idx, mut stride) = (0, 1);
            for d in (pad..out.len()).rev() {
                let i = flat % out[d];
                flat /= out[d];
                if shape[d - pad] != 1 {
                    idx += i * stride;
                }
                stride *= shape[d - pad];
            }
            idx
        };
        (0..n)
            .map(|i| {
                let (x, y) = (a[src(sa, i)], b[src(sb, i)]);
                match op {
                    Op::Add => x + y,
                    Op::Sub => x - y,
                    Op::Mul => x * y,
                    Op::Div => x / y,
                    _ => unreachable!(),
                }
            })
            .collect()
    }

    /// Positive-ish pseudo-random data (Sqrt and Div stay finite).
    fn data(n: usize, seed: usize) -> Vec<f32> {
        (0..n)
            .map(|i| ((i * 7919 + seed * 104_729) % 1000) as f32 / 250.0 - 1.5)
            .collect()
    }

    fn inputs_for(g: &Graph, seed: usize) -> Vec<Vec<f32>> {
        g.inputs
            .iter()
            .enumerate()
            .map(|(k, &v)| data(g.values[v].ty.numel(), seed + k))
            .collect()
    }

    fn run(p: &Program, inputs: &[Vec<f32>]) -> Result<Vec<Vec<f32>>> {
        let mut outs: Vec<Vec<f32>> = p.outputs().iter().map(|s| vec![f32::NAN; s.numel()]).collect();
        let ins: Vec<&[f32]> = inputs.iter().map(|v| &v[..]).collect();
        let mut out_refs: Vec<&mut [f32]> = outs.iter_mut().map(|v| &mut v[..]).collect();
        p.run(Target::cpu_best(), &ins, &mut out_refs)?;
        Ok(outs)
    }

    fn assert_close(got: &[Vec<f32>], want: &[Vec<f32>]) {
        assert_eq!(got.len(), want.len());
        for (k, (g, w)) in got.iter().zip(want).enumerate() {
            assert_eq!(g.len(), w.len(), "output {k}");
            for (i, (&x, &y)) in g.iter().zip(w).enumerate() {
                // Relative, with an absolute floor for results that cancel to near zero.
                let ok = (x.is_nan() && y.is_nan()) || (x - y).abs() <= 2e-6 * y.abs() + 1e-6;
                assert!(ok, "output {k}[{i}]: got {x}, want {y}");
            }
        }
    }

    /// Compiles for every target this CPU can run and checks against the reference.
    fn check_all_targets(g: &Graph) -> Program {
        let inputs = inputs_for(g, 1);
        let want = reference(g, &inputs);
        let mut last = None;
        for target in Target::ALL {
            let p = compile(g, target).unwrap();
            if !target.can_run_on(Target::cpu_best()) {
                continue;
            }
            assert_close(&run(&p, &inputs).unwrap(), &want);
            last = Some(p);
        }
        last.unwrap()
    }

    #[test]
    fn every_op_matches_reference() {
        for &op in Op::ALL {
            let mut b = Builder::new();
            let x = b.input("x", &[2, 3, 4]);
            let y = if op.is_binary() {
                let w = b.input("w", &[3, 1]);
                b.node(op, &[x, w], "y")
            } else {
                b.node(op, &[x], "y")
            };
            b.output(y);
            let p = check_all_targets(&b.g);
            assert_eq!(p.op_summary(), format!("{op} x1"));
        }
    }

    #[test]
    fn broadcast_shapes_in_graphs() {
        let shapes: [&[usize]; 6] = [&[3, 1], &[4], &[], &[1, 1, 4], &[2, 1, 4], &[2, 3, 4]];
        for s in shapes {
            for swap in [false, true] {
                let mut b = Builder::new();
                let x = b.input("x", &[2, 3, 4]);
                let c = b.constant("c", s, data(s.iter().product(), 9));
                let args = if swap { [c, x] } else { [x, c] };
                let y = b.node(Op::Sub, &args, "y");
                let z = b.node(Op::Div, &[y, c], "z");
                b.output(z);
                check_all_targets(&b.g);
            }
        }
    }

    #[test]
    fn shared_inputs_and_multiple_outputs() {
        // x feeds three nodes; s is both an output and consumed internally.
        let mut b = Builder::new();
        let x = b.input("x", &[5, 7]);
        let w = b.input("w", &[7]);
        let s = b.node(Op::Add, &[x, x], "s");
        let m = b.node(Op::Mul, &[x, w], "m");
        let t = b.node(Op::Tanh, &[s], "t");
        let u = b.node(Op::Sub, &[t, m], "u");
        let e = b.node(Op::Sigmoid, &[x], "e");
        let f = b.node(Op::Div, &[u, e], "f");
        b.output(f);
        b.output(s);
        b.output(m);
        let p = check_all_targets(&b.g);
        // s and m are written straight into the caller's outputs.
        assert!(p.steps().iter().any(|st| matches!(
            st,
            Step::Binary {
                op: crate::kernels::BinaryOp::Add,
                dst: BufRef::Output(1),
                ..
            }
        )));
        assert_eq!(p.op_summary(), "Add x1, Sub x1, Mul x1, Div x1, Sigmoid x1, Tanh x1");
    }

    #[test]
    fn identity_output_costs_no_step() {
        let mut b = Builder::new();
        let x = b.input("x", &[8]);
        let t = b.node(Op::Exp, &[x], "t");
        let y = b.node(Op::Identity, &[t], "y");
        b.output(y);
        let p = check_all_targets(&b.g);
        assert_eq!(p.num_steps(), 1);
        assert_eq!(p.arena_bytes(), 0);
        assert_eq!(p.steps()[0].dst(), BufRef::Output(0));
        assert_eq!(p.op_summary(), "Exp x1, Identity x1");
    }

    #[test]
    fn identity_of_intermediate_consumed_later() {
        let mut b = Builder::new();
        let x = b.input("x", &[6]);
        let t = b.node(Op::Abs, &[x], "t");
        let i = b.node(Op::Identity, &[t], "i");
        let y = b.node(Op::Sqrt, &[i], "y");
        let z = b.node(Op::Identity, &[i], "z");
        b.output(y);
        b.output(z);
        let p = check_all_targets(&b.g);
        assert_eq!(p.num_steps(), 2);
        assert_eq!(p.arena_bytes(), 0);
    }

    #[test]
    fn graph_input_as_output_via_identity() {
        let mut b = Builder::new();
        let x = b.input("x", &[3, 2]);
        let y = b.node(Op::Identity, &[x], "y");
        let z = b.node(Op::Neg, &[x], "z");
        b.output(y);
        b.output(z);
        let p = check_all_targets(&b.g);
        assert!(p.steps().contains(&Step::Copy {
            src: BufRef::Input(0),
            dst: BufRef::Output(0)
        }));
        // Only an Identity: the program is one copy.
        let mut b = Builder::new();
        let x = b.input("x", &[4]);
        let y = b.node(Op::Identity, &[x], "y");
        b.output(y);
        let p = check_all_targets(&b.g);
        assert_eq!(p.num_steps(), 1);
    }

    #[test]
    fn constants_and_inputs_returned_directly() {
        let mut b = Builder::new();
        let x = b.input("x", &[2]);
        let c = b.constant("c", &[2], vec![3.0, 4.0]);
        let y = b.node(Op::Mul, &[x, c], "y");
        b.output(c);
        b.output(x);
        b.output(y);
        b.output(y);
        let p = check_all_targets(&b.g);
        assert_eq!(p.constant_bytes(), 8);
        let out = run(&p, &[vec![1.0, 2.0]]).unwrap();
        assert_eq!(
            out,
            vec![vec![3.0, 4.0], vec![1.0, 2.0], vec![3.0, 8.0], vec![3.0, 8.0]]
        );
    }

    #[test]
    fn memory_plan_reuses_buffers_on_a_chain() {
        let mut b = Builder::new();
        let mut v = b.input("x", &[64]);
        let ops = [Op::Relu, Op::Neg, Op::Abs, Op::Exp, Op::Sqrt, Op::Tanh];
        for (k, op) in ops.iter().enumerate() {
            v = b.node(*op, &[v], &format!("t{k}"));
        }
        b.output(v);
        let p = check_all_targets(&b.g);
        let intermediates = (ops.len() - 1) * 64 * 4;
        assert!(p.arena_bytes() < intermediates, "{p:?}");
        assert_eq!(p.arena_bytes(), 2 * 64 * 4);
    }

    #[test]
    fn dead_code_is_not_run() {
        let mut b = Builder::new();
        let x = b.input("x", &[4]);
        let dead = b.node(Op::Exp, &[x], "dead");
        b.node(Op::Mul, &[dead, x], "dead2");
        let y = b.node(Op::Relu, &[x], "y");
        b.output(y);
        let p = check_all_targets(&b.g);
        assert_eq!(p.num_steps(), 1);
        assert_eq!(p.op_summary(), "Relu x1");
        assert_eq!(p.inputs().len(), 1);
    }

    #[test]
    fn empty_tensors() {
        let mut b = Builder::new();
        let x = b.input("x", &[0, 3]);
        let w = b.input("w", &[3]);
        let y = b.node(Op::Add, &[x, w], "y");
        let z = b.node(Op::Exp, &[y], "z");
        b.output(z);
        let p = compile(&b.g, Target::Generic).unwrap();
        let out = run(&p, &[vec![], vec![1.0; 3]]).unwrap();
        assert_eq!(out, vec![Vec::<f32>::new()]);
    }

    /// (x + c) * sigmoid(x) - x / 2, with a row-broadcast constant.
    fn sample_graph() -> Graph {
        let mut b = Builder::new();
        let x = b.input("x", &[16, 33]);
        let c = b.constant("c", &[33], data(33, 5));
        let two = b.constant("two", &[], vec![2.0]);
        let s = b.node(Op::Add, &[x, c], "s");
        let g = b.node(Op::Sigmoid, &[x], "g");
        let m = b.node(Op::Mul, &[s, g], "m");
        let h = b.node(Op::Div, &[x, two], "h");
        let y = b.node(Op::Sub, &[m, h], "y");
        b.output(y);
        b.g
    }

    #[test]
    fn concurrent_runs_share_one_program() {
        let g = sample_graph();
        let p = compile(&g, Target::cpu_best()).unwrap();
        let cases: Vec<Vec<Vec<f32>>> = (0..40).map(|i| inputs_for(&g, i)).collect();
        // Sequential answers first; every thread must reproduce them bit for bit.
        let want: Vec<Vec<Vec<f32>>> = cases.iter().map(|c| run(&p, c).unwrap()).collect();
        assert_close(&want[0], &reference(&g, &cases[0]));
        std::thread::scope(|scope| {
            for t in 0..4 {
                let (p, cases, want) = (&p, &cases, &want);
                scope.spawn(move || {
                    for round in 0..5 {
                        for i in 0..cases.len() {
                            let k = (i + t * 7 + round) % cases.len();
                            assert_eq!(run(p, &cases[k]).unwrap(), want[k], "thread {t} case {k}");
                        }
                    }
                });
            }
        });
    }

    #[test]
    fn refuses_target_newer_than_host() {
        let g = sample_graph();
        let p = compile(&g, Target::Avx512).unwrap();
        assert_eq!(p.target(), Target::Avx512);
        let x = vec![0.0; 16 * 33];
        let mut y = vec![0.0; 16 * 33];
        for host in [Target::Avx2, Target::Generic] {
            let e = p.run(host, &[&x], &mut [&mut y]).unwrap_err();
            assert_eq!(e.kind, ErrorKind::InvalidGraph);
            assert!(
                e.message.contains("x86_64-avx512") && e.message.contains(host.name()),
                "{e}"
            );
        }
    }

    #[test]
    fn wrong_lengths_name_the_tensor() {
        let g = sample_graph();
        let p = compile(&g, Target::Generic).unwrap();
        let mut y = vec![0.0; 16 * 33];
        let e = p.run(Target::Generic, &[&[0.0; 5]], &mut [&mut y]).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        assert!(e.message.contains("'x'") && e.message.contains("[16,33]"), "{e}");
        let x = vec![0.0; 16 * 33];
        let e = p.run(Target::Generic, &[&x], &mut [&mut y[..3]]).unwrap_err();
        assert!(e.message.contains("'y'"), "{e}");
        let e = p.run(Target::Generic, &[], &mut [&mut y]).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
    }

    #[test]
    fn specs_follow_graph_order() {
        let g = sample_graph();
        let p = compile(&g, Target::Generic).unwrap();
        assert_eq!(p.inputs()[0].name, "x");
        assert_eq!(p.inputs()[0].shape, vec![16, 33]);
        assert_eq!(p.outputs()[0].name, "y");
        assert_eq!(p.constant_bytes(), (33 + 1) * 4);
    }

    #[test]
    fn invalid_graphs_are_refused() {
        let mut b = Builder::new();
        let x = b.input("x", &[2]);
        let y = b.value("y", &[3]);
        b.g.add_node("bad", Op::Relu, vec![x], vec![y]);
        b.output(y);
        let e = compile(&b.g, Target::Generic).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidGraph);
        assert!(e.message.contains("'bad'"), "{e}");
    }
}
