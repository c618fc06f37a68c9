"""The ``kiln`` command: compile, inspect, devices, bench.

    kiln compile MODEL... [-o DIR] [--embed] [--target T | --virtual] [--share]
                 [--prefix P] [--option K=V]... [--force]
    kiln inspect CTX_MODEL [--json]
    kiln devices [--json]
    kiln bench MODEL [--shapes NAME=D1xD2...]... [--runs N] [--target T] [--option K=V]...

Every user error (a missing file, a file that is not an ONNX model, a model kiln
compiles nothing from, an existing output, a bad option) prints one line
``kiln: error: ...`` on stderr and exits with status 1 (2 for a bad command line
or option). ``KILN_DEBUG=1`` shows Python's traceback instead.
``python -m onnxruntime_ep_kiln.cli`` is the same command without installing.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from typing import Dict, List, Optional, Sequence, TextIO

import onnxruntime_ep_kiln as kiln

PROG = "kiln"
EXIT_ERROR = 1
EXIT_USAGE = 2
#: ``kiln inspect``: the model was read but cannot run on this machine.
EXIT_CANNOT_RUN = 3


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # one line, status 2
        self.exit(EXIT_USAGE, f"{self.prog}: error: {' '.join(message.split())}\n")


def _key_value(text: str):
    if "=" not in text or text.startswith("="):
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got '{text}'")
    k, v = text.split("=", 1)
    return k.strip(), v


def _options(pairs) -> Dict[str, str]:
    return {k: v for k, v in pairs}


# --------------------------------------------------------------------------
# progress
# --------------------------------------------------------------------------
class Progress:
    """One line per model: on a terminal an updating bar with the elapsed time,
    otherwise plain lines (logs, pipes, CI)."""

    WIDTH = 24

    def __init__(self, stream: TextIO, count: int):
        self.stream = stream
        self.count = count
        self.tty = stream.isatty()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._label = ""
        self._start = 0.0

    def begin(self, model: str, index: int, count: int) -> None:
        self.end()
        self._label = f"[{index + 1}/{count}] {model}"
        self._start = time.perf_counter()
        if not self.tty:
            print(f"compiling {model} ({index + 1}/{count})", file=self.stream, flush=True)
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._spin, daemon=True)
        self._thread.start()

    def _spin(self) -> None:
        tick = 0
        while not self._stop.wait(0.1):
            tick += 1
            pos = tick % (2 * self.WIDTH - 2)
            pos = pos if pos < self.WIDTH else 2 * self.WIDTH - 2 - pos
            bar = " " * pos + "#" + " " * (self.WIDTH - pos - 1)
            self.stream.write(f"\r{self._label} [{bar}] {time.perf_counter() - self._start:6.1f} s")
            self.stream.flush()

    def end(self, ok: bool = True) -> None:
        if self._thread is None:
            return
        self._stop.set()
        self._thread.join()
        self._thread = None
        bar = "#" * self.WIDTH if ok else "!" * self.WIDTH
        self.stream.write(f"\r{self._label} [{bar}] {time.perf_counter() - self._start:6.1f} s\n")
        self.stream.flush()


# --------------------------------------------------------------------------
# compile
# --------------------------------------------------------------------------
def _compile(args) -> int:
    options = _options(args.option)
    kiln.check_options(options)
    targets: List[Optional[str]] = list(kiln.TARGETS) if args.virtual else [args.target]
    results = []
    start = time.perf_counter()
    created = _folders_to_create(args)
    try:
        for target in targets:
            results.append(_compile_for(args, target, options))
    except BaseException:
        for folder in reversed(created):  # only the empty folders this run made
            try:
                os.rmdir(folder)
            except OSError:
                pass
        raise
    print(_summary(results, time.perf_counter() - start))
    return 0


def _folders_to_create(args) -> List[str]:
    """Output folders that do not exist yet, created now, parents first."""
    wanted = []
    if args.virtual:
        wanted = [args.output or "."] + [os.path.join(args.output or ".", t) for t in kiln.TARGETS]
    elif args.output is not None and not args.output.lower().endswith(".onnx"):
        wanted = [args.output]
    created = []
    for folder in wanted:
        if not os.path.isdir(folder):
            os.makedirs(folder)
            created.append(folder)
    return created


def _compile_for(args, target: Optional[str], options: Dict[str, str]):
    """One kiln.compile call, with its progress lines."""
    output = os.path.join(args.output or ".", target) if args.virtual else args.output
    progress = Progress(sys.stderr, len(args.models))
    try:
        result = kiln.compile(args.models, output, embed=args.embed, target=target, share_group=args.share,
                              prefix=args.prefix, options=options, force=args.force,
                              progress=progress.begin)
    except BaseException:
        progress.end(ok=False)
        raise
    progress.end()
    if not progress.tty:
        for m in result.models:
            print(f"compiled {m.model} -> {m.output} ({m.partitions} kiln partition(s), "
                  f"{m.seconds:.2f} s)", file=sys.stderr)
    return result


def _summary(results, seconds: float) -> str:
    files = [(f, os.path.getsize(f)) for r in results for f in r.files]
    total = sum(size for _, size in files)
    shared = sum(r.bytes_shared for r in results)
    models = sum(len(r.models) for r in results)
    parts = sum(m.partitions for r in results for m in r.models)
    targets = ", ".join(r.target for r in results)
    lines = [f"kiln: {models} model(s) compiled for {targets}: {parts} kiln partition(s), "
             f"{len(files)} file(s) written, {total:,} bytes, weights shared {shared:,} bytes, {seconds:.2f} s"]
    width = max(len(f) for f, _ in files)
    lines.extend(f"  {f:<{width}}  {size:>14,} bytes" for f, size in files)
    return "\n".join(lines)


# --------------------------------------------------------------------------
# inspect
# --------------------------------------------------------------------------
def _inspect(args) -> int:
    report = kiln.inspect(args.model)
    if args.json:
        print(json.dumps(report.to_dict(), indent=2))
    else:
        print(report.summary())
    return 0 if report.can_run_here else EXIT_CANNOT_RUN


# --------------------------------------------------------------------------
# devices
# --------------------------------------------------------------------------
CPU_FLAGS = ("sse2", "fma", "avx2", "avx512f", "avx512bw", "avx512vl")


def cpu_flags() -> List[str]:
    """The x86 features kiln's targets use that this CPU reports (``/proc/cpuinfo``)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    have = set(line.split(":", 1)[1].split())
                    return [flag for flag in CPU_FLAGS if flag in have]
    except OSError:
        pass
    return []


