"""kiln-share-ctx-gen: compile several models into EPContext models that share one weights binary.

kiln's counterpart of ONNX Runtime's ``ep_weight_sharing_ctx_gen``::

    kiln-share-ctx-gen model1.onnx model2.onnx ... --output-dir DIR
        [--embed-mode 0] [--target TARGET | --device-target TARGET]
        [--option key=value ...] [--config key=value ...] [--prefix-per-model]
        [--library PATH] [--verbose]

    python -m onnxruntime_ep_kiln.share ...        (the same, without installing)
    kiln compile model1.onnx model2.onnx ... --share -o DIR   (the same flow, in ``kiln``)

The models are compiled in the order given, as one *sharing group*, through
ONNX Runtime's compile API (``ort.ModelCompiler``) with the session entries
``ep.share_ep_contexts=1`` on every model and ``ep.stop_share_ep_contexts=1`` on
the last. For N models kiln writes N + 1 files into ``DIR``:

* ``DIR/<stem>_ctx.onnx`` for every model ``<stem>.onnx`` -- the compiled model,
  whose EPContext nodes name the shared binary;
* ``DIR/<first stem>_kiln.bin`` -- one context binary holding the compiled graphs
  of every model, each distinct weight (same shape and bytes) stored once. It is
  written (atomically) only when the last model has been compiled. "first" is
  the first model kiln compiled something from (normally model1).

Load the ``_ctx.onnx`` files like any kiln EPContext model; add the session entry
``ep.share_ep_contexts=1`` so that sessions of one process map the binary once
and share the weights in memory (without it, each session maps the file itself).

The tool prints every file it wrote with its size, and what sharing saved: the
weight bytes kiln did not store twice (kiln's ``context_bytes_deduplicated``
counter) and the models' own initializer bytes against the binary's size.

Options:

``--output-dir DIR``   where all files go (created if missing). Every model's
                       stem must be distinct (the outputs are ``<stem>_ctx.onnx``).
``--embed-mode 0``     the only mode that shares: mode 1 (weights inside each
                       model) is refused with an error.
``--target T``         compile for target T (``x86_64-avx512``, ``x86_64-avx2``,
                       ``x86_64-generic``). For a target other than the host's,
                       kiln is registered as ``kiln.virtual`` and its virtual
                       device of that target is used, so any target can be
                       compiled on any x86-64 host. Default: the host's target.
``--device-target T``  the same as ``--target`` (picks kiln's device by target).
``--option k=v``       a kiln EP option (``disabled_ops=Tanh``, ...); repeatable.
``--config k=v``       an extra session config entry; repeatable. The entries the
                       tool manages (``ep.share_ep_contexts``,
                       ``ep.stop_share_ep_contexts``, ``ep.context_enable``,
                       ``ep.context_embed_mode``, ``ep.context_file_path``) are
                       refused.
``--prefix-per-model`` set ``ep.context_node_name_prefix=<stem>_`` for every model,
                       so graphs never clash inside the shared binary.
``--library PATH``     ``libkiln_ep.so`` to use (default: ``KILN_EP_LIBRARY``, the
                       package's copy, or the checkout's ``target/release``).
``--verbose``          ONNX Runtime's and kiln's info logs on stderr.

Exit status 0 when all N + 1 files were written; otherwise a one-line
``kiln-share-ctx-gen: error: ...`` on stderr and status 1 (2 for bad command
lines). On failure, the ``_ctx.onnx`` files this run wrote are removed, and no
binary is written (kiln writes it only when the last model compiled), so a
failed run leaves no half-usable set behind.

Limitations: the last model must be one kiln compiles something from (the stop
entry is acted on when kiln compiles); otherwise the tool fails with a message
saying so. A sharing group is process-wide: use :func:`compile_group` from
Python only when no other group is being built in the same process.

From Python::

    from onnxruntime_ep_kiln import share
    report = share.compile_group(["a.onnx", "b.onnx"], "out", device=kiln_device)
    print(report.binary, report.binary_bytes, report.bytes_deduplicated)
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Sequence

import onnxruntime_ep_kiln as kiln
from onnxruntime_ep_kiln._ort import ort as _ort

PROG = "kiln-share-ctx-gen"

#: Session config entries the tool sets itself.
MANAGED_CONFIG = (
    "ep.share_ep_contexts",
    "ep.stop_share_ep_contexts",
    "ep.context_enable",
    "ep.context_embed_mode",
    "ep.context_file_path",
)


class ShareError(Exception):
    """A failure worth a one-line message."""


# --------------------------------------------------------------------------
# kiln's counters
# --------------------------------------------------------------------------
def stats(library_path: Optional[str] = None) -> Dict[str, int]:
    """kiln's counters (:func:`onnxruntime_ep_kiln.stats`), every field."""
    return kiln.stats(library_path)


