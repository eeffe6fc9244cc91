#!/usr/bin/env bash
# CPU used by each thread of a server while perf_analyzer loads it: where the cores go.
#
#   MODEL=mlp C=64 benchmarks/thread_cpu.sh .venv/bin/python -m inferd serve \
#       --model-repository REPO --grpc-port 18556 --host 127.0.0.1
#   MODEL=mlp C=64 benchmarks/thread_cpu.sh .venv/bin/python benchmarks/transport_floor.py \
#       --model-repository examples-repo --model mlp --port 18556
#
# The server must listen on 127.0.0.1:${PORT:-18556}. Prints perf_analyzer's throughput and, per
# thread that used more than 1% of a core, the cores it used over a 4 s window under load.
set -euo pipefail
cd "$(dirname "$0")/.."
PORT=${PORT:-18556}
"$@" 2>/tmp/thread_cpu_server.log &
server=$!
trap 'kill -INT $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
sleep 3
cudart=$(.venv/bin/python -c "import nvidia.cuda_runtime, os; print(os.path.join(nvidia.cuda_runtime.__path__[0], 'lib'))")
LD_LIBRARY_PATH=$cudart timeout 60 .venv/bin/perf_analyzer -m "${MODEL:-simple}" -i grpc \
  -u "127.0.0.1:$PORT" --concurrency-range "${C:-16}:${C:-16}" --measurement-interval 4000 \
  --stability-percentage 50 >/tmp/thread_cpu_pa.log 2>&1 &
load=$!
snapshot() {
  for t in /proc/$server/task/*; do echo "$(basename "$t") $(cat "$t/comm") $(awk '{print $14+$15}' "$t/stat")"; done
}
sleep 2
snapshot >/tmp/thread_cpu_1
sleep 4
snapshot >/tmp/thread_cpu_2
wait $load || true
grep Throughput /tmp/thread_cpu_pa.log | head -1
ticks=$(getconf CLK_TCK)
join /tmp/thread_cpu_1 /tmp/thread_cpu_2 | awk -v hz="$ticks" '{d=$5-$3; total+=d; if (d>0.04*hz) printf "  thread %s %-14s %.2f cores\n", $1, $2, d/hz/4} END {printf "  total %.2f cores\n", total/hz/4}'
