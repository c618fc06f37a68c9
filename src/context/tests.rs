//! Round trips, dedup, in-place weights and every kind of corruption.

use std::sync::Arc;

use prost::Message;

use super::header::{checksum, Header, HEADER_LEN};
use super::*;
use crate::compiler::{compile_with, Passes};
use crate::error::ErrorKind;
use crate::ir::{broadcast_shapes, BinaryOp, Graph, Op, TensorType, UnaryOp, ValueId};
use crate::kernels::parallel::Serial;
use crate::plan::{AlignedBytes, Storage, STORAGE_ALIGN};
use crate::plan::{Packing, TensorMut, TensorRef};
use crate::target::Target;

/// Terse graph building: values named as they are added.
struct G(Graph);

impl G {
    fn new(name: &str) -> G {
        G(Graph::new(name))
    }

    fn value(&mut self, name: &str, shape: &[usize]) -> ValueId {
        self.0.add_value(name, TensorType::f32(shape)).unwrap()
    }

    fn input(&mut self, name: &str, shape: &[usize]) -> ValueId {
        let v = self.value(name, shape);
        self.0.inputs.push(v);
        v
    }

    fn constant(&mut self, name: &str, shape: &[usize], data: Vec<f32>) -> ValueId {
        let v = self.value(name, shape);
        self.0.add_constant(v, data).unwrap();
        v
    }

    fn node(&mut self, op: Op, inputs: &[ValueId], out: &str) -> ValueId {
        let shapes: Vec<Vec<usize>> = inputs.iter().map(|&v| self.0.values[v].ty.shape.clone()).collect();
        let shape = match &shapes[..] {
            [a, b] => broadcast_shapes(a, b).unwrap(),
            [a] => a.clone(),
            _ => unreachable!(),
        };
        let y = self.value(out, &shape);
        self.0.add_node(out, op, inputs.to_vec(), vec![y]);
        y
    }
}

pub(super) fn row(n: usize, seed: usize) -> Vec<f32> {
    (0..n).map(|i| ((i * 37 + seed * 11) % 17) as f32 / 4.0 - 2.0).collect()
}

/// y = relu(x + c) * 2, c a row constant shared with `graph_b`.
pub(super) fn graph_a() -> Graph {
    let mut g = G::new("a");
    let x = g.input("x", &[4, 8]);
    let c = g.constant("c", &[8], row(8, 1));
    let two = g.constant("two", &[], vec![2.0]);
    let s = g.node(Op::Binary(BinaryOp::Add), &[x, c], "s");
    let r = g.node(Op::Unary(UnaryOp::Relu), &[s], "r");
    let y = g.node(Op::Binary(BinaryOp::Mul), &[r, two], "y");
    g.0.outputs.push(y);
    g.0
}

/// t = tanh((x - c) / col), z = x - c: a strided layout, two outputs.
pub(super) fn graph_b() -> Graph {
    let mut g = G::new("b");
    let x = g.input("x", &[3, 8]);
    let c = g.constant("c", &[8], row(8, 1));
    let col = g.constant("col", &[3, 1], vec![1.5, -2.0, 4.0]);
    let z = g.node(Op::Binary(BinaryOp::Sub), &[x, c], "z");
    let w = g.node(Op::Binary(BinaryOp::Div), &[z, col], "w");
    let t = g.node(Op::Unary(UnaryOp::Tanh), &[w], "t");
    g.0.outputs.extend([t, z]);
    g.0
}

/// The bytes of `c` again, as a [2,4] tensor: must not merge with `c`.
fn graph_c() -> Graph {
    let mut g = G::new("c");
    let x = g.input("x", &[2, 4]);
    let m = g.constant("m", &[2, 4], row(8, 1));
    let y = g.node(Op::Binary(BinaryOp::Mul), &[x, m], "y");
    g.0.outputs.push(y);
    g.0
}

/// Compiles without elementwise chains: these tests tamper with the unary
/// and binary steps of small graphs, which a chain would hold
/// (`chain_steps_round_trip_and_bad_ones_are_refused` covers chains).
pub(super) fn compile(g: &Graph, target: Target) -> crate::error::Result<crate::plan::Program> {
    let passes = Passes {
        chain: false,
        ..Passes::default()
    };
    compile_with(g, target, passes)
}

pub(super) fn storage(bytes: &[u8]) -> Arc<dyn Storage> {
    Arc::new(AlignedBytes::copy_from(bytes))
}

pub(super) fn parse(bytes: &[u8]) -> crate::error::Result<ContextBinary> {
    ContextBinary::parse(storage(bytes))
}

fn builder(graphs: &[Graph]) -> ContextBuilder {
    let mut b = ContextBuilder::new(Target::Generic);
    for g in graphs {
        b.add_graph(&g.name, &compile(g, Target::Generic).unwrap()).unwrap();
    }
    b
}

fn sample_bytes() -> Vec<u8> {
    builder(&[graph_a(), graph_b()]).to_bytes().unwrap()
}

pub(super) fn run(p: &Program, seed: usize) -> Vec<Vec<f32>> {
    let inputs: Vec<Vec<f32>> = p
        .inputs()
        .iter()
        .enumerate()
        .map(|(k, s)| row(s.numel(), seed + k))
        .collect();
    let ins: Vec<TensorRef<'_>> = inputs.iter().map(|v| TensorRef::F32(v)).collect();
    let mut outs: Vec<Vec<f32>> = p.outputs().iter().map(|s| vec![f32::NAN; s.numel()]).collect();
    let mut refs: Vec<TensorMut<'_>> = outs.iter_mut().map(|v| TensorMut::F32(v)).collect();
    p.run(Target::cpu_best(), &ins, &mut refs, &Serial).unwrap();
    drop(refs);
    outs
}

/// `p`'s parts, for building a changed copy (which `from_parts` validates).
fn parts_of(p: &Program) -> crate::plan::ProgramParts {
    crate::plan::ProgramParts {
        target: p.target(),
        inputs: p.inputs().to_vec(),
        outputs: p.outputs().to_vec(),
        constants: p.constants().to_vec(),
        steps: p.steps().to_vec(),
        arena_bytes: p.arena_bytes(),
        op_counts: p.op_counts().to_vec(),
    }
}

pub(super) fn assert_same_program(got: &Program, want: &Program) {
    assert_eq!(got.target(), want.target());
    assert_eq!(got.inputs(), want.inputs());
    assert_eq!(got.outputs(), want.outputs());
    assert_eq!(got.steps(), want.steps());
    assert_eq!(got.arena_bytes(), want.arena_bytes());
    assert_eq!(got.op_counts(), want.op_counts());
    assert_eq!(got.constants().len(), want.constants().len());
    for (g, w) in got.constants().iter().zip(want.constants()) {
        assert_eq!(g.shape, w.shape);
        assert_eq!((g.dtype, g.packing), (w.dtype, w.packing));
        assert_eq!(g.data.as_bytes(), w.data.as_bytes());
    }
    for seed in 0..3 {
        assert_eq!(run(got, seed), run(want, seed));
    }
}

/// Reassembles a file around tampered metadata with a valid checksum.
pub(super) fn tamper(bytes: &[u8], f: impl FnOnce(&mut proto::Metadata)) -> Vec<u8> {
    let header = Header::parse(bytes).unwrap();
    let mut meta = proto::Metadata::decode(&bytes[header.metadata_range()]).unwrap();
    f(&mut meta);
    reassemble(&meta.encode_to_vec(), &bytes[header.data_range()])
}

