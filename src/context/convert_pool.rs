//! Serialisation of the pool and resize steps (`plan::PoolStep`, issue #13).

use super::convert::{buf, buf_ref, stride_info, stride_of, usize_of};
use super::proto::{self, step_info::Kind as K, CoordModeInfo as C, PoolKindInfo as P, ResizeModeInfo as M};
use crate::error::Result;
use crate::kernels::pool::{PoolKind, PoolShape};
use crate::kernels::resize::{CoordMode, Interp, NearestMode, ResizeAttrs, ResizeAxis};
use crate::kernels::spatial::{Axis, Window};
use crate::plan::PoolStep;

pub(super) fn pool_info(step: &PoolStep) -> K {
    match step {
        PoolStep::Pool { kind, shape, src, dst } => K::Pool(proto::PoolStep {
            kind: pool_kind(*kind) as i32,
            h: Some(axis_info(&shape.window.h)),
            w: Some(axis_info(&shape.window.w)),
            batch: shape.batch as u64,
            channels: shape.channels as u64,
            src: Some(buf(*src)),
            dst: Some(buf(*dst)),
        }),
        PoolStep::Resize {
            attrs,
            batch,
            channels,
            src,
            dst,
            dst_stride,
        } => {
            let (mode, a, exclude_outside) = match attrs.interp {
                Interp::Nearest(m) => (nearest_kind(m), 0.0, false),
                Interp::Linear => (M::Linear, 0.0, false),
                Interp::Cubic { a, exclude_outside } => (M::Cubic, a, exclude_outside),
            };
            K::Resize(proto::ResizeStep {
                mode: mode as i32,
                cubic_coeff_a: a,
                exclude_outside,
                coord: coord_kind(attrs.coord) as i32,
                h: Some(resize_axis_info(&attrs.h)),
                w: Some(resize_axis_info(&attrs.w)),
                batch: *batch as u64,
                channels: *channels as u64,
                src: Some(buf(*src)),
                dst: Some(buf(*dst)),
                dst_stride: stride_info(*dst_stride, *channels),
            })
        }
    }
}

/// The step of a pool or resize kind (the caller dispatches only those).
pub(super) fn pool_step(kind: &K) -> Result<PoolStep> {
    Ok(match kind {
        K::Pool(p) => PoolStep::Pool {
            kind: pool_kind_of(p.kind)?,
            shape: PoolShape {
                window: Window {
                    h: axis(&p.h)?,
                    w: axis(&p.w)?,
                },
                batch: usize_of(p.batch, "batch size")?,
                channels: usize_of(p.channels, "channel count")?,
            },
            src: buf_ref(&p.src)?,
            dst: buf_ref(&p.dst)?,
        },
        K::Resize(r) => PoolStep::Resize {
            attrs: ResizeAttrs {
                interp: interp_of(r)?,
                coord: coord_of(r.coord)?,
                h: resize_axis(&r.h)?,
                w: resize_axis(&r.w)?,
            },
            batch: usize_of(r.batch, "batch size")?,
            channels: usize_of(r.channels, "channel count")?,
            src: buf_ref(&r.src)?,
            dst: buf_ref(&r.dst)?,
            dst_stride: stride_of(r.dst_stride, usize_of(r.channels, "channel count")?)?,
        },
        _ => crate::bail!(InvalidGraph, "not a pool or resize step"),
    })
}

fn axis_info(a: &Axis) -> proto::WindowAxis {
    proto::WindowAxis {
        input: a.input as u64,
        output: a.output as u64,
        kernel: a.kernel as u64,
        stride: a.stride as u64,
        dilation: a.dilation as u64,
        pad_begin: a.pad_begin as u64,
        pad_end: a.pad_end as u64,
    }
}

fn axis(a: &Option<proto::WindowAxis>) -> Result<Axis> {
    let Some(a) = a else {
        crate::bail!(InvalidGraph, "a pool step has no window axis");
    };
    Ok(Axis {
        input: usize_of(a.input, "window input length")?,
        output: usize_of(a.output, "window output length")?,
        kernel: usize_of(a.kernel, "kernel size")?,
        stride: usize_of(a.stride, "stride")?,
        dilation: usize_of(a.dilation, "dilation")?,
        pad_begin: usize_of(a.pad_begin, "padding")?,
        pad_end: usize_of(a.pad_end, "padding")?,
    })
}

fn resize_axis_info(a: &ResizeAxis) -> proto::ResizeAxisInfo {
    proto::ResizeAxisInfo {
        input: a.input as u64,
        output: a.output as u64,
        scale: a.scale,
    }
}

