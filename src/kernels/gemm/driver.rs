//! The blocked loops around the microkernels, written once (generic over
//! [`Kernel`], `#[inline(always)]`) and compiled per target in `kernels.rs`;
//! plus the views of C that let parallel tasks write disjoint blocks of it.

use std::marker::PhantomData;
use std::ops::Range;

use super::epilogue::{activate_with, MulAdd, Plain};
pub(super) use super::pack::{pack_a, pack_b};
use super::pack::{row_tiles, ASrc, BSrc};
use super::{put_scratch, size_error, take_scratch, Activation, Bias, Epilogue, Parts, A_SCRATCH};
use crate::error::Result;
use crate::kernels::parallel::Parallel;

/// A target's microkernel and blocking.
#[allow(unsafe_code)] // `tile` is unsafe to call: it needs the target's instructions
pub(super) trait Kernel {
    const MR: usize;
    const NR: usize;

    /// `tile = store(A · B)` for one tile of `tile.rows() <= MR` rows and
    /// `tile.cols() <= NR` columns: `a` is a packed A micro-panel (`kc` groups
    /// of `tile.rows()` values), `b` a B panel (`kc` rows of `NR` values).
    ///
    /// # Safety
    /// The CPU supports the target's instructions. (Sizes are checked inside.)
    unsafe fn tile(kc: usize, a: &[f32], b: &[f32], tile: &mut Tile<'_>, store: &Store<'_>);

    /// Whether [`Kernel::tile_direct`] exists for this target.
    const DIRECT_A: bool = false;

    /// [`Kernel::tile`] with A read in place: the tile's row `i` is
    /// `a[i * lda..][..kc]`. Same operations in the same order, so the same
    /// results. Only called where [`Kernel::DIRECT_A`] holds.
    ///
    /// # Safety
    /// As [`Kernel::tile`]'s.
    unsafe fn tile_direct(kc: usize, a: &[f32], lda: usize, b: &[f32], tile: &mut Tile<'_>, store: &Store<'_>) {
        let _ = (kc, a, lda, b, tile, store);
        unreachable!("this target's kernel reads A packed only");
    }

    /// `a * b + c`, fused where the target has FMA.
    fn madd(a: f32, b: f32, c: f32) -> f32;

    /// How the epilogue's activations evaluate their polynomials (fused
    /// where the target has FMA).
    type Madd: MulAdd;

    /// [`pack_a`] with `MR` rows per micro-panel.
    ///
    /// # Safety
    /// The CPU supports the target's instructions.
    unsafe fn pack_a(a: ASrc<'_>, rows: Range<usize>, ks: Range<usize>, dst: &mut [f32]);

    /// [`pack_b`] with `NR` columns per panel.
    ///
    /// # Safety
    /// The CPU supports the target's instructions.
    unsafe fn pack_b(b: BSrc<'_>, ks: Range<usize>, cols: Range<usize>, dst: &mut [f32]);
}

/// How a microkernel stores its sums `acc` into C:
/// `c = (acc + (accumulate ? c : 0)) * scale + bias[j]`.
#[derive(Clone, Copy)]
pub(super) struct Store<'a> {
    pub accumulate: bool,
    pub scale: f32,
    /// The tile's columns of a per-column bias (at least `tile.cols()` values).
    pub bias: Option<&'a [f32]>,
    /// B values to prefetch while the tile runs, spread over its K loop:
    /// its share of the next panel (see [`super::prefetch_share`]). Kernels
    /// may ignore it.
    pub next: &'a [f32],
}

/// Exclusive access to the block `rows x cols` (global indices) of a C with
/// row stride `ld`, like a `&mut` to those elements.
///
/// Invariant: `ptr.add(i * ld + j)` is in bounds of one live `&'a mut [f32]`
/// for every `(i, j)` in `rows x cols`, and no other live `CView` or `Tile`
/// covers any of those elements.
pub(super) struct CView<'a> {
    ptr: *mut f32,
    ld: usize,
    rows: Range<usize>,
    cols: Range<usize>,
    _c: PhantomData<&'a mut [f32]>,
}

// SAFETY: a CView is an exclusive borrow of f32 values, like `&mut [f32]`.
#[allow(unsafe_code)]
unsafe impl Send for CView<'_> {}