fn reassemble(metadata: &[u8], data: &[u8]) -> Vec<u8> {
    let sum = checksum(metadata, [data]);
    let h = Header::for_sections(metadata.len() as u64, data.len() as u64, sum).unwrap();
    let mut out = h.to_bytes().to_vec();
    out.extend_from_slice(metadata);
    out.resize(h.data_offset as usize, 0);
    out.extend_from_slice(data);
    out
}

/// One way to tamper with the metadata.
type Tamper = Box<dyn Fn(&mut proto::Metadata)>;

pub(super) fn refused(bytes: &[u8], needle: &str) {
    let e = parse(bytes).unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidGraph, "{e}");
    assert!(e.message.contains(needle), "{needle:?} not in: {e}");
}

pub(super) fn metadata_of(bytes: &[u8]) -> (Header, proto::Metadata) {
    let h = Header::parse(bytes).unwrap();
    let m = proto::Metadata::decode(&bytes[h.metadata_range()]).unwrap();
    (h, m)
}

#[test]
fn round_trip_runs_identically() {
    let graphs = [graph_a(), graph_b()];
    let programs: Vec<Program> = graphs.iter().map(|g| compile(g, Target::Generic).unwrap()).collect();
    let bytes = sample_bytes();
    let ctx = parse(&bytes).unwrap();
    assert_eq!(ctx.format_version(), FORMAT_VERSION);
    assert_eq!(ctx.kiln_version(), KILN_VERSION);
    assert_eq!(ctx.target(), Target::Generic);
    for (g, want) in graphs.iter().zip(&programs) {
        let got = ctx.program(&g.name).unwrap().unwrap();
        assert_same_program(&got, want);
    }
    // The strided layout really went through the file.
    let b = ctx.program("b").unwrap().unwrap();
    let strided = |p: &Program| {
        p.steps().iter().any(|s| {
            matches!(
                s,
                crate::plan::Step::Binary {
                    layout: crate::kernels::Layout::Strided(_),
                    ..
                }
            )
        })
    };
    assert!(strided(&b));
}

#[test]
fn round_trip_every_target() {
    for t in Target::ALL {
        let mut b = ContextBuilder::new(t);
        b.add_graph("a", &compile(&graph_a(), t).unwrap()).unwrap();
        let ctx = parse(&b.to_bytes().unwrap()).unwrap();
        assert_eq!(ctx.target(), t);
        let p = ctx.program("a").unwrap().unwrap();
        assert_eq!(p.target(), t);
        if t.can_run_on(Target::cpu_best()) {
            assert_same_program(&p, &compile(&graph_a(), t).unwrap());
        }
    }
}

#[test]
fn several_graphs_by_name() {
    let b = builder(&[graph_a(), graph_b(), graph_c()]);
    assert_eq!(b.graph_names(), ["a", "b", "c"]);
    assert!(!b.is_empty());
    let ctx = parse(&b.to_bytes().unwrap()).unwrap();
    assert_eq!(ctx.graph_names(), ["a", "b", "c"]);
    assert!(ctx.contains("b") && !ctx.contains("d"));
    assert!(ctx.program("d").unwrap().is_none());
    let text = ctx.describe();
    assert!(
        text.contains("3 graph(s)") && text.contains("'b': target x86_64-generic"),
        "{text}"
    );
    assert!(text.contains("Sub x1, Div x1, Tanh x1"), "{text}");
    assert!(format!("{ctx:?}").contains("ContextBinary"));
}

#[test]
fn empty_builder_writes_a_valid_file() {
    let b = ContextBuilder::new(Target::Avx2);
    assert!(b.is_empty());
    let mut out = Vec::new();
    let stats = b.write_to(&mut out).unwrap();
    assert_eq!(stats.file_bytes, out.len() as u64);
    assert_eq!(stats.graphs, 0);
    let ctx = parse(&out).unwrap();
    assert!(ctx.graph_names().is_empty());
    assert_eq!(ctx.target(), Target::Avx2);
    assert_eq!(ctx.weight_bytes(), 0);
}

#[test]
fn add_graph_refusals_are_invalid_argument() {
    let p = compile(&graph_a(), Target::Generic).unwrap();
    let mut b = ContextBuilder::new(Target::Generic);
    b.add_graph("a", &p).unwrap();
    let e = b.add_graph("a", &p).unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    assert!(e.message.contains("'a'") && e.message.contains("already"), "{e}");
    let e = b.add_graph("", &p).unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    let avx2 = compile(&graph_a(), Target::Avx2).unwrap();
    let e = b.add_graph("other", &avx2).unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidArgument);
    assert!(
        e.message.contains("x86_64-avx2") && e.message.contains("x86_64-generic"),
        "{e}"
    );
    assert_eq!(b.graph_names(), ["a"]);
}

#[test]
fn shared_weights_are_stored_once() {
    let b = builder(&[graph_a(), graph_b()]);
    let mut bytes = Vec::new();
    let stats = b.write_to(&mut bytes).unwrap();
    // a: c, two; b: c (shared), col.
    assert_eq!(stats.graphs, 2);
    assert_eq!(stats.weights, 3);
    assert_eq!(stats.weight_bytes_referenced, (8 + 1 + 8 + 3) * 4);
    assert_eq!(stats.weight_bytes_stored, (8 + 1 + 3) * 4);
    assert_eq!(stats.file_bytes, bytes.len() as u64);
    let ctx = parse(&bytes).unwrap();
    assert_eq!(ctx.num_weights(), 3);
    assert_eq!(ctx.weight_bytes(), stats.weight_bytes_stored);
    let (_, meta) = metadata_of(&bytes);
    let c_id = |g: &proto::GraphInfo| {
        g.weight_ids
            .iter()
            .copied()
            .find(|&id| meta.weights[id as usize].shape == [8])
    };
    assert_eq!(c_id(&meta.graphs[0]), c_id(&meta.graphs[1]));
    // Both loaded programs read the same bytes of the file.
    let (a, bp) = (ctx.program("a").unwrap().unwrap(), ctx.program("b").unwrap().unwrap());
    let ptr = |p: &Program| {
        p.constants()
            .iter()
            .find(|c| *c.shape == [8])
            .unwrap()
            .data
            .as_bytes()
            .as_ptr()
    };
    assert_eq!(ptr(&a), ptr(&bp));
}

#[test]
fn same_bytes_with_another_shape_are_not_merged() {
    let stats = builder(&[graph_a(), graph_c()]).write_to(&mut Vec::new()).unwrap();
    assert_eq!(stats.weights, 3, "{stats:?}");
    assert_eq!(stats.weight_bytes_stored, stats.weight_bytes_referenced);
    // Same graph twice under two names: everything shared.
    let p = compile(&graph_b(), Target::Generic).unwrap();
    let mut b = ContextBuilder::new(Target::Generic);
    b.add_graph("b1", &p).unwrap();
    b.add_graph("b2", &p).unwrap();
    let stats = b.write_to(&mut Vec::new()).unwrap();
    assert_eq!(stats.weights, 2);
    assert_eq!(stats.weight_bytes_referenced, 2 * stats.weight_bytes_stored);
}

