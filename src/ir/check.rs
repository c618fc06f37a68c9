//! Type rules of every IR op: what inputs it accepts and what outputs it
//! produces. `Graph::validate` checks each node with [`check`]; `import`
//! and the passes compute output types with [`infer`].

use super::{
    broadcast_shapes, Access, BiasKind, ChainOp, DType, EmbedAttrs, EmbedTerm, MatMulAttrs, Op, Operand,
    ScatterReduction, ShapeDisplay, TensorType,
};

type Why = String;

/// Why kiln moves and casts float16 but computes nothing on it.
pub(crate) const F16_ARITHMETIC: &str = "kiln leaves float16 arithmetic to ORT (ORT's CPU EP computes \
     float16 ops in float over the groups of nodes it casts together, so kiln's result node by node \
     would differ); kiln claims float16 Casts and data movement only";

fn shape(s: &[usize]) -> ShapeDisplay<'_> {
    ShapeDisplay(s)
}

/// The dims of a matrix product: broadcast batch dims, `m`, `k`, `n`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MatMulDims {
    pub batch: Vec<usize>,
    pub m: usize,
    pub k: usize,
    pub n: usize,
}

pub fn matmul_dims(a: &[usize], b: &[usize], attrs: &MatMulAttrs) -> Result<MatMulDims, Why> {
    if a.len() < 2 || b.len() < 2 {
        return Err(format!(
            "matrix product needs rank >= 2 operands, got {} and {}",
            shape(a),
            shape(b)
        ));
    }
    let (ra, rb) = (a.len(), b.len());
    let (m, ka) = if attrs.trans_a {
        (a[ra - 1], a[ra - 2])
    } else {
        (a[ra - 2], a[ra - 1])
    };
    let (kb, n) = if attrs.trans_b {
        (b[rb - 1], b[rb - 2])
    } else {
        (b[rb - 2], b[rb - 1])
    };
    if ka != kb {
        return Err(format!(
            "matrix product of {} and {}: inner dims {ka} and {kb} differ",
            shape(a),
            shape(b)
        ));
    }
    let batch = broadcast_shapes(&a[..ra - 2], &b[..rb - 2])
        .ok_or_else(|| format!("batch dims of {} and {} do not broadcast", shape(a), shape(b)))?;
    Ok(MatMulDims { batch, m, k: ka, n })
}

fn expect_dtype(what: &str, t: &TensorType, allowed: &[DType]) -> Result<(), Why> {
    if allowed.contains(&t.dtype) {
        return Ok(());
    }
    if t.dtype == DType::F16 {
        return Err(format!("{what} is float16: {F16_ARITHMETIC}"));
    }
    let names: Vec<&str> = allowed.iter().map(|d| d.name()).collect();
    Err(format!("{what} is {}, expected {}", t.dtype, names.join(" or ")))
}

fn arity(op: &Op, ins: usize, outs: usize) -> Result<(), Why> {
    let (want_in, want_out): (&[usize], usize) = match op {
        Op::Unary(_) | Op::Softmax { .. } | Op::Reduce { .. } | Op::Transpose { .. } | Op::Reshape => (&[1], 1),
        Op::Slice { .. } | Op::Cast { .. } | Op::Expand | Op::Shape { .. } => (&[1], 1),
        Op::Binary(_) | Op::Gather { .. } => (&[2], 1),
        Op::Where | Op::ScatterNd { .. } => (&[3], 1),
        Op::CumSum { .. } => (&[1], 1),
        Op::Pool { .. } | Op::Resize(_) => (&[1], 1),
        Op::GatherElements { .. } | Op::GatherNd { .. } | Op::OneHot { .. } => (&[2], 1),
        Op::LayerNorm { .. } => (&[2, 3], 1),
        Op::MatMul(m) => return exact(op, ins, m.num_inputs(), outs, 1),
        Op::Rnn(r) => return exact(op, ins, 3 + r.has.count(), outs, 1),
        Op::Conv(c) => return exact(op, ins, c.num_inputs(), outs, 1),
        // Normalisation and selection ops (issue #13).
        Op::GroupNorm { .. } => (&[3], 1),
        Op::Lrn(_) | Op::ArgReduce { .. } | Op::TopK { .. } => (&[1], 1),
        Op::ConvTranspose(c) => return exact(op, ins, 2 + usize::from(c.bias), outs, 1),
        Op::Attention(a) => return exact(op, ins, a.qkv_inputs() + usize::from(a.mask), outs, 1),
        Op::EmbedLayerNorm(e) => return exact(op, ins, e.num_inputs(), outs, 1),
        Op::Chain(_) => {
            if ins == 0 {
                return Err("Chain needs at least one input".into());
            }
            (&[ins], 1)
        }
        Op::Concat { .. } => {
            if ins == 0 {
                return Err("Concat needs at least one input".into());
            }
            (&[ins], 1)
        }
    };
    if !want_in.contains(&ins) {
        return Err(format!("{op} takes {:?} input(s), got {ins}", want_in));
    }
    exact(op, ins, ins, outs, want_out)
}

