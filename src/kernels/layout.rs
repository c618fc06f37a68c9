//! How the two inputs of a broadcasting binary op line up with its output.
//!
//! Computed once at compile time from the static shapes, so `run` never
//! looks at shapes. Broadcast shapes are first simplified: size-1 output
//! dims are dropped and neighbouring dims that step the same way in both
//! inputs are merged, which turns most real cases into one of the fast paths.

use crate::tensor::broadcast_shapes;

/// The access pattern of `out = a op b`, all row-major.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Layout {
    /// `a`, `b` and `out` have the same number of elements.
    Same,
    /// `a` is one element.
    ScalarA,
    /// `b` is one element.
    ScalarB,
    /// `a` is one row of `inner` elements, repeated for every row of `out`.
    RowA { inner: usize },
    /// `b` is one row of `inner` elements, repeated for every row of `out`.
    RowB { inner: usize },
    /// Anything else.
    Strided(Strided),
}

/// General broadcast: `out` has shape `dims`; stepping dim `d` by one moves
/// `a` by `a_strides[d]` and `b` by `b_strides[d]` elements (0 = broadcast).
/// The innermost strides are 0 or 1, so the innermost dim runs as a slice loop.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Strided {
    pub dims: Vec<usize>,
    pub a_strides: Vec<usize>,
    pub b_strides: Vec<usize>,
}

impl Layout {
    /// The layout of `a op b`, or `None` if the shapes do not broadcast.
    pub fn for_shapes(a: &[usize], b: &[usize]) -> Option<Layout> {
        let out = broadcast_shapes(a, b)?;
        if out.contains(&0) {
            // Nothing to compute; Same checks only that `out` is empty.
            return Some(Layout::Same);
        }
        let s = collapse(&out, &strides_in(a, &out), &strides_in(b, &out));
        Some(classify(s))
    }

    /// Whether this layout stays in bounds for slices of these lengths.
    /// Cheap (O(rank)); `kernels::binary` calls it so a bad plan cannot panic.
    pub fn fits(&self, a_len: usize, b_len: usize, out_len: usize) -> bool {
        if out_len == 0 {
            return true;
        }
        match self {
            Layout::Same => a_len == out_len && b_len == out_len,
            Layout::ScalarA => a_len == 1 && b_len == out_len,
            Layout::ScalarB => a_len == out_len && b_len == 1,
            Layout::RowA { inner } => row_fits(*inner, a_len, b_len, out_len),
            Layout::RowB { inner } => row_fits(*inner, b_len, a_len, out_len),
            Layout::Strided(s) => s.fits(a_len, b_len, out_len),
        }
    }
}

fn row_fits(inner: usize, row_len: usize, full_len: usize, out_len: usize) -> bool {
    row_len == inner && full_len == out_len && out_len.checked_rem(inner) == Some(0)
}

impl Strided {
    fn fits(&self, a_len: usize, b_len: usize, out_len: usize) -> bool {
        let rank = self.dims.len();
        if rank == 0 || self.a_strides.len() != rank || self.b_strides.len() != rank {
            return false;
        }
        let inner_ok = |s: &[usize]| s[rank - 1] <= 1;
        let numel = self.dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
        numel == Some(out_len)
            && inner_ok(&self.a_strides)
            && inner_ok(&self.b_strides)
            && self.last_index(&self.a_strides).is_some_and(|i| i < a_len)
            && self.last_index(&self.b_strides).is_some_and(|i| i < b_len)
    }

    /// The largest element index reached through `strides`, plus the inner run.
    fn last_index(&self, strides: &[usize]) -> Option<usize> {
        self.dims.iter().zip(strides).try_fold(0usize, |acc, (&d, &s)| {
            acc.checked_add(d.checked_sub(1)?.checked_mul(s)?)
        })
    }
}

/// Element strides of `shape` (right-aligned into `out`), 0 where it broadcasts.
fn strides_in(shape: &[usize], out: &[usize]) -> Vec<usize> {
    let pad = out.len() - shape.len();
    let mut strides = vec![0; out.len()];
    let mut step = 1;
    for i in (0..shape.len()).rev() {
        if shape[i] != 1 {
            strides[pad + i] = step;
        }
        step *= shape[i];
    }
    strides
}

/// Drops size-1 dims and merges neighbours that are contiguous in both inputs.
fn collapse(dims: &[usize], a: &[usize], b: &[usize]) -> Strided {
    let (dims, a_strides, b_strides) = merge_dims(dims, a, b, |n| n);
    Strided {
        dims,
        a_strides,
        b_strides,
    }
}

