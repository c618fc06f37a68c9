"""Loading EPContext models on kiln: which nodes kiln claims, how it finds binaries,
and every way a shipped artifact can be broken (each an InvalidGraph naming the node,
the file and the cause). Broken models are made by editing a compiled model with
``onnx`` and by damaging / moving / symlinking its ``.bin``.
"""
from __future__ import annotations

import os
import shutil
import struct

import numpy as np
import onnx
import pytest
from onnx import helper
from onnxruntime.capi import onnxruntime_pybind11_state as C

import onnxruntime_ep_kiln as kiln
import kiln_testutil as tu

KILN = kiln.EP_NAME


def set_attr(node, name, value):
    """Replace (or add) attribute ``name``; ``value=None`` removes it."""
    keep = [a for a in node.attribute if a.name != name]
    del node.attribute[:]
    node.attribute.extend(keep)
    if value is not None:
        node.attribute.append(helper.make_attribute(name, value))


def main_node(m):
    (n,) = [n for n in tu.ep_context_nodes(m) if tu.attrs_of(n)["main_context"] == 1]
    return n


@pytest.fixture
def amr_ctx(models, kiln_virtual, tmp_path):
    """add_mul_relu compiled with embed 0 in a fresh folder: (ctx path, bin path, original)."""
    src = tmp_path / "add_mul_relu.onnx"
    shutil.copy(models["add_mul_relu"], src)
    tu.generate_context(str(src), kiln_virtual["host"], embed=0)
    return tmp_path / "add_mul_relu_ctx.onnx", tmp_path / "add_mul_relu_kiln.bin", str(src)


@pytest.fixture
def split_ctx(models, kiln_virtual, tmp_path):
    src = tmp_path / "split.onnx"
    shutil.copy(models["split"], src)
    tu.generate_context(str(src), kiln_virtual["host"], embed=0)
    return tmp_path / "split_ctx.onnx", tmp_path / "split_kiln.bin", str(src)


def load_error(model, dev, config=None) -> tu.KilnSessionError:
    return tu.expect_error(tu.run_kiln, str(model) if not isinstance(model, bytes) else model, dev,
                           None, None, config)


def assert_bad_context(err, node_name, *needles):
    tu.assert_error(err, C.InvalidGraph, "kiln EPContext node", f"'{node_name}'", *needles)


def check_runs(ctx, original, dev, config=None) -> tu.KilnRun:
    feeds = tu.make_feeds(original)
    names, want = tu.run_cpu(original, feeds)
    run = tu.run_kiln(str(ctx) if not isinstance(ctx, bytes) else ctx, dev, feeds, config=config)
    tu.assert_outputs_close(names, want, run.outputs)
    assert run.created_delta("partitions_compiled") == 0
    return run


# --------------------------------------------------------------------------
# damaged / missing binaries
# --------------------------------------------------------------------------
def test_missing_binary(amr_ctx, kiln_virtual):
    ctx, binp, _ = amr_ctx
    binp.unlink()
    err = load_error(ctx, kiln_virtual["host"])
    assert_bad_context(err, tu.ep_context_nodes(ctx)[0].name, "add_mul_relu_kiln.bin", "does not exist")


