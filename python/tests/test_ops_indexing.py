"""Shape and indexing ops (issue #12): Range, ConstantOfShape, Expand, Tile,
GatherND, ScatterND, GatherElements, Pad, CumSum, Trilu, OneHot.

Every model is run on kiln with the EP option ``claim=all`` (so the kernels
are tested, not the claim rule), with CPU fallback disabled (so every node
really ran on kiln), and compared with ORT's CPU EP. Each op family has a
model with symbolic dims run at two shapes. Also: an input whose values set
an output's shape (Tile's repeats, Range's limit) at run time is refused and
left to ORT; an index out of range is a run-time error naming the op; and a
compiled model (EPContext) holding several of these ops runs the same.
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

NP = {T.FLOAT: np.float32, T.INT64: np.int64, T.INT32: np.int32, T.BOOL: np.bool_}


def _model(nodes, inputs, outputs, inits=(), opset=21):
    g = h.make_graph(nodes, "g", inputs, outputs, list(inits))
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)], ir_version=9)
    return m


def _vi(name, elem, dims):
    return h.make_tensor_value_info(name, elem, dims)


def _init(name, arr):
    return onnx.numpy_helper.from_array(np.asarray(arr), name)


def _save(m, tmp_path, name="m"):
    path = os.path.join(str(tmp_path), f"{name}.onnx")
    onnx.save(m, path)
    return path


def _check(m, tmp_path, kiln_dev, feeds_list):
    """Runs every feed on kiln (whole model claimed) and on the CPU EP; outputs equal."""
    path = _save(m, tmp_path)
    run = tu.run_fully_on_kiln(path, kiln_dev, feeds_seq=feeds_list, options=CLAIM_ALL)
    for feeds, outs in zip(feeds_list, run.all_outputs):
        names, want = tu.run_cpu(path, feeds)
        for name, w, a in zip(names, want, outs):
            assert a.dtype == w.dtype, name
            assert a.shape == w.shape, (name, a.shape, w.shape)
            np.testing.assert_allclose(a, w, rtol=1e-6, atol=1e-6, err_msg=name)
    return run


def _rand(shape, elem, seed=0, lo=-5, hi=5):
    rng = np.random.default_rng(seed)
    if elem == T.FLOAT:
        return rng.standard_normal(shape).astype(np.float32)
    if elem == T.BOOL:
        return rng.integers(0, 2, shape).astype(np.bool_)
    return rng.integers(lo, hi, shape).astype(NP[elem])


# ---------------------------------------------------------------- Range


@pytest.mark.parametrize("elem,start,delta", [
    (T.INT64, 0, 1), (T.INT64, 7, -2), (T.INT32, -3, 2), (T.FLOAT, 0.5, 0.25), (T.FLOAT, 3.0, -0.7),
])
def test_range_from_a_symbolic_dim(elem, start, delta, tmp_path, kiln_dev):
    # limit = size of x's symbolic dim (shape arithmetic kiln folds per shape).
    nodes = [
        h.make_node("Shape", ["x"], ["s"]),
        h.make_node("Gather", ["s", "one"], ["n"], axis=0),
        h.make_node("Cast", ["n"], ["limit"], to=elem),
        h.make_node("Range", ["start", "limit", "delta"], ["y"]),
    ]
    inits = [_init("one", np.int64(1)), _init("start", NP[elem](start)), _init("delta", NP[elem](delta))]
    m = _model(nodes, [_vi("x", T.FLOAT, [2, "n"])], [_vi("y", elem, None)], inits)
    _check(m, tmp_path, kiln_dev, [{"x": _rand((2, 9), T.FLOAT)}, {"x": _rand((2, 4), T.FLOAT)}])


def test_range_with_a_run_time_limit_is_left_to_ort(tmp_path, kiln_dev):
    nodes = [h.make_node("Range", ["start", "limit", "delta"], ["y"])]
    inits = [_init("start", np.int64(0)), _init("delta", np.int64(1))]
    m = _model(nodes, [_vi("limit", T.INT64, [])], [_vi("y", T.INT64, None)], inits)
    path = _save(m, tmp_path)
    feeds = {"limit": np.array(5, np.int64)}
    run = tu.run_kiln(path, kiln_dev, feeds, options=CLAIM_ALL)
    assert run.nodes_on(kiln.EP_NAME) == []
    np.testing.assert_array_equal(run.outputs[0], np.arange(5))


# ---------------------------------------------------------------- ConstantOfShape, Expand, Tile


@pytest.mark.parametrize("elem,value", [(T.FLOAT, 2.5), (T.INT64, -3), (T.INT32, 7), (T.BOOL, True)])
def test_constant_of_shape_of_a_symbolic_shape(elem, value, tmp_path, kiln_dev):
    nodes = [
        h.make_node("Shape", ["x"], ["s"]),
        h.make_node("ConstantOfShape", ["s"], ["c"], value=h.make_tensor("v", elem, [1], [value])),
        h.make_node("Identity", ["c"], ["y"]),
    ]
    m = _model(nodes, [_vi("x", T.FLOAT, ["a", 3])], [_vi("y", elem, None)])
    _check(m, tmp_path, kiln_dev, [{"x": _rand((2, 3), T.FLOAT)}, {"x": _rand((5, 3), T.FLOAT)}])


@pytest.mark.parametrize("elem", [T.FLOAT, T.INT64, T.INT32, T.BOOL])
def test_expand_to_a_shape_built_from_symbolic_dims(elem, tmp_path, kiln_dev):
    # x [n, 1] expanded to [4, n, 3] (shape from Shape -> Concat), and to a
    # constant shape of lower rank than x.
    nodes = [
        h.make_node("Shape", ["x"], ["s"]),
        h.make_node("Slice", ["s", "z", "o"], ["n"]),
        h.make_node("Concat", ["four", "n", "three"], ["shape"], axis=0),
        h.make_node("Expand", ["x", "shape"], ["y"]),
        h.make_node("Expand", ["x", "small"], ["y2"]),
    ]
    inits = [_init("z", np.array([0])), _init("o", np.array([1])), _init("four", np.array([4])),
             _init("three", np.array([3])), _init("small", np.array([1, 5]))]
    m = _model(nodes, [_vi("x", elem, ["n", 1])], [_vi("y", elem, None), _vi("y2", elem, None)], inits)
    _check(m, tmp_path, kiln_dev, [{"x": _rand((2, 1), elem)}, {"x": _rand((7, 1), elem, 1)}])


@pytest.mark.parametrize("elem", [T.FLOAT, T.INT64, T.INT32, T.BOOL])
@pytest.mark.parametrize("repeats", [[1, 1, 1], [2, 1, 3], [1, 0, 2], [3, 2, 1]])
def test_tile(elem, repeats, tmp_path, kiln_dev):
    nodes = [h.make_node("Tile", ["x", "r"], ["y"])]
    m = _model(nodes, [_vi("x", elem, ["b", 3, 2])], [_vi("y", elem, None)], [_init("r", np.array(repeats))])
    _check(m, tmp_path, kiln_dev, [{"x": _rand((2, 3, 2), elem)}, {"x": _rand((5, 3, 2), elem, 1)}])


def test_tile_with_run_time_repeats_is_left_to_ort(tmp_path, kiln_dev):
    nodes = [h.make_node("Tile", ["x", "r"], ["y"])]
    m = _model(nodes, [_vi("x", T.FLOAT, [2, 3]), _vi("r", T.INT64, [2])], [_vi("y", T.FLOAT, None)])
    path = _save(m, tmp_path)
    feeds = {"x": _rand((2, 3), T.FLOAT), "r": np.array([2, 1], np.int64)}
    run = tu.run_kiln(path, kiln_dev, feeds, options=CLAIM_ALL)
    assert run.nodes_on(kiln.EP_NAME) == []
    np.testing.assert_array_equal(run.outputs[0], np.tile(feeds["x"], (2, 1)))


# ---------------------------------------------------------------- GatherElements, GatherND, ScatterND


@pytest.mark.parametrize("elem", [T.FLOAT, T.INT64, T.INT32, T.BOOL])
@pytest.mark.parametrize("idx_elem", [T.INT64, T.INT32])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_elements(elem, idx_elem, axis, tmp_path, kiln_dev):
    # Indices smaller than data on the other axes, negative ones included.
    nodes = [h.make_node("GatherElements", ["x", "i"], ["y"], axis=axis)]
    data_shape = ["b", 4, 5]
    # Along axis 0 the indices' dim is free; on the other axes it may not
    # exceed data's, which kiln can only know when both are the same symbol.
    idx_shape = ["c", 3, 2] if axis == 0 else ["b", 3, 2]
    m = _model(nodes, [_vi("x", elem, data_shape), _vi("i", idx_elem, idx_shape)], [_vi("y", elem, None)])
    size = {0: None, 1: 4, -1: 5}[axis]

    def feeds(b, c, seed):
        n = b if size is None else size
        c = c if axis == 0 else b
        rng = np.random.default_rng(seed)
        return {"x": _rand((b, 4, 5), elem, seed), "i": rng.integers(-n, n, (c, 3, 2)).astype(NP[idx_elem])}

    empty = [feeds(3, 0, 2)] if axis == 0 else []
    _check(m, tmp_path, kiln_dev, [feeds(3, 2, 0), feeds(6, 6, 1)] + empty)


def test_gather_elements_indices_larger_than_data_may_not_be_claimed(tmp_path, kiln_dev):
    """Indices [c, 2] on data [b, 4] along axis 1: at some sizes c > b, so
    kiln refuses the node (ORT runs it) rather than fail at those sizes."""
    nodes = [h.make_node("GatherElements", ["x", "i"], ["y"], axis=1)]
    m = _model(nodes, [_vi("x", T.FLOAT, ["b", 4]), _vi("i", T.INT64, ["c", 2])], [_vi("y", T.FLOAT, None)])
    path = _save(m, tmp_path)
    feeds = {"x": _rand((3, 4), T.FLOAT), "i": np.array([[0, 3], [1, -1]], np.int64)}
    run = tu.run_kiln(path, kiln_dev, feeds, options=CLAIM_ALL)
    assert run.nodes_on(kiln.EP_NAME) == []
    np.testing.assert_array_equal(run.outputs[0], np.take_along_axis(feeds["x"][:2], feeds["i"] % 4, 1))


@pytest.mark.parametrize("elem", [T.FLOAT, T.INT64, T.BOOL])
@pytest.mark.parametrize("batch_dims,idx_shape", [
    (0, [4, 1]), (0, [2, 3, 2]), (0, [5, 3]), (1, [3, 2, 1]), (1, [3, 2]), (2, [3, 4, 1]), (0, [0, 2]),
])
def test_gather_nd(elem, batch_dims, idx_shape, tmp_path, kiln_dev):
    data_shape = (3, 4, 5)
    k = idx_shape[-1]
    nodes = [h.make_node("GatherND", ["x", "i"], ["y"], batch_dims=batch_dims)]
    # The first batch dim must agree with data's: the same symbol.
    sym_idx = ["b"] + idx_shape[1:] if batch_dims else idx_shape
    m = _model(nodes, [_vi("x", elem, ["b", 4, 5]), _vi("i", T.INT64, sym_idx)], [_vi("y", elem, None)])

    def feeds(seed):
        rng = np.random.default_rng(seed)
        dims = data_shape[batch_dims:batch_dims + k]
        cols = [rng.integers(-d, d, idx_shape[:-1]) for d in dims]
        i = np.stack(cols, -1) if cols else np.zeros(idx_shape)
        return {"x": _rand(data_shape, elem, seed), "i": i.reshape(idx_shape).astype(np.int64)}

    _check(m, tmp_path, kiln_dev, [feeds(0), feeds(1)])


def test_gather_nd_symbolic_batch_at_two_shapes(tmp_path, kiln_dev):
    nodes = [h.make_node("GatherND", ["x", "i"], ["y"], batch_dims=1)]
    m = _model(nodes, [_vi("x", T.FLOAT, ["b", 6, 2]), _vi("i", T.INT64, ["b", "t", 1])], [_vi("y", T.FLOAT, None)])
    rng = np.random.default_rng(0)
    f = [{"x": _rand((b, 6, 2), T.FLOAT, b), "i": rng.integers(-6, 6, (b, t, 1)).astype(np.int64)}
         for b, t in [(2, 3), (5, 7)]]
    _check(m, tmp_path, kiln_dev, f)


SCATTER_TYPES = [(e, r) for e in (T.FLOAT, T.INT64, T.INT32) for r in ("none", "add", "mul", "max", "min")]
SCATTER_TYPES.append((T.BOOL, "none"))  # reductions need numbers


@pytest.mark.parametrize("elem,reduction", SCATTER_TYPES)
@pytest.mark.parametrize("indices", [
    [[1], [-1]],                 # whole rows
    [[0, 2], [2, -1], [0, 2]],   # single elements (a repeat: combined in order)
])
def test_scatter_nd(elem, reduction, indices, tmp_path, kiln_dev):
    if reduction == "none" and len(indices) == 3:
        indices = indices[:2]  # a repeated index without reduction has no defined result
    idx = np.array(indices, np.int64)
    k = idx.shape[-1]
    upd_shape = [idx.shape[0]] + ([4] if k == 1 else [])
    nodes = [h.make_node("ScatterND", ["x", "i", "u"], ["y"], reduction=reduction)]
    m = _model(nodes, [_vi("x", elem, [3, 4]), _vi("u", elem, upd_shape)], [_vi("y", elem, None)],
               [_init("i", idx)], opset=18)
    _check(m, tmp_path, kiln_dev, [{"x": _rand((3, 4), elem, 0), "u": _rand(upd_shape, elem, 1)}])


def test_scatter_nd_symbolic_rows_at_two_shapes(tmp_path, kiln_dev):
    nodes = [h.make_node("ScatterND", ["x", "i", "u"], ["y"])]
    m = _model(nodes, [_vi("x", T.FLOAT, ["r", 3]), _vi("i", T.INT64, ["n", 1]), _vi("u", T.FLOAT, ["n", 3])],
               [_vi("y", T.FLOAT, None)], opset=13)
    f = [{"x": _rand((r, 3), T.FLOAT, r), "i": np.array(rows, np.int64).reshape(-1, 1),
          "u": _rand((len(rows), 3), T.FLOAT, 9)} for r, rows in [(4, [3, 0]), (9, [-1, 5, 2]), (3, [])]]
    _check(m, tmp_path, kiln_dev, f)


@pytest.mark.parametrize("op,bad", [("GatherElements", 7), ("GatherND", -8), ("ScatterND", 4)])
def test_an_index_out_of_range_is_a_run_time_error(op, bad, tmp_path, kiln_dev):
    ins = ["x", "i", "u"] if op == "ScatterND" else ["x", "i"]
    nodes = [h.make_node(op, ins, ["y"])]
    inputs = [_vi("x", T.FLOAT, [4, 3]), _vi("i", T.INT64, [2, 1])]
    if op == "ScatterND":
        inputs.append(_vi("u", T.FLOAT, [2, 3]))
    out_shape = [2, 1] if op == "GatherElements" else [2, 3]
    m = _model(nodes, inputs, [_vi("y", T.FLOAT, out_shape)])
    path = _save(m, tmp_path)
    feeds = {"x": _rand((4, 3), T.FLOAT), "i": np.array([[1], [bad]], np.int64), "u": _rand((2, 3), T.FLOAT)}
    feeds = {k: v for k, v in feeds.items() if k in ins}
    # A good index runs on kiln...
    good = dict(feeds, i=np.array([[1], [0]], np.int64))
    tu.run_fully_on_kiln(path, kiln_dev, good, options=CLAIM_ALL)
    # ...a bad one fails the run, naming the op and the index.
    err = tu.expect_error(tu.run_fully_on_kiln, path, kiln_dev, feeds, options=CLAIM_ALL)
    assert err.stage == "run"
    assert op in err.message and f"index {bad} is out of range" in err.message, err.message
    assert "INVALID_ARGUMENT" in err.message, err.message


# ---------------------------------------------------------------- Pad


PAD_CASES = [
    # (mode, pads for [r, c] input)
    ("constant", [1, 2, 0, 3]),
    ("constant", [0, -1, 2, -2]),
    ("reflect", [2, 1, 1, 3]),
    ("reflect", [0, -1, 0, 2]),
    ("edge", [3, 0, 1, 2]),
    ("edge", [0, -1, 0, 2]),
    ("wrap", [1, 2, 2, 1]),
    ("wrap", [0, 9, 0, 7]),
    ("wrap", [0, 2, 0, -1]),
]


@pytest.mark.parametrize("elem", [T.FLOAT, T.INT64, T.INT32])
@pytest.mark.parametrize("mode,pads", PAD_CASES)
def test_pad_modes(elem, mode, pads, tmp_path, kiln_dev):
    ins = ["x", "p"] + (["v"] if mode == "constant" else [])
    nodes = [h.make_node("Pad", ins, ["y"], mode=mode)]
    inputs = [_vi("x", elem, ["r", 5])] + ([_vi("v", elem, [])] if mode == "constant" else [])
    m = _model(nodes, inputs, [_vi("y", elem, None)], [_init("p", np.array(pads, np.int64))], opset=19)
    feeds = [{"x": _rand((r, 5), elem, r)} for r in (4, 7)]
    if mode == "constant":
        for f in feeds:
            f["v"] = np.array(9, NP[elem])
    _check(m, tmp_path, kiln_dev, feeds)


@pytest.mark.parametrize("opset", [2, 11, 13, 18, 21])
def test_pad_forms_across_opsets(opset, tmp_path, kiln_dev):
    if opset < 11:
        nodes = [h.make_node("Pad", ["x"], ["y"], mode="constant", pads=[0, 1, 2, 0, 2, 1], value=1.5)]
        inits = []
    elif opset < 18:
        nodes = [h.make_node("Pad", ["x", "p", "v"], ["y"], mode="reflect")]
        inits = [_init("p", np.array([0, 1, 2, 0, 2, 1])), _init("v", np.float32(0))]
    else:
        # axes as an input, negative and out of order; a constant constant_value.
        nodes = [h.make_node("Pad", ["x", "p", "v", "a"], ["y"], mode="constant")]
        inits = [_init("p", np.array([2, 1, 0, 3])), _init("v", np.float32(-4)), _init("a", np.array([-1, 1]))]
    m = _model(nodes, [_vi("x", T.FLOAT, ["b", 3, 4])], [_vi("y", T.FLOAT, None)], inits, opset=opset)
    _check(m, tmp_path, kiln_dev, [{"x": _rand((2, 3, 4), T.FLOAT)}, {"x": _rand((5, 3, 4), T.FLOAT, 1)}])


def test_a_reflect_pad_too_large_for_the_run_time_size_is_a_clear_error(tmp_path, kiln_dev):
    """Claimed at the probe sizes; at a size where the pad exceeds the axis
    (ORT's CPU EP refuses that input too) the run fails with the reason, and
    the session still runs other sizes."""
    nodes = [h.make_node("Pad", ["x", "p"], ["y"], mode="reflect")]
    m = _model(nodes, [_vi("x", T.FLOAT, [2, "n"])], [_vi("y", T.FLOAT, None)], [_init("p", np.array([0, 3, 0, 0]))])
    path = _save(m, tmp_path)
    small = {"x": _rand((2, 2), T.FLOAT)}
    with pytest.raises(Exception, match="Pad reflect: pre-pad"):
        tu.run_cpu(path, small)
    err = tu.expect_error(tu.run_fully_on_kiln, path, kiln_dev, small, options=CLAIM_ALL)
    assert err.stage == "run"
    assert "Pad 'reflect' of 3 and 0 on axis 1 of size 2 (at most 1)" in err.message, err.message
    _check(m, tmp_path, kiln_dev, [{"x": _rand((2, 6), T.FLOAT)}, {"x": _rand((2, 4), T.FLOAT)}])


def test_pad_of_an_empty_tensor(tmp_path, kiln_dev):
    nodes = [h.make_node("Pad", ["x", "p"], ["y"])]
    m = _model(nodes, [_vi("x", T.FLOAT, ["n", 2])], [_vi("y", T.FLOAT, None)], [_init("p", np.array([1, 0, 1, 1]))])
    _check(m, tmp_path, kiln_dev, [{"x": np.zeros((0, 2), np.float32)}, {"x": _rand((3, 2), T.FLOAT)}])


# ---------------------------------------------------------------- CumSum, Trilu, OneHot


@pytest.mark.parametrize("elem", [T.FLOAT, T.INT64, T.INT32])
@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("axis,axis_elem", [(0, T.INT64), (-1, T.INT32), (1, T.INT64)])
def test_cumsum(elem, exclusive, reverse, axis, axis_elem, tmp_path, kiln_dev):
    nodes = [h.make_node("CumSum", ["x", "a"], ["y"], exclusive=exclusive, reverse=reverse)]
    m = _model(nodes, [_vi("x", elem, ["b", 4, 3])], [_vi("y", elem, None)], [_init("a", NP[axis_elem](axis))])
    feeds = [{"x": _rand((b, 4, 3), elem, b)} for b in (2, 5)] + [{"x": np.zeros((0, 4, 3), NP[elem])}]
    _check(m, tmp_path, kiln_dev, feeds)


@pytest.mark.parametrize("elem", [T.FLOAT, T.INT64, T.INT32])
@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [None, -2, 0, 1, 3])
def test_trilu(elem, upper, k, tmp_path, kiln_dev):
    ins = ["x"] if k is None else ["x", "k"]
    nodes = [h.make_node("Trilu", ins, ["y"], upper=upper)]
    inits = [] if k is None else [_init("k", np.int64(k))]
    m = _model(nodes, [_vi("x", elem, ["b", 4, 6])], [_vi("y", elem, None)], inits)
    _check(m, tmp_path, kiln_dev, [{"x": _rand((b, 4, 6), elem, b)} for b in (1, 3, 0)])


@pytest.mark.parametrize("axis", [-1, 0, 1])
@pytest.mark.parametrize("idx_elem,val_elem,depth_elem", [
    (T.INT64, T.FLOAT, T.INT64), (T.INT64, T.INT64, T.INT64), (T.INT32, T.FLOAT, T.INT32),
    (T.FLOAT, T.FLOAT, T.FLOAT), (T.INT64, T.INT32, T.FLOAT),
])
def test_one_hot(axis, idx_elem, val_elem, depth_elem, tmp_path, kiln_dev):
    # Indices include negatives (count from the end) and out-of-range values (a row of off).
    nodes = [h.make_node("OneHot", ["i", "d", "v"], ["y"], axis=axis)]
    m = _model(nodes, [_vi("i", idx_elem, ["b", 3]), _vi("v", val_elem, [2])], [_vi("y", val_elem, None)],
               [_init("d", NP[depth_elem](5))])
    rng = np.random.default_rng(0)
    f = [{"i": rng.integers(-7, 8, (b, 3)).astype(NP[idx_elem]), "v": np.array([2, 7], NP[val_elem])}
         for b in (2, 4, 0)]
    _check(m, tmp_path, kiln_dev, f)


def test_one_hot_depth_from_a_symbolic_dim(tmp_path, kiln_dev):
    nodes = [
        h.make_node("Shape", ["x"], ["s"]),
        h.make_node("Gather", ["s", "one"], ["d"], axis=0),
        h.make_node("OneHot", ["i", "d", "v"], ["y"]),
    ]
    inits = [_init("one", np.int64(1)), _init("v", np.array([0.0, 1.0], np.float32))]
    m = _model(nodes, [_vi("x", T.FLOAT, [1, "n"]), _vi("i", T.INT64, [4])], [_vi("y", T.FLOAT, None)], inits)
    f = [{"x": _rand((1, n), T.FLOAT), "i": np.array([0, -1, 2, 5], np.int64)} for n in (3, 6)]
    _check(m, tmp_path, kiln_dev, f)


@pytest.mark.parametrize("op", ["ConstantOfShape", "Expand"])
def test_a_run_time_shape_is_left_to_ort(op, tmp_path, kiln_dev):
    ins = ["shape"] if op == "ConstantOfShape" else ["x", "shape"]
    nodes = [h.make_node(op, ins, ["y"])]
    inputs = [_vi("shape", T.INT64, [2])] + ([_vi("x", T.FLOAT, [1, 1])] if op == "Expand" else [])
    m = _model(nodes, inputs, [_vi("y", T.FLOAT, None)])
    path = _save(m, tmp_path)
    feeds = {"shape": np.array([2, 3], np.int64)}
    if op == "Expand":
        feeds["x"] = np.full((1, 1), 4.0, np.float32)
    run = tu.run_kiln(path, kiln_dev, feeds, options=CLAIM_ALL)
    assert run.nodes_on(kiln.EP_NAME) == []
    np.testing.assert_array_equal(run.outputs[0], np.full((2, 3), 4.0 if op == "Expand" else 0.0, np.float32))


# ---------------------------------------------------------------- compiled model


@pytest.mark.parametrize("symbolic", [True, False], ids=["symbolic", "static"])
def test_compiled_model_round_trip(symbolic, tmp_path, kiln_dev):
    """A graph of GatherND, ScatterND, CumSum, OneHot, Pad and GatherElements
    compiles to an EPContext model that loads and runs the same: with
    symbolic dims (the binary holds the shape-generic graph) and static ones
    (it holds the compiled steps, each of the five indexing step kinds)."""
    nodes = [
        h.make_node("CumSum", ["x", "ax"], ["c"], reverse=1),
        h.make_node("Pad", ["c", "p"], ["pd"], mode="reflect"),
        h.make_node("GatherElements", ["pd", "ge"], ["g"], axis=1),
        h.make_node("GatherND", ["g", "gi"], ["nd"], batch_dims=1),
        h.make_node("ScatterND", ["x", "si", "su"], ["sc"], reduction="add"),
        h.make_node("OneHot", ["oi", "d", "ov"], ["oh"], axis=1),
    ]
    inits = [_init("ax", np.int64(1)), _init("p", np.array([0, 2, 0, 1])),
             _init("ge", np.array([[0, 6, -1], [1, 2, 3]])), _init("gi", np.array([[2], [-3]])),
             _init("si", np.array([[0], [1], [0]])), _init("d", np.int64(4)),
             _init("ov", np.array([0.0, 1.0], np.float32))]
    b, n = ("b", "n") if symbolic else (2, 3)
    inputs = [_vi("x", T.FLOAT, [b, 5]), _vi("su", T.FLOAT, [3, 5]), _vi("oi", T.INT64, [n])]
    outputs = [_vi(n, T.FLOAT, None) for n in ("nd", "sc", "oh")]
    m = _model(nodes, inputs, outputs, inits)
    src = _save(m, tmp_path, "indexing")
    ctx = os.path.join(str(tmp_path), "indexing_ctx.onnx")
    tu.compile_model(src, kiln_dev, embed=False, output=ctx, options=CLAIM_ALL)
    assert os.path.exists(os.path.join(str(tmp_path), "indexing_kiln.bin"))
    compiled = onnx.load(ctx)
    assert {n.op_type for n in compiled.graph.node} == {"EPContext"}
    rng = np.random.default_rng(0)
    feeds = [{"x": _rand((2, 5), T.FLOAT, b), "su": _rand((3, 5), T.FLOAT, 1),
              "oi": rng.integers(-4, 4, (n,)).astype(np.int64)} for b, n in [(2, 3), (2, 6 if symbolic else 3)]]
    run = tu.run_fully_on_kiln(ctx, kiln_dev, feeds_seq=feeds, options=CLAIM_ALL)
    for f, outs in zip(feeds, run.all_outputs):
        names, want = tu.run_cpu(src, f)
        for name, w, a in zip(names, want, outs):
            np.testing.assert_allclose(a, w, rtol=1e-6, atol=1e-6, err_msg=name)
