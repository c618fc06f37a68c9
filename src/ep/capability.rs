//! GetCapability: decide which nodes kiln runs and group them into
//! partitions (see `partition`). What kiln can run is decided by the ORT-free
//! `ir::check_support` on a description of ORT's graph.

use std::collections::{BTreeMap, HashMap};

use super::cost::CostRule;
use super::describe::{describe, Constants};
use super::epcontext::{self, schema};
use super::options::ClaimPolicy;
use super::partition::{merge, partition, PNode};
use super::KilnEp;
use crate::compiler;
use crate::error::Result;
use crate::ffi::ep::SupportInfo;
use crate::ffi::graph::{Graph, Node};
use crate::ir;

/// Claims kiln's EPContext nodes (each its own partition) and every convex
/// group of other nodes kiln supports.
pub fn claim(ep: &KilnEp, graph: Graph<'_>, support: &mut SupportInfo) -> Result<()> {
    let nodes = graph.nodes()?;
    if ep.config.context.enable && graph.is_subgraph()? {
        leave_subgraph(ep, &graph, nodes.len())?;
        return Ok(());
    }
    let index: HashMap<_, _> = nodes.iter().enumerate().map(|(i, n)| (n.as_ptr(), i)).collect();
    let mut contexts = Vec::new();
    let mut is_context = vec![false; nodes.len()];
    for (i, node) in nodes.iter().enumerate() {
        if epcontext::is_ep_context(node)? {
            is_context[i] = true;
            if claim_context(ep, node)? {
                contexts.push(*node);
            }
        }
    }
    if !contexts.is_empty() {
        return claim_compiled(ep, &nodes, &contexts, support);
    }
    let desc = describe(&nodes, Vec::new(), Vec::new())?;
    let constants = Constants::of(&graph, &nodes)?;
    let mut verdicts = verdicts(ep, &desc, &constants, &is_context);
    let mut rule = (ep.config.kiln.claim == ClaimPolicy::Cost)
        .then(|| CostRule::new(&desc, &constants, &ep.config.kiln.force_ops, ep.target));
    if let Some(rule) = &rule {
        for (i, v) in verdicts.iter_mut().enumerate() {
            if let (Ok(()), Some(why)) = (&v, rule.quantized(i)) {
                *v = Err(why);
            }
        }
    }
    let mut pnodes = Vec::with_capacity(nodes.len());
    for (node, verdict) in nodes.iter().zip(&verdicts) {
        pnodes.push(PNode {
            supported: verdict.is_ok(),
            producers: producers(node, &index)?,
        });
    }
    let parts = claimed_partitions(ep, &desc, &constants, &mut pnodes, &mut verdicts, rule.as_mut());
    log_left_out(ep, &nodes, &verdicts, &is_context);
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

/// ORT (1.31) writes a compiled model from the main graph's nodes only: the
/// EPContext node of a partition inside an `If`/`Loop`/`Scan` body would be
/// lost (and the body's original nodes kept without the constants kiln took),
/// so while generating EPContext kiln claims nothing inside a body. Loading the
/// compiled model later claims (and compiles) those nodes as usual.
fn leave_subgraph(ep: &KilnEp, graph: &Graph<'_>, nodes: usize) -> Result<()> {
    let name = graph.name()?;
    ep.logger.info(|| {
        format!(
            "GetCapability: kiln claims none of the {nodes} nodes of control-flow body '{name}' while \
             generating EPContext (ORT writes EPContext nodes of the main graph only)"
        )
    });
    Ok(())
}

/// Whether kiln can run each node (EPContext nodes never join partitions).
fn verdicts(
    ep: &KilnEp,
    desc: &ir::GraphDesc,
    constants: &Constants<'_>,
    is_context: &[bool],
) -> Vec<std::result::Result<(), String>> {
    let mut verdicts = compiler::check_support(desc, constants, &ep.config.kiln.disabled_ops);
    for (v, &ctx) in verdicts.iter_mut().zip(is_context) {
        if ctx {
            *v = Err("an EPContext node is a partition of its own".into());
        }
    }
    verdicts
}

/// A compiled model: kiln takes its EPContext nodes and nothing else. The
/// other nodes were left to ORT when the model was compiled; compiling some
/// of them now (ORT may have optimised them since) would put compile work
/// into loading, which a compiled model exists to avoid.
fn claim_compiled(ep: &KilnEp, nodes: &[Node<'_>], contexts: &[Node<'_>], support: &mut SupportInfo) -> Result<()> {
    for node in contexts {
        support.add_fused(std::slice::from_ref(node), false)?;
    }
    ep.logger.info(|| {
        format!(
            "GetCapability: a compiled model; kiln claims its {} EPContext node(s) and leaves the other {} \
             node(s) to ORT (compile the original model again to change that)",
            contexts.len(),
            nodes.len() - contexts.len()
        )
    });
    Ok(())
}

/// The partitions kiln claims: those Compile will accept, and (with
/// `claim=cost`) that the cost rule says pay off. Each round leaves at
/// least one node to ORT, so this ends.
fn claimed_partitions(
    ep: &KilnEp,
    desc: &ir::GraphDesc,
    constants: &Constants<'_>,
    pnodes: &mut [PNode],
    verdicts: &mut [std::result::Result<(), String>],
    mut rule: Option<&mut CostRule<'_>>,
) -> Vec<Vec<usize>> {
    loop {
        let parts = agreed_partitions(ep, desc, constants, pnodes, verdicts);
        let Some(rule) = rule.as_deref_mut() else {
            return parts;
        };
        let claimed: Vec<bool> = pnodes.iter().map(|p| p.supported).collect();
        let left = rule.judge(&parts, &claimed);
        if left.is_empty() {
            return parts;
        }
        for (i, why) in left {
            verdicts[i] = Err(why);
            pnodes[i].supported = false;
        }
    }
}

/// Partitions whose every node Compile will accept. The whole-graph check
/// sees a value another partition produces with the type kiln infers for
/// it; Compile sees only what ORT says of it (often less: unknown dims or
/// rank). So each partition is checked again as Compile will see it, the
/// nodes it refuses are left out, and the graph is partitioned again until
/// nothing changes (each round leaves out at least one node).
fn agreed_partitions(
    ep: &KilnEp,
    desc: &ir::GraphDesc,
    constants: &Constants<'_>,
    pnodes: &mut [PNode],
    verdicts: &mut [std::result::Result<(), String>],
) -> Vec<Vec<usize>> {
    loop {
        let parts = merge(pnodes, partition(pnodes));
        let mut changed = false;
        for part in &parts {
            let again = compiler::check_support(&desc.subset(part), constants, &ep.config.kiln.disabled_ops);
            for (&i, v) in part.iter().zip(again) {
                if let Err(why) = v {
                    verdicts[i] = Err(format!("{why} (checked in its partition alone)"));
                    pnodes[i].supported = false;
                    changed = true;
                }
            }
        }
        if !changed {
            return parts;
        }
    }
}

/// One INFO line summing up what kiln left to other EPs and why (also kept
/// for `kiln_ep_last_left_out`); the details per node at VERBOSE.
fn log_left_out(ep: &KilnEp, nodes: &[Node<'_>], verdicts: &[std::result::Result<(), String>], is_context: &[bool]) {
    let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
    for ((node, verdict), &ctx) in nodes.iter().zip(verdicts).zip(is_context) {
        if let (Err(reason), false) = (verdict, ctx) {
            let op = node.op_type().unwrap_or_default();
            ep.logger
                .verbose(|| format!("leaving node {} to other EPs: {reason}", node.label()));
            *reasons.entry(format!("{op}: {reason}")).or_default() += 1;
        }
    }
    let parts: Vec<String> = reasons.iter().map(|(r, n)| format!("{n} x {r}")).collect();
    let summary = parts.join("; ");
    if !summary.is_empty() {
        ep.logger.info(|| format!("nodes left to other EPs: {summary}"));
    }
    crate::stats::set_left_out(summary);
}

/// kiln claims an EPContext node only when its `source` names kiln; other
/// EPs' nodes are left alone (ORT itself does not check `source`).
fn claim_context(ep: &KilnEp, node: &Node<'_>) -> Result<bool> {
    let source = epcontext::source_of(node)?;
    let mine = source.as_deref().is_some_and(schema::is_kiln_source);
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
    let explicit = node.inputs()?.into_iter().flatten();
    for input in explicit.chain(node.implicit_inputs()?) {
        if let Some(p) = input.producer()? {
            out.extend(index.get(&p.as_ptr()));
        }
    }
    Ok(out)
}
