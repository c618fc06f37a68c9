//! Property tests of shape inference: for random shapes and attributes, the
//! shape kiln infers on import equals the shape the reference interpreter
//! produces, and the compiled program's values equal the reference's.
//! Case counts are small so that all of them run in about a second.

use proptest::prelude::*;
use proptest::test_runner::Config;

use super::*;
use crate::compiler::import;

fn config() -> Config {
    Config {
        cases: 128,
        failure_persistence: None,
        ..Config::default()
    }
}

/// A random static shape of rank `0..=max_rank` with dims in `1..=4`.
fn shape(max_rank: usize) -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(1usize..=4, 0..=max_rank)
}

/// Two shapes that broadcast: `b` takes a suffix of `a`'s dims, each kept or
/// set to 1, and either may be the longer one.
fn broadcastable() -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
    (
        shape(4),
        prop::collection::vec(any::<bool>(), 4),
        0usize..=4,
        any::<bool>(),
    )
        .prop_map(|(a, ones, drop, swap)| {
            let skip = drop.min(a.len());
            let b: Vec<usize> = a[skip..]
                .iter()
                .zip(&ones)
                .map(|(&d, &one)| if one { 1 } else { d })
                .collect();
            if swap {
                (b, a)
            } else {
                (a, b)
            }
        })
}

fn dims(s: &[usize]) -> Vec<i64> {
    s.iter().map(|&d| d as i64).collect()
}

/// Imports `d` and returns the inferred shape of its only output, after
/// checking it equals the reference's and the compiled values match.
fn inferred_matches_reference(d: &D) -> Vec<usize> {
    let inputs = random_inputs(d, 5);
    let named: HashMap<String, T> = d.g.inputs.iter().cloned().zip(inputs.iter().cloned()).collect();
    let want = reference::run(&d.g, &d.consts, &named);
    let ir = import(&d.g, &d.consts).expect("import");
    let inferred = ir.ty(ir.outputs[0]).shape.clone();
    assert_eq!(inferred, want[0].shape, "inferred shape vs reference");
    check_and_run(d, &inputs, 2e-6);
    inferred
}

/// One node over one float input `x` of shape `s`, with constant inputs.
fn unary_graph(opset: i32, op: &str, s: &[usize], consts: &[TensorValue], attrs: Attrs) -> D {
    let mut d = D::new(opset);
    let mut ins = vec![d.input("x", 1, &dims(s))];
    for (i, t) in consts.iter().enumerate() {
        ins.push(d.init(&format!("c{i}"), t.clone()));
    }
    let refs: Vec<&str> = ins.iter().map(String::as_str).collect();
    let y = d.node(op, &refs, attrs);
    d.output(&y);
    d
}

