"""kiln demo: run a model on kiln and check it against ONNX Runtime's CPU EP.

    python -m onnxruntime_ep_kiln.demo [--model models/demo.onnx] [--target x86_64-avx2]

Steps: register kiln (under ``kiln.virtual``, so devices for every target are
listed), print the devices, create a session on the chosen kiln device, run
the model on random inputs, run the same inputs on the CPU EP, print the
largest difference and which nodes kiln took, then unregister.

Exit codes: 0 outputs match, 1 outputs differ, 2 setup error (library or
model not found, session creation failed, ...).
"""
from __future__ import annotations

import argparse
import shutil
import tempfile
import time
import gc
import os
import re
import sys
from typing import Dict, List, Optional

import numpy as np
import onnxruntime as ort

import onnxruntime_ep_kiln as kiln

RTOL = 1e-5
ATOL = 1e-6
REGISTRATION_NAME = "kiln" + kiln.VIRTUAL_SUFFIX

_NP_TYPES = {
    "tensor(float)": np.float32,
    "tensor(double)": np.float64,
    "tensor(float16)": np.float16,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,
    "tensor(bool)": np.bool_,
}


class DemoError(Exception):
    """A problem worth a one-line message rather than a traceback."""


def _find_default_model() -> Optional[str]:
    rel = os.path.join("models", "demo.onnx")
    candidates = [os.path.abspath(rel)]
    d = os.path.dirname(os.path.abspath(__file__))
    while True:
        candidates.append(os.path.join(d, rel))
        parent = os.path.dirname(d)
        if parent == d:
            break
        d = parent
    candidates.append(os.path.join(os.path.dirname(os.path.abspath(__file__)), "demo.onnx"))
    for c in candidates:
        if os.path.isfile(c):
            return c
    return None


def _make_inputs(sess: ort.InferenceSession, seed: int) -> Dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for inp in sess.get_inputs():
        shape = [d if isinstance(d, int) and d > 0 else 1 for d in inp.shape]
        dtype = _NP_TYPES.get(inp.type)
        if dtype is None:
            raise DemoError(f"input {inp.name!r} has type {inp.type}, which the demo cannot generate")
        if dtype == np.bool_:
            feeds[inp.name] = rng.random(shape) < 0.5
        elif np.issubdtype(dtype, np.integer):
            feeds[inp.name] = rng.integers(0, 10, shape).astype(dtype)
        else:
            feeds[inp.name] = rng.standard_normal(shape).astype(dtype)
    return feeds


def outputs_close(actual: np.ndarray, expected: np.ndarray) -> bool:
    """kiln's output matches the CPU EP's within RTOL / ATOL."""
    return bool(np.allclose(actual, expected, rtol=RTOL, atol=ATOL, equal_nan=True))


def _ort_message(exc: BaseException) -> str:
    """The useful tail of an ORT error ("CODE : text"), without C++ source locations."""
    text = str(exc).strip()
    found = re.findall(r"\[ONNXRuntimeError\] : \d+ : (\w+) : (.*)", text, flags=re.S)
    if found:
        code, msg = found[-1]
        return f"{code}: {msg.strip()}"
    return text


def _fmt_metadata(md) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(dict(md).items())) or "-"


def _print_devices(devs) -> None:
    print(f"kiln devices ({len(devs)}):")
    for i, d in enumerate(devs):
        kind = "virtual" if kiln.is_virtual(d) else "host   "
        feats = d.ep_metadata.get("kiln.target_features", "")
        print(f"  [{i}] {kind}  target={kiln.device_target(d):<15} {feats}")
    if any(kiln.is_virtual(d) for d in devs):
        print(f"  (virtual devices stand for other CPUs; kiln offers them because it was "
              f"registered as '{REGISTRATION_NAME}')")
    if devs:
        d = devs[0]
        print(f"  EP {d.ep_name} by {d.ep_vendor}, version {d.ep_metadata.get('version', '?')}; "
              f"options (defaults): {_fmt_metadata(d.ep_options)}")


