"""kiln-share-ctx-gen (``python -m onnxruntime_ep_kiln.share``) end to end, in subprocesses,
and its Python API in this process."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys

import pytest

import kiln_testutil as tu
from onnxruntime_ep_kiln import share

SHARE = "ep.share_ep_contexts"


def run_tool(*args, lib=None, env_extra=None):
    """The tool with ``--option claim=all`` added: make_share_model's models are
    elementwise, which kiln's default cost rule leaves to ORT."""
    if args:
        args = (*args, "--option", "claim=all")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([tu.PYTHON_DIR, os.environ.get("PYTHONPATH", "")]))
    if lib:
        env["KILN_EP_LIBRARY"] = lib
    env.pop("KILN_MAX_TARGET", None)
    env.update(env_extra or {})
    return subprocess.run([sys.executable, "-m", "onnxruntime_ep_kiln.share", *map(str, args)],
                          env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    src = tmp_path_factory.mktemp("tool_src")
    return [tu.make_share_model(str(src / f"{n}.onnx"), i) for i, n in enumerate(["alpha", "beta", "gamma"])]


def one_line_error(proc, *needles):
    assert proc.returncode != 0, proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("kiln-share-ctx-gen: error: "), lines[0]
    for n in needles:
        assert n in lines[0], lines[0]
    return lines[0]


def test_console_script_is_declared():
    import tomllib

    with open(os.path.join(tu.PYTHON_DIR, "pyproject.toml"), "rb") as f:
        scripts = tomllib.load(f)["project"]["scripts"]
    assert scripts["kiln-share-ctx-gen"] == "onnxruntime_ep_kiln.share:main"


def test_help(lib_path):
    proc = run_tool("--help", lib=lib_path)
    assert proc.returncode == 0
    for opt in ("--output-dir", "--embed-mode", "--target", "--device-target", "--option", "--library"):
        assert opt in proc.stdout


def test_end_to_end(kiln_dev, lib_path, three, tmp_path):
    out = tmp_path / "out"
    proc = run_tool(*[m["path"] for m in three], "--output-dir", out, lib=lib_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert tu.files_in(out) == ["alpha_ctx.onnx", "alpha_kiln.bin", "beta_ctx.onnx", "gamma_ctx.onnx"]
    text = proc.stdout
    for f in tu.files_in(out):
        size = os.path.getsize(out / f)
        assert re.search(rf"{re.escape(str(out / f))}\s+{size:,} bytes", text), (f, text)
    backbone = three[0]["weights"]["W"].nbytes + three[0]["weights"]["B"].nbytes
    assert f"sharing saved {2 * backbone:,} bytes" in text, text
    total = sum(m["initializer_bytes"] for m in three)
    assert f"initializers: {total:,} bytes" in text and f"binary: {os.path.getsize(out / 'alpha_kiln.bin'):,} bytes" in text
    unique = tu.unique_weight_bytes(three)
    assert unique <= os.path.getsize(out / "alpha_kiln.bin") <= unique + 64 * 1024
    # the compiled models run, with and without sharing, and match the CPU EP
    for cfg in ({}, {SHARE: "1"}):
        for m in three:
            ctx = out / (os.path.basename(m["path"])[:-5] + "_ctx.onnx")
            feeds = tu.make_feeds(m["path"])
            names, expected = tu.run_cpu(m["path"], feeds)
            run = tu.run_kiln(str(ctx), kiln_dev, feeds,
                              config=dict(cfg, **{"session.disable_cpu_ep_fallback": "1"}))
            tu.assert_outputs_close(names, expected, run.outputs)
            assert run.created_delta("context_graphs_loaded") == 1


@pytest.mark.parametrize("flag", ["--target", "--device-target"])
def test_other_target_through_a_virtual_device(lib_path, three, tmp_path, flag):
    target = "x86_64-generic"
    out = tmp_path / "out"
    proc = run_tool(three[0]["path"], three[1]["path"], "--output-dir", out, flag, target, lib=lib_path)
    assert proc.returncode == 0, proc.stderr
    assert f"(target {target})" in proc.stdout
    for f in ("alpha_ctx.onnx", "beta_ctx.onnx"):
        for node in tu.ep_context_nodes(out / f):
            assert tu.attrs_of(node)["hardware_architecture"] == target.encode()
        assert tu.metadata(out / f)[tu.COMPAT_KEY] == tu.compat_info(target)
    with open(out / "alpha_kiln.bin", "rb") as fh:
        assert tu.parse_ctx_binary(fh.read())[1]["target"] == target


def test_a_target_the_host_cannot_run_can_be_compiled(lib_path, three, tmp_path):
    out = tmp_path / "out"
    proc = run_tool(three[0]["path"], "--output-dir", out, "--target", "x86_64-avx512", lib=lib_path,
                    env_extra={"KILN_MAX_TARGET": "x86_64-generic"})
    assert proc.returncode == 0, proc.stderr
    assert tu.files_in(out) == ["alpha_ctx.onnx", "alpha_kiln.bin"]


def test_options_and_config_reach_kiln(lib_path, three, tmp_path):
    out = tmp_path / "out"
    proc = run_tool(three[0]["path"], three[1]["path"], "--output-dir", out, "--option", "disabled_ops=Tanh",
                    "--prefix-per-model", lib=lib_path)
    assert proc.returncode == 0, proc.stderr
    for stem in ("alpha", "beta"):
        nodes = tu.ep_context_nodes(out / f"{stem}_ctx.onnx")
        assert [tu.attrs_of(n)["partition_name"].decode().startswith(f"{stem}_") for n in nodes] == [True]
        ops = [n.op_type for n in tu.load_model_proto(out / f"{stem}_ctx.onnx").graph.node]
        assert "Tanh" in ops, "Tanh was left to the CPU EP"


def test_embed_mode_1_is_refused(lib_path, three, tmp_path):
    out = tmp_path / "out"
    proc = run_tool(three[0]["path"], "--output-dir", out, "--embed-mode", "1", lib=lib_path)
    assert proc.returncode == 2
    one_line_error(proc, "ep.context_embed_mode=0")
    assert not out.exists()


def test_last_model_kiln_claims_nothing_still_ends_the_group(lib_path, three, tmp_path, models):
    out = tmp_path / "out"
    proc = run_tool(three[0]["path"], models["unsupported"], "--output-dir", out, lib=lib_path)
    assert proc.returncode == 0, proc.stderr
    a_stem = os.path.splitext(os.path.basename(three[0]["path"]))[0]
    assert tu.files_in(out) == sorted([f"{a_stem}_ctx.onnx", "unsupported_ctx.onnx", f"{a_stem}_kiln.bin"])


@pytest.mark.parametrize("case", ["missing model", "duplicate stem", "bad option", "managed config",
                                  "bad target", "no models", "bad library", "same model twice", "nothing claimed"])
def test_error_paths(lib_path, three, tmp_path, models, case):
    out = tmp_path / "out"
    a, b = three[0]["path"], three[1]["path"]
    other = tmp_path / "other"
    other.mkdir()
    dup = str(other / "alpha.onnx")
    tu.make_share_model(dup, 5)
    lonely = str(other / "lonely.onnx")
    shutil.copy(models["unsupported"], lonely)
    args, needles, status = {
        "missing model": ([a, tmp_path / "nope.onnx"], ["nope.onnx", "does not exist"], 1),
        "duplicate stem": ([a, dup], ["alpha_ctx.onnx"], 1),
        "bad option": ([a, b, "--option", "target=riscv"], ["riscv", "target", "model 1 of 2"], 1),
        "managed config": ([a, "--config", "ep.context_embed_mode=1"], ["ep.context_embed_mode"], 1),
        "bad target": ([a, "--target", "riscv"], ["--target"], 2),
        "no models": ([], ["models"], 2),
        "bad library": ([a, "--library", tmp_path / "libnope.so"], ["libnope.so"], 1),
        "same model twice": ([a, b, "--config", "ep.context_node_name_prefix=same_"], [], 0),
        # the error says why, per model: what kiln's GetCapability left to ORT
        "nothing claimed": ([models["unsupported"], lonely],
                            ["compiled nothing from any model", "unsupported.onnx: ", "lonely.onnx: ",
                             "1 x Atan: kiln does not implement Atan"], 1),
    }[case]
    proc = run_tool(*args, "--output-dir", out, lib=lib_path)
    if status == 0:  # one prefix for every model is harmless when the models differ
        assert proc.returncode == 0, proc.stderr
        return
    assert proc.returncode == status, (proc.returncode, proc.stderr)
    one_line_error(proc, *needles)
    # a failed run leaves nothing behind: no binary, no half set of compiled models
    left = tu.files_in(out) if out.exists() else []
    assert left == [], left


def test_a_failure_in_the_middle_leaves_nothing(lib_path, three, tmp_path):
    """beta fails (its input file is not an ONNX model): alpha's _ctx.onnx is removed, no binary."""
    bad = tmp_path / "broken.onnx"
    bad.write_bytes(b"not a model")
    out = tmp_path / "out"
    proc = run_tool(three[0]["path"], bad, three[2]["path"], "--output-dir", out, lib=lib_path)
    one_line_error(proc, "broken.onnx", "model 2 of 3")
    assert tu.files_in(out) == []


def test_python_api_in_process(kiln_dev, three, tmp_path):
    out = tmp_path / "out"
    before = tu.stats()
    report = share.compile_group([m["path"] for m in three[:2]], str(out), kiln_dev, ep_options=tu.TEST_OPTIONS)
    assert tu.files_in(out) == ["alpha_ctx.onnx", "alpha_kiln.bin", "beta_ctx.onnx"]
    assert report.binary == str(out / "alpha_kiln.bin")
    assert report.binary_bytes == os.path.getsize(report.binary)
    assert report.bytes_deduplicated == tu.stats()["context_bytes_deduplicated"] - before["context_bytes_deduplicated"]
    assert report.initializer_bytes == sum(m["initializer_bytes"] for m in three[:2])
    assert [m.partitions for m in report.models] == [1, 1]
    assert "sharing saved" in share.format_report(report)
    # usage errors are raised before any session, so no group is left open
    with pytest.raises(share.ShareError, match="ep.share_ep_contexts"):
        share.compile_group([three[0]["path"]], str(out), kiln_dev, ep_options=tu.TEST_OPTIONS, config={SHARE: "1"})
