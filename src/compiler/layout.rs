//! Layout propagation: moves transposes through ops that do not care about
//! the order of their input's dims, so that inverse pairs cancel.
//!
//! kiln imports every spatial op channels-last, between a `Transpose` into
//! `[N, H, W, C]` and one back to ONNX's `[N, C, H, W]`. Between two such ops
//! a model has activations, residual adds, per-channel scales, concats and
//! slices on the channel axis, reductions... Without this pass each of those
//! transposes would run.
//!
//! The pass walks the graph in order and defers every transpose: its output
//! becomes a *view*, `(stored, perm)`, meaning `value = Transpose(stored,
//! perm)`, with nothing computed. An op that does not care about layout
//! (elementwise, Cast, Where, Concat, Slice, Softmax, Reduce; see
//! [`Layout::push`]) runs on the stored tensors instead, its axes remapped
//! and its constant operands permuted at compile time, and its output is a
//! view with the same perm. A transpose of a view composes the perms; when
//! the result is the identity (the channels-first → channels-last pair
//! between two spatial ops) nothing remains. A view is *materialised* (its
//! `Transpose` emitted, once, writing the original value) only where an op
//! that needs ONNX's layout reads it (Reshape, MatMul, Gather, a spatial op
//! ...) or where it is a graph output; the ops that can take it keep reading
//! the view. A Reshape that only adds or removes size-1 dims (the 1-D ops'
//! `[N, C, L]` ↔ `[N, C, 1, L]`, Flatten after a global pool) passes a view
//! through, and a transpose that only moves size-1 dims becomes a Reshape.
//!
//! What each op computes is unchanged: elementwise and data-movement ops
//! give bit-identical results; Softmax and Reduce along a remapped axis give
//! the same values up to the order of their f32 sums.

use std::collections::{HashMap, HashSet};

use crate::error::Result;
use crate::ir::{infer, Graph, Node, Op, TensorType, ValueId};
use crate::plan::Weight;

/// Runs the pass over `g` (validated, in topological order).
pub(crate) fn propagate(g: &mut Graph) -> Result<()> {
    let reaches = reaches_transpose(g);
    let single = single_reader(g);
    let old_nodes = std::mem::take(&mut g.nodes);
    let mut pass = Layout {
        reaches,
        single,
        g,
        views: HashMap::new(),
        subst: HashMap::new(),
        materialised: HashSet::new(),
        moved: HashMap::new(),
        view_of: HashMap::new(),
    };
    for node in old_nodes {
        pass.node(node)?;
    }
    pass.finish_outputs();
    Ok(())
}

/// `value = Transpose(stored, perm)`, not computed (unless materialised).
#[derive(Clone, Debug)]
struct View {
    stored: ValueId,
    perm: Vec<usize>,
}

struct Layout<'g> {
    g: &'g mut Graph,
    /// Per original value: whether a Transpose reads it through layout-agnostic
    /// ops (so a view moved into it may cancel or compose there).
    reaches: Vec<bool>,
    /// Per original value: read by one node and not a graph output.
    single: Vec<bool>,
    views: HashMap<ValueId, View>,
    /// Values that are another value under an identity transpose.
    subst: HashMap<ValueId, ValueId>,
    /// Views whose `Transpose` has been emitted (the value exists too).
    materialised: HashSet<ValueId>,
    /// `(value, perm)` → the value transposed by `perm`, already made (a
    /// permuted constant, or a plain operand moved into a view's layout).
    moved: HashMap<(ValueId, Vec<usize>), ValueId>,
    /// `(stored, perm)` → the first view of it: a later one is that value,
    /// so that a tensor read by several spatial ops (a graph input feeding
    /// two convolutions) is transposed once, not once per reader.
    view_of: HashMap<(ValueId, Vec<usize>), ValueId>,
}

/// How a pushed op's output relates to its stored result.
struct Pushed {
    op: Op,
    /// The stored output's shape.
    shape: Vec<usize>,
    /// The perm that gives the original output back from the stored one.
    perm: Vec<usize>,
}

/// One input of a pushed op, before anything is emitted.
enum Operand {
    /// A view in the op's perm: read its stored tensor.
    Stored(ValueId),
    /// A one-element constant: broadcasts the same in any layout.
    Scalar(ValueId),
    /// A constant to permute at compile time.
    Constant(ValueId),
    /// A computed value to transpose (it must be smaller than the views).
    Plain(ValueId),
}

