//! Attention over few keys (short sequences: sentence embeddings of a
//! dozen tokens, batches of them): per head, Kᵀ gathered once into a small
//! zero-padded block and every query row's scores, softmax and product
//! with V computed in loops over whole vectors, without the two GEMM calls
//! per head of [`super::attention`]'s general path. There, a head of 16
//! keys is ~1000 FMAs of vectors against a fixed cost per call (checks,
//! splitting, packing, tiles of 14 rows for 16), and 8 × 16 tokens of
//! MiniLM ran at 17 GFLOP/s.
//!
//! Generic over the multiply-add so that `isa_kernels!` compiles it per
//! target; the loops run over [`LANES`]-value chunks that the compiler
//! turns into vector FMAs (one zmm, two ymm).

use super::attention::{AttentionShape, Mask, Rows};
use super::math::{self, MulAdd};
use super::norm::combine;
use super::transpose::{self, Transpose2};
use super::Isa;

/// Keys up to which [`short_heads`] runs instead of the GEMM path.
pub(crate) const SHORT_KEYS: usize = 32;

/// Query rows whose scores are accumulated together: their FMAs are
/// independent, so they overlap instead of waiting on one chain.
const GROUP: usize = 4;

/// Values per chunk of the loops (a zmm register).
const LANES: usize = 16;

/// One task's view: batch `b`, query rows `row0..` (as many as the output
/// block holds) of Q, K and V's rows `x`.
pub(crate) struct ShortBlock<'a> {
    pub isa: Isa,
    pub shape: &'a AttentionShape,
    pub x: Rows<'a>,
    pub mask: Option<Mask<'a>>,
    pub b: usize,
    pub row0: usize,
}

/// Scratch floats [`short_heads`] needs: Kᵀ, a group's score rows, and
/// the group's Q and probabilities transposed.
pub(crate) fn scratch_len(shape: &AttentionShape) -> usize {
    let padded = shape.kv_len.next_multiple_of(LANES);
    (shape.head_dim + GROUP) * padded + GROUP * (shape.head_dim + padded)
}

/// Every head of `blk`'s rows into `out` (`rows x heads·head_dim`).
/// `scratch` holds at least [`scratch_len`] floats.
#[inline(always)]
pub(crate) fn short_heads<F: MulAdd>(blk: &ShortBlock<'_>, scratch: &mut [f32], out: &mut [f32]) {
    let shape = blk.shape;
    let (width, d, n) = (shape.width(), shape.head_dim, shape.kv_len);
    let padded = n.next_multiple_of(LANES);
    let (kt, rest) = scratch[..scratch_len(shape)].split_at_mut(d * padded);
    let (scores, rest) = rest.split_at_mut(GROUP * padded);
    let (qt, pt) = bytemuck::cast_slice_mut::<f32, [f32; GROUP]>(rest).split_at_mut(d);
    // Columns past the keys stay zero: their scores are computed and ignored.
    kt.fill(0.0);
    let rows = out.len() / width;
    let x = blk.x;
    let kv0 = blk.b * n * x.ld;
    for h in 0..shape.heads {
        let col = h * d;
        gather_keys(blk.isa, &x.k[kv0 + col..], x.ld, n, d, padded, kt);
        for i0 in (0..rows).step_by(GROUP) {
            let group = GROUP.min(rows - i0);
            let q0 = (blk.b * shape.q_len + blk.row0 + i0) * x.ld + col;
            transpose_group(&x.q[q0..], x.ld, group, qt);
            let s = &mut scores[..group * padded];
            score_rows::<F>(qt, group, kt, padded, s);
            for (r, row) in s.chunks_exact_mut(padded).enumerate() {
                let mask = mask_row(blk, h, i0 + r);
                softmax_row::<F>(row, n, shape.scale, mask);
            }
            transpose_group(s, padded, group, &mut pt[..n]);
            let o = &mut out[i0 * width + col..];
            times_v::<F>(&pt[..n], group, &x.v[kv0 + col..], x.ld, d, o, width);
        }
    }
}

/// `kt[t·padded + j] = k[j·ld + t]`: the head's keys as columns, by the
/// vectorised transpose (element by element it cost as much as the scores).
#[inline(always)]
fn gather_keys(isa: Isa, k: &[f32], ld: usize, n: usize, d: usize, padded: usize, kt: &mut [f32]) {
    let t = Transpose2 {
        rows: d,
        cols: n,
        s: 0,
        sld: ld,
        d: 0,
        dld: padded,
    };
    transpose::transpose(isa, &t, k, kt);
}

