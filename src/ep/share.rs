//! The process-wide shared workspace behind `ep.share_ep_contexts=1`.
//!
//! Generation: the sessions of a *group* (every one with
//! `ep.share_ep_contexts=1` and `ep.context_enable=1`, the last one also with
//! `ep.stop_share_ep_contexts=1`) compile into one context binary, named after
//! the group's first model (or the next name kiln may write, see
//! `epcontext::writer::files`) and written into its output folder. Each distinct
//! weight is stored once (by content). Only the stop session writes the file
//! (staged until its compiled model is written) and then empties the
//! workspace, so an abandoned group leaves nothing on disk, and a session
//! that fails adds nothing to its group.
//!
//! Loading: sessions with `ep.share_ep_contexts=1` take binaries other
//! sessions already mapped from the workspace instead of mapping the file
//! again, so their weights exist once in memory. The workspace holds weak
//! references: a binary lives as long as some session uses it. It is keyed
//! by the file's identity (path, device, inode, size, modification time and
//! the header's checksum), so a binary recompiled in place is a new entry:
//! new sessions load the new file, live ones keep the mapping they have.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};

use once_cell::sync::Lazy;
use parking_lot::Mutex;

use super::epcontext::names::Name;
use crate::context::StoredGraph;
use crate::context::{ContextBinary, ContextBuilder, WriteStats};
use crate::error::{Error, Result};
use crate::target::Target;

/// A group of sessions compiling into one binary.
struct Group {
    folder: PathBuf,
    /// The binary's name, and older binaries of the group's first model.
    name: Name,
    builder: ContextBuilder,
    models: usize,
}

#[derive(Default)]
struct Workspace {
    group: Option<Group>,
    loaded: HashMap<FileIdentity, Weak<ContextBinary>>,
}

static WORKSPACE: Lazy<Mutex<Workspace>> = Lazy::new(Default::default);

/// Where a session's graphs went.
pub struct Shared {
    /// The binary's file name, relative to the session's output folder.
    pub bin_name: String,
    /// Set when this session ended the group and wrote the binary.
    pub written: Option<WriteStats>,
    /// 1 for the group's first model, 2 for the second, ...
    pub model_index: usize,
}

fn same_folder(a: &Path, b: &Path) -> bool {
    let canon = |p: &Path| {
        let p = if p.as_os_str().is_empty() { Path::new(".") } else { p };
        p.canonicalize().unwrap_or_else(|_| p.to_path_buf())
    };
    canon(a) == canon(b)
}

/// One session joining the current group.
pub struct Member<'a> {
    pub target: Target,
    /// The output model's folder.
    pub folder: &'a Path,
    /// The output model's file name, recorded in the binary.
    pub ctx_name: &'a str,
    pub graphs: &'a [(String, StoredGraph)],
    /// `ep.stop_share_ep_contexts=1`: this session ends the group.
    pub stop: bool,
}

/// Adds one session's graphs to the current group (starting one, named by
/// `bin_name`, if none), all or nothing; with `stop`, writes the binary
/// (`write(name, builder)`, which stages it) and ends the group.
pub fn add_to_group(
    member: Member<'_>,
    bin_name: impl FnOnce() -> Result<Name>,
    write: impl FnOnce(&Name, &ContextBuilder) -> Result<WriteStats>,
) -> Result<Shared> {
    let mut ws = WORKSPACE.lock();
    // A group starts only once its first session succeeds, so a failed
    // first session does not name the binary.
    let mut group = match ws.group.take() {
        Some(g) => g,
        None => Group {
            folder: member.folder.to_path_buf(),
            name: bin_name()?,
            builder: ContextBuilder::new(member.target),
            models: 0,
        },
    };
    let result = add_graphs(&mut group, &member, write);
    if (result.is_ok() && !member.stop) || (result.is_err() && group.models > 0) {
        ws.group = Some(group);
    }
    result
}

fn add_graphs(
    group: &mut Group,
    member: &Member<'_>,
    write: impl FnOnce(&Name, &ContextBuilder) -> Result<WriteStats>,
) -> Result<Shared> {
    check_joinable(group, member.target, member.folder)?;
    let mut next = group.builder.clone();
    for (name, program) in member.graphs {
        if next.graph_names().iter().any(|n| n == name) {
            return Err(Error::invalid_argument(format!(
                "graph '{name}' is already in the shared context binary '{}': give each model of the group its \
                 own ep.context_node_name_prefix",
                group.name.name
            )));
        }
        next.add_stored(name, program)?;
    }
    next.add_context_model(member.ctx_name);
    let written = if member.stop {
        Some(write(&group.name, &next)?)
    } else {
        None
    };
    group.builder = next;
    group.models += 1;
    Ok(Shared {
        bin_name: group.name.name.clone(),
        written,
        model_index: group.models,
    })
}

