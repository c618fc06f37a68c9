"""Elementwise math, comparisons and logic (issue #12) run by kiln's kernels.

Each model is claimed whole by kiln (EP option ``claim=all``, so the kernel is
tested rather than the claim rule; ``run_fully_on_kiln`` fails if any node is
left to the CPU EP) and compared with ONNX Runtime's CPU EP on inputs that
include NaN, ±inf, ±0, exact halves and broadcasting shapes. Bool and integer
outputs must match exactly; float outputs bit for bit where the math is exact
(Floor, Ceil, Round, Sign, Max, Min, Mod) and within a few ulps elsewhere.
"""
from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import kiln_testutil as tu
import onnxruntime_ep_kiln as kiln

ALL = {"claim": "all"}
CPU = "CPUExecutionProvider"

ELEM = {np.float32: TensorProto.FLOAT, np.int64: TensorProto.INT64, np.int32: TensorProto.INT32,
        np.bool_: TensorProto.BOOL}

#: float values every float test feeds (besides random ones)
SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 1e30, -1e30,
                    100.0, -100.0, 20.0, -20.0, 1e-30, 3.0, -3.0], np.float32)


def _model(nodes, inputs, outputs, opset=18):
    """inputs/outputs: [(name, numpy dtype, dims)] (dims may hold strings)."""
    g = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(n, ELEM[t], d) for n, t, d in inputs],
        [helper.make_tensor_value_info(n, ELEM[t], d) for n, t, d in outputs])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=9)


def _save(model, tmp_path, name="m"):
    onnx.checker.check_model(model)
    path = os.path.join(str(tmp_path), f"{name}.onnx")
    onnx.save(model, path)
    return path


def _data(dtype, shape, seed, special=True):
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(np.bool_)
    if dtype != np.float32:
        # few distinct values, so that equal pairs occur
        return rng.integers(-4, 5, shape).astype(dtype)
    v = (rng.integers(-6, 7, n) * 0.5).astype(np.float32)
    if special and n:
        k = min(n, len(SPECIAL))
        v[rng.permutation(n)[:k]] = SPECIAL[rng.permutation(len(SPECIAL))[:k]]
    return v.reshape(shape)


def _assert_matches(names, want, got, exact, rtol=1e-5, atol=1e-6, signs=True):
    """``signs``: exact float results must also agree on the sign of zero (a
    NaN's sign means nothing and is not compared)."""
    for name, w, a in zip(names, want, got):
        assert a.dtype == w.dtype and a.shape == w.shape, f"{name}: {a.dtype}{a.shape} vs {w.dtype}{w.shape}"
        if exact or w.dtype != np.float32:
            np.testing.assert_array_equal(a, w, err_msg=name)
            if w.dtype == np.float32 and signs:
                num = ~np.isnan(w)
                np.testing.assert_array_equal(np.signbit(a[num]), np.signbit(w[num]), err_msg=f"{name}: signs")
        else:
            np.testing.assert_allclose(a, w, rtol=rtol, atol=atol, equal_nan=True, err_msg=name)


def _check(model, feeds, dev, tmp_path, exact=True, **tol):  # tol: rtol, atol, signs
    """Runs fully on kiln and compares with the CPU EP; returns the KilnRun."""
    path = _save(model, tmp_path)
    run = tu.run_fully_on_kiln(path, dev, feeds, options=ALL)
    assert run.created_delta("partitions_compiled") >= 1
    assert len(run.nodes_on(kiln.EP_NAME)) == len(model.graph.node)
    names, want = tu.run_cpu(path, feeds)
    _assert_matches(names, want, run.outputs, exact, **tol)
    return run


# ---- comparisons and logic ----

#: broadcasting pairs: same, row, scalar, both sides, rank 0
SHAPES2 = [((3, 4), (3, 4)), ((2, 3, 4), (4,)), ((2, 1, 4), (3, 1)), ((), (5,)), ((5, 1), ()),
           ((1, 70), (40, 1))]


