//! [`ContextBuilder`]: collects compiled graphs (programs and shape-generic
//! graphs), stores each distinct weight once, and writes the binary.

use std::collections::HashMap;
use std::io::Write;

use prost::Message;
use xxhash_rust::xxh3::xxh3_128;

use super::header::{align_up, checksum, Header};
use super::{convert, generic, proto, StoredGraph, WriteStats, KILN_VERSION};
use crate::compiler::generic::GenericGraph;
use crate::error::{Error, Result};
use crate::ir::DType;
use crate::plan::{Constant, Packing, Program, Weight, STORAGE_ALIGN};
use crate::target::Target;

/// A weight to store, keyed by dtype, packing, shape and contents.
#[derive(Clone)]
struct Pending {
    dtype: DType,
    packing: Packing,
    shape: std::sync::Arc<[usize]>,
    hash: u128,
    data: Weight,
}

/// Builds a context binary from compiled programs of one target. Cloning is
/// cheap (weights are shared), which lets a caller add graphs all-or-nothing.
#[derive(Clone)]
pub struct ContextBuilder {
    target: Target,
    weights: Vec<Pending>,
    /// Content hash -> indices into `weights` (candidates for dedup).
    by_hash: HashMap<u128, Vec<usize>>,
    graphs: Vec<proto::GraphInfo>,
    weight_bytes_referenced: u64,
    /// The compiled models the binary is written for (metadata `context_models`).
    context_models: Vec<String>,
}

impl ContextBuilder {
    pub fn new(target: Target) -> Self {
        ContextBuilder {
            target,
            weights: Vec::new(),
            by_hash: HashMap::new(),
            graphs: Vec::new(),
            weight_bytes_referenced: 0,
            context_models: Vec::new(),
        }
    }

    /// Records `name` (a `_ctx.onnx` file name) as a model this binary is written for.
    pub fn add_context_model(&mut self, name: &str) {
        if !self.context_models.iter().any(|n| n == name) {
            self.context_models.push(name.to_string());
        }
    }

    pub fn context_models(&self) -> &[String] {
        &self.context_models
    }

    pub fn target(&self) -> Target {
        self.target
    }

    /// Adds `program` under `name`. `Err(InvalidArgument)` if `name` is empty
    /// or already present or the program's target differs; `Err(InvalidGraph)`
    /// if the program does not validate.
    pub fn add_graph(&mut self, name: &str, program: &Program) -> Result<()> {
        self.check_new(name, program.target())?;
        // A file must never hold a program its reader would refuse.
        program
            .validate()
            .map_err(|e| e.context(format_args!("graph '{name}'")))?;
        let mut ids = Vec::with_capacity(program.constants().len());
        for c in program.constants() {
            ids.push(self.intern(c)?);
            self.weight_bytes_referenced += c.data.byte_len() as u64;
        }
        self.graphs.push(convert::graph_info(name, program, ids));
        Ok(())
    }

    /// Adds the shape-generic graph `g` under `name` (format 2): its
    /// description inline, its constants and packed weights in the weight
    /// table, shared with equal weights of any graph. Errors as for
    /// [`ContextBuilder::add_graph`]; `Err(InvalidGraph)` if `g` is not one a
    /// reader accepts (constant sizes, packed sizes, names, attributes).
    pub fn add_generic(&mut self, name: &str, g: &GenericGraph) -> Result<()> {
        self.check_new(name, g.target)?;
        generic::check_for_write(g).map_err(|e| e.context(format_args!("graph '{name}'")))?;
        let mut constant_ids = Vec::with_capacity(g.constants.len());
        for c in &g.constants {
            let c = Constant::plain(c.dtype, &c.shape, c.data.clone());
            constant_ids.push(self.intern(&c)?);
            self.weight_bytes_referenced += c.data.byte_len() as u64;
        }
        let mut packed_ids = Vec::with_capacity(g.packed.len());
        for p in &g.packed {
            let c = Constant {
                dtype: DType::F32,
                shape: [p.k, p.n].into(),
                data: p.data.clone(),
                packing: Packing::GemmB { k: p.k, n: p.n },
            };
            packed_ids.push(self.intern(&c)?);
            self.weight_bytes_referenced += c.data.byte_len() as u64;
        }
        self.graphs.push(proto::GraphInfo {
            name: name.to_string(),
            generic: Some(generic::generic_info(g, &constant_ids, &packed_ids)),
            ..Default::default()
        });
        Ok(())
    }

    /// Adds either kind of graph (see [`ContextBuilder::add_graph`] and
    /// [`ContextBuilder::add_generic`]).
    pub fn add_stored(&mut self, name: &str, graph: &StoredGraph) -> Result<()> {
        match graph {
            StoredGraph::Program(p) => self.add_graph(name, p),
            StoredGraph::Generic(g) => self.add_generic(name, g),
        }
    }

