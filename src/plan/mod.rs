//! A compiled program: plain data (steps over numbered buffers plus a static
//! memory plan), and the interpreter that runs it.
//!
//! Nothing here holds code pointers, so a `Program` can be serialised as is
//! (see `context`); kernels are chosen from `target` each time a step runs.
//! Constants are [`Weight`]s, which can point into a memory-mapped file.
//! [`Program::from_parts`] rebuilds a program from untrusted data and
//! validates it, so that running it can never read out of bounds.

mod validate;
mod weight;

use std::fmt;
use std::sync::{Arc, Mutex};

pub use weight::{AlignedBytes, Storage, Weight, STORAGE_ALIGN};

use crate::error::{Error, Result};
use crate::ir::{Op, ShapeDisplay};
use crate::kernels::{self, BinaryOp, Isa, Layout, UnaryOp};
use crate::target::Target;

/// A graph input or output: name and static shape (f32 for now).
#[derive(Clone, Debug, PartialEq)]
pub struct TensorSpec {
    pub name: String,
    pub shape: Vec<usize>,
}

impl TensorSpec {
    /// Element count; saturates instead of overflowing (validation rejects such shapes).
    pub fn numel(&self) -> usize {
        self.shape.iter().fold(1usize, |n, &d| n.saturating_mul(d))
    }
}

/// A program constant: its static shape and its data. Cheap to clone (a
/// hostile file may reference one weight many times).
#[derive(Clone, Debug)]
pub struct Constant {
    pub shape: Arc<[usize]>,
    pub data: Weight,
}

/// Where a step reads or writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BufRef {
    /// The caller's input `i`.
    Input(usize),
    /// The program's constant `i`.
    Constant(usize),
    /// The caller's output `i`.
    Output(usize),
    /// `len` elements of the scratch arena starting at `offset`.
    Scratch { offset: usize, len: usize },
}

/// One instruction of a program.
#[derive(Clone, Debug, PartialEq)]
pub enum Step {
    Unary {
        op: UnaryOp,
        src: BufRef,
        dst: BufRef,
    },
    Binary {
        op: BinaryOp,
        layout: Layout,
        a: BufRef,
        b: BufRef,
        dst: BufRef,
    },
    Copy {
        src: BufRef,
        dst: BufRef,
    },
}

impl Step {
    pub fn dst(&self) -> BufRef {
        match self {
            Step::Unary { dst, .. } | Step::Binary { dst, .. } | Step::Copy { dst, .. } => *dst,
        }
    }

    pub fn srcs(&self) -> Vec<BufRef> {
        match self {
            Step::Unary { src, .. } | Step::Copy { src, .. } => vec![*src],
            Step::Binary { a, b, .. } => vec![*a, *b],
        }
    }
}

/// A compiled subgraph, ready to run on any host that supports its target.
/// Cloning shares the constants' storage.
#[derive(Clone)]
pub struct Program {
    pub(crate) target: Target,
    pub(crate) inputs: Vec<TensorSpec>,
    pub(crate) outputs: Vec<TensorSpec>,
    pub(crate) constants: Vec<Constant>,
    pub(crate) steps: Vec<Step>,
    /// Arena size in elements.
    pub(crate) arena_len: usize,
    /// How many nodes of each op the source graph had after dead-code removal.
    pub(crate) op_counts: Vec<(Op, usize)>,
    /// Run-time cache, not part of the program's meaning.
    pub(crate) scratch: ScratchPool,
}

/// Everything a [`Program`] is made of, e.g. as read back from a file.
#[derive(Clone, Debug)]
pub struct ProgramParts {
    pub target: Target,
    pub inputs: Vec<TensorSpec>,
    pub outputs: Vec<TensorSpec>,
    pub constants: Vec<Constant>,
    pub steps: Vec<Step>,
    /// Arena size in elements.
    pub arena_len: usize,
    pub op_counts: Vec<(Op, usize)>,
}

