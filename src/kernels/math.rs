//! Vectorisable f32 approximations of `exp`, `tanh`, `erf`, `erfc`, the
//! logistic sigmoid, both GELUs, `sin`/`cos`, softplus and mish.
//!
//! Everything is `#[inline(always)]` straight-line code (selects, no calls,
//! no tables) so that LLVM vectorises the loops that use it for each target.
//! Accuracy against an f64 reference, over the whole f32 range:
//!
//! | function | method | error |
//! |---|---|---|
//! | `exp` | Cephes range reduction (`n·ln2` split hi/lo), degree-6 polynomial, `2^n` built from bits in two halves (subnormal results stay exact-ish) | ≤ 2 ulp |
//! | `tanh` | Cephes `tanhf`: odd polynomial below 0.625, `1 - 2/(e^{2|x|}+1)` above | ≤ 2 ulp |
//! | `erfc` (x ≥ 0) | Numerical Recipes' Chebyshev fit `t·exp(-x² + P(t))`, `t = 1/(1+x/2)`, with `x²` split exactly | ≤ 1.2e-7 relative, plus a few ulp |
//! | `erf` | Taylor series below 0.5, `1 - erfc` above | ≤ 2e-7 relative |
//! | `sigmoid` | `1/(1+e^{-x})` | ≤ 2 ulp |
//! | GELU (erf) | `x/2 · erfc(-x/√2)`, accurate even where `1+erf` cancels | ≤ 3e-7 relative for x > -4; below, rounding `x/√2` costs ~x²·ulp (≤ 1e-6·x²/8) on values under 1e-4 |
//! | GELU (tanh) | `x · sigmoid(2u)`, `u = √(2/π)(x + 0.044715x³)` (= `x/2·(1+tanh u)` without cancellation) | ≤ 3 ulp for x > -2; below, rounding grows like |x|³·ulp (the exponent's size) on values under 1e-3 |
//! | `sin_cos` (\|x\| ≤ 65536) | reduction by π/2 in f64, FreeBSD's double `sindf`/`cosdf` polynomials | ≤ 1 ulp |
//! | `softplus` | `max(x,0) + 2·atanh(s)`, `s = e^-\|x\|/(2 + e^-\|x\|)`, odd series | ≤ 4 ulp |
//! | `mish` | `x·n/(n+2)`, `n = eˣ(eˣ+2)` | ≤ 6 ulp |
//! | activations (issue #13) | ORT's formulas in ORT's order over `exp` (`elu`, `selu`, `celu`, `silu`), or exact selections and products | as `exp`; `eˣ - 1` near 0 costs ~1e-7 absolute |
//!
//! NaN propagates through all of them; `exp` overflows to `inf` above 88.72
//! and underflows to 0 below -103.97. At ±inf they give the limits ORT's
//! CPU EP gives: `erf(±inf) = ±1`, `erfc(inf) = 0`, `tanh(±inf) = ±1`,
//! `sigmoid(±inf) = 1 / 0`, `gelu(inf) = inf` and `gelu(-inf) = NaN` for both
//! GELUs (`-inf · 0`, as in ORT's `x/2 · (1 + erf(x/√2))`).

#![allow(clippy::excessive_precision)] // coefficients as published (Cephes, Numerical Recipes)

pub(crate) const LOG2E: f32 = std::f32::consts::LOG2_E;
/// `ln 2` split so that `n * LN2_HI` is exact for |n| < 2^9.
pub(crate) const LN2_HI: f32 = 0.693_359_4;
pub(crate) const LN2_LO: f32 = -2.121_944_4e-4;
/// 1.5 · 2^23: adding it rounds to an integer held in the low mantissa bits.
pub(crate) const MAGIC: f32 = 12_582_912.0;
/// `exp`'s polynomial in the reduced argument, highest power first (Cephes).
pub(crate) const EXP_POLY: [f32; 6] = [
    1.987_569_1e-4,
    1.398_199_9e-3,
    8.333_452e-3,
    4.166_579_6e-2,
    1.666_666_5e-1,
    5.000_000_1e-1,
];
/// Above this `e^x` is infinite in f32, below the other 0.
pub(crate) const EXP_INF_ABOVE: f32 = 88.722_84;
pub(crate) const EXP_ZERO_BELOW: f32 = -103.972_08;
/// `tanh(x) / x - 1` below 0.625 as a polynomial in `x²` (times `x²`), highest power first.
pub(crate) const TANH_POLY: [f32; 5] = [
    -5.704_988_7e-3,
    2.063_908_9e-2,
    -5.373_971_6e-2,
    1.333_144_2e-1,
    -3.333_328_2e-1,
];

