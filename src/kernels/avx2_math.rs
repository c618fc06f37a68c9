//! `exp`, sigmoid, tanh and SiLU over rows on AVX2 + FMA (8 lanes, two
//! vectors per loop iteration) and AVX-512 (16 lanes, the same operations,
//! four vectors per iteration, tanh two).
//!
//! The portable loops (`math::exp` and friends in `elementwise::unary` and
//! the recurrent gates) vectorise to one 8-lane vector per iteration, and
//! each value's `exp` is a chain of ~20 dependent operations multiplied and
//! added apart. Here two independent vectors are in flight at once (four
//! spilled registers and ran no faster), and the polynomials use FMA. On a
//! Zen 3, 8192 values in cache: `Exp` 0.98 → 0.69 ns per value, `Sigmoid`
//! 1.19 → 0.82-0.91, `Tanh` 1.61 → 1.35, SiLU 1.20 → 0.83. ORT's CPU EP
//! is still faster on these ops alone (on 1M values through a session,
//! Exp 0.52 against 0.79, Sigmoid 0.36 against 0.96, Tanh 0.44 against
//! 1.56 ns per value: MLAS's own kernels use fewer operations).
//!
//! Each lane computes exactly what [`math::exp_with`] with fused
//! multiply-adds computes (and the sigmoid, tanh and SiLU built on it as in
//! `math`): the same operations in the same order, checked bit for bit by
//! the tests below.

use std::arch::x86_64::*;

use super::math::{EXP_INF_ABOVE, EXP_POLY, EXP_ZERO_BELOW, LN2_HI, LN2_LO, LOG2E, MAGIC, TANH_POLY};
use super::Isa;
use crate::target::Target;

/// The functions this module computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Fun {
    Exp,
    Sigmoid,
    Tanh,
    Silu,
}

// The helpers are `#[inline(always)]` without target features (Rust refuses
// both on one function) and `unsafe` for it: they are only ever inlined into
// `run`, which has AVX2 and FMA, so that the two vectors' operations
// interleave instead of costing a call each.

/// # Safety
/// AVX2 and FMA available (as for every helper below).
#[inline(always)]
unsafe fn splat(c: f32) -> __m256 {
    // SAFETY: the caller's CPU.
    unsafe { _mm256_set1_ps(c) }
}

/// `2^n` for `n` in [-126, 127], per lane (`math::pow2i`).
#[inline(always)]
unsafe fn pow2i(n: __m256i) -> __m256 {
    // SAFETY: the caller's CPU.
    unsafe { _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(n, _mm256_set1_epi32(127)))) }
}

/// `math::exp_with::<Fused>`, lane by lane, on 8 or 16 lanes.
#[inline(always)]
unsafe fn exp_v<V: Lanes>(x: V) -> V {
    // SAFETY: the caller's CPU; register operations only.
    unsafe {
        // clamp(x, -104, 89) keeping NaN: max/min return their second
        // operand when one is NaN.
        let xc = V::splat(89.0).min(V::splat(-104.0).max(x));
        let t = xc.fmadd(V::splat(LOG2E), V::splat(MAGIC));
        let n = t.sub(V::splat(MAGIC));
        // fma(-n, c, x) is fnmadd(n, c, x): negating is exact.
        let r = n.fnmadd(V::splat(LN2_LO), n.fnmadd(V::splat(LN2_HI), xc));
        let mut p = V::splat(EXP_POLY[0]);
        for &c in &EXP_POLY[1..] {
            p = p.fmadd(r, V::splat(c));
        }
        let p = p.mul(r).fmadd(r, r).add(V::splat(1.0));
        let (s1, s2) = t.pow2_halves();
        let y = p.mul(s1).mul(s2);
        y.inf_where_above(x, EXP_INF_ABOVE).zero_where_below(x, EXP_ZERO_BELOW)
    }
}

/// `x / (1 + e^-x)`: sigmoid for `x = 1`, SiLU for `x = x` (`math::sigmoid`, `math::silu`).
#[inline(always)]
unsafe fn over_one_plus_exp_neg<V: Lanes>(num: V, x: V) -> V {
    // SAFETY: the caller's CPU; register operations only.
    unsafe { num.div(V::splat(1.0).add(exp_v(x.neg()))) }
}

/// Largest `-x` whose `e^-x` [`store_den`] computes; above it the
/// denominator is `inf` (as `exp8`'s above `EXP_INF_ABOVE`, a hair higher).
const STORE_EXP_MAX: f32 = 88.72;

