"""EPContext generation through ONNX Runtime's Python API, and running what was generated.

Both routes (session options with ``ep.context_enable=1``, and ``ort.ModelCompiler``),
embed modes 0 and 1, output to a file / bytes / a stream, default and explicit
``ep.context_file_path`` (also in a subfolder), models given as bytes, multi-partition
models, the node-name prefix, two compiled models merged into one, compile flags, what
is (not) in the compiled model and the binary. Every compiled model is run on kiln and
compared with the original on ORT's CPU EP, and must load without compiling anything.
"""
from __future__ import annotations

import os
import shutil

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnxruntime.capi import onnxruntime_pybind11_state as C

import onnxruntime_ep_kiln as kiln
import kiln_testutil as tu

KILN = kiln.EP_NAME
SOURCE = b"KilnExecutionProvider"
SDK_VERSION = f"kiln 0.1.0 (context format {tu.CONTEXT_FORMAT})".encode()


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------
def copy_model(models, name, folder) -> str:
    dst = os.path.join(str(folder), f"{name}.onnx")
    shutil.copy(models[name], dst)
    return dst


def host_target(devs) -> str:
    return kiln.device_target(devs["host"])


def check_loaded_run(ctx_model, original, dev, config=None, expect_graphs=None, expect_files=None,
                     seed=0) -> tu.KilnRun:
    """Run the compiled model on kiln, compare with the original on the CPU EP, and
    check that loading compiled nothing."""
    feeds = tu.make_feeds(original, seed)
    names, expected = tu.run_cpu(original, feeds)
    run = tu.run_kiln(ctx_model, dev, feeds, config=config)
    assert run.output_names == names
    tu.assert_outputs_close(names, expected, run.outputs)
    assert run.created_delta("partitions_compiled") == 0, "loading an EPContext model must not compile"
    assert run.created_delta("nodes_compiled") == 0
    if expect_graphs is not None:
        assert run.created_delta("context_graphs_loaded") == expect_graphs
    if expect_files is not None:
        assert run.created_delta("context_files_opened") == expect_files
    assert run.run_delta("compute_calls") >= 1
    assert all(op == "EPContext" for _, op in run.nodes_on(KILN)), run.assignment
    return run


def no_temp_files(folder):
    leftovers = [f for f in os.listdir(folder) if ".tmp" in f or f.startswith(".")]
    assert leftovers == [], f"temporary files left behind: {leftovers}"


def check_common_attrs(node, target, model_filename=None, prefix=""):
    a = tu.attrs_of(node)
    assert node.domain == "com.microsoft"
    assert a["source"] == SOURCE
    assert a["partition_name"] == (prefix + node.name).encode(), (a["partition_name"], node.name)
    assert a["ep_sdk_version"] == SDK_VERSION
    assert a["hardware_architecture"] == target.encode()
    if model_filename is None:
        assert "onnx_model_filename" not in a
    else:
        assert a["onnx_model_filename"] == model_filename.encode()
    assert isinstance(a["notes"], bytes) and b"steps" in a["notes"]
    assert isinstance(a["max_size"], int) and a["max_size"] >= 0
    assert a["embed_mode"] in (0, 1)
    assert a["main_context"] in (0, 1)
    return a


# --------------------------------------------------------------------------
# session-option route
# --------------------------------------------------------------------------
def test_session_route_embed0_default_path(models, kiln_virtual, tmp_path):
    dev = kiln_virtual["host"]
    src = copy_model(models, "add_mul_relu", tmp_path)
    tu.generate_context(src, dev, embed=0)
    assert tu.files_in(tmp_path) == ["add_mul_relu.onnx", "add_mul_relu_ctx.onnx", "add_mul_relu_kiln.bin"]
    ctx = tmp_path / "add_mul_relu_ctx.onnx"
    nodes = tu.ep_context_nodes(ctx)
    assert len(nodes) == 1
    a = check_common_attrs(nodes[0], host_target(kiln_virtual), "add_mul_relu.onnx")
    assert a["embed_mode"] == 0 and a["main_context"] == 1
    assert a["ep_cache_context"] == b"add_mul_relu_kiln.bin"
    assert list(nodes[0].input) == ["A", "B"] and list(nodes[0].output) == ["Y"]
    assert tu.metadata(ctx)[tu.COMPAT_KEY] == tu.compat_info(host_target(kiln_virtual))
    # W was compiled by kiln: not in the compiled model
    assert [i.name for i in tu.load_model_proto(ctx).graph.initializer] == []
    no_temp_files(tmp_path)
    run = check_loaded_run(str(ctx), src, dev, expect_graphs=1, expect_files=1)
    assert run.subgraphs_on(KILN) == 1


