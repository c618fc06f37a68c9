//! Format 2: shape-generic graph records (round trips, sharing weights with
//! programs, hostile records, writer refusals), and reading format 1.

use super::header::Header;
use super::tests::{graph_a, graph_b, metadata_of, parse, refused, storage, tamper};
use super::*;
use crate::compiler::compile;
use crate::compiler::generic::{GenericGraph, NamedConstant, PackedConstant};
use crate::error::ErrorKind;
use crate::ir::tests::{bert_layer, mlp, random_inputs, run_program, Bert, D};
use crate::ir::{AttrValue, DType, GraphDesc, TensorValue};
use crate::kernels::gemm::PackedB;
use crate::kernels::parallel::Serial;
use crate::plan::{Packing, Weight};
use crate::target::Target;

/// `d` as a generic graph for `target`: its constants (sorted by name), every
/// 2-D float constant a MatMul or Gemm reads as B packed; with `symbolic`, the
/// inputs' first dim becomes the named unknown `batch`.
pub(super) fn generic_of(d: &D, target: Target, symbolic: bool) -> GenericGraph {
    let mut names: Vec<&String> = d.consts.keys().collect();
    names.sort();
    let constants: Vec<NamedConstant> = names
        .iter()
        .map(|&n| {
            let t = &d.consts[n];
            NamedConstant {
                name: n.clone(),
                dtype: DType::from_onnx(t.elem_type).unwrap(),
                shape: t.shape.clone(),
                data: Weight::from_bytes(&t.bytes),
            }
        })
        .collect();
    let mut packed = Vec::new();
    for node in &d.g.nodes {
        let trans_b = match (node.op_type.as_str(), node.attrs.get("transB")) {
            ("MatMul", _) | ("Gemm", None | Some(AttrValue::Int(0))) => false,
            ("Gemm", Some(AttrValue::Int(1))) => true,
            _ => continue,
        };
        let Some(c) = constants.iter().find(|c| c.name == node.inputs[1]) else {
            continue;
        };
        if c.shape.len() != 2 || packed.iter().any(|p: &PackedConstant| p.source == c.name) {
            continue;
        }
        let (k, n) = if trans_b {
            (c.shape[1], c.shape[0])
        } else {
            (c.shape[0], c.shape[1])
        };
        let b = PackedB::pack(target, c.data.as_slice(), k, n, trans_b);
        packed.push(PackedConstant {
            source: c.name.clone(),
            conv_group: None,
            trans_b,
            k,
            n,
            data: b.data().clone(),
        });
    }
    let mut desc = d.g.clone();
    if symbolic {
        for name in &desc.inputs {
            let v = desc.values.get_mut(name).unwrap();
            let rank = v.dims.as_ref().map_or(0, Vec::len);
            if rank > 0 {
                v.dims.as_mut().unwrap()[0] = -1;
                v.dim_params = (0..rank)
                    .map(|i| if i == 0 { "batch".into() } else { String::new() })
                    .collect();
            }
        }
    }
    GenericGraph {
        desc,
        constants,
        packed,
        target,
        winograd: true,
    }
}

pub(super) fn assert_same_desc(got: &GraphDesc, want: &GraphDesc) {
    assert_eq!(got.nodes, want.nodes);
    assert_eq!(got.values, want.values);
    assert_eq!(got.inputs, want.inputs);
    assert_eq!(got.outputs, want.outputs);
}

pub(super) fn assert_same_generic(got: &GenericGraph, want: &GenericGraph) {
    assert_eq!((got.target, got.winograd), (want.target, want.winograd));
    assert_same_desc(&got.desc, &want.desc);
    assert_eq!(got.constants.len(), want.constants.len());
    for (g, w) in got.constants.iter().zip(&want.constants) {
        assert_eq!((&g.name, g.dtype, &g.shape), (&w.name, w.dtype, &w.shape));
        assert_eq!(g.data.as_bytes(), w.data.as_bytes(), "{}", g.name);
    }
    assert_eq!(got.packed.len(), want.packed.len());
    for (g, w) in got.packed.iter().zip(&want.packed) {
        assert_eq!((&g.source, g.trans_b, g.k, g.n), (&w.source, w.trans_b, w.k, w.n));
        assert_eq!(g.data.as_bytes(), w.data.as_bytes(), "{}", g.source);
    }
}

