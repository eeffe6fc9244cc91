"""Every baseline and inferd, in one run on one machine, with perf_analyzer: tables and commands.

    python benchmarks/run.py                       # mlp at 1 16 64, simple at 1 16, 5 s windows
    python benchmarks/run.py --model mlp:1,16 --measurement-interval 1000 --configs floor inferd
    python benchmarks/run.py --max-queue-delay-us 500 --out benchmarks/out/delay500

Per model (``--model NAME[:C,C,...]``, repeatable; without concurrencies, ``--concurrency``):

  raw engine        benchmarks/raw_engine.py: ONNX Runtime in-process at batch 1 8 32 64, no server
  floor             benchmarks/transport_floor.py: grpc.aio answering a canned response
  inline            benchmarks/transport_floor.py --inline: grpc.aio running ONNX Runtime in the
                    handler, on the event loop's thread (the naive server)
  inferd            inferd serve on the repository as written (no dynamic batching)
  inferd-batching   inferd serve on a copy of the repository whose models' config.pbtxt gets
                    ``dynamic_batching { }`` appended (or ``{ max_queue_delay_microseconds: N }``)

Each server is started on a free loopback port; perf_analyzer (gRPC, the Triton protocol, batch 1)
measures it at each concurrency (``--concurrency-range C:C --measurement-interval MS
--percentile 99``), then the server is stopped. The servers and perf_analyzer share the machine's
cores. Writes ``results.md`` (tables, ratios, the exact commands), ``results.json``, one
throughput-vs-p99 PNG per model (benchmarks/plot.py) and every tool's log under ``logs/`` into
``--out`` (default ``benchmarks/out/<timestamp>/``, git-ignored).

Ratios, per model at its highest concurrency: inferd-batching / min(floor, raw engine best rows/s),
inferd-batching / inferd, inferd-batching / floor; at concurrency 1: p50 of inferd (both
configurations) minus p50 of the floor, in µs.

perf_analyzer ships in the ``tritonclient==2.41.0`` wheel; it needs Debian's ``libb64-0d`` and
``libcudart.so.12`` (pip ``nvidia-cuda-runtime-cu12``, found and put on LD_LIBRARY_PATH here)
although it runs without a GPU.
"""

from __future__ import annotations

import argparse
import json
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

CONFIGS = ["floor", "inline", "inferd", "inferd-batching"]
LABELS = {
    "floor": "transport floor",
    "inline": "inline naive server",
    "inferd": "inferd, no batching",
    "inferd-batching": "inferd, dynamic batching",
}
DEFAULT_MODELS = ["mlp:1,16,64", "simple:1,16"]


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


def shown_command(cmd: list[str], python: str, replace: dict[str, str]) -> str:
    text = shlex.join(cmd).replace(python, harness.relative(python))
    for old, new in replace.items():
        text = text.replace(old, new)
    return text.replace(str(harness.ROOT) + "/", "")


def run_raw_engine(
    python: str, repository: Path, model: str, args: argparse.Namespace, out: Path
) -> tuple[dict[str, Any] | None, str]:
    json_path = out / f"raw_engine_{model}.json"
    cmd = [
        python, str(harness.BENCHMARKS / "raw_engine.py"),
        "--model-repository", str(repository), "--model", model,
        "--batch-sizes", *map(str, args.batch_sizes), "--min-seconds", str(args.raw_seconds),
        "--json", str(json_path),
    ]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True)
    (out / "logs" / f"raw_engine_{model}.log").write_text(done.stdout + done.stderr)
    shown = shown_command(cmd, python, {str(out) + "/": ""})
    if done.returncode != 0:
        print(f"  raw engine failed for {model}: {done.stderr.strip()[-400:]}", flush=True)
        return None, shown
    print(done.stdout, flush=True)
    result: dict[str, Any] = json.loads(json_path.read_text())
    return result, shown


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
        server = harness.start_server(command, out / "logs" / f"{tag}.server.log")
    except RuntimeError as e:
        print(f"  {config}: {e}", flush=True)
        error = str(e).strip().splitlines()[-1]
        for plan in plans:
            results = [
                {**harness.PerfResult(c, {}, "", 0.0, f"server did not start: {error}").summary()}
                for c in plan.concurrencies
            ]
            runs.append({"config": config, "model": plan.model, "results": results})
        return runs
    try:
        for plan in plans:
            results = []
            for concurrency in plan.concurrencies:
                attempt, extra = 0, list(args.pa_arg)
                while True:
                    log = out / "logs" / f"{config}-{plan.model}-c{concurrency}-{attempt}.log"
                    result = pa.measure(
                        plan.model, server.port, concurrency, args.measurement_interval, extra, log
                    )
                    if result.error is None or attempt >= args.retries:
                        break
                    attempt += 1
                    # perf_analyzer gives up when 3 windows in a row do not agree within 10%;
                    # on 2 shared cores that happens. The retry accepts a wider spread, and the
                    # report marks the figure.
                    extra = [*args.pa_arg, "--stability-percentage", str(args.retry_stability)]
                    print(
                        f"    retrying with --stability-percentage {args.retry_stability} "
                        f"({result.error.splitlines()[-1]})",
                        flush=True,
                    )
                summary = result.summary()
                summary["attempts"] = attempt + 1
                summary["stability_percentage"] = args.retry_stability if attempt else None
                results.append(summary)
                figure = (
                    f"{summary['infer_per_s']:.0f} infer/s, p50 {summary['p50_us']:.0f} µs, "
                    f"p99 {summary['p99_us']:.0f} µs"
                    if result.error is None
                    else f"FAILED: {result.error}"
                )
                print(
                    f"  {config:16} {plan.model:8} c={concurrency:<3} {figure} "
                    f"({result.seconds:.0f} s)",
                    flush=True,
                )
            runs.append({"config": config, "model": plan.model, "results": results})
    finally:
        server.stop()
    return runs


