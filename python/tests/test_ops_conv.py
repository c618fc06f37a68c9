"""Conv (issue #13): 1-D and 2-D, groups (depthwise, channel multiplier),
strides, dilations, explicit and automatic pads, bias, 1x1.

Every model runs on kiln with ``claim=all`` and CPU fallback disabled (so
kiln ran every node) and is compared with ORT's CPU EP. Also: symbolic
N/H/W at two sizes from one session, weights that are not constants left to
ORT with a reason, the fused epilogue (per-channel scale/shift, activation,
residual) at ORT_DISABLE_ALL where those ops reach kiln separately, and an
EPContext round trip (static steps and the shape-generic graph).
"""
from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import kiln_testutil as tu

CLAIM_ALL = {"claim": "all"}
RTOL = ATOL = 1e-4


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = h.make_graph(nodes, "g", inputs, outputs, list(inits))
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)], ir_version=8)


def _save(m, tmp_path, name="conv"):
    path = os.path.join(str(tmp_path), f"{name}.onnx")
    onnx.save(m, path)
    return path


def _rand(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _conv_model(x_dims, w_shape, bias=True, **attrs):
    """x -> Conv(W, B) -> y with random constant weights."""
    co = w_shape[0]
    inits = [onnx.numpy_helper.from_array(_rand(w_shape, 1), "w")]
    ins = ["x", "w"]
    if bias:
        inits.append(onnx.numpy_helper.from_array(_rand((co,), 2), "b"))
        ins.append("b")
    node = h.make_node("Conv", ins, ["y"], **attrs)
    return _model([node], [h.make_tensor_value_info("x", T.FLOAT, x_dims)],
                  [h.make_tensor_value_info("y", T.FLOAT, None)], inits)


def _check(m, tmp_path, kiln_dev, shapes, opt_level=None):
    """Runs x of each shape in one kiln session (whole model on kiln), compares with the CPU EP."""
    path = _save(m, tmp_path)
    feeds = [{"x": _rand(s, 10 + i)} for i, s in enumerate(shapes)]
    run = tu.run_fully_on_kiln(path, kiln_dev, feeds_seq=feeds, options=CLAIM_ALL, opt_level=opt_level)
    for f, outs in zip(feeds, run.all_outputs):
        names, want = tu.run_cpu(path, f, opt_level=opt_level)
        for name, w, a in zip(names, want, outs):
            assert a.shape == w.shape, (name, a.shape, w.shape)
            np.testing.assert_allclose(a, w, rtol=RTOL, atol=ATOL, err_msg=name)
    return run


# (input NCHW, weights, attributes)
CASES_2D = {
    "3x3_pad1": ((2, 8, 9, 11), (16, 8, 3, 3), dict(pads=[1, 1, 1, 1])),
    "3x3_valid": ((1, 3, 10, 7), (5, 3, 3, 3), {}),
    "1x1": ((2, 24, 7, 5), (40, 24, 1, 1), {}),
    "1x1_stride2": ((1, 16, 9, 9), (8, 16, 1, 1), dict(strides=[2, 2])),
    "1x1_groups": ((1, 12, 5, 6), (9, 12 // 3, 1, 1), dict(group=3)),
    "stride2_pad": ((1, 4, 13, 12), (6, 4, 3, 3), dict(strides=[2, 2], pads=[1, 1, 1, 1])),
    "7x7_stride2": ((1, 3, 32, 30), (8, 3, 7, 7), dict(strides=[2, 2], pads=[3, 3, 3, 3])),
    "dilation2": ((1, 5, 14, 12), (7, 5, 3, 3), dict(dilations=[2, 2], pads=[2, 2, 2, 2])),
    "dilation_rect": ((1, 4, 11, 13), (3, 4, 2, 3), dict(dilations=[3, 1])),
    "asym_pads": ((1, 6, 8, 9), (4, 6, 3, 2), dict(pads=[0, 1, 2, 0])),
    "big_pads": ((1, 2, 4, 4), (3, 2, 3, 3), dict(pads=[3, 2, 3, 4])),
    "same_upper": ((1, 5, 9, 10), (6, 5, 3, 3), dict(auto_pad="SAME_UPPER", strides=[2, 2])),
    "same_lower": ((1, 5, 9, 10), (6, 5, 4, 4), dict(auto_pad="SAME_LOWER", strides=[2, 3])),
    "valid_stride": ((1, 5, 10, 9), (6, 5, 3, 3), dict(auto_pad="VALID", strides=[2, 2])),
    "kernel_shape_attr": ((1, 3, 6, 6), (4, 3, 3, 3), dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1])),
    "groups2": ((2, 8, 7, 6), (10, 4, 3, 3), dict(group=2, pads=[1, 1, 1, 1])),
    "groups4_dilated": ((1, 16, 11, 10), (8, 4, 3, 3), dict(group=4, dilations=[2, 2], pads=[2, 1, 2, 1])),
    "depthwise": ((2, 12, 10, 9), (12, 1, 3, 3), dict(group=12, pads=[1, 1, 1, 1])),
    "depthwise_stride2": ((1, 20, 11, 11), (20, 1, 5, 5), dict(group=20, strides=[2, 2], pads=[2, 2, 2, 2])),
    "depthwise_dilated": ((1, 8, 12, 12), (8, 1, 3, 3), dict(group=8, dilations=[2, 2], pads=[2, 1, 2, 3])),
    "channel_multiplier": ((1, 6, 8, 7), (12, 1, 3, 3), dict(group=6, pads=[1, 0, 1, 2])),
    "large_k": ((1, 64, 9, 9), (32, 64, 3, 3), dict(pads=[1, 1, 1, 1])),
}


@pytest.mark.parametrize("case", sorted(CASES_2D))
def test_conv2d(case, tmp_path, kiln_dev):
    x, w, attrs = CASES_2D[case]
    _check(_conv_model(list(x), w, **attrs), tmp_path, kiln_dev, [x])


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_conv2d_bias_or_not(bias, tmp_path, kiln_dev):
    _check(_conv_model([1, 4, 6, 7], (5, 4, 3, 3), bias=bias, pads=[1, 1, 1, 1]), tmp_path, kiln_dev,
           [(1, 4, 6, 7)])


CASES_1D = {
    "k3": ((2, 6, 17), (8, 6, 3), dict(pads=[1, 1])),
    "stride2_dil": ((1, 4, 20), (5, 4, 3), dict(strides=[2], dilations=[2], pads=[0, 3])),
    "same_lower": ((1, 3, 11), (4, 3, 4), dict(auto_pad="SAME_LOWER", strides=[2])),
    "depthwise": ((1, 10, 15), (10, 1, 5), dict(group=10, pads=[2, 2])),
    "pointwise": ((2, 7, 9), (3, 7, 1), {}),
    "groups": ((1, 6, 12), (9, 2, 3), dict(group=3)),
}


@pytest.mark.parametrize("case", sorted(CASES_1D))
def test_conv1d(case, tmp_path, kiln_dev):
    x, w, attrs = CASES_1D[case]
    _check(_conv_model(list(x), w, **attrs), tmp_path, kiln_dev, [x])


@pytest.mark.parametrize("case", ["3x3_pad1", "same_upper", "depthwise", "1x1", "groups2"])
def test_symbolic_sizes_one_session(case, tmp_path, kiln_dev):
    """N, H, W symbolic: one session serves two sizes (the shape-generic plan)."""
    x, w, attrs = CASES_2D[case]
    m = _conv_model(["n", x[1], "h", "w"], w, **attrs)
    shapes = [x, (x[0] + 1, x[1], x[2] + 3, x[3] + 2)]
    _check(m, tmp_path, kiln_dev, shapes)


def test_symbolic_1d(tmp_path, kiln_dev):
    x, w, attrs = CASES_1D["stride2_dil"]
    _check(_conv_model(["n", x[1], "l"], w, **attrs), tmp_path, kiln_dev, [x, (3, x[1], 33)])


def test_weights_not_constant_left_to_ort(tmp_path, kiln_dev):
    """Weights from a graph input: kiln cannot pack them, so ORT runs the Conv."""
    node = h.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])
    m = _model([node], [h.make_tensor_value_info("x", T.FLOAT, [1, 3, 5, 5]),
                        h.make_tensor_value_info("w", T.FLOAT, [4, 3, 3, 3])],
               [h.make_tensor_value_info("y", T.FLOAT, None)])
    path = _save(m, tmp_path)
    feeds = {"x": _rand((1, 3, 5, 5), 3), "w": _rand((4, 3, 3, 3), 4)}
    run = tu.run_kiln(path, kiln_dev, feeds, options=CLAIM_ALL)
    assert "Conv" not in [op for _, op in run.nodes_on(tu.kiln.EP_NAME)]
    _, want = tu.run_cpu(path, feeds)
    np.testing.assert_allclose(run.outputs[0], want[0], rtol=RTOL, atol=ATOL)


