//! kiln's error type. It knows nothing of ORT: `ffi::status` maps [`ErrorKind`]
//! onto `OrtErrorCode` at the boundary.

use std::fmt;

/// What went wrong, in the terms ORT callers care about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// A generic failure (ORT_FAIL).
    Fail,
    /// A bad option, argument or configuration (ORT_INVALID_ARGUMENT).
    InvalidArgument,
    /// A file that should exist does not (ORT_NO_SUCHFILE).
    NoSuchFile,
    /// A graph or compiled context kiln cannot use (ORT_INVALID_GRAPH).
    InvalidGraph,
    /// Something kiln does not implement (ORT_NOT_IMPLEMENTED).
    NotImplemented,
    /// A failure while running a compiled graph (ORT_RUNTIME_EXCEPTION).
    Runtime,
    /// kiln itself is unusable, e.g. after a panic (ORT_EP_FAIL).
    EpFail,
    /// Something looked up is absent (ORT_NOT_FOUND).
    NotFound,
}

/// An error with a message a user can act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    pub kind: ErrorKind,
    pub message: String,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Error {
            kind,
            message: message.into(),
        }
    }
    pub fn fail(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Fail, message)
    }
    pub fn invalid_argument(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidArgument, message)
    }
    pub fn invalid_graph(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidGraph, message)
    }
    pub fn not_implemented(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotImplemented, message)
    }
    pub fn runtime(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Runtime, message)
    }

    /// Prefixes the message with where it happened, keeping the kind.
    pub fn context(mut self, what: impl fmt::Display) -> Self {
        self.message = format!("{what}: {}", self.message);
        self
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Error {}

/// `bail!(kind, "fmt", args)` returns an [`Error`] of that kind.
#[macro_export]
macro_rules! bail {
    ($kind:ident, $($arg:tt)*) => {
        return Err($crate::error::Error::new($crate::error::ErrorKind::$kind, format!($($arg)*)))
    };
}
