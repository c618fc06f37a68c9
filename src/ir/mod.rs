//! kiln's graph IR: the subgraph ORT hands over, with static types, in
//! topological order. It knows nothing of ORT; `ep` builds it.

use std::fmt;

use crate::error::{Error, Result};
use crate::plan::Weight;

/// An element type kiln can compute with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DType {
    F32,
}

/// ONNX `TensorProto.DataType` code of `float`.
const ONNX_FLOAT: i32 = 1;

impl DType {
    pub fn from_onnx(code: i32) -> Option<DType> {
        match code {
            ONNX_FLOAT => Some(DType::F32),
            _ => None,
        }
    }

    pub fn onnx_code(self) -> i32 {
        match self {
            DType::F32 => ONNX_FLOAT,
        }
    }

    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::F32 => 4,
        }
    }

    /// The ONNX spelling, e.g. "float".
    pub fn name(self) -> &'static str {
        onnx_type_name(self.onnx_code())
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The ONNX spelling of a `TensorProto.DataType` code, for messages such as
/// "input 1 is int64, kiln supports float".
pub fn onnx_type_name(code: i32) -> &'static str {
    match code {
        1 => "float",
        2 => "uint8",
        3 => "int8",
        4 => "uint16",
        5 => "int16",
        6 => "int32",
        7 => "int64",
        8 => "string",
        9 => "bool",
        10 => "float16",
        11 => "double",
        12 => "uint32",
        13 => "uint64",
        14 => "complex64",
        15 => "complex128",
        16 => "bfloat16",
        17..=20 => "float8",
        21 => "uint4",
        22 => "int4",
        _ => "an unknown type",
    }
}

/// A tensor's element type and static shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorType {
    pub dtype: DType,
    pub shape: Vec<usize>,
}

impl TensorType {
    pub fn f32(shape: &[usize]) -> Self {
        TensorType {
            dtype: DType::F32,
            shape: shape.to_vec(),
        }
    }

    /// Element count; saturates instead of overflowing (validate rejects such shapes).
    pub fn numel(&self) -> usize {
        self.shape.iter().fold(1usize, |n, &d| n.saturating_mul(d))
    }

    /// Element count, or `None` if the tensor could not fit in memory.
    pub fn checked_numel(&self) -> Option<usize> {
        let n = self.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d))?;
        let bytes = n.checked_mul(self.dtype.size())?;
        (bytes <= isize::MAX as usize).then_some(n)
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}", self.dtype, ShapeDisplay(&self.shape))
    }
}

/// Formats a shape as `[2,3,4]`.
pub(crate) struct ShapeDisplay<'a>(pub &'a [usize]);

impl fmt::Display for ShapeDisplay<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

/// An operator kiln implements.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Op {
    Add,
    Sub,
    Mul,
    Div,
    Relu,
    Sigmoid,
    Tanh,
    Neg,
    Abs,
    Sqrt,
    Exp,
    Identity,
}

impl Op {
    pub const ALL: &'static [Op] = &[
        Op::Add,
        Op::Sub,
        Op::Mul,
        Op::Div,
        Op::Relu,
        Op::Sigmoid,
        Op::Tanh,
        Op::Neg,
        Op::Abs,
        Op::Sqrt,
        Op::Exp,
        Op::Identity,
    ];

    /// The op for an ONNX node of the default domain ("" or "ai.onnx").
    pub fn from_onnx(domain: &str, op_type: &str) -> Option<Op> {
        if !matches!(domain, "" | "ai.onnx") {
            return None;
        }
        Op::ALL.iter().copied().find(|op| op.onnx_name() == op_type)
    }

    pub fn onnx_name(self) -> &'static str {
        match self {
            Op::Add => "Add",
            Op::Sub => "Sub",
            Op::Mul => "Mul",
            Op::Div => "Div",
            Op::Relu => "Relu",
            Op::Sigmoid => "Sigmoid",
            Op::Tanh => "Tanh",
            Op::Neg => "Neg",
            Op::Abs => "Abs",
            Op::Sqrt => "Sqrt",
            Op::Exp => "Exp",
            Op::Identity => "Identity",
        }
    }

    pub fn is_binary(self) -> bool {
        matches!(self, Op::Add | Op::Sub | Op::Mul | Op::Div)
    }

    pub fn num_inputs(self) -> usize {
        if self.is_binary() {
            2
        } else {
            1
        }
    }

    pub fn num_outputs(self) -> usize {
        1
    }

    /// Whether kiln can run this node with these static types; `Err` says why not.
    pub fn check(self, inputs: &[TensorType], outputs: &[TensorType]) -> std::result::Result<(), String> {
        let name = self.onnx_name();
        if inputs.len() != self.num_inputs() {
            return Err(format!(
                "{name} takes {} input(s), got {}",
                self.num_inputs(),
                inputs.len()
            ));
        }
        if outputs.len() != self.num_outputs() {
            return Err(format!(
                "{name} has {} output(s), got {}",
                self.num_outputs(),
                outputs.len()
            ));
        }
        check_dtypes("input", inputs)?;
        check_dtypes("output", outputs)?;
        let expected = self.output_shape(inputs)?;
        if outputs[0].shape != expected {
            return Err(format!(
                "output shape {} does not match the expected {}",
                ShapeDisplay(&outputs[0].shape),
                ShapeDisplay(&expected)
            ));
        }
        Ok(())
    }

    /// The output shape for these inputs (arity already checked).
    fn output_shape(self, inputs: &[TensorType]) -> std::result::Result<Vec<usize>, String> {
        if !self.is_binary() {
            return Ok(inputs[0].shape.clone());
        }
        let (a, b) = (&inputs[0].shape, &inputs[1].shape);
        broadcast_shapes(a, b).ok_or_else(|| {
            format!(
                "input shapes {} and {} do not broadcast",
                ShapeDisplay(a),
                ShapeDisplay(b)
            )
        })
    }
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.onnx_name())
    }
}

