//! Packing A and B into the layouts the microkernels read, in safe Rust.
//!
//! Everything is `#[inline(always)]` so it is compiled inside each target's
//! `#[target_feature]` entry points (see `kernels.rs`).

use std::ops::Range;

use crate::kernels::transpose::{transpose, Transpose2};
use crate::kernels::Isa;
use crate::target::Target;

/// Where A's elements are: `A[i][k] = data[i * ld + k]`, or `data[k * ld + i]` if `trans`.
#[derive(Clone, Copy, Debug)]
pub(super) struct ASrc<'a> {
    pub data: &'a [f32],
    pub ld: usize,
    pub trans: bool,
}

/// Where B's elements are: `B[k][j] = data[k * ld + j]`, or `data[j * ld + k]` if `trans`.
#[derive(Clone, Copy, Debug)]
pub(super) struct BSrc<'a> {
    pub data: &'a [f32],
    pub ld: usize,
    pub trans: bool,
}

/// The row tiles (micro-panels) of `rows` for an `mr`-row microkernel: as
/// few tiles as `mr` allows, their heights differing by at most one (32
/// rows with AVX-512's 14 are 11, 11 and 10, not 14, 14 and 4). A short
/// tile is bound by FMA latency and costs nearly as much as a full one:
/// 32 x 1024 x 1024 ran 4-5% faster split evenly (AVX-512, and 1-4% on
/// AVX2's 6-row tiles at 13 to 32 rows, on a Sapphire Rapids class Xeon).
/// Packing and kernels share this.
#[inline(always)]
pub(super) fn row_tiles(rows: Range<usize>, mr: usize) -> impl ExactSizeIterator<Item = Range<usize>> + Clone {
    let (len, start) = (rows.len(), rows.start);
    let count = len.div_ceil(mr);
    let (base, extra) = (len / count.max(1), len % count.max(1));
    // The first `extra` tiles get one row more.
    let begin = move |t: usize| start + t * base + t.min(extra);
    (0..count).map(move |t| begin(t)..begin(t + 1))
}

/// Packs `A[rows][ks]` into micro-panels, one per [`row_tiles`] tile of
/// height `h <= MR`: each panel is `ks.len()` groups of its `h` rows' values,
/// one group per k. Writes `rows.len() * ks.len()` values at the start of
/// `dst`. The caller checked that `a` holds every element read.
#[inline(always)]
pub(super) fn pack_a<const MR: usize>(a: ASrc<'_>, rows: Range<usize>, ks: Range<usize>, dst: &mut [f32]) {
    let kc = ks.len();
    let mut out = &mut dst[..rows.len() * kc];
    for tile in row_tiles(rows, MR) {
        let (r0, h) = (tile.start, tile.len());
        let (panel, rest) = std::mem::take(&mut out).split_at_mut(h * kc);
        out = rest;
        match (a.trans, h == MR) {
            (true, true) => {
                for (k, d) in ks.clone().zip(panel.chunks_exact_mut(MR)) {
                    let s: &[f32; MR] = a.data[k * a.ld + r0..][..MR].try_into().unwrap();
                    d.copy_from_slice(s);
                }
            }
            (true, false) => {
                for (k, d) in ks.clone().zip(panel.chunks_exact_mut(h)) {
                    d.copy_from_slice(&a.data[k * a.ld + r0..][..h]);
                }
            }
            (false, true) => {
                let src: [&[f32]; MR] = std::array::from_fn(|i| &a.data[(r0 + i) * a.ld + ks.start..][..kc]);
                // Four k at a time: each row contributes 4 values per step.
                let (d4, dt) = panel.split_at_mut(kc / 4 * 4 * MR);
                for (q, d) in d4.chunks_exact_mut(4 * MR).enumerate() {
                    for (i, s) in src.iter().enumerate() {
                        let s: &[f32; 4] = s[q * 4..q * 4 + 4].try_into().unwrap();
                        d[i] = s[0];
                        d[MR + i] = s[1];
                        d[2 * MR + i] = s[2];
                        d[3 * MR + i] = s[3];
                    }
                }
                for (kk, d) in dt.chunks_exact_mut(MR).enumerate() {
                    for (i, s) in src.iter().enumerate() {
                        d[i] = s[kc / 4 * 4 + kk];
                    }
                }
            }
            (false, false) => {
                for i in 0..h {
                    let s = &a.data[(r0 + i) * a.ld + ks.start..][..kc];
                    for (d, &v) in panel[i..].iter_mut().step_by(h).zip(s) {
                        *d = v;
                    }
                }
            }
        }
    }
}

