//! `Program` <-> metadata messages. Encoding cannot fail; decoding refuses
//! anything malformed (missing fields, unknown enum values, numbers that do
//! not fit) and leaves the semantic checks to `Program::from_parts`.

use super::proto::{self, buf_info, layout_info, step_info};
use crate::error::{Error, Result};
use crate::ir::{DType, Op};
use crate::kernels::{BinaryOp, Layout, Strided, UnaryOp};
use crate::plan::{BufRef, Constant, Program, ProgramParts, Step, TensorSpec};
use crate::target::Target;

// ---- encoding ----

pub(crate) fn graph_info(name: &str, program: &Program, weight_ids: Vec<u32>) -> proto::GraphInfo {
    proto::GraphInfo {
        name: name.to_string(),
        inputs: program.inputs().iter().map(tensor_info).collect(),
        outputs: program.outputs().iter().map(tensor_info).collect(),
        weight_ids,
        program: Some(proto::ProgramInfo {
            arena_len: program.arena_len() as u64,
            steps: program.steps().iter().map(step_info).collect(),
            op_counts: program
                .op_counts()
                .iter()
                .map(|(op, n)| proto::OpCount {
                    op: op.onnx_name().to_string(),
                    count: *n as u64,
                })
                .collect(),
        }),
    }
}

pub(crate) fn dims(shape: &[usize]) -> Vec<u64> {
    shape.iter().map(|&d| d as u64).collect()
}

fn tensor_info(spec: &TensorSpec) -> proto::TensorInfo {
    proto::TensorInfo {
        name: spec.name.clone(),
        dtype: DType::F32.onnx_code(),
        shape: dims(&spec.shape),
    }
}

fn step_info(step: &Step) -> proto::StepInfo {
    let kind = match step {
        Step::Unary { op, src, dst } => step_info::Kind::Unary(proto::UnaryStep {
            op: unary_kind(*op) as i32,
            src: Some(buf(*src)),
            dst: Some(buf(*dst)),
        }),
        Step::Binary { op, layout, a, b, dst } => step_info::Kind::Binary(proto::BinaryStep {
            op: binary_kind(*op) as i32,
            layout: Some(layout_info(layout)),
            a: Some(buf(*a)),
            b: Some(buf(*b)),
            dst: Some(buf(*dst)),
        }),
        Step::Copy { src, dst } => step_info::Kind::Copy(proto::CopyStep {
            src: Some(buf(*src)),
            dst: Some(buf(*dst)),
        }),
    };
    proto::StepInfo { kind: Some(kind) }
}

fn buf(r: BufRef) -> proto::BufInfo {
    let kind = match r {
        BufRef::Input(i) => buf_info::Kind::Input(i as u64),
        BufRef::Constant(i) => buf_info::Kind::Constant(i as u64),
        BufRef::Output(i) => buf_info::Kind::Output(i as u64),
        BufRef::Scratch { offset, len } => buf_info::Kind::Scratch(proto::ScratchRange {
            offset: offset as u64,
            len: len as u64,
        }),
    };
    proto::BufInfo { kind: Some(kind) }
}

fn layout_info(layout: &Layout) -> proto::LayoutInfo {
    let kind = match layout {
        Layout::Same => layout_info::Kind::Same(proto::Empty {}),
        Layout::ScalarA => layout_info::Kind::ScalarA(proto::Empty {}),
        Layout::ScalarB => layout_info::Kind::ScalarB(proto::Empty {}),
        Layout::RowA { inner } => layout_info::Kind::RowA(*inner as u64),
        Layout::RowB { inner } => layout_info::Kind::RowB(*inner as u64),
        Layout::Strided(s) => layout_info::Kind::Strided(proto::StridedLayout {
            dims: dims(&s.dims),
            a_strides: dims(&s.a_strides),
            b_strides: dims(&s.b_strides),
        }),
    };
    proto::LayoutInfo { kind: Some(kind) }
}

fn unary_kind(op: UnaryOp) -> proto::UnaryOpKind {
    use proto::UnaryOpKind as K;
    match op {
        UnaryOp::Relu => K::Relu,
        UnaryOp::Sigmoid => K::Sigmoid,
        UnaryOp::Tanh => K::Tanh,
        UnaryOp::Neg => K::Neg,
        UnaryOp::Abs => K::Abs,
        UnaryOp::Sqrt => K::Sqrt,
        UnaryOp::Exp => K::Exp,
    }
}

fn binary_kind(op: BinaryOp) -> proto::BinaryOpKind {
    use proto::BinaryOpKind as K;
    match op {
        BinaryOp::Add => K::Add,
        BinaryOp::Sub => K::Sub,
        BinaryOp::Mul => K::Mul,
        BinaryOp::Div => K::Div,
    }
}

// ---- decoding ----

/// The parts of graph `g`'s program; `constants` are the file's weights by id.
pub(crate) fn program_parts(g: &proto::GraphInfo, target: Target, constants: &[Constant]) -> Result<ProgramParts> {
    let program = g.program.as_ref().ok_or_else(|| missing("program"))?;
    let mut steps = Vec::with_capacity(program.steps.len());
    for (i, s) in program.steps.iter().enumerate() {
        steps.push(step(s).map_err(|e| e.context(format_args!("step {i}")))?);
    }
    Ok(ProgramParts {
        target,
        inputs: specs("input", &g.inputs)?,
        outputs: specs("output", &g.outputs)?,
        constants: graph_constants(&g.weight_ids, constants)?,
        steps,
        arena_len: usize_of(program.arena_len, "arena length")?,
        op_counts: program.op_counts.iter().map(op_count).collect::<Result<_>>()?,
    })
}

