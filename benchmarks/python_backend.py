"""A trivial python-backend model against the same identity as ONNX (issue 17): infer/s, latency
and server CPU per inference at several concurrencies, and the worker's IPC cost per batch.

    python benchmarks/python_backend.py                           # c = 1 16 64, then the IPC
    python benchmarks/python_backend.py --concurrencies 16 --measurement-interval 2000 --no-ipc

Writes a repository of two models, each FP32 INPUT0 [batch, 16] -> OUTPUT0 = INPUT0,
``max_batch_size`` ``--max-batch-size`` (64), ``dynamic_batching { }``, one CPU instance:

  identity_onnx    inferd's example writer's ONNX Identity (inferd.examples.write_identity_model)
  identity_python  ``backend: "python"``, a model.py written from Triton's python-backend API
                   (one InferenceResponse per request, OUTPUT0 = the input's numpy array)

and serves both with one ``inferd serve``. For each model and each ``--concurrencies`` value,
perf_analyzer (gRPC over loopback TCP, batch 1, ``--concurrency-range C:C --measurement-interval
MS --percentile 99 --async``; a run whose windows do not settle is run again with each
``--retry-stability`` percentage, as run.py does). Around each run:

- the server process's CPU (utime + stime, /proc/PID/stat) and per thread group
  (benchmarks/server_usage.py's groups; ``worker`` is the core's ``inferd-worker`` thread, which
  for the python model runs PythonBackendExecutor and PythonModelProcess in Python), user and
  kernel apart;
- the server's child processes (/proc/*/stat whose ppid is the server): the python model's
  worker (``python -m inferd.python_backend.worker``), user and kernel, and context switches;
- the model's ModelStatistics (inference_count, execution_count: the mean batch size);
- the machine's busy CPU (/proc/stat), for the share other processes took.

Server CPU per inference = (server process + its children) CPU over the inferences answered.

Then the IPC overhead per batch, measured in this process without a server: a
``PythonModelProcess`` (the class the server uses) on the same model.py, round trips of
``execute`` for 1 request [1, 16], 8 requests [1, 16] and 1 request of 1 MiB (FP32 [1, 262144]),
the median of ``--ipc-rounds``; beside them two baselines between two Python processes over a
Unix socketpair: a bare 64-byte ping-pong (recv/sendall), and ipc.Channel echoing the JSON
``execute`` control message of 1 and 8 requests (the framing without the arenas and the model).
This process's and the worker's CPU per round trip are read around each case.

Writes results.json and results.md (the tables, the python/ONNX ratios, the commands) into
``--out`` (default benchmarks/out/python-backend-<timestamp>/, git-ignored), logs under logs/.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

import harness
import server_usage
from inferd.examples import TensorSpec, format_config, write_identity_model
from inferd.python_backend import ipc
from inferd.python_backend.process import PythonModelProcess, PythonRequest, WorkerSpec
from shared_memory import kernel_split, machine_busy_ticks, thread_counters

ONNX_MODEL = "identity_onnx"
PYTHON_MODEL = "identity_python"
MODELS = (ONNX_MODEL, PYTHON_MODEL)
ELEMENTS = 16
TICK_US = 1e6 / server_usage.CLK_TCK

IDENTITY_MODEL_PY = '''"""Identity as Triton's python backend documents a model."""
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            data = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            output = pb_utils.Tensor("OUTPUT0", data)
            responses.append(pb_utils.InferenceResponse(output_tensors=[output]))
        return responses