fn exact(op: &Op, ins: usize, want_in: usize, outs: usize, want_out: usize) -> Result<(), Why> {
    if ins != want_in {
        return Err(format!("{op} takes {want_in} input(s), got {ins}"));
    }
    if outs != want_out {
        return Err(format!("{op} has {want_out} output(s), got {outs}"));
    }
    Ok(())
}

/// Output types of `op` for these inputs. Ops whose output shape is not a
/// function of the input types (Reshape, Expand, Slice) take it from `given`.
pub fn infer(op: &Op, ins: &[&TensorType], given: Option<&[usize]>) -> Result<Vec<TensorType>, Why> {
    let x = ins.first().copied();
    let x = || x.ok_or_else(|| format!("{op} has no input"));
    let out = match op {
        Op::Unary(u) => {
            expect_dtype(&format!("the input of {}", u.onnx_name()), x()?, &[u.src_dtype()])?;
            TensorType::new(u.dst_dtype(), &x()?.shape)
        }
        Op::Binary(b) => {
            let (a, c) = (ins[0], ins[1]);
            let allowed: Vec<DType> = DType::ALL.into_iter().filter(|&d| b.accepts(d)).collect();
            expect_dtype(&format!("input 0 of {}", b.onnx_name()), a, &allowed)?;
            if a.dtype != c.dtype {
                return Err(format!("inputs are {} and {}", a.dtype, c.dtype));
            }
            let s = broadcast_shapes(&a.shape, &c.shape).ok_or_else(|| {
                format!(
                    "input shapes {} and {} do not broadcast",
                    shape(&a.shape),
                    shape(&c.shape)
                )
            })?;
            TensorType::new(b.dst_dtype(a.dtype), &s)
        }
        Op::MatMul(m) => {
            for (i, t) in ins.iter().enumerate() {
                expect_dtype(&format!("input {i}"), t, &[DType::F32])?;
            }
            let d = matmul_dims(&ins[0].shape, &ins[1].shape, m)?;
            let n = matmul_parts_n(ins, m, d.n)?;
            let mut s = d.batch.clone();
            s.extend([d.m, n]);
            let mut next = 1 + m.b_parts;
            match m.bias {
                BiasKind::None => {}
                BiasKind::Row => {
                    if ins[next].numel() != n {
                        return Err(format!("bias {} is not a row of {n}", shape(&ins[next].shape)));
                    }
                    next += 1;
                }
                BiasKind::Full { .. } => {
                    if ins[next].shape != s {
                        return Err(format!(
                            "C {} is not of the output's shape {}",
                            shape(&ins[next].shape),
                            shape(&s)
                        ));
                    }
                    next += 1;
                }
            }
            if m.residual && ins[next].shape != s {
                return Err(format!(
                    "residual {} is not of the output's shape {}",
                    shape(&ins[next].shape),
                    shape(&s)
                ));
            }
            TensorType::f32(&s)
        }
        Op::Softmax { axis, .. } => {
            expect_dtype("the input", x()?, &[DType::F32])?;
            if *axis >= x()?.shape.len() {
                return Err(format!("axis {axis} is out of range for {}", shape(&x()?.shape)));
            }
            x()?.clone()
        }
        Op::LayerNorm { axis, .. } => {
            let t = x()?;
            for (i, t) in ins.iter().enumerate() {
                expect_dtype(&format!("input {i}"), t, &[DType::F32])?;
            }
            if *axis >= t.shape.len() {
                return Err(format!("axis {axis} is out of range for {}", shape(&t.shape)));
            }
            let norm: usize = t.shape[*axis..].iter().product();
            for s in &ins[1..] {
                if s.numel() != norm {
                    return Err(format!(
                        "scale/bias {} do not match the normalised dims {}",
                        shape(&s.shape),
                        shape(&t.shape[*axis..])
                    ));
                }
            }
            t.clone()
        }
        Op::Reduce { axes, keepdims, .. } => {
            let t = x()?;
            expect_dtype("the input", t, &[DType::F32])?;
            if axes.windows(2).any(|w| w[0] >= w[1]) || axes.last().is_some_and(|&a| a >= t.shape.len()) {
                return Err(format!(
                    "axes {axes:?} are not sorted, unique and below rank {}",
                    t.shape.len()
                ));
            }
            let s: Vec<usize> = (0..t.shape.len())
                .filter_map(|d| match (axes.contains(&d), keepdims) {
                    (false, _) => Some(t.shape[d]),
                    (true, true) => Some(1),
                    (true, false) => None,
                })
                .collect();
            TensorType::f32(&s)
        }
        Op::Transpose { perm } => {
            let t = x()?;
            let mut seen = vec![false; t.shape.len()];
            if perm.len() != t.shape.len()
                || perm
                    .iter()
                    .any(|&p| p >= seen.len() || std::mem::replace(&mut seen[p], true))
            {
                return Err(format!("perm {perm:?} is not a permutation of rank {}", t.shape.len()));
            }
            let s: Vec<usize> = perm.iter().map(|&p| t.shape[p]).collect();
            TensorType::new(t.dtype, &s)
        }
        Op::Reshape => {
            let t = x()?;
            let s = given.ok_or("Reshape needs its output shape")?;
            let n: Option<usize> = s.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
            if n != Some(t.numel()) {
                return Err(format!("cannot reshape {} into {}", shape(&t.shape), shape(s)));
            }
            TensorType::new(t.dtype, s)
        }
        Op::Expand => {
            let t = x()?;
            let s = given.ok_or("Expand needs its output shape")?;
            if broadcast_shapes(&t.shape, s).as_deref() != Some(s) {
                return Err(format!("cannot expand {} to {}", shape(&t.shape), shape(s)));
            }
            TensorType::new(t.dtype, s)
        }
        Op::Concat { axis } => {
            let t = x()?;
            let rank = t.shape.len();
            if *axis >= rank {
                return Err(format!("axis {axis} is out of range for {}", shape(&t.shape)));
            }
            let mut s = t.shape.clone();
            s[*axis] = 0;
            for (i, u) in ins.iter().enumerate() {
                let same = u.dtype == t.dtype
                    && u.shape.len() == rank
                    && (0..rank).all(|d| d == *axis || u.shape[d] == t.shape[d]);
                if !same {
                    return Err(format!("input {i} {u} does not concatenate with {t} on axis {axis}"));
                }
                s[*axis] += u.shape[*axis];
            }
            TensorType::new(t.dtype, &s)
        }
        Op::Slice { starts, steps } => {
            let t = x()?;
            let s = given.ok_or("Slice needs its output shape")?;
            let rank = t.shape.len();
            if starts.len() != rank || steps.len() != rank || s.len() != rank {
                return Err(format!("slice of rank {} has {} starts", rank, starts.len()));
            }
            for d in 0..rank {
                if s[d] == 0 {
                    continue;
                }
                let last = starts[d] as i128 + (s[d] as i128 - 1) * steps[d] as i128;
                if steps[d] == 0 || starts[d] >= t.shape[d] || last < 0 || last >= t.shape[d] as i128 {
                    return Err(format!("slice of axis {d} leaves the input {}", shape(&t.shape)));
                }
            }
            TensorType::new(t.dtype, s)
        }
        Op::Gather { axis } => {
            let (t, idx) = (ins[0], ins[1]);
            expect_dtype("the indices", idx, &[DType::I64, DType::I32])?;
            if *axis >= t.shape.len() {
                return Err(format!("axis {axis} is out of range for {}", shape(&t.shape)));
            }
            let mut s = t.shape[..*axis].to_vec();
            s.extend(&idx.shape);
            s.extend(&t.shape[axis + 1..]);
            TensorType::new(t.dtype, &s)
        }
        Op::Cast { to } => TensorType::new(*to, &x()?.shape),
        Op::Where => {
            let (c, a, b) = (ins[0], ins[1], ins[2]);
            expect_dtype("the condition", c, &[DType::Bool])?;
            if a.dtype != b.dtype {
                return Err(format!("x is {} but y is {}", a.dtype, b.dtype));
            }
            let s = broadcast_shapes(&c.shape, &a.shape)
                .and_then(|s| broadcast_shapes(&s, &b.shape))
                .ok_or_else(|| "condition, x and y do not broadcast".to_string())?;
            TensorType::new(a.dtype, &s)
        }
        Op::Shape { start, end } => {
            let t = x()?;
            if start > end || *end > t.shape.len() {
                return Err(format!(
                    "Shape range {start}..{end} is out of range for rank {}",
                    t.shape.len()
                ));
            }
            TensorType::new(DType::I64, &[end - start])
        }
        Op::GatherElements { .. }
        | Op::GatherNd { .. }
        | Op::ScatterNd { .. }
        | Op::CumSum { .. }
        | Op::OneHot { .. } => infer_index(op, ins, given)?,
        Op::Rnn(r) => infer_rnn(r, ins)?,
        Op::Conv(c) => infer_conv(c, ins)?,
        Op::Pool { .. } | Op::Resize(_) => infer_spatial(op, x()?)?,
        Op::GroupNorm { .. } | Op::Lrn(_) | Op::ArgReduce { .. } | Op::TopK { .. } => infer_norm(op, ins)?,
        Op::ConvTranspose(c) => infer_conv_transpose(c, ins)?,
        Op::Attention(a) => infer_attention(a, ins)?,
        Op::EmbedLayerNorm(e) => infer_embed(e, ins)?,
        Op::Chain(ops) => infer_chain(ops, ins)?,
    };
    Ok(vec![out])
}

