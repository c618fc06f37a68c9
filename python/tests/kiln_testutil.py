"""Shared helpers for kiln's Python tests.

Sessions that use kiln must all be gone before kiln is unregistered (else
ONNX Runtime crashes at exit). So every helper here creates its session,
extracts plain Python / NumPy results and drops the session before
returning, and converts ORT exceptions into ``KilnSessionError`` raised
*outside* the ``except`` block, so no traceback keeps a half-built session
alive.
"""
from __future__ import annotations

import gc
import os
import shutil
import sys
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import onnxruntime as ort
from onnx import helper
from onnxruntime.capi import onnxruntime_pybind11_state as C

import onnxruntime_ep_kiln as kiln

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(TESTS_DIR)
REPO_DIR = os.path.dirname(PYTHON_DIR)
MODELS_DIR = os.path.join(REPO_DIR, "models")

RTOL = 1e-5
ATOL = 1e-6

MODEL_NAMES = ("add_mul_relu", "split", "unsupported", "all_ops", "demo", "attrs", "share_a", "share_b", "share_c")
SUPPORTED_OPS = ("Add", "Sub", "Mul", "Div", "Relu", "Sigmoid", "Tanh", "Neg", "Abs",
                 "Sqrt", "Exp", "Identity")

_NP = {"tensor(float)": np.float32}


# --------------------------------------------------------------------------
# host
# --------------------------------------------------------------------------
def cpu_flags() -> set:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def host_target(max_target: Optional[str] = None) -> str:
    """The target kiln should pick for this machine (capped by ``max_target``)."""
    flags = cpu_flags()
    if {"avx512f", "avx512bw", "avx512vl", "fma"} <= flags:
        best = "x86_64-avx512"
    elif {"avx2", "fma"} <= flags:
        best = "x86_64-avx2"
    else:
        best = "x86_64-generic"
    if max_target is not None:
        order = list(kiln.TARGETS)  # best first
        best = order[max(order.index(best), order.index(max_target))]
    return best


# --------------------------------------------------------------------------
# running models
# --------------------------------------------------------------------------
def make_feeds(model_path: str, seed: int = 0) -> Dict[str, np.ndarray]:
    sess = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(seed)
    feeds = {}
    for inp in sess.get_inputs():
        assert inp.type in _NP, f"test models use float inputs only, got {inp.type}"
        feeds[inp.name] = rng.standard_normal(inp.shape).astype(_NP[inp.type])
    del sess
    return feeds


