//! Single-precision GEMM: `C = epilogue(A · B)`, blocked for the cache and
//! computed by register-blocked microkernels, one per [`Target`].
//!
//! # Layout
//! B (`K x N`) is stored in *panels* of `NR` columns ([`PackedB`]): panel `p`
//! holds columns `p*NR .. p*NR+NR` as `K` rows of `NR` values (k-major), the
//! last panel zero-padded. The layout depends only on `NR`, which is fixed per
//! target ([`LAYOUT_VERSION`] names it), so weights are packed once at compile
//! time and can be stored packed in a context binary and used in place.
//! A is packed per call into `MR`-row micro-panels of at most `MC x KC`
//! values (a few hundred KiB), which also absorbs `trans_a` — except where
//! the target's microkernel reads a row-major A in place (AVX2, as MLAS
//! does: packing cost more than it saved, see `driver::reads_a_in_place`).
//!
//! # Loops
//! For each task's block of C (see [`Parallel`]): rows in blocks of `MC`,
//! K in equal blocks of at most `KC` ([`k_block`]; pack A), B panels
//! (`KC x NR`, from L1/L2), `MR`-row micro-panels of A (from L2): one microkernel call per `MR x NR` tile of C.
//! Each tile of a panel prefetches its share of the next panel over its K
//! loop (AVX2), so that a panel comes from memory while the previous one
//! is computed, not at the pace of its first tile.
//! The first K block overwrites C, later ones add to it; the last one applies
//! alpha and a per-column bias in registers as it stores each tile, and the
//! rest of the epilogue (activation, other biases, residual) in a pass over
//! the row block's whole rows once all its tiles are stored.
//!
//! | target | microkernel (MR x NR) | KC (at most) | MC (at most) |
//! |---|---|---|---|
//! | `x86_64-avx512` | 14 x 32 (28 zmm accumulators) | 768 | L2 / (4 KC), else 448 |
//! | `x86_64-avx2` | 6 x 16 (12 ymm accumulators) | 768 | L2 / (4 KC), else 168 |
//! | `x86_64-generic` | 6 x 8 (plain Rust, vectorised for SSE2) | 256 | 120 |
//!
//! MC comes from the L2 size the CPU reports ([`Blocking::host`]): the
//! packed `MC x KC` block of A fills one core's L2, and is read once per B
//! panel. (On a Zen 3, 512 KiB of L2: 168 rows; 120 and 240 rows ran up to
//! 8% slower at K = 768 and 3072.)
//!
//! `M = 1` runs a dedicated GEMV path (no packing of A, no K blocking).
//!
//! # Results
//! Every element of C is computed by the same sequence of operations whatever
//! the number of threads or tasks, so results do not depend on `Parallel`.
//! They depend on the target (FMA or not, blocking) and, for `M = 1`, on the path.

mod driver;
mod epilogue;
pub(crate) use epilogue::{activate, activate_with};
mod kernels;
pub(crate) use kernels::by_rows;
#[cfg(target_arch = "x86_64")]
pub(crate) use kernels::RowBases;
mod pack;
#[cfg(test)]
mod tests;

use std::cell::Cell;
use std::ops::Range;
use std::sync::Arc;

use self::driver::{BPanels, CView, Epi};
use self::pack::{ASrc, BSrc};
use super::cache;
use super::parallel::Parallel;
use super::Isa;
use crate::error::{Error, Result};
use crate::target::Target;
use crate::tensor::{AlignedBytes, HugePageBytes, Storage, Weight};

/// Part `i` of `n` near-equal parts of `next` (packed weights to prefetch
/// while tile `i` of `n` runs), in whole 64-byte lines so that no line is
/// split between two tiles: the GEMM's row tiles and the direct
/// convolution's rows and border tiles each fetch their share of the next
/// weight panel this way.
pub(crate) fn prefetch_share(next: &[f32], i: usize, n: usize) -> &[f32] {
    prefetch_part(next, i, prefetch_chunk(next.len(), n))
}

/// The length of each of `n` shares of a panel of `len` values (see
/// [`prefetch_share`]), for callers that take many shares of equal panels.
pub(crate) fn prefetch_chunk(len: usize, n: usize) -> usize {
    const LINE: usize = 16;
    len.div_ceil(n.max(1)).next_multiple_of(LINE)
}

