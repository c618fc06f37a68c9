//! Keeps `libkiln_ep.so` mapped for the rest of the process.
//!
//! ORT unloads a plugin library when it is unregistered (or its environment
//! goes), but sessions created earlier still hold kiln's EPs, compute infos
//! and kernels and call into them later: running or releasing such a
//! session after `dlclose` would jump into unmapped code. kiln therefore
//! takes one extra reference to itself with `RTLD_NODELETE` the first time
//! ORT loads it, so its code and statics stay put; objects are freed by
//! their own release calls (see `factory::Lifetime`).

use std::ffi::{c_void, CStr};
use std::sync::OnceLock;

use crate::error::{Error, Result};

static PINNED: OnceLock<std::result::Result<(), String>> = OnceLock::new();

/// Pins the library once per process; later calls return the first result.
pub fn pin_self() -> Result<()> {
    PINNED
        .get_or_init(|| pin().map_err(|e| e.message))
        .clone()
        .map_err(Error::fail)
}

fn pin() -> Result<()> {
    let path = own_path()?;
    // SAFETY: `path` names this very library, which is loaded already
    // (RTLD_NOLOAD only bumps its reference count and adds RTLD_NODELETE);
    // the handle is deliberately never closed.
    let handle = unsafe { libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD | libc::RTLD_NODELETE) };
    if handle.is_null() {
        return Err(Error::fail(format!(
            "kiln could not pin itself in memory ({}): {}",
            path.to_string_lossy(),
            dl_error()
        )));
    }
    Ok(())
}

/// The path this library was loaded from, as the dynamic loader knows it.
fn own_path() -> Result<&'static CStr> {
    // SAFETY: an all-zero Dl_info is valid; dladdr fills it for an address
    // inside a loaded object (this function's own code).
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let addr = own_path as *const c_void;
    // SAFETY: valid out-pointer; `addr` is code of this library.
    let found = unsafe { libc::dladdr(addr, &mut info) };
    if found == 0 || info.dli_fname.is_null() {
        return Err(Error::fail(format!(
            "kiln could not find its own library: {}",
            dl_error()
        )));
    }
    // SAFETY: dli_fname points into the loader's data for this object,
    // which lives as long as the object (for ever, once pinned).
    Ok(unsafe { CStr::from_ptr(info.dli_fname) })
}

fn dl_error() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string owned by libc.
    let msg = unsafe { libc::dlerror() };
    if msg.is_null() {
        "no detail".to_string()
    } else {
        // SAFETY: non-NULL C string from dlerror, copied at once.
        unsafe { CStr::from_ptr(msg) }.to_string_lossy().into_owned()
    }
}
