//! EPContext loading: rebuild compiled programs from kiln's EPContext nodes
//! (embedded payloads or `<model>_kiln.bin` files), with every check a
//! shipped artifact needs. All failures are `ORT_INVALID_GRAPH` naming the
//! node, the file and the cause.

use std::collections::HashMap;
use std::path::{Component, Path, PathBuf};
use std::sync::Arc;

use super::Session;
use crate::context::{ContextBinary, StoredGraph};
use crate::ep::options::ContextStorage;
use crate::error::{Error, Result};
use crate::ffi::graph::{Graph, Node, ValueInfo};
use crate::ffi::mmap::{copy_file, map_file};
use crate::ir::onnx_type_name;
use crate::plan::{AlignedBytes, Storage, TensorSpec};
use crate::stats;
use crate::target::Target;

use super::schema::{
    binary_source, origin, BinarySource, ContextAttrs, RawContextAttrs, EMBED_MODE, EMBED_MODE_DEFAULT,
    EP_CACHE_CONTEXT, EP_CONTEXT_DOMAIN, EP_CONTEXT_OP, MAIN_CONTEXT, NOTES, PARTITION_NAME, SOURCE,
};

pub fn is_ep_context(node: &Node<'_>) -> Result<bool> {
    Ok(node.op_type()? == EP_CONTEXT_OP && node.domain()? == EP_CONTEXT_DOMAIN)
}

/// An EPContext node kiln owns, with its attributes read.
pub struct ContextNode<'a> {
    pub node: Node<'a>,
    pub name: String,
    pub partition_name: String,
    pub embed_mode: i64,
    pub main_context: i64,
    pub cache_context: Option<Vec<u8>>,
}

fn text_attr(node: &Node<'_>, name: &str) -> Result<Option<String>> {
    Ok(node
        .attribute(name)?
        .map(|a| a.bytes())
        .transpose()?
        .flatten()
        .map(|b| String::from_utf8_lossy(&b).into_owned()))
}

/// The attributes kiln acts on must have their ONNX type: a wrong type is
/// refused, not mistaken for an absent attribute (and its default).
fn wrong_type(node: &Node<'_>, attr: &str, want: &str) -> Result<Error> {
    Ok(Error::invalid_graph(format!(
        "kiln EPContext node '{}': attribute '{attr}' must be {want}, it has another type",
        node.name()?
    )))
}

fn int_attr(node: &Node<'_>, name: &str) -> Result<Option<i64>> {
    let Some(attr) = node.attribute(name)? else {
        return Ok(None);
    };
    match attr.int()? {
        Some(value) => Ok(Some(value)),
        None => Err(wrong_type(node, name, "an INT")?),
    }
}

fn bytes_attr(node: &Node<'_>, name: &str) -> Result<Option<Vec<u8>>> {
    let Some(attr) = node.attribute(name)? else {
        return Ok(None);
    };
    match attr.bytes()? {
        Some(bytes) => Ok(Some(bytes)),
        None => Err(wrong_type(node, name, "a STRING")?),
    }
}

/// The node's `source` attribute, if it has one.
pub fn source_of(node: &Node<'_>) -> Result<Option<String>> {
    text_attr(node, SOURCE)
}