/// `1 + e^-x` for the convolution store's SiLU and sigmoid, a shorter
/// dependency chain than [`exp8`]'s (the store runs 12 of them at once,
/// and out-of-order execution overlaps only a few long chains): the same
/// reduction and polynomial, evaluated by Estrin's scheme instead of
/// Horner's, and one power of two instead of two (`-x` is clamped to
/// [-86, 88.72], where `2^(n-1)` is normal; the polynomial gives `2·e^r`).
/// On a Zen 3 SiLU went from 0.86 to 0.66 ns per value in registers. Not
/// bit for bit [`exp8`]'s: within 2e-7 relative of SiLU and the sigmoid
/// (the test below), where `exp8` is the unary ops' reference.
///
/// Generic over the vector width ([`Lanes`]): the AVX-512 convolution's
/// store computes the same operations 16 lanes at a time.
#[inline(always)]
unsafe fn store_den<V: Lanes>(x: V) -> V {
    // SAFETY: the caller's CPU; register operations only.
    unsafe {
        let xn = x.neg();
        // max/min return their second operand (xn) when it is NaN.
        let xc = V::splat(STORE_EXP_MAX).min(V::splat(-86.0).max(xn));
        let t = xc.fmadd(V::splat(LOG2E), V::splat(MAGIC));
        let n = t.sub(V::splat(MAGIC));
        let r = n.fnmadd(V::splat(LN2_LO), n.fnmadd(V::splat(LN2_HI), xc));
        let (r2, r_twice) = (r.mul(r), r.add(r));
        let r4 = r2.mul(r2);
        // EXP_POLY is highest power first: q(r) = Σ EXP_POLY[5 - k]·r^k.
        let b0 = V::splat(EXP_POLY[4]).fmadd(r, V::splat(EXP_POLY[5]));
        let b1 = V::splat(EXP_POLY[2]).fmadd(r, V::splat(EXP_POLY[3]));
        let b2 = V::splat(EXP_POLY[0]).fmadd(r, V::splat(EXP_POLY[1]));
        let q = b2.fmadd(r4, b1.fmadd(r2, b0));
        // 2·e^r = 2 + 2r + 2r²·q.
        let p2 = q.fmadd(r2.add(r2), r_twice).add(V::splat(2.0));
        // 2^(n-1): t's bits hold n + MAGIC's.
        let scale = t.exponent_bits(126 - MAGIC.to_bits() as i32);
        let d = p2.fmadd(scale, V::splat(1.0));
        d.inf_where_above(xn, STORE_EXP_MAX)
    }
}

/// The operations [`store_den`] and the rows of `run_lanes!` need, on 8
/// (AVX2) or 16 (AVX-512) lanes: one to three instructions each.
pub(super) trait Lanes: Copy {
    unsafe fn splat(c: f32) -> Self;
    unsafe fn add(self, b: Self) -> Self;
    unsafe fn sub(self, b: Self) -> Self;
    unsafe fn mul(self, b: Self) -> Self;
    unsafe fn div(self, b: Self) -> Self;
    /// The hardware's reciprocal estimate of `self` (finite, nonzero).
    unsafe fn rcp_estimate(self) -> Self;
    unsafe fn min(self, b: Self) -> Self;
    unsafe fn max(self, b: Self) -> Self;
    /// `self·b + c`, rounded once.
    unsafe fn fmadd(self, b: Self, c: Self) -> Self;
    /// `c - self·b`, rounded once.
    unsafe fn fnmadd(self, b: Self, c: Self) -> Self;
    /// The sign bit flipped.
    unsafe fn neg(self) -> Self;
    /// The float whose bits are `(bits(self) + bias) << 23`.
    unsafe fn exponent_bits(self, bias: i32) -> Self;
    /// `inf` in the lanes where `x > limit`, else `self`.
    unsafe fn inf_where_above(self, x: Self, limit: f32) -> Self;
    /// 0 in the lanes where `x < limit`, else `self`.
    unsafe fn zero_where_below(self, x: Self, limit: f32) -> Self;
    /// `then` in the lanes where `a < limit`, else `self`.
    unsafe fn where_below(self, a: Self, limit: f32, then: Self) -> Self;
    /// `|self|`.
    unsafe fn abs(self) -> Self;
    /// `|self|` with the sign of `s`.
    unsafe fn copysign(self, s: Self) -> Self;
    /// For `self = n + MAGIC` (an integer `n` in its low mantissa bits):
    /// `2^(n >> 1)` and `2^(n - (n >> 1))`, as `math::exp_with` splits `2^n`.
    unsafe fn pow2_halves(self) -> (Self, Self);
    /// Lanes read from `p`.
    unsafe fn load(p: *const f32) -> Self;
    /// Lanes written to `p`.
    unsafe fn store(self, p: *mut f32);
    /// How many lanes.
    const N: usize;
}

