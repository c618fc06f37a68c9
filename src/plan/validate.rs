//! Static checks of a [`Program`] that may come from an untrusted file.
//!
//! They mirror what `run` relies on: every buffer reference in range, no step
//! reading the buffer it writes, kernel lengths consistent with the buffers,
//! and sizes whose byte counts fit in memory. `run` keeps its own checks as a
//! second line; these make a bad file fail at load, with a reason.

use super::{BufRef, Constant, Program, Step, TensorSpec};
use crate::error::{Error, Result};
use crate::ir::ShapeDisplay;

/// Arena slack allowed past the last scratch buffer (64 bytes of f32), so a
/// future planner may round the arena up.
const ARENA_SLACK: usize = 16;

pub(super) fn check(p: &Program) -> Result<()> {
    check_specs("input", &p.inputs)?;
    check_specs("output", &p.outputs)?;
    check_constants(&p.constants)?;
    elements_fit("the scratch arena", p.arena_len)?;
    let mut written = vec![false; p.outputs.len()];
    let mut scratch_end = 0;
    for (i, step) in p.steps.iter().enumerate() {
        check_step(p, step).map_err(|e| e.context(format_args!("step {i}")))?;
        if let BufRef::Output(j) = step.dst() {
            written[j] = true;
        }
        scratch_end = scratch_end.max(max_scratch_end(step));
    }
    if let Some(j) = written.iter().position(|w| !w) {
        crate::bail!(InvalidGraph, "no step writes output {j} '{}'", p.outputs[j].name);
    }
    if p.arena_len > scratch_end.saturating_add(ARENA_SLACK) {
        crate::bail!(
            InvalidGraph,
            "arena of {} elements is larger than its steps use ({scratch_end})",
            p.arena_len
        );
    }
    Ok(())
}

fn check_specs(what: &str, specs: &[TensorSpec]) -> Result<()> {
    for (i, spec) in specs.iter().enumerate() {
        if spec.name.is_empty() {
            crate::bail!(InvalidGraph, "{what} {i} has an empty name");
        }
        let numel = spec.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
        let numel = numel.ok_or_else(|| too_large(&spec.name, &spec.shape))?;
        elements_fit(&spec.name, numel)?;
    }
    Ok(())
}

fn check_constants(constants: &[Constant]) -> Result<()> {
    for (i, c) in constants.iter().enumerate() {
        let numel = c.shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
        if numel != Some(c.data.len()) {
            crate::bail!(
                InvalidGraph,
                "constant {i} of shape {} has {} elements",
                ShapeDisplay(&c.shape),
                c.data.len()
            );
        }
    }
    Ok(())
}

/// Refuses element counts whose f32 byte size could not be allocated.
fn elements_fit(what: &str, numel: usize) -> Result<()> {
    let bytes = numel.checked_mul(size_of::<f32>());
    if bytes.is_none_or(|b| b > isize::MAX as usize) {
        crate::bail!(InvalidGraph, "{what} of {numel} elements is too large");
    }
    Ok(())
}

fn too_large(name: &str, shape: &[usize]) -> Error {
    Error::invalid_graph(format!("'{name}' of shape {} is too large", ShapeDisplay(shape)))
}

fn check_step(p: &Program, step: &Step) -> Result<()> {
    let dst = step.dst();
    if matches!(dst, BufRef::Input(_) | BufRef::Constant(_)) {
        crate::bail!(InvalidGraph, "writes {dst:?}, which is read-only");
    }
    let dst_len = buf_len(p, dst)?;
    let mut src_lens = Vec::with_capacity(2);
    for src in step.srcs() {
        src_lens.push(buf_len(p, src)?);
        if overlaps(src, dst) {
            crate::bail!(InvalidGraph, "reads {src:?}, which overlaps its destination {dst:?}");
        }
    }
    let consistent = match (step, &src_lens[..]) {
        (Step::Unary { .. } | Step::Copy { .. }, [n]) => *n == dst_len,
        (Step::Binary { layout, .. }, [a, b]) => layout.fits(*a, *b, dst_len),
        _ => false,
    };
    if !consistent {
        crate::bail!(
            InvalidGraph,
            "{} reads buffers of {src_lens:?} elements into {dst_len}, which its kind and layout do not allow",
            step_kind(step)
        );
    }
    Ok(())
}

fn step_kind(step: &Step) -> String {
    match step {
        Step::Unary { op, .. } => format!("{op:?}"),
        Step::Binary { op, layout, .. } => format!("{op:?} with layout {layout:?}"),
        Step::Copy { .. } => "Copy".to_string(),
    }
}

/// Elements of the buffer `r` names, or why it names none.
fn buf_len(p: &Program, r: BufRef) -> Result<usize> {
    let len = match r {
        BufRef::Input(i) => p.inputs.get(i).map(TensorSpec::numel),
        BufRef::Constant(i) => p.constants.get(i).map(|c| c.data.len()),
        BufRef::Output(i) => p.outputs.get(i).map(TensorSpec::numel),
        BufRef::Scratch { offset, len } => offset
            .checked_add(len)
            .is_some_and(|end| end <= p.arena_len)
            .then_some(len),
    };
    len.ok_or_else(|| {
        Error::invalid_graph(format!(
            "{r:?} is out of range ({} inputs, {} constants, {} outputs, arena of {} elements)",
            p.inputs.len(),
            p.constants.len(),
            p.outputs.len(),
            p.arena_len
        ))
    })
}

/// Whether a step reading `src` while writing `dst` would alias; mirrors
/// the split `run` makes (an empty range touching the destination counts).
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

#[cfg(test)]
mod tests {
    use super::super::{ProgramParts, ScratchPool, Weight};
    use super::*;
    use crate::error::ErrorKind;
    use crate::ir::Op;
    use crate::kernels::{BinaryOp, Layout, Strided, UnaryOp};
    use crate::target::Target;

