"""Registering kiln: devices, metadata, options, virtual devices, KILN_MAX_TARGET.

Each test here registers (and unregisters) kiln itself, so it can control the
registration name and the environment.
"""
from __future__ import annotations

import contextlib

import onnxruntime as ort
import pytest
from onnxruntime.capi import onnxruntime_pybind11_state as C

import onnxruntime_ep_kiln as kiln
import kiln_testutil as tu


@contextlib.contextmanager
def registered(lib_path, name):
    assert not tu.kiln_devices(), "kiln is already registered (leaked registration?)"
    ort.register_execution_provider_library(name, lib_path)
    try:
        yield name
    finally:
        tu.safe_unregister(name)


def _by_target(devs):
    out = {}
    for d in devs:
        t = d.ep_metadata.get("kiln.target")
        assert t not in out, f"two kiln devices for target {t}"
        out[t] = d
    return out


def test_register_unregister_cycles(lib_path):
    name = tu.unique_name("kiln_cycle")
    for _ in range(3):
        assert not tu.kiln_devices()
        ort.register_execution_provider_library(name, lib_path)
        try:
            assert len(tu.kiln_devices()) == 1
        finally:
            ort.unregister_execution_provider_library(name)
        assert not tu.kiln_devices()


def test_register_unregister_cycles_with_sessions(lib_path, models):
    """A session per cycle, released before unregistering."""
    for i in range(3):
        with registered(lib_path, tu.unique_name(f"kiln_cycle{i}")):
            (dev,) = tu.kiln_devices()
            tu.check_against_cpu(models["add_mul_relu"], dev)


def test_register_same_name_twice_fails(lib_path):
    name = tu.unique_name("kiln_twice")
    with registered(lib_path, name):
        with pytest.raises(C.Fail, match="already registered"):
            ort.register_execution_provider_library(name, lib_path)
        assert len(tu.kiln_devices()) == 1


def test_unregister_unknown_name_fails():
    with pytest.raises(C.Fail, match="was not registered"):
        ort.unregister_execution_provider_library(tu.unique_name("kiln_never_registered"))


def test_host_device_listing(lib_path):
    expected_target = tu.host_target()
    with registered(lib_path, tu.unique_name("kiln_list")):
        devs = tu.kiln_devices()
        assert len(devs) == 1, "kiln must offer exactly one device without .virtual"
        (d,) = devs
        assert d.ep_name == "KilnExecutionProvider"
        assert d.ep_vendor == "kiln"
        md = dict(d.ep_metadata)
        assert md.get("version") == "0.1.0", md
        assert md.get("kiln.target") == expected_target, md
        assert md.get("kiln.target_features"), md
        if expected_target == "x86_64-avx512":
            assert "AVX-512" in md["kiln.target_features"], md
        assert dict(d.ep_options) == {"target": expected_target, "disabled_ops": ""}
        assert d.device.type == ort.OrtHardwareDeviceType.CPU
        assert d.device.metadata.get("is_virtual", "0") != "1"
        # exactly one CPU EP device is still there, and kiln is listed once
        names = [x.ep_name for x in ort.get_ep_devices()]
        assert names.count("KilnExecutionProvider") == 1
        assert "CPUExecutionProvider" in names


def test_no_virtual_devices_without_suffix(lib_path):
    with registered(lib_path, tu.unique_name("kiln_plain")):
        assert [d for d in tu.kiln_devices() if kiln.is_virtual(d)] == []
        assert kiln.devices(virtual=True) == []


def test_virtual_devices(lib_path):
    host = tu.host_target()
    others = set(kiln.TARGETS) - {host}
    with registered(lib_path, tu.unique_name("kiln_virt", ".virtual")):
        devs = tu.kiln_devices()
        assert len(devs) == 3, [dict(d.ep_metadata) for d in devs]
        real = [d for d in devs if not kiln.is_virtual(d)]
        virt = [d for d in devs if kiln.is_virtual(d)]
        assert len(real) == 1 and real[0].ep_metadata["kiln.target"] == host
        assert {d.ep_metadata["kiln.target"] for d in virt} == others
        for d in virt:
            assert d.device.metadata.get("is_virtual") == "1"
            assert d.device.metadata.get("kiln.target") == d.ep_metadata.get("kiln.target")
            assert d.ep_vendor == "kiln" and d.ep_metadata.get("version") == "0.1.0"
            assert d.ep_options.get("target") == d.ep_metadata["kiln.target"]


@pytest.mark.parametrize("target", ["x86_64-avx2", "x86_64-generic"])
@pytest.mark.parametrize("model", ["add_mul_relu", "all_ops", "split"])
def test_session_on_virtual_device(lib_path, models, target, model):
    with registered(lib_path, tu.unique_name("kiln_vrun", ".virtual")):
        dev = _by_target(tu.kiln_devices())[target]
        if target != tu.host_target():
            assert kiln.is_virtual(dev)
        run = tu.check_against_cpu(models[model], dev)
        assert run.created_delta("partitions_compiled") >= 1
        assert run.run_delta("compute_calls") >= 1


