//! Fuzz target bodies, shared by the libFuzzer crate in `fuzz/` and by the
//! replay test (`fuzz/replay.rs`) that `make test` runs over every
//! corpus and regression file, so the two cannot drift. Each target takes
//! arbitrary bytes and must return without panicking: bad input is a clean
//! [`Error`]. Not part of kiln's API.
//!
//! Input formats (what `fuzz/make_corpus.py` writes):
//! - [`context_binary`]: the bytes of a `<model>_kiln.bin` (programs and
//!   shape-generic graphs; the latter are imported and compiled as at run time).
//! - [`ep_context_attrs`]: `flags:u8` (bit 0 embed_mode, 1 main_context,
//!   2 partition_name, 3 ep_cache_context present), `embed_mode:i64le`,
//!   `main_context:i64le`, `partition_name` (u8 length + bytes), then the rest
//!   is `ep_cache_context`.
//! - [`node_import`]: a small graph, see [`decode_graph`].

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, OnceLock};

use crate::compiler::generic::GenericGraph;
use crate::context::{recompute_checksum, ContextBinary, StoredGraph};
use crate::ep::epcontext::reader::resolve_inside;
use crate::ep::epcontext::schema::{BinarySource, ContextAttrs, RawContextAttrs};
use crate::error::{Error, ErrorKind};
use crate::ir::{AttrValue, DType, GraphDesc, NodeDesc, TensorValue, ValueDesc};
use crate::kernels::parallel::Serial;
use crate::kernels::{TensorMut, TensorRef};
use crate::plan::{AlignedBytes, Program, TensorSpec};
use crate::target::Target;

/// Programs with more input/output/arena elements than this are not run
/// (the point is the reader, not memory exhaustion).
const RUN_LIMIT_BYTES: usize = 1 << 22;

/// Target 1: parse a context binary as given, then again with its checksum
/// recomputed so the metadata parser and program validation are reached.
/// Whatever parses is described and every program run on zeros.
pub fn context_binary(data: &[u8]) -> bool {
    let accepted = check_binary(data);
    let mut fixed = data.to_vec();
    if recompute_checksum(&mut fixed) && fixed != data {
        check_binary(&fixed);
    }
    accepted
}

fn check_binary(data: &[u8]) -> bool {
    let Some(binary) = parse_binary(data) else { return false };
    let _ = binary.describe();
    for name in binary.graph_names() {
        let graph = binary.stored_graph(&name).expect("listed graph");
        if let StoredGraph::Program(_) = graph {
            assert!(binary.program(&name).is_ok_and(|p| p.is_some()));
        } else {
            assert_clean(
                &binary.program(&name).expect_err("a generic graph is no program"),
                &[ErrorKind::InvalidGraph],
            );
        }
        run_stored(&graph);
    }
    true
}

/// Runs a program on zeros; a shape-generic graph is first imported from its
/// stored description and constants and compiled, as at run time.
fn run_stored(graph: &StoredGraph) {
    match graph {
        StoredGraph::Program(p) => run_on_zeros(p),
        StoredGraph::Generic(g) => {
            if let Some(program) = compile_generic(g) {
                run_on_zeros(&program);
            }
        }
    }
}

/// The generic graph `g` imported and compiled for its target, or `None`
/// after a clean refusal (or if its constants are too large to copy).
fn compile_generic(g: &GenericGraph) -> Option<Program> {
    if g.constants.iter().map(|c| c.data.byte_len()).sum::<usize>() > RUN_LIMIT_BYTES {
        return None;
    }
    let constants = g.constant_values();
    // As a first run would: the inputs' unknown dims at a small size.
    let mut desc = g.desc.clone();
    for name in &g.desc.inputs {
        if let Some(dims) = desc.values.get_mut(name).and_then(|v| v.dims.as_mut()) {
            dims.iter_mut().filter(|d| **d < 0).for_each(|d| *d = 2);
        }
    }
    let ir = crate::compiler::import(&desc, &constants)
        .map_err(|e| assert_clean(&e, IMPORT_REFUSALS))
        .ok()?;
    let huge = |v: &crate::ir::Value| v.ty.checked_numel().is_none_or(|n| n > COMPILE_LIMIT_ELEMS);
    if ir.values.iter().any(huge) {
        return None;
    }
    crate::compiler::compile(&ir, g.target)
        .map_err(|e| assert_clean(&e, IMPORT_REFUSALS))
        .ok()
}