    fn spec(name: &str, shape: &[usize]) -> TensorSpec {
        TensorSpec {
            name: name.into(),
            shape: shape.to_vec(),
        }
    }

    /// y = relu(x + c) with x, y [2,2], c [2] and one scratch buffer.
    fn parts() -> ProgramParts {
        let t = BufRef::Scratch { offset: 0, len: 4 };
        ProgramParts {
            target: Target::Generic,
            inputs: vec![spec("x", &[2, 2])],
            outputs: vec![spec("y", &[2, 2])],
            constants: vec![Constant {
                shape: vec![2].into(),
                data: Weight::from_vec(vec![1.0, 2.0]),
            }],
            steps: vec![
                Step::Binary {
                    op: BinaryOp::Add,
                    layout: Layout::RowB { inner: 2 },
                    a: BufRef::Input(0),
                    b: BufRef::Constant(0),
                    dst: t,
                },
                Step::Unary {
                    op: UnaryOp::Relu,
                    src: t,
                    dst: BufRef::Output(0),
                },
            ],
            arena_len: 4,
            op_counts: vec![(Op::Add, 1), (Op::Relu, 1)],
        }
    }

    fn refused(p: ProgramParts, needle: &str) {
        let e = Program::from_parts(p).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidGraph, "{e}");
        assert!(e.message.contains(needle), "{needle:?} not in: {e}");
        assert!(e.message.starts_with("corrupt kiln program"), "{e}");
    }

    #[test]
    fn valid_parts_run() {
        let p = Program::from_parts(parts()).unwrap();
        let mut y = [0.0; 4];
        p.run(Target::Generic, &[&[-5.0, 0.0, 1.0, 2.0]], &mut [&mut y])
            .unwrap();
        assert_eq!(y, [0.0, 2.0, 2.0, 4.0]);
        assert_eq!(p.arena_len(), 4);
        assert_eq!(p.op_counts().len(), 2);
        assert_eq!(*p.constants()[0].shape, [2]);
        // Clones share constants and run on their own scratch.
        let q = p.clone();
        assert!(matches!(q.scratch, ScratchPool { .. }));
        q.run(Target::Generic, &[&[1.0; 4]], &mut [&mut y]).unwrap();
        assert_eq!(y, [2.0, 3.0, 2.0, 3.0]);
    }

    #[test]
    fn out_of_range_refs() {
        let bad = [
            BufRef::Input(1),
            BufRef::Constant(1),
            BufRef::Output(1),
            BufRef::Scratch { offset: 1, len: 4 },
            BufRef::Scratch {
                offset: usize::MAX,
                len: 2,
            },
        ];
        for r in bad {
            let mut p = parts();
            p.steps[1] = Step::Unary {
                op: UnaryOp::Neg,
                src: r,
                dst: BufRef::Output(0),
            };
            refused(p, "out of range");
        }
    }

    #[test]
    fn writes_to_read_only_or_aliased_buffers() {
        for dst in [BufRef::Input(0), BufRef::Constant(0)] {
            let mut p = parts();
            p.steps[1] = Step::Copy {
                src: BufRef::Output(0),
                dst,
            };
            refused(p, "read-only");
        }
        let mut p = parts();
        p.steps[1] = Step::Copy {
            src: BufRef::Output(0),
            dst: BufRef::Output(0),
        };
        refused(p, "overlaps");
        let mut p = parts();
        p.arena_len = 8;
        p.steps.insert(
            1,
            Step::Unary {
                op: UnaryOp::Exp,
                src: BufRef::Scratch { offset: 0, len: 4 },
                dst: BufRef::Scratch { offset: 2, len: 4 },
            },
        );
        refused(p, "overlaps");
    }

    #[test]
    fn inconsistent_lengths_and_layouts() {
        let mut p = parts();
        p.steps[1] = Step::Unary {
            op: UnaryOp::Relu,
            src: BufRef::Constant(0),
            dst: BufRef::Output(0),
        };
        refused(p, "do not allow");
        let layouts = [
            Layout::Same,
            Layout::ScalarB,
            Layout::RowB { inner: 3 },
            Layout::RowA { inner: 0 },
            Layout::Strided(Strided {
                dims: vec![2, 2],
                a_strides: vec![2, 1],
                b_strides: vec![2, 1],
            }),
            Layout::Strided(Strided {
                dims: vec![],
                a_strides: vec![],
                b_strides: vec![],
            }),
            Layout::Strided(Strided {
                dims: vec![usize::MAX, 2],
                a_strides: vec![0, 1],
                b_strides: vec![0, 1],
            }),
        ];
        for layout in layouts {
            let mut p = parts();
            if let Step::Binary { layout: l, .. } = &mut p.steps[0] {
                *l = layout.clone();
            }
            refused(p, "do not allow");
        }
    }

    #[test]
    fn bad_sizes_and_specs() {
        let mut p = parts();
        p.arena_len = 1 << 40;
        refused(p, "larger than its steps use");
        let mut p = parts();
        p.arena_len = usize::MAX;
        refused(p, "too large");
        let mut p = parts();
        p.inputs[0].shape = vec![1 << 40, 1 << 40];
        refused(p, "too large");
        let mut p = parts();
        p.outputs[0].shape = vec![usize::MAX / 2];
        refused(p, "too large");
        let mut p = parts();
        p.outputs[0].name.clear();
        refused(p, "empty name");
        let mut p = parts();
        p.constants[0].shape = vec![3].into();
        refused(p, "constant 0");
        let mut p = parts();
        p.outputs.push(spec("z", &[1]));
        refused(p, "no step writes output 1 'z'");
    }
}
