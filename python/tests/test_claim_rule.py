"""kiln's claim rule (EP option ``claim``, default ``cost``; README "Which nodes
kiln claims"): kiln takes a partition only when it holds work kiln runs faster
than ORT (a MatMul/Gemm with a packed constant weight over enough rows, or a
huge weight; LSTM/GRU). Quantize/dequantize groups and activations ORT fuses
into its own Conv/GEMM stay with ORT; ``force_ops`` and ``claim=all`` override.

Each case runs against the real runtime: ORT's assignment info says who ran
what, outputs are compared with the CPU EP alone."""
import ctypes
import os
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln_testutil as tu
import onnxruntime_ep_kiln as kiln
import real_corpus

KILN = kiln.EP_NAME
CPU = "CPUExecutionProvider"
COST = {"claim": "cost"}  # the default, spelled out: kiln_testutil adds claim=all otherwise
ANCHORS = {"MatMul", "Gemm", "LSTM", "GRU"}


def _save(tmp_path, name, nodes, inputs, outputs, inits=(), opset=17):
    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    path = str(tmp_path / f"{name}.onnx")
    onnx.save(model, path)
    return path


def _vi(name, shape, dtype=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, dtype, shape)


def _w(name, shape, seed):
    rng = np.random.default_rng(seed)
    return numpy_helper.from_array((rng.standard_normal(shape) / np.sqrt(shape[0])).astype(np.float32), name)


def ops_on(run, ep):
    return sorted(op for _, op in run.nodes_on(ep))


def elementwise_model(tmp_path):
    nodes = [helper.make_node("Add", ["x", "x"], ["a"], name="add"),
             helper.make_node("Relu", ["a"], ["r"], name="relu"),
             helper.make_node("Tanh", ["r"], ["y"], name="tanh")]
    return _save(tmp_path, "eltwise", nodes, [_vi("x", [4, 64])], [_vi("y", [4, 64])])


def mlp_model(tmp_path, rows="batch_seq"):
    """x [rows, 256] -> MatMul(256x256) + bias -> Relu -> MatMul -> y."""
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="mm1"),
             helper.make_node("Add", ["h", "b1"], ["hb"], name="bias1"),
             helper.make_node("Relu", ["hb"], ["r"], name="relu"),
             helper.make_node("MatMul", ["r", "w2"], ["y"], name="mm2")]
    inits = [_w("w1", (256, 256), 1), _w("w2", (256, 256), 2),
             numpy_helper.from_array(np.linspace(-1, 1, 256, dtype=np.float32), "b1")]
    return _save(tmp_path, "mlp", nodes, [_vi("x", [1, rows, 256])], [_vi("y", [1, rows, 256])], inits)


def test_elementwise_graph_is_left_to_ort_by_default(kiln_dev, tmp_path):
    path = elementwise_model(tmp_path)
    run = tu.check_against_cpu(path, kiln_dev, options=COST)
    assert ops_on(run, KILN) == []
    assert run.created_delta("partitions_compiled") == 0
    # claim=all takes everything kiln can run; force_ops takes the partition of a forced op
    assert ops_on(tu.check_against_cpu(path, kiln_dev, options={"claim": "all"}), KILN) == ["Add", "Relu", "Tanh"]
    forced = tu.check_against_cpu(path, kiln_dev, options={"claim": "cost", "force_ops": "Tanh"})
    assert ops_on(forced, KILN) == ["Add", "Relu", "Tanh"]
    # disabled_ops wins over force_ops
    both = tu.check_against_cpu(path, kiln_dev, options={"claim": "cost", "force_ops": "Tanh", "disabled_ops": "Tanh"})
    assert ops_on(both, KILN) == []


