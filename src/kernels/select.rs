//! Selection along one axis of `[outer, len, inner]`: ArgMax / ArgMin and
//! TopK, writing int64 indices.
//!
//! The rules are ORT 1.31's CPU EP's, measured against it
//! (`python/tests/test_ops_argtopk.py`): ArgMax keeps the first index whose
//! value is greater than every earlier one (`v > best`, so a NaN never
//! wins unless it comes first); with `select_last_index` it moves on equal
//! values too (`v > best || v == best`). TopK orders by value, ties by the
//! lower index; a NaN counts as greater than every number (ORT's heap gives
//! no consistent order with NaNs, see the README).

use super::parallel::Parallel;

/// The sizes of a selection: `len` values per (outer, inner) pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lanes {
    pub outer: usize,
    pub len: usize,
    pub inner: usize,
}

impl Lanes {
    fn numel(&self) -> Option<usize> {
        self.outer.checked_mul(self.len)?.checked_mul(self.inner)
    }
}

/// What an ArgMax / ArgMin picks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ArgRule {
    /// ArgMin rather than ArgMax.
    pub min: bool,
    /// `select_last_index`.
    pub last: bool,
}

/// Whether `v` replaces `best` under `rule`.
#[inline(always)]
fn beats<T: PartialOrd>(rule: ArgRule, v: T, best: T) -> bool {
    let better = if rule.min { v < best } else { v > best };
    better || rule.last && v == best
}

/// `dst[o, i]` = the index along `len` of the extreme of `src[o, .., i]`
/// (`len > 0`).
pub fn arg_reduce<T: PartialOrd + Copy + Sync>(
    rule: ArgRule,
    lanes: Lanes,
    src: &[T],
    dst: &mut [i64],
    par: &dyn Parallel,
) {
    let Lanes { outer, len, inner } = lanes;
    assert!(
        len > 0 && lanes.numel() == Some(src.len()) && outer * inner == dst.len(),
        "arg_reduce sizes"
    );
    // Nothing to write; also keeps the scratch below from sizing itself on
    // a corrupt file's `inner` when no element backs it.
    if dst.is_empty() {
        return;
    }
    let block = len * inner;
    super::par_rows(par, outer, inner, dst, &|rows, out| {
        let mut best: Vec<T> = Vec::with_capacity(inner);
        for (o, d) in rows.zip(out.chunks_exact_mut(inner)) {
            let s = &src[o * block..(o + 1) * block];
            best.clear();
            best.extend_from_slice(&s[..inner]);
            d.fill(0);
            for (k, row) in s.chunks_exact(inner).enumerate().skip(1) {
                for ((b, i), &v) in best.iter_mut().zip(d.iter_mut()).zip(row) {
                    if beats(rule, v, *b) {
                        *b = v;
                        *i = k as i64;
                    }
                }
            }
        }
    });
}

/// What a TopK keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TopKRule {
    pub k: usize,
    pub largest: bool,
}

/// A value's place in TopK's order as an unsigned key: a greater value
/// has a greater key, equal values (+0 and -0 too) equal keys, and NaN the
/// greatest key of all. Selecting on integer keys is several times faster
/// than on a comparator that checks for NaN.
pub trait SortKey: Copy + Send + Sync {
    fn sort_key(self) -> u64;
}

impl SortKey for f32 {
    #[inline(always)]
    fn sort_key(self) -> u64 {
        if self.is_nan() {
            return u64::MAX;
        }
        // +0 for -0 (they tie); then flip so that the bits order like the values.
        let b = (self + 0.0).to_bits();
        u64::from(if b >> 31 == 1 { !b } else { b | 0x8000_0000 })
    }
}

impl SortKey for i64 {
    #[inline(always)]
    fn sort_key(self) -> u64 {
        (self as u64) ^ (1 << 63)
    }
}

/// The rank of element `idx` of value `v`: the greater, the earlier in the
/// output (by value in the wanted direction, NaN last when smallest, then
/// by the lower index).
#[inline(always)]
fn rank<T: SortKey>(largest: bool, v: T, idx: usize) -> u128 {
    let k = v.sort_key();
    let k = if largest { k } else { !k };
    (u128::from(k) << 64) | u128::from(u64::MAX - idx as u64)
}