impl Program {
    /// Rebuilds a program from (possibly corrupt or hostile) parts, checking
    /// everything a run relies on; `Err(InvalidGraph)` says what is wrong.
    pub fn from_parts(parts: ProgramParts) -> Result<Program> {
        let p = Program {
            target: parts.target,
            inputs: parts.inputs,
            outputs: parts.outputs,
            constants: parts.constants,
            steps: parts.steps,
            arena_len: parts.arena_len,
            op_counts: parts.op_counts,
            scratch: ScratchPool::default(),
        };
        p.validate()?;
        Ok(p)
    }

    /// Checks buffer references, lengths, layouts and sizes: a program that
    /// passes cannot make `run` read or write out of bounds.
    pub fn validate(&self) -> Result<()> {
        validate::check(self).map_err(|e| e.context("corrupt kiln program"))
    }

    pub fn target(&self) -> Target {
        self.target
    }

    pub fn inputs(&self) -> &[TensorSpec] {
        &self.inputs
    }

    pub fn outputs(&self) -> &[TensorSpec] {
        &self.outputs
    }

    pub fn steps(&self) -> &[Step] {
        &self.steps
    }

    pub fn constants(&self) -> &[Constant] {
        &self.constants
    }

    /// Arena size in elements.
    pub fn arena_len(&self) -> usize {
        self.arena_len
    }

    /// Live nodes per op in the source graph.
    pub fn op_counts(&self) -> &[(Op, usize)] {
        &self.op_counts
    }

    pub fn num_steps(&self) -> usize {
        self.steps.len()
    }

    /// Scratch memory one run needs.
    pub fn arena_bytes(&self) -> usize {
        self.arena_len * std::mem::size_of::<f32>()
    }

    pub fn constant_bytes(&self) -> usize {
        let elems: usize = self.constants.iter().map(|c| c.data.len()).sum();
        elems * std::mem::size_of::<f32>()
    }

    /// e.g. "Add x1, Mul x1, Relu x1"; "none" for a program with no ops.
    pub fn op_summary(&self) -> String {
        if self.op_counts.is_empty() {
            return "none".to_string();
        }
        let parts: Vec<String> = self.op_counts.iter().map(|(op, n)| format!("{op} x{n}")).collect();
        parts.join(", ")
    }

    /// Runs the program. Safe to call from several threads at once.
    pub fn run(&self, host: Target, inputs: &[&[f32]], outputs: &mut [&mut [f32]]) -> Result<()> {
        let isa = self.check_target(host)?;
        self.check_io(inputs, outputs)?;
        let mut arena = self.scratch.take(self.arena_len)?;
        let result = self.execute(isa, inputs, outputs, &mut arena);
        self.scratch.give(arena);
        result
    }

    /// Refuses a target newer than `host` (the caller's view, which may be
    /// capped by `KILN_MAX_TARGET`) or than this CPU really supports.
    fn check_target(&self, host: Target) -> Result<Isa> {
        let cpu = Target::cpu_best();
        for (limit, what) in [(host, "the host"), (cpu, "this CPU")] {
            if !self.target.can_run_on(limit) {
                crate::bail!(
                    InvalidGraph,
                    "kiln program was compiled for {} ({}) but {what} supports only {} ({}); \
                     recompile it for {}",
                    self.target,
                    self.target.description(),
                    limit,
                    limit.description(),
                    limit
                );
            }
        }
        Isa::new(self.target).ok_or_else(|| Error::fail("CPU support check disagrees"))
    }

    fn check_io(&self, inputs: &[&[f32]], outputs: &[&mut [f32]]) -> Result<()> {
        check_count("input", &self.inputs, inputs.len())?;
        check_count("output", &self.outputs, outputs.len())?;
        for (spec, data) in self.inputs.iter().zip(inputs) {
            check_len("input", spec, data.len())?;
        }
        for (spec, data) in self.outputs.iter().zip(outputs) {
            check_len("output", spec, data.len())?;
        }
        Ok(())
    }

