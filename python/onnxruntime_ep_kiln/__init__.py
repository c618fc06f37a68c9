"""Python helpers for kiln, an ONNX Runtime plugin execution provider.

Typical use::

    import onnxruntime as ort
    import onnxruntime_ep_kiln as kiln

    kiln.register()                              # loads libkiln_ep.so into ONNX Runtime
    so = kiln.session_options({"disabled_ops": "Tanh"})   # options checked by kiln first
    sess = ort.InferenceSession("model.onnx", so, enable_fallback=0)
    result = kiln.compile("model.onnx")          # -> model_ctx.onnx + model_kiln.bin
    print(kiln.inspect(result.outputs[0]).summary())

The package does not depend on ``onnxruntime`` (pick ``onnxruntime``, a nightly,
...; ``pip install 'onnxruntime-ep-kiln[ort]'`` pins the tested 1.31.1): it is
imported when a helper needs it. :func:`get_library_path` and :func:`get_ep_names`
work without it, as ONNX Runtime's plugin-EP packages do.

Without ``enable_fallback=0`` ONNX Runtime's Python wrapper reacts to a kiln
error at session creation (e.g. a bad option) by printing "EP Error" and
quietly running the whole model on its CPU EP.

``stats()`` reads kiln's process-wide counters (EPs created, partitions and
nodes compiled, compute calls), which is the simplest way to see that kiln
actually ran something.
"""
from __future__ import annotations

import ctypes
import gc
import os
import threading
from typing import TYPE_CHECKING, Dict, List, Mapping, Optional

from . import _native
from ._ort import INSTALL_HINT, TESTED_ORT_VERSION, OrtMissingError, ort as _ort

if TYPE_CHECKING:  # only for annotations: importing this package must not need ONNX Runtime
    import onnxruntime as ort

__version__ = "0.1.0"

#: Name of the execution provider as ONNX Runtime reports it.
EP_NAME = "KilnExecutionProvider"
#: Vendor string of kiln's EP factory.
EP_VENDOR = "kiln"
#: File name of the shared library.
LIBRARY_FILE = "libkiln_ep.so"
#: Environment variable that overrides the library location.
LIBRARY_ENV = "KILN_EP_LIBRARY"
#: Environment variable that caps the target kiln believes the host supports.
MAX_TARGET_ENV = "KILN_MAX_TARGET"
#: Code-generation targets, best first.
TARGETS = ("x86_64-avx512", "x86_64-avx2", "x86_64-generic")
#: Registering under a name ending in this suffix also offers virtual devices.
VIRTUAL_SUFFIX = ".virtual"
#: Default registration name.
DEFAULT_NAME = "kiln"

__all__ = [
    "EP_NAME",
    "EP_VENDOR",
    "TARGETS",
    "VIRTUAL_SUFFIX",
    "OPTION_KEYS",
    "KilnError",
    "KilnOptionError",
    "OrtMissingError",
    "get_library_path",
    "get_ep_names",
    "session_options",
    "check_options",
    "device_for",
    "compile",
    "inspect",
    "register",
    "unregister",
    "registered_names",
    "devices",
    "kiln_devices",
    "host_device",
    "create_session",
    "device_target",
    "is_virtual",
    "stats",
    "last_left_out",
]

#: The EP options kiln reads (``src/ep/options.rs``); see docs/options.md.
OPTION_KEYS = ("target", "disabled_ops", "claim", "force_ops", "context_storage", "shape_cache", "winograd")
#: Session config entries kiln reads, each ``0`` or ``1``.
SESSION_FLAGS = ("ep.context_enable", "ep.context_embed_mode", "ep.share_ep_contexts",
                 "ep.stop_share_ep_contexts", "session.compile_only")

_lock = threading.Lock()
# registration name -> library path, for registrations made through register()
_registered: Dict[str, str] = {}


class KilnError(Exception):
    """A kiln helper failed; the message is one line saying what and why."""


