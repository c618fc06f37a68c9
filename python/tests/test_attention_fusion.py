"""kiln's fused attention (issue #14) against ONNX Runtime's CPU EP.

BERT-style encoders from ``models_lib.bert`` (the HF export's form:
``Transpose(Reshape(x, [B,S,H,D]), [0,2,1,3])`` heads, K as ``[0,2,3,1]``,
scores divided by ``sqrt(D)``, the extended mask ``(1 - m) * -10000`` of shape
``[B,1,1,S]`` added, Softmax, product with V, heads merged back) with symbolic
batch and sequence, with and without a mask, each run at two shapes in one
session (so kiln specialises the shape-generic partition twice), at
``ORT_DISABLE_ALL`` (the graph as exported, what the compile API gives kiln)
and ORT's default ``ORT_ENABLE_ALL``. Masks keep a random prefix of each row
(row 0 everything), so padded keys matter.

The same for every export form ``models_lib.bert(attn=...)`` builds (see its
docstring): BERT/MiniLM ("eager", mask ``(1 - m) * -10000``), RoBERTa (the
same with ``finfo(float32).min``), ViT (``k.transpose(-1, -2)`` kept, ``*
scaling``; shapes with the CLS token's odd length), DistilBERT (``q /
sqrt(D)``, the ``masked_fill`` mask with ``finfo.min`` or ``-inf``) and
PyTorch's SDPA export (Q and Kᵀ scaled by ``Sqrt(scale)``, HF's [B,1,S,S]
float mask or the [B,1,1,S] one).

That the fusion fires is checked on static-shape copies through the compile
API: the EPContext node's notes list the compiled program's ops, which must
show ``Attention(QKV)+Mask`` (or ``Attention(QKV)``) and ``MatMul(3 weights)``
(Q, K and V's projections as one product) once per layer and no ``Softmax``;
at a hidden size that is not whole panels (48) the projections stay three.
paraphrase-MiniLM-L3-v2 against the CPU EP is ``test_real_models.py``'s.

Fully padded rows (an attention mask row of zeros) are compared against the
CPU EP too: ``finfo.min`` gives uniform weights, DistilBERT's ``-inf`` fill
NaN, fused or not.

Tolerance: the models' own (``models_lib``: BERT stacks, GEMM chains).
"""
from __future__ import annotations

import numpy as np
import onnxruntime as ort
import pytest

import kiln_testutil as tu
import models_lib as ml

CPU = "CPUExecutionProvider"
LEVELS = {"raw": ort.GraphOptimizationLevel.ORT_DISABLE_ALL, "ort-opt": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}
SHAPES = [(2, 7), (3, 16)]
FINFO_MIN = float(np.finfo(np.float32).min)
# export form -> models_lib.bert options
FORMS = {
    "bert": dict(attn="eager"),
    "roberta": dict(attn="eager", mask_value=FINFO_MIN),
    "vit": dict(attn="vit"),
    "distilbert": dict(attn="distilbert"),
    "distilbert_inf": dict(attn="distilbert", fill=-np.inf),
    "sdpa": dict(attn="sdpa"),
    "sdpa_keys": dict(attn="sdpa", sdpa_mask="keys"),
}
# ViT: 197 = 14·14 patches + CLS
FORM_SHAPES = {"vit": [(2, 197), (1, 5)]}


def dynamic_bert(mask: bool, form: str = "bert") -> ml.ModelCase:
    return ml.bert(64, 4, 8, 2, 2, mask=mask, ln="op", act="erf", dynamic_batch=True, dynamic_seq=True,
                   name=f"attention_dyn_{form}_{'mask' if mask else 'nomask'}", **FORMS[form])


@pytest.mark.parametrize("level", list(LEVELS))
@pytest.mark.parametrize("mask", [True, False], ids=["mask", "nomask"])
@pytest.mark.parametrize("form", list(FORMS))
def test_symbolic_batch_and_sequence_match_cpu(form, mask, level, kiln_dev, tmp_path):
    if not mask and form in ("roberta", "distilbert_inf", "sdpa_keys"):
        pytest.skip("the same graph as another form's without a mask")
    case = dynamic_bert(mask, form)
    path = case.save(str(tmp_path))
    shapes = FORM_SHAPES.get(form, SHAPES)
    feeds = [case.feeds(seed, batch=b, seq=s) for seed, (b, s) in enumerate(shapes)]
    if mask:
        assert any((f["attention_mask"] == 0).any() for f in feeds), "the masks must pad something"
    run = tu.run_fully_on_kiln(path, kiln_dev, feeds_seq=feeds, opt_level=LEVELS[level])
    assert run.nodes_on(CPU) == []
    assert len(run.all_outputs) == len(shapes)
    for f, got, (b, s) in zip(feeds, run.all_outputs, shapes):
        names, want = tu.run_cpu(path, f, opt_level=LEVELS[level])
        assert got[0].shape == (b, s, 64)
        np.testing.assert_allclose(got[0], want[0], rtol=case.rtol, atol=case.atol,
                                   err_msg=f"{case.name} at batch {b}, seq {s} ({level})")


def assert_whole_kiln_matches_cpu(case: ml.ModelCase, path: str, kiln_dev) -> None:
    """The model at ``case``'s first feeds, whole on kiln, gives the CPU EP's outputs (both
    without ORT's graph optimisations)."""
    feeds = case.feeds(0)
    names, want = tu.run_cpu(path, feeds, opt_level=LEVELS["raw"])
    run = tu.run_fully_on_kiln(path, kiln_dev, feeds, opt_level=LEVELS["raw"])
    for name, e, a in zip(names, want, run.outputs):
        np.testing.assert_allclose(a, e, rtol=case.rtol, atol=case.atol, err_msg=name)