def test_session_route_embed1_default_path(models, kiln_virtual, tmp_path):
    dev = kiln_virtual["host"]
    src = copy_model(models, "add_mul_relu", tmp_path)
    tu.generate_context(src, dev, embed=1)
    assert tu.files_in(tmp_path) == ["add_mul_relu.onnx", "add_mul_relu_ctx.onnx"]
    ctx = tmp_path / "add_mul_relu_ctx.onnx"
    (node,) = tu.ep_context_nodes(ctx)
    a = check_common_attrs(node, host_target(kiln_virtual), "add_mul_relu.onnx")
    assert a["embed_mode"] == 1 and a["main_context"] == 1
    payload = a["ep_cache_context"]
    assert payload.startswith(tu.CTX_MAGIC)
    h, info = tu.parse_ctx_binary(payload)
    assert len(payload) == h.data_offset + h.data_length
    assert info["graphs"] == [node.name] and info["target"] == host_target(kiln_virtual)
    check_loaded_run(str(ctx), src, dev, expect_graphs=1, expect_files=0)


@pytest.mark.parametrize("embed", [0, 1])
def test_session_route_explicit_path_in_subfolder(models, kiln_virtual, tmp_path, embed):
    dev = kiln_virtual["host"]
    src = copy_model(models, "add_mul_relu", tmp_path)
    sub = tmp_path / "out" / "deeper"
    sub.mkdir(parents=True)
    out = sub / "amr_ctx.onnx"
    tu.generate_context(src, dev, embed=embed, file_path=str(out))
    expected = sorted(["amr_ctx.onnx"] + (["add_mul_relu_kiln.bin"] if embed == 0 else []))
    assert tu.files_in(sub) == expected, "the binary is named after the input model, beside the output"
    assert tu.files_in(tmp_path) == ["add_mul_relu.onnx", "out"]
    (node,) = tu.ep_context_nodes(out)
    if embed == 0:
        assert tu.attrs_of(node)["ep_cache_context"] == b"add_mul_relu_kiln.bin"
    no_temp_files(sub)
    check_loaded_run(str(out), src, dev, expect_graphs=1, expect_files=1 - embed)


def test_session_route_model_from_bytes(models, kiln_virtual, tmp_path):
    """Bytes in: ORT itself needs ep.context_file_path for the session route; the
    binary is named after the output's stem (x_ctx.onnx -> x_kiln.bin)."""
    dev = kiln_virtual["host"]
    data = open(models["add_mul_relu"], "rb").read()
    err = tu.expect_error(tu.generate_context, data, dev, embed=0)
    # ORT refuses before kiln is asked (ORT's message, not kiln's)
    tu.assert_error(err, C.InvalidArgument, "ep_context_path")
    out = tmp_path / "x_ctx.onnx"
    tu.generate_context(data, dev, embed=0, file_path=str(out))
    assert tu.files_in(tmp_path) == ["x_ctx.onnx", "x_kiln.bin"]
    (node,) = tu.ep_context_nodes(out)
    a = check_common_attrs(node, host_target(kiln_virtual), None)
    assert a["ep_cache_context"] == b"x_kiln.bin"
    check_loaded_run(str(out), models["add_mul_relu"], dev, expect_graphs=1, expect_files=1)


