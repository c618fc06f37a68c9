"""Activations and Sum (issue #13) run by kiln's kernels, against ORT's CPU EP.

Every model is claimed whole by kiln (EP option ``claim=all``, so the kernel is
tested rather than the claim rule; ``run_fully_on_kiln`` fails if any node is
left to the CPU EP) and compared with ONNX Runtime's CPU EP:

* each op over its attributes (defaults, other values, negative ones), on
  inputs holding NaN, ±inf, ±0, huge and subnormal values, with symbolic
  ``N``/``H``/``W`` run at two sizes from one session;
* ``PRelu`` with the slope shapes ONNX's unidirectional broadcasting allows
  (a CNN's per-channel ``[C, 1, 1]``, a scalar, the whole shape), constant or
  a run-time input; ``Sum`` with 1 to 4 broadcasting inputs;
* the fusions: ``MatMul + bias`` followed by ``HardSwish``, ``HardSigmoid`` or
  ``x * Sigmoid(x)`` (SiLU) becomes one GEMM step (the compiled model's notes
  say so) with the CPU EP's numbers, also after an EPContext round trip; and
  the near misses (``x * Sigmoid(y)``, a HardSigmoid that is not HardSwish's)
  are left unfused and still right.

Exactly rounded results (HardSigmoid, HardSwish, ThresholdedRelu, LeakyRelu,
PRelu: selections and single products) must match bit for bit, zeros' signs
included; results through ``exp`` within rtol 1e-5 / atol 1e-6 (kiln's exp and
MLAS's differ by an ulp or two; ``exp(x) - 1`` near 0 turns that into an
absolute error). The same ops over every kiln target are in test_nonfinite.py.
"""
from __future__ import annotations

import os

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln_testutil as tu
import onnxruntime_ep_kiln as kiln

ALL = {"claim": "all"}
F32 = np.float32
FLOAT = TensorProto.FLOAT

#: special values every test feeds (besides random ones)
SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 3.0, -3.0, 2.9, -2.9, 3.4e38, -3.4e38, 1e-40, -1e-40,
                    -100.0, 100.0, -88.8, -104.0, 0.5, 1e20, -1e20, 1.0, -1.0, 1e-7, -1e-7], F32)

#: symbolic input shape and the two sizes each model runs at (one session)
SYM = ["N", 3, "H", "W"]
SIZES = [(1, 3, 5, 7), (2, 3, 4, 9)]

#: ops whose results are exactly rounded (selections, one product): bits and zero signs must match
EXACT = {"HardSigmoid", "HardSwish", "ThresholdedRelu", "LeakyRelu", "PRelu", "Sum"}


def _model(nodes, inputs, outputs, inits=(), opset=18):
    """inputs/outputs: [(name, dims)] of float tensors (dims may hold strings)."""
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, FLOAT, d) for n, d in inputs],
                          [helper.make_tensor_value_info(n, FLOAT, d) for n, d in outputs],
                          initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)], ir_version=9)


def _save(model, tmp_path, name="m"):
    onnx.checker.check_model(model)
    path = os.path.join(str(tmp_path), f"{name}.onnx")
    onnx.save(model, path)
    return path


def _data(shape, seed, scale=4.0):
    """Random values with every SPECIAL value placed somewhere (when there is room)."""
    rng = np.random.default_rng(seed)
    n = int(np.prod(shape))
    v = (rng.standard_normal(n) * scale).astype(F32)
    k = min(n, len(SPECIAL))
    v[rng.permutation(n)[:k]] = SPECIAL[rng.permutation(len(SPECIAL))[:k]]
    return v.reshape(shape)


def _assert_matches(what, want, got, exact, rtol=1e-5, atol=1e-6):
    assert got.dtype == want.dtype and got.shape == want.shape, f"{what}: {got.dtype}{got.shape} vs {want.shape}"
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=f"{what}: NaN positions")
    if exact:
        np.testing.assert_array_equal(got, want, err_msg=what)
        num = ~np.isnan(want)
        np.testing.assert_array_equal(np.signbit(got[num]), np.signbit(want[num]), err_msg=f"{what}: signs")
    else:
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, equal_nan=True, err_msg=what)