def test_the_default_is_the_cost_rule(kiln_dev, tmp_path):
    """Without any option (not even the tests' claim=all) the rule applies, and
    kiln.last_left_out() (the C export kiln_ep_last_left_out) says why, per op type;
    after a session kiln claims whole, it is empty."""
    so = ort.SessionOptions()
    so.add_session_config_entry("session.record_ep_graph_assignment_info", "1")
    so.add_provider_for_devices([kiln_dev], {})
    path = elementwise_model(tmp_path)
    sess = ort.InferenceSession(path, so, enable_fallback=0)
    on_kiln = [n for sg in sess.get_provider_graph_assignment_info() if sg.ep_name == KILN for n in sg.get_nodes()]
    assert on_kiln == []
    why = kiln.last_left_out()
    for op in ("Add", "Relu", "Tanh"):
        assert f"1 x {op}: left to ORT by the cost rule: " in why, why
    # The export copies as snprintf does: a short buffer gets a NUL-terminated prefix and the full length.
    export = kiln._native.cdll(kiln._library_in_use()).kiln_ep_last_left_out
    export.restype = ctypes.c_size_t
    short = ctypes.create_string_buffer(b"\xff" * 8)
    assert export(short, ctypes.c_size_t(8)) == len(why.encode())
    assert short.raw[:8] == why.encode()[:7] + b"\0"  # the 9th byte is the buffer's own NUL
    tu.check_against_cpu(path, kiln_dev, options={"claim": "all"})
    assert kiln.last_left_out() == ""


def test_a_matmul_block_over_a_symbolic_sequence_is_claimed_whole(kiln_dev, tmp_path):
    path = mlp_model(tmp_path)
    for rows in (3, 40):
        feeds = {"x": np.random.default_rng(rows).standard_normal((1, rows, 256)).astype(np.float32)}
        names, want = tu.run_cpu(path, feeds)
        run = tu.run_fully_on_kiln(path, kiln_dev, feeds, options=COST)
        tu.assert_outputs_close(names, want, run.outputs)
        assert run.subgraphs_on(KILN) == 1


