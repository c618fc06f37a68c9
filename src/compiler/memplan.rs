//! Static memory plan: places every intermediate buffer in one arena, letting
//! buffers whose lifetimes do not overlap share space.
//!
//! Sizes are bytes; every buffer starts at a multiple of [`ARENA_ALIGN`]
//! (64: a cache line, and enough for every element type and vector load).
//! Lifetimes are in node indices. A buffer is busy from the node that writes
//! it to the last node that reads it, inclusive: kernels do not run in
//! place, so a node's inputs and its outputs must not share memory. (The one
//! exception is decided before this plan: `lower` gives a convolution's
//! output its residual's buffer, one lifetime for both, and the step says
//! so.)

use crate::error::{Error, Result};

/// Alignment of every arena buffer, in bytes.
pub(crate) const ARENA_ALIGN: usize = 64;

/// One intermediate buffer to place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Lifetime {
    /// Bytes.
    pub len: usize,
    /// Step that writes it.
    pub first: usize,
    /// Last step that reads it (`>= first`).
    pub last: usize,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ArenaPlan {
    /// Byte offset of each buffer, in input order.
    pub offsets: Vec<usize>,
    /// Arena size in bytes.
    pub len: usize,
}

/// Busy range of the arena: `[offset, offset + len)` until step `last`.
struct Placed {
    offset: usize,
    len: usize,
    last: usize,
}

/// First-fit placement in order of first use; the lowest free gap that fits wins.
pub(crate) fn plan_arena(buffers: &[Lifetime]) -> Result<ArenaPlan> {
    let mut order: Vec<usize> = (0..buffers.len()).collect();
    order.sort_by_key(|&i| (buffers[i].first, std::cmp::Reverse(buffers[i].len)));
    let mut offsets = vec![0; buffers.len()];
    let mut busy: Vec<Placed> = Vec::new(); // sorted by offset
    let mut total = 0usize;
    for i in order {
        let b = buffers[i];
        busy.retain(|p| p.last >= b.first);
        let (slot, offset) = first_fit(&busy, b.len);
        let end = offset
            .checked_add(b.len)
            .ok_or_else(|| Error::invalid_graph("kiln scratch arena would overflow usize"))?;
        total = total.max(end);
        offsets[i] = offset;
        busy.insert(
            slot,
            Placed {
                offset,
                len: b.len,
                last: b.last,
            },
        );
    }
    Ok(ArenaPlan { offsets, len: total })
}

/// Lowest aligned offset with `len` free bytes, and where to insert it in `busy`.
fn first_fit(busy: &[Placed], len: usize) -> (usize, usize) {
    let mut cursor = 0;
    for (slot, p) in busy.iter().enumerate() {
        if p.offset >= cursor && p.offset - cursor >= len {
            return (slot, cursor);
        }
        cursor = align(cursor.max(p.offset + p.len));
    }
    (busy.len(), cursor)
}

fn align(n: usize) -> usize {
    n.div_ceil(ARENA_ALIGN) * ARENA_ALIGN
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sizes in units of 64 bytes, so the expectations read as before.
    fn lt(len: usize, first: usize, last: usize) -> Lifetime {
        Lifetime {
            len: len * 64,
            first,
            last,
        }
    }

    /// No two buffers that are alive at the same step overlap in memory.
    fn assert_sound(buffers: &[Lifetime], plan: &ArenaPlan) {
        for (i, a) in buffers.iter().enumerate() {
            let oa = plan.offsets[i];
            assert!(oa + a.len <= plan.len);
            for (j, b) in buffers.iter().enumerate().skip(i + 1) {
                let ob = plan.offsets[j];
                let time = a.first <= b.last && b.first <= a.last;
                let space = oa < ob + b.len && ob < oa + a.len;
                assert!(!(time && space), "{i} {a:?}@{oa} and {j} {b:?}@{ob} clash");
            }
        }
    }

    #[test]
    fn chain_reuses_two_buffers() {
        // t0 -> t1 -> t2 -> t3, each read only by the next step.
        let bufs = [lt(8, 0, 1), lt(8, 1, 2), lt(8, 2, 3), lt(8, 3, 4)];
        let plan = plan_arena(&bufs).unwrap();
        assert_sound(&bufs, &plan);
        assert_eq!(plan.len, 16 * 64);
        assert_eq!(plan.offsets, vec![0, 8 * 64, 0, 8 * 64]);
    }

    #[test]
    fn long_lived_buffer_is_kept_apart() {
        // t0 is read at the end; the others chain in between.
        let bufs = [lt(4, 0, 5), lt(4, 1, 2), lt(4, 2, 3), lt(4, 3, 5)];
        let plan = plan_arena(&bufs).unwrap();
        assert_sound(&bufs, &plan);
        assert_eq!(plan.len, 12 * 64);
    }

    #[test]
    fn gaps_are_filled_first_fit() {
        // A small buffer fits in the hole a freed one leaves.
        let bufs = [lt(4, 0, 1), lt(8, 1, 3), lt(2, 2, 3), lt(4, 4, 4)];
        let plan = plan_arena(&bufs).unwrap();
        assert_sound(&bufs, &plan);
        assert_eq!(plan.len, 12 * 64);
        assert_eq!(plan.offsets[2], 0);
    }

    #[test]
    fn empty_and_zero_sized() {
        assert_eq!(plan_arena(&[]).unwrap().len, 0);
        let bufs = [lt(0, 0, 1), lt(3, 0, 1)];
        let plan = plan_arena(&bufs).unwrap();
        assert_sound(&bufs, &plan);
        assert_eq!(plan.len, 3 * 64);
    }

    #[test]
    fn random_plans_are_sound() {
        let mut state = 12345u32;
        let mut next = |m: u32| {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            (state % m) as usize
        };
        for _ in 0..200 {
            let n = 1 + next(12);
            let bufs: Vec<Lifetime> = (0..n)
                .map(|_| {
                    let first = next(10);
                    lt(next(20), first, first + next(5))
                })
                .collect();
            let plan = plan_arena(&bufs).unwrap();
            assert_sound(&bufs, &plan);
            assert!(plan.len <= bufs.iter().map(|b| b.len).sum());
        }
    }

    #[test]
    fn odd_sizes_are_aligned() {
        let bufs = [
            Lifetime {
                len: 3,
                first: 0,
                last: 2,
            },
            Lifetime {
                len: 100,
                first: 1,
                last: 2,
            },
            Lifetime {
                len: 8,
                first: 2,
                last: 3,
            },
        ];
        let plan = plan_arena(&bufs).unwrap();
        assert_sound(&bufs, &plan);
        assert!(plan.offsets.iter().all(|o| o % ARENA_ALIGN == 0));
        assert_eq!(plan.offsets, vec![0, 64, 192]);
    }
}
