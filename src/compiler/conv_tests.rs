//! Convolution fusion (issue #13) over hand-built channels-last IR: what is
//! absorbed, what is not, and that the fused program computes what the
//! unfused one does on every runnable target.

use super::tests::{assert_close, data, run_f32, Builder};
use super::*;
use crate::ir::{Activation, Axis, BinaryOp, ConvAttrs, Op, UnaryOp, ValueId, Window};

const NO_PASSES: Passes = Passes {
    fold: false,
    patterns: false,
    layout: false,
    epilogue: false,
    chain: false,
    winograd: true,
};

fn axis(input: usize, kernel: usize, pad: usize) -> Axis {
    Axis {
        input,
        output: input + 2 * pad + 1 - kernel,
        kernel,
        stride: 1,
        dilation: 1,
        pad_begin: pad,
        pad_end: pad,
    }
}

/// `x [1, 5, 6, ci]` → Conv 3×3 pad 1 (`groups`), with a constant bias.
fn conv(b: &mut Builder, ci: usize, co: usize, groups: usize, bias: bool) -> (ValueId, ValueId) {
    let x = b.input("x", &[1, 5, 6, ci]);
    let w = b.constant("w", &[co, ci / groups, 3, 3], data(co * ci / groups * 9, 3));
    let mut ins = vec![x, w];
    if bias {
        ins.push(b.constant("b", &[co], data(co, 4)));
    }
    let attrs = ConvAttrs {
        window: Window {
            h: axis(5, 3, 1),
            w: axis(6, 3, 1),
        },
        groups,
        bias,
        activation: Activation::None,
        residual: false,
        after: Activation::None,
    };
    (x, b.op(Op::Conv(Box::new(attrs)), &ins, "c"))
}

/// Compiles with and without the passes on every runnable target, checks
/// they agree, and returns the optimised graph's op names.
fn fused_ops(g: &Graph) -> Vec<String> {
    let inputs: Vec<Vec<f32>> = g
        .inputs
        .iter()
        .enumerate()
        .map(|(k, &v)| data(g.values[v].ty.numel(), k + 1))
        .collect();
    let want = run_f32(&compile_with(g, Target::Generic, NO_PASSES).unwrap(), &inputs);
    for target in Target::ALL {
        if target.can_run_on(Target::cpu_best()) {
            assert_close(&run_f32(&compile(g, target).unwrap(), &inputs), &want, 1e-4);
        }
    }
    let opt = optimise(g, super::tests::inspected()).unwrap();
    opt.nodes.iter().map(|n| n.op.name()).collect()
}

#[test]
fn scale_shift_activation_and_residual_fold_into_the_conv() {
    for (groups, bias) in [(1, true), (1, false), (2, true), (8, false)] {
        let mut b = Builder::new();
        let (x, c) = conv(&mut b, 8, 8, groups, bias);
        let s = b.constant("s", &[8], data(8, 5));
        let d = b.constant("d", &[1, 1, 1, 8], data(8, 6));
        let m = b.bin(BinaryOp::Mul, s, c, "m");
        let a = b.bin(BinaryOp::Add, m, d, "a");
        let r = b.un(UnaryOp::Relu, a, "r");
        let y = b.bin(BinaryOp::Add, r, x, "y");
        b.output(y);
        assert_eq!(
            fused_ops(&b.g),
            ["Conv+Bias+Relu+Residual"],
            "groups {groups} bias {bias}"
        );
    }
}

/// ResNet's block end: `Relu(Add(conv, skip))` becomes one convolution
/// with the Relu after the residual, on the direct, grouped and depthwise
/// paths; an activation before the residual stays before it.
#[test]
fn an_activation_after_the_residual_folds() {
    for (groups, bias, before) in [(1, true, false), (2, false, false), (8, true, false), (1, true, true)] {
        let mut b = Builder::new();
        let (x, c) = conv(&mut b, 8, 8, groups, bias);
        let c = if before {
            b.un(UnaryOp::Clip(-1.0, 2.0), c, "clip")
        } else {
            c
        };
        let a = b.bin(BinaryOp::Add, x, c, "skip");
        let y = b.un(UnaryOp::Relu, a, "relu");
        b.output(y);
        let want = match (bias, before) {
            (true, true) => "Conv+Bias+Clip+Residual+Relu",
            (true, false) => "Conv+Bias+Residual+Relu",
            _ => "Conv+Residual+Relu",
        };
        assert_eq!(fused_ops(&b.g), [want], "groups {groups} bias {bias}");
    }
    // An activation that is not a clamp runs after the kernels' stores.
    let mut b = Builder::new();
    let (x, c) = conv(&mut b, 8, 8, 1, true);
    let a = b.bin(BinaryOp::Add, c, x, "skip");
    let y = b.un(UnaryOp::Sigmoid, a, "sigmoid");
    b.output(y);
    assert_eq!(fused_ops(&b.g), ["Conv+Bias+Residual+Sigmoid"]);
    // A second activation after it does not fold.
    let mut b = Builder::new();
    let (x, c) = conv(&mut b, 8, 8, 1, true);
    let a = b.bin(BinaryOp::Add, c, x, "skip");
    let r = b.un(UnaryOp::Relu, a, "relu");
    let y = b.un(UnaryOp::Sigmoid, r, "sigmoid");
    b.output(y);
    assert_eq!(fused_ops(&b.g), ["Conv+Bias+Residual+Relu", "Sigmoid"]);
}