def _check(model, feeds_seq, dev, tmp_path, exact, **tol):
    """Runs every feed of ``feeds_seq`` in one session fully on kiln and compares
    each output with the CPU EP; returns the KilnRun."""
    path = _save(model, tmp_path)
    run = tu.run_fully_on_kiln(path, dev, options=ALL, feeds_seq=feeds_seq)
    assert run.created_delta("partitions_compiled") >= 1
    assert run.run_delta("compute_calls") >= len(feeds_seq), "kiln computed nothing"
    # (ORT may have fused MatMul + Add into Gemm first: count nodes on the CPU EP, not on kiln)
    assert run.nodes_on("CPUExecutionProvider") == [] and run.nodes_on(kiln.EP_NAME)
    for k, (feeds, got) in enumerate(zip(feeds_seq, run.all_outputs)):
        names, want = tu.run_cpu(path, feeds)
        for name, w, g in zip(names, want, got):
            _assert_matches(f"{name} (feed {k})", w, g, exact, **tol)
    return run


# ---- unary activations ----

UNARY = [
    ("HardSigmoid", {}), ("HardSigmoid", {"alpha": 0.3, "beta": 0.4}), ("HardSigmoid", {"alpha": -0.5, "beta": 0.1}),
    ("HardSwish", {}),
    ("Elu", {}), ("Elu", {"alpha": 0.5}), ("Elu", {"alpha": 2.5}),
    ("Selu", {}), ("Selu", {"alpha": 2.0, "gamma": 0.5}),
    ("Celu", {}), ("Celu", {"alpha": 2.0}), ("Celu", {"alpha": 0.5}),
    ("ThresholdedRelu", {}), ("ThresholdedRelu", {"alpha": 0.3}), ("ThresholdedRelu", {"alpha": -1.0}),
    ("Softsign", {}),
    ("LeakyRelu", {}), ("LeakyRelu", {"alpha": -0.5}),
]


def _ids(v):
    return v if isinstance(v, str) else ",".join(f"{k}={x}" for k, x in v.items()) or "defaults"


@pytest.mark.parametrize("op,attrs", UNARY, ids=_ids)
def test_unary_activation(op, attrs, kiln_dev, tmp_path):
    m = _model([helper.make_node(op, ["x"], ["y"], **attrs)], [("x", SYM)], [("y", SYM)])
    feeds = [{"x": _data(s, 3 + i)} for i, s in enumerate(SIZES)]
    _check(m, feeds, kiln_dev, tmp_path, exact=op in EXACT)


def test_activation_defaults_are_onnx_s(kiln_dev, tmp_path):
    """Attributes left out take ONNX's defaults: the same numbers as with them written."""
    x = _data((2, 3, 4, 5), 9)
    defaults = [("HardSigmoid", {"alpha": 0.2, "beta": 0.5}), ("Elu", {"alpha": 1.0}),
                ("Selu", {"alpha": 1.67326319217681884765625, "gamma": 1.05070102214813232421875}),
                ("Celu", {"alpha": 1.0}), ("ThresholdedRelu", {"alpha": 1.0}), ("LeakyRelu", {"alpha": 0.01})]
    nodes, outs = [], []
    for i, (op, attrs) in enumerate(defaults):
        nodes += [helper.make_node(op, ["x"], [f"d{i}"]), helper.make_node(op, ["x"], [f"w{i}"], **attrs)]
        outs += [(f"d{i}", x.shape), (f"w{i}", x.shape)]
    m = _model(nodes, [("x", x.shape)], outs)
    run = _check(m, [{"x": x}], kiln_dev, tmp_path, exact=False)
    got = run.all_outputs[0]
    for i, (op, _) in enumerate(defaults):
        np.testing.assert_array_equal(got[2 * i], got[2 * i + 1], err_msg=op)


# ---- PRelu ----

#: (x dims, slope dims, slope is a constant)
PRELU = [(SYM, [3, 1, 1], True), (SYM, [1], True), (SYM, [], True), ([2, 3, 4, 5], [3, 4, 5], True),
         ([2, 3, 4, 5], [5], True), (SYM, [3, 1, 1], False), (["N", 6], [6], False)]