    /// `Err(InvalidArgument)` if `name` is empty or taken or `target` is not the file's.
    fn check_new(&self, name: &str, target: Target) -> Result<()> {
        if name.is_empty() {
            crate::bail!(InvalidArgument, "a graph in a kiln context binary needs a name");
        }
        if self.graphs.iter().any(|g| g.name == name) {
            crate::bail!(InvalidArgument, "graph '{name}' is already in this kiln context binary");
        }
        if target != self.target {
            crate::bail!(
                InvalidArgument,
                "graph '{name}' was compiled for {target} but this kiln context binary is for {}",
                self.target
            );
        }
        Ok(())
    }

    pub fn graph_names(&self) -> Vec<String> {
        self.graphs.iter().map(|g| g.name.clone()).collect()
    }

    pub fn is_empty(&self) -> bool {
        self.graphs.is_empty()
    }

    /// The id of a stored weight equal to `c` (dtype, shape, bytes), adding it if new.
    fn intern(&mut self, c: &Constant) -> Result<u32> {
        let hash = xxh3_128(c.data.as_bytes());
        let same = |p: &Pending| {
            p.dtype == c.dtype && p.packing == c.packing && p.shape == c.shape && p.data.as_bytes() == c.data.as_bytes()
        };
        let candidates = self.by_hash.entry(hash).or_default();
        if let Some(&i) = candidates.iter().find(|&&i| same(&self.weights[i])) {
            return Ok(i as u32);
        }
        let id = u32::try_from(self.weights.len())
            .map_err(|_| Error::invalid_argument("too many weights for one kiln context binary"))?;
        candidates.push(self.weights.len());
        self.weights.push(Pending {
            dtype: c.dtype,
            packing: c.packing,
            shape: c.shape.clone(),
            hash,
            data: c.data.clone(),
        });
        Ok(id)
    }

    /// Data-region offset of each weight: packed in order, each 64-aligned.
    fn layout(&self) -> Result<(Vec<u64>, u64)> {
        let mut offsets = Vec::with_capacity(self.weights.len());
        let mut end = 0u64;
        for w in &self.weights {
            let start = align_up(end).ok_or_else(too_big)?;
            offsets.push(start);
            end = start.checked_add(w.data.byte_len() as u64).ok_or_else(too_big)?;
        }
        Ok((offsets, end))
    }

    fn metadata(&self, offsets: &[u64]) -> proto::Metadata {
        let weights = self
            .weights
            .iter()
            .zip(offsets)
            .map(|(w, &offset)| proto::WeightInfo {
                offset,
                byte_length: w.data.byte_len() as u64,
                dtype: w.dtype.onnx_code(),
                shape: convert::dims(&w.shape),
                content_hash: w.hash.to_le_bytes().to_vec(),
                gemm_packed: match w.packing {
                    Packing::None => None,
                    Packing::GemmB { k, n } => Some(proto::GemmPacking {
                        k: k as u64,
                        n: n as u64,
                    }),
                },
            })
            .collect();
        proto::Metadata {
            kiln_version: KILN_VERSION.to_string(),
            target: self.target.name().to_string(),
            weights,
            graphs: self.graphs.clone(),
            context_models: self.context_models.clone(),
        }
    }

    /// The data region as chunks: zero padding, then each weight's bytes.
    fn data_chunks<'a>(&'a self, offsets: &'a [u64]) -> impl Iterator<Item = &'a [u8]> + 'a {
        const ZEROS: [u8; STORAGE_ALIGN] = [0; STORAGE_ALIGN];
        let mut end = 0u64;
        self.weights.iter().zip(offsets).flat_map(move |(w, &start)| {
            // Padding is below 64 bytes: `layout` aligned `start` up from `end`.
            let pad = &ZEROS[..(start - end) as usize];
            end = start + w.data.byte_len() as u64;
            [pad, w.data.as_bytes()]
        })
    }

    pub fn write_to(&self, out: &mut dyn Write) -> Result<WriteStats> {
        let (offsets, data_len) = self.layout()?;
        let metadata = self.metadata(&offsets).encode_to_vec();
        let sum = checksum(&metadata, self.data_chunks(&offsets));
        let header = Header::for_sections(metadata.len() as u64, data_len, sum)?;
        let gap = (header.data_offset as usize) - header.metadata_range().end;
        let write = |out: &mut dyn Write, bytes: &[u8]| {
            out.write_all(bytes)
                .map_err(|e| Error::fail(format!("writing kiln context binary: {e}")))
        };
        write(out, &header.to_bytes())?;
        write(out, &metadata)?;
        write(out, &[0; STORAGE_ALIGN][..gap])?;
        for chunk in self.data_chunks(&offsets) {
            write(out, chunk)?;
        }
        Ok(WriteStats {
            graphs: self.graphs.len(),
            weights: self.weights.len(),
            weight_bytes_referenced: self.weight_bytes_referenced,
            weight_bytes_stored: self.weights.iter().map(|w| w.data.byte_len() as u64).sum(),
            file_bytes: header.file_len(),
            checksum: sum,
        })
    }

    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let mut out = Vec::new();
        self.write_to(&mut out)?;
        Ok(out)
    }
}

fn too_big() -> Error {
    Error::fail("kiln context binary would exceed 2^64 bytes")
}
