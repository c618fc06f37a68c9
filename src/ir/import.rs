//! From ORT-neutral descriptions to kiln's IR.
//!
//! [`check_support`] and [`import`] run the same translation: each ONNX node
//! becomes zero or more IR nodes with static types that kiln infers itself
//! (and checks against ORT's where ORT knows them). Nodes whose inputs are
//! all known constants — shape arithmetic, `Shape` of a static shape,
//! `Constant`, `ConstantOfShape` — are evaluated on the spot, so a
//! `Shape → Gather → Unsqueeze → Concat → Reshape` chain over static shapes
//! costs nothing and never splits a partition. Large initializers are only
//! read when a value is needed (import), never just to judge support.
//!
//! This file holds the importer's core (values, constants, folding, probe
//! sizes); what each op becomes is in its entry of the op registry
//! ([`super::ops`]), which [`Importer::node`] dispatches through.

use std::collections::HashMap;

use super::desc::{ConstantSource, GraphDesc, NodeDesc};
use super::ops;
use super::{infer, onnx_type_name, DType, Graph, Op, Tensor, TensorType, ValueId};
use crate::error::{Error, Result};
use crate::tensor::Dim;

/// Why a node is not supported (or an import failed), for the user.
pub(super) type Why = String;

/// Constants above this many elements are not read just to fold them.
pub(super) const FETCH_LIMIT: usize = 1 << 16;

/// Evaluates an IR op on known inputs while importing (shape arithmetic,
/// small constants). The compiler provides it (`compiler::KernelFold`, the
/// run-time kernels, so folding and running agree bit for bit): `ir` sits
/// above the compiler and does not call it.
pub trait Fold {
    fn eval(&self, op: &Op, inputs: &[&Tensor], outputs: &[TensorType]) -> Result<Vec<Tensor>>;
}

/// For each node of `graph` (same order): `Ok` if kiln can run it exactly,
/// `Err(reason)` if not. `disabled` lists op types the user excluded.
pub fn check_support(
    graph: &GraphDesc,
    constants: &dyn ConstantSource,
    disabled: &[String],
    fold: &dyn Fold,
) -> Vec<std::result::Result<(), String>> {
    let mut verdicts = check_family(graph, constants, disabled, fold, 1);
    if Probe::dynamic(graph) && verdicts.iter().any(|v| v.is_err()) {
        // Detectors and segmenters only accept image sizes that their
        // strides divide (an upsampled level is concatenated with the one
        // above it): a node refused at odd sizes is checked again at
        // multiples of 32. Either family passing is a size at which the
        // node runs; at run time the real sizes decide, as in ORT.
        let strided = check_family(graph, constants, disabled, fold, STRIDED_PROBE);
        for (v, s) in verdicts.iter_mut().zip(strided) {
            if s.is_ok() {
                *v = Ok(());
            }
        }
    }
    leave_f16_casts_beside_ort(graph, &mut verdicts);
    verdicts
}

/// The multiple of the second family of probe sizes (see [`check_support`]).
const STRIDED_PROBE: i64 = 32;

/// A node's verdict over one family of probes: `Ok` only if it imports at
/// every probe of the family.
fn check_family(
    graph: &GraphDesc,
    constants: &dyn ConstantSource,
    disabled: &[String],
    fold: &dyn Fold,
    scale: i64,
) -> Vec<std::result::Result<(), String>> {
    let mut verdicts = vec![Ok(()); graph.nodes.len()];
    for probe in &Probe::for_graph(graph, scale) {
        for (v, r) in verdicts
            .iter_mut()
            .zip(check_at(graph, constants, disabled, probe, fold))
        {
            if v.is_ok() {
                *v = r;
            }
        }
    }
    verdicts
}