def run_cpu(model_path: str, feeds: Dict[str, np.ndarray],
            opt_level: Optional[ort.GraphOptimizationLevel] = None) -> Tuple[List[str], List[np.ndarray]]:
    """Reference outputs from ONNX Runtime's own CPU EP: (output names, values).
    ``opt_level``: the session's graph optimization level (default: ORT's, ENABLE_ALL)."""
    so = ort.SessionOptions()
    if opt_level is not None:
        so.graph_optimization_level = opt_level
    sess = ort.InferenceSession(model_path, so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    outs = sess.run(names, feeds)
    del sess
    return names, outs


class KilnSessionError(Exception):
    """An ORT error from creating / running a kiln session, detached from its traceback."""

    def __init__(self, exc_type: type, message: str, stage: str):
        super().__init__(f"{stage}: {exc_type.__module__}.{exc_type.__name__}: {message}")
        self.exc_type = exc_type
        self.message = message
        self.stage = stage


@dataclass
class KilnRun:
    output_names: List[str]
    outputs: Optional[List[np.ndarray]]
    stats_before: Dict[str, int]
    stats_created: Dict[str, int]
    stats_after: Dict[str, int]
    providers: List[str]
    # [(ep_name, [(node_name, op_type), ...]), ...] or None if not recorded
    assignment: Optional[List[Tuple[str, List[Tuple[str, str]]]]] = None
    runs: int = 0
    # outputs of every feed of ``feeds_seq`` (run_kiln(..., feeds_seq=[...])), in order
    all_outputs: Optional[List[List[np.ndarray]]] = None

    def created_delta(self, key: str) -> int:
        return self.stats_created[key] - self.stats_before[key]

    def run_delta(self, key: str) -> int:
        return self.stats_after[key] - self.stats_created[key]

    def nodes_on(self, ep_name: str) -> List[Tuple[str, str]]:
        assert self.assignment is not None
        return [n for ep, nodes in self.assignment if ep == ep_name for n in nodes]

    def subgraphs_on(self, ep_name: str) -> int:
        assert self.assignment is not None
        return sum(1 for ep, _ in self.assignment if ep == ep_name)


#: kiln options the helpers below add unless a test sets them: ``claim=all``
#: takes every node kiln can run. The tests of kernels, formats and the ABI
#: use toy graphs (a lone Add, a small MatMul) that the default cost rule
#: (``claim=cost``) rightly leaves to ORT; tests of the rule pass ``claim``.
TEST_OPTIONS = {"claim": "all"}


def with_test_options(options: Optional[Dict[str, str]]) -> Dict[str, str]:
    merged = dict(TEST_OPTIONS)
    merged.update(options or {})
    return merged


def _session_options(devices: Sequence, options: Optional[Dict[str, str]],
                     config: Optional[Dict[str, str]], opt_level=None, threads: Optional[int] = None) -> ort.SessionOptions:
    so = ort.SessionOptions()
    if opt_level is not None:
        so.graph_optimization_level = opt_level
    if threads is not None:
        so.intra_op_num_threads = threads
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    for k, v in (config or {}).items():
        so.add_session_config_entry(k, v)
    so.add_provider_for_devices(list(devices), with_test_options(options))
    return so


def run_kiln(model_path: str, device, feeds: Optional[Dict[str, np.ndarray]] = None,
             options: Optional[Dict[str, str]] = None, config: Optional[Dict[str, str]] = None,
             runs: int = 1, feeds_seq: Optional[Sequence[Dict[str, np.ndarray]]] = None,
             opt_level: Optional[ort.GraphOptimizationLevel] = None, threads: Optional[int] = None) -> KilnRun:
    """Create a session on ``device`` (a kiln OrtEpDevice), run it ``runs`` times
    (if ``feeds`` is given) and return outputs, kiln stats and node assignment.
    ``feeds_seq``: then also run once with each of these feeds, in order, in the
    same session (outputs in ``all_outputs``). ``opt_level``: the session's graph
    optimization level (ORT applies its basic fusions *before* kiln's
    GetCapability; ``ORT_DISABLE_ALL`` hands kiln the model as written).
    ``threads``: ``intra_op_num_threads`` (kiln runs on ORT's intra-op pool).

    Raises KilnSessionError (never the raw ORT exception)."""
    err = None
    sess = None
    result = None
    stage = "session options"
    try:
        so = _session_options([device], options, config, opt_level, threads)
        before = stats()
        stage = "session creation"
        # enable_fallback=0: the Python wrapper would otherwise catch an EP error,
        # print "EP Error ... Falling back" and silently retry on the CPU EP alone.
        sess = ort.InferenceSession(model_path, so, enable_fallback=0)
        created = stats()
        names = [o.name for o in sess.get_outputs()]
        outs = None
        stage = "run"
        if feeds is not None:
            for _ in range(runs):
                outs = sess.run(names, feeds)
        all_outs = [sess.run(names, f) for f in feeds_seq] if feeds_seq is not None else None
        after = stats()
        stage = "graph assignment info"
        assignment = [(sg.ep_name, [(n.name, n.op_type) for n in sg.get_nodes()])
                      for sg in sess.get_provider_graph_assignment_info()]
        result = KilnRun(names, outs, before, created, after, list(sess.get_providers()),
                         assignment, runs if feeds is not None else 0, all_outs)
    except Exception as exc:  # noqa: BLE001 - re-raised below, detached
        err = (type(exc), str(exc), stage)
    finally:
        sess = None
    if err is not None:
        gc.collect()
        raise KilnSessionError(*err)
    return result


NO_CPU_FALLBACK = {"session.disable_cpu_ep_fallback": "1"}


def run_fully_on_kiln(model_path: str, device, feeds=None, config: Optional[Dict[str, str]] = None,
                      **kwargs) -> KilnRun:
    """run_kiln with ``session.disable_cpu_ep_fallback=1`` (the session exists only
    if kiln took every node). If ORT refuses because nodes went to the CPU EP,
    fails with the list of those nodes (from a second session without the flag)."""
    cfg = dict(NO_CPU_FALLBACK)
    cfg.update(config or {})
    err = None
    try:
        return run_kiln(model_path, device, feeds, config=cfg, **kwargs)
    except KilnSessionError as e:
        if "fallback to CPU EP has been explicitly disabled" not in e.message:
            raise
        err = e
    try:
        probe = run_kiln(model_path, device, None, config=config, opt_level=kwargs.get("opt_level"),
                         options=kwargs.get("options"))
        left = [(ep, n) for ep, nodes in probe.assignment if ep != kiln.EP_NAME for n in nodes]
        on_kiln = len(probe.nodes_on(kiln.EP_NAME))
        detail = f"kiln took {on_kiln} node(s); left to other EPs ({len(left)}): {left}"
    except KilnSessionError as e2:
        detail = f"(and without the flag the session fails too: {e2})"
    raise AssertionError(f"kiln did not take every node: {err.message}\n{detail}")


#: Extra sections for pytest's terminal summary: title -> function returning lines
#: (conftest.py prints them; e.g. how many ONNX backend cases kiln claimed).
TERMINAL_SUMMARY: Dict[str, object] = {}


def session_error(model_path: str, device, options=None, config=None) -> Optional[KilnSessionError]:
    """The KilnSessionError from creating a session, or None if creation worked."""
    try:
        run_kiln(model_path, device, None, options, config)
    except KilnSessionError as e:
        return e
    return None


def assert_invalid_argument(err, *needles):
    """kiln's CreateEp returns ORT_INVALID_ARGUMENT. ORT 1.31.1 turns a failed
    CreateEp into ORT_THROW("Error creating execution provider: <status>")
    (PluginExecutionProviderFactory::CreateProvider), which reaches Python as
    a plain RuntimeError whose text carries "INVALID_ARGUMENT"; accept either."""
    assert err is not None, "session creation should have failed"
    assert err.stage == "session creation", err
    assert err.exc_type is C.InvalidArgument or (
        err.exc_type is RuntimeError and "INVALID_ARGUMENT" in err.message
    ), f"expected InvalidArgument, got {err}"
    for n in needles:
        assert n in err.message, f"{n!r} not in error message: {err.message!r}"


def assert_outputs_close(names, expected, actual, rtol=RTOL, atol=ATOL):
    assert actual is not None and len(actual) == len(expected)
    for name, e, a in zip(names, expected, actual):
        assert a.shape == e.shape, f"output {name}: shape {a.shape} != {e.shape}"
        assert a.dtype == e.dtype, f"output {name}: dtype {a.dtype} != {e.dtype}"
        np.testing.assert_allclose(a, e, rtol=rtol, atol=atol, err_msg=f"output {name}")


def check_against_cpu(model_path: str, device, options=None, config=None, seed=0) -> KilnRun:
    feeds = make_feeds(model_path, seed)
    names, expected = run_cpu(model_path, feeds)
    run = run_kiln(model_path, device, feeds, options, config)
    assert run.output_names == names
    assert_outputs_close(names, expected, run.outputs)
    return run


# --------------------------------------------------------------------------
# registration bookkeeping
# --------------------------------------------------------------------------
def unique_name(prefix: str, suffix: str = "") -> str:
    """A registration name no other test uses (``suffix`` e.g. ".virtual")."""
    import uuid

    return f"{prefix}_{uuid.uuid4().hex[:8]}{suffix}"


def kiln_devices() -> list:
    return [d for d in ort.get_ep_devices() if d.ep_name == kiln.EP_NAME]


def live_sessions() -> int:
    """Number of ort.InferenceSession objects still alive (after a gc pass)."""
    for attr in ("last_type", "last_value", "last_traceback", "last_exc"):
        if hasattr(sys, attr):
            setattr(sys, attr, None)
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, ort.InferenceSession))