/// Share `i` of `next` in parts of `chunk` values ([`prefetch_chunk`]).
#[inline(always)]
pub(crate) fn prefetch_part(next: &[f32], i: usize, chunk: usize) -> &[f32] {
    let start = (i * chunk).min(next.len());
    &next[start..(start + chunk).min(next.len())]
}

/// Version of the [`PackedB`] layout (panel widths per target). A stored
/// packed weight is usable only by a kiln with the same version.
pub const LAYOUT_VERSION: u32 = 1;

/// Most K rows per block on AVX-512 and AVX2. Larger than the L1-sized 256
/// that textbook blocking gives: the microkernels do 28 (12) FMAs per 184
/// (88) bytes of A and B, which L2 feeds easily, while every K block more
/// costs a pass that reloads and stores C (MiniLM's K = 1536 products ran
/// ~10% slower with 256 than with 768 on an AMD EPYC with AVX-512; on a Zen 3
/// with AVX2, BERT's K = 768 and 3072 products 5-8% slower).
const KC_WIDE: usize = 768;

/// Blocking parameters of one target's kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Blocking {
    /// Rows of a microkernel tile.
    pub mr: usize,
    /// Columns of a microkernel tile = width of a B panel.
    pub nr: usize,
    /// Largest K block (see [`k_block`]).
    pub kc: usize,
    /// Row block: an `MC x KC` packed A block stays in L2.
    pub mc: usize,
}

impl Blocking {
    pub(crate) const fn of(target: Target) -> Blocking {
        match target {
            Target::Avx512 => Blocking {
                mr: 14,
                nr: 32,
                kc: KC_WIDE,
                mc: 448,
            },
            Target::Avx2 => Blocking {
                mr: 6,
                nr: 16,
                kc: KC_WIDE,
                mc: 168,
            },
            Target::Generic => Blocking {
                mr: 6,
                nr: 8,
                kc: 256,
                mc: 120,
            },
        }
    }

    /// [`Blocking::of`] with MC sized to this CPU's L2 ([`cache::host`]):
    /// the largest multiple of MR whose `MC x KC` packed A fits in the L2,
    /// at least 4 tiles and at most 448 rows (the largest measured). The
    /// table's MC where the CPU does not report its caches, and for the
    /// generic target. MC only groups rows, so results do not depend on it.
    pub(crate) fn host(target: Target) -> Blocking {
        let blk = Blocking::of(target);
        match cache::host() {
            Some(c) if target != Target::Generic => blk.with_l2(c.l2),
            _ => blk,
        }
    }

    /// This blocking with MC for an L2 of `l2` bytes (see [`Blocking::host`]).
    fn with_l2(self, l2: usize) -> Blocking {
        let rows = l2 / (size_of::<f32>() * self.kc) / self.mr * self.mr;
        Blocking {
            // 448 rounded down to whole tiles (AVX2's 6-row tiles on a 2 MiB L2).
            mc: rows.clamp(4 * self.mr, 448 / self.mr * self.mr),
            ..self
        }
    }
}

/// B (K x N, row-major, or its transpose) pre-packed into the microkernel's
/// panel layout for one target.
///
/// Plain data: `data` is a [`Weight`] so a context binary can store it packed
/// and load it in place (no packing at load).
#[derive(Clone, Debug)]
pub struct PackedB {
    target: Target,
    k: usize,
    n: usize,
    /// Panel width (`NR` of `target`).
    nr: usize,
    data: Weight,
}

