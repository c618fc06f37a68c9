//! Static checks of a [`Program`] that may come from an untrusted file.
//!
//! They mirror what `run` relies on: every buffer reference in range and of
//! the element type the step reads it as (size and alignment), no step
//! reading the buffer it writes, kernel parameters consistent with the
//! buffers, and sizes whose byte counts fit in memory. `run` keeps its own
//! checks as a second line; these make a bad file fail at load, with a reason.

use super::{BufRef, DType, MatB, MatBias, Packing, Program, Step, TensorSpec};
use crate::error::{Error, Result};
use crate::tensor::ShapeDisplay;

/// Arena slack allowed past the last scratch buffer, so that a planner may
/// round the arena up to whole cache lines.
const ARENA_SLACK: usize = 64;

pub(super) fn check(p: &Program) -> Result<()> {
    check_specs("input", &p.inputs)?;
    check_specs("output", &p.outputs)?;
    check_constants(p)?;
    bytes_fit("the scratch arena", p.arena_bytes)?;
    let mut written = vec![false; p.outputs.len()];
    let mut scratch_end = 0;
    for (i, step) in p.steps.iter().enumerate() {
        check_step(p, step).map_err(|e| e.context(format_args!("step {i} ({})", step.kind())))?;
        if let BufRef::Output(j) = step.dst() {
            written[j] = true;
        }
        scratch_end = scratch_end.max(max_scratch_end(step));
    }
    if let Some(j) = written.iter().position(|w| !w) {
        crate::bail!(InvalidGraph, "no step writes output {j} '{}'", p.outputs[j].name);
    }
    if p.arena_bytes > scratch_end.saturating_add(ARENA_SLACK) {
        crate::bail!(
            InvalidGraph,
            "arena of {} bytes is larger than its steps use ({scratch_end})",
            p.arena_bytes
        );
    }
    Ok(())
}

fn check_specs(what: &str, specs: &[TensorSpec]) -> Result<()> {
    for (i, spec) in specs.iter().enumerate() {
        if spec.name.is_empty() {
            crate::bail!(InvalidGraph, "{what} {i} has an empty name");
        }
        let dtype = spec.dtype().ok_or_else(|| {
            Error::invalid_graph(format!(
                "{what} {i} '{}' has element type {}, which kiln does not hold",
                spec.name,
                crate::tensor::onnx_type_name(spec.elem_type)
            ))
        })?;
        let numel = spec.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
        let bytes = numel.and_then(|n| n.checked_mul(dtype.size()));
        let bytes = bytes.ok_or_else(|| too_large(&spec.name, &spec.shape))?;
        bytes_fit(&spec.name, bytes)?;
    }
    Ok(())
}

fn check_constants(p: &Program) -> Result<()> {
    for (i, c) in p.constants.iter().enumerate() {
        let numel = c.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
        let ok = match c.packing {
            Packing::None => numel.and_then(|n| n.checked_mul(c.dtype.size())) == Some(c.data.byte_len()),
            // PackedB::from_parts checked the length for the target.
            Packing::GemmB { k, n } => c.dtype == DType::F32 && *c.shape == [k, n] && p.packed[i].is_some(),
        };
        if !ok {
            crate::bail!(
                InvalidGraph,
                "constant {i} ({} {} {:?}) has {} bytes",
                c.dtype,
                ShapeDisplay(&c.shape),
                c.packing,
                c.data.byte_len()
            );
        }
        if !(c.data.as_bytes().as_ptr() as usize).is_multiple_of(c.dtype.size()) {
            crate::bail!(InvalidGraph, "constant {i} is not aligned for {}", c.dtype);
        }
    }
    Ok(())
}

/// Refuses byte counts that could not be allocated.
fn bytes_fit(what: &str, bytes: usize) -> Result<()> {
    if bytes > isize::MAX as usize {
        crate::bail!(InvalidGraph, "{what} of {bytes} bytes is too large");
    }
    Ok(())
}

fn too_large(name: &str, shape: &[usize]) -> Error {
    Error::invalid_graph(format!("'{name}' of shape {} is too large", ShapeDisplay(shape)))
}