impl Lanes for __m256 {
    #[inline(always)]
    unsafe fn splat(c: f32) -> Self {
        // SAFETY (all methods): AVX2 and FMA, the callers' contract.
        unsafe { _mm256_set1_ps(c) }
    }
    #[inline(always)]
    unsafe fn add(self, b: Self) -> Self {
        unsafe { _mm256_add_ps(self, b) }
    }
    #[inline(always)]
    unsafe fn sub(self, b: Self) -> Self {
        unsafe { _mm256_sub_ps(self, b) }
    }
    #[inline(always)]
    unsafe fn mul(self, b: Self) -> Self {
        unsafe { _mm256_mul_ps(self, b) }
    }
    #[inline(always)]
    unsafe fn div(self, b: Self) -> Self {
        unsafe { _mm256_div_ps(self, b) }
    }
    #[inline(always)]
    unsafe fn rcp_estimate(self) -> Self {
        unsafe { _mm256_rcp_ps(self) }
    }
    #[inline(always)]
    unsafe fn min(self, b: Self) -> Self {
        unsafe { _mm256_min_ps(self, b) }
    }
    #[inline(always)]
    unsafe fn max(self, b: Self) -> Self {
        unsafe { _mm256_max_ps(self, b) }
    }
    #[inline(always)]
    unsafe fn fmadd(self, b: Self, c: Self) -> Self {
        unsafe { _mm256_fmadd_ps(self, b, c) }
    }
    #[inline(always)]
    unsafe fn fnmadd(self, b: Self, c: Self) -> Self {
        unsafe { _mm256_fnmadd_ps(self, b, c) }
    }
    #[inline(always)]
    unsafe fn neg(self) -> Self {
        unsafe { _mm256_xor_ps(self, splat(-0.0)) }
    }
    #[inline(always)]
    unsafe fn exponent_bits(self, bias: i32) -> Self {
        unsafe {
            _mm256_castsi256_ps(_mm256_slli_epi32::<23>(_mm256_add_epi32(
                _mm256_castps_si256(self),
                _mm256_set1_epi32(bias),
            )))
        }
    }
    #[inline(always)]
    unsafe fn inf_where_above(self, x: Self, limit: f32) -> Self {
        unsafe { _mm256_blendv_ps(self, splat(f32::INFINITY), _mm256_cmp_ps::<_CMP_GT_OQ>(x, splat(limit))) }
    }
    #[inline(always)]
    unsafe fn zero_where_below(self, x: Self, limit: f32) -> Self {
        unsafe { _mm256_blendv_ps(self, _mm256_setzero_ps(), _mm256_cmp_ps::<_CMP_LT_OQ>(x, splat(limit))) }
    }
    #[inline(always)]
    unsafe fn where_below(self, a: Self, limit: f32, then: Self) -> Self {
        unsafe { _mm256_blendv_ps(self, then, _mm256_cmp_ps::<_CMP_LT_OQ>(a, splat(limit))) }
    }
    #[inline(always)]
    unsafe fn abs(self) -> Self {
        unsafe { _mm256_andnot_ps(splat(-0.0), self) }
    }
    #[inline(always)]
    unsafe fn copysign(self, s: Self) -> Self {
        let sign = unsafe { splat(-0.0) };
        unsafe { _mm256_or_ps(_mm256_andnot_ps(sign, self), _mm256_and_ps(sign, s)) }
    }
    #[inline(always)]
    unsafe fn pow2_halves(self) -> (Self, Self) {
        unsafe {
            let ni = _mm256_sub_epi32(_mm256_castps_si256(self), _mm256_set1_epi32(MAGIC.to_bits() as i32));
            let n1 = _mm256_srai_epi32::<1>(ni);
            (pow2i(n1), pow2i(_mm256_sub_epi32(ni, n1)))
        }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        unsafe { _mm256_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        unsafe { _mm256_storeu_ps(p, self) }
    }
    const N: usize = 8;
}

impl Lanes for __m512 {
    #[inline(always)]
    unsafe fn splat(c: f32) -> Self {
        // SAFETY (all methods): AVX-512F, the callers' contract.
        unsafe { _mm512_set1_ps(c) }
    }
    #[inline(always)]
    unsafe fn add(self, b: Self) -> Self {
        unsafe { _mm512_add_ps(self, b) }
    }
    #[inline(always)]
    unsafe fn sub(self, b: Self) -> Self {
        unsafe { _mm512_sub_ps(self, b) }
    }
    #[inline(always)]
    unsafe fn mul(self, b: Self) -> Self {
        unsafe { _mm512_mul_ps(self, b) }
    }
    #[inline(always)]
    unsafe fn div(self, b: Self) -> Self {
        unsafe { _mm512_div_ps(self, b) }
    }
    #[inline(always)]
    unsafe fn rcp_estimate(self) -> Self {
        unsafe { _mm512_rcp14_ps(self) }
    }
    #[inline(always)]
    unsafe fn min(self, b: Self) -> Self {
        unsafe { _mm512_min_ps(self, b) }
    }
    #[inline(always)]
    unsafe fn max(self, b: Self) -> Self {
        unsafe { _mm512_max_ps(self, b) }
    }
    #[inline(always)]
    unsafe fn fmadd(self, b: Self, c: Self) -> Self {
        unsafe { _mm512_fmadd_ps(self, b, c) }
    }
    #[inline(always)]
    unsafe fn fnmadd(self, b: Self, c: Self) -> Self {
        unsafe { _mm512_fnmadd_ps(self, b, c) }
    }
    #[inline(always)]
    unsafe fn neg(self) -> Self {
        unsafe { _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(self), _mm512_set1_epi32(i32::MIN))) }
    }
    #[inline(always)]
    unsafe fn exponent_bits(self, bias: i32) -> Self {
        unsafe {
            _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(
                _mm512_castps_si512(self),
                _mm512_set1_epi32(bias),
            )))
        }
    }
    #[inline(always)]
    unsafe fn inf_where_above(self, x: Self, limit: f32) -> Self {
        unsafe {
            let above = _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, _mm512_set1_ps(limit));
            _mm512_mask_blend_ps(above, self, _mm512_set1_ps(f32::INFINITY))
        }
    }
    #[inline(always)]
    unsafe fn zero_where_below(self, x: Self, limit: f32) -> Self {
        unsafe {
            let below = _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, _mm512_set1_ps(limit));
            _mm512_mask_blend_ps(below, self, _mm512_setzero_ps())
        }
    }
    #[inline(always)]
    unsafe fn where_below(self, a: Self, limit: f32, then: Self) -> Self {
        unsafe { _mm512_mask_blend_ps(_mm512_cmp_ps_mask::<_CMP_LT_OQ>(a, _mm512_set1_ps(limit)), self, then) }
    }
    #[inline(always)]
    unsafe fn abs(self) -> Self {
        unsafe { _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(self), _mm512_set1_epi32(i32::MAX))) }
    }
    #[inline(always)]
    unsafe fn copysign(self, s: Self) -> Self {
        unsafe {
            let (a, b) = (_mm512_castps_si512(self), _mm512_castps_si512(s));
            let (magnitude, sign) = (_mm512_set1_epi32(i32::MAX), _mm512_set1_epi32(i32::MIN));
            _mm512_castsi512_ps(_mm512_or_si512(
                _mm512_and_si512(a, magnitude),
                _mm512_and_si512(b, sign),
            ))
        }
    }
    #[inline(always)]
    unsafe fn pow2_halves(self) -> (Self, Self) {
        unsafe {
            let ni = _mm512_sub_epi32(_mm512_castps_si512(self), _mm512_set1_epi32(MAGIC.to_bits() as i32));
            let n1 = _mm512_srai_epi32::<1>(ni);
            let pow2 =
                |n: __m512i| _mm512_castsi512_ps(_mm512_slli_epi32::<23>(_mm512_add_epi32(n, _mm512_set1_epi32(127))));
            (pow2(n1), pow2(_mm512_sub_epi32(ni, n1)))
        }
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        unsafe { _mm512_loadu_ps(p) }
    }
    #[inline(always)]
    unsafe fn store(self, p: *mut f32) {
        unsafe { _mm512_storeu_ps(p, self) }
    }
    const N: usize = 16;
}