def _fusion_model(scale_shift: bool, act: str, residual: bool, depthwise: bool = False, after: str = "none",
                  stem: bool = False):
    """x -> [1x1 Conv stem] -> Conv -> [Mul c, Add d] -> [act] -> [+ x or the stem] -> [after]; c, d
    per-channel [C, 1, 1]. With the stem, the skip connection is channels-last inside kiln, as
    between a real network's blocks (a residual from the graph input is added in ONNX's layout)."""
    c = 8
    w = (c, 1, 3, 3) if depthwise else (c, c, 3, 3)
    inits = [onnx.numpy_helper.from_array(_rand(w, 1), "w"),
             onnx.numpy_helper.from_array(_rand((c,), 2), "b"),
             onnx.numpy_helper.from_array(np.abs(_rand((c, 1, 1), 3)) + 0.5, "s"),
             onnx.numpy_helper.from_array(_rand((c, 1, 1), 4), "d")]
    nodes = []
    if stem:
        inits.append(onnx.numpy_helper.from_array(_rand((c, c, 1, 1), 5), "w0"))
        nodes.append(h.make_node("Conv", ["x", "w0"], ["x0"]))
    skip = "x0" if stem else "x"
    nodes.append(h.make_node("Conv", [skip, "w", "b"], ["t0"], pads=[1, 1, 1, 1], group=c if depthwise else 1))
    last = "t0"

    def add(op, ins, **kw):
        nonlocal last
        out = f"t{len(nodes)}"
        nodes.append(h.make_node(op, ins, [out], **kw))
        last = out

    def activation(act):
        if act == "relu":
            add("Relu", [last])
        elif act == "clip":
            if "lo" not in [i.name for i in inits]:
                inits.extend([onnx.numpy_helper.from_array(np.float32(0.0), "lo"),
                              onnx.numpy_helper.from_array(np.float32(6.0), "hi")])
            add("Clip", [last, "lo", "hi"])
        elif act == "sigmoid":
            add("Sigmoid", [last])
        elif act == "leaky":
            add("LeakyRelu", [last], alpha=0.1)
        elif act == "silu":
            x = last
            add("Sigmoid", [x])
            add("Mul", [x, last])
        elif act == "hardswish":
            add("HardSwish", [last])

    if scale_shift:
        add("Mul", [last, "s"])
        add("Add", [last, "d"])
    activation(act)
    if residual:
        add("Add", [skip, last])
    activation(after)
    nodes[-1].output[0] = "y"
    return _model(nodes, [h.make_tensor_value_info("x", T.FLOAT, [1, c, 9, 10])],
                  [h.make_tensor_value_info("y", T.FLOAT, None)], inits)