fn resize_axis(a: &Option<proto::ResizeAxisInfo>) -> Result<ResizeAxis> {
    let Some(a) = a else {
        crate::bail!(InvalidGraph, "a resize step has no axis");
    };
    Ok(ResizeAxis {
        input: usize_of(a.input, "resize input length")?,
        output: usize_of(a.output, "resize output length")?,
        scale: a.scale,
    })
}

fn pool_kind(k: PoolKind) -> P {
    match k {
        PoolKind::Max => P::Max,
        PoolKind::Average {
            count_include_pad: false,
        } => P::Average,
        PoolKind::Average {
            count_include_pad: true,
        } => P::AverageIncludePad,
        PoolKind::MaxIndex { column_major: false } => P::MaxIndex,
        PoolKind::MaxIndex { column_major: true } => P::MaxIndexColumnMajor,
    }
}

fn pool_kind_of(code: i32) -> Result<PoolKind> {
    Ok(match P::try_from(code) {
        Ok(P::Max) => PoolKind::Max,
        Ok(P::Average) => PoolKind::Average {
            count_include_pad: false,
        },
        Ok(P::AverageIncludePad) => PoolKind::Average {
            count_include_pad: true,
        },
        Ok(P::MaxIndex) => PoolKind::MaxIndex { column_major: false },
        Ok(P::MaxIndexColumnMajor) => PoolKind::MaxIndex { column_major: true },
        _ => crate::bail!(InvalidGraph, "unknown pool kind {code}"),
    })
}

fn nearest_kind(m: NearestMode) -> M {
    match m {
        NearestMode::RoundPreferFloor => M::NearestRoundPreferFloor,
        NearestMode::RoundPreferCeil => M::NearestRoundPreferCeil,
        NearestMode::Floor => M::NearestFloor,
        NearestMode::Ceil => M::NearestCeil,
        NearestMode::Simple => M::NearestSimple,
    }
}

fn interp_of(r: &proto::ResizeStep) -> Result<Interp> {
    let nearest = Interp::Nearest;
    Ok(match M::try_from(r.mode) {
        Ok(M::NearestRoundPreferFloor) => nearest(NearestMode::RoundPreferFloor),
        Ok(M::NearestRoundPreferCeil) => nearest(NearestMode::RoundPreferCeil),
        Ok(M::NearestFloor) => nearest(NearestMode::Floor),
        Ok(M::NearestCeil) => nearest(NearestMode::Ceil),
        Ok(M::NearestSimple) => nearest(NearestMode::Simple),
        Ok(M::Linear) => Interp::Linear,
        Ok(M::Cubic) => Interp::Cubic {
            a: r.cubic_coeff_a,
            exclude_outside: r.exclude_outside,
        },
        _ => crate::bail!(InvalidGraph, "unknown resize mode {}", r.mode),
    })
}

fn coord_kind(c: CoordMode) -> C {
    match c {
        CoordMode::HalfPixel => C::HalfPixel,
        CoordMode::HalfPixelSymmetric => C::HalfPixelSymmetric,
        CoordMode::PytorchHalfPixel => C::PytorchHalfPixel,
        CoordMode::AlignCorners => C::AlignCorners,
        CoordMode::Asymmetric => C::Asymmetric,
        CoordMode::TfHalfPixelForNn => C::TfHalfPixelForNn,
    }
}

fn coord_of(code: i32) -> Result<CoordMode> {
    Ok(match C::try_from(code) {
        Ok(C::HalfPixel) => CoordMode::HalfPixel,
        Ok(C::HalfPixelSymmetric) => CoordMode::HalfPixelSymmetric,
        Ok(C::PytorchHalfPixel) => CoordMode::PytorchHalfPixel,
        Ok(C::AlignCorners) => CoordMode::AlignCorners,
        Ok(C::Asymmetric) => CoordMode::Asymmetric,
        Ok(C::TfHalfPixelForNn) => CoordMode::TfHalfPixelForNn,
        _ => crate::bail!(InvalidGraph, "unknown resize coordinate transformation {code}"),
    })
}

#[cfg(test)]
mod tests {
    use super::super::tests::{assert_same_program, parse, tamper};
    use super::super::ContextBuilder;
    use super::*;
    use crate::compiler::compile;
    use crate::ir::{Graph, Op, TensorType};
    use crate::kernels::spatial::output_len;
    use crate::target::Target;

