//! The context binary's file on disk: which name kiln may write, and when
//! the binary goes in place.
//!
//! - **Ownership.** A binary records the compiled models (`_ctx.onnx` file
//!   names) it was written for. kiln replaces an existing `<stem>_kiln.bin`
//!   only if it was written for the model being written and no other
//!   compiled model in the folder still names it; otherwise it writes
//!   `<stem>.2_kiln.bin`, `<stem>.3_kiln.bin`, ... (the name is recorded in
//!   `ep_cache_context`). Anything else under the name (a foreign file, a
//!   binary of an older kiln that records no model, a folder, a FIFO) is
//!   never touched.
//! - **Staging.** Compile writes the binary under a temporary name in the
//!   target folder. It is renamed into place only once ONNX Runtime has
//!   written the compiled model that names it (checked by reading that model:
//!   its kiln node names the file and carries the binary's checksum), and
//!   removed otherwise, so a failed write of the `_ctx.onnx` leaves no
//!   binary behind and destroys no older one.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use parking_lot::Mutex;

use super::super::models::names_binary;
use super::super::names::{Name, Reservation};
use super::super::schema::is_kiln_source;
use crate::context::{self, ContextBuilder, WriteStats};
use crate::error::{Error, Result};
use crate::ffi::logger::Logger;
use crate::ffi::mmap::map_file;

/// How many alternative names kiln tries before giving up.
const MAX_NAMES: usize = 100;

/// A file's identity, to tell whether ORT wrote it since kiln looked.
#[derive(Clone, Debug, PartialEq, Eq)]
struct FileId {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
}

fn file_id(path: &Path) -> Option<FileId> {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(path).ok()?;
    Some(FileId {
        dev: m.dev(),
        ino: m.ino(),
        size: m.size(),
        mtime: (m.mtime(), m.mtime_nsec()),
    })
}

/// Whether kiln may write a binary at a path.
#[derive(Debug, PartialEq, Eq)]
pub enum Ownership {
    /// Nothing there.
    Free,
    /// A binary written for one of the models being written, used by no other.
    Ours,
    /// A binary written for one of the models being written that other
    /// compiled models still name, and which ones.
    InUse(String),
    /// Something kiln must leave alone, and why.
    Other(String),
}

/// Whether the compiled model at `model` names `bin_name` (with `checksum`,
/// if given). Any file that cannot be read as a model does not.
pub fn model_names(model: &Path, bin_name: &str, checksum: Option<u128>) -> bool {
    let regular = std::fs::metadata(model).is_ok_and(|m| m.is_file());
    regular
        && map_file(model)
            .ok()
            .and_then(|bytes| names_binary(bytes.bytes(), is_kiln_source, bin_name, checksum).ok())
            .unwrap_or(false)
}

/// Who `folder/name` belongs to, for a binary written for `models`
/// (`_ctx.onnx` file names in `folder`).
pub fn ownership(folder: &Path, name: &str, models: &[String]) -> Ownership {
    let path = folder.join(name);
    let meta = match std::fs::symlink_metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ownership::Free,
        Err(e) => return Ownership::Other(format!("cannot be inspected ({e})")),
        Ok(m) => m,
    };
    if !meta.is_file() {
        return Ownership::Other("is not a regular file".into());
    }
    let peek = std::fs::File::open(&path)
        .map_err(|e| Error::fail(e.to_string()))
        .and_then(|mut f| context::peek(&mut f));
    let peek = match peek {
        Ok(p) => p,
        Err(e) => return Ownership::Other(format!("is not a kiln context binary kiln can read ({e})")),
    };
    if peek.context_models.is_empty() {
        return Ownership::Other(format!(
            "was written by kiln {}, which did not record the compiled model it belongs to",
            peek.kiln_version
        ));
    }
    if !peek.context_models.iter().any(|m| models.contains(m)) {
        return Ownership::Other(format!("belongs to {}", quoted(&peek.context_models)));
    }
    let users: Vec<String> = peek
        .context_models
        .iter()
        .filter(|m| !models.contains(m) && model_names(&folder.join(m), name, None))
        .cloned()
        .collect();
    if !users.is_empty() {
        return Ownership::InUse(quoted(&users));
    }
    Ownership::Ours
}

