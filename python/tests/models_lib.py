"""Model builders for kiln's compiler tests (issue #5) and ``bench/latency.py``.

Every model is built with ``onnx.helper`` from deterministic weights (NumPy
``default_rng(seed)``), checked with ``onnx.checker`` (full check, shape
inference included) and described by a :class:`ModelCase`: the model, how to
make its inputs, whether its shapes are static, and the tolerance its outputs
are compared with.

Families:

* :func:`mlp` — a stack of dense layers (``Gemm`` or ``MatMul`` + ``Add``)
  with ``Relu`` / ``Gelu`` op / erf-decomposed GELU / tanh-decomposed GELU.
* :func:`bert` — BERT-style encoder layers as PyTorch exports them:
  Q/K/V projections, heads split with ``Reshape``/``Transpose`` whose target
  shapes come from ``Shape -> Gather -> Unsqueeze -> Concat`` subgraphs (or
  constants), scaled scores, an optional int64 attention mask
  (``Unsqueeze -> Unsqueeze -> Cast -> (1 - m) * -10000 -> Add``),
  ``Softmax``, optional ``Dropout`` (inference), residual adds,
  ``LayerNormalization`` as the op or decomposed
  (``ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div/Mul/Add``), and GELU as the
  ``Gelu`` op, erf-decomposed or tanh-decomposed.
* :func:`bert_embeddings` — an HF BERT export's embedding layer (word,
  token-type and position gathers, adds, LayerNorm).
* :func:`gate_chain`, :func:`channels_first_chain`, :func:`affine_relu_chain` — f32 elementwise ops
  that feed one another, which kiln runs as one ``Chain`` (issue #14).
* :mod:`fusion <models_lib>` patterns — :func:`fusion_cases`: every pattern
  kiln's compiler fuses, exactly, and near misses that must not be fused.

Nothing here needs kiln; it only needs ``onnx`` and ``numpy``.
"""
from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

# --------------------------------------------------------------------------
# tolerances (see the docstring of test_compiler_models.py for the reasons)
# --------------------------------------------------------------------------
TOL_ELEMENTWISE = (1e-4, 1e-5)  # small graphs: fusion patterns, a GEMM or two
TOL_GEMM_CHAIN = (1e-4, 1e-5)  # MLPs: K up to 1024, 4 layers
TOL_BERT = (2e-4, 5e-5)  # one or two encoder layers, hidden <= 256
TOL_BERT_DEEP = (5e-4, 1e-4)  # 3-4 encoder layers, or hidden 768

DimT = Union[int, str]

_NP_OF = {TensorProto.FLOAT: np.float32, TensorProto.INT64: np.int64,
          TensorProto.INT32: np.int32, TensorProto.BOOL: np.bool_}


@dataclass
class InputSpec:
    name: str
    elem_type: int
    shape: List[DimT]  # as declared in the model (str = symbolic dim)
    run_shape: List[int]  # the shape fed at run time
    kind: str = "normal"  # "normal" (f32 N(0,1)), "mask" (int64 0/1 prefix mask)


@dataclass
class ModelCase:
    """A model plus what the tests need to run and judge it."""

    name: str
    model: onnx.ModelProto
    inputs: List[InputSpec]
    static: bool = True
    rtol: float = TOL_ELEMENTWISE[0]
    atol: float = TOL_ELEMENTWISE[1]
    family: str = ""
    description: str = ""
    # for fusion cases: the pattern kiln should fuse, and whether this variant matches it
    pattern: Optional[str] = None
    matches: Optional[bool] = None
    tags: Tuple[str, ...] = ()
    # an exact reference where onnx's reference evaluator has no implementation
    # of the model's semantics (opset-11 Softmax): feeds -> outputs
    numpy_reference: Optional[Callable[[Dict[str, np.ndarray]], List[np.ndarray]]] = None

    def feeds(self, seed: int = 0, batch: Optional[int] = None, seq: Optional[int] = None) -> Dict[str, np.ndarray]:
        """Inputs for one run. ``batch`` replaces a symbolic first dimension,
        ``seq`` a symbolic second one."""
        rng = np.random.default_rng(seed)
        out = {}
        for spec in self.inputs:
            run_shape = list(spec.run_shape)
            if batch is not None and spec.shape and isinstance(spec.shape[0], str):
                run_shape[0] = batch
            if seq is not None and len(spec.shape) > 1 and isinstance(spec.shape[1], str):
                run_shape[1] = seq
            spec = InputSpec(spec.name, spec.elem_type, spec.shape, run_shape, spec.kind)
            if spec.kind == "mask":
                b, s = spec.run_shape
                m = np.zeros((b, s), dtype=_NP_OF[spec.elem_type])
                for i in range(b):
                    # batch row i attends to a prefix; row 0 sees everything
                    n = s if i == 0 else max(1, int(rng.integers(1, s + 1)))
                    m[i, :n] = 1
                out[spec.name] = m
            elif spec.elem_type == TensorProto.FLOAT:
                out[spec.name] = rng.standard_normal(spec.run_shape).astype(np.float32)
            elif spec.elem_type == TensorProto.BOOL:
                out[spec.name] = rng.integers(0, 2, spec.run_shape).astype(np.bool_)
            else:
                out[spec.name] = rng.integers(-5, 6, spec.run_shape).astype(_NP_OF[spec.elem_type])
        return out

    def save(self, folder: str, file_name: Optional[str] = None) -> str:
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, file_name or f"{self.name}.onnx")
        onnx.save(self.model, path)
        return path

    @property
    def op_types(self) -> List[str]:
        return sorted({n.op_type for n in self.model.graph.node})

    @property
    def n_nodes(self) -> int:
        return len(self.model.graph.node)

    @property
    def weight_bytes(self) -> int:
        return sum(int(np.prod(t.dims)) * 4 for t in self.model.graph.initializer)