impl PackedB {
    /// Packs `b`: `k x n` row-major, or `n x k` row-major (its transpose) if `trans_b`.
    /// The data is 64-byte aligned.
    ///
    /// # Panics
    /// If `b.len() != k * n`; [`PackedB::try_pack`] returns an error instead.
    pub fn pack(target: Target, b: &[f32], k: usize, n: usize, trans_b: bool) -> PackedB {
        Self::try_pack(target, b, k, n, trans_b).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`PackedB::pack`], with `Err(InvalidArgument)` if `b.len() != k * n`.
    pub fn try_pack(target: Target, b: &[f32], k: usize, n: usize, trans_b: bool) -> Result<PackedB> {
        if k.checked_mul(n) != Some(b.len()) {
            return Err(Error::invalid_argument(format!(
                "cannot pack a {k} x {n} matrix from {} values",
                b.len()
            )));
        }
        let nr = Blocking::of(target).nr;
        let len = Self::checked_len(target, k, n).ok_or_else(|| Error::invalid_argument("packed B is too large"))?;
        let byte_len = len * size_of::<f32>();
        let src = BSrc {
            data: b,
            ld: if trans_b { k } else { n },
            trans: trans_b,
        };
        // Weights of a few MiB and more stream from memory (the M = 1 GEMV
        // above all): huge pages where the system offers them.
        let huge = (byte_len >= HugePageBytes::HUGE_PAGE)
            .then(|| HugePageBytes::zeroed(byte_len).ok())
            .flatten();
        let storage: Arc<dyn Storage> = match huge {
            Some(mut bytes) => {
                pack::pack_b(src, 0..k, 0..n, nr, bytemuck::cast_slice_mut(bytes.bytes_mut()));
                Arc::new(bytes)
            }
            None => {
                let mut bytes = AlignedBytes::zeroed(byte_len);
                if len > 0 {
                    pack::pack_b(src, 0..k, 0..n, nr, bytemuck::cast_slice_mut(bytes.bytes_mut()));
                }
                Arc::new(bytes)
            }
        };
        let data = Weight::in_storage(storage, 0, len)?;
        Ok(PackedB { target, k, n, nr, data })
    }

    /// Packs `b` (`k x n` with row stride `ld`, or its transpose `n x k` if
    /// `trans_b`) into `out`, laid out as [`PackedB::try_pack`] lays it out:
    /// `out` has [`PackedB::packed_len`] values (a buffer kept between runs,
    /// which [`PackedB::from_parts`] then views).
    #[allow(clippy::too_many_arguments)]
    pub fn pack_into(
        target: Target,
        b: &[f32],
        ld: usize,
        k: usize,
        n: usize,
        trans_b: bool,
        out: &mut [f32],
    ) -> Result<()> {
        let (rows, cols) = if trans_b { (n, k) } else { (k, n) };
        check_matrix("B", b.len(), rows, cols, ld, false)?;
        if Self::checked_len(target, k, n) != Some(out.len()) {
            return Err(size_error(format_args!(
                "packed B of {k} x {n} does not fit {} values",
                out.len()
            )));
        }
        let src = BSrc {
            data: b,
            ld,
            trans: trans_b,
        };
        pack::pack_b(src, 0..k, 0..n, Blocking::of(target).nr, out);
        Ok(())
    }

    /// Rebuilds a packed B from stored parts. `Err(InvalidGraph)` unless `data`
    /// has exactly [`PackedB::packed_len`] elements, so a corrupt file cannot
    /// make a kernel read out of bounds.
    pub fn from_parts(target: Target, k: usize, n: usize, data: Weight) -> Result<PackedB> {
        match Self::checked_len(target, k, n) {
            Some(len) if len.checked_mul(4) == Some(data.byte_len()) => Ok(PackedB {
                target,
                k,
                n,
                nr: Blocking::of(target).nr,
                data,
            }),
            want => Err(Error::invalid_graph(format!(
                "packed {k} x {n} weight for {target} needs {} f32 but has {} bytes",
                want.map_or("too many".to_string(), |w| w.to_string()),
                data.byte_len()
            ))),
        }
    }

    pub fn target(&self) -> Target {
        self.target
    }

    pub fn k(&self) -> usize {
        self.k
    }

    /// Panel width: the data is `n / nr` (rounded up) panels of `k` rows of `nr`.
    pub fn nr(&self) -> usize {
        self.nr
    }

    /// Panel `p` (columns `p·nr ..`): `k` rows of `nr` values.
    pub fn panel(&self, p: usize) -> &[f32] {
        self.panels(p, 1)
    }

    /// Panels `p .. p + count`, one after the other.
    pub fn panels(&self, p: usize, count: usize) -> &[f32] {
        &self.data.as_slice()[p * self.k * self.nr..][..count * self.k * self.nr]
    }

    pub fn n(&self) -> usize {
        self.n
    }

    pub fn data(&self) -> &Weight {
        &self.data
    }

