//! Property tests of the context binary: random programs with random names,
//! targets and (shared) weights are written and read back equal; any
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
    let ir = crate::ir::import(&d.g, &d.consts).expect("import");
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
