#!/usr/bin/env python3
"""Transformer encoders at issue #14's shapes: paraphrase-MiniLM-L3-v2 (the
real-model corpus, symbolic batch and sequence) at batch 1 and 8, sequence
16, 128 and 512, on kiln (defaults) and on ORT's CPU EP, 1 and 2 threads.

One session per EP and thread count serves every shape (the model as
shipped, `ORT_ENABLE_ALL`); outputs are compared first; latency is the median
of interleaved blocks (`real.py`'s `latency`). The issue's goal is kiln/CPU EP
≤ 0.85.

``--form`` replaces MiniLM with a synthetic 2-layer encoder (hidden 384, 12
heads, symbolic batch and sequence, with its padding mask unless ViT) in one
of ``models_lib.bert``'s attention export forms: bert, roberta, vit,
distilbert, sdpa. ``--clock cpu`` measures CPU time instead of wall-clock
time (``cpu_time.py``'s interleaved blocks: the calling thread's time at 1
thread, the process's at 2), steadier on a loaded machine.

Writes ``bench/results/encoders.md`` (or ``--out``) and prints it.

Usage (repository root, after ``make build`` and ``make corpus``)::

    KILN_EP_LIBRARY=target/release/libkiln_ep.so PYTHONPATH=python \\
        .venv/bin/python bench/encoders.py [--reps 7] [--threads 1,2] [--shapes 1x16,8x512] [--out FILE] \\
        [--form distilbert] [--clock cpu]
"""
from __future__ import annotations

import argparse
import os
# numpy's OpenBLAS keeps a server thread spinning after any BLAS call (3-8%
# of a benchmark process's samples), on the core a 2-thread session needs.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python", "tests"))

import numpy as np  # noqa: E402

import onnxruntime_ep_kiln as kiln  # noqa: E402
import cpu_time  # noqa: E402  (interleaved CPU-time blocks)
import models_lib as ml  # noqa: E402
import real  # noqa: E402  (sessions and interleaved latency, as bench/real.py)
import real_corpus as rc  # noqa: E402
from machine import describe, publish  # noqa: E402

SHAPES = "1x16,1x128,1x512,8x16,8x128,8x512"
# --form -> models_lib.bert options (issue #14's export forms)
FORMS = {
    "bert": dict(attn="eager"),
    "roberta": dict(attn="eager", mask_value=float(np.finfo(np.float32).min)),
    "vit": dict(attn="vit", mask=False),
    "distilbert": dict(attn="distilbert"),
    "sdpa": dict(attn="sdpa"),
}


class Synthetic:
    """A ``models_lib.bert`` encoder standing in for a corpus spec: feeds and tolerance."""

    def __init__(self, form: str, folder: str):
        opts = {"mask": True, **FORMS[form]}
        self.case = ml.bert(384, 12, 128, 1, 2, ln="op", act="erf", dynamic_batch=True, dynamic_seq=True,
                            name=f"encoder_{form}_h384_l2", **opts)
        self.path = self.case.save(folder)
        self.rtol, self.atol = self.case.rtol, self.case.atol

    def feeds(self, shape, rng):
        batch, seq = shape
        return self.case.feeds(int(rng.integers(1 << 30)), batch=batch, seq=seq)


def timed(sessions, feeds, threads: int, args) -> dict:
    """Seconds per run of each session: wall-clock medians, or CPU time."""
    if args.clock == "wall":
        return real.latency(sessions, feeds, args.reps, 0.05)
    kl, cpu = cpu_time.measure(sessions["cpu"], sessions["kiln"], feeds, threads, args.reps)
    return {"cpu": cpu / 1e3, "kiln": kl / 1e3}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--shapes", default=SHAPES, help="BATCHxSEQ, comma-separated")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "encoders.md"))
    ap.add_argument("--form", default="minilm_l3", choices=["minilm_l3", *FORMS])
    ap.add_argument("--clock", default="wall", choices=["wall", "cpu"])
    args = ap.parse_args()
    work = tempfile.TemporaryDirectory()
    if args.form == "minilm_l3":
        spec = next(s for s in rc.SPECS if s.key == "minilm_l3")
        path = rc.all_models()["minilm_l3"]
        what = (f"paraphrase-MiniLM-L3-v2 as shipped (`{os.path.basename(path)}`, symbolic batch and sequence, "
                "token ids and padding masks as `real_corpus.py` makes them)")
    else:
        spec = Synthetic(args.form, work.name)
        path = spec.path
        what = (f"`models_lib.bert` 2-layer encoder, hidden 384, 12 heads, symbolic batch and sequence, "
                f"attention exported as `{args.form}`{'' if args.form == 'vit' else ' with its padding mask'}")
    kiln.register()
    dev = kiln.host_device()
    shapes = [tuple(int(d) for d in s.split("x")) for s in args.shapes.split(",")]
    rows = []
    for threads in [int(t) for t in args.threads.split(",")]:
        sessions = {"cpu": real.cpu_session(path, threads), "kiln": real.kiln_session(path, dev, threads)}
        for batch, seq in shapes:
            feeds = spec.feeds((batch, seq), np.random.default_rng(0))
            want, got = (sessions[k].run(None, feeds) for k in ("cpu", "kiln"))
            for w, g in zip(want, got):
                np.testing.assert_allclose(g, w, rtol=spec.rtol, atol=spec.atol)
            t = timed(sessions, feeds, threads, args)
            print(f"{batch}x{seq}, {threads} thread(s): CPU EP {t['cpu'] * 1e3:.2f} ms, kiln "
                  f"{t['kiln'] * 1e3:.2f} ms", file=sys.stderr)
            rows.append((batch, seq, threads, t["cpu"], t["kiln"]))
        del sessions
    lines = [
        "# Transformer encoders: kiln vs ORT's CPU EP (issue #14)\n",
        describe() + "\n",
        f"Run: `python bench/encoders.py` on {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}.\n",
        f"{what}, `ORT_ENABLE_ALL`, kiln's defaults; "
        f"one session per EP and thread count for every shape; median of {args.reps} interleaved blocks"
        f"{' of CPU time' if args.clock == 'cpu' else ''}. "
        "kiln/CPU EP < 1: kiln is faster; the goal is ≤ 0.85.\n",
        "| batch × seq | threads | CPU EP ms | kiln ms | kiln / CPU EP |",
        "|---|---:|---:|---:|---:|",
    ]
    for batch, seq, threads, cpu, kl in rows:
        lines.append(f"| {batch} × {seq} | {threads} | {cpu * 1e3:.2f} | {kl * 1e3:.2f} | **{kl / cpu:.2f}** |")
    publish(lines, args.out)
    work.cleanup()
    return 0


if __name__ == "__main__":
    sys.exit(main())
