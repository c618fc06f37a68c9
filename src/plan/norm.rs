//! The normalisation and selection steps of issue #13 (GroupNorm and
//! InstanceNorm, LRN, ArgMax / ArgMin, TopK): their parameters, the
//! buffers they read, the consistency checks `validate` makes of them, and
//! how `run` executes them.

use super::{cast_err, cast_ref, typed_mut, BufRef, DType, Sources};
use crate::error::Result;
use crate::kernels::channel_norm::{self as cn, GroupNormDims, Lrn};
use crate::kernels::parallel::Parallel;
use crate::kernels::select::{self as sel, ArgRule, Lanes, TopKRule};

/// One step; see `kernels::channel_norm` and `kernels::select`.
#[derive(Clone, Debug, PartialEq)]
pub enum NormStep {
    /// Channels-last `src [batch, spatial, channels]` normalised per image
    /// and group; `scale`, `bias`: `[channels]`.
    GroupNorm {
        dims: GroupNormDims,
        src: BufRef,
        scale: BufRef,
        bias: BufRef,
        dst: BufRef,
    },
    /// Rows of `channels` (channels-last).
    Lrn {
        lrn: Lrn,
        channels: usize,
        src: BufRef,
        dst: BufRef,
    },
    /// `src [outer, len, inner]` (`dtype`) to int64 `[outer, inner]`.
    ArgReduce {
        dtype: DType,
        rule: ArgRule,
        lanes: Lanes,
        src: BufRef,
        dst: BufRef,
    },
    /// `src [outer, len, inner]` (`dtype`) to int64 `[outer, k, inner]`.
    TopK {
        dtype: DType,
        rule: TopKRule,
        lanes: Lanes,
        src: BufRef,
        dst: BufRef,
    },
}

impl NormStep {
    pub fn dst(&self) -> BufRef {
        match self {
            NormStep::GroupNorm { dst, .. }
            | NormStep::Lrn { dst, .. }
            | NormStep::ArgReduce { dst, .. }
            | NormStep::TopK { dst, .. } => *dst,
        }
    }

    pub(crate) fn dst_dtype(&self) -> DType {
        match self {
            NormStep::GroupNorm { .. } | NormStep::Lrn { .. } => DType::F32,
            NormStep::ArgReduce { .. } | NormStep::TopK { .. } => DType::I64,
        }
    }

    pub(crate) fn typed_srcs(&self) -> Vec<(BufRef, Option<DType>)> {
        let f = Some(DType::F32);
        match self {
            NormStep::GroupNorm { src, scale, bias, .. } => vec![(*src, f), (*scale, f), (*bias, f)],
            NormStep::Lrn { src, .. } => vec![(*src, f)],
            NormStep::ArgReduce { dtype, src, .. } | NormStep::TopK { dtype, src, .. } => {
                vec![(*src, Some(*dtype))]
            }
        }
    }

