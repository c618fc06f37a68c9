"""Symbolic shapes (issue #11): one kiln session serves every input shape.

A model whose batch or sequence dims are symbols is claimed as a whole (kiln
checks each node with its unknown dims at two sets of probe sizes), compiled
once into a shape-generic partition (weights packed at Compile), and
specialised at the first run with each new input shape signature: later runs
at that shape reuse the program (``shapes_specialized`` counts the builds;
``shape_cache`` bounds how many each partition keeps). Every run is compared
with the CPU EP. Also: a tensor whose rank ORT does not know is never taken
for a scalar, and ``If`` branches with symbolic dims run on kiln.
"""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import kiln_testutil as tu
import models_lib as ml
import onnxruntime_ep_kiln as kiln

DYNAMIC = [
    ml.bert(64, 2, 8, 3, 2, mask=True, ln="decomposed", act="erf", dynamic_batch=True),
    ml.bert(64, 2, 8, 2, 1, mask=True, ln="op", act="erf", dynamic_batch=True, dynamic_seq=True),
    ml.bert(64, 2, 8, 3, 1, mask=True, ln="op", act="op", shape_ops=False, dynamic_batch=True),
    ml.mlp(2, 128, 5, "relu", "gemm", dynamic_batch=True),
    ml.mlp(3, 256, 2, "relu", "matmul", in_dim=128, seq=16, dynamic_batch=True),
]

#: (batch, seq) per run; seq only applies where the model's second dim is a symbol.
SHAPES = [(1, 5), (4, 16), (2, 77), (1, 5), (4, 16)]


def _feeds_at(case, batch, seq, seed):
    return case.feeds(seed, batch=batch, seq=seq)


def _signature(case, batch, seq):
    f = _feeds_at(case, batch, seq, 0)
    return tuple(tuple(v.shape) for v in f.values())


@pytest.mark.parametrize("case", DYNAMIC, ids=lambda c: c.name)
def test_dynamic_model_is_claimed_whole_and_runs_at_every_shape(case, kiln_dev, tmp_path):
    path = case.save(str(tmp_path))
    feeds = [_feeds_at(case, b, s, i) for i, (b, s) in enumerate(SHAPES)]
    run = tu.run_fully_on_kiln(path, kiln_dev, feeds_seq=feeds)
    for f, outs in zip(feeds, run.all_outputs):
        names, want = tu.run_cpu(path, f)
        shapes = {k: v.shape for k, v in f.items()}
        for name, w, a in zip(names, want, outs):
            np.testing.assert_allclose(a, w, rtol=case.rtol, atol=case.atol, err_msg=f"{name} at {shapes}")
    distinct = len({_signature(case, b, s) for b, s in SHAPES})
    partitions = run.created_delta("partitions_compiled")
    assert partitions >= 1
    # One program per partition per distinct input shape, built at its first run.
    assert run.run_delta("shapes_specialized") == partitions * distinct


def _three_shape_runs(kiln_dev, path, case, options):
    feeds = [case.feeds(i, batch=b) for i, b in enumerate([1, 2, 3, 1])]
    return tu.run_kiln(path, kiln_dev, options=options, feeds_seq=feeds)


def test_shape_cache_keeps_recent_shapes(kiln_dev, tmp_path):
    """Batch 1, 2, 3, then 1 again: with the default cache the last run reuses
    batch 1's program; with ``shape_cache=2`` batch 1 was evicted by batch 3."""
    case = ml.mlp(2, 64, 1, "relu", "gemm", dynamic_batch=True, name="mlp_shape_cache")
    path = case.save(str(tmp_path))
    default = _three_shape_runs(kiln_dev, path, case, None)
    assert default.created_delta("partitions_compiled") == 1
    assert default.run_delta("shapes_specialized") == 3
    small = _three_shape_runs(kiln_dev, path, case, {"shape_cache": "2"})
    assert small.run_delta("shapes_specialized") == 4
    for a, b in zip(default.all_outputs, small.all_outputs):
        np.testing.assert_array_equal(a[0], b[0])


@pytest.mark.parametrize("value", ["0", "-1", "x", "1025"])
def test_shape_cache_rejects_bad_values(kiln_dev, tmp_path, value):
    case = ml.mlp(1, 16, 1, "relu", "gemm", dynamic_batch=True, name="mlp_bad_cache")
    err = tu.session_error(case.save(str(tmp_path)), kiln_dev, options={"shape_cache": value})
    tu.assert_invalid_argument(err, "shape_cache", "an integer from 1 to 1024")


def _save(model, tmp_path, name):
    path = str(tmp_path / f"{name}.onnx")
    onnx.save(model, path)
    return path