# --------------------------------------------------------------------------
# the group
# --------------------------------------------------------------------------
@dataclass
class ModelResult:
    model: str
    output: str
    output_bytes: int
    partitions: int
    initializer_bytes: Optional[int]
    #: ONNX nodes kiln compiled from this model.
    nodes: int = 0


@dataclass
class Report:
    output_dir: str
    target: str
    models: List[ModelResult] = field(default_factory=list)
    binary: str = ""
    binary_bytes: int = 0
    #: kiln's context_bytes_deduplicated for this group: weight bytes stored once instead of twice or more.
    bytes_deduplicated: int = 0
    #: kiln's context_bytes_written for this group.
    bytes_written: int = 0

    @property
    def files(self) -> List[str]:
        return [m.output for m in self.models] + ([self.binary] if self.binary else [])

    @property
    def initializer_bytes(self) -> Optional[int]:
        sizes = [m.initializer_bytes for m in self.models]
        return None if any(s is None for s in sizes) else sum(sizes)


def initializer_bytes(model_path: str) -> Optional[int]:
    """Bytes of a model's initializers (from shapes and types; external data is not read).
    None if ``onnx`` is not installed."""
    try:
        import onnx
        from onnx import helper
    except ImportError:
        return None
    m = onnx.load(model_path, load_external_data=False)
    total = 0

    def add(t):
        nonlocal total
        n = 1
        for d in t.dims:
            n *= d
        try:
            size = helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
        except Exception:  # noqa: BLE001 - exotic types: fall back to the raw payload
            total += len(t.raw_data)
            return
        total += n * size

    def walk(g):
        for t in g.initializer:
            add(t)
        for node in g.node:
            for a in node.attribute:
                if a.g is not None and a.HasField("g"):
                    walk(a.g)
                for sub in a.graphs:
                    walk(sub)

    walk(m.graph)
    return total


def _stem(path: str) -> str:
    base = os.path.basename(path)
    return base[:-5] if base.lower().endswith(".onnx") else os.path.splitext(base)[0]


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def _ort_message(exc) -> str:
    text = _one_line(exc)
    # ORT prefixes a failed EP creation with its C++ source location and signature
    marker = "Error creating execution provider: "
    return text[text.index(marker):] if marker in text else text


