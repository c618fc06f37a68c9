//! Compile: turn the partitions ORT hands over into kiln programs — by
//! compiling ORT's subgraph, or by loading kiln's EPContext nodes — and wrap
//! them for ORT's Compute. With `ep.context_enable=1` it also produces the
//! EPContext nodes (see `epcontext::writer`).

use super::describe::{describe, Constants};
use super::epcontext::reader::{self, ContextNode};
use super::epcontext::writer::{self, Generated};
use super::KilnEp;
use std::sync::Arc;

use crate::compiler;
use crate::compiler::generic::{Executable, GenericGraph, Specializer};
use crate::context::StoredGraph;
use crate::error::{Error, Result};
use crate::ffi::compute::{ComputeImpl, KernelContext, PoolProbe, RawInput};
use crate::ffi::ep::{Compiled, Partition};
use crate::ffi::graph::{Graph, Node, ValueInfo};
use crate::ir;
use crate::plan::Program;
use crate::plan::{TensorMut, TensorRef};
use crate::stats;
use crate::target::Target;
use crate::tensor::InlineVec;

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
    let programs: Vec<Executable> = programs
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
        for (slot, node) in
            ep_context
                .iter_mut()
                .zip(writer::generate(&ep.epcontext(), model_path.as_deref(), &generated)?)
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
    let mut compiled = Vec::with_capacity(partitions.len());
    for (((p, program), ep_context), source) in partitions.iter().zip(programs).zip(ep_context).zip(&sources) {
        let fused_inputs = value_names(p.fused_node.inputs()?)?;
        let inputs = input_order(&fused_inputs, &feeds(source, &program)?)?;
        let outputs = output_order(p.fused_node, &produces(source, &program)?)?;
        compiled.push(Compiled {
            compute: Box::new(Runner {
                name: p.fused_node.name()?,
                exe: program,
                host: ep.host,
                inject_panic: ep.inject == super::InjectedPanic::Compute,
                kernel_inputs: fused_inputs.len(),
                inputs,
                outputs,
                pool: PoolProbe::default(),
            }),
            ep_context,
        });
    }
    Ok(compiled)
}

/// The value feeding each program input: for a loaded EPContext node, its
/// own inputs (`epcontext::reader::check_io` matched them to the program by
/// position); for a compiled graph, the program's inputs themselves.
fn feeds(source: &Source<'_>, exe: &Executable) -> Result<Vec<String>> {
    match source {
        Source::Context(cn) => value_names(cn.node.inputs()?),
        Source::Graph => Ok(exe.input_names()),
    }
}

/// For each program input, the kernel input (fused-node input) feeding it.
/// Several program inputs may share one kernel input: ORT's common
/// subexpression elimination can merge two values an EPContext node reads
/// into one, and the fused node lists each value once.
fn input_order(fused_inputs: &[String], feeds: &[String]) -> Result<Vec<usize>> {
    feeds
        .iter()
        .map(|name| {
            fused_inputs.iter().position(|n| n == name).ok_or_else(|| {
                Error::invalid_graph(format!(
                    "the fused node has no input '{name}' (its inputs: {}), which its compiled graph reads",
                    fused_inputs.join(", ")
                ))
            })
        })
        .collect()
}

/// The value each program output is: for a loaded EPContext node, its own
/// outputs (matched to the program by position, like its inputs; their
/// names may differ from the compiled ones, e.g. after `onnx.compose`
/// prefixed them); for a compiled graph, the program's outputs themselves.
fn produces(source: &Source<'_>, exe: &Executable) -> Result<Vec<String>> {
    match source {
        Source::Context(cn) => value_names(cn.node.outputs()?),
        Source::Graph => Ok(exe.output_names()),
    }
}

/// For each kernel output, the program output it is. ORT orders a fused
/// node's outputs itself (a reloaded EPContext node's fused node may list
/// them differently from the EPContext node), so match by name.
fn output_order(fused: Node<'_>, specs: &[String]) -> Result<Vec<usize>> {
    let names = value_names(fused.outputs()?)?;
    if names.len() != specs.len() {
        return Err(Error::invalid_graph(format!(
            "the fused node has {} outputs, its compiled graph {}",
            names.len(),
            specs.len()
        )));
    }
    Ok(names
        .iter()
        .enumerate()
        .map(|(i, n)| specs.iter().position(|s| s == n).unwrap_or(i))
        .collect())
}