/// SiLU for the direct convolution's store ([`store_den`]).
///
/// # Safety
/// AVX2 and FMA available.
#[inline(always)]
pub(super) unsafe fn silu8_store(x: __m256) -> __m256 {
    // SAFETY: the caller's CPU.
    unsafe { silu_store(x) }
}

/// SiLU for the direct convolution's store ([`store_den`]), 8 or 16 lanes.
///
/// # Safety
/// The CPU has the vector's instructions (AVX2 and FMA, or AVX-512F).
#[inline(always)]
pub(super) unsafe fn silu_store<V: Lanes>(x: V) -> V {
    // SAFETY: the caller's CPU.
    unsafe { x.div(store_den(x)) }
}

/// The sigmoid for the direct convolution's store ([`store_den`]), 8 or 16 lanes.
///
/// # Safety
/// As [`silu_store`]'s.
#[inline(always)]
pub(super) unsafe fn sigmoid_store<V: Lanes>(x: V) -> V {
    // SAFETY: the caller's CPU.
    unsafe { V::splat(1.0).div(store_den(x)) }
}

/// The sigmoid for the direct convolution's store ([`store_den`]).
///
/// # Safety
/// AVX2 and FMA available.
#[inline(always)]
pub(super) unsafe fn sigmoid8_store(x: __m256) -> __m256 {
    // SAFETY: the caller's CPU.
    unsafe { sigmoid_store(x) }
}

/// `math::tanh`'s odd polynomial, for |x| below 0.625 (plain multiplies
/// and adds, as there).
#[inline(always)]
unsafe fn tanh_small<V: Lanes>(x: V) -> V {
    // SAFETY: the caller's CPU; register operations only.
    unsafe {
        let z = x.mul(x);
        let mut q = V::splat(TANH_POLY[0]);
        for &c in &TANH_POLY[1..] {
            q = q.mul(z).add(V::splat(c));
        }
        q.mul(z).mul(x).add(x)
    }
}

