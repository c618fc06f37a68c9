//! Elementwise chains in one pass (issue #14): f32 unary and binary ops whose
//! results are all of the output's size, run block by block so that every
//! intermediate stays in L1 (`compiler::chain` makes them). Each op runs the
//! same loops as its own step (`unary_part`, `binary_f32_isa`) on a block, so
//! the results are bit for bit those of the unfused program.

use std::cell::RefCell;
use std::ops::Range;

use super::parallel::Parallel;
use super::{binary_f32_isa, length_error, par_rows, unary_part, with_thread_buffer, BinaryOp, Isa, Layout, UnaryOp};
use crate::error::Result;
use crate::tensor::{DType, InlineVec};

/// Most ops in one chain; the results of up to this many are live at once.
pub const MAX_CHAIN_OPS: usize = 8;
/// Most distinct inputs of one chain.
pub const MAX_CHAIN_INPUTS: usize = 8;
/// Elements per block: with two or three live results, a block's working
/// set stays well inside a 32 KiB L1.
const BLOCK: usize = 1024;

/// What an op reads: a chain input, or the result of an earlier op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operand {
    Input(usize),
    Result(usize),
}

/// One op of a chain.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum ChainOp {
    Unary(UnaryOp, Operand),
    Binary(BinaryOp, Operand, Operand),
}

impl ChainOp {
    pub fn operands(&self) -> impl Iterator<Item = Operand> {
        let (a, b) = match *self {
            ChainOp::Unary(_, a) => (a, None),
            ChainOp::Binary(_, a, b) => (a, Some(b)),
        };
        std::iter::once(a).chain(b)
    }

    /// The ONNX op type, e.g. for the compile log's `Mul+Add+Relu`.
    pub fn onnx_name(&self) -> &'static str {
        match self {
            ChainOp::Unary(op, _) => op.onnx_name(),
            ChainOp::Binary(op, ..) => op.onnx_name(),
        }
    }
}

/// Whether a chain may hold `op` (f32 in, f32 out, elementwise).
pub fn chain_unary(op: UnaryOp) -> bool {
    op.src_dtype() == DType::F32 && op.dst_dtype() == DType::F32
}

/// Whether a chain may hold `op` on f32 (PRelu's slope and the integer
/// remainders keep their own steps).
pub fn chain_binary(op: BinaryOp) -> bool {
    use BinaryOp::*;
    matches!(op, Add | Sub | Mul | Div | Pow | Max | Min)
}

/// How a chain input lines up with the output.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Access {
    /// As many elements as the output.
    #[default]
    Full,
    /// One element.
    Scalar,
    /// One row of `inner` elements, repeated along the output.
    Row(usize),
    /// `count` values, each for a run of `inner` consecutive output
    /// elements, repeated along the output: a per-channel constant of a
    /// channels-first `[N, C, H, W]` (`count` C, `inner` H·W).
    Channel { count: usize, inner: usize },
}

impl Access {
    /// The access of an input of shape `input` to an output of shape `out`,
    /// if it is one of these: the input's dims other than 1 must be one run
    /// of the output's.
    pub fn for_shapes(out: &[usize], input: &[usize]) -> Option<Access> {
        if crate::tensor::broadcast_shapes(out, input)? != out {
            return None;
        }
        // The input's dims aligned to the output's last ones; size-1 output
        // dims cannot tell a run apart, so they are left out.
        let pad = out.len() - input.len();
        let kept: Vec<(usize, bool)> = out
            .iter()
            .enumerate()
            .filter(|&(_, &d)| d != 1)
            .map(|(i, &d)| (d, i >= pad && input[i - pad] == d))
            .collect();
        let first = kept.iter().position(|&(_, on)| on);
        let last = kept.iter().rposition(|&(_, on)| on);
        let (Some(first), Some(last)) = (first, last) else {
            return Some(Access::Scalar);
        };
        if kept[first..=last].iter().any(|&(_, on)| !on) {
            return None;
        }
        let count: usize = kept[first..=last].iter().map(|&(d, _)| d).product();
        let inner: usize = kept[last + 1..].iter().map(|&(d, _)| d).product();
        Some(match (first, inner) {
            (0, 1) => Access::Full,
            (_, 1) => Access::Row(count),
            _ => Access::Channel { count, inner },
        })
    }