@pytest.mark.parametrize("xs,ss,const", PRELU, ids=lambda v: str(v))
def test_prelu(xs, ss, const, kiln_dev, tmp_path):
    slope = np.random.default_rng(4).uniform(-1.5, 1.5, ss).astype(F32)
    if slope.size > 1:
        slope.flat[0], slope.flat[1] = 0.0, -0.25  # -inf · 0 = NaN; -0 · (-0.25) stays -0 (x < 0 fails)
    inits = [numpy_helper.from_array(slope, "s")] if const else []
    inputs = [("x", xs)] + ([] if const else [("s", ss)])
    m = _model([helper.make_node("PRelu", ["x", "s"], ["y"])], inputs, [("y", xs)], inits)
    sizes = SIZES if xs == SYM else [tuple(d if isinstance(d, int) else 3 for d in xs)]
    if xs == ["N", 6]:
        sizes = [(1, 6), (7, 6)]
    feeds = []
    for i, s in enumerate(sizes):
        f = {"x": _data(s, 20 + i)}
        if not const:
            f["s"] = slope
        feeds.append(f)
    _check(m, feeds, kiln_dev, tmp_path, exact=True)


def test_prelu_slope_wider_than_x_is_left_to_ort(kiln_dev, tmp_path):
    """A slope that does not broadcast *to* x (ONNX allows only that direction; ORT's CPU EP
    broadcasts both ways and writes a bigger output than the model declares) stays with ORT."""
    slope = np.full((2, 1, 1, 1), 0.5, F32)
    m = _model([helper.make_node("PRelu", ["x", "s"], ["y"])], [("x", [1, 3, 4, 5])], [("y", [1, 3, 4, 5])],
               [numpy_helper.from_array(slope, "s")], opset=16)
    path = _save(m, tmp_path)
    x = _data((1, 3, 4, 5), 50)
    run = tu.run_kiln(path, kiln_dev, {"x": x}, options=ALL)
    assert run.nodes_on(kiln.EP_NAME) == [], run.assignment
    _, want = tu.run_cpu(path, {"x": x})
    np.testing.assert_array_equal(run.outputs[0], want[0])


# ---- Sum ----

SUM_SHAPES = [[(3, 4)], [(3, 4), (3, 4)], [(2, 3, 4), (4,), (3, 1)], [(), (2, 5), (1, 5), (2, 1)],
              [("N", 4), (4,)]]


@pytest.mark.parametrize("shapes", SUM_SHAPES, ids=lambda s: f"{len(s)}in-{s}")
def test_sum(shapes, kiln_dev, tmp_path):
    names = [f"x{i}" for i in range(len(shapes))]
    out = list(np.broadcast_shapes(*[tuple(1 if isinstance(d, str) else d for d in s) for s in shapes]))
    if shapes[0] and shapes[0][0] == "N":
        out[0] = "N"
    m = _model([helper.make_node("Sum", names, ["y"])], [(n, list(s)) for n, s in zip(names, shapes)], [("y", out)])
    runs = [5, 2] if "N" in str(shapes) else [None]
    feeds = []
    for r, n_size in enumerate(runs):
        feeds.append({n: _data(tuple(n_size if d == "N" else d for d in s), 30 + 7 * r + i, scale=1e3)
                      for i, (n, s) in enumerate(zip(names, shapes))})
    # Sum adds left to right, as ORT does: the same bits, even for inf - inf and huge partial sums.
    _check(m, feeds, kiln_dev, tmp_path, exact=True)


# ---- fusions ----

def _gemm_model(act: str, gate_of_other: bool = False, hs_alpha: float = 1 / 6):
    """y = act(x · W + b) for x [M, 32] (M symbolic when asked), act as written by exporters."""
    rng = np.random.default_rng(11)
    w = rng.standard_normal((32, 48)).astype(F32) * 0.5
    b = rng.standard_normal(48).astype(F32)
    nodes = [helper.make_node("MatMul", ["x", "W"], ["mm"]), helper.make_node("Add", ["mm", "B"], ["z"])]
    inputs = [("x", ["M", 32])]
    if act == "Silu":  # x * Sigmoid(x) (YOLOv8's SiLU), or x * Sigmoid(other)
        gate = "g_in" if gate_of_other else "z"
        if gate_of_other:
            inputs.append(("g_in", ["M", 48]))
        nodes += [helper.make_node("Sigmoid", [gate], ["s"]), helper.make_node("Mul", ["z", "s"], ["y"])]
    elif act == "HardSwishWritten":  # x * HardSigmoid(x) with HardSwish's constants (older exports)
        nodes += [helper.make_node("HardSigmoid", ["z"], ["h"], alpha=hs_alpha, beta=0.5),
                  helper.make_node("Mul", ["h", "z"], ["y"])]
    elif act == "HardSigmoid":
        nodes.append(helper.make_node("HardSigmoid", ["z"], ["y"], alpha=0.3, beta=0.6))
    else:
        nodes.append(helper.make_node(act, ["z"], ["y"]))
    inits = [numpy_helper.from_array(w, "W"), numpy_helper.from_array(b, "B")]
    return _model(nodes, inputs, [("y", ["M", 48])], inits)