#[test]
fn equal_hash_candidates_compare_bytes() {
    // Two constants differing in one value: different weights.
    let mut g = G::new("d");
    let x = g.input("x", &[8]);
    let mut other = row(8, 1);
    other[7] += 1.0;
    let c1 = g.constant("c1", &[8], row(8, 1));
    let c2 = g.constant("c2", &[8], other);
    let s = g.node(Op::Binary(BinaryOp::Add), &[x, c1], "s");
    let y = g.node(Op::Binary(BinaryOp::Mul), &[s, c2], "y");
    g.0.outputs.push(y);
    let stats = builder(&[g.0, graph_a()]).write_to(&mut Vec::new()).unwrap();
    // c1 == a's c; c2 and two are distinct.
    assert_eq!(stats.weights, 3);
}

#[test]
fn weights_point_into_the_storage() {
    let bytes = sample_bytes();
    let s = storage(&bytes);
    let ctx = ContextBinary::parse(s.clone()).unwrap();
    assert!(Arc::ptr_eq(ctx.storage(), &s));
    let mut seen = 0;
    for name in ctx.graph_names() {
        for c in ctx.program(&name).unwrap().unwrap().constants() {
            assert!(c.data.shares_storage_with(&s), "{name}");
            seen += 1;
        }
    }
    assert_eq!(seen, 4);
    // Programs keep the storage alive after the binary and the caller let go.
    let p = ctx.program("a").unwrap().unwrap();
    drop((ctx, s));
    assert_same_program(&p, &compile(&graph_a(), Target::Generic).unwrap());
}

#[test]
fn every_weight_is_64_byte_aligned_in_the_file() {
    let bytes = builder(&[graph_a(), graph_b(), graph_c()]).to_bytes().unwrap();
    let (h, meta) = metadata_of(&bytes);
    assert_eq!(h.data_offset % STORAGE_ALIGN as u64, 0);
    assert!(meta.weights.len() >= 4);
    for w in &meta.weights {
        assert_eq!((h.data_offset + w.offset) % STORAGE_ALIGN as u64, 0, "{w:?}");
    }
    // And in memory, since the storage is aligned.
    let s = storage(&bytes);
    let ctx = ContextBinary::parse(s).unwrap();
    for c in ctx.program("c").unwrap().unwrap().constants() {
        assert_eq!(c.data.as_bytes().as_ptr() as usize % STORAGE_ALIGN, 0);
    }
}

#[test]
fn header_fields_are_as_documented() {
    let bytes = sample_bytes();
    assert_eq!(&bytes[0..8], b"KILNCTX\0");
    assert_eq!(u32::from_le_bytes(bytes[8..12].try_into().unwrap()), FORMAT_VERSION);
    assert_eq!(u32::from_le_bytes(bytes[12..16].try_into().unwrap()), 64);
    assert_eq!(u64::from_le_bytes(bytes[16..24].try_into().unwrap()), 64);
    let meta_len = u64::from_le_bytes(bytes[24..32].try_into().unwrap());
    let data_off = u64::from_le_bytes(bytes[32..40].try_into().unwrap());
    let data_len = u64::from_le_bytes(bytes[40..48].try_into().unwrap());
    assert_eq!(data_off, (64 + meta_len).div_ceil(64) * 64);
    assert_eq!(data_off + data_len, bytes.len() as u64);
    let sum = xxhash_rust::xxh3::xxh3_128(&[&bytes[64..64 + meta_len as usize], &bytes[data_off as usize..]].concat());
    assert_eq!(bytes[48..64], sum.to_le_bytes());
}

#[test]
fn bad_magic() {
    let mut bytes = sample_bytes();
    bytes[0] = b'X';
    refused(&bytes, "not a kiln context binary");
    refused(b"PK\x03\x04 a zip file, not ours", "not a kiln context binary");
    refused(&[], "truncated");
}

#[test]
fn unreadable_versions_say_which_are_read() {
    for (v, word) in [(0u32, "older"), (FORMAT_VERSION + 1, "newer"), (u32::MAX, "newer")] {
        let mut bytes = sample_bytes();
        bytes[8..12].copy_from_slice(&v.to_le_bytes());
        let e = parse(&bytes).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidGraph);
        assert!(e.message.contains(&format!("format version {v} is {word}")), "{e}");
        assert!(e.message.contains(&format!("versions 1 to {FORMAT_VERSION}")), "{e}");
    }
}

#[test]
fn every_truncation_is_an_error() {
    let bytes = sample_bytes();
    for len in 0..bytes.len() {
        let e = parse(&bytes[..len]).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidGraph, "{len}: {e}");
        assert!(e.message.contains("truncated"), "{len}: {e}");
    }
    let e = parse(&bytes[..100]).unwrap_err();
    assert!(
        e.message.contains(&format!("expected {} bytes", bytes.len())) && e.message.contains("file has 100"),
        "{e}"
    );
}

#[test]
fn trailing_bytes_are_refused() {
    let mut bytes = sample_bytes();
    bytes.push(0);
    refused(&bytes, "unexpected bytes after the data region");
}

#[test]
fn every_flipped_byte_is_detected() {
    let bytes = sample_bytes();
    let mut copy = bytes.clone();
    let mut checksum_errors = 0;
    for i in 0..bytes.len() {
        copy[i] ^= 0x10;
        let e = parse(&copy).unwrap_err();
        assert_eq!(e.kind, ErrorKind::InvalidGraph, "byte {i}: {e}");
        checksum_errors += e.message.contains("checksum mismatch") as usize;
        copy[i] = bytes[i];
    }
    // Everything past the header is covered by the checksum or is zero padding.
    assert!(checksum_errors > bytes.len() / 2, "{checksum_errors}");
    parse(&copy).unwrap();
}

#[test]
fn header_layout_fields_are_checked() {
    let patch = |at: usize, v: u64, width: usize| {
        let mut b = sample_bytes();
        b[at..at + width].copy_from_slice(&v.to_le_bytes()[..width]);
        b
    };
    refused(&patch(12, 128, 4), "header size is 128");
    refused(&patch(16, 0, 8), "metadata offset is 0");
    refused(&patch(24, u64::MAX, 8), "data offset");
    refused(&patch(32, 0, 8), "data offset is 0");
    refused(&patch(40, u64::MAX, 8), "overflows");
    refused(&patch(40, 1 << 40, 8), "truncated");
}

#[test]
fn garbage_metadata_with_a_valid_checksum() {
    let (h, _) = metadata_of(&sample_bytes());
    let bytes = sample_bytes();
    let data = &bytes[h.data_range()];
    refused(&reassemble(&[0xff; 40], data), "metadata does not decode");
    // Empty metadata decodes to defaults: the empty target is unknown.
    refused(&reassemble(&[], data), "unknown target ''");
}

