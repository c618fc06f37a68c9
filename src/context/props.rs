//! Property tests of the context binary: random programs with random names,
//! targets and (shared) weights, and random shape-generic graphs (every
//! attribute kind, symbolic and unknown dims, constants of every type,
//! packed weights), are written and read back equal; any
//! single-byte corruption is refused with `InvalidGraph`, and with the
//! checksum recomputed it is refused or loads something that runs, never a
//! panic. Case counts keep the whole file at about a second.

use std::sync::Arc;

use proptest::prelude::*;
use proptest::test_runner::Config;

use super::tests::assert_same_program;
use super::*;
use crate::compiler::compile;
use crate::error::ErrorKind;
use crate::ir::tests::{ints, tv_f32, D};
use crate::plan::{AlignedBytes, Program};
use crate::target::Target;

fn config(cases: u32) -> Config {
    Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    }
}

/// One random graph: x[m, k] → MatMul(W[k, n]) (packed on AVX targets) →
/// a chain of elementwise ops with row constants, some shared between graphs
/// (`shared_seed` makes the same bytes).
#[derive(Clone, Debug)]
struct Spec {
    name: String,
    m: usize,
    k: usize,
    n: usize,
    matmul: bool,
    ops: Vec<(u8, u8)>,
    transpose: bool,
}

fn spec() -> impl Strategy<Value = Spec> {
    (
        "[a-zA-Z0-9_./ -]{1,12}",
        1usize..5,
        1usize..9,
        1usize..9,
        any::<bool>(),
        prop::collection::vec((0u8..7, 0u8..3), 0..5),
        any::<bool>(),
    )
        .prop_map(|(name, m, k, n, matmul, ops, transpose)| Spec {
            name,
            m,
            k,
            n,
            matmul,
            ops,
            transpose,
        })
}

fn program(s: &Spec, target: Target) -> Program {
    let mut d = D::new(13);
    let mut y = d.input("x", 1, &[s.m as i64, s.k as i64]);
    let mut width = s.k;
    if s.matmul {
        let w = d.f32s("W", &[s.k, s.n], 7);
        y = d.node("MatMul", &[&y, &w], vec![]);
        width = s.n;
    }
    for (i, &(op, seed)) in s.ops.iter().enumerate() {
        y = match op {
            0 => d.node("Relu", &[&y], vec![]),
            1 => d.node("Tanh", &[&y], vec![]),
            2 => d.node("Sigmoid", &[&y], vec![]),
            _ => {
                // The seed, not the position, picks the values: equal seeds share a weight.
                // Never 0, so Div gives no NaN (which would not compare equal).
                let v: Vec<f32> = (0..width).map(|j| (j as f32 + seed as f32) * 0.25 + 0.5).collect();
                let c = d.init(&format!("c{i}"), tv_f32(&[width], &v));
                let bin = ["Add", "Sub", "Mul", "Div"][(op - 3) as usize];
                d.node(bin, &[&y, &c], vec![])
            }
        };
    }
    if s.transpose {
        y = d.node("Transpose", &[&y], vec![("perm", ints(&[1, 0]))]);
    }
    d.output(&y);
    let ir = crate::compiler::import(&d.g, &d.consts).expect("import");
    compile(&ir, target).expect("compile")
}

fn unique_names(specs: Vec<Spec>) -> Vec<Spec> {
    let mut out: Vec<Spec> = Vec::new();
    for s in specs {
        if !out.iter().any(|o| o.name == s.name) {
            out.push(s);
        }
    }
    out
}

fn write(specs: &[Spec], target: Target) -> (Vec<u8>, Vec<Program>) {
    let mut b = ContextBuilder::new(target);
    let programs: Vec<Program> = specs.iter().map(|s| program(s, target)).collect();
    for (s, p) in specs.iter().zip(&programs) {
        b.add_graph(&s.name, p).expect("add_graph");
    }
    (b.to_bytes().expect("write"), programs)
}

