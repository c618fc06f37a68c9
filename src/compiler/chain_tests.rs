//! Elementwise chains (`compiler::chain`, issue #14): which nodes become one
//! `Chain`, and that the program computes bit for bit what the unfused one
//! does on every runnable target, serially and on two threads (rows shorter
//! and longer than a block, scalars on either side, results read twice,
//! chains that need several result buffers, tensors big enough to split).

// Every pass but the chains.
use super::tests::{data, inspected as unchained, Builder};
use super::*;
use crate::ir::{BinaryOp, ChainOp, DType, Op, TensorType, UnaryOp};
use crate::kernels::chain::MAX_CHAIN_OPS;
use crate::kernels::parallel::{Parallel, ScopedThreads, Serial};
use crate::plan::{Step, TensorMut, TensorRef};

/// The chains of the optimised graph, as op names.
fn chains(g: &Graph) -> Vec<Vec<&'static str>> {
    let opt = optimise(g, Passes::default()).unwrap();
    opt.validate().unwrap();
    opt.nodes
        .iter()
        .filter_map(|n| match &n.op {
            Op::Chain(ops) => Some(ops.iter().map(ChainOp::onnx_name).collect()),
            _ => None,
        })
        .collect()
}

/// Nodes of the optimised graph that are still plain unary or binary ops.
fn loose(g: &Graph) -> usize {
    let opt = optimise(g, Passes::default()).unwrap();
    opt.nodes
        .iter()
        .filter(|n| matches!(n.op, Op::Unary(_) | Op::Binary(_)))
        .count()
}

fn run(p: &Program, par: &dyn Parallel) -> Vec<Vec<u32>> {
    let ins: Vec<Vec<f32>> = p
        .inputs()
        .iter()
        .enumerate()
        .map(|(k, s)| data(s.numel(), k + 3))
        .collect();
    let refs: Vec<TensorRef<'_>> = ins.iter().map(|v| TensorRef::F32(v)).collect();
    let mut outs: Vec<Vec<f32>> = p.outputs().iter().map(|s| vec![f32::NAN; s.numel()]).collect();
    let mut views: Vec<TensorMut<'_>> = outs.iter_mut().map(|v| TensorMut::F32(v)).collect();
    p.run(Target::cpu_best(), &refs, &mut views, par).unwrap();
    // Bits, so that NaNs compare too.
    outs.iter().map(|o| o.iter().map(|x| x.to_bits()).collect()).collect()
}

/// Every runnable target, serially and on two threads, computes bit for bit
/// what the program without chains computes.
fn assert_unchanged(g: &Graph) {
    for target in Target::ALL.into_iter().filter(|t| t.can_run_on(Target::cpu_best())) {
        let want = run(&compile_with(g, target, unchained()).unwrap(), &Serial);
        let p = compile(g, target).unwrap();
        assert_eq!(run(&p, &Serial), want, "{target}");
        assert_eq!(run(&p, &ScopedThreads(2)), want, "{target}, 2 threads");
    }
}

/// A batch norm and a per-channel affine on channels-last `[n, h, w, c]`,
/// then a Relu: DenseNet's pre-activation after a concat.
fn affine_relu(n: usize, hw: usize, c: usize) -> Graph {
    let mut b = Builder::new();
    let x = b.input("x", &[n, hw, hw, c]);
    let mut y = x;
    for (i, op) in [BinaryOp::Mul, BinaryOp::Add, BinaryOp::Mul, BinaryOp::Add]
        .into_iter()
        .enumerate()
    {
        let row = b.constant(&format!("r{i}"), &[c], data(c, i + 1));
        y = b.bin(op, y, row, &format!("y{i}"));
    }
    let out = b.un(UnaryOp::Relu, y, "out");
    b.output(out);
    b.g
}

#[test]
fn per_channel_affine_and_relu_is_one_chain() {
    // Rows shorter than a block, longer than one (pieces of a row), and a
    // tensor big enough to split over threads.
    for (n, hw, c) in [(2, 5, 33), (1, 2, 3000), (1, 40, 64), (3, 1, 1)] {
        let g = affine_relu(n, hw, c);
        assert_eq!(
            chains(&g),
            vec![vec!["Mul", "Add", "Mul", "Add", "Relu"]],
            "{n}x{hw}x{hw}x{c}"
        );
        assert_eq!(loose(&g), 0);
        assert_unchanged(&g);
    }
}

#[test]
fn the_program_has_one_step_and_names_the_chain() {
    let p = compile(&affine_relu(1, 4, 8), Target::Generic).unwrap();
    assert_eq!(p.num_steps(), 1, "{:?}", p.steps());
    assert!(matches!(&p.steps()[0], Step::Chain(c) if c.ops.len() == 5));
    assert_eq!(p.op_summary(), "Chain(Mul+Add+Mul+Add+Relu) x1");
}