@pytest.mark.parametrize("shapes", SHAPES2, ids=str)
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.int32], ids=lambda t: t.__name__)
@pytest.mark.parametrize("op", ["Equal", "Greater", "Less", "GreaterOrEqual", "LessOrEqual"])
def test_comparison(op, dtype, shapes, kiln_dev, tmp_path):
    (sa, sb) = shapes
    out = np.broadcast_shapes(sa, sb)
    m = _model([helper.make_node(op, ["a", "b"], ["y"])],
               [("a", dtype, sa), ("b", dtype, sb)], [("y", np.bool_, out)])
    _check(m, {"a": _data(dtype, sa, 1), "b": _data(dtype, sb, 2)}, kiln_dev, tmp_path)


@pytest.mark.parametrize("shapes", SHAPES2[:4], ids=str)
@pytest.mark.parametrize("op", ["Equal", "And", "Or", "Xor"])
def test_bool_binary(op, shapes, kiln_dev, tmp_path):
    (sa, sb) = shapes
    out = np.broadcast_shapes(sa, sb)
    m = _model([helper.make_node(op, ["a", "b"], ["y"])],
               [("a", np.bool_, sa), ("b", np.bool_, sb)], [("y", np.bool_, out)])
    _check(m, {"a": _data(np.bool_, sa, 3), "b": _data(np.bool_, sb, 4)}, kiln_dev, tmp_path)


def test_not_and_isnan(kiln_dev, tmp_path):
    m = _model([helper.make_node("IsNaN", ["x"], ["nan"]),
                helper.make_node("Not", ["nan"], ["y"])],
               [("x", np.float32, (4, 5))], [("nan", np.bool_, (4, 5)), ("y", np.bool_, (4, 5))])
    x = _data(np.float32, (4, 5), 5)
    run = _check(m, {"x": x}, kiln_dev, tmp_path)
    assert run.outputs[0].sum() == 1  # SPECIAL holds one NaN


@pytest.mark.parametrize("neg,pos", [(1, 1), (0, 1), (1, 0), (0, 0)])
def test_isinf(neg, pos, kiln_dev, tmp_path):
    m = _model([helper.make_node("IsInf", ["x"], ["y"], detect_negative=neg, detect_positive=pos)],
               [("x", np.float32, (4, 5))], [("y", np.bool_, (4, 5))])
    run = _check(m, {"x": _data(np.float32, (4, 5), 6)}, kiln_dev, tmp_path)
    assert run.outputs[0].sum() == neg + pos


# ---- variadic Max / Min / Mean ----

VARIADIC_SHAPES = [[(3, 4)], [(3, 4), (3, 4)], [(2, 3, 4), (4,), (3, 1)], [(), (2, 5), (1, 5)]]


#: ONNX Mean is defined for float types only
VARIADIC_OPS = [(op, t) for op in ["Max", "Min"] for t in [np.float32, np.int64, np.int32]] + [("Mean", np.float32)]


@pytest.mark.parametrize("shapes", VARIADIC_SHAPES, ids=lambda s: f"{len(s)}in")
@pytest.mark.parametrize("op,dtype", VARIADIC_OPS, ids=lambda v: v if isinstance(v, str) else v.__name__)
def test_variadic(op, dtype, shapes, kiln_dev, tmp_path):
    names = [f"x{i}" for i in range(len(shapes))]
    out = np.broadcast_shapes(*shapes)
    m = _model([helper.make_node(op, names, ["y"])],
               [(n, dtype, s) for n, s in zip(names, shapes)], [("y", dtype, out)])
    feeds = {n: _data(dtype, s, 10 + i) for i, (n, s) in enumerate(zip(names, shapes))}
    # Mean divides; Max and Min pick one input exactly. Which zero of a
    # (-0, +0) tie ORT returns depends on its broadcast path (the first
    # input when the shapes are equal: tested below), so signs are not compared.
    _check(m, feeds, kiln_dev, tmp_path, exact=op != "Mean", signs=False)


