"""Running the bundled models on kiln's host device and comparing with ORT's CPU EP."""
from __future__ import annotations

import pytest
from onnxruntime.capi import onnxruntime_pybind11_state as C

import onnxruntime_ep_kiln as kiln
import kiln_testutil as tu

KILN = kiln.EP_NAME
CPU = "CPUExecutionProvider"
NO_FALLBACK = {"session.disable_cpu_ep_fallback": "1"}


def test_add_mul_relu(models, kiln_dev):
    run = tu.check_against_cpu(models["add_mul_relu"], kiln_dev)
    assert run.created_delta("eps_created") >= 1
    assert run.created_delta("partitions_compiled") == 1
    assert run.created_delta("nodes_compiled") == 3
    assert run.run_delta("compute_calls") >= 1
    assert KILN in run.providers
    assert sorted(op for _, op in run.nodes_on(KILN)) == ["Add", "Mul", "Relu"]
    assert run.nodes_on(CPU) == []
    assert run.subgraphs_on(KILN) == 1


def test_repeated_runs_call_kiln_each_time(models, kiln_dev):
    feeds = tu.make_feeds(models["add_mul_relu"], seed=3)
    names, expected = tu.run_cpu(models["add_mul_relu"], feeds)
    run = tu.run_kiln(models["add_mul_relu"], kiln_dev, feeds, runs=4)
    tu.assert_outputs_close(names, expected, run.outputs)
    assert run.run_delta("compute_calls") == 4


def test_split(models, kiln_dev):
    run = tu.check_against_cpu(models["split"], kiln_dev)
    assert run.created_delta("partitions_compiled") >= 2
    # split.onnx gives three kiln groups; the chains before Atan and after
    # Asinh are independent, so they are merged into one partition
    assert run.created_delta("partitions_compiled") == 2
    assert run.created_delta("nodes_compiled") == 7
    assert run.run_delta("compute_calls") >= 2
    assert sorted(op for _, op in run.nodes_on(CPU)) == ["Asinh", "Atan"]
    assert sorted(op for _, op in run.nodes_on(KILN)) == sorted(
        ["Add", "Relu", "Mul", "Tanh", "Sub", "Neg", "Abs"])
    assert run.subgraphs_on(KILN) == 2


def test_all_ops(models, kiln_dev):
    run = tu.check_against_cpu(models["all_ops"], kiln_dev)
    assert run.created_delta("partitions_compiled") == 1
    assert run.created_delta("nodes_compiled") == 21
    assert run.run_delta("compute_calls") >= 1
    assert {op for _, op in run.nodes_on(KILN)} == set(tu.SUPPORTED_OPS)
    assert run.nodes_on(CPU) == []


@pytest.mark.parametrize("seed", [1, 2])
def test_all_ops_other_inputs(models, kiln_dev, seed):
    tu.check_against_cpu(models["all_ops"], kiln_dev, seed=seed)


def test_demo_model(models, kiln_dev):
    run = tu.check_against_cpu(models["demo"], kiln_dev)
    # LayerNorm, MatMul + bias, erf-GELU, MatMul + bias, residual: all kiln's, one partition
    assert run.created_delta("partitions_compiled") == 1
    assert run.nodes_on(CPU) == []
    assert len(run.nodes_on(KILN)) == run.created_delta("nodes_compiled") >= 9


def test_unsupported_runs_on_cpu(models, kiln_dev):
    run = tu.check_against_cpu(models["unsupported"], kiln_dev)
    assert run.created_delta("partitions_compiled") == 0
    assert run.created_delta("nodes_compiled") == 0
    assert run.run_delta("compute_calls") == 0
    assert run.nodes_on(KILN) == []
    assert sorted(op for _, op in run.nodes_on(CPU)) == ["Asinh", "Asinh", "Atan", "Cosh"]


def test_no_cpu_fallback_fully_supported(models, kiln_dev):
    for name in ("add_mul_relu", "all_ops"):
        run = tu.check_against_cpu(models[name], kiln_dev, config=NO_FALLBACK)
        assert run.created_delta("partitions_compiled") == 1


def test_no_cpu_fallback_split_fails(models, kiln_dev):
    err = tu.session_error(models["split"], kiln_dev, config=NO_FALLBACK)
    assert err is not None, "split.onnx needs the CPU EP for Atan/Asinh; creation must fail"
    assert err.stage == "session creation"
    assert err.exc_type is C.Fail, err
    assert "fallback to CPU EP has been explicitly disabled" in err.message, err


def test_no_cpu_fallback_unsupported_fails(models, kiln_dev):
    err = tu.session_error(models["unsupported"], kiln_dev, config=NO_FALLBACK)
    assert err is not None and err.stage == "session creation"


