"""The normalisations of CNNs (issue #13): InstanceNormalization,
GroupNormalization (opset 18 per-group and opset 21 per-channel scale and
bias) and LRN.

kiln runs them channels-last; each model runs on kiln with ``claim=all``
and CPU fallback disabled (so every node really ran on kiln) and is
compared with ORT's CPU EP, with symbolic N, H, W at two sizes from one
session where it matters. Also: a large mean over a small spread (where a
one-pass variance cancels), an attribute kiln refuses (left to ORT), and a
compiled model (EPContext) round trip.
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
import onnxruntime_ep_kiln as kiln

CLAIM_ALL = {"claim": "all"}
RTOL, ATOL = 1e-4, 1e-5


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


def _rand(shape, seed=0, loc=0.0, scale=1.0):
    return (np.random.default_rng(seed).standard_normal(shape) * scale + loc).astype(np.float32)


def _check(path, kiln_dev, feeds_list, opt_level=None, rtol=RTOL, atol=ATOL):
    """Every feed on kiln (whole model claimed, one session) equals the CPU EP."""
    run = tu.run_fully_on_kiln(path, kiln_dev, feeds_seq=feeds_list, options=CLAIM_ALL, opt_level=opt_level)
    for feeds, outs in zip(feeds_list, run.all_outputs):
        names, want = tu.run_cpu(path, feeds, opt_level=opt_level)
        for name, w, a in zip(names, want, outs):
            assert a.shape == w.shape, (name, a.shape, w.shape)
            np.testing.assert_allclose(a, w, rtol=rtol, atol=atol, err_msg=name)
    return run


# ---------------------------------------------------------------- InstanceNormalization


@pytest.mark.parametrize("dims,sizes", [
    (["n", 6, "l"], [(2, 6, 17), (1, 6, 40)]),
    (["n", 5, "h", "w"], [(2, 5, 7, 9), (3, 5, 13, 4)]),
    ([2, 3, 4, 5, 6], [(2, 3, 4, 5, 6)]),
    ([1, 4, 1, 1], [(1, 4, 1, 1)]),
], ids=["1d-symbolic", "2d-symbolic", "3d", "single-position"])
@pytest.mark.parametrize("epsilon", [1e-5, 0.1])
def test_instance_norm(dims, sizes, epsilon, tmp_path, kiln_dev):
    c = dims[1]
    node = h.make_node("InstanceNormalization", ["x", "s", "b"], ["y"], epsilon=epsilon)
    inits = [_init("s", _rand(c, 1)), _init("b", _rand(c, 2))]
    path = _save(_model([node], [_vi("x", dims)], [_vi("y", None)], inits), tmp_path)
    feeds = [{"x": _rand(s, 3 + i, loc=0.5, scale=2.0)} for i, s in enumerate(sizes)]
    _check(path, kiln_dev, feeds)


def test_instance_norm_large_mean_small_spread(tmp_path, kiln_dev):
    """Values 1000 + N(0, 0.01): a one-pass E[x²] - E[x]² in float would
    lose the variance entirely; kiln's two-pass statistics keep it."""
    node = h.make_node("InstanceNormalization", ["x", "s", "b"], ["y"], epsilon=1e-6)
    inits = [_init("s", np.ones(3, np.float32)), _init("b", np.zeros(3, np.float32))]
    path = _save(_model([node], [_vi("x", [1, 3, 16, 16])], [_vi("y", None)], inits), tmp_path)
    x = _rand((1, 3, 16, 16), 4, loc=1000.0, scale=0.01)
    # Floats near 1000 are 6.1e-5 (0.006 sigma) apart, so a mean one ulp
    # apart (kiln rounds an f64 sum, ORT sums in float) moves every output
    # by up to 0.008: agreement to a few quanta is all the input allows.
    run = _check(path, kiln_dev, [{"x": x}], rtol=0, atol=0.02)
    y = run.all_outputs[0][0]
    # Really normalised: unit variance per channel, not zeros or noise.
    np.testing.assert_allclose(y.reshape(3, -1).std(axis=1), 1.0, rtol=1e-2)