def test_max_min_propagate_nan_and_keep_the_first_zero(kiln_dev, tmp_path):
    a = np.array([1, np.nan, 3, np.nan, -0.0, 0.0], np.float32)
    b = np.array([np.nan, 2, 1, np.nan, 0.0, -0.0], np.float32)
    m = _model([helper.make_node("Max", ["a", "b"], ["mx"]), helper.make_node("Min", ["a", "b"], ["mn"])],
               [("a", np.float32, (6,)), ("b", np.float32, (6,))],
               [("mx", np.float32, (6,)), ("mn", np.float32, (6,))])
    run = _check(m, {"a": a, "b": b}, kiln_dev, tmp_path)
    np.testing.assert_array_equal(np.isnan(run.outputs[0]), [True, True, False, True, False, False])
    np.testing.assert_array_equal(np.signbit(run.outputs[0][4:]), [True, False])


# ---- math ----

@pytest.mark.parametrize("op", ["Floor", "Ceil", "Round", "Sign", "Sin", "Cos", "Softplus", "Mish"])
def test_unary_math(op, kiln_dev, tmp_path):
    shape = (3, 50)
    x = _data(np.float32, shape, 7)
    x[1] = np.linspace(-40, 40, shape[1], dtype=np.float32)
    x[2] = np.random.default_rng(8).standard_normal(shape[1]).astype(np.float32) * 1e4
    m = _model([helper.make_node(op, ["x"], ["y"])], [("x", np.float32, shape)], [("y", np.float32, shape)])
    exact = op in ("Floor", "Ceil", "Round", "Sign")
    _check(m, {"x": x}, kiln_dev, tmp_path, exact=exact, rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.int64, np.int32], ids=lambda t: t.__name__)
def test_sign_integers(dtype, kiln_dev, tmp_path):
    x = np.array([[0, -5, 7, 1, -1, np.iinfo(dtype).min, np.iinfo(dtype).max]], dtype)
    m = _model([helper.make_node("Sign", ["x"], ["y"])], [("x", dtype, ["n", 7])], [("y", dtype, ["n", 7])])
    run = _check(m, {"x": x}, kiln_dev, tmp_path)
    np.testing.assert_array_equal(run.outputs[0], [[0, -1, 1, 1, -1, -1, 1]])


@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("dtype", [np.int64, np.int32], ids=lambda t: t.__name__)
def test_mod_integers(dtype, fmod, kiln_dev, tmp_path):
    a = np.array([[5, -5, 5, -5, 0, 7, -7, 9]] * 3, dtype)
    a[2] = np.iinfo(dtype).min + np.arange(8)
    b = np.array([3, 3, -3, -3, 2, -4, 4, 1], dtype)
    m = _model([helper.make_node("Mod", ["a", "b"], ["y"], fmod=fmod)],
               [("a", dtype, (3, 8)), ("b", dtype, (8,))], [("y", dtype, (3, 8))])
    _check(m, {"a": a, "b": b}, kiln_dev, tmp_path)


def test_mod_floats_is_c_fmod(kiln_dev, tmp_path):
    a = np.array([5.5, -5.5, 5.5, -5.5, np.inf, 3.0, np.nan, 1e30, -0.0, 7.0], np.float32)
    b = np.array([2.0, 2.0, -2.0, -2.0, 2.0, np.inf, 1.0, 3.0, 5.0, 0.0], np.float32)
    m = _model([helper.make_node("Mod", ["a", "b"], ["y"], fmod=1)],
               [("a", np.float32, (10,)), ("b", np.float32, (10,))], [("y", np.float32, (10,))])
    _check(m, {"a": a, "b": b}, kiln_dev, tmp_path)


def test_float_mod_without_fmod_is_left_to_ort(kiln_dev, tmp_path):
    """ONNX Runtime refuses float Mod with fmod=0 when it runs; kiln does not claim it."""
    m = _model([helper.make_node("Mod", ["a", "b"], ["y"])],
               [("a", np.float32, (4,)), ("b", np.float32, (4,))], [("y", np.float32, (4,))])
    run = tu.run_kiln(_save(m, tmp_path), kiln_dev, None, options=ALL)
    assert run.nodes_on(kiln.EP_NAME) == []
    assert [op for _, op in run.nodes_on(CPU)] == ["Mod"]


def test_integer_mod_by_zero_is_an_error(kiln_dev, tmp_path):
    m = _model([helper.make_node("Mod", ["a", "b"], ["y"])],
               [("a", np.int64, (4,)), ("b", np.int64, (4,))], [("y", np.int64, (4,))])
    feeds = {"a": np.arange(4, dtype=np.int64), "b": np.array([1, 2, 0, 3], np.int64)}
    err = tu.expect_error(tu.run_fully_on_kiln, _save(m, tmp_path), kiln_dev, feeds, options=ALL)
    assert err.stage == "run"
    assert "integer Mod by zero" in err.message, err.message