#[test]
fn hostile_weight_tables() {
    let bytes = sample_bytes();
    let (h, _) = metadata_of(&bytes);
    let past_end = h.data_len.div_ceil(64) * 64;
    let cases: Vec<(Tamper, &str)> = vec![
        (Box::new(move |m| m.weights[0].offset = past_end), "outside"),
        (Box::new(|m| m.weights[0].offset = u64::MAX - 63), "outside"),
        (Box::new(|m| m.weights[0].offset += 4), "multiple of 64"),
        (Box::new(|m| m.weights[0].byte_length += 4), "do not hold"),
        (Box::new(|m| m.weights[0].shape = vec![u64::MAX, 2]), "do not hold"),
        (Box::new(|m| m.weights[0].dtype = 7), "do not hold"),
        (Box::new(|m| m.weights[0].dtype = 10), "float16"),
        (Box::new(|m| m.weights[0].content_hash.truncate(8)), "content hash"),
        (Box::new(|m| m.weights[0].content_hash.clear()), "content hash"),
        (Box::new(|m| m.graphs[0].weight_ids[0] = 99), "weight id 99"),
        (
            Box::new(|m| m.target = "riscv64-v".into()),
            "unknown target 'riscv64-v'",
        ),
    ];
    for (f, needle) in cases {
        refused(&tamper(&bytes, f), needle);
    }
}

/// The program of graph 0 (`a`), for tampering.
fn program0(m: &mut proto::Metadata) -> &mut proto::ProgramInfo {
    m.graphs[0].program.as_mut().unwrap()
}

fn first_unary(m: &mut proto::Metadata) -> &mut proto::UnaryStep {
    program0(m)
        .steps
        .iter_mut()
        .find_map(|s| match &mut s.kind {
            Some(proto::step_info::Kind::Unary(u)) => Some(u),
            _ => None,
        })
        .unwrap()
}

fn buf(kind: proto::buf_info::Kind) -> Option<proto::BufInfo> {
    Some(proto::BufInfo { kind: Some(kind) })
}

#[test]
fn hostile_programs() {
    use proto::buf_info::Kind as B;
    let bytes = sample_bytes();
    let scratch = |offset, len| B::Scratch(proto::ScratchRange { offset, len });
    let cases: Vec<(Tamper, &str)> = vec![
        (Box::new(|m| first_unary(m).src = buf(B::Input(99))), "out of range"),
        (
            Box::new(|m| first_unary(m).src = buf(B::Constant(u64::MAX))),
            "out of range",
        ),
        (Box::new(|m| first_unary(m).dst = buf(B::Output(5))), "out of range"),
        (Box::new(|m| first_unary(m).dst = buf(B::Input(0))), "read-only"),
        (
            Box::new(move |m| first_unary(m).src = buf(scratch(u64::MAX, 2))),
            "out of range",
        ),
        (
            Box::new(move |m| first_unary(m).src = buf(scratch(0, 1 << 50))),
            "out of range",
        ),
        (Box::new(|m| first_unary(m).src = None), "buffer is missing"),
        (Box::new(|m| first_unary(m).op = 99), "unknown unary op code 99"),
        (Box::new(|m| first_unary(m).op = 0), "unknown unary op code 0"),
        (
            Box::new(|m| program0(m).arena_bytes = 1 << 40),
            "larger than its steps use",
        ),
        (Box::new(|m| program0(m).arena_bytes = u64::MAX), "too large"),
        (
            Box::new(|m| program0(m).steps.push(proto::StepInfo { kind: None })),
            "step kind is missing",
        ),
        (Box::new(|m| program0(m).steps.clear()), "no step writes output 0"),
        (Box::new(|m| program0(m).op_counts[0].op = String::new()), "no op name"),
        (Box::new(|m| m.graphs[0].program = None), "program is missing"),
        (
            Box::new(|m| m.graphs[0].inputs[0].shape = vec![1 << 40, 1 << 40]),
            "too large",
        ),
        (Box::new(|m| m.graphs[0].inputs[0].shape = vec![3]), "do not allow"),
        (Box::new(|m| m.graphs[0].outputs[0].dtype = 10), "float16"),
        (
            Box::new(|m| m.graphs[0].weight_ids.pop().map(drop).unwrap_or(())),
            "out of range",
        ),
        (Box::new(|m| m.graphs[1].name = "a".into()), "repeated"),
        (Box::new(|m| m.graphs[1].name.clear()), "empty"),
    ];
    for (f, needle) in cases {
        refused(&tamper(&bytes, f), needle);
    }
}

#[test]
fn hostile_layouts() {
    use proto::layout_info::Kind as L;
    let bytes = sample_bytes();
    let strided = |dims: Vec<u64>, a: Vec<u64>, b: Vec<u64>| {
        L::Strided(proto::StridedLayout {
            dims,
            a_strides: a,
            b_strides: b,
        })
    };
    let layouts = vec![
        L::RowB(0),
        L::RowB(7),
        L::ScalarA(proto::Empty {}),
        strided(vec![4, 8], vec![8, 1], vec![1, 1]),
        strided(vec![4, 8], vec![8, 1], vec![0]),
        strided(vec![], vec![], vec![]),
        strided(vec![u64::MAX, 8], vec![0, 1], vec![0, 1]),
        strided(vec![4, 8], vec![8, 2], vec![0, 1]),
    ];
    for layout in layouts {
        let set = |m: &mut proto::Metadata| {
            for s in &mut program0(m).steps {
                if let Some(proto::step_info::Kind::Binary(b)) = &mut s.kind {
                    b.layout = Some(proto::LayoutInfo {
                        kind: Some(layout.clone()),
                    });
                    break;
                }
            }
        };
        refused(&tamper(&bytes, set), "do not allow");
    }
    refused(
        &tamper(&bytes, |m| {
            for s in &mut program0(m).steps {
                if let Some(proto::step_info::Kind::Binary(b)) = &mut s.kind {
                    b.layout = None;
                }
            }
        }),
        "layout is missing",
    );
}

/// Storage whose bytes start `shift` bytes into an aligned buffer.
#[derive(Debug)]
struct Shifted(AlignedBytes, usize);

impl Storage for Shifted {
    fn bytes(&self) -> &[u8] {
        &self.0.bytes()[self.1..]
    }
}

#[test]
fn misaligned_storage_is_an_error_not_ub() {
    let bytes = sample_bytes();
    let mut padded = vec![0u8; 3];
    padded.extend_from_slice(&bytes);
    let e = ContextBinary::parse(Arc::new(Shifted(AlignedBytes::copy_from(&padded), 3))).unwrap_err();
    assert_eq!(e.kind, ErrorKind::InvalidGraph);
    assert!(e.message.contains("not 4-byte aligned"), "{e}");
    // 4-byte aligned is enough to load.
    let mut padded = vec![0u8; 4];
    padded.extend_from_slice(&bytes);
    let ctx = ContextBinary::parse(Arc::new(Shifted(AlignedBytes::copy_from(&padded), 4))).unwrap();
    assert_same_program(
        &ctx.program("a").unwrap().unwrap(),
        &compile(&graph_a(), Target::Generic).unwrap(),
    );
}

#[test]
fn tampering_helper_round_trips() {
    let bytes = sample_bytes();
    assert_eq!(tamper(&bytes, |_| {}), bytes);
    assert_eq!(HEADER_LEN, 64);
}

#[test]
fn context_types_are_send_sync() {
    fn check<T: Send + Sync>() {}
    check::<ContextBinary>();
    check::<ContextBuilder>();
}

#[test]
fn describe_program_summarises() {
    let p = compile(&graph_a(), Target::Generic).unwrap();
    let s = describe_program(&p);
    assert!(
        s.starts_with("target x86_64-generic; ops Add x1, Relu x1, Mul x1;"),
        "{s}"
    );
    assert!(s.contains("2 constant(s) of 36 bytes"), "{s}");
}