fn check_dtypes(what: &str, types: &[TensorType]) -> std::result::Result<(), String> {
    for (i, t) in types.iter().enumerate() {
        // Only f32 exists today; this is where new dtypes get refused per op.
        if t.dtype != DType::F32 {
            return Err(format!("{what} {i} is {}, kiln supports float", t.dtype));
        }
    }
    Ok(())
}

/// The shape of `a op b` under ONNX multidirectional (NumPy) broadcasting.
pub fn broadcast_shapes(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let rank = a.len().max(b.len());
    let dim = |s: &[usize], i: usize| {
        // Right-align: missing leading dims count as 1.
        let pad = rank - s.len();
        if i < pad {
            1
        } else {
            s[i - pad]
        }
    };
    (0..rank)
        .map(|i| match (dim(a, i), dim(b, i)) {
            (x, y) if x == y => Some(x),
            (1, y) => Some(y),
            (x, 1) => Some(x),
            _ => None,
        })
        .collect()
}

/// Index of a value in [`Graph::values`].
pub type ValueId = usize;

#[derive(Clone, Debug, PartialEq)]
pub struct Value {
    pub name: String,
    pub ty: TensorType,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Node {
    pub name: String,
    pub op: Op,
    pub inputs: Vec<ValueId>,
    pub outputs: Vec<ValueId>,
}

/// A subgraph with static types. Nodes must be in topological order.
#[derive(Clone, Debug)]
pub struct Graph {
    pub name: String,
    pub values: Vec<Value>,
    pub nodes: Vec<Node>,
    pub inputs: Vec<ValueId>,
    pub outputs: Vec<ValueId>,
    pub constants: Vec<(ValueId, Weight)>,
}

/// Where a value comes from; used by `validate`.
#[derive(Clone, Copy)]
enum Source {
    Input,
    Constant,
    Node(usize),
}

impl Graph {
    pub fn new(name: impl Into<String>) -> Self {
        Graph {
            name: name.into(),
            values: Vec::new(),
            nodes: Vec::new(),
            inputs: Vec::new(),
            outputs: Vec::new(),
            constants: Vec::new(),
        }
    }

    /// Declares a value; declaring the same name again with the same type
    /// returns the same id.
    pub fn add_value(&mut self, name: &str, ty: TensorType) -> Result<ValueId> {
        if name.is_empty() {
            crate::bail!(InvalidGraph, "graph '{}': a value has an empty name", self.name);
        }
        if let Some(id) = self.value_id(name) {
            let old = &self.values[id].ty;
            if *old != ty {
                crate::bail!(
                    InvalidGraph,
                    "graph '{}': value '{name}' declared as {old} and as {ty}",
                    self.name
                );
            }
            return Ok(id);
        }
        self.values.push(Value {
            name: name.to_string(),
            ty,
        });
        Ok(self.values.len() - 1)
    }

    pub fn value_id(&self, name: &str) -> Option<ValueId> {
        // Linear: graphs handed to kiln are small, and this runs once per build.
        self.values.iter().position(|v| v.name == name)
    }

    pub fn add_node(&mut self, name: &str, op: Op, inputs: Vec<ValueId>, outputs: Vec<ValueId>) {
        self.nodes.push(Node {
            name: name.to_string(),
            op,
            inputs,
            outputs,
        });
    }