impl Layout<'_> {
    fn node(&mut self, mut node: Node) -> Result<()> {
        for v in node.inputs.iter_mut() {
            *v = self.resolve(*v);
        }
        match node.op.clone() {
            Op::Transpose { perm } => self.transpose(&node, &perm),
            Op::Reshape if self.reshape(&node)? => Ok(()),
            _ if self.push(&node)? => Ok(()),
            _ => self.keep(node),
        }
    }

    fn resolve(&self, v: ValueId) -> ValueId {
        self.subst.get(&v).copied().unwrap_or(v)
    }

    /// Emits `node` as it is, materialising the views it reads.
    fn keep(&mut self, mut node: Node) -> Result<()> {
        for k in 0..node.inputs.len() {
            node.inputs[k] = self.materialise(node.inputs[k]);
        }
        self.g.nodes.push(node);
        Ok(())
    }

    /// `v` as a computed value: emits a view's transpose the first time.
    fn materialise(&mut self, v: ValueId) -> ValueId {
        let Some(view) = self.views.get(&v).cloned() else {
            return v;
        };
        if self.materialised.insert(v) {
            self.g
                .add_node("layout", Op::Transpose { perm: view.perm }, vec![view.stored], vec![v]);
        }
        v
    }

    /// Graph outputs keep ONNX's layout and names.
    fn finish_outputs(&mut self) {
        for k in 0..self.g.outputs.len() {
            let v = self.g.outputs[k];
            if let Some(&s) = self.subst.get(&v) {
                // `s` may be a view (an output equal to an earlier view).
                let s = self.materialise(s);
                self.g.add_node("layout", Op::Reshape, vec![s], vec![v]);
                self.subst.remove(&v);
            } else {
                self.materialise(v);
            }
        }
    }

    /// Records `out = Transpose(stored, perm)` without computing it: an
    /// identity is the stored value itself, a move of size-1 dims a Reshape.
    fn set_view(&mut self, out: ValueId, stored: ValueId, perm: Vec<usize>) {
        if is_identity(&perm) {
            self.subst.insert(out, stored);
        } else if moves_only_unit_dims(&self.g.ty(stored).shape, &perm) {
            self.g.add_node("layout", Op::Reshape, vec![stored], vec![out]);
        } else if let Some(&first) = self.view_of.get(&(stored, perm.clone())) {
            self.subst.insert(out, first);
        } else {
            self.view_of.insert((stored, perm.clone()), out);
            self.views.insert(out, View { stored, perm });
        }
    }

    fn transpose(&mut self, node: &Node, perm: &[usize]) -> Result<()> {
        let (x, out) = (node.inputs[0], node.outputs[0]);
        match self.views.get(&x).cloned() {
            Some(v) => {
                let composed = perm.iter().map(|&i| v.perm[i]).collect();
                self.set_view(out, v.stored, composed);
            }
            None => self.set_view(out, x, perm.to_vec()),
        }
        Ok(())
    }

    /// A Reshape that only adds or removes size-1 dims passes a view
    /// through; returns whether it did.
    fn reshape(&mut self, node: &Node) -> Result<bool> {
        let (x, out) = (node.inputs[0], node.outputs[0]);
        let Some(view) = self.views.get(&x).cloned() else {
            return Ok(false);
        };
        let (from, to) = (self.g.ty(x).shape.clone(), self.g.ty(out).shape.clone());
        if non_unit(&from) != non_unit(&to) {
            return Ok(false);
        }
        let (shape, perm) = unit_reshape(&from, &to, &view.perm);
        let stored = self.reshaped(view.stored, &shape, "layout");
        self.set_view(out, stored, perm);
        Ok(true)
    }

    /// `v` reshaped to `shape` (a new alias unless it has that shape).
    fn reshaped(&mut self, v: ValueId, shape: &[usize], hint: &str) -> ValueId {
        if self.g.ty(v).shape == shape {
            return v;
        }
        let ty = TensorType::new(self.g.ty(v).dtype, shape);
        let id = self.g.fresh_value(hint, ty);
        self.g.add_node("layout", Op::Reshape, vec![v], vec![id]);
        id
    }

    /// Runs a layout-agnostic op on the stored tensors of the views it
    /// reads, when that is no more work; returns whether it did.
    fn push(&mut self, node: &Node) -> Result<bool> {
        let Some((perm, operands)) = self.plan_operands(node) else {
            return Ok(false);
        };
        let Some(pushed) = self.pushed_op(node, &perm, &operands) else {
            return Ok(false);
        };
        let mut inputs = Vec::with_capacity(operands.len());
        for op in &operands {
            inputs.push(match *op {
                Operand::Stored(s) | Operand::Scalar(s) => s,
                Operand::Constant(c) => self.permuted_constant(c, &perm)?,
                Operand::Plain(v) => self.moved_operand(v, &perm),
            });
        }
        let tys: Vec<&TensorType> = inputs.iter().map(|&v| self.g.ty(v)).collect();
        let ty = infer(&pushed.op, &tys, Some(&pushed.shape))
            .map_err(|e| super::lower::internal(format_args!("layout pass, {}: {e}", node.op)))?
            .remove(0);
        if ty.shape != pushed.shape {
            return Err(super::lower::internal(format_args!(
                "layout pass, {}: stored output {ty} is not {:?}",
                node.op, pushed.shape
            )));
        }
        let out = node.outputs[0];
        let hint = self.g.values[out].name.clone();
        let stored = self.g.fresh_value(&hint, ty);
        self.g.add_node(&node.name, pushed.op, inputs, vec![stored]);
        self.set_view(out, stored, pushed.perm);
        Ok(true)
    }

    /// The perm the op's views share and what to do with each input, if
    /// the op can run in that layout for no more work than materialising.
    fn plan_operands(&self, node: &Node) -> Option<(Vec<usize>, Vec<Operand>)> {
        if !is_agnostic(&node.op) || node.outputs.len() != 1 {
            return None;
        }
        let perm = node.inputs.iter().find_map(|v| self.views.get(v))?.perm.clone();
        let rank = perm.len();
        let (mut viewed, mut plain, mut shared) = (0usize, 0usize, false);
        let mut operands = Vec::with_capacity(node.inputs.len());
        for &v in &node.inputs {
            let ty = self.g.ty(v);
            let op = match self.views.get(&v) {
                Some(view) if view.perm == perm => {
                    viewed += ty.numel();
                    shared |= !self.single[v];
                    Operand::Stored(view.stored)
                }
                Some(_) => return None,
                None if ty.shape.len() > rank => return None,
                None if self.g.constant(v).is_some() && ty.numel() == 1 => Operand::Scalar(v),
                None if self.g.constant(v).is_some() => Operand::Constant(v),
                None => {
                    plain += ty.numel();
                    Operand::Plain(v)
                }
            };
            operands.push(op);
        }
        // Transposing a smaller operand beats transposing the views, and the
        // output must not grow (it may be materialised later). Moving the
        // view pays if it can meet a transpose, or if materialising the
        // output later costs less than materialising the views now; at
        // equal cost (an activation or a constant scale at a partition's
        // edge) too, since the op then can fuse into the one before it (a
        // detector head's Conv → Sigmoid), unless a view is read elsewhere
        // as well (it would be materialised twice).
        let out = self.g.ty(node.outputs[0]);
        let same_rank = out.shape.len() == rank || matches!(node.op, Op::Reduce { .. });
        let cheaper = out.numel() < viewed || (plain == 0 && !shared && out.numel() == viewed);
        let pays = self.reaches[node.outputs[0]] || cheaper;
        (plain < viewed && out.numel() <= viewed && same_rank && pays).then_some((perm, operands))
    }

    /// The op on the stored tensors, with its axes remapped.
    fn pushed_op(&self, node: &Node, perm: &[usize], operands: &[Operand]) -> Option<Pushed> {
        let out_shape = &self.g.ty(node.outputs[0]).shape;
        let same = |op: Op| Pushed {
            op,
            shape: stored_shape_of(out_shape, perm),
            perm: perm.to_vec(),
        };
        let pushed = match &node.op {
            Op::Unary(_) | Op::Binary(_) | Op::Where | Op::Cast { .. } => same(node.op.clone()),
            Op::Softmax { axis, unshifted } => same(Op::Softmax {
                axis: perm[*axis],
                unshifted: *unshifted,
            }),
            Op::Concat { axis } => same(Op::Concat { axis: perm[*axis] }),
            Op::Slice { starts, steps } => same(Op::Slice {
                starts: stored_shape_of(starts, perm),
                steps: stored_shape_of(steps, perm),
            }),
            Op::Reduce { kind, axes, keepdims } => {
                let Operand::Stored(x) = operands[0] else {
                    return None;
                };
                return reduce(*kind, axes, *keepdims, perm, &self.g.ty(x).shape);
            }
            _ => return None,
        };
        Some(pushed)
    }

    /// Constant `c` in the layout of views with `perm` (its rank kept when
    /// the permuted dims allow, e.g. `[C, 1, 1]` → `[1, 1, C]` under
    /// `[0, 3, 1, 2]`).
    fn permuted_constant(&mut self, c: ValueId, perm: &[usize]) -> Result<ValueId> {
        if let Some(&id) = self.moved.get(&(c, perm.to_vec())) {
            return Ok(id);
        }
        let ty = self.g.ty(c).clone();
        let padded = padded(&ty.shape, perm.len());
        let inv = inverse(perm);
        let w = self.g.constant(c).expect("a constant operand");
        let bytes = permute_bytes(w.as_bytes(), ty.dtype.size(), &padded, &inv);
        let mut shape: Vec<usize> = inv.iter().map(|&p| padded[p]).collect();
        while shape.len() > ty.shape.len() && shape[0] == 1 {
            shape.remove(0);
        }
        let name = self.g.values[c].name.clone();
        let id = self.g.fresh_value(&name, TensorType::new(ty.dtype, &shape));
        self.g.add_constant_weight(id, Weight::from_bytes(&bytes))?;
        self.moved.insert((c, perm.to_vec()), id);
        Ok(id)
    }

    /// Computed value `v` (rank ≤ the perm's) in the layout of views with `perm`.
    fn moved_operand(&mut self, v: ValueId, perm: &[usize]) -> ValueId {
        if let Some(&id) = self.moved.get(&(v, perm.to_vec())) {
            return id;
        }
        let v = self.materialise(v);
        let name = self.g.values[v].name.clone();
        let padded = padded(&self.g.ty(v).shape, perm.len());
        let x = self.reshaped(v, &padded, &name);
        let inv = inverse(perm);
        let shape: Vec<usize> = inv.iter().map(|&p| padded[p]).collect();
        let id = if moves_only_unit_dims(&padded, &inv) {
            self.reshaped(x, &shape, &name)
        } else {
            let ty = TensorType::new(self.g.ty(v).dtype, &shape);
            let id = self.g.fresh_value(&name, ty);
            self.g
                .add_node("layout", Op::Transpose { perm: inv }, vec![x], vec![id]);
            id
        };
        self.moved.insert((v, perm.to_vec()), id);
        id
    }
}

