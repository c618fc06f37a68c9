//! Pattern recognition: replaces decomposed subgraphs with single ops.
//!
//! - erf-GELU: `x·0.5·(1 + erf(x/√2))` with the division written as
//!   `Div(x, √2)` or `Mul(x, 1/√2)`, and the halving in any of the three
//!   common places (`(x·(1+erf))·0.5`, `(x·0.5)·(1+erf)`, `x·((1+erf)·0.5)`);
//! - tanh-GELU: `x·0.5·(1 + tanh(√(2/π)·(x + 0.044715·x³)))`, the cube as
//!   any product of Mul nodes (`Pow(x, 3)`, `x·(x·x)`, `x·(x·(0.044715·x))`),
//!   with the same tails;
//! - LayerNorm: `ReduceMean → Sub → Pow(2)|Mul → ReduceMean → Add(eps) →
//!   Sqrt → Div`, then optionally `Mul(γ)` and `Add(β)` with constant
//!   per-feature γ/β, over trailing axes;
//! - Softmax: `Exp → ReduceSum(keepdims) → Div`, with or without the
//!   `ReduceMax → Sub` max subtraction, over one axis;
//! - SiLU: `x · Sigmoid(x)` (YOLOv8, EfficientNet), and HardSwish:
//!   `x · HardSigmoid(x)` with exactly HardSwish's alpha = 1/6 and
//!   beta = 1/2 (older exports), or `x · Clip(x + 3, 0, 6) / 6` (PP-OCR's
//!   paddle2onnx export; the `/ 6` also as `· (1/6)`), so the epilogue
//!   fusion can take them.
//!
//! A match needs every intermediate value to be used only inside the
//! pattern (and not be a graph output), constants to match within 1e-5
//! relative, and the result to have the input's type; anything else is
//! left alone. Operands of Add/Mul match in either order.

use crate::ir::{BinaryOp, DType, Graph, Node, Op, ReduceKind, UnaryOp, ValueId};

/// One replacement: `node` takes the place of node `at`; `remove` go away;
/// `before` are new nodes placed just before `at` (so they may read only
/// constants and values of nodes before `at` that stay).
pub(crate) struct Rewrite {
    pub at: usize,
    pub node: Node,
    pub remove: Vec<usize>,
    pub before: Vec<Node>,
}

/// Graph facts the matchers need.
pub(crate) struct View<'g> {
    pub g: &'g Graph,
    pub cons: Vec<Vec<usize>>,
    pub prod: Vec<Option<usize>>,
    pub is_out: Vec<bool>,
}

impl<'g> View<'g> {
    pub fn new(g: &'g Graph) -> Self {
        let mut is_out = vec![false; g.values.len()];
        for &v in &g.outputs {
            is_out[v] = true;
        }
        View {
            g,
            cons: g.consumers(),
            prod: g.producers(),
            is_out,
        }
    }

    /// The producer of `v` if it is `op`-like (checked by `f`).
    pub fn producer(&self, v: ValueId) -> Option<(usize, &'g Node)> {
        let i = self.prod[v]?;
        Some((i, &self.g.nodes[i]))
    }

    /// The single node reading `v` (possibly through several of its inputs),
    /// if `v` is not a graph output.
    pub fn sole_use(&self, v: ValueId) -> Option<usize> {
        let c = &self.cons[v];
        let first = *c.first()?;
        (!self.is_out[v] && c.iter().all(|&i| i == first)).then_some(first)
    }

    /// Value of a one-element f32 constant.
    pub fn scalar(&self, v: ValueId) -> Option<f64> {
        if self.g.values[v].ty.dtype != DType::F32 || self.g.values[v].ty.numel() != 1 {
            return None;
        }
        self.g.constant(v).map(|w| w.as_slice()[0] as f64)
    }

    pub fn scalar_is(&self, v: ValueId, want: f64) -> bool {
        self.scalar(v).is_some_and(|s| (s - want).abs() <= 1e-5 * want.abs())
    }

    /// For a binary `op` node reading `v`, the other operand.
    pub fn other(&self, node: &Node, op: BinaryOp, v: ValueId) -> Option<ValueId> {
        if node.op != Op::Binary(op) {
            return None;
        }
        match node.inputs[..] {
            [a, b] if a == v => Some(b),
            [a, b] if b == v => Some(a),
            _ => None,
        }
    }

