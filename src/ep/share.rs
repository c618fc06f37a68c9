//! The process-wide shared workspace behind `ep.share_ep_contexts=1`.
//!
//! Generation: the sessions of a *group* (every one with
//! `ep.share_ep_contexts=1` and `ep.context_enable=1`, the last one also with
//! `ep.stop_share_ep_contexts=1`) compile into one context binary, named after
//! the group's first model and written into its output folder. Each distinct
//! weight is stored once (by content). Only the stop session writes the file
//! (atomically) and then empties the workspace, so an abandoned group leaves
//! nothing on disk, and a session that fails adds nothing to its group.
//!
//! Loading: sessions with `ep.share_ep_contexts=1` take binaries other
//! sessions already mapped from the workspace instead of opening the file
//! again, so their weights exist once in memory. The workspace holds weak
//! references: a binary lives as long as some session uses it.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};

use once_cell::sync::Lazy;
use parking_lot::Mutex;

use crate::context::{ContextBinary, ContextBuilder, WriteStats};
use crate::error::{Error, Result};
use crate::plan::Program;
use crate::target::Target;

/// A group of sessions compiling into one binary.
struct Group {
    folder: PathBuf,
    bin_name: String,
    builder: ContextBuilder,
    models: usize,
}

#[derive(Default)]
struct Workspace {
    group: Option<Group>,
    loaded: HashMap<PathBuf, Weak<ContextBinary>>,
}

static WORKSPACE: Lazy<Mutex<Workspace>> = Lazy::new(Default::default);

/// Where a session's graphs went.
pub struct Shared {
    /// The binary's file name, relative to the session's output folder.
    pub bin_name: String,
    /// The binary's full path.
    pub bin_path: PathBuf,
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

/// Adds one session's graphs to the current group (starting one if none),
/// all or nothing; with `stop`, writes the binary and ends the group.
pub fn add_to_group(
    target: Target,
    folder: &Path,
    model_stem: &str,
    graphs: &[(String, &Program)],
    stop: bool,
    write: impl FnOnce(&Path, &ContextBuilder) -> Result<WriteStats>,
) -> Result<Shared> {
    let mut ws = WORKSPACE.lock();
    // A group starts only once its first session succeeds, so a failed
    // first session does not name the binary.
    let mut group = ws.group.take().unwrap_or_else(|| Group {
        folder: folder.to_path_buf(),
        bin_name: format!("{model_stem}_kiln.bin"),
        builder: ContextBuilder::new(target),
        models: 0,
    });
    let result = add_graphs(&mut group, target, folder, graphs, stop, write);
    if (result.is_ok() && !stop) || (result.is_err() && group.models > 0) {
        ws.group = Some(group);
    }
    result
}

fn add_graphs(
    group: &mut Group,
    target: Target,
    folder: &Path,
    graphs: &[(String, &Program)],
    stop: bool,
    write: impl FnOnce(&Path, &ContextBuilder) -> Result<WriteStats>,
) -> Result<Shared> {
    check_joinable(group, target, folder)?;
    let mut next = group.builder.clone();
    for (name, program) in graphs {
        if next.graph_names().iter().any(|n| n == name) {
            return Err(Error::invalid_argument(format!(
                "graph '{name}' is already in the shared context binary '{}': give each model of the group its \
                 own ep.context_node_name_prefix",
                group.bin_name
            )));
        }
        next.add_graph(name, program)?;
    }
    let bin_path = group.folder.join(&group.bin_name);
    let written = if stop { Some(write(&bin_path, &next)?) } else { None };
    group.builder = next;
    group.models += 1;
    Ok(Shared {
        bin_name: group.bin_name.clone(),
        bin_path,
        written,
        model_index: group.models,
    })
}

fn check_joinable(group: &Group, target: Target, folder: &Path) -> Result<()> {
    if group.builder.target() != target {
        return Err(Error::invalid_argument(format!(
            "this session compiles for {target}, but the shared context group writing '{}' compiles for {}; \
             a group shares one target",
            group.bin_name,
            group.builder.target()
        )));
    }
    if !same_folder(&group.folder, folder) {
        return Err(Error::invalid_argument(format!(
            "the shared context group writes '{}' into '{}', but this session's output model goes to '{}': \
             every model of a group must be written to the same folder",
            group.bin_name,
            group.folder.display(),
            folder.display()
        )));
    }
    Ok(())
}

/// A binary another session of this process already mapped, if it is still alive.
pub fn loaded(path: &Path) -> Option<Arc<ContextBinary>> {
    WORKSPACE.lock().loaded.get(path).and_then(Weak::upgrade)
}

/// Offers a freshly mapped binary to later sharing sessions.
pub fn publish(path: &Path, binary: &Arc<ContextBinary>) {
    let mut ws = WORKSPACE.lock();
    ws.loaded.retain(|_, b| b.strong_count() > 0);
    ws.loaded.insert(path.to_path_buf(), Arc::downgrade(binary));
}

/// `ep.stop_share_ep_contexts=1` on a loading session: later sessions start afresh.
pub fn stop_sharing_loaded() {
    WORKSPACE.lock().loaded.clear();
}

/// Ends the open group, if any, writing its binary: for a stop session that
/// never compiled anything (kiln claimed nothing of its model).
pub fn finish_group(
    write: impl FnOnce(&Path, &ContextBuilder) -> Result<WriteStats>,
) -> Result<Option<(PathBuf, WriteStats)>> {
    let mut ws = WORKSPACE.lock();
    let Some(group) = ws.group.take() else {
        return Ok(None);
    };
    let path = group.folder.join(&group.bin_name);
    match write(&path, &group.builder) {
        Ok(stats) => Ok(Some((path, stats))),
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
