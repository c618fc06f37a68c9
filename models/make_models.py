#!/usr/bin/env python3
"""Build the small ONNX models bundled with kiln.

Usage:
    python models/make_models.py            # writes into models/
    python models/make_models.py --out DIR  # writes into DIR

Every model is built with ``onnx.helper`` from fixed seeds, so running this
script twice produces byte-identical files. Each model is validated with
``onnx.checker.check_model(full_check=True)`` before it is written.

Models
------
add_mul_relu.onnx  A, B: float[2,3,4];  C = Add(A, B); D = Mul(C, W); Y = Relu(D)
                   with the initializer W: float[3,4].  Fully supported by kiln
                   -> exactly one kiln partition.
split.onnx         Add -> Relu -> Atan -> Mul -> Tanh -> Sub, plus an independent
                   Asinh -> Neg -> Abs branch.  Atan and Asinh are CPU-only, so kiln
                   gets three partitions ({Add, Relu}, {Mul, Tanh, Sub}, {Neg, Abs}).
unsupported.onnx   Only Atan / Cosh / Asinh: kiln claims nothing.
all_ops.onnx       Every op kiln supports (Add Sub Mul Div Relu Sigmoid Tanh Neg
                   Abs Sqrt Exp Identity), scalar / rank-expanding / two-sided
                   broadcasting, initializers as first and second inputs, one
                   graph output that is also consumed inside the graph, and
                   Sqrt / Div only ever applied to strictly positive values.
share_{a,b,c}.onnx Three "fine-tunes" of one backbone for weight-sharing tests:
                   X: float[4,64,64]; H = Relu(X * W_backbone + B_backbone)
                   (identical 16 KiB weights in all three), Y = Tanh(H * W_head)
                   with a 16 KiB head of each model's own.
attrs.onnx         Constant (tensor attribute) -> Mul -> LeakyRelu(alpha) -> Softmax(axis)
                   -> Transpose(perm) on X: float[256,512], large enough that kiln splits
                   steps over ORT's intra-op thread pool.
demo.onnx          A transformer feed-forward block, x: float[1,32,128]:
                   LayerNormalization -> MatMul+bias -> erf-GELU (decomposed) ->
                   MatMul+bias -> residual Add. kiln takes all of it.
"""
from __future__ import annotations

import argparse
import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# Opset 17 / IR 8 is loadable by every ONNX Runtime since 1.13 (including 1.31.1).
OPSET = 17
IR_VERSION = 8

F32 = TensorProto.FLOAT


def _vi(name: str, shape):
    return helper.make_tensor_value_info(name, F32, list(shape))


def _init(name: str, array: np.ndarray) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(array, dtype=np.float32), name=name)


def _model(graph: onnx.GraphProto, doc: str) -> onnx.ModelProto:
    graph.doc_string = doc
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        ir_version=IR_VERSION,
        producer_name="kiln-make-models",
        producer_version="0.1.0",
    )
    # full_check also runs strict shape inference over the graph.
    onnx.checker.check_model(model, full_check=True)
    return model


def make_add_mul_relu() -> onnx.ModelProto:
    rng = np.random.default_rng(1001)
    w = rng.standard_normal((3, 4)).astype(np.float32)
    nodes = [
        helper.make_node("Add", ["A", "B"], ["C"], name="add"),
        helper.make_node("Mul", ["C", "W"], ["D"], name="mul"),
        helper.make_node("Relu", ["D"], ["Y"], name="relu"),
    ]
    graph = helper.make_graph(
        nodes,
        "add_mul_relu",
        [_vi("A", [2, 3, 4]), _vi("B", [2, 3, 4])],
        [_vi("Y", [2, 3, 4])],
        initializer=[_init("W", w)],
    )
    return _model(graph, "Y = Relu((A + B) * W); fully supported by kiln (one partition).")


