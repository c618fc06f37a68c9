//! Channels-last normalisations of CNNs over `[N, S, C]` (`S`: the spatial
//! positions, flattened): group normalisation (instance normalisation is
//! the case of one channel per group) and local response normalisation.
//!
//! Group statistics are two-pass (mean, then mean squared deviation), summed
//! in f64 over fixed blocks of positions, so that the result does not depend
//! on the thread count and a large mean does not cancel the variance away.

use super::parallel::{Parallel, Serial};
use std::sync::Mutex;

/// Positions summed by one statistics task (fixed: results do not depend
/// on how many threads run).
const STAT_BLOCK: usize = 512;

/// Tensors smaller than this (elements) take their statistics on one thread.
const SMALL: usize = 1 << 15;

/// The sizes of one group normalisation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GroupNormDims {
    pub batch: usize,
    pub spatial: usize,
    pub channels: usize,
    /// Divides `channels`.
    pub groups: usize,
    pub epsilon: f32,
}

impl GroupNormDims {
    /// Whether the sizes are consistent with buffers of `x`, `scale`,
    /// `bias` and `y` elements.
    pub fn fits(&self, x: usize, scale: usize, bias: usize, y: usize) -> bool {
        let numel = self
            .batch
            .checked_mul(self.spatial)
            .and_then(|n| n.checked_mul(self.channels));
        self.groups > 0
            && self.channels.is_multiple_of(self.groups)
            && numel == Some(x)
            && x == y
            && scale == self.channels
            && bias == self.channels
    }
}

/// `y = (x - mean) / sqrt(var + epsilon) * scale[c] + bias[c]`, the
/// statistics taken per image and group of `channels / groups` adjacent
/// channels. The statistics and `rsqrt(var + eps) * scale` are computed in
/// f64, so a channel of huge values (whose float sum overflows) still
/// normalises, and `x - mean` is exact for a large mean of a small spread.
pub fn group_norm(d: &GroupNormDims, x: &[f32], scale: &[f32], bias: &[f32], y: &mut [f32], par: &dyn Parallel) {
    assert!(d.fits(x.len(), scale.len(), bias.len(), y.len()), "group norm sizes");
    let c = d.channels;
    if x.is_empty() || c == 0 {
        return;
    }
    let cg = c / d.groups;
    let mean = per_group(d, &channel_sums(d, x, None, par));
    // The group's mean repeated per channel, for the deviations.
    let centre: Vec<f64> = (0..d.batch * c)
        .map(|i| mean[(i / c) * d.groups + (i % c) / cg])
        .collect();
    let var = per_group(d, &channel_sums(d, x, Some(&centre), par));
    // Per image and channel: y = (x - m) * a + bias.
    let m: Vec<f32> = centre.iter().map(|&v| v as f32).collect();
    let a: Vec<f32> = (0..d.batch * c)
        .map(|i| {
            let v = var[(i / c) * d.groups + (i % c) / cg];
            (f64::from(scale[i % c]) / (v + f64::from(d.epsilon)).sqrt()) as f32
        })
        .collect();
    super::par_rows(par, d.batch * d.spatial, c, y, &|rows, out| {
        for (r, row) in rows.zip(out.chunks_exact_mut(c)) {
            let n = r / d.spatial;
            let (m, a) = (&m[n * c..(n + 1) * c], &a[n * c..(n + 1) * c]);
            let xs = &x[r * c..(r + 1) * c];
            for ((((o, &v), &m), &a), &b) in row.iter_mut().zip(xs).zip(m).zip(a).zip(bias) {
                *o = (v - m) * a + b;
            }
        }
    });
}

