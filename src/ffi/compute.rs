//! `OrtNodeComputeInfo` (one per compiled partition) and the kernel context
//! ORT passes to Compute.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

use super::api::{ort, Api};
use super::logger::Logger;
use super::status::{check, guard, guard_or, Poison};
use super::tensor::{byte_len, run_type, tensor_data, RunDims};
use super::{non_null, non_null_mut, sys};
use crate::error::{Error, Result};

/// A compiled partition ORT can run. ORT may call `compute` from several
/// threads at once on one object (concurrent `Run`s on a session).
pub trait ComputeImpl: Send + Sync {
    fn compute(&self, ctx: KernelContext<'_>) -> Result<()>;
}

/// A tensor input of any element type, as raw bytes borrowed for Compute.
#[derive(Default)]
pub struct RawInput<'a> {
    /// ONNX element type code.
    pub elem_type: i32,
    pub dims: RunDims,
    pub bytes: &'a [u8],
}

/// The `OrtKernelContext` of one Compute call.
pub struct KernelContext<'a> {
    ptr: *mut sys::OrtKernelContext,
    _life: std::marker::PhantomData<&'a mut ()>,
}

impl<'a> KernelContext<'a> {
    pub fn logger(&self) -> Logger {
        let mut logger = std::ptr::null();
        // SAFETY: live context; the logger lives as long as the session.
        let status = unsafe { ort!(Api::get().ort, KernelContext_GetLogger(self.ptr, &mut logger)) };
        // SAFETY: status from ORT; on failure fall back to no logging.
        match unsafe { check(status) } {
            Ok(()) => unsafe { Logger::from_raw(logger) },
            Err(_) => Logger::none(),
        }
    }

    fn count(&self, outputs: bool) -> Result<usize> {
        let api = Api::get();
        let mut n = 0usize;
        // SAFETY: live context, valid out-pointer.
        unsafe {
            check(if outputs {
                ort!(api.ort, KernelContext_GetOutputCount(self.ptr, &mut n))
            } else {
                ort!(api.ort, KernelContext_GetInputCount(self.ptr, &mut n))
            })?
        };
        Ok(n)
    }

    /// How many inputs ORT passes.
    pub fn input_count(&self) -> Result<usize> {
        self.count(false)
    }

