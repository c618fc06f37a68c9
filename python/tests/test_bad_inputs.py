"""The bad input table: every bad input a user can hand kiln when loading a compiled
model, one row each, with the ORT error code (and the Python exception ORT's binding
raises for it) and a substring of the message.

Each row starts from a good compiled model, copied into a fresh folder
(``<tmp>/inner/``: the model's folder; ``<tmp>/``: "outside" it), breaks one thing,
and loads the result with kiln's host device and CPU fallback off. Every row also
checks that nothing was left behind: the folders hold exactly the files they held
before the attempt (no partial ``.bin``, ``_ctx.onnx`` or temporary file).

Rows whose input could hang or crash a broken kiln (FIFOs, directories, sockets,
devices) load in a subprocess with a timeout, so a regression fails instead of
hanging or killing the test run.

Kinds of rows: ``load`` (create a session on the broken model; ``exc=None`` means
kiln must load and run it and match ORT's CPU EP, because kiln does not act on that
input), ``compile`` (compile a model, with the compile API, in a way kiln refuses)
and ``verdict`` (tampered ``ep_compatibility_info`` metadata: kiln's answer through
``get_model_compatibility_for_ep_devices``; from Python ORT never asks it before
loading, so the session loads on what the binary itself says; the C harness's table
checks the C API's refusal).
"""
from __future__ import annotations

import json
import os
import shutil
import socket
import struct
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

import onnx
import pytest
from onnx import TensorProto, helper
from onnxruntime.capi import onnxruntime_pybind11_state as C

import onnxruntime_ep_kiln as kiln
import kiln_testutil as tu

V = C.OrtCompiledModelCompatibility

# ORT error code -> (number in ORT's message, Python exception), as ORT 1.31.1's binding
# maps them. "FAIL_CREATE_EP": kiln's INVALID_ARGUMENT from CreateEp, which ORT rethrows
# as an exception: ORT_FAIL through the C API, a plain RuntimeError in Python, with
# "Error creating execution provider: [ONNXRuntimeError] : 2 : INVALID_ARGUMENT : ...".
CODES = {
    "FAIL_CREATE_EP": (None, RuntimeError),
    "INVALID_ARGUMENT": (2, C.InvalidArgument),
    "NOT_IMPLEMENTED": (9, C.NotImplemented),
    "INVALID_GRAPH": (10, C.InvalidGraph),
}

AMR = "add_mul_relu"
BIN = f"{AMR}_kiln.bin"
CTX = f"{AMR}_ctx.onnx"
SUBPROCESS_TIMEOUT = 120  # a hang guard, not a timing: a healthy row takes about a second


# --------------------------------------------------------------------------
# the starting points: good compiled models, built once
# --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def good(models, kiln_virtual, tmp_path_factory):
    """Good compiled models: {"amr": folder with add_mul_relu_ctx.onnx (embed 0) + its
    .bin + the original, "amr_embed": embed-1 model bytes, "split": folder with
    split_ctx.onnx (3 kiln nodes, one binary)}."""
    dev = kiln_virtual["host"]
    out = {}
    for name in (AMR, "split"):
        folder = tmp_path_factory.mktemp(f"good_{name}")
        src = folder / f"{name}.onnx"
        shutil.copy(models[name], src)
        tu.generate_context(str(src), dev, embed=0)
        out[name] = folder
    out["amr_embed"] = tu.compile_model(models[AMR], dev, embed=True, to="bytes")
    return out


class Work:
    """One row's folder: ``root/inner`` holds the compiled model (``ctx``), its binary
    (``bin``) and the original model (``src``)."""

    def __init__(self, root, good, model: str):
        self.root = root
        self.good = good
        self.inner = root / "inner"
        self.inner.mkdir()
        self.out = root / "out"  # where compile rows write
        self.out.mkdir()
        if model == "amr_embed":
            self.ctx = self.inner / CTX
            self.ctx.write_bytes(good["amr_embed"])
            shutil.copy(good[AMR] / f"{AMR}.onnx", self.inner / f"{AMR}.onnx")
            self.bin, self.src = None, self.inner / f"{AMR}.onnx"
        else:
            for f in os.listdir(good[model]):
                shutil.copy(good[model] / f, self.inner / f)
            self.ctx = self.inner / f"{model}_ctx.onnx"
            self.bin = self.inner / f"{model}_kiln.bin"
            self.src = self.inner / f"{model}.onnx"

    def model(self) -> onnx.ModelProto:
        return tu.load_model_proto(self.ctx)

    def save(self, m: onnx.ModelProto) -> None:
        onnx.save(m, str(self.ctx))

    def edit_node(self, fn, which: int = 0) -> None:
        """Applies ``fn(node, model)`` to the ``which``-th kiln EPContext node."""
        m = self.model()
        fn(tu.ep_context_nodes(m)[which], m)
        self.save(m)

    def snapshot(self) -> Dict[str, List[str]]:
        return {str(d): tu.files_in(d) for d in (self.root, self.inner)}


