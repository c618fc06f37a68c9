"""What a Python user sees when kiln fails (issue #10, defect 11): the exception class for
each ORT error code kiln returns, and when onnxruntime's Python wrapper quietly rebuilds
a session on the CPU EP instead of raising.

Facts of onnxruntime 1.31.1 these tests pin (docs/reliability.md, "Errors from Python"):

* ``InferenceSession(...)`` catches ``RuntimeError``/``ValueError`` from session creation
  and, unless ``enable_fallback=0`` is passed, prints "EP Error ..." to stdout and
  creates the session again with ``providers=["CPUExecutionProvider"]`` only;
* every error kiln returns from ``CreateEp`` (bad options) reaches Python as a plain
  ``RuntimeError`` (ORT rethrows it as "Error creating execution provider: ... :
  INVALID_ARGUMENT : ..."), so it triggers that fallback;
* an error kiln returns later (Compile, loading a compiled model, the compile API) keeps
  its code and becomes the matching class of ``onnxruntime_pybind11_state``, none of
  which derives from ``RuntimeError``: no fallback;
* ``sess.run`` falls back (once, to the CPU EP) only on ``EPFail``, which kiln returns
  only after a panic; kiln's Compute errors are ``RuntimeException``.

The process-wide cases (resource limits, an injected panic) run in a subprocess.
"""
from __future__ import annotations

import gc
import json
import os
import shutil
import subprocess
import sys
import textwrap
import warnings

import onnxruntime as ort
import pytest
from onnxruntime.capi import onnxruntime_pybind11_state as C

import onnxruntime_ep_kiln as kiln
import kiln_testutil as tu

CPU = "CPUExecutionProvider"
EP_ERROR = "*************** EP Error ***************"


def create(model, so=None, providers=None, **kw):
    """(session providers, None) or (None, (exception class, message, cause class)),
    without a traceback that keeps a session alive."""
    err = None
    providers_out = None
    try:
        with warnings.catch_warnings():
            # "Specified 'providers' ... but SessionOptions has already been configured":
            # printed by the wrapper's own fallback, not by the test
            warnings.simplefilter("ignore", UserWarning)
            sess = ort.InferenceSession(model, so, providers=providers, **kw)
        providers_out = list(sess.get_providers())
        sess = None  # noqa: F841
    except Exception as exc:  # noqa: BLE001 - detached below
        err = (type(exc), str(exc), type(exc.__cause__) if exc.__cause__ is not None else None,
               str(exc.__cause__) if exc.__cause__ is not None else "")
    gc.collect()
    return providers_out, err


# --------------------------------------------------------------------------
# defect 11: a bad kiln option
# --------------------------------------------------------------------------
BAD_OPTIONS = [
    ({"target": "bogus"}, ["invalid value 'bogus' for kiln option 'target'",
                           "ep.kilnexecutionprovider.target", "accepted values"]),
    ({"bogus_key": "1"}, ["unknown kiln option 'bogus_key'", "accepted options: target, disabled_ops"]),
    ({"disabled_ops": "Foo"}, ["'disabled_ops'", "Foo"]),
]


def kiln_options(dev, options, config=None):
    return tu.kiln_session_options(dev, config, options)


