//! Elementwise loops, written once and instantiated per target.
//!
//! Everything here is `#[inline(always)]` so that it is compiled inside each
//! `#[target_feature]` wrapper in `kernels/mod.rs`: LLVM then vectorises the
//! same loop for SSE2, AVX2 and AVX-512. The loops are plain zipped slice
//! iterations, which LLVM vectorises without bounds checks; the math comes
//! from [`super::math`] (branch-free approximations) or is native (`sqrt`,
//! division). `Log` and `Pow` call libm.
//!
//! Callers check lengths first (`Layout::fits`, equal lengths for unary) and
//! skip empty outputs, so the slicing below cannot go out of bounds.

use super::layout::{Layout, Strided};
use super::{math, BinaryOp, UnaryOp};

/// `dst[i] = op(src[i])`; lengths are equal.
#[inline(always)]
pub(super) fn unary(op: UnaryOp, src: &[f32], dst: &mut [f32]) {
    match op {
        // `x < 0 ? 0 : x` keeps NaN as NaN, like a max that propagates NaN.
        UnaryOp::Relu => map(src, dst, |x| if x < 0.0 { 0.0 } else { x }),
        UnaryOp::Sigmoid => map(src, dst, math::sigmoid),
        UnaryOp::Tanh => map(src, dst, math::tanh),
        UnaryOp::Neg => map(src, dst, |x| -x),
        UnaryOp::Abs => map(src, dst, f32::abs),
        UnaryOp::Sqrt => map(src, dst, f32::sqrt),
        UnaryOp::Exp => map(src, dst, math::exp),
        UnaryOp::Log => map(src, dst, f32::ln),
        UnaryOp::Erf => map(src, dst, math::erf),
        UnaryOp::Reciprocal => map(src, dst, |x| 1.0 / x),
        UnaryOp::LeakyRelu(alpha) => map(src, dst, move |x| if x < 0.0 { alpha * x } else { x }),
        UnaryOp::Clip(lo, hi) => map(src, dst, move |x| {
            let y = if x < lo { lo } else { x };
            if y > hi {
                hi
            } else {
                y
            }
        }),
        UnaryOp::Gelu => map(src, dst, math::gelu),
        UnaryOp::GeluTanh => map(src, dst, math::gelu_tanh),
        UnaryOp::GeluWritten => map(src, dst, |x| math::overflow_doubled(x, math::gelu(x))),
        UnaryOp::GeluTanhWritten => map(src, dst, |x| math::overflow_doubled(x, math::gelu_tanh(x))),
        // floor/ceil/round_ties_even become one rounding instruction where the
        // target has one (SSE4.1 and up), else a libm call.
        UnaryOp::Floor => map(src, dst, f32::floor),
        UnaryOp::Ceil => map(src, dst, f32::ceil),
        UnaryOp::Round => map(src, dst, f32::round_ties_even),
        UnaryOp::Sin => sin_cos(src, dst, false),
        UnaryOp::Cos => sin_cos(src, dst, true),
        UnaryOp::Sign => map(src, dst, sign),
        UnaryOp::Softplus => map(src, dst, math::softplus),
        UnaryOp::Mish => map(src, dst, math::mish),
        // Not bool → f32 ops; `unary_to_bool` and `not` run these.
        UnaryOp::Not | UnaryOp::IsNaN | UnaryOp::IsInf { .. } => {}
        // Activations (issue #13).
        UnaryOp::HardSigmoid(alpha, beta) => map(src, dst, move |x| math::hard_sigmoid(x, alpha, beta)),
        UnaryOp::HardSwish => map(src, dst, math::hard_swish),
        UnaryOp::Silu => map(src, dst, math::silu),
        UnaryOp::Elu(alpha) => map(src, dst, move |x| math::elu(x, alpha)),
        UnaryOp::Selu(alpha, gamma) => map(src, dst, move |x| math::selu(x, alpha, gamma)),
        UnaryOp::Celu(alpha) => map(src, dst, move |x| math::celu(x, alpha)),
        UnaryOp::ThresholdedRelu(alpha) => map(src, dst, move |x| math::thresholded_relu(x, alpha)),
        UnaryOp::Softsign => map(src, dst, math::softsign),
    }
}

