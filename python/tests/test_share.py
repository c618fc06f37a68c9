"""Weight sharing between models and sessions (``ep.share_ep_contexts``), through
onnxruntime's Python API against the real library.

The sharing workspace is process-wide, so every test ends the groups it starts
(the ``group`` fixture ends one left open by a failing test with a throw-away
stop session in the group's folder).
"""
from __future__ import annotations

import gc
import os
import random
import subprocess
import sys
import textwrap
import threading
import uuid

import numpy as np
import onnxruntime as ort
import pytest
from onnxruntime.capi import onnxruntime_pybind11_state as C

import kiln_testutil as tu

SHARE = "ep.share_ep_contexts"
STOP = "ep.stop_share_ep_contexts"
#: What the binary may hold besides the weights: header, metadata, programs, alignment.
OVERHEAD = 64 * 1024


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------
def ctx_path(folder, model_path) -> str:
    stem = os.path.splitext(os.path.basename(str(model_path)))[0]
    return os.path.join(str(folder), f"{stem}_ctx.onnx")


def generate(model, dev, out, *, stop=False, route="session", config=None, embed=0):
    """One member of a sharing group, written to ``out`` (its folder is created first:
    ORT fails to save a model into a missing folder *after* kiln compiled it, see
    test_an_ort_failure_after_kiln_compiled_adds_nothing). Raises KilnSessionError."""
    os.makedirs(os.path.dirname(str(out)), exist_ok=True)
    cfg = {SHARE: "1"}
    if stop:
        cfg[STOP] = "1"
    cfg.update(config or {})
    if route == "session":
        tu.generate_context(str(model), dev, embed=embed, file_path=str(out), config=cfg)
    else:
        tu.compile_model(str(model), dev, embed=bool(embed), output=str(out), config=cfg)


class Group:
    """Tracks a sharing group so that a failing test still ends it."""

    def __init__(self, dev, tmp_path):
        self.dev = dev
        self.tmp = tmp_path
        self.folder = None
        self.open = False

    def add(self, model, out, *, stop=False, route="session", config=None, embed=0):
        generate(model, self.dev, out, stop=stop, route=route, config=config, embed=embed)
        if not self.open:
            self.folder = os.path.dirname(str(out))
        self.open = not stop

    def close(self):
        if not self.open:
            return
        spare = tu.make_share_model(str(self.tmp / f"spare_{uuid.uuid4().hex[:6]}.onnx"), 99,
                                    batch=1, rows=4, cols=4)
        out = os.path.join(self.folder, f"spare_{uuid.uuid4().hex[:6]}_ctx.onnx")
        generate(spare["path"], self.dev, out, stop=True,
                 config={"ep.context_node_name_prefix": f"spare{uuid.uuid4().hex[:6]}_"})
        self.open = False


@pytest.fixture
def group(kiln_dev, tmp_path):
    g = Group(kiln_dev, tmp_path)
    yield g
    g.close()


def build(tmp_path, n, **kw):
    """n models sharing a backbone (W, B), each with its own head (H, Hb), in tmp/src."""
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    return [tu.make_share_model(str(src / f"m{i}.onnx"), i, **kw) for i in range(n)]


def open_session(model, dev, share=False, stop=False) -> ort.InferenceSession:
    cfg = {}
    if share:
        cfg[SHARE] = "1"
    if stop:
        cfg[STOP] = "1"
    so = tu.kiln_session_options(dev, cfg)
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    return ort.InferenceSession(str(model), so, enable_fallback=0)


def check_close(sess, original, seed=0):
    feeds = tu.make_feeds(original, seed)
    names, expected = tu.run_cpu(original, feeds)
    tu.assert_outputs_close(names, expected, sess.run(names, feeds))


def check_all(sessions, originals):
    """check_close for each pair (a helper, so no loop variable keeps a session alive)."""
    for i, m in enumerate(originals):
        check_close(sessions[i], m)


def mappings(binary) -> int:
    """How many mappings of ``binary`` this process has."""
    real = os.path.realpath(str(binary))
    with open("/proc/self/maps") as f:
        return sum(1 for line in f if line.rstrip("\n").endswith(" " + real))