fn parse(bytes: &[u8]) -> crate::error::Result<ContextBinary> {
    ContextBinary::parse(Arc::new(AlignedBytes::copy_from(bytes)))
}

fn target() -> impl Strategy<Value = Target> {
    prop::sample::select(Target::ALL.to_vec())
}

proptest! {
    #![proptest_config(config(64))]

    #[test]
    fn written_binaries_read_back_equal(
        specs in prop::collection::vec(spec(), 1..4).prop_map(unique_names),
        target in target(),
    ) {
        let (bytes, programs) = write(&specs, target);
        let ctx = parse(&bytes).expect("parse what was written");
        let names: Vec<String> = specs.iter().map(|s| s.name.clone()).collect();
        prop_assert_eq!(ctx.graph_names(), names);
        prop_assert_eq!(ctx.target(), target);
        prop_assert_eq!(ctx.kiln_version(), KILN_VERSION);
        for (s, want) in specs.iter().zip(&programs) {
            let got = ctx.program(&s.name).unwrap().expect("graph present");
            if target.can_run_on(Target::cpu_best()) {
                assert_same_program(&got, want);
            } else {
                prop_assert_eq!(got.steps(), want.steps());
                prop_assert_eq!(got.constants().len(), want.constants().len());
            }
        }
        // Weights are stored once: writing the same graphs twice adds no weight.
        let mut twice = specs.clone();
        twice.extend(specs.iter().map(|s| Spec { name: format!("{}#2", s.name), ..s.clone() }));
        let (bytes2, _) = write(&unique_names(twice), target);
        prop_assert_eq!(parse(&bytes2).unwrap().num_weights(), ctx.num_weights());
    }

    #[test]
    fn any_flipped_byte_is_refused_cleanly(
        s in spec(),
        target in target(),
        at in any::<prop::sample::Index>(),
        xor in 1u8..=255,
    ) {
        let (mut bytes, _) = write(&[s], target);
        let i = at.index(bytes.len());
        bytes[i] ^= xor;
        let e = parse(&bytes).expect_err("a flipped byte must be detected");
        prop_assert_eq!(e.kind, ErrorKind::InvalidGraph, "{}", e);
        // With the checksum made to match, the parser itself must cope: a clean
        // refusal, or a binary whose programs run (the fuzz target checks both).
        crate::fuzzing::context_binary(&bytes);
    }

    #[test]
    fn any_truncation_is_refused(s in spec(), at in any::<prop::sample::Index>()) {
        let (bytes, _) = write(&[s], Target::Generic);
        let cut = &bytes[..at.index(bytes.len())];
        prop_assert_eq!(parse(cut).expect_err("truncated").kind, ErrorKind::InvalidGraph);
        crate::fuzzing::context_binary(cut);
    }
}

// ---- shape-generic graphs (format 2) ----

use std::collections::{BTreeMap, HashMap};

use super::generic_tests::assert_same_generic;
use crate::compiler::generic::{GenericGraph, NamedConstant, PackedConstant};
use crate::ir::{AttrValue, DType, GraphDesc, NodeDesc, TensorValue, ValueDesc};
use crate::kernels::gemm::PackedB;
use crate::plan::Weight;

const NAMES: &[&str] = &["x", "y", "w", "b", "t0", "t1", "batch/seq", "é"];

fn name() -> impl Strategy<Value = String> {
    prop::sample::select(NAMES).prop_map(str::to_string)
}

fn finite() -> impl Strategy<Value = f32> {
    prop::num::f32::NORMAL | prop::num::f32::SUBNORMAL | prop::num::f32::ZERO | prop::num::f32::INFINITE
}

fn tensor_value() -> impl Strategy<Value = TensorValue> {
    (
        prop::sample::select(vec![(1, 4), (6, 4), (7, 8), (9, 1), (10, 2), (11, 8), (2, 1)]),
        prop::collection::vec(0usize..4, 0..3),
    )
        .prop_flat_map(|((elem_type, size), shape)| {
            let len = shape.iter().product::<usize>() * size;
            prop::collection::vec(any::<u8>(), len).prop_map(move |bytes| TensorValue {
                elem_type,
                shape: shape.clone(),
                bytes,
            })
        })
}

