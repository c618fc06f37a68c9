//! GetCapability: decide which nodes kiln runs and group them into
//! partitions (see `partition`).

use std::collections::HashMap;

use super::partition::{partition, PNode};
use super::{context_load, KilnEp};
use crate::error::Result;
use crate::ffi::ep::SupportInfo;
use crate::ffi::graph::{Graph, Node, ValueInfo};
use crate::ir::{DType, Op, TensorType};

/// Claims every convex group of supported nodes as one fused partition.
pub fn claim(ep: &KilnEp, graph: Graph<'_>, support: &mut SupportInfo) -> Result<()> {
    let nodes = graph.nodes()?;
    let index: HashMap<_, _> = nodes.iter().enumerate().map(|(i, n)| (n.as_ptr(), i)).collect();
    let mut pnodes = Vec::with_capacity(nodes.len());
    let mut contexts = Vec::new();
    for node in &nodes {
        if context_load::is_ep_context(node)? {
            // Each of kiln's EPContext nodes is a partition of its own.
            if claim_context(ep, node)? {
                contexts.push(*node);
            }
            pnodes.push(PNode {
                supported: false,
                producers: producers(node, &index)?,
            });
            continue;
        }
        let supported = match node_support(ep, node)? {
            Ok(_) => true,
            Err(reason) => {
                ep.logger
                    .verbose(|| format!("leaving node {} to other EPs: {reason}", node.label()));
                false
            }
        };
        pnodes.push(PNode {
            supported,
            producers: producers(node, &index)?,
        });
    }
    let parts = partition(&pnodes);
    for part in &parts {
        let members: Vec<Node<'_>> = part.iter().map(|&i| nodes[i]).collect();
        // Constants are copied into kiln's program, so ORT need not pass them.
        support.add_fused(&members, true)?;
    }
    for node in &contexts {
        support.add_fused(std::slice::from_ref(node), false)?;
    }
    let claimed: usize = parts.iter().map(Vec::len).sum::<usize>() + contexts.len();
    ep.logger.info(|| {
        format!(
            "GetCapability: kiln claims {claimed} of {} nodes in {} partition(s)",
            nodes.len(),
            parts.len() + contexts.len()
        )
    });
    Ok(())
}

/// kiln claims an EPContext node only when its `source` names kiln; other
/// EPs' nodes are left alone (ORT itself does not check `source`).
fn claim_context(ep: &KilnEp, node: &Node<'_>) -> Result<bool> {
    let source = context_load::source_of(node)?;
    let mine = source.as_deref().is_some_and(context_load::is_kiln_source);
    if !mine {
        ep.logger.verbose(|| {
            format!(
                "leaving EPContext node {} to other EPs: source is {:?}",
                node.label(),
                source.as_deref().unwrap_or("(none)")
            )
        });
    }
    Ok(mine)
}

fn producers(node: &Node<'_>, index: &HashMap<*const crate::ffi::sys::OrtNode, usize>) -> Result<Vec<usize>> {
    let mut out = Vec::new();
    for input in node.inputs()?.into_iter().flatten() {
        if let Some(p) = input.producer()? {
            out.extend(index.get(&p.as_ptr()));
        }
    }
    Ok(out)
}

/// `Ok(Ok(op))` when kiln can run the node, `Ok(Err(reason))` when not.
fn node_support(ep: &KilnEp, node: &Node<'_>) -> Result<std::result::Result<Op, String>> {
    let (domain, op_type) = (node.domain()?, node.op_type()?);
    let Some(op) = Op::from_onnx(&domain, &op_type) else {
        return Ok(Err(format!(
            "kiln does not implement {domain}{}{op_type}",
            if domain.is_empty() { "" } else { "." }
        )));
    };
    if ep.config.kiln.disabled_ops.contains(&op) {
        return Ok(Err("disabled by the kiln option disabled_ops".into()));
    }
    let inputs = match value_types(node.inputs()?, "input")? {
        Ok(t) => t,
        Err(reason) => return Ok(Err(reason)),
    };
    let outputs = match value_types(node.outputs()?, "output")? {
        Ok(t) => t,
        Err(reason) => return Ok(Err(reason)),
    };
    Ok(op.check(&inputs, &outputs).map(|()| op))
}

fn value_types(values: Vec<Option<ValueInfo<'_>>>, what: &str) -> Result<std::result::Result<Vec<TensorType>, String>> {
    let mut types = Vec::with_capacity(values.len());
    for (i, v) in values.into_iter().enumerate() {
        let Some(v) = v else {
            return Ok(Err(format!("{what} {i} is an omitted optional value")));
        };
        match tensor_type(&v)? {
            Ok(t) => types.push(t),
            Err(reason) => return Ok(Err(format!("{what} {i} ('{}') {reason}", v.name()?))),
        }
    }
    Ok(Ok(types))
}

/// kiln's static tensor type of a value, or why it has none.
pub fn tensor_type(v: &ValueInfo<'_>) -> Result<std::result::Result<TensorType, String>> {
    let Some(info) = v.tensor_info()? else {
        return Ok(Err("is not a tensor".into()));
    };
    let Some(dtype) = DType::from_onnx(info.elem_type) else {
        return Ok(Err(format!("has element type {}, kiln supports float", info.elem_type)));
    };
    let shape: Option<Vec<usize>> = info.dims.iter().map(|&d| usize::try_from(d).ok()).collect();
    Ok(match shape {
        Some(shape) => Ok(TensorType { dtype, shape }),
        None => Err(format!(
            "has a dynamic shape {:?}; kiln compiles static shapes",
            info.dims
        )),
    })
}