    fn execute(&self, isa: Isa, inputs: &[&[f32]], outputs: &mut [&mut [f32]], arena: &mut [f32]) -> Result<()> {
        let mut mem = Memory {
            inputs,
            constants: &self.constants,
            outputs,
            arena,
        };
        for (i, step) in self.steps.iter().enumerate() {
            mem.run_step(isa, step)
                .map_err(|e| e.context(format_args!("kiln step {i}")))?;
        }
        Ok(())
    }
}

fn check_count(what: &str, specs: &[TensorSpec], got: usize) -> Result<()> {
    if specs.len() != got {
        crate::bail!(
            InvalidArgument,
            "kiln program takes {} {what}(s), got {got}",
            specs.len()
        );
    }
    Ok(())
}

fn check_len(what: &str, spec: &TensorSpec, got: usize) -> Result<()> {
    if spec.numel() != got {
        crate::bail!(
            InvalidArgument,
            "{what} '{}' of shape {} needs {} elements, got {got}",
            spec.name,
            ShapeDisplay(&spec.shape),
            spec.numel()
        );
    }
    Ok(())
}

impl fmt::Debug for Program {
    // By hand, so that constants print as sizes rather than every value.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Program")
            .field("target", &self.target)
            .field("inputs", &self.inputs)
            .field("outputs", &self.outputs)
            .field("constant_bytes", &self.constant_bytes())
            .field("arena_bytes", &self.arena_bytes())
            .field("steps", &self.steps)
            .finish()
    }
}

/// The buffers one run works on.
struct Memory<'r, 'i, 'o> {
    inputs: &'r [&'i [f32]],
    constants: &'r [Constant],
    outputs: &'r mut [&'o mut [f32]],
    arena: &'r mut [f32],
}

/// Read-only view of everything but the step's destination.
struct Sources<'v> {
    inputs: &'v [&'v [f32]],
    constants: &'v [Constant],
    outputs_before: &'v [&'v mut [f32]],
    outputs_after: &'v [&'v mut [f32]],
    /// Output index of the destination, or `outputs.len()` when it is scratch.
    hole: usize,
    arena_before: &'v [f32],
    arena_after: &'v [f32],
    /// Arena range of the destination (empty at the end when it is an output).
    arena_hole: (usize, usize),
}

impl Memory<'_, '_, '_> {
    fn run_step(&mut self, isa: Isa, step: &Step) -> Result<()> {
        let (src, dst) = self.split(step.dst())?;
        match step {
            Step::Unary { op, src: s, .. } => kernels::unary(isa, *op, src.get(*s)?, dst),
            Step::Binary { op, layout, a, b, .. } => kernels::binary(isa, *op, layout, src.get(*a)?, src.get(*b)?, dst),
            Step::Copy { src: s, .. } => kernels::copy(src.get(*s)?, dst),
        }
    }

    /// Splits off `dst` mutably and leaves the rest readable: the borrow
    /// checker then proves that no step reads the buffer it writes.
    fn split(&mut self, dst: BufRef) -> Result<(Sources<'_>, &mut [f32])> {
        let n_out = self.outputs.len();
        let arena_len = self.arena.len();
        let (hole, arena_hole) = match dst {
            BufRef::Output(i) if i < n_out => (i, (arena_len, arena_len)),
            BufRef::Scratch { offset, len } => match offset.checked_add(len) {
                Some(end) if end <= arena_len => (n_out, (offset, end)),
                _ => return Err(bad_ref(dst)),
            },
            _ => return Err(bad_ref(dst)),
        };
        let (outputs_before, rest) = self.outputs.split_at_mut(hole);
        let (out_dst, outputs_after) = match rest {
            [d, after @ ..] => (Some(d), &*after),
            [] => (None, &[][..]),
        };
        let (arena_before, rest) = self.arena.split_at_mut(arena_hole.0);
        let (arena_dst, arena_after) = rest.split_at_mut(arena_hole.1 - arena_hole.0);
        let dst: &mut [f32] = match out_dst {
            Some(d) => d,
            None => arena_dst,
        };
        let src = Sources {
            inputs: self.inputs,
            constants: self.constants,
            outputs_before,
            outputs_after,
            hole,
            arena_before,
            arena_after,
            arena_hole,
        };
        Ok((src, dst))
    }
}

