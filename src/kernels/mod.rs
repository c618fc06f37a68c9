//! Compute kernels, one variant per [`Target`].
//!
//! The loops live once (`elementwise`, `norm`) as `#[inline(always)]`
//! generics. `isa_kernels!` compiles them again inside `#[target_feature]`
//! functions so LLVM vectorises them for AVX2 and AVX-512. Which variant runs
//! is decided by the program's target alone, through an [`Isa`] token that
//! can only exist when this CPU supports the target: that is what makes the
//! `unsafe` calls to the `#[target_feature]` functions sound.
//!
//! Big steps are split over a [`parallel::Parallel`] by rows; the GEMM
//! ([`gemm`]) parallelises itself.

pub mod attention;
mod attention_short;
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod avx2;
#[cfg(target_arch = "x86_64")]
#[allow(unsafe_code)]
mod avx2_math;
pub mod cache;
// Elementwise chains in one pass (issue #14).
pub mod chain;
pub mod conv;
pub mod conv_direct;
pub mod conv_transpose;
pub mod depthwise;
mod elementwise;
// Embeddings + LayerNorm (issue #14).
pub mod embed;
pub mod gemm;
pub mod half;
pub mod index;
pub mod layout;
pub mod math;
pub mod movement;
mod norm;
pub mod parallel;
pub mod recurrent;
pub mod spatial;
pub mod transpose;
pub mod winograd;
// Pools and resize (issue #13).
pub mod pool;
pub mod resize;
// Normalisation and selection kernels of issue #13.
pub mod channel_norm;
pub mod select;

pub use layout::{Layout, Strided};
pub use movement::{cast_f32_i32, cast_f32_i64, CopyPlan, Where3};

use std::ops::Range;

use crate::error::{Error, Result};
use crate::target::Target;
use crate::tensor::DType;
use parallel::Parallel;

/// A unary elementwise op: f32 to f32, except the tests at the end
/// ([`UnaryOp::src_dtype`], [`UnaryOp::dst_dtype`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum UnaryOp {
    Relu,
    Sigmoid,
    Tanh,
    Neg,
    Abs,
    Sqrt,
    Exp,
    Log,
    Erf,
    Reciprocal,
    LeakyRelu(f32),
    /// `min(max(x, lo), hi)`.
    Clip(f32, f32),
    /// `x/2·(1 + erf(x/√2))`.
    Gelu,
    /// `x/2·(1 + tanh(√(2/π)(x + 0.044715x³)))`.
    GeluTanh,
    /// [`UnaryOp::Gelu`] fused from `(x·(1 + erf(x/√2)))·0.5` as exporters
    /// write it: `+inf` for `x > FLT_MAX/2`, where that product overflows
    /// before the halving (as ORT running the ops gives).
    GeluWritten,
    /// [`UnaryOp::GeluTanh`] fused from `(x·(1 + tanh(…)))·0.5`, see [`UnaryOp::GeluWritten`].
    GeluTanhWritten,
    // Elementwise math, comparisons and logic (issue #12).
    Floor,
    Ceil,
    /// Halves to even.
    Round,
    Sin,
    Cos,
    /// -1, 0 or 1; NaN stays NaN (as ORT).
    Sign,
    /// `ln(1 + eˣ)`.
    Softplus,
    /// `x·tanh(softplus(x))`.
    Mish,
    /// bool to bool.
    Not,
    /// f32 to bool.
    IsNaN,
    /// f32 to bool: which infinities count.
    IsInf {
        negative: bool,
        positive: bool,
    },
    // Activations (issue #13).
    /// `max(0, min(1, alpha·x + beta))`.
    HardSigmoid(f32, f32),
    /// `x·max(0, min(1, x/6 + 1/2))`.
    HardSwish,
    /// `x·sigmoid(x)`, fused from `Mul(x, Sigmoid(x))` (YOLOv8's SiLU).
    Silu,
    /// `x ≥ 0 ? x : alpha·(eˣ - 1)`.
    Elu(f32),
    /// `x > 0 ? gamma·x : gamma·(alpha·eˣ - alpha)`: (alpha, gamma).
    Selu(f32, f32),
    /// `max(0, x) + min(0, alpha·(e^(x/alpha) - 1))`.
    Celu(f32),
    /// `x > alpha ? x : 0` (NaN gives 0, as in ORT).
    ThresholdedRelu(f32),
    /// `x / (1 + |x|)`.
    Softsign,
}

