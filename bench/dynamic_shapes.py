#!/usr/bin/env python3
"""Shape-generic partitions against fixed-shape compiles (issue #11).

kiln compiles a partition with symbolic dims once (weights packed at
Compile) and builds its program at the first run with each new input shape.
This measures, for models of the real-model corpus with symbolic dims, at
each shape:

* steady-state latency of a kiln session on the model as shipped (symbolic
  dims, shape-generic) against a kiln session on a copy whose input dims are
  fixed to that shape (compiled for it at session creation): what a run
  costs once the shape's program is cached;
* the first run at that shape in a fresh shape-generic session (the
  specialisation: import, passes, kernel choice, memory plan) against the
  first run of the fixed-shape session (whose program was built at creation);
* session creation of both.

Writes ``bench/results/dynamic_shapes.md`` (with the machine it ran on).

Usage::

    KILN_EP_LIBRARY=target/release/libkiln_ep.so PYTHONPATH=python \\
        .venv/bin/python bench/dynamic_shapes.py [--models minilm_l3,ppocr_rec] [--reps 10]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Dict, List

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, os.path.join(REPO, "python", "tests"))

import numpy as np  # noqa: E402
import onnx  # noqa: E402

import onnxruntime_ep_kiln as kiln  # noqa: E402
import real_corpus as rc  # noqa: E402
from machine import describe, publish  # noqa: E402
from real import creation, kiln_session, latency, ms  # noqa: E402

DEFAULT_MODELS = "minilm_l3,ppocr_rec,yolov8n"


def fixed_copy(path: str, feeds: Dict[str, np.ndarray], out: str) -> str:
    """The model with its graph inputs fixed to these feeds' shapes and ORT's
    inferred value infos dropped (ORT infers them again, statically)."""
    m = onnx.load(path)
    for i in m.graph.input:
        if i.name in feeds:
            dims = i.type.tensor_type.shape.dim
            for d, n in zip(dims, feeds[i.name].shape):
                d.Clear()
                d.dim_value = int(n)
    del m.graph.value_info[:]
    for o in m.graph.output:
        o.type.tensor_type.ClearField("shape")
    onnx.save(m, out)
    return out


def first_run(make, feeds) -> float:
    sess = make()
    t0 = time.perf_counter()
    sess.run(None, feeds)
    return time.perf_counter() - t0


def bench_shape(path: str, dev, feeds, reps: int, work: str, label: str) -> List[str]:
    fixed = fixed_copy(path, feeds, os.path.join(work, f"fixed_{label}.onnx"))
    generic = kiln_session(path, dev)
    static = kiln_session(fixed, dev)
    generic.run(None, feeds)
    static.run(None, feeds)
    lat = latency({"generic": generic, "fixed": static}, feeds, reps, 0.05)
    firsts = {
        "generic": statistics.median(first_run(lambda: kiln_session(path, dev), feeds) for _ in range(3)),
        "fixed": statistics.median(first_run(lambda: kiln_session(fixed, dev), feeds) for _ in range(3)),
    }
    made = creation({"generic": lambda: kiln_session(path, dev), "fixed": lambda: kiln_session(fixed, dev)}, 3)
    return [label, f"{ms(lat['generic'])} / {ms(lat['fixed'])} (**{lat['generic'] / lat['fixed']:.2f}**)",
            f"{ms(firsts['generic'])} / {ms(firsts['fixed'])}",
            f"{ms(made['generic'])} / {ms(made['fixed'])}"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default=DEFAULT_MODELS)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "dynamic_shapes.md"))
    args = ap.parse_args()
    paths = rc.all_models()
    kiln.register()
    dev = kiln.host_device()
    lines = ["# Shape-generic partitions vs fixed-shape compiles (issue #11)", "", describe(), "",
             f"Run: `python bench/dynamic_shapes.py` on {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}",
             "", "| model | shape | steady latency ms: shape-generic / fixed (ratio) | first run ms: "
             "shape-generic / fixed | session creation ms: shape-generic / fixed |",
             "|---|---|---:|---:|---:|"]
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory() as work:
        for key in args.models.split(","):
            spec = rc.spec(key)
            for label, params in spec.variants:
                feeds = rc.model_feeds(spec, paths[key], params)
                row = bench_shape(paths[key], dev, feeds, args.reps, work, label)
                lines.append(f"| `{key}` | " + " | ".join(row) + " |")
                print(lines[-1], flush=True)
    lines += ["", "1 intra-op thread; steady latency: median of interleaved ~50 ms blocks; first run and "
              "creation: median of 3 fresh sessions. The fixed model is the shipped one with its input "
              "dims set to the shape (so kiln compiles it at session creation, as before issue #11)."]
    publish(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