class KilnOptionError(KilnError, ValueError):
    """kiln refuses an EP option or a session entry (the message names it and what it accepts)."""


# --------------------------------------------------------------------------
# library location
# --------------------------------------------------------------------------
def _repo_library_candidates(start_dir: str) -> List[str]:
    """``target/release/libkiln_ep.so`` in ``start_dir`` and every parent."""
    found = []
    d = os.path.abspath(start_dir)
    while True:
        found.append(os.path.join(d, "target", "release", LIBRARY_FILE))
        parent = os.path.dirname(d)
        if parent == d:
            return found
        d = parent


def get_library_path() -> str:
    """Absolute path of ``libkiln_ep.so``.

    Looked up in this order:

    1. the ``KILN_EP_LIBRARY`` environment variable (must name an existing file),
    2. a ``libkiln_ep.so`` bundled inside this package's directory (wheels),
    3. ``target/release/libkiln_ep.so`` of the source checkout, found by walking
       up from this file (development installs / running from the repo).

    Raises ``FileNotFoundError`` explaining what was tried.
    """
    env = os.environ.get(LIBRARY_ENV)
    if env:
        path = os.path.abspath(os.path.expanduser(env))
        if os.path.isfile(path):
            return path
        raise FileNotFoundError(
            f"{LIBRARY_ENV} is set to {env!r}, but no such file exists. "
            f"Point it at a built {LIBRARY_FILE} or unset it."
        )

    pkg_dir = os.path.dirname(os.path.abspath(__file__))
    bundled = os.path.join(pkg_dir, LIBRARY_FILE)
    if os.path.isfile(bundled):
        return bundled

    candidates = _repo_library_candidates(pkg_dir)
    for path in candidates:
        if os.path.isfile(path):
            return path

    raise FileNotFoundError(
        f"cannot find the kiln library {LIBRARY_FILE}. Tried: ${LIBRARY_ENV} (not set), "
        f"{bundled} (not bundled), and target/release/{LIBRARY_FILE} in {pkg_dir} and its "
        f"parents. Build it with `cargo build --release` in the kiln repository, or set "
        f"{LIBRARY_ENV}=/path/to/{LIBRARY_FILE}."
    )


def get_ep_names() -> List[str]:
    """The execution provider names the library offers: ``["KilnExecutionProvider"]``."""
    return [EP_NAME]


# --------------------------------------------------------------------------
# registration
# --------------------------------------------------------------------------
def register(name: Optional[str] = None, virtual: bool = False, library_path: Optional[str] = None) -> str:
    """Register kiln with ONNX Runtime and return the registration name.

    ``name`` defaults to ``"kiln"``, or ``"kiln.virtual"`` with ``virtual=True``:
    a name ending in ``.virtual`` makes kiln also offer one virtual device per
    other target (to compile for CPUs other than this one); ``virtual=True``
    adds that suffix to a ``name`` that lacks it. ``library_path`` defaults to
    :func:`get_library_path`. Safe to call repeatedly: if the name is already
    registered (through this helper or directly), nothing happens.
    ``KILN_MAX_TARGET`` is read by kiln at registration time. Raises
    :class:`OrtMissingError` if ONNX Runtime is not installed.
    """
    if isinstance(virtual, str) and library_path is None:
        # the 0.1.0 signature was register(name, library_path)
        virtual, library_path = False, virtual
    if name is None:
        name = DEFAULT_NAME + (VIRTUAL_SUFFIX if virtual else "")
    elif virtual and not name.endswith(VIRTUAL_SUFFIX):
        name += VIRTUAL_SUFFIX
    ort = _ort()
    path = os.path.abspath(library_path) if library_path else get_library_path()
    with _lock:
        if name in _registered:
            return name
        try:
            ort.register_execution_provider_library(name, path)
        except Exception as exc:  # ORT raises ...Fail for a duplicate name
            if "already registered" in str(exc):
                return name
            raise
        _registered[name] = path
    return name