/// For every value, whether a Transpose reads it, directly or through
/// layout-agnostic ops and Reshapes of size-1 dims.
fn reaches_transpose(g: &Graph) -> Vec<bool> {
    let mut reaches = vec![false; g.values.len()];
    for node in g.nodes.iter().rev() {
        let through = match &node.op {
            Op::Transpose { .. } => true,
            Op::Reshape => {
                let (i, o) = (node.inputs[0], node.outputs[0]);
                reaches[o] && non_unit(&g.ty(i).shape) == non_unit(&g.ty(o).shape)
            }
            op => is_agnostic(op) && node.outputs.iter().any(|&o| reaches[o]),
        };
        if through {
            for &v in &node.inputs {
                reaches[v] = true;
            }
        }
    }
    reaches
}

/// Per value: whether exactly one node reads it (once) and it is not a
/// graph output.
fn single_reader(g: &Graph) -> Vec<bool> {
    let mut single: Vec<bool> = g.consumers().iter().map(|c| c.len() == 1).collect();
    for &v in &g.outputs {
        single[v] = false;
    }
    single
}

/// Ops that compute the same thing in any layout once their axes are remapped.
fn is_agnostic(op: &Op) -> bool {
    matches!(
        op,
        Op::Unary(_)
            | Op::Binary(_)
            | Op::Where
            | Op::Cast { .. }
            | Op::Softmax { .. }
            | Op::Concat { .. }
            | Op::Slice { .. }
            | Op::Reduce { .. }
    )
}

