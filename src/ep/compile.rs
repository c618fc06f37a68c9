//! Compile: turn one fused partition ORT hands over into kiln's IR, compile
//! it, and wrap the program for ORT's Compute.

use std::collections::{HashMap, HashSet};

use super::capability::tensor_type;
use super::KilnEp;
use crate::compiler;
use crate::error::{Error, Result};
use crate::ffi::compute::{ComputeImpl, KernelContext};
use crate::ffi::graph::{Graph, Node, ValueInfo};
use crate::ir::{self, Op, ValueId};
use crate::plan::Program;
use crate::stats;
use crate::target::Target;

pub fn compile_partition(ep: &KilnEp, graph: Graph<'_>, fused: Node<'_>) -> Result<Box<dyn ComputeImpl>> {
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
    Ok(Box::new(Compiled {
        name,
        program,
        host: ep.host,
        inject_panic: ep.inject == super::InjectedPanic::Compute,
    }))
}

/// Builds kiln's IR from ORT's subgraph. Inputs and outputs follow the fused
/// node's order, which is the order of Compute's kernel inputs and outputs.
fn to_ir(graph: Graph<'_>, fused: Node<'_>) -> Result<ir::Graph> {
    let mut g = ir::Graph::new(fused.name()?);
    let inputs = values(&mut g, fused.inputs()?)?;
    let outputs = values(&mut g, fused.outputs()?)?;
    let input_names: HashSet<String> = inputs.iter().map(|&id| g.values[id].name.clone()).collect();
    let mut initializers = HashMap::new();
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
            if !input_names.contains(&name) && !g.constants.iter().any(|(c, _)| *c == id) {
                if let Some(init) = initializers.get(&name) {
                    g.add_constant(id, init.copy_f32_initializer()?)?;
                }
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
struct Compiled {
    name: String,
    program: Program,
    host: Target,
    inject_panic: bool,
}

impl ComputeImpl for Compiled {
    fn compute(&self, ctx: KernelContext<'_>) -> Result<()> {
        let logger = ctx.logger();
        let result = self.run(ctx);
        if let Err(e) = &result {
            logger.error(&format!("partition '{}' failed: {e}", self.name));
        }
        result
    }
}

impl Compiled {
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
