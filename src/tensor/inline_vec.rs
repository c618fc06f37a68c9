//! A list that keeps up to `N` values inline (on the stack) and moves to
//! the heap only beyond that: the per-Run lists of a partition's inputs,
//! outputs and dims allocate nothing in the common case (issue #14).

use std::ops::{Deref, DerefMut};

pub struct InlineVec<T, const N: usize> {
    inline: [T; N],
    len: usize,
    /// Every value once more than `N` were pushed (`inline` is then unused).
    heap: Vec<T>,
}

impl<T: Default, const N: usize> Default for InlineVec<T, N> {
    fn default() -> Self {
        InlineVec {
            inline: std::array::from_fn(|_| T::default()),
            len: 0,
            heap: Vec::new(),
        }
    }
}

impl<T: Default, const N: usize> InlineVec<T, N> {
    pub fn push(&mut self, value: T) {
        if self.len < N {
            self.inline[self.len] = value;
        } else {
            if self.len == N {
                self.heap.extend(self.inline.iter_mut().map(std::mem::take));
            }
            self.heap.push(value);
        }
        self.len += 1;
    }
}

impl<T, const N: usize> Deref for InlineVec<T, N> {
    type Target = [T];

    fn deref(&self) -> &[T] {
        if self.len > N {
            &self.heap
        } else {
            &self.inline[..self.len]
        }
    }
}

impl<T, const N: usize> DerefMut for InlineVec<T, N> {
    fn deref_mut(&mut self) -> &mut [T] {
        if self.len > N {
            &mut self.heap
        } else {
            &mut self.inline[..self.len]
        }
    }
}

impl<T: Default, const N: usize> FromIterator<T> for InlineVec<T, N> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> Self {
        let mut out = InlineVec::default();
        iter.into_iter().for_each(|v| out.push(v));
        out
    }
}

impl<T: std::fmt::Debug, const N: usize> std::fmt::Debug for InlineVec<T, N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::InlineVec;

    #[test]
    fn keeps_order_inline_and_past_its_capacity() {
        for n in [0, 1, 3, 4, 5, 9] {
            let v: InlineVec<usize, 4> = (0..n).collect();
            assert_eq!(&v[..], (0..n).collect::<Vec<_>>());
            assert_eq!(v.heap.is_empty(), n <= 4);
        }
        let mut v: InlineVec<String, 2> = InlineVec::default();
        v.push("a".into());
        v[0].push('b');
        assert_eq!(format!("{v:?}"), r#"["ab"]"#);
    }
}
