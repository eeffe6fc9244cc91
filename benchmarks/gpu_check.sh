#!/usr/bin/env bash
# The GPU check, in one go on a GPU machine (an H200 through the device tool):
#
#   make gpu-carry                                   # here: what the GPU machine lacks
#   GPU_CHECK_OUT=/somewhere make gpu-check          # there (the device tool: GPU_CHECK_OUT=$OUT)
#
# 1. installs inferd's missing dependencies from the carried wheels (no network there) and builds
#    inferd with its C++ core; 2. builds and runs the core's GoogleTest suite (the CUDA tests then
#    exercise real streams, device memory, copies, events and copy-engine overlap); 3. runs
#    benchmarks/gpu_check.py: the correctness table (each GPU executor against a float64 CPU
#    reference) and the throughput table (served through gRPC against the raw engine at batch 1, 8,
#    32 and max), naming every executor it could not run and why, and the CUDA shared-memory check
#    (a client's cudaMalloc'd memory registered by IPC handle: correctness, refusals, raw against
#    CUDA shm throughput). Everything goes to GPU_CHECK_OUT.
# Exits non-zero only when something that ran failed; absent packages are reported, not failures.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${GPU_CHECK_OUT:-${OUT:-benchmarks/out/gpu-check}}"
CARRY="${GPU_CARRY:-build/gpu-carry}"
PYTHON="${PYTHON:-python3}"
mkdir -p "$OUT"
exec > >(tee "$OUT/gpu_check.log") 2>&1
status=0
step() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }

step "machine"
nvidia-smi -L || echo "nvidia-smi: not available"
"$PYTHON" -c 'import sys, torch; print(sys.version.split()[0], "torch", torch.__version__, "cuda", torch.cuda.is_available())' \
  || echo "no PyTorch"

# The core's transport links grpc++ (found through pkg-config). Where the machine has none, use the
# kit `make gpu-carry` unpacked from Debian 12's packages: its pkgconf reads its .pc files
# (PKG_CONFIG_LIBDIR: those alone; PKG_CONFIG_SYSROOT_DIR turns their /usr into the kit's), for
# `pip install -e .` and the cmake build below alike, and LD_LIBRARY_PATH lets the built extension,
# in this shell and in the servers gpu_check.py starts, load the kit's libraries. libssl3 and
# zlib1g (linked against from grpc/fallback) come from the machine unless it has none.
step "grpc++"
grpc_root="$CARRY/grpc/root"
if command -v pkg-config >/dev/null 2>&1 && pkg-config --exists grpc++; then
  echo "the machine's grpc++ $(pkg-config --modversion grpc++) ($(command -v pkg-config))"
elif [ -d "$grpc_root" ]; then
  grpc_root="$(cd "$grpc_root" && pwd)"
  grpc_lib="$grpc_root/usr/lib/x86_64-linux-gnu"
  export PATH="$grpc_root/usr/bin:$PATH"
  export LD_LIBRARY_PATH="$grpc_lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  export PKG_CONFIG="$grpc_root/usr/bin/pkgconf"  # CMake's FindPkgConfig takes it before PATH
  export PKG_CONFIG_PATH="$grpc_lib/pkgconfig" PKG_CONFIG_LIBDIR="$grpc_lib/pkgconfig"
  export PKG_CONFIG_SYSROOT_DIR="$grpc_root"
  for fallback in "$(dirname "$grpc_root")"/fallback/*/; do
    fallback="${fallback%/}"
    for so in "$fallback"/*.so*; do
      if ! "$PYTHON" -c 'import ctypes, sys; ctypes.CDLL(sys.argv[1])' "$(basename "$so")" 2>/dev/null; then
        echo "no $(basename "$so") on this machine: using the carried one"
        export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$fallback"
        break
      fi
    done
  done
  echo "grpc++ from $grpc_root"
  echo "PATH=$grpc_root/usr/bin:... PKG_CONFIG=$PKG_CONFIG"
  echo "PKG_CONFIG_PATH=PKG_CONFIG_LIBDIR=$PKG_CONFIG_LIBDIR PKG_CONFIG_SYSROOT_DIR=$PKG_CONFIG_SYSROOT_DIR"
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  if v="$(pkg-config --modversion grpc++)"; then
    echo "pkg-config: grpc++ $v, $(pkg-config --cflags-only-I --libs-only-L grpc++ | tr ' ' '\n' | sort -u | xargs)"
  else
    echo "the carried pkg-config cannot read grpc++ (above): the build will fail"; status=1
  fi
else
  echo "no grpc++ on this machine (pkg-config) and no $grpc_root: run make gpu-carry here first"
fi

step "install from $CARRY (no network)"
if [ -d "$CARRY/wheels" ]; then
  "$PYTHON" -m pip install -q --no-index --find-links "$CARRY/wheels" "$CARRY"/wheels/*.whl || status=1
else
  echo "no $CARRY/wheels: using what is installed"
fi
# The GPU machine has no Boost: the core is built without its HTTP transport (the servers this
# check starts listen on gRPC only), with the carried RapidJSON headers for the core's codec.
http=(-DINFERD_BUILD_HTTP=OFF)
[ -d "$CARRY/rapidjson" ] && http+=(-DINFERD_RAPIDJSON_INCLUDE_DIR="$PWD/$CARRY")
"$PYTHON" -m pip install -q --no-index --no-build-isolation --no-deps \
  $(printf -- '-C cmake.define.%s ' "${http[@]#-D}") -e . || { echo "build failed"; exit 1; }

step "core tests (GoogleTest)"
gtest=()
[ -d "$CARRY/googletest" ] && gtest=(-DINFERD_GTEST_SOURCE_DIR="$PWD/$CARRY/googletest")
if cmake -S . -B build/gpu-cpp -DINFERD_BUILD_TESTS=ON -DINFERD_BUILD_PYTHON=OFF "${gtest[@]}" "${http[@]}" > "$OUT/cmake.log" 2>&1 \
   && cmake --build build/gpu-cpp -j "$(nproc)" >> "$OUT/cmake.log" 2>&1; then
  build/gpu-cpp/inferd_core_tests 2>&1 | tee "$OUT/core_tests.log" | grep -E "^\[  (PASSED|FAILED|SKIPPED) |256 MiB|no CUDA" || true
  [ "${PIPESTATUS[0]}" -eq 0 ] || status=1
else
  echo "core tests not built: see $OUT/cmake.log"; tail -5 "$OUT/cmake.log"; status=1
fi

step "correctness and throughput"
timeout 420 "$PYTHON" benchmarks/gpu_check.py --out "$OUT" || status=1

step "done: exit $status; tables in $OUT/gpu_check.md"
exit $status
