//! Convolution fusion (issue #13) over hand-built channels-last IR: what is
//! absorbed, what is not, and that the fused program computes what the
//! unfused one does on every runnable target.

use super::tests::{assert_close, data, run_f32, Builder};
use super::*;
use crate::ir::{Activation, Axis, BinaryOp, ConvAttrs, Op, UnaryOp, ValueId, Window};

const NO_PASSES: Passes = Passes {
    fold: false,
    patterns: false,
    epilogue: false,
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
    let opt = optimise(g, Passes::default()).unwrap();
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
        assert_eq!(fused_ops(&b.g), ["Conv+Bias+Relu+Residual"], "groups {groups} bias {bias}");
    }
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
