"""The bundled models: valid, small, deterministic, and runnable on ORT's CPU EP.

These tests do not need the kiln library.
"""
from __future__ import annotations

import os

import numpy as np
import onnx
from onnx import numpy_helper
import onnxruntime as ort
import pytest

import kiln_testutil as tu


@pytest.mark.parametrize("name", tu.MODEL_NAMES)
def test_committed_model_matches_generator(models, name):
    committed = os.path.join(tu.MODELS_DIR, f"{name}.onnx")
    assert os.path.isfile(committed), f"{committed} missing; run python models/make_models.py"
    with open(committed, "rb") as a, open(models[name], "rb") as b:
        assert a.read() == b.read(), (
            f"models/{name}.onnx is stale or make_models.py is not deterministic; "
            "rerun python models/make_models.py"
        )


@pytest.mark.parametrize("name", tu.MODEL_NAMES)
def test_model_valid_and_small(models, name):
    path = models[name]
    assert os.path.getsize(path) < (600 if name == "demo" else 50) * 1024
    onnx.checker.check_model(path, full_check=True)
    m = onnx.load(path)
    opset = {o.domain: o.version for o in m.opset_import}
    assert opset.get("", 0) >= 17
    # everything is static and float32
    for vi in list(m.graph.input) + list(m.graph.output):
        assert vi.type.tensor_type.elem_type == onnx.TensorProto.FLOAT
        dims = vi.type.tensor_type.shape.dim
        assert all(d.HasField("dim_value") for d in dims), f"{vi.name} has a dynamic dim"


def _ops(path):
    return [n.op_type for n in onnx.load(path).graph.node]


def test_add_mul_relu_structure(models):
    m = onnx.load(models["add_mul_relu"])
    assert [n.op_type for n in m.graph.node] == ["Add", "Mul", "Relu"]
    assert [i.name for i in m.graph.input] == ["A", "B"]
    (w,) = m.graph.initializer
    assert w.name == "W" and list(w.dims) == [3, 4]
    for i in m.graph.input:
        assert [d.dim_value for d in i.type.tensor_type.shape.dim] == [2, 3, 4]


def test_split_and_unsupported_ops(models):
    split = _ops(models["split"])
    assert "Atan" in split and set(split) - {"Atan", "Asinh"} <= set(tu.SUPPORTED_OPS)
    assert set(_ops(models["unsupported"])) <= {"Atan", "Cosh", "Asinh"}
    demo = _ops(models["demo"])
    assert {"LayerNormalization", "MatMul", "Erf", "Div", "Mul", "Add"} <= set(demo)


def test_all_ops_covers_every_supported_op(models):
    assert set(_ops(models["all_ops"])) == set(tu.SUPPORTED_OPS)


def test_all_ops_survive_ort_optimizations(models):
    """ORT's level-1 optimizations (e.g. IdentityElimination) run before kiln sees
    the graph; every supported op must still be there afterwards."""
    so = ort.SessionOptions()
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    sess = ort.InferenceSession(models["all_ops"], so, providers=["CPUExecutionProvider"])
    ops = {n.op_type for sg in sess.get_provider_graph_assignment_info() for n in sg.get_nodes()}
    assert ops == set(tu.SUPPORTED_OPS)


@pytest.mark.parametrize("name", tu.MODEL_NAMES)
def test_model_runs_on_cpu_ep(models, name):
    feeds = tu.make_feeds(models[name])
    names, outs = tu.run_cpu(models[name], feeds)
    assert names
    for n, o in zip(names, outs):
        assert np.all(np.isfinite(o)), f"{name}: output {n} has non-finite values"


def test_add_mul_relu_reference_values(models):
    feeds = tu.make_feeds(models["add_mul_relu"])
    w = numpy_helper.to_array(onnx.load(models["add_mul_relu"]).graph.initializer[0])
    _, (y,) = tu.run_cpu(models["add_mul_relu"], feeds)
    np.testing.assert_allclose(y, np.maximum((feeds["A"] + feeds["B"]) * w, 0), rtol=1e-6)


def test_generator_out_option(tmp_path):
    import make_models

    assert make_models.main(["--out", str(tmp_path)]) == 0
    assert sorted(os.listdir(tmp_path)) == sorted(f"{n}.onnx" for n in tu.MODEL_NAMES)
