"""ONNX's backend test data through kiln (issue #5).

Which cases: every ONNX backend test case whose nodes all have op types kiln
supports after issue #5 (``KILN_OPS`` below, default domain only) and whose
graph inputs and outputs are f32 / int64 / int32 / bool tensors with static
shapes. The cases come from the installed ``onnx`` package:

* ``onnx/backend/test/data/node/*`` when the package ships it; the PyPI wheels
  of onnx >= 1.19 do not, so otherwise the very same cases are generated in
  memory from ``onnx.backend.test.case.node`` (what ``backend-test-tools
  generate-data`` writes to ``data/node``);
* ``data/simple/*``, ``data/pytorch-operator/*`` and ``data/pytorch-converted/*`` (model.onnx +
  ``test_data_set_*/input_*.pb`` / ``output_*.pb``). ``data/light`` and
  ``data/real`` are convolutional networks (Conv, pooling: not kiln ops;
  ``real`` ships only download links), so none of their models qualifies.

Every case with more than one graph input also runs as ``<name>+const``: all
inputs but the first become initializers holding the reference values
(shapes, axes, starts/ends, Clip bounds, LayerNorm scale/bias, Gemm B/C, ...
are constants in real models, and kiln only compiles most of those ops when
they are); a LayerNormalization case also drops its optional Mean/InvStdDev
outputs (training-only, which kiln leaves to the CPU EP). The reference
outputs are otherwise unchanged.

Each case runs on kiln (assignment info recorded) and on ORT's CPU EP:

* kiln claims **none** of its nodes -> skipped with the reason (kiln left the
  case to the CPU EP, which is allowed: an attribute, a dynamic input such as a
  ``Reshape`` shape fed as a graph input, or a dtype kiln does not compile);
* kiln claims some or all nodes -> kiln's outputs must equal the reference
  outputs and the CPU EP's. Integer and bool outputs exactly. Float outputs:

  - vs the reference ``output_*.pb``: the case's own tolerance (ONNX's
    defaults, rtol 1e-3 / atol 1e-7) — the tolerance ONNX Runtime's CPU EP is
    held to. Where the CPU EP itself misses the reference by more than that
    (the reference was computed in float64 by NumPy), kiln is held to the CPU
    EP only and the case says so;
  - vs the CPU EP: rtol 1e-4 / atol 1e-5 — two f32 implementations of the same
    op on the same inputs; the slack covers different summation orders in
    reductions/GEMMs and the polynomial exp/erf/tanh approximations of both.

A session kiln fails to create or run is a failure (never skipped). The
terminal summary lists how many cases kiln claimed fully / partially / not at all.
"""
from __future__ import annotations

import glob
import os
import warnings
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import numpy as np
import onnx
import pytest
from onnx import TensorProto, numpy_helper

import onnxruntime as ort
import onnxruntime_ep_kiln as kiln
import kiln_testutil as tu

KILN_OPS = frozenset("""
MatMul Gemm Add Sub Mul Div Pow Sqrt Reciprocal Exp Log Erf Tanh Sigmoid Relu LeakyRelu Gelu Clip
Softmax LayerNormalization ReduceMean ReduceSum Reshape Transpose Flatten Squeeze Unsqueeze Concat
Split Slice Gather Cast Shape Constant ConstantOfShape Identity Dropout Where Expand Neg Abs
LSTM GRU
ArgMax ArgMin TopK InstanceNormalization GroupNormalization LRN
""".split())
IO_TYPES = {TensorProto.FLOAT, TensorProto.INT64, TensorProto.INT32, TensorProto.BOOL}
CPU_RTOL, CPU_ATOL = 1e-4, 1e-5
DATA_DIR = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data")


@dataclass
class BackendCase:
    name: str
    model: onnx.ModelProto
    data_sets: List[Tuple[List[np.ndarray], List[np.ndarray]]]
    rtol: float = 1e-3
    atol: float = 1e-7
    source: str = ""


def _static_tensor_type(vi) -> bool:
    t = vi.type
    if t.WhichOneof("value") != "tensor_type":
        return False
    tt = t.tensor_type
    if tt.elem_type not in IO_TYPES or not tt.HasField("shape"):
        return False
    return all(d.HasField("dim_value") for d in tt.shape.dim)


def _eligible(model: onnx.ModelProto) -> bool:
    g = model.graph
    if not g.node:
        return False
    for n in g.node:
        if n.domain not in ("", "ai.onnx") or n.op_type not in KILN_OPS:
            return False
    inits = {i.name for i in g.initializer}
    ios = [i for i in g.input if i.name not in inits] + list(g.output)
    return all(_static_tensor_type(v) for v in ios)


def _to_array(x):
    return numpy_helper.to_array(x) if isinstance(x, TensorProto) else np.asarray(x)


