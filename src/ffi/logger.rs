//! Logging through ORT's logger, so users filter kiln's lines with ORT's
//! severity settings (`log_severity_level`) like any other ORT output.

use std::ffi::CString;

use super::api::{ort, Api};
use super::sys;

/// Severity, mapped onto `OrtLoggingLevel`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Verbose,
    Info,
    Warning,
    Error,
}

impl Level {
    fn ort(self) -> sys::OrtLoggingLevel {
        match self {
            Level::Verbose => sys::ORT_LOGGING_LEVEL_VERBOSE,
            Level::Info => sys::ORT_LOGGING_LEVEL_INFO,
            Level::Warning => sys::ORT_LOGGING_LEVEL_WARNING,
            Level::Error => sys::ORT_LOGGING_LEVEL_ERROR,
        }
    }
}

/// A borrowed `OrtLogger`. The default logger lives as long as the ORT
/// environment and a session logger as long as its session, which outlive
/// the factory and the EP that keep them.
#[derive(Clone, Copy, Debug)]
pub struct Logger(*const sys::OrtLogger);

// SAFETY: ORT's loggers are thread-safe; kiln only passes the pointer back.
unsafe impl Send for Logger {}
unsafe impl Sync for Logger {}

impl Logger {
    /// # Safety
    /// `ptr` must be NULL or an `OrtLogger` that outlives every use of this value.
    pub unsafe fn from_raw(ptr: *const sys::OrtLogger) -> Logger {
        Logger(ptr)
    }

    /// A logger that drops every message (for code running outside ORT).
    pub fn none() -> Logger {
        Logger(std::ptr::null())
    }

    /// Whether ORT would print a message at `level` (skip building it otherwise).
    pub fn enabled(&self, level: Level) -> bool {
        if self.0.is_null() {
            return false;
        }
        let api = Api::get();
        let mut min = sys::ORT_LOGGING_LEVEL_FATAL;
        // SAFETY: valid logger (from_raw contract) and out-pointer.
        let status = unsafe { ort!(api.ort, Logger_GetLoggingSeverityLevel(self.0, &mut min)) };
        // SAFETY: status came from ORT.
        unsafe { super::status::check(status) }.is_ok() && level.ort() >= min
    }

    pub fn log(&self, level: Level, message: &str) {
        if self.0.is_null() {
            return;
        }
        let api = Api::get();
        let msg = CString::new(format!("[kiln] {message}").replace('\0', " ")).unwrap_or_default();
        // SAFETY: valid logger; ORT copies the strings during the call.
        let status = unsafe {
            ort!(
                api.ort,
                Logger_LogMessage(self.0, level.ort(), msg.as_ptr(), c"kiln".as_ptr(), 0, c"kiln".as_ptr())
            )
        };
        // A failed log line is not worth failing the caller for.
        // SAFETY: status came from ORT.
        let _ = unsafe { super::status::check(status) };
    }

    pub fn verbose(&self, message: impl FnOnce() -> String) {
        if self.enabled(Level::Verbose) {
            self.log(Level::Verbose, &message());
        }
    }

    pub fn info(&self, message: impl FnOnce() -> String) {
        if self.enabled(Level::Info) {
            self.log(Level::Info, &message());
        }
    }

    pub fn warning(&self, message: &str) {
        self.log(Level::Warning, message);
    }

    pub fn error(&self, message: &str) {
        self.log(Level::Error, message);
    }
}
