"""Seed corpus for kiln's fuzz targets, made from real compiled models.

Compiles the repository's models (models/*.onnx and a few from
python/tests/models_lib.py) with kiln through ORT's compile API, for every
target kiln offers (virtual devices), and writes

  fuzz/corpus/context_binary/    each <model>_kiln.bin as it is
  fuzz/corpus/ep_context_attrs/  each EPContext node's attributes (embed 0 and 1)
  fuzz/corpus/node_import/       each source node, with its input types, constant
                                 inputs and attributes, as a one-node graph

in the formats `kiln_ep::fuzzing` documents. File names are content hashes, so
re-running adds nothing twice. Run from the repository root:

  PYTHONPATH=python:python/tests KILN_EP_LIBRARY=target/release/libkiln_ep.so \
      .venv/bin/python fuzz/make_corpus.py
"""
from __future__ import annotations

import glob
import hashlib
import os
import struct
import sys
import tempfile

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper, numpy_helper, shape_inference

import onnxruntime_ep_kiln as kiln

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORPUS = os.path.join(REPO, "fuzz", "corpus")
MAX_FILE = 256 * 1024  # keep the committed corpus small


def save(target: str, data: bytes) -> bool:
    if len(data) > MAX_FILE:
        return False
    folder = os.path.join(CORPUS, target)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, hashlib.sha1(data).hexdigest()[:16])
    if os.path.exists(path):
        return False
    with open(path, "wb") as f:
        f.write(data)
    return True


# ---------------------------------------------------------------- models
def models() -> list[tuple[str, onnx.ModelProto]]:
    out = [(os.path.basename(p)[:-5], onnx.load(p)) for p in sorted(glob.glob(os.path.join(REPO, "models", "*.onnx")))]
    sys.path.insert(0, os.path.join(REPO, "python", "tests"))
    import models_lib as ml

    cases = [
        ml.mlp(2, 32, 1, "relu", "gemm"),
        ml.mlp(2, 32, 4, "relu", "matmul", seq=3),
        ml.mlp(2, 16, 2, "relu", "gemm", dynamic_batch=True),
        ml.bert(32, 2, 4, 1, 1, mask=True, ln="op", act="erf"),
        ml.bert(32, 2, 4, 1, 1, mask=False, ln="decomposed", act="tanh", shape_ops=True),
    ]
    cases += ml.fusion_cases()[:24]
    for c in cases:
        if c is not None:
            out.append((c.name, c.model))
    return out


# ---------------------------------------------------------------- node_import
def u8(v: int) -> bytes:
    return struct.pack("<B", v & 0xFF)


def string(s) -> bytes:
    b = s.encode() if isinstance(s, str) else bytes(s)
    b = b[:255]
    return u8(len(b)) + b


def dim_bytes(dims) -> bytes:
    out = b""
    for d in dims[:6]:
        out += u8(255 if d is None or d < 0 or d > 254 else d)
    return out


def value_desc(elem: int, dims) -> bytes:
    if dims is None:
        return u8(elem) + u8(255)
    return u8(elem) + u8(len(dims)) + dim_bytes(dims)


def tensor(arr: np.ndarray, elem: int) -> bytes:
    raw = arr.tobytes()[:65535]
    return u8(elem) + u8(arr.ndim) + dim_bytes(list(arr.shape)) + struct.pack("<H", len(raw)) + raw


def attr(a: onnx.AttributeProto) -> bytes:
    T = onnx.AttributeProto
    if a.type == T.INT:
        body = u8(0) + struct.pack("<q", a.i)
    elif a.type == T.INTS:
        body = u8(1) + u8(len(a.ints)) + b"".join(struct.pack("<q", v) for v in a.ints[:8])
    elif a.type == T.FLOAT:
        body = u8(2) + struct.pack("<f", a.f)
    elif a.type == T.FLOATS:
        body = u8(3) + u8(len(a.floats)) + b"".join(struct.pack("<f", v) for v in a.floats[:8])
    elif a.type == T.STRING:
        body = u8(4) + string(a.s)
    elif a.type == T.STRINGS:
        body = u8(5) + u8(len(a.strings)) + b"".join(string(s) for s in a.strings[:4])
    elif a.type == T.TENSOR:
        arr = numpy_helper.to_array(a.t)
        body = u8(6) + tensor(arr, a.t.data_type)
    else:
        body = u8(7)
    return string(a.name) + body