    /// Gives value `id` constant contents (row-major, `numel` elements).
    pub fn add_constant(&mut self, id: ValueId, data: Vec<f32>) -> Result<()> {
        self.add_constant_weight(id, Weight::from_vec(data))
    }

    /// Like [`Graph::add_constant`], for data that already lives in shared
    /// storage (kept in place, not copied).
    pub fn add_constant_weight(&mut self, id: ValueId, data: Weight) -> Result<()> {
        let value = self.value(id)?;
        if value.ty.dtype != DType::F32 {
            crate::bail!(
                InvalidGraph,
                "constant '{}' is {}, kiln supports float",
                value.name,
                value.ty.dtype
            );
        }
        if data.len() != value.ty.numel() {
            crate::bail!(
                InvalidGraph,
                "constant '{}' of type {} has {} elements, expected {}",
                value.name,
                value.ty,
                data.len(),
                value.ty.numel()
            );
        }
        if self.constants.iter().any(|(c, _)| *c == id) {
            crate::bail!(InvalidGraph, "constant '{}' is given twice", value.name);
        }
        self.constants.push((id, data));
        Ok(())
    }

    /// Checks that the graph is well formed and that kiln supports every node.
    pub fn validate(&self) -> Result<()> {
        self.validate_inner()
            .map_err(|e| e.context(format_args!("graph '{}'", self.name)))
    }

    fn validate_inner(&self) -> Result<()> {
        for v in &self.values {
            if v.ty.checked_numel().is_none() {
                crate::bail!(InvalidGraph, "value '{}' of type {} is too large", v.name, v.ty);
            }
        }
        let mut source: Vec<Option<Source>> = vec![None; self.values.len()];
        for &id in &self.inputs {
            self.define(&mut source, id, Source::Input, "graph input")?;
        }
        for (id, data) in &self.constants {
            self.define(&mut source, *id, Source::Constant, "constant")?;
            let v = &self.values[*id];
            if data.len() != v.ty.numel() {
                crate::bail!(
                    InvalidGraph,
                    "constant '{}' has {} elements, its type {} needs {}",
                    v.name,
                    data.len(),
                    v.ty,
                    v.ty.numel()
                );
            }
        }
        for i in 0..self.nodes.len() {
            self.validate_node(&mut source, i)
                .map_err(|e| e.context(self.node_label(i)))?;
        }
        for &id in &self.outputs {
            let v = self.value(id)?;
            if source[id].is_none() {
                crate::bail!(
                    InvalidGraph,
                    "graph output '{}' is not produced by any node, input or constant",
                    v.name
                );
            }
        }
        Ok(())
    }

    fn validate_node(&self, source: &mut [Option<Source>], i: usize) -> Result<()> {
        let node = &self.nodes[i];
        let mut in_types = Vec::with_capacity(node.inputs.len());
        for (k, &id) in node.inputs.iter().enumerate() {
            let v = self.value(id)?;
            if source[id].is_none() {
                crate::bail!(
                    InvalidGraph,
                    "input {k} '{}' is not a graph input, a constant or an earlier node's output",
                    v.name
                );
            }
            in_types.push(v.ty.clone());
        }
        let mut out_types = Vec::with_capacity(node.outputs.len());
        for &id in &node.outputs {
            out_types.push(self.value(id)?.ty.clone());
        }
        node.op.check(&in_types, &out_types).map_err(Error::invalid_graph)?;
        for &id in &node.outputs {
            self.define(source, id, Source::Node(i), "node output")?;
        }
        Ok(())
    }

    /// Records where `id` comes from, refusing a second producer.
    fn define(&self, source: &mut [Option<Source>], id: ValueId, src: Source, what: &str) -> Result<()> {
        let name = &self.value(id)?.name;
        if let Some(old) = source[id] {
            let old = match old {
                Source::Input => "a graph input".to_string(),
                Source::Constant => "a constant".to_string(),
                Source::Node(n) => format!("the output of {}", self.node_label(n)),
            };
            crate::bail!(
                InvalidGraph,
                "value '{name}' is both {old} and a {what}; each value needs exactly one producer"
            );
        }
        source[id] = Some(src);
        Ok(())
    }

    fn value(&self, id: ValueId) -> Result<&Value> {
        self.values.get(id).ok_or_else(|| {
            Error::invalid_graph(format!("value id {id} is out of range ({} values)", self.values.len()))
        })
    }

