"""The machine a benchmark ran on, in one line for its results file."""
from __future__ import annotations

import os
import platform


def _cpu() -> tuple[str, set]:
    model, flags = "unknown CPU", set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name") and model == "unknown CPU":
                    model = line.split(":", 1)[1].strip()
                elif line.startswith("flags") and not flags:
                    flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return model, flags


def _memory() -> str:
    try:
        with open("/proc/meminfo") as f:
            kb = int(f.readline().split()[1])
        return f"; {kb / 2**20:.0f} GiB RAM"
    except (OSError, ValueError, IndexError):
        return ""


def describe() -> str:
    """CPU model, CPUs usable, RAM, ISA, OS, Python, onnxruntime and kiln versions."""
    import onnxruntime as ort
    import onnxruntime_ep_kiln as kiln

    model, flags = _cpu()
    isa = "AVX-512" if "avx512f" in flags else ("AVX2" if "avx2" in flags else "SSE2")
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    return (f"{model}; {os.cpu_count()} logical CPUs ({usable} usable){_memory()}; {isa}; "
            f"{platform.system()} {platform.release()}; Python {platform.python_version()}; "
            f"onnxruntime {ort.__version__}; kiln {kiln.__version__}")


def publish(lines: list, out: str) -> None:
    """Prints a results table and writes it to `out` (its folder created)."""
    text = "\n".join(lines) + "\n"
    print(text)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        f.write(text)
