//! Shape-generic partitions: one `GenericGraph` specialised at several input
//! shapes agrees with the reference, packs its weights once and caches
//! programs in a bounded LRU.

use std::collections::HashMap;

use super::generic::{GenericGraph, Specializer};
use crate::compiler::check_support;
use crate::ir::tests::{compare, data, reference, run_program, tv_i64, D, T};
use crate::ir::{AttrValue, ValueDesc};
use crate::kernels::parallel::Serial;
use crate::target::Target;

/// An MLP layer over `[batch, seq, 16]` and a `Shape → Gather → Concat →
/// Reshape` chain that folds only once the dims are known.
fn encoder_like() -> D {
    let mut d = D::new(17);
    let x = d.input("x", 1, &[-1, -1, 16]);
    d.g.values
        .insert("x".into(), ValueDesc::named(1, &[-1, -1, 16], &["batch", "seq", ""]));
    let w = d.f32s("w", &[16, 32], 1);
    let b = d.f32s("b", &[32], 2);
    let y = d.node("MatMul", &[&x, &w], vec![]);
    let y = d.node("Add", &[&y, &b], vec![]);
    let y = d.node("Relu", &[&y], vec![]);
    let shape = d.node("Shape", &[&y], vec![]);
    let zero = d.init("zero", tv_i64(&[1], &[0]));
    let one = d.init("one", tv_i64(&[1], &[1]));
    let b0 = d.node("Gather", &[&shape, &zero], vec![("axis", AttrValue::Int(0))]);
    let s1 = d.node("Gather", &[&shape, &one], vec![("axis", AttrValue::Int(0))]);
    let heads = d.i64s("heads", &[4, 8]);
    let target = d.node("Concat", &[&b0, &s1, &heads], vec![("axis", AttrValue::Int(0))]);
    let r = d.node("Reshape", &[&y, &target], vec![]);
    let t = d.node("Transpose", &[&r], vec![("perm", AttrValue::Ints(vec![0, 2, 1, 3]))]);
    d.output(&t);
    d
}

fn inputs_at(batch: usize, seq: usize) -> Vec<T> {
    let n = batch * seq * 16;
    vec![T::new(
        1,
        &[batch, seq, 16],
        data(n, 7).iter().map(|&v| v as f64).collect(),
    )]
}

fn specializer(d: &D, capacity: usize) -> Specializer {
    for (n, v) in d.g.nodes.iter().zip(check_support(&d.g, &d.consts, &[])) {
        assert_eq!(v, Ok(()), "node {} ({})", n.name, n.op_type);
    }
    let g = GenericGraph::build(d.g.clone(), &d.consts, Target::cpu_best()).unwrap();
    Specializer::new(g, capacity).unwrap()
}

#[test]
fn one_generic_graph_runs_at_every_shape() {
    let d = encoder_like();
    let s = specializer(&d, 8);
    assert!(!GenericGraph::is_static(&d.g));
    assert_eq!(s.generic().packed.len(), 1, "the MatMul weight is packed at build");
    for (batch, seq) in [(1, 1), (2, 5), (3, 7), (1, 128)] {
        let ins = inputs_at(batch, seq);
        let (p, built) = s.program_for(&[vec![batch as i64, seq as i64, 16]]).unwrap();
        assert!(built);
        let mut fixed = d.g.clone();
        fixed.values.get_mut("x").unwrap().dims = Some(vec![batch as i64, seq as i64, 16]);
        let named: HashMap<String, T> = [("x".to_string(), ins[0].clone())].into();
        let want = reference::run(&fixed, &d.consts, &named);
        compare(&run_program(&p, &ins, &Serial), &want, 1e-5);
        assert_eq!(p.outputs()[0].shape, vec![batch, 4, seq, 8]);
    }
}

#[test]
fn specialisations_reuse_the_packed_weights() {
    let d = encoder_like();
    let s = specializer(&d, 8);
    let packed = s.generic().packed[0].data.as_bytes().as_ptr();
    for batch in [1, 2] {
        let (p, _) = s.program_for(&[vec![batch, 3, 16]]).unwrap();
        let shares = p.constants().iter().any(|c| c.data.as_bytes().as_ptr() == packed);
        assert!(shares, "batch {batch}: the program packs its own copy of the weight");
    }
}

#[test]
fn the_shape_cache_is_a_bounded_lru() {
    let d = encoder_like();
    let s = specializer(&d, 2);
    let at = |b: i64| vec![vec![b, 2, 16]];
    let built = |b: i64| s.program_for(&at(b)).unwrap().1;
    assert!(built(1));
    assert!(built(2));
    assert!(!built(1), "cached");
    assert!(built(3), "evicts 2, the least recently used");
    assert!(!built(1));
    assert!(built(2));
    assert_eq!(s.cached(), 2);
}

