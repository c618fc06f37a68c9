#!/usr/bin/env python3
"""Elementwise chains: kiln's one-pass `Chain` op vs ONNX Runtime's CPU EP (issue #14).

Models whose time is f32 elementwise ops that feed one another, which kiln
runs as one ``Chain`` (``compiler::chain``: one pass over memory, the
intermediates in L1) and the CPU EP op by op:

* ``preact HxWxC``: DenseNet's pre-activation as kiln sees it inside a
  channels-last partition: ``[1, H, W, C]`` times a per-channel scale, plus a
  shift, times a scale, plus a shift, ``Relu`` (a ``BatchNormalization`` and
  the exporter's ``Mul``/``Add`` before it), at DenseNet-121's block sizes;
* ``gate BxSxW``: a transformer-shaped chain over ``[B, S, 384]``:
  ``th = tanh(x·g + b)·0.5``, ``max(sqrt(2 - (th - x)), th)``;
* ``densenet121``: the ``onnx`` wheel's light DenseNet-121 (224², batch 1)
  whole in kiln (``claim=all``: kiln's default rule leaves ReLU CNNs'
  convolutions to ORT), 19 five-op chains after its concats.

kiln runs with ``claim=all`` (its cost rule leaves a partition without a
matrix product or convolution to ORT). For each case and thread count
(``intra_op_num_threads`` 1 and 2) both sessions' outputs are compared first,
then timed interleaved (``embeddings.compare``: blocks of ~30 ms after a 20
ms pause); the table reports medians and kiln / CPU EP (< 1: kiln is faster),
and the ops kiln compiled, from the compiled model's notes.

Usage (from the repository root, after ``cargo build --release``)::

    KILN_EP_LIBRARY=target/release/libkiln_ep.so PYTHONPATH=python \\
        .venv/bin/python bench/chains.py [--reps 11] [--out FILE]
"""
from __future__ import annotations

import argparse
import os
# numpy's OpenBLAS keeps a server thread spinning after any BLAS call.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, os.path.join(REPO, "python", "tests"))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402

import onnxruntime_ep_kiln as kiln  # noqa: E402
from embeddings import compare, session  # noqa: E402
from machine import describe as describe_machine, publish  # noqa: E402
import kiln_testutil as tu  # noqa: E402
import models_lib as ml  # noqa: E402

DENSENET = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "light", "light_densenet121.onnx")


def cases(tmp: str):
    for h, c in [(56, 256), (28, 512), (14, 1024)]:
        path = os.path.join(tmp, f"preact_{h}_{c}.onnx")
        onnx.save(ml.affine_relu_chain(h, h, c), path)
        yield f"preact {h}x{h}x{c}", path, [1, h, h, c]
    for b, s in [(1, 128), (8, 128), (8, 512)]:
        path = os.path.join(tmp, f"gate_{b}_{s}.onnx")
        onnx.save(ml.gate_chain((b, s), hidden=384, seed=1), path)
        yield f"gate {b}x{s}x384", path, [b, s, 384]
    yield "densenet121", DENSENET, [1, 3, 224, 224]


def compiled_ops(path: str, dev) -> str:
    """The ops kiln compiled, from the compiled model's notes (counts summed over partitions)."""
    counts = {}
    for notes in tu.compiled_notes(path, dev, options={"claim": "all"}):
        for part in notes.split(";")[0].split(","):
            op, _, k = part.strip().rpartition(" x")
            counts[op] = counts.get(op, 0) + int(k)
    return ", ".join(f"{op} x{k}" for op, k in counts.items())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=11)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "chains.md"))
    args = ap.parse_args()
    lib = os.environ.get("KILN_EP_LIBRARY") or kiln.get_library_path()
    ort.register_execution_provider_library(kiln.EP_NAME, os.path.abspath(lib))
    dev = next(d for d in ort.get_ep_devices() if d.ep_name == kiln.EP_NAME and not kiln.is_virtual(d))
    rows, ops = [], {}
    rng = np.random.default_rng(2)
    with tempfile.TemporaryDirectory() as tmp:
        for name, path, shape in cases(tmp):
            ops[name] = compiled_ops(path, dev)
            name_in = session(path, 1).get_inputs()[0].name
            feeds = {name_in: rng.standard_normal(shape).astype(np.float32)}
            for threads in [int(t) for t in args.threads.split(",")]:
                c, k = compare(path, dev, feeds, threads, args.reps)
                rows.append((name, threads, c * 1e6, k * 1e6, k / c))
                print(f"{name} threads {threads}: CPU EP {c * 1e6:.1f} us, kiln {k * 1e6:.1f} us, "
                      f"kiln/CPU EP {k / c:.2f}", flush=True)
    lines = [
        "# kiln vs ORT's CPU EP: elementwise chains (issue #14)",
        "",
        describe_machine(),
        "",
        f"Run: `python bench/chains.py` on {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}; kiln with "
        f"`claim=all`, the CPU EP at `ORT_ENABLE_ALL`; median of {args.reps} interleaved blocks per session.",
        "",
        "| case | threads | CPU EP µs | kiln µs | kiln/CPU EP |",
        "|---|---:|---:|---:|---:|",
    ]
    lines += [f"| {n} | {t} | {c:.1f} | {k:.1f} | **{r:.2f}** |" for n, t, c, k, r in rows]
    lines += ["", "What kiln compiled:", ""] + [f"- {n}: {o}" for n, o in ops.items()]
    publish(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
