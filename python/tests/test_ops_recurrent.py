"""LSTM and GRU on kiln against ORT's CPU EP (issue #12), and Silero VAD's LSTM
inside its ``If`` bodies.

Every model has symbolic sequence and batch dims and runs at two shapes from one
session; each test asserts that the recurrent node ran on kiln (ORT's
assignment info) with the EP option ``claim=all`` (the op's kernel is tested,
not the claim rule). The attribute space: direction (forward, reverse,
bidirectional), initial states present or not, bias present or not,
``sequence_lens`` with mixed lengths (0 included), ``clip``, every activation
ONNX allows with and without ``activation_alpha``/``beta``, LSTM
``input_forget`` and peepholes, GRU ``linear_before_reset`` 0 and 1, optional
outputs, and ``layout=1`` (which ORT's CPU EP refuses: compared with the
equivalent ``layout=0`` model there).
"""
from __future__ import annotations

import os
from typing import Dict, List, Optional

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

import kiln_testutil as tu
import onnxruntime_ep_kiln as kiln
import real_corpus as rc

CLAIM_ALL = {"claim": "all"}
INPUT, HIDDEN = 4, 5
#: (seq, batch) the models run at, from one session.
SHAPES = ((3, 2), (5, 3))
#: ORT's recurrent kernels use their own sigmoid/tanh approximations.
RTOL, ATOL = 1e-4, 1e-5


def gates(op: str) -> int:
    return 4 if op == "LSTM" else 3


def build(path: str, op: str, attrs: Dict[str, object], *, bias=True, h0=True, c0=True, seq_lens=False,
          peepholes=False, outputs=("Y", "Y_h", "Y_c"), layout=0, weights_as_inputs=False, seed=0,
          scale=0.5) -> str:
    """One ``op`` node with symbolic S (sequence) and N (batch); returns ``path``."""
    rng = np.random.default_rng(seed)
    dirs = 2 if attrs.get("direction") == "bidirectional" else 1
    g = gates(op)
    w = (scale * rng.standard_normal((dirs, g * HIDDEN, INPUT))).astype(np.float32)
    r = (scale * rng.standard_normal((dirs, g * HIDDEN, HIDDEN))).astype(np.float32)
    inits = []
    inputs = [helper.make_tensor_value_info("X", T.FLOAT, ["S", "N", INPUT] if layout == 0 else ["N", "S", INPUT])]
    if weights_as_inputs:
        inputs += [helper.make_tensor_value_info("W", T.FLOAT, list(w.shape)),
                   helper.make_tensor_value_info("R", T.FLOAT, list(r.shape))]
    else:
        inits += [numpy_helper.from_array(w, "W"), numpy_helper.from_array(r, "R")]
    names = ["X", "W", "R", "", "", "", "", ""]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal((dirs, 2 * g * HIDDEN)).astype(np.float32), "B"))
        names[3] = "B"
    if seq_lens:
        inputs.append(helper.make_tensor_value_info("seq_lens", T.INT32, ["N"]))
        names[4] = "seq_lens"
    state = [dirs, "N", HIDDEN] if layout == 0 else ["N", dirs, HIDDEN]
    if h0:
        inputs.append(helper.make_tensor_value_info("h0", T.FLOAT, state))
        names[5] = "h0"
    if c0 and op == "LSTM":
        inputs.append(helper.make_tensor_value_info("c0", T.FLOAT, state))
        names[6] = "c0"
    if peepholes and op == "LSTM":
        inits.append(numpy_helper.from_array(rng.standard_normal((dirs, 3 * HIDDEN)).astype(np.float32), "P"))
        names[7] = "P"
    names = names[:8 if op == "LSTM" else 6]
    while names and names[-1] == "":
        names.pop()
    outs = [o if o in outputs else "" for o in (["Y", "Y_h", "Y_c"] if op == "LSTM" else ["Y", "Y_h"])]
    while outs and outs[-1] == "":
        outs.pop()
    if layout:
        attrs = dict(attrs, layout=layout)
    node = helper.make_node(op, names, outs, name="rnn", hidden_size=HIDDEN, **attrs)
    graph = helper.make_graph([node], "rnn", inputs,
                              [helper.make_tensor_value_info(o, T.FLOAT, None) for o in outs if o], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], ir_version=8)
    onnx.save(model, path)
    return path


