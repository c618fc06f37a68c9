#!/usr/bin/env python3
"""An HF BERT embedding layer: kiln's fused EmbedLayerNorm vs ONNX Runtime's CPU EP (issue #14).

The model is ``models_lib.bert_embeddings``: word (30522 x 384), token-type and
position gathers, their two adds and a LayerNormalization, as a MiniLM /
BERT export writes them, at static shapes (batch 1 and 8, sequence 128 and
512). No projection after it, so the time is the embedding layer's alone;
kiln is told ``claim=all`` (its cost rule leaves a partition without a
matrix product to ORT; in a real model the layer is part of the encoder's
partition). ORT's CPU EP runs at ``ORT_ENABLE_ALL``, where it may apply its
own ``EmbedLayerNormalization`` fusion.

For each shape and thread count (``intra_op_num_threads`` 1 and 2), both
sessions' outputs are compared first (1e-4), then timed interleaved: each
repetition runs a block of ~30 ms per session after a 20 ms pause; the table
reports the median time per ``Run`` and kiln / CPU EP (< 1: kiln is faster).

Usage (from the repository root, after ``cargo build --release``)::

    KILN_EP_LIBRARY=target/release/libkiln_ep.so PYTHONPATH=python \\
        .venv/bin/python bench/embeddings.py [--reps 15] [--out FILE]
"""
from __future__ import annotations

import argparse
import os
# numpy's OpenBLAS keeps a server thread spinning after any BLAS call (3-8%
# of a benchmark process's samples), on the core a 2-thread session needs.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import statistics
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
from machine import describe as describe_machine  # noqa: E402
import models_lib as ml  # noqa: E402

SHAPES = [(1, 128), (8, 128), (8, 512)]
HIDDEN, VOCAB = 384, 30522


def session(path: str, threads: int, dev=None) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    if dev is None:
        return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    so.add_provider_for_devices([dev], {"claim": "all"})
    return ort.InferenceSession(path, so, enable_fallback=0)


def per_run(sess, feeds, seconds: float = 0.03) -> float:
    sess.run(None, feeds)
    t0 = time.perf_counter()
    sess.run(None, feeds)
    n = max(3, int(seconds / max(time.perf_counter() - t0, 1e-6)))
    t0 = time.perf_counter()
    for _ in range(n):
        sess.run(None, feeds)
    return (time.perf_counter() - t0) / n


def compare(path: str, dev, feeds, threads: int, reps: int):
    """Median seconds per Run of the CPU EP and of kiln (``claim=all``) on
    ``path``, outputs compared first (1e-4), blocks interleaved with pauses."""
    cpu, ks = session(path, threads), session(path, threads, dev)
    np.testing.assert_allclose(ks.run(None, feeds)[0], cpu.run(None, feeds)[0], rtol=1e-4, atol=1e-4)
    times = {"cpu": [], "kiln": []}
    for rep in range(reps):
        order = [("cpu", cpu), ("kiln", ks)][:: 1 if rep % 2 == 0 else -1]
        for name, sess in order:
            time.sleep(0.02)
            times[name].append(per_run(sess, feeds))
    return statistics.median(times["cpu"]), statistics.median(times["kiln"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "embeddings.md"))
    args = ap.parse_args()
    lib = os.environ.get("KILN_EP_LIBRARY") or kiln.get_library_path()
    ort.register_execution_provider_library(kiln.EP_NAME, os.path.abspath(lib))
    dev = next(d for d in ort.get_ep_devices() if d.ep_name == kiln.EP_NAME and not kiln.is_virtual(d))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for batch, seq in SHAPES:
            model = ml.bert_embeddings("input", "op", dynamic=False, batch=batch, seq=seq, project=False,
                                       hidden=HIDDEN, vocab=VOCAB)
            path = os.path.join(tmp, f"embeddings_b{batch}_s{seq}.onnx")
            onnx.save(model, path)
            feeds = ml.bert_embeddings_feeds(model, batch, seq, 0, vocab=VOCAB)
            for threads in [int(t) for t in args.threads.split(",")]:
                c, k = compare(path, dev, feeds, threads, args.reps)
                rows.append((batch, seq, threads, c * 1e6, k * 1e6, k / c))
                print(f"batch {batch} seq {seq} threads {threads}: CPU EP {c * 1e6:.1f} us, kiln {k * 1e6:.1f} us, "
                      f"kiln/CPU EP {k / c:.2f}", flush=True)
    lines = [
        "# kiln vs ORT's CPU EP: an HF BERT embedding layer (issue #14)",
        "",
        describe_machine(),
        "",
        f"Run: `python bench/embeddings.py` on {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}; "
        f"word table {VOCAB} x {HIDDEN}, token-type and position gathers, two adds, LayerNormalization "
        f"(`models_lib.bert_embeddings`, no projection); kiln with `claim=all`, one `EmbedLayerNormalization` "
        f"op; the CPU EP at `ORT_ENABLE_ALL`; median of {args.reps} interleaved blocks.",
        "",
        "| batch | seq | threads | CPU EP µs | kiln µs | kiln/CPU EP |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    lines += [f"| {b} | {s} | {t} | {c:.1f} | {k:.1f} | **{r:.2f}** |" for b, s, t, c, k, r in rows]
    text = "\n".join(lines) + "\n"
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
