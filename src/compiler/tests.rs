//! Pass-by-pass tests over hand-built IR, and whole-pipeline checks that the
//! optimised program computes what the unoptimised one does.

use super::*;
use crate::ir::{
    infer, Activation, BiasKind, BinaryOp, DType, MatMulAttrs, Op, ReduceKind, TensorType, UnaryOp, ValueId,
};
use crate::kernels::parallel::{ScopedThreads, Serial};
use crate::plan::{Step, TensorMut, TensorRef};

/// Small builder so tests read like the graphs they build.
pub(crate) struct Builder {
    pub g: Graph,
}

impl Builder {
    pub fn new() -> Self {
        Builder { g: Graph::new("test") }
    }

    pub fn input(&mut self, name: &str, shape: &[usize]) -> ValueId {
        let v = self.g.add_value(name, TensorType::f32(shape)).unwrap();
        self.g.inputs.push(v);
        v
    }

    pub fn constant(&mut self, name: &str, shape: &[usize], data: Vec<f32>) -> ValueId {
        let v = self.g.add_value(name, TensorType::f32(shape)).unwrap();
        self.g.add_constant(v, data).unwrap();
        v
    }

    pub fn scalar(&mut self, name: &str, x: f32) -> ValueId {
        self.constant(name, &[], vec![x])
    }

    /// Adds `op(inputs)` with inferred (or `shape`-given) output type.
    pub fn op_shaped(&mut self, op: Op, inputs: &[ValueId], out: &str, shape: Option<&[usize]>) -> ValueId {
        let tys: Vec<&TensorType> = inputs.iter().map(|&v| &self.g.values[v].ty).collect();
        let ty = infer(&op, &tys, shape).unwrap().remove(0);
        let y = self.g.add_value(out, ty).unwrap();
        self.g.add_node(out, op, inputs.to_vec(), vec![y]);
        y
    }

    pub fn op(&mut self, op: Op, inputs: &[ValueId], out: &str) -> ValueId {
        self.op_shaped(op, inputs, out, None)
    }

    pub fn bin(&mut self, op: BinaryOp, a: ValueId, b: ValueId, out: &str) -> ValueId {
        self.op(Op::Binary(op), &[a, b], out)
    }

    pub fn un(&mut self, op: UnaryOp, a: ValueId, out: &str) -> ValueId {
        self.op(Op::Unary(op), &[a], out)
    }

    pub fn output(&mut self, v: ValueId) {
        self.g.outputs.push(v);
    }
}

pub(crate) fn data(n: usize, seed: usize) -> Vec<f32> {
    (0..n)
        .map(|i| ((i * 7919 + seed * 104_729) % 1000) as f32 / 250.0 - 2.0)
        .collect()
}

/// Runs `p` on f32 inputs, returning f32 outputs.
pub(crate) fn run_f32(p: &Program, inputs: &[Vec<f32>]) -> Vec<Vec<f32>> {
    let mut outs: Vec<Vec<f32>> = p.outputs().iter().map(|s| vec![f32::NAN; s.numel()]).collect();
    let ins: Vec<TensorRef<'_>> = inputs.iter().map(|v| TensorRef::F32(v)).collect();
    let mut views: Vec<TensorMut<'_>> = outs.iter_mut().map(|v| TensorMut::F32(v)).collect();
    p.run(Target::cpu_best(), &ins, &mut views, &Serial).unwrap();
    outs
}

fn inputs_for(g: &Graph) -> Vec<Vec<f32>> {
    g.inputs
        .iter()
        .enumerate()
        .map(|(k, &v)| data(g.values[v].ty.numel(), k + 1))
        .collect()
}

pub(crate) fn assert_close(got: &[Vec<f32>], want: &[Vec<f32>], tol: f32) {
    assert_eq!(got.len(), want.len());
    for (k, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.len(), w.len(), "output {k}");
        for (i, (&x, &y)) in g.iter().zip(w).enumerate() {
            let ok = (x.is_nan() && y.is_nan()) || (x - y).abs() <= tol * y.abs() + tol;
            assert!(ok, "output {k}[{i}]: got {x}, want {y}");
        }
    }
}

const NO_PASSES: Passes = Passes {
    fold: false,
    patterns: false,
    layout: false,
    epilogue: false,
    chain: false,
    winograd: true,
};

/// Compiles with and without the optional passes on every runnable target
/// and checks they agree; returns the optimised graph.
fn check_passes_agree(g: &Graph) -> Graph {
    let inputs = inputs_for(g);
    let plain = compile_with(g, Target::Generic, NO_PASSES).unwrap();
    let want = run_f32(&plain, &inputs);
    for target in Target::ALL {
        let p = compile(g, target).unwrap();
        if target.can_run_on(Target::cpu_best()) {
            assert_close(&run_f32(&p, &inputs), &want, 2e-5);
        }
    }
    optimise(g, inspected()).unwrap()
}