impl Sources<'_> {
    fn get(&self, r: BufRef) -> Result<&[f32]> {
        let found = match r {
            BufRef::Input(i) => self.inputs.get(i).map(|s| &**s),
            BufRef::Constant(i) => self.constants.get(i).map(|c| c.data.as_slice()),
            BufRef::Output(i) if i < self.hole => self.outputs_before.get(i).map(|s| &**s),
            BufRef::Output(i) if i > self.hole => self.outputs_after.get(i - self.hole - 1).map(|s| &**s),
            BufRef::Output(_) => None,
            BufRef::Scratch { offset, len } => self.scratch(offset, len),
        };
        found.ok_or_else(|| bad_ref(r))
    }

    fn scratch(&self, offset: usize, len: usize) -> Option<&[f32]> {
        let end = offset.checked_add(len)?;
        let (hole_start, hole_end) = self.arena_hole;
        if end <= hole_start {
            self.arena_before.get(offset..end)
        } else if offset >= hole_end {
            self.arena_after.get(offset - hole_end..end - hole_end)
        } else {
            None // overlaps the destination
        }
    }
}

fn bad_ref(r: BufRef) -> Error {
    Error::runtime(format!(
        "corrupt kiln program: {r:?} is out of range or overlaps the step's destination"
    ))
}

/// Scratch arenas kept between runs, one per concurrent caller at most.
#[derive(Default)]
pub(crate) struct ScratchPool {
    free: Mutex<Vec<Vec<f32>>>,
}

/// Arenas kept at most; more only happens under heavy concurrency.
const MAX_POOLED: usize = 16;

impl ScratchPool {
    fn take(&self, len: usize) -> Result<Vec<f32>> {
        if len == 0 {
            return Ok(Vec::new());
        }
        if let Some(v) = self.lock().pop() {
            return Ok(v);
        }
        let mut v = Vec::new();
        v.try_reserve_exact(len)
            .map_err(|_| Error::runtime(format!("kiln could not allocate {len} f32 of scratch memory")))?;
        v.resize(len, 0.0);
        Ok(v)
    }

