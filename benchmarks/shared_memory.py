"""Raw bytes against system shared memory over inferd's Unix socket (issue 15): an identity FP32
model at 64 KiB, 1 MiB, 4 MiB and 16 MiB per input (and as much output), one fixed concurrency.

    python benchmarks/shared_memory.py                          # 64 KiB..16 MiB, c=4, 5 s windows
    python benchmarks/shared_memory.py --sizes-kib 4096 --modes raw --measurement-interval 2000

One ``inferd serve`` (``--grpc-unix-socket``, and a loopback TCP port that only this script's
ModelStatistics reads use) serves ``identity``: INPUT0 FP32 [batch, -1] -> OUTPUT0, the ONNX
Identity op, ``max_batch_size: 8`` (inferd completes ``dynamic_batching { }``, as Triton does),
written into a temporary repository by inferd's example writer; ``--max-batch-size 0`` serves it
unbatched (INPUT0 [-1, -1], each request alone). For each size and mode the load generator is
Triton's perf_analyzer, as for every other figure in RESULTS.md (gRPC, async, batch 1, ``--shape
INPUT0:N``), over ``unix://SOCKET``:

  raw   the tensors travel in the request and the response (raw_input_contents, and
        raw_output_contents back)
  shm   ``--shared-memory system --output-shared-memory-size BYTES``: perf_analyzer makes POSIX
        shared-memory regions, registers them (SystemSharedMemoryRegister), writes the input data
        into them once, and names a region in every request for the input and for the output

perf_analyzer's shm mode gives every in-flight request the same two regions (SystemSharedMemory
Status during a run lists INPUT0_0_0 and OUTPUT0): the input is read only, and the concurrent
requests write the same output region, which a throughput measurement does not read back.

``--load-generator python`` uses benchmarks/shm_client.py instead: a thread per client, each with
its own channel and, in shm mode, its own input and output region (made with
multiprocessing.shared_memory, registered through tritonclient), every answer checked against that
client's input, for 3 x ``--measurement-interval``; a wrong answer or an error fails the row.

perf_analyzer reports a run once 3 windows in a row agree within 10 % in throughput and average
latency (no ``--percentile``: on 2 cores shared with other work p99 rarely settles; p50 and p99
still come from its CSV); a run that does not is repeated with each ``--retry-stability``
percentage in turn, and the table marks the one that was accepted.

Around each perf_analyzer run the server's CPU (/proc/PID/stat and per thread, grouped as
benchmarks/server_usage.py does), its ModelStatistics and the whole machine's busy CPU
(/proc/stat) are read: server CPU per inference, per thread group, and how much of the machine
other processes used meanwhile (the machine is shared). Writes results.json and results.md (the
table, the targets, the commands) into ``--out`` (default benchmarks/out/shm-<timestamp>/,
git-ignored), with every tool's log under logs/.

Targets (issue 15): at 4 MiB, shm infer/s >= 2 x raw infer/s; shm server CPU per inference
within 20 % over the sizes (max / min <= 1.2).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import harness
import server_usage

MODEL = "identity"
MODES = ("raw", "shm")
DEFAULT_SIZES_KIB = [64, 1024, 4096, 16384]
FP32_BYTES = 4


def write_repository(python: str, repository: Path, max_batch_size: int) -> str:
    """The identity model through inferd's own example writer; returns its config.pbtxt."""
    program = (
        "import pathlib, sys\n"
        "from inferd.examples import write_identity_model\n"
        "write_identity_model(pathlib.Path(sys.argv[1]), 'FP32', max_batch_size=int(sys.argv[2]))\n"
    )
    model_dir = repository / MODEL
    subprocess.run([python, "-c", program, str(model_dir), str(max_batch_size)], check=True)
    return (model_dir / "config.pbtxt").read_text()


# --- the machine's CPU, for the load other processes put on it ---------------------------------


