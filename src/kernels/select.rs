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
use std::cmp::Ordering;

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
    if inner == 0 {
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

/// `a` before `b` in TopK's output order: by value (NaN greatest), then by
/// the lower index.
#[inline(always)]
fn order<T: PartialOrd>(largest: bool, a: &(T, usize), b: &(T, usize)) -> Ordering {
    let by_value = match a.0.partial_cmp(&b.0) {
        Some(o) => o,
        // Exactly one of them (or both) is NaN: NaN is the greater.
        None => is_nan(&a.0).cmp(&is_nan(&b.0)),
    };
    let by_value = if largest { by_value.reverse() } else { by_value };
    by_value.then(a.1.cmp(&b.1))
}

#[inline(always)]
fn is_nan<T: PartialOrd>(v: &T) -> bool {
    v.partial_cmp(v).is_none()
}

/// `dst[o, j, i]` = the index along `len` of the `j`-th of the `k` largest
/// (smallest) values of `src[o, .., i]`, in order (`k <= len`).
pub fn top_k<T: PartialOrd + Copy + Send + Sync>(
    rule: TopKRule,
    lanes: Lanes,
    src: &[T],
    dst: &mut [i64],
    par: &dyn Parallel,
) {
    let Lanes { outer, len, inner } = lanes;
    let k = rule.k;
    assert!(
        k <= len && lanes.numel() == Some(src.len()) && outer * k * inner == dst.len(),
        "top_k sizes"
    );
    if k == 0 || inner == 0 {
        return;
    }
    let block = len * inner;
    super::par_rows(par, outer, k * inner, dst, &|rows, out| {
        let mut col: Vec<(T, usize)> = Vec::with_capacity(len);
        for (o, d) in rows.zip(out.chunks_exact_mut(k * inner)) {
            let s = &src[o * block..(o + 1) * block];
            for i in 0..inner {
                col.clear();
                col.extend((0..len).map(|j| (s[j * inner + i], j)));
                let cmp = |a: &(T, usize), b: &(T, usize)| order(rule.largest, a, b);
                if k < len {
                    col.select_nth_unstable_by(k - 1, cmp);
                }
                col[..k].sort_unstable_by(cmp);
                for (j, &(_, idx)) in col[..k].iter().enumerate() {
                    d[j * inner + i] = idx as i64;
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
        let ints = [4i64, 4, 9, -1, 4, 0];
        top_k(TopKRule { k: 4, largest: true }, lanes, &ints, &mut d, &Serial);
        assert_eq!(d, [2, 0, 1, 4]);
    }
}