def _load_dir_case(name: str, folder: str, source: str) -> Optional[BackendCase]:
    path = os.path.join(folder, "model.onnx")
    if not os.path.isfile(path):
        return None
    model = onnx.load(path)
    if not _eligible(model):
        return None
    sets = []
    for ds in sorted(glob.glob(os.path.join(folder, "test_data_set_*"))):
        def read(prefix):
            files = sorted(glob.glob(os.path.join(ds, f"{prefix}_*.pb")),
                           key=lambda p: int(p.rsplit("_", 1)[1].split(".")[0]))
            out = []
            for f in files:
                t = TensorProto()
                with open(f, "rb") as fh:
                    t.ParseFromString(fh.read())
                out.append(numpy_helper.to_array(t))
            return out
        sets.append((read("input"), read("output")))
    return BackendCase(name, model, sets, source=source) if sets else None


def _collect() -> Tuple[List[BackendCase], Dict[str, int]]:
    cases: List[BackendCase] = []
    scanned = {}
    node_dir = os.path.join(DATA_DIR, "node")
    if os.path.isdir(node_dir):
        names = sorted(os.listdir(node_dir))
        scanned["node (data/node)"] = len(names)
        for n in names:
            c = _load_dir_case(n, os.path.join(node_dir, n), "data/node")
            if c:
                cases.append(c)
    else:
        from onnx.backend.test.case import node as node_cases

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            all_cases = node_cases.collect_testcases(None)
        scanned["node (generated from onnx.backend.test.case.node)"] = len(all_cases)
        for tc in all_cases:
            if tc.model is None or not _eligible(tc.model):
                continue
            sets = [([_to_array(i) for i in ins], [_to_array(o) for o in outs]) for ins, outs in tc.data_sets]
            cases.append(BackendCase(tc.name, tc.model, sets, tc.rtol, tc.atol, "node (generated)"))
    for sub in ("simple", "pytorch-operator", "pytorch-converted"):
        d = os.path.join(DATA_DIR, sub)
        if not os.path.isdir(d):
            continue
        names = sorted(os.listdir(d))
        scanned[sub] = len(names)
        for n in names:
            c = _load_dir_case(f"{sub}/{n}", os.path.join(d, n), sub)
            if c:
                cases.append(c)
    return cases, scanned


def _constantized(case: BackendCase) -> Optional[BackendCase]:
    """The case with every graph input but the first turned into an initializer
    holding the data set's value: shapes, axes, starts/ends, bounds, scales and
    biases become constants, as in exported models, so kiln can compile ops it
    must leave to the CPU EP when those arrive at run time."""
    if len(case.data_sets) != 1:
        return None
    inits = {i.name for i in case.model.graph.initializer}
    inputs = [i for i in case.model.graph.input if i.name not in inits]
    if len(inputs) < 2:
        return None
    values, outputs = case.data_sets[0]
    m = onnx.ModelProto()
    m.CopyFrom(case.model)
    keep = [inputs[0].name]
    for vi, val in zip(inputs[1:], values[1:]):
        m.graph.initializer.append(numpy_helper.from_array(np.asarray(val), vi.name))
    kept = [vi for vi in m.graph.input if vi.name in keep or vi.name in inits]
    del m.graph.input[:]
    m.graph.input.extend(kept)
    # LayerNormalization's optional Mean / InvStdDev outputs (training only) dropped
    if len(m.graph.node) == 1 and m.graph.node[0].op_type == "LayerNormalization" and len(m.graph.output) > 1:
        node = m.graph.node[0]
        del node.output[1:]
        del m.graph.output[1:]
        outputs = outputs[:1]
    return BackendCase(case.name + "+const", m, [([values[0]], outputs)], case.rtol, case.atol,
                       case.source + " (inputs 1.. as initializers)")


CASES, SCANNED = _collect()
CONST_CASES = [c for c in (_constantized(c) for c in CASES) if c is not None]
CASE_BY_NAME = {c.name: c for c in CASES + CONST_CASES}

# name -> ("full" | "partial" | "none" | "ort-cannot-load", kiln nodes, all nodes)
CLAIMS: Dict[str, Tuple[str, int, int]] = {}


def _summary() -> List[str]:
    if not CLAIMS:
        return []
    by = {}
    for st, _, _ in CLAIMS.values():
        by[st] = by.get(st, 0) + 1
    lines = [
        f"scanned: {', '.join(f'{k}: {v}' for k, v in SCANNED.items())}; eligible (kiln's op list, "
        f"f32/int/bool static I/O): {len(CASES)}, plus {len(CONST_CASES)} '+const' variants (inputs 1.. as "
        f"initializers); run: {len(CLAIMS)}",
        f"kiln claimed fully: {by.get('full', 0)}, partially: {by.get('partial', 0)}, "
        f"nothing (skipped): {by.get('none', 0)}, ORT cannot load: {by.get('ort-cannot-load', 0)}",
    ]
    partial = sorted(n for n, (st, _, _) in CLAIMS.items() if st == "partial")
    if partial:
        lines.append("partially claimed: " + ", ".join(f"{n} ({CLAIMS[n][1]}/{CLAIMS[n][2]})" for n in partial))
    return lines


