//! Lowering: turns the optimised, alias-folded nodes into plan steps with a
//! static memory plan, packing constant GEMM weights on the way.
//!
//! Every buffer gets a home: graph inputs and constants are read in place,
//! the first graph output naming a value owns it (its producer writes
//! straight into the caller's output), and all other intermediates live in
//! the scratch arena laid out by `memplan`.

use std::collections::{HashMap, HashSet};

use super::alias::Folded;
use super::generic::PackedWeights;
use super::memplan::{plan_arena, Lifetime};
use crate::error::{Error, Result};
use crate::ir::{
    matmul_dims, Access, AttentionAttrs, BiasKind, ChainOp, ConvAttrs, ConvTransposeAttrs, DType, EmbedAttrs,
    EmbedTerm, Graph, MatMulAttrs, Node, Op, RnnAttrs, ValueId,
};
use crate::kernels::channel_norm::GroupNormDims;
use crate::kernels::conv;
use crate::kernels::conv_transpose;
use crate::kernels::gemm::PackedB;
use crate::kernels::movement::broadcast_strides;
use crate::kernels::pool::PoolShape;
use crate::kernels::recurrent::RnnDims;
use crate::kernels::select::Lanes;
use crate::kernels::winograd;
use crate::kernels::{CopyPlan, Layout, Where3};
use crate::plan::{
    AttentionShape, AttentionStep, BufRef, ChainStep, Constant, ConvResidual, ConvStep, ConvTransposeStep,
    ConvWeightsRef, EmbedSrc, EmbedStep, EmbedTermStep, IndexStep, MatB, MatBias, MatMulStep, NormStep, Packing,
    PoolStep, Program, ProgramParts, RnnStep, Step, TensorSpec, Weight,
};
use crate::target::Target;

/// Where a representative value lives at run time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Home {
    Input(usize),
    /// Index into `graph.constants`.
    Constant(usize),
    Output(usize),
    /// Index into the arena plan.
    Temp(usize),
    /// A convolution's or `Slice`'s output that only a channel concat reads,
    /// written in place into the concat's output (arena buffer `temp`): from value
    /// `channel` of each pixel, pixels `stride` values apart, `len` bytes.
    Slice {
        temp: usize,
        channel: usize,
        stride: usize,
        len: usize,
    },
}

/// Where a convolution's or `Slice`'s output goes in the output of the concat that reads it.
#[derive(Clone, Copy, Debug)]
struct ConcatSlice {
    concat: ValueId,
    channel: usize,
    stride: usize,
}

/// Builds the program for a validated, optimised graph.
pub(crate) fn lower(
    graph: &Graph,
    target: Target,
    folded: &Folded,
    packs: Option<&PackedWeights>,
    winograd: bool,
) -> Result<Program> {
    let mut homes = vec![None; graph.values.len()];
    let copies = assign_io_homes(graph, &folded.rep, &mut homes);
    let (slices, filled) = concat_slices(graph, folded, &homes, target);
    let onto = residual_outputs(graph, folded, &homes, &slices);
    let temps = assign_temps(graph, folded, &slices, &onto, &mut homes);
    let arena = plan_arena(&temps)?;
    let mut ctx = Lowering {
        graph,
        target,
        allow_winograd: winograd,
        homes: &homes,
        filled: &filled,
        rep: &folded.rep,
        temps: &temps,
        offsets: &arena.offsets,
        constant_index: vec![None; graph.constants.len()],
        packed_index: HashMap::new(),
        packs,
        constants: Vec::new(),
        steps: Vec::new(),
        winograd: HashSet::new(),
    };
    for &i in &folded.nodes {
        ctx.node_steps(&graph.nodes[i])
            .map_err(|e| e.context(graph.node_label(i)))?;
    }
    for (j, root) in copies {
        let src = ctx.buf(root)?;
        ctx.steps.push(Step::Copy {
            src,
            dst: BufRef::Output(j),
        });
    }
    Program::from_parts(ProgramParts {
        target,
        inputs: specs(graph, &graph.inputs),
        outputs: specs(graph, &graph.outputs),
        constants: ctx.constants,
        steps: ctx.steps,
        arena_bytes: arena.len,
        op_counts: op_counts(graph, &slices, &ctx.winograd),
    })
    .map_err(|e| internal(format!("the program does not validate: {e}")))
}

/// Homes for inputs, constants and outputs. Returns the outputs that need a
/// copy (their data already lives elsewhere) as (output index, representative).
fn assign_io_homes(graph: &Graph, rep: &[ValueId], homes: &mut [Option<Home>]) -> Vec<(usize, ValueId)> {
    for (i, &v) in graph.inputs.iter().enumerate() {
        homes[v] = Some(Home::Input(i));
    }
    for (k, (v, _)) in graph.constants.iter().enumerate() {
        homes[*v] = Some(Home::Constant(k));
    }
    let mut copies = Vec::new();
    for (j, &v) in graph.outputs.iter().enumerate() {
        let root = rep[v];
        match homes[root] {
            None => homes[root] = Some(Home::Output(j)),
            Some(_) => copies.push((j, root)),
        }
    }
    copies
}

/// Convolutions whose output can take their residual's buffer, as (output,
/// residual): the residual is an intermediate that no later node reads and
/// that the convolution reads only as its residual, and the output has no
/// home of its own (not a graph output, not a concat's slice). The kernels
/// then read each residual value in the store that overwrites it
/// (`kernels::conv::conv_onto`): the output's lines are the residual's,
/// one stream fewer to memory.
fn residual_outputs(
    graph: &Graph,
    folded: &Folded,
    homes: &[Option<Home>],
    slices: &HashMap<ValueId, ConcatSlice>,
) -> HashMap<ValueId, ValueId> {
    let mut last_read = vec![None; graph.values.len()];
    for (t, &i) in folded.nodes.iter().enumerate() {
        for &v in &graph.nodes[i].inputs {
            last_read[folded.rep[v]] = Some(t);
        }
    }
    let mut onto = HashMap::new();
    for (t, &i) in folded.nodes.iter().enumerate() {
        let node = &graph.nodes[i];
        let (Op::Conv(attrs), [out], Some((&r, others))) = (&node.op, &node.outputs[..], node.inputs.split_last())
        else {
            continue;
        };
        let r = folded.rep[r];
        // Inputs, constants and graph outputs have their homes already.
        if attrs.residual
            && homes[r].is_none()
            && last_read[r] == Some(t)
            && others.iter().all(|&v| folded.rep[v] != r)
            && homes[*out].is_none()
            && !slices.contains_key(out)
            && !slices.contains_key(&r)
            && graph.values[r].ty.byte_len() == graph.values[*out].ty.byte_len()
        {
            onto.insert(*out, r);
        }
    }
    onto
}