fn check_joinable(group: &Group, target: Target, folder: &Path) -> Result<()> {
    if group.builder.target() != target {
        return Err(Error::invalid_argument(format!(
            "this session compiles for {target}, but the shared context group writing '{}' compiles for {}; \
             a group shares one target",
            group.name.name,
            group.builder.target()
        )));
    }
    if !same_folder(&group.folder, folder) {
        return Err(Error::invalid_argument(format!(
            "the shared context group writes '{}' into '{}', but this session's output model goes to '{}': \
             every model of a group must be written to the same folder",
            group.name.name,
            group.folder.display(),
            folder.display()
        )));
    }
    Ok(())
}

/// What makes two opens of a path the same binary: the file (device and
/// inode), its size and modification time, and its contents' checksum.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FileIdentity {
    path: PathBuf,
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    checksum: u128,
}

/// The identity of the binary at `path` now; `None` for anything that is
/// not a regular file with a readable kiln header (the caller's own open
/// then reports what is wrong).
pub fn identity(path: &Path) -> Option<FileIdentity> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).ok().filter(|m| m.is_file())?;
    let mut file = std::fs::File::open(path).ok()?;
    let checksum = crate::context::peek_checksum(&mut file).ok()?;
    Some(FileIdentity {
        path: path.to_path_buf(),
        dev: meta.dev(),
        ino: meta.ino(),
        size: meta.size(),
        mtime: (meta.mtime(), meta.mtime_nsec()),
        checksum,
    })
}

/// Serialises first loads of shared binaries: without it, sessions created
/// at the same moment would each miss the workspace and map the file again.
static LOADING: Mutex<()> = parking_lot::const_mutex(());

/// The binary with identity `id` from the workspace, or `open`ed and offered
/// to later sessions. Returns it and whether it came from the workspace.
pub fn load_shared(
    id: FileIdentity,
    open: impl FnOnce() -> Result<Arc<ContextBinary>>,
) -> Result<(Arc<ContextBinary>, bool)> {
    let _one_at_a_time = LOADING.lock();
    if let Some(b) = loaded(&id) {
        return Ok((b, true));
    }
    let b = open()?;
    publish(id, &b);
    Ok((b, false))
}

/// A binary another session of this process already mapped, if it is still
/// alive and the file is still the one it mapped.
fn loaded(id: &FileIdentity) -> Option<Arc<ContextBinary>> {
    WORKSPACE.lock().loaded.get(id).and_then(Weak::upgrade)
}

/// Offers a freshly mapped binary to later sharing sessions. `id` must be
/// taken before mapping; a binary whose contents are not the ones `id` saw
/// (the file was replaced in between) is not offered.
fn publish(id: FileIdentity, binary: &Arc<ContextBinary>) {
    if binary.checksum() != id.checksum {
        return;
    }
    let mut ws = WORKSPACE.lock();
    ws.loaded.retain(|_, b| b.strong_count() > 0);
    ws.loaded.insert(id, Arc::downgrade(binary));
}

/// `ep.stop_share_ep_contexts=1` on a loading session: later sessions start afresh.
pub fn stop_sharing_loaded() {
    WORKSPACE.lock().loaded.clear();
}

/// Ends the open group, if any, writing its binary: for a stop session that
/// never compiled anything (kiln claimed nothing of its model).
pub fn finish_group(
    write: impl FnOnce(&Path, &Name, &ContextBuilder) -> Result<WriteStats>,
) -> Result<Option<(PathBuf, WriteStats)>> {
    let mut ws = WORKSPACE.lock();
    let Some(group) = ws.group.take() else {
        return Ok(None);
    };
    match write(&group.folder, &group.name, &group.builder) {
        Ok(stats) => Ok(Some((group.folder.join(&group.name.name), stats))),
        Err(e) => {
            ws.group = Some(group);
            Err(e)
        }
    }
}

/// Whether a generation group is open (for tests and logs).
pub fn group_open() -> bool {
    WORKSPACE.lock().group.is_some()
}