    /// For a commutative `op` node, the operand that is not a scalar equal
    /// to `c` (if one is).
    pub fn with_scalar(&self, node: &Node, op: BinaryOp, c: f64) -> Option<ValueId> {
        if node.op != Op::Binary(op) {
            return None;
        }
        match node.inputs[..] {
            [a, b] if self.scalar_is(b, c) => Some(a),
            [a, b] if op != BinaryOp::Div && op != BinaryOp::Sub && self.scalar_is(a, c) => Some(b),
            _ => None,
        }
    }

    fn same_type(&self, a: ValueId, b: ValueId) -> bool {
        self.g.values[a].ty == self.g.values[b].ty
    }
}

/// Drops leading 1s: `[1, 1, 768]` → `[768]`.
pub(crate) fn strip_ones(s: &[usize]) -> &[usize] {
    let k = s.iter().take_while(|&&d| d == 1).count();
    &s[k..]
}

/// Runs every pattern; returns how many rewrites were made.
pub(crate) fn recognise(g: &mut Graph) -> usize {
    let mut total = 0;
    for matcher in [
        gelu_erf as Matcher,
        gelu_tanh,
        layer_norm,
        softmax,
        self_gated,
        hard_swish_clip,
    ] {
        total += apply(g, matcher);
    }
    total
}

