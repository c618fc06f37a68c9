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

use std::collections::HashMap;

use super::desc::{AttrValue, ConstantSource, GraphDesc, NodeDesc, ValueDesc, SUPPORTED_OPS};
use super::{
    broadcast_shapes, infer, onnx_type_name, BiasKind, BinaryOp, DType, Graph, MatMulAttrs, Op, ReduceKind,
    ShapeDisplay, Tensor, TensorType, UnaryOp, ValueId,
};
use crate::compiler::eval_op;
use crate::error::{Error, Result};

type Why = String;

/// Constants above this many elements are not read just to fold them.
const FETCH_LIMIT: usize = 1 << 16;

/// For each node of `graph` (same order): `Ok` if kiln can run it exactly,
/// `Err(reason)` if not. `disabled` lists op types the user excluded.
pub fn check_support(
    graph: &GraphDesc,
    constants: &dyn ConstantSource,
    disabled: &[String],
) -> Vec<std::result::Result<(), String>> {
    let probes = Probe::for_graph(graph);
    let mut verdicts = vec![Ok(()); graph.nodes.len()];
    for probe in &probes {
        for (v, r) in verdicts.iter_mut().zip(check_at(graph, constants, disabled, probe)) {
            if v.is_ok() {
                *v = r;
            }
        }
    }
    verdicts
}

/// One pass of [`check_support`] with the graph's unknown dims at `probe`'s sizes.
fn check_at(
    graph: &GraphDesc,
    constants: &dyn ConstantSource,
    disabled: &[String],
    probe: &Probe,
) -> Vec<std::result::Result<(), String>> {
    let mut imp = Importer::new(graph, constants, true);
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
    /// No probe for a graph without unknown dims; else two.
    fn for_graph(graph: &GraphDesc) -> Vec<Probe> {
        let dynamic = graph
            .values
            .values()
            .any(|v| v.dims.as_ref().is_some_and(|d| d.iter().any(|&x| x < 0)));
        let sets: &[i64] = if dynamic { &[0, 1] } else { &[0] };
        sets.iter()
            .map(|&first| Probe {
                first,
                named: Default::default(),
                next: Default::default(),
            })
            .collect()
    }

    fn fresh(&self) -> i64 {
        let k = self.next.get();
        self.next.set(k + 1);
        PROBE_PRIMES[(k % PROBE_SYMBOLS) * 2 + self.first as usize]
    }

    /// The size of dim `i` of `v`, `d` if known.
    fn size(&self, v: &ValueDesc, i: usize, d: i64) -> i64 {
        if d >= 0 {
            return d;
        }
        match v.dim_param(i) {
            Some(name) => {
                if let Some(&s) = self.named.borrow().get(name) {
                    return s;
                }
                let s = self.fresh();
                self.named.borrow_mut().insert(name.to_string(), s);
                s
            }
            None => self.fresh(),
        }
    }
}

/// Builds the IR of one partition: `graph.inputs`/`outputs` in the fused
/// node's order; constant initializers come from `constants`.
pub fn import(graph: &GraphDesc, constants: &dyn ConstantSource) -> Result<Graph> {
    let mut imp = Importer::new(graph, constants, false);
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

struct Importer<'a> {
    desc: &'a GraphDesc,
    /// Sizes for unknown dims of values the checked nodes read (check only).
    probe: Option<&'a Probe>,
    consts: &'a dyn ConstantSource,
    check_only: bool,
    g: Graph,
    ids: HashMap<String, ValueId>,
    /// Values whose contents are known (folded or read constants).
    data: HashMap<ValueId, Tensor>,
    /// Constant initializers not read yet.
    lazy: HashMap<ValueId, String>,
}

fn attr<'n>(n: &'n NodeDesc, name: &str) -> Option<&'n AttrValue> {
    n.attrs.get(name)
}

fn attr_int(n: &NodeDesc, name: &str, default: i64) -> std::result::Result<i64, Why> {
    match attr(n, name) {
        None => Ok(default),
        Some(AttrValue::Int(v)) => Ok(*v),
        Some(other) => Err(format!("attribute {name} is {other:?}, expected an int")),
    }
}

fn attr_float(n: &NodeDesc, name: &str, default: f32) -> std::result::Result<f32, Why> {
    match attr(n, name) {
        None => Ok(default),
        Some(AttrValue::Float(v)) => Ok(*v),
        Some(other) => Err(format!("attribute {name} is {other:?}, expected a float")),
    }
}

fn attr_ints(n: &NodeDesc, name: &str) -> std::result::Result<Option<Vec<i64>>, Why> {
    match attr(n, name) {
        None => Ok(None),
        Some(AttrValue::Ints(v)) => Ok(Some(v.clone())),
        Some(other) => Err(format!("attribute {name} is {other:?}, expected ints")),
    }
}