def no_temp_files(folder):
    left = [f for f in os.listdir(folder) if ".tmp" in f or f.startswith(".")]
    assert not left, f"temporary files left in {folder}: {left}"


def binary_info(path):
    with open(path, "rb") as f:
        data = f.read()
    header, info = tu.parse_ctx_binary(data)
    assert header.magic == tu.CTX_MAGIC
    return info


def partition_names(ctx) -> list:
    return [tu.attrs_of(n)["partition_name"].decode() for n in tu.ep_context_nodes(ctx)]


def load_error(ctx, dev, share=False):
    err = None
    try:
        s = open_session(ctx, dev, share)
        s = None  # noqa: F841
    except Exception as exc:  # noqa: BLE001 - detached below
        err = tu.KilnSessionError(type(exc), str(exc), "session creation")
    gc.collect()
    return err


# --------------------------------------------------------------------------
# generation
# --------------------------------------------------------------------------
@pytest.mark.parametrize("route", ["session", "compile_api"])
@pytest.mark.parametrize("n", [2, 3])
def test_group_writes_n_plus_one_files_and_stores_shared_weights_once(kiln_dev, group, tmp_path, n, route):
    models = build(tmp_path, n)
    out = tmp_path / "out"
    before = tu.stats()
    for i, m in enumerate(models):
        group.add(m["path"], ctx_path(out, m["path"]), stop=i == n - 1, route=route)
        if i < n - 1:
            assert not (out / "m0_kiln.bin").exists(), "only the stop session writes the binary"
    after = tu.stats()
    assert tu.files_in(out) == sorted([f"m{i}_ctx.onnx" for i in range(n)] + ["m0_kiln.bin"])

    binary = out / "m0_kiln.bin"
    size = binary.stat().st_size
    unique = tu.unique_weight_bytes(models)
    total = sum(m["initializer_bytes"] for m in models)
    assert unique <= size <= unique + OVERHEAD, (size, unique)
    assert size < 0.75 * total, (size, total)
    # counters: the shared backbone (W, B) is stored once, so n-1 copies were not written
    backbone = models[0]["weights"]["W"].nbytes + models[0]["weights"]["B"].nbytes
    assert after["context_bytes_deduplicated"] - before["context_bytes_deduplicated"] == (n - 1) * backbone
    assert after["context_bytes_written"] - before["context_bytes_written"] == size

    info = binary_info(binary)
    assert len(info["weights"]) == 2 + 2 * n, "W and B once, every head's H and Hb"
    assert sum(w.byte_length for w in info["weights"]) == unique
    names = []
    for m in models:
        ctx = ctx_path(out, m["path"])
        nodes = tu.ep_context_nodes(ctx)
        assert nodes, ctx
        main = [tu.attrs_of(x) for x in nodes if tu.attrs_of(x).get("main_context", 1) == 1]
        assert len(main) == 1 and main[0]["embed_mode"] == 0
        assert main[0]["ep_cache_context"] == b"m0_kiln.bin"
        # ORT leaves the weights kiln compiled out of the model: they live in the binary
        assert not tu.load_model_proto(ctx).graph.initializer
        names += partition_names(ctx)
    assert sorted(info["graphs"]) == sorted(names)
    assert len(set(names)) == len(names)
    no_temp_files(out)


