//! Parallel-for without owning threads.
//!
//! kiln lives in a library ORT can unload, so it never starts threads of its
//! own: at run time the ORT side implements [`Parallel`] with ORT's intra-op
//! pool (`KernelContext_ParallelFor`). [`Serial`] runs everything on the
//! caller; [`ScopedThreads`] is a stand-in pool for tests and benchmarks.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

/// A parallel-for: something that can run independent tasks concurrently.
pub trait Parallel: Sync {
    /// How many threads may run tasks at once (>= 1).
    fn threads(&self) -> usize;
    /// Runs f(i) for every i in 0..n, possibly concurrently; returns when all are done.
    fn for_each(&self, n: usize, f: &(dyn Fn(usize) + Sync));
}

/// Runs `f(item)` for each of `items` over `par`, one task per item, each
/// with its own item (typically a disjoint `&mut` block of an output);
/// returns an error a task returned (the last one stored if several fail).
pub fn try_for_each_item<T: Send>(
    par: &dyn Parallel,
    items: Vec<T>,
    f: &(dyn Fn(&mut T) -> crate::error::Result<()> + Sync),
) -> crate::error::Result<()> {
    let items: Vec<Mutex<T>> = items.into_iter().map(Mutex::new).collect();
    let failed = Mutex::new(None);
    par.for_each(items.len(), &|i| {
        // Each task locks its own item once: never contended.
        let mut item = items[i].lock().unwrap_or_else(|e| e.into_inner());
        if let Err(e) = f(&mut item) {
            *failed.lock().unwrap_or_else(|e| e.into_inner()) = Some(e);
        }
    });
    match failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Runs every task on the caller, in order.
#[derive(Clone, Copy, Debug, Default)]
pub struct Serial;

impl Parallel for Serial {
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

impl Parallel for ScopedThreads {
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
    fn try_for_each_item_visits_every_item_and_returns_an_error() {
        for par in [&Serial as &dyn Parallel, &ScopedThreads(3)] {
            let mut out = vec![0u32; 10];
            let items: Vec<(usize, &mut [u32])> = out.chunks_mut(3).enumerate().collect();
            try_for_each_item(par, items, &|(i, chunk)| {
                chunk.fill(*i as u32 + 1);
                Ok(())
            })
            .unwrap();
            assert_eq!(out, [1, 1, 1, 2, 2, 2, 3, 3, 3, 4]);
            let err = try_for_each_item(par, vec![0, 1, 2], &|i| match *i {
                1 => Err(crate::error::Error::runtime("task 1 failed")),
                _ => Ok(()),
            });
            assert!(err.unwrap_err().to_string().contains("task 1 failed"));
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