# --------------------------------------------------------------------------
# compile API
# --------------------------------------------------------------------------
@pytest.mark.parametrize("embed", [False, True])
def test_compile_api_to_file(models, kiln_virtual, tmp_path, embed):
    dev = kiln_virtual["host"]
    src = copy_model(models, "split", tmp_path)
    out = tmp_path / "compiled.onnx"
    tu.compile_model(src, dev, embed=embed, output=out)
    want = ["compiled.onnx", "split.onnx"] + ([] if embed else ["split_kiln.bin"])
    assert tu.files_in(tmp_path) == want
    nodes = tu.ep_context_nodes(out)
    assert len(nodes) == 2
    for n in nodes:
        a = check_common_attrs(n, host_target(kiln_virtual), "split.onnx")
        assert a["embed_mode"] == int(embed)
    check_loaded_run(str(out), src, dev, expect_graphs=2, expect_files=0 if embed else 1)


@pytest.mark.parametrize("to", ["bytes", "stream"])
def test_compile_api_to_bytes_and_stream_embed1(models, kiln_virtual, tmp_path, to):
    dev = kiln_virtual["host"]
    src = copy_model(models, "split", tmp_path)
    data = tu.compile_model(src, dev, embed=True, to=to)
    assert tu.files_in(tmp_path) == ["split.onnx"], "embed mode 1 writes no file"
    nodes = tu.ep_context_nodes(data)
    assert len(nodes) == 2
    for n in nodes:
        a = check_common_attrs(n, host_target(kiln_virtual), "split.onnx")
        assert a["embed_mode"] == 1 and a["main_context"] == 1
        assert a["ep_cache_context"].startswith(tu.CTX_MAGIC)
        _, info = tu.parse_ctx_binary(a["ep_cache_context"])
        assert info["graphs"] == [a["partition_name"].decode()], "each node is self-contained"
    check_loaded_run(data, src, dev, expect_graphs=2, expect_files=0)


@pytest.mark.parametrize("to", ["bytes", "stream"])
def test_compile_api_path_to_bytes_embed0_writes_binary_beside_input(models, kiln_virtual, tmp_path, to):
    """Input given as a path: ORT's default output is <dir>/<stem>_ctx.onnx, so the binary
    goes beside the input and the returned model (loaded with ep.context_file_path) finds it."""
    dev = kiln_virtual["host"]
    src = copy_model(models, "add_mul_relu", tmp_path)
    data = tu.compile_model(src, dev, embed=False, to=to)
    assert tu.files_in(tmp_path) == ["add_mul_relu.onnx", "add_mul_relu_kiln.bin"]
    (node,) = tu.ep_context_nodes(data)
    assert tu.attrs_of(node)["ep_cache_context"] == b"add_mul_relu_kiln.bin"
    check_loaded_run(data, src, dev, config={"ep.context_file_path": str(tmp_path / "anything.onnx")},
                     expect_graphs=1, expect_files=1)


def test_compile_api_bytes_in(models, kiln_virtual, tmp_path):
    dev = kiln_virtual["host"]
    data = open(models["add_mul_relu"], "rb").read()
    # embed 0 with no idea where the output goes: kiln says which option is missing
    for to in ("bytes", "stream"):
        err = tu.expect_error(tu.compile_model, data, dev, embed=False, to=to)
        tu.assert_error(err, C.InvalidArgument, "ep.context_file_path")
    assert tu.files_in(tmp_path) == []
    # embed 0 to a file: binary named after the output stem
    sub = tmp_path / "from_bytes"
    sub.mkdir()
    out = sub / "m_ctx.onnx"
    tu.compile_model(data, dev, embed=False, output=out)
    assert tu.files_in(sub) == ["m_ctx.onnx", "m_kiln.bin"]
    (node,) = tu.ep_context_nodes(out)
    a = check_common_attrs(node, host_target(kiln_virtual), None)
    assert a["ep_cache_context"] == b"m_kiln.bin"
    check_loaded_run(str(out), models["add_mul_relu"], dev, expect_graphs=1, expect_files=1)
    # embed 0 to bytes with ep.context_file_path: binary beside that path
    sub2 = tmp_path / "to_bytes"
    sub2.mkdir()
    ctx = tu.compile_model(data, dev, embed=False, to="bytes",
                           config={"ep.context_file_path": str(sub2 / "y_ctx.onnx")})
    assert tu.files_in(sub2) == ["y_kiln.bin"]
    check_loaded_run(ctx, models["add_mul_relu"], dev,
                     config={"ep.context_file_path": str(sub2 / "y_ctx.onnx")}, expect_graphs=1, expect_files=1)
    # embed 1: self-contained bytes
    ctx = tu.compile_model(data, dev, embed=True, to="bytes")
    check_loaded_run(ctx, models["add_mul_relu"], dev, expect_graphs=1, expect_files=0)


