//! The layout pass on hand-built graphs: how many transposes remain, and
//! that the program computes what it computes without the pass.

use super::*;
use crate::compiler::tests::{assert_close, data, run_f32, Builder};
use crate::compiler::{compile_with, optimise, Passes};
use crate::ir::{BinaryOp, DType, MatMulAttrs, ReduceKind, UnaryOp};
use crate::target::Target;

const NHWC: [usize; 4] = [0, 2, 3, 1];
const NCHW: [usize; 4] = [0, 3, 1, 2];

fn without_layout() -> Passes {
    Passes {
        layout: false,
        ..Passes::default()
    }
}

fn transposes(g: &Graph) -> usize {
    g.nodes.iter().filter(|n| matches!(n.op, Op::Transpose { .. })).count()
}

fn program_transposes(g: &Graph, passes: Passes) -> usize {
    let p = compile_with(g, Target::Generic, passes).unwrap();
    p.op_counts()
        .iter()
        .filter(|(op, _)| op == "Transpose")
        .map(|(_, n)| n)
        .sum()
}

/// Runs `g` with and without the pass on the same random inputs and checks
/// the outputs agree within `tol` (0: bit-identical); returns the graph
/// after the passes.
fn check_same(g: &Graph, tol: f32) -> Graph {
    let inputs: Vec<Vec<f32>> = g
        .inputs
        .iter()
        .enumerate()
        .map(|(k, &v)| data(g.values[v].ty.numel(), k + 3))
        .collect();
    // The host's best kernels and the portable ones.
    for target in [Target::cpu_best(), Target::Generic] {
        let want = run_f32(&compile_with(g, target, without_layout()).unwrap(), &inputs);
        let got = run_f32(&compile_with(g, target, Passes::default()).unwrap(), &inputs);
        assert_close(&got, &want, tol);
    }
    optimise(g, crate::compiler::tests::inspected()).unwrap()
}

fn t(b: &mut Builder, x: ValueId, perm: &[usize], out: &str) -> ValueId {
    b.op(Op::Transpose { perm: perm.to_vec() }, &[x], out)
}

/// A layout-sensitive stand-in for a spatial op on `[N, H, W, C]`: a 1×1
/// convolution written as a product over the channels.
fn pointwise(b: &mut Builder, x: ValueId, cin: usize, cout: usize, name: &str) -> ValueId {
    let w = b.constant(&format!("{name}.w"), &[cin, cout], data(cin * cout, cout));
    b.op(Op::MatMul(MatMulAttrs::default()), &[x, w], name)
}

/// `conv` as kiln imports it: to channels-last, the op, back to channels-first.
fn conv(b: &mut Builder, x: ValueId, cin: usize, cout: usize, name: &str) -> ValueId {
    let xl = t(b, x, &NHWC, &format!("{name}.in"));
    let y = pointwise(b, xl, cin, cout, name);
    t(b, y, &NCHW, &format!("{name}.out"))
}

#[test]
fn conv_chain_keeps_channels_last_between_convolutions() {
    let mut b = Builder::new();
    let x = b.input("x", &[2, 3, 4, 5]);
    let c1 = conv(&mut b, x, 3, 6, "c1");
    let r = b.un(UnaryOp::Relu, c1, "relu");
    let bias = b.constant("bias", &[6, 1, 1], data(6, 9));
    let a = b.bin(BinaryOp::Add, r, bias, "add");
    let s = b.un(UnaryOp::Sigmoid, a, "sig");
    let silu = b.bin(BinaryOp::Mul, a, s, "silu");
    let c2 = conv(&mut b, silu, 6, 6, "c2");
    let res = b.bin(BinaryOp::Add, c2, silu, "residual");
    let half = b.scalar("half", 0.5);
    let h = b.bin(BinaryOp::Mul, res, half, "halved");
    let c3 = conv(&mut b, h, 6, 4, "c3");
    b.output(c3);
    assert_eq!(transposes(&b.g), 6);
    let opt = check_same(&b.g, 0.0);
    // Only the partition's edges transpose.
    assert_eq!(transposes(&opt), 2, "{:?}", opt.nodes);
    assert_eq!(program_transposes(&b.g, Passes::default()), 2);
    assert_eq!(program_transposes(&b.g, without_layout()), 6);
    // The per-channel bias became [1, 1, 6] in channels-last order.
    let permuted: Vec<_> = opt
        .nodes
        .iter()
        .filter(|n| n.op == Op::Binary(BinaryOp::Add))
        .flat_map(|n| n.inputs.clone())
        .filter_map(|v| opt.constant(v).map(|_| opt.ty(v).shape.clone()))
        .collect();
    assert_eq!(permuted, vec![vec![1, 1, 6]]);
}

