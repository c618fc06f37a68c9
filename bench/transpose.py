#!/usr/bin/env python3
"""Layout transposes NCHW <-> NHWC: kiln vs ORT's CPU EP (issue #13).

kiln runs convolutions channels-last, so a CNN's NCHW tensors are transposed
at the edges of kiln's partitions. One ONNX model per case holding a single
``Transpose`` of the graph input (perm ``[0,2,3,1]``: NCHW -> NHWC, or
``[0,3,1,2]``: NHWC -> NCHW) at CNN shapes, plus a few other strided copies
as controls (an attention-style ``[0,2,1,3]``, 2- and 8-byte elements). Each
runs on kiln (EP option ``claim=all``) and on ORT's CPU EP
(``ORT_ENABLE_ALL``), ``intra_op_num_threads`` 1, interleaved blocks in the
same run (``bench/real.py``'s ``latency``: each a block of runs of ~50 ms
after a pause and one untimed run; median over ``--reps``), after checking
kiln's output equals the CPU EP's bit for bit. Times are per ``Run`` (the
session's overhead included, the same on both sides); kiln/ORT > 1: kiln is
faster.

Usage (from the repository root, after ``cargo build --release``)::

    KILN_EP_LIBRARY=target/release/libkiln_ep.so PYTHONPATH=python \\
        .venv/bin/python bench/transpose.py [--reps 9] [--threads 1] [--out FILE]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from onnx import TensorProto, helper  # noqa: E402

import real  # noqa: E402  (puts python/ and python/tests on sys.path)
import onnxruntime_ep_kiln as kiln  # noqa: E402
from machine import describe, publish  # noqa: E402


@dataclass(frozen=True)
class Case:
    shape: Tuple[int, ...]
    perm: Tuple[int, ...]
    dtype: str = "float32"

    @property
    def key(self) -> str:
        what = {(0, 2, 3, 1): "NCHW->NHWC", (0, 3, 1, 2): "NHWC->NCHW"}.get(self.perm, f"perm {list(self.perm)}")
        return f"{what} {'x'.join(map(str, self.shape))} {self.dtype}"


NCHW = ((1, 3, 640, 640), (1, 64, 112, 112), (1, 256, 56, 56), (1, 2048, 7, 7), (1, 32, 112, 112),
        (2, 64, 56, 56))
CASES = (
    [Case(s, (0, 2, 3, 1)) for s in NCHW]
    + [Case((s[0], s[2], s[3], s[1]), (0, 3, 1, 2)) for s in NCHW]
    + [
        Case((1, 64, 112, 112), (0, 2, 3, 1), "float16"),
        Case((1, 112, 112, 64), (0, 3, 1, 2), "float16"),
        Case((1, 64, 56, 56), (0, 2, 3, 1), "int64"),
        Case((1, 12, 128, 64), (0, 2, 1, 3)),
        Case((1, 96, 96, 33), (0, 3, 1, 2)),
    ]
)

ONNX_TYPE = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "int64": TensorProto.INT64}


def transpose_model(case: Case) -> onnx.ModelProto:
    t = ONNX_TYPE[case.dtype]
    node = helper.make_node("Transpose", ["x"], ["y"], perm=list(case.perm))
    g = helper.make_graph([node], "transpose", [helper.make_tensor_value_info("x", t, list(case.shape))],
                          [helper.make_tensor_value_info("y", t, None)])
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def feed(case: Case) -> np.ndarray:
    rng = np.random.default_rng(sum(case.shape))
    if case.dtype == "int64":
        return rng.integers(-1000, 1000, case.shape, dtype=np.int64)
    return rng.standard_normal(case.shape).astype(case.dtype)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=9, help="interleaved repetitions of the timed blocks")
    ap.add_argument("--threads", default="1")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "transpose.md"))
    args = ap.parse_args()
    threads = [int(t) for t in args.threads.split(",")]

    kiln.register()
    dev = kiln.host_device()
    real.EP_OPTIONS = {"claim": "all"}
    rows: List[str] = []
    with real.OtherLoad() as load, tempfile.TemporaryDirectory() as work:
        for case in CASES:
            path = os.path.join(work, "transpose.onnx")
            onnx.save(transpose_model(case), path)
            feeds = {"x": feed(case)}
            on_kiln = real.claimed(path, dev, real.GOL.ORT_ENABLE_ALL)["kiln"] > 0
            cells = [case.key, "yes" if on_kiln else "no"]
            for t in threads:
                cpu, ks = real.cpu_session(path, t), real.kiln_session(path, dev, t)
                want, got = cpu.run(None, feeds)[0], ks.run(None, feeds)[0]
                assert got.dtype == want.dtype and np.array_equal(got.view(np.uint8), want.view(np.uint8)), case.key
                times = real.latency({"cpu": cpu, "kiln": ks}, feeds, args.reps, 0.02)
                cells += [f"{times['cpu'] * 1e3:.3f}", f"{times['kiln'] * 1e3:.3f}",
                          f"{times['cpu'] / times['kiln']:.2f}"]
                print(f"{case.key} x{t}: ORT {times['cpu'] * 1e3:.3f} ms, kiln {times['kiln'] * 1e3:.3f} ms, "
                      f"kiln/ORT {times['cpu'] / times['kiln']:.2f}", file=sys.stderr)
                del cpu, ks
            rows.append("| " + " | ".join(cells) + " |")

    head = "| case | kiln ran |" + "".join(f" ORT x{t} ms | kiln x{t} ms | kiln/ORT x{t} |" for t in threads)
    busy = (f" **The machine was busy** (other processes used {load.cpus:.1f} CPUs on average): "
            "the interleaved medians keep the ratios comparable, the absolute times less so."
            if load.cpus >= 0.3 else "")
    lines = [
        "# Transposes NCHW <-> NHWC: kiln vs ORT's CPU EP (issue #13)\n",
        describe() + "\n",
        f"Run: `python bench/transpose.py` on {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}; "
        f"median of {args.reps} interleaved blocks (~50 ms each) per case; other processes used "
        f"{load.cpus:.1f} CPUs on average while it ran.{busy}\n",
        "One `Transpose` of the graph input per model; kiln with `claim=all`, the CPU EP at `ORT_ENABLE_ALL`; "
        "ms per `Run` (session overhead included); kiln/ORT > 1: kiln is faster. Outputs checked bit-exact "
        "against the CPU EP's.\n",
        head,
        "|---|---|" + "---:|" * (3 * len(threads)),
        *rows,
    ]
    publish(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