/// The last op's shape, after each op's broadcast; every result must have
/// it and every input must reach it as [`crate::kernels::chain::check`] allows.
fn infer_chain(ops: &[ChainOp], ins: &[&TensorType]) -> Result<TensorType, Why> {
    for (k, t) in ins.iter().enumerate() {
        expect_dtype(&format!("chain input {k}"), t, &[DType::F32])?;
    }
    let mut shapes: Vec<Vec<usize>> = Vec::with_capacity(ops.len());
    for (i, op) in ops.iter().enumerate() {
        let mut s: Option<Vec<usize>> = None;
        for o in op.operands() {
            let os = match o {
                Operand::Input(k) => ins.get(k).map(|t| t.shape.clone()),
                Operand::Result(r) => shapes.get(r).cloned(),
            }
            .ok_or_else(|| format!("chain op {i} reads a value it cannot see"))?;
            s = Some(match s {
                None => os,
                Some(prev) => {
                    broadcast_shapes(&prev, &os).ok_or_else(|| format!("chain op {i}: shapes do not broadcast"))?
                }
            });
        }
        shapes.push(s.unwrap_or_default());
    }
    let out = shapes.last().ok_or_else(|| "Chain needs an op".to_string())?.clone();
    if shapes.iter().any(|s| *s != out) {
        return Err(format!("a chain's results are not all of shape {}", shape(&out)));
    }
    let mut inputs = Vec::with_capacity(ins.len());
    for (k, t) in ins.iter().enumerate() {
        let access = Access::for_shapes(&out, &t.shape).ok_or_else(|| {
            format!(
                "chain input {k} {} does not line up with {}",
                shape(&t.shape),
                shape(&out)
            )
        })?;
        inputs.push((access, t.numel()));
    }
    let numel = out.iter().product();
    crate::kernels::chain::check(ops, &inputs, numel)?;
    Ok(TensorType::new(DType::F32, &out))
}