/// Per image and channel, the f64 sum over positions of `x`, or with
/// `centre` (per image and channel) of `(x - centre)²`: summed per block of
/// `STAT_BLOCK` positions, then over blocks in order.
fn channel_sums(d: &GroupNormDims, x: &[f32], centre: Option<&[f64]>, par: &dyn Parallel) -> Vec<f64> {
    let c = d.channels;
    let blocks = d.spatial.div_ceil(STAT_BLOCK).max(1);
    let partial: Vec<Mutex<Vec<f64>>> = (0..d.batch * blocks).map(|_| Mutex::new(Vec::new())).collect();
    // Small tensors are not worth a dispatch.
    let par = if x.len() < SMALL { &Serial as &dyn Parallel } else { par };
    par.for_each(d.batch * blocks, &|t| {
        let (n, blk) = (t / blocks, t % blocks);
        let start = n * d.spatial + blk * STAT_BLOCK;
        let end = (start + STAT_BLOCK).min((n + 1) * d.spatial);
        let mut acc = vec![0f64; c];
        let rows = x[start * c..end * c].chunks_exact(c);
        match centre {
            None => {
                for row in rows {
                    for (a, &v) in acc.iter_mut().zip(row) {
                        *a += f64::from(v);
                    }
                }
            }
            Some(centre) => {
                let m = &centre[n * c..(n + 1) * c];
                for row in rows {
                    for ((a, &v), &m) in acc.iter_mut().zip(row).zip(m) {
                        let dev = f64::from(v) - m;
                        *a += dev * dev;
                    }
                }
            }
        }
        *partial[t].lock().unwrap_or_else(|e| e.into_inner()) = acc;
    });
    let mut sums = vec![0f64; d.batch * c];
    for (t, p) in partial.into_iter().enumerate() {
        let n = t / blocks;
        let p = p.into_inner().unwrap_or_else(|e| e.into_inner());
        for (s, v) in sums[n * c..(n + 1) * c].iter_mut().zip(p) {
            *s += v;
        }
    }
    sums
}

/// Sums per channel folded into sums per (image, group), divided by the group's size.
fn per_group(d: &GroupNormDims, sums: &[f64]) -> Vec<f64> {
    let cg = d.channels / d.groups;
    let count = (d.spatial * cg) as f64;
    let mut out = vec![0f64; d.batch * d.groups];
    for (i, s) in sums.iter().enumerate() {
        let (n, ch) = (i / d.channels, i % d.channels);
        out[n * d.groups + ch / cg] += s;
    }
    for v in out.iter_mut() {
        *v /= count;
    }
    out
}

/// The parameters of one local response normalisation.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Lrn {
    /// Channels summed over, centred on the output's (ONNX's `size`).
    pub size: usize,
    pub alpha: f32,
    pub beta: f32,
    pub bias: f32,
}