def _feeds(model, rows, seed):
    f = {"x": _data((rows, 32), seed, scale=2.0)}
    # Products of special values (sums that cancel by order) are test_nonfinite's; here x stays
    # moderate, so the activation sees a range of finite values and the gate specials.
    f["x"][~(np.abs(f["x"]) < 10)] = 1.0
    if any(i.name == "g_in" for i in model.graph.input):
        f["g_in"] = _data((rows, 48), seed + 1)
    return f


def _notes(model, dev, tmp_path):
    """The compiled model's notes (static shapes: M fixed to 7)."""
    static = onnx.ModelProto()
    static.CopyFrom(model)
    for v in list(static.graph.input) + list(static.graph.output):
        v.type.tensor_type.shape.dim[0].dim_value = 7
    data = tu.compile_model(static.SerializeToString(), dev, embed=True, to="bytes", options=ALL)
    return data, " | ".join(tu.notes_of(data))


FUSED = [("Silu", "MatMul+Bias+Silu"), ("HardSwish", "MatMul+Bias+HardSwish"),
         ("HardSwishWritten", "MatMul+Bias+HardSwish"), ("HardSigmoid", "MatMul+Bias+HardSigmoid")]


@pytest.mark.parametrize("act,fused", FUSED, ids=[a for a, _ in FUSED])
def test_gemm_epilogue_fusion(act, fused, kiln_dev, tmp_path):
    m = _gemm_model(act)
    # Numbers: symbolic M at two sizes; HardSwish/HardSigmoid are exact, SiLU goes through exp
    # (atol: ORT's own x * Sigmoid(x) is up to 2.3e-6 off where SiLU is tiny, see test_nonfinite.SILU_ATOL).
    _check(m, [_feeds(m, 7, 1), _feeds(m, 2, 2)], kiln_dev, tmp_path, exact=act != "Silu", rtol=2e-5, atol=2.5e-6)
    data, notes = _notes(m, kiln_dev, tmp_path)
    assert fused in notes and "; 1 steps;" in notes, f"{act}: kiln compiled {notes!r}, expected one {fused}"
    # An EPContext round trip: the fused activation is stored and loaded, same numbers.
    ctx = os.path.join(str(tmp_path), "ctx.onnx")
    with open(ctx, "wb") as f:
        f.write(data)
    feeds = _feeds(m, 7, 3)
    run = tu.run_fully_on_kiln(ctx, kiln_dev, feeds, options=ALL)
    names, want = tu.run_cpu(_save(m, tmp_path, "orig"), feeds)
    _assert_matches(f"{act} from {os.path.basename(ctx)}", want[0], run.outputs[0], exact=False, rtol=2e-5,
                    atol=2.5e-6)


@pytest.mark.parametrize("case", ["sigmoid_of_another_value", "hardsigmoid_not_hardswish"])
def test_near_misses_are_not_fused(case, kiln_dev, tmp_path):
    if case == "sigmoid_of_another_value":
        m = _gemm_model("Silu", gate_of_other=True)
    else:
        m = _gemm_model("HardSwishWritten", hs_alpha=0.2)
    _check(m, [_feeds(m, 7, 4)], kiln_dev, tmp_path, exact=False, rtol=2e-5, atol=2.5e-6)
    _, notes = _notes(m, kiln_dev, tmp_path)
    assert "Silu" not in notes and "HardSwish" not in notes, notes
    # The gate and the Mul stay two ops (which the elementwise chain pass
    # then runs in one pass: `Chain(Sigmoid+Mul)`).
    gate = "Sigmoid" if case == "sigmoid_of_another_value" else "HardSigmoid"
    assert f"Chain({gate}+Mul) x1" in notes, notes