    /// "node 'name' (Op)", or "node #i (Op)" for unnamed nodes.
    pub fn node_label(&self, i: usize) -> String {
        match self.nodes.get(i) {
            Some(n) if !n.name.is_empty() => format!("node '{}' ({})", n.name, n.op),
            Some(n) => format!("node #{i} ({})", n.op),
            None => format!("node #{i}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    fn f32t(shape: &[usize]) -> TensorType {
        TensorType::f32(shape)
    }

    #[test]
    fn dtype_codes() {
        assert_eq!(DType::from_onnx(1), Some(DType::F32));
        assert_eq!(DType::from_onnx(7), None);
        assert_eq!(DType::F32.onnx_code(), 1);
        assert_eq!(DType::F32.size(), 4);
        assert_eq!(DType::F32.to_string(), "float");
        assert_eq!(onnx_type_name(7), "int64");
    }

    #[test]
    fn tensor_type_numel() {
        assert_eq!(f32t(&[2, 3, 4]).numel(), 24);
        assert_eq!(f32t(&[]).numel(), 1);
        assert_eq!(f32t(&[0, 5]).numel(), 0);
        assert_eq!(f32t(&[usize::MAX, 2]).checked_numel(), None);
        assert_eq!(f32t(&[2, 3]).to_string(), "float[2,3]");
    }

    #[test]
    fn op_names_round_trip() {
        for &op in Op::ALL {
            assert_eq!(Op::from_onnx("", op.onnx_name()), Some(op));
            assert_eq!(Op::from_onnx("ai.onnx", op.onnx_name()), Some(op));
            assert_eq!(Op::from_onnx("com.microsoft", op.onnx_name()), None);
        }
        assert_eq!(Op::from_onnx("", "add"), None);
        assert_eq!(Op::from_onnx("", "MatMul"), None);
        assert_eq!(Op::Add.num_inputs(), 2);
        assert_eq!(Op::Exp.num_inputs(), 1);
    }

    #[test]
    fn broadcasting_rules() {
        let b = broadcast_shapes;
        assert_eq!(b(&[2, 3, 4], &[3, 1]), Some(vec![2, 3, 4]));
        assert_eq!(b(&[2, 3, 4], &[4]), Some(vec![2, 3, 4]));
        assert_eq!(b(&[2, 3, 4], &[]), Some(vec![2, 3, 4]));
        assert_eq!(b(&[1, 1, 4], &[2, 3, 1]), Some(vec![2, 3, 4]));
        assert_eq!(b(&[], &[]), Some(vec![]));
        assert_eq!(b(&[0, 3], &[1, 3]), Some(vec![0, 3]));
        assert_eq!(b(&[2, 3], &[4]), None);
        assert_eq!(b(&[0], &[2]), None);
    }

    #[test]
    fn check_explains_refusals() {
        let ok = Op::Add.check(&[f32t(&[2, 3]), f32t(&[3])], &[f32t(&[2, 3])]);
        assert_eq!(ok, Ok(()));
        let e = Op::Add
            .check(&[f32t(&[2, 3]), f32t(&[4])], &[f32t(&[2, 3])])
            .unwrap_err();
        assert!(e.contains("[2,3]") && e.contains("[4]"), "{e}");
        let e = Op::Add.check(&[f32t(&[2])], &[f32t(&[2])]).unwrap_err();
        assert!(e.contains("2 input"), "{e}");
        let e = Op::Relu.check(&[f32t(&[2])], &[f32t(&[3])]).unwrap_err();
        assert!(e.contains("[3]") && e.contains("[2]"), "{e}");
        let e = Op::Relu.check(&[f32t(&[2])], &[f32t(&[2]), f32t(&[2])]).unwrap_err();
        assert!(e.contains("output"), "{e}");
    }

    #[test]
    fn add_value_dedups_by_name() {
        let mut g = Graph::new("g");
        let a = g.add_value("a", f32t(&[2])).unwrap();
        assert_eq!(g.add_value("a", f32t(&[2])).unwrap(), a);
        let b = g.add_value("b", f32t(&[2])).unwrap();
        assert_ne!(a, b);
        assert_eq!(g.value_id("b"), Some(b));
        assert_eq!(g.value_id("c"), None);
        let e = g.add_value("a", f32t(&[3])).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidGraph);
        assert!(e.message.contains("'a'"), "{e}");
        assert!(g.add_value("", f32t(&[1])).is_err());
    }

    #[test]
    fn add_constant_checks_length() {
        let mut g = Graph::new("g");
        let c = g.add_value("c", f32t(&[2, 2])).unwrap();
        let e = g.add_constant(c, vec![1.0; 3]).unwrap_err();
        assert!(e.message.contains("'c'") && e.message.contains('3'), "{e}");
        g.add_constant(c, vec![1.0; 4]).unwrap();
        assert!(g.add_constant(c, vec![1.0; 4]).is_err());
        assert!(g.add_constant(99, vec![]).is_err());
    }

    /// x -> Relu -> y, plus whatever the test adds.
    fn relu_graph() -> (Graph, ValueId, ValueId) {
        let mut g = Graph::new("g");
        let x = g.add_value("x", f32t(&[4])).unwrap();
        let y = g.add_value("y", f32t(&[4])).unwrap();
        g.inputs.push(x);
        g.add_node("r", Op::Relu, vec![x], vec![y]);
        g.outputs.push(y);
        (g, x, y)
    }

    fn invalid(g: &Graph, needles: &[&str]) {
        let e = g.validate().unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidGraph, "{e}");
        for n in needles {
            assert!(e.message.contains(n), "{n:?} not in {e}");
        }
    }

