//! The microkernels, one per target, and the entry points that compile the
//! generic loops of `driver.rs` for each target inside `#[target_feature]`
//! functions. Which one runs is decided by the [`Isa`] token alone, whose
//! existence proves the CPU has the instructions: that is what makes the
//! `unsafe` calls below sound.

use std::ops::Range;

use super::driver::{self, BPanels, CView, Epi, Kernel, Store, Tile};
use super::pack::{ASrc, BSrc};
use super::Blocking;
use crate::kernels::Isa;
use crate::target::Target;

/// Calls `$f::<MR>($args)` for the runtime `$mr` in `1..=14` (`$f` may be
/// a path); the microkernels here and the direct convolution's use it.
macro_rules! by_rows {
    ($mr:expr, $($f:ident)::+, ($($arg:expr),*)) => {
        match $mr {
            1 => $($f)::+::<1>($($arg),*),
            2 => $($f)::+::<2>($($arg),*),
            3 => $($f)::+::<3>($($arg),*),
            4 => $($f)::+::<4>($($arg),*),
            5 => $($f)::+::<5>($($arg),*),
            6 => $($f)::+::<6>($($arg),*),
            7 => $($f)::+::<7>($($arg),*),
            8 => $($f)::+::<8>($($arg),*),
            9 => $($f)::+::<9>($($arg),*),
            10 => $($f)::+::<10>($($arg),*),
            11 => $($f)::+::<11>($($arg),*),
            12 => $($f)::+::<12>($($arg),*),
            13 => $($f)::+::<13>($($arg),*),
            14 => $($f)::+::<14>($($arg),*),
            _ => unreachable!("tile of {} rows", $mr),
        }
    };
}
pub(crate) use by_rows;

/// Checks what every microkernel relies on; panics are bugs in the driver.
/// `lda`: A is read in place, the tile's rows `lda` apart, `kc` values each
/// ([`Kernel::tile_direct`]); `None`: a packed micro-panel of `kc · rows`.
#[inline(always)]
fn check_tile(
    mr_max: usize,
    nr: usize,
    kc: usize,
    (a, lda): (&[f32], Option<usize>),
    b: &[f32],
    tile: &Tile<'_>,
    store: &Store<'_>,
) {
    let (mr, nc) = (tile.rows(), tile.cols());
    let a_need = match lda {
        None => mr.checked_mul(kc),
        Some(lda) if mr == 1 || lda >= kc => (mr - 1).checked_mul(lda).and_then(|r| r.checked_add(kc)),
        Some(_) => None,
    };
    assert!(
        (1..=mr_max).contains(&mr)
            && (1..=nr).contains(&nc)
            && a_need.is_some_and(|need| a.len() >= need)
            && b.len() >= kc * nr
            && store.bias.is_none_or(|bias| bias.len() >= nc),
        "microkernel given a bad tile: {mr} x {nc}, kc {kc}, lda {lda:?}, a {}, b {}",
        a.len(),
        b.len()
    );
}

/// Plain Rust, vectorised by LLVM for whatever the build targets (SSE2 on x86_64).
pub(super) struct Generic;

impl Generic {
    const NR: usize = Blocking::of(Target::Generic).nr;

    /// Kept out of line: inlined into the big driver loops, LLVM no longer
    /// keeps the accumulators in registers.
    #[inline(never)]
    fn kernel<const MR: usize>(kc: usize, a: &[f32], b: &[f32], tile: &mut Tile<'_>, store: &Store<'_>) {
        const NR: usize = Generic::NR;
        let mut acc = [[0.0f32; NR]; MR];
        let (a, b) = (&a[..kc * MR], &b[..kc * NR]);
        for (ak, bk) in a.chunks_exact(MR).zip(b.chunks_exact(NR)) {
            let bk: [f32; NR] = bk.try_into().unwrap();
            for i in 0..MR {
                let x = ak[i];
                for j in 0..NR {
                    acc[i][j] += x * bk[j];
                }
            }
        }
        let nc = tile.cols();
        for (i, acc) in acc.iter().enumerate() {
            let row = tile.row(i);
            for (j, (c, &x)) in row.iter_mut().zip(&acc[..nc]).enumerate() {
                let sum = if store.accumulate { x + *c } else { x };
                *c = match store.bias {
                    Some(bias) => sum * store.scale + bias[j],
                    None => sum * store.scale,
                };
            }
        }
    }
}