fn attr() -> impl Strategy<Value = AttrValue> {
    prop_oneof![
        any::<i64>().prop_map(AttrValue::Int),
        prop::collection::vec(any::<i64>(), 0..4).prop_map(AttrValue::Ints),
        finite().prop_map(AttrValue::Float),
        prop::collection::vec(finite(), 0..4).prop_map(AttrValue::Floats),
        ".{0,6}".prop_map(AttrValue::String),
        prop::collection::vec(".{0,4}", 0..3).prop_map(AttrValue::Strings),
        tensor_value().prop_map(AttrValue::Tensor),
        "[a-z ]{1,10}".prop_map(AttrValue::Unsupported),
    ]
}

fn node() -> impl Strategy<Value = NodeDesc> {
    (
        "[A-Za-z]{1,8}",
        prop::sample::select(vec!["", "com.microsoft", "ai.onnx.ml"]),
        -1i32..25,
        prop::collection::vec(prop_oneof![name(), Just(String::new())], 0..4),
        prop::collection::vec(name(), 0..3),
        prop::collection::btree_map("[a-z_]{1,6}", attr(), 0..4),
    )
        .prop_map(|(op_type, domain, since_version, inputs, outputs, attrs)| NodeDesc {
            name: format!("{op_type}_n"),
            domain: domain.to_string(),
            op_type,
            since_version,
            inputs,
            outputs,
            attrs: attrs.into_iter().collect::<BTreeMap<_, _>>(),
        })
}

fn value_desc() -> impl Strategy<Value = ValueDesc> {
    let dims = prop::option::weighted(0.85, prop::collection::vec(-1i64..6, 0..4));
    (0i32..17, dims, any::<bool>()).prop_flat_map(|(elem_type, dims, named)| {
        let rank = dims.as_ref().map_or(0, Vec::len);
        let params = prop::collection::vec(prop::sample::select(vec!["", "batch", "sequence_length"]), rank);
        params.prop_map(move |params| ValueDesc {
            elem_type,
            dims: dims.clone(),
            dim_params: if named {
                params.iter().map(|s| s.to_string()).collect()
            } else {
                Vec::new()
            },
        })
    })
}

fn desc() -> impl Strategy<Value = GraphDesc> {
    (
        prop::collection::vec(node(), 0..4),
        prop::collection::hash_map(name(), value_desc(), 0..6),
        prop::collection::vec(name(), 0..3),
        prop::collection::vec(name(), 0..3),
    )
        .prop_map(|(nodes, values, inputs, outputs)| GraphDesc {
            nodes,
            values: values.into_iter().collect::<HashMap<_, _>>(),
            inputs,
            outputs,
        })
}

/// Constants `c0, c1, ...` of random types and shapes; every 2-D float one
/// with `pack` set is also packed (as `[k, n]`, or `[n, k]` with `trans_b`).
/// A constant: type, shape, bytes, and whether (and how: `trans_b`) to pack it.
type RandomWeight = (DType, Vec<usize>, Vec<u8>, Option<bool>);

fn weights() -> impl Strategy<Value = Vec<RandomWeight>> {
    let one = (
        prop::sample::select(DType::ALL.to_vec()),
        prop::collection::vec(1usize..6, 0..3),
    )
        .prop_flat_map(|(dtype, shape)| {
            let len = shape.iter().product::<usize>() * dtype.size();
            let pack = prop::option::of(any::<bool>());
            // Bytes of a seed, so that equal seeds make equal (shared) weights.
            (0u8..3, pack).prop_map(move |(seed, pack)| {
                let bytes = (0..len)
                    .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
                    .collect();
                (dtype, shape.clone(), bytes, pack)
            })
        });
    prop::collection::vec(one, 0..5)
}