def test_a_batch_only_gemv_is_left_to_ort(kiln_dev, tmp_path):
    """x [batch, 256] x W[256, 256]: one row per batch item, where MLAS's GEMV is faster."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["y"], name="mm")]
    path = _save(tmp_path, "gemv", nodes, [_vi("x", ["batch", 256])], [_vi("y", ["batch", 256])],
                 [_w("w", (256, 256), 3)])
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 256)).astype(np.float32)}
    names, want = tu.run_cpu(path, feeds)
    for options, on_kiln in ((COST, []), ({"claim": "all"}, ["MatMul"])):
        run = tu.run_kiln(path, kiln_dev, feeds, options=options)
        tu.assert_outputs_close(names, want, run.outputs)
        assert ops_on(run, KILN) == on_kiln


def conv_relu_matmul(tmp_path):
    """Conv (ORT) -> Relu -> Reshape -> MatMul (an anchor): ORT fuses the Relu into its Conv.
    kiln runs Conv too (issue #13): the tests keep it with ORT through ``disabled_ops``."""
    nodes = [helper.make_node("Conv", ["x", "k"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Reshape", ["r", "shape"], ["f"], name="flat"),
             helper.make_node("MatMul", ["f", "w"], ["y"], name="mm")]
    inits = [_w("k", (32, 8, 3, 3), 4), _w("w", (64, 128), 5),
             numpy_helper.from_array(np.array([1, 32, 64], np.int64), "shape")]
    return _save(tmp_path, "conv_relu_mm", nodes, [_vi("x", [1, 8, 8, 8])], [_vi("y", [1, 32, 128])], inits)


def test_an_activation_after_an_ort_conv_stays_with_ort(kiln_dev, tmp_path, capfd):
    path = conv_relu_matmul(tmp_path)
    capfd.readouterr()
    ort.set_default_logger_severity(0)
    try:
        run = tu.check_against_cpu(path, kiln_dev, options={**COST, "disabled_ops": "Conv"})
    finally:
        ort.set_default_logger_severity(2)
    log = capfd.readouterr().err
    assert ops_on(run, CPU) == ["Conv", "Relu"]
    assert ops_on(run, KILN) == ["MatMul", "Reshape"]
    assert "ORT fuses it into the Conv before it" in log, log[-3000:]
    everything = tu.check_against_cpu(path, kiln_dev, options={"claim": "all", "disabled_ops": "Conv"})
    assert ops_on(everything, KILN) == ["MatMul", "Relu", "Reshape"]


def qdq_mlp(tmp_path):
    """x -> Q -> DQ -> MatMul(DQ(int8 W)) -> Relu -> Q -> DQ -> y: a QDQ model as
    quantization tools write it. ORT runs the MatMul group as one int8 kernel."""
    rng = np.random.default_rng(6)
    wq = rng.integers(-127, 127, (128, 128), dtype=np.int8)
    nodes = [helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"], name="qx"),
             helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xd"], name="dqx"),
             helper.make_node("DequantizeLinear", ["wq", "sw", "zw"], ["wd"], name="dqw"),
             helper.make_node("MatMul", ["xd", "wd"], ["h"], name="mm"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("QuantizeLinear", ["r", "sy", "zy"], ["yq"], name="qy"),
             helper.make_node("DequantizeLinear", ["yq", "sy", "zy"], ["y"], name="dqy")]
    inits = [numpy_helper.from_array(wq, "wq"),
             numpy_helper.from_array(np.array(0.02, np.float32), "sx"),
             numpy_helper.from_array(np.array(0, np.int8), "zx"),
             numpy_helper.from_array(np.array(0.01, np.float32), "sw"),
             numpy_helper.from_array(np.array(0, np.int8), "zw"),
             numpy_helper.from_array(np.array(0.05, np.float32), "sy"),
             numpy_helper.from_array(np.array(0, np.int8), "zy")]
    return _save(tmp_path, "qdq_mlp", nodes, [_vi("x", [64, 128])], [_vi("y", [64, 128])], inits, opset=17)


def test_quantize_dequantize_groups_stay_with_ort(kiln_dev, tmp_path):
    path = qdq_mlp(tmp_path)
    feeds = tu.make_feeds(path)
    names, want = tu.run_cpu(path, feeds)
    run = tu.run_kiln(path, kiln_dev, feeds, options=COST)
    assert ops_on(run, KILN) == []
    # ORT ran all of it, as without kiln: the same int8 results, exactly
    for w, g in zip(want, run.outputs):
        np.testing.assert_array_equal(g, w)
    forced = tu.run_kiln(path, kiln_dev, feeds, options={"claim": "cost", "force_ops": "MatMul"})
    assert "MatMul" in ops_on(forced, KILN)


def test_independent_partitions_are_merged(kiln_dev, tmp_path):
    """Two independent MatMul blocks, separated from a third by an op kiln leaves to
    ORT: the two independent ones become one partition."""
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["a"], name="mm_a"),
             helper.make_node("MatMul", ["x", "w2"], ["b"], name="mm_b"),
             helper.make_node("Hardmax", ["a"], ["h"], name="ort_hardmax", axis=-1),
             helper.make_node("MatMul", ["h", "w3"], ["c"], name="mm_c")]
    inits = [_w("w1", (128, 128), 7), _w("w2", (128, 128), 8), _w("w3", (128, 128), 9)]
    path = _save(tmp_path, "branches", nodes, [_vi("x", [32, 128])], [_vi("b", [32, 128]), _vi("c", [32, 128])], inits)
    run = tu.check_against_cpu(path, kiln_dev, options=COST)
    assert ops_on(run, CPU) == ["Hardmax"]
    assert run.subgraphs_on(KILN) == 2  # {mm_a, mm_b} and {mm_c}: mm_c waits on Hardmax
    groups = sorted(sorted(n for n, _ in nodes) for ep, nodes in run.assignment if ep == KILN)
    assert groups == [["mm_a", "mm_b"], ["mm_c"]]


def corpus_case(key):
    """The corpus model's path, spec and feeds at its first shape (a skip, with the reason, when
    the model is not in this machine's corpus)."""
    models = real_corpus.all_models(log=lambda *a: None)
    if key not in models:
        pytest.skip(f"{key} is not in the corpus on this machine")
    path = models[key]
    spec = real_corpus.spec(key)
    return path, spec, real_corpus.model_feeds(spec, path, spec.variants[0][1])


@pytest.mark.parametrize("key", real_corpus.wheel_model_keys() + ["light_resnet50", "light_bvlc_alexnet"])
def test_real_models_keep_only_paying_partitions(key, kiln_dev):
    """On the corpus, every partition the default rule keeps holds an anchor, and the
    model still matches the CPU EP."""
    path, spec, feeds = corpus_case(key)
    names, want = tu.run_cpu(path, feeds)
    run = tu.run_kiln(path, kiln_dev, feeds, options=COST)
    tu.assert_outputs_close(names, want, run.outputs, rtol=spec.rtol, atol=spec.atol)
    anchors = ANCHORS | ({"Conv", "ConvTranspose"} if convs_pay(key, kiln_dev) else set())
    for ep, nodes in run.assignment:
        if ep == KILN:
            ops = {op for _, op in nodes}
            assert ops & anchors, f"{key}: a kiln partition without an anchor: {sorted(ops)}"


# Networks whose convolutions feed gated activations (SiLU, HardSwish as x * Clip(x + 3, 0, 6) / 6
# or x * HardSigmoid(x)), which ORT runs as passes of their own and kiln fuses: rule 4 claims them
# when kiln compiles for AVX2 or AVX-512.
GATED_CNNS = {"yolov8n", "ppocr_det", "ppocr_rec", "ppocr_cls"}


def gates_pay(device) -> bool:
    """Whether rule 4 claims a gated network's convolutions for ``device``'s target."""
    return kiln.device_target(device) in ("x86_64-avx2", "x86_64-avx512")


# ReLU networks by the share of their convolutions' multiply-adds in dense k x k convolutions (3+
# taps, 16+ input channels per group): rule 4 claims the dense ones (ResNet-50 0.45, SqueezeNet
# 0.54, DenseNet-121 0.44, Inception v1 0.69) for AVX2, where kiln's Winograd kernels run them
# faster than ORT, and leaves ShuffleNet (0.00: depthwise and 1 x 1 group-3 convolutions) to ORT.
# At least 60% of the convolution multiply-adds in dense k×k convolutions: claimed on AVX-512 too.
VERY_DENSE_CNNS = {"light_inception_v1", "light_bvlc_alexnet"}
# At least 30%: claimed on AVX2 only.
DENSE_CNNS = {"light_resnet50", "light_squeezenet", "light_densenet121"} | VERY_DENSE_CNNS
RELU_CNNS = DENSE_CNNS | {"light_shufflenet"}


def convs_pay(key, device) -> bool:
    """Whether rule 4 claims network ``key``'s convolutions for ``device``'s target."""
    target = kiln.device_target(device)
    dense = {"x86_64-avx2": DENSE_CNNS, "x86_64-avx512": VERY_DENSE_CNNS}.get(target, set())
    return (key in GATED_CNNS and gates_pay(device)) or key in dense


@pytest.mark.parametrize("key", sorted(GATED_CNNS | RELU_CNNS))
def test_cnns_claimed_by_rule_4(key, kiln_dev):
    """Rule 4 by default: every convolution of a gated network runs in kiln, in one or two
    partitions, on an AVX2 or AVX-512 host, and so do a dense ReLU network's (30% of the
    multiply-adds in dense k×k convolutions on an AVX2 host, 60% on an AVX-512 one);
    other ReLU networks' convolutions stay with ORT, which fuses their activations too."""
    path, _, feeds = corpus_case(key)
    run = tu.run_kiln(path, kiln_dev, feeds, options=COST)
    convs = {"Conv", "ConvTranspose"}
    if convs_pay(key, kiln_dev):
        assert not convs & set(ops_on(run, CPU)), f"{key}: {sorted(set(ops_on(run, CPU)))} left to ORT"
        assert 1 <= run.subgraphs_on(KILN) <= 2
    else:
        assert not convs & set(ops_on(run, KILN)), key


def hardswish_convs(tmp_path):
    """PP-LCNet's form, symbolic H and W: twice a depthwise 3x3 and a 1x1 convolution of 16
    channels, each followed by a HardSwish op (no dense k x k convolution: rule 4's ReLU case does
    not apply)."""
    nodes, inits, x = [], [], "x"
    for k in range(4):
        kernel, attrs = ([16, 1, 3, 3], {"group": 16, "pads": [1, 1, 1, 1]}) if k % 2 == 0 else ([16, 16, 1, 1], {})
        inits += [_w(f"w{k}", kernel, k), _w(f"b{k}", [16], 10 + k)]
        nodes += [helper.make_node("Conv", [x, f"w{k}", f"b{k}"], [f"c{k}"], **attrs),
                  helper.make_node("HardSwish", [f"c{k}"], [f"a{k}"])]
        x = f"a{k}"
    return _save(tmp_path, "hardswish_convs", nodes, [_vi("x", [1, 16, "h", "w"])], [_vi(x, None)], inits,
                 opset=17)


def relu_convs(tmp_path, kernels=(3, 3, 3, 3), name="relu_convs"):
    """ReLU convolutions of 32 channels with these kernel sides, symbolic H and W: with all
    of them 3x3, all their work is dense; one 3x3 among seven 1x1, 56% of it (9 of 16 taps
    per pixel)."""
    nodes, inits, x = [], [], "x"
    for k, side in enumerate(kernels):
        inits += [_w(f"w{k}", [32, 32, side, side], k), _w(f"b{k}", [32], 10 + k)]
        nodes += [helper.make_node("Conv", [x, f"w{k}", f"b{k}"], [f"c{k}"], pads=[side // 2] * 4),
                  helper.make_node("Relu", [f"c{k}"], [f"a{k}"])]
        x = f"a{k}"
    return _save(tmp_path, name, nodes, [_vi("x", [1, 32, "h", "w"])], [_vi(x, None)], inits, opset=17)


def compile_for(tmp_path, path, target, *flags):
    """``kiln [flags] compile`` of ``path`` for ``target`` in a process of its own (compiling for
    another target registers kiln's virtual devices): the process and the output folder."""
    out = tmp_path / f"{os.path.basename(path)}-{target}"
    os.mkdir(out)
    code = "import sys; from onnxruntime_ep_kiln.cli import main; sys.exit(main(sys.argv[1:]))"
    p = subprocess.run([sys.executable, "-c", code, *flags, "compile", path, "-o", str(out), "--target", target],
                       capture_output=True, text=True, timeout=300)
    return p, out


def assert_all_in_kiln(p, out, path):
    assert p.returncode == 0, p.stdout + p.stderr
    ctx = out / (os.path.splitext(os.path.basename(path))[0] + "_ctx.onnx")
    ops = [n.op_type for n in onnx.load(str(ctx), load_external_data=False).graph.node]
    assert "EPContext" in ops and not {"Conv", "ConvTranspose"} & set(ops), ops


def assert_nothing_compiled(p, out):
    assert p.returncode == 1 and "compiled nothing" in p.stderr, p.stdout + p.stderr
    assert os.listdir(out) == []


def test_gated_rule_follows_the_compile_target(tmp_path):
    """Rule 4 on any host, through the compile API and a (virtual) device of each target: PP-OCR
    cls (HardSwish as products x * f(x), which ORT cannot fuse) goes into kiln's EPContext nodes for
    AVX-512 and for AVX2; a network gated by HardSwish ops, which ORT fuses into its convolutions,
    only for AVX-512 (with the AVX2 kernels such a network, PP-LCNet, was not faster than ORT), and
    for AVX2 kiln claims nothing of it and says so."""
    cls, _, _ = corpus_case("ppocr_cls")
    fused = hardswish_convs(tmp_path)
    for target in ("x86_64-avx512", "x86_64-avx2"):
        assert_all_in_kiln(*compile_for(tmp_path, cls, target), cls)
    assert_all_in_kiln(*compile_for(tmp_path, fused, "x86_64-avx512"), fused)
    assert_nothing_compiled(*compile_for(tmp_path, fused, "x86_64-avx2"))


def test_dense_rule_follows_the_compile_target(tmp_path):
    """Rule 4 for ReLU networks: all-dense 3x3 convolutions go into kiln's EPContext nodes for
    AVX2 and AVX-512; a network 56% dense only for AVX2 (AVX-512 needs 60%: there SqueezeNet,
    54%, ran slower than ORT), and for AVX-512 kiln claims nothing of it and says so."""
    dense = relu_convs(tmp_path)
    mixed = relu_convs(tmp_path, (1, 1, 1, 3, 1, 1, 1, 1), "mixed_convs")
    for target in ("x86_64-avx2", "x86_64-avx512"):
        assert_all_in_kiln(*compile_for(tmp_path, dense, target), dense)
    assert_all_in_kiln(*compile_for(tmp_path, mixed, "x86_64-avx2"), mixed)
    p, out = compile_for(tmp_path, mixed, "x86_64-avx512")
    assert_nothing_compiled(p, out)
    assert "(56% of their multiply-adds in dense k×k convolutions, kiln needs 60%" in p.stdout + p.stderr
