//! Shape-generic partitions: what Compile keeps of a partition whose graph
//! has symbolic dims, so that one compiled model serves every input shape.
//!
//! A [`GenericGraph`] holds the partition as ORT described it (with its
//! symbolic dims), the constants it reads, and its GEMM weights packed once
//! for the target. A concrete [`Program`](crate::plan::Program) is built from
//! it for each new input shape signature at run time (see `ep::compile`),
//! reusing the packed weights.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};
use crate::ir::{AttrValue, ConstantSource, DType, GraphDesc, TensorValue, ValueDesc};
use crate::kernels::gemm::PackedB;
use crate::plan::{Program, Weight};
use crate::target::Target;
use crate::tensor::{Dim, DimsDisplay};

/// A constant initializer the partition reads, by its ONNX name.
#[derive(Clone, Debug)]
pub struct NamedConstant {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<usize>,
    /// Row-major bytes in `dtype`.
    pub data: Weight,
}

impl NamedConstant {
    /// A copy as the ORT-neutral constant the importer folds with.
    pub fn to_tensor_value(&self) -> TensorValue {
        TensorValue {
            elem_type: self.dtype.onnx_code(),
            shape: self.shape.clone(),
            bytes: self.data.as_bytes().to_vec(),
        }
    }
}

/// A constant packed once as a GEMM B operand (`kernels::gemm::PackedB`
/// for `target`): `source` names the [`NamedConstant`] it packs, `trans_b`
/// whether that constant is `[n, k]` rather than `[k, n]`.
#[derive(Clone, Debug)]
pub struct PackedConstant {
    pub source: String,
    pub trans_b: bool,
    /// Convolution weights (issue #13): this group's `[kh·kw·Ci/g, Co/g]`
    /// B in `kernels::conv::pack_groups`'s order (`trans_b` is then true).
    pub conv_group: Option<usize>,
    pub k: usize,
    pub n: usize,
    pub data: Weight,
}

/// A partition compiled for every input shape its graph accepts.
#[derive(Clone, Debug)]
pub struct GenericGraph {
    /// The partition (topological nodes, value types with symbolic dims and
    /// their `dim_params`, inputs and outputs in the fused node's order).
    pub desc: GraphDesc,
    pub constants: Vec<NamedConstant>,
    pub packed: Vec<PackedConstant>,
    pub target: Target,
    /// Whether its specialisations may run 3×3 convolutions as Winograd's
    /// (the `winograd` option when it was compiled).
    pub winograd: bool,
}

/// GEMM weights packed ahead of lowering, found again by the identity of
/// the constant they pack (its bytes' address and length, which every
/// specialisation of one partition shares) and the product's layout.
#[derive(Default)]
pub struct PackedWeights {
    by_source: HashMap<PackKey, Weight>,
    /// Convolution weights (boxed: a specialiser is a variant of
    /// `Executable` beside a program).
    conv: Box<ConvPacks>,
}

/// [`PackedWeights`]' convolution weights.
#[derive(Default)]
struct ConvPacks {
    /// One pack per group: key (source, group, k, n).
    groups: HashMap<(PackKey, usize), Weight>,
    /// Winograd-transformed weights (`kernels::winograd::pack`), made by the
    /// first specialisation that picks them: whether a convolution runs as
    /// Winograd's depends on the image size, the transformed weights only
    /// through the tile size, part of the key (a new YOLOv8n size spent
    /// 10–20 ms transforming them again).
    winograd: std::sync::Mutex<HashMap<(PackKey, usize), Vec<Weight>>>,
}

impl PackedWeights {
    pub fn insert(&mut self, source: &Weight, trans_b: bool, k: usize, n: usize, packed: Weight) {
        self.by_source.insert(key(source, trans_b, k, n), packed);
    }

    /// Group `group` of convolution weights `source` packed as `[k, n]`
    /// (`kernels::conv::pack_groups`).
    pub fn insert_conv(&mut self, source: &Weight, group: usize, k: usize, n: usize, packed: Weight) {
        self.conv.groups.insert((key(source, true, k, n), group), packed);
    }

    pub fn get_conv(&self, source: &Weight, group: usize, k: usize, n: usize) -> Option<Weight> {
        self.conv.groups.get(&(key(source, true, k, n), group)).cloned()
    }

