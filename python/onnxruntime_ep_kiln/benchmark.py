"""``kiln bench``: compile time, load time of the compiled model and latency, kiln vs
ONNX Runtime's CPU EP, for one model on this machine.

Inputs are random, shaped from the model; symbolic or unknown dims take the
sizes given with ``shapes`` (``{"input": [1, 3, 224, 224]}``) and 1 otherwise.
"""
from __future__ import annotations

import gc
import os
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence

import onnxruntime_ep_kiln as kiln
from ._ort import ort as _ort

_NP_TYPES = {
    "tensor(float)": "float32", "tensor(double)": "float64", "tensor(float16)": "float16",
    "tensor(int64)": "int64", "tensor(int32)": "int32", "tensor(int8)": "int8",
    "tensor(uint8)": "uint8", "tensor(bool)": "bool",
}


@dataclass
class BenchResult:
    model: str
    target: str
    shapes: Dict[str, List[int]]
    compile_ms: float
    load_ms: float
    partitions: int
    runs: int
    kiln_ms: List[float] = field(default_factory=list)
    cpu_ms: List[float] = field(default_factory=list)

    @property
    def kiln_median(self) -> float:
        return statistics.median(self.kiln_ms)

    @property
    def cpu_median(self) -> float:
        return statistics.median(self.cpu_ms)

    def table(self) -> str:
        """The result as a plain-text table."""
        speedup = self.cpu_median / self.kiln_median if self.kiln_median > 0 else float("inf")
        shapes = ", ".join(f"{k} {'x'.join(map(str, v))}" for k, v in self.shapes.items())
        rows = [
            ("compile (compile API, kiln)", f"{self.compile_ms:10.1f} ms", f"{self.partitions} partition(s)"),
            ("load _ctx.onnx (session creation)", f"{self.load_ms:10.1f} ms", ""),
            ("run, kiln (median)", f"{self.kiln_median:10.3f} ms", f"min {min(self.kiln_ms):.3f} ms"),
            ("run, CPU EP (median)", f"{self.cpu_median:10.3f} ms", f"min {min(self.cpu_ms):.3f} ms"),
            ("kiln vs CPU EP", f"{speedup:10.2f} x", "(> 1: kiln is faster)"),
        ]
        width = max(len(r[0]) for r in rows)
        lines = [f"{self.model}: target {self.target}, inputs {shapes}, {self.runs} run(s) each"]
        lines.append(f"  {'':<{width}}  {'time':>13}")
        lines.extend(f"  {a:<{width}}  {b:>13}  {c}".rstrip() for a, b, c in rows)
        return "\n".join(lines)


def parse_shapes(specs: Sequence[str]) -> Dict[str, List[int]]:
    """``["x=1x3x224x224", "mask=1,128"]`` -> ``{"x": [1, 3, 224, 224], "mask": [1, 128]}``."""
    out: Dict[str, List[int]] = {}
    for spec in specs:
        for part in filter(None, (p.strip() for p in spec.split(";"))):
            name, sep, dims = part.partition("=")
            try:
                values = [int(d) for d in dims.replace(",", "x").split("x") if d.strip() != ""]
            except ValueError:
                values = []
            if not sep or not name.strip() or not values or any(v < 0 for v in values):
                raise kiln.KilnOptionError(f"bad shape '{part}': expected NAME=D1xD2x... (e.g. x=1x3x224x224)")
            out[name.strip()] = values
    return out


def make_inputs(session, shapes: Mapping[str, Sequence[int]], seed: int = 0) -> Dict[str, object]:
    """Random inputs for ``session``; dims not fixed by the model come from ``shapes`` or are 1."""
    import numpy as np

    rng = np.random.default_rng(seed)
    feeds: Dict[str, object] = {}
    names = {i.name for i in session.get_inputs()}
    unknown = set(shapes) - names
    if unknown:
        raise kiln.KilnOptionError(f"--shapes names {', '.join(sorted(unknown))}, which the model does not have "
                                   f"(inputs: {', '.join(sorted(names))})")
    for inp in session.get_inputs():
        dtype = _NP_TYPES.get(inp.type)
        if dtype is None:
            raise kiln.KilnError(f"input '{inp.name}' has type {inp.type}, which kiln bench cannot generate")
        if inp.name in shapes:
            shape = list(shapes[inp.name])
            if len(shape) != len(inp.shape):
                raise kiln.KilnOptionError(f"--shapes gives input '{inp.name}' rank {len(shape)}; "
                                           f"the model's is {len(inp.shape)}")
        else:
            shape = [d if isinstance(d, int) and d > 0 else 1 for d in inp.shape]
        if dtype == "bool":
            feeds[inp.name] = rng.random(shape) < 0.5
        elif np.issubdtype(np.dtype(dtype), np.integer):
            feeds[inp.name] = rng.integers(0, 2, shape).astype(dtype)
        else:
            feeds[inp.name] = rng.standard_normal(shape).astype(dtype)
    return feeds


def _time_runs(session, feeds, runs: int) -> List[float]:
    session.run(None, feeds)  # warm-up: first-run allocations, shape-specialized programs
    out = []
    for _ in range(runs):
        t0 = time.perf_counter()
        session.run(None, feeds)
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def bench(model: str, *, shapes: Optional[Mapping[str, Sequence[int]]] = None, runs: int = 20,
          target: Optional[str] = None, options: Optional[Mapping[str, str]] = None) -> BenchResult:
    """Compile ``model`` with kiln into a temporary folder, load the compiled model,
    and time ``runs`` runs of it against ONNX Runtime's CPU EP on the original."""
    ort = _ort()
    shapes = dict(shapes or {})
    if runs < 1:
        raise kiln.KilnOptionError("--runs must be at least 1")
    with tempfile.TemporaryDirectory(prefix="kiln-bench-") as tmp:
        result = kiln.compile(model, os.path.join(tmp, "model_ctx.onnx"), target=target, options=options)
        dev = kiln.device_for(target)
        if kiln.is_virtual(dev):
            raise kiln.KilnError(f"cannot time target {result.target} on this machine (it supports at most "
                                 f"{kiln.device_target(kiln.devices(virtual=False)[0])}); compile it with kiln compile")
        t0 = time.perf_counter()
        so = kiln.session_options(options, device=dev)
        ctx_sess = ort.InferenceSession(result.outputs[0], so, enable_fallback=0)
        load_ms = (time.perf_counter() - t0) * 1e3
        cpu_so = ort.SessionOptions()
        cpu_sess = ort.InferenceSession(model, cpu_so, providers=["CPUExecutionProvider"])
        feeds = make_inputs(cpu_sess, shapes)
        out = BenchResult(model=model, target=result.target,
                          shapes={k: list(v.shape) for k, v in feeds.items()},
                          compile_ms=result.seconds * 1e3, load_ms=load_ms,
                          partitions=sum(m.partitions for m in result.models), runs=runs)
        out.kiln_ms = _time_runs(ctx_sess, feeds, runs)
        out.cpu_ms = _time_runs(cpu_sess, feeds, runs)
        ctx_sess = cpu_sess = None
        gc.collect()
    return out
