"""Memory soak: inferd with dynamic batching under perf_analyzer load; does its RSS keep growing?

    python benchmarks/soak.py                         # mlp, concurrency 64, 300 s
    python benchmarks/soak.py --duration 60 --out benchmarks/out/soak-short

Starts ``inferd serve`` on a copy of the repository whose model's config.pbtxt gets
``dynamic_batching { }`` appended (``--max-queue-delay-us N`` sets the delay), drives the model with
perf_analyzer at ``--concurrency`` for ``--duration`` seconds without a pause (one perf_analyzer
run whose measurement window outlasts the soak, interrupted at the end: perf_analyzer then prints
no figures, so throughput comes from the server's own ModelStatistics), and samples the server
process's VmRSS (/proc/PID/status) every ``--interval`` seconds. Reports the RSS before the load,
at ``--baseline-at`` seconds of load (60; a third of the duration when the soak is not longer than
that), at the end, the peak and the growth from the baseline to the end in %. Writes
``soak.csv`` (one row per sample: seconds, RSS, inferences and batches so far) and ``soak.json``
into ``--out`` (default ``benchmarks/out/soak-<timestamp>/``). Exits 1 when the server or
perf_analyzer dies early, or the growth exceeds ``--max-growth-percent`` when given.

``--hostile`` runs the hostile soak of issue 25 instead (benchmarks/hostile_soak.py: valid load
beside malformed and hostile clients, sampled every second).
"""

from __future__ import annotations

import argparse
import csv
import json
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import grpc

import harness
import hostile_soak


