//! Fused multi-head attention: `softmax(scale · Q·Kᵀ + mask) · V` for every
//! batch and head, read from and written to `[batch, seq, heads · head_dim]`
//! activations (the projections' outputs and the output projection's input),
//! so the head transposes of the unfused graph disappear.
//!
//! Work is split into tasks of (batch, block of query rows), as many as
//! the threads need (see [`block_rows`]; with many blocks per batch, each
//! head's K and V are packed for the GEMM once, before); a task runs
//! every head of its rows, so it owns a contiguous block of the output. Per
//! head, the block's scores against all keys (`rows x kv_len`, at most
//! [`SCORE_FLOATS`] values, so they stay in L1/L2) come from the GEMM with
//! the scale as its alpha (and a key mask, the same for every query row, as
//! its per-column bias); any other mask is added, rows are normalised by the
//! softmax row kernel, and the GEMM multiplies them by V straight into the
//! output's columns of that head. No `[batch, heads, seq, seq]` buffer
//! exists: at sequence 512 a block is 32 query rows. Up to
//! [`attention_short::SHORT_KEYS`] keys, a head's two products are too small
//! for the GEMM's fixed costs, and `attention_short`'s vector loops run the
//! block's heads instead (the same definition, its own roundings).
//!
//! The numerics are those of the unfused steps (same GEMM, same softmax),
//! so results match them to rounding.

use std::cell::Cell;
use std::sync::Arc;

use super::attention_short::{self, ShortBlock};
use super::gemm::{self, Bias, Epilogue, PackedB};
use super::parallel::{try_for_each_block, Blocks, Parallel, Serial};
use super::Isa;
use crate::error::{Error, Result};
use crate::target::Target;
use crate::tensor::{AlignedBytes, Weight};

/// Most score values one task's block holds (`rows x kv_len`): 64 KiB of
/// scores plus as much of probabilities, in L2 (sequence 128 runs in one
/// block of 128 query rows; 8192 values, blocks of 64, measured slower).
pub const SCORE_FLOATS: usize = 16384;

/// Query blocks per batch from which each head's K and V are packed once
/// for all blocks rather than by the GEMM in each block. Packing ahead costs
/// the portable packing (measured when it also gathered each head's columns
/// first, a copy now gone); on a Zen 5
/// (MiniLM, one thread, per layer) it took sequence 512 (16 blocks) from
/// 3.67 to 3.34 ms but 256 (4 blocks) from 0.85 to 0.96 ms and 128 (2
/// blocks) from 0.23 to 0.31 ms.
const PREPACK_BLOCKS: usize = 8;

/// Sizes of one attention.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct AttentionShape {
    pub batch: usize,
    pub heads: usize,
    pub q_len: usize,
    pub kv_len: usize,
    pub head_dim: usize,
    /// Multiplies Q·Kᵀ before the mask is added.
    pub scale: f32,
}

impl AttentionShape {
    /// Row length of Q, K, V and the output: `heads · head_dim`.
    pub fn width(&self) -> usize {
        self.heads * self.head_dim
    }

    /// Elements of Q and of the output.
    pub fn q_elems(&self) -> usize {
        self.batch * self.q_len * self.width()
    }

    /// Elements of K and of V.
    pub fn kv_elems(&self) -> usize {
        self.batch * self.kv_len * self.width()
    }
}

/// An additive mask broadcast to `[batch, heads, q_len, kv_len]`: key
/// `j` of query row `i` of head `h` in batch `b` reads
/// `data[b·strides[0] + h·strides[1] + i·strides[2] + j]` (a stride is 0
/// along a broadcast dim, e.g. `[batch, 1, 1, kv_len]` has `[kv_len, 0, 0]`).
#[derive(Clone, Copy, Debug)]
pub struct Mask<'a> {
    pub data: &'a [f32],
    pub strides: [usize; 3],
}