def _pick_device(devs, target: Optional[str]):
    if target is None:
        host = [d for d in devs if not kiln.is_virtual(d)]
        if not host:
            raise DemoError("kiln registered but offers no host device")
        return host[0]
    for d in devs:
        if kiln.device_target(d) == target:
            return d
    raise DemoError(
        f"no kiln device for target {target!r}; available: "
        + ", ".join(kiln.device_target(d) for d in devs)
    )


def _assignment(sess) -> Optional[List]:
    try:
        info = sess.get_provider_graph_assignment_info()
    except Exception:
        return None
    return [(sg.ep_name, [(n.name, n.op_type) for n in sg.get_nodes()]) for sg in info]


def _run(args) -> int:
    model = args.model or _find_default_model()
    if model is None or not os.path.isfile(model):
        raise DemoError(
            f"model not found: {model or 'models/demo.onnx'} "
            "(run `python models/make_models.py` in the kiln repo, or pass --model PATH)"
        )

    try:
        lib = kiln.get_library_path()
    except FileNotFoundError as exc:
        raise DemoError(str(exc)) from None
    print(f"kiln library : {lib}")
    print(f"onnxruntime  : {ort.__version__}")
    print(f"model        : {model}")
    print()

    kiln.register(REGISTRATION_NAME, library_path=lib)
    args._registered = True
    devs = kiln.devices(virtual=None)
    _print_devices(devs)
    dev = _pick_device(devs, args.target)
    print(f"using        : {'virtual' if kiln.is_virtual(dev) else 'host'} device, "
          f"target {kiln.device_target(dev)}")
    print()

    # Reference: ORT's own CPU EP.
    quiet = ort.SessionOptions()
    quiet.log_severity_level = 3  # errors only; the demo explains placement itself
    ref = ort.InferenceSession(model, quiet, providers=["CPUExecutionProvider"])
    feeds = _make_inputs(ref, args.seed)
    out_names = [o.name for o in ref.get_outputs()]
    expected = ref.run(out_names, feeds)
    del ref

    # kiln (ORT's CPU EP picks up whatever kiln does not claim).
    so = ort.SessionOptions()
    so.log_severity_level = 3  # hide "some nodes were not assigned to the preferred EP"
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    options = {}
    if args.disabled_ops:
        options["disabled_ops"] = args.disabled_ops
    so.add_provider_for_devices([dev], options)
    before = kiln.stats(lib)
    sess = None
    try:
        try:
            # enable_fallback=0: report kiln errors instead of quietly using the CPU EP
            sess = ort.InferenceSession(model, so, enable_fallback=0)
        except Exception as exc:
            raise DemoError(f"creating the kiln session failed: {_ort_message(exc)}") from None
        after_create = kiln.stats(lib)
        actual = sess.run(out_names, feeds)
        after_run = kiln.stats(lib)
        assignment = _assignment(sess)
        providers = sess.get_providers()
    finally:
        del sess
        gc.collect()

    parts = after_create["partitions_compiled"] - before["partitions_compiled"]
    nodes = after_create["nodes_compiled"] - before["nodes_compiled"]
    calls = after_run["compute_calls"] - after_create["compute_calls"]
    print(f"session providers: {', '.join(providers)}")
    print(f"kiln compiled {parts} partition(s) with {nodes} node(s); "
          f"{calls} kiln compute call(s) for one run")
    if assignment is not None:
        print("node assignment (session.record_ep_graph_assignment_info):")
        for ep, nodes_ in assignment:
            who = "kiln" if ep == kiln.EP_NAME else ep
            desc = ", ".join(f"{name or '?'}:{op}" for name, op in nodes_)
            print(f"  {who:<22} {desc}")
    print()

    ok = True
    for name, e, a in zip(out_names, expected, actual):
        e = np.asarray(e)
        a = np.asarray(a)
        if e.shape != a.shape:
            print(f"output {name}: shape mismatch, CPU {e.shape} vs kiln {a.shape}")
            ok = False
            continue
        diff = float(np.max(np.abs(e.astype(np.float64) - a.astype(np.float64)))) if e.size else 0.0
        close = outputs_close(a, e)
        ok &= close
        print(f"output {name} {list(e.shape)}: max |kiln - cpu| = {diff:.3g}  "
              f"[{'OK' if close else 'MISMATCH'}]")
    print()
    ok &= _compile_and_load(args, model, dev, options, feeds, out_names, expected, lib)
    print()
    print("result: kiln matches ONNX Runtime's CPU EP, compiled and loaded" if ok
          else f"result: MISMATCH (tolerance rtol={RTOL}, atol={ATOL})")
    return 0 if ok else 1