fn generic(ctx: &ContextBinary, name: &str) -> GenericGraph {
    match ctx.stored_graph(name) {
        Some(StoredGraph::Generic(g)) => g,
        other => panic!("'{name}' is not a generic graph: {other:?}"),
    }
}

/// Every attribute kind, value types of every form (static, -1, named,
/// unknown rank), a tensor attribute and a node with an omitted input.
fn odd_desc() -> GenericGraph {
    let d = mlp();
    let mut g = generic_of(&d, Target::Generic, true);
    let node = &mut g.desc.nodes[0];
    node.attrs.insert("f".into(), AttrValue::Float(f32::MIN_POSITIVE / 3.0));
    node.attrs
        .insert("fs".into(), AttrValue::Floats(vec![1.5, -0.0, f32::INFINITY]));
    node.attrs.insert("i".into(), AttrValue::Int(i64::MIN));
    node.attrs.insert("is".into(), AttrValue::Ints(vec![-1, 0, i64::MAX]));
    node.attrs.insert("s".into(), AttrValue::String("héllo".into()));
    node.attrs
        .insert("ss".into(), AttrValue::Strings(vec!["".into(), "b".into()]));
    node.attrs
        .insert("u".into(), AttrValue::Unsupported("attribute type GRAPH".into()));
    let t = TensorValue {
        elem_type: 7,
        shape: vec![2, 1],
        bytes: [3i64, -4].iter().flat_map(|v| v.to_le_bytes()).collect(),
    };
    node.attrs.insert("t".into(), AttrValue::Tensor(t));
    node.domain = "com.example".into();
    node.inputs.push(String::new());
    let v = g.desc.values.get_mut("b1").unwrap();
    v.dims = None;
    v.dim_params.clear();
    g.desc
        .values
        .insert("unknown_dims".into(), crate::ir::ValueDesc::new(0, &[-1, 3, -1]));
    g
}

#[test]
fn generic_graphs_round_trip_beside_programs() {
    for target in Target::ALL {
        let bert = bert_layer(Bert {
            mask: true,
            fused_layernorm: false,
        });
        let want_bert = generic_of(&bert, target, true);
        // "odd" was compiled with winograd=off (the record's no_winograd).
        let want_odd = GenericGraph {
            target,
            winograd: false,
            ..odd_desc()
        };
        let want_odd = GenericGraph {
            packed: generic_of(&mlp(), target, true).packed,
            ..want_odd
        };
        assert!(want_bert.packed.len() >= 6 && !want_odd.packed.is_empty());
        let mut b = ContextBuilder::new(target);
        b.add_graph("a", &compile(&graph_a(), target).unwrap()).unwrap();
        b.add_generic("bert", &want_bert).unwrap();
        b.add_stored("odd", &StoredGraph::Generic(want_odd.clone())).unwrap();
        let bytes = b.to_bytes().unwrap();
        let s = storage(&bytes);
        let ctx = ContextBinary::parse(s.clone()).unwrap();
        assert_eq!(ctx.format_version(), FORMAT_VERSION);
        assert_eq!(ctx.graph_names(), ["a", "bert", "odd"]);
        assert!(matches!(ctx.stored_graph("a"), Some(StoredGraph::Program(_))));
        for name in ["a", "bert"] {
            assert_eq!(ctx.stored_graph(name).unwrap().target(), target);
        }
        assert!(ctx.stored_graph("nope").is_none());
        assert_same_generic(&generic(&ctx, "bert"), &want_bert);
        assert_same_generic(&generic(&ctx, "odd"), &want_odd);
        // Weights are views of the file, packed ones included: nothing copied.
        let got = generic(&ctx, "bert");
        assert!(got.constants.iter().all(|c| c.data.shares_storage_with(&s)));
        assert!(got.packed.iter().all(|p| p.data.shares_storage_with(&s)));
        // Asking for a generic graph as a program is a clear error.
        let e = ctx.program("bert").unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidGraph);
        assert!(e.message.contains("stored shape-generic"), "{e}");
        assert!(ctx.program("a").unwrap().is_some());
        let text = ctx.describe();
        assert!(
            text.contains(&format!("format {}", FORMAT_VERSION)) && text.contains("'bert': shape-generic for"),
            "{text}"
        );
        assert!(text.contains("MatMul x"), "{text}");
        assert_eq!(
            text.matches("; winograd off").count(),
            1,
            "only 'odd' was compiled so: {text}"
        );
    }
}