/// Elements of `r` read as `dtype` (or bytes when `None`), after checking
/// that `r` exists, holds that type and is aligned for it.
fn buf_elems(p: &Program, r: BufRef, dtype: Option<DType>) -> Result<usize> {
    let (bytes, held) = match r {
        BufRef::Input(i) => p
            .inputs
            .get(i)
            .map(|s| (s.numel() * s.dtype().map_or(1, DType::size), s.dtype())),
        BufRef::Constant(i) => p.constants.get(i).map(|c| (c.data.byte_len(), Some(c.dtype))),
        BufRef::Output(i) => p
            .outputs
            .get(i)
            .map(|s| (s.numel() * s.dtype().map_or(1, DType::size), s.dtype())),
        BufRef::Scratch { offset, len } => offset
            .checked_add(len)
            .is_some_and(|end| end <= p.arena_bytes)
            .then_some((len, None)),
    }
    .ok_or_else(|| {
        Error::invalid_graph(format!(
            "{r:?} is out of range ({} inputs, {} constants, {} outputs, arena of {} bytes)",
            p.inputs.len(),
            p.constants.len(),
            p.outputs.len(),
            p.arena_bytes
        ))
    })?;
    let Some(dtype) = dtype else {
        return Ok(bytes);
    };
    if let Some(held) = held {
        if held != dtype {
            crate::bail!(InvalidGraph, "reads {r:?}, which holds {held}, as {dtype}");
        }
    }
    if let BufRef::Scratch { offset, .. } = r {
        if !offset.is_multiple_of(dtype.size()) {
            crate::bail!(InvalidGraph, "{r:?} is not aligned for {dtype}");
        }
    }
    if !bytes.is_multiple_of(dtype.size()) {
        crate::bail!(InvalidGraph, "{r:?} of {bytes} bytes is not a whole number of {dtype}");
    }
    Ok(bytes / dtype.size())
}

fn check_step(p: &Program, step: &Step) -> Result<()> {
    let dst = step.dst();
    if matches!(dst, BufRef::Input(_) | BufRef::Constant(_)) {
        crate::bail!(InvalidGraph, "writes {dst:?}, which is read-only");
    }
    let d = buf_elems(p, dst, step.dst_dtype())?;
    let mut s = Vec::with_capacity(4);
    for (src, dtype) in step.typed_srcs() {
        s.push(buf_elems(p, src, dtype)?);
        if overlaps(src, dst) {
            crate::bail!(InvalidGraph, "reads {src:?}, which overlaps its destination {dst:?}");
        }
    }
    let mul = |a: usize, b: usize| a.checked_mul(b);
    let consistent = match step {
        Step::Unary { .. } => s[0] == d,
        Step::Binary { op, layout, dtype, .. } => layout.fits(s[0], s[1], d) && op.accepts(*dtype),
        Step::Copy { .. } => s[0] == d,
        Step::Softmax { len, inner, .. } => {
            s[0] == d && mul(*len, *inner).is_some_and(|b| if b == 0 { d == 0 } else { d % b == 0 })
        }
        Step::LayerNorm { len, bias, .. } => {
            s[0] == d
                && s[1] == *len
                && (bias.is_none() || s[2] == *len)
                && (if *len == 0 { d == 0 } else { d % len == 0 })
        }
        Step::Reduce { outer, len, inner, .. } => {
            mul(*outer, *len).and_then(|n| mul(n, *inner)) == Some(s[0]) && mul(*outer, *inner) == Some(d)
        }
        Step::Strided { plan, .. } => plan.fits(s[0], d),
        Step::Gather {
            outer,
            axis_len,
            inner,
            idx_dtype,
            ..
        } => {
            matches!(idx_dtype, DType::I64 | DType::I32)
                && mul(*outer, *axis_len).and_then(|n| mul(n, *inner)) == Some(s[0])
                && mul(*outer, s[1]).and_then(|n| mul(n, *inner)) == Some(d)
        }
        Step::Cast { .. } => s[0] == d,
        Step::Where { layout, .. } => layout.fits(s[0], s[1], s[2], d),
        Step::MatMul(m) => matmul_fits(p, m, &s, d)?,
        Step::Index(x) => x.fits(&s, d),
        Step::Rnn(r) => rnn_fits(p, r, &s, d),
        Step::Conv(c) => conv_fits(p, c, &s, d),
        Step::Pool(x) => x.fits(&s, d),
        Step::Norm(x) => x.fits(&s, d),
        Step::ConvTranspose(c) => conv_transpose_fits(p, c, &s, d),
        Step::Attention(a) => attention_fits(a, &s, d),
        Step::EmbedLayerNorm(e) => embed_fits(e, &s, d),
        Step::Chain(c) => {
            let inputs: Vec<_> = c.inputs.iter().zip(&s).map(|(&(_, a), &n)| (a, n)).collect();
            crate::kernels::chain::check(&c.ops, &inputs, d).is_ok()
        }
    };
    if !consistent {
        crate::bail!(
            InvalidGraph,
            "reads buffers of {s:?} elements into {d}, which its parameters do not allow"
        );
    }
    Ok(())
}

