"""Builds onnxruntime-ep-kiln: cargo compiles kiln (the crate at the repository root,
``../Cargo.toml``) and setuptools-rust copies ``libkiln_ep.so`` into the package.

The library is loaded by ONNX Runtime (``register_execution_provider_library``), never
imported by Python, so it keeps its plain name (no ``.cpython-311-x86_64-linux-gnu``
suffix) and the wheel is tagged ``py3-none-<platform>``: one wheel serves every Python 3.

``CARGO_TARGET_DIR`` is honoured; by default cargo uses the repository's ``target/``, so
after ``cargo build --release`` the wheel build compiles nothing. ``KILN_CARGO_MANIFEST``
names the crate's ``Cargo.toml`` when ``python/`` is built from a copy elsewhere (the tests
build the wheel from a copy, leaving the checkout untouched).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig

from setuptools import setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools_rust import Binding, RustExtension
from setuptools_rust.build import build_rust

HERE = os.path.dirname(os.path.abspath(__file__))
MANIFEST = os.environ.get("KILN_CARGO_MANIFEST") or os.path.join(HERE, "..", "Cargo.toml")

if not os.path.isfile(MANIFEST):
    sys.exit(
        f"onnxruntime-ep-kiln builds from a kiln checkout: {MANIFEST} is missing. "
        "Build the wheel from the repository (pip wheel ./python, or python -m build --wheel python); "
        "an sdist cannot carry the crate, which lives outside python/."
    )


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
    cmdclass={"build_rust": build_rust_plain_name, "bdist_wheel": bdist_wheel_py3_none},
    zip_safe=False,
)