#[test]
fn equal_graphs_write_equal_bytes() {
    // Values live in a HashMap: the record must not depend on its order.
    let write = || {
        let mut b = ContextBuilder::new(Target::Generic);
        b.add_generic("g", &odd_desc()).unwrap();
        b.to_bytes().unwrap()
    };
    assert_eq!(write(), write());
}

/// The stored description and constants import and compile to a program
/// that computes what the original graph does.
#[test]
fn a_stored_generic_graph_imports_and_runs_like_the_original() {
    let d = mlp();
    let mut b = ContextBuilder::new(Target::Generic);
    b.add_generic("mlp", &generic_of(&d, Target::Generic, false)).unwrap();
    let ctx = parse(&b.to_bytes().unwrap()).unwrap();
    let g = generic(&ctx, "mlp");
    let consts = g.constant_values();
    let got = compile(&crate::compiler::import(&g.desc, &consts).unwrap(), Target::Generic).unwrap();
    let want = compile(&crate::compiler::import(&d.g, &d.consts).unwrap(), Target::Generic).unwrap();
    let inputs = random_inputs(&d, 50);
    assert_eq!(
        run_program(&got, &inputs, &Serial),
        run_program(&want, &inputs, &Serial)
    );
}

#[test]
fn weights_are_shared_between_programs_and_generic_graphs() {
    let target = Target::Generic;
    let d = mlp();
    let program = compile(&crate::compiler::import(&d.g, &d.consts).unwrap(), target).unwrap();
    let alone = {
        let mut b = ContextBuilder::new(target);
        b.add_graph("p", &program).unwrap();
        b.add_graph("a", &compile(&graph_a(), target).unwrap()).unwrap();
        b
    };
    let base = parse(&alone.to_bytes().unwrap()).unwrap().num_weights();
    // graph a's constant c ([8], row 1) and the mlp's packed weights, as a generic graph has them
    let pa = compile(&graph_a(), target).unwrap();
    let c = pa.constants().iter().find(|c| c.shape[..] == [8]).unwrap();
    let mut g = generic_of(&d, target, true);
    g.constants.push(NamedConstant {
        name: "c".into(),
        dtype: DType::F32,
        shape: vec![8],
        data: Weight::from_bytes(c.data.as_bytes()),
    });
    let mut b = alone.clone();
    b.add_generic("g", &g).unwrap();
    let mut out = Vec::new();
    let stats = b.write_to(&mut out).unwrap();
    let (_, meta) = metadata_of(&out);
    // 3 packed weights stored once, though both graphs pack them.
    assert_eq!(meta.weights.iter().filter(|w| w.gemm_packed.is_some()).count(), 3);
    // Only the generic graph's unpacked copies are new (w1, w2, w3 and any
    // constant the compiler folded away); `c` and the packed ones are not.
    let plain_program: Vec<&[u8]> = program
        .constants()
        .iter()
        .chain(pa.constants())
        .filter(|c| c.packing == Packing::None)
        .map(|c| c.data.as_bytes())
        .collect();
    let new = g
        .constants
        .iter()
        .filter(|c| !plain_program.contains(&c.data.as_bytes()))
        .count();
    assert!(new < g.constants.len(), "some constants are shared");
    assert_eq!(parse(&out).unwrap().num_weights(), base + new);
    assert!(stats.weight_bytes_stored < stats.weight_bytes_referenced);
}