fn generic_graph(desc: GraphDesc, weights: &[RandomWeight], target: Target) -> GenericGraph {
    let mut constants = Vec::new();
    let mut packed = Vec::new();
    for (i, (dtype, shape, bytes, pack)) in weights.iter().enumerate() {
        let c = NamedConstant {
            name: format!("c{i}"),
            dtype: *dtype,
            shape: shape.clone(),
            data: Weight::from_bytes(bytes),
        };
        if let (DType::F32, [r, s], Some(trans_b)) = (dtype, &shape[..], pack) {
            let (k, n) = if *trans_b { (*s, *r) } else { (*r, *s) };
            let b = PackedB::pack(target, c.data.as_slice(), k, n, *trans_b);
            packed.push(PackedConstant {
                source: c.name.clone(),
                conv_group: None,
                trans_b: *trans_b,
                k,
                n,
                data: b.data().clone(),
            });
        }
        constants.push(c);
    }
    GenericGraph {
        desc,
        constants,
        packed,
        target,
        // Both values of the option, as the drawn weights fall.
        winograd: weights.len().is_multiple_of(2),
    }
}

fn write_generic(graphs: &[GenericGraph], with_program: Option<&Spec>, target: Target) -> Vec<u8> {
    let mut b = ContextBuilder::new(target);
    if let Some(s) = with_program {
        b.add_graph("program", &program(s, target)).expect("add_graph");
    }
    for (i, g) in graphs.iter().enumerate() {
        b.add_generic(&format!("g{i}"), g).expect("add_generic");
    }
    b.to_bytes().expect("write")
}

proptest! {
    #![proptest_config(config(48))]

    #[test]
    fn generic_graphs_read_back_equal(
        parts in prop::collection::vec((desc(), weights()), 1..3),
        program in prop::option::of(spec()),
        target in target(),
    ) {
        let graphs: Vec<GenericGraph> = parts.into_iter().map(|(d, w)| generic_graph(d, &w, target)).collect();
        let bytes = write_generic(&graphs, program.as_ref(), target);
        let ctx = parse(&bytes).expect("parse what was written");
        prop_assert_eq!(ctx.format_version(), FORMAT_VERSION);
        for (i, want) in graphs.iter().enumerate() {
            match ctx.stored_graph(&format!("g{i}")) {
                Some(StoredGraph::Generic(got)) => assert_same_generic(&got, want),
                other => prop_assert!(false, "g{} is {:?}", i, other),
            }
        }
        // Each distinct weight (type, shape, packing, bytes) once, whichever graph has it.
        type Key<'a> = (DType, Vec<usize>, Option<bool>, &'a [u8]);
        let mut distinct: Vec<Key> = Vec::new();
        for g in &graphs {
            let plain = g.constants.iter().map(|c| (c.dtype, c.shape.clone(), None, c.data.as_bytes()));
            let packed = g.packed.iter().map(|p| (DType::F32, vec![p.k, p.n], Some(true), p.data.as_bytes()));
            for w in plain.chain(packed) {
                if !distinct.contains(&w) {
                    distinct.push(w);
                }
            }
        }
        if program.is_none() {
            prop_assert_eq!(ctx.num_weights(), distinct.len());
        }
        crate::fuzzing::context_binary(&bytes);
    }

    #[test]
    fn any_flipped_byte_of_a_generic_graph_is_refused_cleanly(
        d in desc(),
        w in weights(),
        target in target(),
        at in any::<prop::sample::Index>(),
        xor in 1u8..=255,
    ) {
        let mut bytes = write_generic(&[generic_graph(d, &w, target)], None, target);
        let i = at.index(bytes.len());
        bytes[i] ^= xor;
        let e = parse(&bytes).expect_err("a flipped byte must be detected");
        prop_assert_eq!(e.kind, ErrorKind::InvalidGraph, "{}", e);
        crate::fuzzing::context_binary(&bytes);
    }
}
