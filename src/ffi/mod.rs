//! The only part of kiln that touches ONNX Runtime: bindgen types, the
//! status/panic boundary, thin wrappers over ORT objects, and the `extern "C"`
//! trampolines behind the C structs kiln implements. Everything `unsafe`
//! lives here; `ep/` implements the safe traits these trampolines call.

#[cfg(feature = "alloc-count")]
pub mod alloc_count;
pub mod api;
pub mod compute;
pub mod ep;
pub mod exports;
pub mod factory;
pub mod graph;
pub mod kv;
pub mod logger;
pub mod mmap;
pub mod pin;
pub mod status;
pub mod sys;
pub mod tensor;

use std::ffi::{c_char, CStr};

use crate::error::{Error, Result};

/// Copies a C string ORT lent us; NULL becomes "".
///
/// # Safety
/// `p` must be NULL or a NUL-terminated string valid for the call.
pub unsafe fn cstr_to_string(p: *const c_char) -> String {
    if p.is_null() {
        return String::new();
    }
    // SAFETY: caller guarantees a valid NUL-terminated string.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

/// Checks a pointer argument ORT gave us before it is dereferenced.
pub fn non_null<T>(p: *const T, what: &str) -> Result<*const T> {
    if p.is_null() {
        Err(Error::invalid_argument(format!("{what} is NULL")))
    } else {
        Ok(p)
    }
}

/// Checks an out-pointer argument.
pub fn non_null_mut<T>(p: *mut T, what: &str) -> Result<*mut T> {
    if p.is_null() {
        Err(Error::invalid_argument(format!("{what} is NULL")))
    } else {
        Ok(p)
    }
}

/// Builds a `&[T]` from an ORT (pointer, count) pair; count 0 allows NULL.
///
/// # Safety
/// A non-NULL `p` must point to `n` valid elements that outlive `'a`.
pub unsafe fn slice<'a, T>(p: *const T, n: usize, what: &str) -> Result<&'a [T]> {
    if n == 0 {
        return Ok(&[]);
    }
    let p = non_null(p, what)?;
    // SAFETY: caller guarantees n valid elements.
    Ok(unsafe { std::slice::from_raw_parts(p, n) })
}
