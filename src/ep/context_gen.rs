//! EPContext generation: with `ep.context_enable=1`, Compile returns one
//! `EPContext` node per partition and, in embed mode 0, writes the model's
//! one context binary `<model>_kiln.bin` beside the output model.

use std::io::Write;
use std::path::{Path, PathBuf};

use super::{KilnEp, EP_NAME};
use crate::context::{ContextBuilder, FORMAT_VERSION};
use crate::error::{Error, Result};
use crate::ffi::ep::{AttrValue, EpContextNode};
use crate::plan::Program;

/// A compiled partition on its way into an EPContext node.
pub struct Generated<'a> {
    /// Orders the partitions as ORT writes them (see `compile::first_node_id`).
    pub first_node: usize,
    /// The fused node's name (the EPContext node must carry it).
    pub fused_name: String,
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
    pub program: &'a Program,
}

/// The EPContext nodes for one Compile call, writing the binary when
/// embed mode is 0. `model_path` is `None` for a model given as bytes.
pub fn generate(ep: &KilnEp, model_path: Option<&Path>, parts: &[Generated<'_>]) -> Result<Vec<EpContextNode>> {
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
            builder.add_graph(name, part.program)?;
            node.attributes.push(("embed_mode", AttrValue::Int(1)));
            node.attributes.push(("main_context", AttrValue::Int(1)));
            node.attributes
                .push(("ep_cache_context", AttrValue::Bytes(builder.to_bytes()?)));
        }
        return Ok(nodes);
    }
    let bin_name = if ep.config.context.share {
        write_shared(ep, model_path, parts, &names)?
    } else {
        write_own(ep, model_path, parts, &names)?
    };
    // The node ORT writes first names the file; the others find their graph in it.
    let main = (0..parts.len()).min_by_key(|&i| parts[i].first_node).unwrap_or(0);
    for (i, node) in nodes.iter_mut().enumerate() {
        node.attributes.push(("embed_mode", AttrValue::Int(0)));
        node.attributes
            .push(("main_context", AttrValue::Int((i == main) as i64)));
        if i == main {
            node.attributes
                .push(("ep_cache_context", AttrValue::Bytes(bin_name.clone().into_bytes())));
        }
    }
    Ok(nodes)
}

