//! Row-wise kernels: softmax, layer normalisation and reductions.
//!
//! A tensor is seen as `[outer, len, inner]`: the op works along `len`.
//! Horizontal sums and maxima use 16 independent lanes (`LANES`), which
//! LLVM turns into vector registers; the lanes are combined at the end. This
//! changes the summation order against a sequential loop (as every SIMD
//! library does), not the accuracy class.

use super::math::{self, MulAdd};
use super::ReduceKind;

const LANES: usize = 16;

#[inline(always)]
fn sum(x: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let last = for_chunks(x, |c| {
        for i in 0..LANES {
            acc[i] += c[i];
        }
    });
    match last {
        Last::Overlapping(c, fresh) => {
            for i in fresh..LANES {
                acc[i] += c[i];
            }
        }
        Last::Short(rest) => acc[..rest.len()].iter_mut().zip(rest).for_each(|(a, &v)| *a += v),
        Last::None => {}
    }
    combine(acc, |a, b| a + b)
}

/// Maximum of `x` ignoring NaN (`maxps`-style); only for softmax, where a
/// NaN in a row makes every output of the row NaN whatever the maximum is.
#[inline(always)]
fn max(x: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let step = |acc: &mut [f32; LANES], c: &[f32; LANES]| {
        for i in 0..LANES {
            acc[i] = if c[i] > acc[i] { c[i] } else { acc[i] };
        }
    };
    match for_chunks(x, |c| step(&mut acc, c)) {
        // Lanes seen twice do not change a maximum.
        Last::Overlapping(c, _) => step(&mut acc, c),
        Last::Short(rest) => {
            for (a, &v) in acc.iter_mut().zip(rest) {
                *a = if v > *a { v } else { *a };
            }
        }
        Last::None => {}
    }
    combine(acc, |a, b| if b > a { b } else { a })
}

/// What is left of a row after its whole [`LANES`] chunks.
enum Last<'a> {
    /// Nothing.
    None,
    /// The row's last `LANES` values, of which lanes `fresh..` are new: a
    /// row like attention's 77 keys ends in one more vector step instead of
    /// a scalar loop.
    Overlapping(&'a [f32; LANES], usize),
    /// A row shorter than `LANES`.
    Short(&'a [f32]),
}

/// Runs `f` on each whole chunk of `x` and returns the rest.
#[inline(always)]
fn for_chunks<'a>(x: &'a [f32], mut f: impl FnMut(&[f32; LANES])) -> Last<'a> {
    let chunks = x.chunks_exact(LANES);
    let rest = chunks.remainder().len();
    for c in chunks {
        f(c.try_into().expect("LANES"));
    }
    match (rest, x.len()) {
        (0, _) => Last::None,
        (_, n) if n < LANES => Last::Short(x),
        (_, n) => Last::Overlapping(x[n - LANES..].try_into().expect("LANES"), LANES - rest),
    }
}

/// `d` = `exp(s)` element by element, returning the sum of `d` (`exp`:
/// the softmax's, shifted by the row's maximum or not).
///
/// Two passes, the exponentials in a plain loop and then [`sum`]: LLVM's
/// loop vectoriser turns the first into 8-lane code on AVX2, where the
/// 16-lane arrays of one fused pass stayed scalar (softmax took a quarter of
/// MiniLM's time at sequence 512 on a Zen 3). The sum adds the same values
/// in the same order as a fused pass would.
#[inline(always)]
fn exp_sum(s: &[f32], d: &mut [f32], exp: impl Fn(f32) -> f32) -> f32 {
    for (o, &x) in d.iter_mut().zip(s) {
        *o = exp(x);
    }
    sum(&d[..s.len()])
}

/// `max(a, b)` that returns NaN if either is NaN (IEEE `maximum`, numpy's
/// `max`). Branch-free: compare, unordered-compare and blend.
#[inline(always)]
fn max_nan(a: f32, b: f32) -> f32 {
    if a > b || a.is_nan() {
        a
    } else {
        b
    }
}

/// Maximum of `x`, NaN if any element is NaN (`-inf` for an empty slice).
#[inline(always)]
fn max_propagating(x: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let mut chunks = x.chunks_exact(LANES);
    for c in &mut chunks {
        for i in 0..LANES {
            acc[i] = max_nan(acc[i], c[i]);
        }
    }
    let mut m = combine(acc, max_nan);
    for &v in chunks.remainder() {
        m = max_nan(m, v);
    }
    m
}

