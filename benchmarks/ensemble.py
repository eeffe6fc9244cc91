"""A 3-step chain served as an ensemble against the client calling the three models itself
(issue 16): complete inferences per second, latency per inference, server and client CPU.

    python benchmarks/ensemble.py                                  # tcp and unix, c = 1 8 32
    python benchmarks/ensemble.py --shapes client-chain --seconds 3 --transports tcp --no-pa

Writes a repository (onnx's helper API) of three FP32 [batch, 16] models, each with
``dynamic_batching { }`` and ``max_batch_size`` ``--max-batch-size``:

  add_one   INPUT0 -> Add 1     -> OUTPUT0
  scale     INPUT0 -> MatMul 2I -> OUTPUT0   (16 x 16, so y = 2x exactly)
  squash    INPUT0 -> Tanh      -> OUTPUT0

and ``chain``, a Triton ensemble (``platform: "ensemble"``, ``ensemble_scheduling``) running
add_one -> scale -> squash on INPUT, answering OUTPUT = tanh(2 (x + 1)). One ``inferd serve``
serves them on a loopback TCP port and on a Unix socket (``--grpc-unix-socket``).

The same load generator (benchmarks/ensemble_client.py: a thread per client, each with its own
channel and raw gRPC stub, back to back, every answer checked against numpy) measures both shapes
at each concurrency (``--concurrencies``), over each transport, for ``--seconds`` after
``--warmup``:

  ensemble      one ModelInfer to ``chain`` per inference
  client-chain  three ModelInfer per inference, each answer's bytes sent as the next input

Around the measured seconds (the client says when they start and stop) the server's CPU (process
and per thread group, benchmarks/server_usage.py), every model's ModelStatistics and the whole
machine's busy CPU (/proc/stat) are read; the client reports its own CPU (getrusage) over the same
seconds. Per inference = per chain: server CPU over squash's inference_count (each chain runs
squash once in either shape). A wrong answer or an error fails the row.

Then, as context, perf_analyzer (``--concurrency-range C:C --measurement-interval MS --percentile
99 --async``, over TCP; ``-x 1`` for ``chain``, see run_pa) against ``chain`` and against
``add_one`` alone, at ``--pa-concurrencies``; a run whose windows do not settle is retried with
each ``--retry-stability`` percentage.

Writes results.json and results.md (the tables, ensemble against client-chain, the commands) into
``--out`` (default benchmarks/out/ensemble-<timestamp>/, git-ignored), every log under logs/.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import harness
import server_usage
from ensemble_client import ELEMENTS, ENSEMBLE, SHAPES, STEPS
from inferd.examples import IR_VERSION, OPSET, TensorSpec, format_config
from shared_memory import kernel_split, machine_busy_ticks, thread_counters

TRANSPORTS = ("tcp", "unix")
MODELS = (ENSEMBLE, *STEPS)
LAST_STEP = STEPS[-1]  # runs once per chain in both shapes: its count is the chains served


# --- the repository -----------------------------------------------------------------------------


def step_graph(model: str) -> Any:
    """The ONNX graph of one composing model: INPUT0 FP32 [batch, 16] -> OUTPUT0."""
    x = helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", ELEMENTS])
    y = helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", ELEMENTS])
    if model == "add_one":
        constant = numpy_helper.from_array(np.array(1.0, np.float32), "one")
        node = helper.make_node("Add", ["INPUT0", "one"], ["OUTPUT0"])
    elif model == "scale":
        constant = numpy_helper.from_array(2 * np.eye(ELEMENTS, dtype=np.float32), "two_i")
        node = helper.make_node("MatMul", ["INPUT0", "two_i"], ["OUTPUT0"])
    else:
        constant = None
        node = helper.make_node("Tanh", ["INPUT0"], ["OUTPUT0"])
    return helper.make_graph([node], model, [x], [y], [constant] if constant else [])


def ensemble_config(max_batch_size: int) -> str:
    steps = []
    sources = ["INPUT", "after_add_one", "after_scale"]
    sinks = ["after_add_one", "after_scale", "OUTPUT"]
    for model, source, sink in zip(STEPS, sources, sinks, strict=True):
        steps.append(
            f'    {{\n      model_name: "{model}"\n      model_version: -1\n'
            f'      input_map {{ key: "INPUT0" value: "{source}" }}\n'
            f'      output_map {{ key: "OUTPUT0" value: "{sink}" }}\n    }}'
        )
    return (
        f'name: "{ENSEMBLE}"\nplatform: "ensemble"\nmax_batch_size: {max_batch_size}\n'
        f'input [ {{ name: "INPUT" data_type: TYPE_FP32 dims: [ {ELEMENTS} ] }} ]\n'
        f'output [ {{ name: "OUTPUT" data_type: TYPE_FP32 dims: [ {ELEMENTS} ] }} ]\n'
        "ensemble_scheduling {\n  step [\n" + ",\n".join(steps) + "\n  ]\n}\n"
    )


def write_repository(repository: Path, max_batch_size: int, with_ensemble: bool) -> dict[str, str]:
    """The three composing models and (``with_ensemble``) the chain; returns each config."""
    configs: dict[str, str] = {}
    for model in STEPS:
        config = format_config(
            model,
            max_batch_size,
            [TensorSpec("INPUT0", "TYPE_FP32", [ELEMENTS])],
            [TensorSpec("OUTPUT0", "TYPE_FP32", [ELEMENTS])],
        )
        configs[model] = config + "dynamic_batching { }\n"
        onnx_model = helper.make_model(
            step_graph(model), opset_imports=[helper.make_opsetid("", OPSET)]
        )
        onnx_model.ir_version = IR_VERSION
        onnx.checker.check_model(onnx_model, full_check=True)
        (repository / model / "1").mkdir(parents=True)
        (repository / model / "1" / "model.onnx").write_bytes(onnx_model.SerializeToString())
        (repository / model / "config.pbtxt").write_text(configs[model])
    if with_ensemble:
        configs[ENSEMBLE] = ensemble_config(max_batch_size)
        (repository / ENSEMBLE / "1").mkdir(parents=True)
        (repository / ENSEMBLE / "config.pbtxt").write_text(configs[ENSEMBLE])
    return configs


# --- sampling the server ------------------------------------------------------------------------


def model_counts(
    statistics: server_usage.StatisticsClient, models: tuple[str, ...]
) -> dict[str, server_usage.ModelCounts | None]:
    out: dict[str, server_usage.ModelCounts | None] = {}
    for model in models:
        try:
            out[model] = statistics.counts(model)
        except Exception:  # a model the server does not serve (the chain before issue 16)
            out[model] = None
    return out


def context_switches(pid: int) -> dict[str, int]:
    """Context switches (voluntary + involuntary) of a live process's threads, per thread group:
    each hand-off between threads (a wake-up) costs both CPU and latency."""
    switches: dict[str, int] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            comm = (task / "comm").read_text().strip()
            status = (task / "status").read_text().splitlines()
        except (FileNotFoundError, ProcessLookupError):
            continue  # the thread ended while we read
        count = sum(int(line.split()[1]) for line in status if "ctxt_switches" in line)
        group = server_usage.thread_group(int(task.name), pid, comm)
        switches[group] = switches.get(group, 0) + count
    return switches


class Probe:
    """The server's CPU (per thread: user, kernel, context switches), its models' counts and the
    machine's busy CPU at one moment."""

    def __init__(
        self, pid: int, statistics: server_usage.StatisticsClient, models: tuple[str, ...]
    ) -> None:
        self.models = model_counts(statistics, models)
        self.sample = server_usage.sample(pid, statistics, LAST_STEP)
        self.counters = thread_counters(pid)
        self.switches = context_switches(pid)
        self.busy, self.total = machine_busy_ticks()