def test_instance_norm_nonfinite(tmp_path, kiln_dev):
    """A channel holding inf, -inf or NaN is NaN throughout, as in ORT; a
    channel of huge finite values, whose float sum overflows (ORT: NaN),
    normalises on kiln (f64 statistics), like the float64 definition."""
    node = h.make_node("InstanceNormalization", ["x", "s", "b"], ["y"])
    inits = [_init("s", np.full(5, 0.5, np.float32)), _init("b", np.full(5, 0.25, np.float32))]
    path = _save(_model([node], [_vi("x", [1, 5, 1, 4])], [_vi("y", None)], inits), tmp_path)
    x = np.array([[[[1, 2, np.inf, 3]], [[1, np.nan, 2, 3]], [[-np.inf, 1, 2, 3]],
                   [[1e38, 2e38, -1e38, 3e38]], [[1, 2, 3, 4]]]], np.float32)
    run = tu.run_fully_on_kiln(path, kiln_dev, {"x": x}, options=CLAIM_ALL)
    got = run.outputs[0][0, :, 0]
    _, (want,) = tu.run_cpu(path, {"x": x})
    want = want[0, :, 0]
    assert np.isnan(got[:3]).all() and np.isnan(want[:3]).all()
    np.testing.assert_allclose(got[4], want[4], rtol=RTOL, atol=ATOL)
    assert np.isnan(want[3]).all(), "ORT now normalises huge values: kiln's documented difference is gone"
    x64 = x[0, 3, 0].astype(np.float64)
    ref = (x64 - x64.mean()) / np.sqrt(x64.var() + 1e-5) * 0.5 + 0.25
    np.testing.assert_allclose(got[3], ref, rtol=1e-5)


def test_instance_norm_with_runtime_scale_and_conv_chain(tmp_path, kiln_dev):
    """Scale and bias as graph inputs (not constants), between two elementwise
    ops: the channels-last wrapping is exact inside a chain."""
    nodes = [
        h.make_node("Mul", ["x", "two"], ["m"]),
        h.make_node("InstanceNormalization", ["m", "s", "b"], ["i"]),
        h.make_node("Relu", ["i"], ["y"]),
    ]
    inputs = [_vi("x", ["n", 4, "h", "w"]), _vi("s", [4]), _vi("b", [4])]
    path = _save(_model(nodes, inputs, [_vi("y", None)], [_init("two", np.float32(2.0))]), tmp_path)
    feeds = [{"x": _rand((1, 4, 5, 6), 5), "s": _rand(4, 6), "b": _rand(4, 7)},
             {"x": _rand((2, 4, 3, 11), 8), "s": _rand(4, 9), "b": _rand(4, 10)}]
    _check(path, kiln_dev, feeds)


# ---------------------------------------------------------------- GroupNormalization


@pytest.mark.parametrize("opset", [18, 21])
@pytest.mark.parametrize("channels,groups", [(6, 3), (8, 1), (4, 4), (12, 2)])
def test_group_norm(opset, channels, groups, tmp_path, kiln_dev):
    per = groups if opset == 18 else channels
    node = h.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=groups, epsilon=1e-4)
    inits = [_init("s", _rand(per, 1)), _init("b", _rand(per, 2))]
    path = _save(_model([node], [_vi("x", ["n", channels, "h", "w"])], [_vi("y", None)], inits, opset=opset),
                 tmp_path)
    feeds = [{"x": _rand((2, channels, 5, 7), 3, loc=-1.0)}, {"x": _rand((1, channels, 9, 3), 4, scale=3.0)}]
    _check(path, kiln_dev, feeds)


@pytest.mark.parametrize("opset", [18, 21])
def test_group_norm_runtime_scale_and_bias(opset, tmp_path, kiln_dev):
    """Scale and bias as graph inputs: opset 18's per-group vectors are
    repeated per channel at run time (Reshape, Expand), opset 21's used as is."""
    per = 3 if opset == 18 else 6
    node = h.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=3)
    inputs = [_vi("x", ["n", 6, "h", "w"]), _vi("s", [per]), _vi("b", [per])]
    path = _save(_model([node], inputs, [_vi("y", None)], opset=opset), tmp_path)
    feeds = [{"x": _rand((2, 6, 4, 5), 1), "s": _rand(per, 2), "b": _rand(per, 3)},
             {"x": _rand((1, 6, 7, 2), 4), "s": _rand(per, 5), "b": _rand(per, 6)}]
    _check(path, kiln_dev, feeds)


@pytest.mark.parametrize("stash_type", [1, 11])
def test_group_norm_1d_and_stash_type(stash_type, tmp_path, kiln_dev):
    node = h.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=2, stash_type=stash_type)
    inits = [_init("s", _rand(4, 1)), _init("b", _rand(4, 2))]
    path = _save(_model([node], [_vi("x", [3, 4, "l"])], [_vi("y", None)], inits), tmp_path)
    _check(path, kiln_dev, [{"x": _rand((3, 4, 10), 3)}, {"x": _rand((3, 4, 33), 4)}])


