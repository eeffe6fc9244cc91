#!/usr/bin/env bash
# Where inferd's CPU goes per chain in benchmarks/ensemble.py's two shapes: perf samples of the
# server's threads, by thread and symbol, while benchmarks/ensemble_client.py loads it.
#
#   benchmarks/ensemble_profile.sh ensemble 1        # one client, one call to the chain each
#   benchmarks/ensemble_profile.sh client-chain 1    # one client calling the three steps itself
#
# The repository is benchmarks/ensemble.py's (add_one -> scale -> squash, FP32 [batch, 16], and the
# `chain` ensemble), written into a temporary folder and served over the Unix socket. The client
# runs for PERF_SECONDS (4) + 4 s; perf records PERF_SECONDS of it at 499 Hz without call graphs.
# Prints the client's figures, the samples per thread and the hottest symbols per thread (>= 1 %).
set -euo pipefail
cd "$(dirname "$0")/.."
shape=${1:?ensemble or client-chain}
clients=${2:-1}
seconds=${PERF_SECONDS:-4}
work=$(mktemp -d /tmp/inferd-ensemble-profile.XXXXXX)
socket=$work/inferd.sock
.venv/bin/python -c "import pathlib, sys; sys.path.insert(0, 'benchmarks'); import ensemble; ensemble.write_repository(pathlib.Path(sys.argv[1]), 32, True)" "$work/repository"
.venv/bin/python -m inferd serve --model-repository "$work/repository" --grpc-port off \
  --metrics-port 0 --grpc-unix-socket "$socket" --log-format json 2>"$work/server.log" &
server=$!
trap 'kill -INT $server 2>/dev/null; wait $server 2>/dev/null || true; rm -rf "$work"' EXIT
for _ in $(seq 120); do grep -q '"server started"' "$work/server.log" && break; sleep 0.5; done
.venv/bin/python benchmarks/ensemble_client.py --target "unix:$socket" --shape "$shape" \
  --clients "$clients" --warmup 2 --seconds $((seconds + 2)) >"$work/client.log" 2>&1 &
load=$!
sleep 3
perf record -F 499 -p "$server" -o "$work/perf.data" -- sleep "$seconds" >/dev/null 2>&1
wait $load || true
tail -1 "$work/client.log"
perf report -i "$work/perf.data" --sort comm --stdio 2>/dev/null | grep '%'
perf report -i "$work/perf.data" --sort comm,dso,sym --stdio --percent-limit 1 2>/dev/null |
  grep '%' | head -"${LINES_SHOWN:-40}"
