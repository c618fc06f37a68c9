//! Read-only memory maps of context binaries, so compiled weights are used
//! in place. Mapping is `unsafe` (another process could change the file
//! under us), hence it lives in the FFI layer; kiln maps files it just
//! validated and never writes through the map.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{Error, ErrorKind, Result};
use crate::plan::{AlignedBytes, Storage};

/// A mapped file, shared by every program whose weights live in it.
pub struct MappedFile {
    map: memmap2::Mmap,
    path: PathBuf,
}

impl std::fmt::Debug for MappedFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MappedFile({}, {} bytes)", self.path.display(), self.map.len())
    }
}

impl Storage for MappedFile {
    fn bytes(&self) -> &[u8] {
        &self.map
    }
}

/// Maps `path` read-only. An empty file cannot be mapped, so it becomes an
/// empty buffer (which the format reader then rejects as truncated).
pub fn map_file(path: &Path) -> Result<Arc<dyn Storage>> {
    let file = File::open(path).map_err(|e| {
        Error::new(
            ErrorKind::InvalidGraph,
            format!("cannot open context binary '{}': {e}", path.display()),
        )
    })?;
    let len = file.metadata().map(|m| m.len()).unwrap_or(0);
    if len == 0 {
        return Ok(Arc::new(AlignedBytes::zeroed(0)));
    }
    // SAFETY: a private read-only mapping; kiln does not write the file while
    // it is mapped. A file truncated by someone else afterwards could still
    // fault, which is the documented limit of mapping (see docs/context-format.md).
    let map = unsafe { memmap2::Mmap::map(&file) }.map_err(|e| {
        Error::new(
            ErrorKind::InvalidGraph,
            format!("cannot map context binary '{}': {e}", path.display()),
        )
    })?;
    Ok(Arc::new(MappedFile {
        map,
        path: path.to_path_buf(),
    }))
}