fn attr_str<'n>(n: &'n NodeDesc, name: &str, default: &'n str) -> std::result::Result<&'n str, Why> {
    match attr(n, name) {
        None => Ok(default),
        Some(AttrValue::String(s)) => Ok(s),
        Some(other) => Err(format!("attribute {name} is {other:?}, expected a string")),
    }
}

/// `axis` (possibly negative) as an index into `rank` dims.
fn norm_axis(axis: i64, rank: usize, what: &str) -> std::result::Result<usize, Why> {
    let a = if axis < 0 { axis + rank as i64 } else { axis };
    if a < 0 || a >= rank as i64 {
        return Err(format!("{what} attribute {axis} out of range for rank {rank}"));
    }
    Ok(a as usize)
}

fn norm_axes(axes: &[i64], rank: usize, what: &str) -> std::result::Result<Vec<usize>, Why> {
    let mut v = axes
        .iter()
        .map(|&a| norm_axis(a, rank, what))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    v.sort_unstable();
    if v.windows(2).any(|w| w[0] == w[1]) {
        return Err(format!("{what} {axes:?} repeats an axis"));
    }
    Ok(v)
}

fn tensor_of(t: &super::desc::TensorValue) -> std::result::Result<Tensor, Why> {
    let dtype =
        DType::from_onnx(t.elem_type).ok_or_else(|| format!("a constant is {}", onnx_type_name(t.elem_type)))?;
    Tensor::from_bytes(dtype, &t.shape, &t.bytes).map_err(|e| e.message)
}

fn is_reduce(op: &str) -> Option<ReduceKind> {
    Some(match op {
        "ReduceMean" => ReduceKind::Mean,
        "ReduceSum" => ReduceKind::Sum,
        "ReduceMax" => ReduceKind::Max,
        _ => return None,
    })
}

