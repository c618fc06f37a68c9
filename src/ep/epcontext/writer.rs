//! EPContext generation: with `ep.context_enable=1`, Compile returns one
//! `EPContext` node per partition and, in embed mode 0, writes the model's
//! one context binary `<model>_kiln.bin` beside the output model.

mod files;

use std::path::{Path, PathBuf};

use super::models::binary_stamp;
use super::schema::{
    EMBED_MODE, EP_CACHE_CONTEXT, EP_CONTEXT_DOMAIN, EP_CONTEXT_OP, EP_SDK_VERSION, HARDWARE_ARCHITECTURE, KILN_SOURCE,
    MAIN_CONTEXT, MAX_SIZE, NOTES, ONNX_MODEL_FILENAME, PARTITION_NAME, SOURCE,
};
use super::Session;
use crate::compiler::generic::Executable;
use crate::context::{ContextBuilder, StoredGraph, FORMAT_VERSION};
use crate::error::{Error, Result};
use crate::ffi::ep::{AttrValue, EpContextNode};

/// A compiled partition on its way into an EPContext node.
pub struct Generated<'a> {
    /// Orders the partitions as ORT writes them (see `compile::first_node_id`).
    pub first_node: usize,
    /// The fused node's name (the EPContext node must carry it).
    pub fused_name: String,
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
    pub exe: &'a Executable,
}

impl Generated<'_> {
    /// What the context binary stores: the compiled program of a static
    /// partition, or a shape-generic partition's graph and packed weights.
    fn stored(&self) -> StoredGraph {
        match self.exe {
            Executable::Fixed(p) => StoredGraph::Program(p.clone()),
            Executable::Generic(s) => StoredGraph::Generic(s.generic().clone()),
        }
    }
}

/// The EPContext nodes for one Compile call, writing the binary when
/// embed mode is 0. `model_path` is `None` for a model given as bytes.
pub fn generate(ep: &Session<'_>, model_path: Option<&Path>, parts: &[Generated<'_>]) -> Result<Vec<EpContextNode>> {
    let names: Vec<String> = parts
        .iter()
        .map(|p| format!("{}{}", ep.config.context.node_name_prefix, p.fused_name))
        .collect();
    let mut nodes: Vec<EpContextNode> = parts
        .iter()
        .zip(&names)
        .map(|(p, name)| base_node(ep, model_path, p, name))
        .collect();
    if ep.config.context.embed_mode && ep.config.context.share {
        return Err(Error::invalid_argument(
            "ep.share_ep_contexts=1 shares one context binary file between models, which needs \
             ep.context_embed_mode=0 (embed mode 1 puts a copy of the weights into every model)",
        ));
    }
    if ep.config.context.embed_mode {
        for ((node, part), name) in nodes.iter_mut().zip(parts).zip(&names) {
            let mut builder = ContextBuilder::new(ep.target);
            builder.add_stored(name, &part.stored())?;
            node.attributes.push((EMBED_MODE, AttrValue::Int(1)));
            node.attributes.push((MAIN_CONTEXT, AttrValue::Int(1)));
            node.attributes
                .push((EP_CACHE_CONTEXT, AttrValue::Bytes(builder.to_bytes()?)));
        }
        return Ok(nodes);
    }
    let out = output_location(ep, model_path)?;
    let (bin_name, checksum) = if ep.config.context.share {
        write_shared(ep, &out, parts, &names)?
    } else {
        write_own(ep, &out, parts, &names)?
    };
    // The node ORT writes first names the file; the others find their graph in it.
    let main = (0..parts.len()).min_by_key(|&i| parts[i].first_node).unwrap_or(0);
    for (i, node) in nodes.iter_mut().enumerate() {
        node.attributes.push((EMBED_MODE, AttrValue::Int(0)));
        node.attributes.push((MAIN_CONTEXT, AttrValue::Int((i == main) as i64)));
        if i == main {
            node.attributes
                .push((EP_CACHE_CONTEXT, AttrValue::Bytes(bin_name.clone().into_bytes())));
            if let Some(sum) = checksum {
                stamp_notes(node, sum);
            }
        }
    }
    Ok(nodes)
}

/// Adds the binary's checksum to the main node's notes: how kiln tells that
/// ORT wrote this model for this very binary (see `files`).
fn stamp_notes(node: &mut EpContextNode, checksum: u128) {
    if let Some((_, AttrValue::Bytes(notes))) = node.attributes.iter_mut().find(|(k, _)| *k == NOTES) {
        notes.extend_from_slice(format!("; {}", binary_stamp(checksum)).as_bytes());
    }
}

