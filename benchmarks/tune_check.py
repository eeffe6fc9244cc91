"""The config ``inferd tune`` wrote, served and measured again with perf_analyzer against the config
it started from (issue 30's check), rounds taking turns: each config's most throughput whose p99
stays within the objective, over the same concurrencies.

    python benchmarks/tune_check.py MODEL_DIR TUNE_OUT --p99-ms 5 --concurrency 1 4 16 64

One server serves both: ``stated`` (MODEL_DIR's config.pbtxt) and ``tuned`` (TUNE_OUT's
config.pbtxt), the same model file. Writes ``check.json`` and ``check.md`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import harness
import server_usage


def write_repository(model_dir: Path, tuned_config: Path, out: Path) -> Path:
    """``stated`` is MODEL_DIR's config, or, without a config.pbtxt, the one the server completes
    (Triton's default config: max_batch_size 4 and dynamic batching for a model that batches)."""
    repository = out / "models"
    for name, config in (("stated", model_dir / "config.pbtxt"), ("tuned", tuned_config)):
        target = repository / name
        shutil.copytree(model_dir, target, ignore=shutil.ignore_patterns("config.pbtxt"))
        text = config.read_text() if config.is_file() else 'name: "stated"\n'
        name_line = next(line for line in text.splitlines() if line.startswith("name:"))
        (target / "config.pbtxt").write_text(text.replace(name_line, f'name: "{name}"'))
    return repository


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("tune_out", type=Path)
    parser.add_argument("--python", default=sys.executable, help="Python with inferd installed")
    parser.add_argument("--p99-ms", type=float, required=True)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--interval-ms", type=int, default=3000, help="perf_analyzer window")
    parser.add_argument("--out", type=Path, help="default benchmarks/out/tune-check-<timestamp>/")
    args = parser.parse_args()

    python = str(Path(args.python).absolute()) if "/" in args.python else args.python
    started = datetime.now()
    out = args.out or harness.BENCHMARKS / "out" / f"tune-check-{started:%Y%m%d-%H%M%S}"
    out.mkdir(parents=True, exist_ok=True)
    repository = write_repository(args.model_dir, args.tune_out / "config.pbtxt", out)
    pa = harness.PerfAnalyzer.find(python)
    machine = harness.machine_info(python)
    print(f"machine: {harness.describe_machine(machine)}\nout: {out}", flush=True)
    runs: list[dict[str, Any]] = []
    command = harness.inferd_command(python, repository, [])
    with harness.running(harness.start_server(command, out / "server.log")) as server:
        for round_index in range(args.rounds):
            models = ("stated", "tuned") if round_index % 2 == 0 else ("tuned", "stated")
            for model in models:
                for concurrency in args.concurrency:
                    stats = server_usage.StatisticsClient(server.port)
                    try:
                        start = server_usage.sample(server.pid, stats, model)
                        log = out / f"pa-{model}-c{concurrency}-r{round_index}.log"
                        flags = ["--stability-percentage", "25"]
                        result = pa.measure(
                            model, server.port, concurrency, args.interval_ms, flags, log
                        )
                        end = server_usage.sample(server.pid, stats, model)
                    finally:
                        stats.close()
                    run = result.summary()
                    run["usage"] = server_usage.usage(server.pid, start, end)
                    run.update(model=model, round=round_index)
                    runs.append(run)
                    print(
                        f"round {round_index} {model} c={concurrency}: {run['infer_per_s']} "
                        f"infer/s, p99 {run['p99_us']} us",
                        flush=True,
                    )
    report = {"machine": machine, "command": " ".join(sys.argv), "runs": runs}
    (out / "check.json").write_text(json.dumps(report, indent=2))
    text = markdown(runs, args.concurrency, args.p99_ms)
    (out / "check.md").write_text(text)
    print(text)
    return 0


def markdown(runs: list[dict[str, Any]], concurrencies: list[int], p99_ms: float) -> str:
    def median(model: str, concurrency: int, key: str) -> float | None:
        values = [
            r[key] if key in r else r["usage"].get(key)
            for r in runs
            if r["model"] == model and r["concurrency"] == concurrency and not r["error"]
        ]
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None

    lines = [
        "| config | c | infer/s | p50 µs | p99 µs | server CPU µs/infer |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    best: dict[str, float] = {}
    for model in ("stated", "tuned"):
        for concurrency in concurrencies:
            cells = [
                median(model, concurrency, k)
                for k in ("infer_per_s", "p50_us", "p99_us", "server_cpu_us_per_infer")
            ]
            shown = ["-" if c is None else f"{c:,.0f}" for c in cells]
            lines.append(f"| {model} | {concurrency} | {' | '.join(shown)} |")
            throughput, p99 = cells[0], cells[2]
            if throughput is not None and p99 is not None and p99 <= p99_ms * 1000:
                best[model] = max(best.get(model, 0.0), throughput)
    stated, tuned = best.get("stated"), best.get("tuned")
    lines.append("")
    lines.append(
        f"Most throughput with p99 <= {p99_ms:g} ms: stated {stated or 0:,.0f}, tuned "
        f"{tuned or 0:,.0f}" + (f": {tuned / stated:.2f}x" if stated and tuned else "") + "."
    )
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
