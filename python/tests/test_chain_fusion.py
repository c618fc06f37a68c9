"""kiln's elementwise chains (issue #14) against ONNX Runtime's CPU EP.

f32 unary and binary ops that feed one another, all of one output shape,
become one ``Chain`` op that runs them in one pass over memory
(``compiler::chain``): what kiln's other fusions leave of a model's
arithmetic. Three shapes of chain are checked:

* DenseNet's pre-activation: ``Concat → BatchNormalization → Mul → Add →
  Relu → Conv`` (per-channel constants, which kiln's channels-last layout
  reads as repeated rows), symbolic batch, height and width, two shapes in
  one session;
* per-channel constants over a channels-first ``[N, C, H, W]``, where
  kiln keeps ONNX's layout (no convolution around), runs of H·W shorter
  and longer than the kernel's block;
* a transformer-shaped chain over ``[batch, sequence, hidden]``: a row
  scale and shift, ``Tanh``, a scalar on the left of a ``Sub``, the input
  read again, ``Sqrt`` of a negative (NaN) and ``Max``.

Checked: whole on kiln, against the CPU EP at ``ORT_DISABLE_ALL`` and
``ORT_ENABLE_ALL``; that the fusion fires, in the compiled program's notes
(``Chain(Mul+Add+...)``); the near miss (an intermediate that is also a
model output) is split there and stays right.

Tolerance: 1e-5 relative (and 1e-5 absolute after convolutions): each op of a chain computes what its own kernel
computes (bit for bit, tested in Rust), so the differences from the CPU EP
are those of kiln's unfused ops (tanh/sigmoid approximations, a few ulp).
"""
from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

import kiln_testutil as tu
import models_lib as ml

CPU = "CPUExecutionProvider"
LEVELS = {"raw": ort.GraphOptimizationLevel.ORT_DISABLE_ALL, "ort-opt": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}
RTOL, ATOL = 1e-5, 1e-6
C = 24


def preactivation(dims=("n", "h", "w")) -> onnx.ModelProto:
    """Two Convs' channels concatenated, then BatchNormalization → Mul → Add →
    Relu, then Conv (DenseNet; right after a Conv, kiln would fold the
    per-channel ops into it instead)."""
    rng = np.random.default_rng(3)
    const = ml.f32_tensor
    inits = [
        const("w0", rng.standard_normal((8, 8, 1, 1)) * 0.2),
        const("w1", rng.standard_normal((C, 8, 3, 3)) * 0.2),
        const("w2", rng.standard_normal((16, C + 8, 1, 1)) * 0.2),
        const("scale", rng.random(C + 8) + 0.5), const("bias", rng.standard_normal(C + 8)),
        const("mean", rng.standard_normal(C + 8) * 0.1), const("var", rng.random(C + 8) + 0.5),
        const("mul", (rng.random(C + 8) + 0.5).reshape(C + 8, 1, 1)),
        const("add", rng.standard_normal(C + 8).reshape(C + 8, 1, 1)),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Conv", ["x", "w0"], ["c0"]),
        helper.make_node("Concat", ["c1", "c0"], ["cat"], axis=1),
        helper.make_node("BatchNormalization", ["cat", "scale", "bias", "mean", "var"], ["bn"]),
        helper.make_node("Mul", ["bn", "mul"], ["m"]),
        helper.make_node("Add", ["m", "add"], ["a"]),
        helper.make_node("Relu", ["a"], ["r"]),
        helper.make_node("Conv", ["r", "w2"], ["y"]),
    ]
    return ml.one_input_model(nodes, [dims[0], 8, dims[1], dims[2]], ["y"], inits)


save = tu.save_model


def compiled_ops(path: str, kiln_dev) -> list:
    """The ops of every compiled partition, e.g. ['Conv', 'Chain(Mul+Add+Relu)']."""
    return [op for notes in tu.compiled_notes(path, kiln_dev) for op in tu.note_ops(notes)]


