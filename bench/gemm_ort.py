#!/usr/bin/env python3
"""GEMM side by side with ORT (issues #5, #14): kiln vs ORT's CPU EP (MLAS) on
one MatMul with a constant B, at 1 and 2 threads, at the shapes ``bench/gemm.rs``
uses and MiniLM's.

Each case is a model with one ``MatMul(A [M, K], B [K, N] initializer)``. Both
sessions use the same ``intra_op_num_threads`` (``--threads``, default 1,2), ``ORT_ENABLE_ALL``; kiln's with
``session.disable_cpu_ep_fallback=1`` (kiln runs the node; B is packed at
compile time, as MLAS pre-packs it). Outputs are compared first. Then,
interleaved (default 9 repetitions, order alternated), each session runs a
block of ~60 ms after a 50 ms pause and one untimed run (as ``latency.py``: the other
session's intra-op workers spin after its runs and would take the second core); the table gives the median time per run as GFLOP/s
(2·M·N·K / time), the percentage of this core's FMA peak (AVX2 or AVX-512, whichever kiln compiles for), and kiln/ORT.
Times include ORT's per-Run overhead (a few µs, the same for both), which
shows at the M = 1 shapes.

The peak comes from the same measurement as ``bench/gemm.rs`` (independent zmm
FMAs), run here through ``cargo bench --bench gemm -- --bench --peak-only``.

Writes ``bench/results/gemm_ort.md`` (or ``--out``) and prints it.

Usage (repository root, after ``cargo build --release``)::

    KILN_EP_LIBRARY=target/release/libkiln_ep.so PYTHONPATH=python \\
        .venv/bin/python bench/gemm_ort.py [--reps 9] [--threads 1,2] [--filter TEXT] [--out FILE]
"""
from __future__ import annotations

import argparse
import os
# numpy's OpenBLAS keeps a server thread spinning after any BLAS call (3-8%
# of a benchmark process's samples), on the core a 2-thread session needs.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "python"))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import onnxruntime_ep_kiln as kiln  # noqa: E402
from latency import cpu_options, kiln_options, time_block  # noqa: E402  (the same settings and timing)
from machine import describe, publish  # noqa: E402

# (name, M, N, K): bench/gemm.rs's square and model shapes.
CASES = [
    ("square 256", 256, 256, 256),
    ("square 512", 512, 512, 512),
    ("square 1024", 1024, 1024, 1024),
    ("MLP M=1 1024->1024", 1, 1024, 1024),
    ("MLP M=32 1024->1024", 32, 1024, 1024),
    ("BERT M=128 768->768", 128, 768, 768),
    ("BERT M=128 768->3072", 128, 3072, 768),
    ("BERT M=128 3072->768", 128, 768, 3072),
    ("encoder M=128 256->1024", 128, 1024, 256),
    ("encoder M=128 1024->256", 128, 256, 1024),
    # paraphrase-MiniLM-L3-v2 at batch 4, sequence 77 (bench/real.py): M = 4 * 77.
    ("MiniLM M=308 384->384", 308, 384, 384),
    ("MiniLM M=308 384->1536", 308, 1536, 384),
    ("MiniLM M=308 1536->384", 308, 384, 1536),
    # A bidirectional LSTM of hidden 100 over 500 steps of batch 2 (bench/recurrent.py's
    # first case): the input projection of both directions, and one step's H·Rᵀ.
    ("LSTM projection M=1000 100->800", 1000, 800, 100),
    ("LSTM step M=2 100->400", 2, 400, 100),
]
BLOCK_SECONDS = 0.06
# Idle time before each timed block, as in latency.py: ORT's intra-op workers
# spin after a run, and without it the other session's spinning worker takes
# the second core (both EPs' 2-thread rates then fell to 50-65% of the peak).
PAUSE_SECONDS = 0.05


def matmul_model(m: int, n: int, k: int) -> bytes:
    rng = np.random.default_rng(m * 7 + n * 3 + k)
    b = rng.uniform(-1, 1, (k, n)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["A", "B"], ["C"])], "gemm",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, [m, k])],
        [helper.make_tensor_value_info("C", TensorProto.FLOAT, [m, n])],
        [numpy_helper.from_array(b, "B")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)
    onnx.checker.check_model(model)
    return model.SerializeToString()


