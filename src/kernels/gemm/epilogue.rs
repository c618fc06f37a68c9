//! Activations for the GEMM epilogue, written as branch-free `f32` code that
//! LLVM vectorises inside each target's `#[target_feature]` functions (no
//! libm calls, which would stay scalar).
//!
//! Accuracy (checked against f64 in the tests): `exp` ~2 ulp; sigmoid, tanh and
//! both GELUs within ~4e-7 relative (plus a few 1e-38 absolute near underflow).

use super::Activation;
use crate::kernels::math::{hard_sigmoid, hard_swish, overflow_doubled, stored};
pub(crate) use crate::kernels::math::{Fused, MulAdd, Plain};

/// `e^x` for `f32`, Cephes' `expf` polynomial with Cody-Waite range reduction.
/// Returns +inf above 88.376 (true value up to 3.4e38) and 0 below -87.336
/// (true value subnormal); NaN stays NaN.
#[cfg(test)]
#[inline(always)]
pub(crate) fn exp(x: f32) -> f32 {
    exp_with::<Plain>(x)
}

/// [`exp`] with the polynomial evaluated by `F`.
#[inline(always)]
pub(crate) fn exp_with<F: MulAdd>(x: f32) -> f32 {
    const HI: f32 = 88.376_26;
    const LO: f32 = -87.336_54;
    // Adding 1.5 * 2^23 rounds to an integer, which lands in the low mantissa bits.
    const MAGIC: f32 = 12_582_912.0;
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let xc = x.clamp(LO, HI); // NaN stays NaN
    let t = xc * std::f32::consts::LOG2_E + MAGIC;
    let n = t - MAGIC;
    let r = xc - n * LN2_HI - n * LN2_LO;
    let mut p = 1.987_569_1e-4;
    p = F::madd(p, r, 1.398_199_9e-3);
    p = F::madd(p, r, 8.333_452e-3);
    p = F::madd(p, r, 4.166_579_6e-2);
    p = F::madd(p, r, 0.166_666_65);
    p = F::madd(p, r, 0.5);
    let y = F::madd(p, r * r, r) + 1.0;
    // n is in [-126, 127]: 2^n is a normal float.
    let n_int = t.to_bits().wrapping_sub(MAGIC.to_bits());
    let pow2n = f32::from_bits(n_int.wrapping_add(127) << 23);
    let e = y * pow2n;
    if x > HI {
        f32::INFINITY
    } else if x < LO {
        0.0
    } else {
        e
    }
}

#[cfg(test)]
#[inline(always)]
pub(crate) fn sigmoid(x: f32) -> f32 {
    sigmoid_with::<Plain>(x)
}

#[inline(always)]
pub(crate) fn sigmoid_with<F: MulAdd>(x: f32) -> f32 {
    1.0 / (1.0 + exp_with::<F>(-x))
}

/// Cephes' `tanhf`: an odd polynomial below 0.625, `1 - 2 / (e^2|x| + 1)` above.
#[cfg(test)]
#[inline(always)]
pub(crate) fn tanh(x: f32) -> f32 {
    tanh_with::<Plain>(x)
}

#[inline(always)]
pub(crate) fn tanh_with<F: MulAdd>(x: f32) -> f32 {
    let ax = x.abs();
    let z = x * x;
    let mut p = -5.704_988_7e-3;
    p = F::madd(p, z, 2.063_909e-2);
    p = F::madd(p, z, -5.373_971_6e-2);
    p = F::madd(p, z, 0.133_314_42);
    p = F::madd(p, z, -0.333_332_8);
    let small = F::madd(p * z, x, x);
    let large = (1.0 - 2.0 / (exp_with::<F>(2.0 * ax) + 1.0)).copysign(x);
    if ax < 0.625 {
        small
    } else {
        large
    }
}

/// `x/2 * (1 + erf(x/sqrt 2))` as `x * (1 - h)` for x >= 0 and `x * h` below,
/// with `h = erfc(|x|/sqrt 2) / 2`, so neither side cancels.
///
/// `h = t * E(t) * e^(-x²/2)` with `t = 1 / (1 + |x| / (2 sqrt 2))` (Numerical
/// Recipes' variable for `erfcc`) and `E` a degree-8 polynomial (a weighted
/// least-squares fit of `erfc(z) e^(z²) / (2t)` for z in [0, 10.5], relative
/// error 4e-8). Unlike `erfcc`'s `t * exp(P(t) - z²)`, the exponential does not
/// wait for the division and the polynomial: the two chains run side by side,
/// and the loop, which was bound by their latency, runs 1.6x faster.
#[cfg(test)]
#[inline(always)]
pub(crate) fn gelu_erf(x: f32) -> f32 {
    gelu_erf_with::<Plain>(x)
}