    /// The Winograd packs of convolution weights `source` (`[co, ci, 3, 3]`),
    /// made by `make` the first time.
    pub fn winograd(
        &self,
        source: &Weight,
        (ci, co, tile): (usize, usize, usize),
        make: impl FnOnce() -> Result<Vec<Weight>>,
    ) -> Result<Vec<Weight>> {
        let mut cache = self.conv.winograd.lock().unwrap_or_else(|e| e.into_inner());
        let k = (key(source, false, ci, co), tile);
        if let Some(packs) = cache.get(&k) {
            return Ok(packs.clone());
        }
        let packs = make()?;
        cache.insert(k, packs.clone());
        Ok(packs)
    }

    /// The packed form of `source` for a `[k, n]` product, if packed before.
    pub fn get(&self, source: &Weight, trans_b: bool, k: usize, n: usize) -> Option<Weight> {
        self.by_source.get(&key(source, trans_b, k, n)).cloned()
    }
}

/// A packed weight's identity: its source's address and length, `trans_b`, `k`, `n`.
type PackKey = (usize, usize, bool, usize, usize);

fn key(w: &Weight, trans_b: bool, k: usize, n: usize) -> PackKey {
    (w.as_bytes().as_ptr() as usize, w.byte_len(), trans_b, k, n)
}

impl GenericGraph {
    /// Keeps `desc` (a partition kiln's check accepted) with the constants
    /// its nodes read, copied out of `consts`, and packs its constant GEMM
    /// weights for `target` once.
    pub fn build(desc: GraphDesc, consts: &dyn ConstantSource, target: Target) -> Result<GenericGraph> {
        let mut constants: Vec<NamedConstant> = Vec::new();
        let mut seen = HashSet::new();
        let names = desc.nodes.iter().flat_map(|n| n.inputs.iter()).chain(&desc.outputs);
        for name in names {
            if name.is_empty() || !consts.is_constant(name) || !seen.insert(name.clone()) {
                continue;
            }
            let t = consts
                .constant(name)?
                .ok_or_else(|| Error::invalid_graph(format!("constant '{name}' is missing")))?;
            let Some(dtype) = DType::from_onnx(t.elem_type) else {
                // Not a type kiln computes with: the import will say so if it is read.
                continue;
            };
            constants.push(NamedConstant {
                name: name.clone(),
                dtype,
                shape: t.shape,
                data: Weight::from_bytes(&t.bytes),
            });
        }
        let mut desc = desc;
        super::conv_affine::fold(&mut desc, &mut constants);
        let packed = pack_gemm_weights(&desc, &constants, target);
        Ok(GenericGraph {
            desc,
            constants,
            packed,
            target,
            winograd: true,
        })
    }

    /// Names of the partition's inputs with their declared dims, e.g.
    /// `input_ids [batch_size,sequence_length]`, for messages.
    pub fn input_label(&self, i: usize) -> String {
        let name = &self.desc.inputs[i];
        match self.desc.values.get(name) {
            Some(v) => format!("'{name}' {}", dims_label(v)),
            None => format!("'{name}'"),
        }
    }
}

/// `[batch,3,?,640]`: dim names, known sizes, `?` for unnamed unknowns.
pub fn dims_label(v: &ValueDesc) -> String {
    let Some(dims) = &v.dims else {
        return "(unknown rank)".into();
    };
    let parts: Vec<String> = dims
        .iter()
        .enumerate()
        .map(|(i, &d)| match v.dim_param(i) {
            Some(p) => p.to_string(),
            None if d >= 0 => d.to_string(),
            None => "?".into(),
        })
        .collect();
    format!("[{}]", parts.join(","))
}

/// Packs the constant B operands of `MatMul` and `Gemm` (2-D, f32): the
/// weights of every transformer and MLP layer.
fn pack_gemm_weights(desc: &GraphDesc, constants: &[NamedConstant], target: Target) -> Vec<PackedConstant> {
    let by_name: HashMap<&str, &NamedConstant> = constants.iter().map(|c| (c.name.as_str(), c)).collect();
    let mut out: Vec<PackedConstant> = Vec::new();
    for node in &desc.nodes {
        if matches!(node.domain.as_str(), "" | "ai.onnx") && matches!(node.op_type.as_str(), "LSTM" | "GRU") {
            pack_recurrent_weights(node, &by_name, target, &mut out);
            continue;
        }
        if matches!(node.domain.as_str(), "" | "ai.onnx") && node.op_type == "Conv" {
            pack_conv_weights(node, &by_name, target, &mut out);
            continue;
        }
        let trans_b = match (node.domain.as_str(), node.op_type.as_str()) {
            ("" | "ai.onnx", "MatMul") => false,
            ("" | "ai.onnx", "Gemm") => matches!(node.attrs.get("transB"), Some(AttrValue::Int(t)) if *t != 0),
            _ => continue,
        };
        let Some(c) = node.inputs.get(1).and_then(|b| by_name.get(b.as_str())) else {
            continue;
        };
        if c.dtype != DType::F32 || c.shape.len() != 2 || c.data.byte_len() != c.shape[0] * c.shape[1] * 4 {
            continue;
        }
        if out.iter().any(|p| p.source == c.name && p.trans_b == trans_b) {
            continue;
        }
        let (k, n) = if trans_b {
            (c.shape[1], c.shape[0])
        } else {
            (c.shape[0], c.shape[1])
        };
        let Ok(pb) = PackedB::try_pack(target, c.data.as_slice(), k, n, trans_b) else {
            continue;
        };
        out.push(PackedConstant {
            source: c.name.clone(),
            trans_b,
            conv_group: None,
            k,
            n,
            data: pb.data().clone(),
        });
    }
    out
}