/// How polynomials evaluate `a * b + c`: [`Plain`] (a multiply and an add,
/// for targets without FMA) or [`Fused`] (one FMA; only inside code compiled
/// with FMA enabled, where `mul_add` is an instruction, not a libm call).
/// Fused halves the instructions and the latency of each Horner step.
pub(crate) trait MulAdd {
    fn madd(a: f32, b: f32, c: f32) -> f32;
}

/// `a * b + c` rounded twice.
pub(crate) struct Plain;

impl MulAdd for Plain {
    #[inline(always)]
    fn madd(a: f32, b: f32, c: f32) -> f32 {
        a * b + c
    }
}

/// `a * b + c` rounded once (FMA).
pub(crate) struct Fused;

impl MulAdd for Fused {
    #[inline(always)]
    fn madd(a: f32, b: f32, c: f32) -> f32 {
        a.mul_add(b, c)
    }
}

#[inline(always)]
fn pow2i(n: i32) -> f32 {
    // Valid for n in [-126, 127].
    f32::from_bits(((n + 127) as u32) << 23)
}

/// `e^x`.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    exp_with::<Plain>(x)
}

/// `e^x` as `(p, n)` with `e^x = p · 2^n`: the reduction by `n·ln 2` and
/// the polynomial in the rest, evaluated by `F` (`x` already clamped).
#[inline(always)]
fn exp_parts<F: MulAdd>(xc: f32) -> (f32, i32) {
    let t = F::madd(xc, LOG2E, MAGIC);
    let n = t - MAGIC;
    let ni = (t.to_bits() as i32).wrapping_sub(MAGIC.to_bits() as i32);
    let r = F::madd(-n, LN2_LO, F::madd(-n, LN2_HI, xc));
    let p = EXP_POLY[1..].iter().fold(EXP_POLY[0], |p, &c| F::madd(p, r, c));
    (F::madd(p * r, r, r) + 1.0, ni)
}

/// [`exp`] with the reduction and the polynomial evaluated by `F`.
#[inline(always)]
pub(crate) fn exp_with<F: MulAdd>(x: f32) -> f32 {
    // `clamp` keeps NaN as NaN.
    let (p, ni) = exp_parts::<F>(x.clamp(-104.0, 89.0));
    // 2^n in two factors so that results down to the subnormals are right.
    let n1 = ni >> 1;
    let y = p * pow2i(n1) * pow2i(ni - n1);
    if x > EXP_INF_ABOVE {
        f32::INFINITY
    } else if x < EXP_ZERO_BELOW {
        0.0
    } else {
        y
    }
}

/// [`exp_with`] for arguments `x <= 0` (or NaN), as a softmax's shifted
/// ones are: no overflow side, and `2^n` as one power of two instead of
/// two, so results under 2^-126 (x < -87.34) are 0 where [`exp_with`] gives
/// subnormals (at most 1.2e-38 apart); every other result is the same bits.
#[inline(always)]
pub(crate) fn exp_nonpositive_with<F: MulAdd>(x: f32) -> f32 {
    // ln(2^-126): from here on 2^n is a normal float.
    const NORMAL_FROM: f32 = -87.336_54;
    // A select that keeps NaN as NaN.
    let (p, ni) = exp_parts::<F>(if x < NORMAL_FROM { NORMAL_FROM } else { x });
    let y = p * pow2i(ni);
    if x < NORMAL_FROM {
        0.0
    } else {
        y
    }
}

/// `x`, as a value the compiler must compute: `x + 0`, which is `x` except
/// that -0 becomes +0 (as in `max(x, 0)`). Given `*v = if c { y } else { *v }`
/// LLVM stores only where `c` holds, with AVX2's masked store, which is
/// microcoded on AMD CPUs: Relu ran at 1.7 cycles per value on a Zen 3, 0.3
/// with `else { stored(*v) }`.
#[inline(always)]
pub(crate) fn stored(x: f32) -> f32 {
    x + 0.0
}

/// Hyperbolic tangent.
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    let a = x.abs();
    let z = x * x;
    let q = TANH_POLY[1..].iter().fold(TANH_POLY[0], |q, &c| q * z + c);
    let small = q * z * x + x;
    let e = exp(2.0 * a);
    let big = (1.0 - 2.0 / (e + 1.0)).copysign(x);
    if a < 0.625 {
        small
    } else {
        big
    }
}

