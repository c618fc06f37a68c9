//! Compute kernels, one variant per [`Target`].
//!
//! The loops live once, in `elementwise`, as `#[inline(always)]` generics.
//! `isa_variant!` compiles them again inside `#[target_feature]` functions so
//! LLVM vectorises them for AVX2 and AVX-512. Which variant runs is decided by
//! the program's target alone, through an [`Isa`] token that can only exist
//! when this CPU supports the target: that is what makes the `unsafe` calls
//! to the `#[target_feature]` functions sound.

mod elementwise;
pub mod layout;

pub use layout::{Layout, Strided};

use crate::error::{Error, Result};
use crate::ir::Op;
use crate::target::Target;

/// A unary elementwise op.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum UnaryOp {
    Relu,
    Sigmoid,
    Tanh,
    Neg,
    Abs,
    Sqrt,
    Exp,
}

/// A binary elementwise op with broadcasting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
}

impl UnaryOp {
    pub fn from_op(op: Op) -> Option<UnaryOp> {
        Some(match op {
            Op::Relu => UnaryOp::Relu,
            Op::Sigmoid => UnaryOp::Sigmoid,
            Op::Tanh => UnaryOp::Tanh,
            Op::Neg => UnaryOp::Neg,
            Op::Abs => UnaryOp::Abs,
            Op::Sqrt => UnaryOp::Sqrt,
            Op::Exp => UnaryOp::Exp,
            _ => return None,
        })
    }
}

impl BinaryOp {
    pub fn from_op(op: Op) -> Option<BinaryOp> {
        Some(match op {
            Op::Add => BinaryOp::Add,
            Op::Sub => BinaryOp::Sub,
            Op::Mul => BinaryOp::Mul,
            Op::Div => BinaryOp::Div,
            _ => return None,
        })
    }
}

/// Proof that this CPU can run `target`'s kernels. Only [`Isa::new`] makes one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Isa(Target);

impl Isa {
    /// `None` when this CPU lacks the instructions `target`'s kernels use.
    pub fn new(target: Target) -> Option<Isa> {
        target.can_run_on(Target::cpu_best()).then_some(Isa(target))
    }

    pub fn target(self) -> Target {
        self.0
    }
}

/// `dst[i] = op(src[i])`.
#[allow(unsafe_code)] // calls the ISA variants, see SAFETY below
pub fn unary(isa: Isa, op: UnaryOp, src: &[f32], dst: &mut [f32]) -> Result<()> {
    if src.len() != dst.len() {
        return Err(length_error(format_args!(
            "{op:?} reads {} elements but writes {}",
            src.len(),
            dst.len()
        )));
    }
    match isa.0 {
        // SAFETY: `Isa::new` checked that this CPU has AVX-512F/BW/VL and FMA.
        #[cfg(target_arch = "x86_64")]
        Target::Avx512 => unsafe { avx512::unary(op, src, dst) },
        // SAFETY: `Isa::new` checked that this CPU has AVX2 and FMA.
        #[cfg(target_arch = "x86_64")]
        Target::Avx2 => unsafe { avx2::unary(op, src, dst) },
        _ => generic::unary(op, src, dst),
    }
    Ok(())
}

/// `dst = a op b`, broadcast as `layout` says.
#[allow(unsafe_code)] // calls the ISA variants, see SAFETY below
pub fn binary(isa: Isa, op: BinaryOp, layout: &Layout, a: &[f32], b: &[f32], dst: &mut [f32]) -> Result<()> {
    if !layout.fits(a.len(), b.len(), dst.len()) {
        return Err(length_error(format_args!(
            "{op:?} with layout {layout:?} cannot read {} and {} elements into {}",
            a.len(),
            b.len(),
            dst.len()
        )));
    }
    if dst.is_empty() {
        return Ok(());
    }
    match isa.0 {
        // SAFETY: `Isa::new` checked that this CPU has AVX-512F/BW/VL and FMA.
        #[cfg(target_arch = "x86_64")]
        Target::Avx512 => unsafe { avx512::binary(op, layout, a, b, dst) },
        // SAFETY: `Isa::new` checked that this CPU has AVX2 and FMA.
        #[cfg(target_arch = "x86_64")]
        Target::Avx2 => unsafe { avx2::binary(op, layout, a, b, dst) },
        _ => generic::binary(op, layout, a, b, dst),
    }
    Ok(())
}

/// `dst = src`.
pub fn copy(src: &[f32], dst: &mut [f32]) -> Result<()> {
    if src.len() != dst.len() {
        return Err(length_error(format_args!(
            "copy of {} elements into {}",
            src.len(),
            dst.len()
        )));
    }
    dst.copy_from_slice(src);
    Ok(())
}

/// Mismatched lengths here mean a corrupt program, not bad user input.
fn length_error(what: std::fmt::Arguments<'_>) -> Error {
    Error::runtime(format!("kiln kernel given inconsistent buffers: {what}"))
}