def make_split() -> onnx.ModelProto:
    rng = np.random.default_rng(1002)
    bias = rng.standard_normal((4,)).astype(np.float32)
    w = rng.standard_normal((3, 4)).astype(np.float32)
    nodes = [
        # kiln partition 1
        helper.make_node("Add", ["X", "bias"], ["a"], name="p1_add"),
        helper.make_node("Relu", ["a"], ["r"], name="p1_relu"),
        # CPU
        helper.make_node("Atan", ["r"], ["s"], name="cpu_atan"),
        # kiln partition 2
        helper.make_node("Mul", ["s", "W"], ["m"], name="p2_mul"),
        helper.make_node("Tanh", ["m"], ["t"], name="p2_tanh"),
        helper.make_node("Sub", ["t", "X"], ["Y"], name="p2_sub"),
        # independent branch: CPU Asinh, then kiln partition 3
        helper.make_node("Asinh", ["X"], ["f"], name="cpu_asinh"),
        helper.make_node("Neg", ["f"], ["n"], name="p3_neg"),
        helper.make_node("Abs", ["n"], ["Z"], name="p3_abs"),
    ]
    graph = helper.make_graph(
        nodes,
        "split",
        [_vi("X", [2, 3, 4])],
        [_vi("Y", [2, 3, 4]), _vi("Z", [2, 3, 4])],
        initializer=[_init("bias", bias), _init("W", w)],
    )
    return _model(
        graph,
        "Supported chain -> Atan (CPU) -> supported chain, plus Asinh (CPU) -> supported "
        "chain: three kiln groups, two after merging the independent ones; the CPU EP "
        "runs Atan and Asinh.",
    )


def make_unsupported() -> onnx.ModelProto:
    nodes = [
        helper.make_node("Atan", ["X"], ["s"], name="atan"),
        helper.make_node("Cosh", ["s"], ["c"], name="cosh"),
        helper.make_node("Asinh", ["c"], ["Y"], name="asinh"),
        helper.make_node("Asinh", ["X"], ["Z"], name="asinh2"),
    ]
    graph = helper.make_graph(
        nodes,
        "unsupported",
        [_vi("X", [2, 3, 4])],
        [_vi("Y", [2, 3, 4]), _vi("Z", [2, 3, 4])],
    )
    return _model(graph, "Only ops kiln does not support: everything runs on the CPU EP.")


