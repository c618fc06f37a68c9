"""kiln's newer ABI members and its lifetime in the host process, through
ORT 1.31.1's public Python API.

* ``get_hardware_device_ep_incompatibility_details`` reads OrtEpFactory
  member 13 without looking at ``ort_version_supported`` (it crashed when
  kiln's factory ended after member 12);
* ORT calls ``IsConcurrentRunSupported`` and ``OnSessionInitializationEnd``
  once per session;
* unregistering kiln while sessions live, running and dropping them
  afterwards, registering again, or exiting with sessions alive never
  crashes and leaves no mapping of a context binary behind (each scenario in
  a subprocess, so a crash fails the test instead of ending pytest).
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import onnxruntime as ort
from onnxruntime.capi import _pybind_state as C

import kiln_testutil as tu
import onnxruntime_ep_kiln as kiln

EP = "KilnExecutionProvider"
TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(TESTS_DIR)
REPO_DIR = os.path.dirname(PYTHON_DIR)
DEMO = os.path.join(REPO_DIR, "models", "demo.onnx")


def test_incompatibility_details_for_every_hardware_device(kiln_dev, lib_path):
    before = tu.stats(lib_path)["device_queries"]
    hardware = C.get_hardware_devices()
    assert hardware, "ORT lists no hardware device"
    for hw in hardware:
        details = C.get_hardware_device_ep_incompatibility_details(EP, hw)
        if hw.type == C.OrtHardwareDeviceType.CPU:
            assert details["reasons_bitmask"] == 0, details
            assert details["error_code"] == 0, details
            assert f"target {tu.host_target()}" in details["notes"], details
        else:
            assert details["reasons_bitmask"] & int(C.OrtDeviceEpIncompatibilityReason.DEVICE_INCOMPATIBLE)
            assert "CPUs only" in details["notes"]
    # kiln's own device entry names the same CPU
    details = C.get_hardware_device_ep_incompatibility_details(EP, kiln_dev.device)
    assert details["reasons_bitmask"] == 0
    assert tu.stats(lib_path)["device_queries"] == before + len(hardware) + 1


def test_ort_asks_concurrency_and_ends_initialization_once_per_session(kiln_dev, lib_path):
    before = tu.stats(lib_path)
    sessions = [ort.InferenceSession(DEMO, tu.kiln_session_options(kiln_dev)) for _ in range(3)]
    after = tu.stats(lib_path)
    assert after["concurrency_queries"] - before["concurrency_queries"] == 3
    assert after["sessions_initialized"] - before["sessions_initialized"] == 3
    feeds = tu.make_feeds(DEMO)
    outs = [s.run(None, feeds)[0] for s in sessions]
    assert all(np.array_equal(outs[0], o) for o in outs[1:])
    del sessions
    assert tu.stats(lib_path)["eps_released"] - before["eps_released"] == 3


def _lib() -> str:
    return os.path.abspath(kiln.get_library_path())


def _run_script(body: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """Runs `body` in a fresh Python with kiln's package and test helpers importable."""
    prelude = textwrap.dedent(f"""
        import gc, os, sys
        sys.path[:0] = [{PYTHON_DIR!r}, {TESTS_DIR!r}]
        import numpy as np
        import onnxruntime as ort
        import kiln_testutil as tu
        LIB = {_lib()!r}
        DEMO = {DEMO!r}
        EP = {EP!r}

        def register(name):
            ort.register_execution_provider_library(name, LIB)
            return [d for d in ort.get_ep_devices() if d.ep_name == EP and d.ep_metadata.get("kiln.target")][0]

        def session(model, dev, config=None):
            so = ort.SessionOptions()
            so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
            for k, v in (config or {{}}).items():
                so.add_session_config_entry(k, v)
            so.add_provider_for_devices([dev], {{}})
            return ort.InferenceSession(model, so)

        def bin_mappings():
            with open("/proc/self/maps") as f:
                return [l for l in f if "_kiln.bin" in l]
    """)
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(body)],
        capture_output=True, text=True, timeout=timeout,
    )


def _assert_ok(proc: subprocess.CompletedProcess, marker: str = "DONE"):
    assert proc.returncode == 0 and marker in proc.stdout, (
        f"rc={proc.returncode}\nstdout:\n{proc.stdout[-3000:]}\nstderr:\n{proc.stderr[-3000:]}"
    )


def test_unregister_run_drop_reregister_100_times(tmp_path):
    """register -> sessions (plain and from a mapped compiled model, one of
    them sharing) -> unregister -> run -> drop -> register again -> run, 100
    times; afterwards no factory, EP or binary mapping is left."""
    ctx = tmp_path / "demo_ctx.onnx"
    proc = _run_script(f"""
        ctx = {str(ctx)!r}
        dev = register("kiln_prep")
        so = ort.SessionOptions()
        so.add_provider_for_devices([dev], {{}})
        ort.ModelCompiler(so, DEMO, embed_compiled_data_into_model=False).compile_to_file(ctx)
        del so, dev
        ort.unregister_execution_provider_library("kiln_prep")
        feeds = tu.make_feeds(DEMO)
        want = tu.run_cpu(DEMO, feeds)[1][0]
        for i in range(100):
            dev = register(f"kiln_{{i}}")
            plain = session(DEMO, dev)
            compiled = session(ctx, dev)
            shared = session(ctx, dev, {{"ep.share_ep_contexts": "1"}})
            del dev
            ort.unregister_execution_provider_library(f"kiln_{{i}}")
            for s in (plain, compiled, shared):
                got = s.run(None, feeds)[0]
                assert np.abs(got - want).max() < 1e-4, (i, np.abs(got - want).max())
            del plain, compiled, shared, s
            gc.collect()
            assert not bin_mappings(), bin_mappings()
        dev = register("kiln_last")
        again = session(ctx, dev)
        assert np.abs(again.run(None, feeds)[0] - want).max() < 1e-4
        del again, dev
        ort.unregister_execution_provider_library("kiln_last")
        st = tu.stats(LIB)
        assert st["factories_created"] == st["factories_freed"] == 102, st
        assert st["eps_created"] == st["eps_released"], st
        assert not bin_mappings(), bin_mappings()
        print("DONE", st["factories_created"], st["eps_created"])
    """)
    _assert_ok(proc)


