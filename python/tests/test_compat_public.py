"""kiln's compatibility verdicts through ORT's public Python queries only (issue #10):
``get_compatibility_info_from_model(path, ep_name)`` reads the string ORT stored in a
compiled model, ``get_model_compatibility_for_ep_devices(devices, info)`` asks kiln about
it. (ORT 1.31.1 exposes both in ``onnxruntime.capi.onnxruntime_pybind11_state``, not at
the top level of ``onnxruntime``.)

Models are compiled on every target's device (kiln registered under a ``.virtual`` name:
the host device plus one virtual device per other target), and their strings, and
tampered copies written into the model file, are judged on every device. Expected
answers follow the README's rules ("Compatibility and cross-compiling"), written here
independently of kiln's code:

* not kiln's / does not parse / a format other than 1 or 2: UNSUPPORTED;
* compiled for a target above the device's: UNSUPPORTED;
* a target below the device's, format 1 (read, but older than the 2 kiln writes), or an
  older kiln: PREFER_RECOMPILATION;
* otherwise OPTIMAL.
"""
from __future__ import annotations

import os
import shutil

import onnx
import pytest
from onnxruntime.capi import onnxruntime_pybind11_state as C

import onnxruntime_ep_kiln as kiln
import kiln_testutil as tu

V = C.OrtCompiledModelCompatibility
OPTIMAL = V.EP_SUPPORTED_OPTIMAL
PREFER = V.EP_SUPPORTED_PREFER_RECOMPILATION
UNSUPPORTED = V.EP_UNSUPPORTED
TARGETS = kiln.TARGETS  # best first
RANK = {t: len(TARGETS) - i for i, t in enumerate(TARGETS)}  # higher = better


def expected(compiled_target, device_target, version=kiln.__version__, fmt=str(tu.CONTEXT_FORMAT)):
    if RANK[compiled_target] > RANK[device_target]:
        return UNSUPPORTED
    if RANK[compiled_target] < RANK[device_target] or older(version) or int(fmt) < tu.CONTEXT_FORMAT:
        return PREFER
    return OPTIMAL


def older(version):
    # only the versions used below: 0.0.x and pre-releases of ours are older
    return version.startswith("0.0.") or version.startswith(kiln.__version__ + "-")


@pytest.fixture(scope="module")
def devices(kiln_virtual):
    """target -> kiln device whose best target it is (the host's own is the host device)."""
    out = {t: kiln_virtual[t] for t in TARGETS}
    assert {kiln.device_target(d) for d in out.values()} == set(TARGETS)
    assert not kiln.is_virtual(out[tu.host_target()])
    assert all(kiln.is_virtual(d) for t, d in out.items() if t != tu.host_target())
    return out


@pytest.fixture(scope="module")
def compiled(models, devices, tmp_path_factory):
    """target -> a model compiled by kiln on that target's device (compile API, embed 0)."""
    out = {}
    for t, dev in devices.items():
        folder = tmp_path_factory.mktemp(t)
        src = folder / "m.onnx"
        shutil.copy(models["add_mul_relu"], src)
        path = folder / "m_ctx.onnx"
        tu.compile_model(str(src), dev, embed=False, output=str(path))
        out[t] = str(path)
    return out


def info_of(path):
    return C.get_compatibility_info_from_model(str(path), kiln.EP_NAME)


def verdict(devs, info):
    return C.get_model_compatibility_for_ep_devices(list(devs), info)


@pytest.mark.parametrize("target", TARGETS)
def test_ort_reads_kiln_string_from_each_compiled_model(compiled, target):
    path = compiled[target]
    want = f"kiln;format={tu.CONTEXT_FORMAT};version={kiln.__version__};target={target}"
    assert info_of(path) == want
    with open(path, "rb") as f:
        assert C.get_compatibility_info_from_model_bytes(f.read(), kiln.EP_NAME) == want
    assert C.get_compatibility_info_from_model(path, "CPUExecutionProvider") is None


@pytest.mark.parametrize("target", TARGETS)
def test_verdict_of_each_compiled_model_on_each_device(compiled, devices, target):
    info = info_of(compiled[target])
    got = {d: verdict([dev], info) for d, dev in devices.items()}
    assert got == {d: expected(target, d) for d in devices}
    assert got[target] == OPTIMAL, "kiln's own string on a matching device"
    # all kiln devices at once: the best answer over them
    assert verdict(devices.values(), info) == OPTIMAL