def safe_unregister(name: str) -> None:
    """Unregister ``name`` unless some session might still use it (then leak the
    registration rather than crash the interpreter at exit)."""
    n = live_sessions()
    if n:
        import warnings

        warnings.warn(f"not unregistering {name!r}: {n} InferenceSession(s) still alive")
        return
    ort.unregister_execution_provider_library(name)


# --------------------------------------------------------------------------
# EPContext helpers (test_epcontext_*.py)
# --------------------------------------------------------------------------
import ctypes  # noqa: E402
import struct  # noqa: E402

CTX_MAGIC = b"KILNCTX\x00"
CTX_HEADER_SIZE = 64
COMPAT_KEY = "ep_compatibility_info." + kiln.EP_NAME


STATS_FIELDS = kiln.STAT_FIELDS


def stats(library_path: Optional[str] = None) -> Dict[str, int]:
    """kiln's counters (the package's ``stats()``, which reads every field)."""
    return kiln.stats(library_path or kiln.get_library_path())


def kiln_session_options(device, config: Optional[Dict[str, str]] = None,
                         options: Optional[Dict[str, str]] = None) -> ort.SessionOptions:
    so = ort.SessionOptions()
    for k, v in (config or {}).items():
        so.add_session_config_entry(k, v)
    so.add_provider_for_devices([device], with_test_options(options))
    return so