/// The passes whose graph these tests inspect: all but the elementwise
/// chains, which would hide the ops the other passes leave (the programs
/// run with every pass; `chain_tests` checks the chains).
pub(crate) fn inspected() -> Passes {
    Passes {
        chain: false,
        ..Passes::default()
    }
}

fn ops(g: &Graph) -> Vec<String> {
    g.nodes.iter().map(|n| n.op.name()).collect()
}

/// x·0.5·(1+erf(x/√2)) in one of three arrangements, `c` standing for √2.
fn gelu_graph(arrangement: usize, c: f32, div: bool) -> Graph {
    let mut b = Builder::new();
    let x = b.input("x", &[4, 33]);
    let k = b.scalar("k", if div { c } else { 1.0 / c });
    let one = b.scalar("one", 1.0);
    let half = b.scalar("half", 0.5);
    let d = b.bin(if div { BinaryOp::Div } else { BinaryOp::Mul }, x, k, "d");
    let e = b.un(UnaryOp::Erf, d, "e");
    let a = b.bin(BinaryOp::Add, one, e, "a");
    let y = match arrangement {
        0 => {
            let m = b.bin(BinaryOp::Mul, x, a, "m");
            b.bin(BinaryOp::Mul, m, half, "y")
        }
        1 => {
            let h = b.bin(BinaryOp::Mul, half, x, "h");
            b.bin(BinaryOp::Mul, h, a, "y")
        }
        _ => {
            let h = b.bin(BinaryOp::Mul, a, half, "h");
            b.bin(BinaryOp::Mul, x, h, "y")
        }
    };
    let z = b.un(UnaryOp::Neg, y, "z");
    b.output(z);
    b.g
}

#[test]
fn erf_gelu_is_recognised_in_every_arrangement() {
    for arrangement in 0..3 {
        for div in [true, false] {
            let g = gelu_graph(arrangement, std::f32::consts::SQRT_2, div);
            let opt = check_passes_agree(&g);
            assert_eq!(ops(&opt), ["Gelu", "Neg"], "arrangement {arrangement} div {div}");
            // Only `(x·a)·0.5` doubles x first, and so overflows for x > FLT_MAX/2.
            let want = if arrangement == 0 {
                UnaryOp::GeluWritten
            } else {
                UnaryOp::Gelu
            };
            assert_eq!(opt.nodes[0].op, Op::Unary(want), "arrangement {arrangement}");
        }
    }
}

#[test]
fn near_miss_gelu_is_left_alone() {
    let g = gelu_graph(0, 1.5, true);
    let opt = check_passes_agree(&g);
    assert!(ops(&opt).contains(&"Erf".to_string()), "{:?}", ops(&opt));
    // An intermediate that escapes (a graph output) blocks the fusion too.
    let mut g = gelu_graph(0, std::f32::consts::SQRT_2, true);
    let e = g.value_id("e").unwrap();
    g.outputs.push(e);
    let opt = check_passes_agree(&g);
    assert!(ops(&opt).contains(&"Erf".to_string()), "{:?}", ops(&opt));
    // Without the pattern pass nothing is fused.
    let g = gelu_graph(0, std::f32::consts::SQRT_2, true);
    let opt = optimise(
        &g,
        Passes {
            patterns: false,
            ..inspected()
        },
    )
    .unwrap();
    assert!(ops(&opt).contains(&"Erf".to_string()));
}

/// `x + 0.044715 · x³`'s cube term written as `form` says; `coef` and
/// `power` (of x) let a test break it.
fn cube_term(b: &mut Builder, x: ValueId, form: usize, coef: f32, power: usize) -> ValueId {
    let c = b.scalar("c", coef);
    match form {
        // c · Pow(x, 3)
        0 => {
            let three = b.scalar("three", power as f32);
            let cube = b.bin(BinaryOp::Pow, x, three, "cube");
            b.bin(BinaryOp::Mul, cube, c, "m")
        }
        // (x · (x · x)) · c
        1 => {
            let x2 = b.bin(BinaryOp::Mul, x, x, "x2");
            let cube = if power == 3 {
                b.bin(BinaryOp::Mul, x, x2, "cube")
            } else {
                x2
            };
            b.bin(BinaryOp::Mul, cube, c, "m")
        }
        // x · (x · (c · x)), as jax2tf writes it (Magika)
        _ => {
            let mut m = b.bin(BinaryOp::Mul, c, x, "cx");
            for i in 1..power {
                m = b.bin(BinaryOp::Mul, x, m, &format!("m{i}"));
            }
            m
        }
    }
}

