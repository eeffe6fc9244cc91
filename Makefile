# inferd: the commands a newcomer needs. `make serve` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
EXAMPLES ?= examples-repo
PORT ?= 8001
CPP_BUILD ?= build/cpp
JOBS ?= $(shell nproc)
# Debian packages the build and tests need: a C++ toolchain, CMake, GoogleTest, and libb64 for
# Triton's perf_analyzer (benchmarks).
APT_PACKAGES := g++ cmake make libgtest-dev libb64-0d

.PHONY: help setup system-deps build examples serve test test-cpp test-python test-sanitize test-asan-python lint bench gpu-carry gpu-check clean

help:
	@echo "make serve          set up, build, write the example models, serve them on port $(PORT)"
	@echo "make test           set up, build, run the C++ (ctest) and Python (pytest) tests"
	@echo "make test-sanitize  C++ tests under AddressSanitizer and ThreadSanitizer"
	@echo "make test-asan-python  every Python test against an AddressSanitizer build of the core"
	@echo "make lint           ruff, ruff format --check, mypy --strict"
	@echo "make bench          benchmarks/run.py: floor, naive server, inferd with and without batching (~15 min)"
	@echo "make gpu-carry      gather what the GPU machine lacks (wheels, GoogleTest sources) into $(GPU_CARRY)"
	@echo "make gpu-check      on a GPU machine: build, CUDA tests, correctness and throughput tables (GPU_CHECK_OUT)"

# Installs the Debian packages when one is missing and we may (root); otherwise says what is missing.
system-deps:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing; \
	  else echo "missing Debian packages:$$missing (sudo apt-get install$$missing)"; exit 1; fi; \
	fi

$(VENV)/.deps: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q "scikit-build-core>=0.10" "pybind11>=2.13" "grpcio-tools==1.85.1" ninja
	touch $@

setup: system-deps $(VENV)/.deps

# Editable install without build isolation: rebuilds are incremental in build/<wheel tag>.
build: setup
	$(PIP) install -q --no-build-isolation -e ".[cpu,dev]"

examples: build
	$(VENV)/bin/inferd make-examples $(EXAMPLES)

serve: examples
	$(VENV)/bin/inferd serve --model-repository $(EXAMPLES) --grpc-port $(PORT)

test: build test-cpp test-python

test-cpp: system-deps
	cmake -S . -B $(CPP_BUILD) -DINFERD_BUILD_TESTS=ON -DINFERD_WERROR=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	cmake --build $(CPP_BUILD) -j $(JOBS)
	cd $(CPP_BUILD) && ctest --output-on-failure

test-python: build
	$(PY) -m pytest

test-sanitize: system-deps
	for s in address thread; do \
	  cmake -S . -B build/sanitize-$$s -DINFERD_BUILD_TESTS=ON -DINFERD_SANITIZE=$$s -DCMAKE_BUILD_TYPE=Debug >/dev/null && \
	  cmake --build build/sanitize-$$s -j $(JOBS) && \
	  (cd build/sanitize-$$s && ctest --output-on-failure) || exit 1; \
	done

# The whole pytest suite (servers included) against an AddressSanitizer build of inferd._core, in a
# venv of its own. libstdc++ is preloaded after libasan so that exceptions thrown inside ONNX
# Runtime's uninstrumented library find the real __cxa_throw.
ASAN_VENV ?= build/asan-venv
test-asan-python: system-deps
	test -x $(ASAN_VENV)/bin/python || $(PYTHON) -m venv $(ASAN_VENV)
	$(ASAN_VENV)/bin/python -m pip install -q --upgrade pip
	$(ASAN_VENV)/bin/python -m pip install -q "scikit-build-core>=0.10" "pybind11>=2.13" "grpcio-tools==1.85.1" ninja
	$(ASAN_VENV)/bin/python -m pip install -q --no-build-isolation \
	  -C cmake.define.INFERD_SANITIZE=address -C build-dir=build/asan-wheel ".[cpu,dev]"
	$(ASAN_VENV)/bin/python -m pip install -q --no-build-isolation --force-reinstall --no-deps \
	  -C cmake.define.INFERD_SANITIZE=address -C build-dir=build/asan-wheel .
	ASAN_OPTIONS=detect_leaks=0 \
	  LD_PRELOAD="$$(gcc -print-file-name=libasan.so) $$(gcc -print-file-name=libstdc++.so)" \
	  $(ASAN_VENV)/bin/python -m pytest -p no:cacheprovider

lint: build
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

bench: examples
	$(PY) benchmarks/run.py --python $(PY) --repository $(EXAMPLES)

# The GPU machine has CUDA, PyTorch and most of inferd's dependencies but no package registry:
# gpu-carry downloads (here) the CPython 3.12 wheels it lacks and copies GoogleTest's sources;
# the device tool carries $(GPU_CARRY) over, and gpu-check installs from it with --no-index.
GPU_CARRY ?= build/gpu-carry
GPU_WHEELS := grpcio==1.85.3 grpcio-tools==1.85.1 protobuf==7.36.2 grpcio-health-checking==1.85.1 \
	grpcio-reflection==1.85.1 structlog==26.1.0 opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2 \
	opentelemetry-exporter-otlp-proto-grpc==1.45.2 opentelemetry-exporter-otlp-proto-common==1.45.2 \
	opentelemetry-exporter-otlp-common==0.66b2 opentelemetry-proto==1.45.2 \
	opentelemetry-semantic-conventions==0.66b2 googleapis-common-protos==1.76.0

gpu-carry: system-deps
	rm -rf $(GPU_CARRY) && mkdir -p $(GPU_CARRY)/wheels
	$(PYTHON) -m pip download -q --only-binary=:all: --no-deps --python-version 3.12 \
		--implementation cp --abi cp312 --abi abi3 --abi none --platform manylinux2014_x86_64 \
		--platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 --platform any \
		-d $(GPU_CARRY)/wheels $(GPU_WHEELS)
	cp -r /usr/src/googletest $(GPU_CARRY)/googletest
	du -sh $(GPU_CARRY)

gpu-check:
	bash benchmarks/gpu_check.sh

clean:
	rm -rf build $(EXAMPLES) .pytest_cache .mypy_cache .ruff_cache
