#!/usr/bin/env python3
"""Loading compiled models: session creation vs the number of EPContext nodes (issue #12).

For each N in ``--nodes`` builds a chain model of N small kiln partitions
separated by ``Tanh`` nodes, which kiln leaves to ORT (EP options
``{"claim": "all", "disabled_ops": "Tanh"}``): each partition is
``Mul(x, C) -> Add(., D)`` on a [1, 64] float tensor with its own constants.
It compiles the model once with ORT's compile API (``ModelCompiler``, embed
mode 0: ``_ctx.onnx`` + ``_kiln.bin``), checks the compiled model's output
against the CPU EP, then times, interleaved and repeated (median):

  cpu   ORT's CPU EP creating a session on the original model
  ctx   kiln creating a session on the ``_ctx.onnx`` (N EPContext nodes)

and prints ``ctx / cpu`` (issue #12 asks for <= 0.5) and ctx per EPContext
node (which should stay flat as N grows: loading is linear in N). Writes
``bench/results/ctx_load.md`` with the machine it ran on.

Usage (from the repository root, after ``cargo build --release``)::

    KILN_EP_LIBRARY=target/release/libkiln_ep.so PYTHONPATH=python \\
        .venv/bin/python bench/ctx_load.py [--nodes 10,100,500] [--reps 9]
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
from machine import describe, publish  # noqa: E402

KILN_OPTIONS = {"claim": "all", "disabled_ops": "Tanh"}
WIDTH = 64


def build_model(path: str, n: int) -> None:
    """N partitions Mul -> Add, each followed by a Tanh kiln leaves to ORT."""
    rng = np.random.default_rng(n)
    inits, nodes, prev = [], [], "X"
    for i in range(n):
        c = (1.0 + 0.01 * rng.standard_normal((1, WIDTH))).astype(np.float32)
        d = (0.01 * rng.standard_normal((1, WIDTH))).astype(np.float32)
        inits += [numpy_helper.from_array(c, f"C{i}"), numpy_helper.from_array(d, f"D{i}")]
        out = "Y" if i == n - 1 else f"t{i}"
        nodes += [helper.make_node("Mul", [prev, f"C{i}"], [f"m{i}"], name=f"mul{i}"),
                  helper.make_node("Add", [f"m{i}", f"D{i}"], [f"a{i}"], name=f"add{i}"),
                  helper.make_node("Tanh", [f"a{i}"], [out], name=f"tanh{i}")]
        prev = out
    vi = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [1, WIDTH])  # noqa: E731
    graph = helper.make_graph(nodes, f"chain{n}", [vi("X")], [vi("Y")], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    onnx.save(model, path)


def kiln_options(dev) -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.add_provider_for_devices([dev], dict(KILN_OPTIONS))
    return so


def cpu_options() -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return so


def compile_ctx(src: str, dev) -> str:
    out = src.replace(".onnx", "_ctx.onnx")
    mc = ort.ModelCompiler(kiln_options(dev), src, embed_compiled_data_into_model=False)
    mc.compile_to_file(out)
    del mc
    return out


def context_nodes(path: str) -> int:
    return sum(1 for n in onnx.load(path, load_external_data=False).graph.node if n.op_type == "EPContext")


def measure(n: int, dev, work: str, reps: int) -> dict:
    src = os.path.join(work, f"chain{n}.onnx")
    build_model(src, n)
    ctx = compile_ctx(src, dev)
    nodes = context_nodes(ctx)
    x = np.random.default_rng(0).standard_normal((1, WIDTH)).astype(np.float32)

    def cpu():
        return ort.InferenceSession(src, cpu_options(), providers=["CPUExecutionProvider"])

    def from_ctx():
        return ort.InferenceSession(ctx, kiln_options(dev), enable_fallback=0)

    want = cpu().run(None, {"X": x})[0]
    got = from_ctx().run(None, {"X": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5, err_msg=f"N={n}")
    cases = [("cpu", cpu), ("ctx", from_ctx)]
    times = {key: [] for key, _ in cases}
    for rep in range(reps):
        for key, fn in cases[rep % 2:] + cases[:rep % 2]:
            gc.collect()
            t0 = time.perf_counter()
            sess = fn()
            times[key].append(time.perf_counter() - t0)
            del sess
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"n": n, "ctx_nodes": nodes, "cpu": med["cpu"], "ctx": med["ctx"],
            "bin": os.path.getsize(os.path.join(work, f"chain{n}_kiln.bin"))}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", default="10,100,500", help="partition counts, comma-separated")
    ap.add_argument("--reps", type=int, default=9, help="interleaved repetitions of each creation")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "ctx_load.md"))
    args = ap.parse_args()
    counts = [int(v) for v in args.nodes.split(",") if v]

    name = kiln.register("kiln_ctx_load")
    work = tempfile.mkdtemp(prefix="kiln-ctx-load-")
    try:
        dev = kiln.host_device()
        rows = [measure(n, dev, work, args.reps) for n in counts]
    finally:
        gc.collect()
        kiln.unregister(name)
        shutil.rmtree(work, ignore_errors=True)

    argv = " ".join(sys.argv[1:])
    lines = [
        "# Loading compiled models (issue #12)",
        "",
        f"Machine: {describe()}",
        "",
        f"Run: `python bench/ctx_load.py {argv}` on {time.strftime('%Y-%m-%d %H:%M:%S %Z')}",
        "",
        "| partitions | EPContext nodes | `_kiln.bin` bytes | CPU EP, original ms | kiln, `_ctx.onnx` ms "
        "| kiln / CPU EP | kiln µs per EPContext node |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(f"| {r['n']} | {r['ctx_nodes']} | {r['bin']:,} | {r['cpu'] * 1e3:.2f} | "
                     f"{r['ctx'] * 1e3:.2f} | **{r['ctx'] / r['cpu']:.2f}** | "
                     f"{r['ctx'] * 1e6 / max(r['ctx_nodes'], 1):.0f} |")
    lines += [
        "",
        f"Model: N partitions `Mul -> Add` on a [1, {WIDTH}] float tensor (own constants), each followed by a "
        "`Tanh` kiln leaves to ORT; kiln EP options "
        f"`{KILN_OPTIONS}`; compiled with `ModelCompiler` (embed mode 0). Session creation with 1 intra-op "
        f"thread, median of {args.reps} interleaved repetitions; the compiled model's output is checked "
        "against the CPU EP first.",
    ]
    publish(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