    fn fits(self, len: usize, out: usize) -> bool {
        match self {
            Access::Full => len == out,
            Access::Scalar => len == 1,
            Access::Row(inner) => inner > 0 && len == inner && out.is_multiple_of(inner),
            Access::Channel { count, inner } => {
                len == count && count.checked_mul(inner).is_some_and(|p| p > 0 && out.is_multiple_of(p))
            }
        }
    }
}

/// Checks a chain against its inputs' and output's lengths: operands in
/// range and earlier, at least one full-size operand per binary op, one row
/// length for all row inputs. What `run` relies on (validation calls it).
pub fn check(ops: &[ChainOp], inputs: &[(Access, usize)], out: usize) -> std::result::Result<(), String> {
    if ops.is_empty() || ops.len() > MAX_CHAIN_OPS || inputs.len() > MAX_CHAIN_INPUTS {
        return Err(format!("a chain of {} ops on {} inputs", ops.len(), inputs.len()));
    }
    if out == 0 {
        return Ok(());
    }
    for (k, &(access, len)) in inputs.iter().enumerate() {
        if !access.fits(len, out) {
            return Err(format!("chain input {k} ({access:?}) has {len} elements for {out}"));
        }
    }
    if row_inner(inputs).is_none() {
        return Err("chain inputs of two row lengths".into());
    }
    for (i, op) in ops.iter().enumerate() {
        // Whether an operand is of the output's size; `None`: out of range or not earlier.
        let full = |o: Operand| match o {
            Operand::Input(k) => inputs.get(k).map(|&(a, _)| a == Access::Full),
            Operand::Result(r) => (r < i).then_some(true),
        };
        // No allocation: `run` checks on every call.
        let ok = match *op {
            ChainOp::Unary(u, a) => chain_unary(u) && full(a) == Some(true),
            ChainOp::Binary(b, x, y) => match (full(x), full(y)) {
                (Some(fx), Some(fy)) => chain_binary(b) && (fx || fy),
                _ => false,
            },
        };
        if !ok {
            return Err(format!(
                "chain op {i} ({op:?}) is not an elementwise op on earlier values"
            ));
        }
    }
    Ok(())
}

/// The one row length of the row inputs (`Some(None)`: none), or `None` for two.
fn row_inner(inputs: &[(Access, usize)]) -> Option<Option<usize>> {
    let mut inner = None;
    for &(a, _) in inputs {
        if let Access::Row(r) = a {
            if inner.is_some_and(|i| i != r) {
                return None;
            }
            inner = Some(r);
        }
    }
    Some(inner)
}

