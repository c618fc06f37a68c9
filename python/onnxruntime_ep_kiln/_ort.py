"""ONNX Runtime, imported when a helper first needs it.

The package does not depend on the ``onnxruntime`` distribution (users pick
``onnxruntime``, a nightly, ...), so ``import onnxruntime_ep_kiln`` works without
it and only the helpers that talk to ONNX Runtime fail, with a message saying
how to install it.
"""
from __future__ import annotations

#: The ONNX Runtime kiln is tested against (the ``[ort]`` extra pins it).
TESTED_ORT_VERSION = "1.31.1"

INSTALL_HINT = (
    "install ONNX Runtime: pip install 'onnxruntime-ep-kiln[ort]' (pins the tested "
    f"onnxruntime=={TESTED_ORT_VERSION}) or pip install onnxruntime (1.24 or newer)"
)


class OrtMissingError(ImportError):
    """ONNX Runtime is not installed; the message says how to install it."""


def ort():
    """The ``onnxruntime`` module; :class:`OrtMissingError` if it is not installed."""
    try:
        import onnxruntime
    except ImportError as exc:
        raise OrtMissingError(f"onnxruntime_ep_kiln needs ONNX Runtime, which cannot be imported "
                              f"({exc}); {INSTALL_HINT}") from None
    return onnxruntime


def onnx():
    """The ``onnx`` module (read compiled models); ImportError with a hint if missing."""
    try:
        import onnx as onnx_module
    except ImportError as exc:
        raise ImportError(f"reading ONNX models needs the onnx package, which cannot be imported "
                          f"({exc}): pip install 'onnxruntime-ep-kiln[onnx]' (or pip install onnx)") from None
    return onnx_module