# ---- run time, symbolic dims, compiled models ----

def _mixed_model(dims):
    """Comparisons, logic and math feeding each other, so none of them folds."""
    nodes = [
        helper.make_node("Floor", ["x"], ["fl"]),
        helper.make_node("Round", ["x"], ["rd"]),
        helper.make_node("Max", ["fl", "rd", "s"], ["mx"]),
        helper.make_node("Greater", ["mx", "x"], ["gt"]),
        helper.make_node("IsNaN", ["x"], ["nan"]),
        helper.make_node("Or", ["gt", "nan"], ["any"]),
        helper.make_node("Not", ["any"], ["y_mask"]),
        helper.make_node("Sin", ["x"], ["sn"]),
        helper.make_node("Mish", ["sn"], ["mi"]),
        helper.make_node("Mean", ["mi", "fl"], ["y"]),
        helper.make_node("Mod", ["i", "j"], ["y_mod"]),
        helper.make_node("Equal", ["y_mod", "j"], ["y_eq"]),
    ]
    return _model(nodes,
                  [("x", np.float32, dims), ("s", np.float32, dims[-1:]),
                   ("i", np.int64, dims), ("j", np.int64, dims[-1:])],
                  [("y", np.float32, dims), ("y_mask", np.bool_, dims),
                   ("y_mod", np.int64, dims), ("y_eq", np.bool_, dims)])


def _mixed_feeds(shape, seed):
    rng = np.random.default_rng(seed)
    j = rng.integers(1, 6, shape[-1:]) * rng.choice([-1, 1], shape[-1:])
    return {"x": _data(np.float32, shape, seed), "s": _data(np.float32, shape[-1:], seed + 1, special=False),
            "i": rng.integers(-50, 50, shape).astype(np.int64), "j": j.astype(np.int64)}


def test_symbolic_dims_run_at_two_shapes(kiln_dev, tmp_path):
    m = _mixed_model(["batch", "n"])
    path = _save(m, tmp_path, "mixed_dyn")
    feeds = [_mixed_feeds((2, 7), 1), _mixed_feeds((5, 33), 2)]
    run = tu.run_fully_on_kiln(path, kiln_dev, feeds_seq=feeds, options=ALL)
    assert len(run.nodes_on(kiln.EP_NAME)) == len(m.graph.node)
    # one program per partition (the float and the integer parts are apart) per shape
    assert run.run_delta("shapes_specialized") == 2 * run.created_delta("partitions_compiled")
    for f, outs in zip(feeds, run.all_outputs):
        names, want = tu.run_cpu(path, f)
        _assert_matches(names, want, outs, exact=False)


@pytest.mark.parametrize("embed", [0, 1])
def test_compiled_model_roundtrip(embed, kiln_dev, tmp_path):
    m = _mixed_model([3, 16])
    src = _save(m, tmp_path, "mixed")
    feeds = _mixed_feeds((3, 16), 4)
    orig = tu.run_fully_on_kiln(src, kiln_dev, feeds, options=ALL)
    ctx = os.path.join(str(tmp_path), "mixed_ctx.onnx")
    tu.compile_model(src, kiln_dev, embed=bool(embed), to="file", output=ctx, options=ALL)
    assert len(tu.ep_context_nodes(ctx)) == orig.created_delta("partitions_compiled") >= 1
    loaded = tu.run_fully_on_kiln(ctx, kiln_dev, feeds, options=ALL)
    assert loaded.created_delta("partitions_compiled") == 0, "loading the _ctx.onnx compiled"
    assert loaded.created_delta("context_graphs_loaded") >= 1
    for name, a, b in zip(orig.output_names, orig.outputs, loaded.outputs):
        np.testing.assert_array_equal(b, a, err_msg=f"{name}: _ctx.onnx vs original")
    names, want = tu.run_cpu(src, feeds)
    _assert_matches(names, want, loaded.outputs, exact=False)