/// Parses; asserts a refusal is an `InvalidGraph` with a message.
fn parse_binary(data: &[u8]) -> Option<ContextBinary> {
    let storage = Arc::new(AlignedBytes::copy_from(data));
    match ContextBinary::parse(storage) {
        Ok(b) => Some(b),
        Err(e) => {
            assert_clean(&e, &[ErrorKind::InvalidGraph]);
            None
        }
    }
}

/// A refusal must be one of the `kinds` and say something.
pub fn assert_clean(e: &Error, kinds: &[ErrorKind]) {
    assert!(kinds.contains(&e.kind), "unexpected error kind: {e}");
    assert!(!e.message.trim().is_empty(), "empty error message ({:?})", e.kind);
}

/// Runs `p` on zero inputs if it is small and this CPU can run it; a refusal
/// must be clean.
fn run_on_zeros(p: &Program) {
    let host = Target::cpu_best();
    if !p.target().can_run_on(host) {
        return;
    }
    let bytes = |specs: &[TensorSpec]| {
        specs
            .iter()
            .map(|s| s.numel().saturating_mul(s.dtype().map_or(1, DType::size)))
            .fold(0usize, usize::saturating_add)
    };
    let total = bytes(p.inputs())
        .saturating_add(bytes(p.outputs()))
        .saturating_add(p.arena_bytes());
    if total > RUN_LIMIT_BYTES {
        return;
    }
    let mut ins: Vec<Buf> = p.inputs().iter().map(Buf::zeros).collect();
    let mut outs: Vec<Buf> = p.outputs().iter().map(Buf::zeros).collect();
    let in_refs: Vec<TensorRef<'_>> = ins.iter_mut().map(|b| b.as_ref()).collect();
    let mut out_refs: Vec<TensorMut<'_>> = outs.iter_mut().map(|b| b.as_mut()).collect();
    if let Err(e) = p.run(host, &in_refs, &mut out_refs, &Serial) {
        assert_clean(
            &e,
            &[
                ErrorKind::InvalidGraph,
                ErrorKind::InvalidArgument,
                ErrorKind::Runtime,
                ErrorKind::Fail,
            ],
        );
    }
}

/// An owned tensor of one of the boundary element types.
enum Buf {
    F32(Vec<f32>),
    I64(Vec<i64>),
    I32(Vec<i32>),
    Bool(Vec<u8>),
    F16(Vec<u16>),
}

impl Buf {
    fn zeros(spec: &TensorSpec) -> Buf {
        let n = spec.numel();
        match spec.dtype() {
            Some(DType::I64) => Buf::I64(vec![0; n]),
            Some(DType::I32) => Buf::I32(vec![0; n]),
            Some(DType::Bool) => Buf::Bool(vec![0; n]),
            Some(DType::F16) => Buf::F16(vec![0; n]),
            _ => Buf::F32(vec![0.0; n]),
        }
    }

    fn as_ref(&self) -> TensorRef<'_> {
        match self {
            Buf::F32(v) => TensorRef::F32(v),
            Buf::I64(v) => TensorRef::I64(v),
            Buf::I32(v) => TensorRef::I32(v),
            Buf::Bool(v) => TensorRef::Bool(v),
            Buf::F16(v) => TensorRef::F16(v),
        }
    }

    fn as_mut(&mut self) -> TensorMut<'_> {
        match self {
            Buf::F32(v) => TensorMut::F32(v),
            Buf::I64(v) => TensorMut::I64(v),
            Buf::I32(v) => TensorMut::I32(v),
            Buf::Bool(v) => TensorMut::Bool(v),
            Buf::F16(v) => TensorMut::F16(v),
        }
    }
}

