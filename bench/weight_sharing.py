#!/usr/bin/env python3
"""Weight-sharing benchmark: peak memory and disk for models that share a large backbone.

Builds N models ("fine-tunes") that share a backbone of large constant f32
tensors (default 96 MiB in 8 tensors) and each have a small head of their own,
all elementwise ops kiln claims completely::

    Y = Tanh(((X * W1 + W2) * W3 + W4) ... * H + Hb)      W1..W8 shared, H, Hb own

For N = 2 and 4 it measures, each configuration in a fresh subprocess that
creates all N sessions, runs each once and then reads ``VmHWM`` (peak RSS) from
``/proc/self/status``:

  kiln, shared            the N models compiled as one sharing group
                          (``kiln-share-ctx-gen``: one ``.bin``), loaded with
                          ``ep.share_ep_contexts=1`` (one mapping of the weights)
  kiln, shared binary,    the same files loaded without ``ep.share_ep_contexts``
   no share at load       (each session maps the one file itself)
  kiln, not shared        every model compiled alone (its own ``.bin``), loaded
                          without ``ep.share_ep_contexts``
  ORT CPU EP              ORT's CPU EP on the original models

Every kiln session runs with ``session.disable_cpu_ep_fallback=1`` and its
output is checked against the CPU EP's. Prints a Markdown table (MB = 10^6
bytes; ratios vs the CPU EP) and writes it with a machine description to
``bench/results/weight_sharing.md``.

Usage (from the repository root, after ``cargo build --release``)::

    .venv/bin/python bench/weight_sharing.py [--mb 96] [--tensors 8] [--models 2,4] [--out FILE]

``KILN_EP_LIBRARY`` overrides where the kiln library is found. The models live in
a temporary folder (about (N + 2) x MB on disk) removed afterwards (``--keep DIR``
keeps them).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
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
from onnxruntime_ep_kiln import share  # noqa: E402

COLS = 1024
MB = 1e6


def build_model(path: str, head: int, mb: float, tensors: int) -> None:
    rows = max(1, int(mb * 2**20 / tensors / 4 / COLS))
    bb = np.random.default_rng(1)
    ws = [(bb.standard_normal((rows, COLS)) * 0.5 + (1.0 if i % 2 == 0 else 0.0)).astype(np.float32)
          for i in range(tensors)]
    hd = np.random.default_rng(100 + head)
    h = hd.standard_normal((1, COLS)).astype(np.float32)
    hb = hd.standard_normal((1, COLS)).astype(np.float32)
    nodes, cur = [], "X"
    for i in range(tensors):
        op = "Mul" if i % 2 == 0 else "Add"
        nodes.append(helper.make_node(op, [cur, f"W{i}"], [f"t{i}"], name=f"bb{i}"))
        cur = f"t{i}"
    nodes += [helper.make_node("Mul", [cur, "H"], ["h0"], name="head_mul"),
              helper.make_node("Add", ["h0", "Hb"], ["h1"], name="head_add"),
              helper.make_node("Tanh", ["h1"], ["Y"], name="head_tanh")]
    inits = [numpy_helper.from_array(w, f"W{i}") for i, w in enumerate(ws)]
    inits += [numpy_helper.from_array(h, "H"), numpy_helper.from_array(hb, "Hb")]
    vi = lambda n: helper.make_tensor_value_info(n, TensorProto.FLOAT, [rows, COLS])  # noqa: E731
    graph = helper.make_graph(nodes, f"finetune_{head}", [vi("X")], [vi("Y")], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, path)


CHILD = r"""
import json, os, sys
import numpy as np
import onnxruntime as ort
ort.set_default_logger_severity(3)

def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024

mode, models = sys.argv[1], sys.argv[2:]
dev = None
if mode != "cpu":
    import onnxruntime_ep_kiln as kiln
    kiln.register()
    dev = kiln.host_device()
base = status("VmRSS")
sessions = []
for m in models:
    so = ort.SessionOptions()
    if dev is not None:
        if mode == "kiln-share":
            so.add_session_config_entry("ep.share_ep_contexts", "1")
        so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
        so.add_provider_for_devices([dev], {})
        sessions.append(ort.InferenceSession(m, so, enable_fallback=0))
    else:
        sessions.append(ort.InferenceSession(m, so, providers=["CPUExecutionProvider"]))