/// The broadcast of the terms' shapes (a gathered term's: its indices' shape
/// and the table's width), each of whose last dim is the scale's length.
fn infer_embed(e: &EmbedAttrs, ins: &[&TensorType]) -> Result<TensorType, Why> {
    if e.terms.is_empty() {
        return Err("EmbedLayerNorm needs a term".into());
    }
    let (norm, mut rest) = ins.split_at(e.norm_inputs());
    for (i, t) in norm.iter().enumerate() {
        expect_dtype(if i == 0 { "the scale" } else { "the bias" }, t, &[DType::F32])?;
    }
    let width = norm[0].numel();
    if norm.iter().any(|t| t.shape.len() != 1 || t.numel() != width) {
        return Err(format!(
            "scale/bias {} are not one row of one length",
            shape(&norm[0].shape)
        ));
    }
    let mut out: Option<Vec<usize>> = None;
    for (k, term) in e.terms.iter().enumerate() {
        let (now, later) = rest.split_at(term.inputs());
        rest = later;
        let s = match term {
            EmbedTerm::Gathered => {
                let (table, idx) = (now[0], now[1]);
                expect_dtype(&format!("term {k}'s table"), table, &[DType::F32])?;
                expect_dtype(&format!("term {k}'s indices"), idx, &[DType::I64, DType::I32])?;
                if table.shape.len() != 2 {
                    return Err(format!("term {k}'s table {} is not 2-D", shape(&table.shape)));
                }
                let mut s = idx.shape.clone();
                s.push(table.shape[1]);
                s
            }
            EmbedTerm::Added => {
                expect_dtype(&format!("term {k}"), now[0], &[DType::F32])?;
                now[0].shape.clone()
            }
        };
        if s.last() != Some(&width) {
            return Err(format!(
                "term {k} {} does not end in the scale's length {width}",
                shape(&s)
            ));
        }
        out = match out {
            None => Some(s),
            Some(o) => Some(
                broadcast_shapes(&o, &s)
                    .ok_or_else(|| format!("term {k} {} does not broadcast to {}", shape(&s), shape(&o)))?,
            ),
        };
    }
    Ok(TensorType::f32(&out.unwrap_or_default()))
}

