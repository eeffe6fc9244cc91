"""The hostile soak (issue 25): valid load and hostile clients together; does anything valid fail,
does memory or the descriptor count grow, does health stay fast? Run through soak.py:

    python benchmarks/soak.py --hostile --duration 180        # make bench-soak-hostile

One ``inferd serve`` (explicit model control, mlp with ``dynamic_batching`` and the decoupled python
model ``flood``, the ``model-repository`` group restricted by a key no client sends) is driven by
perf_analyzer on mlp at ``--concurrency`` and by the valid and hostile clients of
benchmarks/hostile.py, in threads of this process, for ``--duration`` seconds. Every
``--interval`` seconds (1 in this mode unless given) it samples (benchmarks/hostile_samples.py) the
server's VmRSS, its python workers' (every descendant process, summed), its open descriptors
(/proc/PID/fd), the health Check latencies since the last sample (timed in a process of its own)
and the cores other processes took (other engineers' tests share the machine). Then the clients
stop, perf_analyzer is killed 5 s after its SIGINT, and it waits (30 s at most) for the
descriptors to come back before a last sample. Criteria, each failing the run (exit 1): a valid
request failed (perf_analyzer exiting early, the mlp checker, the flood reader, a health Check);
a hostile request got an answer it must not get; health p99 >= ``--health-p99-ms`` (100); server
or worker RSS's floor (the minimum of 20 s of samples) grew more than ``--max-growth-percent``
(10 here) from around ``--baseline-at`` (60 s) to the load's last 20 s, or RSS peaked more than
256 MiB above the start; descriptors not back within 16 of the start, or past half the limit.
Writes ``hostile.csv`` and ``hostile.json`` into ``--out``.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import secrets
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

import harness
import hostile
from hostile_samples import (
    OtherCpu,
    Sample,
    descendants,
    memory,
    open_fds,
    percentile,
    sample,
    soft_fd_limit,
)

THREADS = {"malformed": 1, "near misses": 1, "churn": 2, "silent readers": 2, "stalled": 1}
WARMUP_S = 10  # health p99 is also reported without the load's first seconds (not a criterion)
# What the server may hold more than at the start during the attack: two silent streams' backlogs
# (--stream-max-pending-bytes, 64 MiB each) and their HTTP/2 windows, with room to spare.
PEAK_SLACK_KIB = 256 << 10
FD_SLACK = 16  # descriptors the server may hold more than at the start once the clients left


def write_repository(args: argparse.Namespace, destination: Path) -> str:
    block = harness.batching_repository(
        args.repository.resolve(), destination, [args.model], args.max_queue_delay_us
    )
    flood = destination / "flood"
    (flood / "1").mkdir(parents=True)
    (flood / "1" / "model.py").write_text(hostile.FLOOD_MODEL)
    (flood / "config.pbtxt").write_text(hostile.FLOOD_CONFIG)
    return block


def server_flags(args: argparse.Namespace) -> list[str]:
    # The key is never sent: the exact control paths must stay refused, near misses UNIMPLEMENTED.
    key = secrets.token_hex(8)
    return [
        "--model-control-mode", "explicit", "--load-model", f"{args.model},flood",
        "--grpc-restricted-protocol", f"model-repository:admin={key}",
        "--metrics-port", "0", *args.server_arg,
    ]  # fmt: skip


def start_clients(
    target: hostile.Target, stop: threading.Event
) -> tuple[list[threading.Thread], dict[str, hostile.Tally], hostile.HealthProbe]:
    tallies: dict[str, hostile.Tally] = {}
    threads: list[threading.Thread] = []
    for kind, clients in (("valid", hostile.VALID), ("hostile", hostile.HOSTILE)):
        for name, client in clients.items():
            tally = tallies[f"{kind}: {name}"] = hostile.Tally(name)
            for index in range(THREADS.get(name, 1)):
                threads.append(
                    threading.Thread(
                        target=client, args=(target, stop, tally), name=f"{name}-{index}"
                    )
                )
    probe = hostile.HealthProbe()
    tallies["valid: health"] = probe.tally
    probe.start(target.port)
    for thread in threads:
        thread.start()
    return threads, tallies, probe


def settled_back(pid: int, start: Sample) -> bool:
    fds, rss = open_fds(pid), harness.rss_kib(pid)
    return (
        fds is not None
        and fds <= (start.fds or 0) + FD_SLACK
        and rss is not None
        and rss <= (start.rss_kib or 0) * 1.1
    )


def stop_load(load: subprocess.Popen[str]) -> None:
    """SIGINT, then SIGKILL 5 s later: perf_analyzer 2.41 ends its requests at once on SIGINT
    (the server's inference count stops moving) but its main thread sleeps on to the end of its
    measurement window (60 s here, soak.py's default mode waits for it)."""
    if load.poll() is None:
        load.send_signal(signal.SIGINT)
        try:
            load.wait(timeout=5)
        except subprocess.TimeoutExpired:
            load.kill()
            load.wait()


def soak(
    args: argparse.Namespace,
    server: harness.Server,
    pa_cmd: list[str],
    env: dict[str, str],
    out: Path,
) -> dict[str, Any]:
    """The load, the clients and the samples; returns what the report needs."""
    pid = server.pid
    start_sample = sample(pid, 0, [], None)
    cpu = OtherCpu()
    stop = threading.Event()
    target = hostile.Target(server.port)
    samples: list[Sample] = []
    failures: list[str] = []
    with (out / "perf_analyzer.log").open("w") as pa_log:
        load = subprocess.Popen(pa_cmd, env=env, stdout=pa_log, stderr=subprocess.STDOUT, text=True)
        threads, tallies, probe = start_clients(target, stop)
        began = time.monotonic()
        ours = [os.getpid(), load.pid, pid, probe.pid or 0]
        settled: list[float] = []  # health latencies after the first WARMUP_S
        cpu.cores(ours)
        try:
            while (now := time.monotonic() - began) < args.duration:
                others = cpu.cores([*ours, *descendants(pid)])
                latest = probe.drain()
                samples.append(sample(pid, now, latest, others))
                if now >= WARMUP_S:
                    settled += latest
                last = samples[-1]
                print(
                    f"  t={now:6.1f} s  RSS {(last.rss_kib or 0) / 1024:7.1f} MiB  workers "
                    f"{last.workers_rss_kib / 1024:7.1f} MiB ({last.workers})  fds {last.fds}  "
                    f"health p99 {last.health_p99_ms or 0:6.1f} ms  "
                    f"others {last.others_cores or 0:.2f} cores",
                    flush=True,
                )
                if server.process.poll() is not None:
                    failures.append(f"server exited with {server.process.returncode}")
                    break
                if load.poll() is not None:
                    failures.append(f"perf_analyzer exited early with {load.returncode}")
                    break
                time.sleep(max(0.0, args.interval - (time.monotonic() - began - now)))
        finally:
            stop.set()
            stopping = {"since": time.monotonic()}
            probe.stop()
            for thread in threads:
                thread.join(timeout=60)
            failures += [f"client thread {t.name} did not stop" for t in threads if t.is_alive()]
            stopping["clients_s"] = time.monotonic() - stopping["since"]
            stop_load(load)
            stopping["perf_analyzer_s"] = time.monotonic() - stopping["since"]
    # Once the clients left, the descriptors should come back and memory with them: the last
    # sample waits (30 s at most) for both, RSS within 10% of the start (reported, not a criterion).
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and not settled_back(pid, start_sample):
        time.sleep(0.2)
    after = sample(pid, time.monotonic() - began, [], None)
    print(
        f"stopped: clients {stopping['clients_s']:.1f} s, perf_analyzer "
        f"{stopping['perf_analyzer_s']:.1f} s, last sample {after.seconds - args.duration:.1f} s "
        "after the load's end"
    )
    return {
        "start": start_sample,
        "samples": samples,
        "after": after,
        "tallies": {name: tally.summary() for name, tally in tallies.items()},
        "health_ms": probe.latencies_ms,
        "health_settled_ms": settled,
        "failures": failures,
        "fd_limit": soft_fd_limit(pid),
    }


def judge(args: argparse.Namespace, result: dict[str, Any]) -> dict[str, Any]:
    """The figures of the report; the criteria that failed are appended to result['failures']."""
    samples: list[Sample] = result["samples"]
    start, after, failures = result["start"], result["after"], result["failures"]
    at = args.baseline_at if args.duration > args.baseline_at else args.duration / 3
    half = min(10.0, args.duration / 6)
    for name, tally in result["tallies"].items():
        if tally["failures"]:
            failures.append(f"{name}: {tally['failures']} failures, e.g. {tally['examples']}")
    rss = memory(samples, start, after, at, half)
    limit = 10.0 if args.max_growth_percent is None else args.max_growth_percent
    for what, figures in rss.items():
        growth = figures["growth_percent"]
        if growth is None or growth > limit:
            failures.append(f"{what} RSS floor grew {growth}% > {limit}% after {at:.0f} s")
        if figures["peak_kib"] > (figures["start_kib"] or 0) + PEAK_SLACK_KIB:
            failures.append(f"{what} RSS peaked at {figures['peak_kib']} KiB")
    health = result["health_ms"]
    p99 = percentile(health, 0.99)
    if p99 is None or p99 >= args.health_p99_ms:
        failures.append(f"health p99 {p99} ms, not under {args.health_p99_ms} ms")
    fds = [s.fds for s in samples if s.fds is not None]
    others = [s.others_cores for s in samples if s.others_cores is not None]
    if after.fds is None or after.fds > (start.fds or 0) + FD_SLACK:
        failures.append(f"descriptors {after.fds} once the clients left, {start.fds} at the start")
    if result["fd_limit"] and fds and max(fds) > result["fd_limit"] // 2:
        failures.append(f"descriptors reached {max(fds)} of {result['fd_limit']}")
    return {
        "rss": rss,
        "baseline_at_s": at,
        "window_s": 2 * half,
        "fds": {
            "start": start.fds,
            "max": max(fds) if fds else None,
            "end": samples[-1].fds,
            "after_clients_left": after.fds,
            "limit": result["fd_limit"],
        },
        "health_ms": {
            "checks": len(health),
            "p50": percentile(health, 0.5),
            "p99": p99,
            "max": max(health) if health else None,
            "p99_after_warmup": percentile(result["health_settled_ms"], 0.99),
        },
        "others_cores": {
            "mean": statistics.fmean(others) if others else None,
            "max": max(others) if others else None,
        },
        "load_average_max": max(s.load_average or 0 for s in samples),
    }


def report(figures: dict[str, Any], summary: dict[str, Any], out: Path) -> None:
    def mib(kib: int | None) -> str:
        return "n/a" if kib is None else f"{kib / 1024:.1f}"

    print(
        f"\nhostile soak: {summary['duration_s']:.0f} s, perf_analyzer c={summary['concurrency']}"
    )
    print(f"mlp inferences (perf_analyzer and the checker): {summary['mlp_inferences']}")
    for name, tally in summary["tallies"].items():
        answers = ", ".join(f"{k} {v}" for k, v in sorted(tally["answers"].items()))
        print(f"  {name}: failures {tally['failures']}; {answers}")
    at, window = figures["baseline_at_s"], figures["window_s"]
    print(
        f"\n| RSS MiB | start | at {at:.0f} s: median / floor | last {window:.0f} s: median / "
        "floor | after clients left | peak | floor growth | median growth |\n"
        "|---|---|---|---|---|---|---|---|"
    )

    def percent(value: float | None) -> str:
        return "n/a" if value is None else f"{value:+.1f}%"

    for what, rss in figures["rss"].items():
        print(
            f"| {what} | {mib(rss['start_kib'])} | {mib(rss['baseline_kib'])} / "
            f"{mib(rss['baseline_floor_kib'])} | {mib(rss['end_kib'])} / "
            f"{mib(rss['end_floor_kib'])} | {mib(rss['after_clients_left_kib'])} | "
            f"{mib(rss['peak_kib'])} | {percent(rss['growth_percent'])} | "
            f"{percent(rss['median_growth_percent'])} |"
        )
    fds, health = figures["fds"], figures["health_ms"]
    print(
        f"\ndescriptors: start {fds['start']}, max {fds['max']}, end of load {fds['end']}, "
        f"after clients left {fds['after_clients_left']} (limit {fds['limit']})\n"
        f"health: {health['checks']} checks, p50 {health['p50']:.1f} ms, p99 {health['p99']:.1f} "
        f"ms, max {health['max']:.1f} ms; p99 after the first {WARMUP_S} s "
        f"{health['p99_after_warmup'] or 0:.1f} ms\nother processes: "
        f"{figures['others_cores']['mean'] or 0:.2f} cores on average, at most "
        f"{figures['others_cores']['max'] or 0:.2f}; load average up to "
        f"{figures['load_average_max']:.2f}\nserver log records: {summary['log_levels']}"
    )
    print(f"written: {out / 'hostile.csv'}, {out / 'hostile.json'}")


def log_levels(log: Path) -> dict[str, int]:
    """How many records of each level the server logged (a hostile client may cause warnings;
    errors deserve a look)."""
    levels: Counter[str] = Counter()
    for line in log.read_text(errors="replace").splitlines():
        with contextlib.suppress(json.JSONDecodeError, AttributeError):
            levels[str(json.loads(line).get("level"))] += 1
    return dict(levels)


Counts = Callable[
    [int, str], "tuple[int, int] | None"
]  # soak.model_counts: (inferences, executions)


def run(args: argparse.Namespace, out: Path, model_counts: Counts) -> int:
    python = str(Path(args.python).absolute()) if "/" in args.python else args.python
    started = datetime.now()
    pa = harness.PerfAnalyzer.find(python)
    machine = harness.machine_info(python)
    print(f"machine: {harness.describe_machine(machine)}\nout: {out}", flush=True)
    with tempfile.TemporaryDirectory(prefix="inferd-hostile-") as tmp:
        repository = Path(tmp) / "repository"
        block = write_repository(args, repository)
        server_cmd = harness.inferd_command(python, repository, server_flags(args))
        server = harness.start_server(server_cmd, out / "server.log")
        try:
            window_ms = int((args.duration + 600) * 1000)  # never completes: interrupted
            pa_cmd = pa.command(args.model, server.port, args.concurrency, window_ms, "/dev/null")
            counts_before = model_counts(server.port, args.model) or (0, 0)
            result = soak(args, server, pa_cmd, pa.env, out)
            counts_after = model_counts(server.port, args.model) or (0, 0)
        finally:
            server.stop()
    if server.process.returncode not in (0, None):
        result["failures"].append(f"server stopped with exit code {server.process.returncode}")
    figures = judge(args, result)
    summary = {
        "started": started.isoformat(timespec="seconds"),
        "machine": machine,
        "invocation": shlex.join(
            [harness.relative(sys.executable), harness.relative(sys.argv[0]), *sys.argv[1:]]
        ),
        "server_command": shlex.join(server_cmd)
        .replace(str(repository), "REPOSITORY-COPY")
        .replace(
            server_cmd[server_cmd.index("--grpc-restricted-protocol") + 1],
            "model-repository:admin=KEY",
        )
        .replace(str(harness.ROOT) + "/", ""),
        "perf_analyzer_command": shlex.join(pa_cmd)
        .replace(f":{server.port}", ":PORT")
        .replace(str(harness.ROOT) + "/", ""),
        "batching_block": block,
        "concurrency": args.concurrency,
        "duration_s": args.duration,
        "threads": THREADS,
        "mlp_inferences": counts_after[0] - counts_before[0],
        "tallies": result["tallies"],
        "log_levels": log_levels(out / "server.log"),
        **figures,
        "failures": result["failures"],
    }
    with (out / "hostile.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(Sample.__dataclass_fields__))
        writer.writeheader()
        writer.writerows(s.__dict__ for s in [result["start"], *result["samples"], result["after"]])
    (out / "hostile.json").write_text(json.dumps(summary, indent=2) + "\n")
    report(figures, summary, out)
    for failure in result["failures"]:
        print(f"FAILED: {failure}")
    return 1 if result["failures"] else 0