def test_exit_with_live_sessions_after_unregister(tmp_path):
    proc = _run_script("""
        dev = register("kiln_exit")
        s = session(DEMO, dev)
        feeds = tu.make_feeds(DEMO)
        s.run(None, feeds)
        del dev
        ort.unregister_execution_provider_library("kiln_exit")
        s.run(None, feeds)
        print("DONE", flush=True)
        # the interpreter now exits with `s` alive
    """)
    _assert_ok(proc)


def test_register_unregister_loop_while_another_thread_creates_sessions():
    proc = _run_script("""
        import threading
        feeds = tu.make_feeds(DEMO)
        want = tu.run_cpu(DEMO, feeds)[1][0]
        stop = threading.Event()
        errors = []

        def churn():
            for i in range(40):
                try:
                    register(f"kiln_churn_{i}")
                    ort.unregister_execution_provider_library(f"kiln_churn_{i}")
                except Exception as e:  # a race ORT itself reports is fine, a crash is not
                    errors.append(repr(e))
            stop.set()

        dev = register("kiln_steady")
        t = threading.Thread(target=churn)
        t.start()
        runs = 0
        while not stop.is_set() or runs < 20:
            s = session(DEMO, dev)
            assert np.abs(s.run(None, feeds)[0] - want).max() < 1e-4
            del s
            runs += 1
        t.join()
        del dev
        ort.unregister_execution_provider_library("kiln_steady")
        print("DONE", runs, len(errors))
    """)
    _assert_ok(proc)


def test_pytest_run_whose_failing_test_keeps_a_session_alive(tmp_path):
    """The traceback of a failing test holds its kiln session past the
    fixture that unregisters kiln; pytest must still end with rc 1, not 139."""
    (tmp_path / "conftest.py").write_text(textwrap.dedent(f"""
        import sys
        sys.path[:0] = [{PYTHON_DIR!r}, {TESTS_DIR!r}]
        import onnxruntime as ort
        import pytest

        @pytest.fixture(scope="session")
        def kiln_dev():
            ort.register_execution_provider_library("kiln_inner", {_lib()!r})
            yield [d for d in ort.get_ep_devices() if d.ep_name == {EP!r}][0]
            ort.unregister_execution_provider_library("kiln_inner")
    """))
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(f"""
        import onnxruntime as ort
        import kiln_testutil as tu

        def test_fails_holding_a_session(kiln_dev):
            so = ort.SessionOptions()
            so.add_provider_for_devices([kiln_dev], {{}})
            sess = ort.InferenceSession({DEMO!r}, so)
            sess.run(None, tu.make_feeds({DEMO!r}))
            assert sess is None, "deliberate failure"

        def test_passes():
            pass
    """))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
        capture_output=True, text=True, timeout=240, cwd=str(tmp_path),
    )
    assert proc.returncode == 1, f"rc={proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert "1 failed, 1 passed" in proc.stdout, proc.stdout[-3000:]


def test_members_kiln_leaves_null_on_the_paths_users_take(kiln_dev, tmp_path):
    """ORT accepts kiln's NULL members where a user reaches them: profiling
    (CreateProfiler: kiln's partitions still show as ORT node events with
    their times), IOBinding with synchronisation (Sync), dynamic options
    (SetDynamicOptions), and a session run at graph optimisation level
    ENABLE_ALL (layout transformation asks GetPreferredDataLayout)."""
    import json

    so = tu.kiln_session_options(kiln_dev, {"session.disable_cpu_ep_fallback": "1"})
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "kiln_profile")
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    sess = ort.InferenceSession(DEMO, so)
    feeds = tu.make_feeds(DEMO)
    want = tu.run_cpu(DEMO, feeds)[1][0]
    np.testing.assert_allclose(sess.run(None, feeds)[0], want, rtol=1e-4, atol=1e-4)

    binding = sess.io_binding()
    for name, value in feeds.items():
        binding.bind_cpu_input(name, value)
    binding.bind_output(sess.get_outputs()[0].name)
    binding.synchronize_inputs()
    sess.run_with_iobinding(binding)
    binding.synchronize_outputs()
    np.testing.assert_allclose(binding.copy_outputs_to_cpu()[0], want, rtol=1e-4, atol=1e-4)

    sess.set_ep_dynamic_options({"ep.dynamic.workload_type": "Efficient"})
    np.testing.assert_allclose(sess.run(None, feeds)[0], want, rtol=1e-4, atol=1e-4)

    events = json.load(open(sess.end_profiling()))
    kiln_nodes = [e for e in events if e.get("cat") == "Node" and e["name"].startswith(EP)]
    assert kiln_nodes, [e["name"] for e in events]
    assert all(e["dur"] >= 0 and e["args"].get("provider") == EP for e in kiln_nodes), kiln_nodes