def compile_group(models: Sequence[str], output_dir: str, device, *,
                  ep_options: Optional[Dict[str, str]] = None,
                  config: Optional[Dict[str, str]] = None,
                  prefix_per_model: bool = False,
                  library_path: Optional[str] = None,
                  log=None,
                  prefix: str = "",
                  progress: Optional[Callable[[str, int, int], None]] = None) -> Report:
    """Compile ``models`` (in order) with kiln on ``device`` into ``output_dir`` as one
    sharing group; return what was written. ``prefix`` starts every graph name
    (``ep.context_node_name_prefix``), followed by ``<stem>_`` with
    ``prefix_per_model``. ``progress(model, index, count)`` is called before each
    model. Raises :class:`ShareError`; on error the
    ``_ctx.onnx`` files this call wrote are removed and no binary is written -- but the
    process-wide group stays open until a session with ``ep.stop_share_ep_contexts=1``
    compiles, so after an error only a fresh process is safe for a new group."""
    if not models:
        raise ShareError("no models given")
    ep_options = dict(ep_options or {})
    config = dict(config or {})
    for key in config:
        if key in MANAGED_CONFIG:
            raise ShareError(f"session entry '{key}' is set by {PROG}; do not pass it with --config")
    stems: Dict[str, str] = {}
    for m in models:
        if not os.path.isfile(m):
            raise ShareError(f"model '{m}' does not exist")
        s = _stem(m)
        if s in stems:
            raise ShareError(
                f"models '{stems[s]}' and '{m}' would both be written to '{s}_ctx.onnx'; "
                "give every model its own file name")
        stems[s] = m
    os.makedirs(output_dir, exist_ok=True)
    for m in models:
        out = os.path.join(output_dir, f"{_stem(m)}_ctx.onnx")
        if os.path.abspath(out) == os.path.abspath(m):
            raise ShareError(f"output '{out}' would overwrite its input model")

    ort = _ort()
    report = Report(output_dir=output_dir, target=kiln.device_target(device))
    written: List[str] = []
    start = stats(library_path)
    first_compiled: Optional[str] = None
    left_out: List[str] = []  # per model kiln claimed nothing of: why (its GetCapability summary)
    err = None
    try:
        for i, m in enumerate(models):
            last = i == len(models) - 1
            out = os.path.join(output_dir, f"{_stem(m)}_ctx.onnx")
            if progress:
                progress(m, i, len(models))
            so = ort.SessionOptions()
            for k, v in config.items():
                so.add_session_config_entry(k, v)
            so.add_session_config_entry("ep.share_ep_contexts", "1")
            if last:
                so.add_session_config_entry("ep.stop_share_ep_contexts", "1")
            if prefix or prefix_per_model:
                name_prefix = prefix + (f"{_stem(m)}_" if prefix_per_model else "")
                so.add_session_config_entry("ep.context_node_name_prefix", name_prefix)
            so.add_provider_for_devices([device], ep_options)
            before = stats(library_path)
            try:
                compiler = ort.ModelCompiler(so, m, embed_compiled_data_into_model=False)
                compiler.compile_to_file(out)
                compiler = None  # noqa: F841
            except Exception as exc:  # noqa: BLE001 - re-raised below, detached from ORT objects
                err = f"compiling '{m}' (model {i + 1} of {len(models)}) failed: {_ort_message(exc)}"
                break
            written.append(out)
            after = stats(library_path)
            parts = after["partitions_compiled"] - before["partitions_compiled"]
            if parts and first_compiled is None:
                first_compiled = m
            if not parts:
                # ORT ran GetCapability on this thread, for this model.
                left_out.append(f"{os.path.basename(m)}: {kiln.last_left_out(library_path) or 'no nodes'}")
            report.models.append(ModelResult(m, out, os.path.getsize(out), parts, initializer_bytes(m),
                                             after["nodes_compiled"] - before["nodes_compiled"]))
            if log:
                log(f"compiled {m} -> {out} ({parts} kiln partition(s))")
            # A last model kiln claims nothing of still ends the group: kiln
            # writes the binary when that model's compile session is released.
    finally:
        so = None
        gc.collect()
    if err is None and first_compiled is None:
        err = f"kiln compiled nothing from any model ({'; '.join(left_out)}); there is nothing to share"
    if err is None:
        binary = os.path.join(output_dir, f"{_stem(first_compiled)}_kiln.bin")
        if not os.path.isfile(binary):
            err = f"kiln did not write the shared binary '{binary}'"
        else:
            report.binary = binary
            report.binary_bytes = os.path.getsize(binary)
    if err is not None:
        for f in written:
            try:
                os.remove(f)
            except OSError:
                pass
        raise ShareError(err)
    end = stats(library_path)
    report.bytes_deduplicated = end["context_bytes_deduplicated"] - start["context_bytes_deduplicated"]
    report.bytes_written = end["context_bytes_written"] - start["context_bytes_written"]
    return report


