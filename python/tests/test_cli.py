"""The ``kiln`` command (and the ``kiln-share-ctx-gen`` alias) from the wheel installed into
a fresh virtualenv (``installed`` fixture, ``wheel_env.py``), as subprocesses: outputs, exit
codes, files written, one-line errors, ``--help``, the progress display on a terminal."""
from __future__ import annotations

import json
import os
import shutil

import pytest

import kiln_testutil as tu
import wheel_env

MODELS = os.path.join(wheel_env.REPO_DIR, "models")
TARGETS = ("x86_64-avx512", "x86_64-avx2", "x86_64-generic")


@pytest.fixture
def work(tmp_path):
    """A folder holding copies of the repository's models."""
    for m in ("demo", "add_mul_relu", "share_a", "share_b", "share_c", "unsupported"):
        shutil.copy(os.path.join(MODELS, f"{m}.onnx"), tmp_path / f"{m}.onnx")
    return tmp_path


def kiln(installed, *args, **kwargs):
    return installed.run("kiln", *map(str, args), **kwargs)


def ok(p):
    assert p.returncode == 0, p.stdout + p.stderr
    assert "Traceback" not in p.stdout + p.stderr
    return p


def one_line_error(p, code, *needles):
    """The process failed with ``code`` and printed exactly one ``kiln: error:`` line, naming ``needles``."""
    assert p.returncode == code, (p.returncode, p.stdout, p.stderr)
    errors = [line for line in p.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1, p.stderr
    assert errors[0].startswith("kiln: error: ") or errors[0].startswith("kiln compile: error: ") \
        or errors[0].startswith("kiln bench: error: "), errors[0]
    assert "Traceback" not in p.stdout + p.stderr
    for n in needles:
        assert n in errors[0], (n, errors[0])
    return errors[0]


# --------------------------------------------------------------------------
# help and the command line itself
# --------------------------------------------------------------------------
@pytest.mark.parametrize("command", [[], ["compile"], ["inspect"], ["devices"], ["bench"]])
def test_help_for_each_command(installed, command):
    p = ok(kiln(installed, *command, "--help"))
    assert p.stdout.startswith("usage: kiln")
    for word in {(): ["compile", "inspect", "devices", "bench"], ("compile",): ["--embed", "--share", "--virtual",
                 "--prefix", "--option", "--force", "--target"], ("inspect",): ["--json", "CTX_MODEL"],
                 ("devices",): ["--json"], ("bench",): ["--shapes", "--runs"]}[tuple(command)]:
        assert word in p.stdout, word


def test_version(installed):
    assert ok(kiln(installed, "--version")).stdout.strip() == "kiln 0.1.0"


@pytest.mark.parametrize("args, needle", [
    ([], "required: COMMAND"),
    (["compile"], "MODEL"),
    (["frobnicate"], "invalid choice"),
    (["compile", "m.onnx", "--target", "arm64"], "invalid choice"),
    (["compile", "m.onnx", "--target", "x86_64-generic", "--virtual"], "not allowed with"),
    (["compile", "m.onnx", "--option", "claim"], "expected KEY=VALUE"),
])
def test_bad_command_lines_are_one_line_and_status_2(installed, args, needle):
    p = kiln(installed, *args)
    assert p.returncode == 2, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and needle in p.stderr, p.stderr
    assert "Traceback" not in p.stderr


# --------------------------------------------------------------------------
# compile
# --------------------------------------------------------------------------
def test_compile_one_model_writes_beside_it_with_plain_progress(installed, work):
    p = ok(kiln(installed, "compile", work / "demo.onnx"))
    assert sorted(os.listdir(work)) == sorted(["demo.onnx", "add_mul_relu.onnx", "share_a.onnx", "share_b.onnx",
                                               "share_c.onnx", "unsupported.onnx", "demo_ctx.onnx", "demo_kiln.bin"])
    # not a terminal: plain lines, no carriage returns
    assert f"compiling {work / 'demo.onnx'} (1/1)" in p.stderr and "\r" not in p.stderr
    assert f"compiled {work / 'demo.onnx'} -> {work / 'demo_ctx.onnx'} (1 kiln partition(s)" in p.stderr
    summary = p.stdout.splitlines()
    total = os.path.getsize(work / "demo_ctx.onnx") + os.path.getsize(work / "demo_kiln.bin")
    assert summary[0].startswith("kiln: 1 model(s) compiled for x86_64-")
    assert f"2 file(s) written, {total:,} bytes, weights shared 0 bytes" in summary[0]
    assert str(work / "demo_kiln.bin") in summary[2]


def test_compile_many_models_into_a_folder_embedded(installed, work):
    out = work / "out"
    p = ok(kiln(installed, "compile", work / "demo.onnx", work / "add_mul_relu.onnx", "-o", out, "--embed",
                "--option", "claim=all"))
    assert sorted(os.listdir(out)) == ["add_mul_relu_ctx.onnx", "demo_ctx.onnx"]
    assert "kiln: 2 model(s) compiled" in p.stdout and "2 file(s) written" in p.stdout


def test_compile_for_a_target_and_for_every_target(installed, work):
    p = ok(kiln(installed, "compile", work / "demo.onnx", "-o", work / "g", "--target", "x86_64-generic"))
    assert "compiled for x86_64-generic" in p.stdout
    out = work / "all"
    p = ok(kiln(installed, "compile", work / "demo.onnx", "-o", out, "--virtual"))
    assert sorted(os.listdir(out)) == sorted(TARGETS)
    host = TARGETS.index(tu.host_target())
    for i, t in enumerate(TARGETS):
        assert sorted(os.listdir(out / t)) == ["demo_ctx.onnx", "demo_kiln.bin"]
        shown = kiln(installed, "inspect", out / t / "demo_ctx.onnx", "--json")
        rep = json.loads(shown.stdout)
        assert rep["targets"] == [t]
        # A target above this CPU's (AVX-512 on an AVX2-only machine) is
        # reported as not runnable here, with exit status 3.
        runs_here = i >= host
        want = (0, True) if runs_here else (3, False)
        assert (shown.returncode, rep["can_run_here"]) == want, shown.stdout + shown.stderr
        if not runs_here:
            assert f"compiled for {t} but the device supports at most {TARGETS[host]}" in rep["kiln_reason"]
    assert "3 model(s) compiled for x86_64-avx512, x86_64-avx2, x86_64-generic" in p.stdout


def test_compile_share_and_the_old_alias(installed, work):
    out = work / "shared"
    models = [work / f"share_{c}.onnx" for c in "abc"]
    p = ok(kiln(installed, "compile", *models, "--share", "-o", out, "--option", "claim=all", "--prefix", "v1_"))
    assert sorted(os.listdir(out)) == ["share_a_ctx.onnx", "share_a_kiln.bin", "share_b_ctx.onnx",
                                       "share_c_ctx.onnx"]
    line = p.stdout.splitlines()[0]
    assert "4 file(s) written" in line
    shared = int(line.split("weights shared ")[1].split(" bytes")[0].replace(",", ""))
    assert shared > 0
    rep = json.loads(ok(kiln(installed, "inspect", out / "share_b_ctx.onnx", "--json")).stdout)
    assert [n["partition_name"].split("_Kiln")[0] for n in rep["nodes"]] == ["v1_share_b"]
    # kiln-share-ctx-gen is still there and does the same
    out2 = work / "shared2"
    p = installed.run("kiln-share-ctx-gen", *map(str, models), "--output-dir", str(out2), "--option", "claim=all")
    assert p.returncode == 0, p.stderr
    assert sorted(os.listdir(out2)) == sorted(os.listdir(out))


def test_compile_refuses_to_overwrite_unless_forced(installed, work):
    ok(kiln(installed, "compile", work / "demo.onnx"))
    before = (work / "demo_kiln.bin").read_bytes()
    one_line_error(kiln(installed, "compile", work / "demo.onnx"), 1, "already exists", "--force")
    assert (work / "demo_kiln.bin").read_bytes() == before
    ok(kiln(installed, "compile", work / "demo.onnx", "--force"))


@pytest.mark.parametrize("case", ["missing", "not-onnx", "nothing-to-compile", "bad-option", "bad-option-key",
                                  "folder-missing", "share-embed"])
def test_compile_user_errors(installed, work, case):
    (work / "text.onnx").write_text("hello, I am not a model\n")
    args, code, needles = {
        "missing": ([work / "nope.onnx"], 1, ["model", "nope.onnx", "does not exist"]),
        "not-onnx": ([work / "text.onnx"], 1, ["text.onnx", "is not an ONNX model"]),
        "nothing-to-compile": ([work / "unsupported.onnx"], 1, ["kiln compiled nothing from",
                                                                  "1 x Atan: kiln does not implement Atan"]),
        "bad-option": ([work / "demo.onnx", "--option", "shape_cache=0"], 2, ["'shape_cache'", "1 to 1024"]),
        "bad-option-key": ([work / "demo.onnx", "--option", "speed=max"], 2, ["unknown kiln option 'speed'"]),
        "folder-missing": ([work / "demo.onnx", "-o", work / "no" / "x_ctx.onnx"], 1, ["does not exist"]),
        "share-embed": ([work / "demo.onnx", "--share", "--embed", "-o", work / "s"], 2, ["embed"]),
    }[case]
    before = sorted(os.listdir(work))
    one_line_error(kiln(installed, "compile", *args), code, *needles)
    assert sorted(os.listdir(work)) == before, "a failed compile left files"


def test_compile_progress_on_a_terminal(installed, work):
    """stderr on a pseudo-terminal: one updating bar line per model, ending with a full bar."""
    import pty
    import subprocess

    master, slave = pty.openpty()
    try:
        p = subprocess.Popen([installed.bin("kiln"), "compile", str(work / "demo.onnx"), str(work / "add_mul_relu.onnx"),
                              "--option", "claim=all"], cwd=installed.workdir, env=installed.env(),
                             stdout=subprocess.PIPE, stderr=slave)
        os.close(slave)
        chunks = []
        while True:
            try:
                data = os.read(master, 4096)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
        assert p.wait(timeout=300) == 0
    finally:
        os.close(master)
    err = b"".join(chunks).decode()
    done = [line for line in err.replace("\r\n", "\n").split("\n") if line]
    assert any("[1/2]" in line and "demo.onnx" in line and "#" * 24 in line for line in done), err
    assert any("[2/2]" in line and "add_mul_relu.onnx" in line and "#" * 24 in line for line in done), err
    assert "compiling " not in err, "plain lines are for non-terminals"
    assert "kiln: 2 model(s) compiled" in p.stdout.read().decode()


# --------------------------------------------------------------------------
# inspect
# --------------------------------------------------------------------------
def test_inspect_readable_and_json(installed, work):
    ok(kiln(installed, "compile", work / "demo.onnx"))
    p = ok(kiln(installed, "inspect", work / "demo_ctx.onnx"))
    text = p.stdout
    for needle in ["1 kiln EPContext node(s)", "ep_cache_context demo_kiln.bin", f"format {tu.CONTEXT_FORMAT}",
                   "OK; matches the node's stamp", "kiln says: optimal", "ONNX Runtime's compatibility check: optimal",
                   "runs here: yes", "weight(s) of 527,872 bytes"]:
        assert needle in text, (needle, text)
    rep = json.loads(ok(kiln(installed, "inspect", work / "demo_ctx.onnx", "--json")).stdout)
    assert rep["can_run_here"] is True and rep["checksums_ok"] is True
    assert rep["binaries"][0]["info"]["checksum_ok"] is True
    assert rep["binaries"][0]["info"]["file_bytes"] == os.path.getsize(work / "demo_kiln.bin")
    assert rep["nodes"][0]["source"] == "KilnExecutionProvider"


def test_inspect_damaged_binary_exits_3(installed, work):
    ok(kiln(installed, "compile", work / "demo.onnx"))
    data = bytearray((work / "demo_kiln.bin").read_bytes())
    data[len(data) // 2] ^= 1
    (work / "demo_kiln.bin").write_bytes(bytes(data))
    p = kiln(installed, "inspect", work / "demo_ctx.onnx")
    assert p.returncode == 3, p.stdout + p.stderr
    assert "MISMATCH" in p.stdout and "cannot run here:" in p.stdout and "checksum mismatch" in p.stdout


def onnx_only_path(tmp_path) -> str:
    """A folder holding the onnx package and its dependencies, not onnxruntime."""
    import sysconfig

    site = sysconfig.get_paths()["purelib"]
    folder = tmp_path / "onnx_only"
    folder.mkdir()
    for name in ("onnx", "numpy", "numpy.libs", "google", "ml_dtypes", "typing_extensions.py"):
        if os.path.exists(os.path.join(site, name)):
            os.symlink(os.path.join(site, name), folder / name)
    return str(folder)


def test_inspect_works_without_onnxruntime(installed, work, tmp_path):
    """inspect reads the model with onnx and the binary with kiln's library: without ONNX
    Runtime it still reports and checks everything, and says ORT's answer is missing."""
    ok(kiln(installed, "compile", work / "demo.onnx"))
    p = ok(kiln(installed, "inspect", work / "demo_ctx.onnx", no_ort=True,
                env={"PYTHONPATH": onnx_only_path(tmp_path)}))
    for needle in ("OK; matches the node's stamp", "kiln says: optimal", "runs here: yes",
                   "ONNX Runtime's compatibility check: None (onnxruntime_ep_kiln needs ONNX Runtime"):
        assert needle in p.stdout, (needle, p.stdout)


def test_without_onnx_and_onnxruntime(installed, work):
    """--help needs neither; inspect says how to get onnx, devices how to get ONNX Runtime."""
    ok(kiln(installed, "compile", work / "demo.onnx"))
    assert ok(kiln(installed, "--help", no_ort=True)).stdout.startswith("usage: kiln")
    one_line_error(kiln(installed, "inspect", work / "demo_ctx.onnx", no_ort=True), 1, "onnx", "pip install")


@pytest.mark.parametrize("case", ["missing", "not-onnx"])
def test_inspect_user_errors(installed, work, case):
    (work / "text.onnx").write_bytes(b"\xff\xfe not protobuf")
    target, needles = {"missing": (work / "nope_ctx.onnx", ["does not exist"]),
                       "not-onnx": (work / "text.onnx", ["is not an ONNX model"])}[case]
    one_line_error(kiln(installed, "inspect", target), 1, *needles)


def test_inspect_of_an_uncompiled_model_says_so(installed, work):
    p = kiln(installed, "inspect", work / "demo.onnx")
    assert p.returncode == 3
    assert "no kiln EPContext node" in p.stdout


# --------------------------------------------------------------------------
# devices
# --------------------------------------------------------------------------
def test_devices(installed):
    p = ok(kiln(installed, "devices"))
    text = p.stdout
    assert "devices (3):" in text
    assert text.count("] host ") == 1 and text.count("] virtual ") == 2
    for t in TARGETS:
        assert f"target={t}" in text
    assert "this CPU: sse2" in text and "best kiln target x86_64-" in text
    for key in ("target", "disabled_ops", "claim", "force_ops", "context_storage", "shape_cache", "winograd"):
        assert f"  {key} " in text
    assert "cost, all" in text and "map, copy" in text and "on, off" in text
    d = json.loads(ok(kiln(installed, "devices", "--json")).stdout)
    assert d["library"].startswith(installed.site)
    assert sorted(x["target"] for x in d["devices"]) == sorted(TARGETS)
    assert d["options"]["claim"] == "cost, all"


def test_devices_respects_kiln_max_target(installed):
    p = ok(kiln(installed, "devices", env={"KILN_MAX_TARGET": "x86_64-generic"}))
    assert "best kiln target x86_64-generic (KILN_MAX_TARGET=x86_64-generic)" in p.stdout


def test_devices_without_onnxruntime_is_one_line(installed):
    one_line_error(kiln(installed, "devices", no_ort=True), 1, "onnxruntime-ep-kiln[ort]")


def test_missing_library_is_one_line(installed, tmp_path):
    one_line_error(kiln(installed, "--library", tmp_path / "none.so", "devices"), 1, "none.so", "does not exist")


# --------------------------------------------------------------------------
# bench
# --------------------------------------------------------------------------
def test_bench_table(installed, work):
    p = ok(kiln(installed, "bench", work / "demo.onnx", "--runs", "3"))
    text = p.stdout
    for row in ("compile (compile API, kiln)", "load _ctx.onnx (session creation)", "run, kiln (median)",
                "run, CPU EP (median)", "kiln vs CPU EP"):
        assert row in text, text
    assert "inputs x 1x32x128, 3 run(s) each" in text
    assert sorted(os.listdir(work)) == sorted(["demo.onnx", "add_mul_relu.onnx", "share_a.onnx", "share_b.onnx",
                                               "share_c.onnx", "unsupported.onnx"]), "bench writes nothing beside"


@pytest.fixture
def symbolic_model(work):
    """y = Relu(x @ W) with x [batch, seq, 16]: symbolic dims for --shapes."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((16, 16)).astype(np.float32), "W")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"]), helper.make_node("Relu", ["h"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 16])], [w])
    path = work / "symbolic.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
    return path


def test_bench_shapes_for_symbolic_dims(installed, symbolic_model):
    p = ok(kiln(installed, "bench", symbolic_model, "--shapes", "x=2x5x16", "--runs", "2", "--option", "claim=all"))
    assert "inputs x 2x5x16" in p.stdout
    p = ok(kiln(installed, "bench", symbolic_model, "--runs", "2", "--option", "claim=all"))
    assert "inputs x 1x1x16" in p.stdout, "unknown dims default to 1"


@pytest.mark.parametrize("args, code, needles", [
    (["--shapes", "x=2xAx16"], 2, ["bad shape 'x=2xAx16'"]),
    (["--shapes", "z=1x1x16"], 2, ["z", "inputs: x"]),
    (["--shapes", "x=1x16"], 2, ["rank 2", "3"]),
    (["--runs", "0"], 2, ["--runs"]),
])
def test_bench_user_errors(installed, symbolic_model, args, code, needles):
    one_line_error(kiln(installed, "bench", symbolic_model, "--option", "claim=all", *args), code, *needles)


def test_bench_missing_model(installed, tmp_path):
    one_line_error(kiln(installed, "bench", tmp_path / "nope.onnx"), 1, "does not exist")
