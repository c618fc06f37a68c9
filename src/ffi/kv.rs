//! `OrtKeyValuePairs`: an owned builder for what kiln hands ORT, and a reader
//! that copies what ORT lends kiln.

use std::ffi::CString;

use super::api::{ort, Api};
use super::sys;
use crate::error::{Error, Result};

/// An `OrtKeyValuePairs` kiln created; released on drop (ORT copies it).
pub struct KeyValues(*mut sys::OrtKeyValuePairs);

impl Default for KeyValues {
    fn default() -> Self {
        Self::new()
    }
}

impl KeyValues {
    pub fn new() -> KeyValues {
        let api = Api::get();
        let mut p = std::ptr::null_mut();
        // SAFETY: out-pointer is valid.
        unsafe { ort!(api.ort, CreateKeyValuePairs(&mut p)) };
        KeyValues(p)
    }

    pub fn from_pairs<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> Result<KeyValues> {
        let mut kv = KeyValues::new();
        for (k, v) in pairs {
            kv.add(k, v)?;
        }
        Ok(kv)
    }

    pub fn add(&mut self, key: &str, value: &str) -> Result<()> {
        let k = CString::new(key).map_err(|_| Error::invalid_argument("key holds a NUL byte"))?;
        let v = CString::new(value).map_err(|_| Error::invalid_argument("value holds a NUL byte"))?;
        let api = Api::get();
        // SAFETY: self.0 is live; ORT copies both strings.
        unsafe { ort!(api.ort, AddKeyValuePair(self.0, k.as_ptr(), v.as_ptr())) };
        Ok(())
    }

    pub fn as_ptr(&self) -> *const sys::OrtKeyValuePairs {
        self.0
    }
}

impl Drop for KeyValues {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: created by CreateKeyValuePairs, released once.
            unsafe { ort!(Api::get().ort, ReleaseKeyValuePairs(self.0)) };
        }
    }
}

/// Copies every entry of a borrowed `OrtKeyValuePairs` (NULL gives none).
///
/// # Safety
/// `p` must be NULL or a live `OrtKeyValuePairs`.
pub unsafe fn entries(p: *const sys::OrtKeyValuePairs) -> Vec<(String, String)> {
    if p.is_null() {
        return Vec::new();
    }
    let api = Api::get();
    let (mut keys, mut values, mut n) = (std::ptr::null(), std::ptr::null(), 0usize);
    // SAFETY: live pairs; the arrays are borrowed for the duration of this call.
    unsafe {
        ort!(api.ort, GetKeyValuePairs(p, &mut keys, &mut values, &mut n));
        (0..n)
            .map(|i| {
                (
                    super::cstr_to_string(*keys.add(i)),
                    super::cstr_to_string(*values.add(i)),
                )
            })
            .collect()
    }
}

/// Copies and releases a `OrtKeyValuePairs` that ORT handed over to kiln.
///
/// # Safety
/// `p` must be NULL or an owned `OrtKeyValuePairs` not used afterwards.
pub unsafe fn take_entries(p: *mut sys::OrtKeyValuePairs) -> Vec<(String, String)> {
    // SAFETY: per contract.
    let out = unsafe { entries(p) };
    if !p.is_null() {
        // SAFETY: owned, released once.
        unsafe { ort!(Api::get().ort, ReleaseKeyValuePairs(p)) };
    }
    out
}