/// `x · sigmoid(x · s + b)`, `s / (1 + exp(-x))` and a scalar minus a value:
/// inputs read twice, scalars on either side.
#[test]
fn inputs_read_twice_and_scalars_on_either_side() {
    let mut b = Builder::new();
    let x = b.input("x", &[3, 50, 20]);
    let s = b.scalar("s", 1.7);
    let bias = b.constant("bias", &[20], data(20, 9));
    let xs = b.bin(BinaryOp::Mul, x, s, "xs");
    let z = b.bin(BinaryOp::Add, xs, bias, "z");
    let sig = b.un(UnaryOp::Sigmoid, z, "sig");
    let gated = b.bin(BinaryOp::Mul, x, sig, "gated");
    let neg = b.un(UnaryOp::Neg, gated, "neg");
    let e = b.un(UnaryOp::Exp, neg, "e");
    let one = b.scalar("one", 1.0);
    let d = b.bin(BinaryOp::Add, one, e, "d");
    let q = b.bin(BinaryOp::Div, s, d, "q");
    let out = b.bin(BinaryOp::Sub, one, q, "out");
    b.output(out);
    let g = b.g;
    let ops = chains(&g);
    assert_eq!(ops.len(), 1, "{ops:?}");
    assert_eq!(ops[0].len(), MAX_CHAIN_OPS, "{ops:?}");
    assert_unchanged(&g);
}

/// A value read by two ops of the chain, and results that need several
/// buffers at once: `((relu(a) + tanh(a)) · sigmoid(a)) - exp(a)`.
#[test]
fn a_value_read_twice_and_several_live_results() {
    let mut b = Builder::new();
    let x = b.input("x", &[7, 300]);
    let s = b.scalar("s", 0.5);
    let a = b.bin(BinaryOp::Mul, x, s, "a");
    let r = b.un(UnaryOp::Relu, a, "r");
    let t = b.un(UnaryOp::Tanh, a, "t");
    let sum = b.bin(BinaryOp::Add, r, t, "sum");
    let sg = b.un(UnaryOp::Sigmoid, a, "sg");
    let prod = b.bin(BinaryOp::Mul, sum, sg, "prod");
    let e = b.un(UnaryOp::Exp, a, "e");
    let out = b.bin(BinaryOp::Sub, prod, e, "out");
    b.output(out);
    let g = b.g;
    // `a` has four readers, all in the chain.
    assert_eq!(
        chains(&g),
        vec![vec!["Mul", "Relu", "Tanh", "Add", "Sigmoid", "Mul", "Exp", "Sub"]]
    );
    assert_eq!(loose(&g), 0);
    assert_unchanged(&g);
}

#[test]
fn a_result_that_is_a_graph_output_ends_a_chain() {
    let mut b = Builder::new();
    let x = b.input("x", &[4, 10]);
    let s = b.scalar("s", 3.0);
    let m = b.bin(BinaryOp::Mul, x, s, "m");
    let a = b.bin(BinaryOp::Add, m, s, "a");
    let r = b.un(UnaryOp::Relu, a, "r");
    let out = b.un(UnaryOp::Sqrt, r, "out");
    b.output(out);
    b.output(a);
    let g = b.g;
    assert_eq!(chains(&g), vec![vec!["Mul", "Add"], vec!["Relu", "Sqrt"]]);
    assert_unchanged(&g);
}

/// A result read by two chains belongs to neither; what feeds it is a
/// chain of its own.
#[test]
fn a_result_read_by_two_chains_ends_its_own() {
    let mut b = Builder::new();
    let x = b.input("x", &[5, 64]);
    let s = b.scalar("s", 0.75);
    let m = b.bin(BinaryOp::Mul, x, s, "m");
    let t = b.un(UnaryOp::Tanh, m, "t");
    let e = b.un(UnaryOp::Exp, t, "e");
    let y1 = b.bin(BinaryOp::Add, e, s, "y1");
    let n = b.un(UnaryOp::Neg, t, "n");
    let y2 = b.bin(BinaryOp::Max, n, x, "y2");
    b.output(y1);
    b.output(y2);
    let g = b.g;
    assert_eq!(
        chains(&g),
        vec![vec!["Mul", "Tanh"], vec!["Exp", "Add"], vec!["Neg", "Max"]]
    );
    assert_unchanged(&g);
}

/// Channels-first per-channel constants (`[C, 1, 1]` over `[N, C, H, W]`):
/// runs of H·W shorter and longer than a block, batch 1 and 3.
#[test]
fn channels_first_per_channel_constants_are_chained() {
    for (n, c, hw) in [(1, 6, 5), (3, 6, 5), (2, 3, 64), (1, 64, 40)] {
        let mut b = Builder::new();
        let x = b.input("x", &[n, c, hw, hw]);
        let scale = b.constant("scale", &[c, 1, 1], data(c, 2));
        let shift = b.constant("shift", &[1, c, 1, 1], data(c, 3));
        let y = b.bin(BinaryOp::Mul, x, scale, "y");
        let z = b.bin(BinaryOp::Add, shift, y, "z");
        let out = b.un(UnaryOp::Relu, z, "out");
        b.output(out);
        let g = b.g;
        assert_eq!(chains(&g), vec![vec!["Mul", "Add", "Relu"]], "{n}x{c}x{hw}x{hw}");
        assert_unchanged(&g);
    }
}

