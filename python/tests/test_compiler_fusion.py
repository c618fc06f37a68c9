"""kiln's fusion patterns (issue #5), each exactly and as near misses.

For each pattern kiln's compiler fuses — erf-GELU, tanh-GELU, decomposed
LayerNorm, decomposed Softmax (Exp/ReduceSum/Div), bias + activation +
residual epilogues after a MatMul — ``models_lib.fusion_cases()`` has graphs
that are exactly the pattern (``fuse_*``) and graphs that look like it but must
not be fused or must be fused differently (``miss_*``: a constant changed
(0.5 -> 0.6, sqrt2 -> sqrt3, 0.044715 -> 0.05), another axis, an intermediate
with an extra consumer inside the graph or as a graph output, a bias that
broadcasts per row or is a graph input). Plus the Softmax op in both
semantics (opset 13, and opset 11's flatten-to-2-D) and the Gemm attribute
variants (transA/transB/alpha/beta, bias of every broadcastable shape).

Both kinds must give the CPU EP's result (whether kiln fused is its own
business; a near miss fused by mistake shows up as wrong numbers). Each case
runs in two session configurations, kiln and the CPU EP alike:

* ``raw`` — ``ORT_DISABLE_ALL``: ORT hands kiln the graph as written, so
  kiln's own pattern matching is what runs. kiln must also match the float64
  reference evaluation (onnx's reference evaluator on a float64 copy; numpy
  for opset-11 Softmax, which the evaluator gets wrong).
* ``ort-opt`` — ORT's default ``ORT_ENABLE_ALL``: ORT applies its basic
  fusions (LayerNormFusion, MatMulAddFusion into Reshape/Gemm/Reshape,
  constant folding of Shape subgraphs) *before* kiln's GetCapability, so kiln
  sees ORT's rewritten graph. Compared with the CPU EP at the same level only:
  ORT 1.31.1's LayerNormFusion also fuses ``Pow(x - mean, 4)`` (a near miss)
  into LayerNormalization, which makes both EPs equally wrong there (pinned by
  ``test_ort_fuses_a_wrong_layernorm_so_raw_graphs_are_the_oracle``).

All these graphs use only ops kiln supports with static shapes, so kiln must
take every node (``session.disable_cpu_ep_fallback=1``).

Tolerance: rtol 1e-4, atol 1e-5 (``models_lib.TOL_ELEMENTWISE``): single
GEMMs with K <= 96 and elementwise chains whose f32 results differ between
correct implementations only by the exp/erf/tanh approximations and rounding
(a few ulp, ~1e-6 on these O(1) values).

The terminal summary lists, per case, the step count kiln reports in the
EPContext node's ``notes`` attribute: where a fuse_ case has fewer steps than
its near misses, the fusion fired (informational, not asserted).
"""
from __future__ import annotations

from typing import Dict, List

import numpy as np
import onnxruntime as ort
import pytest

import kiln_testutil as tu
import models_lib as ml

CPU = "CPUExecutionProvider"
CASES = ml.fusion_cases()
NOTES: Dict[str, str] = {}


def _summary() -> List[str]:
    return [f"{n:34s} {NOTES[n]}" for n in sorted(NOTES, key=lambda n: (ml_pattern(n), n))]


def ml_pattern(name: str) -> str:
    c = next((c for c in CASES if c.name == name), None)
    return c.pattern if c and c.pattern else ""


tu.TERMINAL_SUMMARY["kiln: fusion cases (compiled notes, informational)"] = _summary


def test_fusion_case_list():
    patterns = {}
    for c in CASES:
        patterns.setdefault(c.pattern, set()).add(c.matches)
    for p in ("gelu_erf", "gelu_tanh", "layernorm", "softmax", "gemm_epilogue"):
        assert patterns.get(p) == {True, False}, f"pattern {p} needs exact and near-miss cases: {patterns.get(p)}"


ORT_OPT = {"raw": ort.GraphOptimizationLevel.ORT_DISABLE_ALL, "ort-opt": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}


@pytest.mark.parametrize("graph_opt", list(ORT_OPT))
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_fusion_case_matches_cpu(case: ml.ModelCase, graph_opt, kiln_dev, tmp_path):
    level = ORT_OPT[graph_opt]
    path = case.save(str(tmp_path))
    feeds = case.feeds(0)
    names, want = tu.run_cpu(path, feeds, opt_level=level)
    run = tu.run_fully_on_kiln(path, kiln_dev, feeds, opt_level=level)
    assert run.nodes_on(CPU) == [], f"nodes left to the CPU EP: {run.nodes_on(CPU)}"
    assert run.created_delta("partitions_compiled") >= 1
    assert run.output_names == names
    for name, e, a in zip(names, want, run.outputs):
        assert a.shape == e.shape and a.dtype == e.dtype, f"output {name}: {a.shape}/{a.dtype} vs {e.shape}/{e.dtype}"
        np.testing.assert_allclose(a, e, rtol=case.rtol, atol=case.atol,
                                   err_msg=f"{case.name} ({graph_opt}): kiln vs CPU EP, {name}")
    if graph_opt != "raw":
        return  # ORT rewrote the graph for both EPs (and may get it wrong: see the module docstring)
    ref = ml.reference_f64(case, feeds)
    for name, e, a in zip(names, ref, run.outputs):
        np.testing.assert_allclose(a, e, rtol=case.rtol, atol=case.atol,
                                   err_msg=f"{case.name} ({graph_opt}): kiln vs float64 reference, {name}")

    # informational: what kiln compiled (kiln's own fusions: the compile API hands
    # kiln the graph without ORT's fusions), from the EPContext notes
    try:
        data = tu.compile_model(path, kiln_dev, embed=True, to="bytes")
        notes = [tu.attrs_of(n).get("notes", b"") for n in tu.ep_context_nodes(data)]
        NOTES[case.name] = " | ".join((x.decode() if isinstance(x, bytes) else str(x)) for x in notes)
    except tu.KilnSessionError as e:  # recorded, the EPContext tests judge compiling
        NOTES[case.name] = f"(compile API failed: {e})"


def test_ort_fuses_a_wrong_layernorm_so_raw_graphs_are_the_oracle(tmp_path):
    """Why kiln's own fusions are judged on ``ORT_DISABLE_ALL`` sessions and the
    float64 reference: ORT 1.31.1's basic LayerNormFusion rewrites
    ``Pow(x - mean, 4)`` as a LayerNormalization, so its CPU EP gets the near
    miss wrong (by ~2) at its default optimization level. If this starts
    failing, ORT fixed it and the ORT-optimised comparison can use the float64
    reference too."""
    case = next(c for c in CASES if c.name == "miss_layernorm_pow4")
    path = case.save(str(tmp_path))
    feeds = case.feeds(0)
    ref = ml.reference_f64(case, feeds)[0]
    _, raw = tu.run_cpu(path, feeds, opt_level=ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    _, opt = tu.run_cpu(path, feeds)
    np.testing.assert_allclose(raw[0], ref, rtol=case.rtol, atol=case.atol)
    assert np.abs(opt[0] - ref).max() > 0.1
