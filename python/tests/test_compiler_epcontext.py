"""Issue #5 models through an EPContext round trip.

Every static project model (``models_lib.all_static_cases()``: the MLPs and
BERT-style encoders of test_compiler_models.py) is run on kiln, then compiled
with ``ep.context_enable=1`` in embed mode 0 (``_ctx.onnx`` + ``_kiln.bin``)
and embed mode 1 (payload inside the model). Loading the ``_ctx.onnx``:

* compiles nothing — kiln's ``partitions_compiled`` counter does not move and
  ``context_graphs_loaded`` goes up by the number of partitions kiln compiled
  for the original;
* takes every node (``session.disable_cpu_ep_fallback=1``);
* gives the original kiln session's outputs: bitwise, or within 1e-6 absolute
  (the same programs and pre-packed weights run on the same inputs; only a
  different reduction split across threads could move a last bit).

Embed mode 0 also must leave kiln's weights out of ``_ctx.onnx`` (they live
packed in the binary). The same through the compile API (``ort.ModelCompiler``),
whose graph reaches kiln without ORT's basic fusions: there the original is a
kiln session with ``ORT_DISABLE_ALL`` (which gets the very same graph; a
default session's program, compiled after ORT's MatMulAddFusion/LayerNormFusion,
may differ by a few ulp). Also a dynamic-batch model and a partially claimed
static encoder (several partitions with CPU nodes between them).
"""
from __future__ import annotations

import os

import numpy as np
import onnxruntime as ort
import pytest

import kiln_testutil as tu
import models_lib as ml

CPU = "CPUExecutionProvider"
ROUNDTRIP_ATOL = 1e-6
STATIC = ml.all_static_cases()


def assert_same(names, a_outs, b_outs, what):
    for name, a, b in zip(names, a_outs, b_outs):
        assert a.shape == b.shape and a.dtype == b.dtype, f"{what}: output {name}"
        if not np.array_equal(a, b):
            np.testing.assert_allclose(b, a, rtol=0, atol=ROUNDTRIP_ATOL, err_msg=f"{what}: output {name}")


