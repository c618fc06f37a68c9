//! `OrtNodeComputeInfo` (one per compiled partition) and the kernel context
//! ORT passes to Compute.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
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
        OrtParallel {
            ctx: self.ptr,
            threads: pool.threads(host_threads()),
            pool,
        }
    }
}

/// What a partition has learnt of its session's intra-op pool. ORT does not
/// tell an EP how many threads `intra_op_num_threads` gave it, and with 1 it
/// runs every `ParallelFor` task on the caller: kernels that cut their work
/// for two threads then ran it serially in small pieces (a 3×3 convolution
/// at 7×7, cut into one task per output row, streamed its 9 MiB of weights
/// once per row: 25% slower than one task). So the first `ParallelFor` calls
/// note which threads run their tasks: a task on another thread proves a
/// pool; [`POOL_PROBES`] calls run on the caller alone say there is none, and
/// from then on kernels plan for one thread. Kernels give the same results
/// however they cut their work, so what is learnt changes speed only.
#[derive(Debug, Default)]
pub struct PoolProbe(AtomicU32);

/// Calls of `ParallelFor` whose tasks all ran on the caller before kiln
/// takes the pool to have one thread. A pool's thread, woken by each call,
/// misses the first few only when the tasks are tiny and the caller ends
/// them first.
pub const POOL_PROBES: u32 = 16;

/// The probe's state once a task ran on a pool thread.
const POOL_FOUND: u32 = u32::MAX;

impl PoolProbe {
    /// The threads to plan for: the host's until the pool is known to have
    /// one thread.
    pub fn threads(&self, host: usize) -> usize {
        match self.0.load(Ordering::Relaxed) {
            n if n != POOL_FOUND && n >= POOL_PROBES => 1,
            _ => host,
        }
    }

    /// Whether calls still need watching.
    fn learning(&self) -> bool {
        let n = self.0.load(Ordering::Relaxed);
        n != POOL_FOUND && n < POOL_PROBES
    }

    /// One call's finding: whether a task ran on a thread other than the caller.
    fn observe(&self, foreign: bool) {
        if foreign {
            self.0.store(POOL_FOUND, Ordering::Relaxed);
        } else {
            // Concurrent Runs: count only while still learning.
            let _ = self.0.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                (n != POOL_FOUND && n < POOL_PROBES).then_some(n + 1)
            });
        }
    }
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
}

// SAFETY: ORT's ParallelFor may be called from the Compute thread only, and
// `for_each` is where it is; the tasks it runs only see `&dyn Fn + Sync`.
unsafe impl Sync for OrtParallel<'_> {}

struct Task<'f> {
    f: &'f (dyn Fn(usize) + Sync),
    panic: parking_lot::Mutex<Option<Box<dyn std::any::Any + Send>>>,
    /// While the pool is being learnt: the calling thread, and whether a
    /// task ran on another.
    caller: Option<std::thread::ThreadId>,
    foreign: AtomicBool,
}

unsafe extern "C" fn run_task(user: *mut std::ffi::c_void, index: usize) {
    // SAFETY: `user` is the Task that for_each passed, alive until ParallelFor returns.
    let task = unsafe { &*(user as *const Task<'_>) };
    let run = || {
        if task.caller.is_some_and(|c| c != std::thread::current().id()) {
            task.foreign.store(true, Ordering::Relaxed);
        }
        (task.f)(index)
    };
    // Never unwind into ORT's thread pool: keep the panic, re-raise it after.
    if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(run)) {
        task.panic.lock().get_or_insert(p);
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
        let learning = self.pool.learning();
        let task = Task {
            f,
            panic: parking_lot::Mutex::new(None),
            caller: learning.then(|| std::thread::current().id()),
            foreign: AtomicBool::new(false),
        };
        // SAFETY: live context; ORT runs run_task(&task, i) for every i < n and
        // returns only when all have finished (facts sheet 9.1).
        let status = unsafe {
            ort!(
                Api::get().ort,
                KernelContext_ParallelFor(
                    self.ctx,
                    Some(run_task),
                    n,
                    0,
                    (&task as *const Task<'_>).cast_mut().cast()
                )
            )
        };
        // SAFETY: status from ORT.
        if unsafe { check(status) }.is_err() {
            // The pool refused: run the tasks here, so results stay right.
            return (0..n).for_each(f);
        }
        crate::stats::parallel_for_called();
        if learning {
            self.pool.observe(task.foreign.load(Ordering::Relaxed));
        }
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
    use super::{PoolProbe, POOL_PROBES};

    #[test]
    fn calls_on_the_caller_alone_teach_one_thread() {
        let pool = PoolProbe::default();
        for _ in 0..POOL_PROBES - 1 {
            pool.observe(false);
            assert_eq!(pool.threads(2), 2, "still learning: plan for the host");
            assert!(pool.learning());
        }
        pool.observe(false);
        assert_eq!(pool.threads(2), 1);
        assert!(!pool.learning());
    }

    #[test]
    fn a_task_on_a_pool_thread_settles_it() {
        let pool = PoolProbe::default();
        for _ in 0..POOL_PROBES - 1 {
            pool.observe(false);
        }
        pool.observe(true);
        assert!(!pool.learning());
        for _ in 0..2 * POOL_PROBES {
            pool.observe(false);
        }
        assert_eq!(pool.threads(2), 2);
    }
}
