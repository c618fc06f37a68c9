"""Builds onnxruntime-ep-kiln: cargo compiles kiln (the crate at the repository root,
``../Cargo.toml``) and setuptools-rust copies ``libkiln_ep.so`` into the package.

The library is loaded by ONNX Runtime (``register_execution_provider_library``), never
imported by Python, so it keeps its plain name (no ``.cpython-311-x86_64-linux-gnu``
suffix) and the wheel is tagged ``py3-none-<platform>``: one wheel serves every Python 3.

``CARGO_TARGET_DIR`` is honoured; by default cargo uses the repository's ``target/``, so
after ``cargo build --release`` the wheel build compiles nothing. ``KILN_CARGO_MANIFEST``
names the crate's ``Cargo.toml`` when ``python/`` is built from a copy elsewhere (the tests
build the wheel from a copy, leaving the checkout untouched).

The crate lives outside ``python/``, so an sdist copies what cargo needs into ``crate/``
(``python -m build`` makes an sdist, then the wheel from it; that build compiles kiln in
``crate/target``).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig

from setuptools import setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.sdist import sdist
from setuptools_rust import Binding, RustExtension
from setuptools_rust.build import build_rust

HERE = os.path.dirname(os.path.abspath(__file__))
# The crate: KILN_CARGO_MANIFEST, the checkout around python/, or the copy inside an sdist.
CANDIDATES = [os.environ.get("KILN_CARGO_MANIFEST"), os.path.join(HERE, "..", "Cargo.toml"),
              os.path.join(HERE, "crate", "Cargo.toml")]
MANIFEST = next((m for m in CANDIDATES if m and os.path.isfile(m)), None)
if MANIFEST is None:
    sys.exit("onnxruntime-ep-kiln builds kiln's crate, and found no Cargo.toml: build from a kiln "
             "checkout (pip wheel ./python, python -m build python) or set KILN_CARGO_MANIFEST")
CRATE_DIR = os.path.dirname(os.path.abspath(MANIFEST))

# What cargo needs to build the library from an sdist: the crate's sources and every
# target Cargo.toml names (cargo checks that their files exist).
CRATE_FILES = ["Cargo.toml", "Cargo.lock", "build.rs", "src", "include", "ffi-tests", "fuzz/replay.rs",
               "c-harness/driver.rs", "bench/gemm.rs", "bench/conv_kernels.rs", "LICENSE", "README.md"]


class sdist_with_crate(sdist):
    """An sdist that carries the crate in ``crate/``, so it builds without the checkout."""

    def make_release_tree(self, base_dir, files):
        super().make_release_tree(base_dir, files)
        for rel in CRATE_FILES:
            src = os.path.join(CRATE_DIR, rel)
            dest = os.path.join(base_dir, "crate", rel)
            if os.path.isdir(src):
                shutil.copytree(src, dest, ignore=shutil.ignore_patterns("target", "__pycache__"))
            elif os.path.isfile(src):
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                shutil.copy2(src, dest)


class build_rust_plain_name(build_rust):
    """setuptools-rust's build, with the library's plain file name and without debug info."""

    def get_dylib_ext_path(self, ext: RustExtension, target_fname: str) -> str:
        path = super().get_dylib_ext_path(ext, target_fname)
        suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
        if ext.binding is Binding.NoBinding and path.endswith(suffix):
            path = path[: -len(suffix)] + ".so"
        return path

    def install_extension(self, ext, dylib_paths, *args) -> None:
        super().install_extension(ext, dylib_paths, *args)
        # The release profile keeps line tables (debug = 1) for kiln's own
        # backtraces; the shipped copy drops them (about 4x smaller). Stripping
        # the copy, not asking cargo, keeps the build a no-op after `make build`.
        strip = shutil.which("strip")
        if strip is None:
            return
        for module in dylib_paths:
            path = self.get_dylib_ext_path(ext, module.module_name)
            if os.path.isfile(path):
                subprocess.run([strip, "--strip-debug", path], check=True)


class bdist_wheel_py3_none(bdist_wheel):
    """Tag ``py3-none-<platform>``: the library uses no Python ABI."""

    def get_tag(self):
        _, _, plat = super().get_tag()
        return "py3", "none", plat


setup(
    rust_extensions=[
        RustExtension(
            "onnxruntime_ep_kiln.libkiln_ep",
            path=MANIFEST,
            binding=Binding.NoBinding,
            # Cargo.toml's own crate types: `cargo rustc` then reuses what
            # `cargo build --release` built instead of recompiling for cdylib alone.
            args=["--crate-type", "cdylib,rlib"],
            py_limited_api=False,
        )
    ],
    cmdclass={"build_rust": build_rust_plain_name, "bdist_wheel": bdist_wheel_py3_none,
              "sdist": sdist_with_crate},
    zip_safe=False,
)
