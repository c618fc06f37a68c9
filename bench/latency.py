#!/usr/bin/env python3
"""Latency benchmark for issue #5: kiln vs ONNX Runtime's CPU EP on GEMM-heavy models.

Models (built by ``python/tests/models_lib.py``, deterministic weights, static shapes):

  mlp_4x1024_b1 / _b32        4 x Gemm(1024 x 1024) + Relu, batch 1 and 32
  bert_base_l4_s128_b1_mask   BERT-base-shaped encoder: hidden 768, 12 heads,
                              seq 128, 4 layers, batch 1, int64 attention mask
  bert_h256_l4_s128_b1_mask   small-hidden encoder: hidden 256, 4 heads, seq 128,
                              4 layers, batch 1, attention mask

For each model and each ``intra_op_num_threads`` (1 and 2):

  cpu   ORT's CPU EP, ``GraphOptimizationLevel.ORT_ENABLE_ALL``
  kiln  kiln's host device, ``session.disable_cpu_ep_fallback=1`` (kiln must
        take every node), same thread count (kiln runs on ORT's intra-op pool),
        ORT's default ``ORT_ENABLE_ALL`` (ORT's basic fusions run before kiln
        sees the graph)
  kiln-raw  the same with ``ORT_DISABLE_ALL``: kiln gets the graph as exported

Before timing, both sessions' outputs are checked against each other (the
model's tolerance from models_lib) and kiln's compute counter must move. Then,
interleaved and repeated (default 20 repetitions, order rotated each time),
each session runs a block of calls sized to take ~50 ms, after a 50 ms pause
and one untimed run (ORT's intra-op worker threads spin for a while after a
run; without the pause, the previous session's spinning worker takes the
second core and the 2-thread numbers of whichever session runs next double);
the table reports the median time per call over the repetitions and the
ratio kiln / ORT (< 1: kiln is faster).

Session creation, also interleaved (default 5 repetitions): the CPU EP on the
original model, kiln on the original (GetCapability + compile + weight
packing: kiln's compile time) and kiln on the ``_ctx.onnx`` it wrote (embed
mode 0: the packed weights are memory-mapped from ``_kiln.bin``).

Writes a Markdown report with the machine description to
``bench/results/latency.md`` and prints it.

Usage (from the repository root, after ``cargo build --release``)::

    KILN_EP_LIBRARY=target/release/libkiln_ep.so PYTHONPATH=python \\
        .venv/bin/python bench/latency.py [--reps 20] [--create-reps 5] [--threads 1,2]
        [--models mlp_4x1024_b1,...] [--out FILE] [--keep DIR]
"""
from __future__ import annotations

import argparse
import gc
import os
# numpy's OpenBLAS keeps a server thread spinning after any BLAS call (3-8%
# of a benchmark process's samples), on the core a 2-thread session needs.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import shutil
import statistics
import sys
import tempfile
import time
from typing import Dict, List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, os.path.join(REPO, "python", "tests"))

import numpy as np  # noqa: E402
import onnxruntime as ort  # noqa: E402

import onnxruntime_ep_kiln as kiln  # noqa: E402
from machine import describe as describe_machine  # noqa: E402
import models_lib as ml  # noqa: E402

BLOCK_SECONDS = 0.05


def machine() -> str:
    return describe_machine()


def cpu_options(threads: int) -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    return so


def kiln_options(dev, threads: int, extra: Dict[str, str] = None, strict: bool = True,
                 level=ort.GraphOptimizationLevel.ORT_ENABLE_ALL,
                 ep: Dict[str, str] = None) -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    if strict:
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    for k, v in (extra or {}).items():
        so.add_session_config_entry(k, v)
    so.add_provider_for_devices([dev], dict(ep or {}))
    return so


def cpu_session(path: str, threads: int) -> ort.InferenceSession:
    return ort.InferenceSession(path, cpu_options(threads), providers=["CPUExecutionProvider"])


def kiln_session(path: str, dev, threads: int, strict: bool = True) -> ort.InferenceSession:
    return ort.InferenceSession(path, kiln_options(dev, threads, strict=strict), enable_fallback=0)


