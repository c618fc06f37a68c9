//! ORT's graph → kiln's ORT-neutral description (`ir::GraphDesc`), which the
//! ORT-free compiler checks (GetCapability) and imports (Compile).

use std::collections::{BTreeMap, HashMap};

use crate::error::Result;
use crate::ffi::graph::{AttrRead, Graph, Node, ValueInfo};
use crate::ffi::tensor::TensorBytes;
use crate::ir::{AttrValue, ConstantSource, GraphDesc, NodeDesc, TensorValue, ValueDesc};

/// Describes `nodes` (topological) and every value they touch. `inputs` and
/// `outputs` name the graph's (or fused node's) inputs and outputs in order.
pub fn describe(nodes: &[Node<'_>], inputs: Vec<String>, outputs: Vec<String>) -> Result<GraphDesc> {
    let mut desc = GraphDesc {
        inputs,
        outputs,
        ..Default::default()
    };
    for node in nodes {
        let ins = node.inputs()?;
        let outs = node.outputs()?;
        for v in ins.iter().chain(&outs).flatten() {
            if let std::collections::hash_map::Entry::Vacant(e) = desc.values.entry(v.name()?) {
                e.insert(value_desc(v)?);
            }
        }
        desc.nodes.push(node_desc(node, &ins, &outs)?);
    }
    Ok(desc)
}

fn names(values: &[Option<ValueInfo<'_>>]) -> Result<Vec<String>> {
    values
        .iter()
        .map(|v| v.map_or(Ok(String::new()), |v| v.name()))
        .collect()
}

fn node_desc(node: &Node<'_>, ins: &[Option<ValueInfo<'_>>], outs: &[Option<ValueInfo<'_>>]) -> Result<NodeDesc> {
    let mut attrs = BTreeMap::new();
    // An EPContext node's attributes may hold a whole compiled model: never
    // copy them here (kiln reads the few it needs in `epcontext::reader`).
    if !super::epcontext::is_ep_context(node)? {
        for a in node.attributes()? {
            attrs.insert(a.name()?, attr_value(a.value()?));
        }
    }
    Ok(NodeDesc {
        name: node.name()?,
        domain: node.domain()?,
        op_type: node.op_type()?,
        since_version: node.since_version()?,
        inputs: names(ins)?,
        outputs: names(outs)?,
        attrs,
    })
}

fn value_desc(v: &ValueInfo<'_>) -> Result<ValueDesc> {
    let desc = match v.tensor_info()? {
        Some(info) => ValueDesc {
            elem_type: info.elem_type,
            // An unknown rank is not a scalar (ORT describes both with no dims;
            // `has_shape` tells them apart): the importer refuses it.
            dims: info.has_shape.then_some(info.dims),
            dim_params: info.dim_params,
        },
        None => ValueDesc::default(),
    };
    Ok(desc)
}

fn text(bytes: Vec<u8>) -> String {
    String::from_utf8_lossy(&bytes).into_owned()
}

fn attr_value(v: AttrRead) -> AttrValue {
    match v {
        AttrRead::Int(i) => AttrValue::Int(i),
        AttrRead::Ints(v) => AttrValue::Ints(v),
        AttrRead::Float(f) => AttrValue::Float(f),
        AttrRead::Floats(v) => AttrValue::Floats(v),
        AttrRead::String(b) => AttrValue::String(text(b)),
        AttrRead::Strings(v) => AttrValue::Strings(v.into_iter().map(text).collect()),
        AttrRead::Tensor(t) => match tensor_value(t) {
            Some(t) => AttrValue::Tensor(t),
            None => AttrValue::Unsupported("a tensor with a dynamic shape".into()),
        },
        AttrRead::Other(kind) => AttrValue::Unsupported(format!("attribute type {kind}")),
    }
}

fn tensor_value(t: TensorBytes) -> Option<TensorValue> {
    let shape = t
        .dims
        .iter()
        .map(|&d| usize::try_from(d).ok())
        .collect::<Option<Vec<_>>>()?;
    Some(TensorValue {
        elem_type: t.elem_type,
        shape,
        bytes: t.bytes,
    })
}

/// The constant initializers of an ORT graph, read only when asked for:
/// weights can be large, and GetCapability needs only small shape tensors.
pub struct Constants<'a> {
    initializers: HashMap<String, ValueInfo<'a>>,
}

impl<'a> Constants<'a> {
    /// The graph's own constant initializers, and those of an outer scope
    /// that `nodes` read (inside an `If`/`Loop`/`Scan` body): ORT drops both
    /// from a fused node's inputs, so Compile must find them here too.
    pub fn of(graph: &Graph<'a>, nodes: &[Node<'a>]) -> Result<Constants<'a>> {
        let mut initializers = HashMap::new();
        for init in graph.initializers()? {
            if init.is_constant_initializer()? {
                initializers.insert(init.name()?, init);
            }
        }
        for node in nodes {
            for v in node.inputs()?.into_iter().flatten() {
                let name = v.name()?;
                if !initializers.contains_key(&name) && v.is_constant_initializer()? {
                    initializers.insert(name, v);
                }
            }
        }
        Ok(Constants { initializers })
    }
}

impl ConstantSource for Constants<'_> {
    fn is_constant(&self, name: &str) -> bool {
        self.initializers.contains_key(name)
    }

    fn constant(&self, name: &str) -> Result<Option<TensorValue>> {
        let Some(v) = self.initializers.get(name) else {
            return Ok(None);
        };
        Ok(v.copy_initializer()?.and_then(tensor_value))
    }
}
