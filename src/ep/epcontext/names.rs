//! Names of context binaries a session of this process is about to write,
//! reserved until the binary is settled. Shared by the writer (which picks
//! names) and the weight-sharing workspace (which keeps a group's name).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use once_cell::sync::Lazy;
use parking_lot::Mutex;

/// A name for a binary, and the binaries of the same models it supersedes.
#[derive(Debug)]
pub struct Name {
    pub name: String,
    /// Binaries written for these models that other compiled models still
    /// named; removed once no model names them (see `remove_superseded`).
    pub superseded: Vec<String>,
    /// Keeps other sessions of this process off the name until the binary
    /// is in place or dropped.
    pub(super) reservation: Arc<Reservation>,
}

/// Names chosen by sessions of this process whose binaries are not settled
/// yet: two sessions compiling models with the same stem into one folder at
/// the same time must not pick the same name.
static RESERVED: Lazy<Mutex<HashMap<PathBuf, u64>>> = Lazy::new(Default::default);

#[derive(Debug)]
pub(super) struct Reservation {
    pub(super) key: PathBuf,
    pub(super) token: u64,
}

impl Reservation {
    /// `None` if another session of this process holds the name.
    pub(super) fn take(folder: &Path, name: &str) -> Option<Arc<Reservation>> {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let key = folder
            .canonicalize()
            .unwrap_or_else(|_| folder.to_path_buf())
            .join(name);
        let mut reserved = RESERVED.lock();
        if reserved.contains_key(&key) {
            return None;
        }
        let token = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        reserved.insert(key.clone(), token);
        Some(Arc::new(Reservation { key, token }))
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut reserved = RESERVED.lock();
        if reserved.get(&self.key) == Some(&self.token) {
            reserved.remove(&self.key);
        }
    }
}