def kiln_latency_session(path: str, dev, threads: int, allow_partial: bool,
                         level=ort.GraphOptimizationLevel.ORT_ENABLE_ALL) -> Tuple[ort.InferenceSession, str]:
    """A kiln session for timing and who runs what: "all" when kiln took every
    node; with ``allow_partial``, a session where the CPU EP may run some nodes
    and "k/n" nodes on kiln (the table marks such rows)."""
    try:
        return ort.InferenceSession(path, kiln_options(dev, threads, level=level), enable_fallback=0), "all"
    except Exception as exc:  # noqa: BLE001
        if not allow_partial or "fallback to CPU EP has been explicitly disabled" not in str(exc):
            raise
    gc.collect()
    so = kiln_options(dev, threads, {"session.record_ep_graph_assignment_info": "1"}, strict=False, level=level)
    sess = ort.InferenceSession(path, so, enable_fallback=0)
    info = sess.get_provider_graph_assignment_info()
    on_kiln = sum(len(sg.get_nodes()) for sg in info if sg.ep_name == kiln.EP_NAME)
    total = sum(len(sg.get_nodes()) for sg in info)
    return sess, f"{on_kiln}/{total}"


def _cpu_jiffies() -> Tuple[int, int]:
    """(busy jiffies of the whole machine, jiffies of this process), from /proc."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:]]
        busy = sum(v) - v[3] - (v[4] if len(v) > 4 else 0)  # minus idle and iowait
        with open("/proc/self/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return busy, int(fields[11]) + int(fields[12])  # utime + stime (all threads)
    except (OSError, ValueError, IndexError):
        return 0, 0


class OtherLoad:
    """CPU time other processes used while timing, in CPUs (0 = the machine was ours)."""

    def __enter__(self):
        self.t0, (self.b0, self.s0) = time.perf_counter(), _cpu_jiffies()
        return self

    def __exit__(self, *exc):
        b1, s1 = _cpu_jiffies()
        hz = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        self.cpus = max(0.0, ((b1 - self.b0) - (s1 - self.s0)) / hz / max(time.perf_counter() - self.t0, 1e-9))
        return False


def block_size(sess, feeds) -> int:
    for _ in range(3):
        sess.run(None, feeds)
    t0 = time.perf_counter()
    sess.run(None, feeds)
    dt = time.perf_counter() - t0
    return max(1, int(round(BLOCK_SECONDS / max(dt, 1e-6))))


def time_block(sess, feeds, n: int, pause: float) -> float:
    # ORT's intra-op workers spin for a while after a run: let the previous
    # session's workers go to sleep (else they steal the second core), then wake
    # this session's pool with one untimed run.
    time.sleep(pause)
    sess.run(None, feeds)
    t0 = time.perf_counter()
    for _ in range(n):
        sess.run(None, feeds)
    return (time.perf_counter() - t0) / n


def check(case: ml.ModelCase, want: List[np.ndarray], got: List[np.ndarray], what: str) -> float:
    worst = 0.0
    for e, a in zip(want, got):
        np.testing.assert_allclose(a, e, rtol=case.rtol, atol=case.atol, err_msg=f"{case.name}: {what}")
        worst = max(worst, float(np.max(np.abs(a - e))))
    return worst


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=20, help="interleaved repetitions of the latency blocks")
    ap.add_argument("--create-reps", type=int, default=5, help="interleaved repetitions of session creation")
    ap.add_argument("--threads", default="1,2", help="intra_op_num_threads values, comma-separated")
    ap.add_argument("--models", default="", help="comma-separated subset of the model names")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "latency.md"))
    ap.add_argument("--keep", help="keep the generated models in this folder")
    ap.add_argument("--pause-ms", type=float, default=50.0,
                    help="idle time before each timed block (lets other sessions' spinning threads sleep)")
    ap.add_argument("--allow-partial", action="store_true",
                    help="time kiln even where it does not take every node (marked in the table)")
    args = ap.parse_args()
    threads_list = [int(t) for t in args.threads.split(",") if t.strip()]

    cases = list(ml.bench_cases())
    if args.models:
        wanted = set(args.models.split(","))
        cases = [c for c in cases if c.name in wanted]
        missing = wanted - {c.name for c in cases}
        if missing:
            ap.error(f"unknown model(s) {sorted(missing)}; known: {[c.name for c in ml.bench_cases()]}")

    load_before = os.getloadavg()
    name = kiln.register("kiln_latency_bench")
    dev = kiln.host_device()
    work = args.keep or tempfile.mkdtemp(prefix="kiln-latency-")
    os.makedirs(work, exist_ok=True)
    lat_rows: List[Tuple] = []
    create_rows: List[Tuple] = []
    try:
        for case in cases:
            folder = os.path.join(work, case.name)
            path = case.save(folder)
            feeds = case.feeds(0)
            print(f"== {case.name}: {case.description}; {case.weight_bytes / 2**20:.1f} MiB weights", flush=True)

            # ---- latency --------------------------------------------------
            strict = True
            for threads in threads_list:
                cpu = cpu_session(path, threads)
                s0 = kiln.stats()
                kl, share = kiln_latency_session(path, dev, threads, args.allow_partial)
                strict = strict and share == "all"
                s1 = kiln.stats()
                raw, share_raw = kiln_latency_session(path, dev, threads, args.allow_partial,
                                                      ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
                want = cpu.run(None, feeds)
                s2 = kiln.stats()
                got = kl.run(None, feeds)
                s3 = kiln.stats()
                assert s3["compute_calls"] > s2["compute_calls"], "kiln computed nothing"
                diff = check(case, want, got, f"kiln vs CPU EP, {threads} thread(s)")
                diff_raw = check(case, want, raw.run(None, feeds), f"kiln (ORT_DISABLE_ALL) vs CPU EP, {threads} thread(s)")
                sessions = {"cpu": cpu, "kiln": kl, "kiln-raw": raw}
                blocks = {k: block_size(s, feeds) for k, s in sessions.items()}
                times: Dict[str, List[float]] = {k: [] for k in sessions}
                keys = list(sessions)
                with OtherLoad() as other:
                    for rep in range(args.reps):
                        order = keys[rep % len(keys):] + keys[:rep % len(keys)]
                        for k in order:
                            times[k].append(time_block(sessions[k], feeds, blocks[k], args.pause_ms / 1e3))
                med = {k: statistics.median(v) for k, v in times.items()}
                lat_rows.append((case, threads, med, times, max(diff, diff_raw),
                                 s1["partitions_compiled"] - s0["partitions_compiled"], share, share_raw, other.cpus))
                print(f"   {threads} thread(s): ORT CPU {med['cpu'] * 1e3:8.3f} ms   kiln {med['kiln'] * 1e3:8.3f} ms"
                      f" ({med['kiln'] / med['cpu']:.2f}x)   kiln on the unoptimised graph {med['kiln-raw'] * 1e3:8.3f} ms"
                      f" ({med['kiln-raw'] / med['cpu']:.2f}x)   (max |diff| {max(diff, diff_raw):.1e}; other processes used"
                      f" {other.cpus:.2f} CPUs meanwhile)", flush=True)
                del cpu, kl, raw, sessions
                gc.collect()

            # ---- session creation: compile vs load -----------------------
            ctx_dir = os.path.join(folder, "ctx")
            os.makedirs(ctx_dir, exist_ok=True)
            ctx = os.path.join(ctx_dir, f"{case.name}_ctx.onnx")
            gen = ort.InferenceSession(path, kiln_options(dev, 1, {
                "ep.context_enable": "1", "ep.context_embed_mode": "0", "ep.context_file_path": ctx}, strict=strict),
                enable_fallback=0)
            del gen
            gc.collect()
            s0 = kiln.stats()
            loaded = kiln_session(ctx, dev, 1, strict)
            s1 = kiln.stats()
            assert s1["partitions_compiled"] == s0["partitions_compiled"], "loading the _ctx.onnx compiled"
            assert s1["context_graphs_loaded"] > s0["context_graphs_loaded"], "nothing loaded from the context"
            check(case, cpu_session(path, 1).run(None, feeds), loaded.run(None, feeds), "_ctx.onnx vs CPU EP")
            del loaded
            gc.collect()
            creators = {
                "cpu": lambda: cpu_session(path, 1),
                "kiln-compile": lambda: kiln_session(path, dev, 1, strict),
                "kiln-ctx": lambda: kiln_session(ctx, dev, 1, strict),
            }
            ctimes: Dict[str, List[float]] = {k: [] for k in creators}
            keys = list(creators)
            for rep in range(args.create_reps):
                order = keys[rep % len(keys):] + keys[:rep % len(keys)]
                for k in order:
                    gc.collect()
                    t0 = time.perf_counter()
                    obj = creators[k]()
                    ctimes[k].append(time.perf_counter() - t0)
                    del obj
            gc.collect()
            sizes = (os.path.getsize(path), os.path.getsize(ctx),
                     os.path.getsize(os.path.join(ctx_dir, f"{case.name}_kiln.bin")))
            create_rows.append((case, {k: statistics.median(v) for k, v in ctimes.items()}, sizes))
            c = create_rows[-1][1]
            print(f"   session creation: ORT CPU {c['cpu'] * 1e3:.1f} ms, kiln compile {c['kiln-compile'] * 1e3:.1f} ms,"
                  f" kiln from _ctx.onnx {c['kiln-ctx'] * 1e3:.1f} ms", flush=True)
    finally:
        gc.collect()
        kiln.unregister(name)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    # ---- report -----------------------------------------------------------
    lines = [
        f"Latency per run, median of {args.reps} interleaved repetitions (each a block of runs of ~"
        f"{BLOCK_SECONDS * 1e3:.0f} ms after {args.pause_ms:.0f} ms idle and one untimed run); ORT's CPU EP with `ORT_ENABLE_ALL`; kiln with "
        f"`session.disable_cpu_ep_fallback=1` (kiln ran every node). Same `intra_op_num_threads` for both. "
        f"kiln/ORT < 1 means kiln is faster.",
        "",
        "| model | threads | ORT CPU EP ms | kiln ms | kiln/ORT | kiln, `ORT_DISABLE_ALL` ms | kiln/ORT | "
        "kiln partitions | nodes on kiln | max \\|kiln - ORT\\| | other load (CPUs) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for case, threads, med, _times, diff, parts, share, share_raw, other_cpus in lat_rows:
        shares = share if share == share_raw else f"{share} / {share_raw}"
        lines.append(f"| {case.name} | {threads} | {med['cpu'] * 1e3:.3f} | {med['kiln'] * 1e3:.3f} | "
                     f"**{med['kiln'] / med['cpu']:.2f}** | {med['kiln-raw'] * 1e3:.3f} | {med['kiln-raw'] / med['cpu']:.2f} | "
                     f"{parts} | {shares if shares == 'all' else '**' + shares + '**'} | {diff:.1e} | "
                     f"{other_cpus:.2f} |")
    lines += [
        "",
        "\"kiln\" is a default session (`ORT_ENABLE_ALL`, what an application gets): ORT applies its basic "
        "fusions (MatMulAddFusion turns 3-D MatMul+Add into Reshape/Gemm/Reshape, LayerNormFusion, Shape "
        "constant folding) before kiln's GetCapability, so kiln compiles ORT's rewritten graph. \"kiln, "
        "`ORT_DISABLE_ALL`\" hands kiln the model as exported (what the compile API gives it too), where kiln's "
        "own fusions (bias/GELU/residual GEMM epilogues) see the original patterns. \"other load\": CPU time "
        "other processes used while the row was timed, in CPUs (from /proc/stat; above ~0.1 the row, especially "
        "its 2-thread numbers, is disturbed: rerun on a quiet machine).",
    ]
    lines += [
        "",
        f"Session creation (1 thread), median of {args.create_reps} interleaved repetitions: ORT's CPU EP on the "
        "original model, kiln on the original (compiles: kiln's compile time) and kiln on the embed-0 "
        "`_ctx.onnx` it wrote (loads the compiled programs and packed weights, compiles nothing).",
        "",
        "| model | ORT CPU EP ms | kiln compile ms | kiln from `_ctx.onnx` ms | load/compile | .onnx MB | _ctx.onnx KB | _kiln.bin MB |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for case, c, (onnx_b, ctx_b, bin_b) in create_rows:
        lines.append(f"| {case.name} | {c['cpu'] * 1e3:.1f} | {c['kiln-compile'] * 1e3:.1f} | "
                     f"{c['kiln-ctx'] * 1e3:.1f} | {c['kiln-ctx'] / c['kiln-compile']:.2f} | "
                     f"{onnx_b / 1e6:.1f} | {ctx_b / 1e3:.1f} | {bin_b / 1e6:.1f} |")
    lines += ["", "Models:", ""]
    lines += [f"- `{c.name}`: {c.description}; {c.n_nodes} nodes; {c.weight_bytes / 2**20:.1f} MiB of f32 weights"
              for c in cases]
    table = "\n".join(lines)
    cmd = " ".join(["bench/latency.py"] + [a for a in sys.argv[1:]])
    doc = ("# kiln latency benchmark (issue #5)\n\n"
           f"Machine: {machine()}\n\n"
           f"Run: `python {cmd}` on {time.strftime('%Y-%m-%d %H:%M:%S %Z')}; load average before the run "
           f"{load_before[0]:.2f} / {load_before[1]:.2f} (1 / 5 min), after {os.getloadavg()[0]:.2f}\n\n"
           f"{table}\n")
    print()
    print(doc)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(doc)
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
