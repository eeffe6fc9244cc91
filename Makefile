# inferd: the commands a newcomer needs. `make serve` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
EXAMPLES ?= examples-repo
PORT ?= 8001
CPP_BUILD ?= build/cpp
JOBS ?= $(shell nproc)
# Debian packages the build and tests need: a C++ toolchain, CMake, GoogleTest, grpc++ and
# pkg-config (the core's gRPC transport), openssl (the TLS tests make their certificates), and
# libb64 for Triton's perf_analyzer (benchmarks); for the HTTP transport Boost (Beast and Asio),
# RapidJSON, protobuf's C++ library and compiler, OpenSSL's and zlib's headers, and curl (its tests).
APT_PACKAGES := g++ cmake make pkg-config libgtest-dev libgrpc++-dev openssl libb64-0d \
	libboost1.81-dev rapidjson-dev libprotobuf-dev protobuf-compiler libssl-dev zlib1g-dev curl

.PHONY: help setup system-deps build examples serve test test-cpp test-python test-sanitize test-asan-python lint bench gpu-carry gpu-check clean fuzz fuzz-ci fuzz-build fuzz-deps fuzz-live

help:
	@echo "make serve          set up, build, write the example models, serve them on port $(PORT)"
	@echo "make test           set up, build, run the C++ (ctest) and Python (pytest) tests"
	@echo "make test-sanitize  C++ tests under AddressSanitizer and ThreadSanitizer"
	@echo "make test-asan-python  every Python test against an AddressSanitizer build of the core"
	@echo "make lint           ruff, ruff format --check, mypy --strict, vulture (dead code), clang-format"
	@echo "make fuzz           libFuzzer (ASan + UBSan) on the request parser, builder and writer for FUZZ_SECONDS (600),"
	@echo "                    the HTTP codec for FUZZ_HTTP_SECONDS (300), the access policy, the worker ring's"
	@echo "                    descriptions for FUZZ_WORKER_SECONDS (120), then fuzz-live"
	@echo "make fuzz-ci        libFuzzer alone, bounded to FUZZ_CI_SECONDS (40), FUZZ_CI_HTTP_SECONDS (20),"
	@echo "                    FUZZ_CI_ACCESS_SECONDS (20) and FUZZ_CI_WORKER_SECONDS (10): what CI runs"
	@echo "make fuzz-live      hypothesis against a live server, FUZZ_LIVE_EXAMPLES (5000) examples per test"
	@echo "make bench          benchmarks/run.py: floor, naive server, inferd with and without batching (~15 min)"
	@echo "make bench-shm      benchmarks/shared_memory.py: raw bytes vs system shared memory, 64 KiB-16 MiB (5-15 min)"
	@echo "make bench-ensemble benchmarks/ensemble.py: a 3-step chain as an ensemble vs the client calling each step (~12 min)"
	@echo "make bench-python   benchmarks/python_backend.py: an identity python model vs the same as ONNX, and IPC per batch (8-15 min)"
	@echo "make bench-python-decoupled benchmarks/python_decoupled.py: a decoupled python model's streamed responses (~1 min)"
	@echo "make bench-soak-hostile benchmarks/soak.py --hostile: valid load beside hostile clients, 3 min (~4 min)"
	@echo "make gpu-carry      gather what the GPU machine lacks (wheels, GoogleTest sources, a grpc++ kit) into $(GPU_CARRY)"
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

# The native ONNX Runtime executor's test runs the onnxruntime wheel's library from .venv (when
# built) on a model kept in cpp/tests/data; without the library it skips, saying why.
ORT_TEST_ENV = INFERD_TEST_ORT_LIBRARY=$(abspath $(firstword $(wildcard $(VENV)/lib/python*/site-packages/onnxruntime/capi/libonnxruntime.so.*))) \
	INFERD_TEST_ORT_MODEL=$(CURDIR)/cpp/tests/data/onnxruntime_test_model.onnx

test-cpp: system-deps
	cmake -S . -B $(CPP_BUILD) -DINFERD_BUILD_TESTS=ON -DINFERD_WERROR=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	cmake --build $(CPP_BUILD) -j $(JOBS)
	cd $(CPP_BUILD) && $(ORT_TEST_ENV) ctest --output-on-failure

test-python: build
	$(PY) -m pytest

