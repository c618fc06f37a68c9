"""float16 at a partition's edge (issue #12).

kiln holds float16 tensors, casts them to and from the other types and moves
them (Transpose, Reshape, Concat, Slice, Gather, Identity, ...), but computes
nothing on them: ORT's CPU EP runs float16 ops in float over groups of nodes
it casts together, which kiln cannot match node by node, so float16
arithmetic stays with ORT (kiln's log says why). Casts are compared with the
CPU EP bit for bit (every float16, float edge cases: NaN payloads, ties,
subnormals, overflow); the float body between the Casts within kiln's usual
tolerance. Every test passes ``claim=all``, so it tests kiln's kernels rather
than the claim cost rule.
"""
from __future__ import annotations

import os

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP, helper, numpy_helper

import kiln_testutil as tu
import onnxruntime_ep_kiln as kiln

ALL = {"claim": "all"}
AS_WRITTEN = ort.GraphOptimizationLevel.ORT_DISABLE_ALL


def _model(nodes, inputs, outputs, inits=(), opset=17):
    graph = helper.make_graph(nodes, "f16", inputs, outputs, initializer=list(inits))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    onnx.checker.check_model(m, full_check=True)
    return m


def _save(m, tmp_path, name):
    path = os.path.join(str(tmp_path), f"{name}.onnx")
    onnx.save(m, path)
    return path


def _cast_model(src, dsts):
    """x (src) -> one Cast per destination type, each an output."""
    nodes = [helper.make_node("Cast", ["x"], [f"y{i}"], name=f"cast{i}", to=t) for i, t in enumerate(dsts)]
    outs = [helper.make_tensor_value_info(f"y{i}", t, ["n"]) for i, t in enumerate(dsts)]
    return _model(nodes, [helper.make_tensor_value_info("x", src, ["n"])], outs)


def _bits(a):
    return a.view({2: np.uint16, 4: np.uint32, 8: np.uint64, 1: np.uint8}[a.dtype.itemsize])


def _assert_bit_exact(names, want, got):
    for name, w, g in zip(names, want, got):
        assert w.dtype == g.dtype and w.shape == g.shape, name
        diff = np.nonzero(_bits(w) != _bits(g))[0]
        assert diff.size == 0, (f"{name}: {diff.size} elements differ, first at {diff[:5]}: "
                                f"cpu {_bits(w)[diff[:5]]} kiln {_bits(g)[diff[:5]]}")


def _on_kiln(run):
    return {name for name, _ in run.nodes_on(kiln.EP_NAME)}


def _edge_f32():
    """Every float16 and the midpoints around it, NaN payloads, overflow, random bits."""
    h = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
    exact = h.astype(np.float32).view(np.uint32)
    exact = exact[(exact & 0x7f800000) != 0x7f800000]
    mids = exact.astype(np.uint64) + 0x1000
    near = np.concatenate([exact, mids, mids - 1, mids + 1, exact + 1, exact - 1]).astype(np.uint32)
    special = np.array([0x7f800001, 0x7fbfffff, 0x7fc00000, 0x7f802000, 0xffc12345, 0x7f7fffff,
                        0x477ff000, 0x477fefff, 0x33000000, 0x33000001, 0x00000001, 0x80000000,
                        0x7f800000, 0xff800000], dtype=np.uint32)
    rng = np.random.default_rng(12)
    rand = rng.integers(0, 2 ** 32, 100_000, dtype=np.uint64).astype(np.uint32)
    return np.concatenate([near, special, rand]).view(np.float32)


def _compare_casts(path, kiln_dev, feeds):
    names, want = tu.run_cpu(path, feeds, opt_level=AS_WRITTEN)
    run = tu.run_fully_on_kiln(path, kiln_dev, feeds, options=ALL, opt_level=AS_WRITTEN)
    _assert_bit_exact(names, want, run.outputs)
    return run