def attr(name, value, which=0):
    return lambda w: w.edit_node(lambda n, m: tu.set_attr(n, name, value), which)


def main_index(w: Work) -> int:
    return [tu.attrs_of(n)["main_context"] for n in tu.ep_context_nodes(w.model())].index(1)


# --------------------------------------------------------------------------
# the rows
# --------------------------------------------------------------------------
@dataclass
class Row:
    id: str
    setup: Callable[[Work], object]
    code: Optional[str]  # ORT error code name; None: loads and runs
    needles: Sequence[str] = ()
    model: str = AMR
    kind: str = "load"
    risky: bool = False
    options: Dict[str, str] = field(default_factory=dict)
    config: Dict[str, str] = field(default_factory=dict)
    verdict: Optional[object] = None
    needs: Optional[Callable[[], Optional[str]]] = None  # returns a skip reason or None
    by_ort: bool = False  # ORT refuses it before kiln sees it


def damage_bin(fn):
    def setup(w: Work):
        w.bin.write_bytes(fn(w.bin.read_bytes()))
    return setup


def damage_payload(fn):
    return lambda w: w.edit_node(
        lambda n, m: tu.set_attr(n, "ep_cache_context", fn(tu.attrs_of(n)["ep_cache_context"])))


def flip(offset_fn, bit=0x10):
    def fn(data: bytes) -> bytes:
        i = offset_fn(len(data))
        return data[:i] + bytes([data[i] ^ bit]) + data[i + 1:]
    return fn


def version(v):
    return lambda d: d[:8] + struct.pack("<I", v) + d[12:]


def not_kiln(_):
    return b"definitely not a kiln context binary" * 4


