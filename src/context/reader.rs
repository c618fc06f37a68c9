//! [`ContextBinary`]: parses and validates a context binary held in some
//! [`Storage`] (a memory-mapped file, or bytes in memory). Programs and
//! shape-generic graphs point into the storage; nothing is copied.

use std::collections::HashMap;
use std::sync::Arc;

use prost::Message;

use super::generic;
use super::header::Header;
use super::{convert, describe_program, proto};
use crate::compiler::generic::GenericGraph;
use crate::error::{Error, Result};
use crate::ir::DType;
use crate::kernels::gemm::PackedB;
use crate::plan::{Constant, Packing, Program, Storage, Weight, STORAGE_ALIGN};
use crate::target::Target;

/// A graph record of a context binary: a static partition's compiled
/// program, or a shape-generic graph (format 2) from which a program is
/// built for each input shape. Cloning shares the weights.
#[derive(Clone, Debug)]
pub enum StoredGraph {
    Program(Program),
    Generic(GenericGraph),
}

impl StoredGraph {
    /// The target the graph was compiled (or its weights packed) for.
    pub fn target(&self) -> Target {
        match self {
            StoredGraph::Program(p) => p.target(),
            StoredGraph::Generic(g) => g.target,
        }
    }

    /// One line about the graph (see [`describe_program`], `GenericGraph::summary`).
    pub fn describe(&self) -> String {
        match self {
            StoredGraph::Program(p) => describe_program(p),
            StoredGraph::Generic(g) => g.summary(),
        }
    }
}

/// A parsed, fully validated context binary.
pub struct ContextBinary {
    storage: Arc<dyn Storage>,
    format_version: u32,
    kiln_version: String,
    checksum: u128,
    context_models: Vec<String>,
    target: Target,
    weights: usize,
    weight_bytes: u64,
    /// In file order; every program already passed `Program::from_parts`,
    /// every generic graph the record checks.
    graphs: Vec<(String, StoredGraph)>,
    /// Position in `graphs` by name: a compiled model with hundreds of
    /// EPContext nodes looks each one up once, in constant time.
    index: HashMap<String, usize>,
}

impl ContextBinary {
    /// Checks magic, version, layout, checksum, metadata, target, every weight
    /// and every program. All errors are `InvalidGraph` and say what is wrong.
    pub fn parse(storage: Arc<dyn Storage>) -> Result<ContextBinary> {
        parse(storage).map_err(|e| e.context("kiln context binary"))
    }

    pub fn format_version(&self) -> u32 {
        self.format_version
    }

    /// Version of the kiln that wrote it.
    pub fn kiln_version(&self) -> &str {
        &self.kiln_version
    }

    pub fn target(&self) -> Target {
        self.target
    }

    /// The header's checksum (xxh3-128 of metadata and data): the contents' identity.
    pub fn checksum(&self) -> u128 {
        self.checksum
    }

    /// The compiled models the binary was written for (empty in files of older kilns).
    pub fn context_models(&self) -> &[String] {
        &self.context_models
    }

    pub fn graph_names(&self) -> Vec<String> {
        self.graphs.iter().map(|(n, _)| n.clone()).collect()
    }

    pub fn contains(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    /// The graph's program, its weights pointing into the storage in place.
    /// `Ok(None)` if the binary has no graph of that name;
    /// `Err(InvalidGraph)` if the graph is shape-generic (see [`ContextBinary::stored_graph`]).
    pub fn program(&self, name: &str) -> Result<Option<Program>> {
        match self.stored_graph(name) {
            None => Ok(None),
            Some(StoredGraph::Program(p)) => Ok(Some(p)),
            Some(StoredGraph::Generic(_)) => Err(Error::invalid_graph(format!(
                "graph '{name}' is stored shape-generic (format 2), not as a compiled program; \
                 read it with stored_graph"
            ))),
        }
    }

    /// The graph of that name, of either kind, its weights pointing into the
    /// storage in place; `None` if the binary has no graph of that name.
    pub fn stored_graph(&self, name: &str) -> Option<StoredGraph> {
        self.index.get(name).map(|&i| self.graphs[i].1.clone())
    }

    /// Distinct weights stored.
    pub fn num_weights(&self) -> usize {
        self.weights
    }

    /// Bytes of weights stored (each distinct weight once, without padding).
    pub fn weight_bytes(&self) -> u64 {
        self.weight_bytes
    }

    pub fn storage(&self) -> &Arc<dyn Storage> {
        &self.storage
    }

    /// One line per binary, then one per graph.
    pub fn describe(&self) -> String {
        let mut s = format!(
            "kiln context binary format {} written by kiln {} for {}: {} graph(s), {} weight(s) of {} bytes",
            self.format_version,
            self.kiln_version,
            self.target,
            self.graphs.len(),
            self.weights,
            self.weight_bytes
        );
        for (name, g) in &self.graphs {
            s.push_str(&format!("\n  '{name}': {}", g.describe()));
        }
        s
    }
}

impl std::fmt::Debug for ContextBinary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ContextBinary")
            .field("format_version", &self.format_version)
            .field("kiln_version", &self.kiln_version)
            .field("target", &self.target)
            .field("graphs", &self.graph_names())
            .field("weight_bytes", &self.weight_bytes)
            .finish()
    }
}

