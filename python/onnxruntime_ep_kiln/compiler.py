"""``compile()``: models to kiln EPContext models through ONNX Runtime's compile API.

Every model is compiled into a hidden temporary folder inside the output folder
and its files (``<stem>_ctx.onnx`` and, unless embedded, ``<stem>_kiln.bin``) are
renamed into place only when the whole call succeeded, so a failure leaves
nothing behind and existing files are replaced only with ``force=True``.
"""
from __future__ import annotations

import gc
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Mapping, Optional, Sequence, Union

import onnxruntime_ep_kiln as kiln
from ._ort import ort as _ort

PathLike = Union[str, "os.PathLike[str]"]

#: Session entries compile() sets itself.
MANAGED_CONFIG = ("ep.context_enable", "ep.context_embed_mode", "ep.context_file_path",
                  "ep.share_ep_contexts", "ep.stop_share_ep_contexts", "ep.context_node_name_prefix")


@dataclass
class CompiledModel:
    """One model compiled by :func:`compile`."""

    model: str
    #: The ``_ctx.onnx`` written.
    output: str
    output_bytes: int
    #: kiln partitions compiled from this model (each one EPContext node).
    partitions: int
    nodes: int
    seconds: float


@dataclass
class CompileResult:
    """What :func:`compile` wrote."""

    target: str
    models: List[CompiledModel] = field(default_factory=list)
    #: Context binaries written (none when embedded), with their sizes.
    binaries: Dict[str, int] = field(default_factory=dict)
    #: Weight bytes stored once instead of several times (kiln's ``context_bytes_deduplicated``).
    bytes_shared: int = 0
    seconds: float = 0.0

    @property
    def outputs(self) -> List[str]:
        """The ``_ctx.onnx`` files, in the order of the models."""
        return [m.output for m in self.models]

    @property
    def files(self) -> List[str]:
        """Every file written."""
        return self.outputs + list(self.binaries)

    @property
    def total_bytes(self) -> int:
        return sum(m.output_bytes for m in self.models) + sum(self.binaries.values())


def _stem(path: str) -> str:
    base = os.path.basename(path)
    return base[:-5] if base.lower().endswith(".onnx") else os.path.splitext(base)[0]


def _one_line(text) -> str:
    return " ".join(str(text).split())


def ort_message(exc: BaseException, model: str) -> str:
    """ONNX Runtime's error, shortened to what a user acts on."""
    text = _one_line(exc)
    if "INVALID_PROTOBUF" in text or "Protobuf parsing failed" in text:
        return f"'{model}' is not an ONNX model (ONNX Runtime cannot parse it)"
    marker = "Error creating execution provider: "
    if marker in text:
        text = text[text.index(marker):]
    return f"compiling '{model}' failed: {text}"


def _check_inputs(models: Sequence[str], outputs: Sequence[str], force: bool, embed: bool) -> None:
    for m in models:
        if not os.path.exists(m):
            raise kiln.KilnError(f"model '{m}' does not exist")
        if not os.path.isfile(m):
            raise kiln.KilnError(f"model '{m}' is not a file")
    seen: Dict[str, str] = {}
    for m, out in zip(models, outputs):
        key = os.path.abspath(out)
        if key in seen:
            raise kiln.KilnError(f"models '{seen[key]}' and '{m}' would both be written to '{out}'; "
                                 "give every model its own file name")
        seen[key] = m
        if key == os.path.abspath(m):
            raise kiln.KilnError(f"output '{out}' would overwrite its input model")
        existing = [out] + ([] if embed else [os.path.join(os.path.dirname(out), f"{_stem(m)}_kiln.bin")])
        for path in existing:
            if os.path.lexists(path) and not force:
                raise kiln.KilnError(f"output '{path}' already exists; remove it or pass force=True (--force)")


