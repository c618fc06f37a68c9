#!/usr/bin/env python3
"""kiln vs ORT's CPU EP on corpus models, by CPU time (issue #12).

``bench/real.py`` measures wall-clock latency, which on a busy shared machine
(load above the number of cores) mostly measures the other processes. This
script measures the CPU time the work itself takes, which such load disturbs
far less:

* 1 thread: ``time.thread_time()`` of the calling thread, where ORT runs the
  whole graph with ``intra_op_num_threads=1`` (kiln's steps included);
* 2 threads: ``time.process_time()`` (all threads of the process): the total
  CPU time, not the latency, so it shows the cost of kiln's parallel split
  and ORT's, not their speed-up.

Per model, shape and thread count: a kiln session (default options; ORT runs
what kiln does not claim) and a CPU EP session, outputs compared first, then
``--reps`` interleaved blocks of runs (order alternated), median per run.
Writes ``bench/results/cpu_time.md`` (or ``--out``) with the machine it ran on.

Usage (repository root, after ``cargo build --release``)::

    KILN_EP_LIBRARY=target/release/libkiln_ep.so PYTHONPATH=python \\
        .venv/bin/python bench/cpu_time.py [--models minilm_l3] [--threads 1,2] [--reps 9]
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

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, os.path.join(REPO, "python", "tests"))

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402

import onnxruntime_ep_kiln as kiln  # noqa: E402
import real_corpus as rc  # noqa: E402
from machine import describe, publish  # noqa: E402
from real import cpu_session, kiln_session  # noqa: E402

BLOCK_S = 0.05


def per_run_ms(sess: ort.InferenceSession, feeds, runs: int, clock) -> float:
    t0 = clock()
    for _ in range(runs):
        sess.run(None, feeds)
    return (clock() - t0) / runs * 1e3


def measure(cpu, kl, feeds, threads: int, reps: int):
    clock = time.thread_time if threads == 1 else time.process_time
    for s in (cpu, kl):
        s.run(None, feeds)
    runs = max(3, int(BLOCK_S / max(per_run_ms(cpu, feeds, 3, time.perf_counter) / 1e3, 1e-6)))
    times = {"cpu": [], "kiln": []}
    for r in range(reps):
        order = [("cpu", cpu), ("kiln", kl)]
        for key, sess in order if r % 2 == 0 else order[::-1]:
            times[key].append(per_run_ms(sess, feeds, runs, clock))
    return statistics.median(times["kiln"]), statistics.median(times["cpu"])


def check(spec: rc.Spec, cpu, kl, feeds) -> None:
    for w, g in zip(cpu.run(None, feeds), kl.run(None, feeds)):
        np.testing.assert_allclose(g, w, rtol=spec.rtol, atol=spec.atol)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="minilm_l3", help="comma-separated corpus keys")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--reps", type=int, default=9, help="interleaved blocks of ~50 ms per session")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "cpu_time.md"))
    args = ap.parse_args()
    paths = rc.all_models(log=lambda *a: None)
    name = kiln.register("kiln_cpu_time")
    dev = kiln.host_device()
    rows = []
    try:
        for key in [m for m in args.models.split(",") if m]:
            spec = rc.spec(key)
            path = paths[key]
            feeds = [(label, rc.model_feeds(spec, path, params, seed=i))
                     for i, (label, params) in enumerate(spec.variants)]
            for threads in [int(t) for t in args.threads.split(",")]:
                cpu, kl = cpu_session(path, threads), kiln_session(path, dev, threads)
                for label, f in feeds:
                    check(spec, cpu, kl, f)
                    k, c = measure(cpu, kl, f, threads, args.reps)
                    rows.append((key, label, threads, k, c))
                    print(f"{key} {label} {threads} thread(s): kiln {k:.3f} ms, CPU EP {c:.3f} ms ({k / c:.2f})",
                          flush=True)
                del cpu, kl
    finally:
        kiln.unregister(name)
    load = os.getloadavg()[0]
    lines = [
        "# kiln vs the CPU EP by CPU time (issue #12)",
        "",
        f"Machine: {describe()}",
        "",
        f"Run: `python bench/cpu_time.py {' '.join(sys.argv[1:])}` on {time.strftime('%Y-%m-%d %H:%M:%S %Z')}; "
        f"load average after {load:.2f}",
        "",
        "| model | shape | threads | kiln ms | CPU EP ms | kiln / CPU EP |",
        "|---|---|---:|---:|---:|---:|",
    ]
    lines += [f"| `{m}` | {lab} | {t} | {k:.3f} | {c:.3f} | **{k / c:.2f}** |" for m, lab, t, k, c in rows]
    lines += [
        "",
        "CPU time per run, median of interleaved blocks of ~50 ms: with 1 thread the calling thread's "
        "(`time.thread_time`, ORT runs the graph on it), with 2 threads the whole process's "
        "(`time.process_time`: total CPU, not latency). Outputs checked against the CPU EP first.",
    ]
    publish(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