    /// Input `index`, of any element type, as raw bytes.
    pub fn raw_input(&self, index: usize) -> Result<RawInput<'a>> {
        let api = Api::get();
        let mut value = std::ptr::null();
        // SAFETY: live context; the value is borrowed for this Compute call.
        unsafe { check(ort!(api.ort, KernelContext_GetInput(self.ptr, index, &mut value)))? };
        let value = non_null(value, "kernel input")?;
        let (elem_type, dims) = run_type(value)?;
        let len = byte_len(elem_type, &dims)?;
        // SAFETY: a tensor of `len` bytes owned by ORT for this call.
        let bytes = unsafe { super::slice(tensor_data(value)? as *const u8, len, "input data")? };
        Ok(RawInput { elem_type, dims, bytes })
    }

    /// Allocates every output as raw bytes: output `i` has the element type
    /// and shape `spec(i)`, for `i < count`, and goes to `put(i, bytes)`.
    /// Consumes the context so that no output can be borrowed twice.
    pub fn raw_outputs<'s>(
        self,
        count: usize,
        spec: impl Fn(usize) -> (i32, &'s [usize]),
        mut put: impl FnMut(usize, &'a mut [u8]) -> Result<()>,
    ) -> Result<()> {
        let n = self.count(true)?;
        if n != count {
            return Err(Error::invalid_argument(format!(
                "ORT asks for {n} outputs, the compiled partition has {count}"
            )));
        }
        for i in 0..n {
            let (elem_type, shape) = spec(i);
            put(i, self.raw_output(i, elem_type, shape)?)?;
        }
        Ok(())
    }

    fn raw_output(&self, index: usize, elem_type: i32, shape: &[usize]) -> Result<&'a mut [u8]> {
        let api = Api::get();
        let dims: RunDims = shape.iter().map(|&d| d as i64).collect();
        let len = byte_len(elem_type, &dims)?;
        let mut value = std::ptr::null_mut();
        let mut data = std::ptr::null_mut();
        // SAFETY: live context; ORT allocates the output and owns it.
        unsafe {
            check(ort!(
                api.ort,
                KernelContext_GetOutput(self.ptr, index, dims.as_ptr(), dims.len(), &mut value)
            ))?;
        }
        let value = non_null_mut(value, "kernel output")?;
        // ORT sizes the buffer by the graph's type for this output, which an
        // edited model can make differ from the program's: never write more
        // than ORT allocated.
        let (given_type, given_dims) = run_type(value)?;
        let given_len = byte_len(given_type, &given_dims)?;
        if given_type != elem_type || given_dims[..] != dims[..] || given_len != len {
            return Err(Error::runtime(format!(
                "output {index}: ORT allocated {} {:?} ({given_len} bytes), the compiled partition writes {} {:?} \
                 ({len} bytes); the model's type for this output disagrees with the compiled graph",
                crate::ir::onnx_type_name(given_type),
                given_dims,
                crate::ir::onnx_type_name(elem_type),
                dims
            )));
        }
        // SAFETY: live output value owned by ORT.
        unsafe { check(ort!(api.ort, GetTensorMutableData(value, &mut data)))? };
        if len == 0 {
            return Ok(&mut []);
        }
        // SAFETY: ORT allocated `given_len` == `len` bytes for this output
        // (checked above), distinct per index.
        Ok(unsafe { std::slice::from_raw_parts_mut(non_null_mut(data.cast::<u8>(), "output data")?, len) })
    }

    /// ORT's intra-op thread pool for this call, as kiln's `Parallel`;
    /// `pool` is what the partition has learnt of it so far.
    pub fn parallel<'p>(&self, pool: &'p PoolProbe) -> OrtParallel<'p>
    where
        'a: 'p,
    {
        let host = host_threads();
        let probe = host > 1 && pool.probe_now(micros_now);
        OrtParallel {
            ctx: self.ptr,
            threads: if probe { host } else { pool.threads(host) },
            pool,
            probe: AtomicBool::new(probe),
        }
    }
}

/// What a partition has learnt of its session's intra-op pool. ORT does not
/// tell an EP how many threads `intra_op_num_threads` gave it, and with 1 it
/// runs every `ParallelFor` task on the caller: kernels that cut their work
/// for two threads then ran it serially in small pieces (a 3×3 convolution
/// at 7×7, cut into one task per output row, streamed its 9 MiB of weights
/// once per row: 25% slower than one task). So the first `ParallelFor` calls
/// each start with a rendezvous ([`OrtParallel::rendezvous`]): two tasks, the
/// caller's waiting up to [`PROBE_WAIT`] for the other to start on another
/// thread. One that does proves a pool, for good; [`POOL_PROBES`] that do not say
/// there is none, and kernels then plan for one thread. A pool's thread can
/// miss them all (asleep, or its core held by another session's spinning
/// thread: 4 ms was seen), so a one-thread plan is checked again by one
/// rendezvous after [`REPROBE_MICROS`] and [`REPROBE_COMPUTES`] Computes,
/// the interval doubling with each check no pool thread joined, up to
/// [`REPROBE_BACKOFF`] doublings. Kernels give the same results however
/// they cut their work, so what is learnt changes speed only.
#[derive(Debug, Default)]
pub struct PoolProbe {
    /// Rendezvous no pool thread joined (at most [`MOST_MISSES`]), or
    /// [`POOL_FOUND`].
    misses: AtomicU32,
    /// Computes since the last rendezvous, once planning for one thread.
    computes: AtomicU32,
    /// When the last rendezvous was claimed, in µs of [`micros_now`].
    last: AtomicU64,
}