fn tanh_gelu_graph(form: usize, coef: f32, power: usize) -> Graph {
    let mut b = Builder::new();
    let x = b.input("x", &[3, 16]);
    let m = cube_term(&mut b, x, form, coef, power);
    let s = b.bin(BinaryOp::Add, x, m, "s");
    let k = b.scalar("k", 0.797_884_6);
    let u = b.bin(BinaryOp::Mul, s, k, "u");
    let t = b.un(UnaryOp::Tanh, u, "t");
    let one = b.scalar("one", 1.0);
    let a = b.bin(BinaryOp::Add, t, one, "a");
    let half = b.scalar("half", 0.5);
    let h = b.bin(BinaryOp::Mul, x, half, "h");
    let y = b.bin(BinaryOp::Mul, h, a, "y");
    b.output(y);
    b.g
}

#[test]
fn tanh_gelu_is_recognised() {
    for form in 0..3 {
        let opt = check_passes_agree(&tanh_gelu_graph(form, 0.044715, 3));
        assert_eq!(ops(&opt), ["Gelu(tanh)"], "form {form}");
        // Another coefficient, or a square for the cube: not GELU.
        for (coef, power) in [(0.05, 3), (0.044715, 2)] {
            let opt = check_passes_agree(&tanh_gelu_graph(form, coef, power));
            assert!(
                ops(&opt).contains(&"Tanh".to_string()),
                "form {form} {coef} x^{power}: {:?}",
                ops(&opt)
            );
        }
    }
}

/// Decomposed LayerNorm over the last axis, optionally with γ and β.
fn layer_norm_graph(gamma: bool, beta: bool, square_by_mul: bool) -> Graph {
    let mut b = Builder::new();
    let x = b.input("x", &[2, 5, 24]);
    let mean = |axes| Op::Reduce {
        kind: ReduceKind::Mean,
        axes,
        keepdims: true,
    };
    let mu = b.op(mean(vec![2]), &[x], "mu");
    let d = b.bin(BinaryOp::Sub, x, mu, "d");
    let p = if square_by_mul {
        b.bin(BinaryOp::Mul, d, d, "p")
    } else {
        let two = b.scalar("two", 2.0);
        b.bin(BinaryOp::Pow, d, two, "p")
    };
    let var = b.op(mean(vec![2]), &[p], "var");
    let eps = b.scalar("eps", 1e-5);
    let ve = b.bin(BinaryOp::Add, var, eps, "ve");
    let s = b.un(UnaryOp::Sqrt, ve, "s");
    let mut y = b.bin(BinaryOp::Div, d, s, "n");
    if gamma {
        let g = b.constant("gamma", &[24], data(24, 3));
        y = b.bin(BinaryOp::Mul, y, g, "scaled");
        if beta {
            let bt = b.constant("beta", &[1, 24], data(24, 4));
            y = b.bin(BinaryOp::Add, y, bt, "shifted");
        }
    }
    b.output(y);
    b.g
}

#[test]
fn layer_norm_is_recognised() {
    for (gamma, beta, by_mul) in [(true, true, false), (true, false, true), (false, false, false)] {
        let opt = check_passes_agree(&layer_norm_graph(gamma, beta, by_mul));
        assert_eq!(ops(&opt), ["LayerNormalization"], "{gamma} {beta}");
        // It keeps the decomposed ops' f32 statistics (README "Numerics").
        assert!(matches!(opt.nodes[0].op, Op::LayerNorm { decomposed: true, .. }));
        let expected_inputs = if beta { 3 } else { 2 };
        assert_eq!(opt.nodes[0].inputs.len(), expected_inputs);
    }
    // `mu - x` instead of `x - mu` is not a LayerNorm.
    let mut g = layer_norm_graph(true, true, false);
    for n in &mut g.nodes {
        if n.name == "d" {
            n.inputs.reverse();
        }
    }
    let opt = check_passes_agree(&g);
    assert!(
        !ops(&opt).contains(&"LayerNormalization".to_string()),
        "{:?}",
        ops(&opt)
    );
}