/// Target 2: an EPContext node's raw attributes through the same ORT-free
/// checks `ContextNode::read` and the loader apply: defaults, partition name,
/// embed mode, file name (resolved inside an empty folder) or embedded
/// payload (parsed, and the partition looked up in it).
pub fn ep_context_attrs(data: &[u8]) -> bool {
    let (raw, payload) = decode_attrs(data);
    let attrs = match ContextAttrs::from_raw(raw) {
        Ok(a) => a,
        Err((a, cause)) => {
            assert!(!cause.is_empty() && !a.origin().is_empty());
            return false;
        }
    };
    let _ = attrs.origin();
    if attrs.main_context == 0 {
        return true;
    }
    match attrs.binary_source() {
        Err(cause) => {
            assert!(!cause.is_empty());
            false
        }
        Ok(BinarySource::File(rel)) => match resolve_inside(empty_folder(), rel) {
            Err(cause) => {
                assert!(!cause.is_empty());
                // The folder is empty: a well-formed name gets as far as "does not exist".
                cause.contains("does not exist")
            }
            Ok(_) => true,
        },
        Ok(BinarySource::Embedded) => {
            let Some(binary) = payload.and_then(|p| parse_binary(&p)) else {
                return false;
            };
            match binary.stored_graph(&attrs.partition_name) {
                Some(g) => {
                    run_stored(&g);
                    true
                }
                None => false,
            }
        }
    }
}

/// An empty folder for file names to be resolved in (nothing can be found).
fn empty_folder() -> &'static std::path::Path {
    static DIR: OnceLock<std::path::PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::env::temp_dir().join("kiln-fuzz-empty-folder");
        std::fs::create_dir_all(&dir).expect("create an empty folder for the fuzz target");
        dir
    })
}

/// The attribute layout described in the module docs; missing bytes read as zero.
/// Also returns `ep_cache_context` as the embedded payload (ORT hands it
/// over separately for embed_mode=1).
pub fn decode_attrs(data: &[u8]) -> (RawContextAttrs, Option<Vec<u8>>) {
    let mut r = Reader(data);
    let flags = r.u8();
    let embed_mode = r.i64();
    let main_context = r.i64();
    let partition_name = r.bytes8();
    let cache = r.rest().to_vec();
    let has = |bit: u8| flags & (1 << bit) != 0;
    let raw = RawContextAttrs {
        embed_mode: has(0).then_some(embed_mode),
        main_context: has(1).then_some(main_context),
        partition_name: has(2).then_some(partition_name),
        ep_cache_context: has(3).then(|| cache.clone()),
    };
    (raw, has(3).then_some(cache))
}

/// Target 3: a small graph described by fuzz bytes through
/// `check_support` and `import`; what imports is validated, compiled and
/// run on zeros.
pub fn node_import(data: &[u8]) -> bool {
    let (graph, constants) = decode_graph(data);
    let support = crate::compiler::check_support(&graph, &constants, &[]);
    assert_eq!(support.len(), graph.nodes.len());
    for why in support.iter().filter_map(|r| r.as_ref().err()) {
        assert!(!why.is_empty());
    }
    let ir = match crate::compiler::import(&graph, &constants) {
        Ok(g) => g,
        Err(e) => {
            assert_clean(&e, IMPORT_REFUSALS);
            return false;
        }
    };
    ir.validate().expect("an imported graph validates");
    // Compiling costs memory in proportion to the tensors' sizes (e.g. one
    // batch-table entry per MatMul batch): a graph with tensors of billions of
    // elements needs gigabytes to compile. That is the model's size, not a
    // reader bug, so such graphs are imported but not compiled.
    let huge = |v: &crate::ir::Value| v.ty.checked_numel().is_none_or(|n| n > COMPILE_LIMIT_ELEMS);
    if ir.values.iter().any(huge) {
        return true;
    }
    let program = match crate::compiler::compile(&ir, Target::Generic) {
        Ok(p) => p,
        Err(e) => {
            assert_clean(&e, IMPORT_REFUSALS);
            return false;
        }
    };
    run_on_zeros(&program);
    true
}

/// How importing or compiling a graph may refuse it cleanly.
const IMPORT_REFUSALS: &[ErrorKind] = &[
    ErrorKind::InvalidGraph,
    ErrorKind::NotImplemented,
    ErrorKind::InvalidArgument,
];

/// Graphs with a larger tensor are imported but not compiled (see [`node_import`]).
const COMPILE_LIMIT_ELEMS: usize = 1 << 24;

/// Most values a decoded graph has; most elements of a decoded constant.
const MAX_VALUES: usize = 16;
const MAX_CONST_ELEMS: usize = 1024;

