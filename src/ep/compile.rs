//! Compile: turn the partitions ORT hands over into kiln programs — by
//! compiling ORT's subgraph, or by loading kiln's EPContext nodes — and wrap
//! them for ORT's Compute. With `ep.context_enable=1` it also produces the
//! EPContext nodes (see `context_gen`).

use std::collections::HashSet;

use super::capability::tensor_type;
use super::context_gen::{self, Generated};
use super::context_load::{self, ContextNode};
use super::KilnEp;
use crate::compiler;
use crate::error::{Error, Result};
use crate::ffi::compute::{ComputeImpl, KernelContext};
use crate::ffi::ep::{Compiled, Partition};
use crate::ffi::graph::{Graph, Node, ValueInfo};
use crate::ir::{self, Op, ValueId};
use crate::plan::Program;
use crate::stats;
use crate::target::Target;

/// One partition on its way through Compile.
enum Source<'a> {
    /// Compile ORT's subgraph.
    Graph,
    /// Load the program an EPContext node points at.
    Context(ContextNode<'a>),
}

pub fn compile_all(ep: &KilnEp, partitions: &[Partition<'_>]) -> Result<Vec<Compiled>> {
    let start = std::time::Instant::now();
    let sources = partitions
        .iter()
        .map(|p| classify(p.graph))
        .collect::<Result<Vec<_>>>()?;
    refuse_recompiling(ep, &sources)?;
    let mut programs = load_contexts(ep, partitions, &sources)?;
    for (i, (p, s)) in partitions.iter().zip(&sources).enumerate() {
        if matches!(s, Source::Graph) {
            programs[i] = Some(compile_graph(ep, p.graph, p.fused_node)?);
        }
    }
    let programs: Vec<Program> = programs
        .into_iter()
        .map(|p| p.expect("every partition has a program"))
        .collect();
    let built = start.elapsed();
    let mut ep_context = vec![None; partitions.len()];
    if ep.config.context.enable {
        let model_path = partitions.first().map(|p| p.graph.model_path()).transpose()?.flatten();
        let generated = partitions
            .iter()
            .zip(&programs)
            .map(|(p, program)| generated(p.graph, p.fused_node, program))
            .collect::<Result<Vec<_>>>()?;
        for (slot, node) in ep_context
            .iter_mut()
            .zip(context_gen::generate(ep, model_path.as_deref(), &generated)?)
        {
            *slot = Some(node);
        }
    }
    ep.logger.info(|| {
        format!(
            "Compile: {} partition(s) ready in {:.1} ms ({:.1} ms with EPContext output)",
            partitions.len(),
            built.as_secs_f64() * 1e3,
            start.elapsed().as_secs_f64() * 1e3
        )
    });
    Ok(partitions
        .iter()
        .zip(programs)
        .zip(ep_context)
        .map(|((p, program), ep_context)| Compiled {
            compute: Box::new(Runner {
                name: p.fused_node.name().unwrap_or_default(),
                program,
                host: ep.host,
                inject_panic: ep.inject == super::InjectedPanic::Compute,
            }),
            ep_context,
        })
        .collect())
}

fn classify<'a>(graph: Graph<'a>) -> Result<Source<'a>> {
    let nodes = graph.nodes()?;
    match nodes.as_slice() {
        [node] if context_load::is_ep_context(node)? => Ok(Source::Context(ContextNode::read(*node)?)),
        _ => Ok(Source::Graph),
    }
}

/// Compiling an already compiled model would wrap kiln's code in itself.
fn refuse_recompiling(ep: &KilnEp, sources: &[Source<'_>]) -> Result<()> {
    let Some(Source::Context(cn)) = sources.iter().find(|s| matches!(s, Source::Context(_))) else {
        return Ok(());
    };
    if !ep.config.context.enable {
        return Ok(());
    }
    Err(Error::invalid_graph(format!(
        "the model already holds kiln EPContext node '{}' (graph '{}'): it is compiled already; \
         load it without ep.context_enable=1, or compile the original model",
        cn.name, cn.partition_name
    )))
}

fn load_contexts(ep: &KilnEp, partitions: &[Partition<'_>], sources: &[Source<'_>]) -> Result<Vec<Option<Program>>> {
    let mut programs: Vec<Option<Program>> = (0..partitions.len()).map(|_| None).collect();
    let (idx, nodes): (Vec<usize>, Vec<&ContextNode<'_>>) = sources
        .iter()
        .enumerate()
        .filter_map(|(i, s)| match s {
            Source::Context(cn) => Some((i, cn)),
            Source::Graph => None,
        })
        .unzip();
    if nodes.is_empty() {
        return Ok(programs);
    }
    let base = context_load::base_folder(ep, &partitions[idx[0]].graph)?;
    let start = std::time::Instant::now();
    let loaded = context_load::load_all(ep, base.as_deref(), &nodes)?;
    ep.logger.info(|| {
        format!(
            "loaded {} graph(s) from EPContext nodes in {:.1} ms",
            nodes.len(),
            start.elapsed().as_secs_f64() * 1e3
        )
    });
    for ((i, program), cn) in idx.into_iter().zip(loaded).zip(&nodes) {
        ep.logger.info(|| {
            format!(
                "loaded graph '{}' for node '{}' from its context ({}, {} weight bytes, no compile)",
                cn.partition_name,
                cn.name,
                program.target().name(),
                program.constant_bytes()
            )
        });
        stats::context_graph_loaded();
        programs[i] = Some(program);
    }
    Ok(programs)
}

fn compile_graph(ep: &KilnEp, graph: Graph<'_>, fused: Node<'_>) -> Result<Program> {
    let name = fused.name()?;
    let ir = to_ir(graph, fused).map_err(|e| e.context(format!("kiln cannot compile partition '{name}'")))?;
    let program = compiler::compile(&ir, ep.target).map_err(|e| e.context(format!("compiling '{name}'")))?;
    stats::partition_compiled(ir.nodes.len());
    ep.logger.info(|| {
        format!(
            "compiled partition '{name}' for {}: {} ({} steps, {} arena bytes, {} constant bytes)",
            ep.target.name(),
            program.op_summary(),
            program.num_steps(),
            program.arena_bytes(),
            program.constant_bytes()
        )
    });
    Ok(program)
}

/// The smallest original node id in a partition: ORT writes the compiled
/// model's nodes in that order, so it tells which EPContext node comes first.
fn first_node_id(graph: Graph<'_>) -> Result<usize> {
    graph
        .nodes()?
        .iter()
        .map(|n| n.id())
        .try_fold(usize::MAX, |min, id| Ok(min.min(id?)))
}

fn generated<'p>(graph: Graph<'_>, fused: Node<'_>, program: &'p Program) -> Result<Generated<'p>> {
    let names = |values: Vec<Option<ValueInfo<'_>>>| -> Result<Vec<String>> {
        values
            .into_iter()
            .map(|v| v.map_or(Ok(String::new()), |v| v.name()))
            .collect()
    };
    Ok(Generated {
        first_node: first_node_id(graph)?,
        fused_name: fused.name()?,
        inputs: names(fused.inputs()?)?,
        outputs: names(fused.outputs()?)?,
        program,
    })
}