def option_values(key: str) -> str:
    """What kiln accepts for option ``key``, in kiln's own words (its parser's message)."""
    try:
        kiln.check_options({key: "\x01"})
    except kiln.KilnOptionError as exc:
        text = str(exc)
        marker = "accepted values: "
        return text.split(marker, 1)[1] if marker in text else text
    return "any value"


def _devices(args) -> int:
    kiln.register(virtual=True)
    devs = kiln.devices(virtual=None)
    if args.json:
        print(json.dumps({
            "library": kiln._library_in_use(),
            "devices": [{"target": kiln.device_target(d), "virtual": kiln.is_virtual(d),
                         "ep_metadata": dict(d.ep_metadata), "ep_options": dict(d.ep_options)} for d in devs],
            "cpu_flags": cpu_flags(),
            "options": {k: option_values(k) for k in kiln.OPTION_KEYS},
        }, indent=2))
        return 0
    print(f"kiln {kiln.__version__} from {kiln._library_in_use()}")
    print(f"devices ({len(devs)}):")
    for i, d in enumerate(devs):
        kind = "virtual" if kiln.is_virtual(d) else "host"
        print(f"  [{i}] {kind:<8} target={kiln.device_target(d):<15} {d.ep_metadata.get('kiln.target_features', '')}")
    host = [d for d in devs if not kiln.is_virtual(d)]
    if host:
        capped = os.environ.get(kiln.MAX_TARGET_ENV)
        note = f" ({kiln.MAX_TARGET_ENV}={capped})" if capped else ""
        print(f"this CPU: {', '.join(cpu_flags()) or 'unknown'} -> best kiln target "
              f"{kiln.device_target(host[0])}{note}")
        print("a virtual device compiles for its target without running it (kiln compile --target / --virtual)")
        defaults = ", ".join(f"{k}={v!r}" for k, v in sorted(dict(host[0].ep_options).items()))
        print(f"EP options of the host device: {defaults}")
    print("kiln options (docs/options.md):")
    for key in kiln.OPTION_KEYS:
        values = option_values(key)
        if len(values) > 100:
            values = values[:97] + "..."
        print(f"  {key:<16} {values}")
    return 0


# --------------------------------------------------------------------------
# bench
# --------------------------------------------------------------------------
def _bench(args) -> int:
    from .benchmark import bench, parse_shapes

    shapes = parse_shapes(args.shapes)
    options = _options(args.option)
    kiln.check_options(options)
    if not os.path.isfile(args.model):
        raise kiln.KilnError(f"model '{args.model}' does not exist")
    print(f"kiln bench: compiling and timing {args.model} ...", file=sys.stderr)
    result = bench(args.model, shapes=shapes, runs=args.runs, target=args.target, options=options)
    print(result.table())
    return 0