#[test]
fn scalar_scale_and_clip_fold() {
    let mut b = Builder::new();
    let (_, c) = conv(&mut b, 4, 6, 1, true);
    let s = b.scalar("s", 0.5);
    let m = b.bin(BinaryOp::Mul, c, s, "m");
    let y = b.un(UnaryOp::Clip(0.0, 6.0), m, "y");
    b.output(y);
    assert_eq!(fused_ops(&b.g), ["Conv+Bias+Clip"]);
}

#[test]
fn what_does_not_fold() {
    // A scale after the activation: the activation fuses, the scale does not.
    let mut b = Builder::new();
    let (_, c) = conv(&mut b, 4, 6, 1, true);
    let r = b.un(UnaryOp::Relu, c, "r");
    let s = b.constant("s", &[6], data(6, 7));
    let y = b.bin(BinaryOp::Mul, r, s, "y");
    b.output(y);
    assert_eq!(fused_ops(&b.g), ["Conv+Bias+Relu", "Mul"]);

    // A per-column (width) constant is not per channel: not folded.
    let mut b = Builder::new();
    let (_, c) = conv(&mut b, 4, 6, 1, true);
    let s = b.constant("s", &[6, 1], data(6, 8));
    let y = b.bin(BinaryOp::Mul, c, s, "y");
    b.output(y);
    assert_eq!(fused_ops(&b.g), ["Conv+Bias", "Mul"]);

    // The conv's output read twice (and a graph output): nothing fuses.
    let mut b = Builder::new();
    let (_, c) = conv(&mut b, 4, 6, 1, true);
    let r = b.un(UnaryOp::Relu, c, "r");
    b.output(c);
    b.output(r);
    assert_eq!(fused_ops(&b.g), ["Conv+Bias", "Relu"]);

    // A broadcasting Add (a [1, 1, 6, 6] tensor) is no residual.
    let mut b = Builder::new();
    let (_, c) = conv(&mut b, 4, 6, 1, false);
    let z = b.input("z", &[1, 1, 6, 6]);
    let y = b.bin(BinaryOp::Add, c, z, "y");
    b.output(y);
    assert_eq!(fused_ops(&b.g), ["Conv", "Add"]);
}

/// Reshapes between the convolution and its per-channel shift and
/// activation, the last ending with the channels (Magika's `[N, L, 1, C] →
/// [N, L, C, 1] → [N, L, C]`), do not stop them folding; a residual after
/// them, or a last Reshape that does not end with the channels, does.
#[test]
fn folds_through_a_reshape_that_keeps_the_channels_last() {
    let build = |shape: &[usize], residual: bool| {
        let mut b = Builder::new();
        let (_, c) = conv(&mut b, 4, 6, 1, true);
        let r = b.op_shaped(Op::Reshape, &[c], "unit_last", Some(&[1, 5, 6, 6, 1]));
        let r = b.op_shaped(Op::Reshape, &[r], "squeeze", Some(shape));
        let a = if residual {
            let z = b.input("z", shape);
            b.bin(BinaryOp::Add, r, z, "a")
        } else {
            let d = b.constant("d", &[6], data(6, 9));
            b.bin(BinaryOp::Add, d, r, "a")
        };
        let y = b.un(UnaryOp::Relu, a, "y");
        b.output(y);
        b.g
    };
    assert_eq!(
        fused_ops(&build(&[5, 6, 6], false)),
        ["Conv+Bias+Relu", "Reshape", "Reshape"]
    );
    assert_eq!(
        fused_ops(&build(&[5, 6, 6], true)),
        ["Conv+Bias", "Reshape", "Reshape", "Add", "Relu"]
    );
    assert_eq!(
        fused_ops(&build(&[5, 36], true)),
        ["Conv+Bias", "Reshape", "Reshape", "Add", "Relu"]
    );
}