    /// Element count `pack` produces for (target, k, n) — lets a loader check a
    /// stored blob. `usize::MAX` if that would overflow (no blob can match it).
    pub fn packed_len(target: Target, k: usize, n: usize) -> usize {
        Self::checked_len(target, k, n).unwrap_or(usize::MAX)
    }

    fn checked_len(target: Target, k: usize, n: usize) -> Option<usize> {
        let nr = Blocking::of(target).nr;
        n.div_ceil(nr).checked_mul(nr)?.checked_mul(k)
    }
}

/// An activation applied to each element of C.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Activation {
    None,
    /// `max(x, 0)` (NaN stays NaN).
    Relu,
    /// `x < 0 ? alpha * x : x`.
    LeakyRelu(f32),
    Sigmoid,
    Tanh,
    /// `x/2 * (1 + erf(x / sqrt 2))`.
    GeluErf,
    /// `x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))`.
    GeluTanh,
    /// [`Activation::GeluErf`] fused from `(x * (1 + erf(x / sqrt 2))) * 0.5`:
    /// `+inf` for `x > FLT_MAX/2`, where that product overflows.
    GeluErfWritten,
    /// [`Activation::GeluTanh`] fused from `(x * (1 + tanh(..))) * 0.5`, likewise.
    GeluTanhWritten,
    /// `min(max(x, lo), hi)` (NaN stays NaN).
    Clip(f32, f32),
    // Activations (issue #13).
    /// `max(0, min(1, alpha * x + beta))`: (alpha, beta).
    HardSigmoid(f32, f32),
    /// `x * max(0, min(1, x / 6 + 1/2))`.
    HardSwish,
    /// `x * sigmoid(x)` (SiLU, Swish).
    Silu,
}

/// What happens to each tile of `C = alpha * A·B` before it is stored, in this order:
/// `+ bias` (see [`Bias`]), then `activation`, then `+ residual`
/// (`m x n`, dense: row stride `n`, e.g. a transformer's skip connection).
#[derive(Clone, Copy, Debug)]
pub struct Epilogue<'a> {
    pub alpha: f32,
    pub bias: Bias<'a>,
    pub activation: Activation,
    pub residual: Option<&'a [f32]>,
}

impl Epilogue<'_> {
    /// `C = A·B`.
    pub const PLAIN: Epilogue<'static> = Epilogue {
        alpha: 1.0,
        bias: Bias::None,
        activation: Activation::None,
        residual: None,
    };
}

impl Default for Epilogue<'_> {
    fn default() -> Self {
        Epilogue::PLAIN
    }
}

