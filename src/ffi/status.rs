//! The panic and error boundary: every entry point runs its body through
//! [`guard`] (or [`guard_or`]), which turns `Err` and panics into an
//! `OrtStatus` and poisons the object whose code panicked.

use std::any::Any;
use std::ffi::CString;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};

use super::api::{ort, Api};
use super::sys;
use crate::error::{Error, ErrorKind, Result};

/// NULL: what ORT reads as success.
pub const OK: *mut sys::OrtStatus = std::ptr::null_mut();

fn code_of(kind: ErrorKind) -> sys::OrtErrorCode {
    match kind {
        ErrorKind::Fail => sys::ORT_FAIL,
        ErrorKind::InvalidArgument => sys::ORT_INVALID_ARGUMENT,
        ErrorKind::NoSuchFile => sys::ORT_NO_SUCHFILE,
        ErrorKind::InvalidGraph => sys::ORT_INVALID_GRAPH,
        ErrorKind::NotImplemented => sys::ORT_NOT_IMPLEMENTED,
        ErrorKind::Runtime => sys::ORT_RUNTIME_EXCEPTION,
        ErrorKind::EpFail => sys::ORT_EP_FAIL,
        ErrorKind::NotFound => sys::ORT_NOT_FOUND,
    }
}

fn kind_of(code: sys::OrtErrorCode) -> ErrorKind {
    match code {
        sys::ORT_INVALID_ARGUMENT => ErrorKind::InvalidArgument,
        sys::ORT_NO_SUCHFILE => ErrorKind::NoSuchFile,
        sys::ORT_INVALID_GRAPH | sys::ORT_INVALID_PROTOBUF => ErrorKind::InvalidGraph,
        sys::ORT_NOT_IMPLEMENTED => ErrorKind::NotImplemented,
        sys::ORT_RUNTIME_EXCEPTION => ErrorKind::Runtime,
        sys::ORT_EP_FAIL => ErrorKind::EpFail,
        sys::ORT_NOT_FOUND => ErrorKind::NotFound,
        _ => ErrorKind::Fail,
    }
}

/// Makes an `OrtStatus` that ORT will own and free; NULL when ORT never
/// handed kiln its API (nothing can be reported then).
pub fn to_status(err: &Error) -> *mut sys::OrtStatus {
    let msg = CString::new(err.message.replace('\0', " ")).unwrap_or_default();
    let Some(api) = Api::try_get() else {
        return OK;
    };
    // SAFETY: CreateStatus copies the message; the pointer is valid for the call.
    unsafe { ort!(api.ort, CreateStatus(code_of(err.kind), msg.as_ptr())) }
}

/// Turns a status returned by ORT into a `Result`, releasing the status.
///
/// # Safety
/// `status` must be NULL or a status ORT returned to kiln (kiln owns it).
pub unsafe fn check(status: *mut sys::OrtStatus) -> Result<()> {
    if status.is_null() {
        return Ok(());
    }
    let api = Api::get();
    // SAFETY: non-NULL status owned by us; read it, then release it once.
    unsafe {
        let code = ort!(api.ort, GetErrorCode(status));
        let msg = ort!(api.ort, GetErrorMessage(status));
        let text = super::cstr_to_string(msg);
        ort!(api.ort, ReleaseStatus(status));
        Err(Error::new(kind_of(code), text))
    }
}

/// A poison flag: set when kiln code panicked inside the object that owns it.
#[derive(Debug, Default)]
pub struct Poison(AtomicBool);

impl Poison {
    pub fn is_set(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
    fn set(&self) {
        self.0.store(true, Ordering::Release);
    }
}

fn panic_text(payload: &(dyn Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic".to_string()
    }
}

/// Runs `body`; returns `Ok(value)` or the error to report. A panic poisons
/// `poison` and becomes an `ORT_EP_FAIL` error; a poisoned object refuses work.
pub fn run_guarded<T>(what: &str, poison: Option<&Poison>, body: impl FnOnce() -> Result<T>) -> Result<T> {
    if poison.is_some_and(Poison::is_set) {
        return Err(Error::new(
            ErrorKind::EpFail,
            format!(
                "kiln refuses {what}: an earlier call panicked and this kiln object is disabled; create a new session"
            ),
        ));
    }
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(result) => result,
        Err(payload) => {
            if let Some(p) = poison {
                p.set();
            }
            Err(Error::new(
                ErrorKind::EpFail,
                format!(
                    "kiln panicked in {what}: {}; this kiln object is now disabled",
                    panic_text(&*payload)
                ),
            ))
        }
    }
}

/// For entry points that return `OrtStatus*`.
pub fn guard(what: &str, poison: Option<&Poison>, body: impl FnOnce() -> Result<()>) -> *mut sys::OrtStatus {
    match run_guarded(what, poison, body) {
        Ok(()) => OK,
        Err(e) => status_or_abort(&e),
    }
}

/// For entry points that cannot return a status (names, void releases):
/// errors and panics become `fallback`.
pub fn guard_or<T>(what: &str, poison: Option<&Poison>, fallback: T, body: impl FnOnce() -> Result<T>) -> T {
    run_guarded(what, poison, body).unwrap_or(fallback)
}

/// Creating the status itself must not unwind into C.
fn status_or_abort(err: &Error) -> *mut sys::OrtStatus {
    match catch_unwind(|| to_status(err)) {
        Ok(status) => status,
        Err(_) => std::process::abort(),
    }
}
