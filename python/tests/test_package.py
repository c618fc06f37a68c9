"""The onnxruntime_ep_kiln package itself: metadata, library lookup, demo CLI."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

import onnxruntime_ep_kiln as kiln
import kiln_testutil as tu


def test_constants():
    assert kiln.EP_NAME == "KilnExecutionProvider"
    assert kiln.EP_VENDOR == "kiln"
    assert kiln.__version__ == "0.1.0"
    assert kiln.TARGETS == ("x86_64-avx512", "x86_64-avx2", "x86_64-generic")
    for fn in ("get_library_path", "register", "unregister", "devices", "kiln_devices", "stats"):
        assert callable(getattr(kiln, fn))


def test_pyproject_metadata():
    import tomllib

    with open(os.path.join(tu.PYTHON_DIR, "pyproject.toml"), "rb") as f:
        meta = tomllib.load(f)
    proj = meta["project"]
    assert proj["name"] == "onnxruntime-ep-kiln"
    assert proj["version"] == "0.1.0"
    # ORT's plugin-EP packaging: no dependency on an ONNX Runtime distribution;
    # the [ort] extra pins the tested one
    assert not [d for d in proj["dependencies"] if d.lower().startswith("onnxruntime")]
    assert proj["optional-dependencies"]["ort"] == ["onnxruntime==1.31.1"]
    assert proj["scripts"]["kiln"] == "onnxruntime_ep_kiln.cli:main"
    assert proj["scripts"]["kiln-share-ctx-gen"] == "onnxruntime_ep_kiln.share:main"
    assert meta["build-system"]["build-backend"] == "setuptools.build_meta"
    assert any(r.startswith("setuptools-rust") for r in meta["build-system"]["requires"])


def _fake_tree(tmp_path, monkeypatch, bundled: bool, in_repo: bool):
    """A fake checkout: tmp/repo/target/release/libkiln_ep.so and
    tmp/repo/python/onnxruntime_ep_kiln/__init__.py (+ optional bundled lib)."""
    repo = tmp_path / "repo"
    pkg = repo / "python" / "onnxruntime_ep_kiln"
    pkg.mkdir(parents=True)
    init = pkg / "__init__.py"
    init.write_text("")
    if bundled:
        (pkg / "libkiln_ep.so").write_bytes(b"bundled")
    if in_repo:
        rel = repo / "target" / "release"
        rel.mkdir(parents=True)
        (rel / "libkiln_ep.so").write_bytes(b"repo")
    monkeypatch.setattr(kiln, "__file__", str(init))
    monkeypatch.delenv(kiln.LIBRARY_ENV, raising=False)
    return repo, pkg


def test_library_path_env_wins(tmp_path, monkeypatch):
    _fake_tree(tmp_path, monkeypatch, bundled=True, in_repo=True)
    lib = tmp_path / "custom.so"
    lib.write_bytes(b"x")
    monkeypatch.setenv("KILN_EP_LIBRARY", str(lib))
    assert kiln.get_library_path() == str(lib)


def test_library_path_env_missing_file_is_an_error(tmp_path, monkeypatch):
    _fake_tree(tmp_path, monkeypatch, bundled=True, in_repo=True)
    monkeypatch.setenv("KILN_EP_LIBRARY", str(tmp_path / "nope.so"))
    with pytest.raises(FileNotFoundError, match="KILN_EP_LIBRARY"):
        kiln.get_library_path()


def test_library_path_bundled_before_repo(tmp_path, monkeypatch):
    _, pkg = _fake_tree(tmp_path, monkeypatch, bundled=True, in_repo=True)
    assert kiln.get_library_path() == str(pkg / "libkiln_ep.so")


def test_library_path_walks_up_to_repo(tmp_path, monkeypatch):
    repo, _ = _fake_tree(tmp_path, monkeypatch, bundled=False, in_repo=True)
    assert kiln.get_library_path() == str(repo / "target" / "release" / "libkiln_ep.so")


def test_library_path_not_found_message(tmp_path, monkeypatch):
    _fake_tree(tmp_path, monkeypatch, bundled=False, in_repo=False)
    with pytest.raises(FileNotFoundError) as ei:
        kiln.get_library_path()
    msg = str(ei.value)
    assert "libkiln_ep.so" in msg and "KILN_EP_LIBRARY" in msg and "cargo build --release" in msg


def test_real_library_is_found(lib_path):
    """The library this checkout builds (target/release) or KILN_EP_LIBRARY."""
    assert os.path.isfile(lib_path)
    assert os.path.basename(lib_path).endswith(".so")


def test_register_helper_is_idempotent(lib_path):
    assert not tu.kiln_devices(), "kiln already registered by someone else"
    name = "kiln_pkg_helper"
    try:
        assert kiln.register(name) == name
        assert kiln.register(name) == name  # second call is a no-op
        assert name in kiln.registered_names()
        assert len(kiln.kiln_devices()) == 1
        assert kiln.devices(virtual=False)[0].ep_name == kiln.EP_NAME
        assert kiln.host_device().ep_vendor == "kiln"
        s = kiln.stats()
        assert set(s) == set(kiln.STAT_FIELDS)
        assert {"eps_created", "partitions_compiled", "context_files_opened", "context_bytes_written"} <= set(s)
        assert all(isinstance(v, int) and v >= 0 for v in s.values())
    finally:
        kiln.unregister(name)
    assert name not in kiln.registered_names()
    assert kiln.kiln_devices() == []


def test_stats_counts_are_monotonic(lib_path):
    a = kiln.stats(lib_path)
    b = kiln.stats(lib_path)
    assert all(b[k] >= a[k] for k in a)


def _demo(args, env_extra=None):
    env = dict(os.environ)
    env["PYTHONPATH"] = tu.PYTHON_DIR + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("KILN_MAX_TARGET", None)
    env.update(env_extra or {})
    return subprocess.run(
        [sys.executable, "-m", "onnxruntime_ep_kiln.demo", *args],
        cwd=tu.REPO_DIR, env=env, capture_output=True, text=True, timeout=300,
    )


def test_demo_cli(lib_path):
    p = _demo(["--model", os.path.join(tu.MODELS_DIR, "demo.onnx")],
              {"KILN_EP_LIBRARY": lib_path})
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert "Traceback" not in out
    assert "kiln matches" in out
    assert "x86_64-generic" in out and "virtual" in out
    assert "partition" in out


def test_demo_cli_on_virtual_target(lib_path):
    p = _demo(["--target", "x86_64-generic"], {"KILN_EP_LIBRARY": lib_path})
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert "virtual device, target x86_64-generic" in out


def test_demo_cli_missing_library_is_a_clean_error(tmp_path):
    p = _demo([], {"KILN_EP_LIBRARY": str(tmp_path / "missing.so")})
    assert p.returncode == 2
    assert "Traceback" not in p.stdout + p.stderr
    assert "error:" in p.stderr and "KILN_EP_LIBRARY" in p.stderr


def test_demo_cli_missing_model_is_a_clean_error(tmp_path):
    p = _demo(["--model", str(tmp_path / "missing.onnx")])
    assert p.returncode == 2
    assert "Traceback" not in p.stdout + p.stderr
    assert "model not found" in p.stderr


def test_demo_exit_code_on_mismatch(lib_path, monkeypatch, capsys):
    """In-process: with a comparison that always fails the demo must report a mismatch
    (exit code 1) and still unregister kiln."""
    from onnxruntime_ep_kiln import demo

    assert not tu.kiln_devices()
    monkeypatch.setenv("KILN_EP_LIBRARY", lib_path)
    monkeypatch.setattr(demo, "outputs_close", lambda actual, expected: False)
    rc = demo.main(["--model", os.path.join(tu.MODELS_DIR, "add_mul_relu.onnx")])
    out = capsys.readouterr()
    assert rc == 1, out.out + out.err
    assert "MISMATCH" in out.out
    assert not tu.kiln_devices(), "demo left kiln registered"


def test_demo_session_error_is_clean(lib_path, monkeypatch, capsys):
    """A kiln error at session creation (bad option) gives exit code 2 and a
    one-line message, not a CPU fallback or a traceback."""
    from onnxruntime_ep_kiln import demo

    monkeypatch.setenv("KILN_EP_LIBRARY", lib_path)
    rc = demo.main(["--model", os.path.join(tu.MODELS_DIR, "add_mul_relu.onnx"),
                    "--disabled-ops", "NotAnOp"])
    out = capsys.readouterr()
    assert rc == 2
    assert "error:" in out.err and "NotAnOp" in out.err and "Traceback" not in out.err
    assert not tu.kiln_devices()