def _roundtrip(case: ml.ModelCase, dev, folder: str, embed: int, route: str = "session", full: bool = True,
               options=None):
    src = case.save(folder)
    feeds = case.feeds(0)
    run = tu.run_fully_on_kiln if full else tu.run_kiln
    # The compile API hands kiln the graph without ORT's optimisations, like an
    # ORT_DISABLE_ALL session; a session (ep.context_enable) after ORT's basic
    # fusions. The original to compare with is the one kiln compiled the same graph in.
    level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL if route == "compile" else None
    orig = run(src, dev, feeds, options=options, opt_level=level)
    compiled = orig.created_delta("partitions_compiled")
    assert compiled >= 1, "kiln compiled nothing for the original model"

    ctx = os.path.join(folder, f"{case.name}_ctx.onnx")
    if route == "session":
        tu.generate_context(src, dev, embed=embed, options=options)
    else:
        tu.compile_model(src, dev, embed=bool(embed), to="file", output=ctx, options=options)
    assert os.path.isfile(ctx), f"no {ctx}: {tu.files_in(folder)}"
    binp = os.path.join(folder, f"{case.name}_kiln.bin")
    nodes = tu.ep_context_nodes(ctx)
    assert len(nodes) == compiled, f"{len(nodes)} EPContext nodes for {compiled} compiled partitions"
    if embed == 0:
        assert os.path.isfile(binp), f"no {binp}: {tu.files_in(folder)}"
        if full:
            # kiln's weights are in the binary, not in the model
            assert os.path.getsize(ctx) < max(64 * 1024, case.weight_bytes // 20), \
                f"_ctx.onnx is {os.path.getsize(ctx)} bytes for {case.weight_bytes} weight bytes"
    else:
        assert not os.path.exists(binp), "embed mode 1 wrote a .bin"

    loaded = run(ctx, dev, feeds, options=options)
    assert loaded.created_delta("partitions_compiled") == 0, "loading the _ctx.onnx compiled"
    assert loaded.created_delta("context_graphs_loaded") == compiled
    if full:
        assert loaded.nodes_on(CPU) == []
    assert loaded.run_delta("compute_calls") >= compiled
    assert loaded.output_names == orig.output_names
    assert_same(orig.output_names, orig.outputs, loaded.outputs, f"embed {embed}, _ctx.onnx vs original on kiln")
    # and still right, not just the same
    names, want = tu.run_cpu(src, feeds)
    for name, e, a in zip(names, want, loaded.outputs):
        np.testing.assert_allclose(a, e, rtol=case.rtol, atol=case.atol, err_msg=f"_ctx.onnx vs CPU EP: {name}")
    return orig, loaded


@pytest.mark.parametrize("embed", [0, 1])
@pytest.mark.parametrize("case", STATIC, ids=[c.name for c in STATIC])
def test_epcontext_roundtrip(case: ml.ModelCase, embed, kiln_dev, tmp_path):
    _roundtrip(case, kiln_dev, str(tmp_path), embed)


@pytest.mark.parametrize("embed", [0, 1])
@pytest.mark.parametrize("case", STATIC, ids=[c.name for c in STATIC])
def test_epcontext_roundtrip_compile_api(case, embed, kiln_dev, tmp_path):
    _roundtrip(case, kiln_dev, str(tmp_path), embed, route="compile")


@pytest.mark.parametrize("embed", [0, 1])
def test_epcontext_roundtrip_dynamic_batch(embed, kiln_dev, tmp_path):
    """A dynamic-batch encoder: what kiln compiled round-trips, the CPU EP keeps the rest."""
    case = ml.dynamic_cases()[0]
    src = case.save(str(tmp_path))
    probe = tu.run_kiln(src, kiln_dev, case.feeds(0))
    if probe.created_delta("partitions_compiled") == 0:
        pytest.skip("kiln claims nothing of the dynamic-batch encoder; nothing to round-trip")
    orig, loaded = _roundtrip(case, kiln_dev, str(tmp_path), embed, full=False)
    f1 = case.feeds(1, batch=1)
    names, want = tu.run_cpu(src, f1)
    run = tu.run_kiln(os.path.join(str(tmp_path), f"{case.name}_ctx.onnx"), kiln_dev, f1)
    assert run.created_delta("partitions_compiled") == 0
    for name, e, a in zip(names, want, run.outputs):
        np.testing.assert_allclose(a, e, rtol=case.rtol, atol=case.atol, err_msg=f"batch 1: {name}")


@pytest.mark.parametrize("embed", [0, 1])
def test_epcontext_roundtrip_partial_claim(embed, kiln_dev, tmp_path):
    """A static 2-layer encoder with Softmax left to the CPU EP (``disabled_ops``):
    several kiln partitions with CPU nodes between them, each layer's partitions
    sharing the mask input. The _ctx.onnx mixes EPContext nodes and CPU nodes
    (which ORT optimises again at load) and must run and give the same outputs.
    ORT orders the inputs of the fused node it makes for a reloaded EPContext
    node its own way (here not the EPContext node's order), so kiln must bind
    them by name: a positional binding fed ``extended_mask/Mul_out`` [1,1,1,8]
    where the program expects ``layer0/attention/Softmax_out`` [1,2,8,8]."""
    case = ml.bert(64, 2, 8, 1, 2, mask=True, ln="op", act="erf", name="bert_partial_softmax_on_cpu")
    orig, loaded = _roundtrip(case, kiln_dev, str(tmp_path), embed, full=False,
                              options={"disabled_ops": "Softmax"})
    assert [n for n in orig.nodes_on("CPUExecutionProvider") if n[1] == "Softmax"], "Softmax should be on the CPU EP"
    assert orig.created_delta("partitions_compiled") >= 2