#[test]
fn softmax_is_recognised_with_and_without_max() {
    for with_max in [true, false] {
        for axis in [1, 2] {
            let mut b = Builder::new();
            let x = b.input("x", &[2, 6, 10]);
            let z = if with_max {
                let m = b.op(
                    Op::Reduce {
                        kind: ReduceKind::Max,
                        axes: vec![axis],
                        keepdims: true,
                    },
                    &[x],
                    "m",
                );
                b.bin(BinaryOp::Sub, x, m, "z")
            } else {
                x
            };
            let e = b.un(UnaryOp::Exp, z, "e");
            let s = b.op(
                Op::Reduce {
                    kind: ReduceKind::Sum,
                    axes: vec![axis],
                    keepdims: true,
                },
                &[e],
                "s",
            );
            let y = b.bin(BinaryOp::Div, e, s, "y");
            b.output(y);
            let opt = check_passes_agree(&b.g);
            assert_eq!(ops(&opt), ["Softmax"]);
            assert_eq!(
                opt.nodes[0].op,
                Op::Softmax {
                    axis,
                    unshifted: !with_max
                }
            );
        }
    }
}

fn matmul(b: &mut Builder, a: ValueId, w: ValueId, out: &str) -> ValueId {
    b.op(Op::MatMul(MatMulAttrs::default()), &[a, w], out)
}

#[test]
fn epilogue_fuses_bias_activation_and_residual() {
    let mut b = Builder::new();
    let x = b.input("x", &[2, 7, 16]);
    let w = b.constant("w", &[16, 16], data(256, 2));
    let bias = b.constant("bias", &[16], data(16, 3));
    let mm = matmul(&mut b, x, w, "mm");
    let s = b.bin(BinaryOp::Add, bias, mm, "s");
    let gl = b.un(UnaryOp::Gelu, s, "g");
    let y = b.bin(BinaryOp::Add, gl, x, "y");
    b.output(y);
    let opt = check_passes_agree(&b.g);
    assert_eq!(ops(&opt), ["MatMul+Bias+Gelu+Residual"]);
    let p = compile(&b.g, Target::Generic).unwrap();
    assert_eq!(p.num_steps(), 1);
    assert_eq!(p.packed_constants(), 1);
    assert_eq!(p.arena_bytes(), 0);
    match &p.steps()[0] {
        Step::MatMul(m) => {
            assert_eq!((m.m, m.n, m.k), (14, 16, 16), "batches fold into rows");
            assert_eq!(m.activation, Activation::GeluErf);
        }
        s => panic!("{s:?}"),
    }
}

#[test]
fn epilogue_scale_then_bias_and_blockers() {
    // Attention-style: (q·kᵀ)/8 + mask, then Softmax.
    let mut b = Builder::new();
    let q = b.input("q", &[2, 3, 5, 8]);
    let k = b.input("k", &[2, 3, 5, 8]);
    let mask = b.input("mask", &[2, 3, 5, 5]);
    let scores = b.op(
        Op::MatMul(MatMulAttrs {
            trans_b: true,
            ..MatMulAttrs::default()
        }),
        &[q, k],
        "scores",
    );
    let eight = b.scalar("eight", 8.0);
    let scaled = b.bin(BinaryOp::Div, scores, eight, "scaled");
    let masked = b.bin(BinaryOp::Add, scaled, mask, "masked");
    let p = b.op(
        Op::Softmax {
            axis: 3,
            unshifted: false,
        },
        &[masked],
        "p",
    );
    b.output(p);
    let opt = check_passes_agree(&b.g);
    assert_eq!(ops(&opt), ["MatMul+Scale+Residual", "Softmax"]);
    match &opt.nodes[0].op {
        Op::MatMul(m) => assert_eq!(m.alpha, 0.125),
        _ => unreachable!(),
    }
    // A product read twice keeps its output: nothing fuses.
    let mut b = Builder::new();
    let x = b.input("x", &[4, 8]);
    let w = b.constant("w", &[8, 8], data(64, 1));
    let mm = matmul(&mut b, x, w, "mm");
    let r = b.un(UnaryOp::Relu, mm, "r");
    b.output(r);
    b.output(mm);
    let opt = check_passes_agree(&b.g);
    assert_eq!(ops(&opt), ["MatMul", "Relu"]);
    // Without the pass, no fusion.
    let mut b = Builder::new();
    let x = b.input("x", &[4, 8]);
    let w = b.constant("w", &[8, 8], data(64, 1));
    let mm = matmul(&mut b, x, w, "mm");
    let r = b.un(UnaryOp::Relu, mm, "r");
    b.output(r);
    let opt = optimise(
        &b.g,
        Passes {
            epilogue: false,
            ..Passes::default()
        },
    )
    .unwrap();
    assert_eq!(ops(&opt), ["MatMul", "Relu"]);
    assert_eq!(ops(&check_passes_agree(&b.g)), ["MatMul+Relu"]);
}