/// Elements a mask with these strides must have (0 if there is no element).
pub fn mask_extent(shape: &AttentionShape, strides: [usize; 3]) -> usize {
    if shape.batch == 0 || shape.heads == 0 || shape.q_len == 0 || shape.kv_len == 0 {
        return 0;
    }
    let last = [shape.batch - 1, shape.heads - 1, shape.q_len - 1];
    last.iter()
        .zip(strides)
        .map(|(&i, s)| i.saturating_mul(s))
        .fold(shape.kv_len, usize::saturating_add)
}

/// Query rows per task: the score block stays under [`SCORE_FLOATS`], and
/// the task count is a multiple of the thread count (balanced). No more
/// than that: every further block packs each head's K and V again, and
/// `threads` is only an upper bound (ORT's pool may run everything on the
/// caller), so extra tasks would slow a one-thread run down.
fn block_rows(shape: &AttentionShape, threads: usize) -> usize {
    let cap = (SCORE_FLOATS / shape.kv_len.max(1)).max(1);
    let threads = threads.max(1);
    let even = threads / gcd(shape.batch.max(1), threads);
    let blocks = shape.q_len.div_ceil(cap).next_multiple_of(even);
    shape.q_len.div_ceil(blocks.clamp(1, shape.q_len.max(1))).max(1)
}

fn gcd(a: usize, b: usize) -> usize {
    if b == 0 {
        a
    } else {
        gcd(b, a % b)
    }
}

/// Where Q, K and V are read from.
#[derive(Clone, Copy, Debug)]
pub enum Qkv<'a> {
    /// `q` is `[batch, q_len, heads · head_dim]`, `k` and `v` `[batch,
    /// kv_len, heads · head_dim]`.
    Separate { q: &'a [f32], k: &'a [f32], v: &'a [f32] },
    /// One `[batch, len, 3 · heads · head_dim]` tensor, each row Q's, K's and
    /// V's rows side by side (their projections as one product); `q_len ==
    /// kv_len`.
    Packed(&'a [f32]),
}

/// Q, K and V as row-major matrices with row stride `ld`, each slice from
/// its first element.
#[derive(Clone, Copy)]
pub(super) struct Rows<'a> {
    pub(super) q: &'a [f32],
    pub(super) k: &'a [f32],
    pub(super) v: &'a [f32],
    pub(super) ld: usize,
}

/// `dst = softmax(scale · Q·Kᵀ + mask) · V` per batch and head (see the
/// module doc); `dst` is `[batch, q_len, heads · head_dim]`.
pub fn attention(
    isa: Isa,
    shape: &AttentionShape,
    qkv: Qkv<'_>,
    mask: Option<Mask<'_>>,
    dst: &mut [f32],
    par: &dyn Parallel,
) -> Result<()> {
    let x = check(shape, qkv, mask, dst)?;
    let width = shape.width();
    if dst.is_empty() {
        return Ok(());
    }
    let rows = block_rows(shape, par.threads());
    let per_batch = shape.q_len.div_ceil(rows);
    // Tasks own whole rows of the output: (batch, block) in order.
    let chunks = Blocks::new(dst.len(), shape.q_len * width, rows * width);
    // Many query blocks per batch read the same heads' K and V: pack them
    // once instead of once per block (see [`PREPACK_BLOCKS`]).
    let packed = if per_batch >= PREPACK_BLOCKS && !short_keys(shape) {
        Some(PackedHeads::pack(isa, shape, x, par)?)
    } else {
        None
    };
    let done = try_for_each_block(par, dst, chunks, &|t, out| {
        let (b, row0) = (t / per_batch, t % per_batch * rows);
        block(isa, shape, b, row0, x, mask, packed.as_ref(), out)
    });
    if let Some(p) = packed {
        p.keep();
    }
    done
}

/// Every (batch, head)'s K (as Kᵀ, `head_dim x kv_len`) and V (`kv_len x
/// head_dim`) packed for the GEMM, in one buffer that the calling thread
/// keeps between runs ([`PackedHeads::keep`]): packing ahead allocates
/// nothing in steady state.
struct PackedHeads {
    data: Arc<AlignedBytes>,
    target: Target,
    head_dim: usize,
    kv_len: usize,
    /// f32 per head: its K at 0, its V at `v_at`, each 64-byte aligned.
    stride: usize,
    v_at: usize,
}