/// Decodes a graph (missing bytes read as zero):
///
/// ```text
/// graph   := n_inputs:u8 input* n_nodes:u8 node*
/// input   := value_desc is_const:u8 [tensor]      values are named v0, v1, ...
/// node    := op:str since_version:u8 n_in:u8 in_ref:u8* n_out:u8 out_desc* n_attr:u8 attr*
/// in_ref  := 255 = omitted (""), else index (mod count) of a value defined so far
/// out_desc:= known:u8 [value_desc]                 outputs get the next names
/// value_desc := elem_type:u8 rank:u8 (255 = unknown) dim:u8* (255 = -1, symbolic)
/// attr    := name:str kind:u8 payload
///   kind 0 int:i64 | 1 ints: n:u8 i64* | 2 float:f32 | 3 floats: n:u8 f32*
///        4 string:str | 5 strings: n:u8 str* | 6 tensor | other: unsupported
/// tensor  := elem_type:u8 rank:u8 dim:u8* n:u16 byte*   (bytes padded/cut to fit)
/// str     := len:u8 byte*
/// ```
///
/// The graph's outputs are the last node's outputs (all values if no node).
pub fn decode_graph(data: &[u8]) -> (GraphDesc, HashMap<String, TensorValue>) {
    let mut r = Reader(data);
    let mut g = GraphDesc::default();
    let mut constants = HashMap::new();
    let mut names: Vec<String> = Vec::new();
    for _ in 0..r.u8() % 5 {
        let name = format!("v{}", names.len());
        g.values.insert(name.clone(), r.value_desc());
        if r.u8() & 1 == 1 {
            constants.insert(name.clone(), r.tensor());
        } else {
            g.inputs.push(name.clone());
        }
        names.push(name);
    }
    for k in 0..r.u8() % 4 {
        if names.len() >= MAX_VALUES {
            break;
        }
        let op_type = r.string();
        let since_version = r.u8() as i32;
        let inputs = (0..r.u8() % 6)
            .map(|_| match r.u8() {
                255 => String::new(),
                i if names.is_empty() => format!("v{i}"),
                i => names[i as usize % names.len()].clone(),
            })
            .collect();
        let mut outputs = Vec::new();
        for _ in 0..r.u8() % 4 {
            let name = format!("v{}", names.len());
            let desc = match r.u8() & 1 {
                1 => r.value_desc(),
                _ => ValueDesc::default(),
            };
            g.values.insert(name.clone(), desc);
            outputs.push(name.clone());
            names.push(name);
        }
        let attrs = (0..r.u8() % 8)
            .map(|_| (r.string(), r.attr()))
            .collect::<BTreeMap<_, _>>();
        g.nodes.push(NodeDesc {
            name: format!("n{k}"),
            domain: String::new(),
            op_type,
            since_version,
            inputs,
            outputs,
            attrs,
        });
    }
    g.outputs = match g.nodes.last() {
        Some(n) => n.outputs.clone(),
        None => g.inputs.clone(),
    };
    (g, constants)
}