/// A Cast whose float16 side touches a node left to ORT stays with ORT too.
/// ORT's CPU EP runs most float16 ops by casting their inputs to float and
/// their outputs back, then drops each `float -> float16 -> float` pair of
/// Casts it owns, so ORT alone computes such a node on unrounded floats.
/// Were kiln to run the model's Cast, the pair would not be ORT's to drop
/// and the values would be rounded to float16 in between: a different result.
fn leave_f16_casts_beside_ort(graph: &GraphDesc, verdicts: &mut [std::result::Result<(), String>]) {
    let links = graph.links();
    let is_f16 = |name: &str| {
        graph
            .values
            .get(name)
            .is_some_and(|v| v.elem_type == DType::F16.onnx_code())
    };
    let left: Vec<bool> = verdicts.iter().map(|v| v.is_err()).collect();
    for (i, n) in graph.nodes.iter().enumerate() {
        if n.op_type != "Cast" || left[i] {
            continue;
        }
        let (Some(x), Some(y)) = (n.inputs.first(), n.outputs.first()) else {
            continue;
        };
        let beside = |name: &str| {
            let from = links.producer.get(name).filter(|&&p| left[p]);
            let to = links.consumers_of(name).iter().find(|&&c| left[c]);
            from.or(to).map(|&k| graph.nodes[k].name.clone())
        };
        let ort_node = match (is_f16(x), is_f16(y)) {
            (true, _) => beside(x),
            (_, true) => beside(y),
            _ => None,
        };
        if let Some(other) = ort_node {
            verdicts[i] = Err(format!(
                "its float16 side meets node '{other}', which ORT runs: ORT's CPU EP drops the Cast \
                 pairs around float16 ops it computes in float, which it cannot do with a Cast kiln runs"
            ));
        }
    }
}

/// One pass of [`check_support`] with the graph's unknown dims at `probe`'s sizes.
fn check_at(
    graph: &GraphDesc,
    constants: &dyn ConstantSource,
    disabled: &[String],
    probe: &Probe,
    fold: &dyn Fold,
) -> Vec<std::result::Result<(), String>> {
    let mut imp = Importer::new(graph, constants, true, fold);
    imp.probe = Some(probe);
    graph
        .nodes
        .iter()
        .map(|n| {
            let r = if disabled.iter().any(|d| d == &n.op_type) {
                Err("disabled by the kiln option disabled_ops".to_string())
            } else {
                imp.node(n)
            };
            if r.is_err() {
                imp.forget_outputs(n);
            }
            r
        })
        .collect()
}

/// Sizes given to a graph's unknown dims while kiln checks it: the same
/// size for every dim of one `dim_param`, a different one for each other
/// symbol and each unnamed dim. Every node is checked at two such sets of
/// sizes (distinct primes, so no size is a product or multiple of another
/// by accident): what imports at both is what kiln claims, and at run time
/// the partition is compiled for the real sizes. Ranks never depend on the
/// sizes, so a tensor of unknown rank stays unclaimed.
pub struct Probe {
    first: i64,
    /// Every size is a multiple of this (1, or [`STRIDED_PROBE`]).
    scale: i64,
    named: std::cell::RefCell<HashMap<String, i64>>,
    next: std::cell::Cell<usize>,
}

const PROBE_PRIMES: [i64; 2 * PROBE_SYMBOLS] = {
    // 17, 19, 23, ... : the first 2 * PROBE_SYMBOLS primes from 17 on.
    let mut out = [0i64; 2 * PROBE_SYMBOLS];
    let mut n = 17i64;
    let mut k = 0;
    while k < out.len() {
        let mut d = 2;
        let mut prime = true;
        while d * d <= n {
            if n % d == 0 {
                prime = false;
            }
            d += 1;
        }
        if prime {
            out[k] = n;
            k += 1;
        }
        n += 1;
    }
    out
};

/// Distinct sizes per probe; symbols beyond it reuse sizes (still valid sizes).
const PROBE_SYMBOLS: usize = 64;

impl Probe {
    /// Whether the graph has a dim of unknown size (or a value of unknown rank).
    fn dynamic(graph: &GraphDesc) -> bool {
        graph
            .values
            .values()
            .any(|v| v.dims.as_ref().is_none_or(|d| d.iter().any(|&x| x < 0)))
    }

    /// No probe for a graph without unknown dims; else two, whose sizes
    /// are multiples of `scale`.
    fn for_graph(graph: &GraphDesc, scale: i64) -> Vec<Probe> {
        let sets: &[i64] = if Probe::dynamic(graph) { &[0, 1] } else { &[0] };
        sets.iter()
            .map(|&first| Probe {
                first,
                scale,
                named: Default::default(),
                next: Default::default(),
            })
            .collect()
    }