/// ORT's MatMulAddFusion form: `Reshape → Gemm(transB, bias) → Reshape`, then
/// GELU and a residual add; `outer` is the second Reshape's shape and
/// `escape` makes the 2-D product a graph output too.
fn reshaped_gemm_graph(outer: &[usize], escape: bool) -> Graph {
    let mut b = Builder::new();
    let x = b.input("x", &[2, 7, 16]);
    let w = b.constant("w", &[16, 16], data(256, 2));
    let bias = b.constant("bias", &[16], data(16, 3));
    let x2 = b.op_shaped(Op::Reshape, &[x], "x2", Some(&[14, 16]));
    let gemm = b.op(
        Op::MatMul(MatMulAttrs {
            trans_b: true,
            bias: BiasKind::Row,
            ..MatMulAttrs::default()
        }),
        &[x2, w, bias],
        "gemm",
    );
    let y3 = b.op_shaped(Op::Reshape, &[gemm], "y3", Some(outer));
    let gl = b.un(UnaryOp::Gelu, y3, "g");
    if outer == [2, 7, 16] {
        let y = b.bin(BinaryOp::Add, gl, x, "y");
        b.output(y);
    } else {
        b.output(gl);
    }
    if escape {
        b.output(gemm);
    }
    b.g
}

#[test]
fn epilogue_sees_through_reshapes_around_a_gemm() {
    let g = reshaped_gemm_graph(&[2, 7, 16], false);
    let opt = check_passes_agree(&g);
    assert_eq!(ops(&opt), ["MatMul+Bias+Gelu+Residual"]);
    let p = compile(&g, Target::Generic).unwrap();
    assert_eq!(p.num_steps(), 1);
    assert_eq!(p.arena_bytes(), 0);
    match &p.steps()[0] {
        Step::MatMul(m) => {
            assert_eq!((m.m, m.n, m.k), (14, 16, 16), "batches fold into rows");
            assert_eq!(m.activation, Activation::GeluErf);
        }
        s => panic!("{s:?}"),
    }
    // Near misses: the outer Reshape regroups the rows ([7, 2, 16]) or splits
    // the columns ([2, 7, 4, 4]), or the 2-D product is also a graph output:
    // the Reshapes stay and the GELU is not fused.
    for (outer, escape) in [
        (&[7usize, 2, 16][..], false),
        (&[2, 7, 4, 4][..], false),
        (&[2, 7, 16][..], true),
    ] {
        let opt = check_passes_agree(&reshaped_gemm_graph(outer, escape));
        let names = ops(&opt);
        assert!(names.contains(&"Gelu".to_string()), "{outer:?} {escape}: {names:?}");
        assert!(
            names.contains(&"MatMul+Bias".to_string()),
            "{outer:?} {escape}: {names:?}"
        );
        assert_eq!(
            names.iter().filter(|n| *n == "Reshape").count(),
            2,
            "{outer:?} {escape}: {names:?}"
        );
    }
}

#[test]
fn batched_broadcast_matmul_and_gemm_attrs() {
    for (sa, sb, ta, tb) in [
        (vec![3, 1, 4, 5], vec![2, 5, 6], false, false),
        (vec![2, 5, 4], vec![2, 6, 5], true, true),
        (vec![4, 5], vec![6, 5], false, true),
        (vec![5, 4], vec![5, 6], true, false),
    ] {
        let mut b = Builder::new();
        let x = b.input("x", &sa);
        let w = b.input("w", &sb);
        let attrs = MatMulAttrs {
            trans_a: ta,
            trans_b: tb,
            alpha: 0.5,
            ..MatMulAttrs::default()
        };
        let y = b.op(Op::MatMul(attrs), &[x, w], "y");
        b.output(y);
        check_passes_agree(&b.g);
        // Check one against a direct loop.
        let inputs = inputs_for(&b.g);
        let p = compile(&b.g, Target::Generic).unwrap();
        let got = run_f32(&p, &inputs);
        if sa.len() == 2 && sb.len() == 2 {
            let (m, k, n) = (4, 5, 6);
            let at = |i: usize, p: usize| if ta { inputs[0][p * m + i] } else { inputs[0][i * k + p] };
            let bt = |p: usize, j: usize| if tb { inputs[1][j * k + p] } else { inputs[1][p * n + j] };
            for i in 0..m {
                for j in 0..n {
                    let want: f32 = 0.5 * (0..k).map(|p| at(i, p) * bt(p, j)).sum::<f32>();
                    assert!((got[0][i * n + j] - want).abs() < 1e-5);
                }
            }
        }
    }
}