/// Compiled MLP and BERT-layer programs survive the file: packed GEMM
/// weights are stored packed, loading adopts them in place (no packing),
/// and outputs are bit-identical.
#[test]
fn packed_programs_round_trip() {
    use crate::ir::tests::{bert_layer, mlp, random_inputs, run_program, Bert};
    let descs = [
        ("mlp", mlp()),
        (
            "bert",
            bert_layer(Bert {
                mask: true,
                fused_layernorm: false,
            }),
        ),
    ];
    for target in Target::ALL {
        let mut b = ContextBuilder::new(target);
        let mut programs = Vec::new();
        for (name, d) in &descs {
            let ir = crate::compiler::import(&d.g, &d.consts).unwrap();
            let p = compile(&ir, target).unwrap();
            assert!(p.packed_constants() >= 3);
            b.add_graph(name, &p).unwrap();
            programs.push(p);
        }
        let bytes = b.to_bytes().unwrap();
        let (_, meta) = metadata_of(&bytes);
        let packed = meta.weights.iter().filter(|w| w.gemm_packed.is_some()).count();
        assert_eq!(packed, 3 + 6, "{target}");
        let s = storage(&bytes);
        let ctx = ContextBinary::parse(s.clone()).unwrap();
        for ((name, d), want) in descs.iter().zip(&programs) {
            let got = ctx.program(name).unwrap().unwrap();
            assert_eq!(got.packed_constants(), want.packed_constants());
            for c in got.constants() {
                // In place: nothing was re-packed or copied at load.
                assert!(c.data.shares_storage_with(&s), "{name}");
                if let Packing::GemmB { k, n } = c.packing {
                    assert_eq!(c.data.len(), crate::kernels::gemm::PackedB::packed_len(target, k, n));
                }
            }
            assert_eq!(got.steps(), want.steps());
            if target.can_run_on(Target::cpu_best()) {
                let inputs = random_inputs(d, 50);
                let a = run_program(&got, &inputs, &Serial);
                let b = run_program(want, &inputs, &Serial);
                assert_eq!(a, b, "{name} on {target}");
            }
        }
    }
}

#[test]
fn packed_weights_of_another_size_are_refused() {
    use crate::ir::tests::mlp;
    let d = mlp();
    let p = compile(&crate::compiler::import(&d.g, &d.consts).unwrap(), Target::Generic).unwrap();
    let mut b = ContextBuilder::new(Target::Generic);
    b.add_graph("mlp", &p).unwrap();
    let bytes = b.to_bytes().unwrap();
    let bad = tamper(&bytes, |m| {
        let w = m.weights.iter_mut().find(|w| w.gemm_packed.is_some()).unwrap();
        w.gemm_packed.as_mut().unwrap().n += 1;
        w.shape[1] += 1;
    });
    refused(&bad, "do not hold");
    let bad = tamper(&bytes, |m| {
        let w = m.weights.iter_mut().find(|w| w.gemm_packed.is_some()).unwrap();
        w.shape = vec![1];
    });
    refused(&bad, "[k, n]");
}

#[test]
fn context_models_and_checksum_round_trip() {
    let mut b = builder(&[graph_a()]);
    b.add_context_model("m_ctx.onnx");
    b.add_context_model("n_ctx.onnx");
    b.add_context_model("m_ctx.onnx");
    let mut out = Vec::new();
    let stats = b.write_to(&mut out).unwrap();
    let ctx = parse(&out).unwrap();
    assert_eq!(ctx.context_models(), ["m_ctx.onnx", "n_ctx.onnx"]);
    assert_eq!(ctx.checksum(), stats.checksum);
    assert_eq!(ctx.checksum(), Header::parse(&out).unwrap().checksum);
    // a file without the field (an older kiln) reads as "no models recorded"
    let old = tamper(&out, |m| m.context_models.clear());
    assert!(parse(&old).unwrap().context_models().is_empty());
}

#[test]
fn peek_reads_header_and_metadata_only() {
    let mut b = builder(&[graph_a(), graph_b()]);
    b.add_context_model("m_ctx.onnx");
    let bytes = b.to_bytes().unwrap();
    let header = Header::parse(&bytes).unwrap();
    // the weights are not needed: cut the file right after the metadata
    let cut = &bytes[..HEADER_LEN + header.metadata_len as usize];
    let p = peek(&mut &cut[..]).unwrap();
    assert_eq!(p.checksum, header.checksum);
    assert_eq!(p.context_models, ["m_ctx.onnx"]);
    assert_eq!(p.kiln_version, KILN_VERSION);
    assert_eq!(peek_checksum(&mut &bytes[..HEADER_LEN]).unwrap(), header.checksum);
    // what is not a kiln binary, or is cut inside the header or the metadata, is refused
    assert!(peek(&mut &b"user data"[..])
        .unwrap_err()
        .message
        .contains("not a kiln context binary"));
    assert!(peek(&mut &bytes[..40]).unwrap_err().message.contains("truncated"));
    assert!(peek(&mut &cut[..cut.len() - 1]).is_err());
    let mut newer = bytes.clone();
    newer[8..12].copy_from_slice(&(FORMAT_VERSION + 1).to_le_bytes());
    assert!(peek_checksum(&mut &newer[..])
        .unwrap_err()
        .message
        .contains("newer than"));
}

/// A bidirectional LSTM with peepholes, clip and mixed activations: its step
/// (tag 40) and packed weights go through the file and run identically.
#[test]
fn recurrent_step_round_trips() {
    use crate::ir::{RnnActivation as A, RnnAttrs, RnnCell, RnnDirection, RnnInputs, RnnSpec};
    let (h, dirs, input) = (3, 2, 4);
    let spec = RnnSpec {
        cell: RnnCell::Lstm {
            input_forget: true,
            peepholes: true,
        },
        direction: RnnDirection::Bidirectional,
        hidden: h,
        activations: vec![
            A::HardSigmoid(0.2, 0.5),
            A::ScaledTanh(1.5, 0.5),
            A::Tanh,
            A::Sigmoid,
            A::Elu(0.8),
            A::Softsign,
        ],
        clip: Some(3.0),
    };
    let dims = crate::kernels::recurrent::RnnDims {
        seq: 2,
        batch: 2,
        input,
    };
    let mut g = G::new("rnn");
    let x = g.input("x", &[2, 2, input]);
    let w = g.constant("w", &[dirs, 4 * h, input], row(dirs * 4 * h * input, 2));
    let r = g.constant("r", &[dirs, 4 * h, h], row(dirs * 4 * h * h, 3));
    let bias = g.constant("bias", &[dirs * 4 * h], row(dirs * 4 * h, 4));
    let h0 = g.input("h0", &[dirs, 2, h]);
    let c0 = g.input("c0", &[dirs, 2, h]);
    let p = g.constant("p", &[dirs * 3 * h], row(dirs * 3 * h, 5));
    let y = g.value("y", &[dims.out_len(&spec).unwrap()]);
    let has = RnnInputs {
        bias: true,
        initial_h: true,
        initial_c: true,
        p: true,
        ..RnnInputs::default()
    };
    g.0.add_node(
        "lstm",
        Op::Rnn(Box::new(RnnAttrs { spec, has })),
        vec![x, w, r, bias, h0, c0, p],
        vec![y],
    );
    g.0.outputs.push(y);
    let want = compile(&g.0, Target::Generic).unwrap();
    assert!(want.steps().iter().any(|s| matches!(s, crate::plan::Step::Rnn(_))));
    let mut b = ContextBuilder::new(Target::Generic);
    b.add_graph("rnn", &want).unwrap();
    let ctx = parse(&b.to_bytes().unwrap()).unwrap();
    assert_same_program(&ctx.program("rnn").unwrap().unwrap(), &want);
}

