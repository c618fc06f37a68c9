#!/usr/bin/env python3
"""Session-creation benchmark: what kiln's EPContext models save at start-up.

Builds one model kiln fully claims (a chain of elementwise Mul/Add with large
constant f32 tensors, static shapes), compiles it with kiln to ``_ctx.onnx`` in
embed mode 0 (``.bin`` beside it) and embed mode 1 (payload inside the model),
then measures, interleaved and repeated:

  cpu          ORT's CPU EP on the original model
  kiln-compile kiln on the original model (GetCapability + compile)
  kiln-ctx0    kiln on the embed-0 ``_ctx.onnx`` (loads ``<model>_kiln.bin``)
  kiln-ctx1    kiln on the embed-1 ``_ctx.onnx`` (payload in the ONNX file)
  read-bin     reading the ``.bin`` once into memory (the floor for loading)

Each kiln session runs once after creation (outside the timing) to check the
output against the CPU EP, with ``session.disable_cpu_ep_fallback=1`` so kiln
must have taken every node. Prints a Markdown table of medians and ratios to the
CPU EP and writes it, with a machine description, to
``bench/results/session_creation.md``.

Usage (from the repository root, after ``cargo build --release``)::

    .venv/bin/python bench/session_creation.py [--reps 15] [--mb 64] [--ops 8] [--out FILE]

``KILN_EP_LIBRARY`` overrides where the kiln library is found.
"""
from __future__ import annotations

import argparse
import gc
import os
import shutil
import statistics
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(REPO, "python"))

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import onnxruntime_ep_kiln as kiln  # noqa: E402
from machine import describe as describe_machine  # noqa: E402


def build_model(path: str, total_mb: int, n_ops: int) -> int:
    """Chain of n_ops Mul/Add, each with its own constant [rows, 1024] f32; the
    constants total ~total_mb MiB. Returns the constant bytes."""
    cols = 1024
    rows = max(1, (total_mb * 1024 * 1024) // (n_ops * cols * 4))
    rng = np.random.default_rng(42)
    inits, nodes = [], []
    prev = "X"
    for i in range(n_ops):
        c = (1.0 + 0.01 * rng.standard_normal((rows, cols))).astype(np.float32)
        inits.append(numpy_helper.from_array(c, f"C{i}"))
        out = "Y" if i == n_ops - 1 else f"t{i}"
        nodes.append(helper.make_node("Mul" if i % 2 == 0 else "Add", [prev, f"C{i}"], [out], name=f"op{i}"))
        prev = out
    vi = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [rows, cols])  # noqa: E731
    graph = helper.make_graph(nodes, "chain", [vi("X")], [vi("Y")], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return sum(int(np.prod(t.dims)) * 4 for t in inits)


def kiln_options(dev, extra=None) -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    for k, v in (extra or {}).items():
        so.add_session_config_entry(k, v)
    so.add_provider_for_devices([dev], {})
    return so


def compile_ctx(src: str, dev, folder: str, embed: int) -> str:
    os.makedirs(folder, exist_ok=True)
    out = os.path.join(folder, "chain_ctx.onnx")
    mc = ort.ModelCompiler(kiln_options(dev), src, embed_compiled_data_into_model=bool(embed))
    mc.compile_to_file(out)
    del mc
    return out


def machine() -> str:
    return describe_machine()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--mb", type=int, default=64, help="total constant MiB")
    ap.add_argument("--ops", type=int, default=8)
    ap.add_argument("--out", default=os.path.join(HERE, "results", "session_creation.md"))
    ap.add_argument("--keep", help="keep the generated models in this folder")
    args = ap.parse_args()

    name = kiln.register("kiln_bench")
    dev = kiln.host_device()
    work = args.keep or tempfile.mkdtemp(prefix="kiln-bench-")
    os.makedirs(work, exist_ok=True)
    try:
        src = os.path.join(work, "chain.onnx")
        weight_bytes = build_model(src, args.mb, args.ops)
        ctx0 = compile_ctx(src, dev, os.path.join(work, "embed0"), 0)
        ctx1 = compile_ctx(src, dev, os.path.join(work, "embed1"), 1)
        binp = os.path.join(work, "embed0", "chain_kiln.bin")
        sizes = {"original .onnx": os.path.getsize(src), "embed-0 _ctx.onnx": os.path.getsize(ctx0),
                 "embed-0 .bin": os.path.getsize(binp), "embed-1 _ctx.onnx": os.path.getsize(ctx1)}

        x = np.random.default_rng(0).standard_normal(
            ort.InferenceSession(src, providers=["CPUExecutionProvider"]).get_inputs()[0].shape
        ).astype(np.float32)
        want = ort.InferenceSession(src, providers=["CPUExecutionProvider"]).run(None, {"X": x})[0]

        def cpu():
            return ort.InferenceSession(src, providers=["CPUExecutionProvider"])

        def kiln_on(path):
            return lambda: ort.InferenceSession(path, kiln_options(dev), enable_fallback=0)

        def read_bin():
            with open(binp, "rb") as f:
                return f.read()

        cases = [("cpu", "ORT CPU EP, original model", cpu),
                 ("kiln-compile", "kiln, original model (compiles)", kiln_on(src)),
                 ("kiln-ctx0", "kiln, `_ctx.onnx` embed 0 (+ `.bin`)", kiln_on(ctx0)),
                 ("kiln-ctx1", "kiln, `_ctx.onnx` embed 1", kiln_on(ctx1)),
                 ("read-bin", "read the `.bin` once (floor)", read_bin)]

        # warm-up (page cache, lazy init) and correctness check of every session
        for key, _, fn in cases:
            obj = fn()
            if key != "read-bin":
                got = obj.run(None, {"X": x})[0]
                np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=key)
            del obj
            gc.collect()

        times = {key: [] for key, _, _ in cases}
        for rep in range(args.reps):
            order = cases[rep % len(cases):] + cases[:rep % len(cases)]  # rotate: interleaved
            for key, _, fn in order:
                gc.collect()
                t0 = time.perf_counter()
                obj = fn()
                dt = time.perf_counter() - t0
                del obj
                times[key].append(dt)
    finally:
        gc.collect()
        kiln.unregister(name)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    med = {k: statistics.median(v) for k, v in times.items()}
    lines = [
        f"Session creation, median of {args.reps} interleaved runs. Model: chain of {args.ops} elementwise "
        f"Mul/Add, {weight_bytes / 2**20:.1f} MiB of f32 constants, fully claimed by kiln "
        f"(`session.disable_cpu_ep_fallback=1`).",
        "",
        "| case | median ms | min ms | max ms | vs CPU EP |",
        "|---|---:|---:|---:|---:|",
    ]
    for key, label, _ in cases:
        v = times[key]
        lines.append(f"| {label} | {med[key] * 1e3:.1f} | {min(v) * 1e3:.1f} | {max(v) * 1e3:.1f} | "
                     f"{med[key] / med['cpu']:.2f}x |")
    lines += ["", "| file | bytes |", "|---|---:|"]
    lines += [f"| {k} | {v:,} |" for k, v in sizes.items()]
    table = "\n".join(lines)
    print(table)
    doc = ("# kiln session-creation benchmark\n\n"
           f"Machine: {machine()}\n\n"
           f"Run: `{os.path.basename(sys.executable)} bench/session_creation.py --reps {args.reps} "
           f"--mb {args.mb} --ops {args.ops}` on {time.strftime('%Y-%m-%d %H:%M:%S %Z')}\n\n"
           f"{table}\n")
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(doc)
    print(f"\nwritten to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