fn quoted(names: &[String]) -> String {
    names.iter().map(|n| format!("'{n}'")).collect::<Vec<_>>().join(", ")
}

/// The binary's file name for `models` in `folder`: `<stem>_kiln.bin`, or,
/// if that belongs to or is used by another compiled model, the first free
/// or own one of `<stem>.2_kiln.bin`, `<stem>.3_kiln.bin`, ...
pub fn choose_name(folder: &Path, stem: &str, models: &[String], logger: &Logger) -> Result<Name> {
    let candidate = |n: usize| match n {
        1 => format!("{stem}_kiln.bin"),
        n => format!("{stem}.{n}_kiln.bin"),
    };
    let mut skipped = Vec::new();
    let mut superseded = Vec::new();
    for n in 1..=MAX_NAMES {
        let name = candidate(n);
        let owner = ownership(folder, &name, models);
        let reservation = match owner {
            Ownership::Free | Ownership::Ours => Reservation::take(folder, &name),
            _ => None,
        };
        match owner {
            Ownership::Free | Ownership::Ours if reservation.is_none() => {
                skipped.push(format!("'{name}' is being written by another session of this process"));
            }
            Ownership::Free | Ownership::Ours => {
                if !skipped.is_empty() {
                    logger.warning(&format!(
                        "kiln leaves existing files alone: {}; writing the context binary as '{name}'",
                        skipped.join("; ")
                    ));
                }
                // Older binaries of these models may follow (a group moving
                // between two names); the run of existing names ends the search.
                for later in (n + 1..=MAX_NAMES).map(candidate) {
                    match ownership(folder, &later, models) {
                        Ownership::Free => break,
                        Ownership::InUse(_) => superseded.push(later),
                        _ => {}
                    }
                }
                return Ok(Name {
                    name,
                    superseded,
                    reservation: reservation.expect("taken above"),
                });
            }
            Ownership::InUse(users) => {
                skipped.push(format!("'{name}' is still used by {users}"));
                superseded.push(name);
            }
            Ownership::Other(why) => skipped.push(format!("'{name}' {why}")),
        }
    }
    Err(Error::fail(format!(
        "no free name for the context binary in '{}': {}",
        folder.display(),
        skipped.join("; ")
    )))
}

/// After `s` went in place: removes the binaries it supersedes that were
/// written only for models of `s` and that none of them names any more (a
/// sharing group recompiled in place moved to a new name). Anything else
/// stays.
fn remove_superseded(s: &Staged, logger: &Logger) {
    for name in s.supersedes.iter().filter(|n| **n != s.bin_name) {
        let path = s.folder.join(name);
        let owners = std::fs::File::open(&path)
            .ok()
            .and_then(|mut f| context::peek(&mut f).ok())
            .map(|p| p.context_models)
            .unwrap_or_default();
        let unused = !owners.is_empty()
            && owners.iter().all(|m| s.models.contains(m))
            && !owners.iter().any(|m| model_names(&s.folder.join(m), name, None));
        if unused && std::fs::remove_file(&path).is_ok() {
            logger.info(|| {
                format!(
                    "removed '{}': it was written for {} only, which now name '{}'",
                    path.display(),
                    quoted(&owners),
                    s.bin_name
                )
            });
        }
    }
}

/// A binary written under a temporary name, waiting for its compiled model.
#[derive(Debug)]
pub struct Staged {
    pub folder: PathBuf,
    pub bin_name: String,
    pub tmp: PathBuf,
    pub stats: WriteStats,
    /// The models the binary records (the ownership check at rename).
    pub models: Vec<String>,
    /// Older binaries of these models (see `Name::superseded`).
    pub supersedes: Vec<String>,
    /// Held until the binary is settled.
    _reservation: Arc<Reservation>,
    /// The compiled model ORT writes, which must name the binary.
    pub ctx_model: PathBuf,
    /// That model's file before ORT wrote it.
    ctx_before: Option<FileId>,
    /// The compile API may write the compiled model to memory instead (see `written_elsewhere`).
    compile_only: bool,
}