fn classify<'a>(graph: Graph<'a>) -> Result<Source<'a>> {
    let nodes = graph.nodes()?;
    match nodes.as_slice() {
        [node] if reader::is_ep_context(node)? => Ok(Source::Context(ContextNode::read(*node)?)),
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

fn load_contexts(ep: &KilnEp, partitions: &[Partition<'_>], sources: &[Source<'_>]) -> Result<Vec<Option<Executable>>> {
    let mut programs: Vec<Option<Executable>> = (0..partitions.len()).map(|_| None).collect();
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
    let base = reader::base_folder(&ep.epcontext(), &partitions[idx[0]].graph)?;
    let start = std::time::Instant::now();
    let loaded = reader::load_all(&ep.epcontext(), base.as_deref(), &nodes)?;
    ep.logger.info(|| {
        format!(
            "loaded {} graph(s) from EPContext nodes in {:.1} ms",
            nodes.len(),
            start.elapsed().as_secs_f64() * 1e3
        )
    });
    for ((i, graph), cn) in idx.into_iter().zip(loaded).zip(&nodes) {
        ep.logger.info(|| {
            format!(
                "loaded graph '{}' for node '{}' from its context ({}; {}; no compile)",
                cn.partition_name,
                cn.name,
                graph.target().name(),
                graph.describe()
            )
        });
        stats::context_graph_loaded();
        programs[i] = Some(match graph {
            StoredGraph::Program(p) => Executable::Fixed(p),
            StoredGraph::Generic(g) => Executable::Generic(Specializer::new(g, shape_cache(ep))?),
        });
    }
    Ok(programs)
}

fn compile_graph(ep: &KilnEp, graph: Graph<'_>, fused: Node<'_>) -> Result<Executable> {
    let name = fused.name()?;
    let nodes = graph.nodes()?;
    let desc = describe(&nodes, value_names(fused.inputs()?)?, value_names(fused.outputs()?)?)?;
    let constants = Constants::of(&graph, &nodes)?;
    let context = |e: Error| e.context(format!("kiln cannot compile partition '{name}'"));
    if !GenericGraph::is_static(&desc) {
        let exe = compile_generic(ep, &name, nodes.len(), desc, &constants).map_err(context)?;
        stats::partition_compiled(nodes.len());
        return Ok(exe);
    }
    let ir = compiler::import(&desc, &constants).map_err(context)?;
    let passes = compiler::Passes {
        winograd: ep.config.kiln.winograd,
        ..compiler::Passes::default()
    };
    let program =
        compiler::compile_with(&ir, ep.target, passes).map_err(|e| e.context(format!("compiling '{name}'")))?;
    stats::partition_compiled(nodes.len());
    ep.logger.info(|| {
        format!(
            "compiled partition '{name}' ({} nodes) for {}: {} ({} steps, {} arena bytes, {} constant bytes)",
            nodes.len(),
            ep.target.name(),
            program.op_summary(),
            program.num_steps(),
            program.arena_bytes(),
            program.constant_bytes()
        )
    });
    Ok(Executable::Fixed(program))
}

/// A partition with unknown input dims: checked as GetCapability checked it
/// (on the partition alone), kept with its weights packed, and compiled per
/// input shape at run time.
fn compile_generic(
    ep: &KilnEp,
    name: &str,
    nodes: usize,
    desc: ir::GraphDesc,
    constants: &Constants<'_>,
) -> Result<Executable> {
    let verdicts = compiler::check_support(&desc, constants, &ep.config.kiln.disabled_ops);
    if let Some((node, Err(why))) = desc.nodes.iter().zip(&verdicts).find(|(_, v)| v.is_err()) {
        return Err(Error::invalid_graph(format!(
            "node '{}' ({}): {why}",
            node.name, node.op_type
        )));
    }
    let mut generic = GenericGraph::build(desc, constants, ep.target)?;
    generic.winograd = ep.config.kiln.winograd;
    ep.logger.info(|| {
        format!(
            "compiled partition '{name}' ({nodes} nodes) for {}: {}",
            ep.target.name(),
            generic.summary()
        )
    });
    Ok(Executable::Generic(Specializer::new(generic, shape_cache(ep))?))
}

/// Programs each shape-generic partition keeps (the `shape_cache` option).
fn shape_cache(ep: &KilnEp) -> usize {
    ep.config
        .kiln
        .shape_cache
        .unwrap_or(compiler::generic::DEFAULT_SHAPE_CACHE)
}

fn value_names(values: Vec<Option<ValueInfo<'_>>>) -> Result<Vec<String>> {
    values
        .into_iter()
        .map(|v| v.map_or(Ok(String::new()), |v| v.name()))
        .collect()
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

fn generated<'p>(graph: Graph<'_>, fused: Node<'_>, exe: &'p Executable) -> Result<Generated<'p>> {
    Ok(Generated {
        first_node: first_node_id(graph)?,
        fused_name: fused.name()?,
        inputs: value_names(fused.inputs()?)?,
        outputs: value_names(fused.outputs()?)?,
        exe,
    })
}