#[test]
fn the_pass_can_be_turned_off() {
    let mut b = Builder::new();
    let x = b.input("x", &[1, 3, 4, 5]);
    let c1 = conv(&mut b, x, 3, 3, "c1");
    let c2 = conv(&mut b, c1, 3, 3, "c2");
    b.output(c2);
    assert_eq!(transposes(&optimise(&b.g, without_layout()).unwrap()), 4);
    assert_eq!(
        transposes(&optimise(&b.g, crate::compiler::tests::inspected()).unwrap()),
        2
    );
}

#[test]
fn a_value_read_by_layout_sensitive_ops_keeps_one_transpose() {
    let mut b = Builder::new();
    let x = b.input("x", &[2, 3, 4, 5]);
    let c1 = conv(&mut b, x, 3, 4, "c1");
    // Read by two convolutions (via Relu), by a Reshape that regroups dims
    // and by a Gather-like sensitive op (a product over W), and returned.
    let r = b.un(UnaryOp::Relu, c1, "relu");
    let c2 = conv(&mut b, r, 4, 4, "c2");
    let c3 = conv(&mut b, c1, 4, 4, "c3");
    let flat = b.op_shaped(Op::Reshape, &[c1], "flat", Some(&[2, 4, 20]));
    let w = b.constant("w", &[5, 2], data(10, 1));
    let mm = b.op(Op::MatMul(MatMulAttrs::default()), &[c1, w], "overw");
    let sum = b.bin(BinaryOp::Add, c2, c3, "sum");
    for v in [sum, flat, mm, c1] {
        b.output(v);
    }
    let opt = check_same(&b.g, 0.0);
    // x in, c1 once for its three channels-first readers, sum out.
    assert_eq!(transposes(&opt), 3, "{:?}", opt.nodes);
}

/// A channels-first value read by several spatial ops (a partition's input
/// feeding two convolutions, a Reshape's output feeding a convolution and
/// its residual path) is transposed once, the other readers reading that
/// transpose; as a graph output too.
#[test]
fn a_value_read_by_several_spatial_ops_is_transposed_once() {
    let mut b = Builder::new();
    let x = b.input("x", &[2, 3, 4, 5]);
    let c1 = conv(&mut b, x, 3, 4, "c1");
    let c2 = conv(&mut b, x, 3, 4, "c2");
    let sum = b.bin(BinaryOp::Add, c1, c2, "sum");
    // The same channels-last view of x, returned as a graph output.
    let xl = t(&mut b, x, &NHWC, "x.nhwc");
    for v in [sum, xl] {
        b.output(v);
    }
    assert_eq!(transposes(&b.g), 5);
    let opt = check_same(&b.g, 0.0);
    // x to channels-last once (c1, c2 and the output read it), sum out.
    assert_eq!(transposes(&opt), 2, "{:?}", opt.nodes);
}