def test_model_from_bytes_embed0_loading(models, kiln_virtual, tmp_path):
    """An embed-0 model loaded from bytes resolves its binary against the folder of
    ep.context_file_path, and without it fails naming the option."""
    dev = kiln_virtual["host"]
    src = copy_model(models, "split", tmp_path)
    tu.generate_context(src, dev, embed=0)
    data = (tmp_path / "split_ctx.onnx").read_bytes()
    err = tu.expect_error(tu.run_kiln, data, dev)
    tu.assert_error(err, C.InvalidGraph, "EPContext node", "split_kiln.bin", "loaded from bytes",
                    "ep.context_file_path")
    check_loaded_run(data, src, dev, config={"ep.context_file_path": str(tmp_path / "nonexistent.onnx")},
                     expect_graphs=2, expect_files=1)
    # the path only needs to name the folder: a different folder fails
    other = tmp_path / "elsewhere"
    other.mkdir()
    err = tu.expect_error(tu.run_kiln, data, dev, config={"ep.context_file_path": str(other / "m.onnx")})
    tu.assert_error(err, C.InvalidGraph, "split_kiln.bin", "does not exist")


# --------------------------------------------------------------------------
# multi-partition models, prefixes, merging
# --------------------------------------------------------------------------
def test_split_one_binary_main_context_then_zeros(models, kiln_virtual, tmp_path):
    dev = kiln_virtual["host"]
    src = copy_model(models, "split", tmp_path)
    tu.generate_context(src, dev, embed=0)
    assert tu.files_in(tmp_path) == ["split.onnx", "split_ctx.onnx", "split_kiln.bin"]
    ctx = tmp_path / "split_ctx.onnx"
    m = tu.load_model_proto(ctx)
    nodes = tu.ep_context_nodes(m)
    assert len(nodes) == 2
    assert sorted(n.op_type for n in m.graph.node if n.op_type != "EPContext") == ["Asinh", "Atan"]
    mains = [n for n in nodes if tu.attrs_of(n)["main_context"] == 1]
    assert len(mains) == 1, "exactly one node points at the binary"
    for n in nodes:
        a = check_common_attrs(n, host_target(kiln_virtual), "split.onnx")
        assert a["embed_mode"] == 0
        if a["main_context"] == 1:
            assert a["ep_cache_context"] == b"split_kiln.bin"
        else:
            assert "ep_cache_context" not in a
    # the binary holds every partition, by partition name
    _, info = tu.parse_ctx_binary((tmp_path / "split_kiln.bin").read_bytes())
    assert sorted(info["graphs"]) == sorted(tu.attrs_of(n)["partition_name"].decode() for n in nodes)
    # io of each EPContext node = the fused node's: same values as the original partitions
    ios = sorted((tuple(n.input), tuple(n.output)) for n in nodes)
    # the chains before Atan and after Asinh are independent: merged into one
    assert ios == sorted([(("X", "f"), ("r", "Z")), (("s", "X"), ("Y",))]), ios
    assert [i.name for i in m.graph.initializer] == [], "bias and W are kiln's"
    run = check_loaded_run(str(ctx), src, dev, expect_graphs=2, expect_files=1)
    assert run.subgraphs_on(KILN) == 2


def test_split_main_context_node_is_first_in_graph_order(models, kiln_virtual, tmp_path):
    """Documented: 'first node main_context=1, then 0s'. Readers of other EPs (and
    humans) look for the main context node first in the graph."""
    dev = kiln_virtual["host"]
    src = copy_model(models, "split", tmp_path)
    tu.generate_context(src, dev, embed=0)
    flags = [tu.attrs_of(n)["main_context"] for n in tu.ep_context_nodes(tmp_path / "split_ctx.onnx")]
    assert flags == [1, 0], f"main_context in graph order: {flags}"