def window(pid: int, start: Probe, end: Probe) -> dict[str, Any]:
    """Server CPU per chain (squash's count), cores, and per model inferences and executions."""
    usage = server_usage.usage(pid, start.sample, end.sample)
    cpus = os.cpu_count() or 1
    machine_cores = (end.busy - start.busy) / max(1, end.total - start.total) * cpus
    per_model: dict[str, dict[str, int]] = {}
    for model, after in end.models.items():
        before = start.models.get(model)
        if after is not None and before is not None:
            per_model[model] = {
                "inferences": after.inference_count - before.inference_count,
                "executions": after.execution_count - before.execution_count,
            }
    chains = usage.get("inferences")
    switches = {
        group: (count - start.switches.get(group, 0)) / chains
        for group, count in end.switches.items()
        if chains
    }
    return {
        "server_cpu_us_per_infer": usage.get("server_cpu_us_per_infer"),
        "kernel_split": kernel_split(start.counters, end.counters, chains),
        "switches_per_infer": switches,
        "thread_us_per_infer": usage.get("thread_us_per_infer", {}),
        "server_cores": usage.get("server_cores") or 0.0,
        "load_generator_cores": usage.get("load_generator_cores") or 0.0,
        "chains_counted": usage.get("inferences"),
        "machine_cores": machine_cores,
        "models": per_model,
        "usage_error": usage.get("error"),
        "load_average": list(os.getloadavg()),
    }