/// `math::tanh`: [`tanh_small`] below 0.625, `1 - 2 / (e^2|x| + 1)` with
/// x's sign above.
#[inline(always)]
unsafe fn tanh_v<V: Lanes>(x: V) -> V {
    // SAFETY: the caller's CPU; register operations only.
    unsafe {
        let a = x.abs();
        let e = exp_v(V::splat(2.0).mul(a));
        let big = V::splat(1.0).sub(V::splat(2.0).div(e.add(V::splat(1.0))));
        big.copysign(x).where_below(a, 0.625, tanh_small(x))
    }
}

/// `dst[i] = f(src[i])` for `i < n`, `K` vectors per iteration; `src` may be `dst`.
///
/// # Safety
/// The CPU has `V`'s instructions; `src` readable and `dst` writable for `n` values.
#[inline(always)]
unsafe fn rows<V: Lanes, const K: usize>(src: *const f32, dst: *mut f32, n: usize, f: impl Fn(V) -> V) {
    let mut i = 0;
    // SAFETY (every load and store below): i + K·N (or + N) <= n, which the
    // caller grants for src and dst; each value is read before its store.
    while i + K * V::N <= n {
        unsafe {
            let x: [V; K] = std::array::from_fn(|j| V::load(src.add(i + j * V::N)));
            let y = x.map(&f);
            for (j, y) in y.into_iter().enumerate() {
                y.store(dst.add(i + j * V::N));
            }
        }
        i += K * V::N;
    }
    while i + V::N <= n {
        unsafe { f(V::load(src.add(i))).store(dst.add(i)) };
        i += V::N;
    }
    if i < n {
        // The last values through a full vector (zeros in the other lanes).
        let mut buf = [0f32; 16];
        // SAFETY: n - i < N <= 16 values of src and dst, as the caller grants.
        unsafe {
            std::ptr::copy(src.add(i), buf.as_mut_ptr(), n - i);
            f(V::load(buf.as_ptr())).store(buf.as_mut_ptr());
            std::ptr::copy(buf.as_ptr(), dst.add(i), n - i);
        }
    }
}

/// `rows` of `$f` on `$v`'s lanes. A macro, not a generic function: the
/// closures must be written inside the `#[target_feature]` function, whose
/// features they inherit (defined in a plain generic helper, they did not
/// and called every intrinsic out of line: Exp 20x slower).
macro_rules! run_lanes {
    ($v:ty, $k:literal, $f:expr, $src:expr, $dst:expr, $n:expr) => {
        match $f {
            Fun::Exp => rows::<$v, $k>($src, $dst, $n, |x: $v| exp_v(x)),
            Fun::Sigmoid => rows::<$v, $k>($src, $dst, $n, |x: $v| over_one_plus_exp_neg(<$v>::splat(1.0), x)),
            // tanh's two branches keep more values live: two vectors.
            Fun::Tanh => rows::<$v, 2>($src, $dst, $n, |x: $v| tanh_v(x)),
            Fun::Silu => rows::<$v, $k>($src, $dst, $n, |x: $v| over_one_plus_exp_neg(x, x)),
        }
    };
}

/// `run_lanes!` on 8 lanes, compiled with AVX2 and FMA.
///
/// # Safety
/// As for [`rows`].
#[target_feature(enable = "avx2,fma")]
unsafe fn run(f: Fun, src: *const f32, dst: *mut f32, n: usize) {
    // SAFETY: the caller's CPU and pointers.
    unsafe { run_lanes!(__m256, 2, f, src, dst, n) }
}

/// `run_lanes!` on 16 lanes, compiled with AVX-512: the same operations,
/// so the same bits. The portable loop it replaces on this target has no
/// FMA (`math` evaluates with plain multiplies and adds there).
///
/// # Safety
/// As for [`rows`], with AVX-512F.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
unsafe fn run512(f: Fun, src: *const f32, dst: *mut f32, n: usize) {
    // SAFETY: the caller's CPU and pointers.
    unsafe { run_lanes!(__m512, 4, f, src, dst, n) }
}

/// `rows` of `f` on `isa`'s vectors; false (nothing written) on the
/// generic target.
///
/// # Safety
/// `src` readable and `dst` writable for `n` values.
unsafe fn run_on(isa: Isa, f: Fun, src: *const f32, dst: *mut f32, n: usize) -> bool {
    // SAFETY: an `Isa` of a target exists only where the CPU has its
    // features (`Isa::new`): AVX2 and FMA, or AVX-512F (with both); the
    // pointers are the caller's.
    unsafe {
        match isa.target() {
            Target::Avx2 => run(f, src, dst, n),
            Target::Avx512 => run512(f, src, dst, n),
            Target::Generic => return false,
        }
    }
    true
}

/// `dst[i] = f(src[i])` on the AVX2 and AVX-512 targets; false (nothing
/// written) on the generic one.
pub(super) fn map(isa: Isa, f: Fun, src: &[f32], dst: &mut [f32]) -> bool {
    let n = src.len().min(dst.len());
    // SAFETY: both slices hold n values.
    unsafe { run_on(isa, f, src.as_ptr(), dst.as_mut_ptr(), n) }
}

