"""HTTP/REST against gRPC on one inferd, in one run: perf_analyzer over each protocol, taking turns
round after round (drift on a shared machine falls on both alike), the median of the rounds.

    python benchmarks/http_vs_grpc.py      # simple c=1 and c=16, 4 MiB FP32 c=4; 3 rounds
    python benchmarks/http_vs_grpc.py --rounds 2 --out benchmarks/out/http

Issue 27's targets, as ratios of the same run: HTTP tiny at c=16 >= 0.8 x gRPC's throughput, with
server CPU per inference <= 1.5 x gRPC's; HTTP c=1 p50 <= gRPC p50 + 100 us; 4 MiB binary tensors:
HTTP bytes/s >= 0.8 x gRPC's. perf_analyzer sends HTTP inputs and asks for outputs as binary (its
default, as tritonclient.http's). Writes ``http.json`` and ``http.md`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import harness
import server_usage

# (name, model, concurrency, perf_analyzer's extra flags, bytes of one request's input)
CASES = [
    ("simple c=1", "simple", 1, [], 2 * 16 * 4),
    ("simple c=16", "simple", 16, [], 2 * 16 * 4),
    ("4 MiB FP32 c=4", "identity_fp32", 4, ["--shape", "INPUT0:1048576"], 4 << 20),
]
PROTOCOLS = ("grpc", "http")


def measure(
    pa: harness.PerfAnalyzer, server: harness.Server, http_port: int, case: tuple[Any, ...],
    protocol: str, interval_ms: int, log: Path,
) -> dict[str, Any]:  # fmt: skip
    _name, model, concurrency, extra, _bytes = case
    port = http_port if protocol == "http" else server.port
    # A shared 2-core machine: windows within 25 % of each other count as stable (default 10 %).
    flags = [*extra, "--stability-percentage", "25"]
    if protocol == "http":
        flags += ["-i", "http"]
    stats = server_usage.StatisticsClient(server.port)
    try:
        start = server_usage.sample(server.pid, stats, model)
        result = pa.measure(model, port, concurrency, interval_ms, flags, log)
        end = server_usage.sample(server.pid, stats, model)
    finally:
        stats.close()
    out = result.summary()
    out["usage"] = server_usage.usage(server.pid, start, end)
    out["protocol"] = protocol
    return out


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--python", default=sys.executable, help="Python with inferd installed")
    parser.add_argument("--repository", type=Path, default=Path("examples-repo"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--interval-ms", type=int, default=4000, help="perf_analyzer window")
    parser.add_argument("--out", type=Path, help="default benchmarks/out/http-<timestamp>/")
    args = parser.parse_args()

    python = str(Path(args.python).absolute()) if "/" in args.python else args.python
    started = datetime.now()
    out = args.out or harness.BENCHMARKS / "out" / f"http-{started.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    if not (args.repository / "simple").is_dir():
        subprocess.run([python, "-m", "inferd", "make-examples", str(args.repository)], check=True)
    pa = harness.PerfAnalyzer.find(python)
    machine = harness.machine_info(python)
    print(f"machine: {harness.describe_machine(machine)}\nout: {out}", flush=True)
    command = harness.inferd_command(python, args.repository, ["--http-port", "0"])
    server = harness.start_server(command, out / "server.log")
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {
        case[0]: {p: [] for p in PROTOCOLS} for case in CASES
    }
    with harness.running(server):
        assert server.http_port is not None
        for round_index in range(args.rounds):
            for case in CASES:
                # Alternate which protocol goes first, round by round.
                order = PROTOCOLS if round_index % 2 == 0 else tuple(reversed(PROTOCOLS))
                for protocol in order:
                    log = out / f"{case[0].replace(' ', '_')}-{protocol}-{round_index}.log"
                    result = measure(
                        pa, server, server.http_port, case, protocol, args.interval_ms, log
                    )
                    runs[case[0]][protocol].append(result)
                    usage = result["usage"]
                    print(
                        f"round {round_index + 1} {case[0]:>16} {protocol:>4}: "
                        f"{result['infer_per_s'] or 0:9.0f} infer/s  "
                        f"p50 {result['p50_us'] or 0:7.0f} us"
                        f"  CPU {usage.get('server_cpu_us_per_infer') or 0:6.1f} us/infer"
                        + (f"  ERROR {result['error']}" if result["error"] else ""),
                        flush=True,
                    )

    def median(case: str, protocol: str, key: str) -> float | None:
        values = [r[key] for r in runs[case][protocol] if r.get(key) is not None]
        return statistics.median(values) if values else None

    def median_cpu(case: str, protocol: str) -> float | None:
        values = [
            r["usage"]["server_cpu_us_per_infer"]
            for r in runs[case][protocol]
            if r["usage"].get("server_cpu_us_per_infer") is not None
        ]
        return statistics.median(values) if values else None

    rows = []
    for name, _model, concurrency, _extra, request_bytes in CASES:
        row: dict[str, Any] = {"case": name, "concurrency": concurrency}
        for protocol in PROTOCOLS:
            rate = median(name, protocol, "infer_per_s")
            row[protocol] = {
                "infer_per_s": rate,
                "p50_us": median(name, protocol, "p50_us"),
                "p99_us": median(name, protocol, "p99_us"),
                "cpu_us_per_infer": median_cpu(name, protocol),
                "mib_per_s": None if rate is None else rate * request_bytes / (1 << 20),
            }
        rows.append(row)
    report = {
        "started": started.isoformat(),
        "machine": machine,
        "rounds": args.rounds,
        "rows": rows,
    }
    (out / "http.json").write_text(json.dumps({**report, "runs": runs}, indent=2))

    def ratio(a: float | None, b: float | None) -> str:
        return "n/a" if a is None or b is None or b == 0 else f"{a / b:.2f}"

    lines = [
        f"HTTP vs gRPC on one inferd, median of {args.rounds} rounds, perf_analyzer "
        f"{args.interval_ms} ms windows ({harness.describe_machine(machine)}).",
        "",
        "| case | gRPC infer/s | HTTP infer/s | HTTP / gRPC | gRPC p50 µs | HTTP p50 µs "
        "| gRPC CPU µs/infer | HTTP CPU µs/infer | HTTP / gRPC CPU |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for row in rows:
        g, h = row["grpc"], row["http"]
        lines.append(
            f"| {row['case']} | {g['infer_per_s'] or 0:,.0f} | {h['infer_per_s'] or 0:,.0f} "
            f"| {ratio(h['infer_per_s'], g['infer_per_s'])} | {g['p50_us'] or 0:,.0f} "
            f"| {h['p50_us'] or 0:,.0f} | {g['cpu_us_per_infer'] or 0:,.1f} "
            f"| {h['cpu_us_per_infer'] or 0:,.1f} "
            f"| {ratio(h['cpu_us_per_infer'], g['cpu_us_per_infer'])} |"
        )
    (out / "http.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