/// Largest [`PackedHeads`] buffer a thread keeps between runs (BERT-base at
/// batch 8 x sequence 512 needs 24 MiB); a bigger one is freed after its run.
const PACKED_KEEP_MAX: usize = 64 << 20;

thread_local! {
    /// This thread's [`PackedHeads`] buffer, kept between runs.
    static PACKED: Cell<Option<Arc<AlignedBytes>>> = const { Cell::new(None) };
}

impl PackedHeads {
    /// Packs every head of `k` and `v` over `par`, one task per head.
    fn pack(isa: Isa, shape: &AttentionShape, x: Rows<'_>, par: &dyn Parallel) -> Result<PackedHeads> {
        let target = isa.target();
        let (ld, d, n) = (x.ld, shape.head_dim, shape.kv_len);
        let (k_len, v_len) = (PackedB::packed_len(target, d, n), PackedB::packed_len(target, n, d));
        // Heads start on 64-byte boundaries (16 floats), as weights do.
        let v_at = k_len.next_multiple_of(16);
        let stride = v_at + v_len.next_multiple_of(16);
        let count = shape.batch * shape.heads;
        let total = stride
            .checked_mul(count)
            .and_then(|t| t.checked_mul(size_of::<f32>()))
            .ok_or_else(|| Error::runtime(format!("attention {shape:?}: packed heads are too large")))?;
        let mut data = PACKED
            .with(Cell::take)
            .filter(|b| b.len() >= total)
            .unwrap_or_else(|| Arc::new(AlignedBytes::zeroed(total)));
        // Unique: the buffer was this thread's, and `keep` returns it only
        // after every view made by `head` is gone.
        let bytes = Arc::get_mut(&mut data).ok_or_else(|| Error::runtime("attention: packed heads are shared"))?;
        let floats = &mut bytemuck::cast_slice_mut::<u8, f32>(bytes.bytes_mut())[..stride * count];
        try_for_each_block(par, floats, Blocks::new(stride * count, stride, stride), &|i, head| {
            let at = (i / shape.heads) * n * ld + (i % shape.heads) * d;
            let (kh, vh) = head.split_at_mut(v_at);
            // Kᵀ: K's rows are the keys (B transposed).
            PackedB::pack_into(target, &x.k[at..], ld, d, n, true, &mut kh[..k_len])?;
            PackedB::pack_into(target, &x.v[at..], ld, n, d, false, &mut vh[..v_len])
        })?;
        Ok(PackedHeads {
            data,
            target,
            head_dim: d,
            kv_len: n,
            stride,
            v_at,
        })
    }

    /// Views of head `i`'s (batch-major) packed K and V.
    fn head(&self, i: usize) -> Result<(PackedB, PackedB)> {
        let (d, n, t) = (self.head_dim, self.kv_len, self.target);
        let view = |at: usize, len: usize| Weight::in_storage(self.data.clone(), at * size_of::<f32>(), len);
        let at = i * self.stride;
        Ok((
            PackedB::from_parts(t, d, n, view(at, PackedB::packed_len(t, d, n))?)?,
            PackedB::from_parts(t, n, d, view(at + self.v_at, PackedB::packed_len(t, n, d))?)?,
        ))
    }

    /// Keeps the buffer for this thread's next run, unless it is huge.
    fn keep(self) {
        if self.data.len() <= PACKED_KEEP_MAX {
            PACKED.with(|c| c.set(Some(self.data)));
        }
    }
}