def test_group_norm_refused_stash_type_is_left_to_ort(tmp_path, kiln_dev):
    """stash_type float16 would compute the statistics in half precision,
    which kiln does not: kiln refuses the node, ORT expands the function
    (kiln may take parts of the expansion), and the result is ORT's."""
    node = h.make_node("GroupNormalization", ["x", "s", "b"], ["y"], num_groups=2, stash_type=10)
    inits = [_init("s", _rand(4, 1)), _init("b", _rand(4, 2))]
    path = _save(_model([node], [_vi("x", [1, 4, 3, 3])], [_vi("y", None)], inits), tmp_path)
    feeds = {"x": _rand((1, 4, 3, 3), 3)}
    run = tu.run_kiln(path, kiln_dev, feeds, options=CLAIM_ALL)
    assert "GroupNormalization" not in {op for _, op in run.nodes_on(kiln.EP_NAME)}
    _, want = tu.run_cpu(path, feeds)
    np.testing.assert_allclose(run.outputs[0], want[0], rtol=1e-2, atol=1e-2)


# ---------------------------------------------------------------- LRN


@pytest.mark.parametrize("size,alpha,beta,bias", [
    (5, 1e-4, 0.75, 1.0),   # AlexNet / GoogLeNet
    (3, 0.5, 0.5, 2.0),
    (1, 1.0, 0.75, 1.0),
    (9, 1e-3, 0.75, 0.5),   # wider than the channels
])
def test_lrn(size, alpha, beta, bias, tmp_path, kiln_dev):
    node = h.make_node("LRN", ["x"], ["y"], size=size, alpha=alpha, beta=beta, bias=bias)
    path = _save(_model([node], [_vi("x", ["n", 7, "h", "w"])], [_vi("y", None)]), tmp_path)
    feeds = [{"x": _rand((2, 7, 5, 6), 1, scale=3.0)}, {"x": _rand((1, 7, 11, 3), 2, scale=3.0)}]
    _check(path, kiln_dev, feeds)