#[test]
fn gemm_with_full_c() {
    let mut b = Builder::new();
    let x = b.input("x", &[3, 4]);
    let w = b.constant("w", &[4, 5], data(20, 2));
    let c = b.input("c", &[3, 5]);
    let y = b.op(
        Op::MatMul(MatMulAttrs {
            bias: BiasKind::Full { beta: 2.0 },
            ..MatMulAttrs::default()
        }),
        &[x, w, c],
        "y",
    );
    b.output(y);
    let inputs = inputs_for(&b.g);
    let p = compile(&b.g, Target::Generic).unwrap();
    let got = run_f32(&p, &inputs);
    let wd = data(20, 2);
    for i in 0..3 {
        for j in 0..5 {
            let want: f32 =
                (0..4).map(|p| inputs[0][i * 4 + p] * wd[p * 5 + j]).sum::<f32>() + 2.0 * inputs[1][i * 5 + j];
            assert!((got[0][i * 5 + j] - want).abs() < 1e-5);
        }
    }
}

#[test]
fn constant_folding_and_shape() {
    let mut b = Builder::new();
    let x = b.input("x", &[2, 3, 4]);
    let sh = b.op(Op::Shape { start: 0, end: 3 }, &[x], "sh");
    let idx = b.g.add_value("idx", TensorType::new(DType::I64, &[])).unwrap();
    b.g.add_constant_tensor(idx, &crate::ir::Tensor::i64(&[], vec![2]))
        .unwrap();
    let last = b.op(Op::Gather { axis: 0 }, &[sh, idx], "last");
    let lastf = b.op(Op::Cast { to: DType::F32 }, &[last], "lastf");
    let w = b.constant("w", &[3, 4], data(12, 1));
    let wt = b.op(Op::Transpose { perm: vec![1, 0] }, &[w], "wt");
    let y = b.bin(BinaryOp::Mul, x, lastf, "y");
    let z = b.op(Op::MatMul(MatMulAttrs::default()), &[y, wt], "z");
    b.output(z);
    b.output(last);
    let opt = optimise(&b.g, inspected()).unwrap();
    // The Shape→Gather→Cast chain and the weight transpose folded away.
    assert_eq!(ops(&opt), ["Mul", "MatMul"]);
    let p = compile(&b.g, Target::Generic).unwrap();
    assert_eq!(p.outputs()[1].elem_type, 7);
    let mut z = vec![0.0; 2 * 3 * 3];
    assert_eq!(p.outputs()[0].shape, [2, 3, 3]);
    let mut last = vec![0i64; 1];
    let xs = data(24, 1);
    p.run(
        Target::Generic,
        &[TensorRef::F32(&xs)],
        &mut [TensorMut::F32(&mut z), TensorMut::I64(&mut last)],
        &Serial,
    )
    .unwrap();
    assert_eq!(last, [4]);
    let wd = data(12, 1);
    let want: f32 = (0..4).map(|k| 4.0 * xs[k] * wd[k]).sum();
    assert!((z[0] - want).abs() < 1e-5);
    // Without folding the Shape still folds (it has no kernel).
    let p = compile_with(&b.g, Target::Generic, NO_PASSES).unwrap();
    assert!(p.num_steps() > 2);
}

#[test]
fn aliases_cost_nothing_and_memory_is_reused() {
    let mut b = Builder::new();
    let x = b.input("x", &[4, 16]);
    let mut v = x;
    for (k, op) in [
        UnaryOp::Relu,
        UnaryOp::Neg,
        UnaryOp::Abs,
        UnaryOp::Exp,
        UnaryOp::Sqrt,
        UnaryOp::Tanh,
    ]
    .iter()
    .enumerate()
    {
        v = b.un(*op, v, &format!("t{k}"));
        let shape: &[usize] = if k % 2 == 0 { &[64] } else { &[4, 16] };
        v = b.op_shaped(Op::Reshape, &[v], &format!("r{k}"), Some(shape));
    }
    b.output(v);
    check_passes_agree(&b.g);
    let p = compile(&b.g, Target::Generic).unwrap();
    assert_eq!(p.num_steps(), 6);
    assert_eq!(p.arena_bytes(), 2 * 256);
    // A reshaped input returned as an output is copied.
    let mut b = Builder::new();
    let x = b.input("x", &[2, 3]);
    let y = b.op_shaped(Op::Reshape, &[x], "y", Some(&[6]));
    b.output(y);
    let p = compile(&b.g, Target::Generic).unwrap();
    assert!(matches!(p.steps(), [Step::Copy { .. }]));
}