def compiled_notes(path: str, kiln_dev) -> str:
    return " | ".join(tu.compiled_notes(path, kiln_dev))


@pytest.mark.parametrize("mask", [True, False], ids=["mask", "nomask"])
@pytest.mark.parametrize("form", list(FORMS))
def test_static_encoders_compile_to_fused_attention(form, mask, kiln_dev, tmp_path):
    if not mask and form in ("roberta", "distilbert_inf", "sdpa_keys"):
        pytest.skip("the same graph as another form's without a mask")
    seq = 17 if form == "vit" else 16
    case = ml.bert(64, 4, seq, 2, 2, mask=mask, ln="op", act="erf", name=f"attention_static_{form}_{mask}",
                   **FORMS[form])
    path = case.save(str(tmp_path))
    notes = compiled_notes(path, kiln_dev)
    # Q, K and V's projections are one product (three packed weights) that
    # the attention reads packed.
    op = "Attention(QKV)+Mask x2" if mask else "Attention(QKV) x2"
    assert op in notes and "Softmax" not in notes, notes
    assert "MatMul(3 weights)+Bias x2" in notes, notes
    if form.startswith("distilbert"):
        # the [B,H,S,S] bool mask is gone: the fused op reads [B,1,1,S]
        assert "Expand" not in notes and ("Where x2" in notes) == mask, notes
    # and the fused program computes what the CPU EP does
    assert_whole_kiln_matches_cpu(case, path, kiln_dev)


@pytest.mark.parametrize("mask", [True, False], ids=["mask", "nomask"])
def test_projections_stay_three_products_where_a_width_is_not_whole_panels(mask, kiln_dev, tmp_path):
    """Near miss of the Q/K/V merge: a hidden size of 48 (4 heads of 12) is not a multiple of
    32, the widest panel, so the projections stay three products and the attention reads
    Q, K and V as separate values (still fused, still right)."""
    case = ml.bert(48, 4, 16, 2, 2, mask=mask, ln="op", act="erf", name=f"attention_width48_{mask}")
    path = case.save(str(tmp_path))
    notes = compiled_notes(path, kiln_dev)
    op = "Attention+Mask x2" if mask else "Attention x2"
    assert op in notes and "QKV" not in notes and "3 weights" not in notes, notes
    assert_whole_kiln_matches_cpu(case, path, kiln_dev)


def test_a_softmax_read_elsewhere_keeps_attention_unfused(kiln_dev, tmp_path):
    """Near miss: the attention probabilities are also a graph output, so the
    score matrix must exist and kiln leaves the ops as they are (still right)."""
    import onnx
    case = ml.bert(64, 4, 16, 1, 1, mask=True, ln="op", act="erf", name="attention_probs_out")
    model = case.model
    probs = next(n.output[0] for n in model.graph.node if n.op_type == "Softmax")
    model.graph.output.append(onnx.helper.make_tensor_value_info(probs, onnx.TensorProto.FLOAT, [1, 4, 16, 16]))
    path = str(tmp_path / "probs_out.onnx")
    onnx.save(model, path)
    notes = compiled_notes(path, kiln_dev)
    assert "Attention" not in notes and "Softmax x1" in notes, notes
    assert_whole_kiln_matches_cpu(case, path, kiln_dev)


def test_a_fill_the_sum_does_not_absorb_keeps_attention_unfused(kiln_dev, tmp_path):
    """Near miss: ``masked_fill(mask, -10000)`` is not ``scores + mask`` (a
    fully padded row would not get uniform weights), so it stays as it is."""
    case = ml.bert(64, 4, 16, 2, 1, mask=True, ln="op", act="erf", attn="distilbert", fill=-10000.0,
                   name="attention_fill_10000")
    path = case.save(str(tmp_path))
    notes = compiled_notes(path, kiln_dev)
    assert "Attention" not in notes and "Softmax x1" in notes, notes
    assert_whole_kiln_matches_cpu(case, path, kiln_dev)


@pytest.mark.parametrize("level", list(LEVELS))
@pytest.mark.parametrize("form", ["roberta", "distilbert", "distilbert_inf", "sdpa"])
def test_fully_padded_rows_match_cpu(form, level, kiln_dev, tmp_path):
    """Batch row 1 pads every key: ``finfo.min`` (added or filled) gives it
    uniform weights, ``-inf`` NaN, in ORT's unfused graph and kiln's fused
    op alike (see ``compiler::attention``'s doc)."""
    case = dynamic_bert(True, form)
    path = case.save(str(tmp_path))
    feeds = [case.feeds(seed, batch=b, seq=s) for seed, (b, s) in enumerate(SHAPES)]
    for f in feeds:
        f["attention_mask"][1] = 0
    run = tu.run_fully_on_kiln(path, kiln_dev, feeds_seq=feeds, opt_level=LEVELS[level])
    assert run.nodes_on(CPU) == []
    for f, got in zip(feeds, run.all_outputs):
        names, want = tu.run_cpu(path, f, opt_level=LEVELS["raw"])
        nan_rows = np.isnan(want[0]).all(axis=(1, 2))
        assert list(nan_rows) == [i == 1 and form == "distilbert_inf" for i in range(len(nan_rows))], nan_rows
        assert not np.isnan(want[0][~nan_rows]).any()
        np.testing.assert_allclose(got[0], want[0], rtol=case.rtol, atol=case.atol, equal_nan=True,
                                   err_msg=f"{case.name} ({level})")