/// An input whose dims other than 1 are not one run of the output's
/// (`[4, 1, 8]` over `[4, 3, 8]`) keeps its op out of the chain.
#[test]
fn an_input_broadcast_another_way_stays_apart() {
    let mut b = Builder::new();
    let x = b.input("x", &[4, 3, 8]);
    let c = b.constant("c", &[4, 1, 8], data(32, 2));
    let y = b.bin(BinaryOp::Mul, x, c, "y");
    let r = b.un(UnaryOp::Relu, y, "r");
    let s = b.scalar("s", 0.25);
    let out = b.bin(BinaryOp::Add, r, s, "out");
    b.output(out);
    let g = b.g;
    assert_eq!(chains(&g), vec![vec!["Relu", "Add"]]);
    assert_eq!(loose(&g), 1);
    assert_unchanged(&g);
}

/// Rows of two lengths cannot share blocks: no chain.
#[test]
fn rows_of_two_lengths_are_not_chained() {
    let mut b = Builder::new();
    let x = b.input("x", &[4, 6, 10]);
    let r1 = b.constant("r1", &[10], data(10, 1));
    let r2 = b.constant("r2", &[6, 10], data(60, 2));
    let a = b.bin(BinaryOp::Add, x, r1, "a");
    let out = b.bin(BinaryOp::Mul, a, r2, "out");
    b.output(out);
    let g = b.g;
    assert!(chains(&g).is_empty());
    assert_unchanged(&g);
}

/// A long run of ops: the last [`MAX_CHAIN_OPS`] are one chain, the rest
/// another.
#[test]
fn long_runs_are_split() {
    let mut b = Builder::new();
    let x = b.input("x", &[3, 17]);
    let s = b.scalar("s", 1.01);
    let mut y = x;
    for i in 0..MAX_CHAIN_OPS + 2 {
        y = b.bin(BinaryOp::Mul, y, s, &format!("y{i}"));
    }
    b.output(y);
    let g = b.g;
    assert_eq!(
        chains(&g).iter().map(Vec::len).collect::<Vec<_>>(),
        vec![2, MAX_CHAIN_OPS]
    );
    assert_eq!(loose(&g), 0);
    assert_unchanged(&g);
}

/// Integer arithmetic, comparisons and PRelu keep their own steps.
#[test]
fn other_types_and_ops_are_not_chained() {
    let mut b = Builder::new();
    let i = b.g.add_value("i", TensorType::new(DType::I64, &[2, 3])).unwrap();
    b.g.inputs.push(i);
    let two = b.g.add_value("two", TensorType::new(DType::I64, &[])).unwrap();
    b.g.add_constant_tensor(two, &crate::ir::Tensor::i64(&[], vec![2]))
        .unwrap();
    let j = b.bin(BinaryOp::Add, i, two, "j");
    let k = b.bin(BinaryOp::Mul, j, two, "k");
    b.output(k);
    let x = b.input("x", &[2, 3]);
    let slope = b.constant("slope", &[3], data(3, 4));
    let p = b.bin(BinaryOp::PRelu, x, slope, "p");
    let q = b.bin(BinaryOp::Greater, p, x, "q");
    b.output(q);
    assert!(chains(&b.g).is_empty());
}

#[test]
fn a_graph_without_the_pass_keeps_its_ops() {
    let g = affine_relu(1, 3, 4);
    let opt = optimise(&g, unchained()).unwrap();
    assert!(opt.nodes.iter().all(|n| !matches!(n.op, Op::Chain(_))));
    assert_eq!(opt.nodes.len(), 5);
}

/// The op's type rule refuses what the kernel could not run.
#[test]
fn the_type_rule_refuses_bad_chains() {
    use crate::ir::{infer, Operand};
    let full = TensorType::f32(&[4, 8]);
    let row = TensorType::f32(&[8]);
    let gap = TensorType::f32(&[4, 1, 8]);
    let wide = TensorType::f32(&[4, 3, 8]);
    let ints = TensorType::new(DType::I64, &[4, 8]);
    let relu = |o| ChainOp::Unary(UnaryOp::Relu, o);
    let add = |a, b| ChainOp::Binary(BinaryOp::Add, a, b);
    let (i0, i1, r0) = (Operand::Input(0), Operand::Input(1), Operand::Result(0));
    let ok = infer(&Op::Chain(vec![add(i0, i1), relu(r0)]), &[&full, &row], None).unwrap();
    assert_eq!(ok[0], full);
    for (ops, ins, why) in [
        (vec![relu(Operand::Result(1)), relu(r0)], vec![&full], "cannot see"),
        (vec![relu(Operand::Input(3))], vec![&full], "cannot see"),
        (vec![add(i0, i1)], vec![&wide, &gap], "does not line up"),
        (vec![relu(i0), add(r0, i1)], vec![&row, &full], "not all of shape"),
        (vec![relu(i0)], vec![&ints], "int64"),
        (vec![], vec![&full], "needs an op"),
    ] {
        let err = infer(&Op::Chain(ops), &ins, None).unwrap_err();
        assert!(err.contains(why), "{err}");
    }
}
