"""Writing compiled models when things go wrong, through ONNX Runtime's Python API.

* kiln never replaces a context binary that belongs to another compiled model (two models
  with the same file stem compiled into one folder, a foreign file under the binary's
  name), and recompiling a model in place still replaces its own binary (issue #10, 3);
* when ORT fails to write the ``_ctx.onnx`` after kiln compiled (output path is a folder,
  an existing read-only ``_ctx.onnx``, a full file system) or kiln cannot write at all
  (a read-only folder, a file system too small for the binary): a clear error, no
  ``_ctx.onnx``, ``.bin`` or temporary file left, an older binary intact, and the source
  model untouched (issue #10, 4 and "Faults");
* with ``ep.share_ep_contexts=1``, a binary recompiled in place while a sharing session
  lives is loaded afresh by new sharing sessions, and the live session keeps its weights
  (issue #10, 9).

Read-only and full folders are tmpfs mounts (``mount -t tmpfs -o ro`` / ``-o size=``), and a
read-only ``_ctx.onnx`` is a read-only bind mount of the file: the tests run as root, for
whom file modes do not make anything read-only. Where mounting is impossible (no root, no
CAP_SYS_ADMIN) those tests are skipped with that reason.
"""
from __future__ import annotations

import contextlib
import gc
import hashlib
import os
import shutil
import subprocess
import uuid

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.capi import onnxruntime_pybind11_state as C

import kiln_testutil as tu