/// Arena lifetimes for node outputs without a home yet; time `t` is
/// `folded.nodes[t]` (all steps of one node share it). A concat whose
/// inputs are `slices` is busy from the first convolution that writes into
/// it, so that nothing else is placed there meanwhile. A convolution's
/// output in `onto` shares its residual's buffer.
fn assign_temps(
    graph: &Graph,
    folded: &Folded,
    slices: &HashMap<ValueId, ConcatSlice>,
    onto: &HashMap<ValueId, ValueId>,
    homes: &mut [Option<Home>],
) -> Vec<Lifetime> {
    let mut temps: Vec<Lifetime> = Vec::new();
    // The arena buffer of `v`, busy at `t`: its own, or a new one from `t`.
    let mut temp_of = |v: ValueId, t: usize, homes: &mut [Option<Home>]| match homes[v] {
        Some(Home::Temp(k)) => {
            temps[k].last = temps[k].last.max(t);
            k
        }
        _ => {
            homes[v] = Some(Home::Temp(temps.len()));
            temps.push(Lifetime {
                len: graph.values[v].ty.byte_len(),
                first: t,
                last: t,
            });
            temps.len() - 1
        }
    };
    for (t, &i) in folded.nodes.iter().enumerate() {
        let node = &graph.nodes[i];
        for &v in &node.inputs {
            let root = folded.rep[v];
            if let Some(Home::Temp(_)) = homes[root] {
                temp_of(root, t, homes);
            }
        }
        for &v in &node.outputs {
            if let Some(slice) = slices.get(&v) {
                let temp = temp_of(slice.concat, t, homes);
                let ty = &graph.values[v].ty;
                let co = ty.shape.last().copied().unwrap_or(1);
                let pixels = ty.numel() / co.max(1);
                let len = conv::strided_len(pixels, slice.stride, co).unwrap_or(0) * ty.dtype.size();
                homes[v] = Some(Home::Slice {
                    temp,
                    channel: slice.channel,
                    stride: slice.stride,
                    len,
                });
            } else if let Some(Some(Home::Temp(k))) = onto.get(&v).map(|&r| homes[r]) {
                homes[v] = Some(Home::Temp(k));
                temp_of(v, t, homes);
            } else if matches!(homes[v], None | Some(Home::Temp(_))) {
                temp_of(v, t, homes);
            }
        }
    }
    temps
}

/// Values written in place into a channel concat's output (NHWC, the last
/// axis), and the concat inputs that are therefore there before it runs:
///
/// - convolution (and `Slice`) outputs that the concat alone reads
///   (SqueezeNet's fire modules, DenseNet's and YOLOv8's blocks: ORT's
///   NCHWc concat copies whole contiguous planes; kiln's NHWC one copies
///   runs of a pixel's channels, 30% slower);
/// - a convolution's output split by channel into consecutive inputs of the
///   concat ([`split_run`], YOLOv8's C2f blocks): the convolution writes all
///   its channels there, a half that only the concat reads is no copy at
///   all, and one that others read too is copied out of the concat.
fn concat_slices(
    graph: &Graph,
    folded: &Folded,
    homes: &[Option<Home>],
    target: Target,
) -> (HashMap<ValueId, ConcatSlice>, HashSet<(ValueId, usize)>) {
    let mut uses = vec![0usize; graph.values.len()];
    let mut producer = vec![None; graph.values.len()];
    for &i in &folded.nodes {
        let node = &graph.nodes[i];
        for &v in &node.inputs {
            uses[folded.rep[v]] += 1;
        }
        for &v in &node.outputs {
            producer[v] = Some(i);
        }
    }
    let mut slices = HashMap::new();
    let mut filled = HashSet::new();
    let free = |v: ValueId| folded.rep[v] == v && homes[v].is_none();
    let strided = |v: ValueId| producer[v].is_some_and(|p| writes_strided(graph, &graph.nodes[p], target));
    for &i in &folded.nodes {
        let node = &graph.nodes[i];
        let (Op::Concat { axis }, [out]) = (&node.op, &node.outputs[..]) else {
            continue;
        };
        let ty = &graph.values[*out].ty;
        if ty.shape.len() != 4 || *axis != 3 || ty.dtype != DType::F32 || homes[*out].is_some() {
            continue;
        }
        let at = |channel| ConcatSlice {
            concat: *out,
            channel,
            stride: ty.shape[3],
        };
        let (mut channel, mut k) = (0, 0);
        while k < node.inputs.len() {
            let v = node.inputs[k];
            let run = split_run(graph, &producer, &node.inputs[k..])
                .filter(|&(src, n)| free(src) && uses[src] == n && !slices.contains_key(&src) && strided(src));
            if let Some((src, n)) = run {
                slices.insert(src, at(channel));
                for (j, &u) in node.inputs.iter().enumerate().skip(k).take(n) {
                    if free(u) && uses[u] == 1 {
                        slices.insert(u, at(channel));
                    }
                    filled.insert((*out, j));
                    channel += graph.values[u].ty.shape[3];
                }
                k += n;
                continue;
            }
            if free(v) && uses[v] == 1 && strided(v) {
                slices.insert(v, at(channel));
                filled.insert((*out, k));
            }
            channel += graph.values[v].ty.shape[3];
            k += 1;
        }
    }
    (slices, filled)
}