/// N of a product whose B is `m.b_parts` constants side by side (`n` for
/// one): every part 2-D, of the first part's K.
fn matmul_parts_n(ins: &[&TensorType], m: &MatMulAttrs, n: usize) -> Result<usize, Why> {
    if m.b_parts == 1 {
        return Ok(n);
    }
    let parts = &ins[1..1 + m.b_parts];
    let dims: Vec<(usize, usize)> = parts
        .iter()
        .filter(|t| t.shape.len() == 2)
        .map(|t| {
            if m.trans_b {
                (t.shape[1], t.shape[0])
            } else {
                (t.shape[0], t.shape[1])
            }
        })
        .collect();
    if dims.len() != parts.len() || dims.iter().any(|d| d.0 != dims[0].0) {
        let shapes: Vec<String> = parts.iter().map(|t| shape(&t.shape).to_string()).collect();
        return Err(format!("B's parts {} are not 2-D with one K", shapes.join(", ")));
    }
    Ok(dims.iter().map(|d| d.1).sum())
}

/// Output type of a fused attention (see `Op::Attention`).
fn infer_attention(a: &crate::ir::AttentionAttrs, ins: &[&TensorType]) -> Result<TensorType, Why> {
    if a.packed_qkv {
        return infer_packed_attention(a, ins);
    }
    let (q, k, v) = (ins[0], ins[1], ins[2]);
    for (what, t) in [("Q", q), ("K", k), ("V", v)] {
        expect_dtype(&format!("attention's {what}"), t, &[DType::F32])?;
        if t.shape.len() != 3 {
            return Err(format!(
                "attention's {what} is {}, expected [batch, seq, heads·dim]",
                shape(&t.shape)
            ));
        }
    }
    let (qs, ks) = (&q.shape, &k.shape);
    if ks != &v.shape || qs[0] != ks[0] || qs[2] != ks[2] || a.heads == 0 || qs[2] % a.heads != 0 {
        return Err(format!(
            "attention of Q {}, K {}, V {} with {} heads",
            shape(qs),
            shape(ks),
            shape(&v.shape),
            a.heads
        ));
    }
    if a.mask {
        check_attention_mask(ins[3], [qs[0], a.heads, qs[1], ks[1]])?;
    }
    Ok(TensorType::f32(qs))
}

/// [`infer_attention`] for Q, K and V packed in one `[B, S, 3·H·D]` value.
fn infer_packed_attention(a: &crate::ir::AttentionAttrs, ins: &[&TensorType]) -> Result<TensorType, Why> {
    let x = ins[0];
    expect_dtype("attention's packed Q, K and V", x, &[DType::F32])?;
    let s = &x.shape;
    let width = s.get(2).map_or(0, |w| w / 3);
    if s.len() != 3 || !s[2].is_multiple_of(3) || a.heads == 0 || !width.is_multiple_of(a.heads) {
        return Err(format!(
            "attention of packed Q, K and V {} with {} heads",
            shape(s),
            a.heads
        ));
    }
    if a.mask {
        check_attention_mask(ins[1], [s[0], a.heads, s[1], s[1]])?;
    }
    Ok(TensorType::f32(&[s[0], s[1], width]))
}

/// An attention mask: f32, broadcasting to `full` (`[B, H, Sq, Sk]`) with
/// `Sk` its last dim.
fn check_attention_mask(m: &TensorType, full: [usize; 4]) -> Result<(), Why> {
    expect_dtype("attention's mask", m, &[DType::F32])?;
    let fits = m.shape.len() <= 4
        && m.shape.last() == Some(&full[3])
        && broadcast_shapes(&m.shape, &full).as_deref() == Some(&full[..]);
    if !fits {
        return Err(format!(
            "attention's mask {} does not broadcast to {}",
            shape(&m.shape),
            shape(&full)
        ));
    }
    Ok(())
}