/// The outputs of `p` (a specialisation of `d`'s graph, input `x`) and of
/// a static compile of that graph at `dims`, on the same input.
fn against_static(d: &crate::ir::tests::D, p: &crate::plan::Program, dims: [i64; 4]) -> (Vec<Vec<f64>>, Vec<Vec<f64>>) {
    use crate::ir::tests::{run_program, T};
    use crate::kernels::parallel::Serial;
    let mut fixed = d.g.clone();
    fixed.values.get_mut("x").unwrap().dims = Some(dims.to_vec());
    let st = compile(&import(&fixed, &d.consts).unwrap(), Target::cpu_best()).unwrap();
    let shape: Vec<usize> = dims.iter().map(|&v| v as usize).collect();
    let numel = shape.iter().product();
    let ins = vec![T::new(1, &shape, data(numel, 9).iter().map(|&v| v as f64).collect())];
    (run_program(p, &ins, &Serial), run_program(&st, &ins, &Serial))
}

/// A 1-D and a 2-D convolution stack over symbolic sizes: `GenericGraph`
/// packs every non-depthwise group once, each specialisation uses those
/// packs (no copy), and computes what a static compile of that size does.
#[test]
fn shape_generic_convolutions_pack_once() {
    use super::generic::{GenericGraph, Specializer};
    use crate::ir::tests::D;
    use crate::ir::{AttrValue, ValueDesc};

    let mut d = D::new(17);
    let x = d.input("x", 1, &[-1, 4, -1, -1]);
    d.g.values
        .insert("x".into(), ValueDesc::named(1, &[-1, 4, -1, -1], &["n", "", "h", "w"]));
    let w1 = d.f32s("w1", &[8, 2, 3, 3], 1);
    let w2 = d.f32s("w2", &[8, 1, 3, 3], 2);
    let w3 = d.f32s("w3", &[6, 8, 1, 1], 3);
    let pads = ("pads", AttrValue::Ints(vec![1, 1, 1, 1]));
    let a = d.node("Conv", &[&x, &w1], vec![("group", AttrValue::Int(2)), pads.clone()]);
    let b = d.node("Conv", &[&a, &w2], vec![("group", AttrValue::Int(8)), pads]);
    let y = d.node("Conv", &[&b, &w3], vec![]);
    d.output(&y);
    let g = GenericGraph::build(d.g.clone(), &d.consts, Target::cpu_best()).unwrap();
    let groups: Vec<(&str, Option<usize>)> = g.packed.iter().map(|p| (p.source.as_str(), p.conv_group)).collect();
    assert_eq!(groups, [("w1", Some(0)), ("w1", Some(1)), ("w3", Some(0))]);
    let packs: Vec<*const u8> = g.packed.iter().map(|p| p.data.as_bytes().as_ptr()).collect();
    let s = Specializer::new(g, 4).unwrap();
    for (n, h, w) in [(1, 5, 7), (2, 9, 4)] {
        let (p, _) = s.program_for(&[vec![n, 4, h, w]]).unwrap();
        let shared = p
            .constants()
            .iter()
            .filter(|c| packs.contains(&c.data.as_bytes().as_ptr()))
            .count();
        assert_eq!(shared, 3, "{n}x{h}x{w}: a program packs its own weights");
        let (got, want) = against_static(&d, &p, [n, 4, h, w]);
        assert_eq!(got, want);
    }
}