/// Reads fuzz bytes; past the end everything is zero.
struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.0.len());
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        head
    }

    fn array<const N: usize>(&mut self) -> [u8; N] {
        let mut a = [0u8; N];
        let b = self.take(N);
        a[..b.len()].copy_from_slice(b);
        a
    }

    fn u8(&mut self) -> u8 {
        self.array::<1>()[0]
    }

    fn i64(&mut self) -> i64 {
        i64::from_le_bytes(self.array())
    }

    fn f32(&mut self) -> f32 {
        f32::from_le_bytes(self.array())
    }

    fn bytes8(&mut self) -> Vec<u8> {
        let n = self.u8() as usize;
        self.take(n).to_vec()
    }

    fn string(&mut self) -> String {
        String::from_utf8_lossy(&self.bytes8()).into_owned()
    }

    fn rest(&mut self) -> &[u8] {
        let n = self.0.len();
        self.take(n)
    }

    fn dims(&mut self, rank: u8) -> Vec<i64> {
        (0..rank % 7)
            .map(|_| match self.u8() {
                255 => -1,
                d => d as i64,
            })
            .collect()
    }

    fn value_desc(&mut self) -> ValueDesc {
        let elem_type = self.u8() as i32;
        let rank = self.u8();
        let dims = (rank != 255).then(|| self.dims(rank));
        ValueDesc {
            elem_type,
            dims,
            ..ValueDesc::default()
        }
    }

    fn tensor(&mut self) -> TensorValue {
        let elem_type = self.u8() as i32;
        let rank = self.u8();
        let mut shape: Vec<usize> = self.dims(rank).iter().map(|&d| d.max(0) as usize).collect();
        if shape.iter().product::<usize>() > MAX_CONST_ELEMS {
            shape = vec![0];
        }
        let n = u16::from_le_bytes(self.array()) as usize;
        let mut bytes = self.take(n).to_vec();
        let size = DType::from_onnx(elem_type).map_or(4, DType::size);
        bytes.resize(shape.iter().product::<usize>() * size, 0);
        TensorValue {
            elem_type,
            shape,
            bytes,
        }
    }

    fn attr(&mut self) -> AttrValue {
        match self.u8() {
            0 => AttrValue::Int(self.i64()),
            1 => AttrValue::Ints((0..self.u8() % 9).map(|_| self.i64()).collect()),
            2 => AttrValue::Float(self.f32()),
            3 => AttrValue::Floats((0..self.u8() % 9).map(|_| self.f32()).collect()),
            4 => AttrValue::String(self.string()),
            5 => AttrValue::Strings((0..self.u8() % 5).map(|_| self.string()).collect()),
            6 => AttrValue::Tensor(self.tensor()),
            k => AttrValue::Unsupported(format!("kind {k}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attrs(embed: Option<i64>, main: Option<i64>, part: Option<&str>, cache: Option<&str>) -> RawContextAttrs {
        RawContextAttrs {
            embed_mode: embed,
            main_context: main,
            partition_name: part.map(|s| s.as_bytes().to_vec()),
            ep_cache_context: cache.map(|s| s.as_bytes().to_vec()),
        }
    }

    /// The pure attribute reading the fuzzer drives gives what
    /// `ContextNode::read` and the loader gave before it was factored out.
    #[test]
    fn context_attrs_defaults_and_refusals() {
        let a = ContextAttrs::from_raw(attrs(None, None, Some("p"), Some("ignored"))).unwrap();
        assert_eq!((a.embed_mode, a.main_context, a.cache_context.as_deref()), (1, 1, None));
        assert_eq!(a.binary_source(), Ok(BinarySource::Embedded));
        assert_eq!(a.origin(), "embedded payload in ep_cache_context");

        let (a, why) = ContextAttrs::from_raw(attrs(Some(0), None, None, Some("m_kiln.bin"))).unwrap_err();
        assert_eq!(why, "it has no partition_name attribute");
        assert_eq!(a.origin(), "file 'm_kiln.bin'");

        let file = ContextAttrs::from_raw(attrs(Some(0), Some(1), Some("p"), Some("m_kiln.bin"))).unwrap();
        assert_eq!(file.binary_source(), Ok(BinarySource::File("m_kiln.bin")));
        let (_, why) = ContextAttrs::from_raw(attrs(Some(2), None, Some("p"), None)).unwrap_err();
        assert_eq!(why, "embed_mode 2 is not 0 or 1");
        let (_, why) = ContextAttrs::from_raw(attrs(Some(0), Some(-1), Some("p"), None)).unwrap_err();
        assert_eq!(why, "main_context -1 is not 0 or 1");
        let empty = ContextAttrs::from_raw(attrs(Some(0), None, Some("p"), Some(""))).unwrap();
        assert_eq!(
            empty.binary_source().unwrap_err(),
            "ep_cache_context is empty or absent"
        );
        let binary = ContextAttrs::from_raw(attrs(Some(0), None, Some("p"), Some("KILN\u{1}"))).unwrap();
        assert!(binary.binary_source().unwrap_err().contains("expects a file name"));
        assert_eq!(binary.origin(), "ep_cache_context of 5 bytes that is not a file name");
        let shared = ContextAttrs::from_raw(attrs(Some(0), Some(0), Some("p"), None)).unwrap();
        assert_eq!(shared.origin(), "main_context=0, no file of its own");
    }

    #[test]
    fn attribute_bytes_decode_as_documented() {
        let mut data = vec![0b1111u8];
        data.extend(0i64.to_le_bytes());
        data.extend(1i64.to_le_bytes());
        data.extend([2, b'g', b'1']);
        data.extend(b"m_kiln.bin");
        let (raw, payload) = decode_attrs(&data);
        assert_eq!(raw, attrs(Some(0), Some(1), Some("g1"), Some("m_kiln.bin")));
        assert_eq!(payload.as_deref(), Some(&b"m_kiln.bin"[..]));
        assert_eq!(decode_attrs(&[]).0, RawContextAttrs::default());
    }
}
