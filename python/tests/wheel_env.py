"""The kiln wheel, built from this checkout and installed into a fresh virtualenv.

* the wheel is built from a copy of ``python/`` (so the checkout gets no ``build/``)
  with ``pip wheel --no-build-isolation``: setuptools-rust runs cargo on the
  repository's crate with the repository's ``target/``, a no-op after ``make build``;
* the virtualenv is made without pip and the wheel installed into it by this
  interpreter's pip (``pip --python``), offline and in seconds;
* ONNX Runtime, numpy and onnx come from this interpreter's site-packages through a
  ``.pth`` file, unless ``KILN_TEST_NO_ORT=1`` is set for a process (then the venv
  holds nothing but the kiln package, as for a user who has not installed ORT);
* commands run outside the repository, without ``PYTHONPATH`` or
  ``KILN_EP_LIBRARY``: kiln and its library can only come from the wheel.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from typing import Dict, Optional

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(TESTS_DIR)
REPO_DIR = os.path.dirname(PYTHON_DIR)


def build_wheel(workdir: str) -> str:
    """Path of the wheel built into ``workdir``."""
    src = os.path.join(workdir, "python")
    shutil.copytree(PYTHON_DIR, src, ignore=shutil.ignore_patterns(
        "tests", "build", "*.egg-info", "__pycache__", "libkiln_ep.so"))
    env = dict(os.environ)
    env["CARGO_TARGET_DIR"] = os.path.join(REPO_DIR, "target")
    env["KILN_CARGO_MANIFEST"] = os.path.join(REPO_DIR, "Cargo.toml")
    dist = os.path.join(workdir, "dist")
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--no-deps",
                        "-w", dist, src], env=env, capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        raise AssertionError(f"building the wheel failed (make venv installs setuptools-rust):\n"
                             f"{p.stdout}\n{p.stderr}")
    wheels = [f for f in os.listdir(dist) if f.endswith(".whl")]
    assert len(wheels) == 1, wheels
    return os.path.join(dist, wheels[0])


class WheelEnv:
    """A fresh virtualenv holding the installed wheel."""

    def __init__(self, root: str, wheel: str):
        self.root = root
        self.wheel = wheel
        self.venv = os.path.join(root, "venv")
        self.workdir = os.path.join(root, "work")
        os.makedirs(self.workdir)
        subprocess.run([sys.executable, "-m", "venv", "--without-pip", self.venv], check=True, timeout=300)
        self.python = os.path.join(self.venv, "bin", "python")
        # Without PYTHONPATH: pip would take a checkout's python/*.egg-info for an
        # installed onnxruntime-ep-kiln and install nothing.
        p = subprocess.run([sys.executable, "-m", "pip", "--python", self.python, "install", "-q", "--no-deps",
                            "--no-index", wheel], capture_output=True, text=True, timeout=600,
                           cwd=self.workdir, env=self.env())
        assert p.returncode == 0, p.stdout + p.stderr
        self.site = subprocess.check_output(
            [self.python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"], text=True).strip()
        deps = sysconfig.get_paths()["purelib"]  # this interpreter's: onnxruntime, numpy, onnx
        with open(os.path.join(self.site, "zz_kiln_test_deps.pth"), "w") as f:
            f.write(f"import os, sys; os.environ.get('KILN_TEST_NO_ORT') or sys.path.append({deps!r})\n")

    def bin(self, name: str) -> str:
        return os.path.join(self.venv, "bin", name)

    def env(self, no_ort: bool = False, extra: Optional[Dict[str, str]] = None) -> Dict[str, str]:
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "KILN_EP_LIBRARY", "KILN_MAX_TARGET", "KILN_DEBUG")}
        if no_ort:
            env["KILN_TEST_NO_ORT"] = "1"
        env.update(extra or {})
        return env

    def run(self, *args: str, no_ort: bool = False, env: Optional[Dict[str, str]] = None,
            cwd: Optional[str] = None, timeout: int = 600) -> subprocess.CompletedProcess:
        """Run a command of the venv (``kiln``, ``python``, ...) outside the repository."""
        cmd = [self.bin(args[0]), *args[1:]]
        return subprocess.run(cmd, cwd=cwd or self.workdir, env=self.env(no_ort, env),
                              capture_output=True, text=True, timeout=timeout)

    def python_code(self, code: str, **kwargs) -> subprocess.CompletedProcess:
        return self.run("python", "-c", code, **kwargs)