def generate_context(model, device, embed: int = 0, file_path: Optional[str] = None,
                     config: Optional[Dict[str, str]] = None, options=None) -> None:
    """The session-option route: create (and drop) a session with
    ``ep.context_enable=1``. ``model`` is a path or bytes. Raises KilnSessionError."""
    cfg = {"ep.context_enable": "1", "ep.context_embed_mode": str(embed)}
    if file_path is not None:
        cfg["ep.context_file_path"] = str(file_path)
    cfg.update(config or {})
    err = None
    try:
        sess = ort.InferenceSession(model, kiln_session_options(device, cfg, options), enable_fallback=0)
        sess = None  # noqa: F841
    except Exception as exc:  # noqa: BLE001 - re-raised below, detached
        err = (type(exc), str(exc), "context generation")
    if err is not None:
        gc.collect()
        raise KilnSessionError(*err)


def compile_model(model, device, *, embed: bool, to: str = "file", output=None,
                  flags: int = 0, config: Optional[Dict[str, str]] = None, options=None):
    """The compile API (``ort.ModelCompiler``). ``model``: path or bytes. ``to``:
    "file" (to ``output``; returns None), "bytes" or "stream" (returns the model
    bytes; the stream's chunks joined). Raises KilnSessionError."""
    err = None
    result = None
    try:
        mc = ort.ModelCompiler(kiln_session_options(device, config, options),
                               model if isinstance(model, bytes) else str(model),
                               embed_compiled_data_into_model=embed, flags=flags)
        if to == "file":
            mc.compile_to_file(str(output))
        elif to == "bytes":
            result = mc.compile_to_bytes()
        elif to == "stream":
            chunks: List[bytes] = []
            mc.compile_to_stream(lambda b: chunks.append(bytes(b)))
            result = b"".join(chunks)
        else:
            raise ValueError(to)
        mc = None  # noqa: F841
    except Exception as exc:  # noqa: BLE001
        err = (type(exc), str(exc), "compile")
    if err is not None:
        gc.collect()
        raise KilnSessionError(*err)
    return result