    fn fresh(&self) -> i64 {
        let k = self.next.get();
        self.next.set(k + 1);
        PROBE_PRIMES[(k % PROBE_SYMBOLS) * 2 + self.first as usize] * self.scale
    }

    /// The size of a symbolic dim at this probe: each symbol gets its own
    /// prime on first sight.
    fn size(&self, dim: &Dim) -> i64 {
        let value_of = |symbol: &str| {
            if let Some(&s) = self.named.borrow().get(symbol) {
                return Some(s);
            }
            let s = self.fresh();
            self.named.borrow_mut().insert(symbol.to_string(), s);
            Some(s)
        };
        dim.eval(&value_of).unwrap_or(1)
    }
}

/// Builds the IR of one partition: `graph.inputs`/`outputs` in the fused
/// node's order; constant initializers come from `constants`.
pub fn import(graph: &GraphDesc, constants: &dyn ConstantSource, fold: &dyn Fold) -> Result<Graph> {
    let mut imp = Importer::new(graph, constants, false, fold);
    for name in &graph.inputs {
        let ty = imp
            .desc_type(name)
            .map_err(|why| Error::invalid_graph(format!("partition input '{name}' {why}")))?;
        let id = imp.g.add_value(name, ty)?;
        imp.ids.insert(name.clone(), id);
        imp.g.inputs.push(id);
    }
    for n in &graph.nodes {
        imp.node(n)
            .map_err(|why| Error::invalid_graph(format!("node '{}' ({}): {why}", n.name, n.op_type)))?;
    }
    imp.finish()
}

/// The state of one import: the IR built so far, which ONNX value is which
/// IR value, and what is known of their contents. Op families (`super::ops`)
/// build on its methods.
pub(super) struct Importer<'a> {
    desc: &'a GraphDesc,
    /// Sizes for unknown dims of values the checked nodes read (check only).
    probe: Option<&'a Probe>,
    consts: &'a dyn ConstantSource,
    fold: &'a dyn Fold,
    check_only: bool,
    g: Graph,
    ids: HashMap<String, ValueId>,
    /// Values whose contents are known (folded or read constants).
    data: HashMap<ValueId, Tensor>,
    /// Constant initializers not read yet.
    lazy: HashMap<ValueId, String>,
}

/// A constant tensor as kiln's host [`Tensor`].
pub(super) fn tensor_of(t: &super::desc::TensorValue) -> std::result::Result<Tensor, Why> {
    let dtype =
        DType::from_onnx(t.elem_type).ok_or_else(|| format!("a constant is {}", onnx_type_name(t.elem_type)))?;
    Tensor::from_bytes(dtype, &t.shape, &t.bytes).map_err(|e| e.message)
}

impl<'a> Importer<'a> {
    fn new(desc: &'a GraphDesc, consts: &'a dyn ConstantSource, check_only: bool, fold: &'a dyn Fold) -> Self {
        Importer {
            desc,
            fold,
            probe: None,
            consts,
            check_only,
            g: Graph::new("partition"),
            ids: HashMap::new(),
            data: HashMap::new(),
            lazy: HashMap::new(),
        }
    }

    /// kiln's static type for a value ORT describes, or why there is none.
    fn desc_type(&self, name: &str) -> std::result::Result<TensorType, Why> {
        let (dtype, dims) = self.desc_dims(name)?;
        let shape: Option<Vec<usize>> = dims.iter().map(|&x| usize::try_from(x).ok()).collect();
        let shape = shape.ok_or_else(|| format!("'{name}' has dynamic shape {dims:?}"))?;
        Ok(TensorType { dtype, shape })
    }

    /// ORT's element type and dims (-1 unknown) of a value.
    fn desc_dims(&self, name: &str) -> std::result::Result<(DType, &'a [i64]), Why> {
        let d = self
            .desc
            .values
            .get(name)
            .ok_or_else(|| format!("'{name}' has no type information"))?;
        let dtype = DType::from_onnx(d.elem_type).ok_or_else(|| {
            if d.elem_type == 0 {
                format!("'{name}' is not a tensor of known type")
            } else {
                format!("'{name}' is {}", onnx_type_name(d.elem_type))
            }
        })?;
        let dims = d.dims.as_ref().ok_or_else(|| format!("'{name}' has an unknown rank"))?;
        Ok((dtype, dims))
    }

