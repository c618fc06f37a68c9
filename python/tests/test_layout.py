"""The channels-last layout pass and BatchNormalization (issue #13).

kiln imports its spatial ops channels-last between two Transposes; the
compiler's layout pass (``compiler::layout``, docs/compiler.md "Layout
propagation") moves transposes through layout-agnostic ops and cancels
inverse pairs. These models write those transposes out explicitly, with a
``MatMul`` over the channels of an ``[N, H, W, C]`` tensor standing in for a
1x1 convolution (a layout-sensitive op), and check against ORT's CPU EP:

* the numbers, with the graph as written (``ORT_DISABLE_ALL``: kiln's pass is
  what removes the transposes) and after ORT's own optimisations;
* with static shapes, that the transposes are gone from what kiln compiled:
  the EPContext node's ``notes`` list the compiled program's ops
  (``Transpose xN``), compiled from the unoptimised graph;
* with symbolic N/H/W, two sizes from one session.

BatchNormalization (inference form, opsets 9/14/15) against the CPU EP for
rank 2, 3 and 4 inputs, symbolic dims, constant and computed parameters and
epsilon corner values; training mode and its extra outputs are left to ORT.
All kiln sessions use ``claim=all`` (``kiln_testutil.TEST_OPTIONS``).
"""
from __future__ import annotations

import os
import re

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h

import kiln_testutil as tu
import onnxruntime_ep_kiln as kiln

RAW = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
OPT = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
LEVELS = {"raw": RAW, "ort-opt": OPT}
NHWC = [0, 2, 3, 1]
NCHW = [0, 3, 1, 2]


def _model(nodes, inputs, outputs, inits=(), opset=17):
    g = h.make_graph(nodes, "g", inputs, outputs, list(inits))
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset)], ir_version=9)


def _vi(name, dims, elem=T.FLOAT):
    return h.make_tensor_value_info(name, elem, dims)


def _init(name, arr):
    return onnx.numpy_helper.from_array(np.asarray(arr, np.float32), name)


def _rand(shape, seed):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def _save(m, tmp_path, name="m"):
    path = os.path.join(str(tmp_path), f"{name}.onnx")
    onnx.checker.check_model(m)
    onnx.save(m, path)
    return path


def _check(path, kiln_dev, feeds_list, level, rtol=1e-5, atol=1e-6):
    """Every feed on kiln (all nodes claimed) and on the CPU EP at ``level``."""
    run = tu.run_fully_on_kiln(path, kiln_dev, feeds_seq=feeds_list, opt_level=level)
    for feeds, outs in zip(feeds_list, run.all_outputs):
        names, want = tu.run_cpu(path, feeds, opt_level=level)
        for name, w, a in zip(names, want, outs):
            assert a.shape == w.shape, (name, a.shape, w.shape)
            np.testing.assert_allclose(a, w, rtol=rtol, atol=atol, err_msg=name)
    return run


def _compiled_notes(path, kiln_dev) -> str:
    """The notes of the EPContext node(s) kiln writes for the graph as written."""
    so = tu.kiln_session_options(kiln_dev)
    so.graph_optimization_level = RAW
    data = ort.ModelCompiler(so, path, embed_compiled_data_into_model=True).compile_to_bytes()
    notes = [tu.attrs_of(n).get("notes", b"") for n in tu.ep_context_nodes(data)]
    return " | ".join(x.decode() if isinstance(x, bytes) else str(x) for x in notes)


def _transposes(notes: str) -> int:
    assert re.search(r"\bMatMul|\bRelu|\bNeg", notes), f"not a compiled program's notes: {notes}"
    return sum(int(n) for n in re.findall(r"\bTranspose x(\d+)", notes))


def _pointwise(nodes, inits, x, cin, cout, name, seed):
    """A 1x1 convolution as kiln runs it: to channels-last, a product over
    the channels, back to channels-first."""
    inits.append(_init(f"{name}_w", _rand((cin, cout), seed) / np.sqrt(cin)))
    nodes += [
        h.make_node("Transpose", [x], [f"{name}_in"], perm=NHWC),
        h.make_node("MatMul", [f"{name}_in", f"{name}_w"], [f"{name}_y"]),
        h.make_node("Transpose", [f"{name}_y"], [name], perm=NCHW),
    ]
    return name


# ---------------------------------------------------------------- the layout pass