#[test]
fn add_generic_refusals() {
    let ok = generic_of(&mlp(), Target::Generic, true);
    let mut b = ContextBuilder::new(Target::Generic);
    b.add_generic("g", &ok).unwrap();
    let kind = |b: &mut ContextBuilder, name: &str, g: &GenericGraph| b.add_generic(name, g).unwrap_err();
    assert_eq!(kind(&mut b, "g", &ok).kind, ErrorKind::InvalidArgument);
    assert_eq!(kind(&mut b, "", &ok).kind, ErrorKind::InvalidArgument);
    let other = GenericGraph {
        target: Target::Avx2,
        ..ok.clone()
    };
    let e = kind(&mut b, "h", &other);
    assert!(
        e.kind == ErrorKind::InvalidArgument && e.message.contains("compiled for x86_64-avx2"),
        "{e}"
    );
    type Change = Box<dyn Fn(&mut GenericGraph)>;
    let bad: Vec<(Change, &str)> = vec![
        (Box::new(|g| g.constants[0].shape.push(2)), "do not hold"),
        (
            Box::new(|g| g.constants[1].name = g.constants[0].name.clone()),
            "repeated",
        ),
        (Box::new(|g| g.packed[0].n += 1), "packed for"),
        (Box::new(|g| g.packed[0].source = "nothing".into()), "packs no constant"),
        (
            Box::new(|g| g.packed[0].trans_b = !g.packed[0].trans_b),
            "expected float",
        ),
        (Box::new(|g| g.packed.push(g.packed[0].clone())), "packed twice"),
        (Box::new(|g| g.desc.nodes[0].op_type.clear()), "no op type"),
        (Box::new(|g| g.desc.inputs.push(String::new())), "empty name"),
        (
            Box::new(|g| {
                let v = g.desc.values.values_mut().next().unwrap();
                v.dims = None;
                v.dim_params = vec!["n".into()];
            }),
            "unknown rank",
        ),
        (
            Box::new(|g| {
                g.desc
                    .values
                    .insert("x".into(), crate::ir::ValueDesc::named(1, &[2, 3], &["a"]));
            }),
            "1 dim names for 2 dims",
        ),
        (
            Box::new(|g| {
                g.desc.values.insert("x".into(), crate::ir::ValueDesc::new(1, &[-2]));
            }),
            "dim -2",
        ),
        (
            Box::new(|g| {
                g.desc
                    .values
                    .insert("x".into(), crate::ir::ValueDesc::new(1, &[1; MAX_RANK + 1]));
            }),
            "rank 65",
        ),
        (
            Box::new(|g| {
                let t = TensorValue {
                    elem_type: 1,
                    shape: vec![3],
                    bytes: vec![0; 8],
                };
                g.desc.nodes[0].attrs.insert("t".into(), AttrValue::Tensor(t));
            }),
            "8 bytes do not hold a float tensor",
        ),
        (
            Box::new(|g| {
                let t = TensorValue {
                    elem_type: 8,
                    shape: vec![],
                    bytes: vec![],
                };
                g.desc.nodes[0].attrs.insert("t".into(), AttrValue::Tensor(t));
            }),
            "a tensor of string (code 8)",
        ),
    ];
    for (f, needle) in bad {
        let mut g = ok.clone();
        f(&mut g);
        let before = b.clone();
        let e = kind(&mut b, "h", &g);
        assert_eq!(e.kind, ErrorKind::InvalidGraph, "{needle}: {e}");
        assert!(
            e.message.contains(needle) && e.message.contains("graph 'h'"),
            "{needle:?} not in {e}"
        );
        assert_eq!(b.graph_names(), before.graph_names(), "nothing added");
    }
}