def _damage(data: bytes, how: str) -> bytes:
    if how == "bad magic":
        return b"PK\x03\x04" + data[4:]
    if how == "not kiln at all":
        return b"definitely not a kiln context binary" * 4
    if how == "newer version":
        return data[:8] + struct.pack("<I", 99) + data[12:]
    if how == "older version":
        return data[:8] + struct.pack("<I", 0) + data[12:]
    if how == "checksum":
        last = len(data) - 1
        return data[:last] + bytes([data[last] ^ 0x5A])
    if how == "truncated":
        return data[: len(data) // 2]
    if how == "header only":
        return data[:64]
    if how == "empty file":
        return b""
    if how == "trailing bytes":
        return data + b"\0" * 64
    raise ValueError(how)


DAMAGE = [
    ("bad magic", ["not a kiln context binary"]),
    ("not kiln at all", ["not a kiln context binary"]),
    ("newer version", ["version", "99"]),
    ("older version", ["version"]),
    ("checksum", ["checksum"]),
    ("truncated", ["truncated"]),
    ("header only", ["truncated"]),
    ("empty file", []),
    ("trailing bytes", []),
]


@pytest.mark.parametrize("how,needles", DAMAGE, ids=[d[0] for d in DAMAGE])
def test_damaged_binary(amr_ctx, kiln_virtual, how, needles):
    ctx, binp, original = amr_ctx
    good = binp.read_bytes()
    binp.write_bytes(_damage(good, how))
    err = load_error(ctx, kiln_virtual["host"])
    assert_bad_context(err, tu.ep_context_nodes(ctx)[0].name, "add_mul_relu_kiln.bin", *needles)
    binp.write_bytes(good)
    check_runs(ctx, original, kiln_virtual["host"])


@pytest.mark.parametrize("how,needles", [d for d in DAMAGE if d[0] != "empty file"],
                         ids=[d[0] for d in DAMAGE if d[0] != "empty file"])
def test_damaged_embedded_payload(models, kiln_virtual, how, needles):
    dev = kiln_virtual["host"]
    m = tu.load_model_proto(tu.compile_model(models["add_mul_relu"], dev, embed=True, to="bytes"))
    (node,) = tu.ep_context_nodes(m)
    set_attr(node, "ep_cache_context", _damage(tu.attrs_of(node)["ep_cache_context"], how))
    err = load_error(m.SerializeToString(), dev)
    assert_bad_context(err, node.name, "embedded payload", *needles)


# --------------------------------------------------------------------------
# bad attributes
# --------------------------------------------------------------------------
@pytest.mark.parametrize("value", [b"", None], ids=["empty", "absent"])
def test_empty_or_absent_cache_context(amr_ctx, kiln_virtual, value):
    ctx, _, _ = amr_ctx
    m = tu.load_model_proto(ctx)
    node = tu.ep_context_nodes(m)[0]
    set_attr(node, "ep_cache_context", value)
    onnx.save(m, str(ctx))
    err = load_error(ctx, kiln_virtual["host"])
    assert_bad_context(err, node.name, "ep_cache_context is empty or absent")


def _point_at(ctx, rel):
    m = tu.load_model_proto(ctx)
    node = tu.ep_context_nodes(m)[0]
    set_attr(node, "ep_cache_context", rel.encode())
    onnx.save(m, str(ctx))
    return node.name


def test_absolute_path_refused(amr_ctx, kiln_virtual, tmp_path):
    ctx, binp, _ = amr_ctx
    name = _point_at(ctx, str(binp))  # an absolute path to the real, valid binary
    err = load_error(ctx, kiln_virtual["host"])
    assert_bad_context(err, name, "absolute path", str(binp))


def test_parent_dir_refused(models, kiln_virtual, tmp_path):
    dev = kiln_virtual["host"]
    src = tmp_path / "add_mul_relu.onnx"
    shutil.copy(models["add_mul_relu"], src)
    inner = tmp_path / "inner"
    inner.mkdir()
    out = inner / "add_mul_relu_ctx.onnx"
    tu.generate_context(str(src), dev, embed=0, file_path=str(out))
    # move the binary one level up and point at it with '..'
    shutil.move(str(inner / "add_mul_relu_kiln.bin"), str(tmp_path / "add_mul_relu_kiln.bin"))
    name = _point_at(out, "../add_mul_relu_kiln.bin")
    err = load_error(out, dev)
    assert_bad_context(err, name, "'..'", "../add_mul_relu_kiln.bin")
    name = _point_at(out, "sub/../../add_mul_relu_kiln.bin")
    assert_bad_context(load_error(out, dev), name, "'..'")


def test_symlink_outside_refused_inside_allowed(models, kiln_virtual, tmp_path):
    dev = kiln_virtual["host"]
    src = tmp_path / "add_mul_relu.onnx"
    shutil.copy(models["add_mul_relu"], src)
    inner = tmp_path / "inner"
    inner.mkdir()
    out = inner / "add_mul_relu_ctx.onnx"
    tu.generate_context(str(src), dev, embed=0, file_path=str(out))
    real = inner / "add_mul_relu_kiln.bin"
    outside = tmp_path / "outside_kiln.bin"
    shutil.move(str(real), str(outside))
    os.symlink(str(outside), str(real))
    err = load_error(out, dev)
    assert_bad_context(err, tu.ep_context_nodes(out)[0].name, "add_mul_relu_kiln.bin", "symbolic link")
    # a symlink (even a relative one, through a subfolder) that stays inside is fine
    os.unlink(str(real))
    (inner / "store").mkdir()
    shutil.move(str(outside), str(inner / "store" / "actual.bin"))
    os.symlink("store/actual.bin", str(real))
    check_runs(out, str(src), dev)


def test_binary_in_subfolder(amr_ctx, kiln_virtual):
    ctx, binp, original = amr_ctx
    (ctx.parent / "bins").mkdir()
    shutil.move(str(binp), str(ctx.parent / "bins" / "renamed.bin"))
    _point_at(ctx, "bins/renamed.bin")
    run = check_runs(ctx, original, kiln_virtual["host"])
    assert run.created_delta("context_files_opened") == 1


def test_main_context_0_without_a_binary(split_ctx, kiln_virtual):
    ctx, _, _ = split_ctx
    m = tu.load_model_proto(ctx)
    node = main_node(m)
    set_attr(node, "main_context", 0)
    set_attr(node, "ep_cache_context", None)
    onnx.save(m, str(ctx))
    err = load_error(ctx, kiln_virtual["host"])
    tu.assert_error(err, C.InvalidGraph, "kiln EPContext node",
                    "main_context=0 but no context binary loaded in this session holds graph")


def test_partition_not_in_binary(split_ctx, kiln_virtual):
    ctx, _, _ = split_ctx
    m = tu.load_model_proto(ctx)
    node = main_node(m)
    set_attr(node, "partition_name", b"no_such_graph")
    onnx.save(m, str(ctx))
    err = load_error(ctx, kiln_virtual["host"])
    assert_bad_context(err, node.name, "no_such_graph", "is not in its context binary")


def test_secondary_partition_not_in_any_binary(split_ctx, kiln_virtual):
    ctx, _, _ = split_ctx
    m = tu.load_model_proto(ctx)
    node = [n for n in tu.ep_context_nodes(m) if tu.attrs_of(n)["main_context"] == 0][0]
    set_attr(node, "partition_name", b"no_such_graph")
    onnx.save(m, str(ctx))
    err = load_error(ctx, kiln_virtual["host"])
    assert_bad_context(err, node.name, "no_such_graph", "main_context=0")


def test_missing_partition_name(amr_ctx, kiln_virtual):
    ctx, _, _ = amr_ctx
    m = tu.load_model_proto(ctx)
    node = tu.ep_context_nodes(m)[0]
    set_attr(node, "partition_name", None)
    onnx.save(m, str(ctx))
    assert_bad_context(load_error(ctx, kiln_virtual["host"]), node.name, "partition_name")


def test_bad_embed_mode(amr_ctx, kiln_virtual):
    ctx, _, _ = amr_ctx
    m = tu.load_model_proto(ctx)
    node = tu.ep_context_nodes(m)[0]
    set_attr(node, "embed_mode", 2)
    onnx.save(m, str(ctx))
    assert_bad_context(load_error(ctx, kiln_virtual["host"]), node.name, "embed_mode 2")


def test_embed_mode_0_attribute_on_a_payload_is_read_as_a_path(models, kiln_virtual, tmp_path):
    """embed_mode is what decides: a payload under embed_mode=0 is taken as a file name."""
    dev = kiln_virtual["host"]
    m = tu.load_model_proto(tu.compile_model(models["add_mul_relu"], dev, embed=True, to="bytes"))
    (node,) = tu.ep_context_nodes(m)
    set_attr(node, "embed_mode", 0)
    path = tmp_path / "m.onnx"
    onnx.save(m, str(path))
    err = load_error(path, dev)
    tu.assert_error(err, C.InvalidGraph, "kiln EPContext node", node.name)


def test_node_input_count_disagrees(amr_ctx, kiln_virtual):
    ctx, _, _ = amr_ctx
    m = tu.load_model_proto(ctx)
    node = tu.ep_context_nodes(m)[0]
    node.input.append("B")
    onnx.save(m, str(ctx))
    assert_bad_context(load_error(ctx, kiln_virtual["host"]), node.name, "it has 3 inputs", "compiled with 2")


def test_node_output_count_disagrees(amr_ctx, kiln_virtual):
    ctx, _, _ = amr_ctx
    m = tu.load_model_proto(ctx)
    node = tu.ep_context_nodes(m)[0]
    node.output.append("Y2")
    m.graph.output.append(helper.make_tensor_value_info("Y2", onnx.TensorProto.FLOAT, [2, 3, 4]))
    onnx.save(m, str(ctx))
    assert_bad_context(load_error(ctx, kiln_virtual["host"]), node.name, "it has 2 outputs", "compiled with 1")


def test_node_input_shape_disagrees(amr_ctx, kiln_virtual):
    ctx, _, _ = amr_ctx
    m = tu.load_model_proto(ctx)
    node = tu.ep_context_nodes(m)[0]
    a = [i for i in m.graph.input if i.name == "A"][0]
    a.type.tensor_type.shape.dim[2].dim_value = 5
    onnx.save(m, str(ctx))
    assert_bad_context(load_error(ctx, kiln_virtual["host"]), node.name, "input 0 ('A') has shape [2, 3, 5]",
                       "[2, 3, 4]")


# --------------------------------------------------------------------------
# which EPContext nodes kiln takes
# --------------------------------------------------------------------------
@pytest.mark.parametrize("source", ["kiln", "KILN", "kilnexecutionprovider", "KilnExecutionProvider"])
def test_source_spellings_are_claimed(amr_ctx, kiln_virtual, source):
    ctx, _, original = amr_ctx
    m = tu.load_model_proto(ctx)
    set_attr(tu.ep_context_nodes(m)[0], "source", source.encode())
    onnx.save(m, str(ctx))
    run = check_runs(ctx, original, kiln_virtual["host"])
    assert run.created_delta("context_graphs_loaded") == 1


@pytest.mark.parametrize("source", ["OtherEP", None], ids=["OtherEP", "no-source"])
def test_foreign_or_sourceless_node_is_not_claimed(amr_ctx, kiln_virtual, source):
    ctx, _, _ = amr_ctx
    m = tu.load_model_proto(ctx)
    node = tu.ep_context_nodes(m)[0]
    set_attr(node, "source", None if source is None else source.encode())
    onnx.save(m, str(ctx))
    before = tu.stats()
    err = load_error(ctx, kiln_virtual["host"])
    assert err.exc_type is C.NotImplemented, err
    assert node.name in err.message, err.message
    if source:
        assert f"generated by '{source}'" in err.message, err.message
    assert tu.stats()["context_files_opened"] == before["context_files_opened"]


def _mixed_model(split_ctx_path):
    """split_ctx (3 kiln EPContext nodes + Sin + Floor) plus an OtherEP EPContext node
    consuming Z and an ordinary Neg after it."""
    m = tu.load_model_proto(split_ctx_path)
    other = helper.make_node("EPContext", ["Z"], ["W_other"], name="other_ep_ctx", domain="com.microsoft",
                             source="OtherEP", embed_mode=1, main_context=1,
                             ep_cache_context=b"OTHER-EP-PAYLOAD", partition_name="other_graph")
    m.graph.node.append(other)
    m.graph.node.append(helper.make_node("Neg", ["W_other"], ["V"], name="after_other"))
    m.graph.value_info.append(helper.make_tensor_value_info("W_other", onnx.TensorProto.FLOAT, [2, 3, 4]))
    m.graph.output.append(helper.make_tensor_value_info("V", onnx.TensorProto.FLOAT, [2, 3, 4]))
    return m


def test_mixed_model_with_another_eps_node(split_ctx, kiln_virtual):
    ctx, _, original = split_ctx
    mixed = ctx.parent / "mixed.onnx"
    onnx.save(_mixed_model(ctx), str(mixed))
    err = load_error(mixed, kiln_virtual["host"])
    tu.assert_error(err, C.NotImplemented, "OtherEP", "other_ep_ctx")
    # the same model minus the other EP's node (and what hangs off it) runs
    m = _mixed_model(ctx)
    keep = [n for n in m.graph.node if n.name not in ("other_ep_ctx", "after_other")]
    del m.graph.node[:]
    m.graph.node.extend(keep)
    outs = [o for o in m.graph.output if o.name not in ("V",)]
    del m.graph.output[:]
    m.graph.output.extend(outs)
    onnx.save(m, str(mixed))
    run = check_runs(mixed, original, kiln_virtual["host"])
    assert run.created_delta("context_graphs_loaded") == 3
    assert sorted(op for _, op in run.nodes_on("CPUExecutionProvider")) == ["Floor", "Sin"]


def test_kiln_nodes_mixed_with_ordinary_supported_nodes(split_ctx, kiln_virtual):
    """Ordinary nodes kiln supports next to its EPContext nodes are compiled as usual."""
    ctx, _, original = split_ctx
    m = tu.load_model_proto(ctx)
    m.graph.node.append(helper.make_node("Relu", ["Y"], ["Y_relu"], name="extra_relu"))
    m.graph.output.append(helper.make_tensor_value_info("Y_relu", onnx.TensorProto.FLOAT, [2, 3, 4]))
    onnx.save(m, str(ctx))
    feeds = tu.make_feeds(original)
    names, want = tu.run_cpu(original, feeds)
    run = tu.run_kiln(str(ctx), kiln_virtual["host"], feeds)
    got = dict(zip(run.output_names, run.outputs))
    for n, w in zip(names, want):
        np.testing.assert_allclose(got[n], w, rtol=tu.RTOL, atol=tu.ATOL)
    np.testing.assert_allclose(got["Y_relu"], np.maximum(want[names.index("Y")], 0), rtol=tu.RTOL, atol=tu.ATOL)
    assert run.created_delta("context_graphs_loaded") == 3
    assert run.created_delta("partitions_compiled") == 1


# --------------------------------------------------------------------------
# each binary read once per session
# --------------------------------------------------------------------------
def test_binary_read_once_per_session(split_ctx, kiln_virtual):
    ctx, _, original = split_ctx
    # make every node a primary pointing at the same binary
    m = tu.load_model_proto(ctx)
    for n in tu.ep_context_nodes(m):
        set_attr(n, "main_context", 1)
        set_attr(n, "ep_cache_context", b"split_kiln.bin")
    onnx.save(m, str(ctx))
    for _ in range(2):  # and again in a second session: opened again, once
        run = check_runs(ctx, original, kiln_virtual["host"])
        assert run.created_delta("context_files_opened") == 1
        assert run.created_delta("context_graphs_loaded") == 3


def test_runs_repeatedly_and_with_other_inputs(split_ctx, kiln_virtual):
    ctx, _, original = split_ctx
    for seed in (1, 2, 3):
        feeds = tu.make_feeds(original, seed)
        names, want = tu.run_cpu(original, feeds)
        run = tu.run_kiln(str(ctx), kiln_virtual["host"], feeds, runs=3)
        tu.assert_outputs_close(names, want, run.outputs)
        assert run.run_delta("compute_calls") == 9