#[test]
fn a_shape_the_model_does_not_accept_is_refused_clearly() {
    let d = encoder_like();
    let s = specializer(&d, 2);
    let e = s.program_for(&[vec![2, 3, 15]]).unwrap_err();
    assert!(e.message.contains("'x' [batch,seq,16]"), "{e}");
    let e = s.program_for(&[vec![2, 3]]).unwrap_err();
    assert!(e.message.contains("cannot be [2, 3]"), "{e}");
}

#[test]
fn a_symbol_may_take_different_sizes_in_different_inputs() {
    // ORT does not enforce dim_params (PP-OCR's classifier names both H
    // and W `?`): the ops at the real sizes decide.
    let mut d = D::new(17);
    let a = d.input("a", 1, &[-1, 4]);
    let b = d.input("b", 1, &[-1, 4]);
    d.g.values.insert("a".into(), ValueDesc::named(1, &[-1, 4], &["n", ""]));
    d.g.values.insert("b".into(), ValueDesc::named(1, &[-1, 4], &["n", ""]));
    let y = d.node("Add", &[&a, &b], vec![]);
    d.output(&y);
    let s = specializer(&d, 2);
    assert!(s.program_for(&[vec![3, 4], vec![3, 4]]).is_ok());
    assert!(s.program_for(&[vec![3, 4], vec![1, 4]]).is_ok(), "broadcasts");
    let e = s.program_for(&[vec![3, 4], vec![2, 4]]).unwrap_err();
    assert!(e.message.contains("do not broadcast"), "{e}");
}

#[test]
fn placeholder_dim_params_name_nothing() {
    let v = ValueDesc::named(1, &[-1, 3, -1, -1], &["batch", "", "?", "?"]);
    assert_eq!(v.dim_param(0), Some("batch"));
    assert_eq!((v.dim_param(2), v.dim_param(3)), (None, None));
    let dims = v.symbolic_dims("x").unwrap();
    assert_ne!(dims[2], dims[3], "two '?' dims are two unknowns");
}

/// A BERT layer with symbolic batch and sequence: every specialisation
/// reads Q, K and V's projections as one product over three parts, and the
/// parts are the weights packed once at build (none packed again, none
/// concatenated), with the reference's results.
#[test]
fn merged_projections_read_the_weights_packed_at_build() {
    use crate::ir::tests::{bert_layer, Bert};
    use crate::plan::{MatB, Step};
    let mut d = bert_layer(Bert {
        mask: true,
        fused_layernorm: true,
    });
    for name in ["input_ids", "attention_mask"] {
        d.g.values
            .insert(name.into(), ValueDesc::named(7, &[-1, -1], &["batch", "seq"]));
    }
    let s = specializer(&d, 8);
    let built: Vec<*const u8> = s.generic().packed.iter().map(|p| p.data.as_bytes().as_ptr()).collect();
    for (batch, seq) in [(1, 3), (2, 6)] {
        let (p, _) = s.program_for(&[vec![batch, seq], vec![batch, seq]]).unwrap();
        let parts = p
            .steps()
            .iter()
            .find_map(|st| match st {
                Step::MatMul(m) => match m.b {
                    MatB::PackedParts(cs) => Some(cs),
                    _ => None,
                },
                _ => None,
            })
            .unwrap_or_else(|| panic!("no merged product: {}", p.op_summary()));
        for c in parts {
            let at = p.constants()[c].data.as_bytes().as_ptr();
            assert!(
                built.contains(&at),
                "batch {batch} seq {seq}: part {c} was packed again"
            );
        }
        let (b, n) = (batch as usize, seq as usize);
        let ids = T::new(7, &[b, n], (0..b * n).map(|i| ((i * 7) % 50) as f64).collect());
        let mask = T::new(
            7,
            &[b, n],
            (0..b * n)
                .map(|i| if i % n == n - 1 && n > 3 { 0.0 } else { 1.0 })
                .collect(),
        );
        let mut fixed = d.g.clone();
        for name in ["input_ids", "attention_mask"] {
            fixed.values.get_mut(name).unwrap().dims = Some(vec![batch, seq]);
        }
        let named: HashMap<String, T> = [
            ("input_ids".to_string(), ids.clone()),
            ("attention_mask".to_string(), mask.clone()),
        ]
        .into();
        let want = reference::run(&fixed, &d.consts, &named);
        compare(&run_program(&p, &[ids, mask], &Serial), &want, 2e-5);
    }
}
