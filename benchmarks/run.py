"""Every baseline and inferd (before and after a change), in one run on one machine, with
perf_analyzer: throughput, latency, server CPU per inference, per-thread CPU, served batch compute
against in-process, targets, and the commands.

    python benchmarks/run.py                       # mlp and simple at 1 16 64, 5 s windows
    python benchmarks/run.py --model mlp:1,16 --measurement-interval 1000 --configs floor inferd
    python benchmarks/run.py --max-queue-delay-us mlp=2000 --out benchmarks/out/delay2000
    python benchmarks/run.py --before-python "$(benchmarks/before.sh 6dd1f18 /tmp/inferd-before)" \
        --configs floor floor-cpp inline inferd-before inferd-batching --max-queue-delay-us mlp=2000

Per model (``--model NAME[:C,C,...]``, repeatable; without concurrencies, ``--concurrency``):

  floor             benchmarks/transport_floor.py: grpc.aio answering a canned response
  floor-cpp         benchmarks/floor_cpp (built into build/floor_cpp): the same canned answers,
                    from grpc++'s callback API in C++ (the floor of a C++ transport)
  inline            benchmarks/transport_floor.py --inline: grpc.aio running ONNX Runtime in the
                    handler, on the event loop's thread (the naive server)
  inferd            inferd serve on the repository as written (no dynamic batching)
  inferd-batching   inferd serve on a copy of the repository whose models' config.pbtxt gets
                    ``dynamic_batching { }`` appended (or ``{ max_queue_delay_microseconds: N }``,
                    ``--max-queue-delay-us [MODEL=]N``, per model or for all)
  inferd-before     the same repository copy served by another build's Python (``--before-python``,
                    made by benchmarks/before.sh: a git worktree of the earlier commit with its own
                    venv); measured when that is given
  in-process        benchmarks/raw_engine.py after the servers, with inferd's session options
                    (intra-op threads = cores - 1, no spinning): batch ``--batch-sizes`` and the
                    sizes the batching servers executed most at the model's top concurrency

Each server is started on a free loopback port; perf_analyzer (gRPC, the Triton protocol, batch 1)
measures it at each concurrency (``--concurrency-range C:C --measurement-interval MS
--percentile 99``), then the server is stopped. The servers and perf_analyzer share the machine's
cores. Around each perf_analyzer run the server's CPU (/proc/PID/stat, and per thread), its
ModelStatistics (inference count, batch_stats) and perf_analyzer's CPU are read
(benchmarks/server_usage.py). Writes ``results.md`` (benchmarks/report.py: tables, targets, the
exact commands), ``results.json``, one throughput-vs-p99 PNG per model (benchmarks/plot.py) and
every tool's log under ``logs/`` into ``--out`` (default ``benchmarks/out/<timestamp>/``,
git-ignored).

perf_analyzer ships in the ``tritonclient==2.41.0`` wheel; it needs Debian's ``libb64-0d`` and
``libcudart.so.12`` (pip ``nvidia-cuda-runtime-cu12``, in inferd's dev extra) although it runs
without a GPU: it is run through ``inferd-perf-analyzer``, which puts that library on its path.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import harness
import report as reporting
import server_usage

CONFIGS = ["floor", "floor-cpp", "inline", "inferd", "inferd-before", "inferd-batching"]
# + inferd-before if given
DEFAULT_CONFIGS = ["floor", "floor-cpp", "inline", "inferd", "inferd-batching"]
DEFAULT_MODELS = ["mlp:1,16,64", "simple:1,16,64"]


@dataclass(frozen=True)
class Plan:
    model: str
    concurrencies: list[int]


def parse_models(specs: list[str], default_concurrency: list[int]) -> list[Plan]:
    plans = []
    for spec in specs:
        name, _, levels = spec.partition(":")
        concurrencies = [int(c) for c in levels.split(",") if c] if levels else default_concurrency
        plans.append(Plan(name, concurrencies))
    return plans


def parse_delays(specs: list[str], models: list[str]) -> dict[str, int]:
    """``--max-queue-delay-us`` values: ``N`` (every model) or ``MODEL=N``; later ones win."""
    delays: dict[str, int] = {}
    for spec in specs:
        name, sep, value = spec.rpartition("=")
        if sep:
            delays[name] = int(value)
        else:
            delays.update(dict.fromkeys(models, int(value)))
    return delays


def shown_command(cmd: list[str], python: str, replace: dict[str, str]) -> str:
    text = shlex.join(cmd).replace(python, harness.relative(python))
    for old, new in replace.items():
        text = text.replace(old, new)
    return text.replace(str(harness.ROOT) + "/", "")


def describe_before(python: str) -> dict[str, Any]:
    """The BEFORE build: where its inferd comes from, and that tree's commit."""
    probe = "import inferd, pathlib; print(pathlib.Path(inferd.__file__).resolve().parents[2])"
    done = subprocess.run([python, "-c", probe], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"--before-python {python} cannot import inferd: {done.stderr[-400:]}")
    tree = done.stdout.strip()
    git = ["git", "-C", tree]
    commit = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    changed = subprocess.run(
        [*git, "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
    ).stdout.split("\n")
    named = any(line.endswith("cpp/src/scheduler.cpp") for line in changed)
    others = [line for line in changed if line.strip() and not line.endswith("scheduler.cpp")]
    note = ""
    if named:
        note = ", its core threads named as now (benchmarks/before.sh)"
    if others:
        note += f", with {len(others)} other changed files"
    return {"python": python, "tree": tree, "commit": commit.stdout.strip(), "note": note}


# --- in-process (raw engine) ------------------------------------------------------------------


def run_raw_engine(
    python: str,
    repository: Path,
    model: str,
    batch_sizes: list[int],
    args: argparse.Namespace,
    out: Path,
) -> tuple[dict[str, Any] | None, str]:
    json_path = out / f"raw_engine_{model}.json"
    cmd = [
        python, str(harness.BENCHMARKS / "raw_engine.py"),
        "--model-repository", str(repository), "--model", model,
        "--batch-sizes", *map(str, batch_sizes), "--min-seconds", str(args.raw_seconds),
        "--intra-op-thread-count", str(args.raw_intra_op_threads), "--no-spinning",
        "--json", str(json_path),
    ]  # fmt: skip
    print(f"in-process {model}, batch {' '.join(map(str, batch_sizes))}", flush=True)
    done = subprocess.run(cmd, capture_output=True, text=True)
    (out / "logs" / f"raw_engine_{model}.log").write_text(done.stdout + done.stderr)
    shown = shown_command(cmd, python, {str(out) + "/": ""})
    if done.returncode != 0:
        print(f"  raw engine failed for {model}: {done.stderr.strip()[-400:]}", flush=True)
        return None, shown
    print(done.stdout, flush=True)
    result: dict[str, Any] = json.loads(json_path.read_text())
    return result, shown


def in_process_sizes(runs: list[dict[str, Any]], plan: Plan, args: argparse.Namespace) -> list[int]:
    """``--batch-sizes`` plus the sizes the batching servers executed most at the top c."""
    sizes = set(args.batch_sizes)
    top = max(plan.concurrencies)
    for config in ("inferd-batching", "inferd-before"):
        result = reporting.at(runs, config, plan.model, top)
        sizes.update(reporting.compared_sizes(result, args.compare_sizes))
    return sorted(sizes)


# --- servers ----------------------------------------------------------------------------------


def measure_once(
    server: harness.Server,
    statistics: server_usage.StatisticsClient,
    pa: harness.PerfAnalyzer,
    model: str,
    concurrency: int,
    extra: list[str],
    args: argparse.Namespace,
    log: Path,
) -> tuple[harness.PerfResult, dict[str, Any]]:
    """One perf_analyzer run, with the server's CPU and counts read just before and after."""
    start = server_usage.sample(server.pid, statistics, model)
    result = pa.measure(model, server.port, concurrency, args.measurement_interval, extra, log)
    end = server_usage.sample(server.pid, statistics, model)
    return result, server_usage.usage(server.pid, start, end)


def measure_plan(
    config: str,
    server: harness.Server,
    statistics: server_usage.StatisticsClient,
    plan: Plan,
    pa: harness.PerfAnalyzer,
    args: argparse.Namespace,
    out: Path,
) -> list[dict[str, Any]]:
    results = []
    for concurrency in plan.concurrencies:
        base = [*(["--async"] if not args.sync else []), *args.pa_arg]
        attempt, extra = 0, base
        while True:
            log = out / "logs" / f"{config}-{plan.model}-c{concurrency}-{attempt}.log"
            result, usage = measure_once(
                server, statistics, pa, plan.model, concurrency, extra, args, log
            )
            if result.error is None or attempt >= len(args.retry_stability):
                break
            # perf_analyzer gives up when 3 windows in a row do not agree within 10%; on 2
            # shared cores that happens. A retry accepts a wider spread; the report marks it.
            stability = args.retry_stability[attempt]
            attempt += 1
            extra = [*base, "--stability-percentage", str(stability)]
            print(
                f"    retrying with --stability-percentage {stability} "
                f"({result.error.splitlines()[-1]})",
                flush=True,
            )
        summary = result.summary()
        summary["attempts"] = attempt + 1
        summary["stability_percentage"] = args.retry_stability[attempt - 1] if attempt else None
        summary["usage"] = usage
        results.append(summary)
        cpu = usage.get("server_cpu_us_per_infer")
        figure = (
            f"{summary['infer_per_s']:.0f} infer/s, p50 {summary['p50_us']:.0f} µs, "
            f"p99 {summary['p99_us']:.0f} µs, server "
            f"{'n/a' if cpu is None else f'{cpu:.0f}'} µs CPU/infer "
            f"({usage.get('server_cores') or 0:.2f} cores)"
            if result.error is None
            else f"FAILED: {result.error}"
        )
        if usage.get("error"):
            figure += f" [{usage['error']}]"
        print(
            f"  {config:16} {plan.model:8} c={concurrency:<3} {figure} ({result.seconds:.0f} s)",
            flush=True,
        )
    return results


def measure_server(
    config: str,
    command: list[str],
    plans: list[Plan],
    pa: harness.PerfAnalyzer,
    args: argparse.Namespace,
    out: Path,
) -> list[dict[str, Any]]:
    """Starts one server, measures the given models at each concurrency, stops it."""
    tag = config if len(plans) != 1 else f"{config}-{plans[0].model}"
    runs: list[dict[str, Any]] = []
    try:
        server = start_with_retries(command, out / "logs" / f"{tag}.server.log", args)
    except RuntimeError as e:
        print(f"  {config}: {e}", flush=True)
        error = str(e).strip().splitlines()[-1]
        for plan in plans:
            failed = harness.PerfResult(0, {}, "", 0.0, f"server did not start: {error}")
            results = [{**failed.summary(), "concurrency": c} for c in plan.concurrencies]
            runs.append({"config": config, "model": plan.model, "results": results})
        return runs
    statistics = server_usage.StatisticsClient(server.port)
    try:
        for plan in plans:
            results = measure_plan(config, server, statistics, plan, pa, args, out)
            runs.append({"config": config, "model": plan.model, "results": results})
    finally:
        statistics.close()
        server.stop()
    return runs


def start_with_retries(command: list[str], log: Path, args: argparse.Namespace) -> harness.Server:
    """A server that does not start is tried again after ``--start-retry-wait`` s (the tree
    being measured may be mid-change: a rebuild finishing can fix it)."""
    for attempt in range(args.start_retries + 1):
        try:
            return harness.start_server(command, log)
        except RuntimeError as e:
            if attempt == args.start_retries:
                raise
            tail = str(e).strip().splitlines()[-1][:200]
            print(f"  did not start ({tail}); again in {args.start_retry_wait} s", flush=True)
            time.sleep(args.start_retry_wait)
    raise AssertionError("unreachable")


def measure_all(
    args: argparse.Namespace,
    python: str,
    repository: Path,
    plans: list[Plan],
    pa: harness.PerfAnalyzer,
    out: Path,
    delays: dict[str, int],
) -> tuple[list[dict[str, Any]], dict[str, str], str]:
    runs: list[dict[str, Any]] = []
    commands: dict[str, str] = {}
    models = [p.model for p in plans]
    with tempfile.TemporaryDirectory(prefix="inferd-bench-") as tmp:
        batching_repo = Path(tmp) / "repository-batching"
        block = harness.batching_repository(repository, batching_repo, models, delays)
        cpp_floor = harness.floor_cpp_binary() if "floor-cpp" in args.configs else None
        for config in args.configs:
            if config == "floor-cpp":
                assert cpp_floor is not None
                for plan in plans:
                    responses = Path(tmp) / f"floor-cpp-{plan.model}"
                    write = harness.write_floor_responses(python, repository, plan.model, responses)
                    cmd = harness.floor_cpp_command(cpp_floor, responses)
                    replace = {f"--model {plan.model}": "--model MODEL", str(responses): "DIR"}
                    commands[config] = " && ".join(
                        shown_command(c, python, replace) for c in (write, cmd)
                    )
                    runs += measure_server(config, cmd, [plan], pa, args, out)
                continue
            if config in ("floor", "inline"):
                for plan in plans:
                    cmd = harness.floor_command(python, repository, plan.model, config == "inline")
                    commands[config] = shown_command(
                        cmd, python, {f"--model {plan.model}": "--model MODEL"}
                    )
                    runs += measure_server(config, cmd, [plan], pa, args, out)
                continue
            repo = repository if config == "inferd" else batching_repo
            server_python = args.before_python if config == "inferd-before" else python
            cmd = harness.inferd_command(server_python, repo, args.server_arg)
            commands[config] = shown_command(
                cmd, server_python, {str(batching_repo): "REPOSITORY-COPY-WITH-DYNAMIC-BATCHING"}
            )
            runs += measure_server(config, cmd, plans, pa, args, out)
    return runs, commands, block


# --- main -------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--python", default=sys.executable, help="Python with inferd installed")
    parser.add_argument(
        "--before-python",
        help="Python of the BEFORE build (benchmarks/before.sh prints it): config inferd-before",
    )
    parser.add_argument("--repository", type=Path, default=Path("examples-repo"))
    parser.add_argument(
        "--model",
        action="append",
        help="NAME[:C,C,...], repeatable (default: mlp:1,16,64 and simple:1,16,64)",
    )
    parser.add_argument(
        "--concurrency", type=int, nargs="+", default=[1, 16], help="for --model NAME alone"
    )
    parser.add_argument(
        "--configs",
        nargs="+",
        choices=CONFIGS,
        help=f"servers to measure (default: {' '.join(DEFAULT_CONFIGS)}, and inferd-before "
        "when --before-python is given)",
    )
    parser.add_argument("--measurement-interval", type=int, default=5000, help="ms per window")
    parser.add_argument(
        "--max-queue-delay-us",
        action="append",
        default=[],
        metavar="[MODEL=]N",
        help="dynamic_batching { max_queue_delay_microseconds: N } for MODEL (or every model); "
        "repeatable; models without one get dynamic_batching { }",
    )
    parser.add_argument("--server-arg", action="append", default=[], help="extra inferd flag")
    parser.add_argument(
        "--pa-arg", action="append", default=[], help="extra perf_analyzer flag, e.g. --pa-arg=-r20"
    )
    parser.add_argument(
        "--retry-stability",
        type=int,
        nargs="*",
        default=[25, 50],
        help="a perf_analyzer run that fails (no 3 windows within 10%%) is run again with each "
        "of these --stability-percentage values in turn, until one succeeds",
    )
    parser.add_argument(
        "--sync", action="store_true", help="perf_analyzer's synchronous API (default --async)"
    )
    parser.add_argument("--start-retries", type=int, default=2, help="for a server that fails")
    parser.add_argument("--start-retry-wait", type=float, default=120.0, help="s between them")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument(
        "--compare-sizes",
        type=int,
        default=20,
        help="in-process also at up to N batch sizes the batching servers executed most",
    )
    parser.add_argument("--raw-seconds", type=float, default=2.0, help="in-process s per size")
    parser.add_argument(
        "--raw-intra-op-threads",
        type=int,
        default=max(1, harness.default_threads() - 1),
        help="in-process intra-op threads (default: inferd's, cores - 1)",
    )
    parser.add_argument("--no-raw-engine", action="store_true")
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--out", type=Path, help="default benchmarks/out/<timestamp>/")
    args = parser.parse_args()
    if args.configs is None:
        args.configs = DEFAULT_CONFIGS + (["inferd-before"] if args.before_python else [])
    if "inferd-before" in args.configs and not args.before_python:
        parser.error("inferd-before needs --before-python (benchmarks/before.sh prints it)")
    return args


def absolute_python(python: str) -> str:
    # Not resolved: a venv's python is a link whose target has no venv around it.
    return str(Path(python).absolute()) if os.sep in python else python


def main() -> int:
    args = parse_args()
    python = absolute_python(args.python)
    if args.before_python:
        args.before_python = absolute_python(args.before_python)
    plans = parse_models(args.model or DEFAULT_MODELS, args.concurrency)
    started = datetime.now()
    out = args.out or harness.BENCHMARKS / "out" / started.strftime("%Y%m%d-%H%M%S")
    (out / "logs").mkdir(parents=True, exist_ok=True)
    repository = args.repository.resolve()
    if not repository.is_dir():
        print(f"{repository} missing: writing the example repository", flush=True)
        subprocess.run([python, "-m", "inferd", "make-examples", str(repository)], check=True)
    before = describe_before(args.before_python) if "inferd-before" in args.configs else None
    pa = harness.PerfAnalyzer.find(python)
    machine = harness.machine_info(python)
    print(f"machine: {harness.describe_machine(machine)}\nout: {out}", flush=True)
    if before:
        print(f"before: {before['commit']} in {before['tree']}", flush=True)
    clock = time.monotonic()

    models = [p.model for p in plans]
    delays = parse_delays(args.max_queue_delay_us, models)
    runs, server_commands, block = measure_all(args, python, repository, plans, pa, out, delays)

    raw: dict[str, dict[str, Any] | None] = {}
    raw_commands: dict[str, str] = {}
    if not args.no_raw_engine:
        for plan in plans:
            sizes = in_process_sizes(runs, plan, args)
            raw[plan.model], raw_commands[plan.model] = run_raw_engine(
                python, repository, plan.model, sizes, args, out
            )

    report: dict[str, Any] = {
        "started": started.isoformat(timespec="seconds"),
        "minutes": (time.monotonic() - clock) / 60,
        "invocation": shlex.join(
            [harness.relative(sys.executable), harness.relative(sys.argv[0]), *sys.argv[1:]]
        ),
        "machine": machine,
        "before": before,
        "settings": {
            "repository": harness.relative(repository),
            "measurement_interval_ms": args.measurement_interval,
            "batching_block": block,
            "batching_blocks": {m: harness.batching_block(delays.get(m)) for m in models},
            "server_args": args.server_arg,
            "pa_args": args.pa_arg,
            "retry_stability": args.retry_stability,
            "perf_analyzer_async": not args.sync,
            "configs": args.configs,
        },
        "plans": [{"model": p.model, "concurrencies": p.concurrencies} for p in plans],
        "raw_engine": raw,
        "raw_engine_commands": raw_commands,
        "server_commands": server_commands,
        "runs": runs,
    }
    report["ratios"] = reporting.ratios(report)
    report["targets"] = reporting.targets(report)
    (out / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    if not args.no_plot:
        done = subprocess.run(
            [python, str(harness.BENCHMARKS / "plot.py"), str(out)], capture_output=True, text=True
        )
        if done.returncode != 0:
            print(f"plot failed: {done.stderr.strip()[-400:]}", flush=True)
        else:
            # plot.py writes the PNG names back into results.json
            report = json.loads((out / "results.json").read_text())
    text = reporting.markdown(report)
    (out / "results.md").write_text(text)
    print("\n" + text)
    print(f"written: {out / 'results.md'}, {out / 'results.json'}")
    failed = sum(1 for run in runs for r in run["results"] if r["error"] is not None)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