/// Sine or cosine, by blocks: the vectorised [`math::sin_cos`] for a block
/// whose arguments are all within its range, libm for the rest (huge, NaN,
/// ±inf), so results are libm-accurate everywhere.
#[inline(always)]
fn sin_cos(src: &[f32], dst: &mut [f32], cos: bool) {
    const BLOCK: usize = 64;
    for (d, s) in dst.chunks_mut(BLOCK).zip(src.chunks(BLOCK)) {
        let in_range = s.iter().fold(true, |ok, x| ok & (x.abs() <= math::SIN_COS_LIMIT));
        if in_range {
            map(s, d, |x| math::sin_cos(x, cos));
        } else if cos {
            map(s, d, f32::cos);
        } else {
            map(s, d, f32::sin);
        }
    }
}

/// -1, 0 or 1 (+0 for ±0), NaN for NaN: ORT's Sign.
#[inline(always)]
fn sign(x: f32) -> f32 {
    if x > 0.0 {
        1.0
    } else if x < 0.0 {
        -1.0
    } else if x == 0.0 {
        0.0
    } else {
        x
    }
}

/// `dst[i] = op(src[i])` for the f32 tests (IsNaN, IsInf); lengths are equal.
#[inline(always)]
pub(super) fn unary_to_bool(op: UnaryOp, src: &[f32], dst: &mut [u8]) {
    match op {
        UnaryOp::IsNaN => test(src, dst, f32::is_nan),
        UnaryOp::IsInf { negative, positive } => test(src, dst, move |x| {
            (positive && x == f32::INFINITY) || (negative && x == f32::NEG_INFINITY)
        }),
        _ => {}
    }
}

#[inline(always)]
fn test(src: &[f32], dst: &mut [u8], f: impl Fn(f32) -> bool) {
    for (d, &x) in dst.iter_mut().zip(src) {
        *d = u8::from(f(x));
    }
}

/// `dst = a op b` on f32 with the given broadcast layout; `layout.fits`
/// holds and `dst` is not empty.
#[inline(always)]
pub(super) fn binary_f32(op: BinaryOp, layout: &Layout, a: &[f32], b: &[f32], dst: &mut [f32]) {
    match op {
        BinaryOp::Add => broadcast(layout, a, b, dst, |x, y| x + y),
        BinaryOp::Sub => broadcast(layout, a, b, dst, |x, y| x - y),
        BinaryOp::Mul => broadcast(layout, a, b, dst, |x, y| x * y),
        BinaryOp::Div => broadcast(layout, a, b, dst, |x, y| x / y),
        BinaryOp::Pow => broadcast(layout, a, b, dst, pow),
        BinaryOp::Max => broadcast(layout, a, b, dst, max_f32),
        BinaryOp::Min => broadcast(layout, a, b, dst, min_f32),
        // Rust's `%` on floats is C's fmod.
        BinaryOp::Fmod => broadcast(layout, a, b, dst, |x, y| x % y),
        // Activations (issue #13).
        BinaryOp::PRelu => broadcast(layout, a, b, dst, math::prelu),
        _ => {}
    }
}

/// The larger, NaN if either is NaN, `x` on ties (so `max(-0, 0)` is -0): ORT's Max.
#[inline(always)]
fn max_f32(x: f32, y: f32) -> f32 {
    let m = if x < y { y } else { x };
    if y.is_nan() {
        y
    } else {
        m
    }
}

/// The smaller, see [`max_f32`].
#[inline(always)]
fn min_f32(x: f32, y: f32) -> f32 {
    let m = if y < x { y } else { x };
    if y.is_nan() {
        y
    } else {
        m
    }
}