@pytest.mark.parametrize("route", ["session", "compile"])
def test_node_name_prefix(models, kiln_virtual, tmp_path, route):
    dev = kiln_virtual["host"]
    src = copy_model(models, "split", tmp_path)
    cfg = {"ep.context_node_name_prefix": "pfx_"}
    out = tmp_path / "p_ctx.onnx"
    if route == "session":
        tu.generate_context(src, dev, embed=0, file_path=str(out), config=cfg)
    else:
        tu.compile_model(src, dev, embed=False, output=out, config=cfg)
    nodes = tu.ep_context_nodes(out)
    assert len(nodes) == 2
    for n in nodes:
        a = check_common_attrs(n, host_target(kiln_virtual), "split.onnx", prefix="pfx_")
        assert a["partition_name"].startswith(b"pfx_")
    _, info = tu.parse_ctx_binary((tmp_path / "split_kiln.bin").read_bytes())
    assert all(g.startswith("pfx_") for g in info["graphs"]) and len(info["graphs"]) == 2
    check_loaded_run(str(out), src, dev, expect_graphs=2, expect_files=1)


def test_two_compiled_models_merged_into_one(models, kiln_virtual, tmp_path):
    """Compile two models (prefixes keep partition names apart, embed 0: two binaries
    in one folder), merge them into one ONNX file, run it, compare with both originals."""
    import onnx.compose

    dev = kiln_virtual["host"]
    amr = copy_model(models, "add_mul_relu", tmp_path)
    split = copy_model(models, "split", tmp_path)
    tu.compile_model(amr, dev, embed=False, output=tmp_path / "amr_ctx.onnx",
                     config={"ep.context_node_name_prefix": "m1_"})
    tu.compile_model(split, dev, embed=False, output=tmp_path / "split_ctx.onnx",
                     config={"ep.context_node_name_prefix": "m2_"})
    assert {"add_mul_relu_kiln.bin", "split_kiln.bin"} <= set(tu.files_in(tmp_path))
    m1 = tu.load_model_proto(tmp_path / "amr_ctx.onnx")
    m2 = tu.load_model_proto(tmp_path / "split_ctx.onnx")
    # value (and node) names of the two graphs clash (Y), so prefix them; the
    # partition_name attributes (what kiln looks graphs up by) are untouched
    merged = onnx.compose.merge_models(m1, m2, io_map=[], prefix1="a/", prefix2="b/")
    merged_path = tmp_path / "merged.onnx"
    onnx.save(merged, str(merged_path))
    nodes = tu.ep_context_nodes(merged)
    assert len(nodes) == 3
    parts = sorted(tu.attrs_of(n)["partition_name"].decode() for n in nodes)
    assert sum(p.startswith("m1_") for p in parts) == 1 and sum(p.startswith("m2_") for p in parts) == 2
    assert sorted(tu.attrs_of(n).get("ep_cache_context", b"") for n in nodes) == \
        [b"", b"add_mul_relu_kiln.bin", b"split_kiln.bin"]

    f1 = tu.make_feeds(amr, 1)
    f2 = tu.make_feeds(split, 2)
    n1, e1 = tu.run_cpu(amr, f1)
    n2, e2 = tu.run_cpu(split, f2)
    feeds = {**{"a/" + k: v for k, v in f1.items()}, **{"b/" + k: v for k, v in f2.items()}}
    run = tu.run_kiln(str(merged_path), dev, feeds)
    want = dict(zip(["a/" + n for n in n1] + ["b/" + n for n in n2], e1 + e2))
    got = dict(zip(run.output_names, run.outputs))
    assert sorted(got) == sorted(want)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=tu.RTOL, atol=tu.ATOL, err_msg=k)
    assert run.created_delta("partitions_compiled") == 0
    assert run.created_delta("context_graphs_loaded") == 3
    assert run.created_delta("context_files_opened") == 2