/// Convolutions (issue #13): a grouped conv with bias, activation and
/// residual (packed weights per group) and a depthwise one (tap-major
/// plain weights): their steps (tag 50) go through the file and run
/// identically; a window that does not fit its sizes is refused at load.
#[test]
fn conv_steps_round_trip() {
    use crate::ir::{Activation, Axis, ConvAttrs, Window};
    let axis = |input: usize, kernel: usize, stride: usize, pad: usize| Axis {
        input,
        output: (input + 2 * pad - kernel) / stride + 1,
        kernel,
        stride,
        dilation: 1,
        pad_begin: pad,
        pad_end: pad,
    };
    let mut g = G::new("conv");
    let x = g.input("x", &[2, 5, 6, 4]);
    let w1 = g.constant("w1", &[6, 2, 3, 3], row(6 * 2 * 9, 2));
    let b1 = g.constant("b1", &[6], row(6, 3));
    let res = g.input("res", &[2, 3, 3, 6]);
    let w2 = g.constant("w2", &[6, 1, 3, 3], row(6 * 9, 4));
    let a = g.value("a", &[2, 3, 3, 6]);
    let y = g.value("y", &[2, 3, 3, 6]);
    let win = Window {
        h: axis(5, 3, 2, 1),
        w: axis(6, 3, 2, 1),
    };
    let dense = ConvAttrs {
        window: win,
        groups: 2,
        bias: true,
        activation: Activation::LeakyRelu(0.1),
        residual: true,
        after: Activation::Relu,
    };
    g.0.add_node("c1", Op::Conv(Box::new(dense)), vec![x, w1, b1, res], vec![a]);
    let dw = ConvAttrs {
        window: Window {
            h: axis(3, 3, 1, 1),
            w: axis(3, 3, 1, 1),
        },
        groups: 6,
        bias: false,
        activation: Activation::None,
        residual: false,
        after: Activation::None,
    };
    g.0.add_node("c2", Op::Conv(Box::new(dw)), vec![a, w2], vec![y]);
    g.0.outputs.push(y);
    let want = compile(&g.0, Target::Generic).unwrap();
    let convs = want
        .steps()
        .iter()
        .filter(|s| matches!(s, crate::plan::Step::Conv(_)))
        .count();
    assert_eq!(convs, 2);
    let mut b = ContextBuilder::new(Target::Generic);
    b.add_graph("conv", &want).unwrap();
    let ctx = parse(&b.to_bytes().unwrap()).unwrap();
    assert_same_program(&ctx.program("conv").unwrap().unwrap(), &want);

    let mut parts = parts_of(&want);
    for s in &mut parts.steps {
        if let crate::plan::Step::Conv(c) = s {
            c.window.w.output += 1;
        }
    }
    let e = Program::from_parts(parts).unwrap_err();
    assert!(e.message.contains("Conv"), "{e}");
}

/// A convolution whose output took its residual's buffer (format 9,
/// `residual_in_dst`) survives the file and runs the same; a file that
/// names a residual buffer as well, or gives the step a strided output, is
/// refused at load.
#[test]
fn a_residual_in_the_output_round_trips() {
    use crate::ir::{Activation, Axis, ConvAttrs, Window};
    use crate::plan::ConvResidual;
    let axis = |input: usize| Axis {
        input,
        output: input,
        kernel: 3,
        stride: 1,
        dilation: 1,
        pad_begin: 1,
        pad_end: 1,
    };
    let mut g = G::new("onto");
    let x = g.input("x", &[1, 4, 5, 6]);
    let u = g.node(Op::Unary(UnaryOp::Abs), &[x], "u");
    let w = g.constant("w", &[6, 6, 3, 3], row(6 * 6 * 9, 2));
    let attrs = ConvAttrs {
        window: Window { h: axis(4), w: axis(5) },
        groups: 1,
        bias: false,
        activation: Activation::None,
        residual: true,
        after: Activation::Relu,
    };
    let c = g.value("c", &[1, 4, 5, 6]);
    g.0.add_node("c", Op::Conv(Box::new(attrs)), vec![x, w, u], vec![c]);
    let y = g.node(Op::Unary(UnaryOp::Neg), &[c], "y");
    g.0.outputs.push(y);
    let want = compile(&g.0, Target::Generic).unwrap();
    let in_dst = |p: &Program| {
        p.steps()
            .iter()
            .any(|s| matches!(s, crate::plan::Step::Conv(c) if c.residual == Some(ConvResidual::InDst)))
    };
    assert!(in_dst(&want), "{}", want.op_summary());
    let mut b = ContextBuilder::new(Target::Generic);
    b.add_graph("onto", &want).unwrap();
    let bytes = b.to_bytes().unwrap();
    let got = parse(&bytes).unwrap().program("onto").unwrap().unwrap();
    assert_same_program(&got, &want);
    assert!(in_dst(&got));

    let both = tamper_steps(&bytes, |k| {
        if let proto::step_info::Kind::Conv(c) = k {
            c.residual = c.x.clone();
        }
    });
    let err = parse(&both).and_then(|c| c.program("onto").map(|_| ())).unwrap_err();
    assert!(err.to_string().contains("both a buffer and its output"), "{err}");
    let mut parts = parts_of(&want);
    for s in &mut parts.steps {
        if let crate::plan::Step::Conv(c) = s {
            c.dst_stride = c.out_channels + 1;
        }
    }
    let e = Program::from_parts(parts).unwrap_err();
    assert!(e.message.contains("Conv"), "{e}");
}

