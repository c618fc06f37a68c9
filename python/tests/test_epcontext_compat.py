"""Compatibility info of compiled models, kiln's verdicts on it (through
``get_model_compatibility_for_ep_devices``), cross-compiling on virtual devices, and a
host capped with ``KILN_MAX_TARGET`` (in a subprocess: kiln reads it at registration).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import onnx
import pytest
from onnxruntime.capi import onnxruntime_pybind11_state as C

import onnxruntime_ep_kiln as kiln
import kiln_testutil as tu

V = C.OrtCompiledModelCompatibility
OPTIMAL = V.EP_SUPPORTED_OPTIMAL
PREFER = V.EP_SUPPORTED_PREFER_RECOMPILATION
UNSUPPORTED = V.EP_UNSUPPORTED
AVX512, AVX2, GENERIC = kiln.TARGETS

needs_avx512 = pytest.mark.skipif(tu.host_target() != AVX512, reason="needs an AVX-512 host")


def verdict(devices, info):
    return C.get_model_compatibility_for_ep_devices(list(devices), info)


def compile_amr(models, dev, folder, embed=False, route="compile"):
    src = os.path.join(str(folder), "add_mul_relu.onnx")
    shutil.copy(models["add_mul_relu"], src)
    out = os.path.join(str(folder), "add_mul_relu_ctx.onnx")
    if route == "compile":
        tu.compile_model(src, dev, embed=embed, output=out)
    else:
        tu.generate_context(src, dev, embed=int(embed))
    return out, src


def test_compatibility_info_in_compiled_model(models, kiln_virtual, tmp_path):
    dev = kiln_virtual["host"]
    out, _ = compile_amr(models, dev, tmp_path)
    want = f"kiln;format={tu.CONTEXT_FORMAT};version={kiln.__version__};target={tu.host_target()}"
    assert tu.metadata(out)[tu.COMPAT_KEY] == want
    assert C.get_compatibility_info_from_model(out, kiln.EP_NAME) == want
    assert C.get_compatibility_info_from_model_bytes(open(out, "rb").read(), kiln.EP_NAME) == want
    assert C.get_compatibility_info_from_model(out, "CPUExecutionProvider") is None
    assert verdict([dev], want) == OPTIMAL


def test_verdicts_for_the_host_device(kiln_virtual):
    host = kiln_virtual["host"]
    t = tu.host_target()
    info = tu.compat_info
    cases = [
        (info(t), OPTIMAL),
        (info(t, version="0.1.0+build.7"), OPTIMAL),
        (info(t, version="0.2.0"), OPTIMAL),  # newer kiln wrote it
        (f"kiln;target={t};extra=1;version={kiln.__version__};format={tu.CONTEXT_FORMAT}", OPTIMAL),  # order, unknown keys
        (info(t, fmt=1), PREFER),  # older formats kiln still reads
        (info(t, fmt=2), PREFER),
        (info(t, version="0.0.9"), PREFER),  # older kiln
        (info(t, version="0.1.0-alpha.1"), PREFER),
        (info(t, fmt=tu.CONTEXT_FORMAT + 1), UNSUPPORTED),
        (info(t, fmt=99), UNSUPPORTED),
        (info(t, fmt=0), UNSUPPORTED),
        (info("arm64"), UNSUPPORTED),
        ("", UNSUPPORTED),
        ("kiln", UNSUPPORTED),
        ("someone-else;format=1;version=0.1.0;target=x86_64-generic", UNSUPPORTED),
        (f"kiln;format=1;format=1;version=0.1.0;target={t}", UNSUPPORTED),
        (f"kiln;format=x;version=0.1.0;target={t}", UNSUPPORTED),
        (f"kiln;format=1;version=0.1;target={t}", UNSUPPORTED),
    ]
    got = [(s, verdict([host], s)) for s, _ in cases]
    assert got == [(s, v) for s, v in cases]


@needs_avx512
def test_verdicts_per_target_and_device(kiln_virtual):
    host, avx2, generic = kiln_virtual["host"], kiln_virtual[AVX2], kiln_virtual[GENERIC]
    info = tu.compat_info
    table = {
        (AVX512, "host"): OPTIMAL, (AVX2, "host"): PREFER, (GENERIC, "host"): PREFER,
        (AVX512, AVX2): UNSUPPORTED, (AVX2, AVX2): OPTIMAL, (GENERIC, AVX2): PREFER,
        (AVX512, GENERIC): UNSUPPORTED, (AVX2, GENERIC): UNSUPPORTED, (GENERIC, GENERIC): OPTIMAL,
    }
    devs = {"host": host, AVX2: avx2, GENERIC: generic}
    got = {(t, d): verdict([devs[d]], info(t)) for (t, d) in table}
    assert got == table
    # several devices: the best answer over them
    assert verdict([avx2, host], info(AVX512)) == OPTIMAL
    assert verdict([generic, avx2], info(AVX2)) == OPTIMAL
    assert verdict([generic, avx2], info(AVX512)) == UNSUPPORTED
    # an older kiln does not rescue nor worsen an unsupported target
    assert verdict([avx2], info(AVX512, version="0.0.1")) == UNSUPPORTED


@needs_avx512
@pytest.mark.parametrize("target", [AVX2, GENERIC])
@pytest.mark.parametrize("route", ["compile", "session"])
@pytest.mark.parametrize("embed", [False, True])
def test_cross_compiled_models_run_here(models, kiln_virtual, tmp_path, target, route, embed):
    vdev = kiln_virtual[target]
    assert kiln.is_virtual(vdev)
    out, src = compile_amr(models, vdev, tmp_path, embed=embed, route=route)
    (node,) = tu.ep_context_nodes(out)
    a = tu.attrs_of(node)
    assert a["hardware_architecture"] == target.encode()
    payload = a["ep_cache_context"] if embed else (tmp_path / "add_mul_relu_kiln.bin").read_bytes()
    assert tu.parse_ctx_binary(payload)[1]["target"] == target
    info = tu.metadata(out)[tu.COMPAT_KEY]
    assert info == tu.compat_info(target)
    assert verdict([kiln_virtual["host"]], info) == PREFER
    assert verdict([vdev], info) == OPTIMAL
    feeds = tu.make_feeds(src)
    names, want = tu.run_cpu(src, feeds)
    run = tu.run_kiln(out, kiln_virtual["host"], feeds)
    tu.assert_outputs_close(names, want, run.outputs)
    assert run.created_delta("partitions_compiled") == 0 and run.created_delta("context_graphs_loaded") == 1


@needs_avx512
def test_virtual_device_cannot_run_without_compiling(models, kiln_virtual):
    """A virtual target below the host runs fine; it is only targets above the host
    that are compile-only (tested under KILN_MAX_TARGET below)."""
    run = tu.check_against_cpu(models["add_mul_relu"], kiln_virtual[AVX2])
    assert run.created_delta("partitions_compiled") == 1


@needs_avx512
@pytest.mark.xfail(strict=True, reason="ORT 1.31.1's Python InferenceSession never calls "
                   "ValidateCompiledModelCompatibilityInfo (the C API's CreateSession does: see "
                   "ffi-tests/context.rs), so fail_on_suboptimal_compiled_model has no effect from Python")
def test_fail_on_suboptimal_compiled_model(models, kiln_virtual, tmp_path):
    out, _ = compile_amr(models, kiln_virtual[AVX2], tmp_path)
    err = tu.expect_error(tu.run_kiln, out, kiln_virtual["host"], None, None,
                          {"session.fail_on_suboptimal_compiled_model": "1"})
    tu.assert_error(err, C.Fail)


@needs_avx512
def test_suboptimal_model_loads_without_the_fail_option(models, kiln_virtual, tmp_path):
    out, src = compile_amr(models, kiln_virtual[AVX2], tmp_path)
    run = tu.run_kiln(out, kiln_virtual["host"], tu.make_feeds(src),
                      config={"session.fail_on_suboptimal_compiled_model": "0"})
    assert run.created_delta("context_graphs_loaded") == 1


@pytest.mark.xfail(strict=True, reason="ORT 1.31.1's Python InferenceSession never calls "
                   "ValidateCompiledModelCompatibilityInfo, so an UNSUPPORTED verdict does not stop it")
def test_unsupported_compatibility_info_refused_at_load(models, kiln_virtual, tmp_path):
    out, _ = compile_amr(models, kiln_virtual["host"], tmp_path)
    m = tu.load_model_proto(out)
    for p in m.metadata_props:
        if p.key == tu.COMPAT_KEY:
            p.value = tu.compat_info(tu.host_target(), fmt=99)
    onnx.save(m, out)
    assert verdict([kiln_virtual["host"]], tu.metadata(out)[tu.COMPAT_KEY]) == UNSUPPORTED
    err = tu.expect_error(tu.run_kiln, out, kiln_virtual["host"])
    tu.assert_error(err, C.Fail, "not supported")


# --------------------------------------------------------------------------
# a host capped at AVX2 (KILN_MAX_TARGET, read at registration: subprocess)
# --------------------------------------------------------------------------
CAPPED_SCRIPT = textwrap.dedent(r"""
    import json, os, sys, gc
    import onnx
    import onnxruntime as ort
    from onnxruntime.capi import onnxruntime_pybind11_state as C
    import kiln_testutil as tu
    import onnxruntime_ep_kiln as kiln

    folder, src = sys.argv[1], sys.argv[2]
    ort.register_execution_provider_library("kiln_capped.virtual", kiln.get_library_path())
    devs = tu.kiln_devices()
    host = [d for d in devs if not kiln.is_virtual(d)][0]
    v512 = [d for d in devs if kiln.device_target(d) == "x86_64-avx512"][0]
    res = {"host_target": kiln.device_target(host), "v512_virtual": kiln.is_virtual(v512)}

    def attempt(key, fn, *a, **k):
        try:
            fn(*a, **k)
            res[key] = "ok"
        except tu.KilnSessionError as e:
            res[key] = [e.exc_type.__name__, e.message]

    out_c = os.path.join(folder, "c", "m_ctx.onnx")
    os.makedirs(os.path.dirname(out_c))
    attempt("compile_api", tu.compile_model, src, v512, embed=False, output=out_c)
    out_s = os.path.join(folder, "s", "m_ctx.onnx")
    os.makedirs(os.path.dirname(out_s))
    attempt("session_route", tu.generate_context, src, v512, embed=0, file_path=out_s)
    attempt("run_on_v512", tu.run_kiln, src, v512, tu.make_feeds(src))
    res["files_c"] = tu.files_in(os.path.dirname(out_c))
    info = tu.metadata(out_c).get(tu.COMPAT_KEY) if os.path.exists(out_c) else None
    res["info"] = info
    if info:
        res["verdict_host"] = str(C.get_model_compatibility_for_ep_devices([host], info))
        res["verdict_v512"] = str(C.get_model_compatibility_for_ep_devices([v512], info))
        attempt("load_on_host", tu.run_kiln, out_c, host, tu.make_feeds(src))
        m = tu.load_model_proto(out_c)
        keep = [p for p in m.metadata_props if p.key != tu.COMPAT_KEY]
        del m.metadata_props[:]
        m.metadata_props.extend(keep)
        stripped = os.path.join(folder, "c", "stripped.onnx")
        onnx.save(m, stripped)
        attempt("load_stripped_on_host", tu.run_kiln, stripped, host, tu.make_feeds(src))
    host = v512 = devs = None
    tu.safe_unregister("kiln_capped.virtual")
    print("RESULT " + json.dumps(res))