def test_float16_to_every_type_bit_exact_over_all_float16s(kiln_dev, tmp_path):
    path = _save(_cast_model(TP.FLOAT16, [TP.FLOAT, TP.INT64, TP.INT32, TP.BOOL, TP.FLOAT16]), tmp_path, "from16")
    every = np.arange(65536, dtype=np.uint32).astype(np.uint16).view(np.float16)
    run = _compare_casts(path, kiln_dev, {"x": every})
    assert _on_kiln(run) == {f"cast{i}" for i in range(5)}


def test_float_and_ints_to_float16_bit_exact(kiln_dev, tmp_path):
    path = _save(_cast_model(TP.FLOAT, [TP.FLOAT16]), tmp_path, "to16")
    _compare_casts(path, kiln_dev, {"x": _edge_f32()})
    ints = np.array([0, 1, -1, 2049, 2051, 4097, 65504, 65519, 65520, -65520, 70000,
                     2 ** 24 + 1, 2 ** 31 - 1, -2 ** 31], dtype=np.int64)
    for src, dtype in [(TP.INT64, np.int64), (TP.INT32, np.int32)]:
        path = _save(_cast_model(src, [TP.FLOAT16]), tmp_path, f"int{src}")
        _compare_casts(path, kiln_dev, {"x": ints.astype(dtype)})
    path = _save(_cast_model(TP.BOOL, [TP.FLOAT16]), tmp_path, "bool")
    _compare_casts(path, kiln_dev, {"x": np.array([True, False, True])})


def _mixed_precision(batch_dim="batch", weights16=False):
    """The usual mixed-precision export: x(f16) -> Cast(f32) -> MatMul + bias ->
    Relu -> Cast(f16) -> y; besides, x moved as float16 (Transpose, Reshape,
    Slice, Concat, Gather, Identity) to outputs of their own."""
    rng = np.random.default_rng(3)
    w = (rng.standard_normal((16, 8)) / 4).astype(np.float32)
    b = (rng.standard_normal(8) / 4).astype(np.float32)
    inits = [numpy_helper.from_array(b, "b"),
             numpy_helper.from_array(np.array([-1, 4, 4], np.int64), "shape"),
             numpy_helper.from_array(np.array([1], np.int64), "s0"),
             numpy_helper.from_array(np.array([9], np.int64), "s1"),
             numpy_helper.from_array(np.array([1], np.int64), "ax"),
             numpy_helper.from_array(np.array([3, 0, 15], np.int64), "idx")]
    nodes = [helper.make_node("Cast", ["x"], ["xf"], name="cast_in", to=TP.FLOAT)]
    if weights16:
        inits.append(numpy_helper.from_array(w.astype(np.float16), "w16"))
        nodes.append(helper.make_node("Cast", ["w16"], ["w"], name="cast_w", to=TP.FLOAT))
    else:
        inits.append(numpy_helper.from_array(w, "w"))
    nodes += [
        helper.make_node("MatMul", ["xf", "w"], ["mm"], name="matmul"),
        helper.make_node("Add", ["mm", "b"], ["mb"], name="bias"),
        helper.make_node("Relu", ["mb"], ["r"], name="relu"),
        helper.make_node("Cast", ["r"], ["y"], name="cast_out", to=TP.FLOAT16),
        helper.make_node("Transpose", ["x"], ["t"], name="transpose", perm=[1, 0]),
        helper.make_node("Reshape", ["x", "shape"], ["rs"], name="reshape"),
        helper.make_node("Slice", ["x", "s0", "s1", "ax"], ["sl"], name="slice"),
        helper.make_node("Concat", ["x", "x"], ["cc"], name="concat", axis=1),
        helper.make_node("Gather", ["x", "idx"], ["g"], name="gather", axis=1),
        helper.make_node("Identity", ["g"], ["gi"], name="identity"),
    ]
    inputs = [helper.make_tensor_value_info("x", TP.FLOAT16, [batch_dim, 16])]
    outputs = [helper.make_tensor_value_info("y", TP.FLOAT16, [batch_dim, 8]),
               helper.make_tensor_value_info("t", TP.FLOAT16, [16, batch_dim]),
               helper.make_tensor_value_info("rs", TP.FLOAT16, [batch_dim, 4, 4]),
               helper.make_tensor_value_info("sl", TP.FLOAT16, [batch_dim, 8]),
               helper.make_tensor_value_info("cc", TP.FLOAT16, [batch_dim, 32]),
               helper.make_tensor_value_info("gi", TP.FLOAT16, [batch_dim, 3])]
    return _model(nodes, inputs, outputs, inits)


