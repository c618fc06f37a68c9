#!/usr/bin/env python3
"""Steady-state memory of a kiln session: what one more session costs once
ORT has finished creating it (kiln's ``OnSessionInitializationEnd`` drops what
only Compile needed).

Builds the session-creation benchmark's model (a chain of Mul/Add with large
f32 constants, which kiln fully claims), compiles it to an embed-0
``_ctx.onnx`` + ``.bin``, and in a fresh process per case creates N sessions
one after the other, running each once, and reads ``/proc/self/smaps_rollup``
before and after. Reported per session: private memory (anonymous and written
pages: what this session owns) and PSS (its fair share of mapped files), next
to the model's constant bytes:

  cpu           ORT's CPU EP on the original model
  kiln          kiln compiling the original model (packs its own weights)
  kiln-ctx      kiln loading the compiled model (weights mapped from the .bin)
  kiln-ctx-share  the same with ep.share_ep_contexts=1 (one mapping for all)

Writes a Markdown table with the machine description to
``bench/results/session_memory.md``.

    .venv/bin/python bench/session_memory.py [--sessions 8] [--mb 64]
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "python"))
sys.path.insert(0, HERE)

import onnxruntime as ort  # noqa: E402

import onnxruntime_ep_kiln as kiln  # noqa: E402
from machine import describe as describe_machine, publish  # noqa: E402
from session_creation import build_model, compile_ctx, kiln_options  # noqa: E402

CHILD = r"""
import gc, json, sys
import numpy as np
import onnxruntime as ort
case, model, lib, n, src = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]

def rollup():
    out = {}
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 3 and parts[-1] == "kB":
                out[parts[0].rstrip(":")] = int(parts[1]) * 1024
    return out

def options():
    so = ort.SessionOptions()
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1" if case != "cpu" else "0")
    if case == "kiln-ctx-share":
        so.add_session_config_entry("ep.share_ep_contexts", "1")
    if case != "cpu":
        dev = [d for d in ort.get_ep_devices() if d.ep_name == "KilnExecutionProvider"][0]
        so.add_provider_for_devices([dev], {})
    return so

if case != "cpu":
    ort.register_execution_provider_library("kiln_mem", lib)
probe = ort.InferenceSession(src, providers=["CPUExecutionProvider"])
feeds = {i.name: np.ones(i.shape, np.float32) for i in probe.get_inputs()}
del probe
gc.collect()
before = rollup()
sessions = []
for _ in range(n):
    s = ort.InferenceSession(model, options())
    s.run(None, feeds)
    sessions.append(s)
gc.collect()
after = rollup()
priv = lambda r: r.get("Private_Clean", 0) + r.get("Private_Dirty", 0)
print(json.dumps({"private": (priv(after) - priv(before)) / n, "pss": (after["Pss"] - before["Pss"]) / n,
                  "rss": (after["Rss"] - before["Rss"]) / n}))
"""


def measure(case: str, model: str, lib: str, n: int, src: str) -> dict:
    out = subprocess.run([sys.executable, "-c", CHILD, case, model, lib, str(n), src],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sessions", type=int, default=8)
    ap.add_argument("--mb", type=int, default=64)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "session_memory.md"))
    args = ap.parse_args()
    lib = os.path.abspath(kiln.get_library_path())
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "chain.onnx")
        const_bytes = build_model(src, args.mb, 8)
        ort.register_execution_provider_library("kiln_mem_compile", lib)
        dev = [d for d in ort.get_ep_devices() if d.ep_name == "KilnExecutionProvider"][0]
        ctx = compile_ctx(src, dev, tmp, 0)
        del dev
        ort.unregister_execution_provider_library("kiln_mem_compile")
        rows = []
        for case, model in [("cpu", src), ("kiln", src), ("kiln-ctx", ctx), ("kiln-ctx-share", ctx)]:
            m = measure(case, model, lib, args.sessions, src)
            rows.append((case, m))
    mib = 2**20
    lines = [
        f"# Session memory ({args.sessions} sessions of one model, {const_bytes / mib:.0f} MiB of constants)",
        "",
        describe_machine(),
        "",
        "| case | private MiB / session | PSS MiB / session | RSS MiB / session | private / constants |",
        "|---|---:|---:|---:|---:|",
    ]
    for case, m in rows:
        lines.append(f"| {case} | {m['private'] / mib:.1f} | {m['pss'] / mib:.1f} | {m['rss'] / mib:.1f} "
                     f"| {m['private'] / const_bytes:.2f} |")
    publish(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
