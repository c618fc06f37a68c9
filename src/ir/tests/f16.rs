//! float16 at a partition's edge: Casts in and out, data movement, float16
//! constants, and float16 arithmetic left to ORT with the reason.

use super::*;
use crate::kernels::half::{f16_to_f32, f32_to_f16};

fn tv_f16(shape: &[usize], v: &[f32]) -> TensorValue {
    let h: Vec<u16> = v.iter().map(|&x| f32_to_f16(x)).collect();
    TensorValue {
        elem_type: 10,
        shape: shape.to_vec(),
        bytes: bytemuck::cast_slice(&h).to_vec(),
    }
}

fn cast(d: &mut D, x: &str, to: i64) -> String {
    d.node("Cast", &[x], vec![("to", AttrValue::Int(to))])
}

/// Compiles `d` and runs it on float16 inputs, giving float16 outputs.
fn run_f16(d: &D, inputs: &[Vec<u16>]) -> (Program, Vec<Vec<u16>>) {
    let verdicts = reasons(d);
    assert!(verdicts.iter().all(|v| v.is_ok()), "{verdicts:?}");
    let ir = import(&d.g, &d.consts).unwrap();
    let p = compile(&ir, Target::cpu_best()).unwrap();
    let views: Vec<TensorRef<'_>> = inputs.iter().map(|v| TensorRef::F16(v)).collect();
    let mut outs: Vec<Vec<u16>> = p.outputs().iter().map(|s| vec![0u16; s.numel()]).collect();
    let mut ov: Vec<TensorMut<'_>> = outs.iter_mut().map(|v| TensorMut::F16(v)).collect();
    p.run(Target::cpu_best(), &views, &mut ov, &Serial).unwrap();
    drop(ov);
    (p, outs)
}

#[test]
fn a_mixed_precision_block_casts_at_its_edges() {
    // input(f16) -> Cast(f32) -> Relu -> Transpose -> Cast(f16) -> output,
    // and the float16 input transposed as is.
    let mut d = D::new(17);
    let x = d.input("x", 10, &[2, 3]);
    let f = cast(&mut d, &x, 1);
    let r = d.node("Relu", &[&f], vec![]);
    let t = d.node("Transpose", &[&r], vec![]);
    let y = cast(&mut d, &t, 10);
    let moved = d.node("Transpose", &[&x], vec![]);
    d.output(&y);
    d.output(&moved);
    let xs: Vec<u16> = vec![0x3c00, 0xbc00, 0x7e00, 0x0001, 0xfc00, 0x7bff];
    let (p, outs) = run_f16(&d, std::slice::from_ref(&xs));
    let relu = |h: u16| f32_to_f16(f16_to_f32(h).max(0.0));
    // NaN: Relu keeps it (max(NaN, 0) as ORT computes it is NaN).
    let want: Vec<u16> = [0, 3, 1, 4, 2, 5].iter().map(|&i| relu(xs[i])).collect();
    assert_eq!(outs[0][..2], want[..2]);
    assert_eq!(outs[0][4] & 0x7c00, 0x7c00, "NaN stays NaN");
    let moved_want: Vec<u16> = [0, 3, 1, 4, 2, 5].iter().map(|&i| xs[i]).collect();
    assert_eq!(outs[1], moved_want);
    let kinds: Vec<String> = p.steps().iter().map(|s| s.kind()).collect();
    assert!(kinds.contains(&"Cast float16->float".to_string()), "{kinds:?}");
    assert!(kinds.contains(&"Cast float->float16".to_string()), "{kinds:?}");
}

#[test]
fn float16_casts_to_every_dtype_go_through_float() {
    let mut d = D::new(17);
    let x = d.input("x", 10, &[6]);
    let outs: Vec<String> = [7, 6, 9, 10].iter().map(|&to| cast(&mut d, &x, to)).collect();
    let back: Vec<String> = outs[..3].iter().map(|o| cast(&mut d, o, 10)).collect();
    for o in back.iter().chain(&outs[3..]) {
        d.output(o);
    }
    // 2.5, -2.5, NaN, inf, -0, 65504
    let xs: Vec<u16> = vec![0x4100, 0xc100, 0x7e00, 0x7c00, 0x8000, 0x7bff];
    let (_, got) = run_f16(&d, std::slice::from_ref(&xs));
    // i64 and i32 truncate; NaN and inf give INT_MIN, which overflows float16 to -inf.
    assert_eq!(got[0], [0x4000, 0xc000, 0xfc00, 0xfc00, 0x0000, 0x7bff]);
    assert_eq!(got[1], [0x4000, 0xc000, 0xfc00, 0xfc00, 0x0000, 0x7bff]);
    // bool: x != 0, NaN true, -0 false.
    assert_eq!(got[2], [0x3c00, 0x3c00, 0x3c00, 0x3c00, 0x0000, 0x3c00]);
    assert_eq!(got[3], xs, "float16 -> float16 copies");
}