def expect_error(fn, *args, **kwargs) -> KilnSessionError:
    try:
        fn(*args, **kwargs)
    except KilnSessionError as e:
        return e
    raise AssertionError(f"{getattr(fn, '__name__', fn)} should have failed")


def assert_error(err: KilnSessionError, exc_type, *needles):
    assert err.exc_type is exc_type, f"expected {exc_type.__name__}, got {err}"
    for n in needles:
        assert n in err.message, f"{n!r} not in error message: {err.message!r}"


def load_model_proto(model):
    import onnx

    if isinstance(model, (bytes, bytearray)):
        return onnx.load_from_string(bytes(model))
    return onnx.load(str(model))


def attrs_of(node) -> Dict[str, object]:
    """A node's attributes as Python values (bytes for strings)."""
    import onnx

    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def ep_context_nodes(model) -> list:
    """The EPContext nodes of a model (path, bytes or ModelProto), in graph order."""
    m = model if hasattr(model, "graph") else load_model_proto(model)
    return [n for n in m.graph.node if n.op_type == "EPContext"]


def notes_of(model) -> List[str]:
    """The ``notes`` of each EPContext node of a compiled model (path, bytes or ModelProto),
    e.g. "MatMul+Bias x2, Chain(Mul+Add) x1; 3 steps; ..."."""
    notes = [attrs_of(n).get("notes", b"") for n in ep_context_nodes(model)]
    return [x.decode() if isinstance(x, bytes) else str(x) for x in notes]


def compiled_notes(model, device, options=None) -> List[str]:
    """:func:`notes_of` what kiln compiles ``model`` (path or bytes) into through the compile API."""
    return notes_of(compile_model(model, device, embed=True, to="bytes", options=options))


def note_ops(notes: str) -> List[str]:
    """The ops of one partition's notes, without counts: ["MatMul+Bias", "Chain(Mul+Add)"]."""
    return [part.strip().rsplit(" x", 1)[0] for part in notes.split(";")[0].split(",")]


def save_model(model, folder, name: str) -> str:
    """Saves ``model`` as ``folder/name.onnx``; returns the path."""
    import onnx

    path = os.path.join(str(folder), f"{name}.onnx")
    onnx.save(model, path)
    return path


def metadata(model) -> Dict[str, str]:
    m = model if hasattr(model, "graph") else load_model_proto(model)
    return {p.key: p.value for p in m.metadata_props}


# The context binary format this kiln writes (`context::FORMAT_VERSION`).
CONTEXT_FORMAT = 13


def compat_info(target: str, version: str = kiln.__version__, fmt: int = CONTEXT_FORMAT) -> str:
    return f"kiln;format={fmt};version={version};target={target}"


def files_in(folder) -> List[str]:
    return sorted(os.listdir(folder))


# --- kiln context binary (docs/context-format.md) ---------------------------
@dataclass
class CtxHeader:
    magic: bytes
    version: int
    header_size: int
    metadata_offset: int
    metadata_length: int
    data_offset: int
    data_length: int
    checksum: bytes


def parse_ctx_header(data: bytes) -> CtxHeader:
    assert len(data) >= CTX_HEADER_SIZE, f"context binary of {len(data)} bytes has no header"
    magic = data[:8]
    version, header_size = struct.unpack_from("<II", data, 8)
    mo, ml, do, dl = struct.unpack_from("<QQQQ", data, 16)
    return CtxHeader(magic, version, header_size, mo, ml, do, dl, data[48:64])


def _varint(buf: bytes, i: int) -> Tuple[int, int]:
    shift = value = 0
    while True:
        b = buf[i]
        i += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, i
        shift += 7


