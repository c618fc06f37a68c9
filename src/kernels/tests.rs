use super::parallel::{ScopedThreads, Serial};
use super::*;
use crate::tensor::broadcast_shapes;

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
        UnaryOp::GeluWritten | UnaryOp::GeluTanhWritten if x > f32::MAX as f64 / 2.0 => f64::INFINITY,
        UnaryOp::GeluWritten => math::reference::gelu(x),
        UnaryOp::GeluTanhWritten => math::reference::gelu_tanh(x),
        UnaryOp::Floor => x.floor(),
        UnaryOp::Ceil => x.ceil(),
        UnaryOp::Round => x.round_ties_even(),
        UnaryOp::Sin => x.sin(),
        UnaryOp::Cos => x.cos(),
        UnaryOp::Sign if x.is_nan() => x,
        UnaryOp::Sign => (x > 0.0) as i32 as f64 - (x < 0.0) as i32 as f64,
        UnaryOp::Softplus => softplus_ref(x),
        UnaryOp::Mish => x * softplus_ref(x).tanh(),
        UnaryOp::Not | UnaryOp::IsNaN | UnaryOp::IsInf { .. } => unreachable!("bool results"),
        // Activations (issue #13), in f64.
        UnaryOp::HardSigmoid(a, b) => (a as f64 * x + b as f64).clamp(0.0, 1.0),
        UnaryOp::HardSwish => x * (x / 6.0 + 0.5).clamp(0.0, 1.0),
        UnaryOp::Silu => x / (1.0 + (-x).exp()),
        UnaryOp::Elu(a) if x < 0.0 => a as f64 * x.exp_m1(),
        UnaryOp::Selu(a, g) if x <= 0.0 => g as f64 * a as f64 * x.exp_m1(),
        UnaryOp::Selu(_, g) => g as f64 * x,
        UnaryOp::Celu(a) => x.max(0.0) + (a as f64 * (x / a as f64).exp_m1()).min(0.0),
        UnaryOp::ThresholdedRelu(a) if x > a as f64 => x,
        UnaryOp::ThresholdedRelu(_) => 0.0,
        UnaryOp::Softsign => x / (1.0 + x.abs()),
        UnaryOp::Elu(_) => x,
    }
}

/// `ln(1 + eˣ)` in f64 without overflow.
fn softplus_ref(x: f64) -> f64 {
    x.max(0.0) + (-x.abs()).exp().ln_1p()
}

const UNARY: [UnaryOp; 16] = [
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
    UnaryOp::GeluWritten,
    UnaryOp::GeluTanhWritten,
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
        BinaryOp::Max if a.is_nan() || b.is_nan() => f32::NAN,
        BinaryOp::Max => a.max(b),
        BinaryOp::Min if a.is_nan() || b.is_nan() => f32::NAN,
        BinaryOp::Min => a.min(b),
        BinaryOp::Fmod => a % b,
        _ => unreachable!("{op:?} has no f32 result"),
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
        softmax(isa, 0, 1, true, &[], &mut [], &Serial).unwrap();
        layer_norm(isa, 4, 1e-5, false, &[], &[1.0; 4], None, &mut [], &Serial).unwrap();
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
    assert!(softmax(isa, 4, 1, true, &[1.0; 6], &mut [0.0; 6], &Serial).is_err());
    assert!(layer_norm(isa, 3, 1e-5, false, &[1.0; 6], &[1.0; 2], None, &mut [0.0; 6], &Serial).is_err());
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
            softmax(isa, len, inner, true, &x, &mut y, &Serial).unwrap();
            for (i, (&g, &w)) in y.iter().zip(&want).enumerate() {
                assert!((g as f64 - w).abs() <= 2e-6 * w + 1e-9, "{isa:?} [{i}] {g} vs {w}");
            }
        }
    }
}