/// Baseline build of the loops (SSE2 on x86_64).
mod generic {
    use super::{elementwise, BinaryOp, Layout, UnaryOp};

    pub(super) fn unary(op: UnaryOp, src: &[f32], dst: &mut [f32]) {
        elementwise::unary(op, src, dst)
    }

    pub(super) fn binary(op: BinaryOp, layout: &Layout, a: &[f32], b: &[f32], dst: &mut [f32]) {
        elementwise::binary(op, layout, a, b, dst)
    }
}

/// The loops compiled with `$features` enabled.
macro_rules! isa_variant {
    ($module:ident, $features:literal) => {
        #[cfg(target_arch = "x86_64")]
        #[allow(unsafe_code)] // target_feature functions are unsafe to call
        mod $module {
            use super::{elementwise, BinaryOp, Layout, UnaryOp};

            /// # Safety
            /// The CPU must support the module's target features.
            #[target_feature(enable = $features)]
            pub(super) unsafe fn unary(op: UnaryOp, src: &[f32], dst: &mut [f32]) {
                elementwise::unary(op, src, dst)
            }

            /// # Safety
            /// The CPU must support the module's target features.
            #[target_feature(enable = $features)]
            pub(super) unsafe fn binary(op: BinaryOp, layout: &Layout, a: &[f32], b: &[f32], dst: &mut [f32]) {
                elementwise::binary(op, layout, a, b, dst)
            }
        }
    };
}