/// Packs `B[ks][cols]` into panels of `nr` columns, the last one zero-padded:
/// panel `p` is `ks.len()` rows of `nr` values. Fills `dst`, which holds
/// exactly `ceil(cols.len() / nr) * nr * ks.len()` values.
/// The caller checked that `b` holds every element read.
#[inline(always)]
pub(super) fn pack_b(b: BSrc<'_>, ks: Range<usize>, cols: Range<usize>, nr: usize, dst: &mut [f32]) {
    let kc = ks.len();
    assert_eq!(dst.len(), cols.len().div_ceil(nr) * nr * kc, "pack_b destination");
    if kc == 0 {
        return;
    }
    for (j0, panel) in cols.clone().step_by(nr).zip(dst.chunks_exact_mut(nr * kc)) {
        let w = nr.min(cols.end - j0);
        if b.trans {
            if w < nr {
                panel.fill(0.0);
            }
            for jj in 0..w {
                let s = &b.data[(j0 + jj) * b.ld + ks.start..][..kc];
                for (d, &v) in panel[jj..].iter_mut().step_by(nr).zip(s) {
                    *d = v;
                }
            }
        } else {
            for (k, d) in ks.clone().zip(panel.chunks_exact_mut(nr)) {
                d[..w].copy_from_slice(&b.data[k * b.ld + j0..][..w]);
                d[w..].fill(0.0);
            }
        }
    }
}

/// [`pack_a`] for row-major A on `target`: each micro-panel is the
/// transpose of `h` rows × `ks`, done in registers by
/// [`crate::kernels::transpose`] (8×8 blocks). The x86 kernels gathered
/// instead, one gather per k, which is slow on AMD CPUs: packing then took
/// an eighth of a 300×384×384 product on a Zen 5.
#[inline(always)]
pub(super) fn pack_a_rows<const MR: usize>(
    target: Target,
    a: ASrc<'_>,
    rows: Range<usize>,
    ks: Range<usize>,
    dst: &mut [f32],
) {
    let Some(isa) = Isa::new(target).filter(|_| !a.trans) else {
        return pack_a::<MR>(a, rows, ks, dst);
    };
    let mut at = 0;
    for tile in row_tiles(rows, MR) {
        let t = Transpose2 {
            rows: ks.len(),
            cols: tile.len(),
            s: tile.start * a.ld + ks.start,
            sld: a.ld,
            d: at,
            dld: tile.len(),
        };
        transpose(isa, &t, a.data, dst);
        at += tile.len() * ks.len();
    }
}

/// [`pack_b`] for transposed B (`Kᵀ` in attention's `Q·Kᵀ`) on `target`,
/// each panel a transpose in registers as in [`pack_a_rows`].
#[inline(always)]
pub(super) fn pack_b_columns(
    target: Target,
    b: BSrc<'_>,
    ks: Range<usize>,
    cols: Range<usize>,
    nr: usize,
    dst: &mut [f32],
) {
    let Some(isa) = Isa::new(target).filter(|_| b.trans) else {
        return pack_b(b, ks, cols, nr, dst);
    };
    let kc = ks.len();
    assert_eq!(dst.len(), cols.len().div_ceil(nr) * nr * kc, "pack_b destination");
    for (j0, panel) in cols.clone().step_by(nr).zip(dst.chunks_exact_mut(nr * kc)) {
        let w = nr.min(cols.end - j0);
        if w < nr {
            panel.fill(0.0);
        }
        let t = Transpose2 {
            rows: kc,
            cols: w,
            s: j0 * b.ld + ks.start,
            sld: b.ld,
            d: 0,
            dld: nr,
        };
        transpose(isa, &t, b.data, panel);
    }
}
