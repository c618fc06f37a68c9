//! Tensor values and their types as ORT hands them over: the element type
//! and shape of a type info or an `OrtValue`, and copies or views of a
//! tensor's bytes. Used both for graphs (`graph`) and at run time (`compute`).

use std::ffi::c_char;

use super::api::{ort, Api};
use super::status::check;
use super::{cstr_to_string, non_null_mut, sys};
use crate::error::{Error, Result};

/// Element type and dimensions of a tensor value (-1 = unknown dimension).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    pub elem_type: i32,
    pub dims: Vec<i64>,
    /// The ONNX `dim_param` of each dim ("" when it has none).
    pub dim_params: Vec<String>,
    /// False when ORT knows no shape at all (unknown rank): `dims` is then
    /// empty, exactly as for a scalar, and must not be taken for one.
    pub has_shape: bool,
}

/// A tensor's element type, dims and raw little-endian bytes, copied.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorBytes {
    pub elem_type: i32,
    pub dims: Vec<i64>,
    pub bytes: Vec<u8>,
}

/// Bytes per element of an ONNX element type kiln can pass through, or None.
pub fn element_size(elem_type: i32) -> Option<usize> {
    Some(match elem_type as u32 {
        sys::ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT
        | sys::ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32
        | sys::ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT32 => 4,
        sys::ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64
        | sys::ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT64
        | sys::ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE => 8,
        sys::ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL
        | sys::ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8
        | sys::ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8 => 1,
        sys::ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16
        | sys::ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16
        | sys::ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16
        | sys::ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16 => 2,
        _ => return None,
    })
}

pub fn byte_len(elem_type: i32, dims: &[i64]) -> Result<usize> {
    let size = element_size(elem_type)
        .ok_or_else(|| Error::invalid_argument(format!("element type {elem_type} is not one kiln handles")))?;
    dims.iter()
        .try_fold(size, |acc, &d| usize::try_from(d).ok().and_then(|d| acc.checked_mul(d)))
        .ok_or_else(|| Error::invalid_argument(format!("tensor shape {dims:?} is not a valid size")))
}

/// A tensor's dims at run time: inline up to rank 8, so that reading them
/// allocates nothing.
pub type RunDims = crate::tensor::InlineVec<i64, 8>;

/// Element type and dims of a tensor value of a Compute call, without the
/// symbolic dims [`read_tensor_info`] copies: nothing allocated for rank <= 8.
pub(super) fn run_type(value: *const sys::OrtValue) -> Result<(i32, RunDims)> {
    let api = Api::get();
    let mut shape = std::ptr::null_mut();
    let mut elem = sys::ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
    let mut rank = 0usize;
    // SAFETY: `value` is a live OrtValue of this Compute call; the shape info
    // is ours to release, after it was read; `dims` holds `rank` elements.
    unsafe {
        check(ort!(api.ort, GetTensorTypeAndShape(value, &mut shape)))?;
        let shape = non_null_mut(shape, "tensor type and shape")?;
        let mut read = || -> Result<RunDims> {
            check(ort!(api.ort, GetTensorElementType(shape, &mut elem)))?;
            check(ort!(api.ort, GetDimensionsCount(shape, &mut rank)))?;
            let mut dims: RunDims = (0..rank).map(|_| 0).collect();
            check(ort!(api.ort, GetDimensions(shape, dims.as_mut_ptr(), rank)))?;
            Ok(dims)
        };
        let dims = read();
        ort!(api.ort, ReleaseTensorTypeAndShapeInfo(shape));
        Ok((elem as i32, dims?))
    }
}

fn numel(dims: &[i64]) -> Option<usize> {
    dims.iter().try_fold(1usize, |acc, &d| {
        usize::try_from(d).ok().and_then(|d| acc.checked_mul(d))
    })
}

/// # Safety
/// `info` must be a live `OrtTensorTypeAndShapeInfo`.
pub unsafe fn read_tensor_info(info: *const sys::OrtTensorTypeAndShapeInfo) -> Result<TensorInfo> {
    let api = Api::get();
    let mut elem = sys::ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
    let mut rank = 0usize;
    // SAFETY: per contract; the dims buffer holds `rank` elements.
    unsafe {
        check(ort!(api.ort, GetTensorElementType(info, &mut elem)))?;
        check(ort!(api.ort, GetDimensionsCount(info, &mut rank)))?;
        let mut dims = vec![0i64; rank];
        check(ort!(api.ort, GetDimensions(info, dims.as_mut_ptr(), rank)))?;
        // ORT fills one borrowed C string per dim ("" for none); copied at once.
        let mut params: Vec<*const c_char> = vec![std::ptr::null(); rank];
        check(ort!(api.ort, GetSymbolicDimensions(info, params.as_mut_ptr(), rank)))?;
        let dim_params = params.iter().map(|&p| cstr_to_string(p)).collect();
        // Slot 390 (ORT 1.24+); an ORT without it gets the old reading.
        let has_shape = api.ort.TensorTypeAndShape_HasShape.is_none_or(|f| f(info));
        Ok(TensorInfo {
            elem_type: elem as i32,
            dims,
            dim_params,
            has_shape,
        })
    }
}

/// Copies a tensor value's type, dims and bytes.
///
/// # Safety
/// `value` must be a live tensor `OrtValue`.
pub unsafe fn copy_tensor(value: *const sys::OrtValue) -> Result<TensorBytes> {
    let api = Api::get();
    let value = super::non_null(value, "tensor value")?;
    let mut shape = std::ptr::null_mut();
    // SAFETY: per contract; the shape info is ours to release.
    let info = unsafe {
        check(ort!(api.ort, GetTensorTypeAndShape(value, &mut shape)))?;
        let info = read_tensor_info(shape);
        ort!(api.ort, ReleaseTensorTypeAndShapeInfo(shape));
        info?
    };
    let size = element_size(info.elem_type)
        .ok_or_else(|| Error::invalid_graph(format!("tensor element type {} is not one kiln reads", info.elem_type)))?;
    let len = numel(&info.dims)
        .and_then(|n| n.checked_mul(size))
        .ok_or_else(|| Error::invalid_graph(format!("tensor shape {:?} is not a valid size", info.dims)))?;
    // SAFETY: a tensor of `len` bytes.
    let bytes = unsafe { super::slice(tensor_data(value)? as *const u8, len, "tensor data")? }.to_vec();
    Ok(TensorBytes {
        elem_type: info.elem_type,
        dims: info.dims,
        bytes,
    })
}

/// # Safety
/// `value` must be a live tensor `OrtValue`.
pub unsafe fn tensor_data(value: *const sys::OrtValue) -> Result<*const std::ffi::c_void> {
    let api = Api::get();
    let mut data = std::ptr::null();
    // SAFETY: per contract.
    unsafe { check(ort!(api.ort, GetTensorData(value, &mut data)))? };
    Ok(data)
}
