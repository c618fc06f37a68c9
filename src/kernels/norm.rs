//! Row-wise kernels: softmax, layer normalisation and reductions.
//!
//! A tensor is seen as `[outer, len, inner]`: the op works along `len`.
//! Horizontal sums and maxima use 16 independent lanes (`LANES`), which
//! LLVM turns into vector registers; the lanes are combined at the end. This
//! changes the summation order against a sequential loop (as every SIMD
//! library does), not the accuracy class.

use super::{math, ReduceKind};

const LANES: usize = 16;

#[inline(always)]
fn sum(x: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let mut chunks = x.chunks_exact(LANES);
    for c in &mut chunks {
        for i in 0..LANES {
            acc[i] += c[i];
        }
    }
    let mut tail = 0.0;
    for &v in chunks.remainder() {
        tail += v;
    }
    combine(acc, |a, b| a + b) + tail
}

#[inline(always)]
fn max(x: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let mut chunks = x.chunks_exact(LANES);
    for c in &mut chunks {
        for i in 0..LANES {
            acc[i] = acc[i].max(c[i]);
        }
    }
    let mut m = combine(acc, f32::max);
    for &v in chunks.remainder() {
        m = m.max(v);
    }
    m
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
fn combine(mut acc: [f32; LANES], f: impl Fn(f32, f32) -> f32) -> f32 {
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
#[inline(always)]
pub(super) fn softmax(len: usize, inner: usize, src: &[f32], dst: &mut [f32]) {
    let block = len * inner;
    if block == 0 {
        return;
    }
    for (s, d) in src.chunks_exact(block).zip(dst.chunks_exact_mut(block)) {
        if inner == 1 {
            let m = max(s);
            for (o, &x) in d.iter_mut().zip(s) {
                *o = math::exp(x - m);
            }
            let r = 1.0 / sum(d);
            for o in d.iter_mut() {
                *o *= r;
            }
        } else {
            let mut m = vec![f32::NEG_INFINITY; inner];
            for row in s.chunks_exact(inner) {
                for (mm, &x) in m.iter_mut().zip(row) {
                    *mm = mm.max(x);
                }
            }
            let mut total = vec![0f32; inner];
            for (drow, srow) in d.chunks_exact_mut(inner).zip(s.chunks_exact(inner)) {
                for (((o, &x), &mm), t) in drow.iter_mut().zip(srow).zip(&m).zip(total.iter_mut()) {
                    *o = math::exp(x - mm);
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

/// Layer normalisation of rows of `len`: `(x - mean) / sqrt(var + eps) * scale + bias`.
/// `scale` (and `bias`) have `len` elements; `src.len() == dst.len()`, a multiple of `len`.
#[inline(always)]
pub(super) fn layer_norm(len: usize, epsilon: f32, src: &[f32], scale: &[f32], bias: Option<&[f32]>, dst: &mut [f32]) {
    if len == 0 {
        return;
    }
    let n = len as f32;
    for (s, d) in src.chunks_exact(len).zip(dst.chunks_exact_mut(len)) {
        let mean = sum(s) / n;
        for (o, &x) in d.iter_mut().zip(s) {
            *o = x - mean;
        }
        let rstd = 1.0 / (sum_squares(d) / n + epsilon).sqrt();
        match bias {
            Some(b) => {
                for ((o, &g), &b) in d.iter_mut().zip(scale).zip(b) {
                    *o = *o * rstd * g + b;
                }
            }
            None => {
                for (o, &g) in d.iter_mut().zip(scale) {
                    *o = *o * rstd * g;
                }
            }
        }
    }
}

/// Reduces `[outer, len, inner]` along `len` into `[outer, inner]`.
#[inline(always)]
pub(super) fn reduce(kind: ReduceKind, len: usize, inner: usize, src: &[f32], dst: &mut [f32]) {
    if inner == 0 {
        return;
    }
    let block = len * inner;
    if block == 0 {
        let v = match kind {
            ReduceKind::Sum => 0.0,
            ReduceKind::Mean => f32::NAN,
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
                ReduceKind::Max => max(s),
            };
            continue;
        }
        d.copy_from_slice(&s[..inner]);
        for row in s[inner..].chunks_exact(inner) {
            match kind {
                ReduceKind::Max => {
                    for (o, &x) in d.iter_mut().zip(row) {
                        *o = o.max(x);
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