""")


@pytest.fixture(scope="module")
def capped(models, lib_path, tmp_path_factory):
    folder = tmp_path_factory.mktemp("capped")
    src = folder / "m.onnx"
    shutil.copy(models["add_mul_relu"], src)
    env = dict(os.environ)
    env[kiln.MAX_TARGET_ENV] = AVX2
    env[kiln.LIBRARY_ENV] = lib_path
    env["PYTHONPATH"] = os.pathsep.join([tu.PYTHON_DIR, tu.TESTS_DIR, env.get("PYTHONPATH", "")])
    p = subprocess.run([sys.executable, "-c", CAPPED_SCRIPT, str(folder), str(src)], env=env,
                       capture_output=True, text=True, timeout=300)
    lines = [line for line in p.stdout.splitlines() if line.startswith("RESULT ")]
    assert p.returncode == 0 and lines, f"subprocess failed ({p.returncode}):\n{p.stdout}\n{p.stderr}"
    return json.loads(lines[-1][len("RESULT "):]), folder, str(src)


@needs_avx512
def test_capped_host_compiles_for_avx512(capped):
    res, folder, _ = capped
    assert res["host_target"] == AVX2 and res["v512_virtual"] is True
    assert res["compile_api"] == "ok", res["compile_api"]
    assert res["session_route"] == "ok", res["session_route"]
    assert res["files_c"] == ["m_ctx.onnx", "m_kiln.bin"]
    assert tu.files_in(folder / "s") == ["m_ctx.onnx", "m_kiln.bin"]
    assert res["info"] == tu.compat_info(AVX512)


@needs_avx512
def test_capped_host_refuses_to_run_avx512(capped):
    res, _, _ = capped
    exc, msg = res["run_on_v512"]
    # ORT wraps CreateEp's INVALID_ARGUMENT into FAIL (see README)
    assert exc in ("Fail", "InvalidArgument", "RuntimeError"), res["run_on_v512"]
    assert "x86_64-avx512" in msg and "cannot run on this host" in msg, msg


@needs_avx512
def test_capped_host_verdicts(capped):
    res, _, _ = capped
    assert res["verdict_host"] == str(UNSUPPORTED)
    assert res["verdict_v512"] == str(OPTIMAL)


@needs_avx512
@pytest.mark.parametrize("key", ["load_on_host", "load_stripped_on_host"])
def test_capped_host_loading_avx512_model_is_refused_by_kiln(capped, key):
    """With the metadata, ORT's C API would refuse first (UNSUPPORTED -> Fail); from
    Python (no validation) and without the metadata, kiln refuses in Compile."""
    res, _, _ = capped
    exc, msg = res[key]
    assert exc == "InvalidGraph", res[key]
    assert "kiln EPContext node" in msg and "x86_64-avx512" in msg and "cannot run" in msg, msg
    assert "x86_64-avx2" in msg, msg


@needs_avx512
def test_capped_output_runs_on_the_real_host(capped, kiln_virtual):
    _, folder, src = capped
    for sub in ("c", "s"):
        feeds = tu.make_feeds(src)
        names, want = tu.run_cpu(src, feeds)
        run = tu.run_kiln(str(folder / sub / "m_ctx.onnx"), kiln_virtual["host"], feeds)
        tu.assert_outputs_close(names, want, run.outputs)
        assert run.created_delta("partitions_compiled") == 0