impl<'a> ContextNode<'a> {
    pub fn read(node: Node<'a>) -> Result<ContextNode<'a>> {
        let embed_mode = int_attr(&node, EMBED_MODE)?;
        // An embedded payload is read later, straight into aligned memory.
        let ep_cache_context = match embed_mode.unwrap_or(EMBED_MODE_DEFAULT) {
            1 => None,
            _ => bytes_attr(&node, EP_CACHE_CONTEXT)?,
        };
        let raw = RawContextAttrs {
            embed_mode,
            main_context: int_attr(&node, MAIN_CONTEXT)?,
            ep_cache_context,
            partition_name: bytes_attr(&node, PARTITION_NAME)?,
        };
        let name = node.name()?;
        let attrs = ContextAttrs::from_raw(raw).map_err(|(attrs, cause)| fail_node(&name, &attrs, cause))?;
        Ok(ContextNode {
            embed_mode: attrs.embed_mode,
            main_context: attrs.main_context,
            cache_context: attrs.cache_context,
            partition_name: attrs.partition_name,
            name,
            node,
        })
    }

    /// An `ORT_INVALID_GRAPH` naming the node, where its graph comes from, and `cause`.
    fn fail(&self, cause: impl std::fmt::Display) -> Error {
        Error::invalid_graph(format!(
            "kiln EPContext node '{}' ({}): {cause}",
            self.name,
            origin(self.main_context, self.embed_mode, self.cache_context.as_deref())
        ))
    }
}

fn fail_node(name: &str, attrs: &ContextAttrs, cause: impl std::fmt::Display) -> Error {
    Error::invalid_graph(format!("kiln EPContext node '{name}' ({}): {cause}", attrs.origin()))
}

/// The folder `ep_cache_context` paths are relative to: the model's folder,
/// or the folder of `ep.context_file_path` for a model loaded from bytes.
pub fn base_folder(ep: &Session<'_>, graph: &Graph<'_>) -> Result<Option<PathBuf>> {
    let folder = |p: &Path| p.parent().map(Path::to_path_buf).unwrap_or_default();
    Ok(match graph.model_path()? {
        Some(model) => Some(folder(&model)),
        None => ep.config.context.file_path.as_deref().map(|p| folder(Path::new(p))),
    })
}

/// Resolves `relative` inside `base`, refusing anything that leaves it:
/// absolute paths, `..`, and symlinks pointing outside.
pub fn resolve_inside(base: &Path, relative: &str) -> std::result::Result<PathBuf, String> {
    if relative.is_empty() {
        return Err("ep_cache_context is empty".into());
    }
    let rel = Path::new(relative);
    if rel.is_absolute() || rel.has_root() {
        return Err(format!(
            "'{relative}' is an absolute path; kiln only reads files inside the model's folder"
        ));
    }
    if rel.components().any(|c| matches!(c, Component::ParentDir)) {
        return Err(format!(
            "'{relative}' contains '..'; kiln only reads files inside the model's folder"
        ));
    }
    let base_dir = if base.as_os_str().is_empty() {
        Path::new(".")
    } else {
        base
    };
    let path = base_dir.join(rel);
    if !path.exists() {
        return Err(format!("context binary '{}' does not exist", path.display()));
    }
    let real = path
        .canonicalize()
        .map_err(|e| format!("cannot resolve '{}': {e}", path.display()))?;
    let real_base = base_dir
        .canonicalize()
        .map_err(|e| format!("cannot resolve the model folder '{}': {e}", base_dir.display()))?;
    if !real.starts_with(&real_base) {
        return Err(format!(
            "'{relative}' leads outside the model's folder (to '{}') through a symbolic link",
            real.display()
        ));
    }
    Ok(real)
}

/// Context binaries one session has opened, by canonical path: each file is
/// read once per session however many nodes use it.
#[derive(Default)]
pub struct LoadedBinaries {
    files: HashMap<PathBuf, Arc<ContextBinary>>,
    /// Every binary this session loaded, in load order (for main_context=0).
    all: Vec<Arc<ContextBinary>>,
}

impl LoadedBinaries {
    /// `share`: take the binary from (and offer it to) the process-wide
    /// workspace. A `copy` session never shares: a binary another session
    /// mapped would bring back the dependence on the file `copy` avoids.
    fn file(&mut self, path: &Path, share: bool, storage: ContextStorage) -> Result<Arc<ContextBinary>> {
        if let Some(b) = self.files.get(path) {
            return Ok(b.clone());
        }
        let share = share && storage == ContextStorage::Map;
        // Taken before mapping: the workspace is keyed by the file's identity.
        let id = share.then(|| crate::ep::share::identity(path)).flatten();
        let open = || -> Result<Arc<ContextBinary>> {
            let bytes = match storage {
                ContextStorage::Map => map_file(path)?,
                ContextStorage::Copy => copy_file(path)?,
            };
            let b = parse(bytes).map_err(|e| e.context(format!("'{}'", path.display())))?;
            stats::context_file_opened();
            Ok(b)
        };
        let binary = match id {
            Some(id) => {
                let (b, shared) = crate::ep::share::load_shared(id, open)?;
                if shared {
                    stats::context_file_shared();
                }
                b
            }
            None => open()?,
        };
        self.files.insert(path.to_path_buf(), binary.clone());
        self.all.push(binary.clone());
        Ok(binary)
    }