def _x16(batch, seed):
    x = np.random.default_rng(seed).standard_normal((batch, 16)).astype(np.float16)
    x[0, :3] = [np.nan, np.inf, -0.0]
    return {"x": x}


def _check_mixed(path, kiln_dev, feeds_seq, opt_level=None):
    run = tu.run_fully_on_kiln(path, kiln_dev, options=ALL, feeds_seq=feeds_seq, opt_level=opt_level)
    for feeds, outs in zip(feeds_seq, run.all_outputs):
        names, want = tu.run_cpu(path, feeds, opt_level=opt_level)
        # The float body rounds to float16 once at the end: equal, or one float16 ulp off.
        np.testing.assert_allclose(outs[0].astype(np.float32), want[0].astype(np.float32),
                                   rtol=1e-3, atol=1e-6, err_msg=f"y at batch {feeds['x'].shape[0]}")
        _assert_bit_exact(names[1:], want[1:], outs[1:])
    return run


@pytest.mark.parametrize("weights16", [False, True], ids=["f32_weights", "f16_weights"])
def test_mixed_precision_block_runs_on_kiln_at_two_batch_sizes(kiln_dev, tmp_path, weights16):
    path = _save(_mixed_precision(weights16=weights16), tmp_path, f"mixed_{weights16}")
    run = _check_mixed(path, kiln_dev, [_x16(2, 0), _x16(5, 1), _x16(2, 2)], opt_level=AS_WRITTEN)
    kiln_nodes = _on_kiln(run)
    assert {"cast_in", "cast_out", "matmul", "relu", "transpose", "concat", "gather"} <= kiln_nodes
    # A float16 weight's Cast is kiln's too (folded when kiln compiles the partition).
    assert ("cast_w" in kiln_nodes) == weights16
    # One program per partition for each of the two batch sizes.
    assert run.run_delta("shapes_specialized") == 2 * run.created_delta("partitions_compiled")
    # ORT's own optimisations first (e.g. folding the weight's Cast): still all on kiln.
    _check_mixed(path, kiln_dev, [_x16(3, 4)])


def test_float16_arithmetic_is_left_to_ort(kiln_dev, tmp_path, capfd):
    """Add on float16 stays with ORT (kiln logs why), and so do the Casts on
    either side of it: ORT's CPU EP computes that Add in float and drops the
    float -> float16 -> float Cast pairs it owns, so ORT alone never rounds
    the values to float16 there; a Cast run by kiln would. The float Relu
    after them is kiln's, and the results are ORT's bit for bit."""
    nodes = [helper.make_node("Cast", ["x"], ["h"], name="to16", to=TP.FLOAT16),
             helper.make_node("Add", ["h", "h"], ["s"], name="add16"),
             helper.make_node("Cast", ["s"], ["f"], name="to32", to=TP.FLOAT),
             helper.make_node("Relu", ["f"], ["y"], name="relu")]
    m = _model(nodes, [helper.make_tensor_value_info("x", TP.FLOAT, ["n", 4])],
               [helper.make_tensor_value_info("y", TP.FLOAT, ["n", 4])])
    path = _save(m, tmp_path, "arith16")
    feeds = {"x": np.random.default_rng(5).standard_normal((6, 4)).astype(np.float32) * 1000}
    names, want = tu.run_cpu(path, feeds, opt_level=AS_WRITTEN)
    assert not np.array_equal(want[0], np.maximum(2 * feeds["x"].astype(np.float16).astype(np.float32), 0)), \
        "ORT alone no longer skips the float16 rounding: this test no longer shows why the Casts stay with ORT"
    capfd.readouterr()
    ort.set_default_logger_severity(0)
    try:
        run = tu.run_kiln(path, kiln_dev, feeds, options=ALL, opt_level=AS_WRITTEN)
    finally:
        ort.set_default_logger_severity(2)
    log = capfd.readouterr().err
    _assert_bit_exact(names, want, run.outputs)
    assert _on_kiln(run) == {"relu"}
    cpu = {name for name, _ in run.nodes_on("CPUExecutionProvider")}
    assert {"to16", "add16", "to32"} <= cpu
    # kiln's VERBOSE line per node left to ORT (stderr, at ORT's log level 0).
    assert "leaving node" in log and "add16" in log, log[-3000:]
    assert "float16 arithmetic to ORT" in log, log[-3000:]
    assert "ORT's CPU EP drops the Cast pairs" in log, log[-3000:]