impl UnaryOp {
    /// The ONNX op type this computes (`Gelu` for both GELUs).
    pub fn onnx_name(self) -> &'static str {
        match self {
            UnaryOp::Relu => "Relu",
            UnaryOp::Sigmoid => "Sigmoid",
            UnaryOp::Tanh => "Tanh",
            UnaryOp::Neg => "Neg",
            UnaryOp::Abs => "Abs",
            UnaryOp::Sqrt => "Sqrt",
            UnaryOp::Exp => "Exp",
            UnaryOp::Log => "Log",
            UnaryOp::Erf => "Erf",
            UnaryOp::Reciprocal => "Reciprocal",
            UnaryOp::LeakyRelu(_) => "LeakyRelu",
            UnaryOp::Clip(..) => "Clip",
            UnaryOp::Gelu | UnaryOp::GeluTanh | UnaryOp::GeluWritten | UnaryOp::GeluTanhWritten => "Gelu",
            UnaryOp::Floor => "Floor",
            UnaryOp::Ceil => "Ceil",
            UnaryOp::Round => "Round",
            UnaryOp::Sin => "Sin",
            UnaryOp::Cos => "Cos",
            UnaryOp::Sign => "Sign",
            UnaryOp::Softplus => "Softplus",
            UnaryOp::Mish => "Mish",
            UnaryOp::Not => "Not",
            UnaryOp::IsNaN => "IsNaN",
            UnaryOp::IsInf { .. } => "IsInf",
            UnaryOp::HardSigmoid(..) => "HardSigmoid",
            UnaryOp::HardSwish => "HardSwish",
            UnaryOp::Silu => "Silu",
            UnaryOp::Elu(_) => "Elu",
            UnaryOp::Selu(..) => "Selu",
            UnaryOp::Celu(_) => "Celu",
            UnaryOp::ThresholdedRelu(_) => "ThresholdedRelu",
            UnaryOp::Softsign => "Softsign",
        }
    }

    /// The element type the op reads.
    pub fn src_dtype(self) -> DType {
        match self {
            UnaryOp::Not => DType::Bool,
            _ => DType::F32,
        }
    }

    /// The element type the op writes.
    pub fn dst_dtype(self) -> DType {
        match self {
            UnaryOp::Not | UnaryOp::IsNaN | UnaryOp::IsInf { .. } => DType::Bool,
            _ => DType::F32,
        }
    }
}

/// A binary elementwise op with broadcasting.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BinaryOp {
    Add,
    Sub,
    Mul,
    Div,
    /// f32 only.
    Pow,
    // Elementwise math, comparisons and logic (issue #12).
    /// Propagates NaN; on ties the first input.
    Max,
    Min,
    /// Integer remainder with the divisor's sign (`Mod` with `fmod=0`).
    Mod,
    /// Remainder with the dividend's sign, C's `fmod` (`Mod` with `fmod=1`).
    Fmod,
    /// Comparisons: bool results.
    Equal,
    Greater,
    Less,
    GreaterOrEqual,
    LessOrEqual,
    /// Connectives of bools.
    And,
    Or,
    Xor,
    // Activations (issue #13).
    /// `x < 0 ? x·slope : x`, the slope broadcast to x (f32 only).
    PRelu,
}

impl BinaryOp {
    pub fn onnx_name(self) -> &'static str {
        match self {
            BinaryOp::Add => "Add",
            BinaryOp::Sub => "Sub",
            BinaryOp::Mul => "Mul",
            BinaryOp::Div => "Div",
            BinaryOp::Pow => "Pow",
            BinaryOp::Max => "Max",
            BinaryOp::Min => "Min",
            BinaryOp::Mod | BinaryOp::Fmod => "Mod",
            BinaryOp::Equal => "Equal",
            BinaryOp::Greater => "Greater",
            BinaryOp::Less => "Less",
            BinaryOp::GreaterOrEqual => "GreaterOrEqual",
            BinaryOp::LessOrEqual => "LessOrEqual",
            BinaryOp::And => "And",
            BinaryOp::Or => "Or",
            BinaryOp::Xor => "Xor",
            BinaryOp::PRelu => "PRelu",
        }
    }

    /// Whether the op reads inputs of `dtype` (both inputs have it).
    pub fn accepts(self, dtype: DType) -> bool {
        use BinaryOp::*;
        if dtype == DType::F16 {
            // ORT computes float16 ops in float over whole groups of nodes;
            // kiln leaves them to it (see `ir::check::F16_ARITHMETIC`).
            return false;
        }
        match self {
            Add | Sub | Mul | Div | Max | Min | Fmod | Greater | Less | GreaterOrEqual | LessOrEqual => {
                dtype != DType::Bool
            }
            Pow | PRelu => dtype == DType::F32,
            // ORT runs integer Mod with fmod=0 only (floats need fmod=1).
            Mod => dtype.is_int(),
            Equal => true,
            And | Or | Xor => dtype == DType::Bool,
        }
    }

    /// Whether the op writes bools whatever it reads.
    pub fn is_comparison(self) -> bool {
        use BinaryOp::*;
        matches!(self, Equal | Greater | Less | GreaterOrEqual | LessOrEqual)
    }

    /// The element type the op writes from inputs of `dtype`.
    pub fn dst_dtype(self, dtype: DType) -> DType {
        if self.is_comparison() {
            DType::Bool
        } else {
            dtype
        }
    }
}