# --- the Python load generator ------------------------------------------------------------------


def run_client(
    args: argparse.Namespace,
    server: harness.Server,
    statistics: server_usage.StatisticsClient,
    target: str,
    shape: str,
    clients: int,
    log: Path,
) -> dict[str, Any]:
    cmd = [
        args.python, str(harness.BENCHMARKS / "ensemble_client.py"), "--target", target,
        "--shape", shape, "--clients", str(clients), "--seconds", str(args.seconds),
        "--warmup", str(args.warmup),
    ]  # fmt: skip
    process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    killer = threading.Timer(args.warmup + args.seconds + 120, process.kill)
    killer.start()
    start = end = None
    lines: list[str] = []
    assert process.stdout is not None
    for line in process.stdout:
        lines.append(line)
        if line.strip() == "measuring":
            start = Probe(server.pid, statistics, MODELS)
        elif line.strip() == "stopped":
            end = Probe(server.pid, statistics, MODELS)
    stderr = process.stderr.read() if process.stderr else ""
    process.wait()
    killer.cancel()
    log.write_text(f"$ {shlex.join(cmd)}\n# exit {process.returncode}\n{''.join(lines)}{stderr}")
    shown = shlex.join(cmd).replace(args.python, harness.relative(args.python))
    shown = shown.replace(str(harness.ROOT) + "/", "")
    row: dict[str, Any] = {"shape": shape, "concurrency": clients, "command": shown, "error": None}
    try:
        figures = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        row["error"] = f"ensemble_client.py exit {process.returncode}: {stderr.strip()[-400:]}"
        return row
    row.update(figures)
    if start is not None and end is not None:
        row.update(window(server.pid, start, end))
        server_cores = row["server_cores"]
        row["other_cores"] = max(0.0, row["machine_cores"] - server_cores - row["client_cores"])
    if figures["wrong"] or figures["errors"] or not figures["answers"]:
        row["error"] = (
            f"{figures['answers']} answers, {figures['wrong']} wrong, {figures['errors']} "
            f"errors: {figures['last_error']}"
        )
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
    # Without -x, perf_analyzer 2.41 takes a model's version from the statistics entry whose
    # inference_stats.queue.count grew during the window; inferd's ensemble statistics keep
    # that count at 0, so the ensemble's version is named (its composing models' still found).
    version = ["-x", "1"] if model == ENSEMBLE else []
    while True:
        extra = [
            "--async",
            *version,
            *([] if stability is None else ["--stability-percentage", str(stability)]),
        ]
        log = out / "logs" / f"pa-{model}-c{concurrency}-{attempt}.log"
        start = Probe(server.pid, statistics, MODELS)
        result = pa.measure(model, server.port, concurrency, args.measurement_interval, extra, log)
        end = Probe(server.pid, statistics, MODELS)
        if result.error is None or attempt >= len(args.retry_stability):
            break
        stability = args.retry_stability[attempt]
        attempt += 1
    summary = result.summary()
    row = {
        "model": model,
        "concurrency": concurrency,
        "stability_percentage": stability,
        **{
            k: summary[k] for k in ("infer_per_s", "p50_us", "p99_us", "avg_us", "error", "command")
        },
        "server_queue_us": summary["server_queue_us"],
        "compute_infer_us": summary["server_compute_infer_us"],
        **window(server.pid, start, end),
    }
    if model != ENSEMBLE:  # one inference of add_one, not a chain: count add_one's
        counted = row["models"].get(model, {}).get("inferences")
        cpu_s = (end.sample.process_ticks - start.sample.process_ticks) / server_usage.CLK_TCK
        row["server_cpu_us_per_infer"] = cpu_s * 1e6 / counted if counted else None
    row["other_cores"] = max(
        0.0, row["machine_cores"] - row["server_cores"] - row["load_generator_cores"]
    )
    return row