    fn embedded(&mut self, payload: AlignedBytes) -> Result<Arc<ContextBinary>> {
        let binary = parse(Arc::new(payload))?;
        self.all.push(binary.clone());
        Ok(binary)
    }

    fn find(&self, partition: &str) -> Option<&Arc<ContextBinary>> {
        self.all.iter().find(|b| b.contains(partition))
    }
}

fn parse(storage: Arc<dyn Storage>) -> Result<Arc<ContextBinary>> {
    ContextBinary::parse(storage).map(Arc::new)
}

/// Rebuilds the program of every EPContext node: primary nodes first, so
/// `main_context=0` nodes find their graph in the binaries those opened.
pub fn load_all(ep: &Session<'_>, base: Option<&Path>, nodes: &[&ContextNode<'_>]) -> Result<Vec<StoredGraph>> {
    let mut loaded = ep.binaries.lock();
    let mut programs: Vec<Option<StoredGraph>> = (0..nodes.len()).map(|_| None).collect();
    let order = (0..nodes.len())
        .filter(|&i| nodes[i].main_context != 0)
        .chain((0..nodes.len()).filter(|&i| nodes[i].main_context == 0));
    for i in order {
        programs[i] = Some(load_one(ep, base, nodes[i], &mut loaded)?);
    }
    if ep.config.context.share && ep.config.context.stop_share {
        crate::ep::share::stop_sharing_loaded();
    }
    Ok(programs.into_iter().flatten().collect())
}

fn load_one(
    ep: &Session<'_>,
    base: Option<&Path>,
    cn: &ContextNode<'_>,
    loaded: &mut LoadedBinaries,
) -> Result<StoredGraph> {
    let binary = if cn.main_context == 0 {
        loaded.find(&cn.partition_name).cloned().ok_or_else(|| {
            cn.fail(format!(
                "main_context=0 but no context binary loaded in this session holds graph '{}'",
                cn.partition_name
            ))
        })?
    } else {
        open_binary(ep, base, cn, loaded)?
    };
    let graph = binary.stored_graph(&cn.partition_name).ok_or_else(|| {
        cn.fail(format!(
            "graph '{}' is not in its context binary (it holds: {})",
            cn.partition_name,
            binary.graph_names().join(", ")
        ))
    })?;
    if cn.main_context != 0 && cn.embed_mode == 0 {
        check_stamp(cn, &binary)?;
    }
    check_runnable(ep, cn, graph.target())?;
    let (inputs, outputs) = expected_io(&graph);
    check_io(cn, &inputs, &outputs)?;
    Ok(graph)
}

/// What a graph's inputs and outputs must be: name, element type and dims
/// (`None`: any shape; -1: any size), for `check_io`.
struct Expected {
    name: String,
    elem_type: i32,
    dims: Option<Vec<i64>>,
}

fn expected_io(graph: &StoredGraph) -> (Vec<Expected>, Vec<Expected>) {
    match graph {
        StoredGraph::Program(p) => {
            let of = |specs: &[TensorSpec]| {
                specs
                    .iter()
                    .map(|s| Expected {
                        name: s.name.clone(),
                        elem_type: s.elem_type,
                        dims: Some(s.shape.iter().map(|&d| d as i64).collect()),
                    })
                    .collect()
            };
            (of(p.inputs()), of(p.outputs()))
        }
        StoredGraph::Generic(g) => {
            let of = |names: &[String]| {
                names
                    .iter()
                    .map(|n| {
                        let v = g.desc.values.get(n).cloned().unwrap_or_default();
                        Expected {
                            name: n.clone(),
                            elem_type: v.elem_type,
                            dims: v.dims,
                        }
                    })
                    .collect()
            };
            (of(&g.desc.inputs), of(&g.desc.outputs))
        }
    }
}