/// Checks the sizes of everything against `shape`; Q, K and V as rows.
fn check<'a>(shape: &AttentionShape, qkv: Qkv<'a>, mask: Option<Mask<'_>>, dst: &[f32]) -> Result<Rows<'a>> {
    let bad = |what: &str, got: usize, want: usize| {
        Err(Error::runtime(format!(
            "attention {shape:?}: {what} has {got} elements, expected {want}"
        )))
    };
    if shape.head_dim == 0 || shape.heads == 0 {
        return Err(Error::runtime(format!("attention {shape:?}: no heads")));
    }
    if dst.len() != shape.q_elems() {
        return bad("the output", dst.len(), shape.q_elems());
    }
    if let Some(m) = mask {
        let need = mask_extent(shape, m.strides);
        if m.data.len() < need {
            return bad("the mask", m.data.len(), need);
        }
    }
    let width = shape.width();
    match qkv {
        Qkv::Separate { q, k, v } => {
            if q.len() != shape.q_elems() {
                return bad("Q", q.len(), shape.q_elems());
            }
            if k.len() != shape.kv_elems() {
                return bad("K", k.len(), shape.kv_elems());
            }
            if v.len() != shape.kv_elems() {
                return bad("V", v.len(), shape.kv_elems());
            }
            Ok(Rows { q, k, v, ld: width })
        }
        Qkv::Packed(x) => {
            if shape.q_len != shape.kv_len {
                return Err(Error::runtime(format!(
                    "attention {shape:?}: packed Q, K and V need as many queries as keys"
                )));
            }
            if x.len() != 3 * shape.q_elems() {
                return bad("packed Q, K and V", x.len(), 3 * shape.q_elems());
            }
            // Empty (no rows): K and V are empty too.
            Ok(Rows {
                q: x,
                k: x.get(width..).unwrap_or_default(),
                v: x.get(2 * width..).unwrap_or_default(),
                ld: 3 * width,
            })
        }
    }
}

/// Whether [`attention_short`]'s loops run the heads instead of two GEMMs each.
fn short_keys(shape: &AttentionShape) -> bool {
    shape.kv_len <= attention_short::SHORT_KEYS
}

/// One task: query rows `row0..` (as many as `out` holds) of batch `b`, all heads.
#[allow(clippy::too_many_arguments)]
fn block(
    isa: Isa,
    shape: &AttentionShape,
    b: usize,
    row0: usize,
    x: Rows<'_>,
    mask: Option<Mask<'_>>,
    packed: Option<&PackedHeads>,
    out: &mut [f32],
) -> Result<()> {
    if short_keys(shape) {
        let len = attention_short::scratch_len(shape);
        let mut buf = gemm::take_scratch(&SCORES, len);
        let scratch = &mut bytemuck::cast_slice_mut::<u8, f32>(buf.bytes_mut())[..len];
        let blk = ShortBlock {
            isa,
            shape,
            x,
            mask,
            b,
            row0,
        };
        super::short_heads_isa(isa, &blk, scratch, out);
        gemm::put_scratch(&SCORES, buf);
        return Ok(());
    }
    let (width, n) = (shape.width(), shape.kv_len);
    let rows = out.len() / width;
    let mut buf = gemm::take_scratch(&SCORES, 2 * rows * n);
    let (scores, probs) = bytemuck::cast_slice_mut::<u8, f32>(buf.bytes_mut())[..2 * rows * n].split_at_mut(rows * n);
    let done = heads(isa, shape, b, row0, x, mask, packed, scores, probs, out);
    gemm::put_scratch(&SCORES, buf);
    done
}

thread_local! {
    /// Each thread's score and probability blocks, kept between runs.
    static SCORES: std::cell::Cell<Option<crate::tensor::AlignedBytes>> = const { std::cell::Cell::new(None) };
}