impl Staged {
    pub fn dest(&self) -> PathBuf {
        self.folder.join(&self.bin_name)
    }

    /// Whether ORT wrote the compiled model naming this very binary.
    fn confirmed(&self) -> bool {
        model_names(&self.ctx_model, &self.bin_name, Some(self.stats.checksum))
    }

    /// At `OnSessionInitializationEnd` of the compile API, a compiled model
    /// absent before and after went to memory (`ep.context_file_path` then
    /// only names the binary's folder).
    fn written_elsewhere(&self) -> bool {
        self.compile_only && self.ctx_before.is_none() && file_id(&self.ctx_model).is_none()
    }
}

/// Writes `builder` as `folder/.<bin_name>.tmp-<pid>-<n>`.
pub fn stage(
    folder: &Path,
    name: &Name,
    builder: &ContextBuilder,
    ctx_model: &Path,
    compile_only: bool,
) -> Result<Staged> {
    let tmp = temp_path(folder, &name.name);
    let stats = write_file(&tmp, &folder.join(&name.name), |out| builder.write_to(out))?;
    Ok(Staged {
        folder: folder.to_path_buf(),
        bin_name: name.name.clone(),
        tmp,
        stats,
        models: builder.context_models().to_vec(),
        supersedes: name.superseded.clone(),
        _reservation: name.reservation.clone(),
        ctx_model: ctx_model.to_path_buf(),
        ctx_before: file_id(ctx_model),
        compile_only,
    })
}

/// Puts a staged binary in place, unless its name now belongs to another
/// model (a concurrent compile took it); the temporary file is gone after.
pub fn commit(staged: &Staged) -> Result<()> {
    let result = commit_inner(staged);
    let _ = std::fs::remove_file(&staged.tmp);
    result
}

fn commit_inner(staged: &Staged) -> Result<()> {
    let dest = staged.dest();
    match ownership(&staged.folder, &staged.bin_name, &staged.models) {
        Ownership::Ours => rename(&staged.tmp, &dest),
        // A hard link never replaces a file that appeared meanwhile.
        Ownership::Free => match std::fs::hard_link(&staged.tmp, &dest) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Err(taken(&dest, "appeared meanwhile")),
            Err(_) => rename(&staged.tmp, &dest),
        },
        Ownership::InUse(users) => Err(taken(&dest, &format!("is still used by {users}"))),
        Ownership::Other(why) => Err(taken(&dest, &why)),
    }
}

fn rename(tmp: &Path, dest: &Path) -> Result<()> {
    std::fs::rename(tmp, dest).map_err(|e| io_error(dest, tmp, &e.to_string()))
}

fn taken(dest: &Path, why: &str) -> Error {
    Error::fail(format!(
        "kiln did not write the context binary '{}': the file {why} (another compile into the same folder?)",
        dest.display()
    ))
}

/// Binaries staged by one EP, settled when ORT is done with the compiled
/// models: at `OnSessionInitializationEnd` and when ORT releases the EP.
#[derive(Default)]
pub struct ContextFiles {
    staged: Mutex<Vec<Staged>>,
}

impl ContextFiles {
    /// Keeps `staged` until ORT has written the compiled model, or, when
    /// that model goes to memory (`ctx_file` false), puts it in place now.
    pub fn hold_or_commit(&self, staged: Staged, ctx_file: bool, logger: &Logger) -> Result<()> {
        if ctx_file {
            self.staged.lock().push(staged);
            Ok(())
        } else {
            settle_written(&staged, logger)
        }
    }