/// A shape-generic partition folds the per-channel `Mul`/`Add` after a
/// convolution (PP-LCNet's learnable scale and shift) into its weights once
/// at build, so specialisations find no scale to fold and repack; a scale
/// whose convolution output is read twice, or that broadcasts along a
/// spatial axis, stays. Each specialisation computes what a static compile
/// of the model as written does, and runs in the scratch the partition's
/// programs share.
#[test]
fn shape_generic_partitions_fold_channel_scales_once() {
    use super::generic::{GenericGraph, Specializer};
    use crate::ir::tests::D;
    use crate::ir::AttrValue;

    let mut d = D::new(17);
    let x = d.input("x", 1, &[-1, 4, -1, -1]);
    let w1 = d.f32s("w1", &[8, 4, 3, 3], 1);
    let b1 = d.f32s("b1", &[8], 2);
    let s = d.f32s("s", &[1], 3);
    let t = d.f32s("t", &[8, 1, 1], 4);
    let w2 = d.f32s("w2", &[8, 8, 1, 1], 5);
    let u = d.f32s("u", &[1, 1, 1, 1], 6);
    let wide = d.f32s("wide", &[1, 1, 1, 5], 7);
    let pads = ("pads", AttrValue::Ints(vec![1, 1, 1, 1]));
    let c1 = d.node("Conv", &[&x, &w1, &b1], vec![pads]);
    let m = d.node("Mul", &[&s, &c1], vec![]);
    let a = d.node("Add", &[&m, &t], vec![]);
    let r = d.node("Relu", &[&a], vec![]);
    let c2 = d.node("Conv", &[&r, &w2], vec![]);
    let m2 = d.node("Mul", &[&c2, &u], vec![]);
    // Read twice: stays.
    let m3 = d.node("Mul", &[&m2, &wide], vec![]);
    let y = d.node("Add", &[&m2, &m3], vec![]);
    d.output(&y);
    let g = GenericGraph::build(d.g.clone(), &d.consts, Target::cpu_best()).unwrap();
    let ops: Vec<&str> = g.desc.nodes.iter().map(|n| n.op_type.as_str()).collect();
    assert_eq!(ops, ["Conv", "Relu", "Conv", "Mul", "Add"]);
    let names: Vec<&str> = g.constants.iter().map(|c| c.name.as_str()).collect();
    assert!(
        !names.contains(&"w1") && !names.contains(&"s"),
        "unused constants kept: {names:?}"
    );
    let s = Specializer::new(g, 1).unwrap();
    let mut arena = None;
    for (n, h, w) in [(1, 5, 5), (2, 6, 5), (1, 5, 5)] {
        let (p, _) = s.program_for(&[vec![n, 4, h, w]]).unwrap();
        let pool = std::sync::Arc::as_ptr(&p.scratch);
        assert_eq!(
            *arena.get_or_insert(pool),
            pool,
            "the partition's programs share their scratch"
        );
        let (got, want) = against_static(&d, &p, [n, 4, h, w]);
        for (a, b) in got[0].iter().zip(&want[0]) {
            assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()), "{n}x{h}x{w}: {a} vs {b}");
        }
    }
}

/// `x [1, 5, 6, 8]` → `t = -x`, `u = |x|`, and a 3×3 convolution of `input`
/// (`t`, or `u` itself) with the residual `u`, then `-conv`; with `later`,
/// `u` is also added to that.
fn residual_graph(input_is_residual: bool, later: bool, fused: bool) -> Graph {
    let mut b = Builder::new();
    let x = b.input("x", &[1, 5, 6, 8]);
    let t = b.un(UnaryOp::Neg, x, "t");
    let u = b.un(UnaryOp::Abs, x, "u");
    let input = if input_is_residual { u } else { t };
    let w = b.constant("w", &[8, 8, 3, 3], data(8 * 8 * 9, 3));
    let attrs = |residual: bool| ConvAttrs {
        window: Window {
            h: axis(5, 3, 1),
            w: axis(6, 3, 1),
        },
        groups: 1,
        bias: false,
        activation: Activation::Relu,
        residual,
        after: Activation::None,
    };
    let c = if fused {
        b.op(Op::Conv(Box::new(attrs(true))), &[input, w, u], "c")
    } else {
        let c = b.op(Op::Conv(Box::new(attrs(false))), &[input, w], "c0");
        b.bin(BinaryOp::Add, c, u, "c")
    };
    let n = b.un(UnaryOp::Neg, c, "n");
    let y = if later { b.bin(BinaryOp::Add, n, u, "y") } else { n };
    b.output(y);
    b.g
}

/// A convolution's output takes its residual's buffer when the convolution
/// is the residual's last reader (ResNet's block ends: one stream fewer to
/// memory), and the values stay those of a separate Add on every runnable
/// target; a residual read later, or that the convolution also reads as
/// its input, keeps a buffer of its own.
#[test]
fn the_output_takes_the_residual_buffer_from_its_last_reader() {
    for (input_is_residual, later, in_place) in [(false, false, true), (false, true, false), (true, false, false)] {
        let inputs = [data(5 * 6 * 8, 1)];
        let want = run_f32(
            &compile_with(
                &residual_graph(input_is_residual, later, false),
                Target::Generic,
                NO_PASSES,
            )
            .unwrap(),
            &inputs,
        );
        let g = residual_graph(input_is_residual, later, true);
        for target in Target::ALL {
            let p = compile_with(&g, target, NO_PASSES).unwrap();
            let residual = p.steps().iter().find_map(|s| match s {
                crate::plan::Step::Conv(c) => Some(c.residual),
                _ => None,
            });
            let expect = if in_place {
                crate::plan::ConvResidual::InDst
            } else {
                crate::plan::ConvResidual::Buf(match residual {
                    Some(Some(crate::plan::ConvResidual::Buf(r))) => r,
                    other => panic!("{target}: residual {other:?}"),
                })
            };
            assert_eq!(residual, Some(Some(expect)), "{target} {input_is_residual} {later}");
            if target.can_run_on(Target::cpu_best()) {
                assert_close(&run_f32(&p, &inputs), &want, 1e-4);
            }
        }
    }
}