impl Kernel for Generic {
    const MR: usize = Blocking::of(Target::Generic).mr;
    const NR: usize = Blocking::of(Target::Generic).nr;

    #[inline(always)]
    #[allow(unsafe_code)]
    unsafe fn tile(kc: usize, a: &[f32], b: &[f32], tile: &mut Tile<'_>, store: &Store<'_>) {
        check_tile(Self::MR, Self::NR, kc, (a, None), b, tile, store);
        by_rows!(tile.rows(), kernel_generic, (kc, a, b, tile, store))
    }

    type Madd = super::epilogue::Plain;

    #[inline(always)]
    fn madd(a: f32, b: f32, c: f32) -> f32 {
        a * b + c
    }

    #[inline(always)]
    #[allow(unsafe_code)]
    unsafe fn pack_a(a: ASrc<'_>, rows: Range<usize>, ks: Range<usize>, dst: &mut [f32]) {
        driver::pack_a::<{ Blocking::of(Target::Generic).mr }>(a, rows, ks, dst)
    }

    #[inline(always)]
    #[allow(unsafe_code)]
    unsafe fn pack_b(b: BSrc<'_>, ks: Range<usize>, cols: Range<usize>, dst: &mut [f32]) {
        driver::pack_b(b, ks, cols, Self::NR, dst)
    }
}

#[inline(always)]
fn kernel_generic<const MR: usize>(kc: usize, a: &[f32], b: &[f32], tile: &mut Tile<'_>, store: &Store<'_>) {
    Generic::kernel::<MR>(kc, a, b, tile, store)
}

#[cfg(target_arch = "x86_64")]
pub(crate) use x86::RowBases;
#[cfg(target_arch = "x86_64")]
pub(super) use x86::{Avx2, Avx512};