/// A reduction of a view with `perm` as one of its stored tensor (of
/// `stored` shape), if the remapped axes are still one contiguous run (what
/// the kernel needs, size-1 dims aside).
fn reduce(
    kind: crate::ir::ReduceKind,
    axes: &[usize],
    keepdims: bool,
    perm: &[usize],
    stored: &[usize],
) -> Option<Pushed> {
    let mut new_axes: Vec<usize> = axes.iter().map(|&a| perm[a]).collect();
    new_axes.sort_unstable();
    let real: Vec<usize> = new_axes.iter().copied().filter(|&a| stored[a] != 1).collect();
    if let (Some(&lo), Some(&hi)) = (real.first(), real.last()) {
        if (lo..=hi).any(|d| stored[d] != 1 && !new_axes.contains(&d)) {
            return None;
        }
    }
    let (shape, out_perm) = if keepdims {
        let s = stored
            .iter()
            .enumerate()
            .map(|(d, &n)| if new_axes.contains(&d) { 1 } else { n })
            .collect();
        (s, perm.to_vec())
    } else {
        // The kept axes, in stored order, and where each output axis went.
        let kept: Vec<usize> = (0..perm.len()).filter(|a| !axes.contains(a)).map(|a| perm[a]).collect();
        let mut order = kept.clone();
        order.sort_unstable();
        let s = order.iter().map(|&d| stored[d]).collect();
        let p = kept
            .iter()
            .map(|k| order.iter().position(|o| o == k).unwrap())
            .collect();
        (s, p)
    };
    Some(Pushed {
        op: crate::ir::Op::Reduce {
            kind,
            axes: new_axes,
            keepdims,
        },
        shape,
        perm: out_perm,
    })
}

