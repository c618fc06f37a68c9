"""Selection ops (issue #13): ArgMax, ArgMin and TopK.

Each model runs on kiln with ``claim=all`` and CPU fallback disabled (so
every node really ran on kiln) and is compared with ORT's CPU EP over the
attributes (axis, keepdims, select_last_index; k, axis, largest, sorted),
with ties and NaNs, symbolic dims at two sizes from one session, a k
computed from the input's shape, int64 inputs, and a compiled model
(EPContext) round trip. Indices must be equal, not close.
"""
from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import kiln_testutil as tu
import onnxruntime_ep_kiln as kiln

CLAIM_ALL = {"claim": "all"}


def _model(nodes, inputs, outputs, inits=(), opset=21):
    g = h.make_graph(nodes, "g", inputs, outputs, list(inits))
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)], ir_version=10)


def _vi(name, dims, elem=T.FLOAT):
    return h.make_tensor_value_info(name, elem, dims)


def _init(name, arr):
    return onnx.numpy_helper.from_array(np.asarray(arr), name)


def _save(m, tmp_path, name="m"):
    path = os.path.join(str(tmp_path), f"{name}.onnx")
    onnx.save(m, path)
    return path


def _ties(shape, seed=0, nan=0.0):
    """Small integers as floats (many ties), a fraction of them NaN."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-3, 4, shape).astype(np.float32)
    if nan:
        x[rng.random(shape) < nan] = np.nan
    return x


def _check(path, kiln_dev, feeds_list, sort_indices=False):
    """Every feed on kiln (whole model claimed, one session) equals the CPU EP
    exactly; ``sort_indices``: outputs compared as sets along the last axis
    (TopK with sorted=0 leaves the order open)."""
    run = tu.run_fully_on_kiln(path, kiln_dev, feeds_seq=feeds_list, options=CLAIM_ALL)
    for feeds, outs in zip(feeds_list, run.all_outputs):
        names, want = tu.run_cpu(path, feeds)
        for name, w, a in zip(names, want, outs):
            assert a.dtype == w.dtype and a.shape == w.shape, (name, a.dtype, a.shape, w.dtype, w.shape)
            if sort_indices:
                a, w = np.sort(a, axis=-1), np.sort(w, axis=-1)
            np.testing.assert_array_equal(a, w, err_msg=name)
    return run


# ---------------------------------------------------------------- ArgMax / ArgMin


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("last", [0, 1])
def test_arg_reduce(op, axis, keepdims, last, tmp_path, kiln_dev):
    node = h.make_node(op, ["x"], ["y"], axis=axis, keepdims=keepdims, select_last_index=last)
    path = _save(_model([node], [_vi("x", ["a", 5, "b"])], [_vi("y", None, T.INT64)]), tmp_path)
    feeds = [{"x": _ties((3, 5, 7), 1)}, {"x": _ties((2, 5, 19), 2)}]
    _check(path, kiln_dev, feeds)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("last", [0, 1])
@pytest.mark.parametrize("axis", [0, 1], ids=["strided", "contiguous"])
def test_arg_reduce_nan_like_ort(op, last, axis, tmp_path, kiln_dev):
    """NaN never beats an earlier number but a leading NaN is never beaten
    (ORT compares `v > best`): every pattern of NaN, 1 and 2 in rows of 4."""
    node = h.make_node(op, ["x"], ["y"], axis=axis, keepdims=0, select_last_index=last)
    grid = np.array(np.meshgrid(*[[np.nan, 1.0, 2.0]] * 4)).reshape(4, -1).T.astype(np.float32)  # [81, 4]
    x = grid if axis == 1 else np.ascontiguousarray(grid.T)
    path = _save(_model([node], [_vi("x", list(x.shape))], [_vi("y", None, T.INT64)]), tmp_path)
    _check(path, kiln_dev, [{"x": x}])


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_arg_reduce_infinities_and_signed_zeros(op, tmp_path, kiln_dev):
    """±inf are ordinary extremes; -0 and +0 are equal (a tie)."""
    node = h.make_node(op, ["x"], ["y"], axis=1, keepdims=0)
    node_last = h.make_node(op, ["x"], ["z"], axis=1, keepdims=0, select_last_index=1)
    inf = np.inf
    x = np.array([[1, inf, -inf, inf], [-inf, -inf, 0, 1], [0.0, -0.0, 0.0, -0.0], [-0.0, 0.0, -1, 1]], np.float32)
    outputs = [_vi("y", None, T.INT64), _vi("z", None, T.INT64)]
    path = _save(_model([node, node_last], [_vi("x", [4, 4])], outputs), tmp_path)
    _check(path, kiln_dev, [{"x": x}])


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_arg_reduce_int64_and_opset_11(op, tmp_path, kiln_dev):
    """int64 input, and opset 11 (no select_last_index)."""
    node = h.make_node(op, ["x"], ["y"], axis=1)
    path = _save(_model([node], [_vi("x", [4, 9], T.INT64)], [_vi("y", None, T.INT64)], opset=11), tmp_path)
    x = np.random.default_rng(3).integers(-5, 5, (4, 9)).astype(np.int64)
    _check(path, kiln_dev, [{"x": x}])


def test_arg_reduce_over_an_empty_axis_is_left_to_ort(tmp_path, kiln_dev):
    """There is no index of an extreme of nothing: kiln refuses the node."""
    node = h.make_node("ArgMax", ["x"], ["y"], axis=1)
    path = _save(_model([node], [_vi("x", [2, 0])], [_vi("y", None, T.INT64)]), tmp_path)
    run = tu.run_kiln(path, kiln_dev, None, options=CLAIM_ALL)
    assert run.nodes_on(kiln.EP_NAME) == []


# ---------------------------------------------------------------- TopK


@pytest.mark.parametrize("k,axis", [(1, -1), (3, -1), (7, -1), (2, 0), (4, 1)])
@pytest.mark.parametrize("largest", [1, 0])
def test_top_k_sorted_with_ties(k, axis, largest, tmp_path, kiln_dev):
    """Many equal values: ties go to the lower index first, as in ORT."""
    node = h.make_node("TopK", ["x", "k"], ["v", "i"], axis=axis, largest=largest, sorted=1)
    inputs = [_vi("x", ["a", 7, "b"])]
    outputs = [_vi("v", None), _vi("i", None, T.INT64)]
    path = _save(_model([node], inputs, outputs, [_init("k", np.array([k], np.int64))]), tmp_path)
    feeds = [{"x": _ties((4, 7, 9), 1)}, {"x": _ties((3, 7, 20), 2)}]
    _check(path, kiln_dev, feeds)


@pytest.mark.parametrize("largest", [1, 0])
def test_top_k_unsorted(largest, tmp_path, kiln_dev):
    """sorted=0 leaves the order open: the same values and indices as sets
    (distinct values, so the set is unique)."""
    node = h.make_node("TopK", ["x", "k"], ["v", "i"], axis=1, largest=largest, sorted=0)
    outputs = [_vi("v", None), _vi("i", None, T.INT64)]
    path = _save(_model([node], [_vi("x", [5, 30])], outputs, [_init("k", np.array([6], np.int64))]), tmp_path)
    x = np.random.default_rng(4).permutation(150).reshape(5, 30).astype(np.float32)
    _check(path, kiln_dev, [{"x": x}], sort_indices=True)


def test_top_k_computed_from_the_shape(tmp_path, kiln_dev):
    """k = width // 2 from Shape -> Gather -> Div: folded per shape, so one
    session serves widths 10 and 16."""
    nodes = [
        h.make_node("Shape", ["x"], ["s"]),
        h.make_node("Gather", ["s", "one"], ["w"], axis=0),
        h.make_node("Div", ["w", "two"], ["k"]),
        h.make_node("TopK", ["x", "k"], ["v", "i"], axis=1),
    ]
    inits = [_init("one", np.array([1], np.int64)), _init("two", np.array([2], np.int64))]
    outputs = [_vi("v", None), _vi("i", None, T.INT64)]
    path = _save(_model(nodes, [_vi("x", [3, "w"])], outputs, inits), tmp_path)
    feeds = [{"x": _ties((3, 10), 5)}, {"x": _ties((3, 16), 6)}]
    run = _check(path, kiln_dev, feeds)
    assert [o[1].shape for o in run.all_outputs] == [(3, 5), (3, 8)]


def test_top_k_int64_and_indices_only_consumer(tmp_path, kiln_dev):
    """int64 values; only the indices are read by a later node."""
    nodes = [
        h.make_node("TopK", ["x", "k"], ["v", "i"], axis=0, largest=0),
        h.make_node("Add", ["i", "i"], ["y"]),
    ]
    outputs = [_vi("v", None, T.INT64), _vi("y", None, T.INT64)]
    path = _save(_model(nodes, [_vi("x", [12, 3], T.INT64)], outputs, [_init("k", np.array([5], np.int64))]),
                 tmp_path)
    x = np.random.default_rng(7).integers(-4, 4, (12, 3)).astype(np.int64)
    _check(path, kiln_dev, [{"x": x}])


@pytest.mark.parametrize("shape,k", [((3, 5), 0), ((0, 5), 2)], ids=["k0", "no-rows"])
def test_top_k_and_arg_max_empty(shape, k, tmp_path, kiln_dev):
    """k = 0 and a batch of no rows: empty outputs of the right shapes."""
    nodes = [h.make_node("TopK", ["x", "k"], ["v", "i"], axis=1), h.make_node("ArgMax", ["x"], ["a"], axis=1)]
    outputs = [_vi("v", None), _vi("i", None, T.INT64), _vi("a", None, T.INT64)]
    path = _save(_model(nodes, [_vi("x", ["n", 5])], outputs, [_init("k", np.array([k], np.int64))]), tmp_path)
    _check(path, kiln_dev, [{"x": np.ones(shape, np.float32)}, {"x": _ties((2, 5), 1)}])


def test_top_k_opset_1_attribute(tmp_path, kiln_dev):
    node = h.make_node("TopK", ["x"], ["v", "i"], k=3)
    outputs = [_vi("v", None), _vi("i", None, T.INT64)]
    path = _save(_model([node], [_vi("x", [4, 8])], outputs, opset=9), tmp_path)
    _check(path, kiln_dev, [{"x": _ties((4, 8), 8)}])


def test_top_k_nan_is_greatest(tmp_path, kiln_dev):
    """With NaNs ORT's selection heap gives no consistent order (e.g. k=3 of
    [1, 5, NaN, 5] keeps 5, 1, NaN), so kiln is compared with its own rule,
    NaN greater than every number (numpy's and torch's): rows with no NaN
    still equal ORT's."""
    node = h.make_node("TopK", ["x", "k"], ["v", "i"], axis=1, largest=1)
    outputs = [_vi("v", None), _vi("i", None, T.INT64)]
    path = _save(_model([node], [_vi("x", [6, 5])], outputs, [_init("k", np.array([3], np.int64))]), tmp_path)
    x = _ties((6, 5), 9)
    x[0, 2] = x[3, 0] = x[3, 4] = np.nan
    run = tu.run_fully_on_kiln(path, kiln_dev, {"x": x}, options=CLAIM_ALL)
    v, i = run.outputs
    # Stable descending sort with NaN first: -x puts NaN last in argsort, so
    # order by (not NaN, -x, index).
    want = np.array([sorted(range(5), key=lambda j: (not np.isnan(r[j]), -np.nan_to_num(r[j]), j))[:3] for r in x])
    np.testing.assert_array_equal(i, want)
    np.testing.assert_array_equal(v, np.take_along_axis(x, want, axis=1))
    _, (_, want_i) = tu.run_cpu(path, {"x": x})
    clean = [1, 2, 4, 5]
    np.testing.assert_array_equal(i[clean], want_i[clean])