/// ONNX `LRN` over rows of `channels` (one row per position):
/// `y = x / (bias + alpha / size * Σ x²)^beta`, the sum over channels
/// `c - (size - 1) / 2 ..= c + size / 2` (clipped to the row).
///
/// The sum is a running one, as ORT's CPU EP computes it: start from the
/// first window, then per channel add the entering square and subtract the
/// leaving one. Besides costing O(1) per channel, this gives ORT's
/// non-finite results: once an inf has entered, `inf - inf` makes the
/// rest of the row NaN, where a direct sum would be finite again.
pub fn lrn(p: &Lrn, channels: usize, x: &[f32], y: &mut [f32], par: &dyn Parallel) {
    assert!(
        p.size > 0 && x.len() == y.len() && (channels > 0 && x.len().is_multiple_of(channels) || x.is_empty()),
        "lrn sizes"
    );
    if x.is_empty() {
        return;
    }
    let rows = x.len() / channels;
    let before = (p.size - 1) / 2;
    let scale = p.alpha / p.size as f32;
    super::par_rows(par, rows, channels, y, &|range, out| {
        let mut sq = vec![0f32; channels];
        for (r, row) in range.zip(out.chunks_exact_mut(channels)) {
            let xs = &x[r * channels..(r + 1) * channels];
            for (s, &v) in sq.iter_mut().zip(xs) {
                *s = v * v;
            }
            // Window position `i` holds channel `i - before` (zero outside the
            // row, so those terms are skipped: memory and time do not grow
            // with `size`, which a corrupt file could make huge).
            let at = |i: Option<usize>| i.and_then(|i| i.checked_sub(before)).and_then(|ch| sq.get(ch)).copied();
            let mut sum = p.bias;
            for &v in &sq[..p.size.saturating_sub(before).min(channels)] {
                sum += scale * v;
            }
            row[0] = sum;
            for (c, o) in row.iter_mut().enumerate().skip(1) {
                if let Some(v) = at(c.checked_add(p.size - 1)) {
                    sum += scale * v;
                }
                if let Some(v) = at(Some(c - 1)) {
                    sum += -scale * v;
                }
                *o = sum;
            }
            for (o, &v) in row.iter_mut().zip(xs) {
                *o = v * o.powf(-p.beta);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::parallel::ScopedThreads;

    fn reference(d: &GroupNormDims, x: &[f32], scale: &[f32], bias: &[f32]) -> Vec<f32> {
        let (c, cg) = (d.channels, d.channels / d.groups);
        let mut y = vec![0f32; x.len()];
        for n in 0..d.batch {
            for g in 0..d.groups {
                let idx: Vec<usize> = (0..d.spatial)
                    .flat_map(|s| (g * cg..(g + 1) * cg).map(move |ch| (n * d.spatial + s) * c + ch))
                    .collect();
                let m: f64 = idx.iter().map(|&i| f64::from(x[i])).sum::<f64>() / idx.len() as f64;
                let v: f64 = idx.iter().map(|&i| (f64::from(x[i]) - m).powi(2)).sum::<f64>() / idx.len() as f64;
                for &i in &idx {
                    let ch = i % c;
                    let r = (f64::from(x[i]) - m) / (v + f64::from(d.epsilon)).sqrt();
                    y[i] = (r * f64::from(scale[ch]) + f64::from(bias[ch])) as f32;
                }
            }
        }
        y
    }

    fn data(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| ((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 1000) as f32 / 100.0 - 5.0)
            .collect()
    }

    #[test]
    fn group_norm_matches_the_definition_and_ignores_the_thread_count() {
        for (batch, spatial, channels, groups) in [(2, 7, 6, 3), (2, 5000, 4, 2), (3, 5, 8, 1), (1, 3, 5, 5)] {
            let d = GroupNormDims {
                batch,
                spatial,
                channels,
                groups,
                epsilon: 1e-5,
            };
            let x = data(batch * spatial * channels, 7);
            let scale = data(channels, 3);
            let bias = data(channels, 11);
            let want = reference(&d, &x, &scale, &bias);
            let mut y1 = vec![0f32; x.len()];
            group_norm(&d, &x, &scale, &bias, &mut y1, &Serial);
            let mut y3 = vec![0f32; x.len()];
            group_norm(&d, &x, &scale, &bias, &mut y3, &ScopedThreads(3));
            assert_eq!(y1, y3);
            for (a, w) in y1.iter().zip(&want) {
                assert!((a - w).abs() <= 1e-4 * (1.0 + w.abs()), "{a} vs {w}");
            }
        }
    }

    #[test]
    fn group_norm_keeps_the_variance_of_a_large_mean() {
        // 1e4 + small deviations: a one-pass E[x²] - E[x]² in f32 would lose them.
        let d = GroupNormDims {
            batch: 1,
            spatial: 64,
            channels: 1,
            groups: 1,
            epsilon: 0.0,
        };
        let x: Vec<f32> = (0..64).map(|i| 1e4 + if i % 2 == 0 { 0.5 } else { -0.5 }).collect();
        let mut y = vec![0f32; 64];
        group_norm(&d, &x, &[1.0], &[0.0], &mut y, &Serial);
        for (i, v) in y.iter().enumerate() {
            let want = if i % 2 == 0 { 1.0 } else { -1.0 };
            assert!((v - want).abs() < 1e-3, "{i}: {v}");
        }
    }

    #[test]
    fn lrn_sums_the_onnx_window() {
        // size 4: channels c-1 ..= c+2.
        let p = Lrn {
            size: 4,
            alpha: 0.5,
            beta: 0.75,
            bias: 2.0,
        };
        let x = [1.0f32, 2.0, 3.0, 4.0, 5.0];
        let mut y = [0f32; 5];
        lrn(&p, 5, &x, &mut y, &Serial);
        let sq = [1.0f32, 4.0, 9.0, 16.0, 25.0];
        for c in 0..5usize {
            let lo = c.saturating_sub(1);
            let hi = (c + 2).min(4);
            let s: f32 = sq[lo..=hi].iter().sum();
            let want = x[c] / (2.0f32 + 0.5 / 4.0 * s).powf(0.75);
            assert!((y[c] - want).abs() < 1e-6, "{c}: {} vs {want}", y[c]);
        }
        // A window wider than any row (a corrupt file's size) costs nothing extra.
        let huge = Lrn { size: usize::MAX, ..p };
        lrn(&huge, 5, &x, &mut y, &Serial);
        let s: f32 = sq.iter().sum();
        assert!((y[4] - x[4] / (2.0 + 0.5 / usize::MAX as f32 * s).powf(0.75)).abs() < 1e-6);
    }
}