/// Two convolutions that only a channel concat reads write into it in place
/// (format 8): on AVX2 their steps carry the concat's pixel stride, which
/// survives the file; a stride under the channels, or with a residual, is
/// refused at load.
#[test]
fn convolutions_into_a_concat_round_trip() {
    use crate::ir::{Activation, Axis, ConvAttrs, Window};
    let axis = |input: usize, kernel: usize| Axis {
        input,
        output: input,
        kernel,
        stride: 1,
        dilation: 1,
        pad_begin: kernel / 2,
        pad_end: kernel / 2,
    };
    let conv = |kernel: usize| {
        Op::Conv(Box::new(ConvAttrs {
            window: Window {
                h: axis(4, kernel),
                w: axis(5, kernel),
            },
            groups: 1,
            bias: false,
            activation: Activation::Relu,
            residual: false,
            after: Activation::None,
        }))
    };
    let mut g = G::new("cat");
    let x = g.input("x", &[1, 4, 5, 3]);
    let w1 = g.constant("w1", &[5, 3, 1, 1], row(15, 1));
    let w3 = g.constant("w3", &[7, 3, 3, 3], row(189, 2));
    let (a, b) = (g.value("a", &[1, 4, 5, 5]), g.value("b", &[1, 4, 5, 7]));
    let cat = g.value("cat", &[1, 4, 5, 12]);
    g.0.add_node("c1", conv(1), vec![x, w1], vec![a]);
    g.0.add_node("c3", conv(3), vec![x, w3], vec![b]);
    g.0.add_node("cat", Op::Concat { axis: 3 }, vec![a, b], vec![cat]);
    let y = g.node(Op::Unary(UnaryOp::Neg), &[cat], "y");
    g.0.outputs.push(y);
    let want = compile(&g.0, Target::Avx2).unwrap();
    let strides: Vec<(usize, usize)> = want
        .steps()
        .iter()
        .filter_map(|s| match s {
            crate::plan::Step::Conv(c) => Some((c.out_channels, c.dst_stride)),
            _ => None,
        })
        .collect();
    assert_eq!(strides, [(5, 12), (7, 12)]);
    assert!(want.op_counts().iter().any(|(n, k)| n == "Concat+InPlace" && *k == 1));
    let mut b = ContextBuilder::new(Target::Avx2);
    b.add_graph("cat", &want).unwrap();
    let ctx = parse(&b.to_bytes().unwrap()).unwrap();
    assert_same_program(&ctx.program("cat").unwrap().unwrap(), &want);

    for bad in [4, 0] {
        let mut parts = parts_of(&want);
        for s in &mut parts.steps {
            if let crate::plan::Step::Conv(c) = s {
                if bad == 0 {
                    // A residual with a strided output: the kernels have no stride for it.
                    c.residual = Some(crate::plan::ConvResidual::Buf(c.x));
                } else {
                    c.dst_stride = bad;
                }
            }
        }
        let e = Program::from_parts(parts).unwrap_err();
        assert!(e.message.contains("Conv"), "{e}");
    }
}

// Activations (issue #13).

/// Every activation of issue #13 as a step (unary, PRelu, GEMM epilogues)
/// survives the file with its parameters.
#[test]
fn activation_steps_round_trip() {
    use crate::ir::{Activation, MatMulAttrs};
    let mut g = G::new("act");
    // Square, so that G::node's broadcast shape is also the product's.
    let x = g.input("x", &[8, 8]);
    let unary = [
        UnaryOp::HardSigmoid(0.3, -0.4),
        UnaryOp::HardSwish,
        UnaryOp::Silu,
        UnaryOp::Elu(0.7),
        UnaryOp::Selu(1.5, 0.9),
        UnaryOp::Celu(2.5),
        UnaryOp::ThresholdedRelu(-0.25),
        UnaryOp::Softsign,
    ];
    let mut v = x;
    for (i, op) in unary.into_iter().enumerate() {
        v = g.node(Op::Unary(op), &[v], &format!("u{i}"));
    }
    let slope = g.constant("slope", &[8], row(8, 3));
    v = g.node(Op::Binary(BinaryOp::PRelu), &[v, slope], "prelu");
    g.0.outputs.push(v);
    let w = g.constant("w", &[8, 8], row(64, 4));
    for (i, act) in [
        Activation::HardSigmoid(0.25, 0.6),
        Activation::HardSwish,
        Activation::Silu,
    ]
    .into_iter()
    .enumerate()
    {
        let attrs = MatMulAttrs {
            activation: act,
            ..MatMulAttrs::default()
        };
        let y = g.node(Op::MatMul(attrs), &[x, w], &format!("mm{i}"));
        g.0.outputs.push(y);
    }
    let want = compile(&g.0, Target::Generic).unwrap();
    let bytes = builder(std::slice::from_ref(&g.0)).to_bytes().unwrap();
    let got = parse(&bytes).unwrap().program("act").unwrap().unwrap();
    assert_same_program(&got, &want);
    let steps = format!("{:?}", got.steps());
    for needle in [
        "HardSigmoid(0.3, -0.4)",
        "Selu(1.5, 0.9)",
        "ThresholdedRelu(-0.25)",
        "PRelu",
        "Silu",
    ] {
        assert!(steps.contains(needle), "{needle} not in {steps}");
    }
}

/// A grouped, strided, padded ConvTranspose with bias: its step (tag 55)
/// and per-group packed weights go through the file and run identically;
/// a step whose window no longer fits its buffers is refused at load.
#[test]
fn conv_transpose_step_round_trips() {
    use crate::ir::ConvTransposeAttrs;
    use crate::kernels::spatial::{Axis, Window};
    let axis = |input: usize, output: usize| Axis {
        input,
        output,
        kernel: 3,
        stride: 2,
        dilation: 1,
        pad_begin: 1,
        pad_end: 1,
    };
    // 2·(in−1) + 3 − 2 (+ output_padding 1 on W).
    let window = Window {
        h: axis(3, 5),
        w: Axis {
            pad_end: 0,
            ..axis(4, 7)
        },
    };
    let (g_, ci, co) = (2, 4, 6);
    let mut g = G::new("ct");
    let x = g.input("x", &[2, 3, 4, ci]);
    let w = g.constant("w", &[ci, co / g_, 3, 3], row(ci * (co / g_) * 9, 2));
    let b = g.constant("b", &[co], row(co, 3));
    let attrs = ConvTransposeAttrs {
        window,
        groups: g_,
        bias: true,
    };
    let y = g.value("y", &[2, 5, 7, co]);
    g.0.add_node("ct", Op::ConvTranspose(Box::new(attrs)), vec![x, w, b], vec![y]);
    g.0.outputs.push(y);
    let want = compile(&g.0, Target::Generic).unwrap();
    assert!(want
        .steps()
        .iter()
        .any(|s| matches!(s, crate::plan::Step::ConvTranspose(_))));
    let mut bld = ContextBuilder::new(Target::Generic);
    bld.add_graph("ct", &want).unwrap();
    let bytes = bld.to_bytes().unwrap();
    let ctx = parse(&bytes).unwrap();
    assert_same_program(&ctx.program("ct").unwrap().unwrap(), &want);

    let bad = tamper(&bytes, |m| {
        for s in &mut program0(m).steps {
            if let Some(proto::step_info::Kind::ConvTranspose(c)) = &mut s.kind {
                c.w.as_mut().unwrap().output += 1;
            }
        }
    });
    let err = parse(&bad).and_then(|c| c.program("ct").map(|_| ())).unwrap_err();
    assert!(err.to_string().contains("ConvTranspose"), "{err}");
}

/// The BERT layer compiled for the generic target and written to a binary
/// that reads back to the same steps; one of them must be what `has` wants.
fn bert_binary(opts: crate::ir::tests::Bert, has: fn(&crate::plan::Step) -> bool) -> (Program, Vec<u8>) {
    let d = crate::ir::tests::bert_layer(opts);
    let p = compile(&crate::compiler::import(&d.g, &d.consts).unwrap(), Target::Generic).unwrap();
    assert!(p.steps().iter().any(has), "{}", p.op_summary());
    let mut b = ContextBuilder::new(Target::Generic);
    b.add_graph("bert", &p).unwrap();
    let bytes = b.to_bytes().unwrap();
    let ctx = ContextBinary::parse(storage(&bytes)).unwrap();
    assert_eq!(ctx.program("bert").unwrap().unwrap().steps(), p.steps());
    (p, bytes)
}