    fn axis(input: usize, kernel: usize, stride: usize, pads: (usize, usize)) -> Axis {
        Axis {
            input,
            output: output_len(input, kernel, stride, 1, pads, true).unwrap(),
            kernel,
            stride,
            dilation: 1,
            pad_begin: pads.0,
            pad_end: pads.1,
        }
    }

    /// Every pool kind and a resize per mode over one `[2, 7, 6, 3]` input.
    fn graph(indices: bool) -> Graph {
        let mut g = Graph::new("pools");
        let x = g.add_value("x", TensorType::f32(&[2, 7, 6, 3])).unwrap();
        g.inputs.push(x);
        let window = Window {
            h: axis(7, 3, 2, (1, 1)),
            w: axis(6, 2, 2, (0, 1)),
        };
        let mut kinds = vec![
            PoolKind::Max,
            PoolKind::Average {
                count_include_pad: true,
            },
            PoolKind::Average {
                count_include_pad: false,
            },
        ];
        if indices {
            kinds.push(PoolKind::MaxIndex { column_major: true });
        }
        let mut ops: Vec<Op> = kinds.into_iter().map(|kind| Op::Pool { kind, window }).collect();
        let resize = |interp, coord| {
            Op::Resize(ResizeAttrs {
                interp,
                coord,
                h: ResizeAxis {
                    input: 7,
                    output: 10,
                    scale: 1.5,
                },
                w: ResizeAxis {
                    input: 6,
                    output: 3,
                    scale: 0.6,
                },
            })
        };
        ops.push(resize(Interp::Nearest(NearestMode::Simple), CoordMode::Asymmetric));
        ops.push(resize(Interp::Linear, CoordMode::HalfPixelSymmetric));
        let cubic = Interp::Cubic {
            a: -0.5,
            exclude_outside: true,
        };
        ops.push(resize(cubic, CoordMode::AlignCorners));
        for (i, op) in ops.into_iter().enumerate() {
            let ty = crate::ir::infer(&op, &[g.ty(x)], None).unwrap().remove(0);
            let y = g.add_value(&format!("y{i}"), ty).unwrap();
            g.add_node(&format!("n{i}"), op, vec![x], vec![y]);
            g.outputs.push(y);
        }
        g
    }

    /// Pool and resize steps (tags 65, 66) go through the file and run identically.
    #[test]
    fn pool_and_resize_steps_round_trip() {
        let want = compile(&graph(false), Target::Generic).unwrap();
        assert_eq!(want.steps().len(), 6);
        let mut b = ContextBuilder::new(Target::Generic);
        b.add_graph("pools", &want).unwrap();
        let ctx = parse(&b.to_bytes().unwrap()).unwrap();
        assert_same_program(&ctx.program("pools").unwrap().unwrap(), &want);
        // The int64 indices: same steps (run() compares f32 outputs only).
        let want = compile(&graph(true), Target::Generic).unwrap();
        let mut b = ContextBuilder::new(Target::Generic);
        b.add_graph("pools", &want).unwrap();
        let got = parse(&b.to_bytes().unwrap())
            .unwrap()
            .program("pools")
            .unwrap()
            .unwrap();
        assert_eq!(got.steps(), want.steps());
    }

    fn first_pool(m: &mut proto::Metadata) -> &mut proto::PoolStep {
        let steps = &mut m.graphs[0].program.as_mut().unwrap().steps;
        steps
            .iter_mut()
            .find_map(|s| match s.kind.as_mut() {
                Some(K::Pool(p)) => Some(p),
                _ => None,
            })
            .unwrap()
    }

    #[test]
    fn bad_pool_steps_are_refused() {
        let want = compile(&graph(false), Target::Generic).unwrap();
        let mut b = ContextBuilder::new(Target::Generic);
        b.add_graph("pools", &want).unwrap();
        let bytes = b.to_bytes().unwrap();
        type Edit = fn(&mut proto::PoolStep);
        let cases: [(Edit, &str); 4] = [
            (|p| p.kind = 0, "unknown pool kind"),
            (|p| p.h = None, "no window axis"),
            (|p| p.h.as_mut().unwrap().stride = 0, "do not allow"),
            (|p| p.w.as_mut().unwrap().output += 1, "do not allow"),
        ];
        for (edit, needle) in cases {
            let bad = tamper(&bytes, |m| edit(first_pool(m)));
            let err = parse(&bad).and_then(|c| c.program("pools").map(|_| ())).unwrap_err();
            assert!(err.message.contains(needle), "{needle}: {}", err.message);
        }
    }
}