'''


# --- the repository -----------------------------------------------------------------------------


def model_config(name: str, max_batch_size: int, backend: str | None) -> str:
    spec = [TensorSpec("INPUT0", "TYPE_FP32", [ELEMENTS])]
    out = [TensorSpec("OUTPUT0", "TYPE_FP32", [ELEMENTS])]
    text = format_config(name, max_batch_size, spec, out)
    if backend is not None:  # format_config names the ONNX platform: a python model names none
        text = "\n".join(line for line in text.splitlines() if not line.startswith("platform:"))
        text = text.replace(f'name: "{name}"', f'name: "{name}"\nbackend: "{backend}"') + "\n"
    return text + "instance_group [ { count: 1 kind: KIND_CPU } ]\ndynamic_batching { }\n"


def write_repository(repository: Path, max_batch_size: int) -> dict[str, str]:
    """Both identities; returns each config.pbtxt."""
    configs = {
        ONNX_MODEL: model_config(ONNX_MODEL, max_batch_size, None),
        PYTHON_MODEL: model_config(PYTHON_MODEL, max_batch_size, "python"),
    }
    write_identity_model(
        repository / ONNX_MODEL, "FP32", max_batch_size=max_batch_size, with_config=False
    )
    (repository / PYTHON_MODEL / "1").mkdir(parents=True)
    (repository / PYTHON_MODEL / "1" / "model.py").write_text(IDENTITY_MODEL_PY)
    for model, config in configs.items():
        (repository / model / "config.pbtxt").write_text(config)
    return configs


# --- the server's processes ---------------------------------------------------------------------


def _switches(pid: int) -> int:
    """Voluntary + involuntary context switches of every thread of a process."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            status = (task / "status").read_text().splitlines()
        except (FileNotFoundError, ProcessLookupError):
            continue
        total += sum(int(line.split()[1]) for line in status if "ctxt_switches" in line)
    return total


def children(pid: int) -> dict[int, dict[str, Any]]:
    """The live child processes of ``pid``: command line, user and kernel ticks, switches."""
    found: dict[int, dict[str, Any]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            ppid, utime, stime, minflt = harness.proc_stat(int(entry.name))
            if ppid != pid:
                continue
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            found[int(entry.name)] = {
                "command": " ".join(a.decode(errors="replace") for a in argv if a),
                "utime": utime,
                "stime": stime,
                "minflt": minflt,
                "switches": _switches(int(entry.name)),
            }
        except (FileNotFoundError, ProcessLookupError, ValueError):
            continue  # it ended while we read
    return found


class Probe:
    """The server's CPU (process, threads, children), one model's counts, the machine's CPU."""

    def __init__(self, pid: int, statistics: server_usage.StatisticsClient, model: str) -> None:
        self.sample = server_usage.sample(pid, statistics, model)
        self.counters = thread_counters(pid)
        self.switches = _switches(pid)
        self.children = children(pid)
        self.busy, self.total = machine_busy_ticks()


def window(pid: int, start: Probe, end: Probe) -> dict[str, Any]:
    """What the server and its children spent between two probes, per inference."""
    usage = server_usage.usage(pid, start.sample, end.sample)
    inferences: int | None = usage.get("inferences")
    executions: int | None = usage.get("executions")
    seconds = usage["seconds"]
    cpus = os.cpu_count() or 1
    machine_cores = (end.busy - start.busy) / max(1, end.total - start.total) * cpus
    user = kernel = switches = 0
    commands = []
    for child, after in end.children.items():
        before = start.children.get(child, {"utime": 0, "stime": 0, "switches": 0})
        user += after["utime"] - before["utime"]
        kernel += after["stime"] - before["stime"]
        switches += after["switches"] - before["switches"]
        commands.append(after["command"])
    child_s = (user + kernel) / server_usage.CLK_TCK
    server_s = usage["server_cpu_s"]
    per = (1e6 / inferences) if inferences else None
    row: dict[str, Any] = {
        "inferences": inferences,
        "executions": executions,
        "mean_batch": inferences / executions if inferences and executions else None,
        "server_process_us_per_infer": server_s * per if per else None,
        "children_us_per_infer": child_s * per if per else None,
        "children_user_us_per_infer": user * TICK_US / inferences if inferences else None,
        "children_kernel_us_per_infer": kernel * TICK_US / inferences if inferences else None,
        "children_us_per_execution": child_s * 1e6 / executions if executions else None,
        "server_cpu_us_per_infer": (server_s + child_s) * per if per else None,
        "thread_us_per_infer": usage.get("thread_us_per_infer", {}),
        "thread_names": usage.get("thread_names", {}),
        "kernel_split": kernel_split(start.counters, end.counters, inferences),
        "server_switches_per_infer": (end.switches - start.switches) / inferences
        if inferences
        else None,
        "children_switches_per_infer": switches / inferences if inferences else None,
        "children": commands,
        "server_cores": server_s / seconds if seconds else 0.0,
        "children_cores": child_s / seconds if seconds else 0.0,
        "load_generator_cores": usage.get("load_generator_cores") or 0.0,
        "machine_cores": machine_cores,
        "batches": usage.get("batches", {}),
        "usage_error": usage.get("error"),
        "load_average": list(os.getloadavg()),
    }
    row["other_cores"] = max(
        0.0,
        machine_cores - row["server_cores"] - row["children_cores"] - row["load_generator_cores"],
    )
    worker = usage.get("batches") or {}
    infer_ns = sum(b["infer_ns"] for b in worker.values())
    row["compute_infer_us_per_execution"] = infer_ns / 1e3 / executions if executions else None
    return row


# --- perf_analyzer ------------------------------------------------------------------------------


def run_pa(
    args: argparse.Namespace,
    pa: harness.PerfAnalyzer,
    server: harness.Server,
    statistics: server_usage.StatisticsClient,
    model: str,
    concurrency: int,
    out: Path,
) -> dict[str, Any]:
    attempt, stability = 0, None
    while True:
        extra = [
            "--async",
            *args.pa_arg,
            *([] if stability is None else ["--stability-percentage", str(stability)]),
        ]
        log = out / "logs" / f"pa-{model}-c{concurrency}-{attempt}.log"
        start = Probe(server.pid, statistics, model)
        result = pa.measure(model, server.port, concurrency, args.measurement_interval, extra, log)
        end = Probe(server.pid, statistics, model)
        if result.error is None or attempt >= len(args.retry_stability):
            break
        stability = args.retry_stability[attempt]
        attempt += 1
        print(f"    retrying with --stability-percentage {stability}", flush=True)
    summary = result.summary()
    return {
        "model": model,
        "concurrency": concurrency,
        "stability_percentage": stability,
        **{
            k: summary[k] for k in ("infer_per_s", "p50_us", "p99_us", "avg_us", "error", "command")
        },
        "seconds": summary["seconds"],
        "server_queue_us": summary["server_queue_us"],
        "compute_infer_us": summary["server_compute_infer_us"],
        **window(server.pid, start, end),
    }


# --- the IPC overhead per batch -----------------------------------------------------------------

ECHO_BARE = """
import socket, sys
s = socket.socket(fileno=int(sys.argv[1]))
while True:
    data = s.recv(1 << 16)
    if not data:
        break
    s.sendall(data)
"""

ECHO_CHANNEL = """
import socket, sys
from inferd.python_backend import ipc
channel = ipc.Channel(socket.socket(fileno=int(sys.argv[1])))
while True:
    try:
        message, _ = channel.receive()
    except ipc.ChannelClosed:
        break
    channel.send(message)
"""


def _cpu_ns(pid: int) -> int:
    """CPU time of every thread of a process, in ns (/proc/PID/task/TID/schedstat: finer than
    the stat files' clock ticks, which a short case would round away)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            continue
    return total


def _timed(rounds: int, warmup: int, call: Any, pid: int) -> dict[str, Any]:
    """Median and p90 µs of ``call`` over ``rounds`` (after ``warmup``), this thread's CPU and
    process ``pid``'s CPU per round."""
    for _ in range(warmup):
        call()
    durations = []
    own = time.thread_time()
    other = _cpu_ns(pid)
    for _ in range(rounds):
        began = time.perf_counter_ns()
        call()
        durations.append(time.perf_counter_ns() - began)
    own_us = (time.thread_time() - own) * 1e6 / rounds
    other_us = (_cpu_ns(pid) - other) / 1e3 / rounds
    durations.sort()
    return {
        "rounds": rounds,
        "min_us": durations[0] / 1e3,
        "median_us": statistics.median(durations) / 1e3,
        "p90_us": durations[int(0.9 * (len(durations) - 1))] / 1e3,
        "caller_cpu_us": own_us,
        "other_process_cpu_us": other_us,
        "load_average": list(os.getloadavg()),
    }


def _echo_process(python: str, program: str) -> tuple[socket.socket, subprocess.Popen[bytes]]:
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    process = subprocess.Popen(
        [python, "-c", program, str(theirs.fileno())], pass_fds=(theirs.fileno(),)
    )
    theirs.close()
    return mine, process


def _execute_message(requests: int) -> ipc.Message:
    """The control message PythonModelProcess.execute sends for ``requests`` x [1, 16] FP32."""
    wire = {
        "request_id": "",
        "inputs": [
            {
                "name": "INPUT0",
                "datatype": "FP32",
                "shape": [1, ELEMENTS],
                "offset": 0,
                "nbytes": 64,
            }
        ],
        "requested_output_names": [],
        "parameters": "{}",
        "correlation_id": 0,
        "flags": 0,
        "timeout": 0,
    }
    return {"type": "execute", "requests": [wire] * requests}


def ipc_overhead(args: argparse.Namespace, model_dir: Path) -> list[dict[str, Any]]:
    rounds, warmup = args.ipc_rounds, max(10, args.ipc_rounds // 20)
    rows: list[dict[str, Any]] = []

    mine, echo = _echo_process(sys.executable, ECHO_BARE)
    try:
        ping = b"x" * 64

        def bare() -> None:
            mine.sendall(ping)
            got = 0
            while got < len(ping):
                got += len(mine.recv(1 << 16))

        rows.append(
            {"case": "bare socket ping-pong, 64 B", **_timed(rounds, warmup, bare, echo.pid)}
        )
    finally:
        mine.close()
        echo.wait(timeout=10)

    mine, echo = _echo_process(sys.executable, ECHO_CHANNEL)
    channel = ipc.Channel(mine)
    try:
        for count in (1, 8):
            message = _execute_message(count)
            size = len(ipc.encode_message(message))

            def framed(message: ipc.Message = message) -> None:
                channel.send(message)
                channel.receive()

            rows.append(
                {
                    "case": f"ipc.Channel echo of the execute message, {count} request(s) "
                    f"({size} B)",
                    **_timed(rounds, warmup, framed, echo.pid),
                }
            )
    finally:
        channel.close()
        echo.wait(timeout=10)

    spec = WorkerSpec(
        model_name=PYTHON_MODEL,
        model_version=1,
        instance_name=f"{PYTHON_MODEL}_ipc_bench",
        model_file=model_dir / "1" / "model.py",
        model_config_json=json.dumps({"name": PYTHON_MODEL, "backend": "python"}),
        model_repository=model_dir,
    )
    process = PythonModelProcess(spec)
    process.start()
    try:
        assert process.pid is not None
        small = np.arange(ELEMENTS, dtype=np.float32).reshape(1, ELEMENTS)
        big = np.arange(1 << 18, dtype=np.float32).reshape(1, 1 << 18)  # 1 MiB
        cases = [
            ("PythonModelProcess.execute, 1 request [1, 16] FP32", [small], rounds),
            ("PythonModelProcess.execute, 8 requests [1, 16] FP32", [small] * 8, rounds),
            ("PythonModelProcess.execute, 1 request [1, 262144] FP32 (1 MiB)", [big], rounds // 4),
        ]
        for case, arrays, count in cases:
            batch = [PythonRequest(request_id="", inputs={"INPUT0": a}) for a in arrays]
            answers = process.execute(batch)  # checked once: the identity answers its input
            for array, answer in zip(arrays, answers, strict=True):
                if answer.error is not None or not np.array_equal(answer.outputs["OUTPUT0"], array):
                    raise SystemExit(f"{case}: wrong answer {answer}")

            def call(batch: list[PythonRequest] = batch) -> None:
                process.execute(batch)

            rows.append({"case": case, **_timed(count, warmup, call, process.pid)})
    finally:
        process.stop()
    return rows


# --- the report ---------------------------------------------------------------------------------


def n(value: float | None, digits: int = 0) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def comparisons(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per concurrency: the python model against the ONNX one (python / onnx)."""
    out = []
    for row in rows:
        if row["model"] != PYTHON_MODEL or row["error"]:
            continue
        onnx_row = next(
            (
                r
                for r in rows
                if r["model"] == ONNX_MODEL
                and r["concurrency"] == row["concurrency"]
                and not r["error"]
            ),
            None,
        )
        if onnx_row is None:
            continue
        out.append(
            {
                "concurrency": row["concurrency"],
                "throughput_ratio": _ratio(row["infer_per_s"], onnx_row["infer_per_s"]),
                "p50_ratio": _ratio(row["p50_us"], onnx_row["p50_us"]),
                "p99_ratio": _ratio(row["p99_us"], onnx_row["p99_us"]),
                "cpu_ratio": _ratio(
                    row["server_cpu_us_per_infer"], onnx_row["server_cpu_us_per_infer"]
                ),
                "extra_cpu_us_per_infer": row["server_cpu_us_per_infer"]
                - onnx_row["server_cpu_us_per_infer"]
                if row["server_cpu_us_per_infer"] is not None
                and onnx_row["server_cpu_us_per_infer"] is not None
                else None,
            }
        )
    return out


def markdown(report: dict[str, Any]) -> str:
    rows: list[dict[str, Any]] = report["rows"]
    lines = [
        f"Machine: {harness.describe_machine(report['machine'])}.",
        "",
        f"Run: `{report['invocation']}` ({report['minutes']:.1f} min).",
        "",
        f"Server: `{report['server_command']}`.",
        "",
        "Configs (identity_python's model.py is IDENTITY_MODEL_PY in the script):",
        "",
        "```",
        *[text.rstrip() for text in report["configs"].values()],
        "```",
        "",
        "perf_analyzer (gRPC, TCP loopback, batch 1, [1, 16] FP32); `*N%` = accepted at "
        "--stability-percentage N. Server CPU = the server process + its children (the python "
        "worker), µs per inference; mean batch = inferences / executions (ModelStatistics):",
        "",
        "| model | c | infer/s | p50 µs | p99 µs | mean batch | server CPU µs/infer "
        "| of it server process | of it python worker | worker µs/execution | server cores "
        "| worker cores | perf_analyzer cores | other processes' cores |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        mark = f"*{r['stability_percentage']}%" if r["stability_percentage"] else ""
        head = f"| {r['model']} | {r['concurrency']} "
        if r["error"]:
            lines.append(head + f"| FAILED: {r['error'].splitlines()[-1]} ||||||||||||")
            continue
        lines.append(
            head + f"| {n(r['infer_per_s'])}{mark} | {n(r['p50_us'])} | {n(r['p99_us'])} "
            f"| {n(r['mean_batch'], 1)} | {n(r['server_cpu_us_per_infer'])} "
            f"| {n(r['server_process_us_per_infer'])} | {n(r['children_us_per_infer'])} "
            f"| {n(r['children_us_per_execution'])} | {r['server_cores']:.2f} "
            f"| {r['children_cores']:.2f} | {r['load_generator_cores']:.2f} "
            f"| {r['other_cores']:.2f} |"
        )
    lines += [
        "",
        "python / ONNX at each concurrency (extra = python's server CPU less ONNX's, µs/infer):",
        "",
        "| c | infer/s ratio | p50 ratio | p99 ratio | server CPU ratio | extra CPU µs/infer |",
        "|---|---|---|---|---|---|",
    ]
    for c in report["comparisons"]:
        lines.append(
            f"| {c['concurrency']} | {n(c['throughput_ratio'], 2)} | {n(c['p50_ratio'], 2)} "
            f"| {n(c['p99_ratio'], 2)} | {n(c['cpu_ratio'], 2)} "
            f"| {n(c['extra_cpu_us_per_infer'])} |"
        )
    groups = list(server_usage.GROUPS)
    lines += [
        "",
        "Where the CPU goes, µs per inference: the server's thread groups (benchmarks/"
        "server_usage.py; `worker` = the core's inferd-worker thread, which for the python model "
        "runs PythonBackendExecutor/PythonModelProcess), user / kernel of the grpc and worker "
        "groups, the python worker process's user / kernel, and context switches per inference:",
        "",
        "| model | c | " + " | ".join(groups) + " | grpc user / kernel | worker user / kernel "
        "| python worker user / kernel | switches server / python worker | compute infer µs "
        "per execution |",
        "|---|---|" + "---|" * len(groups) + "---|---|---|---|---|",
    ]
    for r in rows:
        per = r.get("thread_us_per_infer") or {}
        split = r.get("kernel_split") or {}
        if r["error"] or not per:
            continue
        grpc, worker = split.get("grpc", {}), split.get("worker", {})
        lines.append(
            f"| {r['model']} | {r['concurrency']} | "
            + " | ".join(n(per.get(g)) for g in groups)
            + f" | {n(grpc.get('user_us'))} / {n(grpc.get('system_us'))} "
            f"| {n(worker.get('user_us'))} / {n(worker.get('system_us'))} "
            f"| {n(r['children_user_us_per_infer'])} / {n(r['children_kernel_us_per_infer'])} "
            f"| {n(r['server_switches_per_infer'], 1)} / {n(r['children_switches_per_infer'], 1)} "
            f"| {n(r['compute_infer_us_per_execution'])} |"
        )
    if report["ipc"]:
        lines += [
            "",
            f"IPC per round trip, in one process without a server (median and p90 of "
            f"{report['ipc'][0]['rounds']} rounds, the 1 MiB case a quarter as many; CPU per round "
            "trip of the calling thread and of the other process):",
            "",
            "| case | min µs | median µs | p90 µs | caller CPU µs | other process CPU µs "
            "| load average after |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in report["ipc"]:
            lines.append(
                f"| {r['case']} | {r['min_us']:.1f} | {r['median_us']:.1f} | {r['p90_us']:.1f} "
                f"| {r['caller_cpu_us']:.1f} | {r['other_process_cpu_us']:.1f} "
                f"| {r['load_average'][0]:.2f} |"
            )
    lines += ["", "perf_analyzer commands:", ""]
    lines += [f"    {c}" for c in sorted({r["command"] for r in rows})]
    return "\n".join(lines) + "\n"


def describe(row: dict[str, Any]) -> str:
    if row["error"]:
        return f"FAILED: {row['error']}"
    return (
        f"{row['infer_per_s']:.0f} infer/s, p50 {row['p50_us']:.0f} µs, p99 {row['p99_us']:.0f} "
        f"µs, server {n(row['server_cpu_us_per_infer'])} µs CPU/infer (worker process "
        f"{n(row['children_us_per_infer'])}), mean batch {n(row['mean_batch'], 1)}"
    )


# --- main ---------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--python", default=sys.executable, help="Python with inferd installed")
    parser.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    parser.add_argument("--concurrencies", type=int, nargs="+", default=[1, 16, 64])
    parser.add_argument("--max-batch-size", type=int, default=64)
    parser.add_argument("--server-arg", action="append", default=[], help="extra inferd flag")
    parser.add_argument("--measurement-interval", type=int, default=5000, help="ms per window")
    parser.add_argument(
        "--pa-arg", action="append", default=[], help="extra perf_analyzer flag, e.g. --pa-arg=-r6"
    )
    parser.add_argument(
        "--retry-stability",
        type=int,
        nargs="*",
        default=[25, 50],
        help="--stability-percentage values for the retries of a run that did not stabilise",
    )
    parser.add_argument("--no-pa", action="store_true", help="skip the served measurements")
    parser.add_argument("--no-ipc", action="store_true", help="skip the IPC round trips")
    parser.add_argument("--ipc-rounds", type=int, default=4000, help="round trips per IPC case")
    parser.add_argument("--out", type=Path, help="default benchmarks/out/python-backend-<time>/")
    return parser.parse_args()


def main() -> int:
    # Started in the background by a non-interactive shell, SIGINT arrives ignored: restore
    # Python's handler so that an interrupt still stops the server.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    args = parse_args()
    args.python = str(Path(args.python).absolute()) if os.sep in args.python else args.python
    started = datetime.now()
    out = args.out or harness.BENCHMARKS / "out" / started.strftime("python-backend-%Y%m%d-%H%M%S")
    (out / "logs").mkdir(parents=True, exist_ok=True)
    machine = harness.machine_info(args.python)
    print(f"machine: {harness.describe_machine(machine)}\nout: {out}", flush=True)
    clock = time.monotonic()
    rows: list[dict[str, Any]] = []
    ipc_rows: list[dict[str, Any]] = []
    shown_server = ""
    with tempfile.TemporaryDirectory(prefix="inferd-python-bench-") as tmp:
        repository = Path(tmp) / "repository"
        configs = write_repository(repository, args.max_batch_size)
        if not args.no_pa:
            command = harness.inferd_command(
                args.python, repository, ["--metrics-port", "0", *args.server_arg]
            )
            shown_server = (
                shlex.join(command)
                .replace(args.python, harness.relative(args.python))
                .replace(str(repository), "REPOSITORY")
            )
            server = harness.start_server(command, out / "logs" / "server.log")
            statistics = server_usage.StatisticsClient(server.port)
            try:
                pa = harness.PerfAnalyzer.find(args.python)
                for clients in args.concurrencies:
                    for model in args.models:
                        row = run_pa(args, pa, server, statistics, model, clients, out)
                        rows.append(row)
                        print(f"  {model} c={clients}: {describe(row)}", flush=True)
            finally:
                statistics.close()
                server.stop()
        if not args.no_ipc:
            ipc_rows = ipc_overhead(args, repository / PYTHON_MODEL)
            for r in ipc_rows:
                print(
                    f"  {r['case']}: median {r['median_us']:.1f} µs, p90 {r['p90_us']:.1f} µs, "
                    f"caller CPU {r['caller_cpu_us']:.1f} µs, other process "
                    f"{r['other_process_cpu_us']:.1f} µs",
                    flush=True,
                )
    report: dict[str, Any] = {
        "started": started.isoformat(timespec="seconds"),
        "minutes": (time.monotonic() - clock) / 60,
        "invocation": shlex.join(
            [harness.relative(sys.executable), harness.relative(sys.argv[0]), *sys.argv[1:]]
        ),
        "machine": machine,
        "load_average_at_end": list(os.getloadavg()),
        "server_command": shown_server,
        "configs": configs,
        "model_py": IDENTITY_MODEL_PY,
        "rows": rows,
        "comparisons": comparisons(rows),
        "ipc": ipc_rows,
    }
    (out / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    text = markdown(report)
    (out / "results.md").write_text(text)
    print("\n" + text)
    print(f"written: {out / 'results.md'}, {out / 'results.json'}")
    return 1 if any(r["error"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