/// The first `n` of `inputs` (at least one) as a channel split of one value:
/// each the output of a `Slice` of the last axis alone (step 1, whole other
/// dims) of the same 4-D value, their channel ranges one after the other
/// from 0 to its last channel. Returns (that value, n).
fn split_run(graph: &Graph, producer: &[Option<usize>], inputs: &[ValueId]) -> Option<(ValueId, usize)> {
    let mut src = None;
    let mut next = 0;
    for (n, &u) in inputs.iter().enumerate() {
        let node = &graph.nodes[producer[u]?];
        let Op::Slice { starts, steps } = &node.op else {
            return None;
        };
        let v = node.inputs[0];
        let (vs, us) = (&graph.values[v].ty.shape, &graph.values[u].ty.shape);
        let channel_slice = vs.len() == 4
            && us.len() == 4
            && vs[..3] == us[..3]
            && starts[..3] == [0, 0, 0]
            && steps.iter().all(|&s| s == 1)
            && starts[3] == next;
        if !channel_slice || *src.get_or_insert(v) != v {
            return None;
        }
        next += us[3];
        if next == vs[3] {
            return Some((v, n + 1));
        }
    }
    None
}

/// Whether `node` can write its output with pixels further apart than its
/// channels: a convolution whose kernel can, a `Slice` (a strided copy,
/// whatever the destination's strides: YOLOv8's C2f blocks split a
/// convolution's channels and concat the first half unchanged) or a
/// `Resize` (YOLOv8's neck upsamples a map into each concat).
fn writes_strided(graph: &Graph, node: &Node, target: Target) -> bool {
    let attrs = match &node.op {
        Op::Conv(attrs) => attrs,
        Op::Slice { .. } | Op::Resize(_) => return true,
        _ => return false,
    };
    let shape = |v: ValueId| &graph.values[v].ty.shape;
    let depthwise = shape(node.inputs[0])
        .get(3)
        .is_some_and(|&ci| is_depthwise(ci, attrs.groups, shape(node.inputs[1])));
    conv::writes_strided(target, depthwise)
}

/// Whether a convolution of `ci` input channels in `groups` groups with
/// weights of shape `w` (`[Co, Ci/g, kh, kw]`) runs as depthwise: one
/// filter per channel. Lowering and [`writes_strided`] must agree on it.
fn is_depthwise(ci: usize, groups: usize, w: &[usize]) -> bool {
    groups == ci && w.get(..2) == Some(&[ci, 1][..])
}

struct Lowering<'g> {
    graph: &'g Graph,
    target: Target,
    /// Whether convolutions may run as Winograd's (the `winograd` option).
    allow_winograd: bool,
    /// Outputs of the convolutions that run as Winograd's (the op counts say so).
    winograd: HashSet<ValueId>,
    homes: &'g [Option<Home>],
    /// Concat inputs, as (concat output, input position), whose channels of
    /// the concat's output are written before the concat runs (see
    /// [`concat_slices`]): it copies none of them.
    filled: &'g HashSet<(ValueId, usize)>,
    rep: &'g [ValueId],
    temps: &'g [Lifetime],
    offsets: &'g [usize],
    /// Program index of each graph constant, assigned on first use so that
    /// constants only folded-away code read are dropped.
    constant_index: Vec<Option<usize>>,
    /// Program index of the packed form of (constant value, trans_b).
    packed_index: HashMap<(ValueId, bool), usize>,
    /// Weights packed before lowering (once per shape-generic partition).
    packs: Option<&'g PackedWeights>,
    constants: Vec<Constant>,
    steps: Vec<Step>,
}

/// Row-major element strides.
fn strides(shape: &[usize]) -> Vec<isize> {
    let mut s = vec![0isize; shape.len()];
    let mut step = 1isize;
    for i in (0..shape.len()).rev() {
        s[i] = step;
        step *= shape[i] as isize;
    }
    s
}