FUSIONS = [(False, "none", False), (True, "none", False), (False, "relu", False), (True, "relu", True),
           (False, "none", True), (True, "clip", False), (False, "sigmoid", True), (True, "leaky", True),
           (False, "silu", True), (True, "hardswish", False), (False, "hardswish", True)]


@pytest.mark.parametrize("depthwise", [False, True], ids=["dense", "depthwise"])
@pytest.mark.parametrize("scale_shift,act,residual", FUSIONS)
@pytest.mark.parametrize("level", ["disable_all", "enable_all"])
def test_epilogue_patterns(scale_shift, act, residual, depthwise, level, tmp_path, kiln_dev):
    """Conv followed by a per-channel scale/shift, an activation and a residual
    add, each with and without the pattern: the numbers match the CPU EP both
    when ORT hands kiln the ops separately (ORT_DISABLE_ALL) and after ORT's
    own fusions (ORT_ENABLE_ALL)."""
    lv = {"disable_all": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
          "enable_all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}[level]
    m = _fusion_model(scale_shift, act, residual, depthwise)
    _check(m, tmp_path, kiln_dev, [(1, 8, 9, 10)], opt_level=lv)


# ResNet's block end: the activation after the residual Add.
AFTER_RESIDUAL = [(True, "none", "relu", "Conv+Bias+Residual+Relu"),
                  (False, "relu", "clip", "Conv+Bias+Relu+Residual+Clip"),
                  (True, "none", "sigmoid", "Conv+Bias+Residual+Sigmoid")]


@pytest.mark.parametrize("depthwise", [False, True], ids=["dense", "depthwise"])
@pytest.mark.parametrize("scale_shift,act,after,fused", AFTER_RESIDUAL)
def test_activation_after_the_residual(scale_shift, act, after, fused, depthwise, tmp_path, kiln_dev):
    """An activation after the residual Add fuses into the convolution (the
    compiled notes name it) and the numbers match the CPU EP, at two image
    sizes from one session and after an EPContext round trip."""
    m = _fusion_model(scale_shift, act, True, depthwise, after=after, stem=True)
    m.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "n"
    m.graph.input[0].type.tensor_type.shape.dim[2].dim_param = "h"
    m.graph.input[0].type.tensor_type.shape.dim[3].dim_param = "w"
    _check(m, tmp_path, kiln_dev, [(1, 8, 9, 10), (2, 8, 12, 7)],
           opt_level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    static = _fusion_model(scale_shift, act, True, depthwise, after=after, stem=True)
    path = _save(static, tmp_path, "static")
    data = tu.compile_model(path, kiln_dev, embed=True, to="bytes", options=CLAIM_ALL)
    notes = " | ".join(tu.notes_of(data))
    assert fused in notes and "Add" not in notes.replace(fused, ""), notes
    ctx = os.path.join(str(tmp_path), "after_ctx.onnx")
    with open(ctx, "wb") as f:
        f.write(data)
    feeds = {"x": _rand((1, 8, 9, 10), 5)}
    run = tu.run_fully_on_kiln(ctx, kiln_dev, feeds, options=CLAIM_ALL)
    _, want = tu.run_cpu(path, feeds)
    np.testing.assert_allclose(run.outputs[0], want[0], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("symbolic", [True, False], ids=["symbolic", "static"])
def test_compiled_model_round_trip(symbolic, tmp_path, kiln_dev):
    """A Conv stack (dense 3x3, depthwise, 1x1, grouped, 1-D is separate)
    compiles to an EPContext model that loads and runs the same: static
    shapes store the conv steps with their packed weights, symbolic ones the
    shape-generic graph with the weights packed once."""
    c = 8
    inits = [onnx.numpy_helper.from_array(_rand((c, 3, 3, 3), 1), "w1"),
             onnx.numpy_helper.from_array(_rand((c,), 2), "b1"),
             onnx.numpy_helper.from_array(_rand((c, 1, 3, 3), 3), "w2"),
             onnx.numpy_helper.from_array(_rand((16, c, 1, 1), 4), "w3"),
             onnx.numpy_helper.from_array(_rand((16, 4, 3, 3), 5), "w4")]
    nodes = [h.make_node("Conv", ["x", "w1", "b1"], ["a"], pads=[1, 1, 1, 1], strides=[2, 2]),
             h.make_node("Relu", ["a"], ["ar"]),
             h.make_node("Conv", ["ar", "w2"], ["d"], group=c, auto_pad="SAME_UPPER"),
             h.make_node("Conv", ["d", "w3"], ["p"]),
             h.make_node("Conv", ["p", "w4"], ["y"], group=4, pads=[1, 1, 1, 1])]
    dims = ["n", 3, "h", "w"] if symbolic else [1, 3, 15, 14]
    m = _model(nodes, [h.make_tensor_value_info("x", T.FLOAT, dims)],
               [h.make_tensor_value_info("y", T.FLOAT, None)], inits)
    src = _save(m, tmp_path, "convs")
    ctx = os.path.join(str(tmp_path), "convs_ctx.onnx")
    tu.compile_model(src, kiln_dev, embed=False, output=ctx, options=CLAIM_ALL)
    assert os.path.exists(os.path.join(str(tmp_path), "convs_kiln.bin"))
    assert {n.op_type for n in onnx.load(ctx).graph.node} == {"EPContext"}
    shapes = [(1, 3, 15, 14)] + ([(2, 3, 20, 11)] if symbolic else [])
    feeds = [{"x": _rand(s, 7 + i)} for i, s in enumerate(shapes)]
    run = tu.run_fully_on_kiln(ctx, kiln_dev, feeds_seq=feeds, options=CLAIM_ALL)
    for f, outs in zip(feeds, run.all_outputs):
        _, want = tu.run_cpu(src, f)
        np.testing.assert_allclose(outs[0], want[0], rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("tail", ["div", "mul"])
def test_hardswish_written_with_clip_fuses(tail, tmp_path, kiln_dev):
    """PP-OCR's HardSwish, x * Clip(x + 3, 0, 6) / 6 (or * 1/6), after a convolution: one
    Conv+Bias+HardSwish in the compiled program, and the CPU EP's numbers at two image sizes."""
    c = 8
    inits = [onnx.numpy_helper.from_array(_rand((c, 3, 3, 3), 1), "w"),
             onnx.numpy_helper.from_array(_rand((c,), 2), "b"),
             onnx.numpy_helper.from_array(np.float32(3.0), "three"),
             onnx.numpy_helper.from_array(np.float32(0.0), "zero"),
             onnx.numpy_helper.from_array(np.float32(6.0), "six"),
             onnx.numpy_helper.from_array(np.float32(6.0 if tail == "div" else 1.0 / 6.0), "k")]
    nodes = [h.make_node("Conv", ["x", "w", "b"], ["v"], pads=[1, 1, 1, 1]),
             h.make_node("Add", ["v", "three"], ["p"]),
             h.make_node("Clip", ["p", "zero", "six"], ["q"]),
             h.make_node("Mul", ["v", "q"], ["r"]),
             h.make_node("Div" if tail == "div" else "Mul", ["r", "k"], ["y"])]
    m = _model(nodes, [h.make_tensor_value_info("x", T.FLOAT, ["n", 3, "h", "w"])],
               [h.make_tensor_value_info("y", T.FLOAT, None)], inits)
    _check(m, tmp_path, kiln_dev, [(1, 3, 9, 10), (2, 3, 12, 7)])
    static = _model(nodes, [h.make_tensor_value_info("x", T.FLOAT, [1, 3, 9, 10])],
                    [h.make_tensor_value_info("y", T.FLOAT, None)], inits)
    data = tu.compile_model(_save(static, tmp_path, "static"), kiln_dev, embed=True, to="bytes", options=CLAIM_ALL)
    notes = " | ".join(tu.notes_of(data))
    assert "Conv+Bias+HardSwish x1" in notes and "Clip" not in notes, notes


def _concat_model(dims):
    """SqueezeNet's fire module and more around one channel Concat: a 1x1 and a
    3x3 convolution of one squeeze and one with a residual (written in place into
    the concat, the residual read densely), and inputs that cannot be: a depthwise
    convolution, a MaxPool, and a convolution whose output is also a graph output. A second
    Concat holds only convolutions (40 channels: full and half panels). A 1x1
    convolution reads each concat, so that the concats stay in kiln's layout."""
    specs = {"sq": (6, 8, 1, 1), "e1": (5, 6, 1, 1), "e3": (40, 6, 3, 3), "dw": (6, 1, 3, 3),
             "res": (6, 6, 1, 1), "u": (4, 6, 1, 1), "f1": (16, 6, 1, 1), "f3": (24, 6, 3, 3),
             "head": (3, 67, 1, 1), "head2": (2, 40, 1, 1)}
    inits = []
    for i, (name, shape) in enumerate(specs.items()):
        inits.append(onnx.numpy_helper.from_array(_rand(shape, 20 + i), f"w_{name}"))
        inits.append(onnx.numpy_helper.from_array(_rand((shape[0],), 40 + i), f"b_{name}"))

    def conv(x, name, out, **attrs):
        return h.make_node("Conv", [x, f"w_{name}", f"b_{name}"], [out], **attrs)

    nodes = [conv("x", "sq", "sq_c"), h.make_node("Relu", ["sq_c"], ["s"]),
             conv("s", "e1", "e1_c"), h.make_node("Relu", ["e1_c"], ["e1"]),
             conv("s", "e3", "e3", pads=[1, 1, 1, 1]),
             conv("s", "dw", "dw", group=6, pads=[1, 1, 1, 1]),
             h.make_node("MaxPool", ["s"], ["mp"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             conv("s", "res", "res_c"), h.make_node("Add", ["res_c", "s"], ["res"]),
             conv("s", "u", "u"),
             h.make_node("Concat", ["e1", "e3", "dw", "mp", "res", "u"], ["cat"], axis=1),
             conv("cat", "head", "y"),
             conv("s", "f1", "f1"), conv("s", "f3", "f3", pads=[1, 1, 1, 1], strides=[1, 1]),
             h.make_node("Concat", ["f1", "f3"], ["cat2"], axis=1),
             conv("cat2", "head2", "y2")]
    return _model(nodes, [h.make_tensor_value_info("x", T.FLOAT, dims)],
                  [h.make_tensor_value_info(n, T.FLOAT, None) for n in ("y", "u", "y2")], inits)


def _in_place_notes(make, cin, sizes, seed, name, tmp_path, kiln_dev, threads, scaled_atol=None):
    """Runs `make(dims)` (input "x" of `cin` channels) on kiln at `sizes` from one
    session, and its static form at the first size after an EPContext round trip,
    every output against the CPU EP (with `scaled_atol`, atol is that share of the
    output's largest magnitude); returns the compiled partition's notes."""

    def close(a, w, **kw):
        atol = ATOL if scaled_atol is None else scaled_atol * float(np.abs(w).max())
        np.testing.assert_allclose(a, w, rtol=RTOL, atol=atol, **kw)

    path = _save(make(["n", cin, "h", "w"]), tmp_path, name)
    feeds = [{"x": _rand(s, seed + i)} for i, s in enumerate(sizes)]
    run = tu.run_fully_on_kiln(path, kiln_dev, feeds_seq=feeds, options=CLAIM_ALL, threads=threads)
    for f, outs in zip(feeds, run.all_outputs):
        names, want = tu.run_cpu(path, f)
        for out, w, a in zip(names, want, outs):
            close(a, w, err_msg=out)
    static = _save(make(list(sizes[0])), tmp_path, "static")
    data = tu.compile_model(static, kiln_dev, embed=True, to="bytes", options=CLAIM_ALL)
    ctx = os.path.join(str(tmp_path), f"{name}_ctx.onnx")
    with open(ctx, "wb") as f:
        f.write(data)
    loaded = tu.run_fully_on_kiln(ctx, kiln_dev, feeds[0], options=CLAIM_ALL, threads=threads)
    _, want = tu.run_cpu(static, feeds[0])
    for w, a in zip(want, loaded.outputs):
        close(a, w)
    return " | ".join(tu.notes_of(data))


def _c2f_model(dims, shared=False):
    """YOLOv8's C2f block: a 1x1 convolution split in two halves by channel, a
    bottleneck (two 3x3 convolutions and the skip connection) on the second, and a
    Concat of both halves and the bottleneck's output read by a 1x1 convolution.
    `shared`: a second Concat reads the halves too, the second one twice."""
    specs = {"cv1": (8, 6, 1, 1), "m1": (4, 4, 3, 3), "m2": (4, 4, 3, 3), "cv2": (5, 12, 1, 1),
             "cv3": (3, 12, 1, 1)}
    inits = [onnx.numpy_helper.from_array(np.array([4, 4], np.int64), "halves")]
    for i, (name, shape) in enumerate(specs.items()):
        inits.append(onnx.numpy_helper.from_array(_rand(shape, 60 + i), f"w_{name}"))
        inits.append(onnx.numpy_helper.from_array(_rand((shape[0],), 70 + i), f"b_{name}"))

    def conv(x, name, out, **attrs):
        return h.make_node("Conv", [x, f"w_{name}", f"b_{name}"], [out], **attrs)

    nodes = [conv("x", "cv1", "c1"),
             h.make_node("Split", ["c1", "halves"], ["s0", "s1"], axis=1),
             conv("s1", "m1", "m1", pads=[1, 1, 1, 1]), conv("m1", "m2", "m2", pads=[1, 1, 1, 1]),
             h.make_node("Add", ["s1", "m2"], ["m"]),
             h.make_node("Concat", ["s0", "s1", "m"], ["cat"], axis=1),
             conv("cat", "cv2", "y")]
    outs = ["y"]
    if shared:
        nodes += [h.make_node("Concat", ["s0", "s1", "s1"], ["cat2"], axis=1), conv("cat2", "cv3", "y2")]
        outs.append("y2")
    return _model(nodes, [h.make_tensor_value_info("x", T.FLOAT, dims)],
                  [h.make_tensor_value_info(n, T.FLOAT, None) for n in outs], inits)


@pytest.mark.parametrize("threads", [1, 2])
def test_split_half_and_bottleneck_write_into_their_concat(threads, tmp_path, kiln_dev):
    """In a C2f block, the convolution before the Split writes both halves into
    their channels of the concat, so the first half (read only by the Concat) is no
    copy at all, and the bottleneck's last convolution with its skip connection
    writes its channels in place (its residual, the second half, read densely):
    only the second half, which the bottleneck reads, is copied, once, out of the
    concat. Outputs match the CPU EP at two sizes from one session and after an
    EPContext round trip."""
    notes = _in_place_notes(_c2f_model, 6, [(1, 6, 9, 23), (2, 6, 14, 11)], 80, "c2f",
                            tmp_path, kiln_dev, threads)
    # 2 layout transposes (x, y), 4 convolutions and the second half's copy.
    assert "Concat+InPlace x1" in notes and "; 7 steps;" in notes, notes


@pytest.mark.parametrize("threads", [1, 2])
def test_split_halves_read_by_two_concats(threads, tmp_path, kiln_dev):
    """A split whose halves two Concats read (one of them the second half twice):
    the convolution writes into one concat only, and every other slot is copied."""
    notes = _in_place_notes(lambda d: _c2f_model(d, shared=True), 6, [(1, 6, 9, 23), (2, 6, 14, 11)], 85,
                            "c2f_shared", tmp_path, kiln_dev, threads)
    assert "Concat+InPlace" in notes, notes


def _neck_model(dims):
    """YOLOv8's neck: a map upsampled 2x (nearest) and concatenated with a map of
    twice its size, then a 1x1 convolution; the upsampled map is read only by
    the concat, the other map by a second convolution too (so it is copied)."""
    specs = {"deep": (6, 4, 3, 3), "lat": (5, 4, 1, 1), "out": (4, 11, 1, 1), "side": (3, 5, 1, 1)}
    inits = [onnx.numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales"),
             onnx.numpy_helper.from_array(np.zeros(0, np.float32), "roi")]
    for i, (name, shape) in enumerate(specs.items()):
        inits.append(onnx.numpy_helper.from_array(_rand(shape, 90 + i), f"w_{name}"))
        inits.append(onnx.numpy_helper.from_array(_rand((shape[0],), 95 + i), f"b_{name}"))

    def conv(x, name, out, **attrs):
        return h.make_node("Conv", [x, f"w_{name}", f"b_{name}"], [out], **attrs)

    nodes = [conv("x", "deep", "d", pads=[1, 1, 1, 1], strides=[2, 2]),
             h.make_node("Resize", ["d", "roi", "scales"], ["up"], mode="nearest"),
             conv("x", "lat", "lat"),
             h.make_node("Concat", ["up", "lat"], ["cat"], axis=1),
             conv("cat", "out", "y"), conv("lat", "side", "y2")]
    return _model(nodes, [h.make_tensor_value_info("x", T.FLOAT, dims)],
                  [h.make_tensor_value_info(n, T.FLOAT, None) for n in ("y", "y2")], inits)


@pytest.mark.parametrize("threads", [1, 2])
def test_upsampled_map_is_written_into_its_concat(threads, tmp_path, kiln_dev):
    """A Resize whose output only a channel Concat reads writes its channels of the
    concat's output in place (no copy of it); outputs match the CPU EP at two sizes
    from one session and after an EPContext round trip."""
    notes = _in_place_notes(_neck_model, 4, [(1, 4, 10, 14), (2, 4, 8, 6)], 100, "neck",
                            tmp_path, kiln_dev, threads)
    # 3 layout transposes (x, once for its two convolutions; y, y2), 4
    # convolutions, the Resize and the copy of the lateral map (also read by the
    # side convolution) into the concat.
    assert "Concat+InPlace x1" in notes and "Transpose x3" in notes and "; 9 steps;" in notes, notes


@pytest.mark.parametrize("threads", [1, 2])
def test_convolutions_write_into_their_concat(threads, tmp_path, kiln_dev):
    """Convolutions that only a channel Concat reads write their channels of its
    output in place (the compiled notes say `Concat+InPlace`), the others are
    copied as before, and every output matches the CPU EP: at two image sizes and
    batches from one session, on one and two threads, and after an EPContext
    round trip."""
    notes = _in_place_notes(_concat_model, 8, [(1, 8, 9, 23), (2, 8, 14, 11)], 30, "concat",
                            tmp_path, kiln_dev, threads)
    assert "Concat+InPlace x2" in notes and "Concat x" not in notes, notes
    # 4 layout transposes (x; y, u, y2), 10 convolutions, the MaxPool, and a copy
    # into the first concat for dw, mp and u only: e1, e3, res, f1 and f3 have none.
    assert "; 18 steps;" in notes, notes


def _conv1d_over_h_model(dims):
    """jax2tf's 1-D convolution block (Magika): x [N, L, C] -> Unsqueeze(-1) ->
    a Slice keeping everything -> Transpose to [N, C, L, 1] -> Conv 5x1 -> a Slice
    keeping everything -> Squeeze -> bias Add -> tanh-GELU written
    x * (0.5 * (1 + tanh(0.7978845 * (x + x * (x * (0.044715 * x)))))) -> Transpose
    back to [N, L, C]."""
    n, length, c, co = dims[0], dims[1], 6, 16
    f32 = lambda name, v: onnx.numpy_helper.from_array(np.asarray(v, np.float32), name)  # noqa: E731
    i64 = lambda name, v: onnx.numpy_helper.from_array(np.asarray(v, np.int64), name)  # noqa: E731
    inits = [onnx.numpy_helper.from_array(_rand((co, c, 5, 1), 1), "w"), f32("b", _rand((co, 1), 2)),
             i64("minus1", [-1]), i64("zero", [0]), i64("big", [2**62]), i64("ax1", [1]),
             f32("k3", 0.044715), f32("k2", 0.7978845608), f32("one", 1.0), f32("half", 0.5)]
    nodes = [
        h.make_node("Unsqueeze", ["x", "minus1"], ["u"]),
        h.make_node("Slice", ["u", "zero", "big", "ax1"], ["s"]),
        h.make_node("Transpose", ["s"], ["t"], perm=[0, 2, 1, 3]),
        h.make_node("Conv", ["t", "w"], ["cv"], kernel_shape=[5, 1], pads=[2, 0, 2, 0]),
        h.make_node("Slice", ["cv", "zero", "big", "ax1"], ["s2"]),
        h.make_node("Squeeze", ["s2", "minus1"], ["q"]),
        h.make_node("Add", ["q", "b"], ["a"]),
        h.make_node("Mul", ["k3", "a"], ["g1"]),
        h.make_node("Mul", ["a", "g1"], ["g2"]),
        h.make_node("Mul", ["a", "g2"], ["g3"]),
        h.make_node("Add", ["a", "g3"], ["g4"]),
        h.make_node("Mul", ["k2", "g4"], ["g5"]),
        h.make_node("Tanh", ["g5"], ["g6"]),
        h.make_node("Add", ["one", "g6"], ["g7"]),
        h.make_node("Mul", ["half", "g7"], ["g8"]),
        h.make_node("Mul", ["a", "g8"], ["g9"]),
        h.make_node("Transpose", ["g9"], ["y"], perm=[0, 2, 1]),
    ]
    return _model(nodes, [h.make_tensor_value_info("x", T.FLOAT, [n, length, c])],
                  [h.make_tensor_value_info("y", T.FLOAT, None)], inits)


@pytest.mark.parametrize("threads", [1, 2])
def test_conv1d_over_h_block_is_one_step(threads, tmp_path, kiln_dev):
    """The block runs as one convolution with its bias and GELU in the epilogue:
    the all-keeping Slices are aliases, the layout transposes cancel with the
    model's, the GELU's cube written as three products matches, and the fusion
    looks through the Squeeze. Outputs match the CPU EP at two lengths from one
    session and after an EPContext round trip."""
    path = _save(_conv1d_over_h_model(["n", "l"]), tmp_path, "conv1d_h")
    feeds = [{"x": _rand((2, 37, 6), 90)}, {"x": _rand((1, 120, 6), 91)}]
    run = tu.run_fully_on_kiln(path, kiln_dev, feeds_seq=feeds, options=CLAIM_ALL, threads=threads)
    for f, (got,) in zip(feeds, run.all_outputs):
        _, (want,) = tu.run_cpu(path, f)
        np.testing.assert_allclose(got, want, rtol=RTOL, atol=ATOL)
    static = _save(_conv1d_over_h_model([2, 37]), tmp_path, "conv1d_h_static")
    data = tu.compile_model(static, kiln_dev, embed=True, to="bytes", options=CLAIM_ALL)
    notes = " | ".join(tu.notes_of(data))
    assert "Conv+Bias+Gelu(tanh) x1" in notes and "; 1 steps;" in notes, notes
    ctx = os.path.join(str(tmp_path), "conv1d_h_ctx.onnx")
    with open(ctx, "wb") as f:
        f.write(data)
    (got,) = tu.run_fully_on_kiln(ctx, kiln_dev, feeds[0], options=CLAIM_ALL, threads=threads).outputs
    np.testing.assert_allclose(got, tu.run_cpu(static, feeds[0])[1][0], rtol=RTOL, atol=ATOL)


def _winograd_model(dims):
    """A 3x3 Conv+Bias+Relu at 64 channels, then ResNet's skip connection around a second
    (Conv+Bias, Add, Relu), then a 3x3 convolution to 16 channels (too narrow to pay for
    Winograd's transforms: it stays direct)."""
    inits = []
    for i, (name, shape) in enumerate({"c1": (64, 64, 3, 3), "c2": (64, 64, 3, 3), "c3": (16, 64, 3, 3)}.items()):
        inits.append(onnx.numpy_helper.from_array(_rand(shape, 60 + i) / 8, f"w_{name}"))
        inits.append(onnx.numpy_helper.from_array(_rand((shape[0],), 70 + i), f"b_{name}"))

    def conv(x, name, out):
        return h.make_node("Conv", [x, f"w_{name}", f"b_{name}"], [out], pads=[1, 1, 1, 1])

    nodes = [conv("x", "c1", "a"), h.make_node("Relu", ["a"], ["ar"]), conv("ar", "c2", "b"),
             h.make_node("Add", ["b", "ar"], ["s"]), h.make_node("Relu", ["s"], ["sr"]),
             conv("sr", "c3", "y")]
    return _model(nodes, [h.make_tensor_value_info("x", T.FLOAT, dims)],
                  [h.make_tensor_value_info("y", T.FLOAT, None)], inits)


@pytest.mark.parametrize("threads", [1, 2])
def test_winograd_convolutions_match_the_cpu_ep(threads, tmp_path, kiln_dev):
    """3x3 stride-1 convolutions of 64 channels over at least 12x12 pixels run as Winograd
    on an AVX2 or AVX-512 target (kernels::winograd::pays), F(4x4, 3x3) from 12 output rows and columns,
    else F(2x2, 3x3), with their epilogue and the residual: the CPU EP's numbers at even and
    odd sizes (F(4x4)), a 16x10 image (F(2x2)) and batch 2 from one session, and after an
    EPContext round trip (the context stores the transformed weights). F(4x4)'s transforms
    (factors up to 8) round more than the direct convolution: within 1e-5 of the output's
    magnitude (up to ~25 here), not 1e-4 absolute. The generic target keeps its direct convolution."""
    notes = _in_place_notes(_winograd_model, 64, [(1, 64, 16, 16), (2, 64, 13, 15), (1, 64, 16, 10)], 80,
                            "wino", tmp_path, kiln_dev, threads, scaled_atol=1e-5)
    if tu.host_target() in ("x86_64-avx2", "x86_64-avx512"):
        assert "Conv+Bias+Relu (Winograd) x1" in notes, notes
        assert "Conv+Bias+Residual+Relu (Winograd) x1" in notes, notes
        assert "Conv+Bias x1" in notes, notes
    else:
        assert "Winograd" not in notes, notes


@pytest.mark.skipif(tu.host_target() not in ("x86_64-avx2", "x86_64-avx512"),
                    reason="the generic target runs no convolution as Winograd's, so there is nothing to turn off")
def test_winograd_off_keeps_the_direct_convolution(tmp_path, kiln_dev):
    """`winograd=off` compiles every 3x3 convolution direct: no Winograd step in a static
    partition's notes, and a shape-generic partition compiled with it into an EPContext model
    keeps the choice when loaded without the option (GenericInfo.no_winograd): its outputs are
    bit for bit those of the static direct compile, which Winograd's roundings are not."""
    off = {**CLAIM_ALL, "winograd": "off"}
    static = _save(_winograd_model([1, 64, 16, 16]), tmp_path, "static")
    feeds = {"x": _rand((1, 64, 16, 16), 90)}
    notes, outs = {}, {}
    for name, opts in (("on", CLAIM_ALL), ("off", off)):
        data = tu.compile_model(static, kiln_dev, embed=True, to="bytes", options=opts)
        notes[name] = " | ".join(tu.notes_of(data))
        ctx = tmp_path / f"static_{name}_ctx.onnx"
        ctx.write_bytes(data)
        (outs[name],) = tu.run_fully_on_kiln(str(ctx), kiln_dev, feeds, options=CLAIM_ALL).outputs
    assert "(Winograd)" in notes["on"], notes["on"]
    assert "Winograd" not in notes["off"] and "Conv+Bias+Relu x1" in notes["off"], notes["off"]

    generic = _save(_winograd_model(["n", 64, "h", "w"]), tmp_path, "generic")
    ctx = tmp_path / "generic_off_ctx.onnx"
    data = tu.compile_model(generic, kiln_dev, embed=True, to="bytes", options=off)
    generic_notes = " | ".join(tu.notes_of(data))
    assert "shape-generic" in generic_notes and "; winograd off" in generic_notes, generic_notes
    ctx.write_bytes(data)
    (loaded,) = tu.run_fully_on_kiln(str(ctx), kiln_dev, feeds, options=CLAIM_ALL).outputs
    (plain,) = tu.run_fully_on_kiln(generic, kiln_dev, feeds, options=CLAIM_ALL).outputs
    np.testing.assert_array_equal(loaded, outs["off"])
    np.testing.assert_array_equal(plain, outs["on"])
    assert not np.array_equal(outs["on"], outs["off"])
    _, (want,) = tu.run_cpu(generic, feeds)
    np.testing.assert_allclose(loaded, want, rtol=RTOL, atol=ATOL)
