"""Concurrency through onnxruntime's Python API (issue #10): many threads running one
kiln session, and sessions of one weight-sharing group created, run and dropped from
several threads at once.

``InferenceSession.run`` releases the GIL, so the threads below really call kiln's
Compute at the same time (on 2 cores: interleaved and overlapping).

What a pass means:

* one session that kiln claims fully (``session.disable_cpu_ep_fallback=1`` and ORT's
  assignment info), THREADS x RUNS ``Run`` calls with FEEDS different inputs spread so
  that threads run different inputs at the same moment; every result is **bit for bit**
  the result of the same input run single-threaded on the same session (a shared
  scratch arena, a kernel writing outside its rows, or packed weights modified in
  place would show here), and the single-threaded results match ORT's CPU EP;
* kiln's counters saw every one of those runs (Compute was really called THREADS x RUNS
  times, nothing fell back to the CPU EP);
* sessions of a sharing group: every output is right, and once all sessions are gone
  the shared binary is unmapped.
"""
from __future__ import annotations

import gc
import os
import random
import threading

import numpy as np
import onnxruntime as ort
import pytest

import onnxruntime_ep_kiln as kiln
import kiln_testutil as tu
import models_lib as ml

THREADS = 8
RUNS = 200
FEEDS = 16
NO_FALLBACK = {"session.disable_cpu_ep_fallback": "1"}


# --------------------------------------------------------------------------
# models
# --------------------------------------------------------------------------
BERT = ml.bert(64, 2, 8, 2, 2, mask=True, ln="decomposed", act="erf", name="bert_tiny_mask")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("concurrency")


@pytest.fixture(scope="module")
def cases(models, model_dir, kiln_dev):
    """name -> (model path to load, source model path, feeds list, (rtol, atol))."""
    out = {}
    out["demo"] = (models["demo"], models["demo"],
                   [tu.make_feeds(models["demo"], s) for s in range(FEEDS)], (1e-4, 1e-5))
    bert = BERT.save(str(model_dir))
    out["bert_tiny"] = (bert, bert, [BERT.feeds(s) for s in range(FEEDS)], (BERT.rtol, BERT.atol))
    # a compiled model whose weights live in a memory-mapped _kiln.bin
    src = os.path.join(str(model_dir), "demo_src.onnx")
    with open(models["demo"], "rb") as f, open(src, "wb") as g:
        g.write(f.read())
    ctx = os.path.join(str(model_dir), "demo_src_ctx.onnx")
    tu.compile_model(src, kiln_dev, embed=False, output=ctx)
    assert os.path.exists(os.path.join(str(model_dir), "demo_src_kiln.bin"))
    out["demo_ctx"] = (ctx, src, out["demo"][2], (1e-4, 1e-5))
    return out


def open_fully_on_kiln(path, dev) -> ort.InferenceSession:
    """A session that exists only if kiln took every node; checked again with ORT's
    assignment info."""
    so = tu.kiln_session_options(dev, dict(NO_FALLBACK, **{"session.record_ep_graph_assignment_info": "1"}))
    sess = ort.InferenceSession(str(path), so, enable_fallback=0)
    info = sess.get_provider_graph_assignment_info()
    eps = {sg.ep_name for sg in info}
    assert eps == {kiln.EP_NAME}, f"nodes left to other EPs: {eps}"
    assert sess.get_providers()[0] == kiln.EP_NAME
    return sess


def hammer(sess, feeds, names, threads=THREADS, runs=RUNS):
    """Runs ``runs`` inputs in each of ``threads`` threads, all started together.
    Thread t, iteration j runs feed (5t + 3j) mod len(feeds): at any moment the threads
    run different inputs. Returns ([(j, feed index, outputs)] per thread, errors, the
most threads that were inside ``run`` at once)."""
    barrier = threading.Barrier(threads)
    results = [[] for _ in range(threads)]
    errors = []
    lock = threading.Lock()
    in_run = [0, 0]  # now, most at once

    def worker(t):
        try:
            barrier.wait()
            for j in range(runs):
                i = (5 * t + 3 * j) % len(feeds)
                with lock:
                    in_run[0] += 1
                    in_run[1] = max(in_run)
                outs = sess.run(names, feeds[i])
                with lock:
                    in_run[0] -= 1
                results[t].append((j, i, outs))
        except Exception as exc:  # noqa: BLE001 - reported by the test
            errors.append(f"thread {t}: {type(exc).__name__}: {exc}")

    tu.run_threads(worker, threads)
    return results, errors, in_run[1]