fn sample_generic() -> Vec<u8> {
    let mut b = ContextBuilder::new(Target::Generic);
    b.add_graph("a", &compile(&graph_a(), Target::Generic).unwrap())
        .unwrap();
    b.add_generic("g", &odd_desc()).unwrap();
    b.to_bytes().unwrap()
}

fn g_info(m: &mut proto::Metadata) -> &mut proto::GenericInfo {
    m.graphs[1].generic.as_mut().unwrap()
}

/// The first value of known rank (with its dim names cleared).
fn known(m: &mut proto::Metadata) -> &mut proto::ValueInfo {
    let v = g_info(m).values.iter_mut().find(|v| !v.unknown_rank).unwrap();
    v.dim_params.clear();
    v
}

type Tamper = Box<dyn Fn(&mut proto::Metadata)>;

#[test]
fn hostile_generic_records() {
    use proto::attr_info::Value as V;
    let bytes = sample_generic();
    parse(&bytes).unwrap();
    let packed_id = |m: &proto::Metadata| m.weights.iter().position(|w| w.gemm_packed.is_some()).unwrap() as u32;
    let plain_id = |m: &proto::Metadata| m.weights.iter().position(|w| w.gemm_packed.is_none()).unwrap() as u32;
    let cases: Vec<(Tamper, &str)> = vec![
        (
            Box::new(|m| g_info(m).constants[0].weight_id = 999),
            "weight id 999 is out of range",
        ),
        (
            Box::new(move |m| {
                let id = packed_id(m);
                g_info(m).constants[0].weight_id = id;
            }),
            "a constant must be plain",
        ),
        (
            Box::new(move |m| {
                let id = plain_id(m);
                g_info(m).packed[0].weight_id = id;
            }),
            "is not a packed GEMM weight",
        ),
        (
            Box::new(|m| g_info(m).packed[0].source = "zz".into()),
            "packs no constant",
        ),
        (Box::new(|m| g_info(m).packed[0].trans_b ^= true), "expected float"),
        (
            Box::new(|m| {
                let p = g_info(m).packed[0].clone();
                g_info(m).packed.push(p);
            }),
            "packed twice",
        ),
        (
            Box::new(|m| {
                let c = g_info(m).constants[0].clone();
                g_info(m).constants.push(c);
            }),
            "repeated",
        ),
        (Box::new(|m| g_info(m).constants[0].name.clear()), "empty or repeated"),
        (
            Box::new(|m| {
                let v = g_info(m).values[0].clone();
                g_info(m).values.push(v);
            }),
            "value name",
        ),
        (Box::new(|m| g_info(m).values[0].name.clear()), "value name '' is empty"),
        (Box::new(|m| known(m).dims = vec![-7]), "dim -7"),
        (
            Box::new(|m| {
                let v = &mut g_info(m).values[0];
                v.unknown_rank = true;
                v.dims = vec![1];
            }),
            "unknown rank has dims",
        ),
        (
            Box::new(|m| {
                let v = &mut g_info(m).values[0];
                v.unknown_rank = false;
                v.dims = vec![1, 2];
                v.dim_params = vec!["a".into()];
            }),
            "1 dim names for 2 dims",
        ),
        (Box::new(|m| known(m).dims = vec![1; 100]), "rank 100"),
        (Box::new(|m| g_info(m).nodes[0].op_type.clear()), "no op type"),
        (
            Box::new(|m| {
                let a = g_info(m).nodes[0].attrs[0].clone();
                g_info(m).nodes[0].attrs.push(a);
            }),
            "is empty or repeated",
        ),
        (Box::new(|m| g_info(m).nodes[0].attrs[0].value = None), "has no value"),
        (
            Box::new(|m| {
                g_info(m).nodes[0].attrs[0].value = Some(V::Tensor(proto::TensorValueInfo {
                    elem_type: 7,
                    shape: vec![u64::MAX, 2],
                    data: vec![],
                }))
            }),
            "do not hold",
        ),
        (
            Box::new(|m| {
                g_info(m).nodes[0].attrs[0].value = Some(V::Tensor(proto::TensorValueInfo {
                    elem_type: 999,
                    shape: vec![],
                    data: vec![0; 4],
                }))
            }),
            "not one kiln stores",
        ),
        (
            Box::new(|m| g_info(m).outputs.push(String::new())),
            "output has an empty name",
        ),
        (
            Box::new(|m| m.graphs[1].program = m.graphs[0].program.clone()),
            "has a program's fields",
        ),
        (Box::new(|m| m.graphs[1].weight_ids = vec![0]), "has a program's fields"),
        (Box::new(|m| m.graphs[1].generic = None), "program is missing"),
    ];
    for (f, needle) in cases {
        refused(&tamper(&bytes, f), needle);
    }
}

