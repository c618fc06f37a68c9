"""The onnxruntime-ep-kiln wheel and its Python API, installed into a fresh virtualenv
(``installed`` fixture, ``wheel_env.py``): what the wheel holds and its tag, that it
works without the repository and without ONNX Runtime installed, and every API
function (get_library_path, get_ep_names, register, devices, session_options,
check_options, compile, inspect) as a user calls it, in subprocesses."""
from __future__ import annotations

import json
import os
import zipfile

import pytest

import kiln_testutil as tu
import wheel_env

TARGETS = ("x86_64-avx512", "x86_64-avx2", "x86_64-generic")


def py(installed, code: str, **kwargs):
    """Run ``code`` in the venv; return what it printed last as JSON, or fail with its output."""
    p = installed.python_code(code, **kwargs)
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(p.stdout.strip().splitlines()[-1])


# --------------------------------------------------------------------------
# the wheel itself
# --------------------------------------------------------------------------
def test_wheel_name_and_tag(installed):
    name = os.path.basename(installed.wheel)
    assert name == "onnxruntime_ep_kiln-0.1.0-py3-none-linux_x86_64.whl"
    with zipfile.ZipFile(installed.wheel) as z:
        wheel_meta = z.read("onnxruntime_ep_kiln-0.1.0.dist-info/WHEEL").decode()
    assert "Root-Is-Purelib: false" in wheel_meta
    assert "Tag: py3-none-linux_x86_64" in wheel_meta


def test_wheel_holds_kiln_library_and_no_ort(installed):
    with zipfile.ZipFile(installed.wheel) as z:
        names = z.namelist()
        lib = z.read("onnxruntime_ep_kiln/libkiln_ep.so")
    assert "onnxruntime_ep_kiln/libkiln_ep.so" in names
    assert lib[:4] == b"\x7fELF"
    assert b"CreateEpFactories" in lib and b"kiln_ep_inspect_context" in lib
    assert not [n for n in names if "onnxruntime.so" in n or n.startswith("onnxruntime/")], names
    for module in ("__init__", "cli", "compiler", "inspection", "share", "benchmark", "demo"):
        assert f"onnxruntime_ep_kiln/{module}.py" in names
    # the copy is stripped of the release profile's line tables, but still exports kiln's symbols
    assert len(lib) < 0.5 * os.path.getsize(os.path.join(wheel_env.REPO_DIR, "target", "release", "libkiln_ep.so"))


def test_wheel_metadata_does_not_require_onnxruntime(installed):
    with zipfile.ZipFile(installed.wheel) as z:
        meta = z.read("onnxruntime_ep_kiln-0.1.0.dist-info/METADATA").decode()
        entry_points = z.read("onnxruntime_ep_kiln-0.1.0.dist-info/entry_points.txt").decode()
    assert "Name: onnxruntime-ep-kiln" in meta
    requires = [line.split(":", 1)[1].strip() for line in meta.splitlines() if line.startswith("Requires-Dist:")]
    unconditional = [r for r in requires if "extra ==" not in r]
    assert unconditional == ["numpy"], requires
    assert 'onnxruntime==1.31.1; extra == "ort"' in requires
    assert "kiln = onnxruntime_ep_kiln.cli:main" in entry_points
    assert "kiln-share-ctx-gen = onnxruntime_ep_kiln.share:main" in entry_points


def test_installed_package_and_library_come_from_the_venv(installed):
    out = py(installed, "import json, onnxruntime_ep_kiln as k; "
                        "print(json.dumps([k.__file__, k.get_library_path(), k.get_ep_names()]))")
    pkg_file, lib, names = out
    assert pkg_file.startswith(installed.site), pkg_file
    assert lib == os.path.join(installed.site, "onnxruntime_ep_kiln", "libkiln_ep.so")
    assert names == ["KilnExecutionProvider"]
    assert not lib.startswith(wheel_env.REPO_DIR)


# --------------------------------------------------------------------------
# without ONNX Runtime
# --------------------------------------------------------------------------
def test_import_and_library_path_work_without_onnxruntime(installed):
    out = py(installed, "import json, importlib.util as u, onnxruntime_ep_kiln as k; "
                        "print(json.dumps([u.find_spec('onnxruntime') is None, k.get_library_path(), "
                        "k.get_ep_names()]))", no_ort=True)
    assert out[0] is True, "the no-ORT venv must not see onnxruntime"
    assert out[1].endswith("libkiln_ep.so") and out[2] == ["KilnExecutionProvider"]