// SAFETY: through a shared `&CView` one can only read its pointer, stride and
// ranges, or make views with `sub`, which is private to this module and
// whose callers keep the views they make disjoint (`part`,
// `for_each_part`).
#[allow(unsafe_code)]
unsafe impl Sync for CView<'_> {}

impl<'a> CView<'a> {
    /// The whole `m x n` matrix in `c` (row stride `ld`), after checking it fits.
    pub fn new(c: &'a mut [f32], m: usize, n: usize, ld: usize) -> Result<CView<'a>> {
        super::check_matrix("C", c.len(), m, n, ld, false)?;
        // A single row may have any stride; no element of another row is touched.
        let ld = if m == 1 { n } else { ld };
        Ok(CView {
            ptr: c.as_mut_ptr(),
            ld,
            rows: 0..m,
            cols: 0..n,
            _c: PhantomData,
        })
    }

    pub fn rows(&self) -> Range<usize> {
        self.rows.clone()
    }

    pub fn cols(&self) -> Range<usize> {
        self.cols.clone()
    }

    /// Runs `f` on one view per (row part, column part) over `par`, one task
    /// per pair, the views made by the tasks themselves: nothing allocated.
    /// Panics unless the parts are inside `self`.
    pub fn for_each_part(&mut self, rows: Parts, cols: Parts, par: &dyn Parallel, f: &(dyn Fn(&mut CView<'_>) + Sync)) {
        let (whole, per_row) = (&*self, cols.count());
        par.for_each(rows.count() * per_row, &|t| {
            // Disjoint views: the parts are disjoint ranges, `Parallel`'s
            // contract runs each `t` once, and all within `&mut self`.
            f(&mut whole.sub(rows.get(t / per_row), cols.get(t % per_row)))
        });
    }

    /// The one view `rows x cols`, inside `self`, borrowing it.
    pub fn part(&mut self, rows: Range<usize>, cols: Range<usize>) -> CView<'_> {
        self.sub(rows, cols)
    }

    /// A view of `rows x cols` inside `self` (the caller keeps views it
    /// makes disjoint while they live: `part` and `for_each_part` do).
    fn sub(&self, rows: Range<usize>, cols: Range<usize>) -> CView<'_> {
        let inside =
            |p: &Range<usize>, all: &Range<usize>| all.start <= p.start && p.start <= p.end && p.end <= all.end;
        assert!(inside(&rows, &self.rows) && inside(&cols, &self.cols), "bad split of C");
        CView {
            ptr: self.ptr,
            ld: self.ld,
            rows,
            cols,
            _c: PhantomData,
        }
    }

    /// The tile `rows x cols` (global indices, inside this view).
    pub fn tile(&mut self, rows: Range<usize>, cols: Range<usize>) -> Tile<'_> {
        assert!(
            self.rows.start <= rows.start
                && rows.start <= rows.end
                && rows.end <= self.rows.end
                && self.cols.start <= cols.start
                && cols.start <= cols.end
                && cols.end <= self.cols.end,
            "tile outside its view of C"
        );
        Tile {
            // In bounds (or one past the end for an empty tile) by the view's invariant.
            ptr: self.ptr.wrapping_add(rows.start * self.ld + cols.start),
            ld: self.ld,
            rows: rows.len(),
            cols: cols.len(),
            _c: PhantomData,
        }
    }
}

/// Exclusive access to `rows x cols` elements of C from `ptr`, row stride `ld`:
/// `ptr.add(i * ld + j)` for `i < rows`, `j < cols` is valid for reads and
/// writes and touched by nothing else while the tile lives.
pub(super) struct Tile<'t> {
    ptr: *mut f32,
    ld: usize,
    rows: usize,
    cols: usize,
    _c: PhantomData<&'t mut f32>,
}

impl Tile<'_> {
    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    pub fn ld(&self) -> usize {
        self.ld
    }

    /// Row `i`'s first element; see the type's docs for what may be accessed.
    pub fn ptr(&mut self) -> *mut f32 {
        self.ptr
    }

    /// Row `i` of the tile.
    #[inline(always)]
    #[allow(unsafe_code)]
    pub fn row(&mut self, i: usize) -> &mut [f32] {
        assert!(i < self.rows);
        // SAFETY: by the type's invariant, the `cols` elements from `i * ld`
        // are valid and exclusively ours for the tile's lifetime, which the
        // returned borrow cannot outlive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(i * self.ld), self.cols) }
    }
}