def machine_busy_ticks() -> tuple[int, int]:
    """(busy, total) jiffies of every CPU from /proc/stat (busy = total - idle - iowait)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    total = sum(fields[:8])  # user nice system idle iowait irq softirq steal (guest is in user)
    return total - fields[3] - fields[4], total


# --- user and kernel CPU, and page faults, per thread group -------------------------------------

KERNEL_GROUPS = ("grpc", "worker")  # where the bytes are handled; the others are ~0 here


def thread_counters(pid: int) -> dict[int, tuple[str, int, int, int]]:
    """tid -> (thread group, utime ticks, stime ticks, minor page faults) of a live process."""
    counters: dict[int, tuple[str, int, int, int]] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            text = (task / "stat").read_text()
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread ended while we read
        close = text.rindex(")")
        comm = text[text.index("(") + 1 : close]
        fields = text[close + 2 :].split()  # fields[0] is field 3: minflt 10, utime 14, stime 15
        group = server_usage.thread_group(int(task.name), pid, comm)
        counters[int(task.name)] = (group, int(fields[11]), int(fields[12]), int(fields[7]))
    return counters


def kernel_split(
    start: dict[int, tuple[str, int, int, int]],
    end: dict[int, tuple[str, int, int, int]],
    inferences: int | None,
) -> dict[str, dict[str, float]]:
    """Per thread group and inference: user µs, kernel (system) µs and minor page faults."""
    if not inferences:
        return {}
    totals: dict[str, list[int]] = {}
    for tid, (group, utime, stime, minflt) in end.items():
        before = start.get(tid, (group, 0, 0, 0))
        sums = totals.setdefault(group, [0, 0, 0])
        sums[0] += utime - before[1]
        sums[1] += stime - before[2]
        sums[2] += minflt - before[3]
    tick_us = 1e6 / server_usage.CLK_TCK
    return {
        group: {
            "user_us": u * tick_us / inferences,
            "system_us": k * tick_us / inferences,
            "minor_faults": f / inferences,
        }
        for group, (u, k, f) in totals.items()
    }


@dataclass(frozen=True)
class Window:
    """What one perf_analyzer run measured, with the server's and the machine's CPU around it."""

    size_kib: int
    mode: str
    result: harness.PerfResult
    usage: dict[str, Any]
    machine_cores: float
    load_average: list[float]
    kernel: dict[str, dict[str, float]]

    def row(self) -> dict[str, Any]:
        summary = self.result.summary()
        usage = self.usage
        server = usage.get("server_cores") or 0.0
        load_generator = usage.get("load_generator_cores") or 0.0
        return {
            "size_kib": self.size_kib,
            "mode": self.mode,
            **{k: summary[k] for k in ("infer_per_s", "p50_us", "p99_us", "avg_us", "error")},
            "server_queue_us": summary["server_queue_us"],
            "compute_input_us": summary["server_compute_input_us"],
            "compute_infer_us": summary["server_compute_infer_us"],
            "compute_output_us": summary["server_compute_output_us"],
            "command": summary["command"],
            "seconds": summary["seconds"],
            "attempts": self.result.extra.get("attempts", 1),
            "stability_percentage": self.result.extra.get("stability_percentage"),
            "server_cpu_us_per_infer": usage.get("server_cpu_us_per_infer"),
            "thread_us_per_infer": usage.get("thread_us_per_infer", {}),
            "thread_names": usage.get("thread_names", {}),
            "inferences": usage.get("inferences"),
            "executions": usage.get("executions"),
            "server_cores": server,
            "load_generator_cores": load_generator,
            "machine_cores": self.machine_cores,
            "other_cores": max(0.0, self.machine_cores - server - load_generator),
            "load_average": self.load_average,
            "kernel_split": self.kernel,
            "usage_error": usage.get("error"),
        }


# --- perf_analyzer over the Unix socket ---------------------------------------------------------


def pa_command(
    pa: harness.PerfAnalyzer,
    socket: Path,
    size_kib: int,
    mode: str,
    args: argparse.Namespace,
    csv_path: str,
    stability: int | None,
) -> list[str]:
    elements = size_kib * 1024 // FP32_BYTES
    cmd = [
        pa.binary, "-m", MODEL, "-i", "grpc", "-u", f"unix://{socket}",
        "--concurrency-range", f"{args.concurrency}:{args.concurrency}",
        "--measurement-interval", str(args.measurement_interval),
        "--shape", f"INPUT0:{elements if args.max_batch_size else f'1,{elements}'}",
        "-f", csv_path,
        *([] if args.sync else ["--async"]),
    ]  # fmt: skip
    if mode == "shm":
        cmd += ["--shared-memory", "system", "--output-shared-memory-size", str(size_kib * 1024)]
    if stability is not None:
        cmd += ["--stability-percentage", str(stability)]
    return [*cmd, *args.pa_arg]


def run_pa(
    pa: harness.PerfAnalyzer,
    socket: Path,
    size_kib: int,
    mode: str,
    args: argparse.Namespace,
    log: Path,
    stability: int | None,
) -> harness.PerfResult:
    """One perf_analyzer run (harness.PerfAnalyzer.measure's, with a Unix socket URL)."""
    with tempfile.TemporaryDirectory() as tmp:
        csv_path = os.path.join(tmp, "out.csv")
        cmd = pa_command(pa, socket, size_kib, mode, args, csv_path, stability)
        started = time.monotonic()
        try:
            done = subprocess.run(
                cmd, env=pa.env, capture_output=True, text=True, timeout=args.pa_timeout
            )
            output, returncode = done.stdout + done.stderr, done.returncode
        except subprocess.TimeoutExpired as e:
            output = f"{e.stdout or ''}{e.stderr or ''}\ntimed out after {args.pa_timeout} s"
            returncode = -1
        elapsed = time.monotonic() - started
        rows: list[dict[str, str]] = []
        if os.path.exists(csv_path):
            with open(csv_path) as f:
                rows = list(csv.DictReader(f))
    log.write_text(f"$ {shlex.join(cmd)}\n# exit {returncode}\n{output}")
    error = None
    if returncode != 0 or not rows:
        tail = "\n".join(output.strip().splitlines()[-5:])
        error = f"perf_analyzer exit {returncode}: {tail}"
    shown = shlex.join(cmd).replace(csv_path, "OUT.csv").replace(str(socket), "SOCKET")
    shown = shown.replace(pa.binary, harness.relative(pa.binary))
    return harness.PerfResult(
        concurrency=args.concurrency,
        row=rows[0] if rows and returncode == 0 else {},
        command=shown,
        seconds=elapsed,
        error=error,
    )


def run_python_clients(
    python: str,
    socket: Path,
    size_kib: int,
    mode: str,
    args: argparse.Namespace,
    log: Path,
) -> harness.PerfResult:
    """benchmarks/shm_client.py: ``--concurrency`` threads, each with its own channel and (shm)
    its own input and output region, every answer checked; for 3 windows' worth of seconds."""
    seconds = 3 * args.measurement_interval / 1000
    cmd = [
        python, str(harness.BENCHMARKS / "shm_client.py"), "--socket", str(socket),
        "--elements", str(size_kib * 1024 // FP32_BYTES), "--mode", mode,
        "--clients", str(args.concurrency), "--seconds", str(seconds),
    ]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.pa_timeout)
    elapsed = time.monotonic() - started
    log.write_text(f"$ {shlex.join(cmd)}\n# exit {done.returncode}\n{done.stdout}{done.stderr}")
    shown = shlex.join(cmd).replace(str(socket), "SOCKET").replace(python, harness.relative(python))
    shown = shown.replace(str(harness.ROOT) + "/", "")
    try:
        figures = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        error = f"shm_client.py exit {done.returncode}: {done.stderr.strip()[-400:]}"
        return harness.PerfResult(args.concurrency, {}, shown, elapsed, error)
    error = None
    if figures["wrong"] or figures["errors"] or not figures["answers"]:
        error = (
            f"{figures['answers']} answers, {figures['wrong']} wrong, {figures['errors']} "
            f"errors: {figures['last_error']}"
        )
    # perf_analyzer's CSV column names, so that PerfResult.summary() reads both alike.
    row = {
        "Inferences/Second": str(figures["infer_per_s"]),
        "p50 latency": str(figures["p50_us"]),
        "p99 latency": str(figures["p99_us"]),
        "Avg latency": str(figures["avg_us"]),
    }
    result = harness.PerfResult(args.concurrency, row, shown, elapsed, error)
    result.extra["answers_checked"] = figures["answers"]
    return result


def measure(
    server: harness.Server,
    statistics: server_usage.StatisticsClient,
    pa: harness.PerfAnalyzer,
    socket: Path,
    size_kib: int,
    mode: str,
    args: argparse.Namespace,
    out: Path,
) -> Window:
    """perf_analyzer at one size and mode, retried with a wider --stability-percentage when no
    3 windows agree within 10 % (2 shared cores); the server's and machine's CPU around it."""
    attempt, stability = 0, None
    python_clients = args.load_generator == "python"
    while True:
        log = out / "logs" / f"{mode}-{size_kib}KiB-{attempt}.log"
        start = server_usage.sample(server.pid, statistics, MODEL)
        counters0 = thread_counters(server.pid)
        busy0, total0 = machine_busy_ticks()
        if python_clients:
            result = run_python_clients(args.python, socket, size_kib, mode, args, log)
        else:
            result = run_pa(pa, socket, size_kib, mode, args, log, stability)
        busy1, total1 = machine_busy_ticks()
        counters1 = thread_counters(server.pid)
        end = server_usage.sample(server.pid, statistics, MODEL)
        # The Python clients measure a fixed time: nothing to stabilise, nothing to retry.
        if result.error is None or python_clients or attempt >= len(args.retry_stability):
            break
        stability = args.retry_stability[attempt]
        attempt += 1
        print(f"    again with --stability-percentage {stability}", flush=True)
    usage = server_usage.usage(server.pid, start, end)
    # /proc/stat counts every CPU: jiffies of all CPUs / total jiffies x CPUs = cores busy.
    cpus = os.cpu_count() or 1
    machine_cores = (busy1 - busy0) / max(1, total1 - total0) * cpus
    result.extra["attempts"] = attempt + 1
    result.extra["stability_percentage"] = stability
    kernel = kernel_split(counters0, counters1, usage.get("inferences"))
    return Window(size_kib, mode, result, usage, machine_cores, list(os.getloadavg()), kernel)


def describe(row: dict[str, Any]) -> str:
    if row["error"]:
        return f"FAILED: {row['error']}"
    cpu = row["server_cpu_us_per_infer"]
    return (
        f"{row['infer_per_s']:.0f} infer/s, p50 {row['p50_us']:.0f} µs, p99 {row['p99_us']:.0f} "
        f"µs, server {'n/a' if cpu is None else f'{cpu:.0f}'} µs CPU/infer "
        f"({row['server_cores']:.2f} cores; load generator {row['load_generator_cores']:.2f}, "
        f"others {row['other_cores']:.2f})"
    )


# --- the report ---------------------------------------------------------------------------------


def size_name(kib: int) -> str:
    return f"{kib // 1024} MiB" if kib >= 1024 and kib % 1024 == 0 else f"{kib} KiB"


def number(value: float | None) -> str:
    return "—" if value is None else f"{value:.0f}"


def targets(rows: list[dict[str, Any]], target_kib: int) -> list[dict[str, Any]]:
    def ok(row: dict[str, Any] | None) -> bool:
        return row is not None and not row["error"]

    def find(kib: int, mode: str) -> dict[str, Any] | None:
        return next((r for r in rows if r["size_kib"] == kib and r["mode"] == mode), None)

    out: list[dict[str, Any]] = []
    raw, shm = find(target_kib, "raw"), find(target_kib, "shm")
    name = f"{size_name(target_kib)}: shm infer/s >= 2 x raw bytes"
    if ok(raw) and ok(shm):
        assert raw is not None and shm is not None
        ratio = shm["infer_per_s"] / raw["infer_per_s"]
        out.append(
            {
                "target": name,
                "value": ratio,
                "met": ratio >= 2.0,
                "detail": f"{shm['infer_per_s']:.0f} / {raw['infer_per_s']:.0f} infer/s",
            }
        )
    else:
        out.append({"target": name, "value": None, "met": False, "detail": "not measured"})
    for mode in MODES:
        cpu = [
            (r["size_kib"], r["server_cpu_us_per_infer"])
            for r in rows
            if r["mode"] == mode and ok(r) and r["server_cpu_us_per_infer"]
        ]
        name = f"{mode}: server CPU/inference within 20 % over the sizes (max / min <= 1.2)"
        if len(cpu) < 2:
            out.append({"target": name, "value": None, "met": False, "detail": "not measured"})
            continue
        low, high = min(cpu, key=lambda c: c[1]), max(cpu, key=lambda c: c[1])
        ratio = high[1] / low[1]
        out.append(
            {
                "target": name,
                "value": ratio,
                "met": ratio <= 1.2,
                "detail": f"{high[1]:.0f} µs at {size_name(high[0])} / {low[1]:.0f} µs at "
                f"{size_name(low[0])}",
                "asked": mode == "shm",
            }
        )
    return out


def model_loaded(log: Path) -> dict[str, Any] | None:
    """The server's "model loaded" record: whether it batches, and how many instances."""
    for line in log.read_text().splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            record = json.loads(line)
            if isinstance(record, dict) and record.get("event") == "model loaded":
                return record
    return None


def markdown(report: dict[str, Any]) -> str:
    rows: list[dict[str, Any]] = report["rows"]
    lines = [
        f"Machine: {harness.describe_machine(report['machine'])}.",
        "",
        f"Run: `{report['invocation']}` ({report['minutes']:.1f} min).",
        "",
        f"Server: `{report['server_command']}`; model `{MODEL}`:",
        "",
        "```",
        report["config"].rstrip(),
        "```",
        "",
        f"As the server loaded it: `{json.dumps(report['model_loaded'])}`.",
        "",
        "| size | mode | infer/s | p50 µs | p99 µs | server CPU µs/infer | server cores "
        "| load generator cores | other processes' cores | queue µs "
        "| compute in / infer / out µs |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        mark = f"*{r['stability_percentage']}%" if r["stability_percentage"] else ""
        if r["error"]:
            lines.append(f"| {size_name(r['size_kib'])} | {r['mode']} | FAILED: "
                         f"{r['error'].splitlines()[-1]} |||||||||")  # fmt: skip
            continue
        lines.append(
            f"| {size_name(r['size_kib'])} | {r['mode']} | {number(r['infer_per_s'])}{mark} "
            f"| {number(r['p50_us'])} | {number(r['p99_us'])} "
            f"| {number(r['server_cpu_us_per_infer'])} | {r['server_cores']:.2f} "
            f"| {r['load_generator_cores']:.2f} | {r['other_cores']:.2f} "
            f"| {number(r['server_queue_us'])} | {number(r['compute_input_us'])} / "
            f"{number(r['compute_infer_us'])} / {number(r['compute_output_us'])} |"
        )
    groups = list(server_usage.GROUPS)
    lines += [
        "",
        "Server CPU per inference by thread group (µs; benchmarks/server_usage.py's groups):",
        "",
        "| size | mode | inferences | executions | total | " + " | ".join(groups) + " |",
        "|---|---|---|---|---|" + "---|" * len(groups),
    ]
    for r in rows:
        if r["error"] or not r["thread_us_per_infer"]:
            continue
        per = r["thread_us_per_infer"]
        lines.append(
            f"| {size_name(r['size_kib'])} | {r['mode']} | {r['inferences']} | {r['executions']} "
            f"| {number(r['server_cpu_us_per_infer'])} | "
            + " | ".join(number(per.get(g)) for g in groups)
            + " |"
        )
    lines += [
        "",
        "User and kernel CPU (µs) and minor page faults per inference, by thread group "
        "(/proc/PID/task/TID/stat utime, stime, minflt):",
        "",
        "| size | mode | "
        + " | ".join(f"{g} user | {g} kernel | {g} faults" for g in KERNEL_GROUPS)
        + " |",
        "|---|---|" + "---|---|---|" * len(KERNEL_GROUPS),
    ]
    for r in rows:
        if r["error"] or not r["kernel_split"]:
            continue
        cells = []
        for g in KERNEL_GROUPS:
            split = r["kernel_split"].get(g, {})
            faults = split.get("minor_faults")
            cells += [
                number(split.get("user_us")),
                number(split.get("system_us")),
                "—" if faults is None else f"{faults:.1f}",
            ]
        lines.append(f"| {size_name(r['size_kib'])} | {r['mode']} | " + " | ".join(cells) + " |")
    lines += ["", "| target | measured | met |", "|---|---|---|"]
    for t in report["targets"]:
        value = "—" if t["value"] is None else f"{t['value']:.2f}"
        asked = "" if t.get("asked", True) else " (not a target: for comparison)"
        met = "yes" if t["met"] else "no"
        lines.append(f"| {t['target']}{asked} | {value} ({t['detail']}) | {met} |")
    lines += ["", "Load generator commands:", ""]
    lines += [f"    {c}" for c in sorted({r["command"] for r in rows if r["command"]})]
    return "\n".join(lines) + "\n"


# --- main ---------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--python", default=sys.executable, help="Python with inferd installed")
    parser.add_argument("--sizes-kib", type=int, nargs="+", default=DEFAULT_SIZES_KIB)
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--measurement-interval", type=int, default=5000, help="ms per window")
    parser.add_argument(
        "--target-size-kib", type=int, default=4096, help="the size of the 2x throughput target"
    )
    parser.add_argument(
        "--max-batch-size",
        type=int,
        default=8,
        help="the model's max_batch_size (0: no batching, each request alone)",
    )
    parser.add_argument("--server-arg", action="append", default=[], help="extra inferd flag")
    parser.add_argument("--pa-arg", action="append", default=[], help="extra perf_analyzer flag")
    parser.add_argument("--pa-timeout", type=float, default=240.0, help="s per perf_analyzer run")
    parser.add_argument(
        "--retry-stability",
        type=int,
        nargs="*",
        default=[25, 50],
        help="--stability-percentage values for the retries of a run that did not stabilise",
    )
    parser.add_argument("--sync", action="store_true", help="perf_analyzer's synchronous API")
    parser.add_argument(
        "--load-generator",
        choices=("perf_analyzer", "python"),
        default="perf_analyzer",
        help="python: benchmarks/shm_client.py, a thread per client with its own regions and "
        "every answer checked, for 3 x --measurement-interval",
    )
    parser.add_argument("--out", type=Path, help="default benchmarks/out/shm-<timestamp>/")
    return parser.parse_args()


def main() -> int:
    # Started in the background by a non-interactive shell, SIGINT arrives ignored: restore
    # Python's handler so that an interrupt still stops the server and perf_analyzer.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    args = parse_args()
    python = str(Path(args.python).absolute()) if os.sep in args.python else args.python
    args.python = python
    started = datetime.now()
    out = args.out or harness.BENCHMARKS / "out" / started.strftime("shm-%Y%m%d-%H%M%S")
    (out / "logs").mkdir(parents=True, exist_ok=True)
    pa = harness.PerfAnalyzer.find(python)
    machine = harness.machine_info(python)
    print(f"machine: {harness.describe_machine(machine)}\nout: {out}", flush=True)
    clock = time.monotonic()
    windows: list[Window] = []
    with tempfile.TemporaryDirectory(prefix="inferd-shm-bench-") as tmp:
        repository = Path(tmp) / "repository"
        config = write_repository(python, repository, args.max_batch_size)
        socket = Path(tmp) / "inferd.sock"
        command = harness.inferd_command(
            python,
            repository,
            # A free metrics port: the default (8002) may be another server's on a shared machine.
            ["--grpc-unix-socket", str(socket), "--metrics-port", "0", *args.server_arg],
        )
        shown_server = (
            shlex.join(command)
            .replace(python, harness.relative(python))
            .replace(str(repository), "REPOSITORY")
            .replace(str(socket), "SOCKET")
        )
        server_log = out / "logs" / "server.log"
        server = harness.start_server(command, server_log)
        statistics = server_usage.StatisticsClient(server.port)
        try:
            for size_kib in args.sizes_kib:
                for mode in args.modes:
                    window = measure(server, statistics, pa, socket, size_kib, mode, args, out)
                    windows.append(window)
                    print(
                        f"  {size_name(size_kib):>7} {mode}: {describe(window.row())}", flush=True
                    )
        finally:
            statistics.close()
            server.stop()
    rows = [w.row() for w in windows]
    report: dict[str, Any] = {
        "started": started.isoformat(timespec="seconds"),
        "minutes": (time.monotonic() - clock) / 60,
        "invocation": shlex.join(
            [harness.relative(sys.executable), harness.relative(sys.argv[0]), *sys.argv[1:]]
        ),
        "machine": machine,
        "server_command": shown_server,
        "config": config,
        "model_loaded": model_loaded(server_log),
        "concurrency": args.concurrency,
        "measurement_interval_ms": args.measurement_interval,
        "rows": rows,
    }
    report["targets"] = targets(rows, args.target_size_kib)
    (out / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    text = markdown(report)
    (out / "results.md").write_text(text)
    print("\n" + text)
    print(f"written: {out / 'results.md'}, {out / 'results.json'}")
    return 1 if any(r["error"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
