"""``inspect()``: what a compiled (EPContext) model holds and whether this machine can run it.

The EPContext nodes and their attributes come from the ONNX model (the ``onnx``
package, imported when called); every context binary they name (a
``<model>_kiln.bin`` file or the bytes embedded in a node) is read by kiln's own
reader through the library's ``kiln_ep_inspect_context`` export, which checks
the checksum and everything else a session would, and says what this machine's
kiln thinks of the binary's target and format. ONNX Runtime's own answer comes
from ``get_model_compatibility_for_ep_devices`` on the compatibility string ORT
stored in the model, when ONNX Runtime is installed.
"""
from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional

import onnxruntime_ep_kiln as kiln
from . import _native
from ._ort import onnx as _onnx, ort as _ort

EPCONTEXT_OP = "EPContext"
_STAMP = re.compile(r"binary checksum ([0-9a-f]{32})")
_ORT_VERDICTS = {
    "EP_SUPPORTED_OPTIMAL": "optimal",
    "EP_SUPPORTED_PREFER_RECOMPILATION": "prefer_recompilation",
    "EP_UNSUPPORTED": "unsupported",
    "EP_NOT_APPLICABLE": "not_applicable",
}


@dataclass
class ContextNode:
    """One ``EPContext`` node of the model, its attributes as written."""

    name: str
    source: str
    partition_name: str
    embed_mode: int
    main_context: int
    #: The binary's file name (embed mode 0), or ``<N bytes embedded>``.
    ep_cache_context: str
    hardware_architecture: str
    ep_sdk_version: str
    onnx_model_filename: str
    notes: str
    max_size: Optional[int]
    inputs: List[str]
    outputs: List[str]
    #: The binary checksum kiln stamped into ``notes`` when it wrote the node (hex), if any.
    checksum_stamp: Optional[str]

    @property
    def is_kiln(self) -> bool:
        return self.source.lower() in (kiln.EP_NAME.lower(), "kiln")


@dataclass
class ContextBinaryReport:
    """A context binary named by the model, as kiln's reader sees it."""

    #: The file's path, or ``embedded in node '<name>'``.
    location: str
    embedded: bool
    #: The nodes whose ``ep_cache_context`` it is.
    nodes: List[str]
    #: kiln_ep_inspect_context's description (docs/context-format.md, "Inspecting a binary").
    info: Dict[str, Any]
    #: Whether the checksum stamped in the node's notes is this binary's (None: no stamp).
    stamp_ok: Optional[bool] = None

    @property
    def valid(self) -> bool:
        return bool(self.info.get("valid"))

    @property
    def graph_names(self) -> List[str]:
        return [g["name"] for g in self.info.get("graphs", [])]


