"""run.py's results.md: the tables, the served-vs-in-process compute, the targets (not a script).

Everything here reads the ``report`` dict that run.py writes as results.json, so a results.md can
be written again from a results.json (``python benchmarks/report.py OUT``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import harness
from server_usage import CORE, FRONT_END, GROUPS

LABELS = {
    "floor": "transport floor",
    "floor-cpp": "transport floor, C++ (grpc++)",
    "inline": "inline naive server",
    "inferd": "inferd, no batching",
    "inferd-before": "inferd BEFORE, dynamic batching",
    "inferd-batching": "inferd, dynamic batching",
}
INFERD = ("inferd-before", "inferd-batching", "inferd")


def label(config: str, report: dict[str, Any] | None = None) -> str:
    text = LABELS.get(config, config)
    before = (report or {}).get("before") or {}
    if config == "inferd-before" and before.get("commit"):
        text = f"inferd BEFORE ({before['commit']}), dynamic batching"
    return text


# --- lookups ----------------------------------------------------------------------------------


def at(runs: list[dict[str, Any]], config: str, model: str, concurrency: int) -> dict[str, Any]:
    """The successful result of ``config`` on ``model`` at ``concurrency`` ({} when none)."""
    for run in runs:
        if run["config"] == config and run["model"] == model:
            for r in run["results"]:
                if r["concurrency"] == concurrency and r["error"] is None:
                    return dict(r)
    return {}


def cpu_per_infer(result: dict[str, Any]) -> float | None:
    value = (result.get("usage") or {}).get("server_cpu_us_per_infer")
    return float(value) if value is not None else None


def raw_rows_per_s(raw: dict[str, Any] | None, batch: int) -> float | None:
    for row in (raw or {}).get("rows", []):
        if row["batch_size"] == batch:
            return float(row["rows_per_s"])
    return None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _n(x: float | None, digits: int = 0) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def _cell(x: float | None, digits: int = 0) -> str:
    return "—" if x is None else f"{x:.{digits}f}"


# --- served batch compute against the same batch in-process -----------------------------------


def compute_comparison(result: dict[str, Any], raw: dict[str, Any] | None) -> dict[str, Any] | None:
    """Per batch size the run executed: executions, mean compute_infer µs served (ModelStatistics
    batch_stats, deltas over the run) and the in-process mean at that size (raw engine, inferd's
    session options); the ratio overall is weighted by executions, over the sizes measured both
    ways."""
    batches = (result.get("usage") or {}).get("batches") or {}
    if not batches:
        return None
    in_process = {r["batch_size"]: r["mean_ms"] * 1e3 for r in (raw or {}).get("rows", [])}
    rows, served_ns, expected_ns, covered, total = [], 0.0, 0.0, 0, 0
    for size in sorted(batches, key=int):
        entry = batches[size]
        count = int(entry["count"])
        total += count
        served = entry["infer_ns"] / count / 1e3
        local = in_process.get(int(size))
        if local is not None:
            served_ns += entry["infer_ns"]
            expected_ns += count * local * 1e3
            covered += count
        rows.append(
            {
                "batch_size": int(size),
                "executions": count,
                "served_us": served,
                "in_process_us": local,
                "ratio": _ratio(served, local),
            }
        )
    return {
        "rows": rows,
        "executions": total,
        "compared_executions": covered,
        "ratio": _ratio(served_ns, expected_ns),
    }


def compared_sizes(result: dict[str, Any], limit: int) -> list[int]:
    """The ``limit`` batch sizes a run executed most (all of them when fewer)."""
    batches = (result.get("usage") or {}).get("batches") or {}
    ranked = sorted(batches.items(), key=lambda kv: (-int(kv[1]["count"]), int(kv[0])))
    return sorted(int(size) for size, _ in ranked[:limit])


# Each: what, model, concurrency, bound, at most (else at least), measure(report, config, model, c)
# -> (value, how it was computed).
Measure = Callable[[dict[str, Any], str, str, int], tuple[float | None, str]]


def _throughput_over(baseline: str) -> Measure:
    def measure(
        report: dict[str, Any], config: str, model: str, concurrency: int
    ) -> tuple[float | None, str]:
        runs = report["runs"]
        served = at(runs, config, model, concurrency).get("infer_per_s")
        base = at(runs, baseline, model, concurrency).get("infer_per_s")
        return _ratio(served, base), f"{_n(served)} / {_n(base)} infer/s"

    return measure


def _throughput_over_in_process(
    report: dict[str, Any], config: str, model: str, concurrency: int
) -> tuple[float | None, str]:
    served = at(report["runs"], config, model, concurrency).get("infer_per_s")
    raw = report["raw_engine"].get(model)
    batch = min(concurrency, (raw or {}).get("max_batch_size") or concurrency)
    local = raw_rows_per_s(raw, batch)
    return _ratio(served, local), f"{_n(served)} / {_n(local)} in-process batch {batch} rows/s"


def _p50_over(baseline: str) -> Measure:
    def measure(
        report: dict[str, Any], config: str, model: str, concurrency: int
    ) -> tuple[float | None, str]:
        runs = report["runs"]
        served = at(runs, config, model, concurrency).get("p50_us")
        base = at(runs, baseline, model, concurrency).get("p50_us")
        value = served - base if served is not None and base is not None else None
        return value, f"{_n(served)} - {_n(base)} µs"

    return measure


def _cpu_over_inline(
    report: dict[str, Any], config: str, model: str, concurrency: int
) -> tuple[float | None, str]:
    runs = report["runs"]
    served = cpu_per_infer(at(runs, config, model, concurrency))
    naive = cpu_per_infer(at(runs, "inline", model, concurrency))
    return _ratio(served, naive), f"{_n(served)} / {_n(naive)} µs CPU per inference"


def _p50_over_inline(
    report: dict[str, Any], config: str, model: str, concurrency: int
) -> tuple[float | None, str]:
    runs = report["runs"]
    served = at(runs, config, model, concurrency).get("p50_us")
    naive = at(runs, "inline", model, concurrency).get("p50_us")
    value = served - naive if served is not None and naive is not None else None
    block = report["settings"].get("batching_blocks", {}).get(model, "")
    return value, f"{_n(served)} - {_n(naive)} µs" + (f"; `{block}`" if block else "")


def _compute_over_in_process(
    report: dict[str, Any], config: str, model: str, concurrency: int
) -> tuple[float | None, str]:
    result = at(report["runs"], config, model, concurrency)
    comparison = compute_comparison(result, report["raw_engine"].get(model))
    if comparison is None:
        return None, "no batch_stats"
    return comparison["ratio"], (
        f"weighted by executions over {comparison['compared_executions']} of "
        f"{comparison['executions']} batches"
    )


# Issue 11's targets (the transport in the core) first, then issue 10's that still apply.
TARGETS: list[tuple[str, str, int, float, bool, Measure]] = [
    (
        "tiny c=16: infer/s >= 0.6 x grpc++ floor",
        "simple",
        16,
        0.6,
        False,
        _throughput_over("floor-cpp"),
    ),
    ("tiny c=16: infer/s >= 3 x aio floor", "simple", 16, 3.0, False, _throughput_over("floor")),
    ("tiny c=16: server CPU/inference <= 0.3 x naive's", "simple", 16, 0.3, True, _cpu_over_inline),
    ("tiny c=1: p50 <= grpc.aio floor p50 (+0 µs)", "simple", 1, 0.0, True, _p50_over("floor")),
    (
        "mlp c=64: infer/s >= 0.85 x in-process batch 64",
        "mlp",
        64,
        0.85,
        False,
        _throughput_over_in_process,
    ),
    ("mlp c=64: infer/s >= 3.5 x naive", "mlp", 64, 3.5, False, _throughput_over("inline")),
    ("mlp c=1: p50 <= naive p50 + 100 µs", "mlp", 1, 100.0, True, _p50_over_inline),
    (
        "mlp c=64: served batch compute <= 1.2 x in-process",
        "mlp",
        64,
        1.2,
        True,
        _compute_over_in_process,
    ),
]


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Each target, for the current build and (when measured) the BEFORE build."""
    out = []
    for text, model, concurrency, bound, at_most, measure in TARGETS:
        entry: dict[str, Any] = {
            "target": text,
            "model": model,
            "concurrency": concurrency,
            "bound": bound,
            "at_most": at_most,
        }
        for build, config in (("after", "inferd-batching"), ("before", "inferd-before")):
            value, detail = measure(report, config, model, concurrency)
            met = None if value is None else (value <= bound if at_most else value >= bound)
            entry[build] = {"value": value, "detail": detail, "met": met}
        out.append(entry)
    return out


