"""Shared helpers for kiln's Python tests.

Sessions that use kiln must all be gone before kiln is unregistered (else
ONNX Runtime crashes at exit). So every helper here creates its session,
extracts plain Python / NumPy results and drops the session before
returning, and converts ORT exceptions into ``KilnSessionError`` raised
*outside* the ``except`` block, so no traceback keeps a half-built session
alive.
"""
from __future__ import annotations

import gc
import os
import sys
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np
import onnxruntime as ort
from onnxruntime.capi import onnxruntime_pybind11_state as C

import onnxruntime_ep_kiln as kiln

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(TESTS_DIR)
REPO_DIR = os.path.dirname(PYTHON_DIR)
MODELS_DIR = os.path.join(REPO_DIR, "models")

RTOL = 1e-5
ATOL = 1e-6

MODEL_NAMES = ("add_mul_relu", "split", "unsupported", "all_ops", "demo")
SUPPORTED_OPS = ("Add", "Sub", "Mul", "Div", "Relu", "Sigmoid", "Tanh", "Neg", "Abs",
                 "Sqrt", "Exp", "Identity")

_NP = {"tensor(float)": np.float32}


# --------------------------------------------------------------------------
# host
# --------------------------------------------------------------------------
def cpu_flags() -> set:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def host_target(max_target: Optional[str] = None) -> str:
    """The target kiln should pick for this machine (capped by ``max_target``)."""
    flags = cpu_flags()
    if {"avx512f", "avx512bw", "avx512vl", "fma"} <= flags:
        best = "x86_64-avx512"
    elif {"avx2", "fma"} <= flags:
        best = "x86_64-avx2"
    else:
        best = "x86_64-generic"
    if max_target is not None:
        order = list(kiln.TARGETS)  # best first
        best = order[max(order.index(best), order.index(max_target))]
    return best


# --------------------------------------------------------------------------
# running models
# --------------------------------------------------------------------------
def make_feeds(model_path: str, seed: int = 0) -> Dict[str, np.ndarray]:
    sess = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(seed)
    feeds = {}
    for inp in sess.get_inputs():
        assert inp.type in _NP, f"test models use float inputs only, got {inp.type}"
        feeds[inp.name] = rng.standard_normal(inp.shape).astype(_NP[inp.type])
    del sess
    return feeds


