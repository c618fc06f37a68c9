#!/usr/bin/env python3
"""Convolution GFLOP/s at ResNet-50's and MobileNet's layer shapes (issue #13).

One ONNX model per layer shape holding a single ``Conv`` (constant weights
and bias, static ``1 x C x H x W`` input): ResNet-50's 7x7/2 stem and the
1x1 / 3x3 / 1x1 convolutions of each stage; MobileNet-v2's depthwise 3x3
(stride 1 and 2) and pointwise 1x1 layers. Each runs on kiln (EP option
``claim=all``, so kiln's convolution is measured, not the claim rule) and on
ORT's CPU EP (``ORT_ENABLE_ALL``, MLAS), same ``intra_op_num_threads`` (1 and
2), interleaved blocks in the same run (``bench/real.py``'s ``latency``),
after checking kiln's output against the CPU EP's. GFLOP/s = 2 * N * Ho * Wo
* Co * (Ci / group) * kh * kw / time per ``Run``; % of peak is against the
machine's measured single-core FMA peak (``bench/gemm.rs --peak-only``, or
``--peak``) times the thread count. The ``kiln ran`` column says whether the
Conv ran on kiln: where it did not (kiln leaves it to ORT), kiln's column
measures ORT's kernel behind kiln's partitioning and is not kiln's number.

A one-``Conv`` model also times each EP's layout reorders at its edges (kiln's
NCHW <-> NHWC transposes, ORT's NCHWc reorders), which a network pays once,
not per layer. So layers whose output can feed the next (``Ci == Co``, stride
1: ResNet's 3x3 layers, stride-1 depthwise) run as a chain of ``--chain``
identical convolutions (default 8) and report GFLOP/s per convolution of the
chain; the ``convs`` column says how many the model held.

Usage (from the repository root, after ``cargo build --release``)::

    KILN_EP_LIBRARY=target/release/libkiln_ep.so PYTHONPATH=python \\
        .venv/bin/python bench/conv.py [--quick] [--threads 1,2] [--reps 7] [--peak GFLOPS] [--chain 8]
"""
from __future__ import annotations

import argparse
import os
# numpy's OpenBLAS keeps a server thread spinning after any BLAS call (3-8%
# of a benchmark process's samples), on the core a 2-thread session needs.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import sys
import time
from dataclasses import dataclass
from typing import List

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

import real  # noqa: E402  (puts python/ and python/tests on sys.path)
import onnxruntime_ep_kiln as kiln  # noqa: E402
from machine import describe, publish  # noqa: E402


