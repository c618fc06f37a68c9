//! Elementwise loops, written once and instantiated per target.
//!
//! Everything here is `#[inline(always)]` so that it is compiled inside each
//! `#[target_feature]` wrapper in `kernels/mod.rs`: LLVM then vectorises the
//! same loop for SSE2, AVX2 and AVX-512. The loops are plain zipped slice
//! iterations, which LLVM vectorises without bounds checks.
//!
//! Callers check lengths first (`Layout::fits`, equal lengths for unary) and
//! skip empty outputs, so the slicing below cannot go out of bounds.

use super::layout::{Layout, Strided};
use super::{BinaryOp, UnaryOp};

trait Unary {
    fn apply(x: f32) -> f32;
}

trait Binary {
    fn apply(a: f32, b: f32) -> f32;
}

macro_rules! unary_fn {
    ($name:ident, |$x:ident| $body:expr) => {
        struct $name;
        impl Unary for $name {
            #[inline(always)]
            fn apply($x: f32) -> f32 {
                $body
            }
        }
    };
}

macro_rules! binary_fn {
    ($name:ident, |$a:ident, $b:ident| $body:expr) => {
        struct $name;
        impl Binary for $name {
            #[inline(always)]
            fn apply($a: f32, $b: f32) -> f32 {
                $body
            }
        }
    };
}

// `x < 0 ? 0 : x` keeps NaN as NaN, like a max that propagates NaN.
unary_fn!(Relu, |x| if x < 0.0 { 0.0 } else { x });
unary_fn!(Sigmoid, |x| sigmoid(x));
unary_fn!(Tanh, |x| x.tanh());
unary_fn!(Neg, |x| -x);
unary_fn!(Abs, |x| x.abs());
unary_fn!(Sqrt, |x| x.sqrt());
unary_fn!(Exp, |x| x.exp());

binary_fn!(Add, |a, b| a + b);
binary_fn!(Sub, |a, b| a - b);
binary_fn!(Mul, |a, b| a * b);
binary_fn!(Div, |a, b| a / b);

/// `1 / (1 + e^-x)`, using `e^x / (1 + e^x)` for negative x so that `exp`
/// never overflows and tiny results keep their precision.
#[inline(always)]
fn sigmoid(x: f32) -> f32 {
    if x >= 0.0 {
        1.0 / (1.0 + (-x).exp())
    } else {
        let e = x.exp();
        e / (1.0 + e)
    }
}

/// `dst[i] = op(src[i])`; lengths are equal.
#[inline(always)]
pub(super) fn unary(op: UnaryOp, src: &[f32], dst: &mut [f32]) {
    match op {
        UnaryOp::Relu => map::<Relu>(src, dst),
        UnaryOp::Sigmoid => map::<Sigmoid>(src, dst),
        UnaryOp::Tanh => map::<Tanh>(src, dst),
        UnaryOp::Neg => map::<Neg>(src, dst),
        UnaryOp::Abs => map::<Abs>(src, dst),
        UnaryOp::Sqrt => map::<Sqrt>(src, dst),
        UnaryOp::Exp => map::<Exp>(src, dst),
    }
}

/// `dst = a op b` with the given broadcast layout; `layout.fits` holds and
/// `dst` is not empty.
#[inline(always)]
pub(super) fn binary(op: BinaryOp, layout: &Layout, a: &[f32], b: &[f32], dst: &mut [f32]) {
    match op {
        BinaryOp::Add => broadcast::<Add>(layout, a, b, dst),
        BinaryOp::Sub => broadcast::<Sub>(layout, a, b, dst),
        BinaryOp::Mul => broadcast::<Mul>(layout, a, b, dst),
        BinaryOp::Div => broadcast::<Div>(layout, a, b, dst),
    }
}

#[inline(always)]
fn map<F: Unary>(src: &[f32], dst: &mut [f32]) {
    for (d, &x) in dst.iter_mut().zip(src) {
        *d = F::apply(x);
    }
}

#[inline(always)]
fn broadcast<F: Binary>(layout: &Layout, a: &[f32], b: &[f32], dst: &mut [f32]) {
    match layout {
        Layout::Same => vv::<F>(a, b, dst),
        Layout::ScalarA => sv::<F>(a[0], b, dst),
        Layout::ScalarB => vs::<F>(a, b[0], dst),
        Layout::RowA { inner } => {
            for (d, b) in dst.chunks_exact_mut(*inner).zip(b.chunks_exact(*inner)) {
                vv::<F>(a, b, d);
            }
        }
        Layout::RowB { inner } => {
            for (d, a) in dst.chunks_exact_mut(*inner).zip(a.chunks_exact(*inner)) {
                vv::<F>(a, b, d);
            }
        }
        Layout::Strided(s) => strided::<F>(s, a, b, dst),
    }
}

/// Walks the outer dims with an odometer; each innermost run is a slice loop.
#[inline(always)]
fn strided<F: Binary>(s: &Strided, a: &[f32], b: &[f32], dst: &mut [f32]) {
    let outer = s.dims.len() - 1;
    let inner = s.dims[outer];
    let (step_a, step_b) = (s.a_strides[outer], s.b_strides[outer]);
    let mut index = vec![0usize; outer];
    let (mut at_a, mut at_b) = (0usize, 0usize);
    for d in dst.chunks_exact_mut(inner) {
        let run_a = &a[at_a..at_a + if step_a == 1 { inner } else { 1 }];
        let run_b = &b[at_b..at_b + if step_b == 1 { inner } else { 1 }];
        match (step_a, step_b) {
            (1, 1) => vv::<F>(run_a, run_b, d),
            (1, _) => vs::<F>(run_a, run_b[0], d),
            (_, 1) => sv::<F>(run_a[0], run_b, d),
            _ => d.fill(F::apply(run_a[0], run_b[0])),
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
fn vv<F: Binary>(a: &[f32], b: &[f32], dst: &mut [f32]) {
    for ((d, &x), &y) in dst.iter_mut().zip(a).zip(b) {
        *d = F::apply(x, y);
    }
}

#[inline(always)]
fn vs<F: Binary>(a: &[f32], y: f32, dst: &mut [f32]) {
    for (d, &x) in dst.iter_mut().zip(a) {
        *d = F::apply(x, y);
    }
}

#[inline(always)]
fn sv<F: Binary>(x: f32, b: &[f32], dst: &mut [f32]) {
    for (d, &y) in dst.iter_mut().zip(b) {
        *d = F::apply(x, y);
    }
}