/// Sum of `x` accumulated in f64 (exact enough that the mean of any f32 row
/// is finite and correctly rounded in practice).
#[inline(always)]
fn sum_f64(x: &[f32]) -> f64 {
    let mut acc = [0f64; LANES];
    let mut chunks = x.chunks_exact(LANES);
    for c in &mut chunks {
        for i in 0..LANES {
            acc[i] += c[i] as f64;
        }
    }
    let mut tail = 0.0;
    for &v in chunks.remainder() {
        tail += v as f64;
    }
    let mut width = LANES / 2;
    while width > 0 {
        for i in 0..width {
            acc[i] += acc[i + width];
        }
        width /= 2;
    }
    acc[0] + tail
}

#[inline(always)]
fn sum_squares(x: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let mut chunks = x.chunks_exact(LANES);
    for c in &mut chunks {
        for i in 0..LANES {
            acc[i] += c[i] * c[i];
        }
    }
    let mut tail = 0.0;
    for &v in chunks.remainder() {
        tail += v * v;
    }
    combine(acc, |a, b| a + b) + tail
}

/// Pairwise combination of the lanes.
#[inline(always)]
pub(super) fn combine(mut acc: [f32; LANES], f: impl Fn(f32, f32) -> f32) -> f32 {
    let mut width = LANES / 2;
    while width > 0 {
        for i in 0..width {
            acc[i] = f(acc[i], acc[i + width]);
        }
        width /= 2;
    }
    acc[0]
}

/// Softmax along `len` of `[outer, len, inner]`; `src.len() == dst.len()`,
/// a multiple of `len * inner`.
///
/// `shift`: subtract the maximum first (the Softmax op; ORT's CPU EP does
/// too). Without it this is `exp(x) / Σ exp(x)` exactly as the decomposed
/// `Exp → ReduceSum → Div` computes it, overflow (`inf / inf` = NaN) included.
#[inline(always)]
pub(super) fn softmax<F: MulAdd>(len: usize, inner: usize, shift: bool, src: &[f32], dst: &mut [f32]) {
    let block = len * inner;
    if block == 0 {
        return;
    }
    if inner == 1 && shift {
        return shifted_rows::<F>(len, src, dst);
    }
    for (s, d) in src.chunks_exact(block).zip(dst.chunks_exact_mut(block)) {
        if inner == 1 {
            let r = 1.0 / exp_sum(s, d, math::exp_with::<F>);
            d.iter_mut().for_each(|o| *o *= r);
        } else {
            let mut m = vec![if shift { f32::NEG_INFINITY } else { 0.0 }; inner];
            if shift {
                for row in s.chunks_exact(inner) {
                    for (mm, &x) in m.iter_mut().zip(row) {
                        *mm = mm.max(x);
                    }
                }
            }
            let mut total = vec![0f32; inner];
            for (drow, srow) in d.chunks_exact_mut(inner).zip(s.chunks_exact(inner)) {
                for (((o, &x), &mm), t) in drow.iter_mut().zip(srow).zip(&m).zip(total.iter_mut()) {
                    *o = if shift {
                        math::exp_nonpositive_with::<F>(x - mm)
                    } else {
                        math::exp_with::<F>(x)
                    };
                    *t += *o;
                }
            }
            for t in total.iter_mut() {
                *t = 1.0 / *t;
            }
            for drow in d.chunks_exact_mut(inner) {
                for (o, &t) in drow.iter_mut().zip(&total) {
                    *o *= t;
                }
            }
        }
    }
}

