//! Opening context binaries: read-only memory maps, so compiled weights are
//! used in place, or kiln-owned copies (`context_storage=copy`). Mapping is
//! `unsafe` (another process could change the file under us), hence it lives
//! in the FFI layer; kiln maps files it just validated and never writes
//! through the map.
//!
//! The contract for a mapped binary is the usual one for mmap'd stores: a
//! file a live session uses is replaced atomically (write a new file, rename
//! it over the old one), never truncated or rewritten in place. kiln's own
//! writer renames. A user who cannot promise that picks `copy`.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::error::{Error, ErrorKind, Result};
use crate::tensor::{AlignedBytes, Storage};

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

fn invalid(path: &Path, cause: impl std::fmt::Display) -> Error {
    Error::new(
        ErrorKind::InvalidGraph,
        format!("cannot open context binary '{}': {cause}", path.display()),
    )
}

fn kind_of(t: std::fs::FileType) -> &'static str {
    if t.is_dir() {
        "a directory"
    } else if t.is_fifo() {
        "a FIFO (named pipe)"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_char_device() {
        "a character device"
    } else if t.is_block_device() {
        "a block device"
    } else if t.is_symlink() {
        "a symbolic link"
    } else {
        "not a regular file"
    }
}

/// Opens `path` read-only without ever blocking, and accepts only a regular
/// file. `O_NONBLOCK` keeps the open of a FIFO from waiting for a writer;
/// the type is checked on the opened file (fstat), so a file swapped in
/// after a path check cannot slip through. `O_NOFOLLOW`: `path` is already
/// canonical, so a symlink here appeared after it was resolved.
fn open_regular(path: &Path) -> Result<(File, u64)> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOFOLLOW | libc::O_NOCTTY)
        .open(path)
        .map_err(|e| match e.raw_os_error() {
            Some(libc::ENXIO) => invalid(path, "it is a socket or a FIFO, not a regular file"),
            Some(libc::ELOOP) => invalid(path, "it became a symbolic link after it was resolved"),
            _ => invalid(path, e),
        })?;
    let meta = file.metadata().map_err(|e| invalid(path, e))?;
    if !meta.file_type().is_file() {
        return Err(invalid(
            path,
            format!(
                "it is {}; a context binary must be a regular file",
                kind_of(meta.file_type())
            ),
        ));
    }
    Ok((file, meta.len()))
}

/// Maps `path` read-only. An empty file cannot be mapped, so it becomes an
/// empty buffer (which the format reader then rejects as truncated).
pub fn map_file(path: &Path) -> Result<Arc<dyn Storage>> {
    let (file, len) = open_regular(path)?;
    if len == 0 {
        return Ok(Arc::new(AlignedBytes::zeroed(0)));
    }
    // SAFETY: a private read-only mapping of a regular file; kiln does not
    // write the file while it is mapped. A file truncated or rewritten in
    // place by someone else afterwards can still fault or change the
    // weights: the documented contract (README "Loading compiled models")
    // is to replace files by rename, or to load with context_storage=copy.
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

/// Reads `path` into kiln-owned, aligned memory (`context_storage=copy`):
/// nothing done to the file afterwards reaches the session.
pub fn copy_file(path: &Path) -> Result<Arc<dyn Storage>> {
    let (mut file, len) = open_regular(path)?;
    let len = usize::try_from(len).map_err(|_| invalid(path, "it is too large for this process"))?;
    let mut bytes = AlignedBytes::zeroed(len);
    file.read_exact(bytes.bytes_mut())
        .map_err(|e| invalid(path, format!("reading {len} bytes: {e}")))?;
    // A file that grew while it was read was being written: refuse it rather
    // than load half of a new version.
    let mut extra = [0u8; 1];
    if file.read(&mut extra).map_err(|e| invalid(path, e))? != 0 {
        return Err(invalid(path, "it changed while kiln was reading it"));
    }
    Ok(Arc::new(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_files_are_refused_without_blocking() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("pipe.bin");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid C string; mkfifo only creates a file.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        for f in [map_file, copy_file] {
            let e = f(&fifo).unwrap_err();
            assert!(e.message.contains("FIFO"), "{e}");
            let e = f(dir.path()).unwrap_err();
            assert!(e.message.contains("a directory"), "{e}");
        }
    }

    #[test]
    fn copy_is_independent_of_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m_kiln.bin");
        std::fs::write(&path, b"0123456789").unwrap();
        let copy = copy_file(&path).unwrap();
        std::fs::write(&path, b"xy").unwrap();
        assert_eq!(copy.bytes(), b"0123456789");
        assert_eq!(map_file(&path).unwrap().bytes(), b"xy");
        std::fs::write(&path, b"").unwrap();
        assert!(copy_file(&path).unwrap().bytes().is_empty());
    }
}