@dataclass
class ContextReport:
    """What :func:`inspect` found; ``to_dict()`` is the JSON ``kiln inspect --json`` prints."""

    model: str
    model_bytes: int
    nodes: List[ContextNode] = field(default_factory=list)
    #: Nodes of the model that are not EPContext nodes (they run on other EPs).
    other_nodes: int = 0
    binaries: List[ContextBinaryReport] = field(default_factory=list)
    #: Targets the binaries were compiled for.
    targets: List[str] = field(default_factory=list)
    #: This machine's best target as kiln sees it (``KILN_MAX_TARGET`` caps it).
    host_target: Optional[str] = None
    #: The compatibility string ONNX Runtime stored in the model (None: none, or ORT missing).
    compatibility_info: Optional[str] = None
    #: kiln's verdict for this machine: optimal, prefer_recompilation or unsupported, and why.
    kiln_verdict: Optional[str] = None
    kiln_reason: Optional[str] = None
    #: ONNX Runtime's answer (get_model_compatibility_for_ep_devices on kiln's host device).
    ort_verdict: Optional[str] = None
    ort_note: Optional[str] = None
    #: Everything that stops this model from loading here, one line each.
    problems: List[str] = field(default_factory=list)

    @property
    def checksums_ok(self) -> bool:
        """Every binary's contents match its header checksum (and the nodes' stamps)."""
        return bool(self.binaries) and all(
            b.info.get("checksum_ok") is True and b.stamp_ok is not False for b in self.binaries)

    @property
    def can_run_here(self) -> bool:
        """kiln on this machine can load every kiln node of the model."""
        return bool(self.binaries) and not self.problems

    def to_dict(self) -> Dict[str, Any]:
        d = asdict(self)
        d["checksums_ok"] = self.checksums_ok
        d["can_run_here"] = self.can_run_here
        return d

    def summary(self) -> str:
        """A readable report (what ``kiln inspect`` prints)."""
        kiln_nodes = [n for n in self.nodes if n.is_kiln]
        lines = [f"{self.model} ({self.model_bytes:,} bytes): {len(kiln_nodes)} kiln EPContext node(s), "
                 f"{len(self.nodes) - len(kiln_nodes)} other EPContext node(s), {self.other_nodes} other node(s)"]
        for n in self.nodes:
            lines.append(f"  node {n.name!r}: source {n.source}, partition {n.partition_name!r}, "
                         f"embed_mode {n.embed_mode}, main_context {n.main_context}, "
                         f"ep_cache_context {n.ep_cache_context}, target {n.hardware_architecture or '?'}")
            lines.append(f"    {len(n.inputs)} input(s), {len(n.outputs)} output(s); max_size {n.max_size}; "
                         f"{n.ep_sdk_version}")
        for b in self.binaries:
            i = b.info
            lines.append(f"binary {b.location}: {i.get('file_bytes', 0):,} bytes, format {i.get('format_version')}, "
                         f"written by kiln {i.get('kiln_version')}, target {i.get('target')}")
            checksum = {True: "OK", False: "MISMATCH", None: "not checkable"}[i.get("checksum_ok")]
            stamp = {True: "; matches the node's stamp", False: "; NOT the one the node recorded",
                     None: ""}[b.stamp_ok]
            lines.append(f"  checksum {i.get('checksum')}: {checksum}{stamp}")
            if i.get("valid"):
                lines.append(f"  {len(i.get('graphs', []))} graph(s), {i.get('weights')} weight(s) of "
                             f"{i.get('weight_bytes'):,} bytes")
                for g in i.get("graphs", []):
                    lines.append(f"    {g['name']} ({g['kind']}): {g['description']}")
            else:
                lines.append(f"  INVALID: {i.get('error')}")
        if self.host_target:
            lines.append(f"this machine: kiln target {self.host_target}")
        if self.kiln_verdict:
            lines.append(f"kiln says: {self.kiln_verdict} ({self.kiln_reason})")
        ort_line = f"ONNX Runtime's compatibility check: {self.ort_verdict}"
        if self.compatibility_info:
            ort_line += f" for '{self.compatibility_info}'"
        if self.ort_note:
            ort_line += f" ({self.ort_note})"
        lines.append(ort_line)
        if self.problems:
            lines.append("cannot run here:")
            lines.extend(f"  - {p}" for p in self.problems)
        else:
            lines.append("runs here: yes")
        return "\n".join(lines)


def _attrs(node) -> Dict[str, Any]:
    onnx = _onnx()
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _text(value) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return "" if value is None else str(value)


def _read_nodes(graph, embedded: Dict[str, bytes]) -> List[ContextNode]:
    nodes = []
    for node in graph.node:
        if node.op_type != EPCONTEXT_OP:
            continue
        a = _attrs(node)
        embed = int(a.get("embed_mode", 1))
        payload = a.get("ep_cache_context", b"")
        if embed == 1:
            embedded[node.name] = payload if isinstance(payload, bytes) else str(payload).encode()
            cache = f"<{len(embedded[node.name]):,} bytes embedded>"
        else:
            cache = _text(payload)
        notes = _text(a.get("notes"))
        stamp = _STAMP.search(notes)
        nodes.append(ContextNode(
            name=node.name, source=_text(a.get("source")), partition_name=_text(a.get("partition_name")),
            embed_mode=embed, main_context=int(a.get("main_context", 1)), ep_cache_context=cache,
            hardware_architecture=_text(a.get("hardware_architecture")),
            ep_sdk_version=_text(a.get("ep_sdk_version")), onnx_model_filename=_text(a.get("onnx_model_filename")),
            notes=notes, max_size=int(a["max_size"]) if "max_size" in a else None,
            inputs=list(node.input), outputs=list(node.output),
            checksum_stamp=stamp.group(1) if stamp else None))
    return nodes


def _binaries(model_dir: str, nodes: List[ContextNode], embedded: Dict[str, bytes],
              library: str) -> List[ContextBinaryReport]:
    out: Dict[str, ContextBinaryReport] = {}
    for n in nodes:
        if not n.is_kiln or n.main_context != 1:
            continue
        if n.embed_mode == 1:
            rep = ContextBinaryReport(f"embedded in node '{n.name}'", True, [n.name],
                                      _native.inspect_context(library, data=embedded[n.name]))
            out[rep.location] = rep
        else:
            path = os.path.join(model_dir, n.ep_cache_context)
            if path not in out:
                out[path] = ContextBinaryReport(path, False, [], _native.inspect_context(library, file=path))
            rep = out[path]
            rep.nodes.append(n.name)
        if n.checksum_stamp is not None and rep.info.get("checksum") is not None:
            ok = n.checksum_stamp == rep.info["checksum"]
            rep.stamp_ok = ok if rep.stamp_ok is None else (rep.stamp_ok and ok)
    return list(out.values())