def test_same_model_compiled_twice_merged_with_prefixes(models, kiln_virtual, tmp_path):
    """The same model compiled twice with different prefixes (embed 1) gives EPContext
    nodes with equal node names but distinct partition names; merged, both load."""
    import onnx.compose

    dev = kiln_virtual["host"]
    amr = copy_model(models, "add_mul_relu", tmp_path)
    a = tu.load_model_proto(tu.compile_model(amr, dev, embed=True, to="bytes",
                                             config={"ep.context_node_name_prefix": "first_"}))
    b = tu.load_model_proto(tu.compile_model(amr, dev, embed=True, to="bytes",
                                             config={"ep.context_node_name_prefix": "second_"}))
    merged = onnx.compose.merge_models(a, b, io_map=[], prefix1="a/", prefix2="b/")
    feeds1 = tu.make_feeds(amr, 5)
    _, want = tu.run_cpu(amr, feeds1)
    feeds = {**{"a/" + k: v for k, v in feeds1.items()}, **{"b/" + k: v for k, v in feeds1.items()}}
    run = tu.run_kiln(merged.SerializeToString(), dev, feeds)
    for name, out in zip(run.output_names, run.outputs):
        np.testing.assert_allclose(out, want[0], rtol=tu.RTOL, atol=tu.ATOL, err_msg=name)
    assert run.created_delta("context_graphs_loaded") == 2


# --------------------------------------------------------------------------
# compile flags, refusals, atomic writes
# --------------------------------------------------------------------------
def test_flag_error_if_no_nodes_compiled(models, kiln_virtual, tmp_path):
    dev = kiln_virtual["host"]
    src = copy_model(models, "unsupported", tmp_path)
    err = tu.expect_error(tu.compile_model, src, dev, embed=True, output=tmp_path / "u_ctx.onnx",
                          flags=int(ort.OrtCompileApiFlags.ERROR_IF_NO_NODES_COMPILED))
    tu.assert_error(err, C.Fail, "Unable to compile any nodes")
    assert tu.files_in(tmp_path) == ["unsupported.onnx"]
    # without the flag, compiling a model kiln cannot claim gives a model without EPContext nodes
    tu.compile_model(src, dev, embed=False, output=tmp_path / "u_ctx.onnx")
    assert tu.ep_context_nodes(tmp_path / "u_ctx.onnx") == []
    assert tu.files_in(tmp_path) == ["u_ctx.onnx", "unsupported.onnx"], "no binary for no partitions"


def test_flag_error_if_output_file_exists(models, kiln_virtual, tmp_path):
    dev = kiln_virtual["host"]
    src = copy_model(models, "add_mul_relu", tmp_path)
    out = tmp_path / "a_ctx.onnx"
    out.write_bytes(b"existing")
    err = tu.expect_error(tu.compile_model, src, dev, embed=False, output=out,
                          flags=int(ort.OrtCompileApiFlags.ERROR_IF_OUTPUT_FILE_EXISTS))
    tu.assert_error(err, C.Fail, "exists")
    assert out.read_bytes() == b"existing"
    assert "add_mul_relu_kiln.bin" not in tu.files_in(tmp_path), "nothing written when ORT refuses"
    # without the flag the file is replaced
    tu.compile_model(src, dev, embed=False, output=out)
    assert tu.ep_context_nodes(out)


@pytest.mark.parametrize("route", ["session", "compile"])
def test_recompiling_a_compiled_model_is_refused(models, kiln_virtual, tmp_path, route):
    dev = kiln_virtual["host"]
    src = copy_model(models, "split", tmp_path)
    tu.generate_context(src, dev, embed=0)
    ctx = tmp_path / "split_ctx.onnx"
    again = tmp_path / "again_ctx.onnx"
    if route == "session":
        err = tu.expect_error(tu.generate_context, str(ctx), dev, embed=0, file_path=str(again))
    else:
        err = tu.expect_error(tu.compile_model, str(ctx), dev, embed=True, output=again)
    tu.assert_error(err, C.InvalidGraph, "already holds kiln EPContext node")
    assert not again.exists()
    assert tu.files_in(tmp_path) == ["split.onnx", "split_ctx.onnx", "split_kiln.bin"]


def test_regenerating_overwrites_the_binary_atomically(models, kiln_virtual, tmp_path):
    dev = kiln_virtual["host"]
    src = copy_model(models, "add_mul_relu", tmp_path)
    tu.generate_context(src, dev, embed=0)
    first = (tmp_path / "add_mul_relu_kiln.bin").read_bytes()
    (tmp_path / "add_mul_relu_ctx.onnx").unlink()
    tu.generate_context(src, dev, embed=0)
    assert (tmp_path / "add_mul_relu_kiln.bin").read_bytes() == first, "generation is deterministic"
    no_temp_files(tmp_path)