def test_unknown_rank_is_not_a_scalar(kiln_dev, tmp_path):
    """Reshape to a run-time shape: ORT cannot know the output's rank and
    describes it with no dims, as if it were a scalar. kiln must leave the Relu
    that reads it to ORT (or run it at the real rank), never compile it for []."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [6])
    shape = helper.make_tensor_value_info("shape", TensorProto.INT64, ["n"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["r"], name="reshape"),
        helper.make_node("Relu", ["r"], ["y"], name="relu"),
    ]
    graph = helper.make_graph(nodes, "unknown_rank", [x, shape], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path = _save(model, tmp_path, "unknown_rank")
    data = np.arange(-3, 3, dtype=np.float32)
    feeds = [{"x": data, "shape": np.array(s, np.int64)} for s in ([2, 3], [6], [3, 2, 1])]
    run = tu.run_kiln(path, kiln_dev, feeds_seq=feeds)
    for f, outs in zip(feeds, run.all_outputs):
        np.testing.assert_array_equal(outs[0], np.maximum(data, 0).reshape(f["shape"]))
    assert ("relu", "Relu") not in run.nodes_on(kiln.EP_NAME)


def test_if_branches_reading_the_outer_graph_run(kiln_dev, tmp_path):
    """An ``If`` whose branches compute on the enclosing graph's input, with a
    symbolic batch: ORT asks kiln about the branches too, and what kiln claims
    there (ORT passes the outer value ``x`` to the fused node) runs right at
    every batch size."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])
    cond = helper.make_tensor_value_info("cond", TensorProto.BOOL, [])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])
    one = helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])

    def branch(op, name):
        out = helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, ["batch", 4])
        nodes = [
            helper.make_node(op, ["x", "one_c"], [f"{name}_t"], name=f"{name}_op"),
            helper.make_node("Relu", [f"{name}_t"], [f"{name}_r"], name=f"{name}_relu"),
            helper.make_node("Tanh", [f"{name}_r"], [f"{name}_out"], name=f"{name}_tanh"),
        ]
        return helper.make_graph(nodes, name, [], [out],
                                 initializer=[helper.make_tensor("one_c", TensorProto.FLOAT, [], [1.0])])

    nodes = [helper.make_node("If", ["cond"], ["y"], name="if",
                              then_branch=branch("Add", "then"), else_branch=branch("Sub", "else"))]
    graph = helper.make_graph(nodes, "if_outer", [x, cond], [y], initializer=[one])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path = _save(model, tmp_path, "if_outer")
    rng = np.random.default_rng(0)
    feeds = [{"x": rng.standard_normal((b, 4)).astype(np.float32), "cond": np.array(c)}
             for b, c in [(1, True), (3, False), (2, True)]]
    run = tu.run_kiln(path, kiln_dev, feeds_seq=feeds)
    for f, outs in zip(feeds, run.all_outputs):
        t = f["x"] + 1 if f["cond"] else f["x"] - 1
        np.testing.assert_allclose(outs[0], np.tanh(np.maximum(t, 0)), rtol=1e-6, atol=1e-6)
    on_kiln = run.nodes_on(kiln.EP_NAME)
    assert ("then_tanh", "Tanh") in on_kiln and ("else_tanh", "Tanh") in on_kiln, on_kiln


def test_hf_style_expand_of_a_computed_shape_is_claimed(kiln_dev, tmp_path):
    """``Expand(x, Where(Equal(shape, -1), ones, shape))`` with ``shape`` computed
    from ``Shape`` ops (HF's attention-mask code): kiln evaluates the comparison
    on the shape at each input size, so the whole graph stays in kiln."""
    b = ml.Builder("hf_expand", 17)
    x = b.input("x", TensorProto.FLOAT, ["batch", "seq"], [2, 5])
    shp = b.op("Shape", [x], name="shape")
    neg = b.op("ConstantOfShape", [b.i64([2], "two")], name="cos",
               value=helper.make_tensor("v", TensorProto.INT64, [1], [1]))
    neg = b.op("Mul", [neg, b.i64([-1], "minus1")], name="neg")
    eq = b.op("Equal", [shp, neg], name="eq")
    w = b.op("Where", [eq, b.i64([1, 1], "ones"), shp], name="where")
    u = b.unsqueeze(x, [1], name="unsq")
    e = b.op("Expand", [u, b.op("Concat", [b.op("Slice", [w, b.i64([0], "s0"), b.i64([1], "e1")], name="sl0"),
                                            b.i64([3], "three"),
                                            b.op("Slice", [w, b.i64([1], "s1"), b.i64([2], "e2")], name="sl1")],
                                     name="cat", axis=0)], name="expand")
    b.op("Relu", [e], outputs=["y"], name="relu")
    model = b.model([("y", TensorProto.FLOAT, ["batch", 3, "seq"])])
    path = _save(model, tmp_path, "hf_expand")
    rng = np.random.default_rng(1)
    feeds = [{"x": rng.standard_normal(s).astype(np.float32)} for s in [(2, 5), (1, 9), (3, 2)]]
    run = tu.run_fully_on_kiln(path, kiln_dev, feeds_seq=feeds)
    for f, outs in zip(feeds, run.all_outputs):
        want = np.maximum(np.broadcast_to(f["x"][:, None, :], (f["x"].shape[0], 3, f["x"].shape[1])), 0)
        np.testing.assert_array_equal(outs[0], want)
