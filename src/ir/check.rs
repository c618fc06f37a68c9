//! Type rules of every IR op: what inputs it accepts and what outputs it
//! produces. `Graph::validate` checks each node with [`check`]; `import`
//! and the passes compute output types with [`infer`].

use super::{broadcast_shapes, BiasKind, DType, MatMulAttrs, Op, ShapeDisplay, TensorType};

type Why = String;

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
    let names: Vec<&str> = allowed.iter().map(|d| d.name()).collect();
    Err(format!("{what} is {}, expected {}", t.dtype, names.join(" or ")))
}

fn arity(op: &Op, ins: usize, outs: usize) -> Result<(), Why> {
    let (want_in, want_out): (&[usize], usize) = match op {
        Op::Unary(_) | Op::Softmax { .. } | Op::Reduce { .. } | Op::Transpose { .. } | Op::Reshape => (&[1], 1),
        Op::Slice { .. } | Op::Cast { .. } | Op::Expand | Op::Shape { .. } => (&[1], 1),
        Op::Binary(_) | Op::Gather { .. } => (&[2], 1),
        Op::Where => (&[3], 1),
        Op::LayerNorm { .. } => (&[2, 3], 1),
        Op::MatMul(m) => return exact(op, ins, m.num_inputs(), outs, 1),
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
            let mut s = d.batch.clone();
            s.extend([d.m, d.n]);
            let mut next = 2;
            match m.bias {
                BiasKind::None => {}
                BiasKind::Row => {
                    if ins[next].numel() != d.n {
                        return Err(format!("bias {} is not a row of {}", shape(&ins[next].shape), d.n));
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
    };
    Ok(vec![out])
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