/// Where `erfc` has underflowed to 0 in f32 (erfc(10.5) ≈ 7e-50).
const ERFC_ZERO_AT: f32 = 10.5;

/// `erfc(x)` for `x >= 0` (Numerical Recipes `erfcc`).
#[inline(always)]
fn erfc_pos(z: f32) -> f32 {
    // Clamped (a branch-free select that keeps NaN) so that `z = inf` gives
    // exactly 0 instead of `inf - inf` = NaN in the split of z² below.
    let z = if z > ERFC_ZERO_AT { ERFC_ZERO_AT } else { z };
    let t = 1.0 / (1.0 + 0.5 * z);
    let poly = -1.265_512_2
        + t * (1.000_023_7
            + t * (0.374_091_96
                + t * (0.096_784_18
                    + t * (-0.186_288_06
                        + t * (0.278_868_07
                            + t * (-1.135_203_9 + t * (1.488_515_9 + t * (-0.822_152_2 + t * 0.170_872_77))))))));
    // -z² in two parts: `zh²` is exact (12-bit zh), so large z keep full
    // relative accuracy instead of inheriting the rounding of z·z.
    let zh = f32::from_bits(z.to_bits() & 0xffff_f000);
    let zl = z - zh;
    t * exp(-zh * zh) * exp(-(zl * (z + zh)) + poly)
}

/// Complementary error function.
#[inline(always)]
pub fn erfc(x: f32) -> f32 {
    let e = erfc_pos(x.abs());
    if x < 0.0 {
        2.0 - e
    } else {
        e
    }
}

/// Error function.
#[inline(always)]
pub fn erf(x: f32) -> f32 {
    const TWO_OVER_SQRT_PI: f32 = std::f32::consts::FRAC_2_SQRT_PI;
    let z = x * x;
    let series = TWO_OVER_SQRT_PI
        * x
        * (1.0 + z * (-1.0 / 3.0 + z * (1.0 / 10.0 + z * (-1.0 / 42.0 + z * (1.0 / 216.0 + z * (-1.0 / 1320.0))))));
    let big = (1.0 - erfc_pos(x.abs())).copysign(x);
    if x.abs() < 0.5 {
        series
    } else {
        big
    }
}

/// Logistic sigmoid `1 / (1 + e^-x)`.
#[inline(always)]
pub fn sigmoid(x: f32) -> f32 {
    1.0 / (1.0 + exp(-x))
}

/// `x/2 · (1 + erf(x/√2))`.
#[inline(always)]
pub fn gelu(x: f32) -> f32 {
    0.5 * x * erfc(-x * std::f32::consts::FRAC_1_SQRT_2)
}

/// `x/2 · (1 + tanh(√(2/π)·(x + 0.044715·x³)))`.
#[inline(always)]
pub fn gelu_tanh(x: f32) -> f32 {
    const SQRT_2_OVER_PI: f32 = 0.797_884_6;
    let u = SQRT_2_OVER_PI * (x + 0.044_715 * x * x * x);
    x / (1.0 + exp(-2.0 * u))
}

/// `y` (a GELU of `x`), or `+inf` where `x·2` overflows: a GELU written as
/// `(x·(1 + erf(…)))·0.5` doubles `x` before halving it (a branch-free select).
#[inline(always)]
pub fn overflow_doubled(x: f32, y: f32) -> f32 {
    if x > f32::MAX / 2.0 {
        f32::INFINITY
    } else {
        y
    }
}

/// Below this magnitude [`sin_cos`] reduces by π/2 in double precision
/// exactly enough; callers use libm above it (and for NaN and ±inf).
pub const SIN_COS_LIMIT: f32 = 65_536.0;

