"""The machine a benchmark ran on, in one line for its results file."""
from __future__ import annotations

import os
import platform


def _cpu() -> tuple[str, set]:
    model, flags, family, number = "unknown CPU", set(), None, None
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key, value = key.strip(), value.strip()
                if key == "model name" and model == "unknown CPU":
                    model = value
                elif key == "cpu family" and family is None:
                    family = int(value)
                elif key == "model" and number is None:
                    number = int(value)
                elif key == "flags" and not flags:
                    flags = set(value.split())
    except (OSError, ValueError):
        pass
    if family is not None and number is not None:
        # A VM often reports just "AMD EPYC": the family tells Zen 3/4 from Zen 5.
        core = _core(model, family, number)
        model = f"{model} ({core + ', ' if core else ''}family {family} model {number})"
    return model, flags


def _core(model: str, family: int, number: int) -> str:
    """The microarchitecture for the CPUs kiln has met (empty when unsure)."""
    if "AMD" in model:
        if family == 26:
            return "Zen 5"
        if family == 25:
            return "Zen 4" if 0x10 <= number <= 0x1F or 0x60 <= number <= 0xAF else "Zen 3"
    if "Intel" in model and family == 6:
        return {0x8F: "Sapphire Rapids", 0xCF: "Emerald Rapids", 0x6A: "Ice Lake", 0x55: "Skylake/Cascade Lake"}.get(number, "")
    return ""


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