# --------------------------------------------------------------------------
# tampered strings, written into the compiled model and read back by ORT
# --------------------------------------------------------------------------
def good(target, version=kiln.__version__, fmt=str(tu.CONTEXT_FORMAT)):
    return f"kiln;format={fmt};version={version};target={target}"


G = "x86_64-generic"
MIB = 1 << 20
# (id, string, compiled target for the rules or None if never supported, version)
TAMPERED = [
    ("format-0", good(G, fmt="0"), None),
    ("format-next", good(G, fmt=str(tu.CONTEXT_FORMAT + 1)), None),
    ("format-99", good(G, fmt="99"), None),
    ("format-u32-overflow", good(G, fmt="4294967296"), None),
    ("format-negative", good(G, fmt="-1"), None),
    ("format-empty", good(G, fmt=""), None),
    ("format-twice", good(G) + f";format={tu.CONTEXT_FORMAT}", None),
    ("no-format", f"kiln;version={kiln.__version__};target={G}", None),
    ("target-unknown", good("arm64-neon"), None),
    ("target-empty", good(""), None),
    ("no-target", f"kiln;format={tu.CONTEXT_FORMAT};version={kiln.__version__}", None),
    ("version-garbage", good(G, version="one"), None),
    ("other-ep", "other;format=1;version=0.1.0;target=x86_64-generic", None),
    ("not-key-value", "kiln;format=1;version=0.1.0;target=x86_64-generic;oops", None),
    ("garbage", "\u2603 not a compatibility string \u00ff", None),
    ("separators-only", ";;;;", None),
    ("empty", "", None),
    ("huge-garbage", "kiln;" + "x" * MIB, None),
    ("huge-format", good(G, fmt="9" * 4096), None),
    # still kiln's and readable: the rules apply to its target / version
    ("huge-unknown-field", good(G) + ";padding=" + "p" * MIB, G),
    ("fields-reordered", f"kiln;target={G};version={kiln.__version__};format={tu.CONTEXT_FORMAT}", G),
    ("format-1-older", good(G, fmt="1"), G),
    ("format-2-older", good(G, fmt="2"), G),
    ("older-kiln", good(G, version="0.0.9"), G),
    ("our-pre-release", good(G, version=kiln.__version__ + "-rc.1"), G),
    ("newer-kiln", good(G, version="9.0.0"), G),
    ("leading-spaces", "  " + good("x86_64-avx2"), "x86_64-avx2"),
    ("target-other-case", good("X86_64-Generic"), G),  # target names are case-insensitive
]


@pytest.fixture(scope="module")
def tampered_dir(compiled, tmp_path_factory):
    """A copy of the host-compiled model's folder, in which tampered copies are written."""
    src = os.path.dirname(compiled[tu.host_target()])
    dst = tmp_path_factory.mktemp("tampered")
    for f in os.listdir(src):
        shutil.copy(os.path.join(src, f), dst / f)
    return dst


def with_info(folder, name, info):
    m = onnx.load(str(folder / "m_ctx.onnx"))
    (prop,) = [p for p in m.metadata_props if p.key == tu.COMPAT_KEY]
    prop.value = info
    path = folder / f"{name}_ctx.onnx"
    onnx.save(m, str(path))
    return path


@pytest.mark.parametrize("name,info,target", TAMPERED, ids=[t[0] for t in TAMPERED])
def test_tampered_string_in_a_model(devices, tampered_dir, name, info, target):
    path = with_info(tampered_dir, name, info)
    assert info_of(path) == info, "ORT hands kiln the string stored in the model"
    got = {d: verdict([dev], info) for d, dev in devices.items()}
    if target is None:
        want = {d: UNSUPPORTED for d in devices}
    else:
        version = info.split("version=", 1)[1].split(";", 1)[0]
        fmt = info.split("format=", 1)[1].split(";", 1)[0]
        want = {d: expected(target, d, version, fmt) for d in devices}
    assert got == want
    assert verdict(devices.values(), info) == (UNSUPPORTED if target is None else
                                                max(want.values(), key=[UNSUPPORTED, PREFER, OPTIMAL].index))
