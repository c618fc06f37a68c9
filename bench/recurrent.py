#!/usr/bin/env python3
"""Recurrent layers (LSTM, GRU): kiln vs ORT's CPU EP at the shapes models ship with.

kiln's claim rule takes an ``LSTM`` or ``GRU`` of hidden size 512 or more
(an anchor), so a layer kiln runs slower than ORT would make a model slower
with kiln registered. One ONNX model per case holding a single layer (random
weights and biases, ``X [seq, batch, input]``), run on kiln with
``claim=all`` (the column "default claims it" says whether kiln's default rule claims
it) and on the CPU EP (``ORT_ENABLE_ALL``), in interleaved blocks of the same run
(``bench/real.py``'s ``latency``; median over ``--reps``), after comparing
kiln's outputs with the CPU EP's. kiln/ORT > 1: kiln is faster.

Shapes: the EEG seizure detector of ``brainmaze-eeg-models`` (bidirectional,
hidden 100, batch 2, 500 steps), a CRNN text recogniser's head (ddddocr,
bidirectional, hidden 512-class over ~40 steps), Silero VAD's
decoder (one step, hidden 128), and a small grid around them.

Usage (from the repository root, after ``cargo build --release``)::

    KILN_EP_LIBRARY=target/release/libkiln_ep.so PYTHONPATH=python \\
        .venv/bin/python bench/recurrent.py [--reps 9] [--threads 1,2] [--cases NAME,...] [--out FILE]
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import real  # noqa: E402  (puts python/ and python/tests on sys.path)
import onnxruntime_ep_kiln as kiln  # noqa: E402
from machine import describe, publish  # noqa: E402


@dataclass(frozen=True)
class Case:
    cell: str  # "LSTM" or "GRU"
    direction: str
    seq: int
    batch: int
    input: int
    hidden: int
    note: str = ""

    @property
    def key(self) -> str:
        d = {"forward": "fwd", "bidirectional": "bidi", "reverse": "rev"}[self.direction]
        return f"{self.cell} {d} s{self.seq} b{self.batch} i{self.input} h{self.hidden}"


CASES = [
    Case("LSTM", "bidirectional", 500, 2, 100, 100, "brainmaze-eeg-models seizure detector"),
    Case("LSTM", "bidirectional", 500, 1, 100, 100),
    Case("LSTM", "bidirectional", 500, 8, 100, 100),
    Case("LSTM", "bidirectional", 40, 1, 512, 512, "CRNN head (ddddocr-class)"),
    Case("LSTM", "forward", 1, 1, 128, 128, "Silero VAD decoder step"),
    Case("LSTM", "forward", 100, 1, 64, 64),
    Case("LSTM", "forward", 100, 4, 256, 256),
    Case("LSTM", "forward", 50, 16, 256, 256),
    Case("GRU", "bidirectional", 200, 2, 100, 100),
    Case("GRU", "forward", 100, 1, 128, 128),
    Case("GRU", "forward", 50, 8, 256, 256),
]


def layer_model(case: Case) -> onnx.ModelProto:
    gates = 4 if case.cell == "LSTM" else 3
    dirs = 2 if case.direction == "bidirectional" else 1
    rng = np.random.default_rng(case.hidden * 31 + case.input)
    scale = 1.0 / np.sqrt(case.hidden)

    def weight(name, *shape):
        return numpy_helper.from_array((rng.uniform(-scale, scale, shape)).astype(np.float32), name)

    inits = [weight("W", dirs, gates * case.hidden, case.input), weight("R", dirs, gates * case.hidden, case.hidden),
             weight("B", dirs, 2 * gates * case.hidden)]
    outs = ["Y", "Y_h"] + (["Y_c"] if case.cell == "LSTM" else [])
    node = helper.make_node(case.cell, ["X", "W", "R", "B"], outs, hidden_size=case.hidden,
                            direction=case.direction)
    g = helper.make_graph([node], "layer", [helper.make_tensor_value_info("X", TensorProto.FLOAT,
                                                                          ["seq", "batch", case.input])],
                          [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 14)], ir_version=8)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=9, help="interleaved repetitions of the timed blocks")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--cases", default="", help="comma-separated case names (default: all)")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "recurrent.md"))
    args = ap.parse_args()
    threads = [int(t) for t in args.threads.split(",")]
    cases = real.select(ap, CASES, args.cases)

    kiln.register()
    dev = kiln.host_device()
    rows: List[str] = []
    with real.OtherLoad() as load, tempfile.TemporaryDirectory() as work:
        for case in cases:
            path = os.path.join(work, "layer.onnx")
            onnx.save(layer_model(case), path)
            x = np.random.default_rng(1).standard_normal((case.seq, case.batch, case.input)).astype(np.float32)
            feeds = {"X": x}
            real.EP_OPTIONS = {}
            on_kiln = real.claimed(path, dev, real.GOL.ORT_ENABLE_ALL)["kiln"] > 0
            # Timed with claim=all: the layer on kiln, whatever the default rule decides.
            real.EP_OPTIONS = {"claim": "all"}
            cells = [case.key, case.note, "yes" if on_kiln else "no"]
            for t in threads:
                cpu, ks = real.cpu_session(path, t), real.kiln_session(path, dev, t)
                for want, got in zip(cpu.run(None, feeds), ks.run(None, feeds)):
                    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5, err_msg=case.key)
                times = real.latency({"cpu": cpu, "kiln": ks}, feeds, args.reps, 0.02)
                cells += [f"{times['cpu'] * 1e3:.3f}", f"{times['kiln'] * 1e3:.3f}",
                          f"{times['cpu'] / times['kiln']:.2f}"]
                print(f"{case.key} x{t}: ORT {times['cpu'] * 1e3:.3f} ms, kiln {times['kiln'] * 1e3:.3f} ms, "
                      f"kiln/ORT {times['cpu'] / times['kiln']:.2f}", file=sys.stderr)
                del cpu, ks
            rows.append("| " + " | ".join(cells) + " |")

    head = "| layer | from | default claims it |" + "".join(
        f" ORT x{t} ms | kiln x{t} ms | kiln/ORT x{t} |" for t in threads)
    busy = (f" **The machine was busy** (other processes used {load.cpus:.1f} CPUs on average): "
            "the interleaved medians keep the ratios comparable, the absolute times less so."
            if load.cpus >= 0.3 else "")
    lines = [
        "# Recurrent layers: kiln vs ORT's CPU EP\n",
        describe() + "\n",
        f"Run: `python bench/recurrent.py` on {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}; "
        f"median of {args.reps} interleaved blocks (~50 ms each) per case; other processes used "
        f"{load.cpus:.1f} CPUs on average while it ran.{busy}\n",
        "One layer per model (`X [seq, batch, input]`, bias, all outputs); kiln with `claim=all`, "
        "the CPU EP at `ORT_ENABLE_ALL`; ms per `Run` (session overhead included); kiln/ORT > 1: kiln is "
        "faster. Outputs checked against the CPU EP's (rtol 1e-4).\n",
        head,
        "|---|---|---|" + "---:|" * (3 * len(threads)),
        *rows,
    ]
    publish(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