#[test]
fn movement_ops_match_expectations() {
    // Concat of a transpose and a slice, then expand.
    let mut b = Builder::new();
    let x = b.input("x", &[2, 3]);
    let t = b.op(Op::Transpose { perm: vec![1, 0] }, &[x], "t");
    let s = b.op_shaped(
        Op::Slice {
            starts: vec![2, 1],
            steps: vec![-1, 1],
        },
        &[t],
        "s",
        Some(&[3, 1]),
    );
    let c = b.op(Op::Concat { axis: 1 }, &[t, s], "c");
    let e = b.op_shaped(Op::Expand, &[c], "e", Some(&[2, 3, 3]));
    b.output(e);
    let p = compile(&b.g, Target::Generic).unwrap();
    let x = vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0];
    let got = run_f32(&p, &[x]);
    // t = [[0,3],[1,4],[2,5]]; s = t[2..=0 step -1, 1] = [[5],[4],[3]]
    let c = [0.0, 3.0, 5.0, 1.0, 4.0, 4.0, 2.0, 5.0, 3.0];
    let want: Vec<f32> = c.iter().chain(c.iter()).copied().collect();
    assert_eq!(got[0], want);
}

#[test]
fn batched_products_run_one_per_task_with_the_same_results() {
    // Attention-shaped: 6 small products, one task each with 2+ threads
    // (more threads than products: split inside each GEMM as before).
    let mut b = Builder::new();
    let q = b.input("q", &[2, 3, 16, 8]);
    let k = b.input("k", &[2, 3, 16, 8]);
    let scores = b.op(
        Op::MatMul(MatMulAttrs {
            trans_b: true,
            ..MatMulAttrs::default()
        }),
        &[q, k],
        "scores",
    );
    b.output(scores);
    let p = compile(&b.g, Target::cpu_best()).unwrap();
    let inputs = inputs_for(&b.g);
    let want = run_f32(&p, &inputs);
    for threads in [2, 3, 8] {
        let mut got = vec![f32::NAN; 2 * 3 * 16 * 16];
        p.run(
            Target::cpu_best(),
            &[TensorRef::F32(&inputs[0]), TensorRef::F32(&inputs[1])],
            &mut [TensorMut::F32(&mut got)],
            &ScopedThreads(threads),
        )
        .unwrap();
        assert_eq!(got, want[0], "{threads} threads");
    }
}

#[test]
fn parallel_and_concurrent_runs_agree() {
    let mut b = Builder::new();
    let x = b.input("x", &[64, 96]);
    let w = b.constant("w", &[96, 128], data(96 * 128, 3));
    let mm = matmul(&mut b, x, w, "mm");
    let s = b.op(
        Op::Softmax {
            axis: 1,
            unshifted: false,
        },
        &[mm],
        "s",
    );
    b.output(s);
    let p = compile(&b.g, Target::cpu_best()).unwrap();
    let inputs = inputs_for(&b.g);
    let want = run_f32(&p, &inputs);
    let mut got = vec![0.0; 64 * 128];
    p.run(
        Target::cpu_best(),
        &[TensorRef::F32(&inputs[0])],
        &mut [TensorMut::F32(&mut got)],
        &ScopedThreads(3),
    )
    .unwrap();
    assert_close(&[got], &want, 1e-6);
    std::thread::scope(|scope| {
        for _ in 0..3 {
            scope.spawn(|| {
                for _ in 0..5 {
                    assert_eq!(run_f32(&p, &inputs), want);
                }
            });
        }
    });
}

#[test]
fn refuses_target_newer_than_host_and_invalid_graphs() {
    let mut b = Builder::new();
    let x = b.input("x", &[4]);
    let y = b.un(UnaryOp::Exp, x, "y");
    b.output(y);
    let p = compile(&b.g, Target::Avx512).unwrap();
    let mut out = vec![0.0; 4];
    let e = p
        .run(
            Target::Generic,
            &[TensorRef::F32(&[0.0; 4])],
            &mut [TensorMut::F32(&mut out)],
            &Serial,
        )
        .unwrap_err();
    assert_eq!(e.kind, crate::error::ErrorKind::InvalidGraph);
    let mut g = b.g.clone();
    let bad = g.add_value("bad", TensorType::f32(&[3])).unwrap();
    g.add_node("oops", Op::Unary(UnaryOp::Relu), vec![x], vec![bad]);
    g.outputs.push(bad);
    let e = compile(&g, Target::Generic).unwrap_err();
    assert!(e.message.contains("'oops'"), "{e}");
}

// Activations (issue #13).

/// `s = x [3, 5, 16] · w [16, 24] + bias`: the builder and `s`.
fn product_with_bias() -> (Builder, ValueId) {
    let mut b = Builder::new();
    let x = b.input("x", &[3, 5, 16]);
    let w = b.constant("w", &[16, 24], data(16 * 24, 2));
    let bias = b.constant("bias", &[24], data(24, 3));
    let mm = matmul(&mut b, x, w, "mm");
    let s = b.bin(BinaryOp::Add, mm, bias, "s");
    (b, s)
}