def _issue_example():
    """x -> Transpose(0,2,3,1) -> Relu -> Add const -> Transpose(0,3,1,2) -> Mul y."""
    nodes = [
        h.make_node("Transpose", ["x"], ["t"], perm=NHWC),
        h.make_node("Relu", ["t"], ["r"]),
        h.make_node("Add", ["r", "c"], ["a"]),
        h.make_node("Transpose", ["a"], ["b"], perm=NCHW),
        h.make_node("Mul", ["b", "y"], ["out"]),
    ]
    inits = [_init("c", _rand((1, 1, 5), 1))]  # per channel, channels-last
    return nodes, inits


def _cnn_block(cin=3, mid=8):
    """Two stand-in convolutions with what CNNs put between them: Relu, a
    per-channel [C,1,1] scale and shift, SiLU, a residual add, a channel
    concat, a split (Slice) and a global average pool."""
    nodes, inits = [], []
    c1 = _pointwise(nodes, inits, "x", cin, mid, "c1", 1)
    inits += [_init("scale", _rand((mid, 1, 1), 2)), _init("shift", _rand((mid, 1, 1), 3))]
    nodes += [
        h.make_node("Relu", [c1], ["r"]),
        h.make_node("Mul", ["r", "scale"], ["s"]),
        h.make_node("Add", ["s", "shift"], ["bn"]),
        h.make_node("Sigmoid", ["bn"], ["sg"]),
        h.make_node("Mul", ["bn", "sg"], ["silu"]),
    ]
    c2 = _pointwise(nodes, inits, "silu", mid, mid, "c2", 4)
    nodes += [
        h.make_node("Add", [c2, "silu"], ["res"]),
        h.make_node("Concat", ["res", c1], ["cat"], axis=1),
        h.make_node("Split", ["cat", "halves"], ["p0", "p1"], axis=1),
        h.make_node("Sub", ["p0", "p1"], ["d"]),
        h.make_node("ReduceMean", ["d"], ["gap"], axes=[2, 3], keepdims=1),
        h.make_node("Mul", ["d", "gap"], ["se"]),
    ]
    inits.append(onnx.numpy_helper.from_array(np.array([mid, mid], np.int64), "halves"))
    _pointwise(nodes, inits, "se", mid, 4, "out", 5)
    return nodes, inits


def _one_d_block(cin=3, mid=6):
    """1-D stand-ins: [N, C, L] -> [N, C, 1, L] -> channels-last, and back."""
    nodes, inits = [], []
    inits += [onnx.numpy_helper.from_array(np.array(v, np.int64), n)
              for n, v in [("ax2", [2])]]
    x = "x"
    for k, (a, b) in enumerate([(cin, mid), (mid, mid), (mid, 2)]):
        nodes.append(h.make_node("Unsqueeze", [x, "ax2"], [f"u{k}"]))
        y = _pointwise(nodes, inits, f"u{k}", a, b, f"c{k}", k)
        nodes += [h.make_node("Squeeze", [y, "ax2"], [f"s{k}"]), h.make_node("Tanh", [f"s{k}"], [f"t{k}"])]
        x = f"t{k}"
    nodes.append(h.make_node("Identity", [x], ["out"]))
    return nodes, inits


@pytest.mark.parametrize("level", LEVELS)
def test_issue_example_has_no_transpose_left(level, tmp_path, kiln_dev):
    nodes, inits = _issue_example()
    m = _model(nodes, [_vi("x", [2, 5, 4, 3]), _vi("y", [2, 5, 4, 3])], [_vi("out", [2, 5, 4, 3])], inits)
    path = _save(m, tmp_path)
    _check(path, kiln_dev, [{"x": _rand((2, 5, 4, 3), 7), "y": _rand((2, 5, 4, 3), 8)}], LEVELS[level])
    if level == "raw":
        notes = _compiled_notes(path, kiln_dev)
        assert _transposes(notes) == 0, notes


@pytest.mark.parametrize("level", LEVELS)
def test_cnn_block_transposes_only_at_the_edges(level, tmp_path, kiln_dev):
    nodes, inits = _cnn_block()
    m = _model(nodes, [_vi("x", [2, 3, 6, 5])], [_vi("out", [2, 4, 6, 5])], inits)
    path = _save(m, tmp_path)
    _check(path, kiln_dev, [{"x": _rand((2, 3, 6, 5), 9)}], LEVELS[level])
    if level == "raw":
        notes = _compiled_notes(path, kiln_dev)
        # 6 as written; the input's and the output's remain.
        assert _transposes(notes) == 2, notes