@pytest.mark.parametrize("name", ["demo", "bert_tiny", "demo_ctx"])
def test_threads_on_one_session_match_single_threaded_runs(kiln_dev, cases, name):
    path, src, feeds, (rtol, atol) = cases[name]
    sess = open_fully_on_kiln(path, kiln_dev)
    names = [o.name for o in sess.get_outputs()]

    # single-threaded reference on the same session, and against the CPU EP
    single = [sess.run(names, f) for f in feeds]
    for i, f in enumerate(feeds):
        cpu_names, cpu = tu.run_cpu(src, f)
        assert cpu_names == names
        tu.assert_outputs_close(names, cpu, single[i], rtol=rtol, atol=atol)
    # the inputs differ, so do the outputs (a thread answering with another's result shows)
    assert len({single[i][0].tobytes() for i in range(FEEDS)}) == FEEDS

    before = tu.stats()
    results, errors, overlap = hammer(sess, feeds, names)
    after = tu.stats()
    assert not errors, errors[:5]
    assert overlap >= 2, "the runs never overlapped, so this tested nothing"

    bad = []
    for t, rows in enumerate(results):
        assert len(rows) == RUNS, f"thread {t} did {len(rows)} runs"
        for j, i, outs in rows:
            for k, (got, want) in enumerate(zip(outs, single[i])):
                if got.shape != want.shape or got.dtype != want.dtype or not np.array_equal(got, want):
                    diff = np.max(np.abs(got.astype(np.float64) - want)) if got.shape == want.shape else "shape"
                    bad.append(f"thread {t} run {j} feed {i} output {names[k]}: max diff {diff}")
    assert not bad, f"{len(bad)} of {THREADS * RUNS} concurrent runs differ from single-threaded ones: {bad[:5]}"
    # every one of those runs went through kiln's Compute (one partition)
    assert after["compute_calls"] - before["compute_calls"] == THREADS * RUNS
    del sess
    gc.collect()


# --------------------------------------------------------------------------
# a weight-sharing group, loaded from several threads at once
# --------------------------------------------------------------------------
SHARE = "ep.share_ep_contexts"
STOP = "ep.stop_share_ep_contexts"


@pytest.fixture(scope="module")
def shared_group(kiln_dev, model_dir):
    """Three models compiled as one sharing group: N _ctx.onnx + one binary."""
    src = os.path.join(str(model_dir), "share_src")
    out = os.path.join(str(model_dir), "share_out")
    os.makedirs(src)
    os.makedirs(out)
    models = [tu.make_share_model(os.path.join(src, f"g{i}.onnx"), i, batch=2, rows=128, cols=128)["path"]
              for i in range(3)]
    ctx = []
    for i, m in enumerate(models):
        c = os.path.join(out, f"g{i}_ctx.onnx")
        cfg = {SHARE: "1", **({STOP: "1"} if i == len(models) - 1 else {})}
        tu.compile_model(m, kiln_dev, embed=False, output=c, config=cfg)
        ctx.append(c)
    assert tu.files_in(out) == ["g0_ctx.onnx", "g0_kiln.bin", "g1_ctx.onnx", "g2_ctx.onnx"]
    return {"models": models, "ctx": ctx, "binary": os.path.join(out, "g0_kiln.bin")}


def mappings(binary) -> int:
    real = os.path.realpath(binary)
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if line.rstrip("\n").endswith(" " + real))


def open_sharing(ctx, dev) -> ort.InferenceSession:
    so = tu.kiln_session_options(dev, dict(NO_FALLBACK, **{SHARE: "1"}))
    return ort.InferenceSession(ctx, so, enable_fallback=0)