fn graph_constants(ids: &[u32], constants: &[Constant]) -> Result<Vec<Constant>> {
    ids.iter()
        .map(|&id| {
            constants.get(id as usize).cloned().ok_or_else(|| {
                Error::invalid_graph(format!("weight id {id} is out of range ({} weights)", constants.len()))
            })
        })
        .collect()
}

fn specs(what: &str, infos: &[proto::TensorInfo]) -> Result<Vec<TensorSpec>> {
    infos
        .iter()
        .enumerate()
        .map(|(i, t)| {
            check_dtype(t.dtype).map_err(|e| e.context(format_args!("{what} {i} '{}'", t.name)))?;
            Ok(TensorSpec {
                name: t.name.clone(),
                shape: shape(&t.shape)?,
            })
        })
        .collect()
}

pub(crate) fn check_dtype(code: i32) -> Result<()> {
    if DType::from_onnx(code) != Some(DType::F32) {
        crate::bail!(
            InvalidGraph,
            "element type {} (code {code}) is not one this kiln reads (float)",
            crate::ir::onnx_type_name(code)
        );
    }
    Ok(())
}

pub(crate) fn shape(dims: &[u64]) -> Result<Vec<usize>> {
    dims.iter().map(|&d| usize_of(d, "dimension")).collect()
}

fn usize_of(n: u64, what: &str) -> Result<usize> {
    usize::try_from(n).map_err(|_| Error::invalid_graph(format!("{what} {n} does not fit in memory")))
}

fn op_count(c: &proto::OpCount) -> Result<(Op, usize)> {
    let op =
        Op::from_onnx("", &c.op).ok_or_else(|| Error::invalid_graph(format!("unknown op '{}' in op counts", c.op)))?;
    Ok((op, usize_of(c.count, "op count")?))
}

fn step(s: &proto::StepInfo) -> Result<Step> {
    Ok(match s.kind.as_ref().ok_or_else(|| missing("step kind"))? {
        step_info::Kind::Unary(u) => Step::Unary {
            op: unary_op(u.op)?,
            src: buf_ref(&u.src)?,
            dst: buf_ref(&u.dst)?,
        },
        step_info::Kind::Binary(b) => Step::Binary {
            op: binary_op(b.op)?,
            layout: layout(&b.layout)?,
            a: buf_ref(&b.a)?,
            b: buf_ref(&b.b)?,
            dst: buf_ref(&b.dst)?,
        },
        step_info::Kind::Copy(c) => Step::Copy {
            src: buf_ref(&c.src)?,
            dst: buf_ref(&c.dst)?,
        },
    })
}

fn unary_op(code: i32) -> Result<UnaryOp> {
    use proto::UnaryOpKind as K;
    Ok(match K::try_from(code) {
        Ok(K::Relu) => UnaryOp::Relu,
        Ok(K::Sigmoid) => UnaryOp::Sigmoid,
        Ok(K::Tanh) => UnaryOp::Tanh,
        Ok(K::Neg) => UnaryOp::Neg,
        Ok(K::Abs) => UnaryOp::Abs,
        Ok(K::Sqrt) => UnaryOp::Sqrt,
        Ok(K::Exp) => UnaryOp::Exp,
        Ok(K::Unspecified) | Err(_) => crate::bail!(InvalidGraph, "unknown unary op code {code}"),
    })
}

fn binary_op(code: i32) -> Result<BinaryOp> {
    use proto::BinaryOpKind as K;
    Ok(match K::try_from(code) {
        Ok(K::Add) => BinaryOp::Add,
        Ok(K::Sub) => BinaryOp::Sub,
        Ok(K::Mul) => BinaryOp::Mul,
        Ok(K::Div) => BinaryOp::Div,
        Ok(K::Unspecified) | Err(_) => crate::bail!(InvalidGraph, "unknown binary op code {code}"),
    })
}

fn buf_ref(b: &Option<proto::BufInfo>) -> Result<BufRef> {
    let kind = b
        .as_ref()
        .and_then(|b| b.kind.as_ref())
        .ok_or_else(|| missing("buffer"))?;
    Ok(match kind {
        buf_info::Kind::Input(i) => BufRef::Input(usize_of(*i, "input index")?),
        buf_info::Kind::Constant(i) => BufRef::Constant(usize_of(*i, "constant index")?),
        buf_info::Kind::Output(i) => BufRef::Output(usize_of(*i, "output index")?),
        buf_info::Kind::Scratch(s) => BufRef::Scratch {
            offset: usize_of(s.offset, "scratch offset")?,
            len: usize_of(s.len, "scratch length")?,
        },
    })
}

fn layout(l: &Option<proto::LayoutInfo>) -> Result<Layout> {
    let kind = l
        .as_ref()
        .and_then(|l| l.kind.as_ref())
        .ok_or_else(|| missing("layout"))?;
    Ok(match kind {
        layout_info::Kind::Same(_) => Layout::Same,
        layout_info::Kind::ScalarA(_) => Layout::ScalarA,
        layout_info::Kind::ScalarB(_) => Layout::ScalarB,
        layout_info::Kind::RowA(n) => Layout::RowA {
            inner: usize_of(*n, "row length")?,
        },
        layout_info::Kind::RowB(n) => Layout::RowB {
            inner: usize_of(*n, "row length")?,
        },
        layout_info::Kind::Strided(s) => Layout::Strided(Strided {
            dims: shape(&s.dims)?,
            a_strides: shape(&s.a_strides)?,
            b_strides: shape(&s.b_strides)?,
        }),
    })
}

fn missing(what: &str) -> Error {
    Error::invalid_graph(format!("{what} is missing"))
}