/// B as panels of `nr` columns for the columns from `col0` and K rows from
/// `k0`: panel `p` is `height` rows of `nr` values at `p * height * nr` of
/// its part. B may be several packed matrices side by side (Q, K and V's
/// weights as one product): part `i` holds panels `i * part_panels ..`,
/// the last part all panels from there.
pub(super) struct BPanels<'a> {
    pub parts: [&'a [f32]; MAX_PARTS],
    pub part_panels: usize,
    pub last_part: usize,
    pub nr: usize,
    pub col0: usize,
    pub k0: usize,
    pub height: usize,
}

/// Most packed matrices one product reads as its B.
pub(super) const MAX_PARTS: usize = 3;

impl<'a> BPanels<'a> {
    /// One packed matrix.
    pub fn one(data: &'a [f32], nr: usize, col0: usize, k0: usize, height: usize) -> BPanels<'a> {
        BPanels {
            parts: [data; MAX_PARTS],
            part_panels: usize::MAX,
            last_part: 0,
            nr,
            col0,
            k0,
            height,
        }
    }

    /// Rows `ks` of the panel that starts at column `j`.
    #[inline(always)]
    fn panel(&self, j: usize, ks: Range<usize>) -> &[f32] {
        self.panel_at(self.index(j), ks)
    }

    /// The index of the panel that starts at column `j`.
    #[inline(always)]
    fn index(&self, j: usize) -> usize {
        (j - self.col0) / self.nr
    }

    /// Rows `ks` of panel `p` (see [`BPanels::index`]). No division: the
    /// per-tile bookkeeping of a product with few rows (a recurrent layer's
    /// step: 2 rows, 13 panels) cost more than a tenth of its time with two
    /// per panel.
    #[inline(always)]
    fn panel_at(&self, mut p: usize, ks: Range<usize>) -> &[f32] {
        let mut part = 0;
        while part < self.last_part && p >= self.part_panels {
            p -= self.part_panels;
            part += 1;
        }
        &self.parts[part][(p * self.height + ks.start - self.k0) * self.nr..][..ks.len() * self.nr]
    }
}

/// An [`Epilogue`] with its sizes checked against `m x n`.
pub(super) struct Epi<'a> {
    alpha: f32,
    col_bias: Option<&'a [f32]>,
    bias: Bias<'a>,
    activation: Activation,
    residual: Option<&'a [f32]>,
    n: usize,
}

impl<'a> Epi<'a> {
    pub fn new(e: &Epilogue<'a>, m: usize, n: usize) -> Result<Epi<'a>> {
        let len_is = |what: &str, len: usize, want: usize| {
            if len == want {
                Ok(())
            } else {
                Err(size_error(format_args!(
                    "{what} has {len} values, want {want} for {m} x {n}"
                )))
            }
        };
        let mut col_bias = None;
        let mut bias = e.bias;
        match e.bias {
            Bias::None | Bias::Scalar(_) => {}
            Bias::PerColumn(b) => {
                len_is("per-column bias", b.len(), n)?;
                col_bias = Some(b);
                bias = Bias::None;
            }
            Bias::PerRow(b) => len_is("per-row bias", b.len(), m)?,
            Bias::Full { c, beta } => {
                len_is("bias C", c.len(), m * n)?;
                if beta == 0.0 {
                    bias = Bias::None;
                }
            }
        }
        if let Some(r) = e.residual {
            len_is("residual", r.len(), m * n)?;
        }
        Ok(Epi {
            alpha: e.alpha,
            col_bias,
            bias,
            activation: e.activation,
            residual: e.residual,
            n,
        })
    }

    /// Whether anything is left for [`Epi::finish_row`] after the kernel's store.
    fn has_post(&self) -> bool {
        !matches!(self.bias, Bias::None) || self.activation != Activation::None || self.residual.is_some()
    }

    /// The last K block's store: alpha and the per-column bias.
    fn store<'s>(&'s self, cols: Range<usize>, accumulate: bool) -> Store<'s> {
        Store {
            accumulate,
            scale: self.alpha,
            bias: self.col_bias.map(|b| &b[cols]),
            next: &[],
        }
    }

    /// The rest of the epilogue on a stored row segment `row` = C[i][j0..].
    #[inline(always)]
    fn finish_row<F: MulAdd>(&self, i: usize, j0: usize, row: &mut [f32]) {
        let at = i * self.n + j0..i * self.n + j0 + row.len();
        match self.bias {
            Bias::None | Bias::PerColumn(_) => {}
            Bias::PerRow(b) => row.iter_mut().for_each(|v| *v += b[i]),
            Bias::Scalar(s) => row.iter_mut().for_each(|v| *v += s),
            Bias::Full { c, beta } => row.iter_mut().zip(&c[at.clone()]).for_each(|(v, &c)| *v += beta * c),
        }
        activate_with::<F>(self.activation, row);
        if let Some(r) = self.residual {
            row.iter_mut().zip(&r[at]).for_each(|(v, &r)| *v += r);
        }
    }

    /// Stores `acc` into `row` = C[i][cols] and applies the whole epilogue.
    #[inline(always)]
    fn store_row<F: MulAdd>(&self, i: usize, cols: Range<usize>, acc: &[f32], row: &mut [f32]) {
        let (alpha, j0) = (self.alpha, cols.start);
        match self.col_bias {
            Some(b) => {
                for ((v, &x), &b) in row.iter_mut().zip(acc).zip(&b[cols]) {
                    *v = x * alpha + b;
                }
            }
            None => row.iter_mut().zip(acc).for_each(|(v, &x)| *v = x * alpha),
        }
        self.finish_row::<F>(i, j0, row);
    }
}