def _compile_one(model: str, output: str, device, *, embed: bool, options: Dict[str, str],
                 config: Dict[str, str]) -> None:
    """ORT's compile API on one model; raises KilnError with ORT's message in one line."""
    ort = _ort()
    so = ort.SessionOptions()
    for key, value in config.items():
        so.add_session_config_entry(key, value)
    so.add_provider_for_devices([device], options)
    err = None
    try:
        compiler = ort.ModelCompiler(so, model, embed_compiled_data_into_model=embed)
        compiler.compile_to_file(output)
        compiler = None  # noqa: F841
    except Exception as exc:  # noqa: BLE001 - re-raised below, detached from ORT objects
        err = ort_message(exc, model)
    so = None
    gc.collect()
    if err is not None:
        raise kiln.KilnError(err)


def _move_into_place(tmp: str, out_dir: str) -> Dict[str, str]:
    """Renames every file of ``tmp`` into ``out_dir``: binaries first, models last, so a
    model never names a binary that is not there yet. Returns {temporary: final} paths."""
    names = sorted(os.listdir(tmp), key=lambda n: n.endswith(".onnx"))
    moved = {}
    for name in names:
        final = os.path.join(out_dir, name)
        os.replace(os.path.join(tmp, name), final)
        moved[os.path.join(tmp, name)] = final
    return moved