#[inline(always)]
pub(crate) fn gelu_erf_with<F: MulAdd>(x: f32) -> f32 {
    const E: [f32; 9] = [
        -0.029_596_677,
        0.142_591_49,
        -0.244_230_6,
        0.139_756_5,
        -0.013_811_868,
        0.101_555_03,
        0.121_498_29,
        0.141_195_03,
        0.141_042_78,
    ];
    const HALF_FRAC_1_SQRT_2: f32 = 0.353_553_38;
    let t = 1.0 / F::madd(x.abs(), HALF_FRAC_1_SQRT_2, 1.0);
    let p = E[1..].iter().fold(E[0], |p, &c| F::madd(p, t, c));
    let h = (t * p) * exp_with::<F>(-0.5 * (x * x));
    x * if x >= 0.0 { 1.0 - h } else { h }
}

/// `x/2 * (1 + tanh(u))` = `x * sigmoid(2u)`, `u = sqrt(2/pi) * (x + 0.044715 x^3)`.
#[cfg(test)]
#[inline(always)]
pub(crate) fn gelu_tanh(x: f32) -> f32 {
    gelu_tanh_with::<Plain>(x)
}

#[inline(always)]
pub(crate) fn gelu_tanh_with<F: MulAdd>(x: f32) -> f32 {
    const TWO_SQRT_2_OVER_PI: f32 = 1.595_769_2;
    let u2 = TWO_SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x);
    x / (1.0 + exp_with::<F>(-u2))
}

/// `x * sigmoid(x)` as `x / (1 + e^-x)` (see `math::silu`).
#[inline(always)]
pub(crate) fn silu_with<F: MulAdd>(x: f32) -> f32 {
    x / (1.0 + exp_with::<F>(-x))
}

/// Applies `act` to every value of `row` (scalar polynomials; kernels
/// outside the GEMM driver use it on their tiles).
#[inline(always)]
pub(crate) fn activate(act: Activation, row: &mut [f32]) {
    activate_with::<Plain>(act, row)
}

/// [`activate`] with the polynomials evaluated by `F` (kernels outside the
/// GEMM run its FMA builds as `kernels::activate_isa`).
#[inline(always)]
pub(crate) fn activate_with<F: MulAdd>(act: Activation, row: &mut [f32]) {
    match act {
        Activation::None => {}
        // `x < 0 ? 0 : x` keeps NaN, like ONNX's max(x, 0). `stored` (see
        // there) keeps these loops from becoming masked stores.
        Activation::Relu => row
            .iter_mut()
            .for_each(|v| *v = if *v < 0.0 { 0.0 } else { stored(*v) }),
        Activation::LeakyRelu(alpha) => row
            .iter_mut()
            .for_each(|v| *v = if *v < 0.0 { alpha * *v } else { stored(*v) }),
        Activation::Sigmoid => row.iter_mut().for_each(|v| *v = sigmoid_with::<F>(*v)),
        Activation::Tanh => row.iter_mut().for_each(|v| *v = tanh_with::<F>(*v)),
        Activation::GeluErf => row.iter_mut().for_each(|v| *v = gelu_erf_with::<F>(*v)),
        Activation::GeluTanh => row.iter_mut().for_each(|v| *v = gelu_tanh_with::<F>(*v)),
        Activation::GeluErfWritten => row
            .iter_mut()
            .for_each(|v| *v = overflow_doubled(*v, gelu_erf_with::<F>(*v))),
        Activation::GeluTanhWritten => row
            .iter_mut()
            .for_each(|v| *v = overflow_doubled(*v, gelu_tanh_with::<F>(*v))),
        Activation::Clip(lo, hi) => row.iter_mut().for_each(|v| {
            let x = if *v < lo { lo } else { *v };
            *v = if x > hi { hi } else { x };
        }),
        // Activations (issue #13): HardSigmoid and HardSwish are exactly
        // rounded (no FMA), as ORT computes them.
        Activation::HardSigmoid(alpha, beta) => row.iter_mut().for_each(|v| *v = hard_sigmoid(*v, alpha, beta)),
        Activation::HardSwish => row.iter_mut().for_each(|v| *v = hard_swish(*v)),
        Activation::Silu => row.iter_mut().for_each(|v| *v = silu_with::<F>(*v)),
    }
}