#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod x86 {
    use std::arch::x86_64::*;

    use std::ops::Range;

    use super::super::pack;
    use super::{check_tile, ASrc, BSrc, Blocking, Kernel, Store, Target, Tile};
    use crate::kernels::avx2;

    /// `Kernel::tile`, `DIRECT_A` and `Kernel::tile_direct` of an x86
    /// target, calling its `$packed` / `$direct` forms (`kernel_forms!`).
    macro_rules! tile_methods {
        ($packed:ident, $direct:ident) => {
            #[inline(always)]
            unsafe fn tile(kc: usize, a: &[f32], b: &[f32], tile: &mut Tile<'_>, store: &Store<'_>) {
                check_tile(Self::MR, Self::NR, kc, (a, None), b, tile, store);
                let (ld, nc) = (tile.ld(), tile.cols());
                let (a, b, c) = (a.as_ptr(), b.as_ptr(), tile.ptr());
                // SAFETY: the caller guarantees the target's instructions;
                // check_tile proved that a holds kc * rows values, b
                // kc * NR and the bias nc; the tile grants rows x nc elements
                // of C from c with stride ld.
                unsafe { by_rows!(tile.rows(), $packed, (kc, a, b, c, ld, nc, store)) }
            }

            const DIRECT_A: bool = true;

            #[inline(always)]
            unsafe fn tile_direct(kc: usize, a: &[f32], lda: usize, b: &[f32], tile: &mut Tile<'_>, store: &Store<'_>) {
                check_tile(Self::MR, Self::NR, kc, (a, Some(lda)), b, tile, store);
                let (ld, nc) = (tile.ld(), tile.cols());
                let (b, c) = (b.as_ptr(), tile.ptr());
                // SAFETY: the caller guarantees the target's instructions;
                // check_tile proved that each of the tile's rows of a
                // holds kc values, b kc * NR and the bias nc; the tile grants
                // rows x nc elements of C from c with stride ld.
                unsafe { by_rows!(tile.rows(), $direct, (kc, (a.as_ptr(), lda), b, c, ld, nc, store)) }
            }
        };
    }

    /// AVX-512: 14 x 32 tiles, 28 zmm accumulators, B rows from two loads,
    /// A values as embedded broadcasts.
    pub(in super::super) struct Avx512;

    impl Kernel for Avx512 {
        const MR: usize = Blocking::of(Target::Avx512).mr;
        const NR: usize = Blocking::of(Target::Avx512).nr;

        tile_methods!(avx512_packed, avx512_direct);

        type Madd = super::super::epilogue::Fused;

        #[inline(always)]
        fn madd(a: f32, b: f32, c: f32) -> f32 {
            a.mul_add(b, c)
        }

        #[inline(always)]
        unsafe fn pack_a(a: ASrc<'_>, rows: Range<usize>, ks: Range<usize>, dst: &mut [f32]) {
            pack::pack_a_rows::<{ Self::MR }>(Target::Avx512, a, rows, ks, dst)
        }

        #[inline(always)]
        unsafe fn pack_b(b: BSrc<'_>, ks: Range<usize>, cols: Range<usize>, dst: &mut [f32]) {
            pack::pack_b_columns(Target::Avx512, b, ks, cols, Self::NR, dst)
        }
    }

    /// Defines `$packed` and `$direct`, the two forms of `$kernel` (a
    /// packed A micro-panel, or A's rows in place with row stride `a.1`)
    /// as functions of MR alone, for `by_rows!`.
    macro_rules! kernel_forms {
        ($kernel:ident, $features:literal, $packed:ident, $direct:ident) => {
            /// The kernel on a packed A micro-panel.
            ///
            /// # Safety
            /// As the kernel's, with `DIRECT = false`.
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn $packed<const MR: usize>(
                kc: usize,
                a: *const f32,
                b: *const f32,
                c: *mut f32,
                ld: usize,
                nc: usize,
                store: &Store<'_>,
            ) {
                // SAFETY: the caller's contract.
                unsafe { $kernel::<MR, false>(kc, (a, 0), b, c, ld, nc, store) }
            }

            /// The kernel on A's rows in place (row stride `a.1`).
            ///
            /// # Safety
            /// As the kernel's, with `DIRECT = true`.
            #[inline]
            #[target_feature(enable = $features)]
            unsafe fn $direct<const MR: usize>(
                kc: usize,
                a: (*const f32, usize),
                b: *const f32,
                c: *mut f32,
                ld: usize,
                nc: usize,
                store: &Store<'_>,
            ) {
                // SAFETY: the caller's contract.
                unsafe { $kernel::<MR, true>(kc, a, b, c, ld, nc, store) }
            }
        };
    }

    kernel_forms!(
        avx512_kernel,
        "avx512f,avx512bw,avx512vl,fma",
        avx512_packed,
        avx512_direct
    );
    kernel_forms!(avx2_kernel, "avx2,fma", avx2_packed, avx2_direct);

    /// A's rows read in place, addressed as x86 addressing modes allow:
    /// base `g` points at row `3·g`, and row `i` is one base plus 0, 1, 2,
    /// 4 or 8 row strides ([`ROW_BASE`]). Without it the compiler kept 14
    /// row offsets in registers and spilled some, reloading them from the
    /// stack inside the K loop (in place ran 8-14% slower than packed A on
    /// an Intel Xeon, family 6 model 167). The direct convolution's
    /// 14-pixel tile reads its pixels' rows the same way.
    pub(crate) struct RowBases<const MR: usize> {
        bases: [*const f32; 5],
        /// The row stride in bytes, opaque to the compiler, so that
        /// `m · stride` stays the index register times a scale of 1-8.
        stride: usize,
    }

    /// Row `i`'s base and its stride multiple (0, 1, 2, 4 or 8).
    const ROW_BASE: [(usize, usize); 15] = [
        (0, 0),
        (0, 1),
        (0, 2),
        (1, 0),
        (0, 4),
        (1, 2),
        (2, 0),
        (1, 4),
        (0, 8),
        (3, 0),
        (2, 4),
        (1, 8),
        (4, 0),
        (3, 4),
        (2, 8),
    ];

    // Each row is its base's row plus its stride multiple, a scale x86
    // can encode, and only bases up to `i / 3` serve row `i` (`USED`).
    const _: () = {
        let mut i = 0;
        while i < ROW_BASE.len() {
            let (g, m) = ROW_BASE[i];
            assert!(3 * g + m == i && g <= i / 3 && matches!(m, 0 | 1 | 2 | 4 | 8));
            i += 1;
        }
    };

    impl<const MR: usize> RowBases<MR> {
        /// Bases the tile's rows use.
        const USED: usize = if MR == 0 { 0 } else { (MR - 1) / 3 + 1 };

        #[inline(always)]
        pub(crate) fn new(a: *const f32, lda: usize) -> Self {
            let mut stride = lda * size_of::<f32>();
            // SAFETY: an empty template: no instruction, stride passes through unchanged.
            unsafe { std::arch::asm!("/* {0} */", inout(reg) stride, options(pure, nomem, nostack, preserves_flags)) };
            RowBases {
                bases: std::array::from_fn(|g| a.wrapping_add(3 * g * lda)),
                stride,
            }
        }

        /// A's value in row `i`, `u` values on.
        ///
        /// # Safety
        /// Row `i` has at least `u + 1` readable values from the current position.
        #[inline(always)]
        pub(crate) unsafe fn get(&self, i: usize, u: usize) -> f32 {
            let (g, m) = ROW_BASE[i];
            // SAFETY: the caller's contract; base g + m strides is row i.
            unsafe { *self.bases[g].byte_add(m * self.stride).add(u) }
        }

        /// Moves every row `k` values on. Each base goes through an empty
        /// asm block so that the compiler cannot rewrite it as the first
        /// plus a loop-invariant offset (which needs a register per row).
        #[inline(always)]
        // The asm block only passes the pointer through: it reads nothing.
        #[allow(clippy::pointers_in_nomem_asm_block)]
        pub(crate) fn advance(&mut self, k: usize) {
            for b in &mut self.bases[..Self::USED] {
                let mut p = b.wrapping_add(k);
                // SAFETY: an empty template: no instruction, p passes through unchanged.
                unsafe { std::arch::asm!("/* {0} */", inout(reg) p, options(pure, nomem, nostack, preserves_flags)) };
                *b = p;
            }
        }
    }

    /// How far ahead (in f32) the one-row kernel prefetches B.
    const GEMV_PREFETCH: usize = 4096;

    /// One tile. A is a packed micro-panel (`a.0[k·MR + i]`) or, if
    /// `DIRECT`, read in place: row `i` at `a.0 + i·a.1`, `kc` values each.
    ///
    /// # Safety
    /// AVX-512F and FMA available; `a` readable for `kc * MR` values
    /// (`DIRECT`: `kc` values from each of the MR rows), `b` for `kc * 32`,
    /// `store.bias` has at least `nc <= 32` values, and `c.add(i * ld + j)`
    /// is ours for `i < MR`, `j < nc`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
    unsafe fn avx512_kernel<const MR: usize, const DIRECT: bool>(
        kc: usize,
        (a, lda): (*const f32, usize),
        b: *const f32,
        c: *mut f32,
        ld: usize,
        nc: usize,
        store: &Store<'_>,
    ) {
        // Where A's value (row i, k + u) is, from the current position, and
        // how far one k moves it.
        let at = |i: usize, u: usize| if DIRECT { i * lda + u } else { MR * u + i };
        let step = if DIRECT { 1 } else { MR };
        let mut acc = [[_mm512_setzero_ps(); 2]; MR];
        for i in 0..MR {
            // A hint only: prefetching never faults.
            _mm_prefetch::<_MM_HINT_T0>(c.wrapping_add(i * ld) as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(c.wrapping_add(i * ld + 31) as *const i8);
        }
        // Four k per iteration, so that loop overhead does not take FMA port slots.
        let (mut ap, mut bp) = (a, b);
        if MR == 1 {
            // One row (GEMV): two accumulators alone would make the loop wait
            // on FMA latency and hold back B's stream. Four independent
            // chains (k mod 4) keep enough loads in flight; B is prefetched
            // ahead since it streams from memory once.
            let mut chains = [[_mm512_setzero_ps(); 2]; 4];
            for _ in 0..kc / 4 {
                for line in 0..8 {
                    // A hint only: prefetching never faults.
                    _mm_prefetch::<_MM_HINT_T0>(bp.wrapping_add(GEMV_PREFETCH + 16 * line) as *const i8);
                }
                for (u, chain) in chains.iter_mut().enumerate() {
                    // SAFETY: as in the loop below.
                    let (b0, b1) = unsafe { (_mm512_loadu_ps(bp.add(32 * u)), _mm512_loadu_ps(bp.add(32 * u + 16))) };
                    // SAFETY: MR = 1, u < 4 of the remaining k.
                    let ai = _mm512_set1_ps(unsafe { *ap.add(u) });
                    chain[0] = _mm512_fmadd_ps(ai, b0, chain[0]);
                    chain[1] = _mm512_fmadd_ps(ai, b1, chain[1]);
                }
                // SAFETY: 4 of the remaining k were consumed.
                unsafe {
                    ap = ap.add(4);
                    bp = bp.add(4 * 32);
                }
            }
            for h in 0..2 {
                acc[0][h] = _mm512_add_ps(
                    _mm512_add_ps(chains[0][h], chains[1][h]),
                    _mm512_add_ps(chains[2][h], chains[3][h]),
                );
            }
        }
        // A tile of at most 16 columns (the last panel of an N like
        // attention's 77) needs only the panel's first half: half the FMAs,
        // in the same order per element as the full loop below.
        let half = MR > 1 && nc <= 16;
        if half {
            for _ in 0..kc {
                // SAFETY: fewer than kc k have been consumed, so b .. + 16 and
                // a .. + MR of this k are readable.
                let b0 = unsafe { _mm512_loadu_ps(bp) };
                for (i, acc) in acc.iter_mut().enumerate() {
                    // SAFETY: i < MR (see above).
                    let ai = _mm512_set1_ps(unsafe { *ap.add(at(i, 0)) });
                    acc[0] = _mm512_fmadd_ps(ai, b0, acc[0]);
                }
                // SAFETY: one k consumed; at most one past the end.
                unsafe {
                    ap = ap.add(step);
                    bp = bp.add(32);
                }
            }
        }
        // This tile's share of the next B panel (`Store::next`), spread
        // over the K loop from its start, at most one line per 16 FMAs:
        // with few rows a tile's share is large (the whole panel for one
        // tile of 4 rows), and more prefetches than that took the load
        // ports from B (4 x 1024 x 1024 3.5% slower uncapped).
        let iters = if MR == 1 || half { 0 } else { kc / 4 };
        let (mut pf, mut pf_left) = (store.next.as_ptr(), store.next.len().div_ceil(16));
        let pf_per = pf_left.div_ceil(iters.max(1)).min(MR / 2);
        // In place, A's rows are addressed through [`RowBases`].
        let mut rows = RowBases::<MR>::new(ap, lda);
        for _ in 0..iters {
            for _ in 0..pf_per {
                if pf_left > 0 {
                    // A hint only: prefetching never faults.
                    _mm_prefetch::<_MM_HINT_T1>(pf as *const i8);
                    pf = pf.wrapping_add(16);
                    pf_left -= 1;
                }
            }
            for u in 0..4 {
                // SAFETY: fewer than kc k have been consumed, so b + 32 (k + u) .. + 32
                // and A's values of k + u in each row are readable.
                let (b0, b1) = unsafe { (_mm512_loadu_ps(bp.add(32 * u)), _mm512_loadu_ps(bp.add(32 * u + 16))) };
                for (i, acc) in acc.iter_mut().enumerate() {
                    // SAFETY: i < MR (see above); `rows` is at the same k as `ap`.
                    let ai = _mm512_set1_ps(unsafe {
                        if DIRECT {
                            rows.get(i, u)
                        } else {
                            *ap.add(at(i, u))
                        }
                    });
                    acc[0] = _mm512_fmadd_ps(ai, b0, acc[0]);
                    acc[1] = _mm512_fmadd_ps(ai, b1, acc[1]);
                }
            }
            if DIRECT {
                rows.advance(4);
            }
            // SAFETY: still within (or one past) the panels: 4 of the remaining k were consumed.
            unsafe {
                ap = ap.add(4 * step);
                bp = bp.add(4 * 32);
            }
        }
        for _ in 0..if half { 0 } else { kc % 4 } {
            // SAFETY: as above, for the last kc % 4 k.
            let (b0, b1) = unsafe { (_mm512_loadu_ps(bp), _mm512_loadu_ps(bp.add(16))) };
            for (i, acc) in acc.iter_mut().enumerate() {
                // SAFETY: i < MR (see above).
                let ai = _mm512_set1_ps(unsafe { *ap.add(at(i, 0)) });
                acc[0] = _mm512_fmadd_ps(ai, b0, acc[0]);
                acc[1] = _mm512_fmadd_ps(ai, b1, acc[1]);
            }
            // SAFETY: one k consumed; at most one past the end.
            unsafe {
                ap = ap.add(step);
                bp = bp.add(32);
            }
        }
        let m0: __mmask16 = if nc >= 16 { 0xffff } else { (1u16 << nc) - 1 };
        let m1: __mmask16 = if nc >= 32 {
            0xffff
        } else if nc > 16 {
            (1u16 << (nc - 16)) - 1
        } else {
            0
        };
        let scale = _mm512_set1_ps(store.scale);
        // SAFETY: masked loads touch only the first nc <= bias.len() values.
        let bias = store.bias.map(|bias| unsafe {
            let p = bias.as_ptr();
            (
                _mm512_maskz_loadu_ps(m0, p),
                _mm512_maskz_loadu_ps(m1, p.wrapping_add(16)),
            )
        });
        for (i, acc) in acc.iter().enumerate() {
            let row = c.wrapping_add(i * ld);
            let (mut v0, mut v1) = (acc[0], acc[1]);
            // SAFETY: masked accesses touch only row[j] for j < nc, which the
            // caller grants (i < MR); masked-off lanes are never accessed.
            unsafe {
                if store.accumulate {
                    v0 = _mm512_add_ps(v0, _mm512_maskz_loadu_ps(m0, row));
                    v1 = _mm512_add_ps(v1, _mm512_maskz_loadu_ps(m1, row.wrapping_add(16)));
                }
                v0 = _mm512_mul_ps(v0, scale);
                v1 = _mm512_mul_ps(v1, scale);
                if let Some((bias0, bias1)) = bias {
                    v0 = _mm512_add_ps(v0, bias0);
                    v1 = _mm512_add_ps(v1, bias1);
                }
                _mm512_mask_storeu_ps(row, m0, v0);
                _mm512_mask_storeu_ps(row.wrapping_add(16), m1, v1);
            }
        }
    }

    /// AVX2: 6 x 16 tiles, 12 ymm accumulators.
    pub(in super::super) struct Avx2;

    impl Kernel for Avx2 {
        const MR: usize = Blocking::of(Target::Avx2).mr;
        const NR: usize = Blocking::of(Target::Avx2).nr;

        tile_methods!(avx2_packed, avx2_direct);

        type Madd = super::super::epilogue::Fused;

        #[inline(always)]
        fn madd(a: f32, b: f32, c: f32) -> f32 {
            a.mul_add(b, c)
        }

        #[inline(always)]
        unsafe fn pack_a(a: ASrc<'_>, rows: Range<usize>, ks: Range<usize>, dst: &mut [f32]) {
            pack::pack_a_rows::<{ Self::MR }>(Target::Avx2, a, rows, ks, dst)
        }

        #[inline(always)]
        unsafe fn pack_b(b: BSrc<'_>, ks: Range<usize>, cols: Range<usize>, dst: &mut [f32]) {
            pack::pack_b_columns(Target::Avx2, b, ks, cols, Self::NR, dst)
        }
    }

    /// One tile. A is a packed micro-panel (`a.0[k·MR + i]`) or, if
    /// `DIRECT`, read in place: row `i` at `a.0 + i·a.1`, `kc` values each.
    ///
    /// # Safety
    /// AVX2 and FMA available; `a` readable for `kc * MR` values (`DIRECT`:
    /// `kc` values from each of the MR rows), `b` for `kc * 16`,
    /// `store.bias` has at least `nc <= 16` values, and `c.add(i * ld + j)`
    /// is ours for `i < MR`, `j < nc`.
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn avx2_kernel<const MR: usize, const DIRECT: bool>(
        kc: usize,
        (a, lda): (*const f32, usize),
        b: *const f32,
        c: *mut f32,
        ld: usize,
        nc: usize,
        store: &Store<'_>,
    ) {
        // Where A's value (row i, k + u) is, from the current position, and
        // how far four k move it.
        let at = |i: usize, u: usize| if DIRECT { i * lda + u } else { MR * u + i };
        let step = if DIRECT { 1 } else { MR };
        let mut acc = [[_mm256_setzero_ps(); 2]; MR];
        for i in 0..MR {
            // A hint only: prefetching never faults.
            _mm_prefetch::<_MM_HINT_T0>(c.wrapping_add(i * ld) as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(c.wrapping_add(i * ld + 15) as *const i8);
        }
        let (mut ap, mut bp) = (a, b);
        if MR == 1 {
            // One row (GEMV): as on AVX-512, four independent chains (k mod
            // 4) instead of two accumulators waiting on FMA latency, and B
            // prefetched ahead since it streams from memory once.
            let mut chains = [[_mm256_setzero_ps(); 2]; 4];
            for _ in 0..kc / 4 {
                for line in 0..4 {
                    // A hint only: prefetching never faults.
                    _mm_prefetch::<_MM_HINT_T0>(bp.wrapping_add(GEMV_PREFETCH + 16 * line) as *const i8);
                }
                for (u, chain) in chains.iter_mut().enumerate() {
                    // SAFETY: as in the loop below.
                    let (b0, b1) = unsafe { (_mm256_loadu_ps(bp.add(16 * u)), _mm256_loadu_ps(bp.add(16 * u + 8))) };
                    // SAFETY: MR = 1, u < 4 of the remaining k.
                    let ai = _mm256_broadcast_ss(unsafe { &*ap.add(u) });
                    chain[0] = _mm256_fmadd_ps(ai, b0, chain[0]);
                    chain[1] = _mm256_fmadd_ps(ai, b1, chain[1]);
                }
                // SAFETY: 4 of the remaining k were consumed.
                unsafe {
                    ap = ap.add(4);
                    bp = bp.add(4 * 16);
                }
            }
            for h in 0..2 {
                acc[0][h] = _mm256_add_ps(
                    _mm256_add_ps(chains[0][h], chains[1][h]),
                    _mm256_add_ps(chains[2][h], chains[3][h]),
                );
            }
        }
        // This tile's share of the next B panel (`Store::next`): one line
        // per iteration from the start of the K loop.
        let (mut pf, mut pf_left) = (store.next.as_ptr(), store.next.len().div_ceil(16));
        // Four k per iteration: one pointer step and branch per 4 k.
        for _ in 0..if MR == 1 { 0 } else { kc / 4 } {
            if pf_left > 0 {
                // A hint only: prefetching never faults.
                _mm_prefetch::<_MM_HINT_T1>(pf as *const i8);
                pf = pf.wrapping_add(16);
                pf_left -= 1;
            }
            for u in 0..4 {
                // SAFETY: fewer than kc k have been consumed, so bp + 16 u .. + 16
                // and A's values of k + u in each row are readable.
                let (b0, b1) = unsafe { (_mm256_loadu_ps(bp.add(16 * u)), _mm256_loadu_ps(bp.add(16 * u + 8))) };
                for (i, acc) in acc.iter_mut().enumerate() {
                    // SAFETY: i < MR (see above).
                    let ai = _mm256_broadcast_ss(unsafe { &*ap.add(at(i, u)) });
                    acc[0] = _mm256_fmadd_ps(ai, b0, acc[0]);
                    acc[1] = _mm256_fmadd_ps(ai, b1, acc[1]);
                }
            }
            // SAFETY: 4 of the remaining k were consumed; at most one past the end.
            unsafe {
                ap = ap.add(4 * step);
                bp = bp.add(4 * 16);
            }
        }
        for _ in 0..kc % 4 {
            // SAFETY: as above, for the last kc % 4 k.
            let (b0, b1) = unsafe { (_mm256_loadu_ps(bp), _mm256_loadu_ps(bp.add(8))) };
            for (i, acc) in acc.iter_mut().enumerate() {
                // SAFETY: i < MR (see above).
                let ai = _mm256_broadcast_ss(unsafe { &*ap.add(at(i, 0)) });
                acc[0] = _mm256_fmadd_ps(ai, b0, acc[0]);
                acc[1] = _mm256_fmadd_ps(ai, b1, acc[1]);
            }
            // SAFETY: one k consumed; at most one past the end.
            unsafe {
                ap = ap.add(step);
                bp = bp.add(16);
            }
        }
        let (n0, n1) = (nc, nc.saturating_sub(8));
        let scale = _mm256_set1_ps(store.scale);
        // SAFETY: the loads touch only the first nc <= bias.len() values.
        let bias = store.bias.map(|bias| unsafe {
            let p = bias.as_ptr();
            (avx2::load(p, n0), avx2::load(p.wrapping_add(8), n1))
        });
        for (i, acc) in acc.iter().enumerate() {
            let row = c.wrapping_add(i * ld);
            let (mut v0, mut v1) = (acc[0], acc[1]);
            // SAFETY: the loads and stores touch only row[j] for j < nc, which
            // the caller grants (i < MR).
            unsafe {
                if store.accumulate {
                    v0 = _mm256_add_ps(v0, avx2::load(row, n0));
                    v1 = _mm256_add_ps(v1, avx2::load(row.wrapping_add(8), n1));
                }
                v0 = _mm256_mul_ps(v0, scale);
                v1 = _mm256_mul_ps(v1, scale);
                if let Some((bias0, bias1)) = bias {
                    v0 = _mm256_add_ps(v0, bias0);
                    v1 = _mm256_add_ps(v1, bias1);
                }
                avx2::store(row, n0, v0);
                avx2::store(row.wrapping_add(8), n1, v1);
            }
        }
    }
}

/// Defines `$name`, which runs `driver::$body` for each target: the AVX ones
/// inside `#[target_feature]` functions.
macro_rules! entry {
    ($name:ident ( $($arg:ident : $ty:ty),* ) => $call:ident) => {
        #[allow(clippy::too_many_arguments)]
        #[allow(unsafe_code)] // calls target_feature functions, see SAFETY below
        pub(super) fn $name(isa: Isa, $($arg: $ty),*) {
            #[cfg(target_arch = "x86_64")]
            #[inline(never)]
            #[target_feature(enable = "avx512f,avx512bw,avx512vl,fma")]
            fn avx512($($arg: $ty),*) {
                // SAFETY: this function's target features are the kernel's.
                #[allow(unused_unsafe)]
                unsafe { driver::$call::<Avx512>($($arg),*) }
            }
            #[cfg(target_arch = "x86_64")]
            #[inline(never)]
            #[target_feature(enable = "avx2,fma")]
            fn avx2($($arg: $ty),*) {
                // SAFETY: this function's target features are the kernel's.
                #[allow(unused_unsafe)]
                unsafe { driver::$call::<Avx2>($($arg),*) }
            }
            #[inline(never)]
            fn generic($($arg: $ty),*) {
                // SAFETY: the generic kernel needs nothing of the CPU.
                #[allow(unused_unsafe)]
                unsafe { driver::$call::<Generic>($($arg),*) }
            }
            match isa.target() {
                // SAFETY: `Isa::new` checked that this CPU has AVX-512F/BW/VL and FMA.
                #[cfg(target_arch = "x86_64")]
                Target::Avx512 => unsafe { avx512($($arg),*) },
                // SAFETY: `Isa::new` checked that this CPU has AVX2 and FMA.
                #[cfg(target_arch = "x86_64")]
                Target::Avx2 => unsafe { avx2($($arg),*) },
                _ => generic($($arg),*),
            }
        }
    };
}

entry!(blocked(
    a: ASrc<'_>,
    b: &BPanels<'_>,
    view: &mut CView<'_>,
    ks: Range<usize>,
    mc_kc: (usize, usize),
    first: bool,
    last: bool,
    epi: &Epi<'_>
) => blocked);

entry!(tile_repeat(kc: usize, reps: usize, c: &mut [f32]) => tile_repeat);

entry!(gemv(a: &[f32], b: &BPanels<'_>, view: &mut CView<'_>, epi: &Epi<'_>) => gemv);

entry!(pack_b(b: BSrc<'_>, ks: Range<usize>, cols: Range<usize>, dst: &mut [f32]) => pack_b_for);

entry!(vecmat(k: usize, a: ASrc<'_>, b: BSrc<'_>, view: &mut CView<'_>, epi: &Epi<'_>) => vecmat);
