"""Throughput vs p99 latency, one PNG per model, from a run.py output folder.

    python benchmarks/plot.py benchmarks/out/<timestamp>

Reads ``results.json`` (written by benchmarks/run.py, which calls this script at its end) and
writes ``<model>_throughput_p99.png`` beside it: x = infer/s, y = p99 latency (ms), one line per
configuration through its concurrencies (each point labelled with its concurrency), and the raw
engine's best rows/s as a vertical line when it was measured. Records the PNG names in
``results.json`` (``plans[].plot``). Needs matplotlib (the ``dev`` extra).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt

from report import LABELS  # one name per configuration, for tables and plots

STYLES = {
    "floor": {"color": "tab:gray", "marker": "s", "linestyle": "--"},
    "inline": {"color": "tab:orange", "marker": "^", "linestyle": ":"},
    "inferd": {"color": "tab:blue", "marker": "o", "linestyle": "-"},
    "inferd-before": {"color": "tab:purple", "marker": "v", "linestyle": "--"},
    "inferd-batching": {"color": "tab:green", "marker": "D", "linestyle": "-"},
}


def plot_model(report: dict[str, Any], model: str, path: Path) -> bool:
    fig, ax = plt.subplots(figsize=(10, 5.5))
    drawn = False
    for run in report["runs"]:
        if run["model"] != model:
            continue
        points = [
            (r["infer_per_s"], r["p99_us"] / 1000, r["concurrency"])
            for r in run["results"]
            if r["error"] is None and r["infer_per_s"] is not None and r["p99_us"] is not None
        ]
        if not points:
            continue
        points.sort(key=lambda p: p[2])
        config = run["config"]
        ax.plot(
            [p[0] for p in points],
            [p[1] for p in points],
            label=LABELS.get(config, config),
            **STYLES.get(config, {}),  # type: ignore[arg-type]
        )
        for x, y, c in points:
            ax.annotate(f"c={c}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=8)
        drawn = True
    raw = (report.get("raw_engine") or {}).get(model)
    if raw:
        ax.axvline(
            raw["best_rows_per_s"],
            color="tab:red",
            linestyle="-.",
            linewidth=1,
            label=f"raw engine best ({raw['best_rows_per_s']:.0f} rows/s, "
            f"batch {raw['best_batch_size']})",
        )
    if not drawn:
        plt.close(fig)
        return False
    machine = report.get("machine", {})
    ax.set_title(
        f"{model}: throughput vs p99 latency (perf_analyzer, batch 1)\n"
        f"{machine.get('cores', '?')} cores, {machine.get('cpu', '')}, {report.get('started', '')}",
        fontsize=10,
    )
    ax.set_xlabel("throughput (infer/s)")
    ax.set_ylabel("p99 latency (ms)")
    ax.set_yscale("log")
    ax.set_xlim(left=0)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1.0))  # beside, not over
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("out", type=Path, help="a run.py output folder (with results.json)")
    args = parser.parse_args()

    results = args.out / "results.json"
    report = json.loads(results.read_text())
    for plan in report["plans"]:
        name = f"{plan['model']}_throughput_p99.png"
        if plot_model(report, plan["model"], args.out / name):
            plan["plot"] = name
            print(args.out / name)
    results.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