def test_top_k_with_k_from_a_runtime_input_is_left_to_ort(tmp_path, kiln_dev):
    """k as a graph input sets the output's shape at run time: kiln refuses
    the TopK (and ORT's CPU EP runs it, with the same result as ever)."""
    node = h.make_node("TopK", ["x", "k"], ["v", "i"], axis=1)
    outputs = [_vi("v", None), _vi("i", None, T.INT64)]
    path = _save(_model([node], [_vi("x", [2, 6]), _vi("k", [1], T.INT64)], outputs), tmp_path)
    feeds = {"x": _ties((2, 6), 3), "k": np.array([2], np.int64)}
    run = tu.run_kiln(path, kiln_dev, feeds, options=CLAIM_ALL)
    assert run.nodes_on(kiln.EP_NAME) == []
    _, want = tu.run_cpu(path, feeds)
    np.testing.assert_array_equal(run.outputs[1], want[1])


@pytest.mark.parametrize("target", list(kiln.TARGETS))
def test_selection_on_every_target(target, tmp_path, kiln_dev):
    order = list(kiln.TARGETS)  # best first
    if order.index(target) < order.index(tu.host_target()):
        pytest.skip(f"this CPU cannot run {target} (best here: {tu.host_target()})")
    nodes = [
        h.make_node("ArgMin", ["x"], ["a"], axis=1, select_last_index=1),
        h.make_node("TopK", ["x", "k"], ["v", "i"], axis=0),
    ]
    outputs = [_vi("a", None, T.INT64), _vi("v", None), _vi("i", None, T.INT64)]
    path = _save(_model(nodes, [_vi("x", [9, 8])], outputs, [_init("k", np.array([4], np.int64))]), tmp_path)
    feeds = {"x": _ties((9, 8), 11, nan=0.1)}
    run = tu.run_fully_on_kiln(path, kiln_dev, feeds, options={"claim": "all", "target": target})
    _, want = tu.run_cpu(path, feeds)
    np.testing.assert_array_equal(run.outputs[0], want[0])