def unregister(name: str = DEFAULT_NAME) -> None:
    """Unregister the kiln library registered under ``name``.

    Every InferenceSession that uses kiln (including a session kept alive by
    an exception traceback) must be gone first, otherwise ONNX Runtime
    crashes later. This function runs the garbage collector to release
    sessions caught in reference cycles, but it cannot free sessions you
    still reference.
    """
    gc.collect()
    ort = _ort()
    with _lock:
        ort.unregister_execution_provider_library(name)
        _registered.pop(name, None)


def registered_names() -> List[str]:
    """Names registered through :func:`register` and not yet unregistered."""
    with _lock:
        return list(_registered)


# --------------------------------------------------------------------------
# devices
# --------------------------------------------------------------------------
def is_virtual(dev) -> bool:
    """True for a virtual (non-host) device offered under a ``.virtual`` registration."""
    return dev.device.metadata.get("is_virtual") == "1"


def device_target(dev) -> str:
    """The kiln target a device compiles for (EP metadata ``kiln.target``)."""
    return dev.ep_metadata.get("kiln.target", "")


def devices(virtual: Optional[bool] = False, target: Optional[str] = None, *,
            name_suffix: Optional[str] = None) -> list:
    """kiln's ``OrtEpDevice`` objects from ``onnxruntime.get_ep_devices()``.

    ``virtual``: ``False`` (default) keeps kiln's device on this machine's CPU,
    ``True`` only the virtual devices (offered when kiln is registered with
    ``virtual=True``), ``None`` both, host first. ``target``: keep only devices
    whose ``kiln.target`` equals it. ``name_suffix``: match the EP name
    ``KilnExecutionProvider + name_suffix`` (for builds that register the EP
    under a suffixed name). Empty when kiln is not registered (see :func:`register`).
    """
    if isinstance(virtual, str):  # the 0.1.0 signature was devices(name_suffix, ...)
        virtual, name_suffix = None, virtual
    if target is not None and target not in TARGETS:
        raise KilnOptionError(f"unknown target '{target}'; kiln's targets are {', '.join(TARGETS)}")
    wanted = EP_NAME + (name_suffix or "")
    out = [d for d in _ort().get_ep_devices() if d.ep_name == wanted]
    if target is not None:
        out = [d for d in out if device_target(d) == target]
    if virtual is not None:
        out = [d for d in out if is_virtual(d) == bool(virtual)]
    out.sort(key=is_virtual)  # stable: host device(s) first
    return out


def kiln_devices() -> list:
    """All of kiln's devices (host device first, then any virtual ones)."""
    return devices(virtual=None)


def host_device():
    """kiln's (non-virtual) device for this machine; RuntimeError if kiln is not registered."""
    host = devices(virtual=False)
    if not host:
        raise RuntimeError(
            f"no {EP_NAME} device found; call onnxruntime_ep_kiln.register() first"
        )
    return host[0]


# --------------------------------------------------------------------------
# sessions
# --------------------------------------------------------------------------
def device_for(target: Optional[str] = None, library_path: Optional[str] = None):
    """kiln's device compiling for ``target`` (default: this machine's best),
    registering kiln if needed: ``"kiln"`` for the host's target, ``"kiln.virtual"``
    (after unregistering a plain ``"kiln"`` this package registered) for another one."""
    if target is not None and target not in TARGETS:
        raise KilnOptionError(f"unknown target '{target}'; kiln's targets are {', '.join(TARGETS)}")
    if not devices(virtual=None):
        register(library_path=library_path)
    host = devices(virtual=False)
    if not host:
        raise KilnError(f"no {EP_NAME} device found after registering kiln")
    if target is None or device_target(host[0]) == target:
        return host[0]
    found = devices(virtual=None, target=target)
    if found:
        return found[0]
    if DEFAULT_NAME in registered_names():
        unregister(DEFAULT_NAME)
    register(virtual=True, library_path=library_path)
    found = devices(virtual=None, target=target)
    if not found:
        raise KilnError(f"kiln offers no device for target {target}")
    return found[0]