/// The binary a primary node names: its payload, or a file beside the model.
fn open_binary(
    ep: &Session<'_>,
    base: Option<&Path>,
    cn: &ContextNode<'_>,
    loaded: &mut LoadedBinaries,
) -> Result<Arc<ContextBinary>> {
    let rel = match binary_source(cn.embed_mode, cn.cache_context.as_deref()).map_err(|cause| cn.fail(cause))? {
        BinarySource::File(rel) => rel,
        BinarySource::Embedded => {
            // Read straight into aligned memory: the weights are used in place.
            let payload = cn
                .node
                .attribute(EP_CACHE_CONTEXT)?
                .map(|a| {
                    a.aligned_bytes()?
                        .ok_or_else(|| cn.fail("attribute 'ep_cache_context' must be a STRING, it has another type"))
                })
                .transpose()?
                .filter(|p| !p.is_empty())
                .ok_or_else(|| cn.fail("ep_cache_context is empty or absent"))?;
            return loaded.embedded(payload).map_err(|e| cn.fail(e));
        }
    };
    let base = base.ok_or_else(|| {
        cn.fail(
            "the file is relative to the model's folder, but the model was loaded from bytes; \
             set ep.context_file_path to a path in the folder holding the binary",
        )
    })?;
    let path = resolve_inside(base, rel).map_err(|cause| cn.fail(cause))?;
    loaded
        .file(&path, ep.config.context.share, ep.config.kiln.context_storage)
        .map_err(|e| cn.fail(e))
}

/// kiln writes the checksum of a node's binary into its `notes`: a
/// different binary under that name came from another compile (a model
/// without the stamp, or with unreadable notes, is not checked).
fn check_stamp(cn: &ContextNode<'_>, binary: &ContextBinary) -> Result<()> {
    let notes = text_attr(&cn.node, NOTES).ok().flatten().unwrap_or_default();
    match super::models::stamped_checksum(&notes) {
        Some(sum) if sum != binary.checksum() => Err(cn.fail(format!(
            "the file's checksum is {:032x}, but this model was compiled with a binary of checksum {sum:032x}: \
             another compile replaced the file; recompile the model",
            binary.checksum()
        ))),
        _ => Ok(()),
    }
}

fn check_runnable(ep: &Session<'_>, cn: &ContextNode<'_>, target: Target) -> Result<()> {
    if target.can_run_on(ep.host) {
        return Ok(());
    }
    Err(cn.fail(format!(
        "graph '{}' was compiled for {}, which this host cannot run (best: {}); recompile the model for this machine",
        cn.partition_name,
        target.name(),
        ep.host.name()
    )))
}

/// The node's inputs and outputs must be the ones the graph was compiled
/// for: same names, element types and static shapes. Compute writes each
/// output as the compiled program's type into a buffer ORT sizes by the
/// node's type, so an edited type must never get this far.
fn check_io(cn: &ContextNode<'_>, inputs: &[Expected], outputs: &[Expected]) -> Result<()> {
    let sides = [
        ("input", cn.node.inputs()?, inputs),
        ("output", cn.node.outputs()?, outputs),
    ];
    for (what, values, specs) in sides {
        if values.len() != specs.len() {
            return Err(cn.fail(format!(
                "it has {} {what}s, graph '{}' was compiled with {}",
                values.len(),
                cn.partition_name,
                specs.len()
            )));
        }
        let names = values
            .iter()
            .map(|v| v.map(|v| v.name()).transpose())
            .collect::<Result<Vec<_>>>()?;
        for (i, (v, spec)) in values.iter().zip(specs).enumerate() {
            let v = v.ok_or_else(|| cn.fail(format!("{what} {i} is missing, expected '{}'", spec.name)))?;
            check_name(cn, what, i, &names, specs)?;
            check_value(cn, &format!("{what} {i}"), &v, spec)?;
        }
    }
    Ok(())
}