test-sanitize: system-deps
	for s in address thread; do \
	  if [ $$s = thread ]; then echo "ThreadSanitizer: inferd_transport_tests not built (grpc++ is not instrumented; they ran under address)"; fi; \
	  cmake -S . -B build/sanitize-$$s -DINFERD_BUILD_TESTS=ON -DINFERD_SANITIZE=$$s -DCMAKE_BUILD_TYPE=Debug >/dev/null && \
	  cmake --build build/sanitize-$$s -j $(JOBS) && \
	  (cd build/sanitize-$$s && $(ORT_TEST_ENV) ctest --output-on-failure) || exit 1; \
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

# vulture: dead code in the package; vulture_whitelist.py names what is used where it cannot see.
lint: build
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/vulture python/inferd vulture_whitelist.py --min-confidence 60
	$(VENV)/bin/clang-format --dry-run --Werror $$(git ls-files 'cpp/*.cpp' 'cpp/*.h' 'benchmarks/*.cpp')

# libFuzzer over the request path (cpp/fuzz/): parse_infer_request, build_inference_request and
# InferResponseWriter, built by clang with AddressSanitizer and UndefinedBehaviorSanitizer. The seed
# corpus is generated (cpp/fuzz/make_corpus.py); what the fuzzer adds stays in $(FUZZ_BUILD)/corpus
# between runs. cpp/fuzz/corpus/ holds the reproducers of crashes found so far: every run replays
# them first. A crash, leak, timeout or sanitizer report fails the target; its input is written to
# $(FUZZ_BUILD)/artifacts/ (replay: $(FUZZ_BUILD)/infer_request_fuzzer FILE).
# Debian 12's clang is 14; its fuzzer and sanitizer runtimes are in libclang-rt-14-dev, which clang
# only recommends. Elsewhere: make fuzz FUZZ_CLANG=<version>.
FUZZ_CLANG ?= 14
FUZZ_APT_PACKAGES := clang-$(FUZZ_CLANG) libclang-rt-$(FUZZ_CLANG)-dev
FUZZ_BUILD ?= build/fuzz
FUZZ_SECONDS ?= 600
# fuzz-ci's 80 s, split: the gRPC request path 40 s (was 60), the HTTP codec 20 s (below), the
# access policy 20 s.
FUZZ_CI_SECONDS ?= 40
FUZZ_ARGS ?=
FUZZ_RUN = $(FUZZ_BUILD)/infer_request_fuzzer -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
	-dict=cpp/fuzz/infer_request.dict -print_final_stats=1 -artifact_prefix=$(FUZZ_BUILD)/artifacts/ $(FUZZ_ARGS)
FUZZ_CORPORA = $(FUZZ_BUILD)/corpus $(FUZZ_BUILD)/seeds cpp/fuzz/corpus
# The HTTP codec's fuzzer (issue 27): decode_http_infer_request, build_inference_request and
# encode_http_infer_response; its seeds are request bodies (cpp/fuzz/make_http_corpus.py), each after
# a model byte and a header length (see http_request_fuzzer.cpp); cpp/fuzz/http-corpus/ holds the
# reproducers of what it found, replayed first.
FUZZ_HTTP_SECONDS ?= 300
FUZZ_CI_HTTP_SECONDS ?= 20
FUZZ_HTTP_RUN = $(FUZZ_BUILD)/http_request_fuzzer -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
	-dict=cpp/fuzz/http_request.dict -print_final_stats=1 -artifact_prefix=$(FUZZ_BUILD)/artifacts/http- $(FUZZ_ARGS)
FUZZ_HTTP_CORPORA = $(FUZZ_BUILD)/http-corpus $(FUZZ_BUILD)/http-seeds cpp/fuzz/http-corpus
# The access policy's fuzzer (method paths and metadata; issue 25): its seeds are every served
# path, refused or not (the last two bytes: no metadata, then TCP or the Unix socket).
FUZZ_ACCESS_SECONDS ?= 300
FUZZ_CI_ACCESS_SECONDS ?= 20
FUZZ_ACCESS_RUN = $(FUZZ_BUILD)/access_policy_fuzzer -max_len=512 -timeout=10 -rss_limit_mb=2048 \
	-dict=cpp/fuzz/access_policy.dict -print_final_stats=1 -artifact_prefix=$(FUZZ_BUILD)/artifacts/access- $(FUZZ_ARGS)
FUZZ_ACCESS_CORPORA = $(FUZZ_BUILD)/access-corpus $(FUZZ_BUILD)/access-seeds
# The worker ring's descriptions (issue 28: the worker's answers and calls, the server's batches
# and call answers; see worker_messages_fuzzer.cpp): no seeds, the format is small.
FUZZ_WORKER_SECONDS ?= 120
FUZZ_CI_WORKER_SECONDS ?= 10
FUZZ_WORKER_RUN = $(FUZZ_BUILD)/worker_messages_fuzzer -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
	-print_final_stats=1 -artifact_prefix=$(FUZZ_BUILD)/artifacts/worker- $(FUZZ_ARGS)
