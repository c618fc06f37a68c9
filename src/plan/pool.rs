//! The pool and resize steps (issue #13): their parameters, the buffers
//! they read, the consistency checks `validate` makes of them, and how
//! `run` executes them. Both read and write channels-last `[N, H, W, C]`.

use super::{as_f32_mut, cast_err, typed_mut, BufRef, DType, Sources};
use crate::error::Result;
use crate::kernels::parallel::Parallel;
use crate::kernels::pool::{self, PoolKind, PoolShape};
use crate::kernels::resize::{self, ResizeAttrs};
use crate::kernels::Isa;

/// One pool or resize step.
#[derive(Clone, Debug, PartialEq)]
pub enum PoolStep {
    Pool {
        kind: PoolKind,
        shape: PoolShape,
        src: BufRef,
        dst: BufRef,
    },
    Resize {
        attrs: ResizeAttrs,
        batch: usize,
        channels: usize,
        src: BufRef,
        dst: BufRef,
        /// Values between output pixels: `channels`, or more when the
        /// resize writes its channels of a concat's output (format 10).
        dst_stride: usize,
    },
}

impl PoolStep {
    pub fn dst(&self) -> BufRef {
        match self {
            PoolStep::Pool { dst, .. } | PoolStep::Resize { dst, .. } => *dst,
        }
    }

    pub(crate) fn dst_dtype(&self) -> DType {
        match self {
            PoolStep::Pool {
                kind: PoolKind::MaxIndex { .. },
                ..
            } => DType::I64,
            _ => DType::F32,
        }
    }

    pub(crate) fn typed_srcs(&self) -> Vec<(BufRef, Option<DType>)> {
        match self {
            PoolStep::Pool { src, .. } | PoolStep::Resize { src, .. } => vec![(*src, Some(DType::F32))],
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            PoolStep::Pool { kind, .. } => match kind {
                PoolKind::Max => "MaxPool",
                PoolKind::Average { .. } => "AveragePool",
                PoolKind::MaxIndex { .. } => "MaxPoolIndices",
            },
            PoolStep::Resize { .. } => "Resize",
        }
    }

    /// Whether the parameters fit buffers of `s` source and `d`
    /// destination elements (what `run` relies on).
    pub(crate) fn fits(&self, s: &[usize], d: usize) -> bool {
        match self {
            PoolStep::Pool { shape, .. } => {
                shape.is_valid() && shape.src_len() == Some(s[0]) && shape.dst_len() == Some(d)
            }
            PoolStep::Resize {
                attrs,
                batch,
                channels,
                dst_stride,
                ..
            } => {
                let len = |h: usize, w: usize| [h, w, *channels].iter().try_fold(*batch, |n, &x| n.checked_mul(x));
                let pixels = [attrs.h.output, attrs.w.output]
                    .iter()
                    .try_fold(*batch, |n, &x| n.checked_mul(x));
                attrs.is_valid()
                    && dst_stride >= channels
                    && len(attrs.h.input, attrs.w.input) == Some(s[0])
                    && pixels.and_then(|p| crate::kernels::conv::strided_len(p, *dst_stride, *channels)) == Some(d)
            }
        }
    }

    pub(super) fn run(&self, isa: Isa, src: &Sources<'_>, dst: &mut [u8], par: &dyn Parallel) -> Result<()> {
        if !self.fits(
            &[src.get(self.typed_srcs()[0].0)?.len() / 4],
            dst.len() / self.dst_dtype().size(),
        ) {
            return Err(cast_err());
        }
        match self {
            PoolStep::Pool {
                kind: PoolKind::MaxIndex { column_major },
                shape,
                src: s,
                ..
            } => pool::max_indices(*column_major, shape, src.f32(*s)?, typed_mut(dst)?, par),
            PoolStep::Pool {
                kind, shape, src: s, ..
            } => pool::pool(isa, *kind, shape, src.f32(*s)?, as_f32_mut(dst)?, par),
            PoolStep::Resize {
                attrs,
                batch,
                channels,
                src: s,
                dst_stride,
                ..
            } => resize::resize(
                isa,
                attrs,
                *batch,
                *channels,
                src.f32(*s)?,
                as_f32_mut(dst)?,
                *dst_stride,
                par,
            ),
        }
        Ok(())
    }
}