/// The shifted softmax of rows of `len`, two rows at a time with their
/// steps interleaved where rows have at least `LANES` values: the same
/// operations per row as one row alone, so the same results. One row is a
/// chain of dependent steps (maximum, its horizontal combine, the
/// exponentials, the sum and its combine, the reciprocal, the scaling)
/// that left the core idle. On a Sapphire Rapids class Xeon, rows of 128
/// and 512 ran 7-11% faster in pairs, of 16 and 77 19-28% (AVX-512; AVX2's
/// kernel 5-19%).
#[inline(always)]
fn shifted_rows<F: MulAdd>(len: usize, src: &[f32], dst: &mut [f32]) {
    let paired = if len >= LANES {
        src.len() / (2 * len) * 2 * len
    } else {
        0
    };
    let (src_pairs, src_rest) = src.split_at(paired);
    let (dst_pairs, dst_rest) = dst.split_at_mut(paired);
    for (s, d) in src_pairs.chunks_exact(2 * len).zip(dst_pairs.chunks_exact_mut(2 * len)) {
        let (s0, s1) = s.split_at(len);
        let (d0, d1) = d.split_at_mut(len);
        let (m0, m1) = max_pair(s0, s1);
        // One loop per row: LLVM vectorises a loop over one row's
        // exponentials, not one over both rows' (1.6x slower).
        for (s, d, m) in [(s0, &mut *d0, m0), (s1, &mut *d1, m1)] {
            // Every `x - m` is <= 0 (or NaN).
            for (o, &x) in d.iter_mut().zip(s) {
                *o = math::exp_nonpositive_with::<F>(x - m);
            }
        }
        let (t0, t1) = sum_pair(d0, d1);
        let (r0, r1) = (1.0 / t0, 1.0 / t1);
        d0.iter_mut().for_each(|o| *o *= r0);
        d1.iter_mut().for_each(|o| *o *= r1);
    }
    for (s, d) in src_rest.chunks_exact(len).zip(dst_rest.chunks_exact_mut(len)) {
        let m = max(s);
        let r = 1.0 / exp_sum(s, d, |x| math::exp_nonpositive_with::<F>(x - m));
        d.iter_mut().for_each(|o| *o *= r);
    }
}

/// [`max`] of two rows of the same length (at least `LANES`), their lanes
/// updated in one loop.
#[inline(always)]
fn max_pair(a: &[f32], b: &[f32]) -> (f32, f32) {
    let step = |acc: &mut [f32; LANES], c: &[f32]| {
        for i in 0..LANES {
            acc[i] = if c[i] > acc[i] { c[i] } else { acc[i] };
        }
    };
    let (mut x, mut y) = ([f32::NEG_INFINITY; LANES], [f32::NEG_INFINITY; LANES]);
    for (ca, cb) in a.chunks_exact(LANES).zip(b.chunks_exact(LANES)) {
        step(&mut x, ca);
        step(&mut y, cb);
    }
    if !a.len().is_multiple_of(LANES) {
        // Lanes seen twice do not change a maximum (as in `max`).
        step(&mut x, &a[a.len() - LANES..]);
        step(&mut y, &b[b.len() - LANES..]);
    }
    let pick = |p: f32, q: f32| if q > p { q } else { p };
    (combine(x, pick), combine(y, pick))
}

/// [`sum`] of two rows of the same length (at least `LANES`), in the same
/// order per row, their lanes updated in one loop.
#[inline(always)]
fn sum_pair(a: &[f32], b: &[f32]) -> (f32, f32) {
    let (mut x, mut y) = ([0f32; LANES], [0f32; LANES]);
    for (ca, cb) in a.chunks_exact(LANES).zip(b.chunks_exact(LANES)) {
        for i in 0..LANES {
            x[i] += ca[i];
            y[i] += cb[i];
        }
    }
    let rest = a.len() % LANES;
    if rest != 0 {
        // The last LANES values, of which lanes `fresh..` are new (as in `sum`).
        let (ta, tb, fresh) = (&a[a.len() - LANES..], &b[b.len() - LANES..], LANES - rest);
        for i in fresh..LANES {
            x[i] += ta[i];
            y[i] += tb[i];
        }
    }
    (combine(x, |p, q| p + q), combine(y, |p, q| p + q))
}

/// Rows shorter than this get ORT's short-row statistics (see [`row_mean`]).
const LN_SHORT_ROW: usize = 8;

/// The mean of one row, and its variance where the rule computes it along
/// the way. `decomposed`: the decomposed ops' statistics (an f32 sum divided
/// by the length). Otherwise as ORT 1.31's CPU EP computes them for
/// `LayerNormalization` (measured against it, see `python/tests/test_nonfinite.py`):
/// rows of 8 or more take the mean from an f64 sum (so a row of 1e38 has
/// mean 1e38, not inf), and their variance is then the f32 mean of squared
/// deviations; shorter rows use Welford's running update in f32. Both
/// overflow (to NaN, or to an infinite variance and outputs of 0) where ORT's do.
#[inline(always)]
fn row_mean(s: &[f32], decomposed: bool) -> (f32, Option<f32>) {
    let n = s.len() as f32;
    if decomposed {
        return (sum(s) / n, None);
    }
    if s.len() < LN_SHORT_ROW {
        let (mut mean, mut m2) = (0f32, 0f32);
        for (k, &x) in s.iter().enumerate() {
            let d = x - mean;
            mean += d / (k + 1) as f32;
            m2 += d * (x - mean);
        }
        return (mean, Some(m2 / n));
    }
    ((sum_f64(s) / s.len() as f64) as f32, None)
}