/// A compiled partition, run by ORT's Compute (possibly concurrently).
struct Runner {
    name: String,
    exe: Executable,
    host: Target,
    inject_panic: bool,
    /// How many inputs ORT passes (the fused node's).
    kernel_inputs: usize,
    /// Program input j reads kernel input `inputs[j]` (see `input_order`).
    inputs: Vec<usize>,
    /// Kernel output i is program output `outputs[i]` (see `output_order`).
    outputs: Vec<usize>,
    /// The session's intra-op pool, as far as Runs have shown it.
    pool: PoolProbe,
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

/// A partition's inputs or outputs held inline per Run (more go to the heap).
const INLINE_IO: usize = 16;

impl Runner {
    fn run(&self, ctx: KernelContext<'_>) -> Result<()> {
        assert!(
            !self.inject_panic,
            "injected panic in Compute ({})",
            super::INJECT_PANIC_ENV
        );
        let par = ctx.parallel(&self.pool);
        let given = ctx.input_count()?;
        if given != self.kernel_inputs {
            return Err(Error::invalid_argument(format!(
                "partition '{}' expects {} inputs, ORT passed {given}",
                self.name, self.kernel_inputs,
            )));
        }
        // Program input j reads kernel input inputs[j].
        let raw: InlineVec<RawInput<'_>, INLINE_IO> =
            self.inputs.iter().map(|&k| ctx.raw_input(k)).collect::<Result<_>>()?;
        let held;
        let program = match &self.exe {
            Executable::Fixed(p) => p,
            Executable::Generic(s) => {
                held = self.specialized(s, &raw, &ctx.logger())?;
                &*held
            }
        };
        let specs = program.inputs();
        let mut inputs: InlineVec<TensorRef<'_>, INLINE_IO> = InlineVec::default();
        for (spec, t) in specs.iter().zip(raw.iter()) {
            let same = t.dims.len() == spec.shape.len() && t.dims.iter().zip(&spec.shape).all(|(&a, &b)| a == b as i64);
            if !same || t.elem_type != spec.elem_type {
                return Err(Error::invalid_argument(format!(
                    "input '{}' is {} {:?}; kiln compiled this partition for {} {:?}",
                    spec.name,
                    ir::onnx_type_name(t.elem_type),
                    t.dims,
                    ir::onnx_type_name(spec.elem_type),
                    spec.shape
                )));
            }
            inputs.push(tensor_ref(t.elem_type, t.bytes, &spec.name)?);
        }
        let out_specs = program.outputs();
        let mut outputs: InlineVec<TensorMut<'_>, INLINE_IO> = out_specs.iter().map(|_| TensorMut::default()).collect();
        let mut filled: InlineVec<bool, INLINE_IO> = out_specs.iter().map(|_| false).collect();
        // Kernel output i is program output outputs[i].
        let spec = |i: usize| {
            let s = &out_specs[self.outputs[i]];
            (s.elem_type, &s.shape[..])
        };
        ctx.raw_outputs(self.outputs.len(), spec, |i, bytes| {
            let j = self.outputs[i];
            filled[j] = true;
            outputs[j] = tensor_mut(out_specs[j].elem_type, bytes, &out_specs[j].name)?;
            Ok(())
        })?;
        if filled.iter().any(|f| !f) {
            return Err(Error::invalid_graph(format!(
                "partition '{}': outputs map twice",
                self.name
            )));
        }
        program.run(self.host, &inputs, &mut outputs, &par)?;
        stats::compute_called();
        Ok(())
    }
}

impl Runner {
    /// The program for this run's input shapes: cached, or built now (the
    /// first run at a new shape signature). `raw` in program input order.
    fn specialized(
        &self,
        s: &Specializer,
        raw: &[RawInput<'_>],
        logger: &crate::ffi::logger::Logger,
    ) -> Result<Arc<Program>> {
        let dims: InlineVec<&[i64], INLINE_IO> = raw.iter().map(|r| &r.dims[..]).collect();
        let start = std::time::Instant::now();
        let (program, built) = s
            .program_for(&dims)
            .map_err(|e| e.context(format!("partition '{}' at input shapes {dims:?}", self.name)))?;
        if built {
            stats::shape_specialized();
            logger.info(|| {
                format!(
                    "partition '{}': compiled for input shapes {dims:?} in {:.1} ms ({} steps, {} arena bytes)",
                    self.name,
                    start.elapsed().as_secs_f64() * 1e3,
                    program.num_steps(),
                    program.arena_bytes()
                )
            });
        }
        Ok(program)
    }
}

fn misaligned(name: &str) -> Error {
    Error::invalid_argument(format!("tensor '{name}' is not aligned for its element type"))
}

/// Views ORT's input bytes as kiln's typed tensor.
fn tensor_ref<'a>(elem_type: i32, bytes: &'a [u8], name: &str) -> Result<TensorRef<'a>> {
    use crate::ffi::sys;
    // An empty tensor's bytes may sit at any address: give it an aligned empty slice.
    if bytes.is_empty() {
        return Ok(match elem_type as u32 {
            sys::ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT => TensorRef::F32(&[]),
            sys::ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64 => TensorRef::I64(&[]),
            sys::ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32 => TensorRef::I32(&[]),
            sys::ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 => TensorRef::F16(&[]),
            _ => TensorRef::Bool(&[]),
        });
    }
    Ok(match elem_type as u32 {
        sys::ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT => {
            TensorRef::F32(bytemuck::try_cast_slice(bytes).map_err(|_| misaligned(name))?)
        }
        sys::ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64 => {
            TensorRef::I64(bytemuck::try_cast_slice(bytes).map_err(|_| misaligned(name))?)
        }
        sys::ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32 => {
            TensorRef::I32(bytemuck::try_cast_slice(bytes).map_err(|_| misaligned(name))?)
        }
        sys::ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL => TensorRef::Bool(bytes),
        sys::ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 => {
            TensorRef::F16(bytemuck::try_cast_slice(bytes).map_err(|_| misaligned(name))?)
        }
        _ => {
            return Err(Error::invalid_argument(format!(
                "tensor '{name}' has element type {elem_type}, which kiln does not run"
            )))
        }
    })
}