def assert_matches_cpu(path, kiln_dev, shapes, level, seed=0, atol=ATOL):
    rng = np.random.default_rng(seed)
    runs = [{"x": rng.standard_normal(s).astype(np.float32)} for s in shapes]
    run = tu.run_fully_on_kiln(path, kiln_dev, feeds_seq=runs, opt_level=LEVELS[level])
    assert run.nodes_on(CPU) == []
    for f, got, s in zip(runs, run.all_outputs, shapes):
        _, want = tu.run_cpu(path, f, opt_level=LEVELS[level])
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=RTOL, atol=atol, err_msg=f"shape {s}")


@pytest.mark.parametrize("level", list(LEVELS))
def test_preactivation_matches_cpu_at_two_sizes(level, kiln_dev, tmp_path):
    path = save(preactivation(), tmp_path, "preact")
    # The convolutions' tolerance (sums of 72 products of O(1) values).
    assert_matches_cpu(path, kiln_dev, [(1, 8, 12, 10), (2, 8, 33, 47)], level, atol=1e-5)


def test_preactivation_compiles_to_one_chain(kiln_dev, tmp_path):
    path = save(preactivation(dims=(1, 20, 20)), tmp_path, "preact_static")
    ops = compiled_ops(path, kiln_dev)
    chains = [op for op in ops if op.startswith("Chain(")]
    # BatchNormalization is a per-channel Mul and Add in kiln.
    assert chains == ["Chain(Mul+Add+Mul+Add+Relu)"], ops
    assert not {"Mul", "Add", "Relu"} & set(ops), ops


@pytest.mark.parametrize("level", list(LEVELS))
def test_transformer_chain_matches_cpu_at_two_shapes(level, kiln_dev, tmp_path):
    path = save(ml.gate_chain(), tmp_path, "tchain")
    # The second shape is big enough to split over threads.
    assert_matches_cpu(path, kiln_dev, [(1, 7, 40), (4, 300, 40)], level, seed=1)


def test_transformer_chain_compiles_to_one_op(kiln_dev, tmp_path):
    path = save(ml.gate_chain(dims=(2, 16)), tmp_path, "tchain_static")
    ops = compiled_ops(path, kiln_dev)
    assert ops == ["Chain(Mul+Add+Tanh+Mul+Sub+Sub+Sqrt+Max)"], ops
    rng = np.random.default_rng(2)
    f = {"x": rng.standard_normal((2, 16, 40)).astype(np.float32)}
    _, want = tu.run_cpu(path, f)
    run = tu.run_fully_on_kiln(path, kiln_dev, f)
    np.testing.assert_allclose(run.outputs[0], want[0], rtol=RTOL, atol=ATOL)


def test_an_intermediate_that_is_an_output_splits_the_chain(kiln_dev, tmp_path):
    path = save(ml.gate_chain(dims=(2, 16), also_output=True), tmp_path, "tchain_split")
    ops = compiled_ops(path, kiln_dev)
    # `th` is read by the Sub (whose result is an output) and by the Max.
    assert sorted(ops) == ["Chain(Mul+Add+Tanh+Mul)", "Chain(Sub+Sqrt+Max)", "Sub"], ops
    assert_matches_cpu(path, kiln_dev, [(2, 16, 40)], "raw", seed=5)


@pytest.mark.parametrize("level", list(LEVELS))
def test_channels_first_chain_matches_cpu(level, kiln_dev, tmp_path):
    path = save(ml.channels_first_chain(channels=C), tmp_path, "nchw")
    # H·W of 12 and of 1800 (longer than a block).
    assert_matches_cpu(path, kiln_dev, [(1, C, 3, 4), (2, C, 40, 45)], level, seed=7)
    static = save(ml.channels_first_chain(dims=(2, 9, 9), channels=C), tmp_path, "nchw_static")
    assert compiled_ops(static, kiln_dev) == ["Chain(Mul+Add+Sigmoid+Mul)"]