tu.TERMINAL_SUMMARY["kiln: ONNX backend test cases"] = _summary


def test_backend_cases_found():
    """The installed onnx package gives us a meaningful set of cases."""
    assert len(CASES) >= 100, f"only {len(CASES)} eligible ONNX backend cases found ({SCANNED})"
    names = set(CASE_BY_NAME)
    for must in ("test_matmul_2d", "test_gemm_default_no_bias", "test_softmax_axis_0",
                 "test_layer_normalization_2d_axis0", "test_gelu_tanh_1", "test_erf", "test_transpose_default"):
        assert must in names, f"{must} not among the eligible cases"


def _cpu_outputs(model_bytes: bytes, feeds) -> Tuple[Optional[List[np.ndarray]], Optional[str]]:
    try:
        so = ort.SessionOptions()
        so.log_severity_level = 3  # old-opset warnings of the pytorch-operator models
        sess = ort.InferenceSession(model_bytes, so, providers=["CPUExecutionProvider"])
        outs = sess.run(None, feeds)
        del sess
        return outs, None
    except Exception as exc:  # noqa: BLE001
        msg = f"{type(exc).__name__}: {exc}"
    return None, msg


def _compare(name, got, want, rtol, atol, what):
    assert got.shape == want.shape, f"{what}: output {name}: shape {got.shape} != {want.shape}"
    if want.dtype.kind in "biu":
        assert got.dtype == want.dtype, f"{what}: output {name}: dtype {got.dtype} != {want.dtype}"
        np.testing.assert_array_equal(got, want, err_msg=f"{what}: output {name}")
    else:
        assert got.dtype == want.dtype, f"{what}: output {name}: dtype {got.dtype} != {want.dtype}"
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=f"{what}: output {name}")


def _close(got, want, rtol, atol) -> bool:
    if got.shape != want.shape:
        return False
    if want.dtype.kind in "biu":
        return bool(np.array_equal(got, want))
    return bool(np.allclose(got, want, rtol=rtol, atol=atol, equal_nan=True))


@pytest.mark.parametrize("name", [c.name for c in CASES + CONST_CASES])
def test_backend_case(name, kiln_dev, tmp_path):
    case = CASE_BY_NAME[name]
    path = str(tmp_path / "model.onnx")
    onnx.save(case.model, path)
    model_bytes = case.model.SerializeToString()
    inits = {i.name for i in case.model.graph.initializer}
    in_names = [i.name for i in case.model.graph.input if i.name not in inits]
    out_names = [o.name for o in case.model.graph.output]
    n_nodes = len(case.model.graph.node)

    for ds_index, (inputs, ref_outputs) in enumerate(case.data_sets):
        feeds = dict(zip(in_names, inputs))
        cpu, cpu_err = _cpu_outputs(model_bytes, feeds)
        try:
            run = tu.run_kiln(path, kiln_dev, feeds)
        except tu.KilnSessionError as e:
            if cpu is None:
                CLAIMS[name] = ("ort-cannot-load", 0, n_nodes)
                pytest.skip(f"ORT cannot run this model on any EP: CPU EP: {cpu_err}; with kiln: {e}")
            raise AssertionError(f"kiln failed where the CPU EP runs the model: {e}") from None
        on_kiln = len(run.nodes_on(kiln.EP_NAME))
        on_all = sum(len(nodes) for _, nodes in run.assignment)
        if on_kiln == 0:
            CLAIMS[name] = ("none", 0, on_all)
            if on_all == 0:
                pytest.skip("ORT itself computed the model (constant-folded): no node reached an EP")
            pytest.skip(f"kiln claims none of the {on_all} node(s) (left to the CPU EP: "
                        f"{sorted({op for _, nodes in run.assignment for _, op in nodes})})")
        CLAIMS[name] = ("full" if on_kiln == on_all else "partial", on_kiln, on_all)
        assert run.created_delta("partitions_compiled") >= 1
        assert run.run_delta("compute_calls") >= 1, "kiln claimed nodes but never computed"
        assert run.output_names == out_names
        for i, (oname, ref) in enumerate(zip(out_names, ref_outputs)):
            got = run.outputs[i]
            if cpu is not None:
                _compare(oname, got, cpu[i], CPU_RTOL, CPU_ATOL, f"data set {ds_index}, kiln vs CPU EP")
            if cpu is None or _close(cpu[i], ref, case.rtol, case.atol):
                _compare(oname, got, ref, case.rtol, case.atol, f"data set {ds_index}, kiln vs reference output")