/// The term added to `alpha * A·B` (ONNX Gemm's `beta * C`, broadcast to `m x n`).
/// Only `Full` has a `beta`: fold it into the others' values.
#[derive(Clone, Copy, Debug)]
pub enum Bias<'a> {
    None,
    /// Length `n`: added to every row (shape `[n]` or `[1, n]`).
    PerColumn(&'a [f32]),
    /// Length `m`: added to every column (shape `[m, 1]`).
    PerRow(&'a [f32]),
    /// Added to every element (shape `[]` or `[1, 1]`).
    Scalar(f32),
    /// `beta * c`, `c` dense `m x n` (row stride `n`). With `beta == 0`, `c` is not read.
    Full {
        c: &'a [f32],
        beta: f32,
    },
}

/// C (m x n, row stride ldc) = epilogue(A (m x k, row stride lda) · B).
/// Kernel chosen by `isa` (from the program's target), which must be `b`'s target.
///
/// `Err(Runtime)` if a buffer is too small for its shape and stride or the
/// targets differ; `lda` is ignored when `m == 1`.
#[allow(clippy::too_many_arguments)]
pub fn gemm_packed(
    isa: Isa,
    m: usize,
    a: &[f32],
    lda: usize,
    b: &PackedB,
    c: &mut [f32],
    ldc: usize,
    epi: &Epilogue<'_>,
    par: &dyn Parallel,
) -> Result<()> {
    gemm_packed_parts(isa, m, a, lda, &[b], c, ldc, epi, par)
}

/// [`gemm_packed`] with B's columns of panels `panels` only: C (m x the
/// panels' columns, row stride ldc) = epilogue(A · those columns). A
/// task's share of a product whose other columns other tasks compute
/// (a Winograd convolution cut by output channels).
#[allow(clippy::too_many_arguments)]
pub fn gemm_packed_panels(
    isa: Isa,
    m: usize,
    a: &[f32],
    lda: usize,
    b: &PackedB,
    panels: Range<usize>,
    c: &mut [f32],
    ldc: usize,
    epi: &Epilogue<'_>,
    par: &dyn Parallel,
) -> Result<()> {
    let count = b.n.div_ceil(b.nr);
    if panels.start > panels.end || panels.end > count {
        return Err(size_error(format_args!("panels {panels:?} of a B with {count}")));
    }
    let mut all = parts_panels(isa, &[b])?;
    all.parts = [b.panels(panels.start, panels.len()); driver::MAX_PARTS];
    let n = (panels.end * b.nr).min(b.n) - panels.start * b.nr;
    product(isa, m, a, lda, (&all, n), c, ldc, epi, par)
}

/// [`gemm_packed`] with B made of up to three packed matrices side by side
/// (the same K; all but the last with whole panels): one product for Q, K
/// and V's projections, A read (or packed) once for all three.
#[allow(clippy::too_many_arguments)]
pub fn gemm_packed_parts(
    isa: Isa,
    m: usize,
    a: &[f32],
    lda: usize,
    parts: &[&PackedB],
    c: &mut [f32],
    ldc: usize,
    epi: &Epilogue<'_>,
    par: &dyn Parallel,
) -> Result<()> {
    let panels = parts_panels(isa, parts)?;
    let n = parts.iter().map(|p| p.n).sum();
    product(isa, m, a, lda, (&panels, n), c, ldc, epi, par)
}

/// C (m x n) = epilogue(A · the `n` columns of `panels`).
#[allow(clippy::too_many_arguments)]
fn product(
    isa: Isa,
    m: usize,
    a: &[f32],
    lda: usize,
    (panels, n): (&BPanels<'_>, usize),
    c: &mut [f32],
    ldc: usize,
    epi: &Epilogue<'_>,
    par: &dyn Parallel,
) -> Result<()> {
    let k = panels.height;
    check_matrix("A", a.len(), m, k, lda, false)?;
    let mut view = CView::new(c, m, n, ldc).map_err(|e| e.context("gemm output C"))?;
    let epi = Epi::new(epi, m, n)?;
    if m == 0 || n == 0 {
        return Ok(());
    }
    let a = ASrc {
        data: a,
        ld: if m == 1 { k } else { lda },
        trans: false,
    };
    if k == 0 {
        driver::epilogue_only(&mut view, &epi);
        return Ok(());
    }
    let blk = Blocking::host(isa.target());
    let gemv = m == 1;
    let kc = k_block(blk, k);
    let (row_parts, col_parts) = split_work(m, n, k, blk, par.threads(), gemv);
    run_tasks(&mut view, row_parts, col_parts, par, &|v: &mut CView<'_>| {
        if gemv {
            kernels::gemv(isa, a.data, panels, v, &epi)
        } else {
            kernels::blocked(isa, a, panels, v, 0..k, (blk.mc, kc), true, true, &epi)
        }
    });
    Ok(())
}

/// Whether `parts` can be read as one B side by side: one to three of
/// them, packed for one target with one K, all but the last whole panels
/// of the first's width. (Checked at run time and when a program loads.)
pub fn parts_fit(parts: &[&PackedB]) -> bool {
    let Some((first, _)) = parts.split_first() else {
        return false;
    };
    let inner_ok = |p: &PackedB| p.n == first.n && p.n > 0 && p.n.is_multiple_of(p.nr);
    parts.len() <= driver::MAX_PARTS
        && parts.iter().all(|p| p.target == first.target && p.k == first.k)
        && parts[..parts.len() - 1].iter().all(|p| inner_ok(p))
}

/// The panels of `parts` as one B, after checking that they fit together
/// ([`parts_fit`]) and were packed for `isa`'s target.
fn parts_panels<'a>(isa: Isa, parts: &[&'a PackedB]) -> Result<BPanels<'a>> {
    if !parts_fit(parts) {
        let shapes: Vec<String> = parts.iter().map(|p| format!("{} x {}", p.k, p.n)).collect();
        return Err(size_error(format_args!(
            "B's parts [{}] do not fit together",
            shapes.join(", ")
        )));
    }
    let first = parts[0];
    if first.target != isa.target() {
        return Err(size_error(format_args!(
            "B was packed for {} but the kernel runs for {}",
            first.target,
            isa.target()
        )));
    }
    let mut panels = BPanels::one(first.data.as_slice(), first.nr, 0, 0, first.k);
    if parts.len() > 1 {
        panels.part_panels = first.n / first.nr;
        panels.last_part = parts.len() - 1;
        for (slot, p) in panels.parts.iter_mut().zip(parts) {
            *slot = p.data.as_slice();
        }
    }
    Ok(panels)
}