/// A recurrent layer's constant `W [dirs, gates * hidden, input]`, packed
/// whole as lowering packs it (`[n, k]` rows: `trans_b`), and its `R` when
/// lowering packs that whole too (one direction, one part; see
/// `RnnCell::r_part_rows`). Other `R`s are packed per specialisation.
fn pack_recurrent_weights(
    node: &crate::ir::NodeDesc,
    by_name: &HashMap<&str, &NamedConstant>,
    target: Target,
    out: &mut Vec<PackedConstant>,
) {
    let gru_split = node.op_type == "GRU" && !matches!(node.attrs.get("linear_before_reset"), Some(AttrValue::Int(1)));
    for (k_in, whole_r) in [(1, false), (2, true)] {
        let Some(c) = node.inputs.get(k_in).and_then(|b| by_name.get(b.as_str())) else {
            continue;
        };
        let [dirs, rows, k] = c.shape[..] else { continue };
        if c.dtype != DType::F32 || whole_r && (dirs != 1 || gru_split) {
            continue;
        }
        let n = dirs * rows;
        if out
            .iter()
            .any(|p| p.source == c.name && p.trans_b && p.k == k && p.n == n)
        {
            continue;
        }
        let Ok(pb) = PackedB::try_pack(target, c.data.as_slice(), k, n, true) else {
            continue;
        };
        out.push(PackedConstant {
            source: c.name.clone(),
            trans_b: true,
            conv_group: None,
            k,
            n,
            data: pb.data().clone(),
        });
    }
}

/// A convolution's constant weights `[Co, Ci/g, kh(, kw)]`, one pack per
/// group as lowering packs them (`kernels::conv::pack_groups`), so that no
/// image size packs them again. Depthwise weights (one input channel per
/// group, as many groups as channels) are only reordered, per
/// specialisation: lowering does not pack them.
fn pack_conv_weights(
    node: &crate::ir::NodeDesc,
    by_name: &HashMap<&str, &NamedConstant>,
    target: Target,
    out: &mut Vec<PackedConstant>,
) {
    let Some(c) = node.inputs.get(1).and_then(|w| by_name.get(w.as_str())) else {
        return;
    };
    let groups = match node.attrs.get("group") {
        None => 1,
        Some(AttrValue::Int(g)) if *g >= 1 => *g as usize,
        Some(_) => return,
    };
    if c.dtype != DType::F32 || !(3..=4).contains(&c.shape.len()) || out.iter().any(|p| p.source == c.name) {
        return;
    }
    let (co, cig) = (c.shape[0], c.shape[1]);
    let taps: usize = c.shape[2..].iter().product();
    if !co.is_multiple_of(groups) || (cig == 1 && groups == co) {
        return;
    }
    let Ok(packs) = crate::kernels::conv::pack_groups(target, c.data.as_slice(), co, cig, taps, groups) else {
        return;
    };
    for (g, pb) in packs.into_iter().enumerate() {
        out.push(PackedConstant {
            source: c.name.clone(),
            trans_b: true,
            conv_group: Some(g),
            k: pb.k(),
            n: pb.n(),
            data: pb.data().clone(),
        });
    }
}

/// How many programs (input shape signatures) a partition keeps by default.
pub const DEFAULT_SHAPE_CACHE: usize = 8;

/// Builds and caches the concrete programs of one [`GenericGraph`].
pub struct Specializer {
    generic: GenericGraph,
    index: HashMap<String, usize>,
    packs: PackedWeights,
    cache: Mutex<Lru>,
    /// Scratch arenas every program of the partition runs in.
    scratch: Arc<crate::plan::ScratchPool>,
}

/// The most recently used programs, by input dims (newest last).
struct Lru {
    capacity: usize,
    entries: Vec<(Vec<Vec<i64>>, Arc<Program>)>,
}