/// Output type of the normalisation and selection ops (issue #13).
fn infer_norm(op: &Op, ins: &[&TensorType]) -> Result<TensorType, Why> {
    let t = ins[0];
    let channels_last = |t: &TensorType| -> Result<usize, Why> {
        expect_dtype("the input", t, &[DType::F32])?;
        match t.shape[..] {
            [_, _, _, c] => Ok(c),
            _ => Err(format!("input {} is not channels-last [N, H, W, C]", shape(&t.shape))),
        }
    };
    let along = |axis: usize| -> Result<usize, Why> {
        expect_dtype("the input", t, &[DType::F32, DType::I64])?;
        t.shape
            .get(axis)
            .copied()
            .ok_or_else(|| format!("axis {axis} is out of range for {}", shape(&t.shape)))
    };
    match op {
        Op::GroupNorm { groups, .. } => {
            let c = channels_last(t)?;
            if *groups == 0 || !c.is_multiple_of(*groups) {
                return Err(format!("{c} channels do not split into {groups} groups"));
            }
            for (i, p) in ins[1..].iter().enumerate() {
                expect_dtype(&format!("input {}", i + 1), p, &[DType::F32])?;
                if p.shape != [c] {
                    return Err(format!("scale/bias {} is not [{c}]", shape(&p.shape)));
                }
            }
            Ok(t.clone())
        }
        Op::Lrn(p) => {
            channels_last(t)?;
            if p.size == 0 {
                return Err("LRN size must be at least 1".into());
            }
            Ok(t.clone())
        }
        Op::ArgReduce { axis, keepdims, .. } => {
            if along(*axis)? == 0 {
                return Err(format!("{op} over an empty axis {axis}"));
            }
            let mut s = t.shape.clone();
            if *keepdims {
                s[*axis] = 1;
            } else {
                s.remove(*axis);
            }
            Ok(TensorType::new(DType::I64, &s))
        }
        Op::TopK { axis, rule } => {
            let len = along(*axis)?;
            if rule.k > len {
                return Err(format!("k = {} is larger than the axis' {len} values", rule.k));
            }
            let mut s = t.shape.clone();
            s[*axis] = rule.k;
            Ok(TensorType::new(DType::I64, &s))
        }
        _ => Err(format!("{op} is not a normalisation or selection op")),
    }
}

/// Output type of the indexing ops (issue #12).
fn infer_index(op: &Op, ins: &[&TensorType], given: Option<&[usize]>) -> Result<TensorType, Why> {
    const NUMBERS: &[DType] = &[DType::F32, DType::I64, DType::I32];
    match op {
        Op::GatherElements { axis } => {
            let (t, idx) = (ins[0], ins[1]);
            expect_dtype("the indices", idx, &[DType::I64, DType::I32])?;
            let rank = t.shape.len();
            let fits =
                idx.shape.len() == rank && *axis < rank && (0..rank).all(|a| a == *axis || idx.shape[a] <= t.shape[a]);
            if !fits {
                return Err(format!(
                    "indices {} do not fit data {} on axis {axis}",
                    shape(&idx.shape),
                    shape(&t.shape)
                ));
            }
            Ok(TensorType::new(t.dtype, &idx.shape))
        }
        Op::GatherNd { batch_dims: b } => {
            let (t, idx) = (ins[0], ins[1]);
            expect_dtype("the indices", idx, &[DType::I64, DType::I32])?;
            let (r, q) = (t.shape.len(), idx.shape.len());
            let k = idx.shape.last().copied().unwrap_or(0);
            if q == 0 || k == 0 || *b >= q.min(r) || b + k > r || t.shape[..*b] != idx.shape[..*b] {
                return Err(format!(
                    "indices {} do not index data {} with batch_dims {b}",
                    shape(&idx.shape),
                    shape(&t.shape)
                ));
            }
            let mut s = idx.shape[..q - 1].to_vec();
            s.extend(&t.shape[b + k..]);
            Ok(TensorType::new(t.dtype, &s))
        }
        Op::ScatterNd { reduction } => {
            let (t, idx, u) = (ins[0], ins[1], ins[2]);
            expect_dtype("the indices", idx, &[DType::I64, DType::I32])?;
            if *reduction != ScatterReduction::None {
                expect_dtype("the data", t, NUMBERS)?;
            }
            let q = idx.shape.len();
            let k = idx.shape.last().copied().unwrap_or(0);
            let mut want = idx.shape[..q.saturating_sub(1)].to_vec();
            want.extend(t.shape.get(k..).unwrap_or(&[]));
            if q == 0 || k == 0 || k > t.shape.len() || u.shape != want || u.dtype != t.dtype {
                return Err(format!(
                    "indices {} and updates {u} do not scatter into {t}",
                    shape(&idx.shape)
                ));
            }
            Ok(t.clone())
        }
        Op::CumSum { axis, .. } => {
            let t = ins[0];
            expect_dtype("the input", t, NUMBERS)?;
            if *axis >= t.shape.len() {
                return Err(format!("axis {axis} is out of range for {}", shape(&t.shape)));
            }
            Ok(t.clone())
        }
        Op::OneHot { axis } => {
            let (idx, v) = (ins[0], ins[1]);
            expect_dtype("the indices", idx, &[DType::I64, DType::I32])?;
            if v.numel() != 2 || v.shape.len() != 1 {
                return Err(format!("values {} are not [off, on]", shape(&v.shape)));
            }
            let s = given.ok_or("OneHot needs its output shape")?;
            let fits = s.len() == idx.shape.len() + 1
                && *axis < s.len()
                && s[..*axis] == idx.shape[..*axis]
                && s[axis + 1..] == idx.shape[*axis..];
            if !fits {
                return Err(format!(
                    "output {} is not indices {} with a depth at axis {axis}",
                    shape(s),
                    shape(&idx.shape)
                ));
            }
            Ok(TensorType::new(v.dtype, s))
        }
        _ => Err(format!("{op} is not an indexing op")),
    }
}

