"""Resize (opsets 10, 11, 13, 18, 19) and Upsample (7, 9) of issue #13.

kiln resizes H and W channels-last. Every model runs on kiln with the EP
option ``claim=all`` and CPU fallback disabled (every node really ran on
kiln) and is compared with ORT's CPU EP: every mode × coordinate
transformation, every nearest_mode, cubic's coefficient and
exclude_outside, scale factors integer, non-integer and below 1, sizes,
axes and keep_aspect_ratio_policy, scales and sizes computed from shape
arithmetic, symbolic N/H/W at two sizes from one session, and an EPContext
round trip. What kiln leaves to ORT (tf_crop_and_resize, antialias,
resizing N or C) is checked to stay there.
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
COORDS = ["half_pixel", "half_pixel_symmetric", "pytorch_half_pixel", "align_corners", "asymmetric"]


def _model(nodes, inputs, outputs, inits=(), opset=19):
    g = h.make_graph(nodes, "g", inputs, outputs, list(inits))
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)], ir_version=9)


def _save(m, tmp_path, name="m"):
    path = os.path.join(str(tmp_path), f"{name}.onnx")
    onnx.save(m, path)
    return path


def _init(name, arr):
    return onnx.numpy_helper.from_array(np.asarray(arr), name)


def _rand(shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _check(m, tmp_path, kiln_dev, shapes, rtol=1e-5, atol=1e-5):
    path = _save(m, tmp_path)
    feeds = [{"x": _rand(s, i)} for i, s in enumerate(shapes)]
    run = tu.run_fully_on_kiln(path, kiln_dev, feeds_seq=feeds, options=CLAIM_ALL)
    for f, outs in zip(feeds, run.all_outputs):
        names, want = tu.run_cpu(path, f)
        for name, w, a in zip(names, want, outs):
            assert a.shape == w.shape, (name, a.shape, w.shape)
            np.testing.assert_allclose(a, w, rtol=rtol, atol=atol, err_msg=name)
    return run


def _resize(attrs, scales=None, sizes=None, dims=("n", "c", "h", "w"), opset=19):
    x = h.make_tensor_value_info("x", T.FLOAT, list(dims))
    inits = [_init("roi", np.zeros(0, np.float32))]
    inputs = ["x", "roi", "", ""]
    if scales is not None:
        inits.append(_init("scales", np.array(scales, np.float32)))
        inputs[2] = "scales"
    if sizes is not None:
        inits.append(_init("sizes", np.array(sizes, np.int64)))
        inputs[3] = "sizes"
    inputs = inputs[: 3 if sizes is None else 4]
    node = h.make_node("Resize", inputs, ["y"], **attrs)
    return _model([node], [x], [h.make_tensor_value_info("y", T.FLOAT, None)], inits, opset)


SCALES = [[1, 1, 2, 2], [1, 1, 1.5, 0.75], [1, 1, 0.5, 0.4], [1, 1, 3, 1.25]]
SHAPES = [(1, 3, 7, 10), (2, 3, 8, 5)]


@pytest.mark.parametrize("scales", SCALES)
@pytest.mark.parametrize("coord", COORDS)
@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_modes_and_coordinates(mode, coord, scales, tmp_path, kiln_dev):
    _check(_resize(dict(mode=mode, coordinate_transformation_mode=coord), scales), tmp_path, kiln_dev, SHAPES)


@pytest.mark.parametrize("scales", SCALES)
@pytest.mark.parametrize("nearest_mode", ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"])
@pytest.mark.parametrize("coord", COORDS + ["tf_half_pixel_for_nn"])
def test_nearest_modes(coord, nearest_mode, scales, tmp_path, kiln_dev):
    attrs = dict(mode="nearest", coordinate_transformation_mode=coord, nearest_mode=nearest_mode)
    _check(_resize(attrs, scales, opset=11 if coord == "tf_half_pixel_for_nn" else 19), tmp_path, kiln_dev,
           SHAPES)


@pytest.mark.parametrize("a,exclude", [(-0.5, 0), (-0.75, 1), (-0.5, 1)])
@pytest.mark.parametrize("coord", ["half_pixel", "align_corners", "asymmetric"])
def test_cubic_coefficients(a, exclude, coord, tmp_path, kiln_dev):
    attrs = dict(mode="cubic", cubic_coeff_a=a, exclude_outside=exclude, coordinate_transformation_mode=coord)
    _check(_resize(attrs, [1, 1, 1.7, 0.6]), tmp_path, kiln_dev, SHAPES)


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("sizes", [[2, 3, 9, 14], [2, 3, 4, 3]])
def test_sizes(mode, sizes, tmp_path, kiln_dev):
    m = _resize(dict(mode=mode), sizes=sizes, dims=(2, 3, "h", "w"))
    _check(m, tmp_path, kiln_dev, [(2, 3, 6, 7), (2, 3, 11, 5)])


def test_sizes_fix_a_symbolic_batch(tmp_path, kiln_dev):
    # Constant sizes name N and C: a symbolic N is only valid at sizes[0], and
    # kiln claims the node (ORT would refuse any other N at run time).
    _check(_resize(dict(mode="linear"), sizes=[1, 3, 9, 14]), tmp_path, kiln_dev, [(1, 3, 6, 7), (1, 3, 11, 5)])


@pytest.mark.parametrize("policy", ["stretch", "not_larger", "not_smaller"])
def test_axes_and_aspect_ratio(policy, tmp_path, kiln_dev):
    attrs = dict(mode="linear", axes=[2, 3], keep_aspect_ratio_policy=policy)
    _check(_resize(attrs, sizes=[12, 9]), tmp_path, kiln_dev, [(1, 3, 6, 7), (2, 3, 11, 5)])
    attrs = dict(mode="nearest", axes=[-1, -2])
    _check(_resize(attrs, scales=[2.5, 0.5]), tmp_path, kiln_dev, [(1, 3, 6, 7)])


@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_1d(mode, tmp_path, kiln_dev):
    _check(_resize(dict(mode=mode), [1, 1, 2.5], dims=("n", "c", "l")), tmp_path, kiln_dev,
           [(2, 3, 7), (1, 3, 12)])


@pytest.mark.parametrize("opset,mode", [(10, "nearest"), (10, "linear"), (13, "linear"), (18, "cubic")])
def test_opsets(opset, mode, tmp_path, kiln_dev):
    x = h.make_tensor_value_info("x", T.FLOAT, ["n", "c", "h", "w"])
    scales = _init("scales", np.array([1, 1, 2.5, 0.6], np.float32))
    inputs = ["x", "scales"] if opset == 10 else ["x", "", "scales"]
    m = _model([h.make_node("Resize", inputs, ["y"], mode=mode)], [x],
               [h.make_tensor_value_info("y", T.FLOAT, None)], [scales], opset)
    _check(m, tmp_path, kiln_dev, SHAPES)


@pytest.mark.parametrize("opset", [7, 9])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
def test_upsample(opset, mode, tmp_path, kiln_dev):
    x = h.make_tensor_value_info("x", T.FLOAT, ["n", "c", "h", "w"])
    scales = [1.0, 1.0, 2.0, 1.5]
    if opset == 7:
        node, inits = h.make_node("Upsample", ["x"], ["y"], mode=mode, scales=scales), []
    else:
        node, inits = h.make_node("Upsample", ["x", "s"], ["y"], mode=mode), [_init("s", np.array(scales, np.float32))]
    m = _model([node], [x], [h.make_tensor_value_info("y", T.FLOAT, None)], inits, opset)
    _check(m, tmp_path, kiln_dev, SHAPES)


def test_scales_from_shape_arithmetic(tmp_path, kiln_dev):
    # FPN-style: x resized to the H and W of a second input, the sizes computed
    # with Shape -> Slice -> Concat, and scales computed as Cast(Shape)·2 / Shape.
    nodes = [
        h.make_node("Shape", ["x"], ["sx"]),
        h.make_node("Shape", ["z"], ["sz"]),
        h.make_node("Slice", ["sx", "zero", "two"], ["nc"]),
        h.make_node("Slice", ["sz", "two", "four"], ["hw"]),
        h.make_node("Concat", ["nc", "hw"], ["sizes"], axis=0),
        h.make_node("Resize", ["x", "", "", "sizes"], ["y"], mode="linear"),
        h.make_node("Cast", ["sx"], ["fx"], to=T.FLOAT),
        h.make_node("Mul", ["fx", "two_f"], ["big"]),
        h.make_node("Div", ["big", "fx"], ["sc"]),
        h.make_node("Mul", ["sc", "mask"], ["sm"]),
        h.make_node("Add", ["sm", "ones"], ["scales"]),
        h.make_node("Resize", ["x", "", "scales"], ["u"], mode="nearest"),
    ]
    inits = [_init("zero", np.array([0])), _init("two", np.array([2])), _init("four", np.array([4])),
             _init("two_f", np.float32(2)), _init("mask", np.array([0, 0, 1, 1], np.float32)),
             _init("ones", np.array([1, 1, 0, 0], np.float32))]
    x = h.make_tensor_value_info("x", T.FLOAT, ["n", "c", "h", "w"])
    z = h.make_tensor_value_info("z", T.FLOAT, ["n", 1, "h2", "w2"])
    m = _model(nodes, [x, z], [h.make_tensor_value_info(n, T.FLOAT, None) for n in "yu"], inits)
    path = _save(m, tmp_path, "shape_arith")
    feeds = [{"x": _rand((1, 4, 5, 6), 0), "z": _rand((1, 1, 11, 13), 1)},
             {"x": _rand((2, 4, 9, 4), 2), "z": _rand((2, 1, 7, 8), 3)}]
    run = tu.run_fully_on_kiln(path, kiln_dev, feeds_seq=feeds, options=CLAIM_ALL)
    for f, outs in zip(feeds, run.all_outputs):
        names, want = tu.run_cpu(path, f)
        for name, w, a in zip(names, want, outs):
            assert a.shape == w.shape, name
            np.testing.assert_allclose(a, w, rtol=1e-5, atol=1e-5, err_msg=name)


def _claimed(m, tmp_path, kiln_dev, name):
    run = tu.run_kiln(_save(m, tmp_path, name), kiln_dev, None, options=CLAIM_ALL)
    return [op for _, op in run.nodes_on(kiln.EP_NAME)]


@pytest.mark.parametrize("attrs,scales", [
    (dict(mode="linear", coordinate_transformation_mode="tf_crop_and_resize"), [1, 1, 2, 2]),
    (dict(mode="linear", antialias=1), [1, 1, 0.5, 0.5]),
    (dict(mode="nearest"), [1, 2, 2, 2]),
])
def test_left_to_ort(attrs, scales, tmp_path, kiln_dev):
    m = _resize(attrs, scales)
    if attrs.get("coordinate_transformation_mode") == "tf_crop_and_resize":
        m.graph.initializer[0].CopyFrom(_init("roi", np.array([0, 0, 0.1, 0.2, 1, 1, 0.9, 0.7], np.float32)))
    assert _claimed(m, tmp_path, kiln_dev, "left") == []


def test_epcontext_round_trip(tmp_path, kiln_dev):
    # YOLOv8-style upsampling and a PP-OCR-style downscale in one compiled model,
    # served at two image sizes from one _ctx.onnx.
    nodes = [
        h.make_node("Resize", ["x", "", "up"], ["a"], mode="nearest"),
        h.make_node("Resize", ["a", "", "down"], ["b"], mode="linear"),
        h.make_node("Resize", ["b", "", "up"], ["y"], mode="cubic", coordinate_transformation_mode="align_corners"),
    ]
    inits = [_init("up", np.array([1, 1, 2, 2], np.float32)), _init("down", np.array([1, 1, 0.3, 0.7], np.float32))]
    x = h.make_tensor_value_info("x", T.FLOAT, ["n", 8, "h", "w"])
    src = _save(_model(nodes, [x], [h.make_tensor_value_info("y", T.FLOAT, None)], inits), tmp_path, "resize")
    ctx = os.path.join(str(tmp_path), "resize_ctx.onnx")
    tu.compile_model(src, kiln_dev, embed=False, output=ctx, options=CLAIM_ALL)
    assert os.path.exists(os.path.join(str(tmp_path), "resize_kiln.bin"))
    assert {n.op_type for n in onnx.load(ctx).graph.node} == {"EPContext"}
    feeds = [{"x": _rand(s, i)} for i, s in enumerate([(1, 8, 10, 16), (2, 8, 21, 9)])]
    run = tu.run_fully_on_kiln(ctx, kiln_dev, feeds_seq=feeds, options=CLAIM_ALL)
    for f, outs in zip(feeds, run.all_outputs):
        names, want = tu.run_cpu(src, f)
        for name, w, a in zip(names, want, outs):
            assert a.shape == w.shape, name
            np.testing.assert_allclose(a, w, rtol=1e-5, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("nearest_mode", ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"])
@pytest.mark.parametrize("length,scale", [(10, 0.75), (10, 1.25), (7, 1.5), (13, 0.6), (12, 2.2), (17, 1.3)])
def test_half_pixel_symmetric_near_ties(length, scale, nearest_mode, tmp_path, kiln_dev):
    # Source coordinates within an f32 rounding of an integer or a half: the
    # index picked shows where the arithmetic rounds (ORT mixes f32 and double).
    attrs = dict(mode="nearest", coordinate_transformation_mode="half_pixel_symmetric", nearest_mode=nearest_mode)
    m = _resize(attrs, [1, 1, scale, scale], dims=(1, 1, length, length))
    path = _save(m, tmp_path)
    x = np.arange(length * length, dtype=np.float32).reshape(1, 1, length, length)
    run = tu.run_fully_on_kiln(path, kiln_dev, feeds_seq=[{"x": x}], options=CLAIM_ALL)
    np.testing.assert_array_equal(run.all_outputs[0][0], tu.run_cpu(path, {"x": x})[1][0])
