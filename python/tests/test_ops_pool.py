"""Pools and rearrangements of issue #13: MaxPool (with its Indices output),
AveragePool, GlobalAveragePool, GlobalMaxPool, DepthToSpace, SpaceToDepth.

kiln runs them channels-last; every model runs on kiln with the EP option
``claim=all`` and CPU fallback disabled (so every node really ran on kiln)
and is compared with ORT's CPU EP over the attribute space, the odd cases
included (ceil_mode with pads, asymmetric pads, dilations, auto_pad), with
symbolic N/H/W at two sizes from one session, and through an EPContext
round trip. Nodes kiln cannot run exactly are left to ORT with a reason.
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
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)], ir_version=9)


def _save(m, tmp_path, name="m"):
    path = os.path.join(str(tmp_path), f"{name}.onnx")
    onnx.save(m, path)
    return path


def _rand(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _check(m, tmp_path, kiln_dev, shapes, rtol=1e-6, atol=1e-6):
    """Runs input x at each shape in one kiln session (whole model claimed)
    and on the CPU EP; outputs equal (indices exactly)."""
    path = _save(m, tmp_path)
    feeds = [{"x": _rand(s, i)} for i, s in enumerate(shapes)]
    run = tu.run_fully_on_kiln(path, kiln_dev, feeds_seq=feeds, options=CLAIM_ALL)
    for f, outs in zip(feeds, run.all_outputs):
        names, want = tu.run_cpu(path, f)
        for name, w, a in zip(names, want, outs):
            assert a.dtype == w.dtype and a.shape == w.shape, (name, a.shape, w.shape)
            if w.dtype == np.int64:
                np.testing.assert_array_equal(a, w, err_msg=name)
            else:
                np.testing.assert_allclose(a, w, rtol=rtol, atol=atol, err_msg=name)
    return run


def _pool_model(op, attrs, rank, symbolic, opset=21, indices=False):
    dims = ["n", "c", "h", "w"][: 2] + (["h", "w"] if rank == 4 else ["l"]) if symbolic else None
    x = h.make_tensor_value_info("x", T.FLOAT, dims if symbolic else None)
    outs = ["y", "i"] if indices else ["y"]
    node = h.make_node(op, ["x"], outs, **attrs)
    vis = [h.make_tensor_value_info("y", T.FLOAT, None)]
    if indices:
        vis.append(h.make_tensor_value_info("i", T.INT64, None))
    return _model([node], [x], vis, opset=opset)


POOL_CASES = [
    # (attrs, 2-D shapes)
    (dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]), [(1, 16, 14, 14), (2, 16, 9, 11)]),
    (dict(kernel_shape=[2, 2], strides=[2, 2]), [(1, 8, 8, 8), (1, 8, 7, 9)]),
    (dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1), [(1, 5, 7, 8), (1, 5, 6, 9)]),
    # ceil_mode with pads: the last window would start in the end padding.
    (dict(kernel_shape=[3, 2], strides=[2, 2], pads=[1, 0, 1, 1], ceil_mode=1), [(1, 3, 8, 7), (2, 3, 5, 6)]),
    (dict(kernel_shape=[2, 3], strides=[1, 2], pads=[0, 2, 1, 0]), [(1, 4, 6, 9), (1, 4, 5, 5)]),  # asymmetric
    (dict(kernel_shape=[3, 3], dilations=[2, 2], pads=[2, 1, 2, 1]), [(1, 3, 9, 9), (1, 3, 8, 10)]),
    (dict(kernel_shape=[3, 3], dilations=[2, 1], strides=[2, 2], ceil_mode=1), [(1, 2, 10, 9), (1, 2, 9, 8)]),
    (dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER"), [(1, 4, 7, 8), (1, 4, 6, 5)]),
    (dict(kernel_shape=[2, 3], strides=[2, 1], auto_pad="SAME_LOWER"), [(1, 4, 7, 8), (1, 4, 6, 5)]),
    (dict(kernel_shape=[3, 3], strides=[2, 2], auto_pad="VALID"), [(1, 4, 7, 8), (1, 4, 6, 5)]),
    (dict(kernel_shape=[13, 13], strides=[1, 1], pads=[6, 6, 6, 6]), [(1, 6, 13, 13), (1, 6, 20, 17)]),  # SPPF
]


@pytest.mark.parametrize("attrs,shapes", POOL_CASES)
def test_max_pool_2d(attrs, shapes, tmp_path, kiln_dev):
    _check(_pool_model("MaxPool", attrs, 4, True), tmp_path, kiln_dev, shapes)


@pytest.mark.parametrize("include_pad", [0, 1])
@pytest.mark.parametrize("attrs,shapes", [c for c in POOL_CASES if "dilations" not in c[0]])
def test_average_pool_2d(attrs, shapes, include_pad, tmp_path, kiln_dev):
    attrs = dict(attrs, count_include_pad=include_pad)
    _check(_pool_model("AveragePool", attrs, 4, True), tmp_path, kiln_dev, shapes, rtol=1e-5)


@pytest.mark.parametrize("include_pad", [0, 1])
@pytest.mark.parametrize("attrs", [
    dict(kernel_shape=[3, 3], dilations=[2, 2], pads=[2, 1, 2, 1]),
    dict(kernel_shape=[2, 2], dilations=[2, 3], strides=[2, 1], ceil_mode=1, pads=[1, 1, 1, 1]),
])
def test_average_pool_dilations(attrs, include_pad, tmp_path, kiln_dev):
    # Dilations of AveragePool came with opset 19.
    attrs = dict(attrs, count_include_pad=include_pad)
    _check(_pool_model("AveragePool", attrs, 4, True, opset=19), tmp_path, kiln_dev,
           [(1, 3, 9, 10), (1, 3, 8, 7)], rtol=1e-5)


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize("attrs", [
    dict(kernel_shape=[3], strides=[2], pads=[1, 1]),
    dict(kernel_shape=[4], strides=[3], pads=[1, 2], ceil_mode=1),
    dict(kernel_shape=[3], auto_pad="SAME_UPPER"),
])
def test_pool_1d(op, attrs, tmp_path, kiln_dev):
    _check(_pool_model(op, attrs, 3, True), tmp_path, kiln_dev, [(2, 5, 17), (1, 5, 10)], rtol=1e-5)


@pytest.mark.parametrize("storage_order", [0, 1])
@pytest.mark.parametrize("attrs", [
    dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
    dict(kernel_shape=[2, 3], strides=[2, 2], ceil_mode=1, dilations=[1, 2]),
])
def test_max_pool_indices(attrs, storage_order, tmp_path, kiln_dev):
    attrs = dict(attrs, storage_order=storage_order)
    _check(_pool_model("MaxPool", attrs, 4, True, indices=True), tmp_path, kiln_dev,
           [(2, 3, 7, 8), (1, 3, 6, 9)])


def test_max_pool_indices_1d(tmp_path, kiln_dev):
    attrs = dict(kernel_shape=[3], strides=[2], pads=[1, 1])
    _check(_pool_model("MaxPool", attrs, 3, True, indices=True), tmp_path, kiln_dev, [(2, 3, 9), (3, 2, 6)])


def test_max_pool_ties_take_the_first(tmp_path, kiln_dev):
    # Integer-valued inputs make ties in most windows: the first maximum's index wins.
    path = _save(_pool_model("MaxPool", dict(kernel_shape=[3, 3], strides=[1, 1]), 4, True, indices=True),
                 tmp_path)
    x = np.random.default_rng(3).integers(0, 3, (1, 2, 6, 6)).astype(np.float32)
    run = tu.run_fully_on_kiln(path, kiln_dev, feeds_seq=[{"x": x}], options=CLAIM_ALL)
    names, want = tu.run_cpu(path, {"x": x})
    for w, a in zip(want, run.all_outputs[0]):
        np.testing.assert_array_equal(a, w)


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
@pytest.mark.parametrize("rank", [3, 4])
def test_global_pools(op, rank, tmp_path, kiln_dev):
    dims = ["n", "c", "h", "w"] if rank == 4 else ["n", "c", "l"]
    x = h.make_tensor_value_info("x", T.FLOAT, dims)
    m = _model([h.make_node(op, ["x"], ["y"])], [x], [h.make_tensor_value_info("y", T.FLOAT, None)])
    shapes = [(2, 16, 7, 7), (1, 16, 12, 5)] if rank == 4 else [(2, 16, 9), (1, 16, 4)]
    _check(m, tmp_path, kiln_dev, shapes, rtol=1e-5)


@pytest.mark.parametrize("op,attrs", [
    ("DepthToSpace", dict(blocksize=2, mode="DCR")),
    ("DepthToSpace", dict(blocksize=2, mode="CRD")),
    ("DepthToSpace", dict(blocksize=3)),
])
def test_depth_to_space(op, attrs, tmp_path, kiln_dev):
    x = h.make_tensor_value_info("x", T.FLOAT, ["n", 36, "h", "w"])
    m = _model([h.make_node(op, ["x"], ["y"], **attrs)], [x], [h.make_tensor_value_info("y", T.FLOAT, None)])
    _check(m, tmp_path, kiln_dev, [(1, 36, 5, 4), (2, 36, 12, 7)])


@pytest.mark.parametrize("blocksize", [2, 3])
def test_space_to_depth(blocksize, tmp_path, kiln_dev):
    # H and W must be multiples of the block. Symbolic ones are checked at kiln's second family
    # of probe sizes (multiples of 32): a block of 2 divides them and is claimed, 3 does not.
    x = h.make_tensor_value_info("x", T.FLOAT, ["n", 5, 12, 6])
    m = _model([h.make_node("SpaceToDepth", ["x"], ["y"], blocksize=blocksize)], [x],
               [h.make_tensor_value_info("y", T.FLOAT, None)])
    _check(m, tmp_path, kiln_dev, [(1, 5, 12, 6), (3, 5, 12, 6)])
    x = h.make_tensor_value_info("x", T.FLOAT, ["n", 5, "h", "w"])
    m = _model([h.make_node("SpaceToDepth", ["x"], ["y"], blocksize=blocksize)], [x],
               [h.make_tensor_value_info("y", T.FLOAT, None)])
    if blocksize == 2:
        _check(m, tmp_path, kiln_dev, [(1, 5, 12, 6), (2, 5, 8, 4)])
    else:
        assert _claimed(m, tmp_path, kiln_dev, "s2d_symbolic") == []


def _claimed(m, tmp_path, kiln_dev, name):
    path = _save(m, tmp_path, name)
    run = tu.run_kiln(path, kiln_dev, None, options=CLAIM_ALL)
    return [op for _, op in run.nodes_on(kiln.EP_NAME)]


def test_unsupported_pools_stay_on_ort(tmp_path, kiln_dev):
    # 3-D pools are left to ORT.
    x3 = h.make_tensor_value_info("x", T.FLOAT, [1, 2, 4, 4, 4])
    m = _model([h.make_node("MaxPool", ["x"], ["y"], kernel_shape=[2, 2, 2])], [x3],
               [h.make_tensor_value_info("y", T.FLOAT, None)])
    assert _claimed(m, tmp_path, kiln_dev, "pool3d") == []
    # Pads as large as the kernel: kiln leaves the node, and ORT's own kernel refuses it
    # (had kiln claimed it, the session would have been created).
    x = h.make_tensor_value_info("x", T.FLOAT, [1, 2, 6, 6])
    m = _model([h.make_node("AveragePool", ["x"], ["a"], kernel_shape=[2, 2], pads=[2, 0, 0, 0])], [x],
               [h.make_tensor_value_info("a", T.FLOAT, None)])
    err = tu.session_error(_save(m, tmp_path, "bigpad"), kiln_dev, options=CLAIM_ALL)
    assert err is not None and "Pad should be smaller than kernel" in err.message, err


def test_pools_in_a_small_cnn_epcontext_round_trip(tmp_path, kiln_dev):
    # MaxPool with indices, AveragePool, DepthToSpace and GlobalAveragePool in one
    # compiled model, served at two image sizes from one _ctx.onnx.
    nodes = [
        h.make_node("MaxPool", ["x"], ["m", "mi"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
        h.make_node("AveragePool", ["m"], ["a"], kernel_shape=[2, 2], ceil_mode=1, strides=[2, 2]),
        h.make_node("DepthToSpace", ["m"], ["d"], blocksize=2, mode="CRD"),
        h.make_node("GlobalAveragePool", ["d"], ["g"]),
    ]
    x = h.make_tensor_value_info("x", T.FLOAT, ["n", 8, "h", "w"])
    outs = [h.make_tensor_value_info(n, T.FLOAT, None) for n in ("a", "g")]
    outs.append(h.make_tensor_value_info("mi", T.INT64, None))
    src = _save(_model(nodes, [x], outs), tmp_path, "pools")
    ctx = os.path.join(str(tmp_path), "pools_ctx.onnx")
    tu.compile_model(src, kiln_dev, embed=False, output=ctx, options=CLAIM_ALL)
    assert os.path.exists(os.path.join(str(tmp_path), "pools_kiln.bin"))
    assert {n.op_type for n in onnx.load(ctx).graph.node} == {"EPContext"}
    feeds = [{"x": _rand(s, i)} for i, s in enumerate([(1, 8, 12, 16), (2, 8, 20, 8)])]
    run = tu.run_fully_on_kiln(ctx, kiln_dev, feeds_seq=feeds, options=CLAIM_ALL)
    for f, outs in zip(feeds, run.all_outputs):
        names, want = tu.run_cpu(src, f)
        for name, w, a in zip(names, want, outs):
            assert a.shape == w.shape, name
            np.testing.assert_allclose(a, w, rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("attrs", [
    dict(kernel_shape=[2, 2], strides=[2, 2]),
    dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
    dict(kernel_shape=[2, 2], dilations=[1, 2]),
])
def test_max_pool_nans_as_the_indices_path(attrs, tmp_path, kiln_dev):
    # With Indices, ORT's loop starts the maximum at a window's first tap and
    # then takes `x > max`: a NaN wins only as the first tap. (Without Indices,
    # ORT's MLAS path treats NaNs its own way, differently per window shape.)
    path = _save(_pool_model("MaxPool", attrs, 4, True, indices=True), tmp_path)
    x = _rand((1, 3, 6, 6), 5)
    x[0, 0, :2, :2] = np.nan
    x[0, 1, ::3, ::2] = np.nan
    run = tu.run_fully_on_kiln(path, kiln_dev, feeds_seq=[{"x": x}], options=CLAIM_ALL)
    names, want = tu.run_cpu(path, {"x": x})
    got = run.all_outputs[0]
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
@pytest.mark.parametrize("ceil_mode", [0, 1])
def test_window_longer_than_the_input_as_ort(op, ceil_mode, tmp_path, kiln_dev):
    """A window longer than the (padded) input, as PP-OCRv4 rec's neck pool (kernel 3, stride 3)
    meets at image height 32: ORT's output length truncates toward zero — one window over what
    there is when the overhang is under a stride (heights 1 and 2), an empty output when it is
    one stride (height 2 with stride 1) — and kiln gives the same shapes and values from one
    session."""
    attrs = dict(kernel_shape=[3, 2], strides=[3, 2], ceil_mode=ceil_mode)
    _check(_pool_model(op, attrs, 4, True), tmp_path, kiln_dev, [(1, 8, 2, 6), (2, 4, 1, 5), (1, 8, 3, 6)])
    attrs = dict(kernel_shape=[3, 1], strides=[1, 1], ceil_mode=ceil_mode)
    _check(_pool_model(op, attrs, 4, True), tmp_path, kiln_dev, [(1, 8, 2, 6), (1, 8, 3, 6)])