def sessions(model: bytes, dev, threads: int):
    cpu = ort.InferenceSession(model, cpu_options(threads), providers=["CPUExecutionProvider"])
    # claim=all: kiln's cost rule leaves the small products (the LSTM step) to ORT.
    return cpu, ort.InferenceSession(model, kiln_options(dev, threads, ep={"claim": "all"}))


def per_run(sess, feeds, n: int) -> float:
    sess.run(None, feeds)
    t0 = time.perf_counter()
    for _ in range(n):
        sess.run(None, feeds)
    return (time.perf_counter() - t0) / n


def block(sess, feeds) -> int:
    dt = min(per_run(sess, feeds, 1) for _ in range(3))
    return max(1, int(BLOCK_SECONDS / max(dt, 1e-6)))


def fma_peak() -> float:
    out = subprocess.run(["cargo", "bench", "--quiet", "--bench", "gemm", "--", "--bench", "--peak-only"],
                         cwd=REPO, check=True, capture_output=True, text=True).stdout
    return float(out.strip().splitlines()[-1])


def compare(name: str, m: int, n: int, k: int, dev, threads: int, reps: int):
    """GFLOP/s of ORT's CPU EP and of kiln on one MatMul, interleaved blocks."""
    cpu, ks = sessions(matmul_model(m, n, k), dev, threads)
    a = np.random.default_rng(1).uniform(-1, 1, (m, k)).astype(np.float32)
    feeds = {"A": a}
    want, got = cpu.run(None, feeds)[0], ks.run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.sqrt(k), err_msg=name)
    n_cpu, n_kiln = block(cpu, feeds), block(ks, feeds)
    t_cpu, t_kiln = [], []
    for r in range(reps):
        order = [(cpu, n_cpu, t_cpu), (ks, n_kiln, t_kiln)]
        for sess, count, out in order if r % 2 == 0 else order[::-1]:
            out.append(time_block(sess, feeds, count, PAUSE_SECONDS))
    flops = 2.0 * m * n * k
    return flops / statistics.median(t_cpu) / 1e9, flops / statistics.median(t_kiln) / 1e9


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=9)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "gemm_ort.md"))
    ap.add_argument("--threads", default="1,2", help="intra-op thread counts, comma-separated")
    ap.add_argument("--filter", default="", help="only cases whose name contains this")
    args = ap.parse_args()
    thread_counts = [int(t) for t in args.threads.split(",")]

    kiln.register()
    dev = kiln.host_device()
    peak = fma_peak()
    rows = []
    for name, m, n, k in [c for c in CASES if args.filter in c[0]]:
        for threads in thread_counts:
            g_cpu, g_kiln = compare(name, m, n, k, dev, threads, args.reps)
            print(f"{name}, {threads} thread(s): ORT {g_cpu:.1f} GFLOP/s, kiln {g_kiln:.1f} GFLOP/s", file=sys.stderr)
            rows.append((name, m, n, k, threads, g_cpu, g_kiln))

    lines = [
        "# kiln vs ORT's CPU EP: one MatMul\n",
        describe() + "\n",
        f"Run: `python bench/gemm_ort.py` on {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}; "
        f"single-core FMA peak **{peak:.1f} GFLOP/s** (`bench/gemm.rs`'s measurement; % peak below is "
        "against the peak times the thread count).\n",
        f"One `MatMul(A[M,K], B[K,N] constant)` per model, the same `intra_op_num_threads` for both, "
        f"`ORT_ENABLE_ALL`; median of {args.reps} interleaved blocks of ~{int(BLOCK_SECONDS * 1000)} ms, each after {int(PAUSE_SECONDS * 1000)} ms idle and one untimed run. "
        "GFLOP/s = 2·M·N·K / time per `Run` (ORT's per-Run overhead included for both). kiln/ORT > 1: kiln is "
        "faster.\n",
        "| case | M | N | K | threads | ORT CPU EP GFLOP/s | % peak | kiln GFLOP/s | % peak | kiln/ORT |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, m, n, k, threads, g_cpu, g_kiln in rows:
        top = peak * threads
        lines.append(f"| {name} | {m} | {n} | {k} | {threads} | {g_cpu:.1f} | {100 * g_cpu / top:.0f}% | "
                     f"{g_kiln:.1f} | {100 * g_kiln / top:.0f}% | **{g_kiln / g_cpu:.2f}** |")
    publish(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