#[test]
fn concat_split_reduce_softmax_cast_and_where_follow_the_layout() {
    let mut b = Builder::new();
    let x = b.input("x", &[2, 3, 4, 5]);
    let y = b.input("y", &[2, 3, 4, 5]);
    let cx = conv(&mut b, x, 3, 4, "cx");
    let cy = conv(&mut b, y, 3, 2, "cy");
    let cat = b.op(Op::Concat { axis: 1 }, &[cx, cy], "cat");
    // Split into channels 0..2 and 2..6 (Op::Slice parts), and a strided slice of W.
    let lo = b.op_shaped(
        Op::Slice {
            starts: vec![0, 0, 0, 0],
            steps: vec![1, 1, 1, 1],
        },
        &[cat],
        "lo",
        Some(&[2, 2, 4, 5]),
    );
    let hi = b.op_shaped(
        Op::Slice {
            starts: vec![0, 2, 0, 4],
            steps: vec![1, 1, 1, -2],
        },
        &[cat],
        "hi",
        Some(&[2, 4, 4, 3]),
    );
    let sm = b.op(
        Op::Softmax {
            axis: 1,
            unshifted: false,
        },
        &[hi],
        "softmax",
    );
    let mean = b.op(
        Op::Reduce {
            kind: ReduceKind::Mean,
            axes: vec![2, 3],
            keepdims: true,
        },
        &[lo],
        "gap",
    );
    let scaled = b.bin(BinaryOp::Mul, lo, mean, "se");
    let cast = b.op(Op::Cast { to: DType::F32 }, &[scaled], "cast");
    let cond =
        b.g.add_value("cond", crate::ir::TensorType::new(DType::Bool, &[2, 1, 1]))
            .unwrap();
    b.g.add_constant_tensor(cond, &crate::ir::Tensor::bool(&[2, 1, 1], vec![1, 0]))
        .unwrap();
    let zero = b.scalar("zero", 0.0);
    let wh = b.op(Op::Where, &[cond, cast, zero], "where");
    let c1 = conv(&mut b, wh, 2, 3, "c1");
    let c2 = conv(&mut b, sm, 4, 3, "c2");
    let pooled = b.op(
        Op::Reduce {
            kind: ReduceKind::Max,
            axes: vec![2, 3],
            keepdims: false,
        },
        &[c2],
        "gmp",
    );
    b.output(c1);
    b.output(pooled);
    let opt = check_same(&b.g, 1e-6);
    // In: x, y; out: c1; the pooled [2, 3] needs none.
    assert_eq!(transposes(&opt), 3, "{:?}", opt.nodes);
}

#[test]
fn one_d_ops_round_trip_through_unit_reshapes() {
    for n in [1, 2] {
        let mut b = Builder::new();
        let x = b.input("x", &[n, 3, 7]);
        let mut v = x;
        for (k, (cin, cout)) in [(3, 4), (4, 4), (4, 2)].into_iter().enumerate() {
            // What channels_last / channels_first emit for a 1-D op.
            let x4 = b.op_shaped(Op::Reshape, &[v], &format!("r{k}"), Some(&[n, cin, 1, 7]));
            let c = conv(&mut b, x4, cin, cout, &format!("c{k}"));
            let y = b.op_shaped(Op::Reshape, &[c], &format!("s{k}"), Some(&[n, cout, 7]));
            v = b.un(UnaryOp::Tanh, y, &format!("tanh{k}"));
        }
        b.output(v);
        let opt = check_same(&b.g, 0.0);
        assert_eq!(transposes(&opt), 2, "batch {n}: {:?}", opt.nodes);
    }
}