#[test]
fn a_float16_weight_is_cast_at_compile_time() {
    // A float16 weight bigger than the importer folds, cast to float for a MatMul.
    let (k, n) = (300usize, 256usize);
    let w: Vec<f32> = (0..k * n).map(|i| ((i % 97) as f32 - 48.0) / 64.0).collect();
    let mut d = D::new(17);
    let x = d.input("x", 1, &[2, k as i64]);
    let wh = d.init("w", tv_f16(&[k, n], &w));
    let wf = cast(&mut d, &wh, 1);
    let y = d.node("MatMul", &[&x, &wf], vec![]);
    d.output(&y);
    let verdicts = reasons(&d);
    assert!(verdicts.iter().all(|v| v.is_ok()), "{verdicts:?}");
    let ir = import(&d.g, &d.consts).unwrap();
    let p = compile(&ir, Target::Generic).unwrap();
    let kinds: Vec<String> = p.steps().iter().map(|s| s.kind()).collect();
    assert_eq!(kinds, ["MatMul"], "the Cast of the weight was folded");
    assert_eq!(p.packed_constants(), 1, "the cast weight is packed like a float one");
    let xs: Vec<f32> = (0..2 * k).map(|i| (i % 7) as f32 - 3.0).collect();
    let mut y = vec![0f32; 2 * n];
    p.run(
        Target::Generic,
        &[TensorRef::F32(&xs)],
        &mut [TensorMut::F32(&mut y)],
        &Serial,
    )
    .unwrap();
    // Small integers times multiples of 1/64: exact in any summation order.
    for j in [0, 1, n - 1] {
        let want: f32 = (0..k).map(|i| xs[i] * w[i * n + j]).sum();
        assert_eq!(y[j], want, "column {j}");
    }
}

#[test]
fn float16_arithmetic_is_left_to_ort_with_the_reason() {
    let mut d = D::new(17);
    let x = d.input("x", 10, &[2, 3]);
    let a = d.node("Add", &[&x, &x], vec![]);
    let r = d.node("Relu", &[&x], vec![]);
    let s = d.node("Softmax", &[&x], vec![]);
    let m = d.node("MatMul", &[&x, &x], vec![]);
    let c = d.node("Concat", &[&x, &x], vec![("axis", AttrValue::Int(0))]);
    for o in [&a, &r, &s, &m, &c] {
        d.output(o);
    }
    let res = reasons(&d);
    for v in &res[..4] {
        let e = v.clone().unwrap_err();
        assert!(e.contains("is float16: kiln leaves float16 arithmetic to ORT"), "{e}");
    }
    assert_eq!(res[4], Ok(()), "Concat only moves float16");
}

#[test]
fn float16_constants_fold_in_shape_arithmetic() {
    // ConstantOfShape with a float16 value and a Where over float16 constants.
    let mut d = D::new(17);
    let x = d.input("x", 10, &[2, 3]);
    let sh = d.node("Shape", &[&x], vec![]);
    let c = d.node(
        "ConstantOfShape",
        &[&sh],
        vec![("value", AttrValue::Tensor(tv_f16(&[1], &[0.1])))],
    );
    let cat = d.node("Concat", &[&x, &c], vec![("axis", AttrValue::Int(1))]);
    d.output(&cat);
    let xs: Vec<u16> = (0..6).map(|i| f32_to_f16(i as f32)).collect();
    let (_, got) = run_f16(&d, &[xs]);
    let tenth = f32_to_f16(0.1);
    assert_eq!(got[0][3..6], [tenth; 3]);
    assert_eq!(got[0][..3], [0x0000, 0x3c00, 0x4000]);
}

#[test]
fn casts_beside_float16_nodes_left_to_ort_stay_with_ort() {
    // x -> Cast(f16) -> Add(f16) -> Cast(f32) -> Relu: ORT computes the Add
    // in float and drops the Cast pairs it owns, so both Casts stay with it.
    let mut d = D::new(17);
    let x = d.input("x", 1, &[2, 3]);
    let h = cast(&mut d, &x, 10);
    let a = d.node("Add", &[&h, &h], vec![]);
    let f = cast(&mut d, &a, 1);
    let r = d.node("Relu", &[&f], vec![]);
    let t = d.node("Transpose", &[&h], vec![]);
    for v in [&h, &a] {
        // ORT types every value; the rule reads which ones are float16.
        d.g.values.insert(v.clone(), ValueDesc::new(10, &[2, 3]));
    }
    d.output(&r);
    d.output(&t);
    let res = reasons(&d);
    for k in [0, 2] {
        let e = res[k].clone().unwrap_err();
        assert!(e.contains("its float16 side meets node"), "{e}");
    }
    assert!(res[1].is_err());
    assert_eq!(res[3], Ok(()), "Relu on float is kiln's");
    assert_eq!(res[4], Ok(()), "Transpose only moves float16");
}
