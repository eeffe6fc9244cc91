"""What ``inferd tune`` writes: the table of every config tried (Markdown and JSON), the
throughput-against-p99 plot (PNG, with matplotlib) and the best config.pbtxt, with a comment
saying what was measured."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from google.protobuf import text_format

from inferd._proto.model_config_pb2 import ModelConfig
from inferd.tune.search import MIN_GAIN, Trial, TuneResult

HEADER = (
    "| # | stage | config | kept | load | infer/s | p50 ms | p95 ms | p99 ms | server CPU µs/infer "
    "| memory MiB | cold start s | error rate | cost per 1,000 |"
)


def _cell(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def table(result: TuneResult) -> str:
    """One row per config tried, at its best load point under the objective (or its fastest)."""
    rows = [HEADER, "|" + " --- |" * 14]
    for index, trial in enumerate(result.trials, 1):
        m = trial.measurement
        point = result.objective.best_point(m)
        shown = point or max(m.points, key=lambda p: p.throughput, default=None)
        within = "" if point is not None or shown is None else " (misses the objective)"
        rows.append(
            "| "
            + " | ".join(
                [
                    str(index),
                    trial.stage,
                    trial.candidate.label + (f" — {m.failure}" if m.failure else ""),
                    "yes" if trial.kept else "",
                    (shown.load.label + within) if shown else "-",
                    _cell(shown.throughput if shown else None, 0),
                    _cell(shown.p50_ms if shown else None),
                    _cell(shown.p95_ms if shown else None),
                    _cell(shown.p99_ms if shown else None),
                    _cell(m.cpu_us_per_inference, 0),
                    _cell(m.memory_mib, 0),
                    _cell(m.cold_start_s),
                    _cell(shown.error_rate if shown else None, 3),
                    _cell(result.objective.cost_per_1000(point), 5),
                ]
            )
            + " |"
        )
    return "\n".join(rows) + "\n"


def summary(result: TuneResult, command: str) -> str:
    best, base = result.best, result.baseline
    gain = best.score / base.score if base.score else float("inf")
    lines = [
        f"Objective: {result.objective.description}; loads: "
        + ", ".join(load.label for load in result.loads)
        + ".",
        f"Tried {len(result.trials)} configs of a grid of {result.grid_size} along the same axes, "
        f"in {result.elapsed_s:.0f} s of a {result.budget_s:.0f} s budget.",
        f"Best: {best.candidate.label} (score {best.score:,.1f} against the stated config's "
        f"{base.score:,.1f}: {gain:.2f}x).",
    ]
    if result.confirmed is not None:
        stated, winner = result.confirmed
        lines.append(
            f"Confirmation: the stated config and the stages' winner measured again; mean scores "
            f"{stated:,.1f} and {winner:,.1f}"
            + (
                ": the winner is kept."
                if best.candidate != base.candidate
                else f": not {1 + result.required_gain:.2f}x the stated one (the larger of "
                f"{MIN_GAIN:.0%} and the spread of the stated config's own scores), which is "
                "kept."
            )
        )
    if result.skipped_stages:
        lines.append("Not tried, the budget ran out: " + ", ".join(result.skipped_stages) + ".")
    for variant in result.refused_variants:
        lines.append(f"{variant.precision} refused: {variant.reason}.")
    lines.append(f"Command: `{command}`")
    return "\n\n".join(lines) + "\n"


def best_config(result: TuneResult, stated: ModelConfig, command: str) -> str:
    best = result.best
    point = result.objective.best_point(best.measurement)
    measured = (
        f"{point.throughput:,.0f} infer/s at {point.load.label}, p99 {point.p99_ms:.2f} ms"
        if point
        else "no load point met the objective"
    )
    comment = [
        f"# Written by inferd tune: {best.candidate.label}.",
        f"# Measured: {measured} ({result.objective.description}); the stated config scored "
        f"{result.baseline.score:,.1f}, this one {best.score:,.1f}.",
        f"# Command: {command}",
    ]
    if best.candidate.precision != "fp32":
        comment.append(
            f"# Serve it with the {best.candidate.precision} model file inferd tune wrote "
            f"(variants/{best.candidate.precision}/)."
        )
    return "\n".join(comment) + "\n" + text_format.MessageToString(best.candidate.config(stated))


def plot(result: TuneResult, path: Path) -> str:
    """Throughput against p99, one line per config through its load points; "" when written,
    else why not."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install inferd[tune]): no plot"
    figure, axes = plt.subplots(figsize=(9, 6))
    for index, trial in enumerate(result.trials, 1):
        points = [p for p in trial.measurement.points if p.requests]
        if not points:
            continue
        style: dict[str, Any] = (
            {"linewidth": 2.5, "marker": "o"}
            if trial is result.best
            else {"alpha": 0.45, "marker": "."}
        )
        axes.plot(
            [p.throughput for p in points],
            [p.p99_ms for p in points],
            label=f"{index}: {trial.candidate.label}",
            **style,
        )
    if result.objective.p99_ms is not None:
        axes.axhline(result.objective.p99_ms, color="red", linestyle="--", label="p99 objective")
    axes.set_xlabel("throughput (inferences/s)")
    axes.set_ylabel("p99 latency (ms)")
    axes.set_yscale("log")
    axes.set_title("inferd tune: every config tried (bold: the best)")
    axes.legend(fontsize=6, loc="upper left")
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return ""


def write_json(result: TuneResult, path: Path) -> None:
    def trial(t: Trial) -> dict[str, object]:
        return {
            "stage": t.stage,
            "candidate": asdict(t.candidate),
            "label": t.candidate.label,
            "kept": t.kept,
            "score": t.score,
            "measurement": asdict(t.measurement),
        }

    path.write_text(
        json.dumps(
            {
                "objective": asdict(result.objective),
                "trials": [trial(t) for t in result.trials],
                "refused_variants": [
                    {"precision": v.precision, "max_error": v.max_error, "reason": v.reason}
                    for v in result.refused_variants
                ],
                "skipped_stages": result.skipped_stages,
                "grid_size": result.grid_size,
                "elapsed_s": result.elapsed_s,
                "budget_s": result.budget_s,
            },
            indent=2,
            default=str,
        )
    )
