#!/usr/bin/env python3
"""CNN latency: kiln (defaults) / ORT's CPU EP (issue #13).

Models: the onnx wheel's light ResNet-50, SqueezeNet, DenseNet-121, Inception v1, AlexNet and ShuffleNet
(``python/tests/real_corpus.py``, checksummed; static 1x3x224x224, so batch 8
runs a copy whose input batch dim is set to 8), a MobileNet-v2-style
depthwise net built here with ``onnx.helper`` (random weights, seed 0:
stem, six inverted-residual blocks with Clip(0, 6) and residual Adds,
global pool, classifier), and from the corpus YOLOv8n (nudenet 320n) at
320x320 and 640x640, PP-OCRv4 det at 640x640, PP-OCRv4 rec at 48x320 and PP-OCR cls at 48x192.

Per model and input: nodes kiln claims with its defaults (ORT's assignment
info at ``ORT_ENABLE_ALL``; partitions in brackets), the largest difference
between kiln's and the CPU EP's outputs, and latency of a default kiln
session against the CPU EP alone (``ORT_ENABLE_ALL``, same
``intra_op_num_threads``), 1 and 2 threads, batch 1 and 8, interleaved medians
(``bench/real.py``'s ``latency``); kiln/CPU above 1.0 in bold. A cell that
fails says ``error [n]`` with the text under the table; the run goes on.

Usage (from the repository root, after ``cargo build --release`` and ``make
corpus``)::

    KILN_EP_LIBRARY=target/release/libkiln_ep.so PYTHONPATH=python \\
        .venv/bin/python bench/cnn.py [--quick] [--models resnet50,...] [--threads 1,2] [--batches 1,8]
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
from dataclasses import dataclass
from typing import Dict, List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
import onnx  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import real  # noqa: E402  (puts python/ and python/tests on sys.path)
import onnxruntime_ep_kiln as kiln  # noqa: E402
import real_corpus as rc  # noqa: E402
from machine import describe, publish  # noqa: E402


@dataclass(frozen=True)
class Case:
    key: str
    model: str  # corpus key, or "mobilenet" (built here)
    input_hw: Tuple[int, int]


CASES = (
    Case("resnet50", "light_resnet50", (224, 224)),
    Case("squeezenet", "light_squeezenet", (224, 224)),
    Case("densenet121", "light_densenet121", (224, 224)),
    Case("inception_v1", "light_inception_v1", (224, 224)),
    Case("alexnet", "light_bvlc_alexnet", (224, 224)),
    Case("shufflenet", "light_shufflenet", (224, 224)),
    Case("mobilenet", "mobilenet", (224, 224)),
    Case("yolov8n_320", "yolov8n", (320, 320)),
    Case("yolov8n_640", "yolov8n", (640, 640)),
    Case("ppocr_det_640", "ppocr_det", (640, 640)),
    Case("ppocr_rec_48x320", "ppocr_rec", (48, 320)),
    Case("ppocr_cls_48x192", "ppocr_cls", (48, 192)),
)


def _conv(nodes, inits, rng, x, ci, co, k, stride, group, name, act=True):
    w = (rng.standard_normal((co, ci // group, k, k)) * np.sqrt(2.0 / (ci // group * k * k))).astype(np.float32)
    b = (0.1 * rng.standard_normal(co)).astype(np.float32)
    inits += [numpy_helper.from_array(w, f"{name}_w"), numpy_helper.from_array(b, f"{name}_b")]
    nodes.append(helper.make_node("Conv", [x, f"{name}_w", f"{name}_b"], [f"{name}_c"], group=group,
                                  strides=[stride, stride], pads=[k // 2] * 4, kernel_shape=[k, k]))
    if not act:
        return f"{name}_c"
    nodes.append(helper.make_node("Clip", [f"{name}_c", "zero", "six"], [f"{name}_y"]))
    return f"{name}_y"


def mobilenet_model() -> onnx.ModelProto:
    """A MobileNet-v2-style net (symbolic batch, 224x224)."""
    rng = np.random.default_rng(0)
    nodes: List = []
    inits = [numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
             numpy_helper.from_array(np.array(6.0, np.float32), "six")]
    x = _conv(nodes, inits, rng, "x", 3, 32, 3, 2, 1, "stem")
    c = 32
    # (expansion, out channels, stride)
    for i, (t, co, s) in enumerate([(1, 16, 1), (6, 24, 2), (6, 24, 1), (6, 32, 2), (6, 32, 1), (6, 64, 2)]):
        h = _conv(nodes, inits, rng, x, c, c * t, 1, 1, 1, f"b{i}_expand") if t > 1 else x
        h = _conv(nodes, inits, rng, h, c * t, c * t, 3, s, c * t, f"b{i}_dw")
        h = _conv(nodes, inits, rng, h, c * t, co, 1, 1, 1, f"b{i}_project", act=False)
        if s == 1 and co == c:
            nodes.append(helper.make_node("Add", [x, h], [f"b{i}_sum"]))
            h = f"b{i}_sum"
        x, c = h, co
    nodes.append(helper.make_node("GlobalAveragePool", [x], ["pool"]))
    nodes.append(helper.make_node("Flatten", ["pool"], ["flat"]))
    fc = (rng.standard_normal((c, 1000)) / np.sqrt(c)).astype(np.float32)
    inits.append(numpy_helper.from_array(fc, "fc_w"))
    nodes.append(helper.make_node("MatMul", ["flat", "fc_w"], ["logits"]))
    g = helper.make_graph(nodes, "mobilenet", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                            ["n", 3, 224, 224])],
                          [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["n", 1000])], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def with_batch(path: str, batch: int, out: str) -> str:
    """A copy of a static-batch model whose input batch dim is ``batch``
    (intermediate and output shapes cleared for ORT to infer again, and
    the leading 1 of constant ``Reshape`` targets — ResNet-50's ``{1,
    2048}`` classifier input, ShuffleNet's channel shuffles — set to it)."""
    m = onnx.load(path)
    inits = {i.name for i in m.graph.initializer}
    targets = {n.input[1] for n in m.graph.node if n.op_type == "Reshape"}
    for i, t in enumerate(m.graph.initializer):
        if t.name in targets:
            shape = numpy_helper.to_array(t).copy()
            if shape.ndim == 1 and len(shape) >= 2 and shape[0] == 1:
                shape[0] = batch
                m.graph.initializer[i].CopyFrom(numpy_helper.from_array(shape, t.name))
    for i in m.graph.input:
        if i.name not in inits:
            i.type.tensor_type.shape.dim[0].dim_value = batch
    for o in m.graph.output:
        o.type.tensor_type.shape.dim[0].dim_param = "batch"
    del m.graph.value_info[:]
    onnx.save(m, out)
    return out


