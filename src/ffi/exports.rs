//! The symbols ORT (and applications) look up in `libkiln_ep.so`.

use std::ffi::c_char;

use super::api::Api;
use super::factory::{new_factory, release_factory};
use super::logger::Logger;
use super::status::{guard, run_guarded, Poison};
use super::{non_null_mut, sys};
use crate::context;
use crate::ep::options::{KilnOptions, OPTION_PREFIX};
use crate::ep::KilnFactory;
use crate::error::Error;
use crate::stats::{self, KilnStats};
use crate::target::Target;
use crate::tensor::{AlignedBytes, Storage};

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

/// What the last GetCapability that ran on the calling thread left to
/// other EPs, summed up by op type and reason as kiln's INFO log line does
/// (`"12 x Conv: left to ORT by the cost rule: ..."`, pairs joined by
/// `"; "`); empty when it left nothing or none ran on this thread. ORT runs
/// GetCapability on the thread that creates or compiles a session, so a
/// caller asks on that thread after it. Writes into `out` as `snprintf`
/// does and returns the summary's full length.
///
/// # Safety
/// `out` must be NULL or point to `out_size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn kiln_ep_last_left_out(out: *mut c_char, out_size: usize) -> usize {
    let summary = stats::left_out();
    // SAFETY: `out` is NULL or has `out_size` writable bytes (contract).
    unsafe { write_text(&summary, out, out_size) }
}

/// Copies `text` into `out` like `snprintf`: at most `out_size - 1` bytes and
/// a NUL (nothing when `out` is NULL or `out_size` is 0); returns the full
/// length of `text` in bytes, so a caller whose buffer was too small retries
/// with `return value + 1` bytes.
///
/// # Safety
/// `out` must be NULL or point to `out_size` writable bytes.
unsafe fn write_text(text: &str, out: *mut c_char, out_size: usize) -> usize {
    if !out.is_null() && out_size > 0 {
        let n = text.len().min(out_size - 1);
        // SAFETY: `out` has `out_size` writable bytes (contract) and n + 1 <= out_size;
        // `text` has at least n bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), out.cast::<u8>(), n);
            *out.add(n) = 0;
        }
    }
    text.len()
}

/// Describes a kiln context binary (`<model>_kiln.bin`, or the bytes of an
/// embedded EPContext node) as one JSON object, read by kiln's own context
/// reader: format version, kiln version, target, graphs, weights, whether the
/// checksum matches and the whole binary is valid, and what this machine's
/// kiln says of its compatibility (see `docs/context-format.md`, "Inspecting
/// a binary"). Reads the file at `path` (UTF-8) when `data` is NULL, else the
/// `data_len` bytes at `data`. Writes the JSON into `out` as `snprintf`
/// does and returns its full length (0 only if kiln panicked).
///
/// # Safety
/// `path` must be NULL or a NUL-terminated string; `data` NULL or
/// `data_len` readable bytes; `out` NULL or `out_size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn kiln_ep_inspect_context(
    path: *const c_char,
    data: *const u8,
    data_len: usize,
    out: *mut c_char,
    out_size: usize,
) -> usize {
    let json = run_guarded("kiln_ep_inspect_context", None, || {
        let storage: std::sync::Arc<dyn Storage> = if data.is_null() {
            if path.is_null() {
                return Err(Error::invalid_argument("both path and data are NULL"));
            }
            // SAFETY: a NUL-terminated string (contract).
            let path = unsafe { super::cstr_to_string(path) };
            super::mmap::copy_file(std::path::Path::new(&path))?
        } else {
            // SAFETY: `data_len` readable bytes (contract); copied before returning.
            let bytes = unsafe { std::slice::from_raw_parts(data, data_len) };
            std::sync::Arc::new(AlignedBytes::copy_from(bytes))
        };
        Ok(context::inspect(storage).to_json(Target::detect_host().ok()))
    })
    .unwrap_or_else(|e| {
        // The file could not be read at all (missing, a directory, ...), or kiln panicked.
        context::Inspection {
            error: Some(e.message),
            ..Default::default()
        }
        .to_json(None)
    });
    // SAFETY: `out` is NULL or has `out_size` writable bytes (contract).
    unsafe { write_text(&json, out, out_size) }
}

/// Checks kiln EP options before a session sees them, with the parser
/// `CreateEp` uses: `count` (key, value) pairs, keys as passed to
/// `SessionOptionsAppendExecutionProvider_V2` (`target`, `disabled_ops`, ...;
/// the session-entry form `ep.kilnexecutionprovider.<key>` is accepted too).
/// Returns 0 when all are valid, 1 when one is not (its message, the one
/// `CreateEp` would give, is written into `message` as `snprintf` does), and
/// -1 for NULL arrays with a non-zero count or a panic (message written too).
///
/// # Safety
/// `keys` and `values` must be NULL (only with `count` 0) or hold `count`
/// NUL-terminated strings; `message` NULL or `message_size` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn kiln_ep_check_options(
    keys: *const *const c_char,
    values: *const *const c_char,
    count: usize,
    message: *mut c_char,
    message_size: usize,
) -> i32 {
    let checked = run_guarded("kiln_ep_check_options", None, || {
        // SAFETY: `count` valid pointers, or NULL with count 0 (contract); NULL with a
        // non-zero count is refused by `slice` before any dereference.
        let keys = unsafe { super::slice(keys, count, "keys")? };
        // SAFETY: as for `keys`.
        let values = unsafe { super::slice(values, count, "values")? };
        let entries = keys.iter().zip(values).map(|(&k, &v)| {
            // SAFETY: NUL-terminated strings (contract).
            let (k, v) = unsafe { (super::cstr_to_string(k), super::cstr_to_string(v)) };
            let key = if k.starts_with(OPTION_PREFIX) {
                k
            } else {
                format!("{OPTION_PREFIX}{k}")
            };
            (key, v)
        });
        Ok(KilnOptions::parse(&entries.collect()).map(|_| ()))
    });
    let (code, text) = match checked {
        Ok(Ok(())) => (0, String::new()),
        Ok(Err(e)) => (1, e.message),
        Err(e) => (-1, e.message),
    };
    // SAFETY: `message` is NULL or has `message_size` writable bytes (contract).
    unsafe { write_text(&text, message, message_size) };
    code
}