/// A value keeps its compiled name, or gets a new one (merging models with
/// `onnx.compose` prefixes every name; such values match by position). A
/// name the graph was compiled with at another position is a reordering,
/// which would feed one tensor's data to another — unless the node reads
/// that value at that other position too: ORT's common subexpression
/// elimination (`ORT_ENABLE_BASIC` and up) merges two equal values an
/// EPContext node reads (two `Shape`s of one tensor) into one.
fn check_name(cn: &ContextNode<'_>, what: &str, i: usize, names: &[Option<String>], specs: &[Expected]) -> Result<()> {
    let Some(name) = names[i].as_deref() else {
        return Ok(());
    };
    match specs.iter().position(|s| s.name == name) {
        Some(j) if j != i && names.get(j).and_then(Option::as_deref) != Some(name) => Err(cn.fail(format!(
            "{what} {i} is '{name}', but graph '{}' was compiled with '{name}' as {what} {j} (and '{}' as {what} {i})",
            cn.partition_name, specs[i].name
        ))),
        _ => Ok(()),
    }
}

/// `float [2, 3, 4]`, with `?` for a dynamic dimension.
fn type_text(elem_type: i32, dims: &[i64]) -> String {
    let dims: Vec<String> = dims
        .iter()
        .map(|&d| if d < 0 { "?".into() } else { d.to_string() })
        .collect();
    format!("{} [{}]", onnx_type_name(elem_type), dims.join(", "))
}

fn check_value(cn: &ContextNode<'_>, what: &str, v: &ValueInfo<'_>, spec: &Expected) -> Result<()> {
    let name = v.name()?;
    let expected_text = match &spec.dims {
        Some(dims) => type_text(spec.elem_type, dims),
        None => format!("{} of any shape", onnx_type_name(spec.elem_type)),
    };
    let mismatch = |found: &str, cause: &str| {
        cn.fail(format!(
            "{what} '{name}': found {found}, expected {expected_text} as graph '{}' was compiled ({cause})",
            cn.partition_name
        ))
    };
    let Some(info) = v.tensor_info()? else {
        return Err(mismatch("a value that is not a tensor", "not a tensor"));
    };
    let found = type_text(info.elem_type, &info.dims);
    if info.elem_type != spec.elem_type {
        return Err(mismatch(&found, "element type differs"));
    }
    // What ORT's shape inference left unknown (the whole shape, or a dim) is
    // no mismatch: kiln may know more than ORT did when it wrote the model
    // (it folds shape subgraphs ORT did not), and Compute checks every
    // tensor's actual shape against the program anyway.
    let Some(expected) = spec.dims.as_ref().filter(|_| info.has_shape) else {
        return Ok(());
    };
    if info.dims.len() != expected.len() {
        return Err(mismatch(&found, "rank differs"));
    }
    // A symbolic dim (-1) of a shape-generic graph takes any size.
    if info
        .dims
        .iter()
        .zip(expected)
        .any(|(&d, &e)| d >= 0 && e >= 0 && d != e)
    {
        return Err(mismatch(&found, "shape differs"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_must_stay_inside_the_model_folder() {
        let dir = tempfile::tempdir().unwrap();
        let base = dir.path().join("models");
        std::fs::create_dir_all(base.join("sub")).unwrap();
        std::fs::write(base.join("m_kiln.bin"), b"x").unwrap();
        std::fs::write(base.join("sub/s_kiln.bin"), b"x").unwrap();
        std::fs::write(dir.path().join("outside.bin"), b"x").unwrap();
        assert!(resolve_inside(&base, "m_kiln.bin").is_ok());
        assert!(resolve_inside(&base, "sub/s_kiln.bin").is_ok());
        assert!(resolve_inside(&base, "").unwrap_err().contains("empty"));
        assert!(resolve_inside(&base, "missing.bin")
            .unwrap_err()
            .contains("does not exist"));
        assert!(resolve_inside(&base, "../outside.bin").unwrap_err().contains(".."));
        let abs = dir.path().join("outside.bin");
        assert!(resolve_inside(&base, abs.to_str().unwrap())
            .unwrap_err()
            .contains("absolute"));
        std::os::unix::fs::symlink(dir.path().join("outside.bin"), base.join("link.bin")).unwrap();
        assert!(resolve_inside(&base, "link.bin").unwrap_err().contains("symbolic link"));
    }
}