# --------------------------------------------------------------------------
# sizes and layout: weights live in the binary, not the model
# --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def weighty(tmp_path_factory):
    folder = tmp_path_factory.mktemp("weighty")
    return tu.make_weighty_model(str(folder / "weighty.onnx"))


@pytest.mark.parametrize("route", ["session", "compile"])
def test_weights_move_from_model_to_binary(weighty, kiln_virtual, tmp_path, route):
    dev = kiln_virtual["host"]
    src = str(tmp_path / "weighty.onnx")
    shutil.copy(weighty["path"], src)
    out = tmp_path / "weighty_ctx.onnx"
    if route == "session":
        tu.generate_context(src, dev, embed=0)
    else:
        tu.compile_model(src, dev, embed=False, output=out)
    w = weighty["W"]
    orig_size = os.path.getsize(src)
    ctx_size = os.path.getsize(out)
    bin_path = tmp_path / "weighty_kiln.bin"
    data = bin_path.read_bytes()
    m = tu.load_model_proto(out)
    # only the CPU EP's initializer (Einsum's operand) stays in the model
    assert [i.name for i in m.graph.initializer] == ["E"]
    assert orig_size > w.nbytes
    assert ctx_size < 16 * 1024 + weighty["E"].nbytes, f"compiled model is {ctx_size} bytes"
    # W is used by both partitions but stored once
    assert len(tu.ep_context_nodes(m)) == 2
    assert weighty["weight_bytes"] <= len(data) < w.nbytes * 2, len(data)
    h, info = tu.parse_ctx_binary(data)
    assert h.magic == tu.CTX_MAGIC and h.version == tu.CONTEXT_FORMAT and h.header_size == 64
    assert h.metadata_offset == 64
    assert h.data_offset % 64 == 0 and h.data_offset == (64 + h.metadata_length + 63) // 64 * 64
    assert len(data) == h.data_offset + h.data_length
    assert data[64 + h.metadata_length:h.data_offset] == b"\0" * (h.data_offset - 64 - h.metadata_length)
    assert info["target"] == host_target(kiln_virtual) and info["kiln_version"] == kiln.__version__
    assert len(info["graphs"]) == 2
    by_shape = {tuple(x.shape): x for x in info["weights"]}
    assert set(by_shape) == {tuple(w.shape), tuple(weighty["Bias"].shape)}, info["weights"]
    for x in info["weights"]:
        assert x.offset % 64 == 0 and (h.data_offset + x.offset) % 64 == 0
        assert x.dtype == 1 and x.byte_length == 4 * int(np.prod(x.shape))
    ww = by_shape[tuple(w.shape)]
    start = h.data_offset + ww.offset
    assert data[start:start + ww.byte_length] == w.tobytes(), "W's bytes are in the binary"
    bb = by_shape[tuple(weighty["Bias"].shape)]
    start = h.data_offset + bb.offset
    assert data[start:start + bb.byte_length] == weighty["Bias"].tobytes()
    check_loaded_run(str(out), src, dev, expect_graphs=2, expect_files=1)


def test_embed1_weights_are_in_the_payload(weighty, kiln_virtual, tmp_path):
    dev = kiln_virtual["host"]
    data = tu.compile_model(weighty["path"], dev, embed=True, to="bytes")
    m = tu.load_model_proto(data)
    assert [i.name for i in m.graph.initializer] == ["E"]
    payloads = [tu.attrs_of(n)["ep_cache_context"] for n in tu.ep_context_nodes(m)]
    assert len(payloads) == 2
    # each node is self-contained, so W is in both payloads
    for p in payloads:
        assert p.startswith(tu.CTX_MAGIC) and len(p) >= weighty["W"].nbytes
        assert weighty["W"].tobytes() in p
    assert len(data) < 2 * weighty["W"].nbytes + 64 * 1024
    check_loaded_run(data, weighty["path"], dev, expect_graphs=2, expect_files=0)