/// Both operands at run time (attention scores Q·Kᵀ, batched MatMul of
/// activations): C (m x n, row stride ldc) = epilogue(op(A) · op(B)) with
/// op(A) m x k (A is `k x m` with row stride `lda` if `trans_a`) and op(B)
/// k x n (B is `n x k` with row stride `ldb` if `trans_b`).
///
/// B is packed on the fly in blocks of at most [`B_SCRATCH_MAX`] values;
/// `m == 1` reads B in place.
#[allow(clippy::too_many_arguments)]
pub fn gemm(
    isa: Isa,
    m: usize,
    n: usize,
    k: usize,
    a: &[f32],
    lda: usize,
    trans_a: bool,
    b: &[f32],
    ldb: usize,
    trans_b: bool,
    c: &mut [f32],
    ldc: usize,
    epi: &Epilogue<'_>,
    par: &dyn Parallel,
) -> Result<()> {
    check_matrix("A", a.len(), m, k, lda, trans_a)?;
    check_matrix("B", b.len(), k, n, ldb, trans_b)?;
    let mut view = CView::new(c, m, n, ldc).map_err(|e| e.context("gemm output C"))?;
    let epi = Epi::new(epi, m, n)?;
    if m == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 {
        driver::epilogue_only(&mut view, &epi);
        return Ok(());
    }
    let a = ASrc {
        data: a,
        ld: lda,
        trans: trans_a,
    };
    let b = BSrc {
        data: b,
        ld: ldb,
        trans: trans_b,
    };
    let blk = Blocking::host(isa.target());
    if m == 1 {
        let (rows, cols) = split_work(m, n, k, blk, par.threads(), true);
        run_tasks(&mut view, rows, cols, par, &|v: &mut CView<'_>| {
            kernels::vecmat(isa, k, a, b, v, &epi)
        });
        return Ok(());
    }
    // B in chunks of whole K blocks and whole panels, so that every element
    // sees the same K blocking as `gemm_packed` (same results).
    let kc = k_block(blk, k);
    let chunk_k = k.min(2 * kc);
    let chunk_n = n.min((B_SCRATCH_MAX / chunk_k) / blk.nr * blk.nr);
    let len = chunk_k * chunk_n.next_multiple_of(blk.nr);
    let mut buf = take_scratch(&B_SCRATCH, len);
    let scratch = &mut bytemuck::cast_slice_mut::<u8, f32>(buf.bytes_mut())[..len];
    for cols in ranges(0..n, chunk_n) {
        for ks in ranges(0..k, chunk_k) {
            let panels = cols.len().div_ceil(blk.nr);
            let packed = &mut scratch[..panels * blk.nr * ks.len()];
            kernels::pack_b(isa, b, ks.clone(), cols.clone(), packed);
            let panels = BPanels::one(packed, blk.nr, cols.start, ks.start, ks.len());
            let (first, last) = (ks.start == 0, ks.end == k);
            let (row_parts, col_parts) = split_work(m, cols.len(), ks.len(), blk, par.threads(), false);
            run_tasks(
                &mut view,
                row_parts,
                col_parts.shifted(cols.start),
                par,
                &|v: &mut CView<'_>| kernels::blocked(isa, a, &panels, v, ks.clone(), (blk.mc, kc), first, last, &epi),
            );
        }
    }
    put_scratch(&B_SCRATCH, buf);
    Ok(())
}