/// Embed mode 0 without sharing: this model's own `<model>_kiln.bin`.
fn write_own(ep: &KilnEp, model_path: Option<&Path>, parts: &[Generated<'_>], names: &[String]) -> Result<String> {
    let (bin_path, bin_name) = binary_location(ep, model_path)?;
    let mut builder = ContextBuilder::new(ep.target);
    for (part, name) in parts.iter().zip(names) {
        builder.add_graph(name, part.program)?;
    }
    let stats = write_atomically(&bin_path, |out| builder.write_to(out))?;
    log_written(ep, &bin_path, &stats);
    Ok(bin_name)
}

/// `ep.share_ep_contexts=1`: add this model's graphs to the group's binary.
fn write_shared(ep: &KilnEp, model_path: Option<&Path>, parts: &[Generated<'_>], names: &[String]) -> Result<String> {
    let (own_path, _) = binary_location(ep, model_path)?;
    let folder = own_path.parent().map(Path::to_path_buf).unwrap_or_default();
    let stem = own_path
        .file_name()
        .map(|n| n.to_string_lossy().trim_end_matches("_kiln.bin").to_string())
        .unwrap_or_else(|| "model".into());
    let graphs: Vec<(String, &Program)> = names.iter().cloned().zip(parts.iter().map(|p| p.program)).collect();
    let shared = super::share::add_to_group(
        ep.target,
        &folder,
        &stem,
        &graphs,
        ep.config.context.stop_share,
        |path, b| write_atomically(path, |out| b.write_to(out)),
    )?;
    match &shared.written {
        Some(stats) => log_written(ep, &shared.bin_path, stats),
        None => ep.logger.info(|| {
            format!(
                "model {} of a shared context group: {} graph(s) added to '{}' (written by the session with \
                 ep.stop_share_ep_contexts=1)",
                shared.model_index,
                graphs.len(),
                shared.bin_path.display()
            )
        }),
    }
    Ok(shared.bin_name)
}

fn log_written(ep: &KilnEp, path: &Path, stats: &crate::context::WriteStats) {
    ep.logger.info(|| {
        format!(
            "wrote context binary '{}' ({} bytes, {} graph(s), {} of {} weight bytes stored after sharing)",
            path.display(),
            stats.file_bytes,
            stats.graphs,
            stats.weight_bytes_stored,
            stats.weight_bytes_referenced
        )
    });
    crate::stats::context_written(
        stats.file_bytes,
        stats.weight_bytes_referenced - stats.weight_bytes_stored,
    );
}

fn base_node(ep: &KilnEp, model_path: Option<&Path>, part: &Generated<'_>, partition_name: &str) -> EpContextNode {
    let text = |s: &str| AttrValue::Bytes(s.as_bytes().to_vec());
    let mut attributes = vec![
        ("source", text(EP_NAME.to_str().unwrap_or("KilnExecutionProvider"))),
        ("partition_name", text(partition_name)),
        ("ep_sdk_version", text(&sdk_version())),
        ("hardware_architecture", text(ep.target.name())),
        ("notes", text(&notes(part.program))),
        ("max_size", AttrValue::Int(part.program.arena_bytes() as i64)),
    ];
    if let Some(file) = model_path.and_then(Path::file_name) {
        attributes.push(("onnx_model_filename", text(&file.to_string_lossy())));
    }
    EpContextNode {
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

fn notes(program: &Program) -> String {
    format!(
        "{}; {} steps; {} weight bytes; {} scratch bytes",
        program.op_summary(),
        program.num_steps(),
        program.constant_bytes(),
        program.arena_bytes()
    )
}

/// Where embed mode 0 puts the binary: the output model's folder, named
/// after the model (`<model>_kiln.bin`). Returns the path and the name the
/// EPContext node records (relative to the output model).
fn binary_location(ep: &KilnEp, model_path: Option<&Path>) -> Result<(PathBuf, String)> {
    let output = match (&ep.config.context.file_path, model_path) {
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
    let name = format!("{stem}_kiln.bin");
    let folder = output.parent().map(Path::to_path_buf).unwrap_or_default();
    // ORT would fail to write the model there after kiln wrote (or, sharing,
    // queued) its binary: refuse first, so nothing is left behind.
    let shown = if folder.as_os_str().is_empty() {
        Path::new(".")
    } else {
        folder.as_path()
    };
    if !shown.is_dir() {
        return Err(Error::invalid_argument(format!(
            "the output model's folder '{}' does not exist; create it first",
            shown.display()
        )));
    }
    Ok((folder.join(&name), name))
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

/// Writes `path` through a temporary file in the same folder and a rename,
/// so the binary is either complete or absent, never half-written.
pub fn write_atomically<T>(path: &Path, write: impl FnOnce(&mut dyn Write) -> Result<T>) -> Result<T> {
    let folder = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    std::fs::create_dir_all(folder).map_err(|e| {
        Error::fail(format!(
            "cannot create folder '{}' for the context binary: {e}",
            folder.display()
        ))
    })?;
    // Unique per process and call: sessions may write at the same time.
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let tmp = folder.join(format!(
        ".{}.tmp-{}-{}",
        path.file_name().map(|n| n.to_string_lossy()).unwrap_or_default(),
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let result = (|| {
        let file = std::fs::File::create(&tmp).map_err(|e| io_error(&tmp, e))?;
        let mut out = std::io::BufWriter::new(file);
        let value = write(&mut out)?;
        let file = out.into_inner().map_err(|e| io_error(&tmp, e.into_error()))?;
        file.sync_all().map_err(|e| io_error(&tmp, e))?;
        std::fs::rename(&tmp, path).map_err(|e| io_error(path, e))?;
        Ok(value)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

fn io_error(path: &Path, e: std::io::Error) -> Error {
    Error::fail(format!("cannot write context binary '{}': {e}", path.display()))
}

#[cfg(test)]
mod tests {
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