/// `dst = a op b` for the comparisons, bool results.
#[inline(always)]
pub(super) fn compare_f32(op: BinaryOp, layout: &Layout, a: &[f32], b: &[f32], dst: &mut [u8]) {
    compare(op, layout, a, b, dst)
}

#[inline(always)]
pub(super) fn compare_i64(op: BinaryOp, layout: &Layout, a: &[i64], b: &[i64], dst: &mut [u8]) {
    compare(op, layout, a, b, dst)
}

#[inline(always)]
pub(super) fn compare_i32(op: BinaryOp, layout: &Layout, a: &[i32], b: &[i32], dst: &mut [u8]) {
    compare(op, layout, a, b, dst)
}

#[inline(always)]
fn compare<T: Copy + PartialOrd>(op: BinaryOp, layout: &Layout, a: &[T], b: &[T], dst: &mut [u8]) {
    match op {
        BinaryOp::Equal => broadcast(layout, a, b, dst, |x, y| u8::from(x == y)),
        BinaryOp::Greater => broadcast(layout, a, b, dst, |x, y| u8::from(x > y)),
        BinaryOp::Less => broadcast(layout, a, b, dst, |x, y| u8::from(x < y)),
        BinaryOp::GreaterOrEqual => broadcast(layout, a, b, dst, |x, y| u8::from(x >= y)),
        BinaryOp::LessOrEqual => broadcast(layout, a, b, dst, |x, y| u8::from(x <= y)),
        _ => {}
    }
}

/// `dst = a op b` on bools (0 or 1 bytes; any non-zero byte reads as true).
#[inline(always)]
pub(super) fn binary_bool(op: BinaryOp, layout: &Layout, a: &[u8], b: &[u8], dst: &mut [u8]) {
    match op {
        BinaryOp::Equal => broadcast(layout, a, b, dst, |x, y| u8::from((x != 0) == (y != 0))),
        BinaryOp::And => broadcast(layout, a, b, dst, |x, y| u8::from(x != 0 && y != 0)),
        BinaryOp::Or => broadcast(layout, a, b, dst, |x, y| u8::from(x != 0 || y != 0)),
        BinaryOp::Xor => broadcast(layout, a, b, dst, |x, y| u8::from((x != 0) != (y != 0))),
        _ => {}
    }
}

/// Integer `a op b` (wrapping, like ONNX Runtime) for one integer type: the
/// caller refuses Pow and checks divisors for zero.
macro_rules! int_binary {
    ($name:ident, $t:ty) => {
        #[inline(always)]
        pub(super) fn $name(op: BinaryOp, layout: &Layout, a: &[$t], b: &[$t], dst: &mut [$t]) {
            match op {
                BinaryOp::Add => broadcast(layout, a, b, dst, <$t>::wrapping_add),
                BinaryOp::Sub => broadcast(layout, a, b, dst, <$t>::wrapping_sub),
                BinaryOp::Mul => broadcast(layout, a, b, dst, <$t>::wrapping_mul),
                BinaryOp::Div => broadcast(
                    layout,
                    a,
                    b,
                    dst,
                    |x, y| if y == 0 { 0 } else { x.wrapping_div(y) },
                ),
                BinaryOp::Max => broadcast(layout, a, b, dst, <$t>::max),
                BinaryOp::Min => broadcast(layout, a, b, dst, <$t>::min),
                // The remainder with the divisor's sign (Python's `%`).
                BinaryOp::Mod => broadcast(layout, a, b, dst, |x, y| {
                    if y == 0 {
                        return 0;
                    }
                    let r = x.wrapping_rem(y);
                    if r != 0 && (r < 0) != (y < 0) {
                        r + y
                    } else {
                        r
                    }
                }),
                // C's `fmod` in double precision, as ORT computes it (exact up
                // to 2^53; beyond, the same rounding as ORT's).
                BinaryOp::Fmod => broadcast(layout, a, b, dst, |x, y| {
                    if y == 0 {
                        0
                    } else {
                        (x as f64 % y as f64) as $t
                    }
                }),
                _ => {}
            }
        }
    };
}