# --------------------------------------------------------------------------
# graph builder
# --------------------------------------------------------------------------
class Builder:
    """Small helper over onnx.helper: unique names, initializers, Constant nodes."""

    def __init__(self, name: str, opset: int = 17, seed: int = 0):
        self.name = name
        self.opset = opset
        self.rng = np.random.default_rng(seed)
        self.nodes: List[onnx.NodeProto] = []
        self.inits: List[TensorProto] = []
        self.graph_inputs: List[onnx.ValueInfoProto] = []
        self.input_specs: List[InputSpec] = []
        self._used: Dict[str, int] = {}

    def uniq(self, base: str) -> str:
        n = self._used.get(base, 0)
        self._used[base] = n + 1
        return base if n == 0 else f"{base}_{n}"

    # --- values -----------------------------------------------------------
    def input(self, name: str, elem_type: int, shape: Sequence[DimT], run_shape=None, kind="normal") -> str:
        self.graph_inputs.append(helper.make_tensor_value_info(name, elem_type, list(shape)))
        rs = list(run_shape) if run_shape is not None else [int(d) for d in shape]
        self.input_specs.append(InputSpec(name, elem_type, list(shape), rs, kind))
        self._used[name] = 1
        return name

    def init(self, arr: np.ndarray, base: str) -> str:
        name = self.uniq(base)
        self.inits.append(numpy_helper.from_array(np.asarray(arr), name))
        return name

    def f32(self, value, base: str = "c") -> str:
        """A float32 constant initializer (scalar or array)."""
        return self.init(np.asarray(value, dtype=np.float32), base)

    def i64(self, value, base: str = "i") -> str:
        return self.init(np.asarray(value, dtype=np.int64), base)

    def const(self, arr, base: str = "Constant") -> str:
        """A ``Constant`` node (as PyTorch exports small constants)."""
        out = self.uniq(base + "_output")
        self.nodes.append(helper.make_node("Constant", [], [out], name=self.uniq(base),
                                           value=numpy_helper.from_array(np.asarray(arr))))
        return out

    def weight(self, shape: Sequence[int], base: str = "W", scale: Optional[float] = None) -> str:
        if scale is None:
            scale = 1.0 / math.sqrt(shape[0])
        return self.init((self.rng.standard_normal(shape) * scale).astype(np.float32), base)

    def bias(self, n: int, base: str = "B", scale: float = 0.1) -> str:
        return self.init((self.rng.standard_normal(n) * scale).astype(np.float32), base)

    # --- nodes ------------------------------------------------------------
    def op(self, op_type: str, inputs: Sequence[str], n_out: int = 1, name: Optional[str] = None,
           outputs: Optional[Sequence[str]] = None, domain: str = "", **attrs):
        node_name = self.uniq(name or op_type)
        outs = list(outputs) if outputs is not None else [self.uniq(f"{node_name}_out{i}" if n_out > 1 else f"{node_name}_out")
                                                          for i in range(n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=node_name, domain=domain or None,
                                           **attrs))
        return outs[0] if n_out == 1 else outs

    def reduce_mean(self, x: str, axes: Sequence[int], keepdims: int = 1, name: str = "ReduceMean") -> str:
        if self.opset >= 18:
            return self.op("ReduceMean", [x, self.i64(list(axes), "axes")], name=name, keepdims=keepdims)
        return self.op("ReduceMean", [x], name=name, axes=list(axes), keepdims=keepdims)

    def reduce_sum(self, x: str, axes: Sequence[int], keepdims: int = 1, name: str = "ReduceSum") -> str:
        # ReduceSum takes axes as an input from opset 13
        return self.op("ReduceSum", [x, self.i64(list(axes), "axes")], name=name, keepdims=keepdims)

    def unsqueeze(self, x: str, axes: Sequence[int], name: str = "Unsqueeze", const_node: bool = False) -> str:
        if self.opset >= 13:
            a = self.const(np.array(list(axes), dtype=np.int64)) if const_node else self.i64(list(axes), "axes")
            return self.op("Unsqueeze", [x, a], name=name)
        return self.op("Unsqueeze", [x], name=name, axes=list(axes))

    def model(self, outputs: Sequence[Tuple[str, int, Sequence[DimT]]], extra_opsets=()) -> onnx.ModelProto:
        graph = helper.make_graph(
            self.nodes, self.name, self.graph_inputs,
            [helper.make_tensor_value_info(n, t, list(s)) for n, t, s in outputs],
            initializer=self.inits)
        opsets = [helper.make_opsetid("", self.opset)] + [helper.make_opsetid(d, v) for d, v in extra_opsets]
        ir = 8 if self.opset <= 18 else 10
        m = helper.make_model(graph, opset_imports=opsets, ir_version=ir, producer_name="kiln-tests")
        onnx.checker.check_model(m, full_check=True)
        return m


# --------------------------------------------------------------------------
# building blocks
# --------------------------------------------------------------------------
def gelu(b: Builder, x: str, kind: str, name: str = "gelu") -> str:
    """GELU as kind: "op" (Gelu-20, approximate=none), "op_tanh" (Gelu-20, tanh),
    "erf" (PyTorch's erf decomposition), "tanh" (tanh decomposition)."""
    if kind == "op":
        return b.op("Gelu", [x], name=name)
    if kind == "op_tanh":
        return b.op("Gelu", [x], name=name, approximate="tanh")
    if kind == "erf":
        # x * 0.5 * (1 + erf(x / sqrt(2)))  -- PyTorch: Div, Erf, Add, Mul, Mul
        d = b.op("Div", [x, b.f32(1.4142135381698608, "sqrt2")], name=f"{name}/Div")
        e = b.op("Erf", [d], name=f"{name}/Erf")
        a = b.op("Add", [e, b.f32(1.0, "one")], name=f"{name}/Add")
        m = b.op("Mul", [x, a], name=f"{name}/Mul")
        return b.op("Mul", [m, b.f32(0.5, "half")], name=f"{name}/Mul_1")
    if kind == "tanh":
        # 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 * x^3)))
        p = b.op("Pow", [x, b.f32(3.0, "three")], name=f"{name}/Pow")
        c = b.op("Mul", [p, b.f32(0.044715, "gelu_c")], name=f"{name}/Mul")
        s = b.op("Add", [x, c], name=f"{name}/Add")
        k = b.op("Mul", [s, b.f32(math.sqrt(2.0 / math.pi), "sqrt_2_over_pi")], name=f"{name}/Mul_1")
        t = b.op("Tanh", [k], name=f"{name}/Tanh")
        a = b.op("Add", [t, b.f32(1.0, "one")], name=f"{name}/Add_1")
        h = b.op("Mul", [x, b.f32(0.5, "half")], name=f"{name}/Mul_2")
        return b.op("Mul", [h, a], name=f"{name}/Mul_3")
    if kind == "relu":
        return b.op("Relu", [x], name=name)
    raise ValueError(kind)


def layer_norm(b: Builder, x: str, hidden: int, kind: str, eps: float = 1e-12, name: str = "LayerNorm") -> str:
    gamma = b.init((1.0 + 0.1 * b.rng.standard_normal(hidden)).astype(np.float32), f"{name}.weight")
    beta = b.init((0.1 * b.rng.standard_normal(hidden)).astype(np.float32), f"{name}.bias")
    if kind == "op":
        return b.op("LayerNormalization", [x, gamma, beta], name=name, axis=-1, epsilon=eps)
    if kind == "decomposed":
        mean = b.reduce_mean(x, [-1], name=f"{name}/ReduceMean")
        d = b.op("Sub", [x, mean], name=f"{name}/Sub")
        p = b.op("Pow", [d, b.f32(2.0, "two")], name=f"{name}/Pow")
        var = b.reduce_mean(p, [-1], name=f"{name}/ReduceMean_1")
        ve = b.op("Add", [var, b.f32(eps, "eps")], name=f"{name}/Add")
        sd = b.op("Sqrt", [ve], name=f"{name}/Sqrt")
        n = b.op("Div", [d, sd], name=f"{name}/Div")
        g = b.op("Mul", [n, gamma], name=f"{name}/Mul")
        return b.op("Add", [g, beta], name=f"{name}/Add_1")
    raise ValueError(kind)


def dense(b: Builder, x: str, k: int, n: int, name: str, style: str = "matmul") -> str:
    """x @ W + B. style "matmul": MatMul + Add; "gemm": Gemm (2-D x only, transB=1)."""
    if style == "matmul":
        w = b.weight([k, n], f"{name}.weight")
        mm = b.op("MatMul", [x, w], name=f"{name}/MatMul")
        return b.op("Add", [mm, b.bias(n, f"{name}.bias")], name=f"{name}/Add")
    if style == "gemm":
        w = b.init((b.rng.standard_normal([n, k]) / math.sqrt(k)).astype(np.float32), f"{name}.weight")
        return b.op("Gemm", [x, w, b.bias(n, f"{name}.bias")], name=f"{name}/Gemm", transB=1)
    raise ValueError(style)


# --------------------------------------------------------------------------
# MLP
# --------------------------------------------------------------------------
def mlp(layers: int = 4, hidden: int = 1024, batch: int = 1, act: str = "relu", style: str = "gemm",
        in_dim: Optional[int] = None, dynamic_batch: bool = False, seq: Optional[int] = None,
        seed: int = 1, name: Optional[str] = None) -> ModelCase:
    """``layers`` dense layers of width ``hidden`` with activation ``act`` after
    each but the last. ``seq``: a 3-D input [batch, seq, in] (MatMul style only:
    batched MatMul with a broadcast 2-D weight)."""
    in_dim = in_dim or hidden
    opset = 20 if act.startswith("op") else 17
    name = name or (f"mlp_{style}_{act}_{layers}x{hidden}_b{batch}" + (f"_s{seq}" if seq else "")
                    + ("_dyn" if dynamic_batch else ""))
    b = Builder(name, opset, seed)
    bdim: DimT = "batch" if dynamic_batch else batch
    shape = [bdim, seq, in_dim] if seq else [bdim, in_dim]
    run = [batch, seq, in_dim] if seq else [batch, in_dim]
    x = b.input("input", TensorProto.FLOAT, shape, run)
    k = in_dim
    for i in range(layers):
        x = dense(b, x, k, hidden, f"fc{i}", style)
        k = hidden
        if i < layers - 1:
            x = gelu(b, x, act, name=f"act{i}")
    b.op("Identity", [x], outputs=["output"], name="output_identity")
    out_shape = [bdim, seq, hidden] if seq else [bdim, hidden]
    model = b.model([("output", TensorProto.FLOAT, out_shape)])
    return ModelCase(name, model, b.input_specs, static=not dynamic_batch, rtol=TOL_GEMM_CHAIN[0],
                     atol=TOL_GEMM_CHAIN[1], family="mlp",
                     description=f"{layers} x {hidden} {style} MLP, {act}, batch {batch}")