def test_helpers_needing_onnxruntime_say_how_to_install_it(installed):
    code = ("import json, onnxruntime_ep_kiln as k\n"
            "out = []\n"
            "for f in (k.register, k.devices, lambda: k.session_options({}), lambda: k.compile('m.onnx')):\n"
            "    try:\n"
            "        f()\n"
            "    except ImportError as e:\n"
            "        out.append([type(e).__name__, str(e)])\n"
            "print(json.dumps(out))")
    out = py(installed, code, no_ort=True)
    assert len(out) == 4, out
    for name, message in out:
        assert name == "OrtMissingError"
        assert "pip install 'onnxruntime-ep-kiln[ort]'" in message and "onnxruntime==1.31.1" in message


# --------------------------------------------------------------------------
# register / devices
# --------------------------------------------------------------------------
def test_register_and_devices(installed):
    code = """
import json, onnxruntime_ep_kiln as k
out = {}
out["before"] = len(k.devices(virtual=None))
out["name"] = k.register()
out["again"] = k.register()
out["host"] = [k.device_target(d) for d in k.devices()]
out["virtual_none"] = len(k.devices(virtual=True))
k.unregister("kiln")
out["vname"] = k.register(virtual=True)
out["all"] = [[k.device_target(d), k.is_virtual(d)] for d in k.devices(virtual=None)]
out["virtual"] = sorted(k.device_target(d) for d in k.devices(virtual=True))
out["generic"] = [k.device_target(d) for d in k.devices(virtual=None, target="x86_64-generic")]
try:
    k.devices(target="arm64")
except k.KilnOptionError as e:
    out["bad_target"] = str(e)
print(json.dumps(out))
"""
    out = py(installed, code)
    assert out["before"] == 0
    assert out["name"] == out["again"] == "kiln"
    assert len(out["host"]) == 1 and out["host"][0] in TARGETS
    assert out["virtual_none"] == 0
    assert out["vname"] == "kiln.virtual"
    assert out["all"][0] == [out["host"][0], False], "host device first"
    assert sorted(t for t, _ in out["all"]) == sorted(TARGETS)
    assert out["virtual"] == sorted(set(TARGETS) - {out["host"][0]})
    assert out["generic"] == ["x86_64-generic"]
    assert "unknown target 'arm64'" in out["bad_target"]


def test_the_0_1_0_signatures_still_work(installed):
    """register(name, library_path) and devices(name_suffix) as 0.1.0 had them."""
    code = """
import json, onnxruntime_ep_kiln as k
name = k.register("kiln_old", k.get_library_path())
print(json.dumps([name, len(k.devices("")), len(k.devices("_nope")), len(k.kiln_devices())]))
"""
    assert py(installed, code) == ["kiln_old", 1, 0, 1]


# --------------------------------------------------------------------------
# session_options / check_options
# --------------------------------------------------------------------------
def test_session_options_validates_before_ort(installed):
    code = """
import json, onnxruntime_ep_kiln as k
out = []
for opts, cfg in [({"target": "arm64"}, None), ({"no_such": "1"}, None), ({"shape_cache": "0"}, None),
                  ({"disabled_ops": "NotAnOp"}, None), ({"claim": 1}, None), ({}, {"ep.context_enable": "yes"})]:
    try:
        k.session_options(opts, config=cfg)
        out.append(None)
    except k.KilnOptionError as e:
        out.append([isinstance(e, ValueError), str(e)])
print(json.dumps(out))
"""
    out = py(installed, code)
    assert all(o is not None and o[0] for o in out), out
    msgs = [o[1] for o in out]
    assert "invalid value 'arm64' for kiln option 'target'" in msgs[0] and "x86_64-generic" in msgs[0]
    assert "unknown kiln option 'no_such'" in msgs[1] and "shape_cache" in msgs[1]
    assert "'shape_cache'" in msgs[2] and "1 to 1024" in msgs[2]
    assert "'NotAnOp'" in msgs[3]
    assert "must be strings" in msgs[4]
    assert "ep.context_enable" in msgs[5] and "0, 1" in msgs[5]


def test_session_options_runs_a_model_on_kiln(installed):
    model = os.path.join(wheel_env.REPO_DIR, "models", "demo.onnx")
    code = f"""
import json, numpy as np, onnxruntime as ort, onnxruntime_ep_kiln as k
so = k.session_options({{"disabled_ops": "Tanh"}})
sess = ort.InferenceSession({model!r}, so, enable_fallback=0)
x = np.random.default_rng(0).standard_normal((1, 32, 128)).astype(np.float32)
y = sess.run(None, {{"x": x}})[0]
ref = ort.InferenceSession({model!r}, providers=["CPUExecutionProvider"]).run(None, {{"x": x}})[0]
print(json.dumps([sess.get_providers()[0], float(np.abs(y - ref).max()), k.stats()["compute_calls"]]))
"""
    provider, diff, calls = py(installed, code)
    assert provider == "KilnExecutionProvider"
    assert diff < 1e-4
    assert calls >= 1, "kiln ran the model"