def make_all_ops() -> onnx.ModelProto:
    rng = np.random.default_rng(1003)
    inits = [
        _init("k_scalar", np.float32(0.75)),  # shape [] (scalar)
        _init("k_row", rng.standard_normal((4,))),  # rank-expanding [4]
        _init("k_col", rng.standard_normal((3, 1))),  # [3,1]
        _init("k_half", np.float32(0.5)),  # scalar, keeps Sqrt's input > 0
        _init("k_num", rng.uniform(0.5, 2.0, (2, 1, 4))),  # [2,1,4] initializer as 1st input
        _init("k_two", np.float32(2.0)),  # scalar as 1st input of Sub
    ]
    nodes = [
        # scalar broadcast, initializer 2nd input
        helper.make_node("Add", ["X", "k_scalar"], ["s0"], name="add_scalar"),
        # rank-expanding broadcast [2,3,4] - [4]
        helper.make_node("Sub", ["s0", "k_row"], ["s1"], name="sub_row"),
        # [2,3,4] * [3,1]
        helper.make_node("Mul", ["s1", "k_col"], ["s2"], name="mul_col"),
        helper.make_node("Relu", ["s2"], ["r"], name="relu"),
        # R is a graph output AND consumed below (add_r).  An Identity whose
        # output is a graph output that is also consumed internally survives
        # ORT's IdentityElimination, so kiln really gets to see it.
        helper.make_node("Identity", ["r"], ["R"], name="identity"),
        helper.make_node("Tanh", ["s1"], ["t"], name="tanh"),
        # graph input G: [3,1] (rank-expanding from the input side)
        helper.make_node("Sigmoid", ["G"], ["g"], name="sigmoid"),
        helper.make_node("Mul", ["t", "g"], ["m"], name="mul_gate"),
        helper.make_node("Neg", ["m"], ["n"], name="neg"),
        helper.make_node("Abs", ["n"], ["a"], name="abs"),
        # a >= 0, so a + 0.5 >= 0.5 > 0
        helper.make_node("Add", ["a", "k_half"], ["pa"], name="add_half"),
        helper.make_node("Sqrt", ["pa"], ["sq"], name="sqrt"),
        helper.make_node("Exp", ["n"], ["e"], name="exp"),
        # positive / positive
        helper.make_node("Div", ["e", "sq"], ["d1"], name="div"),
        # initializer as FIRST input, two-sided broadcast [2,1,4] / [2,3,4]
        helper.make_node("Div", ["k_num", "sq"], ["d2"], name="div_init_first"),
        # scalar initializer as first input of Sub
        helper.make_node("Sub", ["k_two", "d2"], ["d3"], name="sub_scalar_first"),
        helper.make_node("Add", ["d1", "d3"], ["u"], name="add_d"),
        # consumes graph output R
        helper.make_node("Add", ["u", "R"], ["v"], name="add_r"),
        # [2,3,4] * graph input H [2,1,4]
        helper.make_node("Mul", ["v", "H"], ["w"], name="mul_h"),
        # two-sided broadcast between two graph inputs: [3,1] + [2,1,4] -> [2,3,4];
        # GH is a graph output and is consumed by the final Sub, which keeps the
        # whole graph one connected group (one kiln partition).
        helper.make_node("Add", ["G", "H"], ["GH"], name="add_inputs_bcast"),
        helper.make_node("Sub", ["w", "GH"], ["Y"], name="sub_gh"),
    ]
    graph = helper.make_graph(
        nodes,
        "all_ops",
        [_vi("X", [2, 3, 4]), _vi("G", [3, 1]), _vi("H", [2, 1, 4])],
        [_vi("Y", [2, 3, 4]), _vi("R", [2, 3, 4]), _vi("GH", [2, 3, 4])],
        initializer=inits,
    )
    return _model(
        graph,
        "Every op kiln supports, with scalar, rank-expanding and two-sided broadcasting, "
        "initializers as inputs, an output consumed internally; Sqrt/Div on positive values.",
    )


def make_share(which: str) -> onnx.ModelProto:
    backbone = np.random.default_rng(100)
    w = backbone.uniform(0.5, 1.5, size=(64, 64)).astype(np.float32)
    b = backbone.uniform(-0.5, 0.5, size=(64, 64)).astype(np.float32)
    head = np.random.default_rng({"a": 1, "b": 2, "c": 3}[which]).uniform(-1, 1, size=(64, 64))
    nodes = [
        helper.make_node("Mul", ["X", "W_backbone"], ["xw"], name="backbone_mul"),
        helper.make_node("Add", ["xw", "B_backbone"], ["xb"], name="backbone_add"),
        helper.make_node("Relu", ["xb"], ["H"], name="backbone_relu"),
        helper.make_node("Mul", ["H", "W_head"], ["hy"], name="head_mul"),
        helper.make_node("Tanh", ["hy"], ["Y"], name="head_tanh"),
    ]
    graph = helper.make_graph(
        nodes,
        f"share_{which}",
        [_vi("X", [4, 64, 64])],
        [_vi("Y", [4, 64, 64])],
        [_init("W_backbone", w), _init("B_backbone", b), _init("W_head", head)],
    )
    return _model(graph, f"weight-sharing test model {which}: shared backbone, own head")


def make_attrs() -> onnx.ModelProto:
    """Attributes of every kind kiln reads (a Constant's tensor, ints, floats),
    on activations big enough that kiln splits steps over ORT's thread pool."""
    scale = numpy_helper.from_array(np.linspace(0.5, 1.5, 512, dtype=np.float32), name="scale_value")
    nodes = [
        helper.make_node("Constant", [], ["scale"], name="scale_const", value=scale),
        helper.make_node("Mul", ["X", "scale"], ["xs"], name="scale_mul"),
        helper.make_node("LeakyRelu", ["xs"], ["xl"], name="leaky", alpha=0.05),
        helper.make_node("Softmax", ["xl"], ["sm"], name="softmax", axis=-1),
        helper.make_node("Transpose", ["sm"], ["Y"], name="transpose", perm=[1, 0]),
    ]
    graph = helper.make_graph(nodes, "attrs", [_vi("X", [256, 512])], [_vi("Y", [512, 256])])
    return _model(graph, "Constant (tensor attribute), LeakyRelu (float), Softmax (int), Transpose (ints).")