def test_weights_equal_in_bytes_but_not_in_shape_are_stored_twice(kiln_dev, group, tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    a = tu.make_share_model(str(src / "a.onnx"), 1)
    b = tu.make_share_model(str(src / "b.onnx"), 2, bias_shape=(1, 256, 256))  # same bytes as a's B
    out = tmp_path / "out"
    group.add(a["path"], ctx_path(out, a["path"]))
    group.add(b["path"], ctx_path(out, b["path"]), stop=True)
    info = binary_info(out / "a_kiln.bin")
    assert len(info["weights"]) == 7, "W shared; B stored in both shapes; two heads"
    assert sum(w.byte_length for w in info["weights"]) == tu.unique_weight_bytes([a, b])


def test_every_ctx_model_matches_the_cpu_ep(kiln_dev, group, tmp_path):
    models = build(tmp_path, 3)
    out = tmp_path / "out"
    for i, m in enumerate(models):
        group.add(m["path"], ctx_path(out, m["path"]), stop=i == 2, route="compile_api")
    for share in (False, True):
        sessions = [open_session(ctx_path(out, m["path"]), kiln_dev, share) for m in models]
        assert all(s.get_providers()[0] == "KilnExecutionProvider" for s in sessions)
        check_all(sessions, [m["path"] for m in models])
        sessions = None  # noqa: F841


def test_embed_mode_1_cannot_share(kiln_dev, tmp_path):
    (m,) = build(tmp_path, 1)
    for route in ("session", "compile_api"):
        err = tu.expect_error(generate, m["path"], kiln_dev, tmp_path / f"{route}_ctx.onnx",
                              stop=True, route=route, embed=1)
        tu.assert_error(err, C.InvalidArgument, "ep.context_embed_mode=0", "ep.share_ep_contexts=1")
    assert not [f for f in os.listdir(tmp_path) if f.endswith((".bin", "_ctx.onnx"))]


def test_a_failing_session_adds_nothing_and_the_group_goes_on(kiln_dev, group, tmp_path):
    """a joins; then four failures (embed 1, another folder, the same graphs again,
    a failing stop session); c ends the group. The binary holds a and c only."""
    a, b, c = build(tmp_path, 3)
    out = tmp_path / "out"
    group.add(a["path"], ctx_path(out, a["path"]))

    err = tu.expect_error(group.add, b["path"], ctx_path(out, b["path"]), embed=1)
    tu.assert_error(err, C.InvalidArgument, "ep.context_embed_mode=0")
    err = tu.expect_error(group.add, b["path"], ctx_path(tmp_path / "elsewhere", b["path"]))
    tu.assert_error(err, C.InvalidArgument, "same folder", "m0_kiln.bin")
    err = tu.expect_error(group.add, a["path"], str(out / "again_ctx.onnx"))
    tu.assert_error(err, C.InvalidArgument, "ep.context_node_name_prefix", "already in the shared context binary")
    err = tu.expect_error(group.add, b["path"], ctx_path(out, b["path"]), stop=True, embed=1)
    tu.assert_error(err, C.InvalidArgument, "ep.context_embed_mode=0")
    assert not (out / "m0_kiln.bin").exists(), "a failing stop session writes nothing"
    assert group.open

    group.add(c["path"], ctx_path(out, c["path"]), stop=True)
    assert tu.files_in(out) == ["m0_ctx.onnx", "m0_kiln.bin", "m2_ctx.onnx"]
    assert not (tmp_path / "elsewhere").exists() or not os.listdir(tmp_path / "elsewhere")
    info = binary_info(out / "m0_kiln.bin")
    assert sorted(info["graphs"]) == sorted(partition_names(ctx_path(out, a["path"]))
                                            + partition_names(ctx_path(out, c["path"])))
    assert sum(w.byte_length for w in info["weights"]) == tu.unique_weight_bytes([a, c])
    for m in (a, c):
        s = open_session(ctx_path(out, m["path"]), kiln_dev, share=True)
        check_close(s, m["path"])
        del s


def test_a_failing_first_session_does_not_name_the_binary(kiln_dev, group, tmp_path):
    a, b = build(tmp_path, 2)
    out = tmp_path / "out"
    err = tu.expect_error(group.add, a["path"], ctx_path(out, a["path"]), embed=1)
    tu.assert_error(err, C.InvalidArgument, "ep.context_embed_mode=0")
    group.add(b["path"], ctx_path(out, b["path"]), stop=True)
    assert tu.files_in(out) == ["m1_ctx.onnx", "m1_kiln.bin"]


def test_the_same_model_twice_needs_a_prefix(kiln_dev, group, tmp_path):
    (a,) = build(tmp_path, 1)
    out = tmp_path / "out"
    group.add(a["path"], ctx_path(out, a["path"]))
    err = tu.expect_error(group.add, a["path"], str(out / "twice_ctx.onnx"), stop=True)
    tu.assert_error(err, C.InvalidArgument, "ep.context_node_name_prefix")
    group.add(a["path"], str(out / "twice_ctx.onnx"), stop=True,
              config={"ep.context_node_name_prefix": "twice_"})
    assert tu.files_in(out) == ["m0_ctx.onnx", "m0_kiln.bin", "twice_ctx.onnx"]
    info = binary_info(out / "m0_kiln.bin")
    assert len(info["graphs"]) == 2 and len(info["weights"]) == 4, "the second copy adds graphs, not weights"
    for ctx in (ctx_path(out, a["path"]), out / "twice_ctx.onnx"):
        s = open_session(ctx, kiln_dev, share=True)
        check_close(s, a["path"])
        del s


def test_a_second_group_after_a_finished_one(kiln_dev, group, tmp_path):
    models = build(tmp_path, 4)
    out1, out2 = tmp_path / "g1", tmp_path / "g2"
    group.add(models[0]["path"], ctx_path(out1, models[0]["path"]))
    group.add(models[1]["path"], ctx_path(out1, models[1]["path"]), stop=True)
    group.add(models[2]["path"], ctx_path(out2, models[2]["path"]), route="compile_api")
    group.add(models[3]["path"], ctx_path(out2, models[3]["path"]), stop=True, route="compile_api")
    assert tu.files_in(out1) == ["m0_ctx.onnx", "m0_kiln.bin", "m1_ctx.onnx"]
    assert tu.files_in(out2) == ["m2_ctx.onnx", "m2_kiln.bin", "m3_ctx.onnx"]
    g1, g2 = binary_info(out1 / "m0_kiln.bin"), binary_info(out2 / "m2_kiln.bin")
    assert not set(g1["graphs"]) & set(g2["graphs"]), "the second group starts afresh"
    assert len(g2["weights"]) == 6
    for out, m in [(out1, models[0]), (out1, models[1]), (out2, models[2]), (out2, models[3])]:
        s = open_session(ctx_path(out, m["path"]), kiln_dev, share=True)
        check_close(s, m["path"])
        del s


ABANDON = textwrap.dedent("""
    import os, sys
    import onnxruntime as ort
    import onnxruntime_ep_kiln as kiln
    ort.set_default_logger_severity(3)
    kiln.register()
    dev = kiln.host_device()
    out = sys.argv[1]
    for i, m in enumerate(sys.argv[3:]):
        so = ort.SessionOptions()
        for k, v in {"ep.share_ep_contexts": "1", "ep.context_enable": "1", "ep.context_embed_mode": "0",
                     "ep.context_file_path": os.path.join(out, f"m{i}_ctx.onnx")}.items():
            so.add_session_config_entry(k, v)
        so.add_provider_for_devices([dev], {"claim": "all"})
        ort.InferenceSession(m, so, enable_fallback=0)
    print(sorted(os.listdir(out)), flush=True)
    if sys.argv[2] == "_exit":
        os._exit(0)
    sys.exit(0)
""")


@pytest.mark.parametrize("how", ["exit", "_exit"])
def test_an_abandoned_group_writes_no_binary(kiln_dev, lib_path, tmp_path, how):
    models = build(tmp_path, 2)
    out = tmp_path / "out"
    out.mkdir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([tu.PYTHON_DIR, os.environ.get("PYTHONPATH", "")]),
               KILN_EP_LIBRARY=lib_path)
    proc = subprocess.run([sys.executable, "-c", ABANDON, str(out), how] + [m["path"] for m in models],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "['m0_ctx.onnx', 'm1_ctx.onnx']"
    assert tu.files_in(out) == ["m0_ctx.onnx", "m1_ctx.onnx"], "no binary, no temporary file"
    # the compiled models name a binary that was never written
    for m in models:
        assert tu.attrs_of(tu.ep_context_nodes(ctx_path(out, m["path"]))[0])["ep_cache_context"] == b"m0_kiln.bin"
    err = load_error(ctx_path(out, models[0]["path"]), kiln_dev)
    assert err is not None
    tu.assert_error(err, C.InvalidGraph, "does not exist", "m0_kiln.bin")


# --------------------------------------------------------------------------
# loading
# --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def shared_set(kiln_name, kiln_dev, tmp_path_factory):
    """Three models compiled as one group (module-wide, read-only)."""
    tmp = tmp_path_factory.mktemp("shared_set")
    models = build(tmp, 3)
    out = tmp / "out"
    for i, m in enumerate(models):
        generate(m["path"], kiln_dev, ctx_path(out, m["path"]), stop=i == 2)
    ctx = [ctx_path(out, m["path"]) for m in models]
    return {"models": [m["path"] for m in models], "ctx": ctx, "binary": str(out / "m0_kiln.bin")}


def test_sharing_sessions_open_and_map_the_binary_once(kiln_dev, shared_set):
    binary = shared_set["binary"]
    assert mappings(binary) == 0
    before = tu.stats()
    sessions = [open_session(c, kiln_dev, share=True) for c in shared_set["ctx"]]
    after = tu.stats()
    assert after["context_files_opened"] - before["context_files_opened"] == 1
    assert after["context_files_shared"] - before["context_files_shared"] == 2
    assert after["context_graphs_loaded"] - before["context_graphs_loaded"] == 3
    assert after["partitions_compiled"] == before["partitions_compiled"], "nothing compiled"
    assert mappings(binary) == 1, "one copy of the weights in memory"
    check_all(sessions, shared_set["models"])
    # destroy in creation order; the mapping lives while any session uses it
    sessions.pop(0)
    gc.collect()
    assert mappings(binary) == 1
    check_close(sessions[-1], shared_set["models"][2])
    sessions.clear()
    gc.collect()
    assert mappings(binary) == 0, "unmapped once no session uses it"

    # a new sharing session after all are gone maps the file again
    before = tu.stats()
    s = open_session(shared_set["ctx"][1], kiln_dev, share=True)
    assert tu.stats()["context_files_opened"] - before["context_files_opened"] == 1
    del s


def test_without_sharing_every_session_maps_the_file(kiln_dev, shared_set):
    binary = shared_set["binary"]
    before = tu.stats()
    sessions = [open_session(c, kiln_dev) for c in shared_set["ctx"]]
    after = tu.stats()
    assert after["context_files_opened"] - before["context_files_opened"] == 3
    assert after["context_files_shared"] == before["context_files_shared"]
    assert mappings(binary) == 3
    check_all(sessions, shared_set["models"])
    # a sharing session does not take a binary a non-sharing session mapped
    before = tu.stats()
    extra = open_session(shared_set["ctx"][0], kiln_dev, share=True)
    assert tu.stats()["context_files_opened"] - before["context_files_opened"] == 1
    assert mappings(binary) == 4
    del extra
    sessions.clear()
    gc.collect()
    assert mappings(binary) == 0


def test_stop_on_a_loading_session_clears_the_workspace(kiln_dev, shared_set):
    ctx = shared_set["ctx"]
    before = tu.stats()
    a = open_session(ctx[0], kiln_dev, share=True)
    b = open_session(ctx[1], kiln_dev, share=True, stop=True)  # takes it, then clears
    c = open_session(ctx[2], kiln_dev, share=True)  # opens the file again
    after = tu.stats()
    assert after["context_files_opened"] - before["context_files_opened"] == 2
    assert after["context_files_shared"] - before["context_files_shared"] == 1
    assert mappings(shared_set["binary"]) == 2
    check_all((a, b, c), shared_set["models"])
    del a, b, c
    gc.collect()
    assert mappings(shared_set["binary"]) == 0


def test_destruction_in_any_order(kiln_dev, shared_set):
    rng = random.Random(5)
    for _ in range(4):
        sessions = {i: open_session(c, kiln_dev, share=True) for i, c in enumerate(shared_set["ctx"])}
        assert mappings(shared_set["binary"]) == 1
        order = list(sessions)
        rng.shuffle(order)
        for k, i in enumerate(order):
            del sessions[i]
            gc.collect()
            for j in sessions:
                check_close(sessions[j], shared_set["models"][j], seed=k)
            assert mappings(shared_set["binary"]) == (1 if sessions else 0)


def test_sessions_created_and_destroyed_from_several_threads(kiln_dev, shared_set):
    feeds = [tu.make_feeds(m, 3) for m in shared_set["models"]]
    expected = [tu.run_cpu(m, f)[1] for m, f in zip(shared_set["models"], feeds)]
    errors = []
    peak = [0]
    keep = []  # some sessions outlive their thread and die in another
    keep_lock = threading.Lock()

    def worker(t):
        rng = random.Random(t)
        try:
            for round_ in range(8):
                i = rng.randrange(3)
                s = open_session(shared_set["ctx"][i], kiln_dev, share=rng.random() < 0.8)
                out = s.run(None, feeds[i])
                np.testing.assert_allclose(out[0], expected[i][0], rtol=tu.RTOL, atol=tu.ATOL)
                peak[0] = max(peak[0], mappings(shared_set["binary"]))
                with keep_lock:
                    if rng.random() < 0.3:
                        keep.append(s)
                    elif keep and rng.random() < 0.5:
                        keep.pop(rng.randrange(len(keep)))
                del s
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(f"thread {t}: {type(exc).__name__}: {exc}")

    tu.run_threads(worker, 4)
    assert not errors, errors
    keep.clear()
    gc.collect()
    assert mappings(shared_set["binary"]) == 0
    assert peak[0] >= 1


# --------------------------------------------------------------------------
# edge cases of a group: ORT failing after kiln compiled, a stop session with nothing to compile
# --------------------------------------------------------------------------
def test_an_ort_failure_after_kiln_compiled_adds_nothing(kiln_dev, tmp_path):
    a, b = build(tmp_path, 2)
    missing, out = tmp_path / "missing", tmp_path / "out"
    out.mkdir()
    err = tu.expect_error(tu.generate_context, a["path"], kiln_dev, 0, str(missing / "m0_ctx.onnx"), {SHARE: "1"})
    assert not missing.exists() and err.exc_type is C.InvalidArgument, err
    try:
        generate(b["path"], kiln_dev, out / "m1_ctx.onnx", stop=True)
        joined = None
    except tu.KilnSessionError as e:
        joined = e
        # end the group a's graphs started: its stop session creates the missing folder
        generate(b["path"], kiln_dev, missing / "m1_ctx.onnx", stop=True)
    assert joined is None, joined
    assert tu.files_in(out) == ["m1_ctx.onnx", "m1_kiln.bin"]


def test_a_stop_session_on_a_model_kiln_does_not_claim_ends_the_group(kiln_dev, group, tmp_path, models):
    (a,) = build(tmp_path, 1)
    out = tmp_path / "out"
    group.add(a["path"], ctx_path(out, a["path"]))
    group.add(models["unsupported"], ctx_path(out, models["unsupported"]), stop=True)
    written = (out / "m0_kiln.bin").exists()
    if not written:
        group.open, group.folder = True, str(out)  # the fixture ends it
    assert written


def test_a_group_of_dynamic_batch_models_shares_one_binary(kiln_dev, group, tmp_path):
    """Shape-generic partitions (format 2) in a sharing group: two dynamic-batch MLPs
    compiled into one binary, loaded by sharing sessions without compiling, each run at
    two batch sizes against the CPU EP."""
    import models_lib as ml

    cases = [ml.mlp(2, 64, 1, "relu", "gemm", dynamic_batch=True, seed=s, name=f"dyn_mlp{s}") for s in (1, 2)]
    src = tmp_path / "src"
    paths = [c.save(str(src)) for c in cases]
    out = tmp_path / "out"
    for i, p in enumerate(paths):
        group.add(p, ctx_path(out, p), stop=i == 1)
    assert sorted(f for f in os.listdir(out) if f.endswith("_kiln.bin")) == ["dyn_mlp1_kiln.bin"]
    for case, p in zip(cases, paths):
        feeds = [case.feeds(b, batch=b) for b in (1, 3)]
        run = tu.run_kiln(ctx_path(out, p), kiln_dev, feeds_seq=feeds, config={SHARE: "1"})
        assert run.created_delta("partitions_compiled") == 0
        assert run.run_delta("shapes_specialized") == 2
        for f, outs in zip(feeds, run.all_outputs):
            names, want = tu.run_cpu(p, f)
            tu.assert_outputs_close(names, want, outs)