# --------------------------------------------------------------------------
# compile / inspect
# --------------------------------------------------------------------------
@pytest.fixture
def demo_copy(installed, tmp_path):
    import shutil

    src = tmp_path / "demo.onnx"
    shutil.copy(os.path.join(wheel_env.REPO_DIR, "models", "demo.onnx"), src)
    return src


def test_compile_then_inspect_then_load(installed, demo_copy):
    code = f"""
import json, os, onnxruntime as ort, onnxruntime_ep_kiln as k
r = k.compile({str(demo_copy)!r})
rep = k.inspect(r.outputs[0])
sess = ort.InferenceSession(r.outputs[0], k.session_options(), enable_fallback=0)
d = rep.to_dict()
print(json.dumps({{"files": r.files, "sizes": [os.path.getsize(f) for f in r.files], "total": r.total_bytes,
    "partitions": [m.partitions for m in r.models], "target": r.target, "binaries": list(r.binaries),
    "ok": rep.can_run_here, "checksums": rep.checksums_ok, "nodes": len(rep.nodes),
    "stamp": rep.binaries[0].stamp_ok, "valid": rep.binaries[0].valid, "kiln": rep.kiln_verdict,
    "ort": rep.ort_verdict, "info": rep.compatibility_info, "targets": rep.targets,
    "graphs": rep.binaries[0].graph_names, "partition": rep.nodes[0].partition_name,
    "json_keys": sorted(d), "loaded": k.stats()["context_graphs_loaded"], "compiled": k.stats()["partitions_compiled"]}}))
"""
    out = py(installed, code)
    folder = str(demo_copy.parent)
    assert out["files"] == [os.path.join(folder, "demo_ctx.onnx"), os.path.join(folder, "demo_kiln.bin")]
    assert out["total"] == sum(out["sizes"])
    assert out["partitions"] == [1]
    assert out["ok"] and out["checksums"] and out["valid"] and out["stamp"] is True
    assert out["kiln"] == out["ort"] == "optimal"
    assert out["info"] == f"kiln;format={tu.CONTEXT_FORMAT};version=0.1.0;target={out['target']}"
    assert out["targets"] == [out["target"]]
    assert out["graphs"] == [out["partition"]]
    assert {"nodes", "binaries", "problems", "can_run_here", "checksums_ok"} <= set(out["json_keys"])
    assert out["loaded"] == 1 and out["compiled"] == 1, "the session loaded the compiled graph"
    assert sorted(os.listdir(folder)) == ["demo.onnx", "demo_ctx.onnx", "demo_kiln.bin"], "no temporary left"


def test_compile_embedded_for_another_target(installed, demo_copy, tmp_path):
    out_path = tmp_path / "out" / "e_ctx.onnx"
    out_path.parent.mkdir()
    code = f"""
import json, onnxruntime_ep_kiln as k
r = k.compile({str(demo_copy)!r}, {str(out_path)!r}, embed=True, target="x86_64-generic", prefix="p_")
rep = k.inspect(r.outputs[0])
print(json.dumps([r.files, r.target, rep.nodes[0].embed_mode, rep.binaries[0].embedded,
                  rep.binaries[0].info["target"], rep.nodes[0].partition_name, rep.can_run_here]))
"""
    files, target, embed_mode, embedded, bin_target, partition, ok = py(installed, code)
    assert files == [str(out_path)] and target == "x86_64-generic"
    assert embed_mode == 1 and embedded and bin_target == "x86_64-generic"
    assert partition.startswith("p_")
    assert ok, "x86_64-generic runs on every x86-64"
    assert os.listdir(out_path.parent) == ["e_ctx.onnx"]


def test_compile_share_group_reuses_the_share_flow(installed, tmp_path):
    import shutil

    for m in ("share_a", "share_b", "share_c"):
        shutil.copy(os.path.join(wheel_env.REPO_DIR, "models", f"{m}.onnx"), tmp_path / f"{m}.onnx")
    out = tmp_path / "out"
    out.mkdir()
    models = [str(tmp_path / f"{m}.onnx") for m in ("share_a", "share_b", "share_c")]
    code = f"""
import json, onnxruntime_ep_kiln as k
r = k.compile({models!r}, {str(out)!r}, share_group=True, options={{"claim": "all"}})
reps = [k.inspect(o) for o in r.outputs]
print(json.dumps([sorted(r.binaries), r.bytes_shared, [x.binaries[0].location for x in reps],
                  [x.can_run_here for x in reps], reps[0].binaries[0].graph_names]))
"""
    binaries, shared, locations, ok, graphs = py(installed, code)
    assert binaries == [str(out / "share_a_kiln.bin")]
    assert shared > 0, "identical weights stored once"
    assert locations == [str(out / "share_a_kiln.bin")] * 3
    assert all(ok)
    assert len(graphs) == 3 and [g.split("_Kiln")[0] for g in graphs] == ["share_a", "share_b", "share_c"]