# --------------------------------------------------------------------------
# options
# --------------------------------------------------------------------------
def test_default_options_explicitly(models, kiln_dev):
    opts = {"target": kiln_dev.ep_options["target"], "disabled_ops": ""}
    run = tu.check_against_cpu(models["add_mul_relu"], kiln_dev, options=opts)
    assert run.created_delta("partitions_compiled") == 1


@pytest.mark.parametrize("target", ["x86_64-avx2", "x86_64-generic"])
def test_target_option_lower_than_host(models, kiln_dev, target):
    run = tu.check_against_cpu(models["all_ops"], kiln_dev, options={"target": target})
    assert run.created_delta("partitions_compiled") == 1


def test_disabled_ops_option(models, kiln_dev):
    run = tu.check_against_cpu(models["add_mul_relu"], kiln_dev, options={"disabled_ops": "Mul"})
    # Add | Mul (CPU) | Relu -> two kiln groups
    assert run.created_delta("nodes_compiled") == 2
    assert run.created_delta("partitions_compiled") == 2
    assert [op for _, op in run.nodes_on(CPU)] == ["Mul"]


def test_disabled_ops_several(models, kiln_dev):
    run = tu.check_against_cpu(models["split"], kiln_dev,
                               options={"disabled_ops": "Tanh,Abs"})
    assert sorted(op for _, op in run.nodes_on(CPU)) == ["Abs", "Asinh", "Atan", "Tanh"]


def test_disabled_ops_everything_falls_back(models, kiln_dev):
    run = tu.check_against_cpu(models["add_mul_relu"], kiln_dev,
                               options={"disabled_ops": "Add,Mul,Relu"})
    assert run.created_delta("partitions_compiled") == 0


def test_bad_target_value(models, kiln_dev):
    err = tu.session_error(models["add_mul_relu"], kiln_dev, options={"target": "riscv64-rvv"})
    tu.assert_invalid_argument(err, "target", "riscv64-rvv", *kiln.TARGETS)


def test_bad_disabled_ops_value(models, kiln_dev):
    err = tu.session_error(models["add_mul_relu"], kiln_dev,
                           options={"disabled_ops": "Relu,NotAnOp"})
    tu.assert_invalid_argument(err, "disabled_ops", "NotAnOp", "Relu", "Sigmoid")


def test_unknown_option(models, kiln_dev):
    err = tu.session_error(models["add_mul_relu"], kiln_dev, options={"bogus_knob": "1"})
    tu.assert_invalid_argument(err, "bogus_knob")


def test_kiln_still_works_after_errors(models, kiln_dev):
    """Failed session creations leave kiln usable."""
    tu.session_error(models["add_mul_relu"], kiln_dev, options={"target": "nope"})
    tu.session_error(models["split"], kiln_dev, config=NO_FALLBACK)
    tu.check_against_cpu(models["add_mul_relu"], kiln_dev)


def test_stats_are_process_wide(models, kiln_dev, lib_path):
    """The counters are per process: the same numbers through any handle."""
    tu.check_against_cpu(models["add_mul_relu"], kiln_dev)
    via_helper = kiln.stats()
    via_path = kiln.stats(lib_path)
    assert via_helper == via_path
    assert via_path["eps_created"] >= 1
    assert via_path["partitions_compiled"] >= 1
    assert via_path["nodes_compiled"] >= 3
    assert via_path["compute_calls"] >= 1


@pytest.mark.filterwarnings("ignore:Specified 'providers'")
def test_default_python_fallback_hides_option_errors(models, kiln_dev, capfd):
    """Documents ORT's Python wrapper: without enable_fallback=0, a kiln error at
    session creation is printed ("EP Error ...") and the session silently runs
    on the CPU EP alone. onnxruntime_ep_kiln.create_session() turns that off."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.add_provider_for_devices([kiln_dev], {"target": "not-a-target"})
    before = kiln.stats()
    sess = ort.InferenceSession(models["add_mul_relu"], so)
    providers = sess.get_providers()
    del sess
    assert providers == ["CPUExecutionProvider"]
    assert kiln.stats()["eps_created"] == before["eps_created"]
    assert "EP Error" in capfd.readouterr().out

    err = None
    try:
        kiln.create_session(models["add_mul_relu"], kiln_dev, {"target": "not-a-target"})
    except Exception as exc:  # noqa: BLE001
        err = (type(exc), str(exc))
    assert err is not None and "not-a-target" in err[1] and "target" in err[1], err


def test_create_session_helper(models, kiln_dev):
    feeds = tu.make_feeds(models["add_mul_relu"])
    names, expected = tu.run_cpu(models["add_mul_relu"], feeds)
    sess = kiln.create_session(models["add_mul_relu"], kiln_dev)
    try:
        assert sess.get_providers()[0] == KILN
        tu.assert_outputs_close(names, expected, sess.run(names, feeds))
    finally:
        del sess