/// Every head of one block: [`block`]'s loop, over its scratch.
#[allow(clippy::too_many_arguments)]
fn heads(
    isa: Isa,
    shape: &AttentionShape,
    b: usize,
    row0: usize,
    x: Rows<'_>,
    mask: Option<Mask<'_>>,
    packed: Option<&PackedHeads>,
    scores: &mut [f32],
    probs: &mut [f32],
    out: &mut [f32],
) -> Result<()> {
    let (width, d, n) = (shape.width(), shape.head_dim, shape.kv_len);
    let rows = out.len() / width;
    let q0 = (b * shape.q_len + row0) * x.ld;
    let kv0 = b * shape.kv_len * x.ld;
    for h in 0..shape.heads {
        let col = h * d;
        let head = packed.map(|p| p.head(b * shape.heads + h)).transpose()?;
        // A mask that is the same for every query row (a key mask, [B,1,1,S])
        // is the GEMM's per-column bias, added in registers.
        let key_mask = mask.filter(|m| m.strides[2] == 0).map(|m| {
            let at = b * m.strides[0] + h * m.strides[1];
            Bias::PerColumn(&m.data[at..at + n])
        });
        let epi = Epilogue {
            alpha: shape.scale,
            bias: key_mask.unwrap_or(Bias::None),
            ..Epilogue::PLAIN
        };
        // scores = scale · Q_h · K_hᵀ (+ key mask): K's rows are the keys (B transposed).
        let (qh, kh) = (&x.q[q0 + col..], &x.k[kv0 + col..]);
        let qk = Operands {
            a: qh,
            lda: x.ld,
            b: kh,
            ldb: x.ld,
            trans_b: true,
            packed: head.as_ref().map(|(k, _)| k),
        };
        product(isa, rows, n, d, qk, scores, n, &epi)?;
        if let Some(m) = mask.filter(|_| key_mask.is_none()) {
            add_mask(scores, n, m, b, h, row0);
        }
        super::softmax_isa(isa, n, 1, true, scores, probs);
        // out[:, h·d..] = P · V_h, written with the output's row stride.
        let pv = Operands {
            a: probs,
            lda: n,
            b: &x.v[kv0 + col..],
            ldb: x.ld,
            trans_b: false,
            packed: head.as_ref().map(|(_, v)| v),
        };
        product(isa, rows, d, n, pv, &mut out[col..], width, &Epilogue::PLAIN)?;
    }
    Ok(())
}

/// A and B of one product (A never transposed); B read from `b` unless
/// it is already `packed`.
struct Operands<'a> {
    a: &'a [f32],
    lda: usize,
    b: &'a [f32],
    ldb: usize,
    trans_b: bool,
    packed: Option<&'a PackedB>,
}

/// `c (m x n, row stride ldc) = epi(A · op(B))` on this thread.
#[allow(clippy::too_many_arguments)]
fn product(
    isa: Isa,
    m: usize,
    n: usize,
    k: usize,
    x: Operands<'_>,
    c: &mut [f32],
    ldc: usize,
    epi: &Epilogue<'_>,
) -> Result<()> {
    match x.packed {
        Some(b) => gemm::gemm_packed(isa, m, x.a, x.lda, b, c, ldc, epi, &Serial),
        None => gemm::gemm(
            isa, m, n, k, x.a, x.lda, false, x.b, x.ldb, x.trans_b, c, ldc, epi, &Serial,
        ),
    }
}