# --------------------------------------------------------------------------
# BERT-style encoder
# --------------------------------------------------------------------------
def _shape_dims(b: Builder, x: str, idx: Sequence[int], tag: str) -> List[str]:
    """PyTorch's ``x.size(i)`` for each i: Shape -> Gather(Constant i) -> Unsqueeze([0])."""
    shp = b.op("Shape", [x], name=f"{tag}/Shape")
    dims = []
    for i in idx:
        g = b.op("Gather", [shp, b.const(np.array(i, dtype=np.int64), f"{tag}/Constant")], name=f"{tag}/Gather",
                 axis=0)
        dims.append(b.unsqueeze(g, [0], name=f"{tag}/Unsqueeze", const_node=True))
    return dims


def _reshape_heads(b: Builder, x: str, batch: DimT, seq: int, heads: int, head_dim: int, tag: str,
                   shape_ops: bool) -> str:
    if shape_ops:
        d0, d1 = _shape_dims(b, x, [0, 1], tag)
        target = b.op("Concat", [d0, d1, b.const(np.array([heads], dtype=np.int64)),
                                 b.const(np.array([head_dim], dtype=np.int64))], name=f"{tag}/Concat", axis=0)
    else:
        bb = batch if isinstance(batch, int) else 0  # 0 = copy the input's dim
        target = b.i64([bb, seq, heads, head_dim], f"{tag}/shape")
    return b.op("Reshape", [x, target], name=f"{tag}/Reshape")


def _merge_heads(b: Builder, x: str, batch: DimT, seq: int, hidden: int, tag: str, shape_ops: bool) -> str:
    if shape_ops:
        d0, d1 = _shape_dims(b, x, [0, 1], tag)
        target = b.op("Concat", [d0, d1, b.const(np.array([hidden], dtype=np.int64))], name=f"{tag}/Concat", axis=0)
    else:
        bb = batch if isinstance(batch, int) else 0
        target = b.i64([bb, seq, hidden], f"{tag}/shape")
    return b.op("Reshape", [x, target], name=f"{tag}/Reshape")


ATTN_FORMS = ("eager", "vit", "distilbert", "sdpa")


def _heads(b: Builder, x: str, batch: DimT, seq: int, heads: int, hd: int, tag: str, shape_ops: bool,
           perm: Sequence[int]) -> str:
    return b.op("Transpose", [_reshape_heads(b, x, batch, seq, heads, hd, tag, shape_ops)], name=f"{tag}/Transpose",
                perm=list(perm))


def _swap_last(b: Builder, x: str, tag: str) -> str:
    """``x.transpose(-1, -2)`` on 4-D heads."""
    return b.op("Transpose", [x], name=f"{tag}/Transpose", perm=[0, 1, 3, 2])


def _sdpa_sqrt_scale(b: Builder, q: str, tag: str) -> str:
    """torch.onnx's SDPA scale without ``scale=``: ``Sqrt(1 / Sqrt(q.size(-1)))``
    computed from ``Shape(q)``, as the exporter writes it."""
    last = b.op("Slice", [b.op("Shape", [q], name=f"{tag}/Shape"), b.const(np.array([-1], dtype=np.int64)),
                          b.const(np.array([2**63 - 1], dtype=np.int64))], name=f"{tag}/Slice")
    d = b.op("Cast", [last], name=f"{tag}/Cast", to=TensorProto.FLOAT)
    scale = b.op("Div", [b.const(np.array([1.0], dtype=np.float32)), b.op("Sqrt", [d], name=f"{tag}/Sqrt")],
                 name=f"{tag}/Div")
    scale = b.op("Cast", [scale], name=f"{tag}/Cast_1", to=TensorProto.FLOAT)
    return b.op("Sqrt", [scale], name=f"{tag}/Sqrt_1")


def _masked_fill(b: Builder, s: str, x: str, attention_mask: str, batch: DimT, seq: int, fill: float,
                 shape_ops: bool, tag: str) -> str:
    """DistilBERT: ``scores.masked_fill((mask == 0).view(bs, 1, 1, k_len).expand_as(scores), fill)``."""
    pad = b.op("Equal", [attention_mask, b.const(np.array(0, dtype=np.int64))], name=f"{tag}/Equal")
    if shape_ops:
        d0, d1 = _shape_dims(b, x, [0, 1], tag)
        one = b.const(np.array([1], dtype=np.int64))
        target = b.op("Concat", [d0, one, one, d1], name=f"{tag}/Concat", axis=0)
    else:
        target = b.i64([batch if isinstance(batch, int) else 0, 1, 1, seq], f"{tag}/shape")
    pad = b.op("Reshape", [pad, target], name=f"{tag}/Reshape")
    pad = b.op("Expand", [pad, b.op("Shape", [s], name=f"{tag}/Shape_scores")], name=f"{tag}/Expand")
    return b.op("Where", [pad, b.const(np.array(fill, dtype=np.float32)), s], name=f"{tag}/Where")


def _qk_heads(b: Builder, q: str, k: str, *, attn: str, batch: DimT, seq: int, heads: int, hd: int,
              shape_ops: bool, tag: str) -> Tuple[str, str]:
    """Q's heads [B,H,S,D] and K's transposed heads [B,H,D,S]."""
    qh = _heads(b, q, batch, seq, heads, hd, f"{tag}/q_heads", shape_ops, [0, 2, 1, 3])
    if attn == "eager":
        return qh, _heads(b, k, batch, seq, heads, hd, f"{tag}/k_heads", shape_ops, [0, 2, 3, 1])
    # k.transpose(-1, -2) on the heads, as exported before ORT merges the pair
    kh = _heads(b, k, batch, seq, heads, hd, f"{tag}/k_heads", shape_ops, [0, 2, 1, 3])
    return qh, _swap_last(b, kh, f"{tag}/k_t")


def _scores(b: Builder, qh: str, kt: str, x: str, mask: Optional[str], *, attn: str, batch: DimT, seq: int,
            hd: int, fill: float, shape_ops: bool, tag: str) -> str:
    """Masked, scaled ``q·kᵀ`` over the heads, as export form ``attn`` writes it
    (``mask``: the additive mask, or for "distilbert" the int64 attention mask)."""
    if attn == "distilbert":
        qh = b.op("Div", [qh, b.const(np.array(math.sqrt(hd), dtype=np.float32))], name=f"{tag}/q_scaled")
    if attn == "sdpa":
        c = _sdpa_sqrt_scale(b, qh, f"{tag}/sdpa_scale")
        qh = b.op("Mul", [qh, c], name=f"{tag}/sdpa/Mul")
        kt = b.op("Mul", [kt, c], name=f"{tag}/sdpa/Mul_1")
    s = b.op("MatMul", [qh, kt], name=f"{tag}/attention/scores/MatMul")
    if attn == "eager":
        s = b.op("Div", [s, b.f32(math.sqrt(hd), "sqrt_head_dim")], name=f"{tag}/attention/scores/Div")
    elif attn == "vit":  # transformers' eager_attention_forward: `* scaling`
        s = b.op("Mul", [s, b.f32(1.0 / math.sqrt(hd), "scaling")], name=f"{tag}/attention/scores/Mul")
    if mask is None:
        return s
    if attn == "distilbert":
        return _masked_fill(b, s, x, mask, batch, seq, fill, shape_ops, f"{tag}/attention/mask")
    return b.op("Add", [s, mask], name=f"{tag}/attention/scores/AddMask")


