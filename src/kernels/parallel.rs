//! Parallel-for without owning threads.
//!
//! kiln lives in a library ORT can unload, so it never starts threads of its
//! own: at run time the ORT side implements [`Parallel`] with ORT's intra-op
//! pool (`KernelContext_ParallelFor`). [`Serial`] runs everything on the
//! caller; [`ScopedThreads`] is a stand-in pool for tests and benchmarks.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// A parallel-for: something that can run independent tasks concurrently.
///
/// # Safety
/// `for_each(n, f)` calls `f(i)` at most once for each `i` in `0..n` (exactly
/// once unless a call panics), and returns or unwinds only after every call
/// it started has returned. [`for_each_block`] relies on this to hand tasks
/// disjoint `&mut` blocks without locks.
#[allow(unsafe_code)]
pub unsafe trait Parallel: Sync {
    /// How many threads may run tasks at once (>= 1).
    fn threads(&self) -> usize;
    /// Runs f(i) for every i in 0..n, possibly concurrently; returns when all are done.
    fn for_each(&self, n: usize, f: &(dyn Fn(usize) + Sync));
}

/// `data` cut into groups of `group` elements, each group into blocks of
/// `block` elements (the last group and the last block of a group may be
/// shorter): block `i` is block `i % per_group` of group `i / per_group`,
/// `per_group = group.div_ceil(block)`. A value, so that splitting allocates
/// nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Blocks {
    len: usize,
    group: usize,
    block: usize,
}

impl Blocks {
    /// Zero sizes count as 1.
    pub fn new(len: usize, group: usize, block: usize) -> Blocks {
        let group = group.max(1);
        Blocks {
            len,
            group,
            block: block.clamp(1, group),
        }
    }

    fn per_group(&self) -> usize {
        self.group.div_ceil(self.block)
    }

    /// How many blocks there are; none is empty.
    pub fn count(&self) -> usize {
        let rest = self.len % self.group;
        self.len / self.group * self.per_group() + rest.div_ceil(self.block)
    }

    /// The elements of block `i`, inside `0..len`. Blocks of different `i`
    /// are disjoint: each lies in its own group's `g * group..(g + 1) * group`,
    /// and within a group at `j * block..(j + 1) * block`.
    pub fn get(&self, i: usize) -> std::ops::Range<usize> {
        let (g, j) = (i / self.per_group(), i % self.per_group());
        let group_end = ((g + 1) * self.group).min(self.len);
        let start = (g * self.group + j * self.block).min(group_end);
        start..(start + self.block).min(group_end)
    }
}

/// A slice that tasks borrow disjoint parts of at once (see [`for_each_block`]).
struct SharedSlice<T> {
    ptr: *mut T,
    len: usize,
}

// SAFETY: only `for_each_block` makes one, and it hands each task a block no
// other task gets; sending those `&mut [T]` to other threads needs `T: Send`.
#[allow(unsafe_code)]
unsafe impl<T: Send> Sync for SharedSlice<T> {}

impl<T> SharedSlice<T> {
    /// `&mut data[r]`; panics unless `r` is inside `data`.
    ///
    /// # Safety
    /// No other live borrow of `data` overlaps `r`.
    #[allow(unsafe_code, clippy::mut_from_ref)] // exclusive by the contract, like split_at_mut
    unsafe fn get(&self, r: std::ops::Range<usize>) -> &mut [T] {
        assert!(r.start <= r.end && r.end <= self.len, "block outside its slice");
        // SAFETY: `r` is inside the slice; exclusive per the contract.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.add(r.start), r.len()) }
    }
}

/// Runs `f(i, block)` for each block `i` of `data` (see [`Blocks`]) over
/// `par`, one task per block: each task gets its own `&mut` block, with
/// neither locks nor allocation.
pub fn for_each_block<T: Send>(
    par: &dyn Parallel,
    data: &mut [T],
    blocks: Blocks,
    f: &(dyn Fn(usize, &mut [T]) + Sync),
) {
    assert_eq!(blocks.len, data.len(), "blocks of another slice");
    let shared = SharedSlice {
        ptr: data.as_mut_ptr(),
        len: data.len(),
    };
    par.for_each(blocks.count(), &|i| {
        // SAFETY: no other task gets a range overlapping block i's: blocks
        // of different indices are disjoint (`Blocks::get`), and `Parallel`'s
        // contract (an unsafe trait) is that each index goes to one call
        // only and that no call outlives `for_each`, so none outlives our
        // `&mut data` either.
        #[allow(unsafe_code)]
        let block = unsafe { shared.get(blocks.get(i)) };
        f(i, block)
    });
}

/// [`for_each_block`] for tasks that can fail: returns an error a task
/// returned (the last one stored if several fail).
pub fn try_for_each_block<T: Send>(
    par: &dyn Parallel,
    data: &mut [T],
    blocks: Blocks,
    f: &(dyn Fn(usize, &mut [T]) -> crate::error::Result<()> + Sync),
) -> crate::error::Result<()> {
    let failed = Failed::default();
    for_each_block(par, data, blocks, &|i, block| failed.keep(f(i, block)));
    failed.result()
}

/// `par.for_each` for tasks that can fail: returns an error a task
/// returned (the last one stored if several fail).
pub fn try_for_each(
    par: &dyn Parallel,
    n: usize,
    f: &(dyn Fn(usize) -> crate::error::Result<()> + Sync),
) -> crate::error::Result<()> {
    let failed = Failed::default();
    par.for_each(n, &|i| failed.keep(f(i)));
    failed.result()
}

/// The error of a failed task, kept for the caller.
#[derive(Default)]
struct Failed(Mutex<Option<crate::error::Error>>);