/// Rendezvous that no pool thread joined before kiln takes the pool to have
/// one thread. In a one-thread session each costs [`PROBE_WAIT`].
pub const POOL_PROBES: u32 = 3;

/// How long a rendezvous waits for a pool thread: long enough for one woken
/// from sleep; one whose core another thread holds can take milliseconds,
/// which the later checks of a one-thread plan catch.
pub const PROBE_WAIT: std::time::Duration = std::time::Duration::from_micros(300);

/// A one-thread plan is first checked again after this long and
/// [`REPROBE_COMPUTES`] Computes: a two-thread session wrongly planned for
/// one recovers within it.
pub const REPROBE_MICROS: u64 = 100_000;

/// Doublings of the interval between checks: after 100 ms, 200 ms, ...,
/// then every 12.8 s, so that checks cost a one-thread session nothing
/// measurable (at a fixed 100 ms, 0.15-0.3% of SqueezeNet's time).
pub const REPROBE_BACKOFF: u32 = 7;

/// `misses` stops counting here, long past [`POOL_PROBES`] and the backoff.
const MOST_MISSES: u32 = POOL_PROBES + REPROBE_BACKOFF + 1;

/// Computes between checks of a one-thread plan, so that a slow Run (a big
/// model, or a test under valgrind) does not check on every call.
pub const REPROBE_COMPUTES: u32 = 8;

/// The probe's state once a pool thread joined a rendezvous.
const POOL_FOUND: u32 = u32::MAX;

impl PoolProbe {
    /// The threads to plan for: the host's unless the pool is taken to have
    /// one thread.
    pub fn threads(&self, host: usize) -> usize {
        match self.misses.load(Ordering::Relaxed) {
            n if n != POOL_FOUND && n >= POOL_PROBES => 1,
            _ => host,
        }
    }

    /// Whether the pool's size is still being learnt.
    fn learning(&self) -> bool {
        self.misses.load(Ordering::Relaxed) < POOL_PROBES
    }

    /// Whether the Compute starting now runs rendezvous: while learning,
    /// yes; once planning for one thread, one claimed by the first Compute
    /// past both re-probe limits. `now` (µs) is read only then, so that the
    /// other Computes pay no clock read.
    fn probe_now(&self, now: impl FnOnce() -> u64) -> bool {
        match self.misses.load(Ordering::Relaxed) {
            POOL_FOUND => false,
            n if n < POOL_PROBES => true,
            n => {
                let computes = self.computes.fetch_add(1, Ordering::Relaxed).saturating_add(1);
                if computes < REPROBE_COMPUTES {
                    return false;
                }
                let (last, now) = (self.last.load(Ordering::Relaxed), now());
                let wait = REPROBE_MICROS << (n - POOL_PROBES).min(REPROBE_BACKOFF);
                // Concurrent Runs: one of them claims the rendezvous.
                now.saturating_sub(last) >= wait
                    && self
                        .last
                        .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                        .is_ok()
                    && {
                        self.computes.store(0, Ordering::Relaxed);
                        true
                    }
            }
        }
    }

    /// One rendezvous's finding at `now` (µs): whether a pool thread joined it.
    fn observe(&self, joined: bool, now: u64) {
        if joined {
            return self.misses.store(POOL_FOUND, Ordering::Relaxed);
        }
        let _ = self.misses.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
            (n < MOST_MISSES).then_some(n + 1)
        });
        self.last.fetch_max(now, Ordering::Relaxed);
    }
}

/// Microseconds since the first call in this process: a clock that fits an
/// atomic.
fn micros_now() -> u64 {
    static EPOCH: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
    let epoch = *EPOCH.get_or_init(std::time::Instant::now);
    u64::try_from(epoch.elapsed().as_micros()).unwrap_or(u64::MAX)
}