fn matmul_fits(p: &Program, m: &super::MatMulStep, s: &[usize], d: usize) -> Result<bool> {
    let block = m.m.checked_mul(m.n);
    let a_block = m.m.checked_mul(m.k);
    let b_block = m.k.checked_mul(m.n);
    let (Some(block), Some(a_block), Some(b_block)) = (block, a_block, b_block) else {
        return Ok(false);
    };
    let total = block.checked_mul(m.batches.len());
    if total != Some(d) {
        return Ok(false);
    }
    let a_len = s[0];
    let mut next = 1;
    let b_len = match m.b {
        MatB::Buf { .. } => {
            next += 1;
            Some(s[1])
        }
        MatB::PackedParts(cs) => {
            let parts: Option<Vec<&crate::kernels::gemm::PackedB>> =
                cs.iter().map(|&c| p.packed.get(c).and_then(|x| x.as_deref())).collect();
            // As the kernel reads them, of the product's K, summing to its N.
            let fits = parts.is_some_and(|parts| {
                crate::kernels::gemm::parts_fit(&parts)
                    && parts[0].k() == m.k
                    && parts.iter().map(|pb| pb.n()).sum::<usize>() == m.n
            });
            if !fits || m.trans_a {
                crate::bail!(
                    InvalidGraph,
                    "packed B parts {cs:?} do not fit a {}x{}x{} product",
                    m.m,
                    m.k,
                    m.n
                );
            }
            None
        }
        MatB::Packed(c) => {
            let packed = p.packed.get(c).and_then(|x| x.as_ref());
            match packed {
                Some(pb) if pb.k() == m.k && pb.n() == m.n && !m.trans_a => None,
                _ => crate::bail!(
                    InvalidGraph,
                    "packed B {c} does not fit a {}x{}x{} product",
                    m.m,
                    m.k,
                    m.n
                ),
            }
        }
    };
    let in_range = |off: usize, len: usize, total: usize| off.checked_add(len).is_some_and(|e| e <= total);
    for &[ao, bo] in &m.batches {
        let b_ok = match b_len {
            Some(b_len) => in_range(bo, b_block, b_len),
            None => bo == 0,
        };
        if !in_range(ao, a_block, a_len) || !b_ok {
            return Ok(false);
        }
    }
    match m.bias {
        MatBias::None => {}
        MatBias::Row(_) => {
            if s[next] != m.n {
                return Ok(false);
            }
            next += 1;
        }
        MatBias::Full { .. } => {
            if s[next] != d {
                return Ok(false);
            }
            next += 1;
        }
    }
    if m.residual.is_some() && s[next] != d {
        return Ok(false);
    }
    Ok(true)
}

/// Whether a step reading `src` while writing `dst` would alias; mirrors
/// the split `run` makes (an empty range touching the destination counts).
/// A recurrent step: packed weights of the right sizes, buffers that fit.
fn rnn_fits(p: &Program, r: &super::RnnStep, s: &[usize], d: usize) -> bool {
    use crate::kernels::recurrent::{sizes_fit, RnnLens};
    let spec = &r.spec;
    if !spec.is_valid() {
        return false;
    }
    let dirs = spec.direction.count();
    let (h, gh) = (spec.hidden, spec.cell.gates() * spec.hidden);
    let packed = |c: usize, k: usize, n: usize| {
        p.packed
            .get(c)
            .and_then(|x| x.as_ref())
            .is_some_and(|pb| pb.k() == k && pb.n() == n)
    };
    let parts = spec.cell.r_part_rows(h);
    let r_ok = r.r.len() == dirs * parts.len()
        && r.r
            .iter()
            .enumerate()
            .all(|(i, &c)| packed(c, h, parts[i % parts.len()].1));
    if !packed(r.w, r.dims.input, dirs * gh) || !r_ok {
        return false;
    }
    let mut rest = s[1..].iter().copied();
    let mut next = |b: Option<BufRef>| b.and_then(|_| rest.next());
    let lens = RnnLens {
        x: s[0],
        bias: next(r.bias),
        rbh: next(r.rbh),
        seq_lens: next(r.seq_lens),
        initial_h: next(r.initial_h),
        initial_c: next(r.initial_c),
        p: next(r.p),
        dst: d,
    };
    sizes_fit(spec, &r.dims, &lens)
}