/// Output type of the pools and resize (issue #13): channels-last
/// `[N, H, W, C]` in, the window's or resize's H and W out.
fn infer_spatial(op: &Op, x: &TensorType) -> Result<TensorType, Why> {
    expect_dtype("the input", x, &[DType::F32])?;
    let [n, h, w, c] = x.shape[..] else {
        return Err(format!("input {} is not channels-last [N, H, W, C]", shape(&x.shape)));
    };
    let (out_h, out_w, dtype) = match op {
        Op::Pool { kind, window } => {
            let fits = window.h.input == h && window.w.input == w && window.h.kernel > 0 && window.w.kernel > 0;
            if !fits {
                return Err(format!("window {window:?} does not fit input {}", shape(&x.shape)));
            }
            let dtype = match kind {
                super::PoolKind::MaxIndex { .. } => DType::I64,
                _ => DType::F32,
            };
            (window.h.output, window.w.output, dtype)
        }
        Op::Resize(r) => {
            if r.h.input != h || r.w.input != w || !r.is_valid() {
                return Err(format!("resize {r:?} does not fit input {}", shape(&x.shape)));
            }
            (r.h.output, r.w.output, DType::F32)
        }
        _ => return Err(format!("{op} is not a pool or resize")),
    };
    Ok(TensorType::new(dtype, &[n, out_h, out_w, c]))
}

/// A recurrent layer's flat output (see [`Op::Rnn`]).
fn infer_rnn(r: &super::RnnAttrs, ins: &[&TensorType]) -> Result<TensorType, Why> {
    use crate::kernels::recurrent::{sizes_fit, RnnDims, RnnLens};
    let spec = &r.spec;
    for (i, t) in ins.iter().enumerate() {
        expect_dtype(
            &format!("input {i}"),
            t,
            &[
                if r.has.seq_lens && i == 3 + usize::from(r.has.bias) + usize::from(r.has.rbh) {
                    DType::I32
                } else {
                    DType::F32
                },
            ],
        )?;
    }
    let [seq, batch, input] = ins[0].shape[..] else {
        return Err(format!("X {} is not 3-D", shape(&ins[0].shape)));
    };
    let dirs = spec.direction.count();
    let gh = spec.cell.gates() * spec.hidden;
    if ins[1].shape != [dirs, gh, input] || ins[2].shape != [dirs, gh, spec.hidden] {
        return Err(format!(
            "W {} and R {} do not fit {dirs} direction(s), hidden size {} and input size {input}",
            shape(&ins[1].shape),
            shape(&ins[2].shape),
            spec.hidden
        ));
    }
    let mut rest = ins[3..].iter().map(|t| t.numel());
    let mut next = |has: bool| if has { rest.next() } else { None };
    let dims = RnnDims { seq, batch, input };
    let lens = RnnLens {
        x: ins[0].numel(),
        bias: next(r.has.bias),
        rbh: next(r.has.rbh),
        seq_lens: next(r.has.seq_lens),
        initial_h: next(r.has.initial_h),
        initial_c: next(r.has.initial_c),
        p: next(r.has.p),
        dst: dims.out_len(spec).ok_or("the layer's output is too large")?,
    };
    if !sizes_fit(spec, &dims, &lens) {
        return Err(format!("inputs {lens:?} do not fit {spec:?} at {dims:?}"));
    }
    Ok(TensorType::f32(&[lens.dst]))
}

