#!/usr/bin/env python3
"""Per-Run overhead of a kiln partition (issue #14): what a kiln node costs
beyond its kernels.

Each case is a model whose work is negligible (a few elements), so a `Run`
is all overhead: ORT's own (the Python binding, input and output OrtValues,
the executor) plus, for kiln, its compute function (binding the inputs and
outputs, the shape-generic plan's size binding, the memory plan's arena).
The same model runs on ORT's CPU EP and on kiln (`claim=all`: the cost rule
leaves such graphs to ORT; kiln runs every node); interleaved blocks of ~50 ms, medians. "kiln − CPU EP" is
kiln's overhead per Run over the CPU EP's (the CPU EP's kernels for these
nodes cost well under a microsecond).

Writes ``bench/results/overhead.md`` (or ``--out``) and prints it.

Usage (repository root, after ``cargo build --release``)::

    KILN_EP_LIBRARY=target/release/libkiln_ep.so PYTHONPATH=python \\
        .venv/bin/python bench/overhead.py [--reps 9] [--out FILE]
"""
from __future__ import annotations

import argparse
import os
# numpy's OpenBLAS keeps a server thread spinning after any BLAS call (3-8%
# of a benchmark process's samples), on the core a 2-thread session needs.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import statistics
import sys
import time
from typing import Dict, List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402

import onnxruntime_ep_kiln as kiln  # noqa: E402
from latency import cpu_options  # noqa: E402  (the same session settings)
from machine import describe, publish  # noqa: E402

BLOCK_SECONDS = 0.05


def chain(name: str, inputs: int, dims: List, ops: int) -> Tuple[str, bytes, Dict[str, np.ndarray]]:
    """`inputs` inputs of shape `dims` (strings are symbolic), each through
    `ops` elementwise ops (Relu, Neg alternating), one output per input."""
    nodes, outs = [], []
    for i in range(inputs):
        prev = f"x{i}"
        for j in range(ops):
            out = f"y{i}" if j == ops - 1 else f"t{i}_{j}"
            nodes.append(helper.make_node("Relu" if j % 2 == 0 else "Neg", [prev], [out]))
            prev = out
        outs.append(helper.make_tensor_value_info(f"y{i}", TensorProto.FLOAT, dims))
    graph = helper.make_graph(
        nodes, name, [helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, dims) for i in range(inputs)], outs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.checker.check_model(model)
    concrete = [d if isinstance(d, int) else 2 for d in dims]
    feeds = {f"x{i}": np.ones(concrete, np.float32) for i in range(inputs)}
    return name, model.SerializeToString(), feeds


CASES = [
    chain("1 input, 1 op, static [1, 8]", 1, [1, 8], 1),
    chain("1 input, 1 op, symbolic [N, 8]", 1, ["N", 8], 1),
    chain("1 input, 8 ops, static [1, 8]", 1, [1, 8], 8),
    chain("4 inputs, 4 outputs, 2 ops each, symbolic [N, S]", 4, ["N", "S"], 2),
]


def per_run(sess, feeds, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        sess.run(None, feeds)
    return (time.perf_counter() - t0) / n


def measure(model: bytes, feeds, dev, reps: int) -> Tuple[float, float]:
    cpu = ort.InferenceSession(model, cpu_options(1), providers=["CPUExecutionProvider"])
    so = cpu_options(1)
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    # Claim everything: the cost rule leaves such tiny graphs to ORT.
    so.add_provider_for_devices([dev], {"claim": "all"})
    ks = ort.InferenceSession(model, so)
    for a, b in zip(cpu.run(None, feeds), ks.run(None, feeds)):
        np.testing.assert_array_equal(a, b)
    runs = {s: max(1, int(BLOCK_SECONDS / per_run(s, feeds, 200))) for s in (cpu, ks)}
    times: Dict[object, List[float]] = {cpu: [], ks: []}
    for r in range(reps):
        for s in ((cpu, ks) if r % 2 == 0 else (ks, cpu)):
            times[s].append(per_run(s, feeds, runs[s]))
    return statistics.median(times[cpu]) * 1e6, statistics.median(times[ks]) * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "overhead.md"))
    args = ap.parse_args()
    kiln.register()
    dev = kiln.host_device()
    before = kiln.stats()["compute_calls"]
    rows = []
    for name, model, feeds in CASES:
        cpu_us, kiln_us = measure(model, feeds, dev, args.reps)
        print(f"{name}: CPU EP {cpu_us:.2f} us, kiln {kiln_us:.2f} us", file=sys.stderr)
        rows.append((name, cpu_us, kiln_us))
    assert kiln.stats()["compute_calls"] > before, "kiln ran nothing: the comparison would be CPU EP vs CPU EP"
    lines = [
        "# kiln's per-Run overhead (issue #14)\n",
        describe() + "\n",
        f"Run: `python bench/overhead.py` on {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}.\n",
        "Models of negligible work (elements of 8 or 2×2 floats), one intra-op thread; time per `Run` from "
        f"Python, median of {args.reps} interleaved blocks of ~{int(BLOCK_SECONDS * 1000)} ms. kiln runs "
        "every node (one partition, `session.disable_cpu_ep_fallback=1`). kiln − CPU EP: what a kiln "
        "partition adds per Run (input and output binding, the plan's size binding, its arena).\n",
        "| model | CPU EP µs/Run | kiln µs/Run | kiln − CPU EP µs |",
        "|---|---:|---:|---:|",
    ]
    for name, cpu_us, kiln_us in rows:
        lines.append(f"| {name} | {cpu_us:.2f} | {kiln_us:.2f} | **{kiln_us - cpu_us:+.2f}** |")
    publish(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