/// `C = epilogue(0)`, for `k == 0`.
pub(super) fn epilogue_only(view: &mut CView<'_>, epi: &Epi<'_>) {
    let (rows, cols) = (view.rows(), view.cols());
    let zeros = vec![0.0; cols.len()];
    let mut tile = view.tile(rows.clone(), cols.clone());
    for i in rows.clone() {
        epi.store_row::<Plain>(i, cols.clone(), &zeros, tile.row(i - rows.start));
    }
}

/// The blocked product over K rows `ks` for the block of C `view` covers,
/// in row blocks of at most `mc` rows and K blocks of `kc` rows (see
/// [`super::k_block`] and [`super::Blocking::host`]):
/// overwrites C if `first`, else adds to it; applies the epilogue if `last`.
/// The view's columns start on a panel of `b`.
///
/// # Safety
/// The CPU supports `K`'s instructions.
#[inline(always)]
#[allow(unsafe_code, clippy::too_many_arguments)]
pub(super) unsafe fn blocked<K: Kernel>(
    a: ASrc<'_>,
    b: &BPanels<'_>,
    view: &mut CView<'_>,
    ks: Range<usize>,
    (mc, kc): (usize, usize),
    first: bool,
    last: bool,
    epi: &Epi<'_>,
) {
    let (rows, cols) = (view.rows(), view.cols());
    let post = last && epi.has_post();
    // Equal row blocks of at most mc (whole tiles), not full ones and a
    // short rest: every block streams all of B's panels, and a short one
    // (70 rows of 518) does too little work per panel to hide that.
    let blocks = rows.len().div_ceil(mc).max(1);
    let mc = rows.len().div_ceil(blocks).next_multiple_of(K::MR).min(mc);
    let direct = reads_a_in_place::<K>(a);
    let len = if direct {
        0
    } else {
        rows.len().min(mc) * ks.len().min(kc)
    };
    let mut buf = take_scratch(&A_SCRATCH, len);
    let apack = &mut bytemuck::cast_slice_mut::<u8, f32>(buf.bytes_mut())[..len];
    for ic in rows.clone().step_by(mc) {
        let mrows = ic..(ic + mc).min(rows.end);
        for pc in ks.clone().step_by(kc) {
            let kb = pc..(pc + kc).min(ks.end);
            let kc = kb.len();
            if !direct {
                // SAFETY: the caller guarantees the CPU supports K.
                unsafe { K::pack_a(a, mrows.clone(), kb.clone(), apack) };
            }
            let accumulate = !(first && pc == ks.start);
            let finish = last && kb.end == ks.end;
            let plain = Store {
                accumulate,
                scale: 1.0,
                bias: None,
                next: &[],
            };
            let p0 = b.index(cols.start);
            let tiles = row_tiles(mrows.clone(), K::MR);
            let count = tiles.len();
            let share = super::prefetch_chunk(kc * b.nr, count);
            for (p, jr) in cols.clone().step_by(K::NR).enumerate() {
                let tcols = jr..(jr + K::NR).min(cols.end);
                let panel = b.panel_at(p0 + p, kb.clone());
                let store = if finish {
                    epi.store(tcols.clone(), accumulate)
                } else {
                    plain
                };
                // Each row tile prefetches its share of the next panel.
                // Without it the first tile to read a panel streams it from
                // memory at the kernel's pace, faster than one core's share
                // of DRAM bandwidth: where the weights do not stay in cache
                // (the MLP's 16 MiB on a Zen 3) a 32 × 1024 × 1024 product
                // took 800 µs instead of 700; with B hot it changes nothing
                // measurable. (Prefetching the whole panel between tiles was
                // slower: a burst of hundreds of prefetches.) On a Sapphire
                // Rapids class Xeon (AVX-512, weights in its L3) it made
                // 16 x 384 x 1536 12% faster, MiniLM's 308-row products 3-8%.
                let next = if jr + K::NR < cols.end {
                    b.panel_at(p0 + p + 1, kb.clone())
                } else {
                    &[]
                };
                for (t, trows) in tiles.clone().enumerate() {
                    let store = Store {
                        next: super::prefetch_part(next, t, share),
                        ..store
                    };
                    let mut tile = view.tile(trows.clone(), tcols.clone());
                    if direct {
                        let at = trows.start * a.ld + kb.start;
                        let arows = &a.data[at..at + (trows.len() - 1) * a.ld + kc];
                        // SAFETY: the caller guarantees the CPU supports K, which reads A in place.
                        unsafe { K::tile_direct(kc, arows, a.ld, panel, &mut tile, &store) };
                    } else {
                        let at = (trows.start - mrows.start) * kc;
                        let apanel = &apack[at..at + trows.len() * kc];
                        // SAFETY: the caller guarantees the CPU supports K.
                        unsafe { K::tile(kc, apanel, panel, &mut tile, &store) };
                    }
                }
            }
            if finish && post {
                // Over whole rows of the block once its last K block is
                // stored, not per tile: a tile row (16 or 32 values) fell to
                // the vector loops' short remainder paths, and GELU plus the
                // residual took ~8% of MiniLM's time on a Zen 3. The same
                // operations per element, so the same results.
                for i in mrows.clone() {
                    epi.finish_row::<K::Madd>(i, cols.start, view.tile(i..i + 1, cols.clone()).row(0));
                }
            }
        }
    }
    put_scratch(&A_SCRATCH, buf);
}

