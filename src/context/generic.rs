//! `GenericGraph` <-> metadata messages (format 2). Encoding cannot fail;
//! decoding refuses anything malformed. The same checks run when a graph is
//! added to a builder, so a file never holds a graph its reader refuses.
//!
//! What is checked here is the record's form (names, attribute kinds, byte
//! sizes, bounds); whether the graph makes sense is `ir::import`'s job when
//! a program is built from it at run time.

use std::collections::{BTreeMap, HashMap, HashSet};

use super::convert::dims;
use super::proto::{self, attr_info};
use crate::compiler::generic::{GenericGraph, NamedConstant, PackedConstant};
use crate::error::{Error, Result};
use crate::ir::{AttrValue, DType, GraphDesc, NodeDesc, TensorValue, ValueDesc};
use crate::kernels::gemm::PackedB;
use crate::plan::{Constant, Packing};
use crate::target::Target;

/// Most dims a value or tensor may have (ONNX sets no limit; real models
/// stay far below).
pub const MAX_RANK: usize = 64;

// ---- encoding ----

/// The record of `g`; `constant_ids[i]` and `packed_ids[i]` are the file's
/// weight ids of `g.constants[i]` and `g.packed[i]`.
pub(crate) fn generic_info(g: &GenericGraph, constant_ids: &[u32], packed_ids: &[u32]) -> proto::GenericInfo {
    // Sorted: equal graphs give equal bytes (the file checksum is its identity).
    let mut values: Vec<proto::ValueInfo> = g.desc.values.iter().map(|(n, v)| value_info(n, v)).collect();
    values.sort_by(|a, b| a.name.cmp(&b.name));
    proto::GenericInfo {
        nodes: g.desc.nodes.iter().map(node_info).collect(),
        values,
        inputs: g.desc.inputs.clone(),
        outputs: g.desc.outputs.clone(),
        constants: g
            .constants
            .iter()
            .zip(constant_ids)
            .map(|(c, &weight_id)| proto::NamedWeight {
                name: c.name.clone(),
                weight_id,
            })
            .collect(),
        packed: g
            .packed
            .iter()
            .zip(packed_ids)
            .map(|(p, &weight_id)| proto::PackedWeight {
                source: p.source.clone(),
                trans_b: p.trans_b,
                weight_id,
                conv_group: p.conv_group.map(|g| g as u64),
            })
            .collect(),
        no_winograd: !g.winograd,
    }
}

fn value_info(name: &str, v: &ValueDesc) -> proto::ValueInfo {
    proto::ValueInfo {
        name: name.to_string(),
        elem_type: v.elem_type,
        unknown_rank: v.dims.is_none(),
        dims: v.dims.clone().unwrap_or_default(),
        dim_params: v.dim_params.clone(),
    }
}

fn node_info(n: &NodeDesc) -> proto::NodeInfo {
    proto::NodeInfo {
        name: n.name.clone(),
        domain: n.domain.clone(),
        op_type: n.op_type.clone(),
        since_version: n.since_version,
        inputs: n.inputs.clone(),
        outputs: n.outputs.clone(),
        attrs: n.attrs.iter().map(|(k, v)| attr_info(k, v)).collect(),
    }
}

fn attr_info(name: &str, v: &AttrValue) -> proto::AttrInfo {
    use attr_info::Value as V;
    let value = match v {
        AttrValue::Int(i) => V::Int(*i),
        AttrValue::Ints(v) => V::Ints(proto::Ints { values: v.clone() }),
        AttrValue::Float(f) => V::Float(*f),
        AttrValue::Floats(v) => V::Floats(proto::Floats { values: v.clone() }),
        AttrValue::String(s) => V::String(s.clone()),
        AttrValue::Strings(v) => V::Strings(proto::Strings { values: v.clone() }),
        AttrValue::Tensor(t) => V::Tensor(proto::TensorValueInfo {
            elem_type: t.elem_type,
            shape: dims(&t.shape),
            data: t.bytes.clone(),
        }),
        AttrValue::Unsupported(what) => V::Unsupported(what.clone()),
    };
    proto::AttrInfo {
        name: name.to_string(),
        value: Some(value),
    }
}