    /// Session initialization ended, which ORT 1.31 reports only after it
    /// wrote the compiled model (on both routes): put every binary that
    /// model names in place, and those of a model written to memory. Others
    /// stay staged until the EP is released.
    pub fn finish_written(&self, logger: &Logger) -> Result<()> {
        let mut staged = self.staged.lock();
        let ready: Vec<Staged>;
        (ready, *staged) = std::mem::take(&mut *staged)
            .into_iter()
            .partition(|s| s.confirmed() || s.written_elsewhere());
        let mut first_error = None;
        for s in ready {
            if let Err(e) = settle_written(&s, logger) {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// ORT released the EP: binaries whose compiled model ORT wrote go in
    /// place; the others are removed, with the incomplete model ORT left
    /// when writing it failed. (A compiled model written to memory was
    /// settled by `finish_written`: ORT calls it only after a successful
    /// write, so what is still staged here has no model.)
    pub fn finish_all(&self, logger: &Logger) {
        for s in std::mem::take(&mut *self.staged.lock()) {
            if s.confirmed() {
                if let Err(e) = settle_written(&s, logger) {
                    logger.error(&e.message);
                }
            } else {
                discard(&s, logger);
            }
        }
    }
}

/// Puts `s` in place, then removes what it supersedes.
pub fn settle_written(s: &Staged, logger: &Logger) -> Result<()> {
    commit(s)?;
    remove_superseded(s, logger);
    logger.info(|| {
        format!(
            "wrote context binary '{}' ({} bytes, {} graph(s), {} of {} weight bytes stored after sharing) for '{}'",
            s.dest().display(),
            s.stats.file_bytes,
            s.stats.graphs,
            s.stats.weight_bytes_stored,
            s.stats.weight_bytes_referenced,
            s.ctx_model.display()
        )
    });
    crate::stats::context_written(
        s.stats.file_bytes,
        s.stats.weight_bytes_referenced - s.stats.weight_bytes_stored,
    );
    Ok(())
}

/// ORT did not write the compiled model: drop the binary, and the model
/// file if ORT changed it without completing it (a full disk).
fn discard(s: &Staged, logger: &Logger) {
    let _ = std::fs::remove_file(&s.tmp);
    let now = file_id(&s.ctx_model);
    let debris = now.is_some() && now != s.ctx_before && std::fs::metadata(&s.ctx_model).is_ok_and(|m| m.is_file());
    if debris && std::fs::remove_file(&s.ctx_model).is_ok() {
        logger.warning(&format!(
            "ONNX Runtime did not complete the compiled model '{}'; kiln removed it and its context binary",
            s.ctx_model.display()
        ));
    } else {
        let kept = if s.dest().exists() {
            format!("; the existing '{}' is untouched", s.dest().display())
        } else {
            String::new()
        };
        logger.warning(&format!(
            "ONNX Runtime did not write the compiled model '{}'; kiln removed the context binary it had staged \
             for it{kept}",
            s.ctx_model.display()
        ));
    }
}

/// A name in `folder` no other writer uses: per process and call.
fn temp_path(folder: &Path, name: &str) -> PathBuf {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    folder.join(format!(
        ".{name}.tmp-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ))
}

/// Writes and syncs `tmp` (a new file) for `dest`, which errors name;
/// removes it on any error.
fn write_file<T>(tmp: &Path, dest: &Path, write: impl FnOnce(&mut dyn std::io::Write) -> Result<T>) -> Result<T> {
    let io = |e: std::io::Error| io_error(dest, tmp, &e.to_string());
    let result = (|| {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(tmp)
            .map_err(io)?;
        let mut out = std::io::BufWriter::new(file);
        let value = write(&mut out).map_err(|e| {
            let file = tmp.file_name().unwrap_or_default().to_string_lossy();
            Error::new(
                e.kind,
                format!("{} ('{}', through '{file}')", e.message, dest.display()),
            )
        })?;
        let file = out.into_inner().map_err(|e| io(e.into_error()))?;
        file.sync_all().map_err(io)?;
        Ok(value)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(tmp);
    }
    result
}

/// Writes `path` through a temporary file in the same folder and a rename,
/// so it is either complete or absent, never half-written (tests' files).
#[cfg(test)]
pub fn write_atomically<T>(path: &Path, write: impl FnOnce(&mut dyn std::io::Write) -> Result<T>) -> Result<T> {
    let folder = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let name = path.file_name().map(|n| n.to_string_lossy()).unwrap_or_default();
    let tmp = temp_path(folder, &name);
    let value = write_file(&tmp, path, write)?;
    std::fs::rename(&tmp, path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        io_error(path, &tmp, &e.to_string())
    })?;
    Ok(value)
}

fn io_error(dest: &Path, tmp: &Path, cause: &str) -> Error {
    Error::fail(format!(
        "cannot write context binary '{}' (through '{}'): {cause}",
        dest.display(),
        tmp.file_name().unwrap_or_default().to_string_lossy()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::Target;

    fn binary_for(models: &[&str]) -> ContextBuilder {
        let mut b = ContextBuilder::new(Target::Generic);
        for m in models {
            b.add_context_model(m);
        }
        b
    }

    /// A name as `choose_name` gives it, without taking part in reservations.
    fn name(folder: &Path, name: &str) -> Name {
        Name {
            name: name.into(),
            superseded: Vec::new(),
            reservation: Arc::new(Reservation {
                key: folder.join(name),
                token: 0,
            }),
        }
    }

    fn write(folder: &Path, name: &str, b: &ContextBuilder) {
        write_atomically(&folder.join(name), |out| b.write_to(out)).unwrap();
    }

    /// An ONNX model with one kiln EPContext node naming `bin` (embed mode 0).
    fn model_naming(bin: &str) -> Vec<u8> {
        crate::ep::epcontext::models::model_naming(crate::ep::epcontext::schema::KILN_SOURCE, bin)
    }

    fn names(folder: &Path) -> Vec<String> {
        let mut v: Vec<String> = std::fs::read_dir(folder)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        v.sort();
        v
    }

    #[test]
    fn ownership_of_what_lies_under_the_name() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let me = ["m_ctx.onnx".to_string()];
        assert_eq!(ownership(d, "m_kiln.bin", &me), Ownership::Free);
        write(d, "m_kiln.bin", &binary_for(&["m_ctx.onnx"]));
        assert_eq!(ownership(d, "m_kiln.bin", &me), Ownership::Ours);
        write(d, "o_kiln.bin", &binary_for(&["o_ctx.onnx"]));
        let other = ownership(d, "o_kiln.bin", &me);
        assert!(
            matches!(&other, Ownership::Other(w) if w.contains("belongs to 'o_ctx.onnx'")),
            "{other:?}"
        );
        write(d, "old_kiln.bin", &binary_for(&[]));
        let old = ownership(d, "old_kiln.bin", &me);
        assert!(
            matches!(&old, Ownership::Other(w) if w.contains("did not record")),
            "{old:?}"
        );
        std::fs::write(d.join("user_kiln.bin"), b"user data").unwrap();
        let user = ownership(d, "user_kiln.bin", &me);
        assert!(
            matches!(&user, Ownership::Other(w) if w.contains("not a kiln context binary")),
            "{user:?}"
        );
        std::fs::create_dir(d.join("dir_kiln.bin")).unwrap();
        let folder = ownership(d, "dir_kiln.bin", &me);
        assert!(
            matches!(&folder, Ownership::Other(w) if w.contains("not a regular file")),
            "{folder:?}"
        );
        std::os::unix::fs::symlink(d.join("m_kiln.bin"), d.join("link_kiln.bin")).unwrap();
        assert!(matches!(ownership(d, "link_kiln.bin", &me), Ownership::Other(_)));
    }

    #[test]
    fn a_binary_another_listed_model_still_uses_is_in_use() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        write(d, "m_kiln.bin", &binary_for(&["m_ctx.onnx", "n_ctx.onnx"]));
        let me = ["m_ctx.onnx".to_string()];
        // n_ctx.onnx is absent, or is not a model naming the file: ours
        assert_eq!(ownership(d, "m_kiln.bin", &me), Ownership::Ours);
        std::fs::write(d.join("n_ctx.onnx"), b"not a model").unwrap();
        assert_eq!(ownership(d, "m_kiln.bin", &me), Ownership::Ours);
        std::fs::write(d.join("n_ctx.onnx"), model_naming("m_kiln.bin")).unwrap();
        assert_eq!(ownership(d, "m_kiln.bin", &me), Ownership::InUse("'n_ctx.onnx'".into()));
        // the group as a whole owns it
        let group = ["m_ctx.onnx".to_string(), "n_ctx.onnx".to_string()];
        assert_eq!(ownership(d, "m_kiln.bin", &group), Ownership::Ours);
    }

    #[test]
    fn choose_name_skips_what_belongs_to_others_and_reuses_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let log = Logger::none();
        let me = ["m_ctx.onnx".to_string()];
        let name = |n: &str| choose_name(d, "m", &me, &log).unwrap().name == n;
        assert!(name("m_kiln.bin"));
        std::fs::write(d.join("m_kiln.bin"), b"user data").unwrap();
        assert!(name("m.2_kiln.bin"));
        write(d, "m.2_kiln.bin", &binary_for(&["other_ctx.onnx"]));
        assert!(name("m.3_kiln.bin"));
        write(d, "m.3_kiln.bin", &binary_for(&["m_ctx.onnx", "n_ctx.onnx"]));
        assert!(name("m.3_kiln.bin"), "its own binary, in place");
        std::fs::write(d.join("n_ctx.onnx"), model_naming("m.3_kiln.bin")).unwrap();
        let chosen = choose_name(d, "m", &me, &log).unwrap();
        assert_eq!(chosen.name, "m.4_kiln.bin", "m.3 is still used by n_ctx.onnx");
        assert_eq!(chosen.superseded, ["m.3_kiln.bin"]);
        // a free first name still collects the older binaries that follow it
        std::fs::remove_file(d.join("m_kiln.bin")).unwrap();
        let chosen = choose_name(d, "m", &me, &log).unwrap();
        assert_eq!(chosen.name, "m_kiln.bin");
        assert_eq!(chosen.superseded, ["m.3_kiln.bin"]);
    }

    #[test]
    fn staged_binaries_are_committed_or_removed() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let log = Logger::none();
        let b = binary_for(&["m_ctx.onnx"]);
        let ctx = d.join("m_ctx.onnx");
        // ORT never writes the model: nothing stays
        let files = ContextFiles::default();
        let staged = stage(d, &name(d, "m_kiln.bin"), &b, &ctx, false).unwrap();
        assert!(staged.tmp.exists());
        files.hold_or_commit(staged, true, &log).unwrap();
        files.finish_written(&log).unwrap();
        assert_eq!(names(d).len(), 1, "still staged: {:?}", names(d));
        files.finish_all(&log);
        assert!(names(d).is_empty(), "{:?}", names(d));
        // a model file ORT left incomplete is removed with the binary
        let staged = stage(d, &name(d, "m_kiln.bin"), &b, &ctx, false).unwrap();
        files.hold_or_commit(staged, true, &log).unwrap();
        std::fs::write(&ctx, b"\x08\x07\x3a\xff\xff").unwrap();
        files.finish_all(&log);
        assert!(names(d).is_empty(), "{:?}", names(d));
        // an existing model ORT did not touch stays, and so does the old binary
        std::fs::write(&ctx, b"old model").unwrap();
        write(d, "m_kiln.bin", &b);
        let old = std::fs::read(d.join("m_kiln.bin")).unwrap();
        let mut newer = binary_for(&["m_ctx.onnx"]);
        newer.add_context_model("x_ctx.onnx");
        let staged = stage(d, &name(d, "m_kiln.bin"), &newer, &ctx, false).unwrap();
        files.hold_or_commit(staged, true, &log).unwrap();
        files.finish_all(&log);
        assert_eq!(names(d), ["m_ctx.onnx", "m_kiln.bin"]);
        assert_eq!(std::fs::read(d.join("m_kiln.bin")).unwrap(), old);
        assert_eq!(std::fs::read(&ctx).unwrap(), b"old model");
        // a memory output is committed at once
        std::fs::remove_file(&ctx).unwrap();
        let staged = stage(d, &name(d, "m_kiln.bin"), &newer, &ctx, true).unwrap();
        files.hold_or_commit(staged, false, &log).unwrap();
        assert_eq!(names(d), ["m_kiln.bin"]);
        assert_ne!(std::fs::read(d.join("m_kiln.bin")).unwrap(), old);
    }

    #[test]
    fn superseded_binaries_go_only_when_no_model_names_them() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let log = Logger::none();
        let group = ["a_ctx.onnx".to_string(), "b_ctx.onnx".to_string()];
        write(d, "a_kiln.bin", &binary_for(&["a_ctx.onnx", "b_ctx.onnx"]));
        write(d, "x_kiln.bin", &binary_for(&["a_ctx.onnx", "x_ctx.onnx"]));
        std::fs::write(d.join("b_ctx.onnx"), model_naming("a_kiln.bin")).unwrap();
        let mut staged = stage(
            d,
            &name(d, "a.2_kiln.bin"),
            &binary_for(&["a_ctx.onnx", "b_ctx.onnx"]),
            d,
            true,
        )
        .unwrap();
        staged.supersedes = vec!["a_kiln.bin".into(), "x_kiln.bin".into()];
        // b_ctx.onnx still names a_kiln.bin: it stays
        settle_written(&staged, &log).unwrap();
        assert_eq!(names(d), ["a.2_kiln.bin", "a_kiln.bin", "b_ctx.onnx", "x_kiln.bin"]);
        // once b_ctx.onnx names the new binary, a_kiln.bin goes; x_kiln.bin (x_ctx's too) stays
        std::fs::write(d.join("b_ctx.onnx"), model_naming("a.2_kiln.bin")).unwrap();
        let mut staged = stage(
            d,
            &name(d, "a.2_kiln.bin"),
            &binary_for(&group.iter().map(String::as_str).collect::<Vec<_>>()),
            d,
            true,
        )
        .unwrap();
        staged.supersedes = vec!["a_kiln.bin".into(), "x_kiln.bin".into()];
        settle_written(&staged, &log).unwrap();
        assert_eq!(names(d), ["a.2_kiln.bin", "b_ctx.onnx", "x_kiln.bin"]);
    }

    #[test]
    fn a_name_another_session_is_writing_is_skipped_until_it_settles() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let log = Logger::none();
        let first = choose_name(d, "m", &["a_ctx.onnx".into()], &log).unwrap();
        let second = choose_name(d, "m", &["b_ctx.onnx".into()], &log).unwrap();
        assert_eq!(
            (first.name.as_str(), second.name.as_str()),
            ("m_kiln.bin", "m.2_kiln.bin")
        );
        let staged = stage(d, &first, &binary_for(&["a_ctx.onnx"]), &d.join("a_ctx.onnx"), false).unwrap();
        drop(first);
        let third = choose_name(d, "m", &["c_ctx.onnx".into()], &log).unwrap();
        assert_eq!(third.name, "m.3_kiln.bin", "the staged binary still holds its name");
        drop(staged);
        drop(third);
        let again = choose_name(d, "m", &["c_ctx.onnx".into()], &log).unwrap();
        assert_eq!(again.name, "m_kiln.bin", "released once settled");
    }

    #[test]
    fn commit_never_replaces_a_file_that_appeared_meanwhile() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        let staged = stage(
            d,
            &name(d, "m_kiln.bin"),
            &binary_for(&["m_ctx.onnx"]),
            &d.join("m_ctx.onnx"),
            false,
        )
        .unwrap();
        std::fs::write(d.join("m_kiln.bin"), b"user data").unwrap();
        let e = commit(&staged).unwrap_err();
        assert!(
            e.message.contains("did not write") && e.message.contains("m_kiln.bin"),
            "{e}"
        );
        assert_eq!(std::fs::read(d.join("m_kiln.bin")).unwrap(), b"user data");
        assert_eq!(names(d), ["m_kiln.bin"], "the temporary file is gone");
    }
}