/// `numel` split into a random shape of rank 1..=4 (its prime factors dealt out).
fn factor_shape(numel: usize, picks: &[usize]) -> Vec<usize> {
    let mut factors = Vec::new();
    let (mut n, mut p) = (numel, 2);
    while n > 1 {
        while n % p == 0 {
            factors.push(p);
            n /= p;
        }
        p += 1;
    }
    let rank = 1 + picks[0] % 4;
    let mut out = vec![1usize; rank];
    for (i, f) in factors.into_iter().enumerate() {
        out[picks[(i + 1) % picks.len()] % rank] *= f;
    }
    out
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn broadcasting_commutes_and_covers_both((a, b) in broadcastable()) {
        let ab = broadcast_shapes(&a, &b);
        prop_assert_eq!(&ab, &broadcast_shapes(&b, &a));
        let out = ab.expect("broadcastable shapes");
        prop_assert_eq!(out.len(), a.len().max(b.len()));
        for s in [&a, &b] {
            let pad = out.len() - s.len();
            for (i, &d) in s.iter().enumerate() {
                prop_assert!(d == out[pad + i] || d == 1);
            }
        }
    }

    #[test]
    fn mismatched_dims_do_not_broadcast(a in shape(3), extra in 2usize..=4) {
        // Append a dim to a copy that differs from a's last one and is not 1.
        let mut a = a;
        a.push(extra);
        let mut b = a.clone();
        *b.last_mut().unwrap() = extra + 1;
        prop_assert_eq!(broadcast_shapes(&a, &b), None);
    }

    #[test]
    fn binary_ops_infer_the_broadcast_shape(
        (a, b) in broadcastable(),
        op in prop::sample::select(vec!["Add", "Sub", "Mul", "Div"]),
    ) {
        let mut d = D::new(13);
        let x = d.input("x", 1, &dims(&a));
        let y = d.input("y", 1, &dims(&b));
        let z = d.node(op, &[&x, &y], vec![]);
        d.output(&z);
        let got = inferred_matches_reference(&d);
        prop_assert_eq!(Some(got), broadcast_shapes(&a, &b));
    }

    #[test]
    fn reshape_keeps_the_element_count(
        s in prop::collection::vec(1usize..=4, 1..=4),
        picks in prop::collection::vec(0usize..8, 6),
        infer_one in any::<bool>(),
        keep_first in any::<bool>(),
    ) {
        let numel: usize = s.iter().product();
        let target = factor_shape(numel, &picks);
        let mut spec: Vec<i64> = dims(&target);
        if keep_first && target[0] == s[0] {
            spec[0] = 0; // 0 copies the input's dim
        }
        if infer_one {
            let i = picks[5] % spec.len();
            spec[i] = -1;
        }
        let d = unary_graph(13, "Reshape", &s, &[tv_i64(&[spec.len()], &spec)], vec![]);
        let got = inferred_matches_reference(&d);
        prop_assert_eq!(got.iter().product::<usize>(), numel);
        prop_assert_eq!(got, target);
    }

    #[test]
    fn slice_infers_the_selected_counts(
        s in prop::collection::vec(1usize..=6, 1..=3),
        raw in prop::collection::vec((-8i64..8, -8i64..8, prop::sample::select(vec![-3i64, -2, -1, 1, 2, 3])), 3),
    ) {
        let r = s.len();
        let starts: Vec<i64> = raw[..r].iter().map(|x| x.0).collect();
        let ends: Vec<i64> = raw[..r].iter().map(|x| x.1).collect();
        let steps: Vec<i64> = raw[..r].iter().map(|x| x.2).collect();
        let axes: Vec<i64> = (0..r as i64).collect();
        let consts = [tv_i64(&[r], &starts), tv_i64(&[r], &ends), tv_i64(&[r], &axes), tv_i64(&[r], &steps)];
        let d = unary_graph(13, "Slice", &s, &consts, vec![]);
        inferred_matches_reference(&d);
    }

    #[test]
    fn transpose_permutes_the_shape(s in shape(4), seed in any::<u64>()) {
        let mut perm: Vec<usize> = (0..s.len()).collect();
        // A seeded Fisher-Yates shuffle.
        let mut x = seed | 1;
        for i in (1..perm.len()).rev() {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            perm.swap(i, (x % (i as u64 + 1)) as usize);
        }
        let p: Vec<i64> = perm.iter().map(|&i| i as i64).collect();
        let d = unary_graph(13, "Transpose", &s, &[], vec![("perm", ints(&p))]);
        let got = inferred_matches_reference(&d);
        let want: Vec<usize> = perm.iter().map(|&i| s[i]).collect();
        prop_assert_eq!(got, want);
    }

    /// Over a run of adjacent axes (kiln refuses non-adjacent ones in check_support).
    #[test]
    fn reductions_drop_or_keep_their_axes(
        s in prop::collection::vec(1usize..=4, 1..=4),
        first in 0usize..4,
        count in 1usize..=4,
        negative in any::<bool>(),
        keepdims in any::<bool>(),
        op in prop::sample::select(vec!["ReduceSum", "ReduceMean", "ReduceMax"]),
    ) {
        let r = s.len();
        let first = first % r;
        let reduced = first..(first + count).min(r);
        let axes: Vec<i64> = reduced
            .clone()
            .map(|i| if negative { i as i64 - r as i64 } else { i as i64 })
            .collect();
        // Opset 13: ReduceSum takes its axes as an input, the others as an attribute.
        let keep = ("keepdims", AttrValue::Int(keepdims as i64));
        let d = if op == "ReduceSum" {
            unary_graph(13, op, &s, &[tv_i64(&[axes.len()], &axes)], vec![keep])
        } else {
            unary_graph(13, op, &s, &[], vec![("axes", ints(&axes)), keep])
        };
        let got = inferred_matches_reference(&d);
        let want: Vec<usize> = (0..r)
            .filter_map(|i| match (reduced.contains(&i), keepdims) {
                (true, true) => Some(1),
                (true, false) => None,
                (false, _) => Some(s[i]),
            })
            .collect();
        prop_assert_eq!(got, want);
    }

    #[test]
    fn concat_adds_along_its_axis(
        s in prop::collection::vec(1usize..=4, 1..=3),
        other in 1usize..=4,
        axis_pick in 0usize..3,
        negative in any::<bool>(),
    ) {
        let axis = axis_pick % s.len();
        let mut t = s.clone();
        t[axis] = other;
        let mut d = D::new(13);
        let x = d.input("x", 1, &dims(&s));
        let y = d.input("y", 1, &dims(&t));
        let a = if negative { axis as i64 - s.len() as i64 } else { axis as i64 };
        let z = d.node("Concat", &[&x, &y], vec![("axis", AttrValue::Int(a))]);
        d.output(&z);
        let got = inferred_matches_reference(&d);
        let mut want = s.clone();
        want[axis] += other;
        prop_assert_eq!(got, want);
    }

    #[test]
    fn unsqueeze_then_squeeze_is_the_identity_shape(
        s in shape(3),
        at in prop::collection::vec(0usize..5, 1..=2),
    ) {
        let out_rank = s.len() + at.len();
        let mut axes: Vec<i64> = at.iter().map(|&a| (a % out_rank) as i64).collect();
        axes.sort();
        axes.dedup();
        if axes.len() < at.len() {
            axes = vec![(at[0] % (s.len() + 1)) as i64];
        }
        let mut d = D::new(13);
        let x = d.input("x", 1, &dims(&s));
        let ax = d.i64s("axes", &axes);
        let u = d.node("Unsqueeze", &[&x, &ax], vec![]);
        let y = d.node("Squeeze", &[&u, &ax], vec![]);
        d.output(&y);
        let got = inferred_matches_reference(&d);
        prop_assert_eq!(got, s);
    }
}