impl Failed {
    fn keep(&self, r: crate::error::Result<()>) {
        if let Err(e) = r {
            *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
        }
    }

    fn result(self) -> crate::error::Result<()> {
        match self.0.into_inner().unwrap_or_else(|e| e.into_inner()) {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// Runs every task on the caller, in order.
#[derive(Clone, Copy, Debug, Default)]
pub struct Serial;

// SAFETY: runs f(0), f(1), ... in order on the caller.
#[allow(unsafe_code)]
unsafe impl Parallel for Serial {
    fn threads(&self) -> usize {
        1
    }

    fn for_each(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        (0..n).for_each(f)
    }
}

/// For tests and benchmarks only: each `for_each` runs its tasks on the caller
/// plus up to `self.0 - 1` threads started for that call (`std::thread::scope`),
/// which take tasks from a shared counter. Nothing outlives the call.
#[derive(Clone, Copy, Debug)]
pub struct ScopedThreads(pub usize);

// SAFETY: each index comes from one `fetch_add` of a shared counter, and
// `thread::scope` joins every thread before returning or unwinding.
#[allow(unsafe_code)]
unsafe impl Parallel for ScopedThreads {
    fn threads(&self) -> usize {
        self.0.max(1)
    }

    fn for_each(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        let workers = self.threads().min(n);
        if workers <= 1 {
            return (0..n).for_each(f);
        }
        let next = AtomicUsize::new(0);
        let work = || loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            if i >= n {
                break;
            }
            f(i);
        };
        std::thread::scope(|s| {
            for _ in 1..workers {
                s.spawn(work);
            }
            work();
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    #[test]
    fn blocks_cover_every_element_once() {
        for len in [0, 1, 5, 12, 13, 40] {
            for group in [0, 1, 3, 4, 12, 50] {
                for block in [0, 1, 2, 5, 100] {
                    let blocks = Blocks::new(len, group, block);
                    let mut seen = vec![0; len];
                    for i in 0..blocks.count() {
                        let r = blocks.get(i);
                        assert!(!r.is_empty() && r.len() <= block.max(1), "{len} {group} {block}: {r:?}");
                        // A block never crosses a group boundary.
                        assert_eq!(r.start / group.max(1), (r.end - 1) / group.max(1));
                        r.for_each(|e| seen[e] += 1);
                    }
                    assert!(seen.iter().all(|&n| n == 1), "{len} {group} {block}: {seen:?}");
                }
            }
        }
    }

    #[test]
    fn each_task_gets_its_block() {
        for par in [&Serial as &dyn Parallel, &ScopedThreads(3)] {
            // Groups of 5, blocks of 2: [0 0 1 1 2] [3 3 4 4 5] [6].
            let mut out = vec![0u32; 11];
            for_each_block(par, &mut out, Blocks::new(11, 5, 2), &|i, block| block.fill(i as u32));
            assert_eq!(out, [0, 0, 1, 1, 2, 3, 3, 4, 4, 5, 6]);
            let mut out = vec![0u32; 10];
            try_for_each_block(par, &mut out, Blocks::new(10, 10, 3), &|i, block| {
                block.fill(i as u32 + 1);
                Ok(())
            })
            .unwrap();
            assert_eq!(out, [1, 1, 1, 2, 2, 2, 3, 3, 3, 4]);
            let err = try_for_each_block(par, &mut [0u8; 3], Blocks::new(3, 3, 1), &|i, _| match i {
                1 => Err(crate::error::Error::runtime("task 1 failed")),
                _ => Ok(()),
            });
            assert!(err.unwrap_err().to_string().contains("task 1 failed"));
            let ran = AtomicU64::new(0);
            let err = try_for_each(par, 4, &|i| {
                ran.fetch_add(1, Ordering::Relaxed);
                match i {
                    2 => Err(crate::error::Error::runtime("task 2 failed")),
                    _ => Ok(()),
                }
            });
            assert!(err.unwrap_err().to_string().contains("task 2 failed"));
            assert_eq!(ran.load(Ordering::Relaxed), 4, "the other tasks still run");
            assert!(try_for_each(par, 3, &|_| Ok(())).is_ok());
        }
    }

    fn runs_each_task_once(par: &dyn Parallel, n: usize) {
        let seen: Vec<AtomicU64> = (0..n).map(|_| AtomicU64::new(0)).collect();
        par.for_each(n, &|i| {
            seen[i].fetch_add(1, Ordering::Relaxed);
        });
        assert!(seen.iter().all(|s| s.load(Ordering::Relaxed) == 1));
    }

    #[test]
    fn every_task_runs_exactly_once() {
        for n in [0, 1, 2, 3, 17, 100] {
            runs_each_task_once(&Serial, n);
            for t in [0, 1, 2, 4] {
                runs_each_task_once(&ScopedThreads(t), n);
            }
        }
        assert_eq!(Serial.threads(), 1);
        assert_eq!(ScopedThreads(0).threads(), 1);
        assert_eq!(ScopedThreads(3).threads(), 3);
    }

    #[test]
    fn scoped_threads_really_run_concurrently() {
        // Two tasks that each wait for the other can only finish if both run at once.
        let arrived = AtomicUsize::new(0);
        ScopedThreads(2).for_each(2, &|_| {
            arrived.fetch_add(1, Ordering::SeqCst);
            let start = std::time::Instant::now();
            while arrived.load(Ordering::SeqCst) < 2 {
                assert!(start.elapsed().as_secs() < 30, "tasks did not run concurrently");
                std::thread::yield_now();
            }
        });
    }
}