/// Builds kiln's IR from ORT's subgraph. Inputs and outputs follow the fused
/// node's order, which is the order of Compute's kernel inputs and outputs.
fn to_ir(graph: Graph<'_>, fused: Node<'_>) -> Result<ir::Graph> {
    let mut g = ir::Graph::new(fused.name()?);
    let inputs = values(&mut g, fused.inputs()?)?;
    let outputs = values(&mut g, fused.outputs()?)?;
    let input_names: HashSet<String> = inputs.iter().map(|&id| g.values[id].name.clone()).collect();
    let mut initializers = std::collections::HashMap::new();
    for init in graph.initializers()? {
        initializers.insert(init.name()?, init);
    }
    for node in graph.nodes()? {
        let op = Op::from_onnx(&node.domain()?, &node.op_type()?)
            .ok_or_else(|| Error::invalid_graph(format!("node {} is not an op kiln implements", node.label())))?;
        let ins = values(&mut g, node.inputs()?)?;
        let outs = values(&mut g, node.outputs()?)?;
        for &id in &ins {
            let name = g.values[id].name.clone();
            if input_names.contains(&name) || g.constants.iter().any(|(c, _)| *c == id) {
                continue;
            }
            if let Some(init) = initializers.get(&name) {
                g.add_constant(id, init.copy_f32_initializer()?)?;
            }
        }
        g.add_node(&node.name()?, op, ins, outs);
    }
    g.inputs = inputs;
    g.outputs = outputs;
    Ok(g)
}

fn values(g: &mut ir::Graph, infos: Vec<Option<ValueInfo<'_>>>) -> Result<Vec<ValueId>> {
    infos
        .into_iter()
        .map(|v| {
            let v = v.ok_or_else(|| Error::invalid_graph("an omitted optional value in a kiln partition"))?;
            let name = v.name()?;
            let ty = tensor_type(&v)?.map_err(|reason| Error::invalid_graph(format!("value '{name}' {reason}")))?;
            g.add_value(&name, ty)
        })
        .collect()
}

/// A compiled partition, run by ORT's Compute (possibly concurrently).
struct Runner {
    name: String,
    program: Program,
    host: Target,
    inject_panic: bool,
}

impl ComputeImpl for Runner {
    fn compute(&self, ctx: KernelContext<'_>) -> Result<()> {
        let logger = ctx.logger();
        let result = self.run(ctx);
        if let Err(e) = &result {
            logger.error(&format!("partition '{}' failed: {e}", self.name));
        }
        result
    }
}

impl Runner {
    fn run(&self, ctx: KernelContext<'_>) -> Result<()> {
        assert!(
            !self.inject_panic,
            "injected panic in Compute ({})",
            super::INJECT_PANIC_ENV
        );
        let inputs = ctx.inputs_f32()?;
        let specs = self.program.inputs();
        if inputs.len() != specs.len() {
            return Err(Error::invalid_argument(format!(
                "partition '{}' expects {} inputs, ORT passed {}",
                self.name,
                specs.len(),
                inputs.len()
            )));
        }
        for (t, spec) in inputs.iter().zip(specs) {
            let dims: Vec<i64> = spec.shape.iter().map(|&d| d as i64).collect();
            if t.dims != dims {
                return Err(Error::invalid_argument(format!(
                    "input '{}' has shape {:?}; kiln compiled this partition for {:?}",
                    spec.name, t.dims, dims
                )));
            }
        }
        let shapes: Vec<Vec<usize>> = self.program.outputs().iter().map(|s| s.shape.clone()).collect();
        let data: Vec<&[f32]> = inputs.iter().map(|t| t.data).collect();
        let mut outputs = ctx.outputs_f32(&shapes)?;
        self.program.run(self.host, &data, &mut outputs)?;
        stats::compute_called();
        Ok(())
    }
}