/// A convolution's output `[N, Ho, Wo, Co]` (issue #13; see [`super::ConvAttrs`]).
fn infer_conv(c: &super::ConvAttrs, ins: &[&TensorType]) -> Result<TensorType, Why> {
    for (i, t) in ins.iter().enumerate() {
        expect_dtype(&format!("input {i}"), t, &[DType::F32])?;
    }
    let [n, h, w, ci] = ins[0].shape[..] else {
        return Err(format!("Conv input {} is not [N, H, W, C]", shape(&ins[0].shape)));
    };
    let win = &c.window;
    if !crate::kernels::conv::window_ok(win) || (h, w) != (win.h.input, win.w.input) {
        return Err(format!(
            "Conv window {win:?} does not fit the input {}",
            shape(&ins[0].shape)
        ));
    }
    let g = c.groups;
    let [co, cig, kh, kw] = ins[1].shape[..] else {
        return Err(format!("Conv weights {} are not 4-D", shape(&ins[1].shape)));
    };
    if g == 0
        || !ci.is_multiple_of(g)
        || !co.is_multiple_of(g)
        || cig * g != ci
        || (kh, kw) != (win.h.kernel, win.w.kernel)
    {
        return Err(format!(
            "Conv weights {} do not fit {ci} input channels in {g} group(s) and a {}x{} kernel",
            shape(&ins[1].shape),
            win.h.kernel,
            win.w.kernel
        ));
    }
    let out = [n, win.h.output, win.w.output, co];
    if c.bias && ins[2].shape != [co] {
        return Err(format!("Conv bias {} is not [{co}]", shape(&ins[2].shape)));
    }
    if !c.residual && c.after != super::Activation::None {
        return Err("an activation after the residual needs a residual".into());
    }
    if c.residual && ins[ins.len() - 1].shape != out {
        return Err(format!(
            "residual {} is not of the output's shape {}",
            shape(&ins[ins.len() - 1].shape),
            shape(&out)
        ));
    }
    Ok(TensorType::f32(&out))
}

/// A transposed convolution's output (see [`super::ConvTransposeAttrs`]).
fn infer_conv_transpose(c: &super::ConvTransposeAttrs, ins: &[&TensorType]) -> Result<TensorType, Why> {
    for (i, t) in ins.iter().enumerate() {
        expect_dtype(&format!("input {i}"), t, &[DType::F32])?;
    }
    let (h, w) = (&c.window.h, &c.window.w);
    let [n, ih, iw, ci] = ins[0].shape[..] else {
        return Err(format!("x {} is not [N, H, W, C]", shape(&ins[0].shape)));
    };
    let g = c.groups;
    let ws = &ins[1].shape;
    let fits = g > 0
        && ih == h.input
        && iw == w.input
        && ci.is_multiple_of(g)
        && ws.len() >= 3
        && ws[0] == ci
        && (ws[2..] == [h.kernel, w.kernel] || (ws[2..] == [w.kernel] && h.kernel == 1))
        && [h, w].iter().all(|a| a.kernel > 0 && a.stride > 0 && a.dilation > 0);
    if !fits {
        return Err(format!(
            "x {} and weights {} do not fit {g} group(s) and window {:?}",
            shape(&ins[0].shape),
            shape(ws),
            c.window
        ));
    }
    let co = ws[1] * g;
    if c.bias && ins[2].shape != [co] {
        return Err(format!("bias {} is not [{co}]", shape(&ins[2].shape)));
    }
    Ok(TensorType::f32(&[n, h.output, w.output, co]))
}

/// Whether kiln can run `op` on these exact types; `Err` says why not.
pub(crate) fn check(op: &Op, ins: &[&TensorType], outs: &[&TensorType]) -> Result<(), Why> {
    arity(op, ins.len(), outs.len())?;
    let given = outs.first().map(|t| &t.shape[..]);
    let want = infer(op, ins, given)?;
    for (i, (w, o)) in want.iter().zip(outs).enumerate() {
        if w != *o {
            return Err(format!("output {i} is declared {o} but {op} produces {w}"));
        }
    }
    Ok(())
}