impl<'a> Importer<'a> {
    fn new(desc: &'a GraphDesc, consts: &'a dyn ConstantSource, check_only: bool) -> Self {
        Importer {
            desc,
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
        let (dtype, dims) = self.desc_dims(name)?;
        let v = &self.desc.values[name];
        let shape = dims
            .iter()
            .enumerate()
            .map(|(i, &d)| probe.size(v, i, d) as usize)
            .collect();
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
        if !constant && self.desc.values.get(name).is_some_and(|v| v.outer_scope) {
            return Err(format!(
                "'{name}' belongs to the enclosing graph, which ORT does not pass to kiln"
            ));
        }
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
    fn known(&mut self, id: ValueId, force: bool) -> std::result::Result<Option<Tensor>, Why> {
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
    fn const_input(&mut self, n: &NodeDesc, k: usize, what: &str) -> std::result::Result<Option<Tensor>, Why> {
        let Some(name) = n.inputs.get(k).filter(|s| !s.is_empty()) else {
            return Ok(None);
        };
        let id = self.value(name)?;
        self.known(id, true)?
            .map(Some)
            .ok_or_else(|| format!("{what} (input {k} '{name}') is not a constant"))
    }

    fn const_ints(&mut self, n: &NodeDesc, k: usize, what: &str) -> std::result::Result<Option<Vec<i64>>, Why> {
        match self.const_input(n, k, what)? {
            None => Ok(None),
            Some(t) => t
                .as_i64s()
                .map(Some)
                .ok_or_else(|| format!("{what} is not an integer tensor")),
        }
    }

    fn input(&mut self, n: &NodeDesc, k: usize) -> std::result::Result<ValueId, Why> {
        let name = n
            .inputs
            .get(k)
            .filter(|s| !s.is_empty())
            .ok_or_else(|| format!("input {k} is missing"))?;
        self.value(name)
    }

    fn ty(&self, id: ValueId) -> &TensorType {
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
    fn emit(
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
            let t = eval_op(&op, &refs, std::slice::from_ref(&ty)).map_err(|e| e.message)?;
            self.data
                .insert(id, t.into_iter().next().ok_or("folding produced nothing")?);
        } else {
            self.g.add_node(&n.name, op, inputs.to_vec(), vec![id]);
        }
        Ok(id)
    }

    /// A constant value holding `t` (for attributes that become inputs).
    fn constant(&mut self, hint: &str, t: Tensor) -> ValueId {
        let id = self.g.fresh_value(hint, t.ty());
        self.data.insert(id, t);
        id
    }

    /// Names `id` as ONNX output `name` (an alias when it already has a value).
    fn bind(&mut self, n: &NodeDesc, name: &str, id: ValueId) -> std::result::Result<(), Why> {
        let shape = self.ty(id).shape.clone();
        self.emit(n, Op::Reshape, &[id], Some(name), Some(&shape))?;
        Ok(())
    }

    fn out<'n>(&self, n: &'n NodeDesc, k: usize) -> std::result::Result<&'n str, Why> {
        n.outputs
            .get(k)
            .map(|s| s.as_str())
            .filter(|s| !s.is_empty())
            .ok_or_else(|| format!("output {k} is missing"))
    }

    fn node(&mut self, n: &NodeDesc) -> std::result::Result<(), Why> {
        if !matches!(n.domain.as_str(), "" | "ai.onnx") {
            return Err(format!("kiln does not implement {}.{}", n.domain, n.op_type));
        }
        if !SUPPORTED_OPS.contains(&n.op_type.as_str()) {
            return Err(format!("kiln does not implement {}", n.op_type));
        }
        for (k, name) in n.outputs.iter().enumerate() {
            if k > 0 && !name.is_empty() && !matches!(n.op_type.as_str(), "Split" | "Dropout") {
                return Err(format!("output {k} ('{name}') of {} is not supported", n.op_type));
            }
        }
        let op = n.op_type.as_str();
        let opset = n.since_version;
        let out0 = self.out(n, 0)?;
        let unary = |u: UnaryOp| Some(u);
        let simple = match op {
            "Relu" => unary(UnaryOp::Relu),
            "Sigmoid" => unary(UnaryOp::Sigmoid),
            "Tanh" => unary(UnaryOp::Tanh),
            "Neg" => unary(UnaryOp::Neg),
            "Abs" => unary(UnaryOp::Abs),
            "Sqrt" => unary(UnaryOp::Sqrt),
            "Exp" => unary(UnaryOp::Exp),
            "Log" => unary(UnaryOp::Log),
            "Erf" => unary(UnaryOp::Erf),
            "Reciprocal" => unary(UnaryOp::Reciprocal),
            "LeakyRelu" => unary(UnaryOp::LeakyRelu(attr_float(n, "alpha", 0.01)?)),
            "Gelu" => match attr_str(n, "approximate", "none")? {
                "none" => unary(UnaryOp::Gelu),
                "tanh" => unary(UnaryOp::GeluTanh),
                other => return Err(format!("Gelu approximate attribute '{other}' is not none or tanh")),
            },
            _ => None,
        };
        if let Some(u) = simple {
            let x = self.input(n, 0)?;
            self.emit(n, Op::Unary(u), &[x], Some(out0), None)?;
            return Ok(());
        }
        match op {
            "Add" | "Sub" | "Mul" | "Div" | "Pow" => {
                let b = match op {
                    "Add" => BinaryOp::Add,
                    "Sub" => BinaryOp::Sub,
                    "Mul" => BinaryOp::Mul,
                    "Div" => BinaryOp::Div,
                    _ => BinaryOp::Pow,
                };
                let x = self.input(n, 0)?;
                let mut y = self.input(n, 1)?;
                if b == BinaryOp::Pow && self.ty(y).dtype != DType::F32 && self.ty(x).dtype == DType::F32 {
                    // An integer exponent: kiln computes it as float.
                    let t = self
                        .const_input(n, 1, "an integer exponent")?
                        .ok_or("exponent missing")?;
                    let f = Tensor::f32(&t.shape, t.as_f64s().iter().map(|&v| v as f32).collect());
                    y = self.constant("exponent", f);
                }
                self.emit(n, Op::Binary(b), &[x, y], Some(out0), None)?;
            }
            "Clip" => {
                // An absent bound is ±FLT_MAX (Clip-6's defaults, which ORT also
                // uses for Clip-11+), not ±inf: Clip(inf) with no max is FLT_MAX.
                let (lo, hi) = if opset < 11 {
                    (attr_float(n, "min", f32::MIN)?, attr_float(n, "max", f32::MAX)?)
                } else {
                    let lo = self.const_input(n, 1, "Clip min")?;
                    let hi = self.const_input(n, 2, "Clip max")?;
                    let scalar = |t: Option<Tensor>, d: f32| -> std::result::Result<f32, Why> {
                        match t {
                            None => Ok(d),
                            Some(t) => t
                                .scalar()
                                .map(|v| v as f32)
                                .ok_or_else(|| "Clip min/max is not a scalar".to_string()),
                        }
                    };
                    (scalar(lo, f32::MIN)?, scalar(hi, f32::MAX)?)
                };
                let x = self.input(n, 0)?;
                self.emit(n, Op::Unary(UnaryOp::Clip(lo, hi)), &[x], Some(out0), None)?;
            }
            "MatMul" => self.matmul(n, out0)?,
            "Gemm" => self.gemm(n, out0)?,
            "Softmax" => {
                let x = self.input(n, 0)?;
                let shape = self.ty(x).shape.clone();
                let rank = shape.len();
                let default = if opset < 13 { 1 } else { -1 };
                let axis = norm_axis(attr_int(n, "axis", default)?, rank, "Softmax axis")?;
                if opset >= 13 || axis == rank - 1 {
                    self.emit(n, Op::Softmax { axis, unshifted: false }, &[x], Some(out0), None)?;
                } else {
                    // Opsets < 13: softmax of the 2-D flattening at `axis`.
                    let flat = [shape[..axis].iter().product(), shape[axis..].iter().product()];
                    let f = self.emit(n, Op::Reshape, &[x], None, Some(&flat))?;
                    let sm = Op::Softmax {
                        axis: 1,
                        unshifted: false,
                    };
                    let s = self.emit(n, sm, &[f], None, None)?;
                    self.emit(n, Op::Reshape, &[s], Some(out0), Some(&shape))?;
                }
            }
            "LayerNormalization" => {
                let x = self.input(n, 0)?;
                let rank = self.ty(x).shape.len();
                let axis = norm_axis(attr_int(n, "axis", -1)?, rank, "LayerNormalization axis")?;
                let epsilon = attr_float(n, "epsilon", 1e-5)?;
                let norm = self.ty(x).shape[axis..].to_vec();
                let mut ins = vec![x];
                for k in 1..3 {
                    if n.inputs.get(k).is_some_and(|s| !s.is_empty()) {
                        let v = self.input(n, k)?;
                        // Scale/bias broadcast over the normalised dims: give them those dims.
                        let v = if self.ty(v).shape != norm && self.ty(v).numel() == norm.iter().product::<usize>() {
                            self.emit(n, Op::Reshape, &[v], None, Some(&norm))?
                        } else {
                            v
                        };
                        ins.push(v);
                    }
                }
                if ins.len() < 2 {
                    return Err("LayerNormalization needs a scale".into());
                }
                let ln = Op::LayerNorm {
                    axis,
                    epsilon,
                    decomposed: false,
                };
                self.emit(n, ln, &ins, Some(out0), None)?;
            }
            _ if is_reduce(op).is_some() => self.reduce(n, is_reduce(op).unwrap_or(ReduceKind::Sum), out0)?,
            "Reshape" => {
                let x = self.input(n, 0)?;
                let spec = self
                    .const_ints(n, 1, "the Reshape shape")?
                    .ok_or("Reshape has no shape")?;
                let allowzero = attr_int(n, "allowzero", 0)? != 0;
                let shape = reshape_target(&self.ty(x).shape, &spec, allowzero)?;
                self.emit(n, Op::Reshape, &[x], Some(out0), Some(&shape))?;
            }
            "Flatten" => {
                let x = self.input(n, 0)?;
                let s = self.ty(x).shape.clone();
                let a = attr_int(n, "axis", 1)?;
                let a = if a < 0 { a + s.len() as i64 } else { a };
                if a < 0 || a > s.len() as i64 {
                    return Err(format!("Flatten axis attribute {a} out of range for rank {}", s.len()));
                }
                let a = a as usize;
                let shape = [s[..a].iter().product(), s[a..].iter().product()];
                self.emit(n, Op::Reshape, &[x], Some(out0), Some(&shape))?;
            }
            "Squeeze" | "Unsqueeze" => {
                let x = self.input(n, 0)?;
                let s = self.ty(x).shape.clone();
                let axes = if opset < 13 {
                    attr_ints(n, "axes")?
                } else {
                    self.const_ints(n, 1, "the axes")?
                };
                let shape = if op == "Squeeze" {
                    match axes {
                        None => s.iter().copied().filter(|&d| d != 1).collect(),
                        Some(axes) => {
                            let axes = norm_axes(&axes, s.len(), "Squeeze axes")?;
                            if let Some(&a) = axes.iter().find(|&&a| s[a] != 1) {
                                return Err(format!("Squeeze axis {a} has size {}", s[a]));
                            }
                            (0..s.len()).filter(|d| !axes.contains(d)).map(|d| s[d]).collect()
                        }
                    }
                } else {
                    let axes = axes.ok_or("Unsqueeze has no axes")?;
                    let r = s.len() + axes.len();
                    let axes = norm_axes(&axes, r, "Unsqueeze axes")?;
                    let mut it = s.iter();
                    (0..r)
                        .map(|d| if axes.contains(&d) { 1 } else { *it.next().unwrap_or(&1) })
                        .collect::<Vec<_>>()
                };
                self.emit(n, Op::Reshape, &[x], Some(out0), Some(&shape))?;
            }
            "Identity" => {
                let x = self.input(n, 0)?;
                self.bind(n, out0, x)?;
            }
            "Dropout" => {
                if let Some(t) = self.const_input(n, 2, "training_mode").ok().flatten() {
                    if t.as_f64s().iter().any(|&v| v != 0.0) {
                        return Err("Dropout in training mode is not supported".into());
                    }
                } else if n.inputs.get(2).is_some_and(|s| !s.is_empty()) {
                    return Err("Dropout training_mode is not a constant".into());
                }
                let x = self.input(n, 0)?;
                self.bind(n, out0, x)?;
                if let Some(mask) = n.outputs.get(1).filter(|s| !s.is_empty()) {
                    let shape = self.ty(x).shape.clone();
                    let ones = Tensor::filled(&TensorType::new(DType::Bool, &shape), 1.0);
                    let c = self.constant("dropout_mask", ones);
                    self.bind(n, mask, c)?;
                }
            }
            "Transpose" => {
                let x = self.input(n, 0)?;
                let rank = self.ty(x).shape.len();
                let perm = match attr_ints(n, "perm")? {
                    Some(p) => p
                        .iter()
                        .map(|&a| norm_axis(a, rank, "Transpose perm"))
                        .collect::<std::result::Result<Vec<_>, _>>()?,
                    None => (0..rank).rev().collect(),
                };
                self.emit(n, Op::Transpose { perm }, &[x], Some(out0), None)?;
            }
            "Concat" => {
                let mut ins = Vec::new();
                for k in 0..n.inputs.len() {
                    ins.push(self.input(n, k)?);
                }
                let rank = ins
                    .first()
                    .map(|&v| self.ty(v).shape.len())
                    .ok_or("Concat has no inputs")?;
                let axis = norm_axis(attr_int(n, "axis", 0)?, rank, "Concat axis")?;
                self.emit(n, Op::Concat { axis }, &ins, Some(out0), None)?;
            }
            "Split" => self.split(n)?,
            "Slice" => self.slice(n, out0)?,
            "Gather" => {
                let x = self.input(n, 0)?;
                let idx = self.input(n, 1)?;
                let rank = self.ty(x).shape.len();
                let axis = norm_axis(attr_int(n, "axis", 0)?, rank, "Gather axis")?;
                self.emit(n, Op::Gather { axis }, &[x, idx], Some(out0), None)?;
            }
            "Cast" => {
                let to = attr_int(n, "to", 0)? as i32;
                let to =
                    DType::from_onnx(to).ok_or_else(|| format!("Cast to {} is not supported", onnx_type_name(to)))?;
                let x = self.input(n, 0)?;
                self.emit(n, Op::Cast { to }, &[x], Some(out0), None)?;
            }
            "Shape" => {
                let x = self.input(n, 0)?;
                let r = self.ty(x).shape.len() as i64;
                let clamp = |v: i64| (if v < 0 { v + r } else { v }).clamp(0, r) as usize;
                let start = clamp(attr_int(n, "start", 0)?);
                let end = clamp(attr_int(n, "end", r)?).max(start);
                self.emit(n, Op::Shape { start, end }, &[x], Some(out0), None)?;
            }
            "Constant" => {
                let t = match n.attrs.iter().next() {
                    Some((k, AttrValue::Tensor(t))) if k == "value" => tensor_of(t)?,
                    Some((k, AttrValue::Float(v))) if k == "value_float" => Tensor::f32(&[], vec![*v]),
                    Some((k, AttrValue::Floats(v))) if k == "value_floats" => Tensor::f32(&[v.len()], v.clone()),
                    Some((k, AttrValue::Int(v))) if k == "value_int" => Tensor::i64(&[], vec![*v]),
                    Some((k, AttrValue::Ints(v))) if k == "value_ints" => Tensor::i64(&[v.len()], v.clone()),
                    other => {
                        return Err(format!(
                            "Constant attribute {:?} is not supported",
                            other.map(|(k, _)| k)
                        ))
                    }
                };
                let c = self.constant("constant", t);
                self.bind(n, out0, c)?;
            }
            "ConstantOfShape" => {
                let shape = self
                    .const_ints(n, 0, "the shape")?
                    .ok_or("ConstantOfShape has no shape")?;
                let shape: Vec<usize> = shape
                    .iter()
                    .map(|&d| usize::try_from(d).map_err(|_| format!("negative dim {d}")))
                    .collect::<std::result::Result<_, _>>()?;
                let value = match attr(n, "value") {
                    None => Tensor::f32(&[1], vec![0.0]),
                    Some(AttrValue::Tensor(t)) => tensor_of(t)?,
                    Some(other) => return Err(format!("ConstantOfShape value {other:?} is not a tensor")),
                };
                let v = value.scalar().ok_or("ConstantOfShape value is not one element")?;
                let ty = TensorType::new(value.dtype(), &shape);
                if ty.checked_numel().is_none_or(|n| n > FETCH_LIMIT * 16) {
                    return Err(format!("ConstantOfShape of {ty} is too large to fold"));
                }
                let c = self.constant("constant_of_shape", Tensor::filled(&ty, v));
                self.bind(n, out0, c)?;
            }
            "Equal" | "Greater" | "Less" | "GreaterOrEqual" | "LessOrEqual" | "And" | "Or" | "Xor" | "Not" => {
                self.fold_logic(n, out0)?
            }
            "Where" => {
                let c = self.input(n, 0)?;
                let x = self.input(n, 1)?;
                let y = self.input(n, 2)?;
                self.emit(n, Op::Where, &[c, x, y], Some(out0), None)?;
            }
            "Expand" => {
                let x = self.input(n, 0)?;
                let spec = self
                    .const_ints(n, 1, "the Expand shape")?
                    .ok_or("Expand has no shape")?;
                let spec: Vec<usize> = spec
                    .iter()
                    .map(|&d| usize::try_from(d).map_err(|_| format!("negative dim {d}")))
                    .collect::<std::result::Result<_, _>>()?;
                let shape = broadcast_shapes(&self.ty(x).shape, &spec).ok_or_else(|| {
                    format!(
                        "cannot expand {} to {}",
                        ShapeDisplay(&self.ty(x).shape),
                        ShapeDisplay(&spec)
                    )
                })?;
                self.emit(n, Op::Expand, &[x], Some(out0), Some(&shape))?;
            }
            other => return Err(format!("kiln does not implement {other}")),
        }
        Ok(())
    }

    /// Comparisons and logic on values known while importing (shape
    /// arithmetic such as `Where(Equal(shape, -1), 1, shape)`): evaluated
    /// here. kiln has no run-time kernel for them yet.
    fn fold_logic(&mut self, n: &NodeDesc, out: &str) -> std::result::Result<(), Why> {
        let arity = if n.op_type == "Not" { 1 } else { 2 };
        let mut known = Vec::with_capacity(arity);
        for k in 0..arity {
            let id = self.input(n, k)?;
            let t = self.known(id, false)?.ok_or_else(|| {
                format!(
                    "{} of run-time values is not supported (only of constants and shapes)",
                    n.op_type
                )
            })?;
            known.push(t);
        }
        let logic = matches!(n.op_type.as_str(), "And" | "Or" | "Xor" | "Not");
        if logic && known.iter().any(|t| t.dtype() != DType::Bool) {
            return Err(format!("{} of non-bool inputs", n.op_type));
        }
        if !logic && known[0].dtype() != known[1].dtype() {
            return Err(format!(
                "{} of {} and {}",
                n.op_type,
                known[0].dtype(),
                known[1].dtype()
            ));
        }
        let t = if n.op_type == "Not" {
            let v = known[0].as_f64s().iter().map(|&x| u8::from(x == 0.0)).collect();
            Tensor::bool(&known[0].shape, v)
        } else {
            let f = |a: f64, b: f64| -> bool {
                match n.op_type.as_str() {
                    "Equal" => a == b,
                    "Greater" => a > b,
                    "Less" => a < b,
                    "GreaterOrEqual" => a >= b,
                    "LessOrEqual" => a <= b,
                    "And" => a != 0.0 && b != 0.0,
                    "Or" => a != 0.0 || b != 0.0,
                    _ => (a != 0.0) != (b != 0.0),
                }
            };
            broadcast_map(&known[0], &known[1], f)?
        };
        let c = self.constant("logic", t);
        self.bind(n, out, c)
    }

    fn matmul(&mut self, n: &NodeDesc, out: &str) -> std::result::Result<(), Why> {
        let mut a = self.input(n, 0)?;
        let mut b = self.input(n, 1)?;
        let (sa, sb) = (self.ty(a).shape.clone(), self.ty(b).shape.clone());
        if sa.is_empty() || sb.is_empty() {
            return Err("MatMul of a scalar".into());
        }
        // NumPy rules for 1-D operands: promote, then drop the added dim.
        if sa.len() == 1 {
            a = self.emit(n, Op::Reshape, &[a], None, Some(&[1, sa[0]]))?;
        }
        if sb.len() == 1 {
            b = self.emit(n, Op::Reshape, &[b], None, Some(&[sb[0], 1]))?;
        }
        if sa.len() > 1 && sb.len() > 1 {
            self.emit(n, Op::MatMul(MatMulAttrs::default()), &[a, b], Some(out), None)?;
            return Ok(());
        }
        let y = self.emit(n, Op::MatMul(MatMulAttrs::default()), &[a, b], None, None)?;
        let mut shape = self.ty(y).shape.clone();
        let r = shape.len();
        if sb.len() == 1 {
            shape.remove(r - 1);
        }
        if sa.len() == 1 {
            shape.remove(r - 2);
        }
        self.emit(n, Op::Reshape, &[y], Some(out), Some(&shape))?;
        Ok(())
    }

    fn gemm(&mut self, n: &NodeDesc, out: &str) -> std::result::Result<(), Why> {
        let a = self.input(n, 0)?;
        let b = self.input(n, 1)?;
        let mut attrs = MatMulAttrs {
            trans_a: attr_int(n, "transA", 0)? != 0,
            trans_b: attr_int(n, "transB", 0)? != 0,
            alpha: attr_float(n, "alpha", 1.0)?,
            ..MatMulAttrs::default()
        };
        let beta = attr_float(n, "beta", 1.0)?;
        if self.ty(a).shape.len() != 2 || self.ty(b).shape.len() != 2 {
            return Err("Gemm operands must be 2-D".into());
        }
        let d = super::matmul_dims(&self.ty(a).shape, &self.ty(b).shape, &attrs)?;
        let (m, nn) = (d.m, d.n);
        let mut ins = vec![a, b];
        if n.inputs.get(2).is_some_and(|s| !s.is_empty()) && beta != 0.0 {
            let c = self.input(n, 2)?;
            let cs = self.ty(c).shape.clone();
            if self.ty(c).dtype != DType::F32 {
                return Err(format!("Gemm C is {}", self.ty(c).dtype));
            }
            let row = super::strip_ones(&cs) == [nn] || (cs.is_empty() && nn == 1);
            match self.known(c, false)? {
                Some(t) => {
                    // Fold beta (and any broadcast) into the constant.
                    let vals: Vec<f32> = t.as_f64s().iter().map(|&v| (v * beta as f64) as f32).collect();
                    if row {
                        ins.push(self.constant("gemm_bias", Tensor::f32(&[nn], vals)));
                        attrs.bias = BiasKind::Row;
                    } else {
                        let full = broadcast_shapes(&cs, &[m, nn])
                            .filter(|s| s == &[m, nn])
                            .ok_or("Gemm C does not broadcast")?;
                        let scaled = self.constant("gemm_c", Tensor::f32(&cs, vals));
                        let e = self.emit(n, Op::Expand, &[scaled], None, Some(&full))?;
                        ins.push(e);
                        attrs.bias = BiasKind::Full { beta: 1.0 };
                    }
                }
                None if row && beta == 1.0 => {
                    ins.push(c);
                    attrs.bias = BiasKind::Row;
                }
                None => {
                    let c = if cs == [m, nn] {
                        c
                    } else {
                        self.emit(n, Op::Expand, &[c], None, Some(&[m, nn]))?
                    };
                    ins.push(c);
                    attrs.bias = BiasKind::Full { beta };
                }
            }
        }
        self.emit(n, Op::MatMul(attrs), &ins, Some(out), None)?;
        Ok(())
    }

    fn reduce(&mut self, n: &NodeDesc, kind: ReduceKind, out: &str) -> std::result::Result<(), Why> {
        let x = self.input(n, 0)?;
        let s = self.ty(x).shape.clone();
        let axes_from_input = match kind {
            ReduceKind::Sum => n.since_version >= 13,
            _ => n.since_version >= 18,
        };
        let axes = if axes_from_input {
            self.const_ints(n, 1, "the axes")?
        } else {
            attr_ints(n, "axes")?
        };
        let keepdims = attr_int(n, "keepdims", 1)? != 0;
        let axes = match axes.filter(|a| !a.is_empty()) {
            Some(a) => norm_axes(&a, s.len(), "axes")?,
            None if attr_int(n, "noop_with_empty_axes", 0)? != 0 => {
                return self.bind(n, out, x);
            }
            None => (0..s.len()).collect(),
        };
        let real: Vec<usize> = axes.iter().copied().filter(|&a| s[a] != 1).collect();
        if let (Some(&lo), Some(&hi)) = (real.first(), real.last()) {
            if (lo..=hi).any(|d| s[d] != 1 && !axes.contains(&d)) {
                return Err(format!(
                    "{} over non-adjacent axes {axes:?} is not supported",
                    n.op_type
                ));
            }
        }
        self.emit(n, Op::Reduce { kind, axes, keepdims }, &[x], Some(out), None)?;
        Ok(())
    }

    fn split(&mut self, n: &NodeDesc) -> std::result::Result<(), Why> {
        let x = self.input(n, 0)?;
        let s = self.ty(x).shape.clone();
        let axis = norm_axis(attr_int(n, "axis", 0)?, s.len(), "Split axis")?;
        let parts = n.outputs.len();
        let sizes = if n.since_version < 13 {
            attr_ints(n, "split")?
        } else {
            self.const_ints(n, 1, "the split sizes")?
        };
        let dim = s[axis];
        let sizes: Vec<usize> = match sizes {
            Some(v) => v
                .iter()
                .map(|&d| usize::try_from(d).map_err(|_| format!("negative split {d}")))
                .collect::<std::result::Result<_, _>>()?,
            None => {
                let each = if n.since_version >= 18 {
                    dim.div_ceil(parts.max(1))
                } else {
                    dim / parts.max(1)
                };
                (0..parts).map(|k| each.min(dim.saturating_sub(k * each))).collect()
            }
        };
        if sizes.len() != parts || sizes.iter().sum::<usize>() != dim {
            return Err(format!("Split sizes {sizes:?} do not cover {dim} in {parts} parts"));
        }
        let mut at = 0;
        for (k, &size) in sizes.iter().enumerate() {
            let mut starts = vec![0; s.len()];
            starts[axis] = if size == 0 { 0 } else { at };
            let mut shape = s.clone();
            shape[axis] = size;
            at += size;
            let name = self.out(n, k)?;
            self.emit(
                n,
                Op::Slice {
                    starts,
                    steps: vec![1; s.len()],
                },
                &[x],
                Some(name),
                Some(&shape),
            )?;
        }
        Ok(())
    }

    fn slice(&mut self, n: &NodeDesc, out: &str) -> std::result::Result<(), Why> {
        let x = self.input(n, 0)?;
        let s = self.ty(x).shape.clone();
        let rank = s.len();
        let (starts, ends, axes, steps) = if n.since_version < 10 {
            (
                attr_ints(n, "starts")?.ok_or("Slice has no starts")?,
                attr_ints(n, "ends")?.ok_or("Slice has no ends")?,
                attr_ints(n, "axes")?,
                None,
            )
        } else {
            (
                self.const_ints(n, 1, "the starts")?.ok_or("Slice has no starts")?,
                self.const_ints(n, 2, "the ends")?.ok_or("Slice has no ends")?,
                self.const_ints(n, 3, "the axes")?,
                self.const_ints(n, 4, "the steps")?,
            )
        };
        let axes = axes.unwrap_or_else(|| (0..starts.len() as i64).collect());
        let steps = steps.unwrap_or_else(|| vec![1; starts.len()]);
        if ends.len() != starts.len() || axes.len() != starts.len() || steps.len() != starts.len() {
            return Err("Slice starts, ends, axes and steps differ in length".into());
        }
        let mut st = vec![0usize; rank];
        let mut sp = vec![1isize; rank];
        let mut shape = s.clone();
        let mut seen = vec![false; rank];
        for k in 0..starts.len() {
            let a = norm_axis(axes[k], rank, "Slice axes")?;
            if std::mem::replace(&mut seen[a], true) {
                return Err(format!("Slice repeats axis {a}"));
            }
            let dim = s[a] as i64;
            let step = steps[k];
            if step == 0 {
                return Err("Slice step 0".into());
            }
            let fix = |v: i64| if v < 0 { v.saturating_add(dim) } else { v };
            let (start, end) = (fix(starts[k]), fix(ends[k]));
            let (start, end) = if step > 0 {
                (start.clamp(0, dim), end.clamp(0, dim))
            } else {
                (start.clamp(0, dim - 1), end.clamp(-1, dim - 1))
            };
            let count = if step > 0 {
                if end > start {
                    (end - start + step - 1) / step
                } else {
                    0
                }
            } else if start > end {
                (start - end + (-step) - 1) / (-step)
            } else {
                0
            };
            shape[a] = count as usize;
            st[a] = if count > 0 { start as usize } else { 0 };
            sp[a] = step as isize;
        }
        self.emit(n, Op::Slice { starts: st, steps: sp }, &[x], Some(out), Some(&shape))?;
        Ok(())
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

/// `f(a[i], b[j])` over the broadcast of two small host tensors, as bool.
fn broadcast_map(a: &Tensor, b: &Tensor, f: impl Fn(f64, f64) -> bool) -> std::result::Result<Tensor, Why> {
    let shape = broadcast_shapes(&a.shape, &b.shape).ok_or_else(|| {
        format!(
            "input shapes {} and {} do not broadcast",
            ShapeDisplay(&a.shape),
            ShapeDisplay(&b.shape)
        )
    })?;
    let n: usize = shape.iter().product();
    if n > FETCH_LIMIT {
        return Err(format!("{} elements are too many to evaluate while importing", n));
    }
    let (va, vb) = (a.as_f64s(), b.as_f64s());
    let index = |s: &[usize], mut flat: usize| -> usize {
        // Row-major index into `s`, right-aligned against `shape`, broadcasting 1s.
        let mut at = 0;
        let mut stride = 1;
        for d in (0..shape.len()).rev() {
            let i = flat % shape[d];
            flat /= shape[d];
            let Some(sd) = (d + s.len()).checked_sub(shape.len()) else {
                continue;
            };
            if s[sd] != 1 {
                at += i * stride;
            }
            stride *= s[sd];
        }
        at
    };
    let out = (0..n)
        .map(|i| u8::from(f(va[index(&a.shape, i)], vb[index(&b.shape, i)])))
        .collect();
    Ok(Tensor::bool(&shape, out))
}

/// The shape a Reshape produces: 0 copies the input dim (unless
/// `allowzero`), one -1 takes what is left.
fn reshape_target(input: &[usize], spec: &[i64], allowzero: bool) -> std::result::Result<Vec<usize>, Why> {
    let total: usize = input.iter().product();
    let mut out = Vec::with_capacity(spec.len());
    let mut infer_at = None;
    for (i, &d) in spec.iter().enumerate() {
        match d {
            -1 if infer_at.is_none() => {
                infer_at = Some(i);
                out.push(1);
            }
            0 if !allowzero => out.push(*input.get(i).ok_or("Reshape 0 beyond the input's rank")?),
            d if d >= 0 => out.push(d as usize),
            _ => return Err(format!("Reshape shape {spec:?} is invalid")),
        }
    }
    if let Some(i) = infer_at {
        let known: usize = out.iter().product();
        if known == 0 || !total.is_multiple_of(known) {
            return Err(format!("cannot reshape {} into {spec:?}", ShapeDisplay(input)));
        }
        out[i] = total / known;
    }
    if out.iter().product::<usize>() != total {
        return Err(format!("cannot reshape {} into {spec:?}", ShapeDisplay(input)));
    }
    Ok(out)
}