def check_options(options: Optional[Mapping[str, str]] = None, config: Optional[Mapping[str, str]] = None,
                  library_path: Optional[str] = None) -> None:
    """Raise :class:`KilnOptionError` if kiln would refuse ``options`` (its EP options)
    or ``config`` (session entries kiln reads, e.g. ``ep.context_enable``).

    EP options go through the parser kiln's ``CreateEp`` uses (the library's
    ``kiln_ep_check_options``), so the message is the one a session would give;
    without this check ONNX Runtime's Python wrapper turns a bad option into a
    silent fallback to its CPU EP.
    """
    for key, value in (config or {}).items():
        if key in SESSION_FLAGS and str(value).strip() not in ("", "0", "1"):
            raise KilnOptionError(f"invalid value '{value}' for session option '{key}'; accepted values: 0, 1")
    if not options:
        return
    for key, value in options.items():
        if not isinstance(key, str) or not isinstance(value, str):
            raise KilnOptionError(f"kiln option {key!r}={value!r}: keys and values must be strings")
    code, message = _native.check_options(library_path or _library_in_use(), options)
    if code != 0:
        raise KilnOptionError(message or "kiln refused the options")


def session_options(options: Optional[Mapping[str, str]] = None, *, device=None, target: Optional[str] = None,
                    config: Optional[Mapping[str, str]] = None,
                    sess_options: Optional["ort.SessionOptions"] = None) -> "ort.SessionOptions":
    """A ``SessionOptions`` with kiln appended (``add_provider_for_devices``).

    ``options``: kiln's EP options (``target``, ``disabled_ops``, ``claim``,
    ``force_ops``, ``context_storage``, ``shape_cache``, ``winograd``; docs/options.md), checked
    by kiln's own parser first (:func:`check_options`): a bad key or value raises
    :class:`KilnOptionError` here. ``device``: a kiln ``OrtEpDevice``; default
    :func:`device_for` ``(target)``, which registers kiln if needed. ``config``:
    session config entries to add. ``sess_options``: add to these instead of new ones.
    Create the session with ``enable_fallback=0`` so a kiln error is raised, not
    turned into a CPU-only session.
    """
    options = dict(options or {})
    config = dict(config or {})
    check_options(options, config)
    dev = device if device is not None else device_for(target)
    so = sess_options if sess_options is not None else _ort().SessionOptions()
    for key, value in config.items():
        so.add_session_config_entry(key, str(value))
    so.add_provider_for_devices([dev], options)
    return so


def create_session(model, device=None, options: Optional[Dict[str, str]] = None,
                   sess_options: Optional["ort.SessionOptions"] = None, **kwargs) -> "ort.InferenceSession":
    """An InferenceSession on a kiln device (default: :func:`host_device`).

    ``options`` are kiln's EP options (``target``, ``disabled_ops``, ``claim``, ``force_ops``,
    ``context_storage``, ``shape_cache``, ``winograd``; see docs/options.md). Unlike a
    plain ``ort.InferenceSession``, errors from kiln are raised: ORT's Python
    wrapper otherwise catches a failed EP creation (e.g. a bad option), prints
    "EP Error ... Falling back" and silently runs everything on the CPU EP.
    Pass ``enable_fallback=1`` to get that behaviour back.
    """
    ort = _ort()
    so = sess_options if sess_options is not None else ort.SessionOptions()
    so.add_provider_for_devices([device if device is not None else host_device()], dict(options or {}))
    kwargs.setdefault("enable_fallback", 0)
    return ort.InferenceSession(model, so, **kwargs)