fn is_identity(perm: &[usize]) -> bool {
    perm.iter().enumerate().all(|(i, &p)| i == p)
}

/// Whether transposing a tensor of `shape` by `perm` keeps its dims other
/// than 1 in order, i.e. is a reshape.
fn moves_only_unit_dims(shape: &[usize], perm: &[usize]) -> bool {
    let mut last = None;
    for &p in perm {
        if shape[p] != 1 {
            if last.is_some_and(|l| l > p) {
                return false;
            }
            last = Some(p);
        }
    }
    true
}

fn non_unit(shape: &[usize]) -> Vec<usize> {
    shape.iter().copied().filter(|&d| d != 1).collect()
}

pub(crate) fn inverse(perm: &[usize]) -> Vec<usize> {
    let mut inv = vec![0; perm.len()];
    for (i, &p) in perm.iter().enumerate() {
        inv[p] = i;
    }
    inv
}

/// Per-axis values of a view (`v[i]` for view axis `i`) in stored order.
fn stored_shape_of<T: Copy + Default>(v: &[T], perm: &[usize]) -> Vec<T> {
    let mut s = vec![T::default(); perm.len()];
    for (i, &p) in perm.iter().enumerate() {
        s[p] = v[i];
    }
    s
}

/// `shape` with leading 1s up to `rank` (how broadcasting aligns it).
fn padded(shape: &[usize], rank: usize) -> Vec<usize> {
    let mut s = vec![1; rank - shape.len()];
    s.extend_from_slice(shape);
    s
}

/// A view of shape `from` (stored with `perm`) reshaped to `to`, which only adds or removes size-1 dims: the stored
/// tensor's new shape and the output's perm. Output dims keep the stored
/// order of the dims they were; a size-1 dim goes just before the next
/// real dim (so that the 1-D ops' `[N, C, L]` ↔ `[N, C, 1, L]` round trip
/// composes to the identity).
fn unit_reshape(from: &[usize], to: &[usize], perm: &[usize]) -> (Vec<usize>, Vec<usize>) {
    let real_from: Vec<usize> = (0..from.len()).filter(|&i| from[i] != 1).collect();
    let mut keys = vec![0usize; to.len()];
    let mut next = 2 * perm.len() + 2;
    let mut m = real_from.len();
    for j in (0..to.len()).rev() {
        if to[j] != 1 {
            m -= 1;
            keys[j] = 2 * perm[real_from[m]] + 1;
            next = keys[j] - 1;
        } else {
            keys[j] = next;
        }
    }
    let mut order: Vec<usize> = (0..to.len()).collect();
    order.sort_by_key(|&j| (keys[j], j));
    let shape = order.iter().map(|&j| to[j]).collect();
    (shape, inverse(&order))
}

/// Row-major `bytes` of a tensor of `shape` transposed by `perm`.
fn permute_bytes(bytes: &[u8], elem: usize, shape: &[usize], perm: &[usize]) -> Vec<u8> {
    let rank = shape.len();
    let mut strides = vec![1usize; rank];
    for d in (0..rank.saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * shape[d + 1];
    }
    let dims: Vec<usize> = perm.iter().map(|&p| shape[p]).collect();
    let src: Vec<usize> = perm.iter().map(|&p| strides[p]).collect();
    let n: usize = dims.iter().product();
    let mut out = Vec::with_capacity(n * elem);
    let mut idx = vec![0usize; rank];
    for _ in 0..n {
        let off: usize = idx.iter().zip(&src).map(|(i, s)| i * s).sum();
        out.extend_from_slice(&bytes[off * elem..(off + 1) * elem]);
        for d in (0..rank).rev() {
            idx[d] += 1;
            if idx[d] < dims[d] {
                break;
            }
            idx[d] = 0;
        }
    }
    out
}

#[cfg(test)]
#[path = "layout_tests.rs"]
mod tests;
