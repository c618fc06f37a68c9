//! The ORT function tables kiln calls, fetched once per process in
//! `CreateEpFactories` and shared by every factory, EP and kernel.

use once_cell::sync::OnceCell;

use super::sys;
use crate::error::{Error, Result};

/// The API version kiln asks for: the oldest that has everything kiln calls
/// (`CreateHardwareDevice` and `GetEnvConfigEntries` arrived in 24).
pub const MIN_API_VERSION: u32 = 24;

/// Borrowed ORT tables; they live as long as the loaded runtime.
#[derive(Clone, Copy)]
pub struct Api {
    pub ort: &'static sys::OrtApi,
    pub ep: &'static sys::OrtEpApi,
}

// SAFETY: the tables are immutable arrays of function pointers owned by ORT.
unsafe impl Send for Api {}
unsafe impl Sync for Api {}

static API: OnceCell<Api> = OnceCell::new();

/// Calls a function-pointer slot of an ORT table: `ort!(api.ort, Name(args...))`.
/// A NULL slot means a runtime older than kiln needs; it panics with the
/// slot's name, and the panic guard turns that into an `OrtStatus`.
macro_rules! ort {
    ($table:expr, $name:ident ( $($arg:expr),* $(,)? )) => {
        ($table.$name.expect(concat!("ONNX Runtime lacks ", stringify!($name))))($($arg),*)
    };
}
pub(crate) use ort;

impl Api {
    /// Fetches the tables from `base`, once per process.
    ///
    /// # Safety
    /// `base` must be the `OrtApiBase*` ORT passed to `CreateEpFactories`.
    pub unsafe fn init(base: *const sys::OrtApiBase) -> Result<Api> {
        API.get_or_try_init(|| unsafe { Self::load(base) }).copied()
    }

    unsafe fn load(base: *const sys::OrtApiBase) -> Result<Api> {
        let base = unsafe { base.as_ref() }.ok_or_else(|| Error::invalid_argument("OrtApiBase is NULL"))?;
        let get_api = base
            .GetApi
            .ok_or_else(|| Error::invalid_argument("OrtApiBase::GetApi is NULL"))?;
        let ort = unsafe { get_api(MIN_API_VERSION).as_ref() }.ok_or_else(|| {
            Error::not_implemented(format!(
                "kiln needs ONNX Runtime with C API version {MIN_API_VERSION} or newer (ORT 1.24+)"
            ))
        })?;
        let get_ep_api = ort
            .GetEpApi
            .ok_or_else(|| Error::not_implemented("OrtApi::GetEpApi is NULL"))?;
        let ep = unsafe { get_ep_api().as_ref() }.ok_or_else(|| Error::not_implemented("GetEpApi returned NULL"))?;
        Ok(Api { ort, ep })
    }

    /// The tables, once `init` has run (always true inside ORT callbacks).
    pub fn get() -> Api {
        *API.get().expect("kiln used before CreateEpFactories")
    }

    /// The tables, or None before `CreateEpFactories` ever ran (an export
    /// called by an application before ORT loaded kiln).
    pub fn try_get() -> Option<Api> {
        API.get().copied()
    }
}

/// Reports an error before [`Api::init`] succeeded, through the oldest API
/// table (version 1 has `CreateStatus`). NULL base: nothing can be reported,
/// so kiln returns a NULL status and no factory.
///
/// # Safety
/// `base` must be NULL or ORT's `OrtApiBase`.
pub unsafe fn early_status(base: *const sys::OrtApiBase, err: &Error) -> *mut sys::OrtStatus {
    let msg = std::ffi::CString::new(err.message.clone()).unwrap_or_default();
    // SAFETY: per contract; version 1 tables always start with CreateStatus.
    unsafe {
        let Some(get_api) = base.as_ref().and_then(|b| b.GetApi) else {
            return std::ptr::null_mut();
        };
        match get_api(1).as_ref().and_then(|api| api.CreateStatus) {
            Some(create) => create(sys::ORT_NOT_IMPLEMENTED, msg.as_ptr()),
            None => std::ptr::null_mut(),
        }
    }
}