def proto_fields(buf: bytes) -> List[Tuple[int, object]]:
    """Top-level (field number, value) pairs of a protobuf message (wire types 0, 2)."""
    out = []
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        field, wire = key >> 3, key & 7
        if wire == 0:
            v, i = _varint(buf, i)
        elif wire == 2:
            n, i = _varint(buf, i)
            v = buf[i:i + n]
            i += n
        elif wire == 1:
            v = buf[i:i + 8]
            i += 8
        elif wire == 5:
            v = buf[i:i + 4]
            i += 4
        else:
            raise ValueError(f"wire type {wire}")
        out.append((field, v))
    return out


def _packed_or_single(values) -> List[int]:
    out = []
    for v in values:
        if isinstance(v, int):
            out.append(v)
        else:
            j = 0
            while j < len(v):
                x, j = _varint(v, j)
                out.append(x)
    return out


@dataclass
class CtxWeight:
    offset: int
    byte_length: int
    dtype: int
    shape: List[int]


def parse_ctx_binary(data: bytes) -> Tuple[CtxHeader, Dict[str, object]]:
    """Header and the metadata fields the tests look at: kiln_version, target,
    weights (CtxWeight list), graphs (names)."""
    h = parse_ctx_header(data)
    meta = data[h.metadata_offset:h.metadata_offset + h.metadata_length]
    info: Dict[str, object] = {"weights": [], "graphs": []}
    for field, v in proto_fields(meta):
        if field == 1:
            info["kiln_version"] = v.decode()
        elif field == 2:
            info["target"] = v.decode()
        elif field == 3:
            w = dict()
            shape = []
            for f2, v2 in proto_fields(v):
                if f2 == 4:
                    shape.append(v2)
                else:
                    w[f2] = v2
            info["weights"].append(CtxWeight(w.get(1, 0), w.get(2, 0), w.get(3, 0), _packed_or_single(shape)))
        elif field == 4:
            name = next((v2.decode() for f2, v2 in proto_fields(v) if f2 == 1), "")
            info["graphs"].append(name)
    return h, info