impl Lru {
    fn get<D: AsRef<[i64]>>(&mut self, dims: &[D]) -> Option<Arc<Program>> {
        let same = |d: &[Vec<i64>]| d.len() == dims.len() && d.iter().zip(dims).all(|(a, b)| a[..] == *b.as_ref());
        let i = self.entries.iter().position(|(d, _)| same(d))?;
        let entry = self.entries.remove(i);
        let p = entry.1.clone();
        self.entries.push(entry);
        Some(p)
    }

    fn put(&mut self, dims: Vec<Vec<i64>>, p: Arc<Program>) {
        if self.entries.iter().any(|(d, _)| *d == dims) {
            return;
        }
        if self.entries.len() >= self.capacity.max(1) {
            self.entries.remove(0);
        }
        self.entries.push((dims, p));
    }
}

impl Specializer {
    /// `capacity`: how many input shape signatures keep their program.
    pub fn new(generic: GenericGraph, capacity: usize) -> Result<Specializer> {
        let index: HashMap<String, usize> = generic
            .constants
            .iter()
            .enumerate()
            .map(|(i, c)| (c.name.clone(), i))
            .collect();
        let mut packs = PackedWeights::default();
        for p in &generic.packed {
            let &i = index
                .get(&p.source)
                .ok_or_else(|| Error::invalid_graph(format!("packed weight of '{}' names no constant", p.source)))?;
            match p.conv_group {
                Some(g) => packs.insert_conv(&generic.constants[i].data, g, p.k, p.n, p.data.clone()),
                None => packs.insert(&generic.constants[i].data, p.trans_b, p.k, p.n, p.data.clone()),
            }
        }
        Ok(Specializer {
            generic,
            index,
            packs,
            cache: Mutex::new(Lru {
                capacity,
                entries: Vec::new(),
            }),
            scratch: Arc::default(),
        })
    }

    pub fn generic(&self) -> &GenericGraph {
        &self.generic
    }

    /// The program for inputs of these dims (the partition's input order),
    /// built on first use and cached.
    pub fn program_for<D: AsRef<[i64]>>(&self, dims: &[D]) -> Result<(Arc<Program>, bool)> {
        if let Some(p) = self.lock().get(dims) {
            return Ok((p, false));
        }
        let dims: Vec<Vec<i64>> = dims.iter().map(|d| d.as_ref().to_vec()).collect();
        // Built outside the lock: other shapes keep running meanwhile.
        let p = Arc::new(self.specialize(&dims)?);
        self.lock().put(dims, p.clone());
        Ok((p, true))
    }

    /// Programs currently cached.
    pub fn cached(&self) -> usize {
        self.lock().entries.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Lru> {
        // A panic while holding the lock leaves a consistent cache.
        self.cache.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Compiles the partition for concrete input dims.
    pub fn specialize(&self, dims: &[Vec<i64>]) -> Result<Program> {
        let g = &self.generic;
        if dims.len() != g.desc.inputs.len() {
            return Err(Error::invalid_argument(format!(
                "the partition has {} inputs, {} were given",
                g.desc.inputs.len(),
                dims.len()
            )));
        }
        let mut desc = g.desc.clone();
        for (i, (name, d)) in g.desc.inputs.iter().zip(dims).enumerate() {
            let declared = g.desc.values.get(name).cloned().unwrap_or_default();
            check_declared(&declared.symbolic_dims(name), d).map_err(|why| {
                Error::invalid_argument(format!("input {} cannot be {d:?}: {why}", g.input_label(i),))
            })?;
            let v = desc.values.entry(name.clone()).or_default();
            v.dims = Some(d.clone());
        }
        let source = Source { g, index: &self.index };
        let ir = crate::compiler::import(&desc, &source)?;
        let mut p = super::compile_with_packs(&ir, g.target, &self.packs, g.winograd)?;
        p.share_scratch(self.scratch.clone());
        Ok(p)
    }
}

/// Checks one input's run-time `dims` against its declared dims: ranks and
/// known sizes must match. Symbols are not bound across inputs: ORT does not
/// enforce a `dim_param` (exporters name unrelated dims alike, e.g. `?` for
/// both H and W), so the import at the real sizes decides, as ORT's kernels would.
fn check_declared(declared: &Option<Vec<Dim>>, dims: &[i64]) -> std::result::Result<(), String> {
    let Some(declared) = declared else {
        return Ok(());
    };
    let fits = declared.len() == dims.len()
        && declared
            .iter()
            .zip(dims)
            .all(|(want, &got)| want.as_known().is_none_or(|k| k == got));
    if fits {
        Ok(())
    } else {
        Err(format!("the model declares {}", DimsDisplay(declared)))
    }
}

/// The generic graph's constants as the importer reads them.
struct Source<'a> {
    g: &'a GenericGraph,
    index: &'a HashMap<String, usize>,
}

impl Source<'_> {
    fn get(&self, name: &str) -> Option<&NamedConstant> {
        self.index.get(name).map(|&i| &self.g.constants[i])
    }
}