def compile(model: Union[PathLike, Sequence[PathLike]], output: Optional[PathLike] = None, *,
            embed: bool = False, target: Optional[str] = None, share_group: Optional[bool] = None,
            prefix: Optional[str] = None, options: Optional[Mapping[str, str]] = None,
            config: Optional[Mapping[str, str]] = None, device=None, force: bool = False,
            progress: Optional[Callable[[str, int, int], None]] = None) -> CompileResult:
    """Compile ``model`` with kiln into an EPContext model (``ort.ModelCompiler``).

    ``model``: an ONNX file, or a list of them. ``output``: an existing folder, or
    for one model the compiled model's path (ending in ``.onnx``); default:
    ``<stem>_ctx.onnx`` beside each model. ``embed``: put the compiled graphs
    inside the model instead of a ``<stem>_kiln.bin`` beside it. ``target``:
    compile for that kiln target (any target on any x86-64 host; see
    :func:`device_for`). ``share_group``: true compiles the models as one
    weight-sharing group (one ``<first stem>_kiln.bin`` holding every model's
    graphs, each distinct weight once; the flow of ``kiln-share-ctx-gen``,
    :func:`onnxruntime_ep_kiln.share.compile_group`); not with ``embed``.
    ``prefix``: ``ep.context_node_name_prefix`` (graph names inside the binary).
    ``options``: kiln EP options, checked first (:class:`KilnOptionError`).
    ``config``: extra session entries. ``device``: a kiln ``OrtEpDevice`` instead of
    ``target``. ``force``: replace existing outputs. ``progress(model, index, count)``
    is called before each model.

    Raises :class:`KilnError` (one-line message) if a model is missing or not ONNX,
    an output exists, kiln compiles nothing from a model, or ONNX Runtime fails;
    nothing is left behind then.
    """
    _ort()  # first: without ONNX Runtime nothing else matters
    models = [os.fspath(m) for m in ([model] if isinstance(model, (str, os.PathLike)) else model)]
    if not models:
        raise kiln.KilnError("no models given")
    options = {str(k): str(v) for k, v in (options or {}).items()}
    config = {str(k): str(v) for k, v in (config or {}).items()}
    for key in config:
        if key in MANAGED_CONFIG:
            raise kiln.KilnOptionError(f"session entry '{key}' is set by compile(); use its arguments instead")
    if share_group and embed:
        raise kiln.KilnOptionError("share_group needs embed=False: shared weights live in one binary "
                                   "file beside the models")
    kiln.check_options(options, config)
    outputs = _output_paths(models, output)
    _check_inputs(models, outputs, force, embed)
    out_dirs = {os.path.dirname(os.path.abspath(o)) for o in outputs}
    if len(out_dirs) != 1:
        raise kiln.KilnError("all outputs must go to one folder; pass output=FOLDER")
    out_dir = out_dirs.pop()
    if not os.path.isdir(out_dir):
        raise kiln.KilnError(f"output folder '{out_dir}' does not exist")
    dev = device if device is not None else kiln.device_for(target)
    result = CompileResult(target=kiln.device_target(dev))
    start = time.perf_counter()
    tmp = tempfile.mkdtemp(prefix=".kiln-compile-", dir=out_dir)
    try:
        if share_group:
            _compile_shared(models, tmp, dev, options, config, prefix, result, progress)
        else:
            _compile_each(models, outputs, tmp, dev, embed, options, config, prefix, result, progress)
        moved = _move_into_place(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for m in result.models:
        m.output = moved.get(m.output, m.output)
    result.binaries = {moved.get(b, b): size for b, size in result.binaries.items()}
    result.seconds = time.perf_counter() - start
    return result


def _output_paths(models: List[str], output: Optional[PathLike]) -> List[str]:
    names = [f"{_stem(m)}_ctx.onnx" for m in models]
    if output is None:
        return [os.path.join(os.path.dirname(os.path.abspath(m)), n) for m, n in zip(models, names)]
    output = os.fspath(output)
    if os.path.isdir(output) or len(models) > 1 or not output.lower().endswith(".onnx"):
        if not os.path.isdir(output):
            raise kiln.KilnError(f"output folder '{output}' does not exist")
        return [os.path.join(output, n) for n in names]
    return [output]


def _delta(before: Dict[str, int], key: str) -> int:
    return kiln.stats()[key] - before[key]


def _compile_each(models, outputs, tmp, dev, embed, options, config, prefix, result, progress) -> None:
    for i, (m, out) in enumerate(zip(models, outputs)):
        if progress:
            progress(m, i, len(models))
        cfg = dict(config)
        if prefix:
            cfg["ep.context_node_name_prefix"] = prefix
        tmp_out = os.path.join(tmp, os.path.basename(out))
        before = kiln.stats()
        t0 = time.perf_counter()
        _compile_one(m, tmp_out, dev, embed=embed, options=options, config=cfg)
        parts = _delta(before, "partitions_compiled")
        if parts == 0:
            why = kiln.last_left_out()
            raise kiln.KilnError(f"kiln compiled nothing from '{m}': none of its nodes is one kiln claims"
                                 f"{' (' + why + ')' if why else ''}; see `kiln devices` for the options "
                                 "(claim=all claims every node kiln can run)")
        result.bytes_shared += _delta(before, "context_bytes_deduplicated")
        result.models.append(CompiledModel(m, tmp_out, os.path.getsize(tmp_out), parts,
                                           _delta(before, "nodes_compiled"), time.perf_counter() - t0))
        if not embed:
            for name in os.listdir(tmp):
                if name.endswith("_kiln.bin") and os.path.join(tmp, name) not in result.binaries:
                    path = os.path.join(tmp, name)
                    result.binaries[path] = os.path.getsize(path)


def _compile_shared(models, tmp, dev, options, config, prefix, result, progress) -> None:
    """The weight-sharing flow of ``kiln-share-ctx-gen`` (share.compile_group) into ``tmp``."""
    from . import share

    # Graph names must not clash inside the one binary: every model's start with its stem.
    t0 = time.perf_counter()
    try:
        report = share.compile_group(models, tmp, dev, ep_options=options, config=config,
                                     prefix=prefix or "", prefix_per_model=True, progress=progress)
    except share.ShareError as exc:
        raise kiln.KilnError(str(exc)) from None
    seconds = (time.perf_counter() - t0) / len(models)
    for m in report.models:
        result.models.append(CompiledModel(m.model, m.output, m.output_bytes, m.partitions, m.nodes, seconds))
    result.binaries[report.binary] = report.binary_bytes
    result.bytes_shared = report.bytes_deduplicated