thread_local! {
    static RESULTS: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
    static EXPANDED: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Runs the chain: `dst` gets the last op's result.
pub fn run(isa: Isa, ops: &[ChainOp], inputs: &[(Access, &[f32])], dst: &mut [f32], par: &dyn Parallel) -> Result<()> {
    let lens: InlineVec<(Access, usize), MAX_CHAIN_INPUTS> = inputs.iter().map(|&(a, x)| (a, x.len())).collect();
    check(ops, &lens, dst.len()).map_err(|e| length_error(format_args!("{e}")))?;
    if dst.is_empty() {
        return Ok(());
    }
    let slots = Slots::new(ops);
    let expanded = Expanded::new(inputs);
    // Tasks of whole rows, so that each block starts a row or lies in one.
    let inner = row_inner(&lens).flatten().unwrap_or(1);
    par_rows(par, dst.len() / inner, inner, dst, &|rows, d| {
        with_thread_buffer(&RESULTS, |buf| {
            with_thread_buffer(&EXPANDED, |ex| {
                buf.resize(slots.count * BLOCK, 0.0);
                ex.resize(expanded.count * BLOCK, 0.0);
                let first = rows.start * inner;
                for r in blocks(first..first + d.len(), inner) {
                    expanded.fill(inputs, &r, ex);
                    let block = Block {
                        inputs,
                        expanded: &expanded,
                        ex,
                        r: r.clone(),
                        inner,
                    };
                    run_block(isa, ops, &slots, &block, buf, &mut d[r.start - first..r.end - first]);
                }
            })
        })
    });
    Ok(())
}

/// Where each channel input's values for the block are spread out, one
/// buffer each (the other inputs are read in place).
struct Expanded {
    of: [usize; MAX_CHAIN_INPUTS],
    count: usize,
}

impl Expanded {
    fn new(inputs: &[(Access, &[f32])]) -> Expanded {
        let mut of = [0; MAX_CHAIN_INPUTS];
        let mut count = 0;
        for (k, (a, _)) in inputs.iter().enumerate() {
            if let Access::Channel { .. } = a {
                of[k] = count;
                count += 1;
            }
        }
        Expanded { of, count }
    }

    /// Writes each channel input's value for every element of `r`.
    fn fill(&self, inputs: &[(Access, &[f32])], r: &Range<usize>, ex: &mut [f32]) {
        for (k, &(a, x)) in inputs.iter().enumerate() {
            let Access::Channel { count, inner } = a else {
                continue;
            };
            let to = &mut ex[self.of[k] * BLOCK..][..r.len()];
            let mut i = r.start;
            while i < r.end {
                let end = ((i / inner + 1) * inner).min(r.end);
                to[i - r.start..end - r.start].fill(x[(i / inner) % count]);
                i = end;
            }
        }
    }
}

/// One block's view of the inputs.
struct Block<'a> {
    inputs: &'a [(Access, &'a [f32])],
    expanded: &'a Expanded,
    ex: &'a [f32],
    r: Range<usize>,
    inner: usize,
}

impl<'a> Block<'a> {
    fn input(&self, k: usize) -> Arg<'a> {
        let (access, x) = self.inputs[k];
        let r = self.r.clone();
        match access {
            Access::Full => Arg::Full(&x[r]),
            Access::Scalar => Arg::Scalar(x),
            // A block of whole rows reads the row; a piece of one row reads its part.
            Access::Row(_) if self.inner <= BLOCK => Arg::Row(x, self.inner),
            Access::Row(_) => {
                let at = r.start % self.inner;
                Arg::Full(&x[at..at + r.len()])
            }
            Access::Channel { .. } => Arg::Full(&self.ex[self.expanded.of[k] * BLOCK..][..r.len()]),
        }
    }
}

/// Blocks of at most [`BLOCK`] elements over `range` (whole rows of
/// `inner`): several rows per block for short rows, pieces of one row for long.
fn blocks(range: Range<usize>, inner: usize) -> impl Iterator<Item = Range<usize>> {
    let step = if inner <= BLOCK { BLOCK / inner * inner } else { BLOCK };
    let mut at = range.start;
    std::iter::from_fn(move || {
        if at >= range.end {
            return None;
        }
        let row_end = if inner <= BLOCK {
            range.end
        } else {
            (at / inner + 1) * inner
        };
        let end = (at + step).min(row_end).min(range.end);
        let r = at..end;
        at = end;
        Some(r)
    })
}

/// Which result buffer each op writes: a result's slot is free again after
/// its last reader, so a linear chain needs two (read one, write the other).
struct Slots {
    of: [usize; MAX_CHAIN_OPS],
    count: usize,
}

impl Slots {
    fn new(ops: &[ChainOp]) -> Slots {
        let mut last_use = [0usize; MAX_CHAIN_OPS];
        for (i, op) in ops.iter().enumerate() {
            for o in op.operands() {
                if let Operand::Result(r) = o {
                    last_use[r] = i;
                }
            }
        }
        let mut of = [0usize; MAX_CHAIN_OPS];
        let mut busy_until = [0usize; MAX_CHAIN_OPS];
        let mut count = 0;
        // The last op writes the destination, not a slot.
        for i in 0..ops.len().saturating_sub(1) {
            // Slot s is free for op i once its value's last reader is before i.
            let free = (0..count).find(|&s| busy_until[s] < i);
            let s = free.unwrap_or_else(|| {
                count += 1;
                count - 1
            });
            of[i] = s;
            busy_until[s] = last_use[i].max(i);
        }
        Slots { of, count }
    }
}

