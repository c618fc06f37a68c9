"""Loading EPContext models on kiln: which nodes kiln claims, how it finds binaries,
how binaries are held in memory (``context_storage``: map or copy) and what a live
session sees when its ``.bin`` changes. Every way a shipped artifact can be broken is
a row of the bad input table, test_bad_inputs.py.
"""
from __future__ import annotations

import os
import json
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest
from onnx import helper
from onnxruntime.capi import onnxruntime_pybind11_state as C

import onnxruntime_ep_kiln as kiln
import kiln_testutil as tu

KILN = kiln.EP_NAME


@pytest.fixture
def amr_ctx(models, kiln_virtual, tmp_path):
    """add_mul_relu compiled with embed 0 in a fresh folder: (ctx path, bin path, original)."""
    src = tmp_path / "add_mul_relu.onnx"
    shutil.copy(models["add_mul_relu"], src)
    tu.generate_context(str(src), kiln_virtual["host"], embed=0)
    return tmp_path / "add_mul_relu_ctx.onnx", tmp_path / "add_mul_relu_kiln.bin", str(src)


@pytest.fixture
def split_ctx(models, kiln_virtual, tmp_path):
    src = tmp_path / "split.onnx"
    shutil.copy(models["split"], src)
    tu.generate_context(str(src), kiln_virtual["host"], embed=0)
    return tmp_path / "split_ctx.onnx", tmp_path / "split_kiln.bin", str(src)


def load_error(model, dev, config=None) -> tu.KilnSessionError:
    return tu.expect_error(tu.run_kiln, str(model) if not isinstance(model, bytes) else model, dev,
                           None, None, config)


def check_runs(ctx, original, dev, config=None) -> tu.KilnRun:
    feeds = tu.make_feeds(original)
    names, want = tu.run_cpu(original, feeds)
    run = tu.run_kiln(str(ctx) if not isinstance(ctx, bytes) else ctx, dev, feeds, config=config)
    tu.assert_outputs_close(names, want, run.outputs)
    assert run.created_delta("partitions_compiled") == 0
    return run


# --------------------------------------------------------------------------
# where binaries are found
# --------------------------------------------------------------------------
def _point_at(ctx, rel):
    m = tu.load_model_proto(ctx)
    node = tu.ep_context_nodes(m)[0]
    tu.set_attr(node, "ep_cache_context", rel.encode())
    onnx.save(m, str(ctx))
    return node.name


def test_symlink_inside_the_folder_allowed(models, kiln_virtual, tmp_path):
    """A symlink (even a relative one, through a subfolder) that stays inside the model's
    folder is fine; one leading outside is a row of test_bad_inputs.py."""
    dev = kiln_virtual["host"]
    src = tmp_path / "add_mul_relu.onnx"
    shutil.copy(models["add_mul_relu"], src)
    inner = tmp_path / "inner"
    inner.mkdir()
    out = inner / "add_mul_relu_ctx.onnx"
    tu.generate_context(str(src), dev, embed=0, file_path=str(out))
    real = inner / "add_mul_relu_kiln.bin"
    (inner / "store").mkdir()
    shutil.move(str(real), str(inner / "store" / "actual.bin"))
    os.symlink("store/actual.bin", str(real))
    check_runs(out, str(src), dev)


def test_binary_in_subfolder(amr_ctx, kiln_virtual):
    ctx, binp, original = amr_ctx
    (ctx.parent / "bins").mkdir()
    shutil.move(str(binp), str(ctx.parent / "bins" / "renamed.bin"))
    _point_at(ctx, "bins/renamed.bin")
    run = check_runs(ctx, original, kiln_virtual["host"])
    assert run.created_delta("context_files_opened") == 1


# --------------------------------------------------------------------------
# which EPContext nodes kiln takes
# --------------------------------------------------------------------------
@pytest.mark.parametrize("source", ["kiln", "KILN", "kilnexecutionprovider", "KilnExecutionProvider"])
def test_source_spellings_are_claimed(amr_ctx, kiln_virtual, source):
    ctx, _, original = amr_ctx
    m = tu.load_model_proto(ctx)
    tu.set_attr(tu.ep_context_nodes(m)[0], "source", source.encode())
    onnx.save(m, str(ctx))
    run = check_runs(ctx, original, kiln_virtual["host"])
    assert run.created_delta("context_graphs_loaded") == 1