def feeds_for(path: str, seq: int, batch: int, seed: int, lens: Optional[List[int]] = None) -> Dict[str, np.ndarray]:
    rng = np.random.default_rng(100 + seed)
    out = {}
    for i in onnx.load(path).graph.input:
        dims = [d.dim_value if d.HasField("dim_value") else {"S": seq, "N": batch}[d.dim_param]
                for d in i.type.tensor_type.shape.dim]
        if i.name == "seq_lens":
            out[i.name] = np.array(lens if lens is not None else rng.integers(0, seq + 1, size=batch), np.int32)
        else:
            out[i.name] = rng.standard_normal(dims).astype(np.float32)
    return out


def check(path: str, device, lens_per_shape=None, shapes=SHAPES, rtol=RTOL) -> tu.KilnRun:
    """Runs ``path`` on kiln at every shape from one session, compares with the CPU EP
    and checks that the recurrent node ran on kiln."""
    feeds = [feeds_for(path, s, b, i, lens_per_shape[i] if lens_per_shape else None)
             for i, (s, b) in enumerate(shapes)]
    run = tu.run_kiln(path, device, options=CLAIM_ALL, feeds_seq=feeds)
    op = onnx.load(path).graph.node[0].op_type
    assert ("rnn", op) in run.nodes_on(kiln.EP_NAME), run.assignment
    for f, got in zip(feeds, run.all_outputs):
        names, want = tu.run_cpu(path, f)
        tu.assert_outputs_close(names, want, got, rtol=rtol, atol=ATOL)
    return run


# --------------------------------------------------------------------------
# the attribute space
# --------------------------------------------------------------------------
DIRECTIONS = ("forward", "reverse", "bidirectional")
MIXED_LENS = ([3, 1], [5, 0, 2])  # one per shape: full, partial and empty sequences


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
@pytest.mark.parametrize("direction", DIRECTIONS)
@pytest.mark.parametrize("states", ["initial", "none"])
def test_directions_and_initial_states(op, direction, states, kiln_dev, tmp_path):
    with_states = states == "initial"
    path = build(str(tmp_path / "m.onnx"), op, {"direction": direction}, h0=with_states, c0=with_states)
    check(path, kiln_dev)


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_sequence_lens_mixed(op, direction, kiln_dev, tmp_path):
    """Outputs past a sequence's length are zero, Y_h / Y_c hold the state at its
    last valid step; a sequence of length 0 gives zeros (ORT's semantics)."""
    path = build(str(tmp_path / "m.onnx"), op, {"direction": direction}, seq_lens=True)
    run = check(path, kiln_dev, lens_per_shape=MIXED_LENS)
    y = run.all_outputs[1][0]  # shape 2: Y [seq, dirs, batch, hidden], batch 1 has length 0
    assert not y[:, :, 1].any() and y[:, :, 0].any()


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
def test_sequence_lens_out_of_range_is_a_run_error(op, kiln_dev, tmp_path):
    path = build(str(tmp_path / "m.onnx"), op, {}, seq_lens=True)
    feeds = feeds_for(path, 3, 2, 0, lens=[3, 4])
    err = tu.expect_error(tu.run_kiln, path, kiln_dev, feeds, options=CLAIM_ALL)
    assert err.stage == "run" and "sequence_lens holds 4, outside 0..=3" in err.message, err


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
@pytest.mark.parametrize("bias", [True, False])
def test_clip_and_bias(op, bias, kiln_dev, tmp_path):
    path = build(str(tmp_path / "m.onnx"), op, {"clip": 0.7, "direction": "bidirectional"}, bias=bias)
    check(path, kiln_dev)


@pytest.mark.parametrize("input_forget", [0, 1])
@pytest.mark.parametrize("peepholes", [False, True])
def test_lstm_input_forget_and_peepholes(input_forget, peepholes, kiln_dev, tmp_path):
    path = build(str(tmp_path / "m.onnx"), "LSTM", {"input_forget": input_forget, "direction": "bidirectional"},
                 peepholes=peepholes, seq_lens=True)
    check(path, kiln_dev, lens_per_shape=MIXED_LENS)


@pytest.mark.parametrize("lbr", [0, 1])
@pytest.mark.parametrize("direction", DIRECTIONS)
def test_gru_linear_before_reset(lbr, direction, kiln_dev, tmp_path):
    path = build(str(tmp_path / "m.onnx"), "GRU", {"linear_before_reset": lbr, "direction": direction},
                 seq_lens=True)
    check(path, kiln_dev, lens_per_shape=MIXED_LENS)


def test_gru_linear_before_reset_without_bias(kiln_dev, tmp_path):
    check(build(str(tmp_path / "m.onnx"), "GRU", {"linear_before_reset": 1}, bias=False), kiln_dev)