SERVED_METHODS := $(addprefix /inference.GRPCInferenceService/,ServerLive ServerReady ModelReady ServerMetadata \
	ModelMetadata ModelInfer ModelStreamInfer ModelConfig ModelStatistics RepositoryIndex RepositoryModelLoad \
	RepositoryModelUnload SystemSharedMemoryStatus SystemSharedMemoryRegister SystemSharedMemoryUnregister \
	CudaSharedMemoryStatus CudaSharedMemoryRegister CudaSharedMemoryUnregister TraceSetting LogSettings) \
	/grpc.health.v1.Health/Check /grpc.health.v1.Health/Watch \
	/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo /grpc.reflection.v1.ServerReflection/ServerReflectionInfo

fuzz-deps:
	@missing=""; for p in $(FUZZ_APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	  else echo "missing Debian packages:$$missing (sudo apt-get install$$missing)"; exit 1; fi; \
	fi

fuzz-build: setup fuzz-deps
	cmake -S . -B $(FUZZ_BUILD) -DINFERD_FUZZ=ON -DCMAKE_CXX_COMPILER=clang++-$(FUZZ_CLANG) -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
	cmake --build $(FUZZ_BUILD) -j $(JOBS) --target infer_request_fuzzer http_request_fuzzer access_policy_fuzzer \
	  worker_messages_fuzzer
	rm -rf $(FUZZ_BUILD)/seeds && $(PY) cpp/fuzz/make_corpus.py $(FUZZ_BUILD)/seeds
	rm -rf $(FUZZ_BUILD)/http-seeds && $(PY) cpp/fuzz/make_http_corpus.py $(FUZZ_BUILD)/http-seeds
	rm -rf $(FUZZ_BUILD)/access-seeds && mkdir -p $(FUZZ_BUILD)/access-seeds $(FUZZ_BUILD)/access-corpus
	i=0; for m in $(SERVED_METHODS); do i=$$((i+1)); \
	  printf '%s\000\000' "$$m" >$(FUZZ_BUILD)/access-seeds/$$i-unix; printf '%s\000\001' "$$m" >$(FUZZ_BUILD)/access-seeds/$$i-tcp; done
	mkdir -p $(FUZZ_BUILD)/corpus $(FUZZ_BUILD)/http-corpus $(FUZZ_BUILD)/worker-corpus $(FUZZ_BUILD)/artifacts

fuzz: fuzz-build
	$(FUZZ_RUN) -max_total_time=$(FUZZ_SECONDS) $(FUZZ_CORPORA)
	$(FUZZ_HTTP_RUN) -max_total_time=$(FUZZ_HTTP_SECONDS) $(FUZZ_HTTP_CORPORA)
	$(FUZZ_ACCESS_RUN) -max_total_time=$(FUZZ_ACCESS_SECONDS) $(FUZZ_ACCESS_CORPORA)
	$(FUZZ_WORKER_RUN) -max_total_time=$(FUZZ_WORKER_SECONDS) $(FUZZ_BUILD)/worker-corpus
	$(MAKE) fuzz-live

# hypothesis against a live server (tests/integration/test_fuzz_live_server.py): arbitrary
# ModelInferRequests and byte strings, good requests interleaved. The test suite runs it with the
# bounded, derandomized "ci" profile; the "long" profile draws new examples every run and keeps
# the failing ones in .hypothesis/ to replay them first.
FUZZ_LIVE_EXAMPLES ?= 5000
fuzz-live: build
	INFERD_FUZZ_PROFILE=long INFERD_FUZZ_EXAMPLES=$(FUZZ_LIVE_EXAMPLES) \
	  $(PY) -m pytest -p no:cacheprovider -o timeout=0 --hypothesis-show-statistics \
	  tests/integration/test_fuzz_live_server.py

fuzz-ci: fuzz-build
	$(FUZZ_RUN) -max_total_time=$(FUZZ_CI_SECONDS) $(FUZZ_CORPORA)
	$(FUZZ_HTTP_RUN) -max_total_time=$(FUZZ_CI_HTTP_SECONDS) $(FUZZ_HTTP_CORPORA)
	$(FUZZ_ACCESS_RUN) -max_total_time=$(FUZZ_CI_ACCESS_SECONDS) $(FUZZ_ACCESS_CORPORA)
	$(FUZZ_WORKER_RUN) -max_total_time=$(FUZZ_CI_WORKER_SECONDS) $(FUZZ_BUILD)/worker-corpus

bench: examples
	$(PY) benchmarks/run.py --python $(PY) --repository $(EXAMPLES)

# Issue 15: raw bytes against system shared memory over the Unix socket, an identity FP32 model at
# 64 KiB to 16 MiB, perf_analyzer at concurrency 4 (5-15 min).
.PHONY: bench-shm
bench-shm: build
	$(PY) benchmarks/shared_memory.py --python $(PY)

# Issue 16: a 3-step chain served as an ensemble against the client calling the three models itself,
# the same Python client for both, over TCP and the Unix socket at concurrency 1, 8, 32; perf_analyzer
# on the ensemble and on its first step as context (~12 min on the shared 2 cores).
.PHONY: bench-ensemble
bench-ensemble: build
	$(PY) benchmarks/ensemble.py --python $(PY)

# Issue 17: an identity python-backend model against the same identity as ONNX, perf_analyzer at
# concurrency 1, 16, 64 (server CPU per inference counts the python worker process too), then the
# worker's IPC round trip per batch against a bare socket ping-pong (8-15 min: 7.6 with -r6).
.PHONY: bench-python
bench-python: build
	$(PY) benchmarks/python_backend.py --python $(PY)

# Issue 17: the decoupled `generate` example's streamed responses, 1 and 16 tritonclient streams:
# responses per second, time to first response, server CPU per response (~1 min).
.PHONY: bench-python-decoupled
bench-python-decoupled: build
	$(PY) benchmarks/python_decoupled.py --python $(PY)

# Issue 25: perf_analyzer on mlp beside malformed, near-miss, churning, silent and stalled clients for
# 3 min; fails when a valid request fails, RSS or descriptors grow, or health p99 reaches 100 ms.
.PHONY: bench-soak-hostile
bench-soak-hostile: examples
	$(PY) benchmarks/soak.py --hostile --python $(PY) --repository $(EXAMPLES) --duration 180

# The GPU machine has CUDA, PyTorch and most of inferd's dependencies but no package registry:
# gpu-carry downloads (here) the CPython 3.12 wheels it lacks, copies GoogleTest's sources and
# unpacks a grpc++ kit (below); the device tool carries $(GPU_CARRY) over, and gpu-check installs
# from it with --no-index.
GPU_CARRY ?= build/gpu-carry
GPU_WHEELS := grpcio==1.85.3 grpcio-tools==1.85.1 protobuf==7.36.2 grpcio-health-checking==1.85.1 \
	grpcio-reflection==1.85.1 structlog==26.1.0 opentelemetry-api==1.45.2 opentelemetry-sdk==1.45.2 \
	opentelemetry-exporter-otlp-proto-grpc==1.45.2 opentelemetry-exporter-otlp-proto-common==1.45.2 \
	opentelemetry-exporter-otlp-common==0.66b2 opentelemetry-proto==1.45.2 \
	opentelemetry-semantic-conventions==0.66b2 googleapis-common-protos==1.76.0

# The grpc++ kit: the GPU machine has no libgrpc++-dev, so Debian 12's packages are unpacked into
# $(GPU_CARRY)/grpc/root, with pkgconf to read their .pc files there (gpu_check.sh points
# pkg-config, with PKG_CONFIG_SYSROOT_DIR, and the loader at it). Only what building against
# `pkg-config grpc++` and running the result needs is kept: the .pc files of its Requires chain, the
# shared libraries inferd links (GPU_GRPC_DROP: the others), the headers it includes (absl, grpc,
# grpcpp); no static archives, CMake configs or docs. The recipe checks the kit (pkg-config grpc++
# resolves, every -l and every NEEDED library is in it). libssl3 and zlib1g go to grpc/fallback/<package>:
# the link uses them (the .so links point there), but at run time the machine's own come first, and
# gpu_check.sh adds a fallback directory only where the machine has no such library.
GPU_GRPC_DEBS := libgrpc++-dev libgrpc++1.51 libgrpc-dev libgrpc29 libabsl-dev libabsl20220623 \
	libre2-dev libre2-9 libc-ares-dev libc-ares2 libssl-dev libssl3 zlib1g-dev zlib1g \
	pkgconf pkgconf-bin libpkgconf3
GPU_GRPC_DROP := libgrpc_unsecure* libgrpc++_unsecure* libgrpc_plugin_support* libgrpc++_alts* \
	libgrpc++_error_details* libgrpc++_reflection* libgrpcpp_channelz* pkgconfig/grpc_unsecure.pc \
	pkgconfig/grpc++_unsecure.pc cmake engines-3 ossl-modules
# Libraries that carried ones may need and every glibc system has (the check below allows them).
GPU_GRPC_SYSTEM_LIBS := libc.so.6 libm.so.6 ld-linux-x86-64.so.2 libstdc++.so.6 libgcc_s.so.1

gpu-carry: system-deps
	rm -rf $(GPU_CARRY) && mkdir -p $(GPU_CARRY)/wheels
	$(PYTHON) -m pip download -q --only-binary=:all: --no-deps --python-version 3.12 \
		--implementation cp --abi cp312 --abi abi3 --abi none --platform manylinux2014_x86_64 \
		--platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 --platform any \
		-d $(GPU_CARRY)/wheels $(GPU_WHEELS)
	cp -r /usr/src/googletest $(GPU_CARRY)/googletest
	cp -r /usr/include/rapidjson $(GPU_CARRY)/rapidjson  # header-only: the core's HTTP codec
	@set -e; g=$(GPU_CARRY)/grpc; r=$$g/root; lib=$$r/usr/lib/x86_64-linux-gnu; \
	tmp=$$(mktemp -d); trap 'rm -rf "$$tmp"' EXIT; \
	get() { (cd "$$tmp" && apt-get -q -o APT::Sandbox::User=root download $(GPU_GRPC_DEBS) >/dev/null); }; \
	get || { apt-get update -qq && get; }; \
	mkdir -p $$r; for d in "$$tmp"/*.deb; do dpkg-deb -x "$$d" "$$r"; done; \
	mkdir -p $$g/fallback/libssl3 $$g/fallback/zlib1g; \
	mv $$lib/libssl.so.3 $$lib/libcrypto.so.3 $$g/fallback/libssl3/; \
	cp -L $$r/lib/x86_64-linux-gnu/libz.so.1 $$g/fallback/zlib1g/; \
	ln -sfn ../../../../fallback/libssl3/libssl.so.3 $$lib/libssl.so; \
	ln -sfn ../../../../fallback/libssl3/libcrypto.so.3 $$lib/libcrypto.so; \
	ln -sfn ../../../../fallback/zlib1g/libz.so.1 $$lib/libz.so; \
	rm -rf $$r/lib $$r/usr/share $$r/usr/lib/pkgconfig; (cd $$lib && rm -rf $(GPU_GRPC_DROP)); \
	find $$r -name '*.a' -delete; \
	find $$r/usr/include -mindepth 1 -maxdepth 1 ! -name absl ! -name grpc ! -name grpcpp -exec rm -rf {} +; \
	sed -i 's|^libdir=$${exec_prefix}/lib$$|libdir=$${exec_prefix}/lib/x86_64-linux-gnu|' $$lib/pkgconfig/*.pc; \
	pc() { env -u PKG_CONFIG_PATH PKG_CONFIG_LIBDIR=$$lib/pkgconfig PKG_CONFIG_SYSROOT_DIR=$$r \
	  LD_LIBRARY_PATH=$$lib $$r/usr/bin/pkgconf "$$@"; }; \
	pc --cflags --libs grpc++ >/dev/null || { echo "gpu-carry: pkg-config grpc++ fails on the kit"; exit 1; }; \
	for l in $$(pc --libs-only-l grpc++); do case $$l in -latomic|-lrt) continue;; esac; \
	  [ -e $$lib/lib$${l#-l}.so ] || { echo "gpu-carry: no lib$${l#-l}.so in the kit"; exit 1; }; done; \
	for f in $$(find $$r $$g/fallback -type f -name '*.so*') $$r/usr/bin/pkgconf; do \
	  for n in $$(readelf -d $$f | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p'); do \
	    case " $(GPU_GRPC_SYSTEM_LIBS) " in *" $$n "*) continue;; esac; \
	    [ -e $$lib/$$n ] || [ -n "$$(find $$g/fallback -name $$n)" ] || { echo "gpu-carry: $$f needs $$n, not in the kit"; exit 1; }; \
	  done; done; \
	echo "grpc++ $$(pc --modversion grpc++) kit: $$(du -sh $$g | cut -f1) in $$g"
	du -sh $(GPU_CARRY)

gpu-check:
	bash benchmarks/gpu_check.sh

clean:
	rm -rf build $(EXAMPLES) .pytest_cache .mypy_cache .ruff_cache