thread_local! {
    /// Each thread's packed-B buffer for [`gemm`], kept between calls:
    /// attention runs one product per head and batch.
    static B_SCRATCH: Cell<Option<AlignedBytes>> = const { Cell::new(None) };
    /// Each thread's packed-A buffer for the blocked loops.
    static A_SCRATCH: Cell<Option<AlignedBytes>> = const { Cell::new(None) };
}

/// This thread's buffer `key` with room for `len` floats (64-byte aligned,
/// so that no zmm load splits a cache line; contents unspecified): the one
/// kept from the last call when it is big enough. [`put_scratch`] keeps it
/// for the next call, so that products allocate nothing in steady state; a
/// nested call on the same thread gets a buffer of its own. No closure:
/// its code would be compiled outside the callers' target features.
#[inline(always)]
pub(super) fn take_scratch(
    key: &'static std::thread::LocalKey<Cell<Option<AlignedBytes>>>,
    len: usize,
) -> AlignedBytes {
    let bytes = len * size_of::<f32>();
    key.with(Cell::take)
        .filter(|b| b.len() >= bytes)
        .unwrap_or_else(|| AlignedBytes::zeroed(bytes))
}

/// Keeps `buf` as this thread's buffer `key` (see [`take_scratch`]).
#[inline(always)]
pub(super) fn put_scratch(key: &'static std::thread::LocalKey<Cell<Option<AlignedBytes>>>, buf: AlignedBytes) {
    key.with(|c| c.set(Some(buf)));
}

/// Rows of K per block for a product of depth `k`: `k` in equal blocks of at
/// most `blk.kc` (rounded up to a multiple of 4, the microkernel's unroll),
/// not full blocks and a short remainder: a short last block costs one more
/// pass over C for little work.
pub(crate) fn k_block(blk: Blocking, k: usize) -> usize {
    // E.g. AVX-512 (at most 768): K = 384 in one block, 1536 in two of 768, 1700 in three of 568.
    let blocks = k.div_ceil(blk.kc).max(1);
    k.div_ceil(blocks).next_multiple_of(4).max(4)
}

/// For the GEMM benchmark: runs `isa`'s microkernel `reps` times on one full
/// tile whose A and B panels (depth `kc`) stay in L1, and returns the flops
/// done; its rate is the ceiling of the whole GEMM (no packing, no misses).
pub fn microkernel_flops(isa: Isa, kc: usize, reps: usize) -> f64 {
    let blk = Blocking::of(isa.target());
    let mut c = vec![0.0f32; blk.mr * blk.nr];
    kernels::tile_repeat(isa, kc, reps, &mut c);
    std::hint::black_box(&c);
    2.0 * (blk.mr * blk.nr * kc * reps) as f64
}

/// Most values `gemm` packs B into at once (2 MiB of f32).
pub const B_SCRATCH_MAX: usize = 512 * 1024;

/// Smallest amount of work (flops) worth one more task: about 5 µs of one core.
const MIN_FLOPS_PER_TASK: usize = 1 << 20;

/// GEMV tasks per thread (see [`split_work`]).
const GEMV_TASKS_PER_THREAD: usize = 4;

/// Runs `f` on one view per (row part, column part), as parallel tasks.
fn run_tasks(view: &mut CView<'_>, rows: Parts, cols: Parts, par: &dyn Parallel, f: &(dyn Fn(&mut CView<'_>) + Sync)) {
    if rows.count() * cols.count() == 1 {
        // One task (one thread, or little work): no views to allocate.
        return f(&mut view.part(rows.get(0), cols.get(0)));
    }
    view.for_each_part(rows, cols, par, f);
}