fn parse(storage: Arc<dyn Storage>) -> Result<ContextBinary> {
    let file = storage.bytes();
    let header = Header::parse(file)?;
    let meta = proto::Metadata::decode(&file[header.metadata_range()])
        .map_err(|e| Error::invalid_graph(format!("metadata does not decode: {e}")))?;
    let target = Target::parse(&meta.target).ok_or_else(|| {
        let known: Vec<&str> = Target::ALL.iter().map(|t| t.name()).collect();
        Error::invalid_graph(format!(
            "unknown target '{}'; this kiln knows {}",
            meta.target,
            known.join(", ")
        ))
    })?;
    let mut constants = Vec::with_capacity(meta.weights.len());
    let mut weight_bytes = 0u64;
    for (i, w) in meta.weights.iter().enumerate() {
        let c = weight(&storage, &header, target, w).map_err(|e| e.context(format_args!("weight {i}")))?;
        weight_bytes += w.byte_length;
        constants.push(c);
    }
    let mut graphs: Vec<(String, StoredGraph)> = Vec::with_capacity(meta.graphs.len());
    let mut index = HashMap::with_capacity(meta.graphs.len());
    for g in &meta.graphs {
        if g.name.is_empty() || index.insert(g.name.clone(), graphs.len()).is_some() {
            crate::bail!(InvalidGraph, "graph name '{}' is empty or repeated", g.name);
        }
        let stored = stored_graph(g, header.version, target, &constants)
            .map_err(|e| e.context(format_args!("graph '{}'", g.name)))?;
        graphs.push((g.name.clone(), stored));
    }
    Ok(ContextBinary {
        format_version: header.version,
        kiln_version: meta.kiln_version,
        checksum: header.checksum,
        context_models: meta.context_models,
        target,
        weights: constants.len(),
        weight_bytes,
        graphs,
        index,
        storage,
    })
}

/// Record `g`: a program, or (from format 2 on) a shape-generic graph.
fn stored_graph(g: &proto::GraphInfo, version: u32, target: Target, weights: &[Constant]) -> Result<StoredGraph> {
    let Some(info) = &g.generic else {
        let parts = convert::program_parts(g, target, weights)?;
        return Program::from_parts(parts).map(StoredGraph::Program);
    };
    if version < 2 {
        crate::bail!(InvalidGraph, "format {version} has no shape-generic graphs");
    }
    if g.program.is_some() || !(g.inputs.is_empty() && g.outputs.is_empty() && g.weight_ids.is_empty()) {
        crate::bail!(
            InvalidGraph,
            "a shape-generic graph has a program's fields (program, inputs, outputs or weight ids)"
        );
    }
    generic::generic_graph(info, target, weights).map(StoredGraph::Generic)
}

/// Weight `w` as a constant viewing the storage in place, after checking
/// dtype, size (plain, or packed for `target`), bounds and 64-byte alignment.
fn weight(storage: &Arc<dyn Storage>, header: &Header, target: Target, w: &proto::WeightInfo) -> Result<Constant> {
    let dtype = convert::dtype(w.dtype)?;
    let shape = convert::shape(&w.shape)?;
    let numel = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
    let (packing, expected_bytes) = match &w.gemm_packed {
        None => (Packing::None, numel.and_then(|n| n.checked_mul(dtype.size()))),
        Some(p) => {
            let (k, n) = (convert::usize_of(p.k, "k")?, convert::usize_of(p.n, "n")?);
            if dtype != DType::F32 || shape != [k, n] {
                crate::bail!(InvalidGraph, "a packed GEMM weight must be float of shape [k, n]");
            }
            let len = PackedB::packed_len(target, k, n);
            (Packing::GemmB { k, n }, len.checked_mul(size_of::<f32>()))
        }
    };
    if expected_bytes.map(|b| b as u64) != Some(w.byte_length) {
        crate::bail!(
            InvalidGraph,
            "{} bytes do not hold a {dtype} tensor of shape {:?} ({packing:?})",
            w.byte_length,
            w.shape
        );
    }
    if !w.offset.is_multiple_of(STORAGE_ALIGN as u64) {
        crate::bail!(InvalidGraph, "offset {} is not a multiple of {STORAGE_ALIGN}", w.offset);
    }
    if w.offset
        .checked_add(w.byte_length)
        .is_none_or(|end| end > header.data_len)
    {
        crate::bail!(
            InvalidGraph,
            "bytes {}..+{} lie outside the {}-byte data region",
            w.offset,
            w.byte_length,
            header.data_len
        );
    }
    // In bounds of the file, which is in memory: these fit in usize.
    let file_offset = (header.data_offset + w.offset) as usize;
    let data = Weight::in_storage_bytes(storage.clone(), file_offset, w.byte_length as usize)?;
    if w.content_hash.len() != 16 {
        crate::bail!(
            InvalidGraph,
            "content hash has {} bytes, expected 16",
            w.content_hash.len()
        );
    }
    Ok(Constant {
        dtype,
        shape: shape.into(),
        data,
        packing,
    })
}

// The per-weight content hashes are not re-checked at load: the file checksum
// already covers every byte, and a second pass over the weights would double
// the cost of loading. Writers recompute hashes themselves when deduplicating.