/// `MatMul + bias`, then `gate(·)` multiplied by `lhs` (the product itself,
/// or another value when `other`).
fn gated_graph(gate: UnaryOp, other: bool) -> Graph {
    let (mut b, s) = product_with_bias();
    let z = if other { b.input("z", &[3, 5, 24]) } else { s };
    let g = b.un(gate, z, "g");
    let y = b.bin(BinaryOp::Mul, g, s, "y");
    b.output(y);
    b.g
}

#[test]
fn silu_and_hardswish_are_recognised_and_fused_into_the_gemm() {
    let cases = [
        (UnaryOp::Sigmoid, "MatMul+Bias+Silu", Activation::Silu),
        (
            UnaryOp::HardSigmoid(1.0 / 6.0, 0.5),
            "MatMul+Bias+HardSwish",
            Activation::HardSwish,
        ),
    ];
    for (gate, name, act) in cases {
        let g = gated_graph(gate, false);
        let opt = check_passes_agree(&g);
        assert_eq!(ops(&opt), [name], "{gate:?}");
        let p = compile(&g, Target::Generic).unwrap();
        match p.steps() {
            [Step::MatMul(m)] => assert_eq!(m.activation, act),
            s => panic!("{gate:?}: {s:?}"),
        }
    }
}

#[test]
fn gates_of_another_value_or_other_constants_are_left_alone() {
    // x · Sigmoid(z), z ≠ x: not a SiLU.
    let opt = check_passes_agree(&gated_graph(UnaryOp::Sigmoid, true));
    assert_eq!(ops(&opt), ["MatMul+Bias", "Sigmoid", "Mul"]);
    // x · HardSigmoid(x) with ONNX's default alpha 0.2: not HardSwish.
    let opt = check_passes_agree(&gated_graph(UnaryOp::HardSigmoid(0.2, 0.5), false));
    assert_eq!(ops(&opt), ["MatMul+Bias", "HardSigmoid", "Mul"]);
    // The sigmoid also read elsewhere: it must stay, so nothing fuses.
    let mut g = gated_graph(UnaryOp::Sigmoid, false);
    let sig = g
        .nodes
        .iter()
        .find(|n| n.op == Op::Unary(UnaryOp::Sigmoid))
        .unwrap()
        .outputs[0];
    g.outputs.push(sig);
    let opt = check_passes_agree(&g);
    assert_eq!(ops(&opt), ["MatMul+Bias", "Sigmoid", "Mul"]);
}

#[test]
fn activation_epilogues_match_the_unfused_ops() {
    // HardSigmoid alone after a product is an epilogue too.
    for act in [UnaryOp::HardSigmoid(0.3, 0.4), UnaryOp::HardSwish, UnaryOp::Silu] {
        let mut b = Builder::new();
        let x = b.input("x", &[4, 16]);
        let w = b.constant("w", &[16, 8], data(128, 5));
        let mm = matmul(&mut b, x, w, "mm");
        let y = b.un(act, mm, "y");
        b.output(y);
        let opt = check_passes_agree(&b.g);
        assert_eq!(ops(&opt).len(), 1, "{act:?}: {:?}", ops(&opt));
    }
}

/// PP-OCR's HardSwish, `x · Clip(x + 3, 0, 6) / 6` (or `· (1/6)`), is one
/// HardSwish fused into the product; another bound or divisor is not.
#[test]
fn hardswish_written_with_clip_is_recognised() {
    let build = |hi: f32, tail: BinaryOp, by: f32| {
        let (mut b, s) = product_with_bias();
        let three = b.scalar("three", 3.0);
        let p = b.bin(BinaryOp::Add, s, three, "p");
        let q = b.un(UnaryOp::Clip(0.0, hi), p, "q");
        let r = b.bin(BinaryOp::Mul, s, q, "r");
        let k = b.scalar("k", by);
        let y = b.bin(tail, r, k, "y");
        b.output(y);
        b.g
    };
    for (tail, by) in [(BinaryOp::Div, 6.0), (BinaryOp::Mul, 1.0 / 6.0)] {
        let opt = check_passes_agree(&build(6.0, tail, by));
        assert_eq!(ops(&opt), ["MatMul+Bias+HardSwish"], "{tail:?}");
    }
    let opt = check_passes_agree(&build(4.0, BinaryOp::Div, 6.0));
    assert_eq!(ops(&opt).len(), 5, "{:?}", ops(&opt));
    let opt = check_passes_agree(&build(6.0, BinaryOp::Div, 5.0));
    assert_eq!(ops(&opt).len(), 5, "{:?}", ops(&opt));
}
