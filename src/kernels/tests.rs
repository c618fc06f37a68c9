use super::parallel::{ScopedThreads, Serial};
use super::*;
use crate::ir::broadcast_shapes;

/// Every target this machine can run.
fn isas() -> Vec<Isa> {
    let isas: Vec<Isa> = Target::ALL.into_iter().filter_map(Isa::new).collect();
    assert!(isas.iter().any(|i| i.target() == Target::Generic));
    isas
}

/// Deterministic values in [-4, 4), with a few special ones up front.
fn data(n: usize, seed: u32) -> Vec<f32> {
    let mut state = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..n)
        .map(|i| match i {
            0 => 0.0,
            1 => -0.5,
            _ => {
                state ^= state << 13;
                state ^= state >> 17;
                state ^= state << 5;
                (state % 8000) as f32 / 1000.0 - 4.0
            }
        })
        .collect()
}

fn close(got: f32, want: f64, rel: f64) -> bool {
    let g = got as f64;
    (got.is_nan() && want.is_nan()) || (g - want).abs() <= rel * want.abs() + 1e-30 || g == want
}

fn unary_ref(op: UnaryOp, x: f32) -> f64 {
    let x = x as f64;
    match op {
        UnaryOp::Relu => x.max(0.0),
        UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Neg => -x,
        UnaryOp::Abs => x.abs(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Erf => math::reference::erf(x),
        UnaryOp::Reciprocal => 1.0 / x,
        UnaryOp::LeakyRelu(a) => {
            if x < 0.0 {
                a as f64 * x
            } else {
                x
            }
        }
        UnaryOp::Clip(lo, hi) => x.max(lo as f64).min(hi as f64),
        UnaryOp::Gelu => math::reference::gelu(x),
        UnaryOp::GeluTanh => math::reference::gelu_tanh(x),
    }
}

const UNARY: [UnaryOp; 14] = [
    UnaryOp::Relu,
    UnaryOp::Sigmoid,
    UnaryOp::Tanh,
    UnaryOp::Neg,
    UnaryOp::Abs,
    UnaryOp::Sqrt,
    UnaryOp::Exp,
    UnaryOp::Log,
    UnaryOp::Erf,
    UnaryOp::Reciprocal,
    UnaryOp::LeakyRelu(0.1),
    UnaryOp::Clip(-1.5, 2.0),
    UnaryOp::Gelu,
    UnaryOp::GeluTanh,
];
const BINARY: [BinaryOp; 5] = [
    BinaryOp::Add,
    BinaryOp::Sub,
    BinaryOp::Mul,
    BinaryOp::Div,
    BinaryOp::Pow,
];

#[test]
fn unary_ops_match_reference() {
    // 67 covers full vectors of every width plus a tail.
    let x = data(67, 1);
    for isa in isas() {
        for op in UNARY {
            let mut y = vec![f32::NAN; x.len()];
            unary(isa, op, &x, &mut y, &Serial).unwrap();
            for (i, (&xi, &yi)) in x.iter().zip(&y).enumerate() {
                let want = unary_ref(op, xi);
                assert!(close(yi, want, 1e-6), "{isa:?} {op:?}({xi}) [{i}] = {yi}, want {want}");
            }
        }
    }
}

#[test]
fn sigmoid_and_exp_extremes() {
    let x = [-1000.0, -100.0, -20.0, 20.0, 100.0, 1000.0, f32::NEG_INFINITY];
    for isa in isas() {
        let mut y = [0.0; 7];
        unary(isa, UnaryOp::Sigmoid, &x, &mut y, &Serial).unwrap();
        assert_eq!(y[0], 0.0);
        assert!(close(y[2], unary_ref(UnaryOp::Sigmoid, -20.0), 1e-6));
        assert_eq!(&y[3..6], &[1.0, 1.0, 1.0]);
        assert_eq!(y[6], 0.0);
        unary(isa, UnaryOp::Exp, &x, &mut y, &Serial).unwrap();
        assert_eq!(y[5], f32::INFINITY);
        unary(isa, UnaryOp::Relu, &[f32::NAN, -1.0], &mut y[..2], &Serial).unwrap();
        assert!(y[0].is_nan() && y[1] == 0.0);
        unary(isa, UnaryOp::Clip(0.0, 1.0), &[f32::NAN, -1.0], &mut y[..2], &Serial).unwrap();
        assert!(y[0].is_nan() && y[1] == 0.0);
    }
}

fn binary_ref(op: BinaryOp, a: f32, b: f32) -> f32 {
    match op {
        BinaryOp::Add => a + b,
        BinaryOp::Sub => a - b,
        BinaryOp::Mul => a * b,
        BinaryOp::Div => a / b,
        BinaryOp::Pow => a.powf(b),
    }
}

/// Naive broadcast by multi-index, the definition kiln must match.
fn broadcast_ref(op: BinaryOp, sa: &[usize], a: &[f32], sb: &[usize], b: &[f32]) -> Vec<f32> {
    let out = broadcast_shapes(sa, sb).unwrap();
    let n: usize = out.iter().product();
    let index = |shape: &[usize], mut flat: usize| {
        let pad = out.len() - shape.len();
        let (mut idx, mut stride) = (0, 1);
        for d in (0..out.len()).rev() {
            let i = flat % out[d];
            flat /= out[d];
            if d >= pad && shape[d - pad] != 1 {
                idx += i * stride;
            }
            if d >= pad {
                stride *= shape[d - pad];
            }
        }
        idx
    };
    (0..n)
        .map(|i| binary_ref(op, a[index(sa, i)], b[index(sb, i)]))
        .collect()
}

fn check_broadcast(sa: &[usize], sb: &[usize]) {
    let na: usize = sa.iter().product();
    let nb: usize = sb.iter().product();
    // Positive bases so Pow stays real; divisors away from zero.
    let a: Vec<f32> = data(na, 3).iter().map(|v| v.abs() + 0.5).collect();
    let b: Vec<f32> = data(nb, 7).iter().map(|v| v + 5.0).collect();
    let layout = Layout::for_shapes(sa, sb).unwrap();
    for isa in isas() {
        for op in BINARY {
            let want = broadcast_ref(op, sa, &a, sb, &b);
            let mut got = vec![f32::NAN; want.len()];
            binary(isa, op, &layout, &a, &b, &mut got, &Serial).unwrap();
            assert_eq!(got, want, "{isa:?} {op:?} {sa:?} op {sb:?} via {layout:?}");
        }
    }
}

#[test]
fn broadcasting_matches_reference() {
    let cases: &[(&[usize], &[usize])] = &[
        (&[2, 3, 4], &[2, 3, 4]),
        (&[2, 3, 4], &[3, 1]),
        (&[2, 3, 4], &[4]),
        (&[2, 3, 4], &[]),
        (&[], &[2, 3, 4]),
        (&[2, 3, 4], &[1, 1, 4]),
        (&[2, 3, 4], &[2, 1, 4]),
        (&[3, 1], &[2, 3, 4]),
        (&[4], &[2, 3, 4]),
        (&[2, 1], &[1, 3]),
        (&[5, 1, 3, 1], &[1, 4, 1, 6]),
        (&[6, 1], &[6, 37]),
        (&[3, 37], &[37]),
        (&[], &[]),
        (&[1], &[1, 1]),
    ];
    for (sa, sb) in cases {
        check_broadcast(sa, sb);
    }
}

#[test]
fn integer_binary_ops() {
    let isa = Isa::new(Target::Generic).unwrap();
    let l = Layout::for_shapes(&[3], &[]).unwrap();
    let mut d = [0i64; 3];
    binary_i64(isa, BinaryOp::Div, &l, &[7, -7, 9], &[2], &mut d).unwrap();
    assert_eq!(d, [3, -3, 4]);
    binary_i64(isa, BinaryOp::Mul, &l, &[7, -7, 9], &[2], &mut d).unwrap();
    assert_eq!(d, [14, -14, 18]);
    assert!(binary_i64(isa, BinaryOp::Div, &l, &[1, 2, 3], &[0], &mut d).is_err());
    assert!(binary_i64(isa, BinaryOp::Pow, &l, &[1, 2, 3], &[1], &mut d).is_err());
    let mut d = [0i32; 3];
    binary_i32(isa, BinaryOp::Sub, &l, &[7, -7, 9], &[2], &mut d).unwrap();
    assert_eq!(d, [5, -9, 7]);
}

#[test]
fn empty_tensors_are_fine() {
    let layout = Layout::for_shapes(&[0, 3], &[3]).unwrap();
    for isa in isas() {
        binary(isa, BinaryOp::Add, &layout, &[], &[1.0; 3], &mut [], &Serial).unwrap();
        unary(isa, UnaryOp::Exp, &[], &mut [], &Serial).unwrap();
        softmax(isa, 0, 1, &[], &mut [], &Serial).unwrap();
        layer_norm(isa, 4, 1e-5, &[], &[1.0; 4], None, &mut [], &Serial).unwrap();
    }
}

#[test]
fn inconsistent_buffers_are_errors() {
    let isa = Isa::new(Target::Generic).unwrap();
    assert!(unary(isa, UnaryOp::Neg, &[1.0; 3], &mut [0.0; 2], &Serial).is_err());
    let layout = Layout::for_shapes(&[2, 3], &[3]).unwrap();
    let e = binary(
        isa,
        BinaryOp::Add,
        &layout,
        &[1.0; 6],
        &[1.0; 2],
        &mut [0.0; 6],
        &Serial,
    );
    assert_eq!(e.unwrap_err().kind, crate::error::ErrorKind::Runtime);
    assert!(softmax(isa, 4, 1, &[1.0; 6], &mut [0.0; 6], &Serial).is_err());
    assert!(layer_norm(isa, 3, 1e-5, &[1.0; 6], &[1.0; 2], None, &mut [0.0; 6], &Serial).is_err());
    assert!(reduce(isa, ReduceKind::Sum, 2, 3, 1, &[1.0; 6], &mut [0.0; 3], &Serial).is_err());
}

#[test]
fn isa_requires_cpu_support() {
    for t in Target::ALL {
        assert_eq!(Isa::new(t).is_some(), t.can_run_on(Target::cpu_best()));
    }
}

fn softmax_ref(outer: usize, len: usize, inner: usize, x: &[f32]) -> Vec<f64> {
    let mut out = vec![0.0; x.len()];
    for o in 0..outer {
        for i in 0..inner {
            let at = |k: usize| o * len * inner + k * inner + i;
            let m = (0..len).map(|k| x[at(k)] as f64).fold(f64::NEG_INFINITY, f64::max);
            let s: f64 = (0..len).map(|k| (x[at(k)] as f64 - m).exp()).sum();
            for k in 0..len {
                out[at(k)] = (x[at(k)] as f64 - m).exp() / s;
            }
        }
    }
    out
}

#[test]
fn softmax_matches_reference() {
    for (outer, len, inner) in [(3, 37, 1), (2, 5, 7), (1, 1, 1), (4, 128, 1), (2, 16, 3)] {
        let x: Vec<f32> = data(outer * len * inner, 5).iter().map(|v| v * 3.0).collect();
        let want = softmax_ref(outer, len, inner, &x);
        for isa in isas() {
            let mut y = vec![f32::NAN; x.len()];
            softmax(isa, len, inner, &x, &mut y, &Serial).unwrap();
            for (i, (&g, &w)) in y.iter().zip(&want).enumerate() {
                assert!((g as f64 - w).abs() <= 2e-6 * w + 1e-9, "{isa:?} [{i}] {g} vs {w}");
            }
        }
    }
}

#[test]
fn layer_norm_and_reduce_match_reference() {
    let (rows, len) = (5, 67);
    let x = data(rows * len, 9);
    let g = data(len, 2);
    let b = data(len, 3);
    for isa in isas() {
        for bias in [None, Some(&b[..])] {
            let mut y = vec![0.0; x.len()];
            layer_norm(isa, len, 1e-5, &x, &g, bias, &mut y, &Serial).unwrap();
            for r in 0..rows {
                let row: Vec<f64> = x[r * len..(r + 1) * len].iter().map(|&v| v as f64).collect();
                let mean = row.iter().sum::<f64>() / len as f64;
                let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / len as f64;
                for k in 0..len {
                    let mut w = (row[k] - mean) / (var + 1e-5).sqrt() * g[k] as f64;
                    if bias.is_some() {
                        w += b[k] as f64;
                    }
                    let got = y[r * len + k] as f64;
                    assert!(
                        (got - w).abs() <= 2e-6 * w.abs() + 2e-6,
                        "{isa:?} {r},{k}: {got} vs {w}"
                    );
                }
            }
        }
        for kind in [ReduceKind::Sum, ReduceKind::Mean, ReduceKind::Max] {
            for (outer, len, inner) in [(5, 67, 1), (3, 4, 5), (1, 0, 2)] {
                let x = data(outer * len * inner, 4);
                let mut y = vec![0.0; outer * inner];
                reduce(isa, kind, outer, len, inner, &x, &mut y, &Serial).unwrap();
                for o in 0..outer {
                    for i in 0..inner {
                        let vals = (0..len).map(|k| x[o * len * inner + k * inner + i] as f64);
                        let w = match kind {
                            ReduceKind::Sum => vals.sum::<f64>(),
                            ReduceKind::Mean => vals.sum::<f64>() / len as f64,
                            ReduceKind::Max => vals.fold(f64::NEG_INFINITY, f64::max),
                        };
                        let got = y[o * inner + i] as f64;
                        assert!(
                            got == w || (got - w).abs() <= 1e-5 * w.abs() + 1e-5 || (got.is_nan() && w.is_nan()),
                            "{kind:?} {got} vs {w}"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn parallel_runs_match_serial() {
    let par = ScopedThreads(3);
    let n = 300_007;
    let x = data(n, 11);
    let isa = Isa::new(Target::cpu_best()).unwrap();
    let (mut a, mut b) = (vec![0.0; n], vec![0.0; n]);
    unary(isa, UnaryOp::Gelu, &x, &mut a, &Serial).unwrap();
    unary(isa, UnaryOp::Gelu, &x, &mut b, &par).unwrap();
    assert_eq!(a, b);
    let row = data(7, 1);
    let l = Layout::RowB { inner: 7 };
    let m = n / 7 * 7;
    binary(isa, BinaryOp::Mul, &l, &x[..m], &row, &mut a[..m], &Serial).unwrap();
    binary(isa, BinaryOp::Mul, &l, &x[..m], &row, &mut b[..m], &par).unwrap();
    assert_eq!(a, b);
    softmax(isa, 7, 1, &x[..m], &mut a[..m], &Serial).unwrap();
    softmax(isa, 7, 1, &x[..m], &mut b[..m], &par).unwrap();
    assert_eq!(a, b);
    let g = vec![1.0; 7];
    layer_norm(isa, 7, 1e-5, &x[..m], &g, None, &mut a[..m], &Serial).unwrap();
    layer_norm(isa, 7, 1e-5, &x[..m], &g, None, &mut b[..m], &par).unwrap();
    assert_eq!(a, b);
}