def at(runs: list[dict[str, Any]], config: str, model: str, concurrency: int) -> dict[str, Any]:
    for run in runs:
        if run["config"] == config and run["model"] == model:
            for r in run["results"]:
                if r["concurrency"] == concurrency and r["error"] is None:
                    return dict(r)
    return {}


def ratios(
    runs: list[dict[str, Any]], plans: list[Plan], raw: dict[str, dict[str, Any] | None]
) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []

    def ratio(a: float | None, b: float | None) -> float | None:
        return a / b if a is not None and b else None

    for plan in plans:
        m, top = plan.model, max(plan.concurrencies)
        batching = at(runs, "inferd-batching", m, top).get("infer_per_s")
        plain = at(runs, "inferd", m, top).get("infer_per_s")
        floor = at(runs, "floor", m, top).get("infer_per_s")
        raw_best = (raw.get(m) or {}).get("best_rows_per_s")
        # Both limits or none: a missing one could be the lower.
        limit = min(floor, raw_best) if floor is not None and raw_best is not None else None
        which = "n/a" if limit is None else ("floor" if limit == floor else "raw engine")
        out += [
            {
                "name": "inferd-batching / min(floor, raw engine best)",
                "model": m,
                "concurrency": top,
                "value": ratio(batching, limit),
                "detail": f"{_n(batching)} / min({_n(floor)}, {_n(raw_best)}) [{which}]",
            },
            {
                "name": "inferd-batching / inferd (no batching)",
                "model": m,
                "concurrency": top,
                "value": ratio(batching, plain),
                "detail": f"{_n(batching)} / {_n(plain)}",
            },
            {
                "name": "inferd-batching / floor",
                "model": m,
                "concurrency": top,
                "value": ratio(batching, floor),
                "detail": f"{_n(batching)} / {_n(floor)}",
            },
        ]
        if 1 in plan.concurrencies:
            floor_p50 = at(runs, "floor", m, 1).get("p50_us")
            for config in ("inferd-batching", "inferd"):
                p50 = at(runs, config, m, 1).get("p50_us")
                out.append(
                    {
                        "name": f"p50 {config} - p50 floor (µs)",
                        "model": m,
                        "concurrency": 1,
                        "value": p50 - floor_p50
                        if p50 is not None and floor_p50 is not None
                        else None,
                        "detail": f"{_n(p50)} - {_n(floor_p50)}",
                    }
                )
    return out


def _n(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.0f}"


def _cell(x: float | None) -> str:
    return "—" if x is None else f"{x:.0f}"