def _timed(fn):
    start = time.perf_counter()
    value = fn()
    return value, (time.perf_counter() - start) * 1e3


def _compile_and_load(args, model, dev, options, feeds, out_names, expected, lib) -> bool:
    """The main job: compile once into an EPContext model, then start from it."""
    work = args.keep or tempfile.mkdtemp(prefix="kiln-demo-")
    os.makedirs(work, exist_ok=True)
    stem = os.path.splitext(os.path.basename(model))[0]
    ctx = os.path.join(work, f"{stem}_ctx.onnx")
    so = ort.SessionOptions()
    so.log_severity_level = 3
    so.add_provider_for_devices([dev], options)
    try:
        compiler = ort.ModelCompiler(so, model, embed_compiled_data_into_model=False)
        _, compile_ms = _timed(lambda: compiler.compile_to_file(ctx))
    except Exception as exc:
        raise DemoError(f"compiling the model failed: {_ort_message(exc)}") from None
    print(f"compiled once with the compile API in {compile_ms:.1f} ms:")
    for name in sorted(os.listdir(work)):
        print(f"  {os.path.join(work, name)}  ({os.path.getsize(os.path.join(work, name)):,} bytes)")

    load = ort.SessionOptions()
    load.log_severity_level = 3
    load.add_provider_for_devices([dev], options)
    before = kiln.stats(lib)
    sess, load_ms = _timed(lambda: ort.InferenceSession(ctx, load, enable_fallback=0))
    after = kiln.stats(lib)
    actual = sess.run(out_names, feeds)
    del sess
    gc.collect()
    print(f"session from {os.path.basename(ctx)} created in {load_ms:.1f} ms: "
          f"{after['context_graphs_loaded'] - before['context_graphs_loaded']} graph(s) loaded, "
          f"{after['partitions_compiled'] - before['partitions_compiled']} compiled")
    ok = all(outputs_close(np.asarray(a), np.asarray(e)) for a, e in zip(actual, expected))
    print(f"outputs of the compiled model: {'OK' if ok else 'MISMATCH'} against the CPU EP")
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return ok


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m onnxruntime_ep_kiln.demo",
        description="Run a model on kiln and compare with ONNX Runtime's CPU EP.",
    )
    parser.add_argument("--model", help="ONNX model (default: models/demo.onnx of the kiln repo)")
    parser.add_argument("--target", choices=kiln.TARGETS,
                        help="run on the (virtual) kiln device for this target (default: the host's)")
    parser.add_argument("--disabled-ops", default="",
                        help="comma-separated op types kiln must leave to the CPU EP")
    parser.add_argument("--seed", type=int, default=0, help="seed for the random inputs")
    parser.add_argument("--keep", help="write the compiled model into this folder and keep it")
    args = parser.parse_args(argv)
    args._registered = False
    # Keep ORT's own warnings (e.g. "Config with key ... will be overwritten" when
    # an option replaces a device default) out of the demo's output.
    ort.set_default_logger_severity(3)

    message = None
    rc = 2
    try:
        rc = _run(args)
    except DemoError as exc:
        message = str(exc)
    except Exception as exc:  # no tracebacks for users; keep the message
        message = f"{type(exc).__name__}: {exc}"
    # The exception (and any half-built session in its traceback) is gone now,
    # so unregistering is safe.
    gc.collect()
    if message is not None:
        print(f"error: {message}", file=sys.stderr)
        rc = 2
    if args._registered:
        try:
            kiln.unregister(REGISTRATION_NAME)
        except Exception as exc:
            print(f"warning: unregistering kiln failed: {exc}", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