/// The CPUs this process may use, read once: `available_parallelism` reads
/// cgroup files on every call, which cost more than a small graph's Compute.
fn host_threads() -> usize {
    static THREADS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *THREADS.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// `KernelContext_ParallelFor`: runs tasks on the caller plus ORT's intra-op
/// pool, so kiln respects `intra_op_num_threads` and owns no threads.
pub struct OrtParallel<'a> {
    ctx: *mut sys::OrtKernelContext,
    /// The host's CPUs, or 1 once `pool` has found no pool threads.
    threads: usize,
    pool: &'a PoolProbe,
    /// Whether this Compute claimed a check of a one-thread plan (or is
    /// learning): its first `ParallelFor` starts with a rendezvous.
    probe: AtomicBool,
}

// SAFETY: ORT's ParallelFor may be called from the Compute thread only, and
// `for_each` is where it is; the tasks it runs only see `&dyn Fn + Sync`.
unsafe impl Sync for OrtParallel<'_> {}

struct Task<'f> {
    f: &'f (dyn Fn(usize) + Sync),
    panic: parking_lot::Mutex<Option<Box<dyn std::any::Any + Send>>>,
}

/// A rendezvous's two tasks: the caller's waits for the other to start on
/// another thread.
struct Rendezvous {
    caller: std::thread::ThreadId,
    joined: AtomicBool,
}

unsafe extern "C" fn run_rendezvous(user: *mut std::ffi::c_void, _index: usize) {
    // SAFETY: `user` is the Rendezvous that `rendezvous` passed, alive until
    // ParallelFor returns.
    let r = unsafe { &*(user as *const Rendezvous) };
    // Nothing here panics; the guard keeps it so if that changes.
    let _ = std::panic::catch_unwind(|| {
        if std::thread::current().id() != r.caller {
            return r.joined.store(true, Ordering::Release);
        }
        // Yielding, not spinning: where the pool's thread shares this core
        // (a busy machine, or valgrind running one thread at a time), it
        // gets to run and join.
        let start = std::time::Instant::now();
        while !r.joined.load(Ordering::Acquire) && start.elapsed() < PROBE_WAIT {
            std::thread::yield_now();
        }
    });
}

unsafe extern "C" fn run_task(user: *mut std::ffi::c_void, index: usize) {
    // SAFETY: `user` is the Task that for_each passed, alive until ParallelFor returns.
    let task = unsafe { &*(user as *const Task<'_>) };
    let run = || (task.f)(index);
    // Never unwind into ORT's thread pool: keep the panic, re-raise it after.
    if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)) {
        task.panic.lock().get_or_insert(p);
    }
}

impl OrtParallel<'_> {
    /// `KernelContext_ParallelFor`: `run(user, i)` for every `i < n`;
    /// false if ORT refused the call.
    ///
    /// # Safety
    /// `run` must be safe to call with `user` and any `i < n`, from any
    /// thread, until this returns.
    unsafe fn parallel_for(
        &self,
        run: unsafe extern "C" fn(*mut std::ffi::c_void, usize),
        n: usize,
        user: *const std::ffi::c_void,
    ) -> bool {
        // SAFETY: live context; ORT runs run(user, i) for every i < n and
        // returns only when all have finished (facts sheet 9.1); `run` and
        // `user` are the caller's.
        let status = unsafe {
            ort!(
                Api::get().ort,
                KernelContext_ParallelFor(self.ctx, Some(run), n, 0, user.cast_mut())
            )
        };
        // SAFETY: status from ORT.
        unsafe { check(status) }.is_ok()
    }

    /// Whether a pool thread joins a call of two tasks within [`PROBE_WAIT`];
    /// None if ORT refused the call. Counted apart from the kernels' calls.
    fn rendezvous(&self) -> Option<bool> {
        let r = Rendezvous {
            caller: std::thread::current().id(),
            joined: AtomicBool::new(false),
        };
        // SAFETY: run_rendezvous reads `r`, alive and shared until the call returns.
        if !unsafe { self.parallel_for(run_rendezvous, 2, (&r as *const Rendezvous).cast()) } {
            return None;
        }
        let joined = r.joined.load(Ordering::Acquire);
        crate::stats::pool_rendezvous(joined);
        Some(joined)
    }
}