/// Scores of the group's query rows against every key column of `kt`,
/// into `s` (`group x padded`). `qt` holds the rows' values transposed
/// (`qt[t][r]`, rows past `group` repeating the last; they are not
/// stored). The accumulators are local arrays so that they live in registers.
#[inline(always)]
fn score_rows<F: MulAdd>(qt: &[[f32; GROUP]], group: usize, kt: &[f32], padded: usize, s: &mut [f32]) {
    for c in (0..padded).step_by(LANES) {
        let mut acc = [[0.0f32; LANES]; GROUP];
        for (a, keys) in qt.iter().zip(kt.chunks_exact(padded)) {
            let keys: &[f32; LANES] = keys[c..c + LANES].try_into().expect("one chunk");
            for (acc, &a) in acc.iter_mut().zip(a) {
                for (o, &x) in acc.iter_mut().zip(keys) {
                    *o = F::madd(a, x, *o);
                }
            }
        }
        for (r, acc) in acc.iter().take(group).enumerate() {
            s[r * padded + c..][..LANES].copy_from_slice(acc);
        }
    }
}

/// `qt[t][r] = q[r·ld + t]` for the group's rows, the last repeated.
#[inline(always)]
fn transpose_group(q: &[f32], ld: usize, group: usize, qt: &mut [[f32; GROUP]]) {
    let len = qt.len();
    let rows: [&[f32]; GROUP] = std::array::from_fn(|r| &q[r.min(group - 1) * ld..][..len]);
    // One value of each row per step (four loads, one store): the loop
    // over one row at a time became scatters.
    for (t, x) in qt.iter_mut().enumerate() {
        *x = std::array::from_fn(|r| rows[r][t]);
    }
}

/// The mask's values for query row `i` of the block, head `h`.
#[inline(always)]
fn mask_row<'a>(blk: &ShortBlock<'a>, h: usize, i: usize) -> Option<&'a [f32]> {
    blk.mask.map(|m| {
        let at = blk.b * m.strides[0] + h * m.strides[1] + (blk.row0 + i) * m.strides[2];
        &m.data[at..at + blk.shape.kv_len]
    })
}

/// `row[..n] = softmax(scale · row[..n] + mask)`, shifted by its maximum
/// as the general path's softmax is; the padding after `n` becomes 0.
/// Written over whole chunks with one accumulator per lane, so that the
/// maximum, the exponentials and their sum vectorise.
#[inline(always)]
fn softmax_row<F: MulAdd>(row: &mut [f32], n: usize, scale: f32, mask: Option<&[f32]>) {
    match mask {
        Some(m) => row.iter_mut().zip(m).for_each(|(x, &a)| *x = *x * scale + a),
        None => row[..n].iter_mut().for_each(|x| *x *= scale),
    }
    row[n..].fill(f32::NEG_INFINITY);
    let mut top = [f32::NEG_INFINITY; LANES];
    for c in row.chunks_exact(LANES) {
        for (t, &x) in top.iter_mut().zip(c) {
            *t = if x > *t { x } else { *t };
        }
    }
    let max = combine(top, |a, b| if b > a { b } else { a });
    let mut sums = [0.0f32; LANES];
    for c in row.chunks_exact_mut(LANES) {
        for (s, x) in sums.iter_mut().zip(c) {
            *x = math::exp_nonpositive_with::<F>(*x - max);
            *s += *x;
        }
    }
    let r = 1.0 / combine(sums, |a, b| a + b);
    row.iter_mut().for_each(|x| *x *= r);
}

/// `o[r·ldo + t] = Σ_j pt[j][r] · v[j·ld + t]` for the group's rows, `LANES`
/// columns at a time in local accumulators, the last `d % LANES` one by
/// one. `pt` holds the probabilities transposed (see [`transpose_group`]).
#[inline(always)]
fn times_v<F: MulAdd>(pt: &[[f32; GROUP]], group: usize, v: &[f32], ld: usize, d: usize, o: &mut [f32], ldo: usize) {
    let whole = d / LANES * LANES;
    for c in (0..whole).step_by(LANES) {
        let mut acc = [[0.0f32; LANES]; GROUP];
        for (j, p) in pt.iter().enumerate() {
            let vals: &[f32; LANES] = v[j * ld + c..][..LANES].try_into().expect("one chunk");
            for (acc, &a) in acc.iter_mut().zip(p) {
                for (x, &y) in acc.iter_mut().zip(vals) {
                    *x = F::madd(a, y, *x);
                }
            }
        }
        for (r, acc) in acc.iter().take(group).enumerate() {
            o[r * ldo + c..][..LANES].copy_from_slice(acc);
        }
    }
    for r in 0..group {
        for t in whole..d {
            let mut x = 0.0f32;
            for (j, p) in pt.iter().enumerate() {
                x = F::madd(p[r], v[j * ld + t], x);
            }
            o[r * ldo + t] = x;
        }
    }
}