int_binary!(binary_i64, i64);
int_binary!(binary_i32, i32);

/// `x^y` with the common exponents done exactly and fast.
#[inline(always)]
fn pow(x: f32, y: f32) -> f32 {
    if y == 2.0 {
        x * x
    } else if y == 1.0 {
        x
    } else if y == 3.0 {
        x * x * x
    } else if y == 0.5 {
        // powf(-0, 0.5) is +0 and powf(-inf, 0.5) is +inf; sqrt differs there.
        if x == f32::NEG_INFINITY {
            f32::INFINITY
        } else {
            x.sqrt().abs()
        }
    } else {
        x.powf(y)
    }
}

#[inline(always)]
fn map(src: &[f32], dst: &mut [f32], f: impl Fn(f32) -> f32) {
    for (d, &x) in dst.iter_mut().zip(src) {
        *d = f(x);
    }
}

#[inline(always)]
fn broadcast<T: Copy, U: Copy>(layout: &Layout, a: &[T], b: &[T], dst: &mut [U], f: impl Fn(T, T) -> U + Copy) {
    match layout {
        Layout::Same => vv(a, b, dst, f),
        Layout::ScalarA => sv(a[0], b, dst, f),
        Layout::ScalarB => vs(a, b[0], dst, f),
        Layout::RowA { inner } => {
            for (d, b) in dst.chunks_exact_mut(*inner).zip(b.chunks_exact(*inner)) {
                vv(a, b, d, f);
            }
        }
        Layout::RowB { inner } => {
            for (d, a) in dst.chunks_exact_mut(*inner).zip(a.chunks_exact(*inner)) {
                vv(a, b, d, f);
            }
        }
        Layout::Strided(s) => strided(s, a, b, dst, f),
    }
}

/// Walks the outer dims with an odometer; each innermost run is a slice loop.
#[inline(always)]
fn strided<T: Copy, U: Copy>(s: &Strided, a: &[T], b: &[T], dst: &mut [U], f: impl Fn(T, T) -> U + Copy) {
    let outer = s.dims.len() - 1;
    let inner = s.dims[outer];
    let (step_a, step_b) = (s.a_strides[outer], s.b_strides[outer]);
    let mut index = vec![0usize; outer];
    let (mut at_a, mut at_b) = (0usize, 0usize);
    for d in dst.chunks_exact_mut(inner) {
        let run_a = &a[at_a..at_a + if step_a == 1 { inner } else { 1 }];
        let run_b = &b[at_b..at_b + if step_b == 1 { inner } else { 1 }];
        match (step_a, step_b) {
            (1, 1) => vv(run_a, run_b, d, f),
            (1, _) => vs(run_a, run_b[0], d, f),
            (_, 1) => sv(run_a[0], run_b, d, f),
            _ => d.fill(f(run_a[0], run_b[0])),
        }
        for k in (0..outer).rev() {
            index[k] += 1;
            at_a += s.a_strides[k];
            at_b += s.b_strides[k];
            if index[k] < s.dims[k] {
                break;
            }
            index[k] = 0;
            at_a -= s.a_strides[k] * s.dims[k];
            at_b -= s.b_strides[k] * s.dims[k];
        }
    }
}

#[inline(always)]
fn vv<T: Copy, U>(a: &[T], b: &[T], dst: &mut [U], f: impl Fn(T, T) -> U) {
    for ((d, &x), &y) in dst.iter_mut().zip(a).zip(b) {
        *d = f(x, y);
    }
}

#[inline(always)]
fn vs<T: Copy, U>(a: &[T], y: T, dst: &mut [U], f: impl Fn(T, T) -> U) {
    for (d, &x) in dst.iter_mut().zip(a) {
        *d = f(x, y);
    }
}

#[inline(always)]
fn sv<T: Copy, U>(x: T, b: &[T], dst: &mut [U], f: impl Fn(T, T) -> U) {
    for (d, &y) in dst.iter_mut().zip(b) {
        *d = f(x, y);
    }
}
