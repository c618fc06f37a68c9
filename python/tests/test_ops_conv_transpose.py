"""ConvTranspose (issue #13) on kiln against ORT's CPU EP.

Every model runs with the EP option ``claim=all`` and CPU fallback disabled
(so the node really ran on kiln) over ConvTranspose's attribute space: 1-D
and 2-D, groups (depthwise included), strides, dilations, explicit and
asymmetric pads, every ``auto_pad``, ``output_padding``, ``output_shape``
(which overrides pads), with and without bias; PP-OCR det's 2x2 stride-2
upsampling; symbolic N/H/W served at two sizes by one session; an EPContext
round trip (static: the compiled step is stored; symbolic: the graph); and
weights that are not constants, which kiln leaves to ORT.
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
RTOL, ATOL = 1e-4, 1e-5


def _model(ci, co, group, kernel, attrs, x_dims, bias=True, seed=0, w_input=False):
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((ci, co // group, *kernel)).astype(np.float32)
    inits = [] if w_input else [onnx.numpy_helper.from_array(w, "w")]
    ins = ["x", "w"]
    if bias:
        inits.append(onnx.numpy_helper.from_array(rng.standard_normal(co).astype(np.float32), "b"))
        ins.append("b")
    node = h.make_node("ConvTranspose", ins, ["y"], group=group, **attrs)
    inputs = [h.make_tensor_value_info("x", T.FLOAT, x_dims)]
    if w_input:
        inputs.append(h.make_tensor_value_info("w", T.FLOAT, list(w.shape)))
    g = h.make_graph([node], "ct", inputs, [h.make_tensor_value_info("y", T.FLOAT, None)], inits)
    return h.make_model(g, opset_imports=[h.make_opsetid("", 17)], ir_version=9), w


def _save(m, tmp_path, name="ct"):
    path = os.path.join(str(tmp_path), f"{name}.onnx")
    onnx.save(m, path)
    return path


def _x(shape, seed=1):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _check(path, kiln_dev, feeds_list, **kwargs):
    run = tu.run_fully_on_kiln(path, kiln_dev, feeds_seq=feeds_list, options=CLAIM_ALL, **kwargs)
    for feeds, outs in zip(feeds_list, run.all_outputs):
        names, want = tu.run_cpu(path, feeds)
        tu.assert_outputs_close(names, want, outs, rtol=RTOL, atol=ATOL)
    assert [op for _, op in run.nodes_on(kiln.EP_NAME)] == ["ConvTranspose"]
    return run


# (ci, co, group, kernel, attrs, input spatial size)
CASES_2D = {
    "plain_3x3": (3, 4, 1, (3, 3), {}, (5, 6)),
    "ppocr_det_2x2_s2": (24, 24, 1, (2, 2), {"strides": [2, 2]}, (8, 10)),
    "k4_s2_p1": (8, 6, 1, (4, 4), {"strides": [2, 2], "pads": [1, 1, 1, 1]}, (7, 5)),
    "asymmetric_pads": (4, 5, 1, (3, 3), {"strides": [2, 1], "pads": [0, 2, 1, 1]}, (6, 7)),
    "dilation": (3, 4, 1, (3, 2), {"dilations": [2, 3]}, (5, 4)),
    "dilation_stride_pads": (4, 4, 1, (3, 3), {"strides": [2, 2], "dilations": [2, 1], "pads": [1, 0, 2, 1]}, (6, 6)),
    "groups": (6, 9, 3, (3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}, (5, 7)),
    "depthwise": (8, 8, 8, (4, 4), {"strides": [2, 2], "pads": [1, 1, 1, 1]}, (6, 6)),
    "dilation_with_groups": (4, 6, 2, (3, 3), {"dilations": [2, 2], "strides": [1, 2]}, (5, 5)),
    "output_padding": (3, 5, 1, (3, 3), {"strides": [2, 3], "output_padding": [1, 2]}, (4, 5)),
    "output_padding_with_dilation": (3, 2, 1, (2, 2), {"strides": [2, 3], "dilations": [3, 3],
                                                    "output_padding": [1, 2]}, (4, 4)),
    "output_shape": (4, 3, 1, (3, 3), {"strides": [2, 2], "output_shape": [10, 12]}, (5, 6)),
    "output_shape_overrides_pads": (4, 3, 1, (3, 3), {"strides": [2, 2], "output_shape": [9, 11],
                                                      "pads": [0, 0, 0, 0]}, (5, 6)),
    "output_shape_same_upper": (2, 3, 1, (3, 3), {"strides": [2, 2], "output_shape": [9, 10],
                                                  "auto_pad": "SAME_UPPER"}, (5, 5)),
    "same_upper": (3, 4, 1, (3, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER"}, (5, 4)),
    "same_lower": (3, 4, 1, (4, 3), {"strides": [2, 2], "auto_pad": "SAME_LOWER"}, (5, 4)),
    "valid": (3, 4, 1, (3, 3), {"strides": [2, 2], "auto_pad": "VALID"}, (4, 4)),
    "kernel_shape_attr": (2, 2, 1, (2, 3), {"kernel_shape": [2, 3], "strides": [3, 2]}, (3, 4)),
    "wide_channels": (20, 40, 1, (2, 2), {"strides": [2, 2]}, (3, 3)),
}


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("case", list(CASES_2D))
def test_conv_transpose_2d(case, bias, tmp_path, kiln_dev):
    ci, co, group, kernel, attrs, hw = CASES_2D[case]
    m, _ = _model(ci, co, group, kernel, attrs, [2, ci, *hw], bias=bias)
    _check(_save(m, tmp_path), kiln_dev, [{"x": _x((2, ci, *hw))}])


CASES_1D = {
    "plain": (3, 4, 1, (3,), {}, 7),
    "stride_pads": (4, 6, 2, (4,), {"strides": [2], "pads": [1, 2]}, 9),
    "dilation_output_padding": (2, 3, 1, (3,), {"strides": [2], "dilations": [2], "output_padding": [1]}, 5),
    "output_shape": (3, 3, 3, (3,), {"strides": [2], "output_shape": [12]}, 6),
    "same_lower": (3, 2, 1, (3,), {"strides": [2], "auto_pad": "SAME_LOWER"}, 5),
    "same_upper": (3, 2, 1, (3,), {"strides": [2], "auto_pad": "SAME_UPPER"}, 5),
}


@pytest.mark.parametrize("case", list(CASES_1D))
def test_conv_transpose_1d(case, tmp_path, kiln_dev):
    ci, co, group, kernel, attrs, length = CASES_1D[case]
    m, _ = _model(ci, co, group, kernel, attrs, [2, ci, length])
    _check(_save(m, tmp_path), kiln_dev, [{"x": _x((2, ci, length))}])


@pytest.mark.parametrize("opt", ["all", "disable"])
def test_symbolic_sizes_one_session(opt, tmp_path, kiln_dev):
    """N, H and W symbolic: one session serves two image sizes (the
    shape-generic partition imports the op again at each)."""
    m, _ = _model(16, 8, 1, (2, 2), {"strides": [2, 2]}, ["n", 16, "h", "w"])
    feeds = [{"x": _x((1, 16, 12, 20))}, {"x": _x((3, 16, 7, 9), seed=2)}]
    level = tu.ort.GraphOptimizationLevel.ORT_ENABLE_ALL if opt == "all" else \
        tu.ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    _check(_save(m, tmp_path), kiln_dev, feeds, opt_level=level)


def test_symbolic_sizes_with_pads_and_groups(tmp_path, kiln_dev):
    m, _ = _model(6, 4, 2, (3, 3), {"strides": [2, 2], "pads": [1, 0, 0, 1], "output_padding": [1, 0]},
                  [1, 6, "h", "w"])
    _check(_save(m, tmp_path), kiln_dev, [{"x": _x((1, 6, 5, 3))}, {"x": _x((1, 6, 8, 11), seed=3)}])


def test_same_with_output_padding_is_left_to_ort(tmp_path, kiln_dev):
    """auto_pad SAME_* with output_padding: ONNX's shape inference declares
    stride*in + output_padding, ORT's CPU EP produces stride*in. kiln cannot
    produce a shape other than the declared one, so it leaves the node to ORT."""
    m, _ = _model(3, 4, 1, (3, 3), {"strides": [2, 2], "auto_pad": "SAME_UPPER", "output_padding": [1, 1]},
                  [1, 3, 5, 4])
    path = _save(m, tmp_path)
    feeds = {"x": _x((1, 3, 5, 4))}
    run = tu.run_kiln(path, kiln_dev, feeds, options=CLAIM_ALL)
    assert run.nodes_on(kiln.EP_NAME) == []
    names, want = tu.run_cpu(path, feeds)
    tu.assert_outputs_close(names, want, run.outputs, rtol=RTOL, atol=ATOL)


def test_weights_not_constant_are_left_to_ort(tmp_path, kiln_dev):
    m, w = _model(3, 4, 1, (3, 3), {}, [1, 3, 5, 5], w_input=True)
    path = _save(m, tmp_path)
    feeds = {"x": _x((1, 3, 5, 5)), "w": w}
    run = tu.run_kiln(path, kiln_dev, feeds, options=CLAIM_ALL)
    assert run.nodes_on(kiln.EP_NAME) == []
    names, want = tu.run_cpu(path, feeds)
    tu.assert_outputs_close(names, want, run.outputs, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("symbolic", [False, True], ids=["static", "symbolic"])
def test_compiled_model_round_trip(symbolic, tmp_path, kiln_dev):
    """Compiled to an EPContext model (embed mode 0), the ConvTranspose loads
    and runs the same: static shapes store the compiled step with its packed
    weights, symbolic ones the graph."""
    dims = [1, 8, "h", "w"] if symbolic else [1, 8, 6, 7]
    m, _ = _model(8, 6, 2, (4, 4), {"strides": [2, 2], "pads": [1, 1, 1, 1]}, dims)
    src = _save(m, tmp_path, "ct")
    ctx = os.path.join(str(tmp_path), "ct_ctx.onnx")
    tu.compile_model(src, kiln_dev, embed=False, output=ctx, options=CLAIM_ALL)
    assert os.path.exists(os.path.join(str(tmp_path), "ct_kiln.bin"))
    assert {n.op_type for n in onnx.load(ctx).graph.node} == {"EPContext"}
    sizes = [(6, 7), (9, 4)] if symbolic else [(6, 7)]
    feeds = [{"x": _x((1, 8, *hw), seed=i)} for i, hw in enumerate(sizes)]
    run = tu.run_fully_on_kiln(ctx, kiln_dev, feeds_seq=feeds, options=CLAIM_ALL)
    for f, outs in zip(feeds, run.all_outputs):
        names, want = tu.run_cpu(src, f)
        tu.assert_outputs_close(names, want, outs, rtol=RTOL, atol=ATOL)