# ---------------------------------------------------------------- compiled model


@pytest.mark.parametrize("symbolic", [True, False], ids=["symbolic", "static"])
def test_compiled_model_round_trip(symbolic, tmp_path, kiln_dev):
    """ArgMax, ArgMin and TopK compile to an EPContext model that loads and
    runs the same."""
    nodes = [
        h.make_node("ArgMax", ["x"], ["am"], axis=1, select_last_index=1),
        h.make_node("ArgMin", ["x"], ["an"], axis=0, keepdims=0),
        h.make_node("TopK", ["x", "k"], ["v", "i"], axis=-1, largest=0),
    ]
    dims = ["a", 6] if symbolic else [4, 6]
    outputs = [_vi("am", None, T.INT64), _vi("an", None, T.INT64), _vi("v", None), _vi("i", None, T.INT64)]
    src = _save(_model(nodes, [_vi("x", dims)], outputs, [_init("k", np.array([2], np.int64))]), tmp_path, "sel")
    ctx = os.path.join(str(tmp_path), "sel_ctx.onnx")
    tu.compile_model(src, kiln_dev, embed=False, output=ctx, options=CLAIM_ALL)
    assert os.path.exists(os.path.join(str(tmp_path), "sel_kiln.bin"))
    assert {n.op_type for n in onnx.load(ctx).graph.node} == {"EPContext"}
    feeds = [{"x": _ties((4, 6), 1)}] + ([{"x": _ties((9, 6), 2)}] if symbolic else [])
    run = tu.run_fully_on_kiln(ctx, kiln_dev, feeds_seq=feeds, options=CLAIM_ALL)
    for f, outs in zip(feeds, run.all_outputs):
        _, want = tu.run_cpu(src, f)
        for w, a in zip(want, outs):
            np.testing.assert_array_equal(a, w)