/// `dst[o, j, i]` = the index along `len` of the `j`-th of the `k` largest
/// (smallest) values of `src[o, .., i]`, in order (`k <= len`).
pub fn top_k<T: SortKey>(rule: TopKRule, lanes: Lanes, src: &[T], dst: &mut [i64], par: &dyn Parallel) {
    let Lanes { outer, len, inner } = lanes;
    let k = rule.k;
    assert!(
        k <= len && lanes.numel() == Some(src.len()) && outer * k * inner == dst.len(),
        "top_k sizes"
    );
    // Nothing to write; also keeps the scratch below from sizing itself on
    // a corrupt file's `len` when no element backs it.
    if dst.is_empty() {
        return;
    }
    let block = len * inner;
    super::par_rows(par, outer, k * inner, dst, &|rows, out| {
        let mut col: Vec<u128> = Vec::with_capacity(len);
        for (o, d) in rows.zip(out.chunks_exact_mut(k * inner)) {
            let s = &src[o * block..(o + 1) * block];
            for i in 0..inner {
                col.clear();
                col.extend((0..len).map(|j| rank(rule.largest, s[j * inner + i], j)));
                let first = |a: &u128, b: &u128| b.cmp(a);
                if k < len {
                    col.select_nth_unstable_by(k - 1, first);
                }
                col[..k].sort_unstable_by(first);
                for (j, &r) in col[..k].iter().enumerate() {
                    d[j * inner + i] = (u64::MAX - r as u64) as i64;
                }
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::parallel::Serial;

    const NAN: f32 = f32::NAN;

    fn arg(min: bool, last: bool, row: &[f32]) -> i64 {
        let mut d = [0i64];
        let lanes = Lanes {
            outer: 1,
            len: row.len(),
            inner: 1,
        };
        arg_reduce(ArgRule { min, last }, lanes, row, &mut d, &Serial);
        d[0]
    }

    #[test]
    fn arg_reduce_follows_orts_nan_and_tie_rules() {
        let x = [1.0, NAN, 3.0, 3.0];
        assert_eq!(arg(false, false, &x), 2);
        assert_eq!(arg(false, true, &x), 3);
        let y = [NAN, 2.0, 2.0, NAN];
        assert_eq!(arg(false, false, &y), 0);
        assert_eq!(arg(false, true, &y), 0);
        let z = [3.0, 3.0, 1.0, 1.0];
        assert_eq!(arg(true, false, &z), 2);
        assert_eq!(arg(true, true, &z), 3);
        assert_eq!(arg(false, true, &z), 1);
    }

    #[test]
    fn arg_reduce_over_an_inner_axis_matches_rows() {
        // [2, 3, 2]: along the middle axis.
        let src = [5.0f32, 1.0, 7.0, 1.0, 7.0, 0.0, 2.0, 2.0, 2.0, 9.0, 1.0, 9.0];
        let lanes = Lanes {
            outer: 2,
            len: 3,
            inner: 2,
        };
        let mut d = [0i64; 4];
        arg_reduce(
            ArgRule {
                min: false,
                last: false,
            },
            lanes,
            &src,
            &mut d,
            &Serial,
        );
        assert_eq!(d, [1, 0, 0, 1]);
        arg_reduce(ArgRule { min: false, last: true }, lanes, &src, &mut d, &Serial);
        assert_eq!(d, [2, 1, 1, 2]);
    }

    #[test]
    fn empty_outputs_allocate_nothing_for_huge_axes() {
        // What a corrupt file may describe: no rows, but an axis of 2^60.
        let lanes = Lanes {
            outer: 0,
            len: 1 << 60,
            inner: 1 << 60,
        };
        let mut d: [i64; 0] = [];
        arg_reduce(
            ArgRule {
                min: false,
                last: false,
            },
            lanes,
            &[0f32; 0],
            &mut d,
            &Serial,
        );
        top_k(TopKRule { k: 3, largest: true }, lanes, &[0f32; 0], &mut d, &Serial);
    }

    #[test]
    fn top_k_orders_ties_by_index_and_nan_as_greatest() {
        let src = [3.0f32, 1.0, 3.0, NAN, 2.0, 1.0];
        let lanes = Lanes {
            outer: 1,
            len: 6,
            inner: 1,
        };
        let mut d = [0i64; 4];
        top_k(TopKRule { k: 4, largest: true }, lanes, &src, &mut d, &Serial);
        assert_eq!(d, [3, 0, 2, 4]);
        top_k(TopKRule { k: 4, largest: false }, lanes, &src, &mut d, &Serial);
        assert_eq!(d, [1, 5, 4, 0]);
        // -0 and +0 tie (lower index first), as in ORT's `==`.
        let zeros = [0.0f32, -0.0, 1.0, 0.0, -0.0, -1.0];
        top_k(TopKRule { k: 4, largest: true }, lanes, &zeros, &mut d, &Serial);
        assert_eq!(d, [2, 0, 1, 3]);
        top_k(TopKRule { k: 4, largest: false }, lanes, &zeros, &mut d, &Serial);
        assert_eq!(d, [5, 0, 1, 3]);
        let ints = [4i64, 4, 9, -1, 4, 0];
        top_k(TopKRule { k: 4, largest: true }, lanes, &ints, &mut d, &Serial);
        assert_eq!(d, [2, 0, 1, 4]);
        let extremes = [i64::MIN, i64::MAX, -1, 0, i64::MAX, 1];
        top_k(TopKRule { k: 4, largest: false }, lanes, &extremes, &mut d, &Serial);
        assert_eq!(d, [0, 2, 3, 5]);
        let floats = [f32::NEG_INFINITY, f32::INFINITY, f32::MIN, f32::MAX, -1e-45, 1e-45];
        top_k(TopKRule { k: 4, largest: true }, lanes, &floats, &mut d, &Serial);
        assert_eq!(d, [1, 3, 5, 4]);
    }
}