#[test]
fn a_format_1_file_with_a_generic_graph_is_refused() {
    let mut bytes = sample_generic();
    bytes[8..12].copy_from_slice(&1u32.to_le_bytes());
    refused(&bytes, "format 1 has no shape-generic graphs");
}

/// A binary written by the format-1 kiln (`testdata/v1_generic.bin`: graphs
/// a and b of `tests`, the mlp compiled for the generic target with packed
/// weights) still loads and computes what a fresh compile of them does.
#[test]
fn format_1_binaries_still_load() {
    let bytes = include_bytes!("testdata/v1_generic.bin");
    assert_eq!(Header::parse(bytes).unwrap().version, 1);
    let s = storage(bytes);
    let ctx = ContextBinary::parse(s.clone()).unwrap();
    assert_eq!(ctx.format_version(), 1);
    assert_eq!(ctx.graph_names(), ["a", "b", "mlp"]);
    assert_eq!(ctx.context_models(), ["v1_ctx.onnx"]);
    assert_eq!(ctx.target(), Target::Generic);
    let d = mlp();
    let fresh = [
        ("a", compile(&graph_a(), Target::Generic).unwrap()),
        ("b", compile(&graph_b(), Target::Generic).unwrap()),
        (
            "mlp",
            compile(&crate::compiler::import(&d.g, &d.consts).unwrap(), Target::Generic).unwrap(),
        ),
    ];
    for (name, want) in &fresh {
        let got = ctx.program(name).unwrap().unwrap();
        assert!(matches!(ctx.stored_graph(name), Some(StoredGraph::Program(_))));
        assert!(got.constants().iter().all(|c| c.data.shares_storage_with(&s)));
        assert_eq!(got.inputs(), want.inputs(), "{name}");
        assert_eq!(got.outputs(), want.outputs(), "{name}");
        if *name != "mlp" {
            assert_eq!(super::tests::run(&got, 3), super::tests::run(want, 3), "{name}");
            continue;
        }
        let inputs = random_inputs(&d, 50);
        let (a, b) = (run_program(&got, &inputs, &Serial), run_program(want, &inputs, &Serial));
        for (x, y) in a.iter().flatten().zip(b.iter().flatten()) {
            assert!((x - y).abs() <= 1e-5 * (1.0 + y.abs()), "{name}: {x} vs {y}");
        }
    }
    let packed = ctx
        .program("mlp")
        .unwrap()
        .unwrap()
        .constants()
        .iter()
        .filter(|c| c.packing != Packing::None)
        .count();
    assert_eq!(packed, 3);
}

#[test]
fn versions_newer_than_ours_are_refused() {
    let mut bytes = sample_generic();
    let next = FORMAT_VERSION + 1;
    bytes[8..12].copy_from_slice(&next.to_le_bytes());
    let e = parse(&bytes).unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidGraph);
    assert!(
        e.message.contains(&format!("format version {next} is newer than"))
            && e.message.contains(&format!("versions 1 to {FORMAT_VERSION}")),
        "{e}"
    );
}
