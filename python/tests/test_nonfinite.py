"""Non-finite and extreme numbers: kiln gives what ORT's CPU EP gives (issue #10, defect 8).

Every case is a small ONNX model built here with ``onnx.helper`` — one op, or a
pattern kiln fuses (erf-/tanh-GELU written out, LayerNorm and Softmax
decomposed, SiLU and HardSwish written out, MatMul/Gemm with bias, activation
and residual epilogues) — fed
with tensors full of special values: ±inf, NaN, ±1e38, ±3.4e38, FLT_MAX,
subnormals, ±0, the edges where exp/erf/tanh saturate, and zero-sized
dimensions. Each runs on ORT's CPU EP alone and on kiln for every kiln target
this CPU can run (the ``target`` EP option picks the lower ones), in the same
graph-optimization level (``raw``: ``ORT_DISABLE_ALL``, so kiln sees and fuses
the graph as written; pattern cases also at ORT's default level).

kiln must take every node (``session.disable_cpu_ep_fallback=1``) and run it
(its counters), and the outputs must agree **NaN-aware**: the same NaN
positions, the same infinities with the same sign, integers and bools exactly,
finite values within ``rtol=1e-5`` / ``atol=1e-6`` (kiln's exp/erf/tanh
approximations differ from MLAS's by a few ulp). The sign of a zero is compared
for the exactly rounded ops (``EXACT_OPS``: Neg, Abs, Relu, Sqrt, Add, Div, Where, …),
not for approximations, which round tiny results to either zero.

Deliberate difference (README "Numerics"): ``ReduceMax`` is NaN when the
reduced values contain a NaN. ORT 1.31.1's result there depends on the NaN's
position and the tensor's layout (a NaN first in the row propagates, elsewhere
it is skipped or, in multi-row last-axis reductions, even yields a value that
is not the maximum); ``test_ort_reduce_max_nan_depends_on_position`` pins that
behaviour so the README's statement stays true.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as TP
from onnx import helper as oh
from onnx import numpy_helper as nh

import kiln_testutil as tu
import onnxruntime_ep_kiln as kiln

F32 = np.float32
INF, NAN = np.inf, np.nan
FMAX = np.finfo(F32).max
TINY = np.finfo(F32).tiny  # smallest normal
RTOL, ATOL = 1e-5, 1e-6
RAW = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
OPT = ort.GraphOptimizationLevel.ORT_ENABLE_ALL

#: every special value, plus the edges where exp / erf / tanh / sigmoid saturate
SPECIAL = np.array([
    INF, -INF, NAN, 1e38, -1e38, 3.4e38, -3.4e38, FMAX, -FMAX, 1e20, -1e20, 1e10, -1e10,
    TINY, -TINY, 1e-40, -1e-40, 1.4e-45, -1.4e-45, 0.0, -0.0, 1.0, -1.0, 0.5, -0.5,
    88.7, 88.73, 89.0, -87.4, -88.8, -103.9, -104.0, 100.0, -100.0, 44.4, -44.4, 10.0, -10.0,
    10.5, -10.5, 5.0, -5.0, 3.9, -3.9, 9.0, -9.0, 20.0, -20.0, 1e-7, -1e-7,
], dtype=F32)


def special_vector(n_repeat: int = 3) -> np.ndarray:
    """SPECIAL in several orders and a tail, so SIMD bodies and scalar tails both see each value."""
    rng = np.random.default_rng(7)
    parts = [SPECIAL, SPECIAL[::-1]] + [rng.permutation(SPECIAL) for _ in range(n_repeat - 2)]
    return np.concatenate(parts + [SPECIAL[:7]]).astype(F32)


# --------------------------------------------------------------------------
# model building
# --------------------------------------------------------------------------
def vi(name: str, shape: Sequence[int], t: int = TP.FLOAT):
    return oh.make_tensor_value_info(name, t, list(shape))


def model(nodes, inputs, outputs, inits=(), opset: int = 20) -> bytes:
    g = oh.make_graph(nodes, "nonfinite", inputs, outputs, initializer=list(inits))
    m = oh.make_model(g, opset_imports=[oh.make_opsetid("", opset)])
    m.ir_version = 10
    return m.SerializeToString()


def const(name: str, value) -> object:
    return nh.from_array(np.asarray(value), name)


@dataclass
class Case:
    name: str
    model: bytes
    feeds: Dict[str, np.ndarray]
    #: also compare at ORT's default optimization level (for fused patterns)
    levels: Sequence = (RAW,)
    #: a word kiln's compiled-program notes must contain (proves the fusion fired)
    fused: Optional[str] = None
    #: the documented deliberate differences: maps ORT's outputs to what kiln must give
    expect: Optional[Callable[[List[np.ndarray]], List[np.ndarray]]] = None
    rtol: float = RTOL
    atol: float = ATOL
    #: kiln runs nothing (every output is empty): only the claim is checked
    empty: bool = False
    #: exact IEEE ops: the sign of a zero must match too
    signed_zero: bool = False
    notes: List[str] = field(default_factory=list)


def unary_case(op: str, x: np.ndarray, opset: int = 20, inits=(), extra_inputs=(), **attrs) -> Case:
    name = op + "".join(f"_{k}={v}" for k, v in attrs.items())
    nodes = [oh.make_node(op, ["x", *extra_inputs], ["y"], **attrs)]
    return Case(name, model(nodes, [vi("x", x.shape)], [vi("y", x.shape)], inits, opset), {"x": x})


def unary_cases() -> List[Case]:
    x = special_vector()
    cases = [unary_case(op, x) for op in
             ("Erf", "Tanh", "Sigmoid", "Exp", "Log", "Sqrt", "Reciprocal", "Abs", "Neg", "Relu")]
    cases += [
        unary_case("LeakyRelu", x, alpha=0.1),
        unary_case("Gelu", x),
        unary_case("Gelu", x, approximate="tanh"),
        unary_case("Clip", x, 13, [const("lo", F32(-1.0)), const("hi", F32(1.0))], ["lo", "hi"]),
        unary_case("Clip", x, 13, [const("lo", F32(0.0))], ["lo"]),
    ]
    cases[-2].name, cases[-1].name = "Clip_-1_1", "Clip_min0"
    # Activations (issue #13).
    cases += [unary_case(op, x, **attrs) for op, attrs in (
        ("HardSigmoid", {}), ("HardSigmoid", {"alpha": -0.5, "beta": 0.1}), ("HardSwish", {}), ("Elu", {}),
        ("Elu", {"alpha": 0.5}), ("Selu", {}), ("Celu", {}), ("Celu", {"alpha": 2.0}), ("ThresholdedRelu", {}),
        ("Softsign", {}))]
    for name, slope in (("PRelu_scalar", [0.25]), ("PRelu_negative", [-0.25]), ("PRelu_zero", [0.0])):
        cases.append(unary_case("PRelu", x, 16, [const("s", np.array(slope, F32))], ["s"]))
        cases[-1].name = name
    for c in cases:
        c.signed_zero = c.name.split("_")[0] in EXACT_OPS
    # 2-D, a shape whose rows are not a multiple of any vector width
    x2 = np.resize(special_vector(5), (7, 37)).astype(F32)
    cases.append(unary_case("Erf", x2))
    cases[-1].name = "Erf_7x37"
    return cases


#: ``x · Sigmoid(x)`` on ORT's CPU EP is off the true SiLU by up to 2.3e-6 (measured over [-30, 30]: MLAS's
#: sigmoid is ~5e-8 off below x ≈ -15 and 0 below -18, which x multiplies); kiln's SiLU is accurate
#: (``x / (1 + e^-x)``), so the two differ by that much where SiLU is tiny (README "Numerics").
SILU_ATOL = 2.5e-6

#: ops whose results are exactly rounded IEEE operations (or selections), so zeros keep their sign
EXACT_OPS = {"Abs", "Neg", "Relu", "LeakyRelu", "Sqrt", "Reciprocal", "Clip", "Add", "Sub", "Mul", "Div", "Where",
             "HardSigmoid", "HardSwish", "ThresholdedRelu", "PRelu", "Elu", "Selu", "Celu", "Softsign"}

PAIR = np.array([INF, -INF, NAN, 0.0, -0.0, 1.0, -1.0, 2.0, 0.5, -0.5, 3.0, -3.0, 1e38, -1e38, 3.4e38,
                 1e-40, -2.0, 1.5, 1e20], dtype=F32)


def binary_cases() -> List[Case]:
    a, b = np.repeat(PAIR, len(PAIR)), np.tile(PAIR, len(PAIR))
    col, row = PAIR.reshape(-1, 1), PAIR.reshape(1, -1)
    n = len(PAIR)
    cases = []
    for op in ("Add", "Sub", "Mul", "Div", "Pow"):
        nodes = [oh.make_node(op, ["a", "b"], ["y"])]
        cases.append(Case(f"{op}_pairs", model(nodes, [vi("a", a.shape), vi("b", b.shape)], [vi("y", a.shape)]),
                          {"a": a, "b": b}))
        cases.append(Case(f"{op}_broadcast", model(nodes, [vi("a", [n, 1]), vi("b", [1, n])], [vi("y", [n, n])]),
                          {"a": col, "b": row}))
    x = special_vector()
    for e in (2.0, 3.0, 0.5, 1.0, -1.0, 1.5, 0.0):
        nodes = [oh.make_node("Pow", ["x", "e"], ["y"])]
        cases.append(Case(f"Pow_const_{e}", model(nodes, [vi("x", x.shape)], [vi("y", x.shape)],
                                                   [const("e", F32(e))]), {"x": x}))
    # Where selects special values untouched
    cond = (np.arange(len(x)) % 3 == 0)
    nodes = [oh.make_node("Where", ["c", "x", "y"], ["z"])]
    for c in cases:
        c.signed_zero = c.name.split("_")[0] in EXACT_OPS
    cases.append(Case("Where", signed_zero=True, model=model(nodes, [vi("c", x.shape, TP.BOOL), vi("x", x.shape), vi("y", x.shape)],
                                     [vi("z", x.shape)]), feeds={"c": cond, "x": x, "y": x[::-1].copy()}))
    return cases


def cast_cases() -> List[Case]:
    x = np.concatenate([special_vector(), np.array([2.2e9, -2.2e9, 2147483520.0, 2147483648.0, -2147483648.0,
                                                    -2147483904.0, 9.2e18, 9.3e18, -9.3e18, 2.5, -2.5, 0.7,
                                                    -0.7], F32)])
    cases = []
    for t, tn in ((TP.INT32, "int32"), (TP.INT64, "int64"), (TP.BOOL, "bool")):
        nodes = [oh.make_node("Cast", ["x"], ["y"], to=t)]
        cases.append(Case(f"Cast_{tn}", model(nodes, [vi("x", x.shape)], [vi("y", x.shape, t)]), {"x": x}))
    return cases


# rows that exercise every branch of the row statistics
def norm_rows(n: int) -> np.ndarray:
    rng = np.random.default_rng(n)
    h = n // 2
    rows = [
        np.full(n, 1e38), np.full(n, -3.4e38), np.r_[np.full(n - 1, 3.4e38), [-3.4e38]],
        np.resize([3.4e38, -3.4e38], n), np.r_[[1e20], np.ones(n - 1)], np.r_[np.full(n - 1, 1e19), [-1e19]],
        np.r_[[INF], np.arange(n - 1)], np.r_[np.arange(n - 1), [-INF]], np.r_[np.arange(n - 1), [NAN]],
        np.full(n, INF), np.full(n, -INF), np.zeros(n), np.full(n, -0.0), np.resize([1e-40, 3e-40], n),
        np.r_[[2.0 ** 30] * (n - h), [2.0 ** 30 + 256] * h], np.arange(n) + 1e7, np.arange(n) * 1e30,
        np.resize([1.5e19, -1.5e19], n), np.full(n, 88.8), np.resize([100.0, -100.0], n),
        np.resize([1e38, -INF], n), rng.standard_normal(n), rng.standard_normal(n) * 1e30,
    ]
    return np.array(rows, dtype=F32)


def order_dependent(row: np.ndarray) -> bool:
    """Rows whose f32 sum depends on the summation order: partial sums that overflow with mixed
    signs (inf + -inf = NaN in one order, a finite value or one infinity in another), or a mean that
    f32 rounding leaves inexact while the spread is tiny (so ``x - mean`` is all rounding error).
    ORT sums in its own SIMD order and kiln in 16 lanes; both are right, neither is comparable."""
    r = row.astype(np.float64)
    fin = r[np.isfinite(r)]
    if np.isnan(r).any() or fin.size == 0:
        return False
    mixed = (r > 0).any() and (r < 0).any()
    if np.abs(fin).sum() > FMAX:
        return mixed  # one sign: every order overflows
    exact_sum = np.sum(fin) == np.float64(np.float32(np.sum(fin)))
    spread = fin.max() - fin.min()
    return not exact_sum and np.isfinite(r).all() and spread < 1e-4 * np.abs(fin).max() * len(fin)


def comparable_rows(n: int) -> np.ndarray:
    return np.array([r for r in norm_rows(n) if not order_dependent(r)], F32)


def layernorm_cases() -> List[Case]:
    cases = []
    for n in (1, 4, 7, 8, 9, 16, 33, 768):
        x = norm_rows(n)
        scale = np.linspace(0.5, 1.5, n).astype(F32)
        bias = np.linspace(-0.25, 0.25, n).astype(F32)
        nodes = [oh.make_node("LayerNormalization", ["x", "s", "b"], ["y"], axis=-1, epsilon=1e-5)]
        cases.append(Case(f"LayerNormalization_{n}",
                          model(nodes, [vi("x", x.shape), vi("s", [n]), vi("b", [n])], [vi("y", x.shape)],
                                opset=17), {"x": x, "s": scale, "b": bias}))
        if n in (4, 16, 768):
            cases.append(decomposed_layernorm(comparable_rows(n), scale, bias))
    # epsilon 0: a constant row divides 0 by 0; a subnormal spread divides by a tiny std
    x = norm_rows(16)
    nodes = [oh.make_node("LayerNormalization", ["x", "s"], ["y"], axis=-1, epsilon=0.0)]
    cases.append(Case("LayerNormalization_eps0_nobias",
                      model(nodes, [vi("x", x.shape), vi("s", [16])], [vi("y", x.shape)], opset=17),
                      {"x": x, "s": np.ones(16, F32)}))
    return cases


def decomposed_layernorm(x: np.ndarray, scale: np.ndarray, bias: np.ndarray) -> Case:
    """ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div/Mul/Add: kiln fuses it, ORT runs it op by op
    (raw) or fuses it into LayerNormalization itself (ORT's default level)."""
    n = x.shape[1]
    nodes = [
        oh.make_node("ReduceMean", ["x", "ax"], ["mu"], keepdims=1),
        oh.make_node("Sub", ["x", "mu"], ["d"]),
        oh.make_node("Pow", ["d", "two"], ["d2"]),
        oh.make_node("ReduceMean", ["d2", "ax"], ["var"], keepdims=1),
        oh.make_node("Add", ["var", "eps"], ["ve"]),
        oh.make_node("Sqrt", ["ve"], ["sd"]),
        oh.make_node("Div", ["d", "sd"], ["nx"]),
        oh.make_node("Mul", ["nx", "g"], ["sx"]),
        oh.make_node("Add", ["sx", "beta"], ["y"]),
    ]
    inits = [const("ax", np.array([-1], np.int64)), const("two", F32(2.0)), const("eps", F32(1e-5)),
             const("g", scale), const("beta", bias)]
    return Case(f"LayerNorm_decomposed_{n}", model(nodes, [vi("x", x.shape)], [vi("y", x.shape)], inits, 18),
                {"x": x}, levels=(RAW, OPT), fused="LayerNorm")


def softmax_cases() -> List[Case]:
    x = norm_rows(8)
    cases = []
    for axis in (-1, 0):
        nodes = [oh.make_node("Softmax", ["x"], ["y"], axis=axis)]
        cases.append(Case(f"Softmax_axis{axis}", model(nodes, [vi("x", x.shape)], [vi("y", x.shape)], opset=13),
                          {"x": x}))
    for shifted in (True, False):
        nodes = []
        src = "x"
        if shifted:
            nodes += [oh.make_node("ReduceMax", ["x"], ["m"], axes=[-1], keepdims=1),
                      oh.make_node("Sub", ["x", "m"], ["z"])]
            src = "z"
        nodes += [oh.make_node("Exp", [src], ["e"]),
                  oh.make_node("ReduceSum", ["e", "ax"], ["s"], keepdims=1),
                  oh.make_node("Div", ["e", "s"], ["y"])]
        cases.append(Case(f"Softmax_decomposed_{'shifted' if shifted else 'unshifted'}",
                          model(nodes, [vi("x", x.shape)], [vi("y", x.shape)],
                                [const("ax", np.array([-1], np.int64))], 17),
                          {"x": x}, levels=(RAW, OPT), fused="Softmax"))
    return cases


def reduce_max_nan(ort_out: List[np.ndarray], x: np.ndarray, axis: int) -> List[np.ndarray]:
    """kiln's deliberate difference: ReduceMax is NaN wherever the reduced values hold a NaN."""
    want = ort_out[0].copy()
    want[np.isnan(x).any(axis=axis)] = NAN
    return [want]


def reduce_cases() -> List[Case]:
    x = comparable_rows(8)
    cases = []
    for op in ("ReduceSum", "ReduceMean", "ReduceMax"):
        for axis in (1, 0):
            out = [x.shape[1 - axis]]
            nodes = [oh.make_node(op, ["x", "ax"], ["y"], keepdims=0)]
            c = Case(f"{op}_axis{axis}", model(nodes, [vi("x", x.shape)], [vi("y", out)],
                                               [const("ax", np.array([axis], np.int64))], 18), {"x": x})
            if op == "ReduceMax":
                c.expect = (lambda o, x=x, axis=axis: reduce_max_nan(o, x, axis))
            cases.append(c)
        # an empty reduced axis: Sum and Mean give 0, Max -inf
        e = np.zeros((3, 0), F32)
        nodes = [oh.make_node(op, ["x", "ax"], ["y"], keepdims=0)]
        cases.append(Case(f"{op}_empty_axis", model(nodes, [vi("x", [3, 0])], [vi("y", [3])],
                                                    [const("ax", np.array([1], np.int64))], 18), {"x": e}))
    return cases


def gemm_cases() -> List[Case]:
    rng = np.random.default_rng(3)
    cases = []
    for m, k, n in ((1, 37, 40), (20, 37, 70)):
        a = rng.uniform(0.5, 1.5, (m, k)).astype(F32) * rng.choice([-1, 1], (m, k)).astype(F32)
        b = rng.uniform(0.5, 1.5, (k, n)).astype(F32) * rng.choice([-1, 1], (k, n)).astype(F32)
        # one special value per row of A (and per column of B): each output is then a sum with at
        # most one special term, which every summation order rounds the same way
        specials = [INF, -INF, NAN, 3.4e38, -3.4e38, 1e38, 1e-40, 0.0, -0.0, 1e20]
        for i in range(m):
            a[i, (7 * i) % k] = specials[i % len(specials)]
        bw = b.copy()
        for j in range(0, n, 3):
            bw[(5 * j) % k, j] = specials[j % len(specials)]
        bias = np.resize(SPECIAL, n).astype(F32)
        tag = f"{m}x{k}x{n}"
        nodes = [oh.make_node("MatMul", ["a", "b"], ["y"])]
        cases.append(Case(f"MatMul_special_A_{tag}", model(nodes, [vi("a", [m, k]), vi("b", [k, n])], [vi("y", [m, n])]),
                          {"a": a, "b": b}))
        cases.append(Case(f"MatMul_special_constB_{tag}",
                          model(nodes, [vi("a", [m, k])], [vi("y", [m, n])], [const("b", bw)]),
                          {"a": np.abs(a[:, :]).clip(0.5, 1.5).astype(F32)}))
        for act in ("Relu", "Gelu", "Tanh", "Sigmoid", "LeakyRelu", "GeluErf", "GeluTanh", "HardSigmoid",
                    "HardSwish", "Silu"):
            nodes = [oh.make_node("MatMul", ["a", "b"], ["mm"]), oh.make_node("Add", ["mm", "bias"], ["z"])]
            nodes += activation(act, "z", "y")
            inits = [const("b", b), const("bias", bias)]
            fin = a.copy()
            fin[~np.isfinite(fin)] = 1.0
            cases.append(Case(f"MatMul_bias_{act}_{tag}", model(nodes, [vi("a", [m, k])], [vi("y", [m, n])], inits),
                              {"a": fin}, levels=(RAW, OPT), fused="MatMul"))
            if act == "Silu":
                cases[-1].atol = SILU_ATOL
        # Gemm with a special C, then Relu, then a residual Add with special values
        nodes = [oh.make_node("Gemm", ["a", "b", "c"], ["g"], alpha=0.5, beta=2.0),
                 oh.make_node("Relu", ["g"], ["r"]), oh.make_node("Add", ["r", "res"], ["y"])]
        res = np.resize(special_vector()[::-1], (m, n)).astype(F32)
        cases.append(Case(f"Gemm_bias_Relu_residual_{tag}",
                          model(nodes, [vi("a", [m, k]), vi("res", [m, n])], [vi("y", [m, n])],
                                [const("b", b), const("c", bias)], 13),
                          {"a": np.abs(a).clip(0.5, 1.5).astype(F32), "res": res}, levels=(RAW, OPT), fused="MatMul"))
    # batched products with both operands at run time (attention's Q·Kᵀ and P·V paths)
    qa = rng.uniform(0.5, 1.5, (4, 6, 37)).astype(F32)
    kb = rng.uniform(0.5, 1.5, (4, 37, 33)).astype(F32) * rng.choice([-1, 1], (4, 37, 33)).astype(F32)
    for bi in range(4):
        for i in range(6):
            qa[bi, i, (3 * i + bi) % 37] = specials[(i + bi) % len(specials)]
    nodes = [oh.make_node("MatMul", ["a", "b"], ["y"])]
    cases.append(Case("MatMul_batched_special", model(nodes, [vi("a", qa.shape), vi("b", kb.shape)],
                                                      [vi("y", [4, 6, 33])]), {"a": qa, "b": kb}))
    # Gemm's beta = 0 ignores C (NaN there stays out); alpha = 0 still multiplies (0 · inf = NaN)
    a3 = np.abs(rng.uniform(0.5, 1.5, (3, 5))).astype(F32)
    a3[0, 0], a3[1, 1] = INF, NAN
    b3 = rng.uniform(0.5, 1.5, (5, 4)).astype(F32)
    c3 = np.array([NAN, INF, -INF, 1.0], F32)
    for alpha, beta in ((1.0, 0.0), (0.0, 1.0), (0.0, 0.0)):
        nodes = [oh.make_node("Gemm", ["a", "b", "c"], ["y"], alpha=alpha, beta=beta)]
        cases.append(Case(f"Gemm_alpha{alpha:g}_beta{beta:g}",
                          model(nodes, [vi("a", [3, 5])], [vi("y", [3, 4])], [const("b", b3), const("c", c3)], 13),
                          {"a": a3}))
    return cases


def activation(act: str, x: str, y: str) -> list:
    if act == "GeluErf":  # (x * (1 + erf(x / sqrt 2))) * 0.5, as PyTorch exports it
        return [oh.make_node("Div", [x, "sqrt2"], ["ge_d"]), oh.make_node("Erf", ["ge_d"], ["ge_e"]),
                oh.make_node("Add", ["ge_e", "one"], ["ge_a"]), oh.make_node("Mul", [x, "ge_a"], ["ge_m"]),
                oh.make_node("Mul", ["ge_m", "half"], [y])]
    if act == "GeluErfHalfFirst":  # (x * 0.5) * (1 + erf(x / sqrt 2)): no intermediate overflow
        return [oh.make_node("Div", [x, "sqrt2"], ["ge_d"]), oh.make_node("Erf", ["ge_d"], ["ge_e"]),
                oh.make_node("Add", ["ge_e", "one"], ["ge_a"]), oh.make_node("Mul", [x, "half"], ["ge_h"]),
                oh.make_node("Mul", ["ge_h", "ge_a"], [y])]
    if act == "GeluTanh":
        return [oh.make_node("Pow", [x, "three"], ["gt_p"]), oh.make_node("Mul", ["gt_p", "c044"], ["gt_c"]),
                oh.make_node("Add", [x, "gt_c"], ["gt_s"]), oh.make_node("Mul", ["gt_s", "s2pi"], ["gt_u"]),
                oh.make_node("Tanh", ["gt_u"], ["gt_t"]), oh.make_node("Add", ["gt_t", "one"], ["gt_a"]),
                oh.make_node("Mul", [x, "gt_a"], ["gt_m"]), oh.make_node("Mul", ["gt_m", "half"], [y])]
    if act == "LeakyRelu":
        return [oh.make_node("LeakyRelu", [x], [y], alpha=0.01)]
    if act == "Silu":  # x * Sigmoid(x), as YOLOv8 writes it
        return [oh.make_node("Sigmoid", [x], ["si_s"]), oh.make_node("Mul", [x, "si_s"], [y])]
    if act == "HardSwishWritten":  # x * HardSigmoid(x) with HardSwish's alpha and beta
        return [oh.make_node("HardSigmoid", [x], ["hs_h"], alpha=1 / 6, beta=0.5), oh.make_node("Mul", ["hs_h", x], [y])]
    if act == "HardSigmoid":
        return [oh.make_node("HardSigmoid", [x], [y], alpha=0.3, beta=0.6)]
    return [oh.make_node(act, [x], [y])]


def with_gelu_constants(c: Case) -> Case:
    import onnx

    m = onnx.load_from_string(c.model)
    have = {i.name for i in m.graph.initializer}
    used = {i for n in m.graph.node for i in n.input}
    for name, v in (("sqrt2", 2 ** 0.5), ("one", 1.0), ("half", 0.5), ("three", 3.0), ("c044", 0.044715),
                    ("s2pi", (2 / np.pi) ** 0.5)):
        if name in used and name not in have:
            m.graph.initializer.append(const(name, F32(v)))
    c.model = m.SerializeToString()
    return c


def pattern_cases() -> List[Case]:
    """erf- and tanh-GELU written out over the special values (kiln fuses them into one op)."""
    x = special_vector()
    cases = []
    for act, word in (("GeluErf", "Gelu"), ("GeluErfHalfFirst", "Gelu"), ("GeluTanh", "Gelu"), ("Silu", "Silu"),
                      ("HardSwishWritten", "HardSwish")):
        c = Case(f"{act}_written_out", model(activation(act, "x", "y"), [vi("x", x.shape)], [vi("y", x.shape)]),
                 {"x": x}, levels=(RAW, OPT), fused=word)
        if act == "Silu":
            c.atol = SILU_ATOL
        cases.append(c)
    return cases


def empty_cases() -> List[Case]:
    cases = []
    z = np.zeros((0, 5), F32)
    for op in ("Erf", "Relu", "Gelu"):
        c = unary_case(op, z)
        c.name, c.empty = f"{op}_empty", True
        cases.append(c)
    nodes = [oh.make_node("Add", ["a", "b"], ["y"])]
    cases.append(Case("Add_empty", model(nodes, [vi("a", [0, 5]), vi("b", [1, 5])], [vi("y", [0, 5])]),
                      {"a": z, "b": np.ones((1, 5), F32)}, empty=True))
    nodes = [oh.make_node("LayerNormalization", ["x", "s"], ["y"], axis=-1)]
    cases.append(Case("LayerNormalization_empty", model(nodes, [vi("x", [0, 5]), vi("s", [5])], [vi("y", [0, 5])],
                                                        opset=17), {"x": z, "s": np.ones(5, F32)}, empty=True))
    nodes = [oh.make_node("Softmax", ["x"], ["y"], axis=-1)]
    cases.append(Case("Softmax_empty", model(nodes, [vi("x", [0, 5])], [vi("y", [0, 5])], opset=13), {"x": z},
                      empty=True))
    # K = 0: a product of empty vectors is 0 (plus the bias)
    nodes = [oh.make_node("MatMul", ["a", "b"], ["y"])]
    cases.append(Case("MatMul_K0", model(nodes, [vi("a", [3, 0]), vi("b", [0, 4])], [vi("y", [3, 4])]),
                      {"a": np.zeros((3, 0), F32), "b": np.zeros((0, 4), F32)}))
    nodes = [oh.make_node("Gemm", ["a", "b", "c"], ["y"])]
    cases.append(Case("Gemm_K0_bias", model(nodes, [vi("a", [3, 0]), vi("b", [0, 4])], [vi("y", [3, 4])],
                                            [const("c", np.array([INF, -1.0, NAN, 2.0], F32))], 13),
                      {"a": np.zeros((3, 0), F32), "b": np.zeros((0, 4), F32)}))
    nodes = [oh.make_node("ReduceSum", ["x", "ax"], ["y"], keepdims=1)]
    cases.append(Case("ReduceSum_empty_outer", model(nodes, [vi("x", [0, 5])], [vi("y", [0, 1])],
                                                     [const("ax", np.array([1], np.int64))], 18), {"x": z},
                      empty=True))
    return cases


def all_cases() -> List[Case]:
    cases = (unary_cases() + binary_cases() + cast_cases() + layernorm_cases() + softmax_cases()
             + reduce_cases() + [with_gelu_constants(c) for c in gemm_cases() + pattern_cases()] + empty_cases())
    names = [c.name for c in cases]
    assert len(names) == len(set(names)), "case names must be unique"
    return cases


CASES = all_cases()
PARAMS = [(c, lvl) for c in CASES for lvl in c.levels]
IDS = [f"{c.name}-{'raw' if lvl == RAW else 'ort-opt'}" for c, lvl in PARAMS]


# --------------------------------------------------------------------------
# comparing
# --------------------------------------------------------------------------
def assert_same(what: str, want: np.ndarray, got: np.ndarray, feeds: Dict[str, np.ndarray],
                rtol: float = RTOL, atol: float = ATOL, signed_zero: bool = False) -> None:
    """NaN-aware equality: same NaNs, same signed infinities, finite values close
    (and, with ``signed_zero``, zeros of the same sign)."""
    assert got.shape == want.shape and got.dtype == want.dtype, \
        f"{what}: {got.shape}/{got.dtype}, CPU EP {want.shape}/{want.dtype}"
    if want.dtype.kind != "f":
        bad = np.flatnonzero(got.ravel() != want.ravel())
    else:
        w, g = want.ravel(), got.ravel()
        with np.errstate(invalid="ignore"):
            nan_ok = np.isnan(w) == np.isnan(g)
            inf_ok = (np.isposinf(w) == np.isposinf(g)) & (np.isneginf(w) == np.isneginf(g))
            fin = np.isfinite(w) & np.isfinite(g)
            close = np.ones_like(nan_ok)
            close[fin] = np.abs(g[fin] - w[fin]) <= atol + rtol * np.abs(w[fin])
            if signed_zero:
                zeros = (w == 0) & (g == 0)
                close[zeros] &= np.signbit(w[zeros]) == np.signbit(g[zeros])
        bad = np.flatnonzero(~(nan_ok & inf_ok & close))
    if bad.size:
        inputs = {k: v.ravel() for k, v in feeds.items() if v.size == want.size}
        lines = [f"  [{i}] kiln {got.ravel()[i]!r}  CPU EP {want.ravel()[i]!r}"
                 + "".join(f"  {k}={v[i]!r}" for k, v in inputs.items()) for i in bad[:12]]
        raise AssertionError(f"{what}: {bad.size} of {want.size} values differ from the CPU EP:\n" + "\n".join(lines))


def cpu_outputs(case: Case, level) -> List[np.ndarray]:
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    sess = ort.InferenceSession(case.model, so, providers=["CPUExecutionProvider"])
    outs = sess.run(None, case.feeds)
    del sess
    return outs


def runnable_targets() -> List[str]:
    host = tu.host_target()
    order = list(kiln.TARGETS)  # best first
    return order[order.index(host):]


@pytest.fixture(params=list(kiln.TARGETS))
def target(request) -> str:
    t = request.param
    if t not in runnable_targets():
        pytest.skip(f"this CPU cannot run {t} kernels (best target here: {tu.host_target()}); "
                    "they run on a machine that has the instructions")
    return t


@pytest.mark.parametrize("case,level", PARAMS, ids=IDS)
def test_matches_cpu_ep(case: Case, level, target, kiln_dev):
    want = cpu_outputs(case, level)
    if case.expect is not None:
        want = case.expect(want)
    run = tu.run_fully_on_kiln(case.model, kiln_dev, case.feeds, options={"target": target}, opt_level=level)
    assert run.nodes_on("CPUExecutionProvider") == [], run.nodes_on("CPUExecutionProvider")
    assert run.created_delta("partitions_compiled") >= 1, "kiln compiled nothing"
    if not case.empty:
        assert run.run_delta("compute_calls") >= 1, "kiln computed nothing"
    for name, w, g in zip(run.output_names, want, run.outputs):
        assert_same(f"{case.name} ({target}, {IDS[PARAMS.index((case, level))]}) output {name}", w, g, case.feeds,
                    case.rtol, case.atol, case.signed_zero)


FUSED = [c for c in CASES if c.fused]


@pytest.mark.parametrize("case", FUSED, ids=[c.name for c in FUSED])
def test_patterns_are_fused(case: Case, kiln_dev):
    """The pattern cases test kiln's fused kernels: the compiled program says so."""
    data = tu.compile_model(case.model, kiln_dev, embed=True, to="bytes")
    notes = " | ".join(tu.notes_of(data))
    assert case.fused in notes, f"{case.name}: kiln compiled {notes!r}, expected a fused {case.fused}"
    assert "; 1 steps;" in notes, f"{case.name}: the pattern did not become one step: {notes!r}"


def test_ort_reduce_max_nan_depends_on_position():
    """Why kiln's ReduceMax propagates NaN instead of copying ORT: ORT 1.31.1 returns NaN when the NaN
    comes first in a row, skips it elsewhere, and in a multi-row last-axis reduction can return a value
    that is not even the maximum. If this starts failing, ORT changed and kiln's choice may be revisited."""
    x = np.array([[NAN, 1, 2, 3], [1, NAN, 2, 3], [1, 2, 3, NAN], [1, 2, 3, 4]], F32)
    nodes = [oh.make_node("ReduceMax", ["x", "ax"], ["y"], keepdims=0)]
    c = Case("probe", model(nodes, [vi("x", x.shape)], [vi("y", [4])], [const("ax", np.array([1], np.int64))], 18),
             {"x": x})
    y = cpu_outputs(c, RAW)[0]
    assert np.isnan(y[0]) and not np.isnan(y[2]) and y[3] == 4.0, y
    single = Case("probe1", model(nodes, [vi("x", [1, 4])], [vi("y", [1])], [const("ax", np.array([1], np.int64))],
                                  18), {"x": x[2:3]})
    assert cpu_outputs(single, RAW)[0][0] == 3.0


def test_case_table_covers_every_special_value_and_target():
    ops = {c.name.split("_")[0] for c in CASES}
    for op in ("Erf", "Gelu", "Tanh", "Sigmoid", "Exp", "Log", "Sqrt", "Pow", "Reciprocal", "Div", "Softmax",
               "LayerNormalization", "ReduceMean", "ReduceSum", "ReduceMax", "MatMul", "Gemm", "Clip", "Relu",
               "LeakyRelu", "Where", "Cast", "HardSigmoid", "HardSwish", "Elu", "Selu", "Celu", "ThresholdedRelu",
               "Softsign", "PRelu", "Silu"):
        assert op in ops, f"no case for {op}"
    for v in (INF, -INF, 1e38, -1e38, 3.4e38, -3.4e38, 1e-40, 0.0):
        assert (SPECIAL == v).any()
    assert np.isnan(SPECIAL).any() and (np.signbit(SPECIAL) & (SPECIAL == 0)).any()
    assert any(c.empty for c in CASES)
    assert len(kiln.TARGETS) == 3


@pytest.mark.parametrize("act", ["GeluErf", "GeluTanh", "GeluErfHalfFirst"])
def test_written_out_gelu_above_half_max(act, kiln_dev):
    """Written as PyTorch exports it, ``(x·(1 + erf(x/√2)))·0.5`` overflows in its intermediate for
    x > FLT_MAX/2, so ORT gives +inf where GELU(x) = x; the ``(x·0.5)·(1 + erf)`` form and the Gelu
    op give x. kiln's fused kernels follow the form they were fused from (the table above checks
    the whole special-value set; this pins the point)."""
    x = np.array([3.4e38, FMAX, 1.7e38, 1e38, -3.4e38], F32)
    c = with_gelu_constants(Case(act, model(activation(act, "x", "y"), [vi("x", [5])], [vi("y", [5])]), {"x": x}))
    want = cpu_outputs(c, RAW)[0]
    got = tu.run_fully_on_kiln(c.model, kiln_dev, c.feeds, opt_level=RAW).outputs[0]
    if act == "GeluErfHalfFirst":
        np.testing.assert_array_equal(want[:2], x[:2])
    else:
        assert np.isposinf(want[:2]).all(), want
    assert_same(act, want, got, c.feeds)