/// Whether [`blocked`] reads A in place: wherever the kernel can, A is
/// row-major and its rows do not all map to the same L1 sets. Packing
/// copies each A value once for `cols / NR` tile rows that read it, which
/// costs more than it saves: reading A in place (as MLAS does) was 2-5%
/// faster on a Zen 3 at 256³, 512³ and at MiniLM's and BERT's shapes,
/// 12-18% on small products (96³), and attention's product with V (32
/// columns) spent a quarter of its time packing A; on a Sapphire Rapids
/// class Xeon with AVX-512, 4-17% on 96³, 256³ and MiniLM's K = 1536.
/// Rows a multiple of 4 KiB apart (K = 1024, BERT's 3072) share their L1
/// set, and a tile's 14 (6) rows then evict each other: in place was
/// 6-14% slower there with AVX-512 (1% on the Zen 3), so such A is packed.
pub(super) fn reads_a_in_place<K: Kernel>(a: ASrc<'_>) -> bool {
    const L1_PERIOD: usize = 4096 / size_of::<f32>();
    K::DIRECT_A && !a.trans && !a.ld.is_multiple_of(L1_PERIOD) && !packing_forced()
}

#[cfg(test)]
thread_local! {
    /// Tests set this to run the packed-A path where A could be read in place.
    pub(super) static FORCE_PACKED_A: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

#[cfg(test)]
fn packing_forced() -> bool {
    FORCE_PACKED_A.get()
}

#[cfg(not(test))]
fn packing_forced() -> bool {
    false
}

/// One full `MR x NR` tile, `reps` times over the same panels of depth `kc`
/// (L1-resident for the blockings used): the microkernel's own ceiling,
/// without packing or cache misses, for the GEMM benchmark.
///
/// # Safety
/// The CPU supports `K`'s instructions.
#[inline(always)]
#[allow(unsafe_code)]
pub(super) unsafe fn tile_repeat<K: Kernel>(kc: usize, reps: usize, c: &mut [f32]) {
    let a = vec![0.5f32; K::MR * kc];
    let b = vec![0.25f32; K::NR * kc];
    let mut view = CView::new(c, K::MR, K::NR, K::NR).expect("tile_repeat: C holds MR x NR values");
    let store = Store {
        accumulate: true,
        scale: 1.0,
        bias: None,
        next: &[],
    };
    for _ in 0..reps {
        let mut tile = view.tile(0..K::MR, 0..K::NR);
        // SAFETY: the caller guarantees the CPU supports K.
        unsafe { K::tile(kc, &a, &b, &mut tile, &store) };
    }
}

/// [`Kernel::pack_b`].
///
/// # Safety
/// The CPU supports `K`'s instructions.
#[inline(always)]
#[allow(unsafe_code)]
pub(super) unsafe fn pack_b_for<K: Kernel>(b: BSrc<'_>, ks: Range<usize>, cols: Range<usize>, dst: &mut [f32]) {
    // SAFETY: passed on from the caller.
    unsafe { K::pack_b(b, ks, cols, dst) }
}

/// `M = 1` with packed B: A's row is already a packed one-row micro-panel,
/// so each B panel is one microkernel call over the whole K (no packing, no
/// K blocking; B streams from memory once).
///
/// # Safety
/// The CPU supports `K`'s instructions.
#[inline(always)]
#[allow(unsafe_code)]
pub(super) unsafe fn gemv<K: Kernel>(a: &[f32], b: &BPanels<'_>, view: &mut CView<'_>, epi: &Epi<'_>) {
    let (rows, cols) = (view.rows(), view.cols());
    let k = b.height;
    let post = epi.has_post();
    for jr in cols.clone().step_by(K::NR) {
        let tcols = jr..(jr + K::NR).min(cols.end);
        let store = epi.store(tcols.clone(), false);
        let mut tile = view.tile(rows.clone(), tcols.clone());
        // SAFETY: the caller guarantees the CPU supports K.
        unsafe { K::tile(k, &a[..k], b.panel(jr, 0..k), &mut tile, &store) };
    }
    if post {
        // The whole row at once, as in `blocked`.
        epi.finish_row::<K::Madd>(rows.start, cols.start, view.tile(rows.clone(), cols.clone()).row(0));
    }
}

/// `M = 1` with B read in place (not packed): row-major B is summed row by row
/// into C (in column blocks that stay in L1), transposed B column by column as
/// dot products (sixteen partial sums each).
#[inline(always)]
pub(super) fn vecmat<K: Kernel>(k: usize, a: ASrc<'_>, b: BSrc<'_>, view: &mut CView<'_>, epi: &Epi<'_>) {
    const LANES: usize = 16;
    const COL_BLOCK: usize = 1024;
    let (rows, cols) = (view.rows(), view.cols());
    let mut tile = view.tile(rows.clone(), cols.clone());
    let row = tile.row(0);
    let av: Vec<f32> = if a.trans {
        (0..k).map(|kk| a.data[kk * a.ld]).collect()
    } else {
        a.data[..k].to_vec()
    };
    let mut acc = vec![0.0f32; COL_BLOCK.min(cols.len())];
    for c0 in cols.clone().step_by(COL_BLOCK) {
        let cb = c0..(c0 + COL_BLOCK).min(cols.end);
        let acc = &mut acc[..cb.len()];
        if b.trans {
            for (j, s) in cb.clone().zip(acc.iter_mut()) {
                let bj = &b.data[j * b.ld..][..k];
                let mut lanes = [0.0f32; LANES];
                for (x, y) in av.chunks_exact(LANES).zip(bj.chunks_exact(LANES)) {
                    for l in 0..LANES {
                        lanes[l] = K::madd(x[l], y[l], lanes[l]);
                    }
                }
                let done = k / LANES * LANES;
                let mut t = 0.0;
                for (&x, &y) in av[done..].iter().zip(&bj[done..]) {
                    t = K::madd(x, y, t);
                }
                *s = lanes.iter().sum::<f32>() + t;
            }
        } else {
            acc.fill(0.0);
            for (kk, &ak) in av.iter().enumerate() {
                let bk = &b.data[kk * b.ld + cb.start..][..cb.len()];
                for (s, &y) in acc.iter_mut().zip(bk) {
                    *s = K::madd(ak, y, *s);
                }
            }
        }
        let seg = &mut row[cb.start - cols.start..cb.end - cols.start];
        epi.store_row::<K::Madd>(rows.start, cb.clone(), acc, seg);
    }
}