// SAFETY: ORT's ParallelFor runs run_task(&task, i) once for every i < n and
// returns only when all have finished (facts sheet 9.1); the fallbacks run
// each index once on the caller.
unsafe impl crate::kernels::parallel::Parallel for OrtParallel<'_> {
    fn threads(&self) -> usize {
        self.threads
    }

    fn for_each(&self, n: usize, f: &(dyn Fn(usize) + Sync)) {
        if n <= 1 || self.threads <= 1 {
            return (0..n).for_each(f);
        }
        // While learning, every call starts with a rendezvous (so a Compute
        // of several steps learns in one Run); a check of a one-thread plan
        // is one rendezvous.
        // The flag is spent by the first call either way: a Compute that
        // learnt all it needed from its first calls makes no check after.
        let claimed = self.probe.swap(false, Ordering::Relaxed);
        if self.pool.learning() || claimed {
            // A refused call proves nothing: keep the host's count, which
            // only costs speed.
            let joined = self.rendezvous().unwrap_or(true);
            self.pool.observe(joined, micros_now());
        }
        let task = Task {
            f,
            panic: parking_lot::Mutex::new(None),
        };
        // SAFETY: run_task reads `task`, alive and shared until the call returns.
        if !unsafe { self.parallel_for(run_task, n, (&task as *const Task<'_>).cast()) } {
            // The pool refused: run the tasks here, so results stay right.
            return (0..n).for_each(f);
        }
        crate::stats::parallel_for_called();
        if let Some(p) = task.panic.into_inner() {
            std::panic::resume_unwind(p);
        }
    }
}

#[repr(C)]
struct ComputeObj {
    base: sys::OrtNodeComputeInfo,
    imp: Box<dyn ComputeImpl>,
    /// The owning EP's flag: a panic here disables the whole EP.
    poison: Arc<Poison>,
}

pub fn new_compute_info(imp: Box<dyn ComputeImpl>, poison: Arc<Poison>) -> *mut sys::OrtNodeComputeInfo {
    // SAFETY: all-zero is a valid OrtNodeComputeInfo (every slot None).
    let mut base: sys::OrtNodeComputeInfo = unsafe { std::mem::zeroed() };
    base.ort_version_supported = 23;
    base.CreateState = Some(create_state);
    base.Compute = Some(compute);
    base.ReleaseState = Some(release_state);
    Box::into_raw(Box::new(ComputeObj { base, imp, poison })).cast()
}

/// # Safety
/// `info` must be NULL or come from `new_compute_info`, not used afterwards.
pub unsafe fn release_compute_info(info: *mut sys::OrtNodeComputeInfo) -> Result<()> {
    if !info.is_null() {
        // SAFETY: per contract.
        drop(unsafe { Box::from_raw(info.cast::<ComputeObj>()) });
    }
    Ok(())
}

/// # Safety
/// `this` must come from `new_compute_info`.
unsafe fn obj<'a>(this: *const sys::OrtNodeComputeInfo) -> Result<&'a ComputeObj> {
    let p = non_null(this, "OrtNodeComputeInfo")?;
    // SAFETY: the base struct is the first field of the repr(C) ComputeObj.
    Ok(unsafe { &*p.cast::<ComputeObj>() })
}

unsafe extern "C" fn create_state(
    this: *mut sys::OrtNodeComputeInfo,
    _context: *mut sys::OrtNodeComputeContext,
    state: *mut *mut std::ffi::c_void,
) -> *mut sys::OrtStatus {
    // The compiled program is immutable and shared by concurrent Runs, so
    // the "state" is the compute info itself.
    guard("CreateState", None, || {
        let out = non_null_mut(state, "compute_state")?;
        // SAFETY: out-pointer from ORT.
        unsafe { *out = this.cast() };
        Ok(())
    })
}

unsafe extern "C" fn compute(
    this: *mut sys::OrtNodeComputeInfo,
    _state: *mut std::ffi::c_void,
    context: *mut sys::OrtKernelContext,
) -> *mut sys::OrtStatus {
    // SAFETY: `this` is our ComputeObj, `context` is live for this call.
    let Ok(info) = (unsafe { obj(this) }) else {
        return guard("Compute", None, || {
            Err(Error::invalid_argument("OrtNodeComputeInfo is NULL"))
        });
    };
    guard("Compute", Some(&info.poison), || {
        let ctx = KernelContext {
            ptr: non_null_mut(context, "kernel context")?,
            _life: std::marker::PhantomData,
        };
        info.imp.compute(ctx)
    })
}

unsafe extern "C" fn release_state(_this: *mut sys::OrtNodeComputeInfo, _state: *mut std::ffi::c_void) {
    guard_or("ReleaseState", None, (), || Ok(()));
}

#[cfg(test)]
mod tests {
    use super::{PoolProbe, POOL_PROBES, REPROBE_BACKOFF, REPROBE_COMPUTES, REPROBE_MICROS};

    /// A probe that has missed `POOL_PROBES` rendezvous at time 0.
    fn one_thread() -> PoolProbe {
        let pool = PoolProbe::default();
        for _ in 0..POOL_PROBES {
            assert_eq!(pool.threads(2), 2, "still learning: plan for the host");
            assert!(pool.probe_now(|| 0), "every Compute probes while learning");
            pool.observe(false, 0);
        }
        pool
    }

    #[test]
    fn missed_rendezvous_teach_one_thread() {
        let pool = one_thread();
        assert_eq!(pool.threads(2), 1);
        assert!(!pool.probe_now(|| 1));
    }

    #[test]
    fn checks_back_off_to_a_ceiling() {
        let pool = one_thread();
        let mut now = 0;
        for k in 0..REPROBE_BACKOFF + 4 {
            let wait = REPROBE_MICROS << k.min(REPROBE_BACKOFF);
            for _ in 0..REPROBE_COMPUTES {
                assert!(!pool.probe_now(|| now + wait - 1), "check {k} too early");
            }
            now += wait;
            assert!(pool.probe_now(|| now), "check {k} due after {wait} µs");
            pool.observe(false, now);
            assert_eq!(pool.threads(2), 1);
        }
    }

    #[test]
    fn a_joined_rendezvous_settles_it() {
        let pool = PoolProbe::default();
        pool.observe(false, 0);
        pool.observe(true, 0);
        for t in 0..4 * REPROBE_COMPUTES {
            assert!(!pool.probe_now(|| u64::from(t) * REPROBE_MICROS));
            pool.observe(false, 0);
        }
        assert_eq!(pool.threads(2), 2);
    }

    #[test]
    fn a_one_thread_plan_is_checked_after_time_and_computes() {
        let pool = one_thread();
        // Enough Computes, but too soon.
        for _ in 0..2 * REPROBE_COMPUTES {
            assert!(!pool.probe_now(|| REPROBE_MICROS - 1));
        }
        // Late enough: one Compute probes, the next does not.
        let late = REPROBE_MICROS;
        assert!(pool.probe_now(|| late));
        assert!(!pool.probe_now(|| late));
        pool.observe(false, late);
        // Late enough again (the interval doubled), but not enough Computes since.
        let later = 3 * REPROBE_MICROS;
        for _ in 1..REPROBE_COMPUTES - 1 {
            assert!(!pool.probe_now(|| later));
        }
        assert!(pool.probe_now(|| later));
        pool.observe(true, later);
        assert_eq!(pool.threads(2), 2, "the pool was there after all");
    }
}