def run_cpu(model_path: str, feeds: Dict[str, np.ndarray]) -> Tuple[List[str], List[np.ndarray]]:
    """Reference outputs from ONNX Runtime's own CPU EP: (output names, values)."""
    sess = ort.InferenceSession(model_path, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    outs = sess.run(names, feeds)
    del sess
    return names, outs


class KilnSessionError(Exception):
    """An ORT error from creating / running a kiln session, detached from its traceback."""

    def __init__(self, exc_type: type, message: str, stage: str):
        super().__init__(f"{stage}: {exc_type.__module__}.{exc_type.__name__}: {message}")
        self.exc_type = exc_type
        self.message = message
        self.stage = stage


@dataclass
class KilnRun:
    output_names: List[str]
    outputs: Optional[List[np.ndarray]]
    stats_before: Dict[str, int]
    stats_created: Dict[str, int]
    stats_after: Dict[str, int]
    providers: List[str]
    # [(ep_name, [(node_name, op_type), ...]), ...] or None if not recorded
    assignment: Optional[List[Tuple[str, List[Tuple[str, str]]]]] = None
    runs: int = 0

    def created_delta(self, key: str) -> int:
        return self.stats_created[key] - self.stats_before[key]

    def run_delta(self, key: str) -> int:
        return self.stats_after[key] - self.stats_created[key]

    def nodes_on(self, ep_name: str) -> List[Tuple[str, str]]:
        assert self.assignment is not None
        return [n for ep, nodes in self.assignment if ep == ep_name for n in nodes]

    def subgraphs_on(self, ep_name: str) -> int:
        assert self.assignment is not None
        return sum(1 for ep, _ in self.assignment if ep == ep_name)


def _session_options(devices: Sequence, options: Optional[Dict[str, str]],
                     config: Optional[Dict[str, str]]) -> ort.SessionOptions:
    so = ort.SessionOptions()
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    for k, v in (config or {}).items():
        so.add_session_config_entry(k, v)
    so.add_provider_for_devices(list(devices), dict(options or {}))
    return so


def run_kiln(model_path: str, device, feeds: Optional[Dict[str, np.ndarray]] = None,
             options: Optional[Dict[str, str]] = None, config: Optional[Dict[str, str]] = None,
             runs: int = 1) -> KilnRun:
    """Create a session on ``device`` (a kiln OrtEpDevice), run it ``runs`` times
    (if ``feeds`` is given) and return outputs, kiln stats and node assignment.

    Raises KilnSessionError (never the raw ORT exception)."""
    err = None
    sess = None
    result = None
    stage = "session options"
    try:
        so = _session_options([device], options, config)
        before = kiln.stats()
        stage = "session creation"
        # enable_fallback=0: the Python wrapper would otherwise catch an EP error,
        # print "EP Error ... Falling back" and silently retry on the CPU EP alone.
        sess = ort.InferenceSession(model_path, so, enable_fallback=0)
        created = kiln.stats()
        names = [o.name for o in sess.get_outputs()]
        outs = None
        stage = "run"
        if feeds is not None:
            for _ in range(runs):
                outs = sess.run(names, feeds)
        after = kiln.stats()
        stage = "graph assignment info"
        assignment = [(sg.ep_name, [(n.name, n.op_type) for n in sg.get_nodes()])
                      for sg in sess.get_provider_graph_assignment_info()]
        result = KilnRun(names, outs, before, created, after, list(sess.get_providers()),
                         assignment, runs if feeds is not None else 0)
    except Exception as exc:  # noqa: BLE001 - re-raised below, detached
        err = (type(exc), str(exc), stage)
    finally:
        sess = None
    if err is not None:
        gc.collect()
        raise KilnSessionError(*err)
    return result


def session_error(model_path: str, device, options=None, config=None) -> Optional[KilnSessionError]:
    """The KilnSessionError from creating a session, or None if creation worked."""
    try:
        run_kiln(model_path, device, None, options, config)
    except KilnSessionError as e:
        return e
    return None


def assert_invalid_argument(err, *needles):
    """kiln's CreateEp returns ORT_INVALID_ARGUMENT. ORT 1.31.1 turns a failed
    CreateEp into ORT_THROW("Error creating execution provider: <status>")
    (PluginExecutionProviderFactory::CreateProvider), which reaches Python as
    a plain RuntimeError whose text carries "INVALID_ARGUMENT"; accept either."""
    assert err is not None, "session creation should have failed"
    assert err.stage == "session creation", err
    assert err.exc_type is C.InvalidArgument or (
        err.exc_type is RuntimeError and "INVALID_ARGUMENT" in err.message
    ), f"expected InvalidArgument, got {err}"
    for n in needles:
        assert n in err.message, f"{n!r} not in error message: {err.message!r}"


def assert_outputs_close(names, expected, actual, rtol=RTOL, atol=ATOL):
    assert actual is not None and len(actual) == len(expected)
    for name, e, a in zip(names, expected, actual):
        assert a.shape == e.shape, f"output {name}: shape {a.shape} != {e.shape}"
        assert a.dtype == e.dtype, f"output {name}: dtype {a.dtype} != {e.dtype}"
        np.testing.assert_allclose(a, e, rtol=rtol, atol=atol, err_msg=f"output {name}")


def check_against_cpu(model_path: str, device, options=None, config=None, seed=0) -> KilnRun:
    feeds = make_feeds(model_path, seed)
    names, expected = run_cpu(model_path, feeds)
    run = run_kiln(model_path, device, feeds, options, config)
    assert run.output_names == names
    assert_outputs_close(names, expected, run.outputs)
    return run


# --------------------------------------------------------------------------
# registration bookkeeping
# --------------------------------------------------------------------------
def unique_name(prefix: str, suffix: str = "") -> str:
    """A registration name no other test uses (``suffix`` e.g. ".virtual")."""
    import uuid

    return f"{prefix}_{uuid.uuid4().hex[:8]}{suffix}"


def kiln_devices() -> list:
    return [d for d in ort.get_ep_devices() if d.ep_name == kiln.EP_NAME]


def live_sessions() -> int:
    """Number of ort.InferenceSession objects still alive (after a gc pass)."""
    for attr in ("last_type", "last_value", "last_traceback", "last_exc"):
        if hasattr(sys, attr):
            setattr(sys, attr, None)
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, ort.InferenceSession))


def safe_unregister(name: str) -> None:
    """Unregister ``name`` unless some session might still use it (then leak the
    registration rather than crash the interpreter at exit)."""
    n = live_sessions()
    if n:
        import warnings

        warnings.warn(f"not unregistering {name!r}: {n} InferenceSession(s) still alive")
        return
    ort.unregister_execution_provider_library(name)