/// `x[i] = f(x[i])` on the AVX2 and AVX-512 targets; false (nothing
/// written) on the generic one.
pub(super) fn map_in_place(isa: Isa, f: Fun, x: &mut [f32]) -> bool {
    let p = x.as_mut_ptr();
    // SAFETY: as in `map`; each value is read before it is written.
    unsafe { run_on(isa, f, p, p, x.len()) }
}

/// `1 / d` for `d` in [1, 2^126]: the reciprocal estimate (12 or 14 bits)
/// refined by one Newton step, within about an ulp of the quotient. A
/// division costs 5-16 cycles per vector; this, three operations.
#[inline(always)]
unsafe fn recip<V: Lanes>(d: V) -> V {
    // SAFETY: the caller's CPU; register operations only.
    unsafe {
        let r = d.rcp_estimate();
        r.fmadd(d.fnmadd(r, V::splat(1.0)), r)
    }
}

/// The sigmoid for the recurrent cells, through [`recip`]: `x` is held at
/// -87 and above so that `1 + e^-x` stays finite (σ(-87) is 2^-126, the
/// true value below it is smaller still); NaN stays NaN.
#[inline(always)]
unsafe fn sigmoid_cell<V: Lanes>(x: V) -> V {
    // SAFETY: the caller's CPU; register operations only.
    unsafe { recip(V::splat(1.0).add(exp_v(V::splat(-87.0).max(x).neg()))) }
}

/// [`tanh_v`] for the recurrent cells, through [`recip`]: [`tanh_small`]
/// below 0.625, `1 - 2 / (e^2|x| + 1)` above with `2|x|` held at 87 or
/// below (tanh is 1 in f32 from 9 on).
#[inline(always)]
unsafe fn tanh_cell<V: Lanes>(x: V) -> V {
    // SAFETY: the caller's CPU; register operations only.
    unsafe {
        let a = x.abs();
        let e = exp_v(V::splat(87.0).min(V::splat(2.0).mul(a)));
        let big = V::splat(1.0).sub(V::splat(2.0).mul(recip(e.add(V::splat(1.0)))));
        big.copysign(x).where_below(a, 0.625, tanh_small(x))
    }
}

/// The slices of one LSTM cell row (see [`lstm_cells`]).
pub(super) struct LstmRow<'a> {
    /// `H·Rᵀ` of this row: gates `i | o | f | g`, `h` values each.
    pub pre: &'a [f32],
    /// The input projection (bias included), laid out like `pre`.
    pub xw: &'a [f32],
    /// The cell state, updated in place.
    pub c: &'a mut [f32],
    /// Where the new hidden state goes.
    pub h: &'a mut [f32],
}

/// One LSTM cell row for `n` lanes starting at `j` (`n == V::N`, or fewer
/// through the caller's buffers).
///
/// # Safety
/// The CPU has `V`'s instructions; `pre` and `xw` readable at `j + g·h .. + N`
/// for the four gates, `c` and `out` readable and writable at `j .. + N`.
#[inline(always)]
unsafe fn lstm_lanes<V: Lanes>(pre: *const f32, xw: *const f32, h: usize, c: *mut f32, out: *mut f32) {
    // SAFETY: the caller's CPU and pointers.
    unsafe {
        // (No closure: one would not inherit the caller's target features.)
        let i = sigmoid_cell(V::load(pre).add(V::load(xw)));
        let o = sigmoid_cell(V::load(pre.add(h)).add(V::load(xw.add(h))));
        let f = sigmoid_cell(V::load(pre.add(2 * h)).add(V::load(xw.add(2 * h))));
        let g = tanh_cell(V::load(pre.add(3 * h)).add(V::load(xw.add(3 * h))));
        // Multiplied and added apart, as the scalar cell update.
        let cn = f.mul(V::load(c)).add(i.mul(g));
        cn.store(c);
        o.mul(tanh_cell(cn)).store(out);
    }
}

/// [`lstm_lanes`] over a whole row, the last partial vector through buffers.
///
/// # Safety
/// The CPU has `V`'s instructions.
#[inline(always)]
unsafe fn lstm_row<V: Lanes>(row: LstmRow<'_>) {
    let h = row.c.len();
    let mut j = 0;
    while j + V::N <= h {
        // SAFETY: j + N <= h; the four gates of `pre` and `xw` hold 4h values.
        unsafe {
            lstm_lanes::<V>(
                row.pre.as_ptr().add(j),
                row.xw.as_ptr().add(j),
                h,
                row.c.as_mut_ptr().add(j),
                row.h.as_mut_ptr().add(j),
            )
        };
        j += V::N;
    }
    if j < h {
        let n = h - j;
        // Gate-major buffers of 16 lanes per gate (the other lanes zero).
        let (mut pre, mut xw, mut c, mut out) = ([0f32; 64], [0f32; 64], [0f32; 16], [0f32; 16]);
        for g in 0..4 {
            pre[g * 16..g * 16 + n].copy_from_slice(&row.pre[g * h + j..g * h + h]);
            xw[g * 16..g * 16 + n].copy_from_slice(&row.xw[g * h + j..g * h + h]);
        }
        c[..n].copy_from_slice(&row.c[j..]);
        // SAFETY: every buffer holds 16 lanes per gate, N <= 16.
        unsafe { lstm_lanes::<V>(pre.as_ptr(), xw.as_ptr(), 16, c.as_mut_ptr(), out.as_mut_ptr()) };
        row.c[j..].copy_from_slice(&c[..n]);
        row.h[j..].copy_from_slice(&out[..n]);
    }
}