#: (name, alpha, beta): every activation ONNX allows; None = ORT's default (kiln's
#: defaults were measured against ORT 1.31.1: 0 for Affine, ThresholdedRelu, ScaledTanh).
ACTIVATIONS = [
    ("Sigmoid", None, None), ("Tanh", None, None), ("Relu", None, None),
    ("Affine", 0.7, 0.2), ("Affine", None, None), ("LeakyRelu", 0.3, None), ("LeakyRelu", None, None),
    ("ThresholdedRelu", 0.2, None), ("ThresholdedRelu", None, None), ("ScaledTanh", 1.5, 0.5),
    ("ScaledTanh", None, None), ("HardSigmoid", 0.3, 0.4), ("HardSigmoid", None, None), ("Elu", 0.8, None),
    ("Elu", None, None), ("Softsign", None, None), ("Softplus", None, None),
]


def act_id(a):
    return f"{a[0]}-{'default' if a[1] is None else a[1]}"


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
@pytest.mark.parametrize("act", ACTIVATIONS, ids=act_id)
def test_activations(op, act, kiln_dev, tmp_path):
    """The activation in the g position (and f for a second direction), with
    alpha/beta consumed in order by the functions that take them."""
    name, alpha, beta = act
    defaults = ["Sigmoid", "Tanh", "Tanh"] if op == "LSTM" else ["Sigmoid", "Tanh"]
    fwd = list(defaults)
    fwd[1] = name
    bwd = list(defaults)
    bwd[0] = name
    attrs = {"direction": "bidirectional", "activations": fwd + bwd}
    if alpha is not None:
        attrs["activation_alpha"] = [alpha, alpha / 2]
    if beta is not None:
        attrs["activation_beta"] = [beta, beta / 2]
    # Unbounded gate functions let values grow over the steps (small weights keep
    # them finite), with the rounding differences of two sigmoid/tanh
    # implementations growing along.
    check(build(str(tmp_path / "m.onnx"), op, attrs, scale=0.25), kiln_dev, rtol=1e-3)


def test_activation_parameters_are_consumed_in_order(kiln_dev, tmp_path):
    """Affine takes alpha and beta, LeakyRelu only an alpha, Sigmoid none."""
    attrs = {"activations": ["LeakyRelu", "Affine", "ScaledTanh"], "activation_alpha": [0.2, 0.9, 1.1],
             "activation_beta": [0.1, 0.7]}
    check(build(str(tmp_path / "m.onnx"), "LSTM", attrs), kiln_dev)


@pytest.mark.parametrize("op,outputs", [("LSTM", ("Y_h",)), ("LSTM", ("Y", "Y_c")), ("LSTM", ("Y_c",)),
                                        ("GRU", ("Y_h",)), ("GRU", ("Y",))])
def test_optional_outputs(op, outputs, kiln_dev, tmp_path):
    check(build(str(tmp_path / "m.onnx"), op, {"direction": "reverse"}, outputs=outputs), kiln_dev)


@pytest.mark.parametrize("op", ["LSTM", "GRU"])
@pytest.mark.parametrize("direction", ["forward", "bidirectional"])
def test_layout_1(op, direction, kiln_dev, tmp_path):
    """ORT's CPU EP refuses ``layout=1``; kiln runs it, and it equals the
    ``layout=0`` model on transposed inputs and outputs."""
    batch_first = build(str(tmp_path / "b.onnx"), op, {"direction": direction}, layout=1, seq_lens=True)
    seq_first = build(str(tmp_path / "s.onnx"), op, {"direction": direction}, layout=0, seq_lens=True)
    with pytest.raises(Exception, match="Batchwise recurrent operations"):
        ort.InferenceSession(batch_first, providers=["CPUExecutionProvider"])
    for i, (seq, batch) in enumerate(SHAPES):
        f0 = feeds_for(seq_first, seq, batch, i, MIXED_LENS[i])
        f1 = {k: (v.transpose(1, 0, 2).copy() if v.ndim == 3 else v) for k, v in f0.items()}
        names, want = tu.run_cpu(seq_first, f0)
        run = tu.run_kiln(batch_first, kiln_dev, f1, options=CLAIM_ALL)
        assert ("rnn", op) in run.nodes_on(kiln.EP_NAME)
        back = [g.transpose(1, 2, 0, 3) if g.ndim == 4 else g.transpose(1, 0, 2) for g in run.outputs]
        tu.assert_outputs_close(names, want, back, rtol=RTOL, atol=ATOL)