def markdown(report: dict[str, Any]) -> str:
    s = report["settings"]
    lines = [
        f"# inferd benchmark, {report['started']}",
        "",
        f"Machine: {harness.describe_machine(report['machine'])}. Servers and perf_analyzer "
        "share these cores.",
        "",
        f"Run: `{report['invocation']}` ({report['minutes']:.1f} min). perf_analyzer gRPC, "
        f"batch 1, {s['measurement_interval_ms']} ms windows, reported once 3 windows in a row "
        "agree within 10% (a figure marked * came from a retry that allowed "
        f"{s['retry_stability']}%). Server-side columns come from ModelStatistics (inferd only; "
        "the baselines do not offer the statistics extension). Latencies in µs.",
        "",
        f"Dynamic batching: `{s['batching_block']}` appended to each model's config.pbtxt in a "
        "copy of the repository.",
        "",
    ]
    for plan in report["plans"]:
        model = plan["model"]
        lines += [
            f"## {model}",
            "",
            "| configuration | concurrency | infer/s | p50 µs | p99 µs | server queue µs | "
            "server compute in / infer / out µs |",
            "|---|---|---|---|---|---|---|",
        ]
        for run in report["runs"]:
            if run["model"] != model:
                continue
            for r in run["results"]:
                label = LABELS[run["config"]]
                if r["error"] is not None:
                    lines.append(
                        f"| {label} | {r['concurrency']} | failed | | | | "
                        f"{r['error'].splitlines()[-1][:120]} |"
                    )
                    continue
                server = run["config"].startswith("inferd")
                queue = _cell(r["server_queue_us"]) if server else "—"
                compute = (
                    " / ".join(
                        _cell(r[k])
                        for k in (
                            "server_compute_input_us",
                            "server_compute_infer_us",
                            "server_compute_output_us",
                        )
                    )
                    if server
                    else "—"
                )
                star = "*" if r.get("stability_percentage") else ""
                lines.append(
                    f"| {label} | {r['concurrency']}{star} | {_cell(r['infer_per_s'])} | "
                    f"{_cell(r['p50_us'])} | {_cell(r['p99_us'])} | {queue} | {compute} |"
                )
        raw = report["raw_engine"].get(model)
        if raw:
            lines += [
                "",
                "Raw engine (ONNX Runtime in-process, intra-op "
                f"{raw['intra_op_threads']}, inter-op {raw['inter_op_threads']}, "
                f">= {raw['min_seconds']} s per size, no server running):",
                "",
                "| batch | rows/s | batches/s | mean ms/batch | p99 ms/batch |",
                "|---|---|---|---|---|",
            ]
            for r in raw["rows"]:
                mark = "" if r["within_max_batch_size"] else " (> max_batch_size)"
                lines.append(
                    f"| {r['batch_size']}{mark} | {r['rows_per_s']:.0f} | "
                    f"{r['batches_per_s']:.1f} | {r['mean_ms']:.3f} | {r['p99_ms']:.3f} |"
                )
            lines.append(
                f"\nBest: {raw['best_rows_per_s']:.0f} rows/s at batch {raw['best_batch_size']}."
            )
        if plan.get("plot"):
            lines += ["", f"![{model}: throughput vs p99]({plan['plot']})"]
        lines.append("")
    lines += [
        "## Ratios",
        "",
        "| ratio | model | concurrency | value | from |",
        "|---|---|---|---|---|",
    ]
    for r in report["ratios"]:
        value = r["value"]
        shown = (
            "n/a" if value is None else (f"{value:.0f}" if "µs" in r["name"] else f"{value:.2f}")
        )
        lines.append(
            f"| {r['name']} | {r['model']} | {r['concurrency']} | {shown} | {r['detail']} |"
        )
    lines += ["", "## Commands", ""]
    for config, cmd in report["server_commands"].items():
        lines.append(f"- {LABELS.get(config, config)}: `{cmd}`")
    for model, cmd in report["raw_engine_commands"].items():
        lines.append(f"- raw engine {model}: `{cmd}`")
    lines += ["", "perf_analyzer, per server, model and concurrency C:", ""]
    generic = {
        r["command"].replace(
            f"--concurrency-range {r['concurrency']}:{r['concurrency']}", "--concurrency-range C:C"
        )
        for run in report["runs"]
        for r in run["results"]
        if r["command"]
    }
    # The plain commands first, then the retries' (with --stability-percentage).
    lines += [f"    {c}" for c in sorted(generic, key=lambda c: ("--stability" in c, c))]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--python", default=sys.executable, help="Python with inferd installed")
    parser.add_argument("--repository", type=Path, default=Path("examples-repo"))
    parser.add_argument(
        "--model",
        action="append",
        help="NAME[:C,C,...], repeatable (default: mlp:1,16,64 and simple:1,16)",
    )
    parser.add_argument(
        "--concurrency", type=int, nargs="+", default=[1, 16], help="for --model NAME alone"
    )
    parser.add_argument(
        "--configs", nargs="+", choices=CONFIGS, default=CONFIGS, help="servers to measure"
    )
    parser.add_argument("--measurement-interval", type=int, default=5000, help="ms per window")
    parser.add_argument(
        "--max-queue-delay-us",
        type=int,
        help="dynamic_batching { max_queue_delay_microseconds: N } (default: dynamic_batching { })",
    )
    parser.add_argument("--server-arg", action="append", default=[], help="extra inferd flag")
    parser.add_argument(
        "--pa-arg", action="append", default=[], help="extra perf_analyzer flag, e.g. --pa-arg=-r20"
    )
    parser.add_argument(
        "--retries", type=int, default=1, help="re-runs of a perf_analyzer run that fails"
    )
    parser.add_argument(
        "--retry-stability",
        type=int,
        default=25,
        help="perf_analyzer --stability-percentage of a retry (its default is 10)",
    )
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--raw-seconds", type=float, default=2.0, help="raw engine s per size")
    parser.add_argument("--no-raw-engine", action="store_true")
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--out", type=Path, help="default benchmarks/out/<timestamp>/")
    args = parser.parse_args()

    python = str(Path(args.python).absolute()) if "/" in args.python else args.python
    plans = parse_models(args.model or DEFAULT_MODELS, args.concurrency)
    started = datetime.now()
    out = args.out or harness.BENCHMARKS / "out" / started.strftime("%Y%m%d-%H%M%S")
    (out / "logs").mkdir(parents=True, exist_ok=True)
    repository = args.repository.resolve()
    if not repository.is_dir():
        print(f"{repository} missing: writing the example repository", flush=True)
        subprocess.run([python, "-m", "inferd", "make-examples", str(repository)], check=True)
    pa = harness.PerfAnalyzer.find(python)
    machine = harness.machine_info(python)
    print(f"machine: {harness.describe_machine(machine)}\nout: {out}", flush=True)
    clock = time.monotonic()

    raw: dict[str, dict[str, Any] | None] = {}
    raw_commands: dict[str, str] = {}
    if not args.no_raw_engine:
        for plan in plans:
            raw[plan.model], raw_commands[plan.model] = run_raw_engine(
                python, repository, plan.model, args, out
            )

    runs: list[dict[str, Any]] = []
    server_commands: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="inferd-bench-") as tmp:
        batching_repo = Path(tmp) / "repository-batching"
        block = harness.batching_repository(
            repository, batching_repo, [p.model for p in plans], args.max_queue_delay_us
        )
        for config in args.configs:
            if config in ("floor", "inline"):
                for plan in plans:
                    cmd = harness.floor_command(python, repository, plan.model, config == "inline")
                    server_commands[f"{config}"] = shown_command(
                        cmd, python, {f"--model {plan.model}": "--model MODEL"}
                    )
                    runs += measure_server(config, cmd, [plan], pa, args, out)
            else:
                repo = batching_repo if config == "inferd-batching" else repository
                cmd = harness.inferd_command(python, repo, args.server_arg)
                server_commands[config] = shown_command(
                    cmd, python, {str(batching_repo): "REPOSITORY-COPY-WITH-DYNAMIC-BATCHING"}
                )
                runs += measure_server(config, cmd, plans, pa, args, out)

    report: dict[str, Any] = {
        "started": started.isoformat(timespec="seconds"),
        "minutes": (time.monotonic() - clock) / 60,
        "invocation": shlex.join(
            [harness.relative(sys.executable), harness.relative(sys.argv[0]), *sys.argv[1:]]
        ),
        "machine": machine,
        "settings": {
            "repository": harness.relative(repository),
            "measurement_interval_ms": args.measurement_interval,
            "batching_block": block,
            "server_args": args.server_arg,
            "pa_args": args.pa_arg,
            "retry_stability": args.retry_stability,
            "configs": args.configs,
        },
        "plans": [{"model": p.model, "concurrencies": p.concurrencies} for p in plans],
        "raw_engine": raw,
        "raw_engine_commands": raw_commands,
        "server_commands": server_commands,
        "runs": runs,
        "ratios": ratios(runs, plans, raw),
    }
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
    text = markdown(report)
    (out / "results.md").write_text(text)
    print("\n" + text)
    print(f"written: {out / 'results.md'}, {out / 'results.json'}")
    failed = sum(1 for run in runs for r in run["results"] if r["error"] is not None)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