def make_weighty_model(path: str, rows: int = 256, cols: int = 1024, seed: int = 7) -> Dict[str, object]:
    """A model with a ~1 MB constant ``W`` [rows, cols] used by two kiln
    partitions, split by a CPU-only ``Einsum`` (an op kiln does not run) whose
    operand ``E`` [cols] must stay in the compiled model:

        Y = Tanh(Einsum("ij,j->ij", Relu(X * W + Bias), E) * W)

    Returns {"path", "W", "Bias", "E", "weight_bytes"} (weight_bytes: what kiln compiles)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    w = rng.standard_normal((rows, cols)).astype(np.float32)
    bias = rng.standard_normal((cols,)).astype(np.float32)
    e = np.full((cols,), 0.25, dtype=np.float32)
    nodes = [
        helper.make_node("Mul", ["X", "W"], ["m"], name="k1_mul"),
        helper.make_node("Add", ["m", "Bias"], ["a"], name="k1_add"),
        helper.make_node("Relu", ["a"], ["r"], name="k1_relu"),
        helper.make_node("Einsum", ["r", "E"], ["p"], name="cpu_einsum", equation="ij,j->ij"),
        helper.make_node("Mul", ["p", "W"], ["q"], name="k2_mul"),
        helper.make_node("Tanh", ["q"], ["Y"], name="k2_tanh"),
    ]
    vi = lambda n, s: helper.make_tensor_value_info(n, TensorProto.FLOAT, s)  # noqa: E731
    graph = helper.make_graph(
        nodes, "weighty", [vi("X", [rows, cols])], [vi("Y", [rows, cols])],
        initializer=[numpy_helper.from_array(w, "W"), numpy_helper.from_array(bias, "Bias"),
                     numpy_helper.from_array(e, "E")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, path)
    return {"path": path, "W": w, "Bias": bias, "E": e, "weight_bytes": w.nbytes + bias.nbytes}


# --------------------------------------------------------------------------
# weight sharing (test_share*.py)
# --------------------------------------------------------------------------
def make_share_model(path: str, head_seed: int, *, batch: int = 4, rows: int = 256, cols: int = 256,
                     backbone_seed: int = 1, bias_shape: Optional[Sequence[int]] = None) -> Dict[str, object]:
    """A "fine-tune" of a shared backbone, fully claimed by kiln::

        Y = Tanh(Relu(X * W + B) * H + Hb)

    ``W`` [batch, rows, cols] and ``B`` (``bias_shape``, default [rows, cols]) come from
    ``backbone_seed`` (shared between models built with the same seed: 1.25 MiB by
    default), ``H`` [rows, cols] and ``Hb`` [1, cols] from ``head_seed`` (the model's
    own head). ``bias_shape`` [1, rows, cols] gives B the same bytes in another shape.
    Returns {"path", "weights": {name: array}, "initializer_bytes"}."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    bb = np.random.default_rng(backbone_seed)
    w = bb.standard_normal((batch, rows, cols)).astype(np.float32)
    b = bb.standard_normal((rows, cols)).astype(np.float32)
    if bias_shape is not None:
        b = b.reshape(bias_shape)
    hd = np.random.default_rng(1000 + head_seed)
    h = hd.standard_normal((rows, cols)).astype(np.float32)
    hb = hd.standard_normal((1, cols)).astype(np.float32)
    weights = {"W": w, "B": b, "H": h, "Hb": hb}
    nodes = [
        helper.make_node("Mul", ["X", "W"], ["xw"], name="bb_mul"),
        helper.make_node("Add", ["xw", "B"], ["xb"], name="bb_add"),
        helper.make_node("Relu", ["xb"], ["r"], name="bb_relu"),
        helper.make_node("Mul", ["r", "H"], ["rh"], name="head_mul"),
        helper.make_node("Add", ["rh", "Hb"], ["rb"], name="head_add"),
        helper.make_node("Tanh", ["rb"], ["Y"], name="head_tanh"),
    ]
    vi = lambda n, s: helper.make_tensor_value_info(n, TensorProto.FLOAT, s)  # noqa: E731
    graph = helper.make_graph(
        nodes, f"share_{head_seed}", [vi("X", [batch, rows, cols])], [vi("Y", [batch, rows, cols])],
        initializer=[numpy_helper.from_array(v, k) for k, v in weights.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, path)
    return {"path": path, "weights": weights,
            "initializer_bytes": sum(v.nbytes for v in weights.values())}


def unique_weight_bytes(models: Sequence[Dict[str, object]]) -> int:
    """Bytes of the distinct (shape, bytes) weights of models from make_share_model."""
    seen = {}
    for m in models:
        for v in m["weights"].values():
            seen[(v.shape, v.tobytes())] = v.nbytes
    return sum(seen.values())


def set_attr(node, name, value):
    """Replace (or add) attribute ``name``; ``value=None`` removes it."""
    keep = [a for a in node.attribute if a.name != name]
    del node.attribute[:]
    node.attribute.extend(keep)
    if value is not None:
        node.attribute.append(helper.make_attribute(name, value))


def compile_copy(model: str, device, folder) -> Tuple[str, str]:
    """Copies `model` into `folder` and compiles it there (embed mode 0):
    (path of the copy, path of its ``_ctx.onnx``)."""
    stem = os.path.splitext(os.path.basename(model))[0]
    src = os.path.join(str(folder), f"{stem}.onnx")
    shutil.copy(model, src)
    ctx = os.path.join(str(folder), f"{stem}_ctx.onnx")
    compile_model(src, device, embed=False, output=ctx)
    return src, ctx


def run_threads(worker, n: int) -> None:
    """Runs ``worker(t)`` for t in 0..n, each on its own thread, and waits for all."""
    import threading

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(n)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