    /// The type of a value the nodes read but do not produce: ORT's, with
    /// unknown dims at the probe's sizes while checking.
    fn input_type(&self, name: &str) -> std::result::Result<TensorType, Why> {
        let Some(probe) = self.probe else {
            return self.desc_type(name);
        };
        let (dtype, _) = self.desc_dims(name)?;
        let dims = self.desc.values[name].symbolic_dims(name).unwrap_or_default();
        let shape = dims.iter().map(|d| probe.size(d).max(0) as usize).collect();
        Ok(TensorType { dtype, shape })
    }

    /// Checks kiln's type for `name` against what ORT knows of it: element
    /// type, rank and every dim ORT knows.
    fn agrees_with_ort(&self, name: &str, ty: &TensorType) -> std::result::Result<(), Why> {
        let Some(d) = self.desc.values.get(name) else {
            return Ok(());
        };
        let said = || match &d.dims {
            Some(dims) => format!("{} {dims:?}", onnx_type_name(d.elem_type)),
            None => onnx_type_name(d.elem_type).to_string(),
        };
        if d.elem_type != 0 && d.elem_type != ty.dtype.onnx_code() {
            return Err(format!("kiln infers {ty} for '{name}' but ORT says {}", said()));
        }
        if let Some(dims) = &d.dims {
            let same =
                dims.len() == ty.shape.len() && dims.iter().zip(&ty.shape).all(|(&o, &k)| o < 0 || o as usize == k);
            if !same {
                return Err(format!("kiln infers {ty} for '{name}' but ORT says {}", said()));
            }
        }
        Ok(())
    }

    /// The IR value for ONNX value `name`.
    fn value(&mut self, name: &str) -> std::result::Result<ValueId, Why> {
        if let Some(&id) = self.ids.get(name) {
            return Ok(id);
        }
        let constant = self.consts.is_constant(name);
        if !constant && !self.check_only {
            return Err(format!(
                "'{name}' is neither a partition input, a constant nor produced before"
            ));
        }
        let ty = match self.input_type(name) {
            Ok(ty) => ty,
            // A constant without type information: read it to learn its type.
            Err(_) if constant => {
                let t = self.fetch(name)?;
                let id = self.new_value(name, t.ty())?;
                self.data.insert(id, t);
                return Ok(id);
            }
            Err(why) => return Err(why),
        };
        let id = self.new_value(name, ty)?;
        if constant {
            self.lazy.insert(id, name.to_string());
        }
        Ok(id)
    }

    fn new_value(&mut self, name: &str, ty: TensorType) -> std::result::Result<ValueId, Why> {
        let id = self.g.add_value(name, ty).map_err(|e| e.message)?;
        self.ids.insert(name.to_string(), id);
        Ok(id)
    }

    fn fetch(&self, name: &str) -> std::result::Result<Tensor, Why> {
        let t = self
            .consts
            .constant(name)
            .map_err(|e| e.message)?
            .ok_or_else(|| format!("constant '{name}' is missing"))?;
        tensor_of(&t)
    }

    /// The contents of `id` if known, reading a constant initializer if it
    /// is small (or `force`).
    pub(super) fn known(&mut self, id: ValueId, force: bool) -> std::result::Result<Option<Tensor>, Why> {
        if let Some(t) = self.data.get(&id) {
            return Ok(Some(t.clone()));
        }
        let Some(name) = self.lazy.get(&id).cloned() else {
            return Ok(None);
        };
        if !force && self.g.values[id].ty.numel() > FETCH_LIMIT {
            return Ok(None);
        }
        let t = self.fetch(&name)?;
        if t.ty() != self.g.values[id].ty {
            return Err(format!(
                "constant '{name}' is {} but described as {}",
                t.ty(),
                self.g.values[id].ty
            ));
        }
        self.lazy.remove(&id);
        self.data.insert(id, t.clone());
        Ok(Some(t))
    }

    /// Contents of input `k` that must be a constant.
    pub(super) fn const_input(
        &mut self,
        n: &NodeDesc,
        k: usize,
        what: &str,
    ) -> std::result::Result<Option<Tensor>, Why> {
        let Some(name) = n.inputs.get(k).filter(|s| !s.is_empty()) else {
            return Ok(None);
        };
        let id = self.value(name)?;
        self.known(id, true)?
            .map(Some)
            .ok_or_else(|| format!("{what} (input {k} '{name}') is not a constant"))
    }