# --- the report ---------------------------------------------------------------------------------


def n(value: float | None, digits: int = 0) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def batch_sizes(row: dict[str, Any]) -> str:
    """Mean executed batch size per model (inferences / executions) over the window."""
    cells = []
    for model in MODELS:
        entry = row.get("models", {}).get(model)
        if entry and entry["executions"]:
            cells.append(f"{model} {entry['inferences'] / entry['executions']:.1f}")
    return ", ".join(cells) or "—"


def comparisons(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per transport and concurrency: the ensemble against the client calling the steps."""
    out = []
    for row in rows:
        if row["shape"] != "ensemble" or row["error"]:
            continue
        chain = next(
            (
                r
                for r in rows
                if r["shape"] == "client-chain"
                and r["transport"] == row["transport"]
                and r["concurrency"] == row["concurrency"]
                and not r["error"]
            ),
            None,
        )
        if chain is None:
            continue
        out.append(
            {
                "transport": row["transport"],
                "concurrency": row["concurrency"],
                "throughput_ratio": row["infer_per_s"] / chain["infer_per_s"],
                "p50_ratio": row["p50_us"] / chain["p50_us"],
                "server_cpu_ratio": _ratio(
                    row.get("server_cpu_us_per_infer"), chain.get("server_cpu_us_per_infer")
                ),
                "client_cpu_ratio": _ratio(
                    row.get("client_cpu_us_per_infer"), chain.get("client_cpu_us_per_infer")
                ),
                "wins": row["infer_per_s"] > chain["infer_per_s"]
                and row["p50_us"] < chain["p50_us"],
            }
        )
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def markdown(report: dict[str, Any]) -> str:
    rows: list[dict[str, Any]] = report["rows"]
    lines = [
        f"Machine: {harness.describe_machine(report['machine'])}.",
        "",
        f"Run: `{report['invocation']}` ({report['minutes']:.1f} min).",
        "",
        f"Server: `{report['server_command']}`.",
        "",
        "Configs:",
        "",
        "```",
        *[text.rstrip() + "\n" for text in report["configs"].values()],
        "```",
        "",
        "Python load generator (benchmarks/ensemble_client.py), per inference = one complete "
        "chain; latencies in µs; CPU in µs per chain:",
        "",
        "| transport | shape | c | infer/s | p50 µs | p99 µs | step p50 µs | server CPU "
        "| client CPU | server + client | server cores | client cores | other processes' cores "
        "| mean batch | answers checked |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        head = f"| {r['transport']} | {r['shape']} | {r['concurrency']} "
        if r["error"]:
            lines.append(head + f"| FAILED: {r['error'].splitlines()[-1]} |||||||||||")
            continue
        server, client = r.get("server_cpu_us_per_infer"), r.get("client_cpu_us_per_infer")
        both = server + client if server is not None and client is not None else None
        steps = " / ".join(n(s) for s in r["step_p50_us"]) or "—"
        lines.append(
            head + f"| {n(r['infer_per_s'])} | {n(r['p50_us'])} | {n(r['p99_us'])} | {steps} "
            f"| {n(server)} | {n(client)} | {n(both)} | {n(r.get('server_cores'), 2)} "
            f"| {n(r['client_cores'], 2)} | {n(r.get('other_cores'), 2)} | {batch_sizes(r)} "
            f"| {r['answers']} |"
        )
    groups = list(server_usage.GROUPS)
    lines += [
        "",
        "Server CPU per chain by thread group (µs; benchmarks/server_usage.py's groups):",
        "",
        "| transport | shape | c | total | " + " | ".join(groups) + " |",
        "|---|---|---|---|" + "---|" * len(groups),
    ]
    for r in rows:
        per = r.get("thread_us_per_infer") or {}
        if r["error"] or not per:
            continue
        lines.append(
            f"| {r['transport']} | {r['shape']} | {r['concurrency']} "
            f"| {n(r['server_cpu_us_per_infer'])} | "
            + " | ".join(n(per.get(g)) for g in groups)
            + " |"
        )
    lines += [
        "",
        "User and kernel CPU (µs) per chain of the grpc and worker thread groups "
        "(/proc/PID/task/TID/stat), and context switches per chain (voluntary + involuntary: "
        "the server's threads from /proc/PID/task/TID/status, the client's from getrusage):",
        "",
        "| transport | shape | c | grpc user | grpc kernel | worker user | worker kernel "
        "| server switches (grpc / worker / all) | client switches |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        split, switches = r.get("kernel_split") or {}, r.get("switches_per_infer") or {}
        if r["error"] or not split:
            continue
        grpc, worker = split.get("grpc", {}), split.get("worker", {})
        lines.append(
            f"| {r['transport']} | {r['shape']} | {r['concurrency']} "
            f"| {n(grpc.get('user_us'))} | {n(grpc.get('system_us'))} "
            f"| {n(worker.get('user_us'))} | {n(worker.get('system_us'))} "
            f"| {n(switches.get('grpc'), 1)} / {n(switches.get('worker'), 1)} / "
            f"{n(sum(switches.values()), 1)} | {n(r.get('client_switches_per_infer'), 1)} |"
        )
    lines += [
        "",
        "Ensemble against client-chain (ratios ensemble / client-chain):",
        "",
        "| transport | c | infer/s ratio | p50 ratio | server CPU ratio | client CPU ratio "
        "| ensemble wins (more infer/s and lower p50) |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in report["comparisons"]:
        lines.append(
            f"| {c['transport']} | {c['concurrency']} | {c['throughput_ratio']:.2f} "
            f"| {c['p50_ratio']:.2f} | {n(c['server_cpu_ratio'], 2)} "
            f"| {n(c['client_cpu_ratio'], 2)} | {'yes' if c['wins'] else 'NO'} |"
        )
    if report["pa_rows"]:
        lines += [
            "",
            "perf_analyzer (TCP), as context: `chain` is one chain per inference, `add_one` one "
            "model; server CPU per inference of that model:",
            "",
            "| model | c | infer/s | p50 µs | p99 µs | server CPU µs/infer | server cores "
            "| perf_analyzer cores | other processes' cores | queue µs | compute infer µs "
            "| mean batch |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for r in report["pa_rows"]:
            mark = f"*{r['stability_percentage']}%" if r["stability_percentage"] else ""
            head = f"| {r['model']} | {r['concurrency']} "
            if r["error"]:
                lines.append(head + f"| FAILED: {r['error'].splitlines()[-1]} ||||||||||")
                continue
            lines.append(
                head + f"| {n(r['infer_per_s'])}{mark} | {n(r['p50_us'])} | {n(r['p99_us'])} "
                f"| {n(r['server_cpu_us_per_infer'])} | {r['server_cores']:.2f} "
                f"| {r['load_generator_cores']:.2f} | {r['other_cores']:.2f} "
                f"| {n(r['server_queue_us'])} | {n(r['compute_infer_us'])} | {batch_sizes(r)} |"
            )
    lines += ["", "Load generator commands:", ""]
    commands = [r["command"] for r in rows] + [r["command"] for r in report["pa_rows"]]
    lines += [f"    {c}" for c in sorted(set(commands))]
    return "\n".join(lines) + "\n"


def describe(row: dict[str, Any]) -> str:
    if row["error"]:
        return f"FAILED: {row['error']}"
    return (
        f"{row['infer_per_s']:.0f} infer/s, p50 {row['p50_us']:.0f} µs, p99 {row['p99_us']:.0f} "
        f"µs, server {n(row.get('server_cpu_us_per_infer'))} µs CPU/infer, client "
        f"{n(row.get('client_cpu_us_per_infer'))} ({n(row.get('server_cores'), 2)} server cores, "
        f"{n(row.get('client_cores'), 2)} client, {n(row.get('other_cores'), 2)} others)"
    )


# --- main ---------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--python", default=sys.executable, help="Python with inferd installed")
    parser.add_argument("--shapes", nargs="+", choices=SHAPES, default=list(SHAPES))
    parser.add_argument("--transports", nargs="+", choices=TRANSPORTS, default=list(TRANSPORTS))
    parser.add_argument(
        "--concurrencies",
        type=int,
        nargs="*",
        default=[1, 8, 32],
        help="the Python client's (none: only perf_analyzer)",
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="measured, per row")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds before measuring")
    parser.add_argument("--max-batch-size", type=int, default=32)
    parser.add_argument("--server-arg", action="append", default=[], help="extra inferd flag")
    parser.add_argument("--no-pa", action="store_true", help="skip the perf_analyzer runs")
    parser.add_argument("--pa-concurrencies", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--measurement-interval", type=int, default=5000, help="ms per window")
    parser.add_argument(
        "--retry-stability",
        type=int,
        nargs="*",
        default=[25, 50],
        help="--stability-percentage values for the retries of a run that did not stabilise",
    )
    parser.add_argument("--out", type=Path, help="default benchmarks/out/ensemble-<timestamp>/")
    return parser.parse_args()


def main() -> int:
    # Started in the background by a non-interactive shell, SIGINT arrives ignored: restore
    # Python's handler so that an interrupt still stops the server and the clients.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    args = parse_args()
    args.python = str(Path(args.python).absolute()) if os.sep in args.python else args.python
    started = datetime.now()
    out = args.out or harness.BENCHMARKS / "out" / started.strftime("ensemble-%Y%m%d-%H%M%S")
    (out / "logs").mkdir(parents=True, exist_ok=True)
    machine = harness.machine_info(args.python)
    print(f"machine: {harness.describe_machine(machine)}\nout: {out}", flush=True)
    clock = time.monotonic()
    rows: list[dict[str, Any]] = []
    pa_rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="inferd-ensemble-bench-") as tmp:
        repository = Path(tmp) / "repository"
        configs = write_repository(repository, args.max_batch_size, "ensemble" in args.shapes)
        socket = Path(tmp) / "inferd.sock"
        command = harness.inferd_command(
            args.python,
            repository,
            ["--grpc-unix-socket", str(socket), "--metrics-port", "0", *args.server_arg],
        )
        shown_server = (
            shlex.join(command)
            .replace(args.python, harness.relative(args.python))
            .replace(str(repository), "REPOSITORY")
            .replace(str(socket), "SOCKET")
        )
        server = harness.start_server(command, out / "logs" / "server.log")
        statistics = server_usage.StatisticsClient(server.port)
        targets = {"tcp": f"127.0.0.1:{server.port}", "unix": f"unix:{socket}"}
        try:
            for transport in args.transports:
                for clients in args.concurrencies:
                    for shape in args.shapes:
                        log = out / "logs" / f"{transport}-{shape}-c{clients}.log"
                        row = run_client(
                            args, server, statistics, targets[transport], shape, clients, log
                        )
                        row["transport"] = transport
                        row["command"] = row["command"].replace(str(socket), "SOCKET")
                        row["command"] = row["command"].replace(str(server.port), "PORT")
                        rows.append(row)
                        print(f"  {transport} {shape} c={clients}: {describe(row)}", flush=True)
            if not args.no_pa:
                pa = harness.PerfAnalyzer.find(args.python)
                for model in [m for m in (ENSEMBLE, STEPS[0]) if m in configs]:
                    for clients in args.pa_concurrencies:
                        row = run_pa(args, pa, server, statistics, model, clients, out)
                        pa_rows.append(row)
                        print(f"  perf_analyzer {model} c={clients}: {describe(row)}", flush=True)
        finally:
            statistics.close()
            server.stop()
    report: dict[str, Any] = {
        "started": started.isoformat(timespec="seconds"),
        "minutes": (time.monotonic() - clock) / 60,
        "invocation": shlex.join(
            [harness.relative(sys.executable), harness.relative(sys.argv[0]), *sys.argv[1:]]
        ),
        "machine": machine,
        "server_command": shown_server,
        "configs": configs,
        "rows": rows,
        "pa_rows": pa_rows,
        "comparisons": comparisons(rows),
    }
    (out / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    text = markdown(report)
    (out / "results.md").write_text(text)
    print("\n" + text)
    print(f"written: {out / 'results.md'}, {out / 'results.json'}")
    return 1 if any(r["error"] for r in rows + pa_rows) else 0


if __name__ == "__main__":
    sys.exit(main())
