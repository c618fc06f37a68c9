//! ORT-neutral descriptions of a graph, as the EP reads them from ORT: what
//! [`super::check_support`] judges and [`super::import`] turns into IR.

use std::collections::{BTreeMap, HashMap};

use crate::error::Result;

/// An ONNX node attribute.
#[derive(Clone, Debug, PartialEq)]
pub enum AttrValue {
    Int(i64),
    Ints(Vec<i64>),
    Float(f32),
    Floats(Vec<f32>),
    String(String),
    Strings(Vec<String>),
    Tensor(TensorValue),
    /// An attribute kind kiln does not read (graph, sparse tensor, ...), by name.
    Unsupported(String),
}

/// A constant tensor: ONNX element type, static shape, raw little-endian bytes.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorValue {
    pub elem_type: i32,
    pub shape: Vec<usize>,
    pub bytes: Vec<u8>,
}

/// A value's type as ORT inferred it: ONNX element type (0 = unknown or not
/// a tensor) and dims (`None` = unknown rank; -1 = symbolic/unknown dim).
#[derive(Clone, Debug, PartialEq, Default)]
pub struct ValueDesc {
    pub elem_type: i32,
    pub dims: Option<Vec<i64>>,
    /// The ONNX `dim_param` of each dim ("" when it has none, or empty when
    /// ORT named none): dims with the same name are the same symbol.
    pub dim_params: Vec<String>,
}

impl ValueDesc {
    pub fn new(elem_type: i32, dims: &[i64]) -> ValueDesc {
        ValueDesc {
            elem_type,
            dims: Some(dims.to_vec()),
            dim_params: Vec::new(),
        }
    }

    /// Like [`ValueDesc::new`], with the dims' names (`""` for unnamed).
    pub fn named(elem_type: i32, dims: &[i64], dim_params: &[&str]) -> ValueDesc {
        ValueDesc {
            elem_type,
            dims: Some(dims.to_vec()),
            dim_params: dim_params.iter().map(|s| s.to_string()).collect(),
        }
    }

    /// The dims as symbolic [`Dim`](crate::tensor::Dim)s: a known size, the
    /// dim's `dim_param`, or (unnamed) a symbol of its own, `value.i`.
    /// `None` for an unknown rank.
    pub fn symbolic_dims(&self, value: &str) -> Option<Vec<crate::tensor::Dim>> {
        use crate::tensor::Dim;
        let dims = self.dims.as_ref()?;
        let dim = |(i, &d): (usize, &i64)| match self.dim_param(i) {
            _ if d >= 0 => Dim::known(d),
            Some(name) => Dim::sym(name),
            None => Dim::sym(&format!("{value}.{i}")),
        };
        Some(dims.iter().enumerate().map(dim).collect())
    }

    /// The name of dim `i`, if ORT gave it one. A placeholder without a
    /// letter or digit names nothing: exporters (paddle2onnx) write `?` for
    /// every unknown dim, which need not be equal (PP-OCR's `[?, 3, ?, ?]`
    /// images are not square), and ORT does not hold them equal either.
    pub fn dim_param(&self, i: usize) -> Option<&str> {
        self.dim_params
            .get(i)
            .map(String::as_str)
            .filter(|s| s.chars().any(char::is_alphanumeric))
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct NodeDesc {
    pub name: String,
    pub domain: String,
    pub op_type: String,
    /// The opset version of the node's domain the model imports.
    pub since_version: i32,
    /// `""` = an omitted optional input.
    pub inputs: Vec<String>,
    /// `""` = an omitted optional output.
    pub outputs: Vec<String>,
    pub attrs: BTreeMap<String, AttrValue>,
}

/// Lazily supplies constant initializers (only what kiln asks for is read:
/// weights can be large).
pub trait ConstantSource {
    fn is_constant(&self, name: &str) -> bool;
    /// `Ok(None)` when `name` is not a constant.
    fn constant(&self, name: &str) -> Result<Option<TensorValue>>;
    /// The constant's bytes in kiln's own storage, when the source holds
    /// them already (a shape-generic partition): imported without a copy.
    fn weight(&self, _name: &str) -> Option<crate::plan::Weight> {
        None
    }
}

/// A graph (or one partition of it).
#[derive(Clone, Debug, Default)]
pub struct GraphDesc {
    /// Topological order.
    pub nodes: Vec<NodeDesc>,
    pub values: HashMap<String, ValueDesc>,
    pub inputs: Vec<String>,
    pub outputs: Vec<String>,
}

impl GraphDesc {
    /// The nodes at `indices` (ascending, so still topological) with the
    /// types of every value they touch: one partition, as it would be
    /// described on its own.
    pub fn subset(&self, indices: &[usize]) -> GraphDesc {
        let nodes: Vec<NodeDesc> = indices.iter().map(|&i| self.nodes[i].clone()).collect();
        let mut values = HashMap::new();
        for name in nodes.iter().flat_map(|n| n.inputs.iter().chain(&n.outputs)) {
            if let Some(v) = self.values.get(name) {
                values.entry(name.clone()).or_insert_with(|| v.clone());
            }
        }
        GraphDesc {
            nodes,
            values,
            ..GraphDesc::default()
        }
    }

    /// The producer and the readers of every value (omitted ones skipped).
    pub fn links(&self) -> Links<'_> {
        let mut links = Links {
            producer: HashMap::new(),
            consumers: HashMap::new(),
        };
        for (i, node) in self.nodes.iter().enumerate() {
            for out in node.outputs.iter().filter(|o| !o.is_empty()) {
                links.producer.insert(out.as_str(), i);
            }
            for input in node.inputs.iter().filter(|x| !x.is_empty()) {
                links.consumers.entry(input.as_str()).or_default().push(i);
            }
        }
        links
    }
}

/// Who produces and who reads each value of a [`GraphDesc`] (node indices).
pub struct Links<'a> {
    pub producer: HashMap<&'a str, usize>,
    pub consumers: HashMap<&'a str, Vec<usize>>,
}

impl Links<'_> {
    /// The nodes reading `value` (none for an unknown name).
    pub fn consumers_of(&self, value: &str) -> &[usize] {
        self.consumers.get(value).map_or(&[], Vec::as_slice)
    }
}

/// A [`ConstantSource`] without constants.
pub struct NoConstants;

pub const NO_CONSTANTS: NoConstants = NoConstants;

impl ConstantSource for NoConstants {
    fn is_constant(&self, _: &str) -> bool {
        false
    }
    fn constant(&self, _: &str) -> Result<Option<TensorValue>> {
        Ok(None)
    }
}

impl ConstantSource for HashMap<String, TensorValue> {
    fn is_constant(&self, name: &str) -> bool {
        self.contains_key(name)
    }
    fn constant(&self, name: &str) -> Result<Option<TensorValue>> {
        Ok(self.get(name).cloned())
    }
}