def encoder_layer(b: Builder, x: str, mask_add: Optional[str], *, batch: DimT, seq: int, hidden: int,
                  heads: int, inter: int, ln: str, act: str, shape_ops: bool, dropout: bool, tag: str,
                  attn: str = "eager", fill: float = float(np.finfo(np.float32).min)) -> str:
    """One post-norm encoder layer; ``attn`` picks the attention's export form
    (see :func:`bert`), ``fill`` DistilBERT's masked-fill value."""
    hd = hidden // heads
    q = dense(b, x, hidden, hidden, f"{tag}/attention/self/query")
    k = dense(b, x, hidden, hidden, f"{tag}/attention/self/key")
    v = dense(b, x, hidden, hidden, f"{tag}/attention/self/value")
    qh, kt = _qk_heads(b, q, k, attn=attn, batch=batch, seq=seq, heads=heads, hd=hd, shape_ops=shape_ops, tag=tag)
    v = _heads(b, v, batch, seq, heads, hd, f"{tag}/v_heads", shape_ops, [0, 2, 1, 3])
    s = _scores(b, qh, kt, x, mask_add, attn=attn, batch=batch, seq=seq, hd=hd, fill=fill, shape_ops=shape_ops,
                tag=tag)
    p = b.op("Softmax", [s], name=f"{tag}/attention/Softmax", axis=-1)
    if dropout:
        p = b.op("Dropout", [p], name=f"{tag}/attention/Dropout")
    c = b.op("MatMul", [p, v], name=f"{tag}/attention/context/MatMul")
    c = b.op("Transpose", [c], name=f"{tag}/attention/context/Transpose", perm=[0, 2, 1, 3])
    c = _merge_heads(b, c, batch, seq, hidden, f"{tag}/attention/context", shape_ops)
    o = dense(b, c, hidden, hidden, f"{tag}/attention/output/dense")
    if dropout:
        o = b.op("Dropout", [o], name=f"{tag}/attention/output/Dropout")
    o = b.op("Add", [o, x], name=f"{tag}/attention/output/residual")
    a = layer_norm(b, o, hidden, ln, name=f"{tag}/attention/output/LayerNorm")
    i = dense(b, a, hidden, inter, f"{tag}/intermediate/dense")
    i = gelu(b, i, act, name=f"{tag}/intermediate/gelu")
    f = dense(b, i, inter, hidden, f"{tag}/output/dense")
    f = b.op("Add", [f, a], name=f"{tag}/output/residual")
    return layer_norm(b, f, hidden, ln, name=f"{tag}/output/LayerNorm")


def bert(hidden: int = 64, heads: int = 2, seq: int = 8, batch: int = 1, layers: int = 1, mask: bool = True,
         ln: str = "op", act: str = "erf", shape_ops: bool = True, dropout: bool = False,
         dynamic_batch: bool = False, inter: Optional[int] = None, seed: int = 2,
         name: Optional[str] = None, dynamic_seq: bool = False, attn: str = "eager",
         mask_value: float = -10000.0, fill: float = float(np.finfo(np.float32).min),
         sdpa_mask: str = "full") -> ModelCase:
    """A stack of BERT encoder layers over an embedded input [batch, seq, hidden]
    (plus ``attention_mask`` int64 [batch, seq] if ``mask``). ``dynamic_seq``:
    the sequence dim is the symbol ``sequence`` (reshapes then go through
    ``Shape`` ops, as HF exports do).

    ``attn``, the attention as exported (issue #14): "eager" (HF BERT/MiniLM/
    RoBERTa: K's heads as ``[0,2,3,1]``, scores ``/ sqrt(D)``, the extended mask
    ``(1 - m) * mask_value`` [B,1,1,S] added; RoBERTa's and newer BERTs'
    ``mask_value`` is ``finfo(float32).min``); "vit" (transformers'
    ``eager_attention_forward``, ViT: ``q·k.transpose(-1,-2) * scaling``,
    both transposes of K kept); "distilbert" (``q / sqrt(D)`` on the heads,
    ``k.transpose(2, 3)``, ``scores.masked_fill(mask == 0 ..., fill)`` per
    layer from the int64 mask); "sdpa" (torch.onnx's
    ``scaled_dot_product_attention``: Q and Kᵀ each ``* Sqrt(scale)``, the
    float mask added: ``sdpa_mask`` "full" is HF's ``[B,1,S,S]`` from
    ``_prepare_4d_attention_mask_for_sdpa``, "keys" the [B,1,1,S] extended one)."""
    assert hidden % heads == 0
    assert attn in ATTN_FORMS
    assert shape_ops or not dynamic_seq
    inter = inter or 4 * hidden
    opset = 20 if act.startswith("op") else 17
    name = name or (f"bert_h{hidden}_a{heads}_s{seq}_b{batch}_l{layers}_{'mask' if mask else 'nomask'}"
                    f"_ln{ln}_gelu{act}{'' if shape_ops else '_constshape'}{'_dropout' if dropout else ''}"
                    f"{'_dyn' if dynamic_batch else ''}{'_dynseq' if dynamic_seq else ''}"
                    f"{'' if attn == 'eager' else '_' + attn}")
    b = Builder(name, opset, seed)
    bdim: DimT = "batch" if dynamic_batch else batch
    sdim: DimT = "sequence" if dynamic_seq else seq
    x = b.input("input", TensorProto.FLOAT, [bdim, sdim, hidden], [batch, seq, hidden])
    mask_add = None
    if mask:
        m = b.input("attention_mask", TensorProto.INT64, [bdim, sdim], [batch, seq], kind="mask")
        if attn == "distilbert":
            mask_add = m
        elif attn == "sdpa" and sdpa_mask == "full":
            mask_add = _sdpa_mask(b, m, x)
        else:
            m = b.unsqueeze(m, [1], name="extended_mask/Unsqueeze")
            m = b.unsqueeze(m, [2], name="extended_mask/Unsqueeze_1")
            m = b.op("Cast", [m], name="extended_mask/Cast", to=TensorProto.FLOAT)
            m = b.op("Sub", [b.f32(1.0, "one"), m], name="extended_mask/Sub")
            mask_add = b.op("Mul", [m, b.f32(mask_value, "mask_neg")], name="extended_mask/Mul")
    for li in range(layers):
        x = encoder_layer(b, x, mask_add, batch=bdim, seq=seq, hidden=hidden, heads=heads, inter=inter, ln=ln,
                          act=act, shape_ops=shape_ops, dropout=dropout, tag=f"layer{li}", attn=attn, fill=fill)
    b.op("Identity", [x], outputs=["output"], name="output_identity")
    model = b.model([("output", TensorProto.FLOAT, [bdim, sdim, hidden])])
    deep = layers >= 3 or hidden >= 768
    rtol, atol = TOL_BERT_DEEP if deep else TOL_BERT
    desc = (f"BERT encoder: hidden {hidden}, {heads} heads, seq {seq}, batch {batch}"
            f"{' (dynamic)' if dynamic_batch else ''}, {layers} layer(s), {'mask' if mask else 'no mask'}, "
            f"LayerNorm {ln}, GELU {act}, {'Shape-computed' if shape_ops else 'constant'} reshapes"
            f"{', Dropout' if dropout else ''}, attention as {attn}")
    return ModelCase(name, model, b.input_specs, static=not (dynamic_batch or dynamic_seq), rtol=rtol, atol=atol,
                     family="bert", description=desc)


def _sdpa_mask(b: Builder, m: str, x: str) -> str:
    """HF's ``_prepare_4d_attention_mask_for_sdpa``: ``m[:, None, None, :]``
    expanded to [B,1,S,S], ``1 - m``, then ``masked_fill(.to(bool), finfo.min)``."""
    m = b.unsqueeze(m, [1], name="sdpa_mask/keys/Unsqueeze")
    m = b.unsqueeze(m, [2], name="sdpa_mask/keys/Unsqueeze_1")
    d0, d1 = _shape_dims(b, x, [0, 1], "sdpa_mask")
    one = b.const(np.array([1], dtype=np.int64))
    m = b.op("Expand", [m, b.op("Concat", [d0, one, d1, d1], name="sdpa_mask/Concat", axis=0)],
             name="sdpa_mask/Expand")
    m = b.op("Cast", [m], name="sdpa_mask/Cast", to=TensorProto.FLOAT)
    inv = b.op("Sub", [b.f32(1.0, "one"), m], name="sdpa_mask/Sub")
    pad = b.op("Cast", [inv], name="sdpa_mask/Cast_1", to=TensorProto.BOOL)
    return b.op("Where", [pad, b.const(np.array(np.finfo(np.float32).min, dtype=np.float32)), inv],
                name="sdpa_mask/Where")