// ---- decoding ----

/// The graph of record `info`; `weights` are the file's weights by id.
pub(crate) fn generic_graph(info: &proto::GenericInfo, target: Target, weights: &[Constant]) -> Result<GenericGraph> {
    let constants = info
        .constants
        .iter()
        .map(|c| named_constant(c, weights).map_err(|e| e.context(format_args!("constant '{}'", c.name))))
        .collect::<Result<Vec<_>>>()?;
    let packed = info
        .packed
        .iter()
        .map(|p| packed_constant(p, weights).map_err(|e| e.context(format_args!("packed weight of '{}'", p.source))))
        .collect::<Result<Vec<_>>>()?;
    let g = GenericGraph {
        desc: desc(info)?,
        constants,
        packed,
        target,
        winograd: !info.no_winograd,
    };
    check_weights(&g)?;
    Ok(g)
}

fn weight(id: u32, weights: &[Constant]) -> Result<&Constant> {
    weights
        .get(id as usize)
        .ok_or_else(|| Error::invalid_graph(format!("weight id {id} is out of range ({} weights)", weights.len())))
}

fn named_constant(c: &proto::NamedWeight, weights: &[Constant]) -> Result<NamedConstant> {
    let w = weight(c.weight_id, weights)?;
    if w.packing != Packing::None {
        crate::bail!(
            InvalidGraph,
            "weight {} is packed, a constant must be plain",
            c.weight_id
        );
    }
    Ok(NamedConstant {
        name: c.name.clone(),
        dtype: w.dtype,
        shape: w.shape.to_vec(),
        data: w.data.clone(),
    })
}

fn packed_constant(p: &proto::PackedWeight, weights: &[Constant]) -> Result<PackedConstant> {
    let w = weight(p.weight_id, weights)?;
    let Packing::GemmB { k, n } = w.packing else {
        crate::bail!(InvalidGraph, "weight {} is not a packed GEMM weight", p.weight_id);
    };
    Ok(PackedConstant {
        source: p.source.clone(),
        trans_b: p.trans_b,
        conv_group: p
            .conv_group
            .map(|g| crate::context::convert::usize_of(g, "convolution group"))
            .transpose()?,
        k,
        n,
        data: w.data.clone(),
    })
}

/// The graph description of record `info`, its form checked.
pub(crate) fn desc(info: &proto::GenericInfo) -> Result<GraphDesc> {
    let mut values = HashMap::with_capacity(info.values.len());
    for v in &info.values {
        let desc = value_desc(v).map_err(|e| e.context(format_args!("value '{}'", v.name)))?;
        if v.name.is_empty() || values.insert(v.name.clone(), desc).is_some() {
            crate::bail!(InvalidGraph, "value name '{}' is empty or repeated", v.name);
        }
    }
    let nodes = info
        .nodes
        .iter()
        .enumerate()
        .map(|(i, n)| node_desc(n).map_err(|e| e.context(format_args!("node {i} '{}'", n.name))))
        .collect::<Result<Vec<_>>>()?;
    for (what, names) in [("input", &info.inputs), ("output", &info.outputs)] {
        if names.iter().any(String::is_empty) {
            crate::bail!(InvalidGraph, "a graph {what} has an empty name");
        }
    }
    Ok(GraphDesc {
        nodes,
        values,
        inputs: info.inputs.clone(),
        outputs: info.outputs.clone(),
    })
}

fn value_desc(v: &proto::ValueInfo) -> Result<ValueDesc> {
    if v.unknown_rank && !(v.dims.is_empty() && v.dim_params.is_empty()) {
        crate::bail!(InvalidGraph, "a value of unknown rank has dims");
    }
    check_rank(v.dims.len())?;
    if let Some(&d) = v.dims.iter().find(|&&d| d < -1) {
        crate::bail!(InvalidGraph, "dim {d} is neither a size nor -1 (unknown)");
    }
    if !v.dim_params.is_empty() && v.dim_params.len() != v.dims.len() {
        crate::bail!(
            InvalidGraph,
            "{} dim names for {} dims",
            v.dim_params.len(),
            v.dims.len()
        );
    }
    Ok(ValueDesc {
        elem_type: v.elem_type,
        dims: (!v.unknown_rank).then(|| v.dims.clone()),
        dim_params: v.dim_params.clone(),
    })
}