def model_path(case: Case, batch: int, paths: Dict[str, str], work: str) -> str:
    if case.model == "mobilenet":
        path = os.path.join(work, "mobilenet.onnx")
        if not os.path.exists(path):
            onnx.save(mobilenet_model(), path)
        return path
    path = paths[case.model]
    if case.model.startswith("light_") and batch != 1:
        return with_batch(path, batch, os.path.join(work, f"{case.model}_b{batch}.onnx"))
    return path


def feeds_for(path: str, batch: int, hw: Tuple[int, int]) -> Dict[str, np.ndarray]:
    graph = onnx.load(path, load_external_data=False).graph
    inits = {i.name for i in graph.initializer}
    (name,) = [i.name for i in graph.input if i.name not in inits]
    return {name: np.random.default_rng(0).random((batch, 3, *hw), dtype=np.float32)}


def bench_case(case: Case, paths, dev, args, work) -> List[str]:
    threads = [int(t) for t in args.threads.split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    path1 = model_path(case, 1, paths, work)
    got, err = real.attempt(real.claimed, path1, dev, real.GOL.ORT_ENABLE_ALL)
    cells = [case.key, "x".join(map(str, case.input_hw))]
    cells.append(err or f"{got['kiln']}/{got['total']} [{got['partitions']}]")
    diffs: List[float] = []
    timing: List[str] = []
    for b in batches:
        path, err = real.attempt(model_path, case, b, paths, work)
        for t in threads:
            if err:
                timing.append(err)
                continue
            feeds = feeds_for(path, b, case.input_hw)
            cell, e = real.attempt(time_pair, path, dev, t, feeds, args.reps, diffs)
            timing.append(e or cell)
    cells.append(f"{max(diffs):.1e}" if diffs else "—")
    return cells + timing


def time_pair(path: str, dev, threads: int, feeds, reps: int, diffs: List[float]) -> str:
    cpu, ks = real.cpu_session(path, threads), real.kiln_session(path, dev, threads)
    want, got = cpu.run(None, feeds), ks.run(None, feeds)
    diffs.append(max(float(np.max(np.abs(w - g))) if w.size else 0.0 for w, g in zip(want, got)))
    times = real.latency({"cpu": cpu, "kiln": ks}, feeds, reps, 0.05)
    ratio = times["kiln"] / times["cpu"]
    r = f"**{ratio:.2f}**" if round(ratio, 2) > 1.0 else f"{ratio:.2f}"
    return f"{real.ms(times['cpu'])} / {real.ms(times['kiln'])} ({r})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1 thread, batch 1, 3 repetitions")
    ap.add_argument("--models", default="", help=f"comma-separated, of {[c.key for c in CASES]}")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--batches", default="1,8")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--option", action="append", default=[], metavar="K=V",
                    help="a kiln EP option (repeatable), e.g. force_ops=Conv to run the convolutions in kiln")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "cnn.md"))
    args = ap.parse_args()
    real.EP_OPTIONS.update(kv.split("=", 1) for kv in args.option)
    if args.quick:
        args.threads, args.batches, args.reps = "1", "1", 3
    cases = real.select(ap, list(CASES), args.models)
    paths = rc.all_models()
    kiln.register()
    dev = kiln.host_device()
    rows = []
    with real.OtherLoad() as load, tempfile.TemporaryDirectory() as work:
        for case in cases:
            rows.append("| " + " | ".join(bench_case(case, paths, dev, args, work)) + " |")
            print(rows[-1], file=sys.stderr)
    cols = [f"b{b} x{t}" for b in args.batches.split(",") for t in args.threads.split(",")]
    lines = [
        f"# CNN latency: kiln ({real.EP_OPTIONS or 'defaults'}) / ORT's CPU EP (issue #13)\n",
        describe() + "\n",
        f"Run: `python bench/cnn.py {' '.join(sys.argv[1:])}` on "
        f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}; median of {args.reps} interleaved blocks; "
        f"other processes used {load.cpus:.1f} CPUs on average while it ran.\n",
        "Cells: CPU EP ms / kiln ms (kiln/CPU; above 1.0 in bold) per batch (b) and "
        "`intra_op_num_threads` (x). Nodes: kiln's / all at `ORT_ENABLE_ALL` [kiln partitions]; "
        "max diff: largest |kiln - CPU EP| over the outputs of every run.\n",
        "| model | input | nodes on kiln | max diff | " + " | ".join(cols) + " |",
        "|---|---|---|---|" + "---|" * len(cols),
        *rows,
    ]
    lines += [f"\n[{i + 1}] {n}" for i, n in enumerate(real.NOTES)]
    publish(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