def bert_embeddings(token_types: Optional[str], ln: str = "op", dynamic: bool = True, batch: int = 2,
                    seq: int = 8, sum_escapes: bool = False, project: bool = True, hidden: int = 64,
                    vocab: int = 100, max_pos: int = 512, seed: int = 0) -> onnx.ModelProto:
    """An HF BERT export's embedding layer as torch.onnx writes it (issue #14):
    ``input_ids`` [batch, sequence] gathered from the word table; position ids
    sliced from the ``position_ids`` buffer to the sequence length (``Shape ->
    Gather -> Unsqueeze -> Slice``) and gathered; token types (``token_types``)
    a ``token_type_ids`` input ("input"), HF's buffered zeros sliced and
    ``Expand``-ed to the ids' shape ("buffer") or absent (None, DistilBERT); the
    terms added in the exporter's order, then ``LayerNormalization`` (``ln``
    "op") or its decomposed form, and (``project``) a first ``MatMul``.
    Output ``hidden``; ``sum_escapes`` also outputs the sum as ``embeddings_sum``.
    ``dynamic``: batch and sequence are symbols."""
    rng = np.random.default_rng(seed)
    inits, nodes = [], []

    def const(name, arr):
        inits.append(numpy_helper.from_array(np.asarray(arr), name))
        return name

    def op(kind, ins, name, **attrs):
        nodes.append(helper.make_node(kind, ins, [name], name=name, **attrs))
        return name

    def table(name, rows):
        return const(name, rng.standard_normal((rows, hidden)).astype(np.float32) * 0.5)

    bdim, sdim = ("batch", "sequence") if dynamic else (batch, seq)
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, [bdim, sdim])]
    word = op("Gather", [table("word_embeddings", vocab), "input_ids"], "word/Gather")
    shape = op("Shape", ["input_ids"], "Shape")
    seq_len = op("Gather", [shape, const("one", np.array(1, np.int64))], "Shape/Gather_1")
    seq_end = op("Unsqueeze", [seq_len, const("axes0", np.array([0], np.int64))], "Unsqueeze")
    zero, axis1 = const("zero", np.array([0], np.int64)), const("axis1", np.array([1], np.int64))
    x = word
    if token_types == "input":
        inputs.append(helper.make_tensor_value_info("token_type_ids", TensorProto.INT64, [bdim, sdim]))
        types = "token_type_ids"
    elif token_types == "buffer":
        buffered = const("buffered_token_type_ids", np.zeros((1, max_pos), np.int64))
        types = op("Slice", [buffered, zero, seq_end, axis1], "token_type/Slice")
        types = op("Expand", [types, shape], "token_type/Expand")
    if token_types is not None:
        seg = op("Gather", [table("token_type_embeddings", 2), types], "token_type/Gather")
        x = op("Add", [x, seg], "embeddings/Add")
    pos_ids = const("position_ids", np.arange(max_pos, dtype=np.int64)[None, :])
    pos_ids = op("Slice", [pos_ids, zero, seq_end, axis1], "position/Slice")
    pos = op("Gather", [table("position_embeddings", max_pos), pos_ids], "position/Gather")
    x = op("Add", [x, pos], "embeddings/Add_1")
    gamma = const("ln_weight", (1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32))
    beta = const("ln_bias", (0.1 * rng.standard_normal(hidden)).astype(np.float32))
    if ln == "op":
        y = op("LayerNormalization", [x, gamma, beta], "LayerNorm", axis=-1, epsilon=1e-12)
    else:
        mu = op("ReduceMean", [x], "ln/ReduceMean", axes=[-1])
        d = op("Sub", [x, mu], "ln/Sub")
        var = op("ReduceMean", [op("Pow", [d, const("two", np.float32(2.0))], "ln/Pow")], "ln/ReduceMean_1",
                 axes=[-1])
        sd = op("Sqrt", [op("Add", [var, const("eps", np.float32(1e-12))], "ln/Add")], "ln/Sqrt")
        y = op("Add", [op("Mul", [op("Div", [d, sd], "ln/Div"), gamma], "ln/Mul"), beta], "ln/Add_1")
    if project:
        w = const("query_weight", rng.standard_normal((hidden, hidden)).astype(np.float32) * 0.1)
        y = op("MatMul", [y, w], "query/MatMul")
    nodes.append(helper.make_node("Identity", [y], ["hidden"], name="hidden"))
    outputs = [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, [bdim, sdim, hidden])]
    if sum_escapes:
        nodes.append(helper.make_node("Identity", [x], ["embeddings_sum"], name="embeddings_sum"))
        outputs.append(helper.make_tensor_value_info("embeddings_sum", TensorProto.FLOAT, [bdim, sdim, hidden]))
    graph = helper.make_graph(nodes, "bert_embeddings", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model



def bert_embeddings_feeds(model: onnx.ModelProto, batch: int, seq: int, seed: int, vocab: int = 100,
                          bad_id: Optional[int] = None) -> Dict[str, np.ndarray]:
    """Ids for :func:`bert_embeddings` (one negative: ``Gather`` counts it from the
    end; ``bad_id`` last), and token types when the model takes them."""
    rng = np.random.default_rng(100 + seed)
    ids = rng.integers(0, vocab, (batch, seq), dtype=np.int64)
    ids[0, 0] = -1  # Gather counts a negative index from the end
    if bad_id is not None:
        ids[-1, -1] = bad_id
    f = {"input_ids": ids}
    if any(i.name == "token_type_ids" for i in model.graph.input):
        f["token_type_ids"] = (rng.random((batch, seq)) < 0.4).astype(np.int64)
    return f



# --------------------------------------------------------------------------
# the project's model list (tests and EPContext round trips)
# --------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def mlp_cases() -> List[ModelCase]:
    return [
        mlp(4, 1024, 1, "relu", "gemm"),
        mlp(4, 1024, 32, "relu", "gemm"),
        mlp(4, 1024, 1, "op", "gemm"),
        mlp(4, 1024, 32, "op", "gemm"),
        mlp(4, 1024, 1, "relu", "matmul"),
        mlp(4, 1024, 32, "relu", "matmul"),
        mlp(4, 1024, 32, "erf", "matmul"),
        mlp(4, 1024, 1, "tanh", "matmul"),
        mlp(3, 256, 2, "relu", "matmul", in_dim=128, seq=16),
        mlp(2, 256, 4, "op_tanh", "gemm", in_dim=100),
    ]


@functools.lru_cache(maxsize=None)
def bert_cases() -> List[ModelCase]:
    return [
        bert(64, 2, 8, 1, 1, mask=False, ln="op", act="op"),
        bert(64, 2, 8, 2, 2, mask=True, ln="decomposed", act="erf"),
        bert(64, 2, 8, 2, 1, mask=True, ln="op", act="erf", shape_ops=False, dropout=True),
        bert(128, 4, 32, 2, 2, mask=True, ln="op", act="erf"),
        bert(128, 4, 32, 1, 1, mask=False, ln="decomposed", act="tanh", dropout=True),
        bert(256, 4, 32, 2, 1, mask=True, ln="op", act="op"),
        bert(256, 4, 128, 1, 4, mask=True, ln="decomposed", act="erf"),
        bert(768, 12, 128, 1, 1, mask=True, ln="decomposed", act="erf"),
        bert(768, 12, 32, 2, 1, mask=False, ln="op", act="op"),
    ]


@functools.lru_cache(maxsize=None)
def dynamic_cases() -> List[ModelCase]:
    """Dynamic batch: kiln must leave what it cannot compile to the CPU EP."""
    return [
        bert(64, 2, 8, 3, 2, mask=True, ln="decomposed", act="erf", dynamic_batch=True),
        bert(64, 2, 8, 3, 1, mask=True, ln="op", act="op", shape_ops=False, dynamic_batch=True),
        mlp(2, 128, 5, "relu", "gemm", dynamic_batch=True),
    ]


# --------------------------------------------------------------------------
# fusion patterns, exact and near misses
# --------------------------------------------------------------------------
def _single(name: str, pattern: str, matches: bool, shape: Sequence[int], body: Callable[[Builder, str], object],
            opset: int = 17, out_shapes: Optional[Sequence[Sequence[int]]] = None, seed: int = 3,
            extra_inputs: Sequence[Tuple[str, Sequence[int]]] = (), description: str = "") -> ModelCase:
    b = Builder(name, opset, seed)
    x = b.input("X", TensorProto.FLOAT, list(shape))
    extra = [b.input(n, TensorProto.FLOAT, list(s)) for n, s in extra_inputs]
    outs = body(b, x, *extra)
    outs = outs if isinstance(outs, list) else [outs]
    names = []
    for i, o in enumerate(outs):
        nm = "Y" if i == 0 else f"Y{i}"
        b.op("Identity", [o], outputs=[nm], name=f"out{i}")
        names.append(nm)
    shapes = out_shapes or [list(shape)] * len(names)
    model = b.model([(n, TensorProto.FLOAT, s) for n, s in zip(names, shapes)])
    return ModelCase(name, model, b.input_specs, rtol=TOL_ELEMENTWISE[0], atol=TOL_ELEMENTWISE[1],
                     family="fusion", pattern=pattern, matches=matches, description=description)


@functools.lru_cache(maxsize=None)
def _softmax11(axis: int):
    """Opset-1..11 Softmax in float64: flatten to [prod(dims[:axis]), prod(dims[axis:])]."""
    def ref(feeds):
        x = feeds["X"].astype(np.float64)
        flat = x.reshape(int(np.prod(x.shape[:axis], dtype=np.int64)), -1)
        e = np.exp(flat - flat.max(axis=1, keepdims=True))
        return [(e / e.sum(axis=1, keepdims=True)).reshape(x.shape).astype(np.float32)]
    return ref


def _with_ref(case: ModelCase, ref) -> ModelCase:
    case.numpy_reference = ref
    return case


def fusion_cases() -> List[ModelCase]:
    S = [2, 16, 64]
    cases: List[ModelCase] = []

    # ---- erf GELU --------------------------------------------------------
    def erf_gelu(c_half=0.5, c_sqrt2=1.4142135381698608, c_one=1.0, expose=False):
        def body(b, x):
            d = b.op("Div", [x, b.f32(c_sqrt2)], name="gelu/Div")
            e = b.op("Erf", [d], name="gelu/Erf")
            a = b.op("Add", [e, b.f32(c_one)], name="gelu/Add")
            m = b.op("Mul", [x, a], name="gelu/Mul")
            y = b.op("Mul", [m, b.f32(c_half)], name="gelu/Mul_1")
            return [y, e] if expose else y
        return body

    cases += [
        _single("fuse_gelu_erf", "gelu_erf", True, S, erf_gelu(), description="x*0.5*(1+erf(x/sqrt2))"),
        _single("fuse_gelu_erf_half_first", "gelu_erf", True, S,
                lambda b, x: b.op("Mul", [b.op("Mul", [x, b.f32(0.5)]),
                                          b.op("Add", [b.op("Erf", [b.op("Mul", [x, b.f32(0.7071067690849304)])]),
                                                       b.f32(1.0)])]),
                description="0.5*x*(1+erf(x*0.70710678)) (HF / Keras ordering)"),
        _single("miss_gelu_erf_c06", "gelu_erf", False, S, erf_gelu(c_half=0.6), description="0.5 -> 0.6"),
        _single("miss_gelu_erf_sqrt3", "gelu_erf", False, S, erf_gelu(c_sqrt2=1.7320508), description="sqrt2 -> sqrt3"),
        _single("miss_gelu_erf_one_plus", "gelu_erf", False, S, erf_gelu(c_one=2.0), description="1+erf -> 2+erf"),
        _single("miss_gelu_erf_extra_consumer", "gelu_erf", False, S, erf_gelu(expose=True),
                out_shapes=[S, S], description="Erf output is also a graph output"),
        _single("miss_gelu_erf_inner_consumer", "gelu_erf", False, S,
                lambda b, x: b.op("Add", erf_gelu(expose=True)(b, x), name="consume_erf"),
                description="Erf output also feeds an Add inside the graph"),
        _single("miss_gelu_erf_other_input", "gelu_erf", False, S,
                lambda b, x, z: b.op("Mul", [b.op("Mul", [x, b.op("Add", [b.op("Erf", [b.op("Div", [z, b.f32(
                    1.4142135381698608)])]), b.f32(1.0)])]), b.f32(0.5)]),
                extra_inputs=[("Z", S)], description="erf over another tensor than the multiplied one"),
    ]

    # ---- tanh GELU -------------------------------------------------------
    def tanh_gelu(c=0.044715, k=math.sqrt(2.0 / math.pi), expose=False):
        def body(b, x):
            p = b.op("Pow", [x, b.f32(3.0)], name="gelu/Pow")
            m = b.op("Mul", [p, b.f32(c)], name="gelu/Mul")
            s = b.op("Add", [x, m], name="gelu/Add")
            kk = b.op("Mul", [s, b.f32(k)], name="gelu/Mul_1")
            t = b.op("Tanh", [kk], name="gelu/Tanh")
            a = b.op("Add", [t, b.f32(1.0)], name="gelu/Add_1")
            h = b.op("Mul", [x, b.f32(0.5)], name="gelu/Mul_2")
            y = b.op("Mul", [h, a], name="gelu/Mul_3")
            return [y, s] if expose else y
        return body

    cases += [
        _single("fuse_gelu_tanh", "gelu_tanh", True, S, tanh_gelu(), description="0.5x(1+tanh(k(x+0.044715x^3)))"),
        _single("fuse_gelu_tanh_mul_cube", "gelu_tanh", True, S,
                lambda b, x: b.op("Mul", [b.op("Mul", [x, b.f32(0.5)]), b.op("Add", [b.op("Tanh", [b.op("Mul", [
                    b.op("Add", [x, b.op("Mul", [b.op("Mul", [b.op("Mul", [x, x]), x]), b.f32(0.044715)])]),
                    b.f32(math.sqrt(2.0 / math.pi))])]), b.f32(1.0)])]),
                description="x^3 as x*x*x"),
        _single("miss_gelu_tanh_c005", "gelu_tanh", False, S, tanh_gelu(c=0.05), description="0.044715 -> 0.05"),
        _single("miss_gelu_tanh_k", "gelu_tanh", False, S, tanh_gelu(k=0.8), description="sqrt(2/pi) -> 0.8"),
        _single("miss_gelu_tanh_extra_consumer", "gelu_tanh", False, S, tanh_gelu(expose=True), out_shapes=[S, S],
                description="x+0.044715x^3 also a graph output"),
    ]

    # ---- decomposed LayerNorm -------------------------------------------
    def ln_dec(hidden, eps=1e-5, pow_exp=2.0, axes2=(-1,), expose=False, affine=True, sqrt_then_div=True,
               eps_after_sqrt=False):
        def body(b, x):
            mean = b.reduce_mean(x, [-1], name="ln/ReduceMean")
            d = b.op("Sub", [x, mean], name="ln/Sub")
            p = b.op("Pow", [d, b.f32(pow_exp)], name="ln/Pow")
            var = b.reduce_mean(p, list(axes2), name="ln/ReduceMean_1")
            ve = b.op("Add", [var, b.f32(eps)], name="ln/Add") if not eps_after_sqrt else var
            if eps_after_sqrt:
                n = b.op("Div", [d, b.op("Add", [b.op("Sqrt", [ve], name="ln/Sqrt"), b.f32(eps)], name="ln/AddEps")],
                         name="ln/Div")
            elif sqrt_then_div:
                sd = b.op("Sqrt", [ve], name="ln/Sqrt")
                n = b.op("Div", [d, sd], name="ln/Div")
            else:
                r = b.op("Reciprocal", [b.op("Sqrt", [ve], name="ln/Sqrt")], name="ln/Reciprocal")
                n = b.op("Mul", [d, r], name="ln/MulR")
            y = n
            if affine:
                g = b.init((1.0 + 0.1 * b.rng.standard_normal(hidden)).astype(np.float32), "gamma")
                bb = b.init((0.1 * b.rng.standard_normal(hidden)).astype(np.float32), "beta")
                y = b.op("Add", [b.op("Mul", [n, g], name="ln/Mul"), bb], name="ln/Add_1")
            return [y, mean] if expose else y
        return body

    H = S[-1]
    cases += [
        _single("fuse_layernorm", "layernorm", True, S, ln_dec(H), description="ReduceMean/Sub/Pow/.../Mul/Add"),
        _single("fuse_layernorm_no_affine", "layernorm", True, S, ln_dec(H, affine=False),
                description="without the gamma/beta Mul/Add"),
        _single("fuse_layernorm_rsqrt", "layernorm", True, S, ln_dec(H, sqrt_then_div=False),
                description="d * Reciprocal(Sqrt(var + eps))"),
        _single("fuse_layernorm_opset18", "layernorm", True, S, ln_dec(H), opset=18,
                description="ReduceMean axes as an input (opset 18)"),
        _single("miss_layernorm_pow4", "layernorm", False, S, ln_dec(H, pow_exp=4.0), description="Pow 2 -> 4"),
        _single("miss_layernorm_eps_after_sqrt", "layernorm", False, S, ln_dec(H, eps_after_sqrt=True),
                description="sqrt(var) + eps instead of sqrt(var + eps)"),
        _single("miss_layernorm_inner_consumer", "layernorm", False, S,
                lambda b, x: b.op("Add", ln_dec(H, expose=True)(b, x), name="consume_mean"),
                description="the mean also feeds an Add inside the graph"),
        _single("miss_layernorm_axes", "layernorm", False, S, ln_dec(H, axes2=(-2,)),
                out_shapes=[S], description="variance over another axis"),
        _single("miss_layernorm_extra_consumer", "layernorm", False, S, ln_dec(H, expose=True),
                out_shapes=[S, S[:-1] + [1]], description="the mean is also a graph output"),
    ]

    # ---- decomposed Softmax ---------------------------------------------
    def sm_dec(axis=-1, sum_axis=-1, expose=False, sub_max=False, denominator_plus=None):
        def body(b, x):
            src = x
            if sub_max:  # numerically safe form with a constant shift instead of ReduceMax
                src = b.op("Sub", [x, b.f32(3.0)], name="sm/Sub")
            e = b.op("Exp", [src], name="sm/Exp")
            s = b.reduce_sum(e, [sum_axis], name="sm/ReduceSum")
            if denominator_plus is not None:
                s = b.op("Add", [s, b.f32(denominator_plus)], name="sm/AddDen")
            y = b.op("Div", [e, s], name="sm/Div")
            return [y, e] if expose else y
        return body

    cases += [
        _single("fuse_softmax", "softmax", True, S, sm_dec(), description="Exp/ReduceSum(-1)/Div"),
        _single("fuse_softmax_shifted", "softmax", True, S, sm_dec(sub_max=True),
                description="Exp(x - c)/ReduceSum/Div"),
        _single("fuse_softmax_axis1", "softmax", True, S, sm_dec(sum_axis=1),
                description="Exp/ReduceSum(1)/Div: a softmax over axis 1"),
        _single("miss_softmax_sum_plus_one", "softmax", False, S, sm_dec(denominator_plus=1.0),
                description="Exp(x) / (ReduceSum(Exp(x)) + 1)"),
        _single("miss_softmax_other_tensor", "softmax", False, S,
                lambda b, x, z: b.op("Div", [b.op("Exp", [x]), b.reduce_sum(b.op("Exp", [z]), [-1])]),
                extra_inputs=[("Z", S)], description="Exp(x) / ReduceSum(Exp(z))"),
        _single("miss_softmax_extra_consumer", "softmax", False, S, sm_dec(expose=True), out_shapes=[S, S],
                description="Exp output is also a graph output"),
        _single("softmax_op13", "softmax_op", True, S, lambda b, x: b.op("Softmax", [x], axis=-1)),
        _single("softmax_op13_axis1", "softmax_op", True, S, lambda b, x: b.op("Softmax", [x], axis=1)),
        _with_ref(_single("softmax_op11_flatten", "softmax_op", True, S, lambda b, x: b.op("Softmax", [x], axis=1),
                          opset=11, description="opset 11 Softmax: flatten to [2, 16*64]"), _softmax11(1)),
        _with_ref(_single("softmax_op11_default", "softmax_op", True, S, lambda b, x: b.op("Softmax", [x]), opset=11,
                          description="opset 11 Softmax, default axis 1"), _softmax11(1)),
        _with_ref(_single("softmax_op11_axis0", "softmax_op", True, S, lambda b, x: b.op("Softmax", [x], axis=0),
                          opset=11, description="opset 11 Softmax, axis 0: over everything"), _softmax11(0)),
        _with_ref(_single("softmax_op11_last", "softmax_op", True, S, lambda b, x: b.op("Softmax", [x], axis=2),
                          opset=11), _softmax11(2)),
    ]

    # ---- GEMM epilogues: bias + activation + residual -------------------
    M, K, N = 32, 96, 64

    def epi(bias="const", act="relu", residual=True, expose_pre=False, bias_shape=None, style="matmul",
            act_kind=None):
        def body(b, x, r, *rest):
            w = b.weight([K, N], "W")
            y = b.op("MatMul", [x, w], name="mm")
            if bias == "const":
                shape = bias_shape or [N]
                y = b.op("Add", [y, b.init((0.1 * b.rng.standard_normal(shape)).astype(np.float32), "bias")],
                         name="bias")
            elif bias == "input":
                y = b.op("Add", [y, rest[0]], name="bias")
            pre = y
            if act == "relu":
                y = b.op("Relu", [y], name="act")
            elif act is not None:
                y = gelu(b, y, act, name="act")
            if residual:
                y = b.op("Add", [y, r], name="residual")
            return [y, pre] if expose_pre else y
        return body

    def ep_case(name, matches, desc, extra=(), out_extra=None, opset=17, **kw):
        return _single(name, "gemm_epilogue", matches, [M, K], epi(**kw), extra_inputs=[("R", [M, N])] + list(extra),
                       out_shapes=[[M, N]] + ([out_extra] if out_extra else []), opset=opset, description=desc)

    cases += [
        ep_case("fuse_mm_bias_relu_residual", True, "MatMul + bias + Relu + residual"),
        ep_case("fuse_mm_bias_gelu_residual", True, "MatMul + bias + erf-GELU + residual", act="erf"),
        ep_case("fuse_mm_bias_geluop_residual", True, "MatMul + bias + Gelu op + residual", act="op", opset=20),
        ep_case("fuse_mm_bias_relu", True, "MatMul + bias + Relu", residual=False),
        ep_case("fuse_mm_bias_residual", True, "MatMul + bias + residual", act=None),
        ep_case("fuse_mm_bias_row", True, "bias [1, N]", bias_shape=[1, N]),
        ep_case("miss_mm_bias_col", False, "bias [M, 1] (per row, not per column)", bias_shape=[M, 1]),
        ep_case("miss_mm_bias_full", False, "bias [M, N]", bias_shape=[M, N]),
        ep_case("miss_mm_bias_input", False, "bias is a graph input", bias="input", extra=[("Bin", [N])]),
        ep_case("miss_mm_extra_consumer", False, "pre-activation is also a graph output", expose_pre=True,
                out_extra=[M, N]),
    ]

    # ---- Gemm attribute variants (fold into the GEMM itself) ------------
    def gemm_case(name, transA=0, transB=0, alpha=1.0, beta=1.0, c_shape=(N,), with_c=True):
        a_shape = [K, M] if transA else [M, K]

        def body(b, x):
            w_shape = [N, K] if transB else [K, N]
            ins = [x, b.weight(w_shape, "W", scale=1.0 / math.sqrt(K))]
            if with_c:
                ins.append(b.init((0.1 * b.rng.standard_normal(list(c_shape))).astype(np.float32), "C"))
            return b.op("Gemm", ins, name="gemm", transA=transA, transB=transB, alpha=alpha, beta=beta)
        return _single(name, "gemm_attrs", True, a_shape, body, out_shapes=[[M, N]],
                       description=f"Gemm transA={transA} transB={transB} alpha={alpha} beta={beta} C{list(c_shape) if with_c else ' none'}")

    cases += [
        gemm_case("gemm_plain"),
        gemm_case("gemm_transA", transA=1),
        gemm_case("gemm_transB", transB=1),
        gemm_case("gemm_transAB_alpha_beta", transA=1, transB=1, alpha=0.5, beta=2.0),
        gemm_case("gemm_bias_scalar", c_shape=()),
        gemm_case("gemm_bias_1xN", c_shape=(1, N)),
        gemm_case("gemm_bias_Mx1", c_shape=(M, 1)),
        gemm_case("gemm_bias_MxN", c_shape=(M, N), beta=0.25),
        gemm_case("gemm_no_bias", with_c=False, alpha=1.5),
    ]
    return cases


@functools.lru_cache(maxsize=None)
def all_static_cases() -> List[ModelCase]:
    return list(mlp_cases()) + list(bert_cases())


# --------------------------------------------------------------------------
# float64 reference (onnx.reference on a float64 copy of the model)
# --------------------------------------------------------------------------
def to_float64(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy of ``model`` computing in float64: f32 initializers, Constant values,
    graph inputs/outputs/value_info and ``Cast(to=FLOAT)`` become double."""
    m = onnx.ModelProto.FromString(model.SerializeToString())
    g = m.graph
    for t in g.initializer:
        if t.data_type == TensorProto.FLOAT:
            t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(t).astype(np.float64), t.name))
    for vi in list(g.input) + list(g.output) + list(g.value_info):
        if vi.type.tensor_type.elem_type == TensorProto.FLOAT:
            vi.type.tensor_type.elem_type = TensorProto.DOUBLE
    for n in g.node:
        for a in n.attribute:
            if n.op_type == "Cast" and a.name == "to" and a.i == TensorProto.FLOAT:
                a.i = TensorProto.DOUBLE
            if a.name == "value" and a.t.data_type == TensorProto.FLOAT:
                a.t.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(a.t).astype(np.float64)))
    return m


def reference_f64(model: Union[onnx.ModelProto, ModelCase], feeds: Dict[str, np.ndarray]) -> List[np.ndarray]:
    """Outputs of ``model`` evaluated in float64 by onnx's reference evaluator,
    cast back to float32: an oracle independent of both ORT and kiln. For a
    ModelCase with ``numpy_reference`` (semantics the evaluator lacks), that."""
    from onnx.reference import ReferenceEvaluator

    if isinstance(model, ModelCase):
        if model.numpy_reference is not None:
            return [np.asarray(o) for o in model.numpy_reference(feeds)]
        model = model.model

    f64 = {k: (v.astype(np.float64) if v.dtype == np.float32 else v) for k, v in feeds.items()}
    outs = ReferenceEvaluator(to_float64(model)).run(None, f64)
    return [o.astype(np.float32) if o.dtype == np.float64 else o for o in outs]


# --------------------------------------------------------------------------
# elementwise chains (issue #14)
# --------------------------------------------------------------------------
def one_input_model(nodes, x_shape, outputs: Sequence[str], inits) -> onnx.ModelProto:
    """A graph of ``nodes`` reading the f32 input ``x`` (opset 17, IR 8), with f32 ``outputs``."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))
    outs = [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs]
    graph = helper.make_graph(nodes, "chain", [x], outs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def f32_tensor(name: str, array) -> onnx.TensorProto:
    """An f32 initializer."""
    return numpy_helper.from_array(np.asarray(array, dtype=np.float32), name)


def gate_chain(dims: Sequence[DimT] = ("batch", "seq"), hidden: int = 40, also_output: bool = False,
               seed: int = 4) -> onnx.ModelProto:
    """``th = tanh(x·g + b)·0.5; y = max(sqrt(2 - (th - x)), th)`` over ``[B, S, hidden]``:
    a row scale and shift, a scalar on the left of a ``Sub``, the input read
    again, ``Sqrt`` of negatives (NaN). ``also_output``: ``th - x`` is an output too."""
    rng = np.random.default_rng(seed)
    inits = [f32_tensor("g", rng.random(hidden) + 0.5), f32_tensor("b", rng.standard_normal(hidden)),
             f32_tensor("half", 0.5), f32_tensor("two", 2.0)]
    nodes = [
        helper.make_node("Mul", ["x", "g"], ["xg"]),
        helper.make_node("Add", ["xg", "b"], ["z"]),
        helper.make_node("Tanh", ["z"], ["t"]),
        helper.make_node("Mul", ["t", "half"], ["th"]),
        helper.make_node("Sub", ["th", "x"], ["d"]),
        helper.make_node("Sub", ["two", "d"], ["q"]),
        helper.make_node("Sqrt", ["q"], ["s"]),
        helper.make_node("Max", ["s", "th"], ["y"]),
    ]
    return one_input_model(nodes, [dims[0], dims[1], hidden], ["y", "d"] if also_output else ["y"], inits)


def channels_first_chain(dims: Sequence[DimT] = ("n", "h", "w"), channels: int = 24) -> onnx.ModelProto:
    """``sigmoid(x·s + t)·x`` over ``[N, C, H, W]`` with per-channel ``[C, 1, 1]``
    and ``[1, C, 1, 1]`` constants and no convolution around (kiln keeps ONNX's
    layout, and a chain reads each constant per run of H·W)."""
    rng = np.random.default_rng(6)
    c = channels
    inits = [f32_tensor("s", (rng.random(c) + 0.5).reshape(c, 1, 1)), f32_tensor("t", rng.standard_normal(c).reshape(1, c, 1, 1))]
    nodes = [
        helper.make_node("Mul", ["x", "s"], ["m"]),
        helper.make_node("Add", ["t", "m"], ["a"]),
        helper.make_node("Sigmoid", ["a"], ["g"]),
        helper.make_node("Mul", ["g", "x"], ["y"]),
    ]
    return one_input_model(nodes, [dims[0], c, dims[1], dims[2]], ["y"], inits)


def affine_relu_chain(h: int, w: int, c: int) -> onnx.ModelProto:
    """DenseNet's pre-activation as kiln sees it inside a channels-last partition:
    ``[1, H, W, C]`` times a per-channel scale, plus a shift, times a scale,
    plus a shift, ``Relu``."""
    rng = np.random.default_rng(0)
    inits = [f32_tensor(f"r{i}", rng.random(c) + 0.5) for i in range(4)]
    names = ["x", "a", "b", "d", "e"]
    nodes = [helper.make_node(op, [names[i], f"r{i}"], [names[i + 1]]) for i, op in enumerate(["Mul", "Add"] * 2)]
    nodes.append(helper.make_node("Relu", ["e"], ["y"]))
    return one_input_model(nodes, [1, h, w, c], ["y"], inits)


# --------------------------------------------------------------------------
# bench models
# --------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def bench_cases() -> List[ModelCase]:
    return [
        mlp(4, 1024, 1, "relu", "gemm", name="mlp_4x1024_b1"),
        mlp(4, 1024, 32, "relu", "gemm", name="mlp_4x1024_b32"),
        bert(768, 12, 128, 1, 4, mask=True, ln="op", act="erf", name="bert_base_l4_s128_b1_mask"),
        bert(256, 4, 128, 1, 4, mask=True, ln="op", act="erf", name="bert_h256_l4_s128_b1_mask"),
    ]


if __name__ == "__main__":  # quick self-check: every model is valid and runs on ORT's CPU EP
    import onnxruntime as ort

    for case in all_static_cases() + dynamic_cases() + fusion_cases():
        sess = ort.InferenceSession(case.model.SerializeToString(), providers=["CPUExecutionProvider"])
        outs = sess.run(None, case.feeds())
        print(f"{case.name:60s} nodes={case.n_nodes:4d} out={[o.shape for o in outs]}")