/// `bytes` with `f` applied to the kind of every step of the first graph.
fn tamper_steps(bytes: &[u8], f: impl Fn(&mut proto::step_info::Kind)) -> Vec<u8> {
    tamper(bytes, |m| {
        for s in &mut m.graphs[0].program.as_mut().unwrap().steps {
            if let Some(k) = s.kind.as_mut() {
                f(k);
            }
        }
    })
}

// Fused attention (issue #14, format 4).
#[test]
fn attention_steps_round_trip_and_bad_ones_are_refused() {
    use crate::ir::tests::Bert;
    use crate::plan::Step;
    let opts = Bert {
        mask: true,
        fused_layernorm: false,
    };
    let (p, bytes) = bert_binary(opts, |s| matches!(s, Step::Attention(_)));
    let with_attention = |f: &dyn Fn(&mut proto::AttentionStep)| {
        tamper_steps(&bytes, |k| {
            if let proto::step_info::Kind::Attention(a) = k {
                f(a);
            }
        })
    };
    // A mask stride reaching past the mask, a head count that does not fit
    // the buffers, two strides instead of three.
    refused(&with_attention(&|a| a.mask_strides[0] = 1 << 40), "do not allow");
    refused(&with_attention(&|a| a.heads += 1), "do not allow");
    refused(&with_attention(&|a| a.mask_strides.truncate(2)), "mask strides");
    // Q, K and V's projections are one product over three packed weights and
    // the attention reads them packed (format 6): both survive the trip,
    // and a program that reads them otherwise is refused.
    assert!(
        p.steps()
            .iter()
            .any(|s| matches!(s, Step::Attention(a) if a.packed_qkv)),
        "{}",
        p.op_summary()
    );
    refused(&with_attention(&|a| a.packed_qkv = false), "do not allow");
    let with_parts = |f: &dyn Fn(&mut Vec<u64>)| {
        tamper_steps(&bytes, |k| match k {
            proto::step_info::Kind::MatMul(x) if !x.packed_b_parts.is_empty() => f(&mut x.packed_b_parts),
            _ => {}
        })
    };
    refused(&with_parts(&|parts| parts.truncate(2)), "packed_b_parts");
    refused(&with_parts(&|parts| parts[1] = parts[0] + 100), "packed");
    // A part of another width (the FFN's 32 x 64 weight): the parts no
    // longer make the product's N.
    let ffn = tamper(&bytes, |m| {
        let steps = &mut m.graphs[0].program.as_mut().unwrap().steps;
        let wide = steps.iter().find_map(|s| match &s.kind {
            Some(proto::step_info::Kind::MatMul(x)) if x.n == 64 => x.packed_b,
            _ => None,
        });
        for s in steps.iter_mut() {
            if let Some(proto::step_info::Kind::MatMul(x)) = s.kind.as_mut() {
                if let (Some(w), false) = (wide, x.packed_b_parts.is_empty()) {
                    x.packed_b_parts[0] = w;
                }
            }
        }
    });
    refused(&ffn, "do not fit");
}

// Embeddings + LayerNorm (issue #14, format 7).
#[test]
fn embed_layer_norm_steps_round_trip_and_bad_ones_are_refused() {
    use crate::ir::tests::Bert;
    use crate::plan::Step;
    let opts = Bert {
        mask: false,
        fused_layernorm: true,
    };
    let (_, bytes) = bert_binary(opts, |s| matches!(s, Step::EmbedLayerNorm(_)));
    let with_embed = |f: &dyn Fn(&mut proto::EmbedLayerNormStep)| {
        tamper_steps(&bytes, |k| {
            if let proto::step_info::Kind::EmbedLayerNorm(e) = k {
                f(e);
            }
        })
    };
    // A stride reaching past its term, a stride list of the wrong rank, no
    // terms, float indices, a wider row than the scale, a lost table.
    refused(&with_embed(&|e| e.terms[1].strides[0] = 1 << 40), "do not allow");
    refused(
        &with_embed(&|e| e.terms[0].strides.pop().map(drop).unwrap_or(())),
        "do not allow",
    );
    refused(&with_embed(&|e| e.terms.clear()), "do not allow");
    refused(
        &with_embed(&|e| {
            for t in e.terms.iter_mut().filter(|t| t.table.is_some()) {
                t.idx_dtype = 1;
            }
        }),
        "holds int64, as float",
    );
    refused(&with_embed(&|e| e.width += 1), "do not allow");
    refused(&with_embed(&|e| e.terms[0].src = None), "missing");
}

// Elementwise chains (issue #14, format 11).
#[test]
fn chain_steps_round_trip_and_bad_ones_are_refused() {
    use crate::plan::Step;
    let p = crate::compiler::compile(&graph_a(), Target::Generic).unwrap();
    assert!(matches!(p.steps(), [Step::Chain(_)]), "{}", p.op_summary());
    let mut b = ContextBuilder::new(Target::Generic);
    b.add_graph("a", &p).unwrap();
    let bytes = b.to_bytes().unwrap();
    let read = parse(&bytes).unwrap().program("a").unwrap().unwrap();
    assert_same_program(&read, &p);
    let with_chain = |f: &dyn Fn(&mut proto::ChainStep)| {
        tamper_steps(&bytes, |k| {
            if let proto::step_info::Kind::Chain(c) = k {
                f(c);
            }
        })
    };
    // An op reading a later result or a missing input, a row input read
    // as the output's size, a row of another length, an unknown access, too
    // many ops, a unary op on a row, a lost input buffer.
    refused(&with_chain(&|c| c.ops[0].a_result = true), "do not allow");
    refused(&with_chain(&|c| c.ops[1].a = 7), "do not allow");
    refused(&with_chain(&|c| c.inputs[1].access = 0), "do not allow");
    refused(&with_chain(&|c| c.inputs[1].inner = 4), "do not allow");
    refused(&with_chain(&|c| c.inputs[1].access = 9), "unknown chain input access 9");
    refused(
        &with_chain(&|c| c.ops = [c.ops.clone(), c.ops.clone(), c.ops.clone()].concat()),
        "do not allow",
    );
    refused(
        &with_chain(&|c| {
            c.ops[1].a = 1;
            c.ops[1].a_result = false;
        }),
        "do not allow",
    );
    refused(&with_chain(&|c| c.inputs[0].src = None), "missing");
    // A channel input whose runs do not tile the output.
    refused(
        &with_chain(&|c| {
            c.inputs[1].access = 3;
            c.inputs[1].count = 8;
            c.inputs[1].inner = 3;
        }),
        "do not allow",
    );
    // Channels-first per-channel constants round-trip and run the same.
    let mut g = G::new("nchw");
    let x = g.input("x", &[2, 3, 4, 5]);
    let c = g.constant("c", &[3, 1, 1], row(3, 2));
    let m = g.node(Op::Binary(BinaryOp::Mul), &[x, c], "m");
    let y = g.node(Op::Unary(UnaryOp::Tanh), &[m], "y");
    g.0.outputs.push(y);
    let p = crate::compiler::compile(&g.0, Target::Generic).unwrap();
    assert!(matches!(p.steps(), [Step::Chain(_)]), "{}", p.op_summary());
    let mut b = ContextBuilder::new(Target::Generic);
    b.add_graph("nchw", &p).unwrap();
    let read = parse(&b.to_bytes().unwrap()).unwrap().program("nchw").unwrap().unwrap();
    assert_same_program(&read, &p);
}