# --------------------------------------------------------------------------
# command line
# --------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog=PROG, description="kiln, an ONNX Runtime execution provider: compile models into "
                "EPContext models, inspect them, list kiln's devices, benchmark a model.")
    p.add_argument("--version", action="version", version=f"kiln {kiln.__version__}")
    p.add_argument("--library", help=f"the {kiln.LIBRARY_FILE} to use (default: {kiln.LIBRARY_ENV}, "
                   "the package's copy, or a checkout's target/release)")
    p.add_argument("--verbose", "-v", action="store_true", help="ONNX Runtime's and kiln's info logs on stderr")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True

    c = sub.add_parser("compile", help="compile models into <stem>_ctx.onnx (+ <stem>_kiln.bin)",
                       description="Compile ONNX models with kiln (ONNX Runtime's compile API) into "
                       "EPContext models: <stem>_ctx.onnx and, unless --embed, <stem>_kiln.bin.")
    c.add_argument("models", nargs="+", metavar="MODEL", help="ONNX model files")
    c.add_argument("-o", "--output", metavar="DIR",
                   help="output folder (default: beside each model); for one model also a path ending in .onnx")
    c.add_argument("--embed", action="store_true", help="put the compiled graphs inside the model (no .bin)")
    tg = c.add_mutually_exclusive_group()
    tg.add_argument("--target", choices=kiln.TARGETS, help="compile for this target (default: this CPU's best)")
    tg.add_argument("--virtual", action="store_true",
                    help="compile for every kiln target, into DIR/<target>/ (kiln's virtual devices)")
    c.add_argument("--share", action="store_true",
                   help="one weight-sharing group: one <first stem>_kiln.bin for all models (kiln-share-ctx-gen)")
    c.add_argument("--prefix", help="start every graph name with this (ep.context_node_name_prefix)")
    c.add_argument("--option", action="append", type=_key_value, default=[], metavar="KEY=VALUE",
                   help="kiln EP option, e.g. disabled_ops=Tanh (repeatable; see kiln devices)")
    c.add_argument("--force", action="store_true", help="replace existing output files")
    c.set_defaults(run=_compile)

    i = sub.add_parser("inspect", help="describe a compiled model and check it",
                       description="Describe a compiled model (*_ctx.onnx): EPContext nodes, context binaries, "
                       "checksums, targets, and whether this machine can run it. Exit status 0: it runs here; "
                       f"{EXIT_CANNOT_RUN}: it does not (reasons printed); 1: error.")
    i.add_argument("model", metavar="CTX_MODEL", help="a compiled model, e.g. model_ctx.onnx")
    i.add_argument("--json", action="store_true", help="print the report as JSON")
    i.set_defaults(run=_inspect)

    d = sub.add_parser("devices", help="kiln's devices, targets, this CPU and kiln's options",
                       description="List kiln's devices (host and virtual), the targets, what this CPU offers "
                       "and the options kiln reads.")
    d.add_argument("--json", action="store_true", help="print as JSON")
    d.set_defaults(run=_devices)

    b = sub.add_parser("bench", help="compile time, load time and latency vs the CPU EP",
                       description="Compile a model with kiln, load the compiled model, and time runs of it "
                       "against ONNX Runtime's CPU EP on random inputs.")
    b.add_argument("model", metavar="MODEL", help="an ONNX model")
    b.add_argument("--shapes", action="extend", nargs="+", default=[], metavar="NAME=D1xD2...",
                   help="input shapes for symbolic dims, e.g. --shapes ids=1x128 mask=1x128 "
                   "(repeatable; unknown dims default to 1)")
    b.add_argument("--runs", type=int, default=20, help="timed runs per EP (default 20)")
    b.add_argument("--target", choices=kiln.TARGETS, help="a target this CPU runs (default: its best)")
    b.add_argument("--option", action="append", type=_key_value, default=[], metavar="KEY=VALUE",
                   help="kiln EP option (repeatable)")
    b.set_defaults(run=_bench)
    return p


def _error(message: str, code: int) -> int:
    print(f"{PROG}: error: {' '.join(str(message).split())}", file=sys.stderr)
    return code


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.library:
        if not os.path.isfile(args.library):
            return _error(f"library '{args.library}' does not exist", EXIT_ERROR)
        os.environ[kiln.LIBRARY_ENV] = os.path.abspath(args.library)
    if os.environ.get("KILN_DEBUG"):
        return _run(args)
    try:
        return _run(args)
    except kiln.KilnOptionError as exc:
        return _error(exc, EXIT_USAGE)
    except KeyboardInterrupt:
        return _error("interrupted", 130)
    except BrokenPipeError:  # `kiln devices | head`: the reader left, nothing to report
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - the interpreter's final flush must not fail
        return 141
    except Exception as exc:  # noqa: BLE001 - one line for the user; KILN_DEBUG=1 shows the traceback
        return _error(exc, EXIT_ERROR)


def _run(args) -> int:
    try:
        from ._ort import ort
        ort().set_default_logger_severity(0 if args.verbose else 3)
    except ImportError:
        if args.command != "inspect":  # inspect reads the model without ONNX Runtime
            raise
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