def test_weights_that_are_not_constants_stay_with_ort(kiln_dev, tmp_path):
    """kiln packs W and R at compile time: run-time weights leave the node to ORT."""
    path = build(str(tmp_path / "m.onnx"), "LSTM", {}, weights_as_inputs=True)
    feeds = feeds_for(path, 3, 2, 0)
    run = tu.run_kiln(path, kiln_dev, feeds, options=CLAIM_ALL)
    assert ("rnn", "LSTM") in run.nodes_on("CPUExecutionProvider")
    names, want = tu.run_cpu(path, feeds)
    tu.assert_outputs_close(names, want, run.outputs)


def test_epcontext_round_trip(kiln_dev, tmp_path):
    """Compile an LSTM model (symbolic dims) with ``ep.context_enable=1`` and run the
    ``_ctx.onnx`` at both shapes without compiling."""
    path = build(str(tmp_path / "lstm.onnx"), "LSTM", {"direction": "bidirectional", "clip": 2.0},
                 seq_lens=True, peepholes=True)
    ctx = str(tmp_path / "lstm_ctx.onnx")
    tu.generate_context(path, kiln_dev, file_path=ctx, options=CLAIM_ALL)
    assert os.path.exists(ctx) and os.path.exists(str(tmp_path / "lstm_kiln.bin"))
    assert [n.op_type for n in onnx.load(ctx).graph.node] == ["EPContext"]
    feeds = [feeds_for(path, s, b, i, MIXED_LENS[i]) for i, (s, b) in enumerate(SHAPES)]
    run = tu.run_kiln(ctx, kiln_dev, options=CLAIM_ALL, feeds_seq=feeds)
    assert run.created_delta("partitions_compiled") == 0
    for f, got in zip(feeds, run.all_outputs):
        names, want = tu.run_cpu(path, f)
        tu.assert_outputs_close(names, want, got, rtol=RTOL, atol=ATOL)


# --------------------------------------------------------------------------
# Silero VAD: the LSTM inside If bodies
# --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def corpus() -> Dict[str, str]:
    try:
        return rc.all_models(log=lambda *_: None)
    except rc.CorpusError as exc:
        pytest.skip(f"the real-model corpus is not available: {exc}")


#: What a VAD caller carries from one chunk to the next: output -> next input.
CARRIED = {"stateN": "state", "hn": "h", "cn": "c"}


@pytest.mark.parametrize("key", ["silero_vad", "silero_vad_seq"])
def test_silero_vad_lstm_and_bodies_on_kiln(key, corpus, kiln_dev):
    """Silero VAD as shipped: kiln claims its LSTM (inside nested ``If`` bodies in
    ``silero_vad``) in a normal session, and four chunks with the state carried
    match the CPU EP."""
    path = corpus[key]
    spec = next(s for s in rc.SPECS if s.key == key)
    params = spec.variants[0][1]
    first = rc.model_feeds(spec, path, params, seed=3)
    cpu = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    so = tu._session_options([kiln_dev], CLAIM_ALL, None)
    sess = ort.InferenceSession(path, so, enable_fallback=0)
    assignment = [(sg.ep_name, [(n.name, n.op_type) for n in sg.get_nodes()])
                  for sg in sess.get_provider_graph_assignment_info()]
    on_kiln = [n for ep, nodes in assignment if ep == kiln.EP_NAME for n in nodes]
    assert any(op == "LSTM" for _, op in on_kiln), assignment
    if key == "silero_vad":
        # Its LSTMs live in If bodies (ORT names body nodes after their branch).
        lstm = [name for name, op in on_kiln if op == "LSTM"]
        assert lstm and all("_branch" in name for name in lstm), lstm
        body = [name for name, op in on_kiln if "_branch" in name and op != "LSTM"]
        assert len(body) >= 10, on_kiln
    names = [o.name for o in cpu.get_outputs()]
    rng = np.random.default_rng(7)
    feeds_k, feeds_c = dict(first), dict(first)
    for chunk in range(4):
        audio = np.clip(0.3 * rng.standard_normal(first["input"].shape), -1, 1).astype(np.float32)
        feeds_k["input"] = feeds_c["input"] = audio
        want = cpu.run(names, feeds_c)
        got = sess.run(names, feeds_k)
        tu.assert_outputs_close(names, want, got, rtol=spec.rtol, atol=spec.atol)
        for name, w, g in zip(names, want, got):
            if name in CARRIED:
                feeds_c[CARRIED[name]], feeds_k[CARRIED[name]] = w, g
    assert set(CARRIED.values()) & set(feeds_k), "no state was carried"
    del sess