def test_silu_alone_is_one_step(kiln_dev, tmp_path):
    """x * Sigmoid(x) with nothing to fuse into becomes one SiLU step (symbolic dims)."""
    m = _model([helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["s", "x"], ["y"])],
               [("x", SYM)], [("y", SYM)])
    _check(m, [{"x": _data(s, 40 + i)} for i, s in enumerate(SIZES)], kiln_dev, tmp_path, exact=False, atol=2.5e-6)
    static = _model(m.graph.node, [("x", [1, 3, 4, 5])], [("y", [1, 3, 4, 5])])
    data = tu.compile_model(static.SerializeToString(), kiln_dev, embed=True, to="bytes", options=ALL)
    notes = " | ".join(tu.notes_of(data))
    assert "Silu x1; 1 steps;" in notes, notes


def test_silu_is_accurate_where_ort_s_is_not(kiln_dev, tmp_path):
    """README "Numerics", deliberate differences: ORT's x * Sigmoid(x) is up to ~2.3e-6 off the true
    SiLU in the sigmoid's tail (MLAS's sigmoid); kiln's fused SiLU is accurate. If ORT's error
    changes, this fails and the README (and SILU_ATOL in test_nonfinite.py) must follow."""
    x = np.linspace(-30, 30, 60001).astype(F32)
    m = _model([helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["y"])],
               [("x", list(x.shape))], [("y", list(x.shape))])
    path = _save(m, tmp_path)
    xd = x.astype(np.float64)
    true = xd / (1 + np.exp(-xd))
    _, (ort_y,) = tu.run_cpu(path, {"x": x})
    # where SiLU is tiny (x < 0) the error is absolute; above, it stays within rtol
    ort_err = np.where(x < 0, np.abs(ort_y - true), 0)
    assert 1e-6 < ort_err.max() <= 2.5e-6, ort_err.max()
    assert -20 <= x[np.argmax(ort_err)] <= -10, x[np.argmax(ort_err)]
    np.testing.assert_allclose(ort_y[x >= 0], true[x >= 0], rtol=2e-7)
    run = tu.run_fully_on_kiln(path, kiln_dev, {"x": x}, options=ALL)
    kiln_err = np.abs(run.outputs[0] - true)
    assert np.all(kiln_err <= 4e-7 * np.abs(true) + 1e-30), kiln_err.max()


def test_every_activation_through_a_compiled_model(kiln_dev, tmp_path):
    """One model with every op of this file and symbolic N/H/W, compiled to an EPContext model
    (a shape-generic record) and loaded: kiln compiles nothing, runs two sizes from one session,
    and matches the CPU EP on the original."""
    chain = [("HardSigmoid", {"alpha": 0.3, "beta": 0.4}), ("Elu", {"alpha": 0.5}), ("Selu", {}),
             ("Celu", {"alpha": 2.0}), ("ThresholdedRelu", {"alpha": -0.5}), ("Softsign", {}),
             ("HardSwish", {}), ("LeakyRelu", {"alpha": 0.2})]
    nodes, v = [], "x"
    for i, (op, attrs) in enumerate(chain):
        nodes.append(helper.make_node(op, [v], [f"a{i}"], **attrs))
        v = f"a{i}"
    nodes += [helper.make_node("PRelu", [v, "s"], ["p"]), helper.make_node("Sigmoid", ["p"], ["g"]),
              helper.make_node("Mul", ["p", "g"], ["silu"]), helper.make_node("Sum", ["silu", "x", "p"], ["y"])]
    slope = np.array([-0.5, 0.25, 2.0], F32).reshape(3, 1, 1)
    m = _model(nodes, [("x", SYM)], [("y", SYM)], [numpy_helper.from_array(slope, "s")])
    src = _save(m, tmp_path, "chain")
    ctx = os.path.join(str(tmp_path), "chain_ctx.onnx")
    tu.compile_model(src, kiln_dev, embed=False, output=ctx, options=ALL)
    feeds = [{"x": _data(s, 60 + i)} for i, s in enumerate(SIZES)]
    run = tu.run_fully_on_kiln(ctx, kiln_dev, options=ALL, feeds_seq=feeds)
    assert run.created_delta("context_graphs_loaded") == 1
    assert run.created_delta("partitions_compiled") == 0, "the compiled model was compiled again"
    for k, (f, got) in enumerate(zip(feeds, run.all_outputs)):
        _, want = tu.run_cpu(src, f)
        _assert_matches(f"chain (feed {k})", want[0], got[0], exact=False, atol=2.5e-6)