pub(crate) type Matcher = fn(&View<'_>, usize, &mut Graph) -> Option<Rewrite>;

pub(crate) fn apply(g: &mut Graph, m: Matcher) -> usize {
    let snapshot = g.clone();
    let view = View::new(&snapshot);
    let mut touched = vec![false; g.nodes.len()];
    let mut rewrites = Vec::new();
    for i in 0..snapshot.nodes.len() {
        if touched[i] {
            continue;
        }
        if let Some(r) = m(&view, i, g) {
            if r.remove.iter().chain([&r.at]).any(|&k| touched[k]) {
                continue;
            }
            for &k in r.remove.iter().chain([&r.at]) {
                touched[k] = true;
            }
            rewrites.push(r);
        }
    }
    apply_rewrites(g, rewrites)
}

/// Applies rewrites that touch disjoint nodes; returns how many.
pub(crate) fn apply_rewrites(g: &mut Graph, rewrites: Vec<Rewrite>) -> usize {
    let n = rewrites.len();
    let mut dead = vec![false; g.nodes.len()];
    let mut before: Vec<Vec<Node>> = (0..g.nodes.len()).map(|_| Vec::new()).collect();
    for r in rewrites {
        for k in r.remove {
            dead[k] = true;
        }
        g.nodes[r.at] = r.node;
        before[r.at] = r.before;
    }
    let old = std::mem::take(&mut g.nodes);
    for ((node, new), dead) in old.into_iter().zip(before).zip(dead) {
        if !dead {
            g.nodes.extend(new);
            g.nodes.push(node);
        }
    }
    n
}

pub(crate) fn replaced(at: &Node, op: Op, inputs: Vec<ValueId>) -> Node {
    Node {
        name: at.name.clone(),
        op,
        inputs,
        outputs: at.outputs.clone(),
    }
}

/// The `·0.5·x` tail after `a = 1 + f(..)`: returns (final node, extra nodes).
/// The halving tail after `a = 1 + f`: its last node, the nodes it adds, and
/// whether it doubles first (`(x · a) · 0.5`, which overflows for x > FLT_MAX/2).
fn half_x_tail(v: &View<'_>, a: usize, x: ValueId) -> Option<(usize, Vec<usize>, bool)> {
    let av = v.g.nodes[a].outputs[0];
    let mi = v.sole_use(av)?;
    let m = &v.g.nodes[mi];
    let other = v.other(m, BinaryOp::Mul, av)?;
    let mv = m.outputs[0];
    if other == x {
        // (x · a) · 0.5
        let hi = v.sole_use(mv)?;
        v.with_scalar(&v.g.nodes[hi], BinaryOp::Mul, 0.5).filter(|&o| o == mv)?;
        return Some((hi, vec![mi], true));
    }
    if v.scalar_is(other, 0.5) {
        // x · (a · 0.5)
        let hi = v.sole_use(mv)?;
        v.other(&v.g.nodes[hi], BinaryOp::Mul, mv).filter(|&o| o == x)?;
        return Some((hi, vec![mi], false));
    }
    // (x · 0.5) · a
    let (pi, p) = v.producer(other)?;
    (v.sole_use(other)? == mi && v.with_scalar(p, BinaryOp::Mul, 0.5)? == x).then_some((mi, vec![pi], false))
}

/// `1 + f` where `f` is the output of node `fi`: the Add node.
fn plus_one(v: &View<'_>, fi: usize) -> Option<usize> {
    let f = v.g.nodes[fi].outputs[0];
    let ai = v.sole_use(f)?;
    v.with_scalar(&v.g.nodes[ai], BinaryOp::Add, 1.0).filter(|&o| o == f)?;
    Some(ai)
}

fn finish(v: &View<'_>, x: ValueId, at: usize, op: Op, mut remove: Vec<usize>) -> Option<Rewrite> {
    let node = &v.g.nodes[at];
    if !v.same_type(x, node.outputs[0]) || v.g.values[x].ty.dtype != DType::F32 {
        return None;
    }
    remove.retain(|&k| k != at);
    Some(Rewrite {
        at,
        node: replaced(node, op, vec![x]),
        remove,
        before: Vec::new(),
    })
}

fn gelu_erf(v: &View<'_>, ei: usize, _: &mut Graph) -> Option<Rewrite> {
    let e = &v.g.nodes[ei];
    if e.op != Op::Unary(UnaryOp::Erf) {
        return None;
    }
    let d = e.inputs[0];
    let (di, dn) = v.producer(d)?;
    let x = v
        .with_scalar(dn, BinaryOp::Div, std::f64::consts::SQRT_2)
        .or_else(|| v.with_scalar(dn, BinaryOp::Mul, std::f64::consts::FRAC_1_SQRT_2))?;
    if v.sole_use(d)? != ei {
        return None;
    }
    let ai = plus_one(v, ei)?;
    let (fin, extra, doubles) = half_x_tail(v, ai, x)?;
    let mut remove = vec![di, ei, ai];
    remove.extend(extra);
    let op = if doubles { UnaryOp::GeluWritten } else { UnaryOp::Gelu };
    finish(v, x, fin, Op::Unary(op), remove)
}

fn gelu_tanh(v: &View<'_>, ti: usize, _: &mut Graph) -> Option<Rewrite> {
    let t = &v.g.nodes[ti];
    if t.op != Op::Unary(UnaryOp::Tanh) {
        return None;
    }
    let s = t.inputs[0];
    let (si, sn) = v.producer(s)?;
    let u = v.with_scalar(sn, BinaryOp::Mul, 0.797_884_560_802_865_4)?;
    let (ui, un) = v.producer(u)?;
    if v.sole_use(s)? != ti || v.sole_use(u)? != si || un.op != Op::Binary(BinaryOp::Add) {
        return None;
    }
    let mut found = None;
    for (x, q) in [(un.inputs[0], un.inputs[1]), (un.inputs[1], un.inputs[0])] {
        let mut nodes = Vec::new();
        if let Some((3, coef)) = product(v, q, x, ui, &mut nodes, 0) {
            if (coef - 0.044_715).abs() <= 1e-5 * 0.044_715 {
                found = Some((x, nodes));
                break;
            }
        }
    }
    let (x, mut remove) = found?;
    let ai = plus_one(v, ti)?;
    let (fin, extra, doubles) = half_x_tail(v, ai, x)?;
    remove.extend([si, ui, ti, ai]);
    remove.extend(extra);
    let op = if doubles {
        UnaryOp::GeluTanhWritten
    } else {
        UnaryOp::GeluTanh
    };
    finish(v, x, fin, Op::Unary(op), remove)
}

/// `q` as a product of powers of `x` and f32 scalars, through Mul and
/// `Pow(x, 3)` nodes each read only by the node above (`user`): the power
/// of `x` and the scalars' product, the nodes pushed onto `nodes`. The
/// cube of tanh-GELU is written `0.044715 · x³`, `x · (x · (0.044715 · x))`
/// (jax2tf, Magika) and other ways.
fn product(
    v: &View<'_>,
    q: ValueId,
    x: ValueId,
    user: usize,
    nodes: &mut Vec<usize>,
    depth: usize,
) -> Option<(u32, f64)> {
    if q == x {
        return Some((1, 1.0));
    }
    if let Some(s) = v.scalar(q) {
        return Some((0, s));
    }
    let (qi, qn) = v.producer(q)?;
    if depth > 4 || v.sole_use(q)? != user {
        return None;
    }
    nodes.push(qi);
    if v.with_scalar(qn, BinaryOp::Pow, 3.0) == Some(x) {
        return Some((3, 1.0));
    }
    if qn.op != Op::Binary(BinaryOp::Mul) {
        return None;
    }
    let (pa, ca) = product(v, qn.inputs[0], x, qi, nodes, depth + 1)?;
    if qn.inputs[1] == qn.inputs[0] {
        return Some((2 * pa, ca * ca));
    }
    let (pb, cb) = product(v, qn.inputs[1], x, qi, nodes, depth + 1)?;
    Some((pa + pb, ca * cb))
}

/// `ReduceMean(x, axes, keepdims=1)` node feeding only `user`.
fn mean_of(v: &View<'_>, val: ValueId, user: usize) -> Option<(usize, ValueId, Vec<usize>)> {
    let (i, n) = v.producer(val)?;
    match &n.op {
        Op::Reduce {
            kind: ReduceKind::Mean,
            axes,
            keepdims: true,
        } if v.sole_use(val)? == user => Some((i, n.inputs[0], axes.clone())),
        _ => None,
    }
}

fn layer_norm(v: &View<'_>, ni: usize, g: &mut Graph) -> Option<Rewrite> {
    let n = &v.g.nodes[ni];
    if n.op != Op::Binary(BinaryOp::Div) {
        return None;
    }
    let (d, s) = (n.inputs[0], n.inputs[1]);
    let (sqi, sq) = v.producer(s)?;
    if sq.op != Op::Unary(UnaryOp::Sqrt) || v.sole_use(s)? != ni {
        return None;
    }
    let ve = sq.inputs[0];
    let (aei, ae) = v.producer(ve)?;
    if v.sole_use(ve)? != sqi || ae.op != Op::Binary(BinaryOp::Add) {
        return None;
    }
    let (var, eps) = match ae.inputs[..] {
        [a, b] if v.scalar(b).is_some() => (a, v.scalar(b)?),
        [a, b] if v.scalar(a).is_some() => (b, v.scalar(a)?),
        _ => return None,
    };
    let (rvi, p, axes) = mean_of(v, var, aei)?;
    let (pi, pn) = v.producer(p)?;
    let squares =
        v.with_scalar(pn, BinaryOp::Pow, 2.0) == Some(d) || (pn.op == Op::Binary(BinaryOp::Mul) && pn.inputs == [d, d]);
    if !squares || v.sole_use(p)? != rvi {
        return None;
    }
    let (dni, dn) = v.producer(d)?;
    if dn.op != Op::Binary(BinaryOp::Sub) || v.is_out[d] || v.cons[d].iter().any(|&c| c != pi && c != ni) {
        return None;
    }
    let (x, mu) = (dn.inputs[0], dn.inputs[1]);
    let (mui, mx, axes2) = mean_of(v, mu, dni)?;
    let shape = v.g.values[x].ty.shape.clone();
    let r = shape.len();
    let k = axes.len();
    if mx != x || axes != axes2 || k == 0 || k > r || axes != (r - k..r).collect::<Vec<_>>() {
        return None;
    }
    let axis = r - k;
    let norm = &shape[axis..];
    let per_feature = |c: ValueId| {
        v.g.constant(c).is_some()
            && v.g.values[c].ty.dtype == DType::F32
            && strip_ones(&v.g.values[c].ty.shape) == strip_ones(norm)
    };
    let mut at = ni;
    let mut remove = vec![mui, dni, pi, rvi, aei, sqi, ni];
    let mut scale = None;
    let mut bias = None;
    let cur = n.outputs[0];
    if let Some(mi) = v.sole_use(cur) {
        if let Some(gm) = v.other(&v.g.nodes[mi], BinaryOp::Mul, cur).filter(|&c| per_feature(c)) {
            scale = Some(gm);
            at = mi;
            let cur = v.g.nodes[mi].outputs[0];
            if let Some(bi) = v.sole_use(cur) {
                if let Some(bt) = v.other(&v.g.nodes[bi], BinaryOp::Add, cur).filter(|&c| per_feature(c)) {
                    bias = Some(bt);
                    remove.push(mi);
                    at = bi;
                }
            }
        }
    }
    if !v.same_type(x, v.g.nodes[at].outputs[0]) {
        return None;
    }
    // Constants are reshaped to the normalised dims by sharing their bytes.
    let feature = |c: ValueId, g: &mut Graph| -> Option<ValueId> {
        let w = v.g.constant(c)?.clone();
        let id = g.fresh_value(&v.g.values[c].name, crate::ir::TensorType::f32(norm));
        g.add_constant_weight(id, w).ok()?;
        Some(id)
    };
    let scale = match scale {
        Some(c) => feature(c, g)?,
        None => {
            let id = g.fresh_value("layernorm_ones", crate::ir::TensorType::f32(norm));
            g.add_constant(id, vec![1.0; norm.iter().product()]).ok()?;
            id
        }
    };
    let mut inputs = vec![x, scale];
    if let Some(b) = bias {
        inputs.push(feature(b, g)?);
    }
    remove.retain(|&k| k != at);
    Some(Rewrite {
        at,
        node: replaced(
            &v.g.nodes[at],
            Op::LayerNorm {
                axis,
                epsilon: eps as f32,
                decomposed: true,
            },
            inputs,
        ),
        remove,
        before: Vec::new(),
    })
}

fn softmax(v: &View<'_>, yi: usize, _: &mut Graph) -> Option<Rewrite> {
    let y = &v.g.nodes[yi];
    if y.op != Op::Binary(BinaryOp::Div) {
        return None;
    }
    let (e, s) = (y.inputs[0], y.inputs[1]);
    let (si, sn) = v.producer(s)?;
    let axis = match &sn.op {
        Op::Reduce {
            kind: ReduceKind::Sum,
            axes,
            keepdims: true,
        } if axes.len() == 1 && sn.inputs[0] == e => axes[0],
        _ => return None,
    };
    let (ei, en) = v.producer(e)?;
    if v.sole_use(s)? != yi
        || en.op != Op::Unary(UnaryOp::Exp)
        || v.is_out[e]
        || v.cons[e].iter().any(|&c| c != si && c != yi)
    {
        return None;
    }
    let z = en.inputs[0];
    let mut remove = vec![si, ei];
    let mut x = z;
    let mut unshifted = true;
    if let Some((zi, zn)) = v.producer(z) {
        if zn.op == Op::Binary(BinaryOp::Sub) && v.sole_use(z) == Some(ei) {
            let (a, mx) = (zn.inputs[0], zn.inputs[1]);
            if let Some((mi, mn)) = v.producer(mx) {
                let is_max = matches!(&mn.op, Op::Reduce { kind: ReduceKind::Max, axes, keepdims: true } if *axes == [axis])
                    && mn.inputs[0] == a
                    && v.sole_use(mx) == Some(zi);
                if is_max {
                    x = a;
                    unshifted = false;
                    remove.extend([zi, mi]);
                }
            }
        }
    }
    finish(v, x, yi, Op::Softmax { axis, unshifted }, remove)
}

/// `x · f(x)` with `f` Sigmoid (→ SiLU) or HardSigmoid(1/6, 1/2) (→
/// HardSwish, the same arithmetic as the ONNX op): node `fi` is `f`, its
/// output read only by the Mul.
fn self_gated(v: &View<'_>, fi: usize, _: &mut Graph) -> Option<Rewrite> {
    let f = &v.g.nodes[fi];
    let op = match f.op {
        Op::Unary(UnaryOp::Sigmoid) => UnaryOp::Silu,
        // Compared exactly: another alpha or beta is not HardSwish.
        Op::Unary(UnaryOp::HardSigmoid(alpha, beta)) if alpha == 1.0 / 6.0 && beta == 0.5 => UnaryOp::HardSwish,
        _ => return None,
    };
    let (x, s) = (f.inputs[0], f.outputs[0]);
    let mi = v.sole_use(s)?;
    if v.other(&v.g.nodes[mi], BinaryOp::Mul, s)? != x {
        return None;
    }
    finish(v, x, mi, Op::Unary(op), vec![fi])
}

/// `x · Clip(x + 3, 0, 6) / 6` (or `· (1/6)`) → HardSwish: node `ci` is the
/// Clip. The same value as the op's `x · max(0, min(1, x/6 + 1/2))` up to
/// rounding.
fn hard_swish_clip(v: &View<'_>, ci: usize, _: &mut Graph) -> Option<Rewrite> {
    let c = &v.g.nodes[ci];
    if c.op != Op::Unary(UnaryOp::Clip(0.0, 6.0)) {
        return None;
    }
    let (p, q) = (c.inputs[0], c.outputs[0]);
    let (ai, an) = v.producer(p)?;
    let x = v.with_scalar(an, BinaryOp::Add, 3.0)?;
    let mi = v.sole_use(q)?;
    if v.sole_use(p)? != ci || v.other(&v.g.nodes[mi], BinaryOp::Mul, q)? != x {
        return None;
    }
    let r = v.g.nodes[mi].outputs[0];
    let di = v.sole_use(r)?;
    let d = &v.g.nodes[di];
    v.with_scalar(d, BinaryOp::Div, 6.0)
        .or_else(|| v.with_scalar(d, BinaryOp::Mul, 1.0 / 6.0))
        .filter(|&y| y == r)?;
    finish(v, x, di, Op::Unary(UnaryOp::HardSwish), vec![ai, ci, mi])
}
