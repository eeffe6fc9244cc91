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

.PHONY: help setup system-deps build examples serve test test-cpp test-python test-sanitize lint bench clean

help:
	@echo "make serve          set up, build, write the example models, serve them on port $(PORT)"
	@echo "make test           set up, build, run the C++ (ctest) and Python (pytest) tests"
	@echo "make test-sanitize  C++ tests under AddressSanitizer and ThreadSanitizer"
	@echo "make lint           ruff, ruff format --check, mypy --strict"
	@echo "make bench          benchmarks/run.py: floor, naive server, inferd with and without batching (~15 min)"

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

lint: build
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

bench: examples
	$(PY) benchmarks/run.py --python $(PY) --repository $(EXAMPLES)

clean:
	rm -rf build $(EXAMPLES) .pytest_cache .mypy_cache .ruff_cache