#[test]
fn transposes_compose_and_unit_moves_become_reshapes() {
    let mut b = Builder::new();
    let x = b.input("x", &[2, 3, 4]);
    let a = t(&mut b, x, &[1, 0, 2], "a");
    let a = b.un(UnaryOp::Neg, a, "neg");
    let c = t(&mut b, a, &[2, 0, 1], "c");
    b.output(c);
    let opt = check_same(&b.g, 0.0);
    assert_eq!(transposes(&opt), 1);
    let perm: Vec<_> = opt
        .nodes
        .iter()
        .filter_map(|n| match &n.op {
            Op::Transpose { perm } => Some(perm.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(perm, vec![vec![2, 1, 0]]);

    // A transpose and its inverse cancel; the output is a copy of the Neg.
    let mut b = Builder::new();
    let x = b.input("x", &[2, 3, 4]);
    let a = t(&mut b, x, &[1, 2, 0], "a");
    let a = b.un(UnaryOp::Neg, a, "neg");
    let c = t(&mut b, a, &inverse(&[1, 2, 0]), "c");
    b.output(c);
    assert_eq!(transposes(&check_same(&b.g, 0.0)), 0);

    // Moving only size-1 dims (channels-last of a 1-channel image) is a reshape.
    let mut b = Builder::new();
    let x = b.input("x", &[2, 1, 4, 5]);
    let a = t(&mut b, x, &NHWC, "a");
    b.output(a);
    let opt = check_same(&b.g, 0.0);
    assert_eq!(transposes(&opt), 0);
}

#[test]
fn broadcasting_operands_of_every_rank() {
    let mut b = Builder::new();
    let x = b.input("x", &[2, 3, 4, 5]);
    let small = b.input("small", &[3, 1, 1]);
    let c1 = conv(&mut b, x, 3, 3, "c1");
    let row = b.constant("row", &[5], data(5, 2));
    let plane = b.constant("plane", &[4, 5], data(20, 3));
    let full = b.constant("full", &[1, 3, 4, 5], data(60, 4));
    let a = b.bin(BinaryOp::Sub, row, c1, "a");
    let a = b.bin(BinaryOp::Div, a, plane, "b");
    let a = b.bin(BinaryOp::Mul, full, a, "c");
    // A computed per-channel operand is transposed itself (it is smaller).
    let a = b.bin(BinaryOp::Add, a, small, "d");
    let c2 = conv(&mut b, a, 3, 2, "c2");
    b.output(c2);
    let opt = check_same(&b.g, 0.0);
    assert_eq!(transposes(&opt), 2, "{:?}", opt.nodes);

    // A computed operand as large as the view: the view is materialised.
    let mut b = Builder::new();
    let x = b.input("x", &[2, 3, 4, 5]);
    let y = b.input("y", &[2, 3, 4, 5]);
    let c1 = conv(&mut b, x, 3, 3, "c1");
    let a = b.bin(BinaryOp::Add, c1, y, "a");
    let c2 = conv(&mut b, a, 3, 2, "c2");
    b.output(c2);
    let opt = check_same(&b.g, 0.0);
    assert_eq!(transposes(&opt), 4, "{:?}", opt.nodes);
}

#[test]
fn views_with_other_perms_and_growing_outputs_are_materialised() {
    let mut b = Builder::new();
    let x = b.input("x", &[2, 3, 4, 5]);
    let a = t(&mut b, x, &NHWC, "a");
    let c = t(&mut b, x, &[0, 1, 3, 2], "c");
    let c = b.op_shaped(Op::Reshape, &[c], "cr", Some(&[2, 4, 5, 3]));
    let s = b.bin(BinaryOp::Add, a, c, "s");
    // A small view broadcast against a large constant would grow.
    let g = b.op(
        Op::Reduce {
            kind: ReduceKind::Sum,
            axes: vec![1, 2],
            keepdims: true,
        },
        &[a],
        "g",
    );
    let big = b.constant("big", &[2, 4, 5, 3], data(120, 5));
    let m = b.bin(BinaryOp::Mul, g, big, "m");
    b.output(s);
    b.output(m);
    check_same(&b.g, 1e-6);
}

/// A small deterministic generator (xorshift).
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }

    fn perm(&mut self, rank: usize) -> Vec<usize> {
        let mut p: Vec<usize> = (0..rank).collect();
        for i in (1..rank).rev() {
            p.swap(i, self.below(i + 1));
        }
        p
    }
}

/// One random layout-agnostic (or layout-sensitive) op on `v`.
fn random_op(b: &mut Builder, rng: &mut Rng, v: ValueId, pool: &[ValueId], k: usize) -> ValueId {
    let shape = b.g.ty(v).shape.clone();
    let rank = shape.len();
    let name = format!("v{k}");
    match rng.below(10) {
        0 | 1 => {
            let p = rng.perm(rank);
            t(b, v, &p, &name)
        }
        2 => b.un([UnaryOp::Neg, UnaryOp::Tanh, UnaryOp::Relu][rng.below(3)], v, &name),
        3 => {
            // A constant broadcasting from the right, some dims 1, maybe lower rank.
            let r = 1 + rng.below(rank);
            let cs: Vec<usize> = shape[rank - r..]
                .iter()
                .map(|&d| if rng.below(2) == 0 { 1 } else { d })
                .collect();
            let n = cs.iter().product();
            let c = b.constant(&format!("c{k}"), &cs, data(n, k));
            let op = [BinaryOp::Add, BinaryOp::Mul, BinaryOp::Sub][rng.below(3)];
            if rng.below(2) == 0 {
                b.bin(op, v, c, &name)
            } else {
                b.bin(op, c, v, &name)
            }
        }
        4 => {
            // Another value of the same shape (a residual), if there is one.
            match pool.iter().find(|&&u| u != v && b.g.ty(u).shape == shape) {
                Some(&u) => b.bin(BinaryOp::Add, v, u, &name),
                None => b.un(UnaryOp::Neg, v, &name),
            }
        }
        5 => {
            let lo = rng.below(rank);
            let hi = lo + rng.below(rank - lo);
            let keepdims = rank == 1 || rng.below(2) == 0;
            let kind = [ReduceKind::Sum, ReduceKind::Max, ReduceKind::Mean][rng.below(3)];
            let axes = (lo..=hi).collect::<Vec<_>>();
            let axes = if !keepdims && axes.len() == rank {
                vec![lo]
            } else {
                axes
            };
            b.op(Op::Reduce { kind, axes, keepdims }, &[v], &name)
        }
        6 => {
            let axis = rng.below(rank);
            b.op(Op::Softmax { axis, unshifted: false }, &[v], &name)
        }
        7 => {
            let axis = rng.below(rank);
            b.op(Op::Concat { axis }, &[v, v], &name)
        }
        8 => {
            let axis = rng.below(rank);
            let mut starts = vec![0; rank];
            let mut steps = vec![1; rank];
            let mut out = shape.clone();
            if shape[axis] > 1 {
                if rng.below(2) == 0 {
                    starts[axis] = 1;
                    out[axis] = shape[axis] - 1;
                } else {
                    starts[axis] = shape[axis] - 1;
                    steps[axis] = -1;
                }
            }
            b.op_shaped(Op::Slice { starts, steps }, &[v], &name, Some(&out))
        }
        _ => {
            // A unit dim added or removed, or a Reshape that regroups dims.
            let mut out = shape.clone();
            match (rng.below(3), shape.iter().position(|&d| d == 1)) {
                (0, Some(i)) if rank > 1 => {
                    out.remove(i);
                }
                (1, _) if rank < 5 => out.insert(rng.below(rank + 1), 1),
                _ if rank > 1 => {
                    let last = out.pop().unwrap();
                    *out.last_mut().unwrap() *= last;
                }
                _ => out.insert(0, 1),
            }
            b.op_shaped(Op::Reshape, &[v], &name, Some(&out))
        }
    }
}

#[test]
fn random_graphs_compute_the_same_with_and_without_the_pass() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    for case in 0..150 {
        let mut b = Builder::new();
        let rank = 2 + rng.below(3);
        let shape: Vec<usize> = (0..rank).map(|_| 1 + rng.below(4)).collect();
        let x = b.input("x", &shape);
        let mut pool = vec![x];
        let mut v = x;
        for k in 0..8 {
            v = random_op(&mut b, &mut rng, v, &pool, k);
            pool.push(v);
        }
        b.output(v);
        let extra = pool[1 + rng.below(pool.len() - 1)];
        if extra != v {
            b.output(extra);
        }
        let before = transposes(&b.g);
        let opt = check_same(&b.g, 1e-5);
        // Moving a smaller operand into a layout may add one; over these
        // cases the pass removes about three quarters of the transposes.
        assert!(
            transposes(&opt) <= before + 1,
            "case {case}: {before} → {}",
            transposes(&opt)
        );
    }
}

#[test]
fn a_view_that_meets_no_transpose_is_not_moved() {
    // conv → Relu → output, the conv's channels-first value also an output:
    // one transpose serves both (moving it into Relu would need two).
    let mut b = Builder::new();
    let x = b.input("x", &[2, 3, 4, 5]);
    let c1 = conv(&mut b, x, 3, 4, "c1");
    let r = b.un(UnaryOp::Relu, c1, "relu");
    b.output(r);
    b.output(c1);
    let opt = check_same(&b.g, 0.0);
    assert_eq!(transposes(&opt), 2, "{:?}", opt.nodes);
    // A reduction is still moved: its output is smaller than the view.
    let mut b = Builder::new();
    let x = b.input("x", &[2, 3, 4, 5]);
    let c1 = conv(&mut b, x, 3, 4, "c1");
    let r = b.op(
        Op::Reduce {
            kind: ReduceKind::Sum,
            axes: vec![1],
            keepdims: false,
        },
        &[c1],
        "sum",
    );
    b.output(r);
    let opt = check_same(&b.g, 1e-6);
    assert_eq!(
        opt.nodes.iter().map(|n| n.op.name()).collect::<Vec<_>>(),
        ["Transpose", "MatMul", "ReduceSum", "Reshape"]
    );
}