/// A convolution step (issue #13): a valid window, channels that split
/// into the groups, packed weights of each group's size, buffers that fit.
fn conv_fits(p: &Program, c: &super::ConvStep, s: &[usize], d: usize) -> bool {
    use super::ConvWeightsRef;
    let (ci, co, g, w) = (c.in_channels, c.out_channels, c.groups, &c.window);
    if !crate::kernels::conv::window_ok(w) || g == 0 || !ci.is_multiple_of(g) || !co.is_multiple_of(g) {
        return false;
    }
    let len = |pixels: usize, ch: usize| c.batch.checked_mul(pixels).and_then(|x| x.checked_mul(ch));
    let k = w.taps().checked_mul(ci / g);
    // `count` packed constants, each `[k, n]`.
    let packed_as = |ids: &[usize], count: usize, k: Option<usize>, n: usize| {
        ids.len() == count
            && ids.iter().all(|&i| {
                p.packed
                    .get(i)
                    .and_then(|x| x.as_ref())
                    .is_some_and(|pb| Some(pb.k()) == k && pb.n() == n)
            })
    };
    let weights_ok = match &c.weights {
        ConvWeightsRef::Packed(ids) => packed_as(ids, g, k, co / g),
        ConvWeightsRef::Depthwise(_) => g == ci && ci == co && s.get(1).copied() == w.taps().checked_mul(ci),
        ConvWeightsRef::Winograd(ids) => {
            crate::kernels::winograd::eligible(w, ci, co, g)
                && crate::kernels::winograd::TILE_SIZES
                    .iter()
                    .any(|&m| packed_as(ids, crate::kernels::winograd::positions(m), Some(ci), co))
        }
    };
    let mut rest = s[1 + usize::from(matches!(c.weights, ConvWeightsRef::Depthwise(_)))..]
        .iter()
        .copied();
    let bias_ok = c.bias.is_none() || rest.next() == Some(co);
    let out = len(w.output_pixels(), co);
    let residual_ok = match c.residual {
        None => true,
        Some(super::ConvResidual::Buf(_)) => rest.next() == out,
        // The destination is the residual: dense, of the output's size.
        Some(super::ConvResidual::InDst) => c.dst_stride == co,
    };
    let after_ok = c.residual.is_some() || c.after == crate::kernels::gemm::Activation::None;
    let dst = c
        .batch
        .checked_mul(w.output_pixels())
        .and_then(|pixels| crate::kernels::conv::strided_len(pixels, c.dst_stride, co));
    let stride_ok = c.dst_stride >= co;
    weights_ok
        && after_ok
        && bias_ok
        && residual_ok
        && stride_ok
        && Some(s[0]) == len(w.input_pixels(), ci)
        && Some(d) == dst
}

/// An embedding layer norm: `s` as `typed_srcs` lists them (scale, bias,
/// then each term's buffers); the kernel's rule for which rows a term's
/// strides reach ([`crate::kernels::embed::reads_fit`]); tables of whole rows.
fn embed_fits(e: &super::EmbedStep, s: &[usize], d: usize) -> bool {
    let w = e.width;
    let rows = e.lead.iter().try_fold(1usize, |acc, &n| acc.checked_mul(n));
    let out_ok = rows.and_then(|r| r.checked_mul(w)) == Some(d);
    let bias = usize::from(e.bias.is_some());
    let norm_ok = s[0] == w && (bias == 0 || s[1] == w);
    // Rows of `len` hold what the strides reach (trivially with empty rows).
    let fits = |strides: &[usize], len: usize| {
        strides.len() == e.lead.len() && (w == 0 || crate::kernels::embed::reads_fit(&e.lead, strides, len))
    };
    let mut at = 1 + bias;
    let mut terms_ok = !e.terms.is_empty();
    for t in &e.terms {
        terms_ok &= match t.src {
            super::EmbedSrc::Gathered { idx_dtype, .. } => {
                at += 2;
                matches!(idx_dtype, DType::I64 | DType::I32)
                    && s[at - 2].is_multiple_of(w.max(1))
                    && fits(&t.strides, s[at - 1])
            }
            super::EmbedSrc::Added(_) => {
                at += 1;
                s[at - 1].is_multiple_of(w.max(1)) && fits(&t.strides, s[at - 1] / w.max(1))
            }
        };
    }
    out_ok && norm_ok && terms_ok
}