def make_demo() -> onnx.ModelProto:
    """A transformer feed-forward block, as exporters write it."""
    rng = np.random.default_rng(1004)
    d, f = 128, 512
    gamma = rng.uniform(0.5, 1.5, (d,)).astype(np.float32)
    beta = (0.1 * rng.standard_normal((d,))).astype(np.float32)
    w1 = (rng.standard_normal((d, f)) / np.sqrt(d)).astype(np.float32)
    b1 = (0.1 * rng.standard_normal((f,))).astype(np.float32)
    w2 = (rng.standard_normal((f, d)) / np.sqrt(f)).astype(np.float32)
    b2 = (0.1 * rng.standard_normal((d,))).astype(np.float32)
    consts = [
        _init("gamma", gamma), _init("beta", beta), _init("W1", w1), _init("b1", b1),
        _init("W2", w2), _init("b2", b2),
        _init("sqrt2", np.array(np.sqrt(2.0))), _init("one", np.array(1.0)), _init("half", np.array(0.5)),
    ]
    nodes = [
        helper.make_node("LayerNormalization", ["x", "gamma", "beta"], ["ln"], name="norm", axis=-1, epsilon=1e-5),
        helper.make_node("MatMul", ["ln", "W1"], ["h0"], name="ffn_in"),
        helper.make_node("Add", ["h0", "b1"], ["h"], name="ffn_in_bias"),
        # GELU, decomposed with Erf as exporters write it: kiln fuses it back
        helper.make_node("Div", ["h", "sqrt2"], ["hs"], name="gelu_div"),
        helper.make_node("Erf", ["hs"], ["he"], name="gelu_erf"),
        helper.make_node("Add", ["he", "one"], ["h1"], name="gelu_add"),
        helper.make_node("Mul", ["h", "h1"], ["hm"], name="gelu_mul"),
        helper.make_node("Mul", ["hm", "half"], ["g"], name="gelu_half"),
        helper.make_node("MatMul", ["g", "W2"], ["o0"], name="ffn_out"),
        helper.make_node("Add", ["o0", "b2"], ["o"], name="ffn_out_bias"),
        helper.make_node("Add", ["x", "o"], ["y"], name="residual"),
    ]
    graph = helper.make_graph(
        nodes, "kiln_demo_ffn", [_vi("x", [1, 32, d])], [_vi("y", [1, 32, d])], initializer=consts
    )
    return _model(graph, "Demo: a transformer feed-forward block (LayerNorm, MatMul, erf-GELU, MatMul, residual).")


BUILDERS = {
    "add_mul_relu.onnx": make_add_mul_relu,
    "split.onnx": make_split,
    "unsupported.onnx": make_unsupported,
    "all_ops.onnx": make_all_ops,
    "demo.onnx": make_demo,
    "attrs.onnx": make_attrs,
    "share_a.onnx": lambda: make_share("a"),
    "share_b.onnx": lambda: make_share("b"),
    "share_c.onnx": lambda: make_share("c"),
}


def build_all(out_dir: str) -> dict[str, str]:
    """Build every model into ``out_dir``; returns {file name: path}."""
    os.makedirs(out_dir, exist_ok=True)
    paths = {}
    for file_name, builder in BUILDERS.items():
        model = builder()
        path = os.path.join(out_dir, file_name)
        onnx.save_model(model, path)
        # Re-check the file as written (catches serialization problems).
        onnx.checker.check_model(path, full_check=True)
        paths[file_name] = path
    return paths


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out",
        default=os.path.dirname(os.path.abspath(__file__)),
        help="output directory (default: the directory of this script, i.e. models/)",
    )
    args = parser.parse_args(argv)
    paths = build_all(args.out)
    for name, path in paths.items():
        print(f"wrote {path} ({os.path.getsize(path)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