fn tensor_mut<'a>(elem_type: i32, bytes: &'a mut [u8], name: &str) -> Result<TensorMut<'a>> {
    use crate::ffi::sys;
    if bytes.is_empty() {
        return Ok(match elem_type as u32 {
            sys::ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT => TensorMut::F32(&mut []),
            sys::ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64 => TensorMut::I64(&mut []),
            sys::ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32 => TensorMut::I32(&mut []),
            sys::ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 => TensorMut::F16(&mut []),
            _ => TensorMut::Bool(&mut []),
        });
    }
    Ok(match elem_type as u32 {
        sys::ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT => {
            TensorMut::F32(bytemuck::try_cast_slice_mut(bytes).map_err(|_| misaligned(name))?)
        }
        sys::ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64 => {
            TensorMut::I64(bytemuck::try_cast_slice_mut(bytes).map_err(|_| misaligned(name))?)
        }
        sys::ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32 => {
            TensorMut::I32(bytemuck::try_cast_slice_mut(bytes).map_err(|_| misaligned(name))?)
        }
        sys::ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL => TensorMut::Bool(bytes),
        sys::ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 => {
            TensorMut::F16(bytemuck::try_cast_slice_mut(bytes).map_err(|_| misaligned(name))?)
        }
        _ => {
            return Err(Error::invalid_argument(format!(
                "tensor '{name}' has element type {elem_type}, which kiln does not run"
            )))
        }
    })
}