fn check_rank(rank: usize) -> Result<()> {
    if rank > MAX_RANK {
        crate::bail!(InvalidGraph, "rank {rank} is above kiln's limit of {MAX_RANK}");
    }
    Ok(())
}

fn node_desc(n: &proto::NodeInfo) -> Result<NodeDesc> {
    if n.op_type.is_empty() {
        crate::bail!(InvalidGraph, "the node has no op type");
    }
    let mut attrs = BTreeMap::new();
    for a in &n.attrs {
        let value = attr_value(a).map_err(|e| e.context(format_args!("attribute '{}'", a.name)))?;
        if a.name.is_empty() || attrs.insert(a.name.clone(), value).is_some() {
            crate::bail!(InvalidGraph, "attribute name '{}' is empty or repeated", a.name);
        }
    }
    Ok(NodeDesc {
        name: n.name.clone(),
        domain: n.domain.clone(),
        op_type: n.op_type.clone(),
        since_version: n.since_version,
        inputs: n.inputs.clone(),
        outputs: n.outputs.clone(),
        attrs,
    })
}

fn attr_value(a: &proto::AttrInfo) -> Result<AttrValue> {
    use attr_info::Value as V;
    let value = a
        .value
        .as_ref()
        .ok_or_else(|| Error::invalid_graph("the attribute has no value"))?;
    Ok(match value {
        V::Int(i) => AttrValue::Int(*i),
        V::Ints(v) => AttrValue::Ints(v.values.clone()),
        V::Float(f) => AttrValue::Float(*f),
        V::Floats(v) => AttrValue::Floats(v.values.clone()),
        V::String(s) => AttrValue::String(s.clone()),
        V::Strings(v) => AttrValue::Strings(v.values.clone()),
        V::Tensor(t) => AttrValue::Tensor(tensor_value(t)?),
        V::Unsupported(what) => AttrValue::Unsupported(what.clone()),
    })
}

fn tensor_value(t: &proto::TensorValueInfo) -> Result<TensorValue> {
    check_rank(t.shape.len())?;
    let shape = super::convert::shape(&t.shape)?;
    let size = elem_size(t.elem_type).ok_or_else(|| {
        Error::invalid_graph(format!(
            "a tensor of {} (code {}) is not one kiln stores",
            crate::ir::onnx_type_name(t.elem_type),
            t.elem_type
        ))
    })?;
    let bytes = shape
        .iter()
        .try_fold(size, |n, &d| n.checked_mul(d))
        .filter(|&b| b == t.data.len());
    if bytes.is_none() {
        crate::bail!(
            InvalidGraph,
            "{} bytes do not hold a {} tensor of shape {shape:?}",
            t.data.len(),
            crate::ir::onnx_type_name(t.elem_type)
        );
    }
    Ok(TensorValue {
        elem_type: t.elem_type,
        shape,
        bytes: t.data.clone(),
    })
}

/// Bytes per element of the ONNX element types of fixed byte size.
fn elem_size(code: i32) -> Option<usize> {
    Some(match code {
        2 | 3 | 9 | 17..=20 => 1,
        4 | 5 | 10 | 16 => 2,
        1 | 6 | 12 => 4,
        7 | 11 | 13 | 14 => 8,
        15 => 16,
        _ => return None,
    })
}

// ---- checks shared by writer and reader ----