impl Lowering<'_> {
    fn shape(&self, v: ValueId) -> &[usize] {
        &self.graph.values[v].ty.shape
    }

    /// Each input read as `ir::infer` found it lines up with the output.
    fn chain(&mut self, ops: &[ChainOp], ins: &[ValueId], out: ValueId, dst: BufRef) -> Result<Step> {
        let mut inputs = Vec::with_capacity(ins.len());
        for &v in ins {
            let access = Access::for_shapes(self.shape(out), self.shape(v))
                .ok_or_else(|| internal("a validated chain input does not line up"))?;
            inputs.push((self.buf(v)?, access));
        }
        Ok(Step::Chain(Box::new(ChainStep {
            ops: ops.to_vec(),
            inputs,
            dst,
        })))
    }

    fn dtype(&self, v: ValueId) -> DType {
        self.graph.values[v].ty.dtype
    }

    fn node_steps(&mut self, node: &Node) -> Result<()> {
        let ins = &node.inputs;
        let out = *node.outputs.first().ok_or_else(|| internal("node without output"))?;
        let dst = self.buf(out)?;
        let step = match &node.op {
            Op::Unary(op) => Step::Unary {
                op: *op,
                src: self.buf(ins[0])?,
                dst,
            },
            Op::Binary(op) => {
                let layout = Layout::for_shapes(self.shape(ins[0]), self.shape(ins[1]))
                    .ok_or_else(|| internal("validated shapes do not broadcast"))?;
                Step::Binary {
                    op: *op,
                    // The inputs' type (a comparison writes bools).
                    dtype: self.dtype(ins[0]),
                    layout,
                    a: self.buf(ins[0])?,
                    b: self.buf(ins[1])?,
                    dst,
                }
            }
            Op::MatMul(attrs) => self.matmul(attrs, ins, dst)?,
            Op::Softmax { axis, unshifted } => {
                let s = self.shape(ins[0]);
                Step::Softmax {
                    len: s[*axis],
                    inner: s[axis + 1..].iter().product(),
                    unshifted: *unshifted,
                    src: self.buf(ins[0])?,
                    dst,
                }
            }
            Op::LayerNorm {
                axis,
                epsilon,
                decomposed,
            } => Step::LayerNorm {
                len: self.shape(ins[0])[*axis..].iter().product(),
                epsilon: *epsilon,
                decomposed: *decomposed,
                src: self.buf(ins[0])?,
                scale: self.buf(ins[1])?,
                bias: ins.get(2).map(|&b| self.buf(b)).transpose()?,
                dst,
            },
            Op::Reduce { kind, axes, .. } => {
                let s = self.shape(ins[0]);
                // Size-1 dims do not matter; the rest must be one contiguous run.
                let (outer, len, inner) = if axes.is_empty() {
                    // Also a scalar's (rank 0): there is no dim to index.
                    (s.iter().product(), 1, 1)
                } else {
                    let real: Vec<usize> = axes.iter().copied().filter(|&a| s[a] != 1).collect();
                    let (lo, hi) = match (real.first(), real.last()) {
                        (Some(&lo), Some(&hi)) => (lo, hi),
                        _ => (axes[0], axes[0]),
                    };
                    if (lo..=hi).any(|d| s[d] != 1 && !axes.contains(&d)) {
                        return Err(internal("reduce axes are not contiguous"));
                    }
                    (
                        s[..lo].iter().product(),
                        s[lo..=hi].iter().product(),
                        s[hi + 1..].iter().product(),
                    )
                };
                Step::Reduce {
                    kind: *kind,
                    outer,
                    len,
                    inner,
                    src: self.buf(ins[0])?,
                    dst,
                }
            }
            Op::Transpose { perm } => {
                let s = self.shape(ins[0]);
                let st = strides(s);
                let dims: Vec<usize> = perm.iter().map(|&p| s[p]).collect();
                let src_strides: Vec<isize> = perm.iter().map(|&p| st[p]).collect();
                Step::Strided {
                    dtype: self.dtype(out),
                    plan: CopyPlan::new(&dims, 0, &src_strides, 0, &strides(&dims)),
                    src: self.buf(ins[0])?,
                    dst,
                }
            }
            Op::Concat { axis } => {
                let out_shape = self.shape(out).to_vec();
                let dst_strides = strides(&out_shape);
                let mut at = 0usize;
                for (k, &v) in ins.iter().enumerate() {
                    let s = self.shape(v).to_vec();
                    let plan = CopyPlan::new(&s, 0, &strides(&s), at * dst_strides[*axis] as usize, &dst_strides);
                    at += s[*axis];
                    if self.filled.contains(&(out, k)) {
                        continue;
                    }
                    let src = self.buf(v)?;
                    self.steps.push(Step::Strided {
                        dtype: self.dtype(out),
                        plan,
                        src,
                        dst,
                    });
                }
                return Ok(());
            }
            Op::Slice { starts, steps } => {
                if self.passed_through(ins[0], out, starts, steps) {
                    return Ok(());
                }
                let st = self.out_strides(ins[0]);
                let dims = self.shape(out).to_vec();
                let offset: isize = starts.iter().zip(&st).map(|(&a, &s)| a as isize * s).sum();
                let src_strides: Vec<isize> = st.iter().zip(steps).map(|(&s, &k)| s * k).collect();
                Step::Strided {
                    dtype: self.dtype(out),
                    plan: CopyPlan::new(&dims, offset as usize, &src_strides, 0, &self.out_strides(out)),
                    src: self.buf(ins[0])?,
                    dst,
                }
            }
            Op::Expand => {
                let dims = self.shape(out).to_vec();
                let src_strides: Vec<isize> = broadcast_strides(self.shape(ins[0]), &dims)
                    .into_iter()
                    .map(|s| s as isize)
                    .collect();
                Step::Strided {
                    dtype: self.dtype(out),
                    plan: CopyPlan::new(&dims, 0, &src_strides, 0, &strides(&dims)),
                    src: self.buf(ins[0])?,
                    dst,
                }
            }
            Op::Gather { axis } => {
                let s = self.shape(ins[0]);
                Step::Gather {
                    dtype: self.dtype(out),
                    idx_dtype: self.dtype(ins[1]),
                    outer: s[..*axis].iter().product(),
                    axis_len: s[*axis],
                    inner: s[axis + 1..].iter().product(),
                    data: self.buf(ins[0])?,
                    indices: self.buf(ins[1])?,
                    dst,
                }
            }
            Op::Cast { to } => {
                let from = self.dtype(ins[0]);
                let src = self.buf(ins[0])?;
                if from == *to {
                    Step::Copy { src, dst }
                } else {
                    Step::Cast {
                        from,
                        to: *to,
                        src,
                        dst,
                    }
                }
            }
            Op::Where => Step::Where {
                dtype: self.dtype(out),
                layout: Where3::for_shapes(
                    self.shape(ins[0]),
                    self.shape(ins[1]),
                    self.shape(ins[2]),
                    self.shape(out),
                ),
                cond: self.buf(ins[0])?,
                x: self.buf(ins[1])?,
                y: self.buf(ins[2])?,
                dst,
            },
            Op::GatherElements { .. }
            | Op::GatherNd { .. }
            | Op::ScatterNd { .. }
            | Op::CumSum { .. }
            | Op::OneHot { .. } => Step::Index(Box::new(self.index_step(&node.op, ins, out, dst)?)),
            Op::Rnn(attrs) => self.rnn(attrs, ins, dst)?,
            Op::Conv(attrs) => self.conv(attrs, ins, out, dst)?,
            Op::Pool { .. } | Op::Resize(_) => Step::Pool(Box::new(self.pool_step(&node.op, ins, out, dst)?)),
            Op::GroupNorm { .. } | Op::Lrn(_) | Op::ArgReduce { .. } | Op::TopK { .. } => {
                Step::Norm(Box::new(self.norm_step(&node.op, ins, dst)?))
            }
            Op::ConvTranspose(attrs) => self.conv_transpose(attrs, ins, dst)?,
            Op::Attention(attrs) => self.attention(attrs, ins, dst)?,
            Op::EmbedLayerNorm(attrs) => self.embed(attrs, ins, out, dst)?,
            Op::Chain(ops) => self.chain(ops, ins, out, dst)?,
            Op::Reshape => return Err(internal("an alias reached lowering")),
            Op::Shape { .. } => return Err(internal("Shape was not folded")),
        };
        self.steps.push(step);
        Ok(())
    }

    fn matmul(&mut self, attrs: &MatMulAttrs, ins: &[ValueId], dst: BufRef) -> Result<Step> {
        let (a_shape, b_shape) = (self.shape(ins[0]).to_vec(), self.shape(ins[1]).to_vec());
        let d = matmul_dims(&a_shape, &b_shape, attrs).map_err(internal)?;
        let parts = &ins[1..1 + attrs.b_parts];
        // Each part's N (2-D parts: checked by the IR).
        let part_n: Vec<usize> = parts
            .iter()
            .map(|&v| self.shape(v)[usize::from(!attrs.trans_b)])
            .collect();
        let (m, k) = (d.m, d.k);
        let n = if attrs.b_parts > 1 { part_n.iter().sum() } else { d.n };
        let a_batch = &a_shape[..a_shape.len() - 2];
        let b_batch = &b_shape[..b_shape.len() - 2];
        let b_single = b_batch.iter().product::<usize>() == 1;
        let nb: usize = d.batch.iter().product();
        // [batch.., m, k] x [k, n]: the batches are just more rows of A.
        let (rows, batches) = if b_single && !attrs.trans_a && a_batch.iter().product::<usize>() == nb {
            (m * nb, vec![[0, 0]])
        } else if m == 0 || n == 0 {
            // An empty product: no batch has work. A table of the batches would
            // cost 16 bytes each, and empty tensors can have billions of them.
            (m, Vec::new())
        } else {
            let a_st = broadcast_strides(a_batch, &d.batch);
            let b_st = broadcast_strides(b_batch, &d.batch);
            let mut batches = Vec::with_capacity(nb);
            let mut idx = vec![0usize; d.batch.len()];
            for _ in 0..nb {
                let ao: usize = idx.iter().zip(&a_st).map(|(i, s)| i * s).sum();
                let bo: usize = idx.iter().zip(&b_st).map(|(i, s)| i * s).sum();
                batches.push([ao * m * k, bo * k * n]);
                for j in (0..idx.len()).rev() {
                    idx[j] += 1;
                    if idx[j] < d.batch[j] {
                        break;
                    }
                    idx[j] = 0;
                }
            }
            (m, batches)
        };
        let b = match self.graph.constant(ins[1]) {
            _ if attrs.b_parts > 1 => {
                let mut index = [0; 3];
                if parts.len() != index.len() {
                    return Err(internal("a product whose B is not three parts"));
                }
                for ((slot, &v), &n) in index.iter_mut().zip(parts).zip(&part_n) {
                    let w = self
                        .graph
                        .constant(v)
                        .ok_or_else(|| internal("a B part is not a constant"))?;
                    *slot = self.packed_b(v, w, attrs.trans_b, k, n);
                }
                MatB::PackedParts(index)
            }
            Some(w) if b_single && !attrs.trans_a => MatB::Packed(self.packed_b(ins[1], w, attrs.trans_b, k, n)),
            _ => MatB::Buf {
                buf: self.buf(ins[1])?,
                trans_b: attrs.trans_b,
            },
        };
        let mut next = 1 + attrs.b_parts;
        let bias = match attrs.bias {
            BiasKind::None => MatBias::None,
            BiasKind::Row => {
                next += 1;
                MatBias::Row(self.buf(ins[next - 1])?)
            }
            BiasKind::Full { beta } => {
                next += 1;
                MatBias::Full {
                    buf: self.buf(ins[next - 1])?,
                    beta,
                }
            }
        };
        let residual = if attrs.residual {
            Some(self.buf(ins[next])?)
        } else {
            None
        };
        Ok(Step::MatMul(Box::new(MatMulStep {
            m: rows,
            n,
            k,
            trans_a: attrs.trans_a,
            a: self.buf(ins[0])?,
            b,
            batches,
            alpha: attrs.alpha,
            bias,
            activation: attrs.activation,
            residual,
            dst,
        })))
    }

    /// The step of a pool or resize (issue #13); input `[N, H, W, C]`.
    fn pool_step(&mut self, op: &Op, ins: &[ValueId], out: ValueId, dst: BufRef) -> Result<PoolStep> {
        let s = self.shape(ins[0]).to_vec();
        let (batch, channels) = (s[0], s[3]);
        let src = self.buf(ins[0])?;
        Ok(match op {
            Op::Pool { kind, window } => PoolStep::Pool {
                kind: *kind,
                shape: PoolShape {
                    window: *window,
                    batch,
                    channels,
                },
                src,
                dst,
            },
            Op::Resize(attrs) => PoolStep::Resize {
                attrs: *attrs,
                batch,
                channels,
                src,
                dst,
                dst_stride: self.pixel_stride(out),
            },
            _ => return Err(internal(format_args!("{op} is not a pool or resize"))),
        })
    }

    /// The step of an indexing op (issue #12).
    fn index_step(&mut self, op: &Op, ins: &[ValueId], out: ValueId, dst: BufRef) -> Result<IndexStep> {
        let dtype = self.dtype(out);
        Ok(match op {
            Op::GatherElements { axis } => IndexStep::GatherElements {
                dtype,
                idx_dtype: self.dtype(ins[1]),
                data_dims: self.shape(ins[0]).to_vec(),
                idx_dims: self.shape(ins[1]).to_vec(),
                axis: *axis,
                data: self.buf(ins[0])?,
                indices: self.buf(ins[1])?,
                dst,
            },
            Op::GatherNd { batch_dims } => {
                let (s, q) = (self.shape(ins[0]).to_vec(), self.shape(ins[1]));
                let k = q.last().copied().unwrap_or(0);
                IndexStep::GatherNd {
                    dtype,
                    idx_dtype: self.dtype(ins[1]),
                    batch: s[..*batch_dims].iter().product(),
                    dims: s[*batch_dims..batch_dims + k].to_vec(),
                    slice: s[batch_dims + k..].iter().product(),
                    data: self.buf(ins[0])?,
                    indices: self.buf(ins[1])?,
                    dst,
                }
            }
            Op::ScatterNd { reduction } => {
                let (s, q) = (self.shape(ins[0]).to_vec(), self.shape(ins[1]));
                let k = q.last().copied().unwrap_or(0);
                IndexStep::ScatterNd {
                    dtype,
                    idx_dtype: self.dtype(ins[1]),
                    reduction: *reduction,
                    dims: s[..k].to_vec(),
                    slice: s[k..].iter().product(),
                    data: self.buf(ins[0])?,
                    indices: self.buf(ins[1])?,
                    updates: self.buf(ins[2])?,
                    dst,
                }
            }
            Op::CumSum {
                axis,
                exclusive,
                reverse,
            } => {
                let s = self.shape(ins[0]);
                IndexStep::CumSum {
                    dtype,
                    outer: s[..*axis].iter().product(),
                    len: s[*axis],
                    inner: s[axis + 1..].iter().product(),
                    exclusive: *exclusive,
                    reverse: *reverse,
                    src: self.buf(ins[0])?,
                    dst,
                }
            }
            Op::OneHot { axis } => {
                let s = self.shape(out);
                IndexStep::OneHot {
                    dtype,
                    idx_dtype: self.dtype(ins[0]),
                    outer: s[..*axis].iter().product(),
                    depth: s[*axis],
                    inner: s[axis + 1..].iter().product(),
                    indices: self.buf(ins[0])?,
                    values: self.buf(ins[1])?,
                    dst,
                }
            }
            _ => return Err(internal(format_args!("{op} is not an indexing op"))),
        })
    }

    /// The step of a normalisation or selection op (issue #13).
    fn norm_step(&mut self, op: &Op, ins: &[ValueId], dst: BufRef) -> Result<NormStep> {
        let s = self.shape(ins[0]).to_vec();
        let lanes = |axis: usize| Lanes {
            outer: s[..axis].iter().product(),
            len: s[axis],
            inner: s[axis + 1..].iter().product(),
        };
        Ok(match op {
            Op::GroupNorm { groups, epsilon } => NormStep::GroupNorm {
                dims: GroupNormDims {
                    batch: s[0],
                    spatial: s[1..s.len() - 1].iter().product(),
                    channels: s[s.len() - 1],
                    groups: *groups,
                    epsilon: *epsilon,
                },
                src: self.buf(ins[0])?,
                scale: self.buf(ins[1])?,
                bias: self.buf(ins[2])?,
                dst,
            },
            Op::Lrn(lrn) => NormStep::Lrn {
                lrn: *lrn,
                channels: s[s.len() - 1],
                src: self.buf(ins[0])?,
                dst,
            },
            Op::ArgReduce { axis, rule, .. } => NormStep::ArgReduce {
                dtype: self.dtype(ins[0]),
                rule: *rule,
                lanes: lanes(*axis),
                src: self.buf(ins[0])?,
                dst,
            },
            Op::TopK { axis, rule } => NormStep::TopK {
                dtype: self.dtype(ins[0]),
                rule: *rule,
                lanes: lanes(*axis),
                src: self.buf(ins[0])?,
                dst,
            },
            _ => return Err(internal(format_args!("{op} is not a normalisation or selection op"))),
        })
    }

    /// A recurrent layer: `W` packed whole, `R` per direction (and part).
    fn rnn(&mut self, attrs: &RnnAttrs, ins: &[ValueId], dst: BufRef) -> Result<Step> {
        let spec = &attrs.spec;
        let [seq, batch, input] = self.shape(ins[0])[..] else {
            return Err(internal("recurrent X is not 3-D"));
        };
        let dirs = spec.direction.count();
        let (h, gh) = (spec.hidden, spec.cell.gates() * spec.hidden);
        let (Some(w), Some(r)) = (
            self.graph.constant(ins[1]).cloned(),
            self.graph.constant(ins[2]).cloned(),
        ) else {
            return Err(internal("recurrent weights are not constants"));
        };
        let w = self.packed_constant(&w, 0, input, dirs * gh)?;
        let mut rs = Vec::new();
        for d in 0..dirs {
            for (first, rows) in spec.cell.r_part_rows(h) {
                rs.push(self.packed_constant(&r, (d * gh + first) * h, h, rows)?);
            }
        }
        let mut next = 3;
        let mut opt = |this: &mut Self, has: bool| -> Result<Option<BufRef>> {
            if !has {
                return Ok(None);
            }
            next += 1;
            this.buf(ins[next - 1]).map(Some)
        };
        let has = attrs.has;
        Ok(Step::Rnn(Box::new(RnnStep {
            spec: spec.clone(),
            dims: RnnDims { seq, batch, input },
            x: self.buf(ins[0])?,
            w,
            r: rs,
            bias: opt(self, has.bias)?,
            rbh: opt(self, has.rbh)?,
            seq_lens: opt(self, has.seq_lens)?,
            initial_h: opt(self, has.initial_h)?,
            initial_c: opt(self, has.initial_c)?,
            p: opt(self, has.p)?,
            dst,
        })))
    }

    /// A convolution (issue #13): depthwise weights reordered tap-major,
    /// others packed per group (reusing a shape-generic partition's packs).
    fn conv(&mut self, attrs: &ConvAttrs, ins: &[ValueId], out: ValueId, dst: BufRef) -> Result<Step> {
        let [batch, _, _, ci] = self.shape(ins[0])[..] else {
            return Err(internal("Conv input is not 4-D"));
        };
        let [co, cig, ..] = self.shape(ins[1])[..] else {
            return Err(internal("Conv weights are not 4-D"));
        };
        let w = self
            .graph
            .constant(ins[1])
            .cloned()
            .ok_or_else(|| internal("Conv weights are not a constant"))?;
        let (g, taps) = (attrs.groups, attrs.window.taps());
        let weights = if self.allow_winograd && winograd::pays(self.target, &attrs.window, ci, co, g) {
            let (target, m) = (self.target, winograd::tile_size(&attrs.window));
            let make = || -> Result<Vec<Weight>> {
                let packs = winograd::pack(target, w.as_slice(), co, ci, m)?;
                Ok(packs.iter().map(|p| p.data().clone()).collect())
            };
            let packs = match self.packs {
                Some(cache) => cache.winograd(&w, (ci, co, m), make)?,
                None => make()?,
            };
            let mut ids = Vec::with_capacity(winograd::positions(m));
            for data in packs {
                ids.push(self.push_packed(data, ci, co));
            }
            self.winograd.insert(out);
            ConvWeightsRef::Winograd(ids)
        } else if is_depthwise(ci, g, self.shape(ins[1])) {
            let dw = conv::depthwise_weights(w.as_slice(), co, taps);
            self.constants
                .push(Constant::plain(DType::F32, &[taps, co], Weight::from_vec(dw)));
            ConvWeightsRef::Depthwise(BufRef::Constant(self.constants.len() - 1))
        } else {
            let (k, n) = (taps * cig, co / g);
            let mut fresh = None;
            let mut ids = Vec::with_capacity(g);
            for gi in 0..g {
                let data = match self.packs.and_then(|p| p.get_conv(&w, gi, k, n)) {
                    Some(data) => data,
                    None => {
                        let all = match &fresh {
                            Some(all) => all,
                            None => fresh.insert(conv::pack_groups(self.target, w.as_slice(), co, cig, taps, g)?),
                        };
                        all[gi].data().clone()
                    }
                };
                ids.push(self.push_packed(data, k, n));
            }
            ConvWeightsRef::Packed(ids)
        };
        let mut next = 2;
        let bias = if attrs.bias {
            next += 1;
            Some(self.buf(ins[2])?)
        } else {
            None
        };
        // The planner gave the output the residual's buffer (`residual_outputs`).
        let residual = attrs.residual.then(|| self.buf(ins[next])).transpose()?;
        let residual = residual.map(|r| {
            if r == dst {
                ConvResidual::InDst
            } else {
                ConvResidual::Buf(r)
            }
        });
        Ok(Step::Conv(Box::new(ConvStep {
            window: attrs.window,
            batch,
            in_channels: ci,
            out_channels: co,
            groups: g,
            x: self.buf(ins[0])?,
            weights,
            bias,
            activation: attrs.activation,
            residual,
            after: attrs.after,
            dst,
            dst_stride: self.pixel_stride(out),
        })))
    }

    /// Embeddings + LayerNorm. Each term's row strides over the output's
    /// leading dims: its row shape (a gathered term's indices, an added
    /// term's dims but the last) broadcast to them.
    fn embed(&mut self, attrs: &EmbedAttrs, ins: &[ValueId], out: ValueId, dst: BufRef) -> Result<Step> {
        let shape = self.shape(out);
        let (lead, width) = match shape.split_last() {
            Some((&w, lead)) => (lead.to_vec(), w),
            None => return Err(internal("an embedding layer norm of a scalar")),
        };
        let (norm, mut rest) = ins.split_at(attrs.norm_inputs());
        let mut terms = Vec::with_capacity(attrs.terms.len());
        for term in &attrs.terms {
            let (now, later) = rest.split_at(term.inputs());
            rest = later;
            let (src, rows) = match term {
                EmbedTerm::Gathered => (
                    EmbedSrc::Gathered {
                        table: self.buf(now[0])?,
                        indices: self.buf(now[1])?,
                        idx_dtype: self.dtype(now[1]),
                    },
                    self.shape(now[1]).to_vec(),
                ),
                EmbedTerm::Added => {
                    let s = self.shape(now[0]);
                    let rows = s[..s.len().saturating_sub(1)].to_vec();
                    (EmbedSrc::Added(self.buf(now[0])?), rows)
                }
            };
            let strides = broadcast_strides(&rows, &lead);
            terms.push(EmbedTermStep { src, strides });
        }
        Ok(Step::EmbedLayerNorm(Box::new(EmbedStep {
            lead,
            width,
            epsilon: attrs.epsilon,
            decomposed: attrs.decomposed,
            scale: self.buf(norm[0])?,
            bias: norm.get(1).map(|&b| self.buf(b)).transpose()?,
            terms,
            dst,
        })))
    }

    /// Fused attention: Q, K, V read in place; the mask's strides over
    /// `[batch, heads, q_len]` (0 along its broadcast dims).
    fn attention(&mut self, attrs: &AttentionAttrs, ins: &[ValueId], dst: BufRef) -> Result<Step> {
        let n = attrs.qkv_inputs();
        let (qs, ks) = (self.shape(ins[0]).to_vec(), self.shape(ins[n - 1]).to_vec());
        let width = if attrs.packed_qkv { qs[2] / 3 } else { qs[2] };
        let shape = AttentionShape {
            batch: qs[0],
            heads: attrs.heads,
            q_len: qs[1],
            kv_len: ks[1],
            head_dim: width / attrs.heads,
            scale: attrs.scale,
        };
        let full = [shape.batch, shape.heads, shape.q_len, shape.kv_len];
        let (mask, mask_strides) = match ins.get(n) {
            Some(&m) => {
                let st = broadcast_strides(self.shape(m), &full);
                (Some(self.buf(m)?), [st[0], st[1], st[2]])
            }
            None => (None, [0; 3]),
        };
        // Packed: Q, K and V name the one buffer.
        let [q, k, v] = if attrs.packed_qkv {
            [ins[0]; 3]
        } else {
            [ins[0], ins[1], ins[2]]
        };
        Ok(Step::Attention(Box::new(AttentionStep {
            shape,
            packed_qkv: attrs.packed_qkv,
            q: self.buf(q)?,
            k: self.buf(k)?,
            v: self.buf(v)?,
            mask,
            mask_strides,
            dst,
        })))
    }

    /// A transposed convolution: the weights packed per group as the GEMM's
    /// B (`[ci / groups, kh · kw · co / groups]`, tap-major columns).
    fn conv_transpose(&mut self, attrs: &ConvTransposeAttrs, ins: &[ValueId], dst: BufRef) -> Result<Step> {
        let [batch, _, _, ci] = self.shape(ins[0])[..] else {
            return Err(internal("ConvTranspose x is not 4-D"));
        };
        let cog = self.shape(ins[1])[1];
        let (g, taps) = (attrs.groups, attrs.window.taps());
        let w = self
            .graph
            .constant(ins[1])
            .cloned()
            .ok_or_else(|| internal("ConvTranspose weights are not a constant"))?;
        let mut packed = Vec::with_capacity(g);
        for b in conv_transpose::weight_matrices(w.as_slice(), g, ci, cog, taps) {
            let pb = PackedB::try_pack(self.target, &b, ci / g, taps * cog, false)?;
            packed.push(self.push_packed(pb.data().clone(), ci / g, taps * cog));
        }
        Ok(Step::ConvTranspose(Box::new(ConvTransposeStep {
            window: attrs.window,
            batch,
            groups: g,
            ci,
            co: cog * g,
            x: self.buf(ins[0])?,
            w: packed,
            bias: if attrs.bias { Some(self.buf(ins[2])?) } else { None },
            dst,
        })))
    }

    /// The program constant holding constant `v` (data `w`) packed as the
    /// B of a `k x n` product, packed once however many products read it;
    /// reuses weights packed once for a shape-generic partition.
    fn packed_b(&mut self, v: ValueId, w: &Weight, trans_b: bool, k: usize, n: usize) -> usize {
        let key = (self.rep[v], trans_b);
        if let Some(&i) = self.packed_index.get(&key) {
            return i;
        }
        let data = match self.packs.and_then(|p| p.get(w, trans_b, k, n)) {
            Some(data) => data,
            None => PackedB::pack(self.target, w.as_slice(), k, n, trans_b).data().clone(),
        };
        let id = self.push_packed(data, k, n);
        self.packed_index.insert(key, id);
        id
    }

    /// A GEMM B packed as `[k, n]` (`Packing::GemmB`) as a new program
    /// constant; its index.
    fn push_packed(&mut self, data: Weight, k: usize, n: usize) -> usize {
        self.constants.push(Constant {
            dtype: DType::F32,
            shape: vec![k, n].into(),
            data,
            packing: Packing::GemmB { k, n },
        });
        self.constants.len() - 1
    }

    /// Packs `n` rows of `k` values of `w` from element `at` (a `[n, k]`
    /// block: `trans_b`) as a program constant; reuses weights packed once
    /// for a shape-generic partition.
    fn packed_constant(&mut self, w: &Weight, at: usize, k: usize, n: usize) -> Result<usize> {
        let data = match self.packs.and_then(|p| p.get(w, true, k, n)).filter(|_| at == 0) {
            Some(data) => data,
            None => {
                let block = w
                    .as_slice()
                    .get(at..at + k * n)
                    .ok_or_else(|| internal("recurrent weight block out of range"))?;
                PackedB::try_pack(self.target, block, k, n, true)?.data().clone()
            }
        };
        Ok(self.push_packed(data, k, n))
    }

    /// The buffer holding value `v` (through its alias representative).
    fn buf(&mut self, v: ValueId) -> Result<BufRef> {
        let root = self.rep[v];
        let home =
            self.homes[root].ok_or_else(|| internal(format_args!("'{}' has no buffer", self.graph.values[v].name)))?;
        Ok(match home {
            Home::Input(i) => BufRef::Input(i),
            Home::Output(j) => BufRef::Output(j),
            Home::Constant(k) => BufRef::Constant(self.constant(k)),
            Home::Temp(k) => BufRef::Scratch {
                offset: self.offsets[k],
                len: self.temps[k].len,
            },
            Home::Slice { temp, channel, len, .. } => BufRef::Scratch {
                offset: self.offsets[temp] + channel * self.dtype(v).size(),
                len,
            },
        })
    }

    /// Values between the pixels of a value (channels last): its channels,
    /// or the concat's when it is written in place there.
    fn pixel_stride(&self, v: ValueId) -> usize {
        match self.homes[self.rep[v]] {
            Some(Home::Slice { stride, .. }) => stride,
            _ => self.shape(v).last().copied().unwrap_or(1),
        }
    }

    /// Row-major strides of `v`'s elements where it is stored: its own
    /// buffer's, or with pixels [`Self::pixel_stride`] apart in a concat's.
    fn out_strides(&self, v: ValueId) -> Vec<isize> {
        let mut shape = self.shape(v).to_vec();
        if let Some(last) = shape.last_mut() {
            *last = self.pixel_stride(v);
        }
        strides(&shape)
    }

    /// Whether `out`, the slice of `src` from `starts` by `steps`, already
    /// lies where `src`'s values put it: a channel split passed through
    /// into the concat that `src` is written into ([`concat_slices`]).
    fn passed_through(&self, src: ValueId, out: ValueId, starts: &[usize], steps: &[isize]) -> bool {
        let (
            Some(Home::Slice {
                temp, channel, stride, ..
            }),
            Some(Home::Slice {
                temp: t,
                channel: c,
                stride: s,
                ..
            }),
        ) = (self.homes[self.rep[src]], self.homes[self.rep[out]])
        else {
            return false;
        };
        let Some((&last, outer)) = starts.split_last() else {
            return false;
        };
        temp == t
            && stride == s
            && channel + last == c
            && outer.iter().all(|&a| a == 0)
            && steps.iter().all(|&k| k == 1)
    }

    fn constant(&mut self, k: usize) -> usize {
        if let Some(index) = self.constant_index[k] {
            return index;
        }
        let (v, data) = &self.graph.constants[k];
        let ty = &self.graph.values[*v].ty;
        self.constants.push(Constant::plain(ty.dtype, &ty.shape, data.clone()));
        self.constant_index[k] = Some(self.constants.len() - 1);
        self.constants.len() - 1
    }
}