/// Rows of 16 or more run two at a time (`norm::shifted_row_pairs`); each
/// row must come out as it does alone, bit for bit, NaN rows included.
#[test]
fn softmax_row_pairs_match_single_rows() {
    for (rows, len) in [(2, 16), (3, 17), (5, 31), (4, 128), (3, 77), (2, 512), (1, 40)] {
        let mut x: Vec<f32> = data(rows * len, 7).iter().map(|v| v * 4.0).collect();
        x[(rows - 1) * len + 3] = f32::NAN;
        for isa in isas() {
            let mut all = vec![0.0; x.len()];
            softmax(isa, len, 1, true, &x, &mut all, &Serial).unwrap();
            for (r, (xr, got)) in x.chunks_exact(len).zip(all.chunks_exact(len)).enumerate() {
                let mut one = vec![0.0; len];
                softmax(isa, len, 1, true, xr, &mut one, &Serial).unwrap();
                let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(got), bits(&one), "{isa:?} {rows} x {len}, row {r}");
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
        for (bias, decomposed) in [(None, false), (Some(&b[..]), false), (Some(&b[..]), true)] {
            let mut y = vec![0.0; x.len()];
            layer_norm(isa, len, 1e-5, decomposed, &x, &g, bias, &mut y, &Serial).unwrap();
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
                            // ORT's mean of nothing is 0.
                            ReduceKind::Mean if len == 0 => 0.0,
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
    softmax(isa, 7, 1, true, &x[..m], &mut a[..m], &Serial).unwrap();
    softmax(isa, 7, 1, true, &x[..m], &mut b[..m], &par).unwrap();
    assert_eq!(a, b);
    let g = vec![1.0; 7];
    layer_norm(isa, 7, 1e-5, false, &x[..m], &g, None, &mut a[..m], &Serial).unwrap();
    layer_norm(isa, 7, 1e-5, false, &x[..m], &g, None, &mut b[..m], &par).unwrap();
    assert_eq!(a, b);
}

/// Counts the tasks it runs (on three scoped threads).
struct CountingPool(std::sync::atomic::AtomicUsize);

// SAFETY: ScopedThreads's for_each, which keeps the contract.
#[allow(unsafe_code)]
unsafe impl super::parallel::Parallel for CountingPool {
    fn threads(&self) -> usize {
        3
    }

    fn for_each(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        self.0.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        ScopedThreads(3).for_each(n, f)
    }
}

/// A transformer's layer norm of 64 tokens × 384 is split over threads
/// (it costs several ns per element), an elementwise op of that size is
/// not, and either gives the serial result.
#[test]
fn layer_norm_of_a_short_sequence_runs_in_parts() {
    let isa = Isa::new(Target::cpu_best()).unwrap();
    let (rows, len) = (64, 384);
    let x = data(rows * len, 5);
    let g = data(len, 6);
    let (mut a, mut b) = (vec![0.0; x.len()], vec![0.0; x.len()]);
    layer_norm(isa, len, 1e-5, false, &x, &g, None, &mut a, &Serial).unwrap();
    let pool = CountingPool(Default::default());
    layer_norm(isa, len, 1e-5, false, &x, &g, None, &mut b, &pool).unwrap();
    assert_eq!(a, b);
    assert!(pool.0.load(std::sync::atomic::Ordering::Relaxed) >= 2);
    let pool = CountingPool(Default::default());
    unary(isa, UnaryOp::Gelu, &x, &mut b, &pool).unwrap();
    assert_eq!(pool.0.load(std::sync::atomic::Ordering::Relaxed), 0);
}

// ---------------------------------------------------------------------------
// Non-finite and extreme inputs: what ORT's CPU EP gives (measured with ORT
// 1.31.1; python/tests/test_nonfinite.py compares every op with it).
// ---------------------------------------------------------------------------

const INF: f32 = f32::INFINITY;

/// `values` repeated into a 3·16+5-element vector, so that every value meets
/// the vector body and the scalar tail of each target's loops.
fn spread(values: &[f32]) -> Vec<f32> {
    values.iter().copied().cycle().take(values.len() * 3 + 5).collect()
}

/// NaN where `want` is NaN, the same infinities, otherwise equal within `tol`.
fn same_special(got: f32, want: f32, tol: f32) -> bool {
    if want.is_nan() || want.is_infinite() {
        got.is_nan() == want.is_nan() && (want.is_nan() || got == want)
    } else {
        got.is_finite() && (got - want).abs() <= tol * want.abs().max(1e-30) + 1e-38
    }
}

#[test]
#[allow(clippy::excessive_precision)] // ORT's outputs as printed
fn unary_ops_at_the_limits() {
    // (x, erf, gelu, gelu_tanh, tanh, sigmoid, exp)
    let rows: &[(f32, [f32; 6])] = &[
        (INF, [1.0, INF, INF, 1.0, 1.0, INF]),
        (-INF, [-1.0, f32::NAN, f32::NAN, -1.0, 0.0, 0.0]),
        (f32::NAN, [f32::NAN; 6]),
        (3.4e38, [1.0, 3.4e38, 3.4e38, 1.0, 1.0, INF]),
        (-3.4e38, [-1.0, 0.0, 0.0, -1.0, 0.0, 0.0]),
        (f32::MAX, [1.0, f32::MAX, f32::MAX, 1.0, 1.0, INF]),
        (1e38, [1.0, 1e38, 1e38, 1.0, 1.0, INF]),
        (-1e38, [-1.0, 0.0, 0.0, -1.0, 0.0, 0.0]),
        (11.0, [1.0, 11.0, 11.0, 1.0, 0.999_983_3, 59_874.14]),
        (-11.0, [-1.0, 0.0, 0.0, -1.0, 1.670_142_2e-5, 1.670_170_1e-5]),
        (1e-40, [1.128_379e-40, 5e-41, 5e-41, 1e-40, 0.5, 1.0]),
        (0.0, [0.0, 0.0, 0.0, 0.0, 0.5, 1.0]),
    ];
    let ops = [
        UnaryOp::Erf,
        UnaryOp::Gelu,
        UnaryOp::GeluTanh,
        UnaryOp::Tanh,
        UnaryOp::Sigmoid,
        UnaryOp::Exp,
    ];
    for isa in isas() {
        for (j, op) in ops.into_iter().enumerate() {
            let x = spread(&rows.iter().map(|r| r.0).collect::<Vec<_>>());
            let mut y = vec![0.0; x.len()];
            unary(isa, op, &x, &mut y, &Serial).unwrap();
            for (&xi, &yi) in x.iter().zip(&y) {
                let want = rows.iter().find(|r| r.0.to_bits() == xi.to_bits()).unwrap().1[j];
                // gelu(-11) is ~-2e-27; sigmoid/exp(-11) are not saturated.
                let tol = if want.abs() < 1e-20 && want != 0.0 { 1e-3 } else { 2e-6 };
                let ok = same_special(yi, want, tol) || (want == 0.0 && yi.abs() < 1e-20);
                assert!(ok, "{isa:?} {op:?}({xi:e}) = {yi:e}, ORT gives {want:e}");
            }
        }
        // Relu / LeakyRelu / Clip keep NaN; Clip bounds ±inf.
        let x = spread(&[f32::NAN, INF, -INF, -0.0]);
        let mut y = vec![0.0; x.len()];
        for op in [UnaryOp::Relu, UnaryOp::LeakyRelu(0.1), UnaryOp::Clip(-1.0, 1.0)] {
            unary(isa, op, &x, &mut y, &Serial).unwrap();
            for (&xi, &yi) in x.iter().zip(&y) {
                let want = match (op, xi) {
                    (_, v) if v.is_nan() => f32::NAN,
                    (UnaryOp::Relu, v) => v.max(0.0),
                    (UnaryOp::LeakyRelu(_), v) => v,
                    (_, v) => v.clamp(-1.0, 1.0),
                };
                assert!(same_special(yi, want, 0.0), "{isa:?} {op:?}({xi}) = {yi}");
            }
        }
    }
}

#[test]
fn gemm_epilogue_activations_match_the_unary_kernels_at_the_limits() {
    use gemm::{Activation, Bias, Epilogue};
    let bias = spread(&[
        INF,
        -INF,
        f32::NAN,
        3.4e38,
        -3.4e38,
        1e38,
        -1e38,
        1e-40,
        0.0,
        -0.0,
        11.0,
        -11.0,
    ]);
    let (m, k, n) = (3, 2, bias.len());
    let (a, b) = (vec![0.0f32; m * k], vec![0.0f32; k * n]);
    let pairs = [
        (Activation::Relu, UnaryOp::Relu),
        (Activation::LeakyRelu(0.1), UnaryOp::LeakyRelu(0.1)),
        (Activation::Sigmoid, UnaryOp::Sigmoid),
        (Activation::Tanh, UnaryOp::Tanh),
        (Activation::GeluErf, UnaryOp::Gelu),
        (Activation::GeluTanh, UnaryOp::GeluTanh),
        (Activation::GeluErfWritten, UnaryOp::GeluWritten),
        (Activation::GeluTanhWritten, UnaryOp::GeluTanhWritten),
        (Activation::Clip(-1.0, 1.0), UnaryOp::Clip(-1.0, 1.0)),
        (Activation::HardSigmoid(0.2, 0.5), UnaryOp::HardSigmoid(0.2, 0.5)),
        (Activation::HardSwish, UnaryOp::HardSwish),
        (Activation::Silu, UnaryOp::Silu),
    ];
    for isa in isas() {
        for (act, op) in pairs {
            let epi = Epilogue {
                alpha: 1.0,
                bias: Bias::PerColumn(&bias),
                activation: act,
                residual: None,
            };
            let mut c = vec![0.0; m * n];
            gemm::gemm(isa, m, n, k, &a, k, false, &b, n, false, &mut c, n, &epi, &Serial).unwrap();
            let mut want = vec![0.0; n];
            unary(isa, op, &bias, &mut want, &Serial).unwrap();
            for row in c.chunks(n) {
                for ((&g, &w), &x) in row.iter().zip(&want).zip(&bias) {
                    let ok = same_special(g, w, 1e-5) || (w.abs() < 1e-30 && g.abs() < 1e-30);
                    assert!(ok, "{isa:?} {act:?}({x:e}) = {g:e}, unary {op:?} gives {w:e}");
                }
            }
        }
    }
}

#[test]
fn layer_norm_statistics_are_ort_s() {
    // (row, LayerNormalization output, decomposed output) with scale 1, no bias, eps 1e-5.
    let nan = f32::NAN;
    let p30 = (1u32 << 30) as f32;
    let cases: Vec<(Vec<f32>, Vec<f32>, Vec<f32>)> = vec![
        // f64 mean for rows >= 8: a row of 1e38 has mean 1e38; the ops' f32 sum overflows.
        (vec![1e38; 8], vec![0.0; 8], vec![nan; 8]),
        (vec![1e38; 4], vec![0.0; 4], vec![nan; 4]),
        // x - mean overflows in the last element only (rows >= 8) ...
        (
            [vec![3.4e38; 7], vec![-3.4e38]].concat(),
            [vec![0.0; 7], vec![nan]].concat(),
            vec![nan; 8],
        ),
        // ... while Welford's update (rows < 8) turns the whole row NaN.
        (vec![3.4e38, 3.4e38, 3.4e38, -3.4e38], vec![nan; 4], vec![nan; 4]),
        // squared deviations overflow: rstd = 0.
        ([vec![1e20], vec![1.0; 7]].concat(), vec![0.0; 8], vec![0.0; 8]),
        (vec![INF, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0], vec![nan; 8], vec![nan; 8]),
        // ORT's short-row statistics round like f32 Welford: these are its outputs.
        (
            vec![p30, p30, p30 + 128.0, p30 + 256.0],
            vec![0.0, 0.0, 0.894_427_2, 1.788_854_4],
            vec![0.0, 0.0, 0.894_427_2, 1.788_854_4],
        ),
    ];
    for isa in isas() {
        for (row, want_op, want_dec) in &cases {
            let len = row.len();
            let ones = vec![1.0; len];
            for (decomposed, want) in [(false, want_op), (true, want_dec)] {
                let mut y = vec![0.0; len];
                layer_norm(isa, len, 1e-5, decomposed, row, &ones, None, &mut y, &Serial).unwrap();
                for (k, (&g, &w)) in y.iter().zip(want.iter()).enumerate() {
                    assert!(
                        same_special(g, w, 2e-6) || (w == 0.0 && g.abs() < 1e-30),
                        "{isa:?} decomposed={decomposed} {row:?}[{k}] = {g}, want {w}"
                    );
                }
            }
        }
        // ORT's output for 1e7 + [0..7) (measured): Welford's mean and M2 in f32.
        let row: Vec<f32> = (0..7).map(|i| 1e7 + i as f32).collect();
        let mut y = vec![0.0; 7];
        layer_norm(isa, 7, 1e-5, false, &row, &[1.0; 7], None, &mut y, &Serial).unwrap();
        assert!(
            (y[0] + 1.449_136).abs() < 1e-5 && (y[1] + 0.966_091).abs() < 1e-5,
            "{y:?}"
        );
    }
}

#[test]
fn softmax_unshifted_overflows_like_the_decomposed_ops() {
    for isa in isas() {
        for inner in [1, 3] {
            let x: Vec<f32> = [100.0f32, 0.0, -1.0].iter().flat_map(|&v| vec![v; inner]).collect();
            let mut y = vec![0.0; x.len()];
            softmax(isa, 3, inner, false, &x, &mut y, &Serial).unwrap();
            assert!(y[0].is_nan() && y[inner] == 0.0 && y[2 * inner] == 0.0, "{isa:?} {y:?}");
            softmax(isa, 3, inner, true, &x, &mut y, &Serial).unwrap();
            // e^-100 is subnormal; shifted, it flushes to 0, as in ORT's CPU EP.
            assert!((y[0] - 1.0).abs() < 1e-6 && y[inner] == 0.0, "{isa:?} {y:?}");
            let x: Vec<f32> = [INF, 1.0, 2.0].iter().flat_map(|&v| vec![v; inner]).collect();
            softmax(isa, 3, inner, true, &x, &mut y, &Serial).unwrap();
            assert!(y.iter().all(|v| v.is_nan()), "{isa:?} softmax with +inf: {y:?}");
        }
    }
}

#[test]
fn reductions_of_nothing_and_of_nan() {
    for isa in isas() {
        for (kind, want) in [
            (ReduceKind::Sum, 0.0),
            (ReduceKind::Mean, 0.0),
            (ReduceKind::Max, f32::NEG_INFINITY),
        ] {
            let mut y = [f32::NAN; 6];
            reduce(isa, kind, 3, 0, 2, &[], &mut y, &Serial).unwrap();
            assert_eq!(y, [want; 6], "{isa:?} {kind:?} over an empty axis");
        }
        // ReduceMax is NaN wherever a NaN is reduced, at any position, in both layouts.
        for len in [4, 16, 17, 40] {
            for at in [0, 1, len / 2, len - 1] {
                let mut x: Vec<f32> = (0..len).map(|i| i as f32).collect();
                x[at] = f32::NAN;
                let mut y = [0.0];
                reduce(isa, ReduceKind::Max, 1, len, 1, &x, &mut y, &Serial).unwrap();
                assert!(y[0].is_nan(), "{isa:?} max of {len} with NaN at {at}: {}", y[0]);
                let cols: Vec<f32> = x.iter().flat_map(|&v| [v, 1.0]).collect();
                let mut y = [0.0; 2];
                reduce(isa, ReduceKind::Max, 1, len, 2, &cols, &mut y, &Serial).unwrap();
                assert!(y[0].is_nan() && y[1] == 1.0, "{isa:?} column max: {y:?}");
            }
        }
        let x = [1e38f32, 2e38, 3e38, -INF];
        let mut y = [0.0];
        reduce(isa, ReduceKind::Max, 1, 4, 1, &x, &mut y, &Serial).unwrap();
        assert_eq!(y[0], 3e38);
        reduce(isa, ReduceKind::Mean, 1, 3, 1, &x[..3], &mut y, &Serial).unwrap();
        assert_eq!(y[0], INF, "the f32 sum overflows, as ORT's ReduceMean does");
    }
}

#[test]
fn casts_to_integers_give_x86_s_integer_indefinite() {
    let x = [
        f32::NAN,
        INF,
        -INF,
        2.2e9,
        -2.2e9,
        2_147_483_648.0,
        -2_147_483_648.0,
        2.7,
        -2.7,
        9.3e18,
        -0.0,
    ];
    let mut i32s = [0i32; 11];
    cast_f32_i32(&x, &mut i32s);
    let m = i32::MIN;
    assert_eq!(i32s, [m, m, m, m, m, m, m, 2, -2, m, 0]);
    let mut i64s = [0i64; 11];
    cast_f32_i64(&x, &mut i64s);
    let m = i64::MIN;
    assert_eq!(
        i64s,
        [
            m,
            m,
            m,
            2_200_000_000,
            -2_200_000_000,
            2_147_483_648,
            -2_147_483_648,
            2,
            -2,
            m,
            0
        ]
    );
}

// ---- elementwise math, comparisons and logic (issue #12) ----

#[test]
fn math_unary_ops_match_reference() {
    let mut x = data(67, 9);
    x.iter_mut().step_by(3).for_each(|v| *v = (*v * 2.0).round() / 2.0); // exact halves
    x.extend([INF, -INF, f32::NAN, -0.0, 1e30, -1e30, 100.0, -100.0, 2.5, -2.5, 1e10]);
    let ops = [
        UnaryOp::Floor,
        UnaryOp::Ceil,
        UnaryOp::Round,
        UnaryOp::Sign,
        UnaryOp::Sin,
        UnaryOp::Cos,
        UnaryOp::Softplus,
        UnaryOp::Mish,
    ];
    for isa in isas() {
        for op in ops {
            let mut y = vec![0.0; x.len()];
            unary(isa, op, &x, &mut y, &Serial).unwrap();
            for (&xi, &yi) in x.iter().zip(&y) {
                let want = unary_ref(op, xi);
                let exact = matches!(op, UnaryOp::Floor | UnaryOp::Ceil | UnaryOp::Round | UnaryOp::Sign);
                let ok = if exact {
                    yi.to_bits() == (want as f32).to_bits() || yi.is_nan() && want.is_nan()
                } else {
                    close(yi, want, 2e-6) || (want.abs() < 1e-30 && yi.abs() < 1e-30)
                };
                assert!(ok, "{isa:?} {op:?}({xi:e}) = {yi:e}, want {want:e}");
            }
        }
    }
}

#[test]
fn float_tests_and_not_write_bools() {
    let x = spread(&[f32::NAN, INF, -INF, 0.0, -1.0, f32::MAX]);
    for isa in isas() {
        let mut y = vec![7u8; x.len()];
        unary_to_bool(isa, UnaryOp::IsNaN, &x, &mut y, &Serial).unwrap();
        assert!(x.iter().zip(&y).all(|(v, &b)| b == u8::from(v.is_nan())));
        for (negative, positive) in [(true, true), (true, false), (false, true), (false, false)] {
            unary_to_bool(isa, UnaryOp::IsInf { negative, positive }, &x, &mut y, &Serial).unwrap();
            for (&v, &b) in x.iter().zip(&y) {
                let want = (positive && v == INF) || (negative && v == -INF);
                assert_eq!(b, u8::from(want), "{isa:?} IsInf({negative}, {positive})({v})");
            }
        }
        // an f32 -> f32 op is refused, not left unwritten
        assert!(unary_to_bool(isa, UnaryOp::Floor, &x, &mut y, &Serial).is_err());
        let mut f = vec![0.0; x.len()];
        assert!(unary(isa, UnaryOp::IsNaN, &x, &mut f, &Serial).is_err());
    }
    let mut y = [9u8; 3];
    not(&[0, 1, 5], &mut y).unwrap();
    assert_eq!(y, [1, 0, 0]);
    assert!(not(&[0, 1], &mut y).is_err());
}

#[test]
fn max_min_keep_nan_and_the_first_of_a_tie() {
    let a = [1.0, f32::NAN, 3.0, f32::NAN, -0.0, 0.0];
    let b = [f32::NAN, 2.0, 1.0, f32::NAN, 0.0, -0.0];
    for isa in isas() {
        let mut y = [0.0; 6];
        binary(isa, BinaryOp::Max, &Layout::Same, &a, &b, &mut y, &Serial).unwrap();
        assert_eq!(y.map(f32::is_nan), [true, true, false, true, false, false]);
        assert_eq!(y[2], 3.0);
        assert_eq!(
            y[4..].iter().map(|v| v.is_sign_negative()).collect::<Vec<_>>(),
            [true, false]
        );
        binary(isa, BinaryOp::Min, &Layout::Same, &a, &b, &mut y, &Serial).unwrap();
        assert_eq!(y.map(f32::is_nan), [true, true, false, true, false, false]);
        assert_eq!(y[2], 1.0);
        assert_eq!(
            y[4..].iter().map(|v| v.is_sign_negative()).collect::<Vec<_>>(),
            [true, false]
        );
    }
}

/// Every comparison and the f32 Max/Min/Fmod over broadcasting shapes, on
/// every layout kind, against the naive definition.
#[test]
fn comparisons_and_new_f32_ops_broadcast() {
    let shapes: [(&[usize], &[usize]); 5] = [
        (&[3, 5], &[3, 5]),
        (&[3, 5], &[5]),
        (&[], &[4]),
        (&[2, 1, 4], &[3, 1]),
        (&[4, 1], &[1, 4]),
    ];
    for (sa, sb) in shapes {
        let na: usize = sa.iter().product();
        let nb: usize = sb.iter().product();
        let a: Vec<f32> = data(na, 3).iter().map(|v| v.round()).collect();
        let mut b: Vec<f32> = data(nb, 4).iter().map(|v| v.round()).collect();
        b[0] = f32::NAN;
        let out = broadcast_shapes(sa, sb).unwrap();
        let n: usize = out.iter().product();
        let layout = Layout::for_shapes(sa, sb).unwrap();
        for isa in isas() {
            for op in [BinaryOp::Max, BinaryOp::Min, BinaryOp::Fmod] {
                let want = broadcast_ref(op, sa, &a, sb, &b);
                let mut y = vec![0.0; n];
                binary(isa, op, &layout, &a, &b, &mut y, &Serial).unwrap();
                for (g, w) in y.iter().zip(&want) {
                    assert!(
                        g.to_bits() == w.to_bits() || g.is_nan() && w.is_nan(),
                        "{op:?} {sa:?} {sb:?}"
                    );
                }
            }
            let cmps = [
                BinaryOp::Equal,
                BinaryOp::Greater,
                BinaryOp::Less,
                BinaryOp::GreaterOrEqual,
                BinaryOp::LessOrEqual,
            ];
            for op in cmps {
                // the reference as 1.0 / 0.0 through the f32 broadcast of Sub's shape logic
                let pick = |x: f32, y: f32| match op {
                    BinaryOp::Equal => x == y,
                    BinaryOp::Greater => x > y,
                    BinaryOp::Less => x < y,
                    BinaryOp::GreaterOrEqual => x >= y,
                    _ => x <= y,
                };
                let ia = broadcast_ref(BinaryOp::Add, sa, &a, sb, &vec![0.0; nb]);
                let ib = broadcast_ref(BinaryOp::Add, sa, &vec![0.0; na], sb, &b);
                let mut y = vec![9u8; n];
                binary_to_bool(
                    isa,
                    op,
                    DType::F32,
                    &layout,
                    bytemuck::cast_slice(&a),
                    bytemuck::cast_slice(&b),
                    &mut y,
                    &Serial,
                )
                .unwrap();
                for k in 0..n {
                    assert_eq!(y[k], u8::from(pick(ia[k], ib[k])), "{op:?} {sa:?} {sb:?} [{k}]");
                }
                let (a64, b64): (Vec<i64>, Vec<i64>) = (
                    a.iter().map(|&v| v as i64).collect(),
                    b.iter().map(|&v| v as i64).collect(),
                );
                binary_to_bool(
                    isa,
                    op,
                    DType::I64,
                    &layout,
                    bytemuck::cast_slice(&a64),
                    bytemuck::cast_slice(&b64),
                    &mut y,
                    &Serial,
                )
                .unwrap();
                for k in 0..n {
                    let (x, z) = (ia[k] as i64, if ib[k].is_nan() { 0 } else { ib[k] as i64 });
                    assert_eq!(
                        y[k],
                        u8::from(pick(x as f32, z as f32)),
                        "i64 {op:?} {sa:?} {sb:?} [{k}]"
                    );
                }
            }
        }
    }
}

#[test]
fn integer_max_min_mod() {
    let a: [i64; 8] = [5, -5, 5, -5, 0, 7, i64::MIN, i64::MAX];
    let b: [i64; 8] = [3, 3, -3, -3, 2, -4, -1, 3];
    for isa in isas() {
        let mut y = [0i64; 8];
        binary_i64(isa, BinaryOp::Mod, &Layout::Same, &a, &b, &mut y).unwrap();
        assert_eq!(y[..6], [2, 1, -1, -2, 0, -1]);
        assert_eq!(y[6], 0);
        binary_i64(isa, BinaryOp::Fmod, &Layout::Same, &a[..6], &b[..6], &mut y[..6]).unwrap();
        assert_eq!(y[..6], [2, -2, 2, -2, 0, 3]);
        binary_i64(isa, BinaryOp::Max, &Layout::Same, &a, &b, &mut y).unwrap();
        assert_eq!(y, [5, 3, 5, -3, 2, 7, -1, i64::MAX]);
        let a32: Vec<i32> = a[..6].iter().map(|&v| v as i32).collect();
        let b32: Vec<i32> = b[..6].iter().map(|&v| v as i32).collect();
        let mut y32 = [0i32; 6];
        binary_i32(isa, BinaryOp::Min, &Layout::Same, &a32, &b32, &mut y32).unwrap();
        assert_eq!(y32, [3, -5, -3, -5, 0, -4]);
        binary_i32(isa, BinaryOp::Mod, &Layout::ScalarB, &a32, &[-3], &mut y32).unwrap();
        assert_eq!(y32, [-1, -2, -1, -2, 0, -2]);
        let err = binary_i64(isa, BinaryOp::Mod, &Layout::ScalarB, &a, &[0], &mut y).unwrap_err();
        assert!(err.to_string().contains("Mod by zero"), "{err}");
        // ops on the wrong types are refused, not run
        assert!(binary_i64(isa, BinaryOp::And, &Layout::Same, &a, &b, &mut y).is_err());
        assert!(binary_i64(isa, BinaryOp::Equal, &Layout::Same, &a, &b, &mut y).is_err());
    }
}

#[test]
fn bool_connectives_and_equal() {
    let a = [0u8, 0, 1, 1];
    let b = [0u8, 1, 0, 1];
    for isa in isas() {
        let mut y = [9u8; 4];
        for (op, want) in [
            (BinaryOp::And, [0, 0, 0, 1]),
            (BinaryOp::Or, [0, 1, 1, 1]),
            (BinaryOp::Xor, [0, 1, 1, 0]),
            (BinaryOp::Equal, [1, 0, 0, 1]),
        ] {
            binary_to_bool(isa, op, DType::Bool, &Layout::Same, &a, &b, &mut y, &Serial).unwrap();
            assert_eq!(y, want, "{op:?}");
        }
        assert!(binary_to_bool(
            isa,
            BinaryOp::Greater,
            DType::Bool,
            &Layout::Same,
            &a,
            &b,
            &mut y,
            &Serial
        )
        .is_err());
        assert!(binary_to_bool(
            isa,
            BinaryOp::Add,
            DType::F32,
            &Layout::ScalarB,
            &[0; 16],
            &[0; 4],
            &mut y,
            &Serial
        )
        .is_err());
    }
}

/// Distance in units in the last place between two finite f32s.
fn ulps(a: f32, b: f32) -> u32 {
    let key = |v: f32| {
        let i = v.to_bits() as i32;
        if i < 0 {
            i32::MIN.wrapping_sub(i) as i64
        } else {
            i as i64
        }
    };
    (key(a) - key(b)).unsigned_abs().min(u32::MAX as u64) as u32
}

#[test]
fn vectorised_sin_cos_softplus_mish_are_libm_accurate() {
    // A dense sweep plus the edges of the vectorised range (and past it: libm).
    let mut x: Vec<f32> = (-20_000..=20_000).map(|i| i as f32 * 0.003_141_5).collect();
    x.extend((0..4000).map(|i| (i as f32 - 2000.0) * 33.7));
    x.extend([
        65_535.9,
        65_536.0,
        -65_536.0,
        65_537.0,
        1e10,
        -1e20,
        1e-30,
        -0.0,
        f32::MIN_POSITIVE,
    ]);
    for isa in isas() {
        let mut y = vec![0.0; x.len()];
        for (op, f) in [(UnaryOp::Sin, f64::sin as fn(f64) -> f64), (UnaryOp::Cos, f64::cos)] {
            unary(isa, op, &x, &mut y, &Serial).unwrap();
            for (&xi, &yi) in x.iter().zip(&y) {
                let want = f(xi as f64) as f32;
                // 1 ulp, or tiny absolute error next to a zero of the function
                let ok = ulps(yi, want) <= 1 || (yi as f64 - f(xi as f64)).abs() < 1e-9;
                assert!(ok, "{isa:?} {op:?}({xi:e}) = {yi:e}, want {want:e}");
            }
        }
        assert_eq!(y.len(), x.len());
        let x: Vec<f32> = (-2000..=2000)
            .map(|i| i as f32 * 0.05)
            .chain([-1e30, 1e30, 88.0, 89.0, -104.0])
            .collect();
        let mut y = vec![0.0; x.len()];
        unary(isa, UnaryOp::Softplus, &x, &mut y, &Serial).unwrap();
        for (&xi, &yi) in x.iter().zip(&y) {
            let want = unary_ref(UnaryOp::Softplus, xi) as f32;
            assert!(ulps(yi, want) <= 4, "{isa:?} softplus({xi:e}) = {yi:e}, want {want:e}");
        }
        unary(isa, UnaryOp::Mish, &x, &mut y, &Serial).unwrap();
        for (&xi, &yi) in x.iter().zip(&y) {
            let want = unary_ref(UnaryOp::Mish, xi) as f32;
            assert!(
                ulps(yi, want) <= 6 || want.abs() < 1e-37,
                "{isa:?} mish({xi:e}) = {yi:e}, want {want:e}"
            );
        }
        // the limits ORT gives
        let x = [f32::NAN, INF, -INF];
        let mut y = [0.0; 3];
        unary(isa, UnaryOp::Softplus, &x, &mut y, &Serial).unwrap();
        assert!(y[0].is_nan() && y[1] == INF && y[2] == 0.0, "{y:?}");
        unary(isa, UnaryOp::Mish, &x, &mut y, &Serial).unwrap();
        assert!(y[0].is_nan() && y[1] == INF && y[2].is_nan(), "{y:?}");
        unary(isa, UnaryOp::Sin, &x, &mut y, &Serial).unwrap();
        assert!(y.iter().all(|v| v.is_nan()), "{y:?}");
    }
}

// Activations (issue #13).

const ACTIVATIONS: [UnaryOp; 10] = [
    UnaryOp::HardSigmoid(0.2, 0.5),
    UnaryOp::HardSigmoid(-0.7, 0.1),
    UnaryOp::HardSwish,
    UnaryOp::Silu,
    UnaryOp::Elu(1.0),
    UnaryOp::Elu(0.3),
    UnaryOp::Selu(1.673_263_2, 1.050_701),
    UnaryOp::Celu(2.0),
    UnaryOp::ThresholdedRelu(0.5),
    UnaryOp::Softsign,
];

#[test]
fn activations_match_reference() {
    // 67 values: full vectors of every width plus a tail; then the tails of exp.
    let mut x = data(67, 4);
    x.extend([-20.0, -80.0, -87.5, -88.9, -104.5, -1e-7, 1e-7, 30.0, 3.0, -3.0]);
    for isa in isas() {
        for op in ACTIVATIONS {
            let mut y = vec![f32::NAN; x.len()];
            unary(isa, op, &x, &mut y, &Serial).unwrap();
            for (&xi, &yi) in x.iter().zip(&y) {
                let want = unary_ref(op, xi);
                // exp(x) - 1 (ORT's formula) cancels near 0: absolute error there.
                let ok = close(yi, want, 2e-6) || (yi as f64 - want).abs() < 1.5e-7;
                assert!(ok, "{isa:?} {op:?}({xi:e}) = {yi:e}, want {want:e}");
            }
        }
    }
}

#[test]
fn activations_at_the_limits_give_ort_s_values() {
    // (x, HardSigmoid(0.2, 0.5), HardSwish, Elu(1), Selu, Celu(1), ThresholdedRelu(1), Softsign, Silu),
    // as ORT 1.31.1's CPU EP gives them (signs of zeros included; Silu: Mul(x, Sigmoid(x))).
    const NAN: f32 = f32::NAN;
    let rows: &[(f32, [f32; 8])] = &[
        (INF, [1.0, INF, INF, INF, INF, INF, NAN, INF]),
        (-INF, [0.0, NAN, -1.0, -1.758_099_3, -1.0, 0.0, NAN, NAN]),
        (NAN, [NAN, NAN, NAN, NAN, NAN, 0.0, NAN, NAN]),
        (0.0, [0.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]),
        (-0.0, [0.5, -0.0, -0.0, 0.0, 0.0, 0.0, -0.0, -0.0]),
        (
            -3.0,
            [
                0.0,
                -0.0,
                -0.950_212_96,
                -1.670_568_7,
                -0.950_212_96,
                0.0,
                -0.75,
                -0.142_277_62,
            ],
        ),
        (3.4e38, [1.0, 3.4e38, 3.4e38, INF, 3.4e38, 3.4e38, 1.000_000_1, 3.4e38]),
        (-3.4e38, [0.0, -0.0, -1.0, -1.758_099_3, -1.0, 0.0, -1.000_000_1, -0.0]),
        (-100.0, [0.0, -0.0, -1.0, -1.758_099_3, -1.0, 0.0, -0.990_099, -0.0]),
    ];
    let ops = [
        UnaryOp::HardSigmoid(0.2, 0.5),
        UnaryOp::HardSwish,
        UnaryOp::Elu(1.0),
        UnaryOp::Selu(1.673_263_2, 1.050_701),
        UnaryOp::Celu(1.0),
        UnaryOp::ThresholdedRelu(1.0),
        UnaryOp::Softsign,
        UnaryOp::Silu,
    ];
    let x = spread(&rows.iter().map(|r| r.0).collect::<Vec<_>>());
    for isa in isas() {
        for (j, op) in ops.into_iter().enumerate() {
            let mut y = vec![0.0; x.len()];
            unary(isa, op, &x, &mut y, &Serial).unwrap();
            for (&xi, &yi) in x.iter().zip(&y) {
                let want = rows.iter().find(|r| r.0.to_bits() == xi.to_bits()).unwrap().1[j];
                let sign_ok = want.is_nan() || yi.is_sign_negative() == want.is_sign_negative();
                assert!(
                    same_special(yi, want, 2e-6) && sign_ok,
                    "{isa:?} {op:?}({xi:e}) = {yi:e}, ORT gives {want:e}"
                );
            }
        }
    }
}

#[test]
fn prelu_broadcasts_its_slope() {
    // A CNN's per-channel slope [C, 1, 1] over [N, C, H, W], a scalar, a full one.
    let cases: &[(&[usize], &[usize])] = &[(&[2, 3, 4, 5], &[3, 1, 1]), (&[2, 3, 4, 5], &[1]), (&[3, 7], &[3, 7])];
    for &(sx, ss) in cases {
        let mut x = data(sx.iter().product(), 9);
        x[..4].copy_from_slice(&[f32::NAN, -INF, -0.0, 1e-40]);
        let slope = data(ss.iter().product(), 2);
        let layout = Layout::for_shapes(sx, ss).unwrap();
        let out = broadcast_shapes(sx, ss).unwrap();
        let at = |i: usize| {
            // The slope element that x's flat index i reads (ss is right-aligned).
            let mut idx = 0;
            let (mut rest, mut stride) = (i, 1);
            for d in (0..out.len()).rev() {
                let k = rest % out[d];
                rest /= out[d];
                let pad = out.len() - ss.len();
                if d >= pad && ss[d - pad] != 1 {
                    idx += k * stride;
                }
                if d >= pad {
                    stride *= ss[d - pad];
                }
            }
            slope[idx]
        };
        for isa in isas() {
            let mut y = vec![0.0; x.len()];
            binary(isa, BinaryOp::PRelu, &layout, &x, &slope, &mut y, &Serial).unwrap();
            for (i, (&xi, &yi)) in x.iter().zip(&y).enumerate() {
                let want = if xi < 0.0 { xi * at(i) } else { xi };
                assert!(
                    yi.to_bits() == want.to_bits() || yi.is_nan() && want.is_nan(),
                    "{isa:?} PRelu {sx:?} {ss:?} [{i}] ({xi:e}) = {yi:e}, want {want:e}"
                );
            }
        }
    }
}
