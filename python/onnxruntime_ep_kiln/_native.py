"""ctypes bindings for kiln's own C exports (``include/kiln_ep.h``).

ONNX Runtime loads ``libkiln_ep.so`` itself; the dynamic loader hands ctypes the
same instance, so ``kiln_ep_stats`` counts what ORT's sessions did. The other
exports let Python use kiln's Rust code instead of copies of it: the option
parser ``CreateEp`` uses and the context-binary reader.
"""
from __future__ import annotations

import ctypes
import json
import os
import threading
from typing import Dict, Mapping, Optional, Tuple

_lock = threading.Lock()
# path -> handle, kept open so the counters survive unregistering
_cdlls: Dict[str, ctypes.CDLL] = {}


def cdll(path: str) -> ctypes.CDLL:
    """The library at ``path`` (loaded once per process)."""
    path = os.path.abspath(path)
    with _lock:
        lib = _cdlls.get(path)
        if lib is None:
            lib = ctypes.CDLL(path)
            _cdlls[path] = lib
    return lib


def _export(path: str, name: str):
    try:
        return getattr(cdll(path), name)
    except AttributeError:
        raise RuntimeError(f"{path} does not export {name}(): it is an older kiln; rebuild it") from None


def check_options(path: str, options: Mapping[str, str]) -> Tuple[int, str]:
    """``kiln_ep_check_options``: (0, "") if kiln accepts ``options``, else (code, message)."""
    fn = _export(path, "kiln_ep_check_options")
    fn.argtypes = [ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_char_p), ctypes.c_size_t,
                   ctypes.c_char_p, ctypes.c_size_t]
    fn.restype = ctypes.c_int32
    items = [(str(k).encode(), str(v).encode()) for k, v in options.items()]
    keys = (ctypes.c_char_p * max(len(items), 1))(*[k for k, _ in items])
    values = (ctypes.c_char_p * max(len(items), 1))(*[v for _, v in items])
    message = ctypes.create_string_buffer(8192)
    code = fn(keys, values, len(items), message, len(message))
    return int(code), message.value.decode("utf-8", "replace")


def inspect_context(path: str, *, file: Optional[str] = None, data: Optional[bytes] = None) -> dict:
    """``kiln_ep_inspect_context`` on a binary file or bytes, as a dict (see docs/context-format.md)."""
    fn = _export(path, "kiln_ep_inspect_context")
    fn.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t]
    fn.restype = ctypes.c_size_t
    c_path = os.fsencode(file) if file is not None else None
    return json.loads(_text(lambda out, size: fn(c_path, data, len(data) if data is not None else 0, out, size)))


def _text(write) -> str:
    """The text an export copies as ``snprintf`` does: ``write(buffer, size)`` returns the
    text's full length, so a buffer too small is replaced by one with room for all of it."""
    size = 4096
    while True:
        out = ctypes.create_string_buffer(size)
        n = write(out, size)
        if n < size:
            return out.raw[:n].decode("utf-8")
        size = n + 1


def last_left_out(path: str) -> str:
    """``kiln_ep_last_left_out``: what the last GetCapability on this thread left to other EPs,
    by op type and reason (``"12 x Conv: left to ORT by the cost rule: ..."``); empty if nothing."""
    fn = _export(path, "kiln_ep_last_left_out")
    fn.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    fn.restype = ctypes.c_size_t
    return _text(fn)