    pub(super) fn const_ints(
        &mut self,
        n: &NodeDesc,
        k: usize,
        what: &str,
    ) -> std::result::Result<Option<Vec<i64>>, Why> {
        match self.const_input(n, k, what)? {
            None => Ok(None),
            Some(t) => t
                .as_i64s()
                .map(Some)
                .ok_or_else(|| format!("{what} is not an integer tensor")),
        }
    }

    pub(super) fn input(&mut self, n: &NodeDesc, k: usize) -> std::result::Result<ValueId, Why> {
        let name = n
            .inputs
            .get(k)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| format!("input {k} is missing"))?;
        self.value(name)
    }

    /// Input `k`, whose shape the op dictates (`None`: any size). While
    /// checking, what ORT does not know of it is taken from `shape`: a value
    /// of unknown rank (an `If` output whose branches differ in rank) gets
    /// that rank, an unknown dim that size (the op is only valid at it) (unknown sizes probed as
    /// usual). At run time a shape-generic partition sees the real dims, and
    /// the op's import checks them.
    pub(super) fn input_shaped(
        &mut self,
        n: &NodeDesc,
        k: usize,
        shape: &[Option<usize>],
    ) -> std::result::Result<ValueId, Why> {
        let name = n
            .inputs
            .get(k)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| format!("input {k} is missing"))?;
        let desc = self.desc.values.get(name.as_str());
        let (Some(probe), Some(d), false, false) = (
            self.probe,
            desc,
            self.ids.contains_key(name.as_str()),
            self.consts.is_constant(name),
        ) else {
            return self.value(name);
        };
        let dtype = DType::from_onnx(d.elem_type).ok_or_else(|| format!("'{name}' is not a tensor of known type"))?;
        let fill = |hint: Option<usize>| hint.unwrap_or_else(|| probe.fresh() as usize);
        let dims: Vec<usize> = match (&d.dims, d.symbolic_dims(name)) {
            (None, _) => shape.iter().map(|&s| fill(s)).collect(),
            (Some(dims), Some(sym)) if dims.len() == shape.len() => (0..dims.len())
                .map(|i| match (dims[i], shape[i]) {
                    (x, _) if x >= 0 => x as usize,
                    (_, Some(hint)) => hint,
                    _ => probe.size(&sym[i]).max(0) as usize,
                })
                .collect(),
            _ => return self.value(name),
        };
        self.new_value(name, TensorType { dtype, shape: dims })
    }

    /// Whether `id`'s contents are known at compile time (a constant
    /// initializer, read or not, or a folded value).
    pub(super) fn is_constant(&self, id: ValueId) -> bool {
        self.data.contains_key(&id) || self.lazy.contains_key(&id)
    }

    pub(super) fn ty(&self, id: ValueId) -> &TensorType {
        &self.g.values[id].ty
    }

    /// Marks the outputs of a node kiln does not run as opaque values.
    fn forget_outputs(&mut self, n: &NodeDesc) {
        for o in &n.outputs {
            self.ids.remove(o);
        }
    }

    /// Adds `op(inputs)`; folds it when every input is known. `out` names
    /// the ONNX output (checked against ORT's type), or `None` for an
    /// internal value.
    pub(super) fn emit(
        &mut self,
        n: &NodeDesc,
        op: Op,
        inputs: &[ValueId],
        out: Option<&str>,
        shape: Option<&[usize]>,
    ) -> std::result::Result<ValueId, Why> {
        let tys: Vec<&TensorType> = inputs.iter().map(|&v| &self.g.values[v].ty).collect();
        let ty = infer(&op, &tys, shape)?.remove(0);
        if ty.checked_numel().is_none() {
            return Err(format!("output of type {ty} is too large"));
        }
        let id = match out {
            Some(name) => {
                self.agrees_with_ort(name, &ty)?;
                if self.ids.contains_key(name) {
                    return Err(format!("value '{name}' is produced twice"));
                }
                self.new_value(name, ty.clone())?
            }
            None => self.g.fresh_value(&n.name, ty.clone()),
        };
        // Fold when everything is known (small constants are read for it).
        let mut known = Vec::with_capacity(inputs.len());
        let small = ty.numel() <= FETCH_LIMIT;
        if small || matches!(op, Op::Shape { .. }) {
            for &v in inputs {
                match self.known(v, false)? {
                    Some(t) => known.push(t),
                    None => break,
                }
            }
        }
        if let Op::Shape { start, end } = op {
            let dims = self.g.values[inputs[0]].ty.shape[start..end]
                .iter()
                .map(|&d| d as i64)
                .collect();
            self.data.insert(id, Tensor::i64(&[end - start], dims));
        } else if known.len() == inputs.len() && small && !inputs.is_empty() {
            let refs: Vec<&Tensor> = known.iter().collect();
            let t = self
                .fold
                .eval(&op, &refs, std::slice::from_ref(&ty))
                .map_err(|e| e.message)?;
            self.data
                .insert(id, t.into_iter().next().ok_or("folding produced nothing")?);
        } else {
            self.g.add_node(&n.name, op, inputs.to_vec(), vec![id]);
        }
        Ok(id)
    }

    /// A constant value holding `t` (for attributes that become inputs).
    pub(super) fn constant(&mut self, hint: &str, t: Tensor) -> ValueId {
        let id = self.g.fresh_value(hint, t.ty());
        self.data.insert(id, t);
        id
    }

    /// Names `id` as ONNX output `name` (an alias when it already has a value).
    pub(super) fn bind(&mut self, n: &NodeDesc, name: &str, id: ValueId) -> std::result::Result<(), Why> {
        let shape = self.ty(id).shape.clone();
        self.emit(n, Op::Reshape, &[id], Some(name), Some(&shape))?;
        Ok(())
    }

    pub(super) fn out<'n>(&self, n: &'n NodeDesc, k: usize) -> std::result::Result<&'n str, Why> {
        n.outputs
            .get(k)
            .map(|s| s.as_str())
            .filter(|s| !s.is_empty())
            .ok_or_else(|| format!("output {k} is missing"))
    }

    /// Imports one ONNX node through its entry in the op registry
    /// ([`super::ops`]), after the checks common to every op.
    fn node(&mut self, n: &NodeDesc) -> std::result::Result<(), Why> {
        if !matches!(n.domain.as_str(), "" | "ai.onnx") {
            return Err(format!("kiln does not implement {}.{}", n.domain, n.op_type));
        }
        let family = ops::lookup(&n.op_type).ok_or_else(|| format!("kiln does not implement {}", n.op_type))?;
        for (k, name) in n.outputs.iter().enumerate() {
            if k > 0 && !name.is_empty() && !family.multi_output {
                return Err(format!("output {k} ('{name}') of {} is not supported", n.op_type));
            }
        }
        if family.optional_outputs {
            if n.outputs.iter().all(|o| o.is_empty()) {
                return Err(format!("{} has no output", n.op_type));
            }
            return (family.import)(self, n, "");
        }
        let out0 = self.out(n, 0)?;
        (family.import)(self, n, out0)
    }

    /// Attaches the constants the kept nodes and outputs read; sets outputs.
    fn finish(mut self) -> Result<Graph> {
        for name in &self.desc.outputs {
            let id = match self.ids.get(name) {
                Some(&id) => id,
                None if self.consts.is_constant(name) => self.value(name).map_err(Error::invalid_graph)?,
                None => crate::bail!(
                    InvalidGraph,
                    "partition output '{name}' is not produced by the partition"
                ),
            };
            self.g.outputs.push(id);
        }
        let mut used = vec![false; self.g.values.len()];
        for node in &self.g.nodes {
            for &v in &node.inputs {
                used[v] = true;
            }
        }
        for &v in &self.g.outputs {
            used[v] = true;
        }
        for &v in &self.g.inputs {
            used[v] = false;
        }
        for (v, used) in used.into_iter().enumerate() {
            if !used {
                continue;
            }
            if let Some(w) = self.lazy.get(&v).and_then(|name| self.consts.weight(name)) {
                self.lazy.remove(&v);
                self.g.add_constant_weight(v, w)?;
                continue;
            }
            if let Some(t) = self.known(v, true).map_err(Error::invalid_graph)? {
                self.g.add_constant_tensor(v, &t)?;
            }
        }
        Ok(self.g)
    }
}