    #[test]
    fn validate_accepts_good_graphs() {
        let (mut g, _, y) = relu_graph();
        let c = g.add_value("c", f32t(&[1])).unwrap();
        g.add_constant(c, vec![2.0]).unwrap();
        let z = g.add_value("z", f32t(&[4])).unwrap();
        g.add_node("m", Op::Mul, vec![y, c], vec![z]);
        g.outputs.push(z);
        g.outputs.push(c); // a constant may be an output
        g.validate().unwrap();
    }

    #[test]
    fn validate_rejects_undefined_input() {
        let (mut g, x, _) = relu_graph();
        let u = g.add_value("u", f32t(&[4])).unwrap();
        let z = g.add_value("z", f32t(&[4])).unwrap();
        g.add_node("add", Op::Add, vec![x, u], vec![z]);
        invalid(&g, &["'add'", "'u'", "earlier"]);
    }

    #[test]
    fn validate_rejects_out_of_order_nodes() {
        let (mut g, _, y) = relu_graph();
        let z = g.add_value("z", f32t(&[4])).unwrap();
        g.nodes.insert(
            0,
            Node {
                name: "first".into(),
                op: Op::Neg,
                inputs: vec![y],
                outputs: vec![z],
            },
        );
        invalid(&g, &["'first'", "'y'"]);
    }

    #[test]
    fn validate_rejects_two_producers() {
        let (mut g, x, y) = relu_graph();
        g.add_node("again", Op::Neg, vec![x], vec![y]);
        invalid(&g, &["'again'", "'y'", "'r'"]);
        let (mut g, x, _) = relu_graph();
        g.inputs.push(x);
        invalid(&g, &["'x'", "graph input"]);
        let (mut g, x, _) = relu_graph();
        g.add_constant(x, vec![0.0; 4]).unwrap();
        invalid(&g, &["'x'", "constant"]);
    }

    #[test]
    fn validate_rejects_unsupported_node() {
        let (mut g, x, _) = relu_graph();
        let w = g.add_value("w", f32t(&[3])).unwrap();
        g.inputs.push(w);
        let z = g.add_value("z", f32t(&[4])).unwrap();
        g.add_node("", Op::Sub, vec![x, w], vec![z]);
        invalid(&g, &["node #1 (Sub)", "[4]", "[3]", "broadcast"]);
        let (mut g, x, _) = relu_graph();
        let z = g.add_value("z", f32t(&[4])).unwrap();
        g.add_node("one", Op::Add, vec![x], vec![z]);
        invalid(&g, &["'one'", "2 input"]);
    }

    #[test]
    fn validate_rejects_unproduced_output_and_bad_ids() {
        let (mut g, _, _) = relu_graph();
        let z = g.add_value("z", f32t(&[4])).unwrap();
        g.outputs.push(z);
        invalid(&g, &["output 'z'"]);
        let (mut g, _, _) = relu_graph();
        g.outputs.push(42);
        invalid(&g, &["42"]);
        let (mut g, _, _) = relu_graph();
        g.nodes[0].inputs[0] = 42;
        invalid(&g, &["42", "'r'"]);
    }

    #[test]
    fn validate_rejects_bad_constant_and_huge_values() {
        let (mut g, _, _) = relu_graph();
        let c = g.add_value("c", f32t(&[2])).unwrap();
        g.constants.push((c, vec![1.0].into()));
        invalid(&g, &["'c'", "1 elements"]);
        let (mut g, _, _) = relu_graph();
        g.add_value("big", f32t(&[usize::MAX, 4])).unwrap();
        invalid(&g, &["'big'", "too large"]);
    }
}