def test_cnn_block_with_symbolic_dims(tmp_path, kiln_dev):
    nodes, inits = _cnn_block()
    m = _model(nodes, [_vi("x", ["n", 3, "h", "w"])], [_vi("out", ["n", 4, "h", "w"])], inits)
    path = _save(m, tmp_path)
    feeds = [{"x": _rand((2, 3, 6, 5), 10)}, {"x": _rand((1, 3, 7, 11), 11)}, {"x": _rand((3, 3, 1, 1), 12)}]
    _check(path, kiln_dev, feeds, RAW)


@pytest.mark.parametrize("batch", [1, "n"])
def test_one_d_ops_cancel_through_unit_reshapes(batch, tmp_path, kiln_dev):
    nodes, inits = _one_d_block()
    m = _model(nodes, [_vi("x", [batch, 3, 9])], [_vi("out", [batch, 2, 9])], inits)
    path = _save(m, tmp_path)
    n = 1 if batch == 1 else 3
    _check(path, kiln_dev, [{"x": _rand((n, 3, 9), 13)}], RAW)
    if batch == 1:
        notes = _compiled_notes(path, kiln_dev)
        assert _transposes(notes) == 2, notes


def test_a_transposed_value_with_a_layout_sensitive_reader(tmp_path, kiln_dev):
    # c1 feeds a convolution (through Relu), a Reshape that regroups dims and
    # the graph output: one transpose serves the last two.
    nodes, inits = [], []
    c1 = _pointwise(nodes, inits, "x", 3, 4, "c1", 1)
    nodes.append(h.make_node("Relu", [c1], ["r"]))
    _pointwise(nodes, inits, "r", 4, 2, "c2", 2)
    inits.append(onnx.numpy_helper.from_array(np.array([2, 4, 30], np.int64), "shape"))
    nodes.append(h.make_node("Reshape", [c1, "shape"], ["flat"]))
    m = _model(nodes, [_vi("x", [2, 3, 6, 5])],
               [_vi("c2", [2, 2, 6, 5]), _vi("flat", [2, 4, 30]), _vi("c1", [2, 4, 6, 5])], inits)
    path = _save(m, tmp_path)
    _check(path, kiln_dev, [{"x": _rand((2, 3, 6, 5), 14)}], RAW)
    notes = _compiled_notes(path, kiln_dev)
    assert _transposes(notes) == 3, notes  # x in, c1 once, c2 out


def test_general_permutations_compose(tmp_path, kiln_dev):
    nodes = [
        h.make_node("Transpose", ["x"], ["a"], perm=[1, 0, 2]),
        h.make_node("Neg", ["a"], ["b"]),
        h.make_node("Transpose", ["b"], ["c"], perm=[2, 0, 1]),
        h.make_node("Softmax", ["c"], ["d"], axis=0),
        h.make_node("ReduceSum", ["d", "axes"], ["out"], keepdims=0),
    ]
    inits = [onnx.numpy_helper.from_array(np.array([1], np.int64), "axes")]
    m = _model(nodes, [_vi("x", [2, 3, 4])], [_vi("out", [4, 3])], inits)
    path = _save(m, tmp_path)
    _check(path, kiln_dev, [{"x": _rand((2, 3, 4), 15)}], RAW)
    notes = _compiled_notes(path, kiln_dev)
    assert _transposes(notes) == 1, notes


# ---------------------------------------------------------------- BatchNormalization


def _bn_model(shape, opset, eps=None, params_as_inputs=False, seed=0, var=None, extra_outputs=0,
              training_mode=None):
    c = shape[1] if isinstance(shape[1], int) else 4
    rng = np.random.default_rng(seed)
    vals = {
        "gamma": rng.standard_normal(c).astype(np.float32),
        "beta": rng.standard_normal(c).astype(np.float32),
        "mean": rng.standard_normal(c).astype(np.float32),
        "var": rng.uniform(0.1, 2.0, c).astype(np.float32) if var is None else np.asarray(var, np.float32),
    }
    attrs = {}
    if eps is not None:
        attrs["epsilon"] = eps
    if training_mode is not None:
        attrs["training_mode"] = training_mode
    outs = ["y"] + [f"stat{k}" for k in range(extra_outputs)]
    node = h.make_node("BatchNormalization", ["x", "gamma", "beta", "mean", "var"], outs, **attrs)
    inputs = [_vi("x", shape)]
    inits = []
    for k, v in vals.items():
        if params_as_inputs:
            inputs.append(_vi(k, [c]))
        else:
            inits.append(_init(k, v))
    outputs = [_vi("y", shape)] + [_vi(o, [c]) for o in outs[1:]]
    return _model([node], inputs, outputs, inits, opset=opset), vals