@dataclass(frozen=True)
class Layer:
    key: str
    ci: int
    co: int
    k: int
    stride: int
    hw: int
    group: int = 1

    def chains(self) -> bool:
        """Whether the output can feed the same convolution again."""
        return self.ci == self.co and self.stride == 1

    def flops(self, batch: int = 1) -> float:
        out = (self.hw + 2 * (self.k // 2) - self.k) // self.stride + 1
        return 2.0 * batch * out * out * self.co * (self.ci // self.group) * self.k * self.k


LAYERS = (
    Layer("resnet stem 7x7/2 3->64 @224", 3, 64, 7, 2, 224),
    Layer("resnet res2 1x1 256->64 @56", 256, 64, 1, 1, 56),
    Layer("resnet res2 3x3 64->64 @56", 64, 64, 3, 1, 56),
    Layer("resnet res2 1x1 64->256 @56", 64, 256, 1, 1, 56),
    Layer("resnet res3 1x1 512->128 @28", 512, 128, 1, 1, 28),
    Layer("resnet res3 3x3 128->128 @28", 128, 128, 3, 1, 28),
    Layer("resnet res3 1x1 128->512 @28", 128, 512, 1, 1, 28),
    Layer("resnet res4 1x1 1024->256 @14", 1024, 256, 1, 1, 14),
    Layer("resnet res4 3x3 256->256 @14", 256, 256, 3, 1, 14),
    Layer("resnet res4 1x1 256->1024 @14", 256, 1024, 1, 1, 14),
    Layer("resnet res5 1x1 2048->512 @7", 2048, 512, 1, 1, 7),
    Layer("resnet res5 3x3 512->512 @7", 512, 512, 3, 1, 7),
    Layer("resnet res5 1x1 512->2048 @7", 512, 2048, 1, 1, 7),
    Layer("mobilenet dw 3x3/1 32 @112", 32, 32, 3, 1, 112, 32),
    Layer("mobilenet dw 3x3/2 96 @112", 96, 96, 3, 2, 112, 96),
    Layer("mobilenet dw 3x3/1 144 @56", 144, 144, 3, 1, 56, 144),
    Layer("mobilenet dw 3x3/2 144 @56", 144, 144, 3, 2, 56, 144),
    Layer("mobilenet dw 3x3/1 192 @28", 192, 192, 3, 1, 28, 192),
    Layer("mobilenet dw 3x3/1 576 @14", 576, 576, 3, 1, 14, 576),
    Layer("mobilenet dw 3x3/1 960 @7", 960, 960, 3, 1, 7, 960),
    Layer("mobilenet pw 1x1 32->16 @112", 32, 16, 1, 1, 112),
    Layer("mobilenet pw 1x1 144->24 @56", 144, 24, 1, 1, 56),
    Layer("mobilenet pw 1x1 192->32 @28", 192, 32, 1, 1, 28),
    Layer("mobilenet pw 1x1 576->96 @14", 576, 96, 1, 1, 14),
    Layer("mobilenet pw 1x1 960->160 @7", 960, 160, 1, 1, 7),
)

#: --quick: one shape of each kind.
QUICK = ("resnet stem 7x7/2 3->64 @224", "resnet res3 3x3 128->128 @28", "resnet res4 1x1 1024->256 @14",
         "mobilenet dw 3x3/1 144 @56", "mobilenet dw 3x3/2 96 @112", "mobilenet pw 1x1 576->96 @14")


def conv_model(layer: Layer, convs: int = 1) -> onnx.ModelProto:
    """``convs`` copies of the layer's Conv in a chain (``convs > 1`` needs ``layer.chains()``)."""
    rng = np.random.default_rng(layer.ci * 31 + layer.co * 7 + layer.k)
    p = layer.k // 2
    nodes, inits, x = [], [], "x"
    for i in range(convs):
        w = (rng.standard_normal((layer.co, layer.ci // layer.group, layer.k, layer.k)) /
             np.sqrt(layer.ci // layer.group * layer.k * layer.k)).astype(np.float32)
        b = (0.1 * rng.standard_normal(layer.co)).astype(np.float32)
        y = "y" if i == convs - 1 else f"h{i}"
        nodes.append(helper.make_node("Conv", [x, f"w{i}", f"b{i}"], [y], group=layer.group,
                                      strides=[layer.stride] * 2, pads=[p] * 4, kernel_shape=[layer.k] * 2))
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(b, f"b{i}")]
        x = y
    g = helper.make_graph(nodes, "conv", [helper.make_tensor_value_info("x", TensorProto.FLOAT,
                                                                       [1, layer.ci, layer.hw, layer.hw])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


def measure_peak() -> float:
    from gemm_ort import fma_peak

    return fma_peak()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="one layer of each kind, 3 repetitions")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--peak", type=float, default=0.0,
                    help="single-core FMA peak in GFLOP/s (default: measured by bench/gemm.rs)")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "conv.md"))
    ap.add_argument("--chain", type=int, default=8,
                    help="convolutions per model for layers whose output can feed the next (1: one each)")
    args = ap.parse_args()
    reps = 3 if args.quick else args.reps
    layers = [l for l in LAYERS if not args.quick or l.key in QUICK]
    threads = [int(t) for t in args.threads.split(",")]
    peak = args.peak or measure_peak()

    kiln.register()
    dev = kiln.host_device()
    real.EP_OPTIONS = {"claim": "all"}
    rows: List[str] = []
    with real.OtherLoad() as load, __import__("tempfile").TemporaryDirectory() as work:
        for layer in layers:
            convs = max(1, args.chain) if layer.chains() else 1
            path = os.path.join(work, "conv.onnx")
            onnx.save(conv_model(layer, convs), path)
            feeds = {"x": np.random.default_rng(0).standard_normal((1, layer.ci, layer.hw, layer.hw))
                     .astype(np.float32)}
            on_kiln = real.claimed(path, dev, real.GOL.ORT_ENABLE_ALL)["kiln"] > 0
            cells = [layer.key, str(convs), "yes" if on_kiln else "no"]
            for t in threads:
                cpu, ks = real.cpu_session(path, t), real.kiln_session(path, dev, t)
                want, got = cpu.run(None, feeds)[0], ks.run(None, feeds)[0]
                # A chain's outputs grow with its length: its atol scales with them.
                scale = max(1.0, float(np.abs(want).max())) if convs > 1 else 1.0
                np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * scale, err_msg=layer.key)
                times = real.latency({"cpu": cpu, "kiln": ks}, feeds, reps, 0.05)
                g_cpu, g_kiln = (convs * layer.flops() / times[k] / 1e9 for k in ("cpu", "kiln"))
                cells += [f"{g_cpu:.1f}", f"{100 * g_cpu / (peak * t):.0f}%", f"{g_kiln:.1f}",
                          f"{100 * g_kiln / (peak * t):.0f}%", f"{g_kiln / g_cpu:.2f}"]
                print(f"{layer.key} x{t}: ORT {g_cpu:.1f}, kiln {g_kiln:.1f} GFLOP/s", file=sys.stderr)
                del cpu, ks
            rows.append("| " + " | ".join(cells) + " |")

    head = "| layer | convs | kiln ran |" + "".join(
        f" ORT x{t} GFLOP/s | % peak | kiln x{t} GFLOP/s | % peak | kiln/ORT x{t} |" for t in threads)
    lines = [
        "# Convolution GFLOP/s: kiln vs ORT's CPU EP (issue #13)\n",
        describe() + "\n",
        f"Run: `python bench/conv.py{' --quick' if args.quick else ''}` on "
        f"{time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}; single-core FMA peak "
        f"**{peak:.1f} GFLOP/s** (x threads for the % columns); median of {reps} interleaved blocks; "
        f"other processes used {load.cpus:.1f} CPUs on average while it ran.\n",
        "One `Conv` (batch 1, bias, pads k/2) per model, or a chain of `convs` identical ones where the "
        "output can feed the next (GFLOP/s per convolution: the layout reorders at the model's edges, "
        "which a network pays once, spread over the chain); kiln with `claim=all`, the CPU EP at "
        "`ORT_ENABLE_ALL`; kiln/ORT > 1: kiln is faster. `kiln ran` = no: kiln left the Conv to ORT.\n",
        head,
        "|---|---:|---|" + "---:|" * (5 * len(threads)),
        *rows,
    ]
    publish(lines, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