fn specs(graph: &Graph, ids: &[ValueId]) -> Vec<TensorSpec> {
    ids.iter()
        .map(|&v| {
            let val = &graph.values[v];
            TensorSpec::new(&val.name, val.ty.dtype, &val.ty.shape)
        })
        .collect()
}

/// Nodes per op name, in order of first appearance (aliases included).
/// How many nodes of each op the graph has, by name (the EPContext node's
/// notes); a concat that some convolutions write in place is
/// `Concat+InPlace`, a convolution run as Winograd's `Conv… (Winograd)`.
fn op_counts(
    graph: &Graph,
    slices: &HashMap<ValueId, ConcatSlice>,
    winograd: &HashSet<ValueId>,
) -> Vec<(String, usize)> {
    let mut counts: Vec<(String, usize)> = Vec::new();
    for node in &graph.nodes {
        let in_place = node.inputs.iter().any(|v| slices.contains_key(v));
        let name = match &node.op {
            Op::Concat { .. } if in_place => "Concat+InPlace".to_string(),
            op @ Op::Conv(_) if node.outputs.first().is_some_and(|o| winograd.contains(o)) => {
                format!("{} (Winograd)", op.name())
            }
            op => op.name(),
        };
        match counts.iter_mut().find(|(n, _)| *n == name) {
            Some((_, c)) => *c += 1,
            None => counts.push((name, 1)),
        }
    }
    counts
}

/// A broken compiler invariant, reported instead of panicking.
pub(crate) fn internal(what: impl std::fmt::Display) -> Error {
    Error::fail(format!("kiln compiler bug: {what}"))
}