/// Embed mode 0 without sharing: this model's own binary, staged until
/// ORT has written the compiled model (see `files`).
fn write_own(
    ep: &Session<'_>,
    out: &Output,
    parts: &[Generated<'_>],
    names: &[String],
) -> Result<(String, Option<u128>)> {
    let models = [out.ctx_name.clone()];
    let name = files::choose_name(&out.folder, &out.stem, &models, ep.logger)?;
    let mut builder = ContextBuilder::new(ep.target);
    builder.add_context_model(&out.ctx_name);
    for (part, name) in parts.iter().zip(names) {
        builder.add_stored(name, &part.stored())?;
    }
    let staged = files::stage(&out.folder, &name, &builder, &out.ctx_model, ep.config.compile_only)?;
    let checksum = staged.stats.checksum;
    ep.context_files.hold_or_commit(staged, out.ctx_file, ep.logger)?;
    Ok((name.name, Some(checksum)))
}

/// `ep.share_ep_contexts=1`: add this model's graphs to the group's binary,
/// which the stop session stages.
fn write_shared(
    ep: &Session<'_>,
    out: &Output,
    parts: &[Generated<'_>],
    names: &[String],
) -> Result<(String, Option<u128>)> {
    let graphs: Vec<(String, StoredGraph)> = names.iter().cloned().zip(parts.iter().map(|p| p.stored())).collect();
    let mut staged = None;
    let member = crate::ep::share::Member {
        target: ep.target,
        folder: &out.folder,
        ctx_name: &out.ctx_name,
        graphs: &graphs,
        stop: ep.config.context.stop_share,
    };
    let shared = crate::ep::share::add_to_group(
        member,
        || files::choose_name(&out.folder, &out.stem, std::slice::from_ref(&out.ctx_name), ep.logger),
        |name, b| {
            let s = files::stage(&out.folder, name, b, &out.ctx_model, ep.config.compile_only)?;
            let stats = s.stats.clone();
            staged = Some(s);
            Ok(stats)
        },
    )?;
    let checksum = staged.as_ref().map(|s| s.stats.checksum);
    match staged {
        Some(s) => ep.context_files.hold_or_commit(s, out.ctx_file, ep.logger)?,
        None => ep.logger.info(|| {
            format!(
                "model {} of a shared context group: {} graph(s) added to '{}' (written by the session with \
                 ep.stop_share_ep_contexts=1)",
                shared.model_index,
                graphs.len(),
                out.folder.join(&shared.bin_name).display()
            )
        }),
    }
    Ok((shared.bin_name, checksum))
}

fn base_node(ep: &Session<'_>, model_path: Option<&Path>, part: &Generated<'_>, partition_name: &str) -> EpContextNode {
    let text = |s: &str| AttrValue::Bytes(s.as_bytes().to_vec());
    let mut attributes = vec![
        (SOURCE, text(KILN_SOURCE)),
        (PARTITION_NAME, text(partition_name)),
        (EP_SDK_VERSION, text(&sdk_version())),
        (HARDWARE_ARCHITECTURE, text(ep.target.name())),
        (NOTES, text(&part.exe.summary())),
        (MAX_SIZE, AttrValue::Int(part.exe.arena_bytes().unwrap_or(0) as i64)),
    ];
    if let Some(file) = model_path.and_then(Path::file_name) {
        attributes.push((ONNX_MODEL_FILENAME, text(&file.to_string_lossy())));
    }
    EpContextNode {
        op_type: EP_CONTEXT_OP,
        domain: EP_CONTEXT_DOMAIN,
        name: part.fused_name.clone(),
        inputs: part.inputs.clone(),
        outputs: part.outputs.clone(),
        attributes,
    }
}

/// `ep_sdk_version`: kiln's version and the context format it wrote.
pub fn sdk_version() -> String {
    format!("kiln {} (context format {FORMAT_VERSION})", env!("CARGO_PKG_VERSION"))
}

/// Where embed mode 0 writes: the output model's folder, the binary named
/// after the model (`<stem>_kiln.bin`, see `files::choose_name`).
pub struct Output {
    pub folder: PathBuf,
    pub stem: String,
    /// The compiled model ORT writes (or would write, for a memory output).
    pub ctx_model: PathBuf,
    /// Its file name, recorded in the binary.
    pub ctx_name: String,
    /// Whether ORT may write `ctx_model` as a file: false only for the
    /// compile API writing to memory without `ep.context_file_path`.
    pub ctx_file: bool,
}

fn output_location(ep: &Session<'_>, model_path: Option<&Path>) -> Result<Output> {
    let ctx = &ep.config.context;
    let output = match (&ctx.file_path, model_path) {
        (Some(out), _) => PathBuf::from(out),
        (None, Some(model)) => default_output(model),
        (None, None) => {
            return Err(Error::invalid_argument(
                "the model was given as bytes and ep.context_embed_mode=0: kiln cannot tell where to write \
                 the context binary; set ep.context_file_path (the output model's path) or use embed mode 1",
            ))
        }
    };
    let stem = match model_path {
        Some(model) => file_stem(model),
        None => file_stem(&output).trim_end_matches("_ctx").to_string(),
    };
    let folder = match output.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    // ORT would fail to write the model there after kiln staged (or, sharing,
    // queued) its binary: refuse first, so nothing is written at all.
    if !folder.is_dir() {
        return Err(Error::invalid_argument(format!(
            "the output model's folder '{}' does not exist; create it first",
            folder.display()
        )));
    }
    let ctx_file = !ep.config.compile_only || ctx.file_path.is_some();
    if ctx_file && output.is_dir() {
        return Err(Error::invalid_argument(format!(
            "the output model path '{}' is a folder; give the path of the _ctx.onnx file to write",
            output.display()
        )));
    }
    Ok(Output {
        ctx_name: output
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        ctx_model: output,
        folder,
        stem,
        ctx_file,
    })
}

/// ORT's default output model: `<model dir>/<model stem>_ctx.onnx`.
fn default_output(model: &Path) -> PathBuf {
    model.with_file_name(format!("{}_ctx.onnx", file_stem(model)))
}

fn file_stem(path: &Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "model".into())
}

pub use files::ContextFiles;

/// `OnSessionInitializationEnd`: ORT has written the session's compiled
/// model (session-option route), so the binaries it names go in place now,
/// while the session lives on.
pub fn on_session_initialization_end(ep: &Session<'_>) -> Result<()> {
    ep.context_files.finish_written(ep.logger)
}

/// ORT releases the EP: settle every staged binary (in place if ORT wrote
/// its compiled model, removed otherwise). A sharing group's stop session
/// whose model gave kiln nothing to compile never reached Compile: end the
/// group here, so the group's binary is still written.
pub fn on_release(ep: &Session<'_>) {
    ep.context_files.finish_all(ep.logger);
    let c = &ep.config.context;
    if !(c.enable && c.share && c.stop_share) || ep.compiled.load(std::sync::atomic::Ordering::Acquire) {
        return;
    }
    let written = crate::ep::share::finish_group(|folder, name, builder| {
        // No kiln node in this model to confirm: in place at once.
        let staged = files::stage(folder, name, builder, folder, ep.config.compile_only)?;
        let stats = staged.stats.clone();
        files::settle_written(&staged, ep.logger)?;
        Ok(stats)
    });
    match written {
        Ok(Some((path, stats))) => {
            ep.logger.info(|| {
                format!(
                    "stop session compiled nothing; ended the shared group by writing '{}' ({} bytes)",
                    path.display(),
                    stats.file_bytes
                )
            });
            crate::stats::context_written(
                stats.file_bytes,
                stats.weight_bytes_referenced - stats.weight_bytes_stored,
            );
        }
        Ok(None) => {}
        Err(e) => ep
            .logger
            .error(&format!("could not write the shared context binary: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::files::write_atomically;
    use super::*;

    #[test]
    fn atomic_write_leaves_nothing_on_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m_kiln.bin");
        let err = write_atomically(&path, |out| {
            out.write_all(b"half").unwrap();
            Err::<(), _>(Error::fail("boom"))
        });
        assert!(err.is_err());
        assert_eq!(
            std::fs::read_dir(dir.path()).unwrap().count(),
            0,
            "no temporary or partial file left"
        );
        write_atomically(&path, |out| {
            out.write_all(b"whole").unwrap();
            Ok(())
        })
        .unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), b"whole");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn default_output_is_beside_the_model() {
        assert_eq!(default_output(Path::new("a/b/m.onnx")), PathBuf::from("a/b/m_ctx.onnx"));
        assert_eq!(file_stem(Path::new("out/x_ctx.onnx")).trim_end_matches("_ctx"), "x");
    }
}