def node_graphs(model: onnx.ModelProto) -> list[bytes]:
    """Each node as a one-node graph: its inputs typed as ORT would see them."""
    try:
        model = shape_inference.infer_shapes(model)
    except Exception:  # noqa: BLE001 - seeds from what can be inferred
        pass
    g = model.graph
    inits = {t.name: t for t in g.initializer}
    types = {}
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        tt = vi.type.tensor_type
        dims = None
        if tt.HasField("shape"):
            dims = [d.dim_value if d.HasField("dim_value") else -1 for d in tt.shape.dim]
        types[vi.name] = (tt.elem_type, dims)
    for name, t in inits.items():
        types[name] = (t.data_type, list(t.dims))
    # Constant nodes' values, so shape chains see constants as kiln would
    for n in g.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value":
                    inits[n.output[0]] = a.t
    out = []
    for n in g.node:
        ins = [i for i in n.input]
        names = [i for i in ins if i]
        names = list(dict.fromkeys(names))
        b = u8(len(names))
        for name in names:
            elem, dims = types.get(name, (0, None))
            b += value_desc(elem, dims)
            t = inits.get(name)
            if t is not None and np.prod(t.dims, dtype=np.int64) <= 1024:
                b += u8(1) + tensor(numpy_helper.to_array(t), t.data_type)
            else:
                b += u8(0)
        b += u8(1)  # one node
        b += string(n.op_type) + u8(opset_of(model, n.domain))
        b += u8(len(ins)) + b"".join(u8(255) if not i else u8(names.index(i)) for i in ins)
        b += u8(len(n.output))
        for o in n.output:
            if o in types:
                b += u8(1) + value_desc(*types[o])
            else:
                b += u8(0)
        b += u8(len(n.attribute)) + b"".join(attr(a) for a in n.attribute)
        out.append(b)
    return out


def opset_of(model: onnx.ModelProto, domain: str) -> int:
    for o in model.opset_import:
        if o.domain in (domain, "ai.onnx" if domain == "" else domain):
            return o.version
    return 17


# ---------------------------------------------------------------- compiled models
def ep_context_attr_bytes(node: onnx.NodeProto) -> bytes:
    a = {x.name: helper.get_attribute_value(x) for x in node.attribute}
    flags = 0
    embed = a.get("embed_mode")
    main = a.get("main_context")
    part = a.get("partition_name")
    cache = a.get("ep_cache_context")
    for bit, v in enumerate((embed, main, part, cache)):
        if v is not None:
            flags |= 1 << bit
    return (u8(flags) + struct.pack("<q", embed or 0) + struct.pack("<q", main or 0)
            + string(part or b"") + (cache or b""))


def compile_all(name: str, model: onnx.ModelProto, devices, tmp: str) -> None:
    src = os.path.join(tmp, f"{name}.onnx")
    onnx.save(model, src)
    for dev in devices:
        target = kiln.device_target(dev)
        for embed in (False, True):
            out = os.path.join(tmp, f"{name}.{target}.{int(embed)}_ctx.onnx")
            so = ort.SessionOptions()
            so.add_provider_for_devices([dev], {})
            try:
                ort.ModelCompiler(so, src, embed_compiled_data_into_model=embed).compile_to_file(out)
            except Exception as e:  # noqa: BLE001 - a model kiln claims nothing of
                print(f"  {name} ({target}): not compiled: {str(e)[:100]}")
                continue
            ctx = onnx.load(out)
            for n in ctx.graph.node:
                if n.op_type == "EPContext":
                    save("ep_context_attrs", ep_context_attr_bytes(n))
            for binary in glob.glob(os.path.join(tmp, "*_kiln.bin")):
                with open(binary, "rb") as f:
                    save("context_binary", f.read())
                os.remove(binary)


def main() -> None:
    name = "kiln_corpus" + kiln.VIRTUAL_SUFFIX
    ort.register_execution_provider_library(name, kiln.get_library_path())
    devices = []
    seen = set()
    for d in kiln.kiln_devices():
        t = kiln.device_target(d)
        if t not in seen:
            seen.add(t)
            devices.append(d)
    print("targets:", sorted(seen))
    before = {t: len(os.listdir(os.path.join(CORPUS, t))) if os.path.isdir(os.path.join(CORPUS, t)) else 0
              for t in ("context_binary", "ep_context_attrs", "node_import")}
    with tempfile.TemporaryDirectory() as tmp:
        for mname, model in models():
            for b in node_graphs(model):
                save("node_import", b)
            compile_all(mname, model, devices, tmp)
    devices = None
    ort.unregister_execution_provider_library(name)
    for t, n in before.items():
        now = len(os.listdir(os.path.join(CORPUS, t)))
        print(f"{t}: {now} files ({now - n} new)")


if __name__ == "__main__":
    main()