def test_float16_moved_between_ort_casts(kiln_dev, tmp_path):
    """A float16 Transpose between ORT's float16 ops: kiln moves the float16
    values; ORT rounds to float16 there as well (its Transpose has a float16
    kernel), so the results agree bit for bit."""
    nodes = [helper.make_node("Cast", ["x"], ["h"], name="to16", to=TP.FLOAT16),
             helper.make_node("Transpose", ["h"], ["t"], name="transpose16"),
             helper.make_node("Add", ["t", "t"], ["s"], name="add16"),
             helper.make_node("Cast", ["s"], ["y"], name="to32", to=TP.FLOAT)]
    m = _model(nodes, [helper.make_tensor_value_info("x", TP.FLOAT, ["n", 4])],
               [helper.make_tensor_value_info("y", TP.FLOAT, [4, "n"])])
    path = _save(m, tmp_path, "move16")
    feeds = {"x": np.random.default_rng(6).standard_normal((5, 4)).astype(np.float32) * 1000}
    names, want = tu.run_cpu(path, feeds, opt_level=AS_WRITTEN)
    run = tu.run_kiln(path, kiln_dev, feeds, options=ALL, opt_level=AS_WRITTEN)
    _assert_bit_exact(names, want, run.outputs)
    assert {"to16", "transpose16"} <= _on_kiln(run)


def test_compiled_model_round_trip(kiln_dev, tmp_path):
    """EPContext: compile once, load the _ctx.onnx (no compiling), same outputs;
    float16 partition inputs and outputs keep their type in the compiled model."""
    src = _save(_mixed_precision(weights16=True), tmp_path, "mixed_ctx")
    ctx = os.path.join(str(tmp_path), "mixed_ctx_ctx.onnx")
    tu.compile_model(src, kiln_dev, embed=False, output=ctx, options=ALL)
    nodes = tu.ep_context_nodes(ctx)
    assert nodes, "no EPContext node in the compiled model"
    loaded = onnx.load(ctx)
    assert loaded.graph.input[0].type.tensor_type.elem_type == TP.FLOAT16
    assert loaded.graph.output[0].type.tensor_type.elem_type == TP.FLOAT16
    feeds_seq = [_x16(2, 7), _x16(4, 8)]
    run = tu.run_kiln(ctx, kiln_dev, options=ALL, feeds_seq=feeds_seq)
    assert run.created_delta("partitions_compiled") == 0
    for feeds, outs in zip(feeds_seq, run.all_outputs):
        names, want = tu.run_cpu(src, feeds)
        np.testing.assert_allclose(outs[0].astype(np.float32), want[0].astype(np.float32), rtol=1e-3, atol=1e-6)
        _assert_bit_exact(names[1:], want[1:], outs[1:])