/// A fused attention: Q, K, V and the output of their shape's sizes (no
/// product overflows), a mask that holds every element its strides reach.
fn attention_fits(a: &super::AttentionStep, s: &[usize], d: usize) -> bool {
    let sh = &a.shape;
    let elems = |len: usize| {
        sh.heads
            .checked_mul(sh.head_dim)
            .and_then(|w| w.checked_mul(len))
            .and_then(|n| n.checked_mul(sh.batch))
    };
    let (q, kv) = (elems(sh.q_len), elems(sh.kv_len));
    let mask_ok = match a.mask {
        None => true,
        Some(_) => {
            let reach = [sh.batch, sh.heads, sh.q_len]
                .iter()
                .zip(a.mask_strides)
                .try_fold(sh.kv_len, |acc, (&n, st)| {
                    n.saturating_sub(1).checked_mul(st)?.checked_add(acc)
                });
            reach.is_some_and(|r| r <= s[3])
        }
    };
    // Packed: Q, K and V are one buffer, each row the three side by side.
    let inputs_ok = if a.packed_qkv {
        let all = q.and_then(|q| q.checked_mul(3));
        sh.q_len == sh.kv_len && a.q == a.k && a.q == a.v && all == Some(s[0])
    } else {
        q == Some(s[0]) && kv == Some(s[1]) && kv == Some(s[2])
    };
    sh.heads > 0 && sh.head_dim > 0 && q == Some(d) && inputs_ok && mask_ok
}

/// Largest size, stride or padding a transposed convolution's axis may
/// have: small enough that the kernel's index arithmetic cannot overflow.
const AXIS_MAX: usize = 1 << 31;

/// A transposed convolution: a sane window, packed weights of the right
/// sizes per group, buffers that fit.
fn conv_transpose_fits(p: &Program, c: &super::ConvTransposeStep, s: &[usize], d: usize) -> bool {
    let (h, w) = (&c.window.h, &c.window.w);
    let axis_ok = |a: &crate::kernels::spatial::Axis| {
        let fields = [
            a.input,
            a.output,
            a.kernel,
            a.stride,
            a.dilation,
            a.pad_begin,
            a.pad_end,
        ];
        fields.iter().all(|&f| f < AXIS_MAX) && a.kernel > 0 && a.stride > 0 && a.dilation > 0
    };
    let g = c.groups;
    if !axis_ok(h) || !axis_ok(w) || g == 0 || !c.ci.is_multiple_of(g) || !c.co.is_multiple_of(g) || c.w.len() != g {
        return false;
    }
    let cols = (h.kernel * w.kernel).checked_mul(c.co / g);
    let packed_ok = c.w.iter().all(|&i| {
        p.packed
            .get(i)
            .and_then(|x| x.as_ref())
            .is_some_and(|pb| Some(pb.n()) == cols && pb.k() == c.ci / g)
    });
    // The GEMM's output for one image, allocated at run time.
    let work = (h.input * w.input)
        .checked_mul(h.kernel * w.kernel)
        .and_then(|n| n.checked_mul(c.co))
        .and_then(|n| n.checked_mul(4));
    let elems = |a: usize, b: usize, ch: usize| {
        a.checked_mul(b)
            .and_then(|n| n.checked_mul(c.batch))
            .and_then(|n| n.checked_mul(ch))
    };
    packed_ok
        && work.is_some_and(|b| b <= isize::MAX as usize)
        && elems(h.input, w.input, c.ci) == Some(s[0])
        && elems(h.output, w.output, c.co) == Some(d)
        && (c.bias.is_none() || s.get(1) == Some(&c.co))
}

fn overlaps(src: BufRef, dst: BufRef) -> bool {
    match (src, dst) {
        (BufRef::Output(i), BufRef::Output(j)) => i == j,
        (BufRef::Scratch { offset: s, len: sl }, BufRef::Scratch { offset: d, len: dl }) => {
            // Both ends are in the arena (checked first), so these cannot overflow.
            !(s + sl <= d || s >= d + dl)
        }
        _ => false,
    }
}

/// End of the furthest scratch range the step touches (0 if none).
fn max_scratch_end(step: &Step) -> usize {
    let mut refs = step.srcs();
    refs.push(step.dst());
    refs.iter()
        .map(|r| match r {
            BufRef::Scratch { offset, len } => offset.saturating_add(*len),
            _ => 0,
        })
        .max()
        .unwrap_or(0)
}