/// How a reduction combines values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ReduceKind {
    Sum,
    Mean,
    Max,
}

impl ReduceKind {
    pub fn onnx_name(self) -> &'static str {
        match self {
            ReduceKind::Sum => "ReduceSum",
            ReduceKind::Mean => "ReduceMean",
            ReduceKind::Max => "ReduceMax",
        }
    }
}

/// A read-only tensor of one of the element types that cross kiln's
/// boundary (bool as one byte, 0 or 1; float16 as its bit pattern).
#[derive(Clone, Copy, Debug)]
pub enum TensorRef<'a> {
    F32(&'a [f32]),
    I64(&'a [i64]),
    I32(&'a [i32]),
    Bool(&'a [u8]),
    F16(&'a [u16]),
}

impl Default for TensorRef<'_> {
    /// An empty tensor (a placeholder in per-Run lists).
    fn default() -> Self {
        TensorRef::F32(&[])
    }
}

/// A writable tensor, see [`TensorRef`].
#[derive(Debug)]
pub enum TensorMut<'a> {
    F32(&'a mut [f32]),
    I64(&'a mut [i64]),
    I32(&'a mut [i32]),
    Bool(&'a mut [u8]),
    F16(&'a mut [u16]),
}

impl Default for TensorMut<'_> {
    /// An empty tensor (a placeholder in per-Run lists).
    fn default() -> Self {
        TensorMut::F32(&mut [])
    }
}

impl TensorRef<'_> {
    /// ONNX element type code.
    pub fn elem_type(&self) -> i32 {
        match self {
            TensorRef::F32(_) => 1,
            TensorRef::I64(_) => 7,
            TensorRef::I32(_) => 6,
            TensorRef::Bool(_) => 9,
            TensorRef::F16(_) => 10,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            TensorRef::F32(s) => s.len(),
            TensorRef::I64(s) => s.len(),
            TensorRef::I32(s) => s.len(),
            TensorRef::Bool(s) => s.len(),
            TensorRef::F16(s) => s.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn bytes(&self) -> &[u8] {
        match self {
            TensorRef::F32(s) => bytemuck::cast_slice(s),
            TensorRef::I64(s) => bytemuck::cast_slice(s),
            TensorRef::I32(s) => bytemuck::cast_slice(s),
            TensorRef::Bool(s) => s,
            TensorRef::F16(s) => bytemuck::cast_slice(s),
        }
    }
}

impl TensorMut<'_> {
    pub fn elem_type(&self) -> i32 {
        match self {
            TensorMut::F32(_) => 1,
            TensorMut::I64(_) => 7,
            TensorMut::I32(_) => 6,
            TensorMut::Bool(_) => 9,
            TensorMut::F16(_) => 10,
        }
    }

    pub fn len(&self) -> usize {
        match self {
            TensorMut::F32(s) => s.len(),
            TensorMut::I64(s) => s.len(),
            TensorMut::I32(s) => s.len(),
            TensorMut::Bool(s) => s.len(),
            TensorMut::F16(s) => s.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn bytes_mut(&mut self) -> &mut [u8] {
        match self {
            TensorMut::F32(s) => bytemuck::cast_slice_mut(s),
            TensorMut::I64(s) => bytemuck::cast_slice_mut(s),
            TensorMut::I32(s) => bytemuck::cast_slice_mut(s),
            TensorMut::Bool(s) => s,
            TensorMut::F16(s) => bytemuck::cast_slice_mut(s),
        }
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

/// For each `fn name(args) => implementation;` defines `name(isa, args)`,
/// which runs the implementation compiled for `isa`'s target. In each
/// build, `Madd` names how it multiply-adds ([`math::MulAdd`]): an
/// implementation written `f::<Madd>` gets fused multiply-adds where the
/// target has them.
macro_rules! isa_kernels {
    ($(fn $name:ident($($arg:ident: $ty:ty),* $(,)?) => $imp:path;)*) => {
        /// Baseline build of the loops (SSE2 on x86_64).
        mod generic_isa {
            #[allow(unused_imports)]
            use super::*;
            /// How this build's polynomials multiply-add: no FMA here.
            #[allow(dead_code)]
            type Madd = super::math::Plain;
            $(
                #[inline(never)]
                pub(super) fn $name($($arg: $ty),*) {
                    $imp($($arg),*)
                }
            )*
        }

        isa_kernels!(@variant avx2_isa, "avx2,fma", $($name($($arg: $ty),*) => $imp;)*);
        isa_kernels!(@variant avx512_isa, "avx512f,avx512bw,avx512vl,fma", $($name($($arg: $ty),*) => $imp;)*);

        $(
            #[allow(unsafe_code)] // calls the ISA variants, see SAFETY below
            #[allow(clippy::too_many_arguments)]
            fn $name(isa: Isa, $($arg: $ty),*) {
                match isa.0 {
                    // SAFETY: `Isa::new` checked that this CPU has AVX-512F/BW/VL and FMA.
                    #[cfg(target_arch = "x86_64")]
                    Target::Avx512 => unsafe { avx512_isa::$name($($arg),*) },
                    // SAFETY: `Isa::new` checked that this CPU has AVX2 and FMA.
                    #[cfg(target_arch = "x86_64")]
                    Target::Avx2 => unsafe { avx2_isa::$name($($arg),*) },
                    _ => generic_isa::$name($($arg),*),
                }
            }
        )*
    };
    (@variant $module:ident, $features:literal, $($name:ident($($arg:ident: $ty:ty),*) => $imp:path;)*) => {
        /// The loops compiled with `$features` enabled.
        #[cfg(target_arch = "x86_64")]
        #[allow(unsafe_code)] // target_feature functions are unsafe to call
        mod $module {
            #[allow(unused_imports)]
            use super::*;
            /// How this build's polynomials multiply-add: both builds have FMA.
            #[allow(dead_code)]
            type Madd = super::math::Fused;
            $(
                /// # Safety
                /// The CPU must support the module's target features.
                #[target_feature(enable = $features)]
                pub(super) unsafe fn $name($($arg: $ty),*) {
                    $imp($($arg),*)
                }
            )*
        }
    };
}

isa_kernels! {
    fn unary_isa(op: UnaryOp, src: &[f32], dst: &mut [f32]) => elementwise::unary;
    fn binary_f32_isa(op: BinaryOp, layout: &Layout, a: &[f32], b: &[f32], dst: &mut [f32]) => elementwise::binary_f32;
    fn binary_i64_isa(op: BinaryOp, layout: &Layout, a: &[i64], b: &[i64], dst: &mut [i64]) => elementwise::binary_i64;
    fn binary_i32_isa(op: BinaryOp, layout: &Layout, a: &[i32], b: &[i32], dst: &mut [i32]) => elementwise::binary_i32;
    fn unary_to_bool_isa(op: UnaryOp, src: &[f32], dst: &mut [u8]) => elementwise::unary_to_bool;
    fn compare_f32_isa(op: BinaryOp, layout: &Layout, a: &[f32], b: &[f32], dst: &mut [u8]) => elementwise::compare_f32;
    fn compare_i64_isa(op: BinaryOp, layout: &Layout, a: &[i64], b: &[i64], dst: &mut [u8]) => elementwise::compare_i64;
    fn compare_i32_isa(op: BinaryOp, layout: &Layout, a: &[i32], b: &[i32], dst: &mut [u8]) => elementwise::compare_i32;
    fn binary_bool_isa(op: BinaryOp, layout: &Layout, a: &[u8], b: &[u8], dst: &mut [u8]) => elementwise::binary_bool;
    // Activations after a kernel's own store (convolutions): the baseline
    // build ran SiLU at a third of a convolution's speed.
    fn activate_isa(act: gemm::Activation, row: &mut [f32]) => gemm::activate_with::<Madd>;
    fn softmax_isa(len: usize, inner: usize, shift: bool, src: &[f32], dst: &mut [f32]) => norm::softmax::<Madd>;
    fn short_heads_isa(blk: &attention_short::ShortBlock<'_>, scratch: &mut [f32], out: &mut [f32]) => attention_short::short_heads::<Madd>;
    fn embed_rows_isa(shape: &embed::EmbedShape<'_>, terms: &[embed::Term<'_>], scale: &[f32], bias: Option<&[f32]>, first: usize, dst: &mut [f32]) => embed::embed_rows;
    fn layer_norm_isa(len: usize, epsilon: f32, decomposed: bool, src: &[f32], scale: &[f32], bias: Option<&[f32]>, dst: &mut [f32]) => norm::layer_norm;
    fn reduce_isa(kind: ReduceKind, len: usize, inner: usize, src: &[f32], dst: &mut [f32]) => norm::reduce;
    fn rnn_gate_isa(f: recurrent::RnnActivation, clip: Option<f32>, x: &mut [f32]) => recurrent::gate;
    // Pools and resize (issue #13).
    fn pool_rows_isa(kind: pool::PoolKind, s: &pool::PoolShape, x: &[f32], first: usize, y: &mut [f32]) => pool::pool_rows;
    fn resize_rows_isa(r: &resize::ResizeAttrs, taps: &[resize::Taps; 2], c: (usize, usize), x: &[f32], first: usize, y: &mut [f32]) => resize::resize_rows;
}

/// Elements below which a step is not worth splitting over threads.
const PAR_MIN_ELEMS: usize = 1 << 15;

/// [`PAR_MIN_ELEMS`] for steps that spend several nanoseconds per element
/// (layer normalisation: three passes and an f64 sum; embeddings: rows
/// gathered from a table in memory): a transformer's 128 × 384 rows took
/// 35 and 140 µs on one core, and stayed there at two threads.
const PAR_MIN_HEAVY_ELEMS: usize = 1 << 13;

/// Splits `rows` rows of `dst` (each `row_len` elements) into contiguous
/// chunks and runs `f(rows, chunk)` for each, over `par` when it pays off.
fn par_rows<T: Send>(
    par: &dyn Parallel,
    rows: usize,
    row_len: usize,
    dst: &mut [T],
    f: &(dyn Fn(Range<usize>, &mut [T]) + Sync),
) {
    par_rows_of(par, rows, row_len, PAR_MIN_ELEMS, dst, f)
}

/// [`par_rows`] with tasks of at least `min_elems` elements.
fn par_rows_of<T: Send>(
    par: &dyn Parallel,
    rows: usize,
    row_len: usize,
    min_elems: usize,
    dst: &mut [T],
    f: &(dyn Fn(Range<usize>, &mut [T]) + Sync),
) {
    let total = rows.saturating_mul(row_len);
    let threads = par.threads();
    if threads <= 1 || total < 2 * min_elems || rows < 2 || row_len == 0 {
        return f(0..rows, dst);
    }
    let tasks = (threads * 4).min(rows).min(total / min_elems).max(2);
    let per = rows.div_ceil(tasks);
    let blocks = parallel::Blocks::new(dst.len(), dst.len(), per * row_len);
    // The last row may be shorter than `row_len` (strided outputs end
    // after their last pixel's values).
    parallel::for_each_block(par, dst, blocks, &|t, chunk| {
        f(t * per..t * per + chunk.len().div_ceil(row_len), chunk)
    });
}

/// Runs `f` with this thread's buffer `key`, kept between runs so that
/// steady-state runs do not allocate, or with a fresh one when the thread
/// already holds it (re-entered: a pool running another task while it waits).
pub(crate) fn with_thread_buffer<T: Default, R>(
    key: &'static std::thread::LocalKey<std::cell::RefCell<T>>,
    f: impl FnOnce(&mut T) -> R,
) -> R {
    key.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buf) => f(&mut buf),
        Err(_) => f(&mut T::default()),
    })
}

/// `dst[i] = op(src[i])`.
pub fn unary(isa: Isa, op: UnaryOp, src: &[f32], dst: &mut [f32], par: &dyn Parallel) -> Result<()> {
    if src.len() != dst.len() || op.src_dtype() != DType::F32 || op.dst_dtype() != DType::F32 {
        return Err(length_error(format_args!(
            "{op:?} reads {} elements but writes {}",
            src.len(),
            dst.len()
        )));
    }
    par_rows(par, dst.len(), 1, dst, &|r, d| unary_part(isa, op, &src[r], d));
    Ok(())
}

/// `dst[i] = op(src[i])` on one thread (f32 to f32, equal lengths).
fn unary_part(isa: Isa, op: UnaryOp, src: &[f32], dst: &mut [f32]) {
    if !unary_fma(isa, op, src, dst) && !unary_gelu(isa, op, src, dst) {
        unary_isa(isa, op, src, dst)
    }
}

/// A GELU as the GEMM epilogue computes it (FMA polynomials, where the
/// portable loop multiplies and adds apart), block by block, on the AVX2
/// and AVX-512 targets; false (nothing written) otherwise or for other ops.
fn unary_gelu(isa: Isa, op: UnaryOp, src: &[f32], dst: &mut [f32]) -> bool {
    /// Values per block: copied, then activated while in L1.
    const BLOCK: usize = 2048;
    let act = match op {
        UnaryOp::Gelu => gemm::Activation::GeluErf,
        UnaryOp::GeluTanh => gemm::Activation::GeluTanh,
        UnaryOp::GeluWritten => gemm::Activation::GeluErfWritten,
        UnaryOp::GeluTanhWritten => gemm::Activation::GeluTanhWritten,
        _ => return false,
    };
    if isa.target() == Target::Generic {
        return false;
    }
    for (d, s) in dst.chunks_mut(BLOCK).zip(src.chunks(BLOCK)) {
        d.copy_from_slice(s);
        activate_isa(isa, act, d);
    }
    true
}

/// `op` by `avx2_math` (two vectors at a time, FMA) if it has the op and
/// `isa` is the AVX2 or AVX-512 target; false (nothing written) otherwise.
fn unary_fma(isa: Isa, op: UnaryOp, src: &[f32], dst: &mut [f32]) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let f = match op {
            UnaryOp::Exp => avx2_math::Fun::Exp,
            UnaryOp::Sigmoid => avx2_math::Fun::Sigmoid,
            UnaryOp::Tanh => avx2_math::Fun::Tanh,
            UnaryOp::Silu => avx2_math::Fun::Silu,
            _ => return false,
        };
        avx2_math::map(isa, f, src, dst)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (isa, op, src, dst);
        false
    }
}

/// A recurrent gate's activation over `x`, clipped first (`recurrent::gate`).
pub(crate) fn rnn_gate(isa: Isa, f: recurrent::RnnActivation, clip: Option<f32>, x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if clip.is_none() {
        let fun = match f {
            recurrent::RnnActivation::Sigmoid => Some(avx2_math::Fun::Sigmoid),
            recurrent::RnnActivation::Tanh => Some(avx2_math::Fun::Tanh),
            _ => None,
        };
        if fun.is_some_and(|fun| avx2_math::map_in_place(isa, fun, x)) {
            return;
        }
    }
    rnn_gate_isa(isa, f, clip, x)
}

/// One LSTM step's cells for one batch row in one pass, default
/// activations only (`avx2_math::lstm_cells`): false (nothing written) where
/// the target has no such kernel.
pub(crate) fn lstm_cells(isa: Isa, pre: &[f32], xw: &[f32], c: &mut [f32], h: &mut [f32]) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        avx2_math::lstm_cells(isa, avx2_math::LstmRow { pre, xw, c, h })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (isa, pre, xw, c, h);
        false
    }
}

/// `dst[i] = op(src[i])` for the f32 tests (IsNaN, IsInf), bool results.
pub fn unary_to_bool(isa: Isa, op: UnaryOp, src: &[f32], dst: &mut [u8], par: &dyn Parallel) -> Result<()> {
    if src.len() != dst.len() || op.src_dtype() != DType::F32 || op.dst_dtype() != DType::Bool {
        return Err(length_error(format_args!(
            "{op:?} from {} f32 elements into {} bools",
            src.len(),
            dst.len()
        )));
    }
    par_rows(par, dst.len(), 1, dst, &|r, d| unary_to_bool_isa(isa, op, &src[r], d));
    Ok(())
}

/// `dst[i] = !src[i]` on bools.
pub fn not(src: &[u8], dst: &mut [u8]) -> Result<()> {
    if src.len() != dst.len() {
        return Err(length_error(format_args!(
            "Not of {} elements into {}",
            src.len(),
            dst.len()
        )));
    }
    for (d, &x) in dst.iter_mut().zip(src) {
        *d = u8::from(x == 0);
    }
    Ok(())
}

/// `dst = a op b` on f32, broadcast as `layout` says.
pub fn binary(
    isa: Isa,
    op: BinaryOp,
    layout: &Layout,
    a: &[f32],
    b: &[f32],
    dst: &mut [f32],
    par: &dyn Parallel,
) -> Result<()> {
    check_binary(op, DType::F32, DType::F32, layout, a.len(), b.len(), dst.len())?;
    par_binary(par, layout, a, b, dst, &|a, b, d| {
        binary_f32_isa(isa, op, layout, a, b, d)
    });
    Ok(())
}

/// A comparison (`op.is_comparison()`) of f32, i64 or i32 elements (as
/// bytes, `dtype` says which), or `Equal`/`And`/`Or`/`Xor` of bools: bool results.
#[allow(clippy::too_many_arguments)]
pub fn binary_to_bool(
    isa: Isa,
    op: BinaryOp,
    dtype: DType,
    layout: &Layout,
    a: &[u8],
    b: &[u8],
    dst: &mut [u8],
    par: &dyn Parallel,
) -> Result<()> {
    fn view<T: bytemuck::Pod>(b: &[u8]) -> Result<&[T]> {
        bytemuck::try_cast_slice(b).map_err(|_| length_error(format_args!("misaligned comparison input")))
    }
    let n = |bytes: usize| bytes / dtype.size();
    check_binary(op, dtype, DType::Bool, layout, n(a.len()), n(b.len()), dst.len())?;
    match dtype {
        DType::F32 => par_binary(par, layout, view(a)?, view(b)?, dst, &|a, b, d| {
            compare_f32_isa(isa, op, layout, a, b, d)
        }),
        DType::I64 => par_binary(par, layout, view(a)?, view(b)?, dst, &|a, b, d| {
            compare_i64_isa(isa, op, layout, a, b, d)
        }),
        DType::I32 => par_binary(par, layout, view(a)?, view(b)?, dst, &|a, b, d| {
            compare_i32_isa(isa, op, layout, a, b, d)
        }),
        DType::Bool => par_binary(par, layout, a, b, dst, &|a, b, d| {
            binary_bool_isa(isa, op, layout, a, b, d)
        }),
        // check_binary refused it (float16 arithmetic stays with ORT).
        DType::F16 => return Err(length_error(format_args!("{op:?} of float16"))),
    }
    Ok(())
}

/// A binary kernel over one part of its operands and destination.
type BinaryPart<'f, T, U> = dyn Fn(&[T], &[T], &mut [U]) + Sync + 'f;

/// Runs `f(a part, b part, dst part)` over row chunks of `dst`, each part
/// sliced as `layout` reads it; `layout.fits` holds.
fn par_binary<T: Sync, U: Send>(
    par: &dyn Parallel,
    layout: &Layout,
    a: &[T],
    b: &[T],
    dst: &mut [U],
    f: &BinaryPart<'_, T, U>,
) {
    if dst.is_empty() {
        return;
    }
    match layout {
        Layout::Same => par_rows(par, dst.len(), 1, dst, &|r, d| f(&a[r.clone()], &b[r], d)),
        Layout::ScalarA => par_rows(par, dst.len(), 1, dst, &|r, d| f(a, &b[r], d)),
        Layout::ScalarB => par_rows(par, dst.len(), 1, dst, &|r, d| f(&a[r], b, d)),
        Layout::RowA { inner } => par_rows(par, dst.len() / inner, *inner, dst, &|r, d| {
            f(a, &b[r.start * inner..r.end * inner], d)
        }),
        Layout::RowB { inner } => par_rows(par, dst.len() / inner, *inner, dst, &|r, d| {
            f(&a[r.start * inner..r.end * inner], b, d)
        }),
        Layout::Strided(_) => f(a, b, dst),
    }
}

/// Integer `dst = a op b` (Add, Sub, Mul, Div; wrapping). Division by zero is an error.
pub fn binary_i64(isa: Isa, op: BinaryOp, layout: &Layout, a: &[i64], b: &[i64], dst: &mut [i64]) -> Result<()> {
    check_int_op(op, b.contains(&0))?;
    check_binary(op, DType::I64, DType::I64, layout, a.len(), b.len(), dst.len())?;
    if !dst.is_empty() {
        binary_i64_isa(isa, op, layout, a, b, dst);
    }
    Ok(())
}

pub fn binary_i32(isa: Isa, op: BinaryOp, layout: &Layout, a: &[i32], b: &[i32], dst: &mut [i32]) -> Result<()> {
    check_int_op(op, b.contains(&0))?;
    check_binary(op, DType::I32, DType::I32, layout, a.len(), b.len(), dst.len())?;
    if !dst.is_empty() {
        binary_i32_isa(isa, op, layout, a, b, dst);
    }
    Ok(())
}

fn check_int_op(op: BinaryOp, zero_divisor: bool) -> Result<()> {
    match op {
        BinaryOp::Div if zero_divisor => Err(Error::invalid_argument("integer division by zero")),
        BinaryOp::Mod | BinaryOp::Fmod if zero_divisor => {
            Err(Error::invalid_argument("integer Mod by zero (a divisor is 0)"))
        }
        _ => Ok(()),
    }
}

/// Checks that `op` reads `dtype` and that the lengths fit `layout`.
/// `dtype` elements, writing `to` elements.
fn check_binary(op: BinaryOp, dtype: DType, to: DType, layout: &Layout, a: usize, b: usize, out: usize) -> Result<()> {
    if !op.accepts(dtype) || op.dst_dtype(dtype) != to {
        return Err(length_error(format_args!("{op:?} from {dtype} to {to}")));
    }
    if !layout.fits(a, b, out) {
        return Err(length_error(format_args!(
            "{op:?} with layout {layout:?} cannot read {a} and {b} elements into {out}"
        )));
    }
    Ok(())
}

/// Softmax along `len` of `[outer, len, inner]`; `shift`: subtract the
/// row's maximum first (the Softmax op) or not (`Exp → ReduceSum → Div` as
/// written, which overflows above 88.7).
pub fn softmax(
    isa: Isa,
    len: usize,
    inner: usize,
    shift: bool,
    src: &[f32],
    dst: &mut [f32],
    par: &dyn Parallel,
) -> Result<()> {
    let block = len.checked_mul(inner).filter(|&b| b > 0 || src.is_empty());
    match block {
        Some(b) if src.len() == dst.len() && (b == 0 || src.len().is_multiple_of(b)) => {
            if let Some(rows) = src.len().checked_div(b) {
                par_rows(par, rows, b, dst, &|r, d| {
                    softmax_isa(isa, len, inner, shift, &src[r.start * b..r.end * b], d)
                });
            }
            Ok(())
        }
        _ => Err(length_error(format_args!(
            "softmax over {len}x{inner} of {} elements into {}",
            src.len(),
            dst.len()
        ))),
    }
}

/// Layer normalisation of rows of `len` elements; `decomposed`: with the
/// statistics of the decomposed ops it was fused from, else those of ORT's
/// `LayerNormalization` (see `norm::layer_norm`).
#[allow(clippy::too_many_arguments)]
pub fn layer_norm(
    isa: Isa,
    len: usize,
    epsilon: f32,
    decomposed: bool,
    src: &[f32],
    scale: &[f32],
    bias: Option<&[f32]>,
    dst: &mut [f32],
    par: &dyn Parallel,
) -> Result<()> {
    let ok = src.len() == dst.len()
        && scale.len() == len
        && bias.is_none_or(|b| b.len() == len)
        && (len > 0 && src.len().is_multiple_of(len) || src.is_empty());
    if !ok {
        return Err(length_error(format_args!(
            "layer norm of rows of {len} over {} elements (scale {})",
            src.len(),
            scale.len()
        )));
    }
    if let Some(rows) = src.len().checked_div(len) {
        par_rows_of(par, rows, len, PAR_MIN_HEAVY_ELEMS, dst, &|r, d| {
            layer_norm_isa(
                isa,
                len,
                epsilon,
                decomposed,
                &src[r.start * len..r.end * len],
                scale,
                bias,
                d,
            )
        });
    }
    Ok(())
}

/// Embedding rows summed and layer-normalised (see [`embed`]): `dst` is
/// `[lead.., width]`.
pub fn embed_layer_norm(
    isa: Isa,
    shape: &embed::EmbedShape<'_>,
    terms: &[embed::Term<'_>],
    scale: &[f32],
    bias: Option<&[f32]>,
    dst: &mut [f32],
    par: &dyn Parallel,
) -> Result<()> {
    let rows = shape.rows();
    if rows.checked_mul(shape.width) != Some(dst.len()) {
        return Err(length_error(format_args!(
            "embedding layer norm of {rows} rows of {} into {}",
            shape.width,
            dst.len()
        )));
    }
    embed::check(shape, terms, scale, bias)?;
    if shape.width == 0 {
        return Ok(());
    }
    par_rows_of(par, rows, shape.width, PAR_MIN_HEAVY_ELEMS, dst, &|r, d| {
        embed_rows_isa(isa, shape, terms, scale, bias, r.start, d)
    });
    Ok(())
}

/// Reduces `[outer, len, inner]` along `len` into `[outer, inner]`.
#[allow(clippy::too_many_arguments)]
pub fn reduce(
    isa: Isa,
    kind: ReduceKind,
    outer: usize,
    len: usize,
    inner: usize,
    src: &[f32],
    dst: &mut [f32],
    par: &dyn Parallel,
) -> Result<()> {
    let src_ok = outer.checked_mul(len).and_then(|n| n.checked_mul(inner)) == Some(src.len());
    if !src_ok || outer.checked_mul(inner) != Some(dst.len()) {
        return Err(length_error(format_args!(
            "reduce {outer}x{len}x{inner} of {} elements into {}",
            src.len(),
            dst.len()
        )));
    }
    let block = len * inner;
    par_rows(par, outer, inner, dst, &|r, d| {
        reduce_isa(isa, kind, len, inner, &src[r.start * block..r.end * block], d)
    });
    Ok(())
}

/// Mismatched lengths here mean a corrupt program, not bad user input.
fn length_error(what: std::fmt::Arguments<'_>) -> Error {
    Error::runtime(format!("kiln kernel given inconsistent buffers: {what}"))
}

#[cfg(test)]
mod tests;