    pub fn kind(&self) -> &'static str {
        match self {
            NormStep::GroupNorm { .. } => "GroupNorm",
            NormStep::Lrn { .. } => "LRN",
            NormStep::ArgReduce { rule, .. } if rule.min => "ArgMin",
            NormStep::ArgReduce { .. } => "ArgMax",
            NormStep::TopK { .. } => "TopK",
        }
    }

    /// Whether the parameters fit buffers of `s` source and `d`
    /// destination elements (what `run` relies on).
    pub(crate) fn fits(&self, s: &[usize], d: usize) -> bool {
        let numel = |l: &Lanes| l.outer.checked_mul(l.len).and_then(|n| n.checked_mul(l.inner));
        let number = |t: &DType| matches!(t, DType::F32 | DType::I64);
        match self {
            NormStep::GroupNorm { dims, .. } => dims.fits(s[0], s[1], s[2], d),
            NormStep::Lrn { lrn, channels, .. } => {
                lrn.size > 0 && s[0] == d && (*channels > 0 && d.is_multiple_of(*channels) || d == 0)
            }
            NormStep::ArgReduce { dtype, lanes, .. } => {
                number(dtype)
                    && lanes.len > 0
                    && numel(lanes) == Some(s[0])
                    && lanes.outer.checked_mul(lanes.inner) == Some(d)
            }
            NormStep::TopK { dtype, rule, lanes, .. } => {
                number(dtype)
                    && rule.k <= lanes.len
                    && numel(lanes) == Some(s[0])
                    && lanes.outer.checked_mul(rule.k).and_then(|n| n.checked_mul(lanes.inner)) == Some(d)
            }
        }
    }

    pub(super) fn run(&self, src: &Sources<'_>, dst: &mut [u8], par: &dyn Parallel) -> Result<()> {
        // Re-checked here too: `run` never trusts a program it did not validate.
        let typed = self.typed_srcs();
        let lens: Vec<usize> = typed
            .iter()
            .map(|(r, t)| Ok(src.get(*r)?.len() / t.map_or(1, DType::size)))
            .collect::<Result<_>>()?;
        if !self.fits(&lens, dst.len() / self.dst_dtype().size()) {
            return Err(cast_err());
        }
        match self {
            NormStep::GroupNorm {
                dims,
                src: s,
                scale,
                bias,
                ..
            } => cn::group_norm(
                dims,
                src.f32(*s)?,
                src.f32(*scale)?,
                src.f32(*bias)?,
                typed_mut(dst)?,
                par,
            ),
            NormStep::Lrn {
                lrn, channels, src: s, ..
            } => cn::lrn(lrn, *channels, src.f32(*s)?, typed_mut(dst)?, par),
            NormStep::ArgReduce {
                dtype,
                rule,
                lanes,
                src: s,
                ..
            } => {
                let (s, d) = (src.get(*s)?, typed_mut(dst)?);
                match dtype {
                    DType::F32 => sel::arg_reduce::<f32>(*rule, *lanes, cast_ref(s)?, d, par),
                    DType::I64 => sel::arg_reduce::<i64>(*rule, *lanes, cast_ref(s)?, d, par),
                    _ => return Err(cast_err()),
                }
            }
            NormStep::TopK {
                dtype,
                rule,
                lanes,
                src: s,
                ..
            } => {
                let (s, d) = (src.get(*s)?, typed_mut(dst)?);
                match dtype {
                    DType::F32 => sel::top_k::<f32>(*rule, *lanes, cast_ref(s)?, d, par),
                    DType::I64 => sel::top_k::<i64>(*rule, *lanes, cast_ref(s)?, d, par),
                    _ => return Err(cast_err()),
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Program, ProgramParts, TensorMut, TensorRef, TensorSpec};
    use super::*;
    use crate::error::ErrorKind;
    use crate::kernels::parallel::Serial;
    use crate::target::Target;

    /// One TopK step over `x [2, 4]` (f32) into `i [2, k]`.
    fn top_k_parts(k: usize, len: usize, out_k: usize) -> ProgramParts {
        ProgramParts {
            target: Target::Generic,
            inputs: vec![TensorSpec::new("x", DType::F32, &[2, 4])],
            outputs: vec![TensorSpec::new("i", DType::I64, &[2, out_k])],
            constants: vec![],
            steps: vec![super::super::Step::Norm(Box::new(NormStep::TopK {
                dtype: DType::F32,
                rule: TopKRule { k, largest: true },
                lanes: Lanes {
                    outer: 2,
                    len,
                    inner: 1,
                },
                src: BufRef::Input(0),
                dst: BufRef::Output(0),
            }))],
            arena_bytes: 0,
            op_counts: vec![],
        }
    }

    #[test]
    fn a_top_k_step_runs_and_inconsistent_ones_are_refused() {
        let p = Program::from_parts(top_k_parts(2, 4, 2)).unwrap();
        let x = [1.0f32, 4.0, 4.0, 2.0, 0.0, -1.0, 3.0, 3.0];
        let mut i = [0i64; 4];
        p.run(
            Target::Generic,
            &[TensorRef::F32(&x)],
            &mut [TensorMut::I64(&mut i)],
            &Serial,
        )
        .unwrap();
        assert_eq!(i, [1, 2, 2, 3]);
        // k larger than the axis, and lanes that do not cover the input.
        for parts in [top_k_parts(5, 4, 5), top_k_parts(2, 3, 2)] {
            let e = Program::from_parts(parts).unwrap_err();
            assert_eq!(e.kind, ErrorKind::InvalidGraph, "{e}");
            assert!(e.to_string().contains("parameters do not allow"), "{e}");
        }
    }

    #[test]
    fn group_norm_steps_need_groups_that_divide_the_channels() {
        let step = |groups: usize| NormStep::GroupNorm {
            dims: GroupNormDims {
                batch: 1,
                spatial: 2,
                channels: 6,
                groups,
                epsilon: 1e-5,
            },
            src: BufRef::Input(0),
            scale: BufRef::Input(1),
            bias: BufRef::Input(2),
            dst: BufRef::Output(0),
        };
        assert!(step(3).fits(&[12, 6, 6], 12));
        assert!(!step(4).fits(&[12, 6, 6], 12));
        assert!(!step(0).fits(&[12, 6, 6], 12));
        assert!(!step(3).fits(&[12, 5, 6], 12));
        let lrn = |size: usize| NormStep::Lrn {
            lrn: Lrn {
                size,
                alpha: 1e-4,
                beta: 0.75,
                bias: 1.0,
            },
            channels: 6,
            src: BufRef::Input(0),
            dst: BufRef::Output(0),
        };
        assert!(lrn(5).fits(&[12], 12));
        assert!(!lrn(0).fits(&[12], 12));
        assert!(!lrn(5).fits(&[13], 13));
    }
}