/// Found by the node_import fuzzer (fuzz/regressions/node_import/
/// reduce-of-a-scalar-without-axes): lowering a reduction of a rank-0 input
/// without axes indexed dim 0 of an empty shape and panicked. Reducing a
/// scalar over all (no) dims gives the scalar.
#[test]
fn reductions_of_a_scalar_are_the_scalar() {
    for op in ["ReduceSum", "ReduceMean", "ReduceMax"] {
        for keepdims in [0, 1] {
            let d = unary_graph(13, op, &[], &[], vec![("keepdims", AttrValue::Int(keepdims))]);
            assert_eq!(inferred_matches_reference(&d), Vec::<usize>::new(), "{op}");
        }
    }
}

/// Found by the node_import fuzzer (fuzz/regressions/node_import/slow-unit-1):
/// a MatMul of empty tensors with batch dims [120, 112, 45, 49] made lowering
/// build a 16-byte entry for each of its 30 million batches (with larger dims,
/// gigabytes: an allocation failure aborts the host process). An empty
/// product now has no batches, and still matches the reference.
#[test]
fn empty_batched_matmul_has_no_batch_table() {
    let mut d = D::new(17);
    let a = d.input("a", 1, &[1, 1, 0]);
    // Fewer batches than the fuzzer's, so the reference interpreter stays quick.
    let b = d.input("b", 1, &[20, 20, 20, 20, 0, 0]);
    let y = d.node("MatMul", &[&a, &b], vec![]);
    d.output(&y);
    assert_eq!(inferred_matches_reference(&d), vec![20, 20, 20, 20, 1, 0]);
    let p = crate::compiler::compile(&import(&d.g, &d.consts).unwrap(), Target::Generic).unwrap();
    for step in p.steps() {
        if let crate::plan::Step::MatMul(m) = step {
            assert!(m.batches.is_empty(), "{} batches", m.batches.len());
        }
    }
}