def test_max_target_lowers_host_target(lib_path, monkeypatch):
    monkeypatch.setenv("KILN_MAX_TARGET", "x86_64-avx2")
    expected = tu.host_target("x86_64-avx2")
    with registered(lib_path, tu.unique_name("kiln_max")):
        (d,) = tu.kiln_devices()
        assert d.ep_metadata["kiln.target"] == expected
        assert d.ep_options["target"] == expected
    monkeypatch.delenv("KILN_MAX_TARGET")
    # back to normal once the variable is gone
    with registered(lib_path, tu.unique_name("kiln_max_after")):
        (d,) = tu.kiln_devices()
        assert d.ep_metadata["kiln.target"] == tu.host_target()


def test_max_target_with_virtual(lib_path, models, monkeypatch):
    monkeypatch.setenv("KILN_MAX_TARGET", "x86_64-avx2")
    expected = tu.host_target("x86_64-avx2")
    with registered(lib_path, tu.unique_name("kiln_maxv", ".virtual")):
        by_t = _by_target(tu.kiln_devices())
        assert set(by_t) == set(kiln.TARGETS)
        assert not kiln.is_virtual(by_t[expected])
        for t, d in by_t.items():
            assert kiln.is_virtual(d) == (t != expected), (t, dict(d.device.metadata))
        # the capped host device still runs correctly
        tu.check_against_cpu(models["all_ops"], by_t[expected])


def test_max_target_generic(lib_path, models, monkeypatch):
    monkeypatch.setenv("KILN_MAX_TARGET", "x86_64-generic")
    with registered(lib_path, tu.unique_name("kiln_maxg")):
        (d,) = tu.kiln_devices()
        assert d.ep_metadata["kiln.target"] == "x86_64-generic"
        tu.check_against_cpu(models["add_mul_relu"], d)


def test_max_target_bad_value_fails_registration(lib_path, monkeypatch):
    """Not in the original facts: kiln rejects an unknown KILN_MAX_TARGET at
    registration, naming the variable and the accepted targets."""
    monkeypatch.setenv("KILN_MAX_TARGET", "x86_64-avx9000")
    name = tu.unique_name("kiln_maxbad")
    err = None
    try:
        ort.register_execution_provider_library(name, lib_path)
    except Exception as exc:  # noqa: BLE001
        err = (type(exc), str(exc))
    if err is None:
        tu.safe_unregister(name)
        pytest.fail("registration with KILN_MAX_TARGET=x86_64-avx9000 should fail")
    assert "KILN_MAX_TARGET" in err[1] and "x86_64-avx2" in err[1], err
    assert not tu.kiln_devices()


def test_target_above_host_is_rejected(lib_path, models, monkeypatch):
    """With the host capped to avx2, compiling for avx512 to *run* is refused
    (it would execute unsupported instructions): InvalidArgument naming both targets."""
    monkeypatch.setenv("KILN_MAX_TARGET", "x86_64-avx2")
    with registered(lib_path, tu.unique_name("kiln_above")):
        (d,) = tu.kiln_devices()
        err = tu.session_error(models["add_mul_relu"], d, options={"target": "x86_64-avx512"})
        tu.assert_invalid_argument(err, "x86_64-avx512", "x86_64-avx2")


_CYCLE_SCRIPT = r"""
import gc, sys
import numpy as np
import onnxruntime as ort
lib, model = sys.argv[1], sys.argv[2]
x = {n: np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32) for n in "AB"}
ref = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(None, x)[0]
for i in range(3):
    name = f"kiln_sub_{i}" + (".virtual" if i == 1 else "")
    ort.register_execution_provider_library(name, lib)
    dev = [d for d in ort.get_ep_devices() if d.ep_name == "KilnExecutionProvider"][0]
    so = ort.SessionOptions()
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    so.add_provider_for_devices([dev], {"claim": "all"})
    sess = ort.InferenceSession(model, so, enable_fallback=0)
    y = sess.run(None, x)[0]
    np.testing.assert_allclose(y, ref, rtol=1e-5, atol=1e-6)
    del sess, so, dev
    gc.collect()
    ort.unregister_execution_provider_library(name)
    assert not [d for d in ort.get_ep_devices() if d.ep_name == "KilnExecutionProvider"]
print("cycles ok")
"""


def test_cycles_in_fresh_process(lib_path, models):
    """register -> session -> unregister three times in a process that never
    loads the library through ctypes, so ORT really unloads it in between, and
    the interpreter must exit cleanly (exit code 0, no crash at shutdown)."""
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-c", _CYCLE_SCRIPT, lib_path, models["add_mul_relu"]],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"exit code {p.returncode}\n{p.stdout}\n{p.stderr}"
    assert "cycles ok" in p.stdout