def format_report(report: Report) -> str:
    rows = [(m.output, m.output_bytes, f"{m.partitions} kiln partition(s)") for m in report.models]
    rows.append((report.binary, report.binary_bytes, "shared context binary"))
    width = max(len(r[0]) for r in rows)
    lines = [f"{PROG}: {len(report.models)} model(s) -> {len(rows)} file(s) in "
             f"{report.output_dir} (target {report.target})"]
    for path, size, what in rows:
        lines.append(f"  {path:<{width}}  {size:>14,} bytes  {what}")
    lines.append(f"sharing saved {report.bytes_deduplicated:,} bytes: identical weights stored once "
                 "(kiln context_bytes_deduplicated)")
    init = report.initializer_bytes
    if init is not None:
        pct = 100.0 * report.binary_bytes / init if init else 0.0
        lines.append(f"the models' initializers: {init:,} bytes in total; the shared binary: "
                     f"{report.binary_bytes:,} bytes ({pct:.1f}%)")
    return "\n".join(lines)


# --------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------
def _key_value(text: str):
    if "=" not in text or text.startswith("="):
        raise argparse.ArgumentTypeError(f"expected key=value, got '{text}'")
    k, v = text.split("=", 1)
    return k.strip(), v


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, status 2
        self.exit(2, f"{self.prog}: error: {_one_line(message)}\n")


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="Compile models with kiln into EPContext models sharing one weights binary.")
    p.add_argument("models", nargs="+", help="ONNX models, compiled in this order")
    p.add_argument("--output-dir", "-o", required=True, help="folder for every output file")
    p.add_argument("--embed-mode", type=int, default=0, choices=(0, 1),
                   help="0 (default; the only mode that shares)")
    tg = p.add_mutually_exclusive_group()
    tg.add_argument("--target", choices=kiln.TARGETS, help="compile for this target (default: the host's)")
    tg.add_argument("--device-target", choices=kiln.TARGETS, help="the same as --target")
    p.add_argument("--option", action="append", type=_key_value, default=[], metavar="KEY=VALUE",
                   help="kiln EP option, e.g. disabled_ops=Tanh (repeatable)")
    p.add_argument("--config", action="append", type=_key_value, default=[], metavar="KEY=VALUE",
                   help="extra session config entry (repeatable)")
    p.add_argument("--prefix-per-model", action="store_true",
                   help="set ep.context_node_name_prefix=<stem>_ for every model")
    p.add_argument("--library", help="path of libkiln_ep.so")
    p.add_argument("--verbose", "-v", action="store_true", help="ONNX Runtime / kiln info logs")
    return p


def _device_for(target: Optional[str], library: Optional[str]):
    """Register kiln and return (registration name, device): kiln.device_for, which
    registers ``kiln.virtual`` for a target other than the host's."""
    try:
        device = kiln.device_for(target, library)
    except kiln.KilnError as exc:
        raise ShareError(str(exc)) from None
    names = kiln.registered_names()
    return (names[-1] if names else None), device


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.embed_mode != 0:
        print(f"{PROG}: error: --embed-mode 1 cannot share weights: kiln's sharing needs "
              "ep.context_embed_mode=0 (one binary file beside the models)", file=sys.stderr)
        return 2
    name = None
    code = 0
    try:
        ort = _ort()
        ort.set_default_logger_severity(0 if args.verbose else 3)
        library = os.path.abspath(args.library) if args.library else kiln.get_library_path()
        if args.library and not os.path.isfile(library):
            raise ShareError(f"library '{args.library}' does not exist")
        try:
            name, device = _device_for(args.target or args.device_target, library)
        except ShareError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise ShareError(f"cannot register kiln from '{library}': {_one_line(exc)}") from None
        report = compile_group(
            args.models, args.output_dir, device,
            ep_options=dict(args.option), config=dict(args.config),
            prefix_per_model=args.prefix_per_model, library_path=library,
            log=(lambda s: print(s, file=sys.stderr)) if args.verbose else None)
        device = None
        print(format_report(report))
    except (ShareError, FileNotFoundError, ImportError) as exc:
        print(f"{PROG}: error: {_one_line(exc)}", file=sys.stderr)
        code = 1
    device = None
    if name is not None and code == 0:
        # Only after a successful run: a failure may leave ORT objects alive.
        kiln.unregister(name)
    return code


if __name__ == "__main__":
    sys.exit(main())
