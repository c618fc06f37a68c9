"""No heap allocation per Run in steady state (issue #14).

Needs a kiln built with the ``alloc-count`` feature, which counts the
allocations kiln's own code makes and exports ``kiln_ep_alloc_count``;
``make test-alloc`` builds one (in ``target/alloc-count``) and runs this
module against it. With an ordinary build the module is skipped.

Each model runs at each shape WARMUP times (the first run at a shape builds
its program; scratch buffers grow to their size), then RUNS more times. With
one thread those must not allocate at all. With two, a thread-local scratch
buffer (GEMM packing, attention scores) still grows the first time its thread
happens to get a larger task than before, which depends on how ORT's pool
hands tasks out: a bounded, one-time cost, so the bound there is fewer than
RUNS // 2 allocations over RUNS runs, which any allocation made in every Run
exceeds. Models: the transformer benchmarks of issue #14,
paraphrase-MiniLM-L3-v2 (the real-model corpus) at batch 1 and 8 x sequence 16
and 128 and at 1 x 512 (where the attention kernel packs K and V ahead), and ``bench/latency.py``'s MLPs and BERT-shaped encoders, with 1 and 2
intra-op threads; and ``models_lib``'s elementwise chains (rows and
channels-first per-channel constants, one ``Chain`` step each). The counts per run are printed in pytest's terminal summary;
``KILN_ALLOC_RUNS`` overrides RUNS.
"""
from __future__ import annotations

import ctypes
import os

import numpy as np
import onnxruntime as ort
import pytest

from onnxruntime_ep_kiln import _native

import kiln_testutil as tu
import models_lib as ml
import real_corpus as rc

WARMUP = 3
RUNS = int(os.environ.get("KILN_ALLOC_RUNS", "20"))
THREADS = (1, 2)
MINILM_SHAPES = ((1, 16), (1, 128), (8, 16), (8, 128), (1, 512))

COUNTS = []  # (model, shape, threads, allocations in the first run, per later run)
tu.TERMINAL_SUMMARY["kiln allocations per Run"] = lambda: [
    f"{m:28s} {s:>8s} {t} thread(s): first run {first:6d}, then {later}" for m, s, t, first, later in COUNTS
]


@pytest.fixture(scope="module")
def alloc_count(lib_path):
    fn = getattr(_native.cdll(lib_path), "kiln_ep_alloc_count", None)
    if fn is None:
        pytest.skip("kiln built without the alloc-count feature (make test-alloc builds one)")
    fn.argtypes = []
    fn.restype = ctypes.c_uint64
    return fn


def session(path: str, dev, threads: int, options=None) -> ort.InferenceSession:
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    so.add_provider_for_devices([dev], options or {})
    return ort.InferenceSession(path, so, enable_fallback=0)


def allocations_per_run(sess, feeds, count, model: str, shape: str, threads: int):
    before = count()
    sess.run(None, feeds)
    first = count() - before
    for _ in range(WARMUP - 1):
        sess.run(None, feeds)
    later = []
    for _ in range(RUNS):
        before = count()
        sess.run(None, feeds)
        later.append(count() - before)
    COUNTS.append((model, shape, threads, first, later))
    return later


def steady(later, threads: int) -> bool:
    """No allocation per run (see the module doc for the bound with several threads)."""
    return sum(later) == 0 if threads == 1 else sum(later) < RUNS // 2


@pytest.mark.parametrize("threads", THREADS)
def test_minilm_runs_allocate_nothing(alloc_count, kiln_dev, threads):
    spec = rc.spec("minilm_l3")
    path = rc.all_models()["minilm_l3"]
    sess = session(path, kiln_dev, threads)
    counts = {}
    for batch, seq in MINILM_SHAPES:
        feeds = spec.feeds((batch, seq), np.random.default_rng(0))
        counts[f"{batch}x{seq}"] = allocations_per_run(sess, feeds, alloc_count, "minilm_l3", f"{batch}x{seq}",
                                                       threads)
    assert all(steady(c, threads) for c in counts.values()), f"{threads} thread(s): allocations per run {counts}"


@pytest.mark.parametrize("case", ml.bench_cases(), ids=lambda c: c.name)
@pytest.mark.parametrize("threads", THREADS)
def test_latency_models_run_without_allocating(alloc_count, kiln_dev, tmp_path, case, threads):
    path = case.save(str(tmp_path))
    sess = session(path, kiln_dev, threads)
    later = allocations_per_run(sess, case.feeds(0), alloc_count, case.name, "", threads)
    assert steady(later, threads), f"{case.name}, {threads} thread(s): allocations per run {later}"


@pytest.mark.parametrize("threads", THREADS)
def test_elementwise_chains_run_without_allocating(alloc_count, kiln_dev, tmp_path, threads):
    rng = np.random.default_rng(0)
    for name, model, shape in [("chain rows", ml.gate_chain(), (8, 128, 40)),
                               ("chain channels", ml.channels_first_chain(channels=24), (2, 24, 40, 45))]:
        path = tu.save_model(model, tmp_path, name.replace(" ", "_"))
        # claim=all: kiln's default rule leaves a partition without a product or convolution to ORT.
        sess = session(path, kiln_dev, threads, {"claim": "all"})
        feeds = {"x": rng.standard_normal(shape).astype(np.float32)}
        later = allocations_per_run(sess, feeds, alloc_count, name, "x".join(map(str, shape)), threads)
        assert steady(later, threads), f"{name}, {threads} thread(s): allocations per run {later}"