/// `lstm_row` on 8 lanes, compiled with AVX2 and FMA.
///
/// # Safety
/// AVX2 and FMA available.
#[target_feature(enable = "avx2,fma")]
unsafe fn lstm_row8(row: LstmRow<'_>) {
    // SAFETY: the caller's CPU.
    unsafe { lstm_row::<__m256>(row) }
}

/// `lstm_row` on 16 lanes, compiled with AVX-512.
///
/// # Safety
/// AVX-512F available.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
unsafe fn lstm_row16(row: LstmRow<'_>) {
    // SAFETY: the caller's CPU.
    unsafe { lstm_row::<__m512>(row) }
}

/// One LSTM time step for one batch row with the default activations
/// (sigmoid gates, tanh candidate and output), no clip, peepholes or coupled
/// gates, in one pass: `i, o, f = σ(pre + xw)`, `g = tanh(pre + xw)`,
/// `C = f ⊙ C + i ⊙ g`, `H = o ⊙ tanh(C)` — each value as the separate
/// passes compute it (`Fun::Sigmoid`, `Fun::Tanh`). False (nothing written)
/// on the generic target or if the slices do not fit one another.
pub(super) fn lstm_cells(isa: Isa, row: LstmRow<'_>) -> bool {
    let h = row.c.len();
    if row.h.len() != h || row.pre.len() != 4 * h || row.xw.len() != 4 * h {
        return false;
    }
    // SAFETY: an `Isa` of a target exists only where the CPU has its
    // features (`Isa::new`); the slices were checked to fit.
    unsafe {
        match isa.target() {
            Target::Avx2 => lstm_row8(row),
            Target::Avx512 => lstm_row16(row),
            Target::Generic => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::math::{exp_with, Fused, MulAdd};

    /// SiLU of one vector: `Fun::Silu`'s lanes (the unary ops' reference for
    /// the store's form).
    ///
    /// # Safety
    /// AVX2 and FMA available.
    #[inline(always)]
    unsafe fn silu8(x: __m256) -> __m256 {
        // SAFETY: the caller's CPU.
        unsafe { over_one_plus_exp_neg(x, x) }
    }

    /// Sigmoid of one vector: `Fun::Sigmoid`'s lanes.
    ///
    /// # Safety
    /// AVX2 and FMA available.
    #[inline(always)]
    unsafe fn sigmoid8(x: __m256) -> __m256 {
        // SAFETY: the caller's CPU.
        unsafe { over_one_plus_exp_neg(splat(1.0), x) }
    }

    /// The scalar definitions, with fused multiply-adds in `exp`.
    fn scalar(f: Fun, x: f32) -> f32 {
        let exp = exp_with::<Fused>;
        match f {
            Fun::Exp => exp(x),
            Fun::Sigmoid => 1.0 / (1.0 + exp(-x)),
            Fun::Silu => x / (1.0 + exp(-x)),
            Fun::Tanh => {
                let a = x.abs();
                let z = x * x;
                let q = TANH_POLY[1..].iter().fold(TANH_POLY[0], |q, &c| q * z + c);
                let small = q * z * x + x;
                let big = (1.0 - 2.0 / (exp(2.0 * a) + 1.0)).copysign(x);
                if a < 0.625 {
                    small
                } else {
                    big
                }
            }
        }
    }

    fn values() -> Vec<f32> {
        let mut v: Vec<f32> = (0..20_000).map(|i| (i as f32 - 10_000.0) * 0.0123).collect();
        v.extend([
            0.0,
            -0.0,
            0.624_999_9,
            0.625,
            -0.625,
            88.722_83,
            88.722_85,
            -103.972,
            -103.973,
            1e-30,
            -1e-30,
            f32::MIN_POSITIVE,
            f32::MAX,
            f32::MIN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
        ]);
        v
    }

    /// The store's SiLU and sigmoid: within 2e-7 relative of the exact
    /// values (f64) wherever those are above 1e-36, and the same as the
    /// unary ops' at zeros, infinities and NaN.
    #[test]
    fn store_silu_and_sigmoid_are_accurate() {
        let _isa = Isa::new(Target::Avx2).expect("an AVX2 CPU");
        let mut x = values();
        x.extend((0..200_000).map(|i| (i as f32 - 100_000.0) * 0.000_9));
        x.extend([
            -86.5, -87.9, -88.5, -88.71, -88.73, 85.9, 86.1, 88.71, 88.73, -17.3, -24.9,
        ]);
        let lanes = |f: unsafe fn(__m256) -> __m256, v: f32| {
            // SAFETY: the CPU has AVX2 and FMA (checked above).
            let y = unsafe { f(_mm256_set1_ps(v)) };
            let mut out = [0f32; 8];
            // SAFETY: 8 values.
            unsafe { _mm256_storeu_ps(out.as_mut_ptr(), y) };
            out[0]
        };
        for &v in &x {
            let xd = v as f64;
            let sig = 1.0 / (1.0 + (-xd).exp());
            for (got, want, exact) in [
                (lanes(silu8_store, v), lanes(silu8, v), xd * sig),
                (lanes(sigmoid8_store, v), lanes(sigmoid8, v), sig),
            ] {
                if !v.is_finite() || v == 0.0 {
                    let same = got.to_bits() == want.to_bits() || got.is_nan() && want.is_nan();
                    assert!(same, "f({v}) = {got}, the unary op gives {want}");
                } else if exact.abs() > 1e-36 {
                    let err = ((got as f64 - exact) / exact).abs();
                    assert!(err <= 2e-7, "f({v}) = {got}, exact {exact} (relative error {err:e})");
                } else {
                    assert!((got as f64 - exact).abs() <= 1e-36, "f({v}) = {got}, exact {exact}");
                }
            }
        }
    }

    /// The AVX-512 convolution's 16-lane store SiLU and sigmoid give the
    /// 8-lane ones' bits in every lane (the same operations, `Lanes`).
    #[test]
    fn store_gates_on_16_lanes_match_8_lanes() {
        if Isa::new(Target::Avx512).is_none() {
            // An AVX2-only CPU (the Zen 3 kind): no 16-lane form runs there.
            return;
        }
        let mut x = values();
        x.extend((0..20_000).map(|i| (i as f32 - 10_000.0) * 0.0091));
        x.extend([-86.5, -88.71, -88.73, 88.71, 88.73]);
        while !x.len().is_multiple_of(16) {
            x.push(1.5);
        }
        type Gate8 = unsafe fn(__m256) -> __m256;
        type Gate16 = unsafe fn(__m512) -> __m512;
        let pairs: [(Gate8, Gate16); 2] = [(silu8_store, silu_store), (sigmoid8_store, sigmoid_store)];
        for (f8, f16) in pairs {
            for chunk in x.chunks_exact(16) {
                let (mut got, mut want) = ([0f32; 16], [0f32; 16]);
                // SAFETY: the CPU has AVX-512F (checked above), so AVX2 and
                // FMA too; 16 values in and out.
                unsafe {
                    _mm512_storeu_ps(got.as_mut_ptr(), f16(_mm512_loadu_ps(chunk.as_ptr())));
                    for h in 0..2 {
                        let v = f8(_mm256_loadu_ps(chunk.as_ptr().add(8 * h)));
                        _mm256_storeu_ps(want.as_mut_ptr().add(8 * h), v);
                    }
                }
                for ((g, w), v) in got.iter().zip(&want).zip(chunk) {
                    let same = g.to_bits() == w.to_bits() || g.is_nan() && w.is_nan();
                    assert!(same, "f({v}) = {g} on 16 lanes, {w} on 8");
                }
            }
        }
    }

    #[test]
    fn every_lane_is_the_scalar_definition_bit_for_bit() {
        // Every machine kiln is tested on has AVX2 (both kinds CI meets);
        // the AVX-512 lanes are checked where the CPU has them.
        let avx2 = Isa::new(Target::Avx2).expect("an AVX2 CPU");
        let generic = Isa::new(Target::Generic).unwrap();
        assert!(!map(generic, Fun::Exp, &[1.0], &mut [0.0]));
        assert_eq!(Fused::madd(2.0, 3.0, 1.0), 7.0);
        let x = values();
        let isas = [Some(avx2), Isa::new(Target::Avx512)];
        for (isa, f) in isas
            .into_iter()
            .flatten()
            .flat_map(|i| [Fun::Exp, Fun::Sigmoid, Fun::Tanh, Fun::Silu].map(|f| (i, f)))
        {
            // Every length from 0 to 40 (both loops and every tail), then all.
            for n in (0..=40).chain([x.len()]) {
                let mut y = vec![f32::NAN; n];
                assert!(map(isa, f, &x[..n], &mut y));
                let mut z = x[..n].to_vec();
                assert!(map_in_place(isa, f, &mut z));
                for (i, (&xi, (&yi, &zi))) in x.iter().zip(y.iter().zip(&z)).enumerate() {
                    let want = scalar(f, xi);
                    let same = |v: f32| v.to_bits() == want.to_bits() || v.is_nan() && want.is_nan();
                    assert!(
                        same(yi) && same(zi),
                        "{} {f:?}({xi}) [{i} of {n}] = {yi} / {zi}, want {want}",
                        isa.target()
                    );
                }
            }
        }
    }
}