/// One block's values of an operand.
#[derive(Clone, Copy)]
enum Arg<'a> {
    Full(&'a [f32]),
    Scalar(&'a [f32]),
    Row(&'a [f32], usize),
}

fn run_block(isa: Isa, ops: &[ChainOp], slots: &Slots, block: &Block<'_>, buf: &mut [f32], out: &mut [f32]) {
    let n = block.r.len();
    let Some((last, body)) = ops.split_last() else {
        return;
    };
    for (i, op) in body.iter().enumerate() {
        // The result's slot is split off so that the operands (other slots,
        // inputs) can be borrowed beside it; an op never reads its own slot.
        let mine = slots.of[i];
        let (before, rest) = buf.split_at_mut(mine * BLOCK);
        let (dst, after) = rest.split_at_mut(BLOCK);
        let arg = |o: Operand| match o {
            Operand::Result(j) if slots.of[j] < mine => Arg::Full(&before[slots.of[j] * BLOCK..][..n]),
            Operand::Result(j) => Arg::Full(&after[(slots.of[j] - mine - 1) * BLOCK..][..n]),
            Operand::Input(k) => block.input(k),
        };
        apply(isa, op, arg, &mut dst[..n]);
    }
    let arg = |o: Operand| match o {
        Operand::Result(j) => Arg::Full(&buf[slots.of[j] * BLOCK..][..n]),
        Operand::Input(k) => block.input(k),
    };
    apply(isa, last, arg, out);
}

/// One op on a block, its operands found by `arg`.
fn apply<'a>(isa: Isa, op: &ChainOp, arg: impl Fn(Operand) -> Arg<'a>, dst: &mut [f32]) {
    match *op {
        ChainOp::Unary(u, a) => {
            if let Arg::Full(x) = arg(a) {
                unary_part(isa, u, x, dst);
            }
        }
        ChainOp::Binary(b, x, y) => binary_block(isa, b, arg(x), arg(y), dst),
    }
}

fn binary_block(isa: Isa, op: BinaryOp, a: Arg<'_>, b: Arg<'_>, dst: &mut [f32]) {
    let (layout, a, b) = match (a, b) {
        (Arg::Full(a), Arg::Full(b)) => (Layout::Same, a, b),
        (Arg::Scalar(a), Arg::Full(b)) => (Layout::ScalarA, a, b),
        (Arg::Full(a), Arg::Scalar(b)) => (Layout::ScalarB, a, b),
        (Arg::Row(a, inner), Arg::Full(b)) => (Layout::RowA { inner }, a, b),
        (Arg::Full(a), Arg::Row(b, inner)) => (Layout::RowB { inner }, a, b),
        // `check` refused chains with such ops.
        _ => return,
    };
    binary_f32_isa(isa, op, &layout, a, b, dst);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accesses_from_shapes() {
        let a = |out: &[usize], input: &[usize]| Access::for_shapes(out, input);
        assert_eq!(a(&[4, 8], &[4, 8]), Some(Access::Full));
        assert_eq!(a(&[4, 8], &[1, 8]), Some(Access::Row(8)));
        assert_eq!(a(&[4, 6, 10], &[6, 10]), Some(Access::Row(60)));
        assert_eq!(a(&[4, 8], &[]), Some(Access::Scalar));
        assert_eq!(
            a(&[2, 6, 5, 5], &[6, 1, 1]),
            Some(Access::Channel { count: 6, inner: 25 })
        );
        assert_eq!(
            a(&[1, 6, 5, 5], &[1, 6, 1, 1]),
            Some(Access::Channel { count: 6, inner: 25 })
        );
        assert_eq!(a(&[4, 8], &[4, 1]), Some(Access::Channel { count: 4, inner: 8 }));
        // Size-1 output dims do not split a run.
        assert_eq!(a(&[1, 4, 1, 8], &[4, 1, 8]), Some(Access::Full));
        assert_eq!(a(&[2, 4, 1, 8], &[4, 1, 8]), Some(Access::Row(32)));
        assert_eq!(a(&[4, 3, 8], &[4, 1, 8]), None);
        assert_eq!(a(&[4, 8], &[2, 8]), None);
    }

    #[test]
    fn blocks_cover_the_range_in_whole_rows_or_pieces_of_one() {
        for (rows, inner) in [(7, 1), (3, 33), (5, 1000), (2, 1024), (3, 1025), (2, 3000)] {
            let n = rows * inner;
            let mut at = 0;
            for b in blocks(0..n, inner) {
                assert_eq!(b.start, at, "{rows} x {inner}");
                assert!(!b.is_empty() && b.len() <= BLOCK);
                if inner <= BLOCK {
                    assert_eq!(b.start % inner, 0);
                    assert!(b.len() % inner == 0 || b.end == n);
                } else {
                    assert_eq!(b.start / inner, (b.end - 1) / inner, "{b:?} crosses a row");
                }
                at = b.end;
            }
            assert_eq!(at, n);
        }
    }

    #[test]
    fn no_op_writes_a_slot_it_reads_and_linear_chains_need_two() {
        use Operand::*;
        let relu = |o| ChainOp::Unary(UnaryOp::Relu, o);
        let add = |a, b| ChainOp::Binary(BinaryOp::Add, a, b);
        let linear = [relu(Input(0)), relu(Result(0)), relu(Result(1)), relu(Result(2))];
        // Each op reads the last result and writes the other buffer.
        assert_eq!(Slots::new(&linear).count, 2);
        let tree = [
            relu(Input(0)),
            relu(Input(0)),
            add(Result(0), Result(1)),
            relu(Input(0)),
            add(Result(2), Result(3)),
            relu(Input(0)),
            add(Result(4), Result(5)),
        ];
        let slots = Slots::new(&tree);
        assert!(slots.count <= 3, "{}", slots.count);
        for (i, op) in tree.iter().enumerate().take(tree.len() - 1) {
            for o in op.operands() {
                if let Result(j) = o {
                    assert_ne!(
                        slots.of[i], slots.of[j],
                        "op {i} writes the slot of {j}, which it reads"
                    );
                }
            }
        }
    }

    #[test]
    fn check_refuses_what_run_could_not_do() {
        use Operand::*;
        let relu = |o| ChainOp::Unary(UnaryOp::Relu, o);
        let mul = |a, b| ChainOp::Binary(BinaryOp::Mul, a, b);
        let full = (Access::Full, 12);
        let row = (Access::Row(4), 4);
        assert!(check(&[mul(Input(0), Input(1)), relu(Result(0))], &[full, row], 12).is_ok());
        let channel = (Access::Channel { count: 2, inner: 3 }, 2);
        assert!(check(&[mul(Input(0), Input(1))], &[channel, full], 12).is_ok());
        for (ops, inputs) in [
            (vec![], vec![full]),
            (vec![relu(Input(0)); MAX_CHAIN_OPS + 1], vec![full]),
            (vec![relu(Result(0))], vec![full]),
            (vec![relu(Input(1))], vec![full]),
            (vec![relu(Input(0))], vec![row]),
            (vec![mul(Input(0), Input(1))], vec![row, (Access::Scalar, 1)]),
            (vec![mul(Input(0), Input(1))], vec![full, (Access::Row(5), 5)]),
            (
                vec![mul(Input(0), Input(1))],
                vec![full, (Access::Row(3), 3), (Access::Row(4), 4)],
            ),
            (vec![ChainOp::Unary(UnaryOp::IsNaN, Input(0))], vec![full]),
            (
                vec![mul(Input(0), Input(1))],
                vec![full, (Access::Channel { count: 2, inner: 5 }, 2)],
            ),
            (
                vec![mul(Input(0), Input(1))],
                vec![full, (Access::Channel { count: 3, inner: 2 }, 2)],
            ),
            (
                vec![mul(Input(0), Input(1))],
                vec![full, (Access::Channel { count: 0, inner: 2 }, 0)],
            ),
            (vec![relu(Input(0))], vec![channel]),
            (
                vec![ChainOp::Binary(BinaryOp::PRelu, Input(0), Input(1))],
                vec![full, full],
            ),
        ] {
            assert!(check(&ops, &inputs, 12).is_err(), "{ops:?} {inputs:?}");
        }
    }
}