/// `sin(x)` (`cos(x)` when `cos`) for `|x| ≤ SIN_COS_LIMIT`: FreeBSD's
/// `sinf`/`cosf` scheme, branch-free. The argument is reduced by π/2 in
/// double (`k·PIO2_HI` is exact for `|k| < 2^20`), and the kernels are the
/// double minimax polynomials of FreeBSD's `__kernel_sindf`/`__kernel_cosdf`
/// on `[-π/4, π/4]`: within 1 ulp of the true value (libm's own accuracy).
#[inline(always)]
pub fn sin_cos(x: f32, cos: bool) -> f32 {
    const FRAC_2_PI: f64 = std::f64::consts::FRAC_2_PI;
    const PIO2_HI: f64 = 1.570_796_326_734_125_614_17;
    const PIO2_LO: f64 = 6.077_100_506_506_192_249_32e-11;
    const S1: f64 = -0.166_666_666_416_265_235_595;
    const S2: f64 = 0.008_333_329_385_889_463_175_6;
    const S3: f64 = -0.000_198_393_348_360_966_317_347;
    const S4: f64 = 0.000_002_718_311_493_989_821_906_4;
    const C0: f64 = -0.499_999_997_251_031_003_12;
    const C1: f64 = 0.041_666_623_323_739_063_189_4;
    const C2: f64 = -0.001_388_676_377_460_992_946_92;
    const C3: f64 = 0.000_024_390_448_796_277_409_065_4;
    // 1.5·2^52: adding it rounds to an integer held in the low mantissa bits
    // (vectorises, where an f64 → i64 conversion would not on AVX2).
    const MAGIC52: f64 = 6_755_399_441_055_744.0;
    let xd = x as f64;
    let t = xd * FRAC_2_PI + MAGIC52;
    let k = t - MAGIC52;
    let r = xd - k * PIO2_HI - k * PIO2_LO;
    let z = r * r;
    let w = z * z;
    let s = z * r;
    let sin_r = (r + s * (S1 + z * S2)) + s * w * (S3 + z * S4);
    let cos_r = ((1.0 + z * C0) + w * C1) + (w * z) * (C2 + z * C3);
    // cos(x) = sin(x + π/2): one more quadrant.
    let q = (t.to_bits() + u64::from(cos)) & 3;
    let v = if q & 1 == 0 { sin_r } else { cos_r };
    (if q & 2 == 0 { v } else { -v }) as f32
}

/// `ln(1 + eˣ)` as `max(x, 0) + log1p(e^-|x|)`, with `log1p(y) = 2·atanh(s)`,
/// `s = y/(2 + y) ≤ 1/3`, summed as its odd series to s¹⁷ (≤ 3 ulp, exact
/// for the tiny `y` of very negative `x`). NaN stays NaN.
#[inline(always)]
pub fn softplus(x: f32) -> f32 {
    let y = exp(-x.abs());
    let s = y / (2.0 + y);
    let z = s * s;
    let series =
        ((((((((z / 17.0 + 1.0 / 15.0) * z + 1.0 / 13.0) * z + 1.0 / 11.0) * z + 1.0 / 9.0) * z + 1.0 / 7.0) * z
            + 1.0 / 5.0)
            * z
            + 1.0 / 3.0)
            * z)
            + 1.0;
    let pos = if x > 0.0 { x } else { 0.0 };
    pos + 2.0 * s * series
}

/// `x·tanh(ln(1 + eˣ))` as `x·n/(n + 2)`, `n = eˣ(eˣ + 2)` (the same
/// value without a logarithm); `x` itself above 20, where the ratio is 1.
#[inline(always)]
pub fn mish(x: f32) -> f32 {
    let e = exp(x.min(20.0));
    let n = e * (e + 2.0);
    let y = x * (n / (n + 2.0));
    if x > 20.0 {
        x
    } else {
        y
    }
}

// Activations (issue #13): ORT's formulas, in ORT's order of operations,
// so that the exactly rounded ones (HardSigmoid, HardSwish, the selections)
// give its bits and the others stay within exp's few ulp.

/// `max(0, min(1, alpha·x + beta))` (NaN stays NaN; no FMA, as ORT).
#[inline(always)]
pub fn hard_sigmoid(x: f32, alpha: f32, beta: f32) -> f32 {
    let y = alpha * x + beta;
    let y = if y > 1.0 { 1.0 } else { y };
    if y < 0.0 {
        0.0
    } else {
        y
    }
}

/// `x·hard_sigmoid(x, 1/6, 1/2)`: `-inf` gives NaN (`-inf·0`), as ORT.
#[inline(always)]
pub fn hard_swish(x: f32) -> f32 {
    x * hard_sigmoid(x, 1.0 / 6.0, 0.5)
}

/// `x·sigmoid(x)` as `x / (1 + e^-x)`: one rounding fewer, and `-inf`
/// gives NaN (`-inf / inf`) like the product does.
#[inline(always)]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + exp(-x))
}