def _mixed_model(split_ctx_path):
    """split_ctx (3 kiln EPContext nodes + Atan + Asinh) plus an OtherEP EPContext node
    consuming Z and an ordinary Neg after it."""
    m = tu.load_model_proto(split_ctx_path)
    other = helper.make_node("EPContext", ["Z"], ["W_other"], name="other_ep_ctx", domain="com.microsoft",
                             source="OtherEP", embed_mode=1, main_context=1,
                             ep_cache_context=b"OTHER-EP-PAYLOAD", partition_name="other_graph")
    m.graph.node.append(other)
    m.graph.node.append(helper.make_node("Neg", ["W_other"], ["V"], name="after_other"))
    m.graph.value_info.append(helper.make_tensor_value_info("W_other", onnx.TensorProto.FLOAT, [2, 3, 4]))
    m.graph.output.append(helper.make_tensor_value_info("V", onnx.TensorProto.FLOAT, [2, 3, 4]))
    return m


def test_mixed_model_with_another_eps_node(split_ctx, kiln_virtual):
    ctx, _, original = split_ctx
    mixed = ctx.parent / "mixed.onnx"
    onnx.save(_mixed_model(ctx), str(mixed))
    err = load_error(mixed, kiln_virtual["host"])
    tu.assert_error(err, C.NotImplemented, "OtherEP", "other_ep_ctx")
    # the same model minus the other EP's node (and what hangs off it) runs
    m = _mixed_model(ctx)
    keep = [n for n in m.graph.node if n.name not in ("other_ep_ctx", "after_other")]
    del m.graph.node[:]
    m.graph.node.extend(keep)
    outs = [o for o in m.graph.output if o.name not in ("V",)]
    del m.graph.output[:]
    m.graph.output.extend(outs)
    onnx.save(m, str(mixed))
    run = check_runs(mixed, original, kiln_virtual["host"])
    assert run.created_delta("context_graphs_loaded") == 2
    assert sorted(op for _, op in run.nodes_on("CPUExecutionProvider")) == ["Asinh", "Atan"]


def test_kiln_nodes_mixed_with_ordinary_supported_nodes(split_ctx, kiln_virtual):
    """In a compiled model kiln takes its EPContext nodes only: an ordinary node it
    could run (here one added after compiling) stays with ORT, so loading a compiled
    model never compiles (README, "Loading compiled models")."""
    ctx, _, original = split_ctx
    m = tu.load_model_proto(ctx)
    m.graph.node.append(helper.make_node("Relu", ["Y"], ["Y_relu"], name="extra_relu"))
    m.graph.output.append(helper.make_tensor_value_info("Y_relu", onnx.TensorProto.FLOAT, [2, 3, 4]))
    onnx.save(m, str(ctx))
    feeds = tu.make_feeds(original)
    names, want = tu.run_cpu(original, feeds)
    run = tu.run_kiln(str(ctx), kiln_virtual["host"], feeds)
    got = dict(zip(run.output_names, run.outputs))
    for n, w in zip(names, want):
        np.testing.assert_allclose(got[n], w, rtol=tu.RTOL, atol=tu.ATOL)
    np.testing.assert_allclose(got["Y_relu"], np.maximum(want[names.index("Y")], 0), rtol=tu.RTOL, atol=tu.ATOL)
    assert run.created_delta("context_graphs_loaded") == 2
    assert run.created_delta("partitions_compiled") == 0
    assert ("extra_relu", "Relu") in run.nodes_on("CPUExecutionProvider")


# --------------------------------------------------------------------------
# each binary read once per session
# --------------------------------------------------------------------------
def test_binary_read_once_per_session(split_ctx, kiln_virtual):
    ctx, _, original = split_ctx
    # make every node a primary pointing at the same binary
    m = tu.load_model_proto(ctx)
    for n in tu.ep_context_nodes(m):
        tu.set_attr(n, "main_context", 1)
        tu.set_attr(n, "ep_cache_context", b"split_kiln.bin")
    onnx.save(m, str(ctx))
    for _ in range(2):  # and again in a second session: opened again, once
        run = check_runs(ctx, original, kiln_virtual["host"])
        assert run.created_delta("context_files_opened") == 1
        assert run.created_delta("context_graphs_loaded") == 2


def test_runs_repeatedly_and_with_other_inputs(split_ctx, kiln_virtual):
    ctx, _, original = split_ctx
    for seed in (1, 2, 3):
        feeds = tu.make_feeds(original, seed)
        names, want = tu.run_cpu(original, feeds)
        run = tu.run_kiln(str(ctx), kiln_virtual["host"], feeds, runs=3)
        tu.assert_outputs_close(names, want, run.outputs)
        assert run.run_delta("compute_calls") == 6