def test_sharing_group_sessions_created_run_and_dropped_from_threads(kiln_dev, shared_group):
    """THREADS threads, each creating SESSIONS sessions on a random model of the group
    (all with ep.share_ep_contexts=1), running each on thread-specific inputs, checking
    the result against the CPU EP, and dropping it (some are handed to another thread
    and dropped there)."""
    sessions_per_thread = 12
    models, ctx = shared_group["models"], shared_group["ctx"]
    feeds = {(t, i): tu.make_feeds(models[i], 100 * t + i) for t in range(THREADS) for i in range(3)}
    expected = {k: tu.run_cpu(models[k[1]], f)[1] for k, f in feeds.items()}
    assert mappings(shared_group["binary"]) == 0
    before = tu.stats()
    barrier = threading.Barrier(THREADS)
    handoff, lock = [], threading.Lock()
    errors, peak = [], [0]

    def worker(t):
        rng = random.Random(t)
        try:
            barrier.wait()
            for _ in range(sessions_per_thread):
                i = rng.randrange(3)
                s = open_sharing(ctx[i], kiln_dev)
                out = s.run(None, feeds[(t, i)])
                np.testing.assert_allclose(out[0], expected[(t, i)][0], rtol=1e-4, atol=1e-5,
                                           err_msg=f"thread {t} model {i}")
                with lock:
                    peak[0] = max(peak[0], mappings(shared_group["binary"]))
                    if rng.random() < 0.3:
                        handoff.append(s)  # dropped later, by another thread
                    elif handoff:
                        handoff.pop(rng.randrange(len(handoff)))
                del s
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(f"thread {t}: {type(exc).__name__}: {exc}")

    tu.run_threads(worker, THREADS)
    assert not errors, errors[:5]
    after = tu.stats()
    n = THREADS * sessions_per_thread
    assert after["context_graphs_loaded"] - before["context_graphs_loaded"] == n
    assert after["partitions_compiled"] == before["partitions_compiled"], "nothing compiled"
    # sharing worked: most sessions took the binary from the workspace
    assert after["context_files_shared"] - before["context_files_shared"] > 0
    assert peak[0] >= 1
    print(f"sharing group: {n} sessions from {THREADS} threads, at most {peak[0]} mapping(s) of the binary, "
          f"{after['context_files_opened'] - before['context_files_opened']} file opens")
    handoff.clear()
    gc.collect()
    assert mappings(shared_group["binary"]) == 0, "the binary stays mapped after every session is gone"


def test_concurrent_first_loads_of_a_shared_binary_map_it_once(kiln_dev, model_dir):
    """ROUNDS times: THREADS sharing sessions created at once on one compiled model whose
    binary nobody has mapped yet; while they all live, the binary must be mapped once.
    A 64 MiB binary makes mapping + checksum long enough for the threads to meet."""
    folder = os.path.join(str(model_dir), "first_loads")
    os.makedirs(folder)
    m = tu.make_share_model(os.path.join(folder, "big.onnx"), 1, batch=16, rows=1024, cols=1024)["path"]
    ctx = os.path.join(folder, "big_ctx.onnx")
    tu.compile_model(m, kiln_dev, embed=False, output=ctx)
    binary = os.path.join(folder, "big_kiln.bin")
    counts = []
    for _ in range(12):
        barrier = threading.Barrier(THREADS)
        held, lock, errors = [], threading.Lock(), []

        def worker():
            try:
                barrier.wait()
                s = open_sharing(ctx, kiln_dev)
                with lock:
                    held.append(s)
            except Exception as exc:  # noqa: BLE001 - reported below
                errors.append(f"{type(exc).__name__}: {exc}")

        tu.run_threads(lambda _t: worker(), THREADS)
        assert not errors, errors[:3]
        assert len(held) == THREADS
        counts.append(mappings(binary))
        held.clear()
        gc.collect()
        assert mappings(binary) == 0
    assert counts == [1] * len(counts), f"mappings of the shared binary per round: {counts}"