/// `x ≥ 0 ? x : alpha·(eˣ - 1)` (-0 stays -0, as ORT).
#[inline(always)]
pub fn elu(x: f32, alpha: f32) -> f32 {
    let neg = alpha * (exp(x) - 1.0);
    if x >= 0.0 {
        x
    } else {
        neg
    }
}

/// `x > 0 ? gamma·x : alpha·gamma·(eˣ - 1)` (-0 gives +0, as ORT).
#[inline(always)]
pub fn selu(x: f32, alpha: f32, gamma: f32) -> f32 {
    let neg = (alpha * gamma) * (exp(x) - 1.0);
    if x > 0.0 {
        gamma * x
    } else {
        neg
    }
}

/// `max(0, x) + min(0, alpha·(e^(x/alpha) - 1))`, NaN propagating.
#[inline(always)]
pub fn celu(x: f32, alpha: f32) -> f32 {
    let pos = if x > 0.0 { x } else { 0.0 };
    let neg = alpha * (exp(x / alpha) - 1.0);
    // `neg > 0 ? 0 : neg` keeps NaN (a min that propagates it).
    pos + if neg > 0.0 { 0.0 } else { neg }
}

/// `x > alpha ? x : 0`; NaN gives 0 (a failed comparison), as ORT.
#[inline(always)]
pub fn thresholded_relu(x: f32, alpha: f32) -> f32 {
    if x > alpha {
        x
    } else {
        0.0
    }
}

/// `x / (1 + |x|)`: ±inf give NaN (`inf / inf`), as ORT.
#[inline(always)]
pub fn softsign(x: f32) -> f32 {
    x / (1.0 + x.abs())
}

/// `x < 0 ? x·slope : x` (-0 stays -0; NaN stays NaN).
#[inline(always)]
pub fn prelu(x: f32, slope: f32) -> f32 {
    if x < 0.0 {
        x * slope
    } else {
        x
    }
}

/// High-accuracy f64 references for tests (series + continued fraction).
#[cfg(test)]
pub(crate) mod reference {
    pub fn erf(x: f64) -> f64 {
        if x.abs() < 3.0 {
            // Maclaurin series; at |x| < 3 the cancellation costs ~3 digits.
            let (mut sum, mut term, mut n) = (x, x, 0.0);
            loop {
                n += 1.0;
                term *= -x * x / n;
                let add = term / (2.0 * n + 1.0);
                sum += add;
                if add.abs() <= 1e-17 * sum.abs() {
                    break;
                }
            }
            sum * 2.0 / std::f64::consts::PI.sqrt()
        } else {
            (1.0 - erfc_big(x.abs())).copysign(x)
        }
    }

    pub fn erfc(x: f64) -> f64 {
        if x >= 3.0 {
            erfc_big(x)
        } else {
            1.0 - erf(x)
        }
    }

    /// Continued fraction for x >= 3.
    fn erfc_big(x: f64) -> f64 {
        let mut f = x;
        for k in (1..80).rev() {
            f = x + (k as f64 / 2.0) / f;
        }
        (-x * x).exp() / std::f64::consts::PI.sqrt() / f
    }

    pub fn gelu(x: f64) -> f64 {
        0.5 * x * erfc(-x / std::f64::consts::SQRT_2)
    }