BINARY_DAMAGE = [
    ("truncated-half", lambda d: d[: len(d) // 2], ["truncated"]),
    ("truncated-last-byte", lambda d: d[:-1], ["truncated"]),
    ("header-only", lambda d: d[:64], ["truncated"]),
    ("shorter-than-header", lambda d: d[:10], ["truncated"]),
    ("bitflip-magic", flip(lambda n: 0, 0x01), ["not a kiln context binary"]),
    ("bitflip-middle", flip(lambda n: n // 2), ["checksum"]),
    ("bitflip-last", flip(lambda n: n - 1), ["checksum"]),
    ("foreign-text", not_kiln, ["not a kiln context binary"]),
    ("foreign-zip", lambda d: b"PK\x03\x04" + d[4:], ["not a kiln context binary"]),
    ("newer-format", version(99), ["version", "99"]),
    ("older-format", version(0), ["version"]),
    ("trailing-bytes", lambda d: d + b"\0" * 64, ["64 unexpected bytes after the data region"]),
]


def bin_rows() -> List[Row]:
    rows = [Row(f"bin-{name}", damage_bin(fn), "INVALID_GRAPH", [BIN, *needles])
            for name, fn, needles in BINARY_DAMAGE]

    def foreign_onnx(w):
        shutil.copy(w.src, w.bin)

    def other_models_binary(w):
        shutil.copy(w.good["split"] / "split_kiln.bin", w.bin)

    def symlink_outside(w):
        shutil.move(str(w.bin), str(w.root / "outside.bin"))
        os.symlink(str(w.root / "outside.bin"), str(w.bin))

    def relative_symlink_outside(w):
        shutil.move(str(w.bin), str(w.root / "outside.bin"))
        os.symlink("../outside.bin", str(w.bin))

    def dangling_symlink(w):
        w.bin.unlink()
        os.symlink(str(w.inner / "nowhere.bin"), str(w.bin))

    def dev_zero(w):
        w.bin.unlink()
        os.symlink("/dev/zero", str(w.bin))

    rows += [
        Row("bin-missing", lambda w: w.bin.unlink(), "INVALID_GRAPH", [BIN, "does not exist"]),
        Row("bin-empty", lambda w: w.bin.write_bytes(b""), "INVALID_GRAPH", [BIN, "truncated"]),
        Row("bin-foreign-onnx-model", foreign_onnx, "INVALID_GRAPH", [BIN, "not a kiln context binary"]),
        Row("bin-another-models-binary", other_models_binary, "INVALID_GRAPH",
            [BIN, "is not in its context binary"]),
        Row("bin-symlink-outside", symlink_outside, "INVALID_GRAPH", [BIN, "symbolic link", "outside"]),
        Row("bin-relative-symlink-outside", relative_symlink_outside, "INVALID_GRAPH",
            [BIN, "symbolic link"]),
        Row("bin-dangling-symlink", dangling_symlink, "INVALID_GRAPH", [BIN, "does not exist"]),
        Row("bin-symlink-to-dev-zero", dev_zero, "INVALID_GRAPH", [BIN, "symbolic link", "/dev/zero"],
            risky=True),
    ]
    return rows


def special_rows() -> List[Row]:
    """Non-regular files in place of the binary: each loads in a subprocess."""

    def directory(w):
        w.bin.unlink()
        w.bin.mkdir()

    def fifo(w):
        w.bin.unlink()
        os.mkfifo(str(w.bin))

    def fifo_via_symlink(w):
        w.bin.unlink()
        (w.inner / "store").mkdir()
        os.mkfifo(str(w.inner / "store" / "pipe"))
        os.symlink("store/pipe", str(w.bin))

    def sock(w):
        w.bin.unlink()
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(w.bin))
        w.keep = s  # listening or not, the path stays a socket while the row runs

    def char_device(w):
        w.bin.unlink()
        os.mknod(str(w.bin), 0o600 | 0o020000, os.makedev(1, 5))  # like /dev/zero

    def can_mknod():
        return None if os.geteuid() == 0 else "creating a device node needs root"

    return [
        Row("bin-is-directory", directory, "INVALID_GRAPH", [BIN, "a directory"], risky=True),
        Row("bin-is-fifo", fifo, "INVALID_GRAPH", [BIN, "FIFO"], risky=True),
        Row("bin-is-fifo-copy-storage", fifo, "INVALID_GRAPH", [BIN, "FIFO"], risky=True,
            options={"context_storage": "copy"}),
        Row("bin-symlink-inside-to-fifo", fifo_via_symlink, "INVALID_GRAPH", ["FIFO"], risky=True),
        Row("bin-is-socket", sock, "INVALID_GRAPH", [BIN, "socket"], risky=True),
        Row("bin-is-char-device", char_device, "INVALID_GRAPH", [BIN, "character device"], risky=True,
            needs=can_mknod),
    ]


EMBED_DAMAGE = [
    ("truncated-half", lambda d: d[: len(d) // 2], ["truncated"]),
    ("header-only", lambda d: d[:64], ["truncated"]),
    ("bitflip-middle", flip(lambda n: n // 2), ["checksum"]),
    ("bitflip-magic", flip(lambda n: 0, 0x01), ["not a kiln context binary"]),
    ("foreign", not_kiln, ["not a kiln context binary"]),
    ("newer-format", version(99), ["version", "99"]),
    ("trailing-bytes", lambda d: d + b"\0" * 64, ["64 unexpected bytes after the data region"]),
]


def embed_rows() -> List[Row]:
    rows = [Row(f"embedded-{name}", damage_payload(fn), "INVALID_GRAPH", ["embedded payload", *needles],
                model="amr_embed") for name, fn, needles in EMBED_DAMAGE]
    rows += [
        Row("embedded-empty", attr("ep_cache_context", b""), "INVALID_GRAPH",
            ["ep_cache_context is empty or absent"], model="amr_embed"),
        Row("embedded-absent", attr("ep_cache_context", None), "INVALID_GRAPH",
            ["ep_cache_context is empty or absent"], model="amr_embed"),
        Row("embedded-payload-under-embed_mode-0", attr("embed_mode", 0), "INVALID_GRAPH",
            ["not a file name", "embed_mode=0 expects a file name"], model="amr_embed"),
    ]
    return rows


def point_at(rel):
    return attr("ep_cache_context", rel if isinstance(rel, bytes) else rel.encode())


def cache_context_rows() -> List[Row]:
    def dotdot(w):
        shutil.copy(w.bin, w.root / BIN)
        return point_at("../" + BIN)(w)

    def absolute_valid(w):
        return point_at(str(w.bin))(w)

    return [
        Row("ep_cache_context-absent", attr("ep_cache_context", None), "INVALID_GRAPH",
            ["ep_cache_context is empty or absent"]),
        Row("ep_cache_context-empty", attr("ep_cache_context", b""), "INVALID_GRAPH",
            ["ep_cache_context is empty or absent"]),
        Row("ep_cache_context-wrong-type-int", attr("ep_cache_context", 7), "INVALID_GRAPH",
            mistyped("ep_cache_context", "STRING", "INT"), by_ort=True),
        Row("ep_cache_context-too-long", point_at("a" * 5000), "INVALID_GRAPH",
            ["5000 bytes that is not a file name"]),
        Row("ep_cache_context-control-chars", point_at("add_mul\nrelu_kiln.bin"), "INVALID_GRAPH",
            ["not a file name"]),
        Row("ep_cache_context-not-utf8", point_at(b"\xff\xfe.bin"), "INVALID_GRAPH", ["not a file name"]),
        Row("ep_cache_context-dotdot-to-real-binary", dotdot, "INVALID_GRAPH", ["'..'", "../" + BIN]),
        Row("ep_cache_context-dotdot-inside-then-out", point_at("sub/../../" + BIN), "INVALID_GRAPH", ["'..'"]),
        Row("ep_cache_context-dotdot-staying-inside", point_at("sub/../" + BIN), "INVALID_GRAPH", ["'..'"]),
        Row("ep_cache_context-absolute-to-real-binary", absolute_valid, "INVALID_GRAPH", ["absolute path"]),
        Row("ep_cache_context-absolute-dev-zero", point_at("/dev/zero"), "INVALID_GRAPH",
            ["absolute path", "/dev/zero"]),
        Row("ep_cache_context-missing-subfolder", point_at("bins/" + BIN), "INVALID_GRAPH", ["does not exist"]),
        Row("ep_cache_context-the-folder-itself", point_at("."), "INVALID_GRAPH", ["a directory"], risky=True),
        Row("ep_cache_context-the-model-itself", point_at(CTX), "INVALID_GRAPH", ["not a kiln context binary"]),
    ]


def control_attr_rows() -> List[Row]:
    """embed_mode, main_context, source, partition_name: what kiln acts on."""

    def secondary_not_in_binary(w):
        m = w.model()
        node = [n for n in tu.ep_context_nodes(m) if tu.attrs_of(n)["main_context"] == 0][0]
        tu.set_attr(node, "partition_name", b"no_such_graph")
        w.save(m)

    def main_to_secondary(w):
        def fn(n, m):
            tu.set_attr(n, "main_context", 0)
            tu.set_attr(n, "ep_cache_context", None)
        w.edit_node(fn, main_index(w))

    return [
        Row("embed_mode-2", attr("embed_mode", 2), "INVALID_GRAPH", ["embed_mode 2 is not 0 or 1"]),
        Row("embed_mode-negative", attr("embed_mode", -1), "INVALID_GRAPH", ["embed_mode -1 is not 0 or 1"]),
        Row("embed_mode-wrong-type-string", attr("embed_mode", b"0"), "INVALID_GRAPH",
            mistyped("embed_mode", "INT", "STRING"), by_ort=True),
        # absent means ORT's default, 1: the file name is then read as a payload
        Row("embed_mode-absent", attr("embed_mode", None), "INVALID_GRAPH",
            ["embedded payload", "not a kiln context binary"]),
        Row("main_context-2", attr("main_context", 2), "INVALID_GRAPH", ["main_context 2 is not 0 or 1"]),
        Row("main_context-wrong-type-float", attr("main_context", 1.0), "INVALID_GRAPH",
            mistyped("main_context", "INT", "FLOAT"), by_ort=True),
        Row("main_context-0-without-a-binary", attr("main_context", 0), "INVALID_GRAPH",
            ["main_context=0 but no context binary loaded in this session holds graph"]),
        Row("main_context-0-on-every-node", main_to_secondary, "INVALID_GRAPH", ["main_context=0"],
            model="split"),
        Row("main_context-0-graph-in-no-binary", secondary_not_in_binary, "INVALID_GRAPH",
            ["no_such_graph", "main_context=0"], model="split"),
        Row("partition_name-absent", attr("partition_name", None), "INVALID_GRAPH",
            ["it has no partition_name attribute"]),
        Row("partition_name-empty", attr("partition_name", b""), "INVALID_GRAPH",
            ["it has no partition_name attribute"]),
        Row("partition_name-not-in-binary", attr("partition_name", b"no_such_graph"), "INVALID_GRAPH",
            ["no_such_graph", "is not in its context binary"]),
        Row("partition_name-wrong-type-ints", attr("partition_name", [1, 2]), "INVALID_GRAPH",
            mistyped("partition_name", "STRING", "INTS"), by_ort=True),
        # kiln leaves EPContext nodes that are not its own to other EPs; ORT has none for them
        Row("source-another-ep", attr("source", b"OtherEP"), "NOT_IMPLEMENTED", ["generated by 'OtherEP'"]),
        Row("source-absent", attr("source", None), "NOT_IMPLEMENTED", ["EPContext"]),
        Row("source-empty", attr("source", b""), "NOT_IMPLEMENTED", ["EPContext"]),
        Row("source-wrong-type-int", attr("source", 1), "INVALID_GRAPH", mistyped("source", "STRING", "INT"),
            by_ort=True),
        Row("source-near-miss", attr("source", b"KilnExecutionProviderX"), "NOT_IMPLEMENTED",
            ["generated by 'KilnExecutionProviderX'"]),
    ]


def informational_rows() -> List[Row]:
    """Attributes kiln writes for people and tools but never acts on when loading
    (the binary carries the authoritative target, format and sizes): any value of
    the right type, or none at all, loads and runs correctly; a wrong type is refused
    by ORT's schema check of EPContext before kiln sees the node."""
    cases = {
        "ep_sdk_version": [(b"kiln 99.0 (context format 99)", "newer"), (None, "absent")],
        "hardware_architecture": [(b"arm64", "foreign-target"), (None, "absent")],
        "onnx_model_filename": [(b"../../etc/passwd", "path-outside"), (None, "absent")],
        "max_size": [(-1, "negative"), (2**62, "huge"), (None, "absent")],
        "notes": [(b"x" * 100000, "100k"), (None, "absent")],
    }
    wrong = {"ep_sdk_version": (3, "STRING", "INT"), "hardware_architecture": (64, "STRING", "INT"),
             "onnx_model_filename": ([1.0], "STRING", "FLOATS"), "max_size": (b"big", "INT", "STRING"),
             "notes": (5, "STRING", "INT")}
    return ([Row(f"{name}-{label}-ignored", attr(name, value), None)
             for name, values in cases.items() for value, label in values]
            + [Row(f"{name}-wrong-type", attr(name, value), "INVALID_GRAPH", mistyped(name, want, got), by_ort=True)
               for name, (value, want, got) in wrong.items()])


def mistyped(name, want, got):
    return ["Mismatched attribute type", f": {name}'", f"Expected: '{want}', actual: '{got}'"]


def io_rows() -> List[Row]:
    def value(w, m, where, name):
        return [v for v in getattr(m.graph, where) if v.name == name][0]

    def retype(where, name, elem):
        def setup(w):
            m = w.model()
            value(w, m, where, name).type.tensor_type.elem_type = elem
            w.save(m)
        return setup

    def reshape(where, name, dims):
        def setup(w):
            m = w.model()
            shape = value(w, m, where, name).type.tensor_type.shape
            del shape.dim[:]
            for d in dims:
                if isinstance(d, str):
                    shape.dim.add().dim_param = d
                else:
                    shape.dim.add().dim_value = d
            w.save(m)
        return setup

    def extra_input(w):
        w.edit_node(lambda n, m: n.input.append("B"))

    def extra_output(w):
        def fn(n, m):
            n.output.append("Y2")
            m.graph.output.append(helper.make_tensor_value_info("Y2", TensorProto.FLOAT, [2, 3, 4]))
        w.edit_node(fn)

    def swapped_inputs(w):
        def fn(n, m):
            a, b = list(n.input)
            del n.input[:]
            n.input.extend([b, a])
        w.edit_node(fn)

    def renamed_everywhere(w):
        m = w.model()
        for v in list(m.graph.input) + list(m.graph.output):
            v.name = "renamed_" + v.name
        for n in m.graph.node:
            n.input[:] = ["renamed_" + i for i in n.input]
            n.output[:] = ["renamed_" + o for o in n.output]
        w.save(m)

    F32 = "expected float [2, 3, 4]"
    return [
        Row("io-extra-input", extra_input, "INVALID_GRAPH", ["it has 3 inputs", "compiled with 2"]),
        Row("io-extra-output", extra_output, "INVALID_GRAPH", ["it has 2 outputs", "compiled with 1"]),
        Row("io-output-float-to-bool", retype("output", "Y", TensorProto.BOOL), "INVALID_GRAPH",
            ["output 0 'Y'", "found bool [2, 3, 4]", F32, "element type differs"]),
        Row("io-output-float-to-int64", retype("output", "Y", TensorProto.INT64), "INVALID_GRAPH",
            ["output 0 'Y'", "found int64 [2, 3, 4]", F32]),
        Row("io-output-float-to-int32", retype("output", "Y", TensorProto.INT32), "INVALID_GRAPH",
            ["output 0 'Y'", "found int32 [2, 3, 4]", F32]),
        Row("io-output-float-to-float16", retype("output", "Y", TensorProto.FLOAT16), "INVALID_GRAPH",
            ["output 0 'Y'", "found float16 [2, 3, 4]", F32]),
        Row("io-input-float-to-int64", retype("input", "A", TensorProto.INT64), "INVALID_GRAPH",
            ["input 0 'A'", "found int64 [2, 3, 4]", F32, "element type differs"]),
        Row("io-input-float-to-bool", retype("input", "B", TensorProto.BOOL), "INVALID_GRAPH",
            ["input 1 'B'", "found bool [2, 3, 4]", F32]),
        Row("io-input-shape", reshape("input", "A", [2, 3, 5]), "INVALID_GRAPH",
            ["input 0 'A'", "found float [2, 3, 5]", F32, "shape differs"]),
        Row("io-output-rank-lower", reshape("output", "Y", [2, 12]), "INVALID_GRAPH",
            ["output 0 'Y'", "found float [2, 12]", F32, "rank differs"]),
        Row("io-input-rank-higher", reshape("input", "A", [2, 3, 4, 1]), "INVALID_GRAPH",
            ["input 0 'A'", "found float [2, 3, 4, 1]", "rank differs"]),
        # a dim ORT's inference left unknown is no mismatch (kiln may know more than ORT
        # did; Compute checks every tensor's actual shape): it loads and runs
        Row("io-input-dynamic-dim-ok", reshape("input", "A", ["batch", 3, 4]), None),
        Row("io-inputs-swapped", swapped_inputs, "INVALID_GRAPH",
            ["input 0 is 'B'", "compiled with 'B' as input 1"]),
        # renaming values consistently (what merging models does) is fine: matched by position
        Row("io-renamed-everywhere-ok", renamed_everywhere, None),
    ]


def option_rows() -> List[Row]:
    """A bad option fails CreateEp with INVALID_ARGUMENT, which ORT 1.31.1 rethrows (FAIL_CREATE_EP)."""
    nothing = lambda w: None  # noqa: E731
    p = "ep.kilnexecutionprovider."
    return [
        Row("option-unknown-key", nothing, "FAIL_CREATE_EP", ["INVALID_ARGUMENT", "unknown kiln option 'speed'",
                                                   p + "speed", "context_storage"], options={"speed": "fast"}),
        Row("option-target-bad", nothing, "FAIL_CREATE_EP", ["invalid value 'riscv' for kiln option 'target'",
                                                  "x86_64-generic"], options={"target": "riscv"}),
        Row("option-disabled_ops-bad", nothing, "FAIL_CREATE_EP", ["invalid value 'QLinearConv' for kiln option 'disabled_ops'"],
            options={"disabled_ops": "QLinearConv"}),
        Row("option-context_storage-bad", nothing, "FAIL_CREATE_EP",
            ["invalid value 'mmap' for kiln option 'context_storage'", "map, copy"],
            options={"context_storage": "mmap"}),
        Row("option-context_storage-empty", nothing, "FAIL_CREATE_EP",
            ["invalid value '' for kiln option 'context_storage'"], options={"context_storage": ""}),
        Row("config-context_embed_mode-2", nothing, "FAIL_CREATE_EP", ["ep.context_embed_mode", "0, 1"],
            config={"ep.context_embed_mode": "2"}),
        Row("config-share_ep_contexts-yes", nothing, "FAIL_CREATE_EP", ["ep.share_ep_contexts", "0, 1"],
            config={"ep.share_ep_contexts": "yes"}),
        Row("config-stop_share_ep_contexts-2", nothing, "FAIL_CREATE_EP", ["ep.stop_share_ep_contexts"],
            config={"ep.stop_share_ep_contexts": "2"}),
        Row("option-context_storage-copy-ok", nothing, None, options={"context_storage": "copy"}),
    ]


def share_rows() -> List[Row]:
    nothing = lambda w: None  # noqa: E731
    share = {"ep.share_ep_contexts": "1", "ep.stop_share_ep_contexts": "1"}
    return [
        # compiling: embed mode 1 cannot share
        Row("compile-embed-1-with-share", nothing, "INVALID_ARGUMENT", ["ep.share_ep_contexts"],
            kind="compile", config={**share, "embed": "1"}),
        # compiling a compiled model again
        Row("compile-a-compiled-model", nothing, "INVALID_GRAPH", ["already holds kiln EPContext node"],
            kind="compile", config={"input": "ctx"}),
        # loading: an embedded payload is never shared, so sharing sessions load it as usual
        Row("load-embedded-with-share-ok", nothing, None, model="amr_embed", config=share),
        Row("load-copy-storage-with-share-ok", nothing, None, options={"context_storage": "copy"},
            config={"ep.share_ep_contexts": "1"}),
    ]


def compat_rows() -> List[Row]:
    def tamper(value):
        def setup(w):
            m = w.model()
            keep = [p for p in m.metadata_props if p.key != tu.COMPAT_KEY]
            del m.metadata_props[:]
            m.metadata_props.extend(keep)
            if value is not None:
                m.metadata_props.add(key=tu.COMPAT_KEY, value=value(tu.host_target()))
            w.save(m)
        return setup

    cases = [
        ("format-99", lambda t: tu.compat_info(t, fmt=99), V.EP_UNSUPPORTED),
        ("foreign-target", lambda t: tu.compat_info("arm64"), V.EP_UNSUPPORTED),
        ("not-kilns", lambda t: "someone-else;format=1;version=0.1.0;target=" + t, V.EP_UNSUPPORTED),
        ("garbage", lambda t: "\u00ff garbage;;==", V.EP_UNSUPPORTED),
        ("empty", lambda t: "", V.EP_UNSUPPORTED),
        ("duplicate-key", lambda t: f"kiln;format=1;format=1;version=0.1.0;target={t}", V.EP_UNSUPPORTED),
        ("older-kiln", lambda t: tu.compat_info(t, version="0.0.1"), V.EP_SUPPORTED_PREFER_RECOMPILATION),
        ("removed", None, None),
    ]
    return [Row(f"compat-{name}", tamper(value), None, kind="verdict", verdict=verdict)
            for name, value, verdict in cases]


ROWS: List[Row] = (bin_rows() + special_rows() + embed_rows() + cache_context_rows() + control_attr_rows()
                   + informational_rows() + io_rows() + option_rows() + share_rows() + compat_rows())
assert len({r.id for r in ROWS}) == len(ROWS), "row ids must be unique"

tu.TERMINAL_SUMMARY["kiln bad input table"] = lambda: [
    f"{len(ROWS)} rows: {sum(r.code is not None for r in ROWS)} refused with an error, "
    f"{sum(r.code is None and r.kind == 'load' for r in ROWS)} loaded and checked against the CPU EP, "
    f"{sum(r.kind == 'verdict' for r in ROWS)} compatibility verdicts; "
    f"{sum(r.risky for r in ROWS)} in a subprocess"]


# --------------------------------------------------------------------------
# running a row
# --------------------------------------------------------------------------
SUBPROCESS = textwrap.dedent(r"""
    import json, sys
    import onnxruntime as ort
    import onnxruntime_ep_kiln as kiln
    import kiln_testutil as tu

    model, options, config = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
    name = tu.unique_name("kiln_bad_input")
    ort.register_execution_provider_library(name, kiln.get_library_path())
    dev = [d for d in tu.kiln_devices() if not kiln.is_virtual(d)][0]
    res = {}
    try:
        tu.run_kiln(model, dev, None, options=options, config=config)
        res["error"] = None
    except tu.KilnSessionError as e:
        res["error"] = [e.exc_type.__name__, e.message]
    dev = None
    tu.safe_unregister(name)
    print("RESULT " + json.dumps(res))
""")


def load_in_subprocess(lib_path, model, options, config):
    env = dict(os.environ)
    env[kiln.LIBRARY_ENV] = lib_path
    env["PYTHONPATH"] = os.pathsep.join([tu.PYTHON_DIR, tu.TESTS_DIR, env.get("PYTHONPATH", "")])
    try:
        p = subprocess.run([sys.executable, "-c", SUBPROCESS, str(model), json.dumps(options), json.dumps(config)],
                           env=env, capture_output=True, text=True, timeout=SUBPROCESS_TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"loading {model} did not finish within {SUBPROCESS_TIMEOUT} s (a hang)")
    lines = [line for line in p.stdout.splitlines() if line.startswith("RESULT ")]
    assert p.returncode == 0 and lines, f"subprocess died ({p.returncode}):\n{p.stdout}\n{p.stderr}"
    return json.loads(lines[-1][len("RESULT "):])["error"]


def check_error(row: Row, exc_name: str, message: str):
    number, exc_type = CODES[row.code]
    assert exc_name == exc_type.__name__, f"expected {exc_type.__name__}, got {exc_name}: {message}"
    if number is None:
        assert "Error creating execution provider: [ONNXRuntimeError] : 2 : INVALID_ARGUMENT" in message, message
    else:
        assert f"[ONNXRuntimeError] : {number} : {row.code}" in message, message
    for n in row.needles:
        assert n in message, f"{n!r} not in error message: {message!r}"
    if row.code == "INVALID_GRAPH" and not row.by_ort:
        assert "kiln EPContext node" in message, message


def run_compile(row: Row, w: Work, dev):
    out = w.out
    cfg = dict(row.config)
    embed = cfg.pop("embed", "0") == "1"
    src = w.ctx if cfg.pop("input", "src") == "ctx" else w.src
    before = tu.files_in(out)
    err = tu.expect_error(tu.compile_model, str(src), dev, embed=embed, output=out / "m_ctx.onnx", config=cfg)
    check_error(row, err.exc_type.__name__, err.message)
    assert tu.files_in(out) == before, "a failed compile left files behind"


def check_loads(row: Row, w: Work, dev):
    """kiln loads every EPContext node (compiles nothing) and matches the CPU EP on
    the original model; inputs and outputs are matched by position (a row may rename them)."""
    want_feeds = tu.make_feeds(str(w.src))
    names, want = tu.run_cpu(str(w.src), want_feeds)
    m = w.model()
    inits = {i.name for i in m.graph.initializer}
    ctx_inputs = [i.name for i in m.graph.input if i.name not in inits]
    feeds = dict(zip(ctx_inputs, want_feeds.values()))
    run = tu.run_kiln(str(w.ctx), dev, feeds, options=row.options, config=row.config)
    tu.assert_outputs_close(names, want, run.outputs)
    assert run.created_delta("partitions_compiled") == 0
    assert run.created_delta("context_graphs_loaded") == len(tu.ep_context_nodes(m))


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_bad_input(row: Row, good, kiln_virtual, lib_path, tmp_path):
    if row.needs is not None and row.needs() is not None:
        pytest.skip(row.needs())
    dev = kiln_virtual["host"]
    w = Work(tmp_path, good, row.model)
    row.setup(w)
    before = w.snapshot()
    if row.kind == "compile":
        run_compile(row, w, dev)
    elif row.kind == "verdict":
        info = C.get_compatibility_info_from_model(str(w.ctx), kiln.EP_NAME)
        if row.verdict is None:
            assert info is None
        else:
            assert C.get_model_compatibility_for_ep_devices([dev], info) == row.verdict, info
        # Python's InferenceSession does not ask kiln before loading: the binary decides
        check_loads(row, w, dev)
    elif row.code is None:
        check_loads(row, w, dev)
    elif row.risky:
        got = load_in_subprocess(lib_path, w.ctx, row.options, row.config)
        assert got is not None, "loaded, but should have failed"
        check_error(row, *got)
    else:
        opened = tu.stats()["context_files_opened"]
        err = tu.expect_error(tu.run_kiln, str(w.ctx), dev, None, row.options, row.config)
        check_error(row, err.exc_type.__name__, err.message)
        if row.code == "NOT_IMPLEMENTED":  # a node kiln does not claim: kiln never reads its file
            assert tu.stats()["context_files_opened"] == opened
    assert w.snapshot() == before, "the attempt left files behind"