@pytest.mark.parametrize("style", ["add_provider_for_devices", "providers="])
@pytest.mark.parametrize("options,needles", BAD_OPTIONS, ids=lambda v: "-".join(v) if isinstance(v, dict) else None)
def test_bad_option_by_default_falls_back_to_the_cpu_ep(models, kiln_dev, capfd, style, options, needles):
    """Without enable_fallback=0 nothing is raised: ORT's wrapper prints "EP Error" and
    the session runs on the CPU EP alone (kiln never runs)."""
    path = models["demo"]
    before = tu.stats()
    if style == "add_provider_for_devices":
        providers, err = create(path, kiln_options(kiln_dev, options))
    else:
        providers, err = create(path, providers=[(kiln.EP_NAME, options)])
    assert err is None, err
    assert providers == [CPU]
    out = capfd.readouterr().out
    assert EP_ERROR in out and "Falling back to ['CPUExecutionProvider'] and retrying." in out, out
    for n in needles:
        assert n in out, f"{n!r} not in what ORT printed:\n{out}"
    # the fallback session gives the CPU EP's numbers and kiln did not run
    feeds = tu.make_feeds(path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        sess = ort.InferenceSession(path, kiln_options(kiln_dev, options))
    got = sess.run(None, feeds)
    del sess
    names, want = tu.run_cpu(path, feeds)
    tu.assert_outputs_close(names, want, got, rtol=0, atol=0)
    after = tu.stats()
    assert after["compute_calls"] == before["compute_calls"]
    assert after["eps_created"] == before["eps_created"], "CreateEp failed: no kiln EP exists"


@pytest.mark.parametrize("style", ["add_provider_for_devices", "providers="])
@pytest.mark.parametrize("options,needles", BAD_OPTIONS, ids=lambda v: "-".join(v) if isinstance(v, dict) else None)
def test_bad_option_with_enable_fallback_0_raises_runtime_error(models, kiln_dev, capfd, style, options, needles):
    path = models["demo"]
    if style == "add_provider_for_devices":
        providers, err = create(path, kiln_options(kiln_dev, options), enable_fallback=0)
    else:
        providers, err = create(path, providers=[(kiln.EP_NAME, options)], enable_fallback=0)
    assert providers is None, f"a session was created on {providers}"
    exc_type, message, _, _ = err
    # not C.Fail / C.InvalidArgument: ORT rethrows CreateEp's status as a C++ exception
    assert exc_type is RuntimeError, err
    assert "Error creating execution provider" in message and "INVALID_ARGUMENT" in message, message
    for n in needles:
        assert n in message, f"{n!r} not in {message!r}"
    assert EP_ERROR not in capfd.readouterr().out


def test_bad_option_with_disable_cpu_ep_fallback_raises_with_kiln_error_as_cause(models, kiln_dev, capfd):
    """``session.disable_cpu_ep_fallback=1`` alone also makes it an error, but a confusing
    one: the wrapper still retries on the CPU EP, ORT refuses that retry, and the kiln
    error is the exception's ``__cause__``."""
    so = kiln_options(kiln_dev, {"target": "bogus"}, {"session.disable_cpu_ep_fallback": "1"})
    providers, err = create(models["demo"], so)
    assert providers is None
    exc_type, message, cause_type, cause = err
    assert exc_type is C.InvalidArgument, err
    assert "Conflicting session configuration" in message, message
    assert cause_type is RuntimeError and "invalid value 'bogus' for kiln option 'target'" in cause, err
    assert EP_ERROR in capfd.readouterr().out


def test_bad_option_in_the_compile_api_raises_runtime_error(models, kiln_dev, tmp_path):
    """``ort.ModelCompiler`` has no fallback: the same RuntimeError, nothing written."""
    src = tmp_path / "demo.onnx"
    shutil.copy(models["demo"], src)
    err = tu.expect_error(tu.compile_model, str(src), kiln_dev, embed=False,
                          output=str(tmp_path / "demo_ctx.onnx"), options={"target": "bogus"})
    tu.assert_error(err, RuntimeError, "INVALID_ARGUMENT : invalid value 'bogus' for kiln option 'target'")
    assert tu.files_in(tmp_path) == ["demo.onnx"]


def test_bad_session_entry_read_by_kiln_falls_back_too(models, kiln_dev, capfd):
    """kiln checks ``ep.context_enable`` & co. in CreateEp: same path as a bad option."""
    so = kiln_options(kiln_dev, {}, {"ep.context_enable": "2"})
    providers, err = create(models["demo"], so)
    assert err is None and providers == [CPU]
    assert "ep.context_enable" in capfd.readouterr().out
    providers, err = create(models["demo"], kiln_options(kiln_dev, {}, {"ep.context_enable": "2"}),
                            enable_fallback=0)
    assert err[0] is RuntimeError and "ep.context_enable" in err[1], err


# --------------------------------------------------------------------------
# errors after CreateEp keep their code; no fallback
# --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def compiled(models, kiln_dev, tmp_path_factory):
    folder = tmp_path_factory.mktemp("errors")
    src, ctx = tu.compile_copy(models["demo"], kiln_dev, folder)
    return folder, src, ctx


@pytest.mark.parametrize("fallback", [1, 0])
def test_invalid_graph_from_loading_raises_invalid_graph_without_fallback(kiln_dev, compiled, tmp_path,
                                                                          capfd, fallback):
    folder, _, ctx = compiled
    moved = tmp_path / "demo_ctx.onnx"
    shutil.copy(ctx, moved)  # its binary is not beside it
    providers, err = create(str(moved), kiln_options(kiln_dev, {}), enable_fallback=fallback)
    assert providers is None, "a session was created"
    assert err[0] is C.InvalidGraph, err
    assert err[1].startswith("[ONNXRuntimeError] : 10 : INVALID_GRAPH : kiln EPContext node"), err[1]
    assert "does not exist" in err[1]
    assert EP_ERROR not in capfd.readouterr().out


@pytest.mark.parametrize("fallback", [1, 0])
def test_invalid_argument_from_compile_raises_invalid_argument_without_fallback(models, kiln_dev, tmp_path,
                                                                                capfd, fallback):
    src = tmp_path / "demo.onnx"
    shutil.copy(models["demo"], src)
    cfg = {"ep.context_enable": "1", "ep.context_embed_mode": "1", "ep.share_ep_contexts": "1",
           "ep.stop_share_ep_contexts": "1", "ep.context_file_path": str(tmp_path / "demo_ctx.onnx")}
    providers, err = create(str(src), kiln_options(kiln_dev, {}, cfg), enable_fallback=fallback)
    assert providers is None
    assert err[0] is C.InvalidArgument, err
    assert err[1].startswith("[ONNXRuntimeError] : 2 : INVALID_ARGUMENT : ep.share_ep_contexts=1"), err[1]
    assert EP_ERROR not in capfd.readouterr().out
    assert tu.files_in(tmp_path) == ["demo.onnx"]


def test_invalid_argument_from_the_compile_api(models, kiln_dev):
    data = open(models["demo"], "rb").read()
    err = tu.expect_error(tu.compile_model, data, kiln_dev, embed=False, to="bytes")
    tu.assert_error(err, C.InvalidArgument, "given as bytes", "ep.context_file_path")


def test_codes_kiln_never_returns_map_like_ort_own(tmp_path):
    """kiln returns no NO_SUCHFILE / NOT_IMPLEMENTED / NOT_FOUND on any path a user can
    reach (a missing binary is INVALID_GRAPH); if it did, Python would map the code like
    ORT's own errors with it, pinned here."""
    from onnx import TensorProto, helper

    _, err = create(str(tmp_path / "missing.onnx"), providers=[CPU], enable_fallback=0)
    assert err[0] is C.NoSuchFile and " : 3 : NO_SUCHFILE : " in err[1], err
    g = helper.make_graph([helper.make_node("Relu", ["X"], ["Y"])], "g",
                          [helper.make_tensor_value_info("X", TensorProto.INT16, [2])],
                          [helper.make_tensor_value_info("Y", TensorProto.INT16, [2])])
    m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    _, err = create(m.SerializeToString(), providers=[CPU], enable_fallback=0)
    assert err[0] is C.NotImplemented and " : 9 : NOT_IMPLEMENTED : " in err[1], err
    # none of ORT's exception classes is a RuntimeError, so none triggers the fallback
    for cls in (C.Fail, C.InvalidArgument, C.NoSuchFile, C.InvalidGraph, C.NotImplemented, C.EPFail,
                C.RuntimeException, C.NotFound, C.InvalidProtobuf):
        assert not issubclass(cls, (RuntimeError, ValueError)), cls


# --------------------------------------------------------------------------
# FAIL, RUNTIME_EXCEPTION, EP_FAIL: in a subprocess (resource limits, injected panics)
# --------------------------------------------------------------------------
SCRIPT = textwrap.dedent(r"""
    import json, os, resource, shutil, signal, sys, tempfile, warnings
    import numpy as np
    import onnx
    from onnx import TensorProto, helper
    import onnxruntime as ort
    import kiln_testutil as tu
    import onnxruntime_ep_kiln as kiln

    case, demo, folder = sys.argv[1], sys.argv[2], sys.argv[3]
    warnings.simplefilter("ignore", UserWarning)
    ort.register_execution_provider_library("kiln_errors.virtual", kiln.get_library_path())
    dev = [d for d in tu.kiln_devices() if not kiln.is_virtual(d)][0]
    res = {}

    def attempt(key, fn):
        try:
            res[key] = ["ok", fn()]
        except Exception as e:
            res[key] = [type(e).__name__, str(e)]

    def session(path, fallback, cfg=None):
        return ort.InferenceSession(path, tu.kiln_session_options(dev, cfg), enable_fallback=fallback)

    if case == "fail":
        # a failing write of the context binary (file size limit): ORT_FAIL
        src = os.path.join(folder, "demo.onnx")
        shutil.copy(demo, src)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (100000, 100000))
        attempt("compile", lambda: ort.ModelCompiler(
            tu.kiln_session_options(dev), src, embed_compiled_data_into_model=False
        ).compile_to_file(os.path.join(folder, "demo_ctx.onnx")))
        res["files"] = tu.files_in(folder)
    elif case == "runtime":
        # 512 MiB of scratch that cannot be allocated (address-space limit): Compute fails
        g = helper.make_graph([
            helper.make_node("Expand", ["X", "shape"], ["E"]),
            helper.make_node("Relu", ["E"], ["R"]),
            helper.make_node("ReduceSum", ["R"], ["Y"], keepdims=0),
        ], "big", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 1])],
           [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [])],
           initializer=[helper.make_tensor("shape", TensorProto.INT64, [2], [8192, 8192])])
        path = os.path.join(folder, "big.onnx")
        onnx.save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8), path)
        for fb in (1, 0):
            s = session(path, fb, {"session.disable_cpu_ep_fallback": "1"})
            with open("/proc/self/status") as f:
                vm = [int(l.split()[1]) * 1024 for l in f if l.startswith("VmSize:")][0]
            resource.setrlimit(resource.RLIMIT_AS, (vm + (64 << 20), resource.RLIM_INFINITY))
            attempt(f"run_fallback{fb}", lambda: s.run(None, {"X": np.ones((1, 1), np.float32)})[0].tolist())
            resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
            res[f"providers_after{fb}"] = s.get_providers()
            res[f"run_again{fb}"] = s.run(None, {"X": np.full((1, 1), 2.0, np.float32)})[0].tolist()
            del s
    elif case in ("panic_compile", "panic_compute"):
        feeds = tu.make_feeds(demo)
        want = tu.run_cpu(demo, feeds)[1][0]
        for fb in (1, 0):
            def go():
                s = session(demo, fb)
                first = s.get_providers()
                out = s.run(None, feeds)[0]
                return [first, s.get_providers(), bool(np.array_equal(out, want))]
            attempt(f"fallback{fb}", go)
    elif case == "capped":
        # KILN_MAX_TARGET=x86_64-generic: the AVX2 virtual device is for compiling only
        avx2 = [d for d in tu.kiln_devices() if kiln.device_target(d) == "x86_64-avx2"][0]
        for fb in (1, 0):
            attempt(f"fallback{fb}", lambda: ort.InferenceSession(
                demo, tu.kiln_session_options(avx2), enable_fallback=fb).get_providers())
    print("RESULT " + json.dumps(res))
""")


def run_case(case, models, lib_path, tmp_path, env_extra=None):
    env = dict(os.environ, RUST_BACKTRACE="0", **(env_extra or {}))
    env[kiln.LIBRARY_ENV] = lib_path
    env["PYTHONPATH"] = os.pathsep.join([tu.PYTHON_DIR, tu.TESTS_DIR, env.get("PYTHONPATH", "")])
    p = subprocess.run([sys.executable, "-c", SCRIPT, case, models["demo"], str(tmp_path)], env=env,
                       capture_output=True, text=True, timeout=300)
    lines = [line for line in p.stdout.splitlines() if line.startswith("RESULT ")]
    assert p.returncode == 0 and lines, f"subprocess failed ({p.returncode}):\n{p.stdout}\n{p.stderr}"
    return json.loads(lines[-1][len("RESULT "):]), p.stdout


def test_a_target_the_host_cannot_run_fails_create_ep_and_falls_back(models, lib_path, tmp_path):
    """Refused in CreateEp, so it behaves like a bad option."""
    res, out = run_case("capped", models, lib_path, tmp_path, {kiln.MAX_TARGET_ENV: "x86_64-generic"})
    assert res["fallback1"] == ["ok", [CPU]], res
    assert EP_ERROR in out and "cannot run on this host" in out
    exc, msg = res["fallback0"]
    assert exc == "RuntimeError" and "INVALID_ARGUMENT : kiln target x86_64-avx2 cannot run on this host" in msg, res


def test_fail_from_writing_the_binary_raises_fail(models, lib_path, tmp_path):
    res, _ = run_case("fail", models, lib_path, tmp_path)
    exc, msg = res["compile"]
    assert exc == "Fail", res
    assert msg.startswith("[ONNXRuntimeError] : 1 : FAIL : writing kiln context binary"), msg
    assert "File too large" in msg
    assert "demo_kiln.bin" not in res["files"] and not [f for f in res["files"] if "tmp" in f], res["files"]


def test_runtime_exception_from_compute_raises_without_fallback(models, lib_path, tmp_path):
    res, _ = run_case("runtime", models, lib_path, tmp_path)
    for fb in (1, 0):
        exc, msg = res[f"run_fallback{fb}"]
        assert exc == "RuntimeException", res
        assert " : 6 : RUNTIME_EXCEPTION : " in msg and "kiln could not allocate 536870912 bytes" in msg, msg
        # no fallback: the session stays on kiln and works once memory is there
        assert res[f"providers_after{fb}"][0] == kiln.EP_NAME
        assert res[f"run_again{fb}"] == 2.0 * 8192 * 8192


def test_ep_fail_from_a_panic_in_compile_raises_without_fallback(models, lib_path, tmp_path):
    res, out = run_case("panic_compile", models, lib_path, tmp_path, {"KILN_INJECT_PANIC": "compile"})
    for fb in (1, 0):
        exc, msg = res[f"fallback{fb}"]
        assert exc == "EPFail", res
        assert " : 11 : EP_FAIL : kiln panicked in Compile" in msg, msg
    assert EP_ERROR not in out


def test_ep_fail_from_a_panic_in_compute_falls_back_in_run(models, lib_path, tmp_path):
    """The only error that makes ``sess.run`` switch to the CPU EP: EP_FAIL (a panic)."""
    res, out = run_case("panic_compute", models, lib_path, tmp_path, {"KILN_INJECT_PANIC": "compute"})
    status, (first, after, equal) = res["fallback1"]
    assert status == "ok" and first[0] == kiln.EP_NAME and after == [CPU] and equal, res
    assert "EP Error: [ONNXRuntimeError] : 11 : EP_FAIL" in out and "kiln panicked in Compute" in out, out
    exc, msg = res["fallback0"]
    assert exc == "EPFail" and "kiln panicked in Compute" in msg, res