def _feeds(shape, vals, params_as_inputs, seed):
    f = {"x": _rand(shape, seed) * 3}
    if params_as_inputs:
        f.update(vals)
    return f


@pytest.mark.parametrize("opset", [9, 14, 15])
@pytest.mark.parametrize("dims,runs", [
    ([3, 4], [(3, 4)]),
    ([2, 4, 7], [(2, 4, 7)]),
    ([2, 4, 5, 6], [(2, 4, 5, 6)]),
    (["n", 4, "h", "w"], [(1, 4, 5, 6), (3, 4, 2, 9)]),
    (["n", 4, "l"], [(2, 4, 3), (1, 4, 11)]),
])
@pytest.mark.parametrize("level", LEVELS)
def test_batch_norm_matches_the_cpu_ep(opset, dims, runs, level, tmp_path, kiln_dev):
    m, vals = _bn_model(dims, opset)
    path = _save(m, tmp_path)
    _check(path, kiln_dev, [_feeds(s, vals, False, k) for k, s in enumerate(runs)], LEVELS[level])


@pytest.mark.parametrize("dims,shape", [([2, 4, 5, 6], (2, 4, 5, 6)), (["n", 4], (5, 4))])
def test_batch_norm_with_computed_parameters(dims, shape, tmp_path, kiln_dev):
    m, vals = _bn_model(dims, 15, params_as_inputs=True)
    path = _save(m, tmp_path)
    _check(path, kiln_dev, [_feeds(shape, vals, True, 1)], RAW)


@pytest.mark.parametrize("eps,var", [
    (0.0, [0.5, 1.0, 2.0, 4.0]),
    (1e-45, [0.5, 1.0, 2.0, 4.0]),      # a subnormal epsilon
    (1e-45, [0.0, 1e-38, 1.0, 3e38]),   # a huge scale, a tiny one
    (0.0, [0.0, 1.0, 0.0, 2.0]),        # infinite scales: inf and NaN as ORT gives them
    (1e3, [0.0, 1.0, 2.0, 3.0]),
])
def test_batch_norm_epsilon_corners(eps, var, tmp_path, kiln_dev):
    m, vals = _bn_model([2, 4, 3, 3], 15, eps=eps, var=var)
    path = _save(m, tmp_path)
    _check(path, kiln_dev, [_feeds((2, 4, 3, 3), vals, False, 2)], RAW)


def test_batch_norm_between_convolutions_keeps_channels_last(tmp_path, kiln_dev):
    nodes, inits = [], []
    c1 = _pointwise(nodes, inits, "x", 3, 4, "c1", 1)
    rng = np.random.default_rng(3)
    for k in ["gamma", "beta", "mean"]:
        inits.append(_init(k, rng.standard_normal(4)))
    inits.append(_init("var", rng.uniform(0.5, 2.0, 4)))
    nodes += [
        h.make_node("BatchNormalization", [c1, "gamma", "beta", "mean", "var"], ["bn"], epsilon=1e-3),
        h.make_node("Relu", ["bn"], ["r"]),
    ]
    _pointwise(nodes, inits, "r", 4, 2, "out", 2)
    m = _model(nodes, [_vi("x", [2, 3, 5, 5])], [_vi("out", [2, 2, 5, 5])], inits, opset=15)
    path = _save(m, tmp_path)
    _check(path, kiln_dev, [{"x": _rand((2, 3, 5, 5), 16)}], RAW)
    notes = _compiled_notes(path, kiln_dev)
    assert _transposes(notes) == 2, notes


@pytest.mark.parametrize("case", ["training_mode", "opset9_outputs"])
def test_batch_norm_training_forms_are_left_to_ort(case, tmp_path, kiln_dev):
    if case == "training_mode":
        m, vals = _bn_model([2, 4, 3], 15, training_mode=1, extra_outputs=2)
    else:
        m, vals = _bn_model([2, 4, 3], 9, extra_outputs=4)
    path = _save(m, tmp_path)
    feeds = _feeds((2, 4, 3), vals, False, 3)
    try:
        run = tu.run_kiln(path, kiln_dev, feeds, opt_level=RAW)
    except tu.KilnSessionError as e:
        # ORT itself may refuse the training form; kiln must not be the reason.
        assert "kiln" not in e.message.lower(), e
        return
    assert run.nodes_on(kiln.EP_NAME) == []