isa_variant!(avx2, "avx2,fma");
isa_variant!(avx512, "avx512f,avx512bw,avx512vl,fma");

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::broadcast_shapes;

    /// Every target this machine can run.
    fn isas() -> Vec<Isa> {
        let isas: Vec<Isa> = Target::ALL.into_iter().filter_map(Isa::new).collect();
        assert!(isas.iter().any(|i| i.target() == Target::Generic));
        isas
    }

    /// Deterministic values in [-4, 4), with a few special ones up front.
    fn data(n: usize, seed: u32) -> Vec<f32> {
        let mut state = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
        (0..n)
            .map(|i| match i {
                0 => 0.0,
                1 => -0.5,
                _ => {
                    state ^= state << 13;
                    state ^= state >> 17;
                    state ^= state << 5;
                    (state % 8000) as f32 / 1000.0 - 4.0
                }
            })
            .collect()
    }

    fn close(got: f32, want: f32) -> bool {
        (got.is_nan() && want.is_nan()) || (got - want).abs() <= 1e-6 * want.abs().max(1e-30)
    }

    fn unary_ref(op: UnaryOp, x: f32) -> f32 {
        let x = x as f64;
        let y = match op {
            UnaryOp::Relu => x.max(0.0),
            UnaryOp::Sigmoid => 1.0 / (1.0 + (-x).exp()),
            UnaryOp::Tanh => x.tanh(),
            UnaryOp::Neg => -x,
            UnaryOp::Abs => x.abs(),
            UnaryOp::Sqrt => x.sqrt(),
            UnaryOp::Exp => x.exp(),
        };
        y as f32
    }

    fn binary_ref(op: BinaryOp, a: f32, b: f32) -> f32 {
        match op {
            BinaryOp::Add => a + b,
            BinaryOp::Sub => a - b,
            BinaryOp::Mul => a * b,
            BinaryOp::Div => a / b,
        }
    }

    const UNARY: [UnaryOp; 7] = [
        UnaryOp::Relu,
        UnaryOp::Sigmoid,
        UnaryOp::Tanh,
        UnaryOp::Neg,
        UnaryOp::Abs,
        UnaryOp::Sqrt,
        UnaryOp::Exp,
    ];
    const BINARY: [BinaryOp; 4] = [BinaryOp::Add, BinaryOp::Sub, BinaryOp::Mul, BinaryOp::Div];

    #[test]
    fn unary_ops_match_reference() {
        // 67 covers full vectors of every width plus a tail.
        let x = data(67, 1);
        for isa in isas() {
            for op in UNARY {
                let mut y = vec![f32::NAN; x.len()];
                unary(isa, op, &x, &mut y).unwrap();
                for (i, (&xi, &yi)) in x.iter().zip(&y).enumerate() {
                    let want = unary_ref(op, xi);
                    assert!(close(yi, want), "{isa:?} {op:?}({xi}) [{i}] = {yi}, want {want}");
                }
            }
        }
    }

    #[test]
    fn sigmoid_and_exp_extremes() {
        let x = [-1000.0, -100.0, -20.0, 20.0, 100.0, 1000.0, f32::NEG_INFINITY];
        for isa in isas() {
            let mut y = [0.0; 7];
            unary(isa, UnaryOp::Sigmoid, &x, &mut y).unwrap();
            assert_eq!(y[0], 0.0);
            assert!(close(y[2], unary_ref(UnaryOp::Sigmoid, -20.0)));
            assert_eq!(&y[3..6], &[1.0, 1.0, 1.0]);
            assert_eq!(y[6], 0.0);
            assert!(y.iter().all(|v| v.is_finite()));
            unary(isa, UnaryOp::Exp, &x, &mut y).unwrap();
            assert_eq!(y[5], f32::INFINITY);
            unary(isa, UnaryOp::Relu, &[f32::NAN, -1.0], &mut y[..2]).unwrap();
            assert!(y[0].is_nan() && y[1] == 0.0);
        }
    }

    /// Naive broadcast by multi-index, the definition kiln must match.
    fn broadcast_ref(op: BinaryOp, sa: &[usize], a: &[f32], sb: &[usize], b: &[f32]) -> Vec<f32> {
        let out = broadcast_shapes(sa, sb).unwrap();
        let n: usize = out.iter().product();
        let index = |shape: &[usize], mut flat: usize| {
            // Map an output flat index to an input's flat index.
            let pad = out.len() - shape.len();
            let (mut idx, mut stride) = (0, 1);
            for d in (0..out.len()).rev() {
                let i = flat % out[d];
                flat /= out[d];
                if d >= pad && shape[d - pad] != 1 {
                    idx += i * stride;
                }
                if d >= pad {
                    stride *= shape[d - pad];
                }
            }
            idx
        };
        (0..n)
            .map(|i| binary_ref(op, a[index(sa, i)], b[index(sb, i)]))
            .collect()
    }

    fn check_broadcast(sa: &[usize], sb: &[usize]) {
        let na: usize = sa.iter().product();
        let nb: usize = sb.iter().product();
        let a = data(na, 3);
        // Keep divisors away from zero so Div compares cleanly.
        let b: Vec<f32> = data(nb, 7).iter().map(|v| v + 5.0).collect();
        let layout = Layout::for_shapes(sa, sb).unwrap();
        for isa in isas() {
            for op in BINARY {
                let want = broadcast_ref(op, sa, &a, sb, &b);
                let mut got = vec![f32::NAN; want.len()];
                binary(isa, op, &layout, &a, &b, &mut got).unwrap();
                assert_eq!(got, want, "{isa:?} {op:?} {sa:?} op {sb:?} via {layout:?}");
            }
        }
    }

    #[test]
    fn broadcasting_matches_reference() {
        let cases: &[(&[usize], &[usize])] = &[
            (&[2, 3, 4], &[2, 3, 4]),
            (&[2, 3, 4], &[3, 1]),
            (&[2, 3, 4], &[4]),
            (&[2, 3, 4], &[]),
            (&[], &[2, 3, 4]),
            (&[2, 3, 4], &[1, 1, 4]),
            (&[2, 3, 4], &[2, 1, 4]),
            (&[3, 1], &[2, 3, 4]),
            (&[4], &[2, 3, 4]),
            (&[2, 1], &[1, 3]),
            (&[5, 1, 3, 1], &[1, 4, 1, 6]),
            (&[6, 1], &[6, 37]),
            (&[3, 37], &[37]),
            (&[], &[]),
            (&[1], &[1, 1]),
        ];
        for (sa, sb) in cases {
            check_broadcast(sa, sb);
        }
    }

    #[test]
    fn empty_tensors_are_fine() {
        let layout = Layout::for_shapes(&[0, 3], &[3]).unwrap();
        for isa in isas() {
            binary(isa, BinaryOp::Add, &layout, &[], &[1.0; 3], &mut []).unwrap();
            unary(isa, UnaryOp::Exp, &[], &mut []).unwrap();
        }
    }

    #[test]
    fn inconsistent_buffers_are_errors() {
        let isa = Isa::new(Target::Generic).unwrap();
        assert!(unary(isa, UnaryOp::Neg, &[1.0; 3], &mut [0.0; 2]).is_err());
        let layout = Layout::for_shapes(&[2, 3], &[3]).unwrap();
        let e = binary(isa, BinaryOp::Add, &layout, &[1.0; 6], &[1.0; 2], &mut [0.0; 6]);
        assert_eq!(e.unwrap_err().kind, crate::error::ErrorKind::Runtime);
        assert!(copy(&[1.0; 3], &mut [0.0; 4]).is_err());
    }

    #[test]
    fn isa_requires_cpu_support() {
        for t in Target::ALL {
            assert_eq!(Isa::new(t).is_some(), t.can_run_on(Target::cpu_best()));
        }
    }

    #[test]
    fn op_mapping_covers_ir_ops() {
        for &op in Op::ALL {
            let mapped = UnaryOp::from_op(op).is_some() as u8 + BinaryOp::from_op(op).is_some() as u8;
            assert_eq!(mapped, (op != Op::Identity) as u8, "{op:?}");
        }
    }
}