/// Splits an `m x n` product into row and column parts, one task per pair:
/// as many tasks as threads allow and the work justifies, shaped to minimise
/// the slowest task (tile compute, plus A packing repeated per column part and
/// B streaming repeated per row part). Parts are whole tiles (`mr`, `nr`).
fn split_work(m: usize, n: usize, k: usize, blk: Blocking, threads: usize, gemv: bool) -> (Parts, Parts) {
    let flops = 2.0 * m as f64 * n as f64 * k as f64;
    // GEMV streams B from memory: it pays off to split much earlier.
    let work = if gemv { flops * 8.0 } else { flops };
    // A GEMV task packs nothing, so it can be cut finer: ORT's pool hands
    // tasks out dynamically, and a worker that wakes late then costs a quarter
    // of its share instead of all of it (the caller takes its tasks).
    let per_thread = if gemv && threads > 1 { GEMV_TASKS_PER_THREAD } else { 1 };
    let tasks = (threads * per_thread)
        .min(1 + (work / MIN_FLOPS_PER_TASK as f64) as usize)
        .max(1);
    let (row_blocks, panels) = (m.div_ceil(blk.mr), n.div_ceil(blk.nr));
    let mut best: Option<(f64, usize, usize)> = None;
    for mt in 1..=tasks {
        let nt = tasks / mt;
        if mt * nt != tasks || (gemv && mt > 1) || mt > row_blocks || nt > panels {
            continue;
        }
        // The largest part gets ceil(blocks / parts) blocks.
        let rows = (row_blocks.div_ceil(mt) * blk.mr).min(m) as f64;
        let cols = (panels.div_ceil(nt) * blk.nr) as f64;
        let cost = k as f64 * (rows * cols / blk.nr as f64 + rows + cols / blk.nr as f64);
        if best.is_none_or(|(c, _, _)| cost < c) {
            best = Some((cost, mt, nt));
        }
    }
    let (_, mt, nt) = best.unwrap_or((0.0, 1, 1));
    (Parts::new(m, blk.mr, mt), Parts::new(n, blk.nr, nt))
}

/// `start..start + len` in `count` ranges of whole `unit`s, sizes differing
/// by at most one unit: a value, so that splitting a product allocates
/// nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Parts {
    start: usize,
    len: usize,
    unit: usize,
    count: usize,
}

impl Parts {
    fn new(len: usize, unit: usize, count: usize) -> Parts {
        let units = len.div_ceil(unit);
        Parts {
            start: 0,
            len,
            unit,
            count: count.clamp(1, units.max(1)),
        }
    }

    /// The same parts moved to start at `start`.
    fn shifted(self, start: usize) -> Parts {
        Parts { start, ..self }
    }

    pub(crate) fn count(&self) -> usize {
        self.count
    }

    /// Part `i` (`i < count`).
    pub(crate) fn get(&self, i: usize) -> Range<usize> {
        let (units, count) = (self.len.div_ceil(self.unit), self.count);
        let before = |i: usize| (i * (units / count) + i.min(units % count)) * self.unit;
        let (a, b) = (before(i).min(self.len), before(i + 1).min(self.len));
        self.start + a..self.start + b
    }

    #[cfg(test)]
    pub(crate) fn iter(&self) -> impl Iterator<Item = Range<usize>> + '_ {
        (0..self.count).map(|i| self.get(i))
    }
}

/// `r` in consecutive pieces of at most `step`.
fn ranges(r: Range<usize>, step: usize) -> impl Iterator<Item = Range<usize>> {
    let end = r.end;
    r.step_by(step.max(1)).map(move |s| s..(s + step).min(end))
}

/// Checks that a `rows x cols` matrix (stored transposed if `trans`) with row
/// stride `ld` fits in `len` values. A single row (or column, transposed) may
/// have any stride.
fn check_matrix(name: &str, len: usize, rows: usize, cols: usize, ld: usize, trans: bool) -> Result<()> {
    let (r, c) = if trans { (cols, rows) } else { (rows, cols) };
    if r == 0 || c == 0 {
        return Ok(());
    }
    let need = if r == 1 {
        Some(c)
    } else if ld < c {
        return Err(size_error(format_args!(
            "{name} has rows of {c} values but a row stride of {ld}"
        )));
    } else {
        (r - 1).checked_mul(ld).and_then(|x| x.checked_add(c))
    };
    match need {
        Some(need) if need <= len => Ok(()),
        _ => Err(size_error(format_args!(
            "{name} ({}{r} x {c}, row stride {ld}) does not fit in {len} values",
            if trans { "transposed, " } else { "" }
        ))),
    }
}

/// Mismatched sizes here mean a corrupt program, not bad user input.
fn size_error(what: std::fmt::Arguments<'_>) -> Error {
    Error::runtime(format!("kiln gemm given inconsistent buffers: {what}"))
}