impl ConstantSource for Source<'_> {
    fn is_constant(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    fn constant(&self, name: &str) -> Result<Option<TensorValue>> {
        Ok(self.get(name).map(NamedConstant::to_tensor_value))
    }

    fn weight(&self, name: &str) -> Option<Weight> {
        self.get(name).map(|c| c.data.clone())
    }
}

/// What Compile produces for a partition: one program when every shape is
/// static, or a shape-generic graph specialised at run time.
pub enum Executable {
    Fixed(Program),
    Generic(Specializer),
}

impl Executable {
    pub fn input_names(&self) -> Vec<String> {
        match self {
            Executable::Fixed(p) => p.inputs().iter().map(|s| s.name.clone()).collect(),
            Executable::Generic(s) => s.generic.desc.inputs.clone(),
        }
    }

    pub fn output_names(&self) -> Vec<String> {
        match self {
            Executable::Fixed(p) => p.outputs().iter().map(|s| s.name.clone()).collect(),
            Executable::Generic(s) => s.generic.desc.outputs.clone(),
        }
    }

    /// One line for logs and EPContext notes.
    pub fn summary(&self) -> String {
        match self {
            Executable::Fixed(p) => format!(
                "{}; {} steps; {} weight bytes; {} scratch bytes",
                p.op_summary(),
                p.num_steps(),
                p.constant_bytes(),
                p.arena_bytes()
            ),
            Executable::Generic(s) => s.generic.summary(),
        }
    }

    /// Scratch bytes when known before run time.
    pub fn arena_bytes(&self) -> Option<usize> {
        match self {
            Executable::Fixed(p) => Some(p.arena_bytes()),
            Executable::Generic(_) => None,
        }
    }
}

impl GenericGraph {
    /// Every constant, copied, by name (for tools and tests that import the
    /// graph themselves).
    pub fn constant_values(&self) -> HashMap<String, TensorValue> {
        self.constants
            .iter()
            .map(|c| (c.name.clone(), c.to_tensor_value()))
            .collect()
    }

    /// One line for logs, EPContext notes and tools, e.g. `shape-generic for
    /// x86_64-avx2 over batch, seq; ops MatMul x1, Relu x1; 2 nodes; 1
    /// constant(s) of 64 bytes; 1 packed weight(s) of 128 bytes`, and
    /// `; winograd off` if compiled so.
    pub fn summary(&self) -> String {
        let mut symbols: Vec<String> = Vec::new();
        for name in &self.desc.inputs {
            if let Some(v) = self.desc.values.get(name) {
                for (i, &d) in v.dims.iter().flatten().enumerate() {
                    let s = v.dim_param(i).map(str::to_string).unwrap_or_else(|| "?".into());
                    if d < 0 && !symbols.contains(&s) {
                        symbols.push(s);
                    }
                }
            }
        }
        let mut ops: BTreeMap<&str, usize> = BTreeMap::new();
        for n in &self.desc.nodes {
            *ops.entry(n.op_type.as_str()).or_default() += 1;
        }
        let ops: Vec<String> = ops.iter().map(|(op, n)| format!("{op} x{n}")).collect();
        format!(
            "shape-generic for {} over {}; ops {}; {} nodes; {} constant(s) of {} bytes; {} packed weight(s) of {} bytes{}",
            self.target,
            if symbols.is_empty() {
                "no dims".to_string()
            } else {
                symbols.join(", ")
            },
            ops.join(", "),
            self.desc.nodes.len(),
            self.constants.len(),
            self.constants.iter().map(|c| c.data.byte_len()).sum::<usize>(),
            self.packed.len(),
            self.packed.iter().map(|p| p.data.byte_len()).sum::<usize>(),
            if self.winograd { "" } else { "; winograd off" },
        )
    }

    /// Whether every partition input has a static shape (then one program
    /// serves every run).
    pub fn is_static(desc: &GraphDesc) -> bool {
        desc.inputs.iter().all(|name| {
            desc.values
                .get(name)
                .and_then(|v| v.dims.as_ref())
                .is_some_and(|d| d.iter().all(|&x| x >= 0))
        })
    }
}