/// Drops size-1 dims and merges each dim into the inner one it continues in
/// both stride sets `x` and `y`: its stride is the inner stride times the
/// inner size (0 == 0 * n for broadcasts). `size` converts a dim to a stride.
pub(crate) fn merge_dims<T>(dims: &[usize], x: &[T], y: &[T], size: impl Fn(usize) -> T) -> (Vec<usize>, Vec<T>, Vec<T>)
where
    T: Copy + PartialEq + std::ops::Mul<Output = T>,
{
    let (mut d, mut xs, mut ys): (Vec<usize>, Vec<T>, Vec<T>) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..dims.len() {
        if dims[i] == 1 {
            continue;
        }
        if let (Some(&sx), Some(&sy)) = (xs.last(), ys.last()) {
            let n = size(dims[i]);
            if sx == x[i] * n && sy == y[i] * n {
                let last = d.len() - 1;
                d[last] *= dims[i];
                xs[last] = x[i];
                ys[last] = y[i];
                continue;
            }
        }
        d.push(dims[i]);
        xs.push(x[i]);
        ys.push(y[i]);
    }
    (d, xs, ys)
}

fn classify(s: Strided) -> Layout {
    match (s.dims.len(), &s.a_strides[..], &s.b_strides[..]) {
        (0, ..) => Layout::Same,
        (1, [1], [1]) => Layout::Same,
        (1, [0], [1]) => Layout::ScalarA,
        (1, [1], [0]) => Layout::ScalarB,
        (2, [0, 1], [n, 1]) if *n == s.dims[1] => Layout::RowA { inner: s.dims[1] },
        (2, [n, 1], [0, 1]) if *n == s.dims[1] => Layout::RowB { inner: s.dims[1] },
        _ => Layout::Strided(s),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn layout(a: &[usize], b: &[usize]) -> Layout {
        Layout::for_shapes(a, b).unwrap()
    }

    fn strided(dims: &[usize], a: &[usize], b: &[usize]) -> Layout {
        Layout::Strided(Strided {
            dims: dims.to_vec(),
            a_strides: a.to_vec(),
            b_strides: b.to_vec(),
        })
    }

    #[test]
    fn fast_paths_are_found() {
        assert_eq!(layout(&[2, 3, 4], &[2, 3, 4]), Layout::Same);
        assert_eq!(layout(&[1, 6], &[6]), Layout::Same);
        assert_eq!(layout(&[], &[]), Layout::Same);
        assert_eq!(layout(&[2, 3, 4], &[]), Layout::ScalarB);
        assert_eq!(layout(&[1, 1], &[2, 3]), Layout::ScalarA);
        assert_eq!(layout(&[2, 3, 4], &[4]), Layout::RowB { inner: 4 });
        assert_eq!(layout(&[2, 3, 4], &[1, 1, 4]), Layout::RowB { inner: 4 });
        assert_eq!(layout(&[3, 4], &[2, 3, 4]), Layout::RowA { inner: 12 });
        assert_eq!(layout(&[1, 3, 4], &[0, 3, 4]), Layout::Same);
    }

    #[test]
    fn general_cases_collapse() {
        // [3,1] against [2,3,4]: b is [1,3,1]; nothing merges.
        assert_eq!(
            layout(&[2, 3, 4], &[3, 1]),
            strided(&[2, 3, 4], &[12, 4, 1], &[0, 1, 0])
        );
        // [2,1,4]: the broadcast middle dim separates two runs of 4.
        assert_eq!(
            layout(&[2, 3, 4], &[2, 1, 4]),
            strided(&[2, 3, 4], &[12, 4, 1], &[4, 0, 1])
        );
        // Column broadcast [6,1] over [6,5].
        assert_eq!(layout(&[6, 5], &[6, 1]), strided(&[6, 5], &[5, 1], &[1, 0]));
        // Both sides broadcast: [2,1] op [1,3].
        assert_eq!(layout(&[2, 1], &[1, 3]), strided(&[2, 3], &[1, 0], &[0, 1]));
        // Mergeable leading dims: [2,3,4,5] op [4,5] is one row of 20.
        assert_eq!(layout(&[2, 3, 4, 5], &[4, 5]), Layout::RowB { inner: 20 });
    }

    #[test]
    fn non_broadcastable_is_none() {
        assert_eq!(Layout::for_shapes(&[2, 3], &[4]), None);
    }

    #[test]
    fn fits_checks_lengths() {
        assert!(Layout::Same.fits(4, 4, 4));
        assert!(!Layout::Same.fits(4, 3, 4));
        assert!(Layout::ScalarB.fits(4, 1, 4));
        assert!(Layout::RowB { inner: 4 }.fits(12, 4, 12));
        assert!(!Layout::RowB { inner: 4 }.fits(12, 4, 10));
        assert!(!Layout::RowA { inner: 0 }.fits(0, 4, 4));
        let s = layout(&[2, 3, 4], &[3, 1]);
        assert!(s.fits(24, 3, 24));
        assert!(!s.fits(24, 2, 24));
        assert!(!s.fits(23, 3, 24));
        assert!(!strided(&[2, 3], &[3, 2], &[0, 1]).fits(6, 3, 6));
        assert!(Layout::Same.fits(0, 7, 0));
    }
}