# --------------------------------------------------------------------------
# a binary that changes under a live session (README "Loading compiled models")
# --------------------------------------------------------------------------
def _weighty_ctx(folder, dev, seed=7):
    """A model with ~1 MB of weights compiled with embed 0: (ctx, bin, original)."""
    src = folder / "weighty.onnx"
    tu.make_weighty_model(str(src), seed=seed)
    tu.generate_context(str(src), dev, embed=0)
    return folder / "weighty_ctx.onnx", folder / "weighty_kiln.bin", src


def test_map_binary_replaced_by_rename_keeps_live_sessions(kiln_virtual, tmp_path):
    """The contract for the default (map): replace a binary atomically (write another
    file, rename it over the old one). A live session keeps the binary it mapped and
    its results; a new session reads the new file."""
    dev = kiln_virtual["host"]
    ctx, binp, src = _weighty_ctx(tmp_path, dev)
    feeds = tu.make_feeds(str(src))
    names, want = tu.run_cpu(str(src), feeds)
    so = tu.kiln_session_options(dev)
    sess = ort_session(str(ctx), so)
    tu.assert_outputs_close(names, want, sess.run(names, feeds))
    replacement = tmp_path / "replacement.bin"
    replacement.write_bytes(b"not a kiln context binary" * 100)
    os.replace(replacement, binp)
    tu.assert_outputs_close(names, want, sess.run(names, feeds))
    sess = None
    err = tu.expect_error(tu.run_kiln, str(ctx), dev)
    tu.assert_error(err, C.InvalidGraph, "weighty_kiln.bin", "not a kiln context binary")


def ort_session(path, so):
    import onnxruntime as ort

    return ort.InferenceSession(path, so, enable_fallback=0)


COPY_SCRIPT = textwrap.dedent(r"""
    import json, os, sys
    import numpy as np
    import onnxruntime as ort
    import onnxruntime_ep_kiln as kiln
    import kiln_testutil as tu

    ctx, binp, src, share = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
    name = tu.unique_name("kiln_copy")
    ort.register_execution_provider_library(name, kiln.get_library_path())
    dev = [d for d in tu.kiln_devices() if not kiln.is_virtual(d)][0]
    config = {"ep.share_ep_contexts": "1"} if share else {}
    feeds = tu.make_feeds(src)
    names, want = tu.run_cpu(src, feeds)
    before = tu.stats()
    sessions = [ort.InferenceSession(ctx, tu.kiln_session_options(dev, config, {"context_storage": "copy"}),
                                     enable_fallback=0) for _ in range(2)]
    opened = tu.stats()["context_files_opened"] - before["context_files_opened"]
    size = os.path.getsize(binp)
    res = {"opened": opened, "diffs": {}}

    def check(label):
        res["diffs"][label] = [max(float(np.max(np.abs(g - w))) for g, w in zip(s.run(names, feeds), want))
                               for s in sessions]

    check("fresh")
    with open(binp, "r+b") as f:  # truncated in place
        f.truncate(0)
    check("truncated")
    with open(binp, "r+b") as f:  # rewritten in place, same length, other bytes
        f.write(b"" * size)
    check("overwritten")
    sessions = None
    dev = None
    tu.safe_unregister(name)
    print("RESULT " + json.dumps(res))
""")


@pytest.mark.parametrize("share", [False, True], ids=["own", "share_ep_contexts"])
def test_copy_storage_is_independent_of_the_file(kiln_virtual, lib_path, tmp_path, share):
    """context_storage=copy: truncating the .bin, then rewriting it in place, changes
    nothing for live sessions. In a subprocess, so that a regression to mapping (whose
    truncation may SIGBUS) cannot take the test run down. With ep.share_ep_contexts=1,
    copy sessions do not share: each reads the file itself."""
    ctx, binp, src = _weighty_ctx(tmp_path, kiln_virtual["host"])
    size = binp.stat().st_size
    env = dict(os.environ)
    env[kiln.LIBRARY_ENV] = lib_path
    env["PYTHONPATH"] = os.pathsep.join([tu.PYTHON_DIR, tu.TESTS_DIR, env.get("PYTHONPATH", "")])
    p = subprocess.run([sys.executable, "-c", COPY_SCRIPT, str(ctx), str(binp), str(src), "1" if share else "0"],
                       env=env, capture_output=True, text=True, timeout=300)
    lines = [line for line in p.stdout.splitlines() if line.startswith("RESULT ")]
    assert p.returncode == 0 and lines, f"subprocess died ({p.returncode}):\n{p.stdout}\n{p.stderr}"
    res = json.loads(lines[-1][len("RESULT "):])
    assert res["opened"] == 2, res  # each session read the file; nothing shared, nothing mapped
    for label, diffs in res["diffs"].items():
        assert all(d <= 1e-5 for d in diffs), (label, diffs)
    assert binp.read_bytes() == b"\x7f" * size  # the file really was rewritten under the sessions