    pub fn gelu_tanh(x: f64) -> f64 {
        let u = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
        // 1 + tanh(u) = 2 / (1 + e^-2u), without f64 cancellation.
        x / (1.0 + (-2.0 * u).exp())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grid() -> Vec<f32> {
        let mut v: Vec<f32> = (-4000..=4000).map(|i| i as f32 / 400.0).collect();
        v.extend([
            1e-3, -1e-3, 1e-6, -1e-7, 0.0, -0.0, 0.624, 0.626, 0.499, 0.501, 30.0, -30.0,
        ]);
        v
    }

    fn rel(got: f32, want: f64) -> f64 {
        if want == 0.0 {
            got.abs() as f64
        } else {
            ((got as f64 - want) / want).abs()
        }
    }

    #[test]
    fn exp_is_within_two_ulp() {
        // Plain, and fused as the FMA builds run it (mul_add is exact here too).
        for (name, exp) in [
            ("plain", exp_with::<Plain> as fn(f32) -> f32),
            ("fused", exp_with::<Fused>),
        ] {
            for i in -10400..=8870 {
                let x = i as f32 / 100.0;
                let want = (x as f64).exp();
                let got = exp(x);
                if want < f32::MIN_POSITIVE as f64 {
                    assert!(
                        (got as f64 - want).abs() <= 2.0 * 1.4e-45,
                        "{name} exp({x}) = {got}, want {want}"
                    );
                } else {
                    assert!(rel(got, want) <= 2.5e-7, "{name} exp({x}) = {got}, want {want}");
                }
            }
            assert_eq!(exp(100.0), f32::INFINITY);
            assert_eq!(exp(-200.0), 0.0);
            assert_eq!(exp(f32::NEG_INFINITY), 0.0);
            assert_eq!(exp(f32::INFINITY), f32::INFINITY);
            assert!(exp(f32::NAN).is_nan());
        }
    }

    #[test]
    fn exp_of_nonpositive_arguments_is_exp_without_subnormals() {
        // Every f32 in [-104, 0] a few ulp apart, both MulAdd forms.
        let mut x = -0.0f32;
        let mut checked = 0;
        while x >= -104.0 {
            for (got, want) in [
                (exp_nonpositive_with::<Plain>(x), exp_with::<Plain>(x)),
                (exp_nonpositive_with::<Fused>(x), exp_with::<Fused>(x)),
            ] {
                if want >= f32::MIN_POSITIVE {
                    assert_eq!(got.to_bits(), want.to_bits(), "exp({x})");
                } else {
                    assert_eq!(got, 0.0, "exp({x}) = {want} flushes to 0");
                }
            }
            checked += 1;
            x = f32::from_bits(x.to_bits() + 997);
        }
        assert!(checked > 100_000, "{checked}");
        assert_eq!(exp_nonpositive_with::<Fused>(f32::NEG_INFINITY), 0.0);
        assert!(exp_nonpositive_with::<Fused>(f32::NAN).is_nan());
        assert!(exp_nonpositive_with::<Plain>(-87.336_54) >= f32::MIN_POSITIVE);
        assert_eq!(exp_nonpositive_with::<Plain>(-87.4), 0.0);
    }

    #[test]
    fn tanh_sigmoid_erf_gelu_accuracy() {
        for x in grid() {
            let xd = x as f64;
            assert!(rel(tanh(x), xd.tanh()) <= 3e-7, "tanh({x}) = {}", tanh(x));
            let s = 1.0 / (1.0 + (-xd).exp());
            assert!(rel(sigmoid(x), s) <= 3e-7, "sigmoid({x})");
            assert!(rel(erf(x), reference::erf(xd)) <= 3e-7, "erf({x}) = {}", erf(x));
            let want = reference::erfc(xd);
            let subnormal = want < f32::MIN_POSITIVE as f64 && (erfc(x) as f64 - want).abs() < 1e-44;
            assert!(
                rel(erfc(x), want) <= 1.5e-6 || subnormal,
                "erfc({x}) = {}, want {want}",
                erfc(x)
            );
            let g = reference::gelu(xd);
            // Rounding x/√2 costs ~x²·ulp where erfc is steep (x < -4, |GELU| < 1e-4).
            let tol = 1e-6 * (xd * xd / 8.0).max(1.0);
            let e = (gelu(x) as f64 - g).abs();
            assert!(e <= tol * g.abs() || e < 1e-44, "gelu({x}) = {}, want {g}", gelu(x));
            let g = reference::gelu_tanh(xd);
            // Here the exponent grows like x³: so does the effect of rounding.
            let tol3 = 1e-6 * (xd.abs().powi(3) / 8.0).max(1.0);
            let e = (gelu_tanh(x) as f64 - g).abs() / g.abs().max(1e-300);
            assert!(
                e <= tol3 || g.abs() < 1e-35,
                "gelu_tanh({x}) = {} want {g}: {e}",
                gelu_tanh(x)
            );
        }
        for f in [tanh, sigmoid, erf, erfc, gelu, gelu_tanh] {
            assert!(f(f32::NAN).is_nan());
        }
        assert_eq!(tanh(f32::INFINITY), 1.0);
        assert_eq!(tanh(-100.0), -1.0);
        assert_eq!(erf(10.0), 1.0);
        assert_eq!(gelu(-100.0), -0.0);
        assert_eq!(sigmoid(-1000.0), 0.0);
    }

    #[test]
    fn reference_erf_is_sane() {
        assert!((reference::erf(1.0) - 0.842_700_792_949_714_9).abs() < 1e-15);
        assert!((reference::erfc(4.0) - 1.541_725_790_028_002e-8).abs() < 1e-20);
        assert!((reference::erf(-0.3) + 0.328_626_759_459_127_4).abs() < 1e-15);
    }
}