/// `dev = (x - mean) / sqrt(var + eps) * scale + bias` in place, with `var`
/// the mean of `dev`'s squares unless the statistics gave it.
#[inline(always)]
fn normalise(dev: &mut [f32], var: Option<f32>, epsilon: f32, scale: &[f32], bias: Option<&[f32]>) {
    let var = var.unwrap_or_else(|| sum_squares(dev) / dev.len() as f32);
    let rstd = 1.0 / (var + epsilon).sqrt();
    match bias {
        Some(b) => {
            for ((o, &g), &b) in dev.iter_mut().zip(scale).zip(b) {
                *o = *o * rstd * g + b;
            }
        }
        None => {
            for (o, &g) in dev.iter_mut().zip(scale) {
                *o = *o * rstd * g;
            }
        }
    }
}

/// Layer normalisation of rows of `len`: `(x - mean) / sqrt(var + eps) * scale + bias`.
/// `scale` (and `bias`) have `len` elements; `src.len() == dst.len()`, a multiple of `len`.
///
/// `decomposed`: the statistics the decomposed ops (`ReduceMean → Sub → Pow →
/// ReduceMean → Add → Sqrt → Div`) compute, i.e. f32 sums divided by `len`,
/// which overflow for rows of 1e38 where the `LayerNormalization` op does not.
#[inline(always)]
pub(super) fn layer_norm(
    len: usize,
    epsilon: f32,
    decomposed: bool,
    src: &[f32],
    scale: &[f32],
    bias: Option<&[f32]>,
    dst: &mut [f32],
) {
    if len == 0 {
        return;
    }
    for (s, d) in src.chunks_exact(len).zip(dst.chunks_exact_mut(len)) {
        let (mean, var) = row_mean(s, decomposed);
        for (o, &x) in d.iter_mut().zip(s) {
            *o = x - mean;
        }
        normalise(d, var, epsilon, scale, bias);
    }
}

/// [`layer_norm`] of one non-empty row in place: the same operations, so the
/// same results.
#[inline(always)]
pub(super) fn layer_norm_row(row: &mut [f32], epsilon: f32, decomposed: bool, scale: &[f32], bias: Option<&[f32]>) {
    let (mean, var) = row_mean(row, decomposed);
    for o in row.iter_mut() {
        *o -= mean;
    }
    normalise(row, var, epsilon, scale, bias);
}

/// Reduces `[outer, len, inner]` along `len` into `[outer, inner]`. An empty
/// `len` gives 0 (Sum, Mean) or `-inf` (Max); Max is NaN when the reduced
/// values contain a NaN.
#[inline(always)]
pub(super) fn reduce(kind: ReduceKind, len: usize, inner: usize, src: &[f32], dst: &mut [f32]) {
    if inner == 0 {
        return;
    }
    let block = len * inner;
    if block == 0 {
        let v = match kind {
            ReduceKind::Sum => 0.0,
            // What ORT's CPU EP gives (ONNX leaves the mean of nothing undefined).
            ReduceKind::Mean => 0.0,
            ReduceKind::Max => f32::NEG_INFINITY,
        };
        dst.fill(v);
        return;
    }
    let scale = 1.0 / len as f32;
    for (s, d) in src.chunks_exact(block).zip(dst.chunks_exact_mut(inner)) {
        if inner == 1 {
            d[0] = match kind {
                ReduceKind::Sum => sum(s),
                ReduceKind::Mean => sum(s) * scale,
                ReduceKind::Max => max_propagating(s),
            };
            continue;
        }
        d.copy_from_slice(&s[..inner]);
        for row in s[inner..].chunks_exact(inner) {
            match kind {
                ReduceKind::Max => {
                    for (o, &x) in d.iter_mut().zip(row) {
                        *o = math::stored(max_nan(*o, x));
                    }
                }
                _ => {
                    for (o, &x) in d.iter_mut().zip(row) {
                        *o += x;
                    }
                }
            }
        }
        if kind == ReduceKind::Mean {
            for o in d.iter_mut() {
                *o *= scale;
            }
        }
    }
}
