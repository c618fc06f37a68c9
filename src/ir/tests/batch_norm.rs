//! BatchNormalization's import (issue #13): constant parameters folded into
//! a per-channel Mul + Add, the training forms refused with their reason.

use super::{tv_f32, D};
use crate::compiler::{check_support, import};
use crate::ir::desc::AttrValue;
use crate::ir::{BinaryOp, Op};

/// `BatchNormalization` of `x [2, 3, 4, 5]` with constant parameters.
fn bn(opset: i32, attrs: Vec<(&'static str, AttrValue)>, outputs: usize) -> D {
    let mut d = D::new(opset);
    let x = d.input("x", 1, &[2, 3, 4, 5]);
    let g = d.init("g", tv_f32(&[3], &[1.0, 2.0, 3.0]));
    let b = d.init("b", tv_f32(&[3], &[0.5, 0.0, -0.5]));
    let m = d.init("m", tv_f32(&[3], &[1.0, -1.0, 0.0]));
    let v = d.init("v", tv_f32(&[3], &[3.0, 0.0, 8.0]));
    let y = d.nodes("BatchNormalization", &[&x, &g, &b, &m, &v], outputs, attrs);
    d.output(&y[0]);
    d
}

#[test]
fn constant_parameters_become_a_per_channel_mul_and_add() {
    let d = bn(15, vec![("epsilon", AttrValue::Float(1.0))], 1);
    assert_eq!(check_support(&d.g, &d.consts, &[]), vec![Ok(())]);
    let g = import(&d.g, &d.consts).unwrap();
    let ops: Vec<&Op> = g.nodes.iter().map(|n| &n.op).collect();
    assert_eq!(ops, [&Op::Binary(BinaryOp::Mul), &Op::Binary(BinaryOp::Add)]);
    let scale = g.nodes[0].inputs[1];
    let shift = g.nodes[1].inputs[1];
    assert_eq!(g.ty(scale).shape, [3, 1, 1]);
    assert_eq!(g.constant(scale).unwrap().as_slice(), [0.5, 2.0, 1.0]);
    assert_eq!(g.constant(shift).unwrap().as_slice(), [0.0, 2.0, -0.5]);
}

#[test]
fn training_forms_are_refused_with_a_reason() {
    let d = bn(15, vec![("training_mode", AttrValue::Int(1))], 1);
    let why = check_support(&d.g, &d.consts, &[]).remove(0).unwrap_err();
    assert!(why.contains("training_mode=1"), "{why}");
    let d = bn(9, vec![], 5);
    let why = check_support(&d.g, &d.consts, &[]).remove(0).unwrap_err();
    assert!(
        why.contains("output 1 ('BatchNormalization_1_1') of BatchNormalization is not supported"),
        "{why}"
    );
    let d = bn(7, vec![], 1);
    let why = check_support(&d.g, &d.consts, &[]).remove(0).unwrap_err();
    assert!(why.contains("before opset 9"), "{why}");
}