    fn give(&self, v: Vec<f32>) {
        let mut free = self.lock();
        if !v.is_empty() && free.len() < MAX_POOLED {
            free.push(v);
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Vec<f32>>> {
        // A panic elsewhere cannot leave the pool inconsistent: it only holds buffers.
        self.free.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Clone for ScratchPool {
    fn clone(&self) -> Self {
        ScratchPool::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::ErrorKind;

    /// y = relu(x + c); z = y * x, hand-built to test the interpreter alone.
    fn program(target: Target) -> Program {
        let spec = |name: &str| TensorSpec {
            name: name.into(),
            shape: vec![2, 2],
        };
        let scratch = BufRef::Scratch { offset: 0, len: 4 };
        Program {
            target,
            inputs: vec![spec("x")],
            outputs: vec![spec("y"), spec("z")],
            constants: vec![Constant {
                shape: Arc::new([]),
                data: Weight::from_vec(vec![1.0]),
            }],
            steps: vec![
                Step::Binary {
                    op: BinaryOp::Add,
                    layout: Layout::ScalarB,
                    a: BufRef::Input(0),
                    b: BufRef::Constant(0),
                    dst: scratch,
                },
                Step::Unary {
                    op: UnaryOp::Relu,
                    src: scratch,
                    dst: BufRef::Output(0),
                },
                Step::Binary {
                    op: BinaryOp::Mul,
                    layout: Layout::Same,
                    a: BufRef::Output(0),
                    b: BufRef::Input(0),
                    dst: BufRef::Output(1),
                },
            ],
            arena_len: 4,
            op_counts: vec![(Op::Add, 1), (Op::Mul, 1), (Op::Relu, 1)],
            scratch: ScratchPool::default(),
        }
    }

    fn run(p: &Program, x: &[f32]) -> Result<(Vec<f32>, Vec<f32>)> {
        let (mut y, mut z) = (vec![0.0; 4], vec![0.0; 4]);
        p.run(Target::Generic.max(p.target), &[x], &mut [&mut y, &mut z])?;
        Ok((y, z))
    }

    #[test]
    fn interprets_steps() {
        let p = program(Target::Generic);
        let (y, z) = run(&p, &[-3.0, -1.0, 0.0, 2.0]).unwrap();
        assert_eq!(y, [0.0, 0.0, 1.0, 3.0]);
        assert_eq!(z, [0.0, 0.0, 0.0, 6.0]);
        assert_eq!(p.op_summary(), "Add x1, Mul x1, Relu x1");
        assert_eq!(p.num_steps(), 3);
        assert_eq!(p.arena_bytes(), 16);
        assert_eq!(p.constant_bytes(), 4);
        assert!(format!("{p:?}").contains("Program"));
    }

    #[test]
    fn wrong_io_is_invalid_argument() {
        let p = program(Target::Generic);
        let e = run(&p, &[1.0; 3]).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        assert!(e.message.contains("'x'") && e.message.contains('3'), "{e}");
        let mut y = vec![0.0; 4];
        let e = p.run(Target::Generic, &[&[1.0; 4]], &mut [&mut y]).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidArgument);
        let mut z = vec![0.0; 5];
        let e = p.run(Target::Generic, &[&[1.0; 4]], &mut [&mut y, &mut z]).unwrap_err();
        assert!(e.message.contains("'z'"), "{e}");
    }

    #[test]
    fn refuses_newer_target() {
        let p = program(Target::Avx2);
        let mut y = vec![0.0; 4];
        let mut z = vec![0.0; 4];
        let e = p.run(Target::Generic, &[&[1.0; 4]], &mut [&mut y, &mut z]).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidGraph);
        assert!(e.message.contains("x86_64-avx2"), "{e}");
        assert!(e.message.contains("x86_64-generic"), "{e}");
    }

    #[test]
    fn corrupt_steps_are_errors_not_panics() {
        let bad = [
            BufRef::Scratch { offset: 2, len: 4 },
            BufRef::Input(3),
            BufRef::Constant(1),
            BufRef::Output(7),
        ];
        for r in bad {
            let mut p = program(Target::Generic);
            p.steps[1] = Step::Unary {
                op: UnaryOp::Neg,
                src: r,
                dst: BufRef::Output(0),
            };
            let e = run(&p, &[1.0; 4]).unwrap_err();
            assert_eq!(e.kind, ErrorKind::Runtime, "{r:?}: {e}");
        }
        // Reading the destination itself.
        let mut p = program(Target::Generic);
        p.steps[2] = Step::Copy {
            src: BufRef::Output(1),
            dst: BufRef::Output(1),
        };
        assert!(run(&p, &[1.0; 4]).is_err());
        let mut p = program(Target::Generic);
        p.steps[0] = Step::Copy {
            src: BufRef::Input(0),
            dst: BufRef::Input(0),
        };
        assert!(run(&p, &[1.0; 4]).is_err());
    }

    #[test]
    fn scratch_pool_reuses_buffers() {
        let pool = ScratchPool::default();
        let v = pool.take(8).unwrap();
        assert_eq!(v.len(), 8);
        pool.give(v);
        assert_eq!(pool.lock().len(), 1);
        let _v = pool.take(8).unwrap();
        assert_eq!(pool.lock().len(), 0);
        assert!(pool.take(0).unwrap().is_empty());
    }

    #[test]
    fn program_is_send_sync() {
        fn check<T: Send + Sync + fmt::Debug>() {}
        check::<Program>();
    }
}
