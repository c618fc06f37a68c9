//! `OrtNodeComputeInfo` (one per compiled partition) and the kernel context
//! ORT passes to Compute.

use std::sync::Arc;

use super::api::{ort, Api};
use super::graph::{read_tensor_info, tensor_data};
use super::logger::Logger;
use super::status::{check, guard, guard_or, Poison};
use super::{non_null, non_null_mut, sys};
use crate::error::{Error, Result};

/// A compiled partition ORT can run. ORT may call `compute` from several
/// threads at once on one object (concurrent `Run`s on a session).
pub trait ComputeImpl: Send + Sync {
    fn compute(&self, ctx: KernelContext<'_>) -> Result<()>;
}

/// A float tensor input, borrowed for the duration of Compute.
pub struct InputTensor<'a> {
    pub data: &'a [f32],
    pub dims: Vec<i64>,
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

    /// Every input, which must all be float tensors.
    pub fn inputs_f32(&self) -> Result<Vec<InputTensor<'a>>> {
        (0..self.count(false)?).map(|i| self.input_f32(i)).collect()
    }

    fn input_f32(&self, index: usize) -> Result<InputTensor<'a>> {
        let api = Api::get();
        let mut value = std::ptr::null();
        // SAFETY: live context; the value is borrowed for this Compute call.
        unsafe { check(ort!(api.ort, KernelContext_GetInput(self.ptr, index, &mut value)))? };
        let value = non_null(value, "kernel input")?;
        let mut shape = std::ptr::null_mut();
        // SAFETY: live value; the shape info is ours to release.
        let info = unsafe {
            check(ort!(api.ort, GetTensorTypeAndShape(value, &mut shape)))?;
            let info = read_tensor_info(shape);
            ort!(api.ort, ReleaseTensorTypeAndShapeInfo(shape));
            info?
        };
        if info.elem_type != sys::ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT as i32 {
            return Err(Error::invalid_argument(format!(
                "input {index} has element type {}, kiln compiled it for float",
                info.elem_type
            )));
        }
        let numel: usize = info.dims.iter().map(|&d| d.max(0) as usize).product();
        // SAFETY: a float tensor of `numel` elements owned by ORT for this call.
        let data = unsafe { super::slice(tensor_data(value)? as *const f32, numel, "input data")? };
        Ok(InputTensor { data, dims: info.dims })
    }

    /// Allocates every output with the given shapes. Consumes the context
    /// so that no output can be borrowed twice.
    pub fn outputs_f32(self, shapes: &[Vec<usize>]) -> Result<Vec<&'a mut [f32]>> {
        let n = self.count(true)?;
        if n != shapes.len() {
            return Err(Error::invalid_argument(format!(
                "ORT asks for {n} outputs, the compiled partition has {}",
                shapes.len()
            )));
        }
        shapes.iter().enumerate().map(|(i, s)| self.output_f32(i, s)).collect()
    }

    fn output_f32(&self, index: usize, shape: &[usize]) -> Result<&'a mut [f32]> {
        let api = Api::get();
        let dims: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
        let mut value = std::ptr::null_mut();
        let mut data = std::ptr::null_mut();
        // SAFETY: live context; ORT allocates the output and owns it.
        unsafe {
            check(ort!(
                api.ort,
                KernelContext_GetOutput(self.ptr, index, dims.as_ptr(), dims.len(), &mut value)
            ))?;
            check(ort!(
                api.ort,
                GetTensorMutableData(non_null_mut(value, "kernel output")?, &mut data)
            ))?;
        }
        let numel = shape.iter().product();
        if numel == 0 {
            return Ok(&mut []);
        }
        // SAFETY: ORT allocated `numel` floats for this output, distinct per index.
        Ok(unsafe { std::slice::from_raw_parts_mut(non_null_mut(data.cast::<f32>(), "output data")?, numel) })
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