ROUTES = ["compile", "session"]


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------
def make_model(path, n=64, seed=0, cpu_tail=False) -> str:
    """Y = Relu(X * W) with W [n] from ``seed``, all on kiln; with ``cpu_tail``, then
    Einsum(., E) (an op kiln does not run) on ORT's CPU EP, so the compiled model keeps E ([n] floats)
    as initializer."""
    w = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
    nodes = [helper.make_node("Mul", ["X", "W"], ["m"], name="mul"),
             helper.make_node("Relu", ["m"], ["r"], name="relu")]
    inits = [numpy_helper.from_array(w, "W")]
    out = "r"
    if cpu_tail:
        nodes.append(helper.make_node("Einsum", ["r", "E"], ["Y"], name="cpu_einsum", equation="i,i->i"))
        inits.append(numpy_helper.from_array(np.full(n, 0.25, np.float32), "E"))
        out = "Y"
    vi = lambda name: helper.make_tensor_value_info(name, TensorProto.FLOAT, [n])  # noqa: E731
    graph = helper.make_graph(nodes, "g", [vi("X")], [vi(out)], initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    import onnx
    onnx.save(model, str(path))
    return str(path)


def compile_to(route, src, dev, out):
    """Embed mode 0 into ``out`` by the compile API or the session-option route."""
    if route == "compile":
        tu.compile_model(str(src), dev, embed=False, output=str(out))
    else:
        tu.generate_context(str(src), dev, embed=0, file_path=str(out))


def check_runs_like(ctx, original, dev, seed=0):
    """The compiled model, loaded on kiln, matches the original on the CPU EP."""
    feeds = tu.make_feeds(str(original), seed)
    names, expected = tu.run_cpu(str(original), feeds)
    run = tu.run_kiln(str(ctx), dev, feeds)
    tu.assert_outputs_close(names, expected, run.outputs)
    assert run.created_delta("partitions_compiled") == 0, "a compiled model must load without compiling"


def bin_name_of(ctx) -> str:
    (node,) = [n for n in tu.ep_context_nodes(ctx) if tu.attrs_of(n).get("main_context", 1) == 1]
    return tu.attrs_of(node)["ep_cache_context"].decode()


def context_models(bin_path) -> list:
    """Metadata field 5 of a context binary: the compiled models it was written for."""
    data = open(bin_path, "rb").read()
    h = tu.parse_ctx_header(data)
    meta = data[h.metadata_offset:h.metadata_offset + h.metadata_length]
    return [v.decode() for f, v in tu.proto_fields(meta) if f == 5]


def digest(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def snapshot(folder) -> dict:
    """{file name: sha256} of a folder (recursively), to prove nothing changed."""
    out = {}
    for root, _, files in os.walk(folder):
        for f in files:
            p = os.path.join(root, f)
            out[os.path.relpath(p, folder)] = digest(p)
    return out


def no_temp_files(folder):
    left = [f for f in os.listdir(folder) if ".tmp" in f or f.startswith(".")]
    assert left == [], f"temporary files left behind: {left}"


@contextlib.contextmanager
def mounted(target, *args):
    """``mount *args target`` for the block; skips the test if this process cannot mount."""
    r = subprocess.run(["mount", *args, str(target)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount ({' '.join(args)}) here: {r.stderr.strip() or r.returncode}; "
                    "this test needs root with CAP_SYS_ADMIN (as in CI)")
    try:
        yield target
    finally:
        gc.collect()
        subprocess.run(["umount", str(target)], check=True)


# --------------------------------------------------------------------------
# defect 3: never overwrite another model's binary
# --------------------------------------------------------------------------
@pytest.mark.parametrize("route", ROUTES)
def test_two_models_with_the_same_stem_in_one_folder_both_load(kiln_dev, tmp_path, route):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    (tmp_path / "out").mkdir()
    a = make_model(tmp_path / "a" / "model.onnx", seed=1)
    b = make_model(tmp_path / "b" / "model.onnx", seed=2)
    out = tmp_path / "out"
    compile_to(route, a, kiln_dev, out / "first_ctx.onnx")
    first_bin = (out / "model_kiln.bin").read_bytes()
    compile_to(route, b, kiln_dev, out / "second_ctx.onnx")
    assert tu.files_in(out) == ["first_ctx.onnx", "model.2_kiln.bin", "model_kiln.bin", "second_ctx.onnx"]
    assert (out / "model_kiln.bin").read_bytes() == first_bin, "the first model's binary was not touched"
    assert bin_name_of(out / "first_ctx.onnx") == "model_kiln.bin"
    assert bin_name_of(out / "second_ctx.onnx") == "model.2_kiln.bin"
    assert context_models(out / "model_kiln.bin") == ["first_ctx.onnx"]
    assert context_models(out / "model.2_kiln.bin") == ["second_ctx.onnx"]
    check_runs_like(out / "first_ctx.onnx", a, kiln_dev)
    check_runs_like(out / "second_ctx.onnx", b, kiln_dev)
    # recompiling either in place keeps its own name and replaces only its own binary
    if route == "session":
        (out / "second_ctx.onnx").unlink()
    make_model(b, seed=3)
    compile_to(route, b, kiln_dev, out / "second_ctx.onnx")
    assert tu.files_in(out) == ["first_ctx.onnx", "model.2_kiln.bin", "model_kiln.bin", "second_ctx.onnx"]
    assert (out / "model_kiln.bin").read_bytes() == first_bin
    check_runs_like(out / "first_ctx.onnx", a, kiln_dev)
    check_runs_like(out / "second_ctx.onnx", b, kiln_dev)
    no_temp_files(out)


@pytest.mark.parametrize("route", ROUTES)
def test_recompiling_in_place_replaces_the_models_own_binary(kiln_dev, tmp_path, route):
    src = make_model(tmp_path / "m.onnx", seed=1)
    ctx = tmp_path / "m_ctx.onnx"
    compile_to(route, src, kiln_dev, ctx)
    old = (tmp_path / "m_kiln.bin").read_bytes()
    make_model(src, seed=2)   # new weights, same model
    if route == "session":
        ctx.unlink()          # this route refuses to replace an existing _ctx.onnx
    compile_to(route, src, kiln_dev, ctx)
    assert tu.files_in(tmp_path) == ["m.onnx", "m_ctx.onnx", "m_kiln.bin"]
    assert (tmp_path / "m_kiln.bin").read_bytes() != old, "the binary holds the new weights"
    check_runs_like(ctx, src, kiln_dev)


def test_a_model_whose_binary_another_compile_replaced_is_refused(kiln_dev, tmp_path):
    """The compiled model records its binary's checksum (notes); a copy of an old _ctx.onnx
    whose binary was recompiled since fails to load clearly instead of running weights it
    was not compiled with."""
    src = make_model(tmp_path / "m.onnx", seed=1)
    ctx = tmp_path / "m_ctx.onnx"
    tu.compile_model(src, kiln_dev, embed=False, output=str(ctx))
    (node,) = tu.ep_context_nodes(ctx)
    checksum = int.from_bytes(tu.parse_ctx_header((tmp_path / "m_kiln.bin").read_bytes()).checksum, "little")
    assert tu.attrs_of(node)["notes"].endswith(f"; binary checksum {checksum:032x}".encode())
    shutil.copy(ctx, tmp_path / "copy_ctx.onnx")
    make_model(src, seed=2)
    tu.compile_model(src, kiln_dev, embed=False, output=str(ctx))
    check_runs_like(ctx, src, kiln_dev)
    err = tu.expect_error(tu.run_kiln, str(tmp_path / "copy_ctx.onnx"), kiln_dev, tu.make_feeds(src))
    tu.assert_error(err, C.InvalidGraph, "m_kiln.bin", "another compile replaced the file")


@pytest.mark.parametrize("foreign", ["user file", "folder", "other model's binary"])
def test_a_foreign_file_under_the_binary_name_is_never_overwritten(kiln_dev, tmp_path, foreign):
    src = make_model(tmp_path / "m.onnx", seed=1)
    target = tmp_path / "m_kiln.bin"
    if foreign == "user file":
        target.write_bytes(b"somebody's data")
    elif foreign == "folder":
        target.mkdir()
        (target / "inside").write_bytes(b"x")
    else:   # a kiln binary written for another compiled model, which still uses it
        tu.compile_model(src, kiln_dev, embed=False, output=str(tmp_path / "other_ctx.onnx"))
    before = snapshot(tmp_path)
    tu.compile_model(src, kiln_dev, embed=False, output=str(tmp_path / "m_ctx.onnx"))
    after = snapshot(tmp_path)
    assert {k: v for k, v in after.items() if k in before} == before, "no existing file changed"
    assert sorted(set(after) - set(before)) == ["m.2_kiln.bin", "m_ctx.onnx"]
    assert bin_name_of(tmp_path / "m_ctx.onnx") == "m.2_kiln.bin"
    check_runs_like(tmp_path / "m_ctx.onnx", src, kiln_dev)
    if foreign == "other model's binary":
        check_runs_like(tmp_path / "other_ctx.onnx", src, kiln_dev)


def test_a_binary_of_a_sharing_group_is_not_replaced_by_one_member_alone(kiln_dev, tmp_path):
    """m0_kiln.bin serves m0_ctx and m1_ctx; compiling m0 alone into the folder must not
    replace it (m1_ctx would lose its graphs)."""
    src = tmp_path / "src"
    src.mkdir()
    models = [tu.make_share_model(str(src / f"m{i}.onnx"), i, batch=1, rows=8, cols=8)["path"] for i in range(2)]
    out = tmp_path / "out"
    out.mkdir()
    for i, m in enumerate(models):
        cfg = {"ep.share_ep_contexts": "1"}
        if i == 1:
            cfg["ep.stop_share_ep_contexts"] = "1"
        tu.compile_model(m, kiln_dev, embed=False, output=str(out / f"m{i}_ctx.onnx"), config=cfg)
    shared = (out / "m0_kiln.bin").read_bytes()
    assert context_models(out / "m0_kiln.bin") == ["m0_ctx.onnx", "m1_ctx.onnx"]
    tu.compile_model(models[0], kiln_dev, embed=False, output=str(out / "m0_ctx.onnx"))
    assert (out / "m0_kiln.bin").read_bytes() == shared
    assert bin_name_of(out / "m0_ctx.onnx") == "m0.2_kiln.bin"
    check_runs_like(out / "m0_ctx.onnx", models[0], kiln_dev)
    check_runs_like(out / "m1_ctx.onnx", models[1], kiln_dev)


def compile_group(models, dev, out):
    for i, m in enumerate(models):
        cfg = {"ep.share_ep_contexts": "1"}
        if i == len(models) - 1:
            cfg["ep.stop_share_ep_contexts"] = "1"
        stem = os.path.splitext(os.path.basename(m))[0]
        tu.compile_model(m, dev, embed=False, output=str(out / f"{stem}_ctx.onnx"), config=cfg)


def test_a_sharing_group_recompiled_in_place_keeps_n_plus_one_files(kiln_dev, tmp_path):
    """The group's binary is still named by the other members' _ctx.onnx when its first
    member is recompiled, so the group moves to a new name; once every member names the
    new binary, the old one (written for these models only) is removed."""
    src = tmp_path / "src"
    src.mkdir()
    out = tmp_path / "out"
    out.mkdir()
    models = [tu.make_share_model(str(src / f"m{i}.onnx"), i, batch=1, rows=8, cols=8)["path"] for i in range(3)]
    compile_group(models, kiln_dev, out)
    assert tu.files_in(out) == ["m0_ctx.onnx", "m0_kiln.bin", "m1_ctx.onnx", "m2_ctx.onnx"]
    for round_ in range(2):
        compile_group(models, kiln_dev, out)
        bins = [f for f in tu.files_in(out) if f.endswith("_kiln.bin")]
        assert len(bins) == 1, f"round {round_}: N+1 files, got {tu.files_in(out)}"
        assert all(bin_name_of(out / f"m{i}_ctx.onnx") == bins[0] for i in range(1)), bins
        assert context_models(out / bins[0]) == ["m0_ctx.onnx", "m1_ctx.onnx", "m2_ctx.onnx"]
        for i, m in enumerate(models):
            check_runs_like(out / f"m{i}_ctx.onnx", m, kiln_dev)
    no_temp_files(out)


# --------------------------------------------------------------------------
# defect 4 and faults: ORT (or kiln) cannot write
# --------------------------------------------------------------------------
def test_session_route_binary_is_in_place_while_the_session_lives(kiln_dev, tmp_path):
    """kiln stages the binary until ORT has written the _ctx.onnx; ORT 1.31.1 calls
    OnSessionInitializationEnd after that write, so on this route the binary is in place
    (and the compiled model loads) while the generating session is still alive."""
    src = make_model(tmp_path / "m.onnx", seed=1)
    ctx = tmp_path / "m_ctx.onnx"
    before = tu.stats()["sessions_initialized"]
    so = tu.kiln_session_options(kiln_dev, {"ep.context_enable": "1", "ep.context_embed_mode": "0",
                                           "ep.context_file_path": str(ctx)})
    generating = ort.InferenceSession(src, so, enable_fallback=0)
    assert tu.stats()["sessions_initialized"] == before + 1, "ORT called OnSessionInitializationEnd"
    assert tu.files_in(tmp_path) == ["m.onnx", "m_ctx.onnx", "m_kiln.bin"]
    check_runs_like(ctx, src, kiln_dev)
    del generating
    gc.collect()
    assert tu.files_in(tmp_path) == ["m.onnx", "m_ctx.onnx", "m_kiln.bin"]


def test_compile_api_calls_the_hook_after_writing_the_model(kiln_dev, tmp_path):
    """The compile API's session also ends its initialization after ORT wrote the model
    (to a file, or to memory: a binary beside ep.context_file_path is kept)."""
    src = make_model(tmp_path / "m.onnx", seed=1)
    before = tu.stats()["sessions_initialized"]
    tu.compile_model(src, kiln_dev, embed=False, output=str(tmp_path / "m_ctx.onnx"))
    assert tu.stats()["sessions_initialized"] == before + 1
    sub = tmp_path / "mem"
    sub.mkdir()
    data = tu.compile_model(src, kiln_dev, embed=False, to="bytes",
                            config={"ep.context_file_path": str(sub / "y_ctx.onnx")})
    assert tu.stats()["sessions_initialized"] == before + 2
    assert tu.files_in(sub) == ["m_kiln.bin"]
    feeds = tu.make_feeds(src)
    names, expected = tu.run_cpu(src, feeds)
    run = tu.run_kiln(data, kiln_dev, feeds, config={"ep.context_file_path": str(sub / "y_ctx.onnx")})
    tu.assert_outputs_close(names, expected, run.outputs)


def expect_compile_error(route, src, dev, out):
    with pytest.raises(tu.KilnSessionError) as info:
        compile_to(route, src, dev, out)
    return info.value


@pytest.mark.parametrize("route", ROUTES)
def test_output_path_is_a_folder(kiln_dev, tmp_path, route):
    src = make_model(tmp_path / "m.onnx")
    (tmp_path / "m_ctx.onnx").mkdir()
    before = snapshot(tmp_path)
    err = expect_compile_error(route, src, kiln_dev, tmp_path / "m_ctx.onnx")
    if route == "compile":
        tu.assert_error(err, C.InvalidArgument, "m_ctx.onnx", "is a folder")
    else:   # ORT refuses an existing path on this route before kiln compiles
        tu.assert_error(err, C.Fail, "m_ctx.onnx", "exists already")
    assert snapshot(tmp_path) == before and tu.files_in(tmp_path) == ["m.onnx", "m_ctx.onnx"]


@pytest.mark.parametrize("route", ROUTES)
def test_existing_read_only_ctx_keeps_the_old_binary(kiln_dev, tmp_path, route):
    """ORT cannot replace the compiled model: the new binary must not replace the old one,
    which the old (still valid) compiled model names."""
    src = make_model(tmp_path / "m.onnx", seed=1)
    ctx = tmp_path / "m_ctx.onnx"
    tu.compile_model(src, kiln_dev, embed=False, output=str(ctx))
    old_src = tmp_path / "old.onnx"
    shutil.copy(src, old_src)
    make_model(src, seed=2)
    before = snapshot(tmp_path)
    with mounted(ctx, "--bind", "-o", "ro", str(ctx)):
        err = expect_compile_error(route, src, kiln_dev, ctx)
        if route == "compile":
            tu.assert_error(err, RuntimeError, "m_ctx.onnx", "Read-only file system")
        else:   # this route refuses any existing output before kiln compiles
            tu.assert_error(err, C.Fail, "m_ctx.onnx", "exists already")
    assert snapshot(tmp_path) == before, "nothing changed: old model, old binary, source"
    no_temp_files(tmp_path)
    check_runs_like(ctx, old_src, kiln_dev)


@pytest.mark.parametrize("route", ROUTES)
def test_read_only_output_folder(kiln_dev, tmp_path, route):
    src = make_model(tmp_path / "m.onnx")
    src_digest = digest(src)
    out = tmp_path / "ro"
    out.mkdir()
    with mounted(out, "-t", "tmpfs", "-o", "ro", "tmpfs"):
        err = expect_compile_error(route, src, kiln_dev, out / "m_ctx.onnx")
        tu.assert_error(err, C.Fail, "cannot write context binary", "Read-only file system")
        assert tu.files_in(out) == []
    assert digest(src) == src_digest and tu.files_in(tmp_path) == ["m.onnx", "ro"]


@pytest.mark.parametrize("route", ROUTES)
def test_full_file_system_when_ort_writes_the_model(kiln_dev, tmp_path, route):
    """64 KiB: kiln's binary (~44 KB) fits, ORT's model with a 44 KB initializer does not.
    ORT leaves a partial _ctx.onnx; kiln removes it with the binary."""
    src = make_model(tmp_path / "m.onnx", n=11000, cpu_tail=True)
    src_digest = digest(src)
    out = tmp_path / "full"
    out.mkdir()
    with mounted(out, "-t", "tmpfs", "-o", "size=64k", "tmpfs"):
        err = expect_compile_error(route, src, kiln_dev, out / "m_ctx.onnx")
        tu.assert_error(err, C.InvalidProtobuf, "m_ctx.onnx")
        assert tu.files_in(out) == [], "no partial _ctx.onnx, binary or temporary file"
    assert digest(src) == src_digest


@pytest.mark.parametrize("route", ROUTES)
def test_full_file_system_when_kiln_writes_the_binary(kiln_dev, tmp_path, route):
    src = make_model(tmp_path / "m.onnx", n=20000)
    src_digest = digest(src)
    out = tmp_path / "full"
    out.mkdir()
    with mounted(out, "-t", "tmpfs", "-o", "size=64k", "tmpfs"):
        err = expect_compile_error(route, src, kiln_dev, out / "m_ctx.onnx")
        tu.assert_error(err, C.Fail, "writing kiln context binary", "No space left on device", "m_kiln.bin")
        assert tu.files_in(out) == []
    assert digest(src) == src_digest


# --------------------------------------------------------------------------
# defect 9: the shared-binary cache follows the file's contents
# --------------------------------------------------------------------------
def sharing_session(ctx, dev):
    so = tu.kiln_session_options(dev, {"ep.share_ep_contexts": "1"})
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    return ort.InferenceSession(str(ctx), so, enable_fallback=0)


def cpu_outputs(model, feeds):
    return tu.run_cpu(str(model), feeds)[1]


def test_sharing_sessions_load_a_binary_recompiled_in_place(kiln_dev, tmp_path):
    src = make_model(tmp_path / "m.onnx", seed=1)
    ctx = tmp_path / "m_ctx.onnx"
    tu.compile_model(src, kiln_dev, embed=False, output=str(ctx))
    feeds = tu.make_feeds(src)
    old_expected = cpu_outputs(src, feeds)
    live = sharing_session(ctx, kiln_dev)
    tu.assert_outputs_close(["r"], old_expected, live.run(None, feeds))
    make_model(src, seed=2)
    tu.compile_model(src, kiln_dev, embed=False, output=str(ctx))   # in place, while `live` maps the old one
    new_expected = cpu_outputs(src, feeds)
    assert not np.allclose(old_expected[0], new_expected[0])
    opened = tu.stats()["context_files_opened"]
    fresh = sharing_session(ctx, kiln_dev)
    assert tu.stats()["context_files_opened"] == opened + 1, "the new file is loaded, not the cached old one"
    tu.assert_outputs_close(["r"], new_expected, fresh.run(None, feeds))
    # a live session keeps the mapping (and the weights) it has
    tu.assert_outputs_close(["r"], old_expected, live.run(None, feeds))
    # a third sharing session takes the new binary from the workspace
    shared = tu.stats()["context_files_shared"]
    third = sharing_session(ctx, kiln_dev)
    assert tu.stats()["context_files_shared"] == shared + 1
    tu.assert_outputs_close(["r"], new_expected, third.run(None, feeds))
    del live, fresh, third
    gc.collect()