def model_counts(port: int, model: str) -> tuple[int, int] | None:
    """(inference_count, execution_count) of the model's versions from ModelStatistics."""
    import inferd._proto.grpc_service_pb2 as pb
    import inferd._proto.grpc_service_pb2_grpc as pb_grpc

    try:
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            stats = stub.ModelStatistics(pb.ModelStatisticsRequest(name=model), timeout=5)
    except grpc.RpcError:
        return None
    inferences = sum(int(s.inference_count) for s in stats.model_stats)
    executions = sum(int(s.execution_count) for s in stats.model_stats)
    return inferences, executions


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--python", default=sys.executable, help="Python with inferd installed")
    parser.add_argument("--repository", type=Path, default=Path("examples-repo"))
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--duration", type=float, default=300, help="seconds of load")
    parser.add_argument(
        "--interval", type=float, help="seconds between RSS samples (5; --hostile: 1)"
    )
    parser.add_argument("--baseline-at", type=float, default=60, help="seconds of load")
    parser.add_argument("--max-queue-delay-us", type=int, help="dynamic_batching delay")
    parser.add_argument("--server-arg", action="append", default=[], help="extra inferd flag")
    parser.add_argument("--max-growth-percent", type=float, help="fail above this growth")
    parser.add_argument("--hostile", action="store_true", help="the hostile soak (issue 25)")
    parser.add_argument(
        "--health-p99-ms", type=float, default=100, help="--hostile: fail at this health p99"
    )
    parser.add_argument("--out", type=Path, help="default benchmarks/out/soak-<timestamp>/")
    args = parser.parse_args()
    args.interval = args.interval or (1 if args.hostile else 5)

    python = str(Path(args.python).absolute()) if "/" in args.python else args.python
    started = datetime.now()
    name = "hostile" if args.hostile else "soak"
    out = args.out or harness.BENCHMARKS / "out" / f"{name}-{started.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    if args.hostile:
        return hostile_soak.run(args, out, model_counts)
    pa = harness.PerfAnalyzer.find(python)
    machine = harness.machine_info(python)
    baseline_at = args.baseline_at if args.duration > args.baseline_at else args.duration / 3
    print(f"machine: {harness.describe_machine(machine)}\nout: {out}", flush=True)

    samples: list[dict[str, Any]] = []
    failures: list[str] = []
    with tempfile.TemporaryDirectory(prefix="inferd-soak-") as tmp:
        repository = Path(tmp) / "repository-batching"
        block = harness.batching_repository(
            args.repository.resolve(), repository, [args.model], args.max_queue_delay_us
        )
        server_cmd = harness.inferd_command(python, repository, args.server_arg)
        server = harness.start_server(server_cmd, out / "server.log")
        pa_log = (out / "perf_analyzer.log").open("w")
        try:
            idle_rss = harness.rss_kib(server.pid)
            window_ms = int((args.duration + 600) * 1000)  # never completes: interrupted
            pa_cmd = pa.command(
                args.model, server.port, args.concurrency, window_ms, str(out / "unused.csv")
            )
            load = subprocess.Popen(
                pa_cmd, env=pa.env, stdout=pa_log, stderr=subprocess.STDOUT, text=True
            )
            start = time.monotonic()
            next_sample = 0.0
            while True:
                now = time.monotonic() - start
                if now >= next_sample:
                    counts = model_counts(server.port, args.model)
                    samples.append(
                        {
                            "seconds": round(now, 2),
                            "rss_kib": harness.rss_kib(server.pid),
                            "inferences": counts[0] if counts else None,
                            "executions": counts[1] if counts else None,
                        }
                    )
                    rss = samples[-1]["rss_kib"]
                    print(
                        f"  t={now:6.1f} s  RSS {rss / 1024 if rss else 0:8.1f} MiB  "
                        f"inferences {samples[-1]['inferences']}",
                        flush=True,
                    )
                    next_sample += args.interval
                if now >= args.duration:
                    break
                if server.process.poll() is not None:
                    failures.append(f"server exited with {server.process.returncode}")
                    break
                if load.poll() is not None:
                    failures.append(f"perf_analyzer exited early with {load.returncode}")
                    break
                time.sleep(min(0.2, max(0.0, next_sample - now)))
            if load.poll() is None:
                load.send_signal(signal.SIGINT)
                try:
                    load.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    load.kill()
                    load.wait()
            final_rss = harness.rss_kib(server.pid)
        finally:
            server.stop()
            pa_log.close()

    with (out / "soak.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["seconds", "rss_kib", "inferences", "executions"])
        writer.writeheader()
        writer.writerows(samples)

    def sample_at(t: float) -> dict[str, Any]:
        return min(samples, key=lambda s: abs(s["seconds"] - t))

    base, end = sample_at(baseline_at), samples[-1]
    # Peak under load: the first sample is taken as perf_analyzer starts, before any answer.
    rss_values = [s["rss_kib"] for s in samples[1:] if s["rss_kib"]]
    growth = (
        (end["rss_kib"] - base["rss_kib"]) / base["rss_kib"] * 100
        if base["rss_kib"] and end["rss_kib"]
        else None
    )
    throughput = batch = None
    first, last = samples[0], samples[-1]
    if first["inferences"] is not None and last["inferences"] is not None:
        span = last["seconds"] - first["seconds"]
        done = last["inferences"] - first["inferences"]
        throughput = done / span if span > 0 else None
        executions = (last["executions"] or 0) - (first["executions"] or 0)
        batch = done / executions if executions else None
    limit = args.max_growth_percent
    if limit is not None and growth is not None and growth > limit:
        failures.append(f"RSS grew {growth:.1f}% > {args.max_growth_percent}%")

    def mib(kib: int | None) -> str:
        return "n/a" if kib is None else f"{kib / 1024:.1f} MiB"

    summary = {
        "started": started.isoformat(timespec="seconds"),
        "machine": machine,
        "invocation": shlex.join(
            [harness.relative(sys.executable), harness.relative(sys.argv[0]), *sys.argv[1:]]
        ),
        "server_command": shlex.join(server_cmd)
        .replace(str(repository), "REPOSITORY-COPY-WITH-DYNAMIC-BATCHING")
        .replace(str(harness.ROOT) + "/", ""),
        "perf_analyzer_command": shlex.join(pa_cmd)
        .replace(f"127.0.0.1:{server.port}", "127.0.0.1:PORT")
        .replace(str(harness.ROOT) + "/", ""),
        "batching_block": block,
        "model": args.model,
        "concurrency": args.concurrency,
        "duration_s": args.duration,
        "interval_s": args.interval,
        "rss_idle_kib": idle_rss,
        "baseline_at_s": base["seconds"],
        "rss_baseline_kib": base["rss_kib"],
        "rss_end_kib": end["rss_kib"],
        "rss_end_s": end["seconds"],
        "rss_after_stop_load_kib": final_rss,
        "rss_peak_kib": max(rss_values) if rss_values else None,
        "growth_percent": growth,
        "infer_per_s": throughput,
        "mean_batch_size": batch,
        "failures": failures,
    }
    (out / "soak.json").write_text(json.dumps(summary, indent=2) + "\n")
    growth_text = "n/a" if growth is None else f"{growth:+.2f}%"
    print(
        f"\nsoak: {args.model} at concurrency {args.concurrency} for {args.duration:.0f} s "
        f"({block}), {len(samples)} samples every {args.interval:.0f} s\n\n"
        "| RSS idle | RSS at "
        f"{base['seconds']:.0f} s | RSS at end ({end['seconds']:.0f} s) | peak under load | "
        "growth | infer/s | mean batch |\n|---|---|---|---|---|---|---|\n"
        f"| {mib(idle_rss)} | {mib(base['rss_kib'])} | {mib(end['rss_kib'])} | "
        f"{mib(summary['rss_peak_kib'])} | {growth_text} | "
        f"{'n/a' if throughput is None else f'{throughput:.0f}'} | "
        f"{'n/a' if batch is None else f'{batch:.2f}'} |\n"
    )
    print(f"server: {summary['server_command']}\nload:   {summary['perf_analyzer_command']}")
    print(f"written: {out / 'soak.csv'}, {out / 'soak.json'}")
    for failure in failures:
        print(f"FAILED: {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