def _lrn_reference(x, size, alpha, beta, bias):
    """ONNX's formula, in float64."""
    x = x.astype(np.float64)
    c = x.shape[1]
    sq = np.zeros_like(x)
    for ch in range(c):
        lo, hi = max(0, ch - (size - 1) // 2), min(c - 1, ch + size // 2)
        sq[:, ch] = (x[:, lo:hi + 1] ** 2).sum(axis=1)
    return (x / (bias + alpha / size * sq) ** beta).astype(np.float32)


def test_lrn_nonfinite(tmp_path, kiln_dev):
    """inf, NaN and a square that overflows: the same NaNs and zeros as ORT.
    At an inf, x · (bias + a·inf)^-beta is inf · 0 = NaN, at its finite
    neighbours 0; and ORT's running window sum leaves every later channel of
    that position NaN (inf - inf), which kiln's running sum reproduces."""
    node = h.make_node("LRN", ["x"], ["y"], size=3)
    path = _save(_model([node], [_vi("x", [1, 6, 2, 2])], [_vi("y", None)]), tmp_path)
    x = _rand((1, 6, 2, 2), 1)
    x[0, 1, 0, 0], x[0, 4, 1, 1], x[0, 2, 1, 0] = np.inf, np.nan, -np.inf
    x[0, 5, 0, 1] = 3e38
    _check(path, kiln_dev, [{"x": x}])


def test_lrn_even_size_against_the_formula(tmp_path, kiln_dev):
    """ONNX allows an even size (one more channel after the centre than
    before); ORT's CPU EP refuses it (``size_ % 2 == 1``), kiln runs it:
    compared with the ONNX formula instead."""
    node = h.make_node("LRN", ["x"], ["y"], size=4, alpha=0.01, beta=1.0, bias=1.0)
    path = _save(_model([node], [_vi("x", ["n", 6, "h", "w"])], [_vi("y", None)]), tmp_path)
    feeds = [{"x": _rand((2, 6, 3, 4), 1, scale=3.0)}, {"x": _rand((1, 6, 5, 2), 2, scale=3.0)}]
    run = tu.run_fully_on_kiln(path, kiln_dev, feeds_seq=feeds, options=CLAIM_ALL)
    for f, outs in zip(feeds, run.all_outputs):
        np.testing.assert_allclose(outs[0], _lrn_reference(f["x"], 4, 0.01, 1.0, 1.0), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------- a CNN block, both optimisation levels


@pytest.mark.parametrize("opt_level", [ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
                                       ort.GraphOptimizationLevel.ORT_ENABLE_ALL], ids=["disable", "enable"])
def test_norm_chain(opt_level, tmp_path, kiln_dev):
    """InstanceNorm -> LRN -> GroupNorm -> Add, symbolic N, H, W: the
    transposes between the channels-last ops stay exact."""
    nodes = [
        h.make_node("InstanceNormalization", ["x", "s", "b"], ["i"]),
        h.make_node("LRN", ["i"], ["l"], size=3, alpha=0.1),
        h.make_node("GroupNormalization", ["l", "gs", "gb"], ["g"], num_groups=2),
        h.make_node("Add", ["g", "x"], ["y"]),
    ]
    inits = [_init("s", _rand(4, 1)), _init("b", _rand(4, 2)), _init("gs", _rand(4, 3)), _init("gb", _rand(4, 4))]
    path = _save(_model(nodes, [_vi("x", ["n", 4, "h", "w"])], [_vi("y", None)], inits), tmp_path)
    feeds = [{"x": _rand((1, 4, 6, 6), 5)}, {"x": _rand((2, 4, 3, 8), 6)}]
    _check(path, kiln_dev, feeds, opt_level=opt_level)


@pytest.mark.parametrize("target", list(kiln.TARGETS))
def test_norms_on_every_target(target, tmp_path, kiln_dev):
    """The kernels have one portable implementation; each target's build
    of it (AVX-512, AVX2, generic code generation) gives the same results."""
    order = list(kiln.TARGETS)  # best first
    if order.index(target) < order.index(tu.host_target()):
        pytest.skip(f"this CPU cannot run {target} (best here: {tu.host_target()})")
    nodes = [
        h.make_node("InstanceNormalization", ["x", "s", "b"], ["i"]),
        h.make_node("LRN", ["i"], ["l"], size=3, alpha=0.3),
        h.make_node("GroupNormalization", ["l", "s", "b"], ["y"], num_groups=2),
    ]
    inits = [_init("s", _rand(4, 1)), _init("b", _rand(4, 2))]
    path = _save(_model(nodes, [_vi("x", [2, 4, 9, 7])], [_vi("y", None)], inits), tmp_path)
    feeds = {"x": _rand((2, 4, 9, 7), 3)}
    run = tu.run_fully_on_kiln(path, kiln_dev, feeds, options={"claim": "all", "target": target})
    _, want = tu.run_cpu(path, feeds)
    np.testing.assert_allclose(run.outputs[0], want[0], rtol=RTOL, atol=ATOL)


# ---------------------------------------------------------------- compiled model


@pytest.mark.parametrize("symbolic", [True, False], ids=["symbolic", "static"])
def test_compiled_model_round_trip(symbolic, tmp_path, kiln_dev):
    """InstanceNorm, GroupNorm and LRN compile to an EPContext model that
    loads and runs the same (symbolic: the shape-generic graph; static: the
    compiled GroupNorm and LRN steps)."""
    nodes = [
        h.make_node("InstanceNormalization", ["x", "s", "b"], ["i"]),
        h.make_node("LRN", ["i"], ["l"], size=5, alpha=0.2, beta=0.6, bias=1.5),
        h.make_node("GroupNormalization", ["l", "gs", "gb"], ["y"], num_groups=3),
    ]
    inits = [_init("s", _rand(6, 1)), _init("b", _rand(6, 2)), _init("gs", _rand(6, 3)), _init("gb", _rand(6, 4))]
    dims = ["n", 6, "h", "w"] if symbolic else [2, 6, 5, 5]
    src = _save(_model(nodes, [_vi("x", dims)], [_vi("y", None)], inits), tmp_path, "norms")
    ctx = os.path.join(str(tmp_path), "norms_ctx.onnx")
    tu.compile_model(src, kiln_dev, embed=False, output=ctx, options=CLAIM_ALL)
    assert os.path.exists(os.path.join(str(tmp_path), "norms_kiln.bin"))
    assert {n.op_type for n in onnx.load(ctx).graph.node} == {"EPContext"}
    sizes = [(2, 6, 5, 5), (1, 6, 8, 3)] if symbolic else [(2, 6, 5, 5)]
    feeds = [{"x": _rand(s, 7 + i)} for i, s in enumerate(sizes)]
    run = tu.run_fully_on_kiln(ctx, kiln_dev, feeds_seq=feeds, options=CLAIM_ALL)
    for f, outs in zip(feeds, run.all_outputs):
        _, want = tu.run_cpu(src, f)
        np.testing.assert_allclose(outs[0], want[0], rtol=RTOL, atol=ATOL)