fn add_mask(scores: &mut [f32], n: usize, m: Mask<'_>, b: usize, h: usize, row0: usize) {
    let base = b * m.strides[0] + h * m.strides[1];
    for (i, row) in scores.chunks_exact_mut(n).enumerate() {
        let at = base + (row0 + i) * m.strides[2];
        for (s, &x) in row.iter_mut().zip(&m.data[at..at + n]) {
            *s += x;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::parallel::ScopedThreads;
    use crate::target::Target;

    fn data(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(7);
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                ((s >> 8) as f32 / (1u32 << 24) as f32) * 4.0 - 2.0
            })
            .collect()
    }

    /// The definition, in f64, one (batch, head, query) at a time.
    fn reference(shape: &AttentionShape, q: &[f32], k: &[f32], v: &[f32], mask: Option<Mask<'_>>) -> Vec<f32> {
        let (w, d) = (shape.width(), shape.head_dim);
        let mut out = vec![0f32; shape.q_elems()];
        for b in 0..shape.batch {
            for h in 0..shape.heads {
                for i in 0..shape.q_len {
                    let qi = &q[(b * shape.q_len + i) * w + h * d..][..d];
                    let mut s: Vec<f64> = (0..shape.kv_len)
                        .map(|j| {
                            let kj = &k[(b * shape.kv_len + j) * w + h * d..][..d];
                            let dot: f64 = qi.iter().zip(kj).map(|(&x, &y)| x as f64 * y as f64).sum();
                            let add = mask.map_or(0.0, |m| {
                                m.data[b * m.strides[0] + h * m.strides[1] + i * m.strides[2] + j] as f64
                            });
                            dot * shape.scale as f64 + add
                        })
                        .collect();
                    let mx = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    s.iter_mut().for_each(|x| *x = (*x - mx).exp());
                    let total: f64 = s.iter().sum();
                    for c in 0..d {
                        let acc: f64 = (0..shape.kv_len)
                            .map(|j| s[j] / total * v[(b * shape.kv_len + j) * w + h * d + c] as f64)
                            .sum();
                        out[(b * shape.q_len + i) * w + h * d + c] = acc as f32;
                    }
                }
            }
        }
        out
    }

    fn run(shape: AttentionShape, mask_kind: u8) {
        let q = data(shape.q_elems(), 1);
        let k = data(shape.kv_elems(), 2);
        let v = data(shape.kv_elems(), 3);
        let (strides, len) = match mask_kind {
            // [B, 1, 1, Sk] of 0 / -10000, as BERT's extended mask.
            1 => ([shape.kv_len, 0, 0], shape.batch * shape.kv_len),
            // [B, H, Sq, Sk] of arbitrary values.
            2 => (
                [
                    shape.heads * shape.q_len * shape.kv_len,
                    shape.q_len * shape.kv_len,
                    shape.kv_len,
                ],
                shape.batch * shape.heads * shape.q_len * shape.kv_len,
            ),
            _ => ([0, 0, 0], 0),
        };
        let mdata: Vec<f32> = match mask_kind {
            1 => (0..len).map(|i| if i % 5 == 3 { -10000.0 } else { 0.0 }).collect(),
            _ => data(len, 4),
        };
        let mask = (mask_kind != 0).then_some(Mask { data: &mdata, strides });
        let want = reference(&shape, &q, &k, &v, mask);
        let packed = (shape.q_len == shape.kv_len).then(|| pack_rows(&shape, &q, &k, &v));
        for isa in Target::ALL.into_iter().filter_map(Isa::new) {
            for threads in [1, 2] {
                let par = ScopedThreads(threads);
                let mut got = vec![f32::NAN; shape.q_elems()];
                let separate = Qkv::Separate { q: &q, k: &k, v: &v };
                attention(isa, &shape, separate, mask, &mut got, &par).unwrap();
                for (i, (&g, &w)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (g - w).abs() <= 1e-5 + 1e-4 * w.abs(),
                        "{shape:?} mask {mask_kind} {isa:?} {threads} threads: [{i}] {g} vs {w}"
                    );
                }
                // Q, K and V side by side in each row: the same results, bit for bit.
                if let Some(x) = &packed {
                    let mut same = vec![f32::NAN; shape.q_elems()];
                    attention(isa, &shape, Qkv::Packed(x), mask, &mut same, &par).unwrap();
                    assert_eq!(
                        same, got,
                        "{shape:?} mask {mask_kind} {isa:?} {threads} threads, packed"
                    );
                }
            }
        }
    }

    /// Each row of Q, K and V one after another: `[batch, len, 3 · width]`.
    fn pack_rows(shape: &AttentionShape, q: &[f32], k: &[f32], v: &[f32]) -> Vec<f32> {
        let w = shape.width();
        q.chunks(w)
            .zip(k.chunks(w))
            .zip(v.chunks(w))
            .flat_map(|((q, k), v)| [q, k, v].concat())
            .collect()
    }

    #[test]
    fn matches_the_definition() {
        let shapes = [
            (1, 1, 1, 1, 1),
            (2, 3, 7, 7, 5),
            (3, 2, 5, 9, 17),
            (1, 4, 77, 77, 32),
            (2, 2, 33, 33, 8),
        ];
        for shape in shapes.map(scaled) {
            for mask in [0, 1, 2] {
                run(shape, mask);
            }
        }
    }

    /// `(batch, heads, q_len, kv_len, head_dim)` with the usual 1/√head_dim scale.
    fn scaled((batch, heads, q_len, kv_len, head_dim): (usize, usize, usize, usize, usize)) -> AttentionShape {
        AttentionShape {
            batch,
            heads,
            q_len,
            kv_len,
            head_dim,
            scale: 1.0 / (head_dim as f32).sqrt(),
        }
    }

    #[test]
    fn short_keys_match_the_definition() {
        // Up to 32 keys run attention_short's loops: a whole chunk of keys,
        // a chunk and a part, two whole ones; head sizes with a tail of
        // columns (40, 5) and without (64); more query rows than keys, in
        // groups of 4 and a rest; a query row alone.
        let shapes = [
            (2, 3, 16, 16, 32),
            (1, 2, 24, 24, 40),
            (2, 2, 32, 32, 64),
            (1, 3, 37, 12, 5),
            (3, 1, 1, 20, 16),
        ];
        for shape in shapes.map(scaled) {
            assert!(short_keys(&shape), "{shape:?}");
            for mask in [0, 1, 2] {
                run(shape, mask);
            }
        }
        assert!(!short_keys(&scaled((1, 1, 1, attention_short::SHORT_KEYS + 1, 1))));
    }

    #[test]
    fn long_sequences_run_in_blocks() {
        // 600 keys: blocks of 27 query rows, never a full score matrix.
        let shape = AttentionShape {
            batch: 1,
            heads: 2,
            q_len: 600,
            kv_len: 600,
            head_dim: 16,
            scale: 0.25,
        };
        assert_eq!(
            block_rows(&shape, 1),
            600usize.div_ceil(600usize.div_ceil(SCORE_FLOATS / 600))
        );
        assert!(block_rows(&shape, 1) * shape.kv_len <= SCORE_FLOATS);
        // Enough blocks that K and V are packed ahead: that path is tested too.
        assert!(shape.q_len.div_ceil(block_rows(&shape, 1)) >= PREPACK_BLOCKS);
        run(shape, 1);
    }

    #[test]
    fn threads_get_several_blocks() {
        let shape = AttentionShape {
            batch: 1,
            heads: 1,
            q_len: 128,
            kv_len: 128,
            head_dim: 8,
            scale: 1.0,
        };
        assert_eq!(block_rows(&shape, 1), 128);
        assert_eq!(block_rows(&shape, 2), 64);
        // Three batches on two threads: six tasks, not three.
        let three = AttentionShape { batch: 3, ..shape };
        assert_eq!(block_rows(&three, 2), 64);
        let four = AttentionShape { batch: 4, ..shape };
        assert_eq!(block_rows(&four, 2), 128);
    }

    #[test]
    fn refuses_wrong_sizes() {
        let shape = AttentionShape {
            batch: 2,
            heads: 2,
            q_len: 3,
            kv_len: 4,
            head_dim: 2,
            scale: 1.0,
        };
        let isa = Isa::new(Target::Generic).unwrap();
        let (q, kv) = (vec![0f32; shape.q_elems()], vec![0f32; shape.kv_elems()]);
        let mut out = vec![0f32; shape.q_elems()];
        let sep = |q, k, v| Qkv::Separate { q, k, v };
        assert!(attention(isa, &shape, sep(&q, &kv, &kv), None, &mut out, &Serial).is_ok());
        assert!(attention(isa, &shape, sep(&q[1..], &kv, &kv), None, &mut out, &Serial).is_err());
        assert!(attention(isa, &shape, sep(&q, &kv, &kv[1..]), None, &mut out, &Serial).is_err());
        let short = Mask {
            data: &[0.0; 7],
            strides: [4, 0, 0],
        };
        assert_eq!(mask_extent(&shape, short.strides), 8);
        assert!(attention(isa, &shape, sep(&q, &kv, &kv), Some(short), &mut out, &Serial).is_err());
        // Packed: as many queries as keys, and exactly three rows' worth.
        let all = vec![0f32; 3 * shape.q_elems()];
        assert!(attention(isa, &shape, Qkv::Packed(&all), None, &mut out, &Serial).is_err());
        let square = AttentionShape { kv_len: 3, ..shape };
        assert!(attention(isa, &square, Qkv::Packed(&all), None, &mut out, &Serial).is_ok());
        assert!(attention(isa, &square, Qkv::Packed(&all[1..]), None, &mut out, &Serial).is_err());
    }
}
