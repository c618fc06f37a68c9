//! The symbols ORT (and applications) look up in `libkiln_ep.so`.

use std::ffi::c_char;

use super::api::Api;
use super::factory::{new_factory, release_factory};
use super::logger::Logger;
use super::status::{guard, Poison};
use super::{non_null_mut, sys};
use crate::ep::KilnFactory;
use crate::error::Error;
use crate::stats::{self, KilnStats};

/// Entry point ORT calls after loading the library: creates kiln's one factory.
///
/// # Safety
/// Called by ONNX Runtime with valid pointers: `factories` has room for
/// `max_factories` entries.
#[no_mangle]
pub unsafe extern "C" fn CreateEpFactories(
    registered_name: *const c_char,
    ort_api_base: *const sys::OrtApiBase,
    default_logger: *const sys::OrtLogger,
    factories: *mut *mut sys::OrtEpFactory,
    max_factories: usize,
    num_factories: *mut usize,
) -> *mut sys::OrtStatus {
    if !num_factories.is_null() {
        // SAFETY: ORT's out-pointer; report no factory until one exists.
        unsafe { *num_factories = 0 };
    }
    // SAFETY: ORT passes its OrtApiBase.
    if let Err(e) = unsafe { Api::init(ort_api_base) } {
        // SAFETY: as above.
        return unsafe { super::api::early_status(ort_api_base, &e) };
    }
    let poison = Poison::default();
    guard("CreateEpFactories", Some(&poison), || {
        let out = non_null_mut(factories, "factories")?;
        let count = non_null_mut(num_factories, "num_factories")?;
        if max_factories < 1 {
            return Err(Error::invalid_argument("ORT offered no room for kiln's factory"));
        }
        // SAFETY: strings and logger from ORT, valid for the library's lifetime.
        let name = unsafe { super::cstr_to_string(registered_name) };
        let logger = unsafe { Logger::from_raw(default_logger) };
        // Without the pin, sessions that outlive an unregister would crash;
        // everything else still works, so a failure is only a warning.
        if let Err(e) = super::pin::pin_self() {
            logger.warning(&format!("{e}; release every kiln session before unregistering kiln"));
        }
        let factory = KilnFactory::new(&name, logger)?;
        // SAFETY: room for at least one entry (checked above).
        unsafe {
            *out = new_factory(factory);
            *count = 1;
        }
        Ok(())
    })
}

/// Releases a factory made by `CreateEpFactories`. Any other pointer
/// (NULL, foreign, already released) gets an `ORT_INVALID_ARGUMENT` status
/// (or NULL when ORT never loaded kiln, so no status can be made).
///
/// # Safety
/// Safe for any argument; ORT must not use a released factory afterwards
/// except to release the EPs it still holds.
#[no_mangle]
pub unsafe extern "C" fn ReleaseEpFactory(factory: *mut sys::OrtEpFactory) -> *mut sys::OrtStatus {
    // SAFETY: release_factory only touches pointers it finds among its live factories.
    guard("ReleaseEpFactory", None, || {
        if unsafe { release_factory::<KilnFactory>(factory)? } {
            crate::ep::share::stop_sharing_loaded();
        }
        Ok(())
    })
}

/// Copies kiln's counters since the library was loaded into `*out`, at most
/// `out_size` bytes, and returns the size of the library's `KilnStats`.
/// Callers pass `sizeof(KilnStats)` as they know it: a caller built against
/// an older, smaller `KilnStats` gets the fields it knows, never an overrun.
/// `out` may be NULL to ask for the size only.
///
/// # Safety
/// `out` must be NULL or point to `out_size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn kiln_ep_stats(out: *mut KilnStats, out_size: usize) -> usize {
    let snapshot = stats::snapshot();
    let size = std::mem::size_of::<KilnStats>();
    if !out.is_null() {
        let n = out_size.min(size);
        // SAFETY: `out` has `out_size` writable bytes (contract) and the
        // snapshot has `size`; n is at most both.
        unsafe { std::ptr::copy_nonoverlapping((&snapshot as *const KilnStats).cast::<u8>(), out.cast::<u8>(), n) };
    }
    size
}