def _problems(report: ContextReport) -> List[str]:
    problems = []
    kiln_nodes = [n for n in report.nodes if n.is_kiln]
    if not kiln_nodes:
        problems.append("the model has no kiln EPContext node (not compiled by kiln)")
    known = set()
    for b in report.binaries:
        if not b.valid:
            problems.append(f"binary {b.location} is not loadable: {b.info.get('error')}")
        if b.stamp_ok is False:
            problems.append(f"binary {b.location} is not the one the model was compiled with "
                            "(its checksum differs from the node's notes): another compile replaced it")
        known.update(b.graph_names)
    for n in kiln_nodes:
        if n.partition_name not in known and all(b.valid for b in report.binaries):
            problems.append(f"node '{n.name}': no binary holds its graph '{n.partition_name}'")
    if report.kiln_verdict == "unsupported" and all(b.valid for b in report.binaries):
        problems.append(f"kiln on this machine: {report.kiln_reason}")
    return problems


def _ort_verdict(path: str, report: ContextReport) -> None:
    """ORT's stored compatibility string and its verdict on kiln's host device."""
    try:
        ort = _ort()
    except ImportError as exc:
        report.ort_note = str(exc)
        return
    from onnxruntime.capi import onnxruntime_pybind11_state as C

    get_info = getattr(C, "get_compatibility_info_from_model", None)
    check = getattr(C, "get_model_compatibility_for_ep_devices", None)
    if get_info is None or check is None:
        report.ort_note = f"ONNX Runtime {ort.__version__} has no compatibility queries"
        return
    report.compatibility_info = get_info(path, kiln.EP_NAME)
    if report.compatibility_info is None:
        report.ort_note = "the model carries no kiln compatibility string"
        return
    registered = None
    try:
        if not kiln.devices(virtual=False):
            registered = kiln.register()
        host = kiln.devices(virtual=False)
        verdict = check(host[:1], report.compatibility_info)
        report.ort_verdict = _ORT_VERDICTS.get(str(verdict).rsplit(".", 1)[-1], str(verdict))
    except Exception as exc:  # noqa: BLE001 - report, do not fail the inspection
        report.ort_note = f"the query failed: {' '.join(str(exc).split())}"
    finally:
        if registered is not None:
            kiln.unregister(registered)


def inspect(ctx_model: "os.PathLike[str] | str", *, query_ort: bool = True) -> ContextReport:
    """Describe a compiled model (``*_ctx.onnx``): its EPContext nodes and attributes,
    the context binaries they name (sizes, targets, graphs, weights, checksum
    status from kiln's own reader), what this machine's kiln says of it and
    (``query_ort``, when ONNX Runtime is installed) what ONNX Runtime's
    compatibility check answers. ``problems`` lists what would stop it loading here.

    Raises ``FileNotFoundError`` for a missing file, :class:`KilnError` for a file
    that is not an ONNX model, ``ImportError`` without the ``onnx`` package.
    """
    path = os.fspath(ctx_model)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"compiled model '{path}' does not exist")
    onnx = _onnx()
    try:
        model = onnx.load(path, load_external_data=False)
    except Exception as exc:  # noqa: BLE001 - any parse failure means "not ONNX"
        raise kiln.KilnError(f"'{path}' is not an ONNX model ({' '.join(str(exc).split())})") from None
    if not model.graph.node and not model.graph.input and not model.opset_import:
        raise kiln.KilnError(f"'{path}' is not an ONNX model (it holds no graph)")
    embedded: Dict[str, bytes] = {}
    report = ContextReport(model=path, model_bytes=os.path.getsize(path))
    report.nodes = _read_nodes(model.graph, embedded)
    report.other_nodes = len(model.graph.node) - len(report.nodes)
    library = kiln._library_in_use()
    report.binaries = _binaries(os.path.dirname(os.path.abspath(path)), report.nodes, embedded, library)
    report.targets = sorted({b.info["target"] for b in report.binaries if b.info.get("target")})
    verdicts = [(b.info.get("host_verdict"), b.info.get("host_reason")) for b in report.binaries]
    report.host_target = next((b.info.get("host_target") for b in report.binaries), None)
    if verdicts:
        order = ["unsupported", "prefer_recompilation", "optimal"]
        report.kiln_verdict, report.kiln_reason = min(
            verdicts, key=lambda v: order.index(v[0]) if v[0] in order else 0)
    if query_ort:
        _ort_verdict(path, report)
    report.problems = _problems(report)
    return report