/// Constants: unique non-empty names, bytes matching dtype and shape.
/// Packed weights: the packed size for (target, k, n), packing a float
/// constant of shape `[k, n]` (`[n, k]` with `trans_b`), once per layout.
pub(crate) fn check_weights(g: &GenericGraph) -> Result<()> {
    let mut by_name: HashMap<&str, &NamedConstant> = HashMap::with_capacity(g.constants.len());
    for c in &g.constants {
        check_constant(c).map_err(|e| e.context(format_args!("constant '{}'", c.name)))?;
        if c.name.is_empty() || by_name.insert(&c.name, c).is_some() {
            crate::bail!(InvalidGraph, "constant name '{}' is empty or repeated", c.name);
        }
    }
    let mut layouts = HashSet::with_capacity(g.packed.len());
    for p in &g.packed {
        check_packed(p, g.target, &by_name).map_err(|e| e.context(format_args!("packed weight of '{}'", p.source)))?;
        if !layouts.insert((&p.source, p.trans_b, p.conv_group)) {
            crate::bail!(
                InvalidGraph,
                "constant '{}' is packed twice (trans_b {})",
                p.source,
                p.trans_b
            );
        }
    }
    Ok(())
}

fn check_constant(c: &NamedConstant) -> Result<()> {
    check_rank(c.shape.len())?;
    let bytes = c.shape.iter().try_fold(c.dtype.size(), |n, &d| n.checked_mul(d));
    if bytes != Some(c.data.byte_len()) {
        crate::bail!(
            InvalidGraph,
            "{} bytes do not hold a {} tensor of shape {:?}",
            c.data.byte_len(),
            c.dtype,
            c.shape
        );
    }
    Ok(())
}

fn check_packed(p: &PackedConstant, target: Target, constants: &HashMap<&str, &NamedConstant>) -> Result<()> {
    let want = PackedB::packed_len(target, p.k, p.n).checked_mul(size_of::<f32>());
    if want != Some(p.data.byte_len()) {
        crate::bail!(
            InvalidGraph,
            "{} bytes are not a {} x {} weight packed for {target}",
            p.data.byte_len(),
            p.k,
            p.n
        );
    }
    let source = constants
        .get(p.source.as_str())
        .ok_or_else(|| Error::invalid_graph("it packs no constant of the graph"))?;
    if let Some(g) = p.conv_group {
        return check_conv_packed(p, g, source);
    }
    let shape = if p.trans_b { [p.n, p.k] } else { [p.k, p.n] };
    // A recurrent layer's `W`/`R` (`[dirs, rows, k]`) is packed as its `[dirs * rows, k]` view.
    let flat = match source.shape.split_last() {
        Some((&last, lead)) if p.trans_b => {
            lead.iter().try_fold(1usize, |a, &d| a.checked_mul(d)) == Some(p.n) && last == p.k
        }
        _ => source.shape == shape,
    };
    if source.dtype != DType::F32 || !flat {
        crate::bail!(
            InvalidGraph,
            "it packs a {} constant of shape {:?}, expected float {shape:?}",
            source.dtype,
            source.shape
        );
    }
    Ok(())
}

/// Group `g` of convolution weights `[Co, Ci/groups, kh(, kw)]`: `k =
/// Ci/groups · kh · kw`, `n = Co / groups`, `g < groups` (issue #13).
fn check_conv_packed(p: &PackedConstant, g: usize, source: &NamedConstant) -> Result<()> {
    let s = &source.shape;
    let fits = source.dtype == DType::F32
        && p.trans_b
        && (3..=4).contains(&s.len())
        && s[1..].iter().try_fold(1usize, |a, &d| a.checked_mul(d)) == Some(p.k)
        && p.n > 0
        && s[0].is_multiple_of(p.n)
        && g < s[0] / p.n;
    if !fits {
        crate::bail!(
            InvalidGraph,
            "it packs group {g} ({} x {}) of a {} constant of shape {s:?}, which is no such convolution group",
            p.k,
            p.n,
            source.dtype
        );
    }
    Ok(())
}

/// Checks `g` as a reader would, before it is written.
pub(crate) fn check_for_write(g: &GenericGraph) -> Result<()> {
    check_weights(g)?;
    let ids = vec![0; g.constants.len().max(g.packed.len())];
    desc(&generic_info(g, &ids, &ids)).map(|_| ())
}