def test_compile_errors_are_one_line_and_leave_nothing(installed, demo_copy, tmp_path):
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"this is not protobuf at all" * 3)
    unsupported = os.path.join(wheel_env.REPO_DIR, "models", "unsupported.onnx")
    code = f"""
import json, onnxruntime_ep_kiln as k
out = []
for args, kw in [(({str(tmp_path / 'missing.onnx')!r},), {{}}), (({str(garbage)!r},), {{}}),
                 (({unsupported!r}, {str(tmp_path / 'u_ctx.onnx')!r}), {{}}),
                 (({str(demo_copy)!r},), {{"options": {{"claim": "some"}}}}),
                 (({str(demo_copy)!r},), {{"embed": True, "share_group": True}})]:
    try:
        k.compile(*args, **kw)
        out.append(None)
    except k.KilnError as e:
        out.append([type(e).__name__, str(e)])
r = k.compile({str(demo_copy)!r})
try:
    k.compile({str(demo_copy)!r})
except k.KilnError as e:
    out.append([type(e).__name__, str(e)])
r2 = k.compile({str(demo_copy)!r}, force=True)
out.append(r2.files)
print(json.dumps(out))
"""
    out = py(installed, code)
    assert out[0] == ["KilnError", f"model '{tmp_path / 'missing.onnx'}' does not exist"]
    assert out[1][0] == "KilnError" and "is not an ONNX model" in out[1][1]
    assert out[2][0] == "KilnError" and "kiln compiled nothing from" in out[2][1]
    assert out[3][0] == "KilnOptionError" and "'some'" in out[3][1]
    assert out[4][0] == "KilnOptionError" and "embed=False" in out[4][1]
    assert out[5][0] == "KilnError" and "already exists" in out[5][1] and "force" in out[5][1]
    assert len(out[6]) == 2
    for o in out[:6]:
        assert "\n" not in o[1]
    assert sorted(os.listdir(tmp_path)) == ["demo.onnx", "demo_ctx.onnx", "demo_kiln.bin", "garbage.onnx"], \
        "failed compiles left files behind"


def test_inspect_reports_a_damaged_or_missing_binary(installed, demo_copy):
    code = f"""
import json, onnxruntime_ep_kiln as k
r = k.compile({str(demo_copy)!r})
bin_path = r.files[1]
data = bytearray(open(bin_path, "rb").read())
data[-1] ^= 0x5A
open(bin_path, "wb").write(bytes(data))
a = k.inspect(r.outputs[0])
import os
os.remove(bin_path)
b = k.inspect(r.outputs[0])
print(json.dumps([a.binaries[0].info["checksum_ok"], a.checksums_ok, a.can_run_here, a.problems,
                  b.binaries[0].valid, b.can_run_here, b.problems]))
"""
    checksum_ok, all_ok, can_run, problems, b_valid, b_run, b_problems = py(installed, code)
    assert checksum_ok is False and all_ok is False and can_run is False
    assert any("checksum mismatch" in p for p in problems), problems
    assert b_valid is False and b_run is False
    assert any("demo_kiln.bin" in p for p in b_problems), b_problems


def test_inspect_sees_what_the_capped_machine_cannot_run(installed, demo_copy):
    """Compiled for AVX2, inspected where kiln believes the CPU has SSE2 only: kiln and ORT both say unsupported."""
    code = f"""
import json, onnxruntime_ep_kiln as k
r = k.compile({str(demo_copy)!r}, target="x86_64-avx2")
print(json.dumps(r.outputs))
"""
    (ctx,) = py(installed, code)
    code = f"""
import json, onnxruntime_ep_kiln as k
rep = k.inspect({ctx!r})
print(json.dumps([rep.host_target, rep.kiln_verdict, rep.ort_verdict, rep.can_run_here, rep.problems]))
"""
    host, kiln_verdict, ort_verdict, ok, problems = py(installed, code, env={"KILN_MAX_TARGET": "x86_64-generic"})
    assert host == "x86_64-generic"
    assert kiln_verdict == ort_verdict == "unsupported"
    assert not ok and any("x86_64-avx2" in p for p in problems), problems