# --- the older ratios (issue 3), kept for comparison with earlier runs -------------------------


def ratios(report: dict[str, Any]) -> list[dict[str, Any]]:
    runs, out = report["runs"], []
    for plan in report["plans"]:
        m, top = plan["model"], max(plan["concurrencies"])
        batching = at(runs, "inferd-batching", m, top).get("infer_per_s")
        plain = at(runs, "inferd", m, top).get("infer_per_s")
        floor = at(runs, "floor", m, top).get("infer_per_s")
        raw_best = (report["raw_engine"].get(m) or {}).get("best_rows_per_s")
        limit = min(floor, raw_best) if floor is not None and raw_best is not None else None
        out += [
            {
                "name": "inferd-batching / min(floor, raw engine best)",
                "model": m,
                "concurrency": top,
                "value": _ratio(batching, limit),
                "detail": f"{_n(batching)} / min({_n(floor)}, {_n(raw_best)})",
            },
            {
                "name": "inferd-batching / inferd (no batching)",
                "model": m,
                "concurrency": top,
                "value": _ratio(batching, plain),
                "detail": f"{_n(batching)} / {_n(plain)}",
            },
        ]
    return out


# --- markdown ---------------------------------------------------------------------------------


def _server_table(report: dict[str, Any], model: str) -> list[str]:
    lines = [
        "| configuration | c | infer/s | p50 µs | p99 µs | server CPU µs/infer | server cores "
        "| perf_analyzer cores | server queue µs | compute in / infer / out µs |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in report["runs"]:
        if run["model"] != model:
            continue
        for r in run["results"]:
            name = label(run["config"], report)
            if r["error"] is not None:
                lines.append(
                    f"| {name} | {r['concurrency']} | failed | | | | | | | "
                    f"{r['error'].splitlines()[-1][:120]} |"
                )
                continue
            usage = r.get("usage") or {}
            server = run["config"] in INFERD
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
            star = f"*{r['stability_percentage']}%" if r.get("stability_percentage") else ""
            lines.append(
                f"| {name} | {r['concurrency']}{star} | {_cell(r['infer_per_s'])} | "
                f"{_cell(r['p50_us'])} | {_cell(r['p99_us'])} | "
                f"{_cell(usage.get('server_cpu_us_per_infer'))} | "
                f"{_cell(usage.get('server_cores'), 2)} | "
                f"{_cell(usage.get('load_generator_cores'), 2)} | {queue} | {compute} |"
            )
    return lines


def _raw_table(raw: dict[str, Any]) -> list[str]:
    lines = [
        "In-process (benchmarks/raw_engine.py: ONNX Runtime in this machine's Python, intra-op "
        f"{raw['intra_op_threads']}, inter-op {raw['inter_op_threads']}, "
        f"{'spinning' if raw.get('spinning', True) else 'no spinning'} (inferd's session "
        f"options), >= {raw['min_seconds']} s per size, no server running):",
        "",
        "| batch | rows/s | batches/s | mean µs/batch | p99 µs/batch |",
        "|---|---|---|---|---|",
    ]
    for r in raw["rows"]:
        mark = "" if r["within_max_batch_size"] else " (> max_batch_size)"
        lines.append(
            f"| {r['batch_size']}{mark} | {r['rows_per_s']:.0f} | {r['batches_per_s']:.1f} | "
            f"{r['mean_ms'] * 1e3:.0f} | {r['p99_ms'] * 1e3:.0f} |"
        )
    return lines


def _thread_table(report: dict[str, Any]) -> list[str]:
    head = " | ".join(GROUPS)
    lines = [
        "## Where the server's CPU goes, per inference",
        "",
        "µs of CPU per inference answered, per thread group, over each perf_analyzer run "
        "(/proc/PID/task/*/stat, grouped by thread name). loop: the main thread, the asyncio "
        "event loop (gRPC completions, the Python handlers, and in inferd the core's request "
        "parse and response write, which run on it); grpc: grpc's threads; other: threads named "
        "like the main one (Python threads, ONNX Runtime pools); worker / stager: the core's "
        "`inferd-worker` (takes, assembles and executes batches; ONNX Runtime at intra-op 1 runs "
        "on it) and `inferd-stager`; ort: threads named for ONNX Runtime; exited: threads that "
        "ended within the run. Front end = loop + grpc + other; core = worker + stager + ort.",
        "",
        f"| configuration | model | c | inferences | total | {head} | front end | core |",
        "|---|---|---|---|---|" + "---|" * len(GROUPS) + "---|---|",
    ]
    others: set[str] = set()
    for run in report["runs"]:
        for r in run["results"]:
            usage = r.get("usage") or {}
            per = usage.get("thread_us_per_infer") or {}
            if r["error"] is not None or not per:
                continue
            others.update((usage.get("thread_names") or {}).get("other", []))
            cells = " | ".join(_cell(per.get(g)) for g in GROUPS)
            lines.append(
                f"| {label(run['config'], report)} | {run['model']} | {r['concurrency']} | "
                f"{usage['inferences']} | {_cell(usage['server_cpu_us_per_infer'])} | {cells} | "
                f"{_cell(usage.get('front_end_us_per_infer'))} | "
                f"{_cell(usage.get('core_us_per_infer'))} |"
            )
    if others:
        lines += ["", f"Threads counted as other: {', '.join(sorted(others))}."]
    front = ", ".join(FRONT_END)
    core = ", ".join(CORE)
    lines += ["", f"(front end: {front}; core: {core})"]
    return lines


def _compute_tables(report: dict[str, Any]) -> list[str]:
    lines = [
        "## Served batch compute against the same batch in-process",
        "",
        "compute_infer per batch from ModelStatistics batch_stats (deltas over the run at the "
        "model's highest concurrency) against the in-process mean at the same batch size "
        "(raw engine, inferd's session options, nothing else running). Ratio = served / "
        "in-process; overall, weighted by executions.",
    ]
    found = False
    for plan in report["plans"]:
        model, top = plan["model"], max(plan["concurrencies"])
        for config in ("inferd-batching", "inferd-before"):
            result = at(report["runs"], config, model, top)
            comparison = compute_comparison(result, report["raw_engine"].get(model))
            if comparison is None:
                continue
            found = True
            lines += [
                "",
                f"{label(config, report)}, {model} c={top}: {comparison['executions']} batches, "
                f"overall ratio {_n(comparison['ratio'], 2)} (over "
                f"{comparison['compared_executions']} batches of sizes measured in-process)",
                "",
                "| batch size | executions | served µs | in-process µs | ratio |",
                "|---|---|---|---|---|",
            ]
            rest = [row for row in comparison["rows"] if row["in_process_us"] is None]
            for row in comparison["rows"]:
                if row["in_process_us"] is not None:
                    lines.append(
                        f"| {row['batch_size']} | {row['executions']} | {row['served_us']:.0f} | "
                        f"{row['in_process_us']:.0f} | {_cell(row['ratio'], 2)} |"
                    )
            if rest:
                count = sum(row["executions"] for row in rest)
                served = sum(row["served_us"] * row["executions"] for row in rest) / count
                sizes = ", ".join(str(row["batch_size"]) for row in rest)
                lines.append(
                    f"| not measured in-process: {sizes} | {count} | {served:.0f} (mean) | — | — |"
                )
    return lines if found else []


def _target_table(report: dict[str, Any]) -> list[str]:
    def shown(entry: dict[str, Any], build: str) -> str:
        side = entry[build]
        if side["value"] is None:
            return f"n/a ({side['detail']})"
        digits = 0 if "µs" in entry["target"] else 2
        verdict = "met" if side["met"] else "MISSED"
        return f"{side['value']:.{digits}f}: {verdict} ({side['detail']})"

    lines = [
        "## Targets",
        "",
        "inferd = the dynamic batching configuration above, each target at its own model and "
        "concurrency, all from this run.",
        "",
        "| target | inferd | inferd BEFORE |",
        "|---|---|---|",
    ]
    for entry in report["targets"]:
        lines.append(f"| {entry['target']} | {shown(entry, 'after')} | {shown(entry, 'before')} |")
    return lines


def _percentages(values: int | list[int]) -> str:
    values = values if isinstance(values, list) else [values]
    return " or ".join(f"{v}%" for v in values) or "n/a"


def markdown(report: dict[str, Any]) -> str:
    s = report["settings"]
    before = report.get("before") or {}
    lines = [
        f"# inferd benchmark, {report['started']}",
        "",
        f"Machine: {harness.describe_machine(report['machine'])}. Servers and perf_analyzer "
        "share these cores.",
        "",
        f"Run: `{report['invocation']}` ({report['minutes']:.1f} min). perf_analyzer gRPC, "
        f"{'async' if s.get('perf_analyzer_async') else 'sync'}, batch 1, the same input every "
        f"request (perf_analyzer's random data, made once), {s['measurement_interval_ms']} ms "
        "windows, reported once 3 windows in a row agree within 10% (a figure marked * came "
        f"from a retry that allowed {_percentages(s['retry_stability'])}, marked with it). "
        "Latencies in µs. Server CPU: utime + stime of the server process (all threads) over "
        "the perf_analyzer run, divided by the inferences it answered in that interval "
        "(ModelStatistics inference_count; the transport floors count their ModelInfer calls); "
        "cores = CPU seconds per second. Server queue and compute columns: inferd's statistics "
        "as perf_analyzer reports them.",
        "",
        f"Dynamic batching: `{s['batching_block']}` appended to each model's config.pbtxt in a "
        "copy of the repository (the same copy for inferd and inferd BEFORE).",
    ]
    if before:
        lines += [
            "",
            f"inferd BEFORE: commit {before.get('commit', '?')}, built in {before['tree']} "
            f"(`{before['python']}`; benchmarks/before.sh){before.get('note', '')}.",
        ]
    lines.append("")
    for plan in report["plans"]:
        model = plan["model"]
        lines += [f"## {model}", "", *_server_table(report, model)]
        raw = report["raw_engine"].get(model)
        if raw:
            lines += ["", *_raw_table(raw)]
        if plan.get("plot"):
            lines += ["", f"![{model}: throughput vs p99]({plan['plot']})"]
        lines.append("")
    lines += [*_thread_table(report), ""]
    compute = _compute_tables(report)
    if compute:
        lines += [*compute, ""]
    lines += [*_target_table(report), ""]
    lines += [
        "## Other ratios",
        "",
        "| ratio | model | concurrency | value | from |",
        "|---|---|---|---|---|",
    ]
    for r in report["ratios"]:
        lines.append(
            f"| {r['name']} | {r['model']} | {r['concurrency']} | {_n(r['value'], 2)} | "
            f"{r['detail']} |"
        )
    lines += ["", "## Commands", ""]
    for config, cmd in report["server_commands"].items():
        lines.append(f"- {label(config, report)}: `{cmd}`")
    for model, cmd in report["raw_engine_commands"].items():
        lines.append(f"- in-process {model}: `{cmd}`")
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
    parser = argparse.ArgumentParser(description="results.md again from a run.py results.json")
    parser.add_argument("out", type=Path, help="a run.py output folder (with results.json)")
    args = parser.parse_args()
    report = json.loads((args.out / "results.json").read_text())
    report["targets"] = targets(report)
    (args.out / "results.md").write_text(markdown(report))
    print(args.out / "results.md")
    return 0


if __name__ == "__main__":
    sys.exit(main())
