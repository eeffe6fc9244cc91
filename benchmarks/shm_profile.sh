#!/usr/bin/env bash
# Where inferd's CPU goes for one size and mode of benchmarks/shared_memory.py: perf samples of
# the server's threads, with their callers, while perf_analyzer loads it over the Unix socket.
#
#   benchmarks/shm_profile.sh 16384 shm      # 16 MiB FP32 identity, system shared memory
#   benchmarks/shm_profile.sh 4096 raw       # 4 MiB in the request and the response
#
# The identity model (max_batch_size 8, dynamic batching completed by inferd) is written into a
# temporary folder; perf_analyzer runs at concurrency 4 (C), perf records PERF_SECONDS (4) of it
# with DWARF call graphs at 199 Hz. Prints perf_analyzer's throughput, the samples per thread and
# the hottest symbols with their callers (perf report --no-children, caller graph, >= 2 %).
set -euo pipefail
cd "$(dirname "$0")/.."
size_kib=${1:?size in KiB}
mode=${2:?raw or shm}
elements=$((size_kib * 1024 / 4))
work=$(mktemp -d /tmp/inferd-shm-profile.XXXXXX)
socket=$work/inferd.sock
.venv/bin/python -c "import pathlib, sys; from inferd.examples import write_identity_model; write_identity_model(pathlib.Path(sys.argv[1]), 'FP32', max_batch_size=8)" "$work/repository/identity"
.venv/bin/python -m inferd serve --model-repository "$work/repository" --grpc-port off \
  --metrics-port 0 --grpc-unix-socket "$socket" --log-format json 2>"$work/server.log" &
server=$!
trap 'kill -INT $server 2>/dev/null; wait $server 2>/dev/null || true; rm -rf "$work"' EXIT
for _ in $(seq 120); do grep -q '"server started"' "$work/server.log" && break; sleep 0.5; done
cudart=$(.venv/bin/python -c "import nvidia.cuda_runtime, os; print(os.path.join(nvidia.cuda_runtime.__path__[0], 'lib'))")
shm=()
if [ "$mode" = shm ]; then shm=(--shared-memory system --output-shared-memory-size $((size_kib * 1024))); fi
LD_LIBRARY_PATH=$cudart timeout 90 .venv/bin/perf_analyzer -m identity -i grpc -u "unix://$socket" \
  --concurrency-range "${C:-4}:${C:-4}" --measurement-interval 4000 --stability-percentage 50 \
  --shape "INPUT0:$elements" --async "${shm[@]}" >"$work/pa.log" 2>&1 &
load=$!
sleep 4
perf record -F 199 --call-graph dwarf,16384 -p "$server" -o "$work/perf.data" -- sleep "${PERF_SECONDS:-4}" >/dev/null 2>&1
wait $load || true
grep Throughput "$work/pa.log" | head -1
perf report -i "$work/perf.data" --no-children --sort comm -g none --stdio 2>/dev/null | grep '%'
perf report -i "$work/perf.data" --no-children --sort comm,sym --call-graph=caller,2,callee --stdio 2>/dev/null |
  grep -v -e '^$' -e '^#' -e '^ *| *$' | head -"${LINES_SHOWN:-80}"