loaded = status("VmRSS")
inp = sessions[0].get_inputs()[0]
x = np.random.default_rng(0).standard_normal(inp.shape).astype(np.float32) * 0.1
checks = []
for s in sessions:
    y = s.run(None, {inp.name: x})[0]
    checks.append([float(np.abs(y).sum()), [float(v) for v in y.ravel()[::max(1, y.size // 64)]]])
maps = 0
if mode != "cpu":
    with open("/proc/self/maps") as f:
        maps = sum(1 for l in f if l.rstrip().endswith(".bin"))
print(json.dumps({"base": base, "loaded": loaded, "after_run": status("VmRSS"), "hwm": status("VmHWM"),
                  "bin_mappings": maps, "checks": checks,
                  "stats": kiln.stats() if dev is not None else None}))
"""


def measure(mode: str, models, env) -> dict:
    proc = subprocess.run([sys.executable, "-c", CHILD, mode, *models], env=env,
                          capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        raise SystemExit(f"{mode} child failed ({proc.returncode}):\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def same_outputs(a, b) -> bool:
    for (sa, va), (sb, vb) in zip(a, b):
        if not np.isclose(sa, sb, rtol=1e-4) or not np.allclose(va, vb, rtol=1e-4, atol=1e-5):
            return False
    return True


def machine() -> str:
    return describe_machine()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=float, default=96.0, help="shared backbone MiB (default 96)")
    ap.add_argument("--tensors", type=int, default=8, help="backbone tensors (default 8)")
    ap.add_argument("--models", default="2,4", help="group sizes (default 2,4)")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "weight_sharing.md"))
    ap.add_argument("--keep", help="keep the generated models in this folder")
    args = ap.parse_args()
    sizes = [int(n) for n in args.models.split(",")]
    lib = kiln.get_library_path()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(REPO, "python"), os.environ.get("PYTHONPATH", "")]),
               KILN_EP_LIBRARY=lib)
    work = args.keep or tempfile.mkdtemp(prefix="kiln_share_bench_")
    os.makedirs(work, exist_ok=True)
    try:
        n_max = max(sizes)
        src = os.path.join(work, "src")
        os.makedirs(src, exist_ok=True)
        originals = [os.path.join(src, f"ft{i}.onnx") for i in range(n_max)]
        print(f"building {n_max} models with a {args.mb:g} MiB shared backbone in {work}", flush=True)
        for i, p in enumerate(originals):
            build_model(p, i, args.mb, args.tensors)
        ort.set_default_logger_severity(3)
        kiln.register()
        dev = kiln.host_device()
        # not shared: every model compiled alone (own .bin)
        alone = os.path.join(work, "alone")
        os.makedirs(alone, exist_ok=True)
        for p in originals:
            so = ort.SessionOptions()
            so.add_provider_for_devices([dev], {})
            ort.ModelCompiler(so, p, embed_compiled_data_into_model=False).compile_to_file(
                os.path.join(alone, os.path.basename(p)[:-5] + "_ctx.onnx"))
        rows = []
        for n in sizes:
            group_dir = os.path.join(work, f"shared{n}")
            report = share.compile_group(originals[:n], group_dir, dev)
            shared_ctx = [m.output for m in report.models]
            alone_ctx = [os.path.join(alone, os.path.basename(p)[:-5] + "_ctx.onnx") for p in originals[:n]]
            disk = {
                "cpu": sum(os.path.getsize(p) for p in originals[:n]),
                "kiln-share": report.binary_bytes + sum(os.path.getsize(p) for p in shared_ctx),
                "kiln-alone": sum(os.path.getsize(p) + os.path.getsize(p.replace("_ctx.onnx", "_kiln.bin"))
                                  for p in alone_ctx),
            }
            disk["kiln-share-noload"] = disk["kiln-share"]
            print(f"N={n}: measuring", flush=True)
            res = {
                "cpu": measure("cpu", originals[:n], env),
                "kiln-share": measure("kiln-share", shared_ctx, env),
                "kiln-share-noload": measure("kiln-noshare", shared_ctx, env),
                "kiln-alone": measure("kiln-noshare", alone_ctx, env),
            }
            for k in ("kiln-share", "kiln-share-noload", "kiln-alone"):
                if not same_outputs(res[k]["checks"], res["cpu"]["checks"]):
                    raise SystemExit(f"N={n} {k}: outputs differ from the CPU EP")
            rows.append((n, res, disk, report))
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)

    labels = {
        "kiln-share": "kiln, shared group, `ep.share_ep_contexts=1`",
        "kiln-share-noload": "kiln, shared group, loaded without sharing",
        "kiln-alone": "kiln, each model compiled alone",
        "cpu": "ORT CPU EP, original models",
    }
    lines = [
        "| models | configuration | peak RSS MB | vs CPU EP | RSS after load MB | `.bin` mappings | weights on disk MB | vs CPU EP |",
        "|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for n, res, disk, report in rows:
        for k in ("kiln-share", "kiln-share-noload", "kiln-alone", "cpu"):
            r = res[k]
            lines.append(
                f"| {n} | {labels[k]} | {r['hwm'] / MB:.1f} | {r['hwm'] / res['cpu']['hwm']:.2f}x | "
                f"{r['loaded'] / MB:.1f} | {r['bin_mappings'] if k != 'cpu' else '-'} | "
                f"{disk[k] / MB:.1f} | {disk[k] / disk['cpu']:.2f}x |")
    base = rows[0][1]["kiln-share"]["base"]
    detail = [
        "",
        f"Process RSS before any session (Python + onnxruntime + kiln registered): about {base / MB:.0f} MB; "
        "it is included in every number above.",
        "",
        "| models | shared binary MB | sum of the models' initializers MB | sharing saved (`context_bytes_deduplicated`) MB |",
        "|---:|---:|---:|---:|",
    ]
    for n, res, disk, report in rows:
        detail.append(f"| {n} | {report.binary_bytes / MB:.1f} | {report.initializer_bytes / MB:.1f} | "
                      f"{report.bytes_deduplicated / MB:.1f} |")
    table = "\n".join(lines + detail)
    print(table)
    cmd = "python bench/weight_sharing.py " + " ".join(
        f"--{k} {v}" for k, v in (("mb", f"{args.mb:g}"), ("tensors", args.tensors), ("models", args.models)))
    doc = "\n".join([
        "# kiln weight-sharing benchmark",
        "",
        f"Machine: {machine()}",
        "",
        f"Run: `{cmd}` on {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}",
        "",
        f"N fine-tunes of one model: {args.tensors} shared backbone tensors ({args.mb:g} MiB of f32 constants, "
        f"elementwise Mul/Add) and a head of their own (2 x {COLS} floats), fully claimed by kiln "
        "(`session.disable_cpu_ep_fallback=1`). Each configuration runs in a fresh process that creates all "
        "N sessions and runs each once; peak RSS is `VmHWM` from `/proc/self/status` (MB = 10^6 bytes). "
        "Outputs were checked against the CPU EP. \"weights on disk\": the `.onnx` files for the CPU EP, "
        "`_ctx.onnx` + `.bin` files for kiln.",
        "",
        table,
        "",
    ])
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        f.write(doc)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
