"""kiln's embeddings + LayerNorm fusion (issue #14) against ONNX Runtime's CPU EP.

An HF BERT export's embedding layer, as torch.onnx writes it
(``models_lib.bert_embeddings``): ``input_ids`` gathered from the word table;
position ids sliced from the ``position_ids`` buffer to the sequence length
and gathered; token types a ``token_type_ids`` input, HF's buffered zeros
(sliced and ``Expand``-ed) or absent (DistilBERT); the terms added in the
exporter's order, then ``LayerNormalization`` (or its decomposed form) and a
first projection. kiln makes the gathers, adds and
norm one ``EmbedLayerNormalization`` op (``compiler::embed``).

Checked: symbolic batch and sequence, two shapes in one session, whole on
kiln, against the CPU EP, at ``ORT_DISABLE_ALL`` and ``ORT_ENABLE_ALL``
(ids include a negative one, which ``Gather`` counts from the end); that
the fusion fires, in the compiled program's notes (static copies through
the compile API); the near miss (the sum is also a model output) stays
unfused and right; and an id outside the vocabulary is refused with the
same error as kiln's unfused ``Gather``.

Tolerance: LayerNorm's (1e-5): kiln's sum is the graph's order of f32 adds
and its norm the LayerNormalization kernel's.
"""
from __future__ import annotations

from typing import Optional

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import kiln_testutil as tu
import models_lib as ml

CPU = "CPUExecutionProvider"
LEVELS = {"raw": ort.GraphOptimizationLevel.ORT_DISABLE_ALL, "ort-opt": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}
HIDDEN, VOCAB, MAX_POS = 64, 100, 512
SHAPES = [(2, 7), (3, 16)]
RTOL = ATOL = 1e-5


def embeddings_model(token_types: Optional[str], ln: str = "op", **kw) -> onnx.ModelProto:
    return ml.bert_embeddings(token_types, ln, hidden=HIDDEN, vocab=VOCAB, max_pos=MAX_POS, **kw)


def feeds(model: onnx.ModelProto, batch: int, seq: int, seed: int, bad_id: Optional[int] = None):
    return ml.bert_embeddings_feeds(model, batch, seq, seed, vocab=VOCAB, bad_id=bad_id)


def save(model: onnx.ModelProto, tmp_path, name: str) -> str:
    return tu.save_model(model, tmp_path, name)


def compiled_notes(path: str, kiln_dev) -> str:
    return " | ".join(tu.compiled_notes(path, kiln_dev))


TOKEN_TYPES = {"input": "input", "buffer": "buffer", "none": None}


@pytest.mark.parametrize("level", list(LEVELS))
@pytest.mark.parametrize("ln", ["op", "decomposed"])
@pytest.mark.parametrize("types", list(TOKEN_TYPES))
def test_symbolic_embeddings_match_cpu(types, ln, level, kiln_dev, tmp_path):
    model = embeddings_model(TOKEN_TYPES[types], ln)
    path = save(model, tmp_path, f"embed_{types}_{ln}")
    runs = [feeds(model, b, s, k) for k, (b, s) in enumerate(SHAPES)]
    run = tu.run_fully_on_kiln(path, kiln_dev, feeds_seq=runs, opt_level=LEVELS[level])
    assert run.nodes_on(CPU) == []
    for f, got, (b, s) in zip(runs, run.all_outputs, SHAPES):
        _, want = tu.run_cpu(path, f, opt_level=LEVELS[level])
        assert got[0].shape == (b, s, HIDDEN)
        np.testing.assert_allclose(got[0], want[0], rtol=RTOL, atol=ATOL, err_msg=f"batch {b}, seq {s}")


@pytest.mark.parametrize("ln", ["op", "decomposed"])
@pytest.mark.parametrize("types", list(TOKEN_TYPES))
def test_static_embeddings_compile_to_one_op(types, ln, kiln_dev, tmp_path):
    model = embeddings_model(TOKEN_TYPES[types], ln, dynamic=False)
    path = save(model, tmp_path, f"embed_static_{types}_{ln}")
    notes = compiled_notes(path, kiln_dev)
    terms = 2 if types == "none" else 3
    assert f"EmbedLayerNormalization({terms} terms) x1" in notes, notes
    ops = [part.strip().rsplit(" x", 1)[0] for part in notes.split(";")[0].split(",")]
    assert "Gather" not in ops and "Add" not in ops and "LayerNormalization" not in ops, notes
    f = feeds(model, 2, 8, 0)
    names, want = tu.run_cpu(path, f)
    run = tu.run_fully_on_kiln(path, kiln_dev, f)
    np.testing.assert_allclose(run.outputs[0], want[0], rtol=RTOL, atol=ATOL)


def test_a_sum_that_is_also_an_output_stays_unfused(kiln_dev, tmp_path):
    model = embeddings_model("input", dynamic=False, sum_escapes=True)
    path = save(model, tmp_path, "embed_sum_escapes")
    notes = compiled_notes(path, kiln_dev)
    assert "EmbedLayerNormalization" not in notes and "LayerNormalization x1" in notes, notes
    f = feeds(model, 2, 8, 0)
    names, want = tu.run_cpu(path, f)
    run = tu.run_fully_on_kiln(path, kiln_dev, f)
    for name, e, a in zip(names, want, run.outputs):
        np.testing.assert_allclose(a, e, rtol=RTOL, atol=ATOL, err_msg=name)


@pytest.mark.parametrize("bad_id", [VOCAB, -VOCAB - 1])
def test_an_id_outside_the_vocabulary_is_refused(bad_id, kiln_dev, tmp_path):
    model = embeddings_model("input")
    path = save(model, tmp_path, "embed_bad_id")
    err = tu.expect_error(tu.run_fully_on_kiln, path, kiln_dev, feeds(model, 2, 7, 0, bad_id=bad_id))
    assert err.stage == "run", err
    assert f"Gather index {bad_id} is out of range for an axis of {VOCAB}" in err.message, err