# --------------------------------------------------------------------------
# stats
# --------------------------------------------------------------------------
class KilnStats(ctypes.Structure):
    """Mirror of ``struct KilnStats`` (include/kiln_ep.h).

    ``kiln_ep_stats(out, size)`` copies at most ``size`` bytes, so this mirror
    may lag behind the library's struct safely: newer fields are just not read.
    """

    _fields_ = [
        ("eps_created", ctypes.c_uint64),
        ("partitions_compiled", ctypes.c_uint64),
        ("nodes_compiled", ctypes.c_uint64),
        ("compute_calls", ctypes.c_uint64),
        ("context_files_opened", ctypes.c_uint64),
        ("context_graphs_loaded", ctypes.c_uint64),
        ("context_files_shared", ctypes.c_uint64),
        ("context_bytes_written", ctypes.c_uint64),
        ("context_bytes_deduplicated", ctypes.c_uint64),
        ("parallel_for_calls", ctypes.c_uint64),
        ("eps_released", ctypes.c_uint64),
        ("sessions_initialized", ctypes.c_uint64),
        ("concurrency_queries", ctypes.c_uint64),
        ("device_queries", ctypes.c_uint64),
        ("factories_created", ctypes.c_uint64),
        ("factories_freed", ctypes.c_uint64),
        ("shapes_specialized", ctypes.c_uint64),
        ("pool_rendezvous", ctypes.c_uint64),
        ("pool_rendezvous_joined", ctypes.c_uint64),
    ]


STAT_FIELDS = tuple(f for f, _ in KilnStats._fields_)


def _library_in_use() -> str:
    """The library registered most recently through :func:`register`, else :func:`get_library_path`."""
    with _lock:
        paths = list(_registered.values())
    return paths[-1] if paths else get_library_path()


def last_left_out(library_path: Optional[str] = None) -> str:
    """What kiln's last GetCapability on this thread left to other EPs, by op type and reason,
    as its INFO log line sums it up: ``"12 x Conv: left to ORT by the cost rule: ..."``, pairs
    joined by ``"; "``; empty when it left nothing. ORT runs GetCapability on the thread that
    creates or compiles a session, so ask right after that, on the same thread."""
    from . import _native
    return _native.last_left_out(os.path.abspath(library_path or _library_in_use()))


def _stats_function(path: str):
    try:
        fn = _native.cdll(path).kiln_ep_stats
    except AttributeError as exc:
        raise RuntimeError(f"{path} does not export kiln_ep_stats()") from exc
    fn.argtypes = [ctypes.POINTER(KilnStats), ctypes.c_size_t]
    fn.restype = ctypes.c_size_t
    return fn


def stats(library_path: Optional[str] = None) -> Dict[str, int]:
    """kiln's process-wide counters as a dict.

    Keys: ``eps_created``, ``partitions_compiled``, ``nodes_compiled``,
    ``compute_calls``, ``context_files_opened``, ``context_graphs_loaded``,
    ``context_files_shared``, ``context_bytes_written``,
    ``context_bytes_deduplicated``, ``parallel_for_calls``, ``eps_released``,
    ``sessions_initialized``, ``concurrency_queries``, ``device_queries``,
    ``factories_created``, ``factories_freed``, ``shapes_specialized`` (programs built at a
    first run with a new input shape), ``pool_rendezvous`` and
    ``pool_rendezvous_joined`` (calls kiln made to learn whether the session's
    intra-op pool has threads, and those a pool thread joined). Counts since the library was loaded into
    this process.
    Reads the library registered most recently through :func:`register` (or
    ``library_path``, or :func:`get_library_path`); the dynamic loader hands
    back the very instance ONNX Runtime loaded, so the counters include work
    done by ONNX Runtime sessions.
    """
    if library_path is None:
        library_path = _library_in_use()
    s = KilnStats()
    size = _stats_function(os.path.abspath(library_path))(ctypes.byref(s), ctypes.sizeof(s))
    # An older library fills fewer fields; report only what it has.
    known = [f for f, t in KilnStats._fields_ if getattr(KilnStats, f).offset + ctypes.sizeof(t) <= size]
    return {f: int(getattr(s, f)) for f in known}


# The compile API and the context inspector live in their own modules; imported
# last because they use the helpers above.
from .compiler import CompileResult, compile  # noqa: E402
from .inspection import ContextReport, inspect  # noqa: E402
