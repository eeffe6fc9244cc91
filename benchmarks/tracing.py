"""What tracing costs: inferd's throughput with tracing off, on for every request, and on for 1%
of them, in one run, as ratios to "off".

    python benchmarks/tracing.py                       # simple, concurrency 16, 3 rounds
    python benchmarks/tracing.py --model mlp --concurrency 64 --out benchmarks/out/tracing-mlp

Each configuration is a fresh ``inferd serve`` (with ``dynamic_batching { }`` on the model, and
/metrics on as always) driven by perf_analyzer; the configurations take turns, round after round,
so that drift on a shared machine falls on all of them alike, and the median of the rounds is
reported. With tracing on, spans are exported over OTLP/gRPC to a receiver in this process (a real
connection, and a real consumer of CPU on the same machine, which a collector elsewhere would
not be). Writes ``tracing.json`` and ``tracing.md`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any

import harness

sys.path.insert(0, str(harness.ROOT))
from tests.integration.otlp_receiver import OtlpTraceReceiver

CONFIGS = {
    "off": {},
    "on, every request": {"OTEL_TRACES_SAMPLER": "always_on"},
    "on, 1% sampled": {"OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.01"},
}


def _slug(name: str) -> str:
    """A configuration's name in its log files and on the command line: off, on, on-1pct."""
    return name.split(",")[0] + ("-1pct" if "1%" in name else "")


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--python", default=sys.executable, help="Python with inferd installed")
    parser.add_argument("--repository", type=Path, default=Path("examples-repo"))
    parser.add_argument("--model", default="simple")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--interval-ms", type=int, default=4000, help="perf_analyzer window")
    parser.add_argument("--out", type=Path, help="default benchmarks/out/tracing-<timestamp>/")
    parser.add_argument(
        "--configs",
        nargs="+",
        choices=[_slug(name) for name in CONFIGS],
        help="the configurations to measure, by their log names (default: all)",
    )
    args = parser.parse_args()
    configs = {
        name: otel
        for name, otel in CONFIGS.items()
        if args.configs is None or _slug(name) in args.configs
    }

    python = str(Path(args.python).absolute()) if "/" in args.python else args.python
    started = datetime.now()
    out = args.out or harness.BENCHMARKS / "out" / f"tracing-{started.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    if not (args.repository / args.model).is_dir():
        subprocess.run([python, "-m", "inferd", "make-examples", str(args.repository)], check=True)
    pa = harness.PerfAnalyzer.find(python)
    machine = harness.machine_info(python)
    print(f"machine: {harness.describe_machine(machine)}\nout: {out}", flush=True)
    receiver = OtlpTraceReceiver()
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in configs}
    try:
        with tempfile.TemporaryDirectory(prefix="inferd-tracing-") as tmp:
            repository = Path(tmp) / "repository-batching"
            harness.batching_repository(args.repository.resolve(), repository, [args.model], None)
            command = harness.inferd_command(python, repository, ["--metrics-port", "0"])
            for round_ in range(args.rounds):
                for name, otel in configs.items():
                    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
                    if otel:
                        env |= otel | {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint}
                    slug = _slug(name)
                    log = out / f"server-{slug}-{round_}.log"
                    spans_before = len(receiver.spans())
                    server = harness.start_server(command, log, env=env)
                    with harness.running(server):
                        result = pa.measure(
                            args.model,
                            server.port,
                            args.concurrency,
                            args.interval_ms,
                            log=out / f"perf_analyzer-{slug}-{round_}.log",
                        )
                        retried = result.error is not None
                        if retried:  # 2 shared cores: windows often differ by more than 10%
                            result = pa.measure(
                                args.model,
                                server.port,
                                args.concurrency,
                                args.interval_ms,
                                extra=["--stability-percentage", "25"],
                                log=out / f"perf_analyzer-{slug}-{round_}-retry.log",
                            )
                    figures = result.summary()
                    figures["stability_25"] = retried
                    figures["spans_received"] = len(receiver.spans()) - spans_before
                    runs[name].append(figures)
                    print(
                        f"  round {round_} {name:18s} {figures['infer_per_s'] or 0:8.0f} infer/s"
                        + ("*" if retried else " ")
                        + f"  p50 {figures['p50_us'] or 0:6.0f} µs"
                        + f"  spans {figures['spans_received']}"
                        + (f"  ERROR {result.error}" if result.error else ""),
                        flush=True,
                    )
    finally:
        receiver.stop()

    def median(name: str, key: str) -> float | None:
        values = [r[key] for r in runs[name] if r[key] is not None]
        return statistics.median(values) if values else None

    off = median("off", "infer_per_s")
    rows = []
    for name in configs:
        throughput = median(name, "infer_per_s")
        rows.append(
            {
                "config": name,
                "infer_per_s": throughput,
                "ratio_to_off": throughput / off if throughput and off else None,
                "p50_us": median(name, "p50_us"),
                "rounds": [r["infer_per_s"] for r in runs[name]],
                "stability_25": [r["stability_25"] for r in runs[name]],
                "spans_received": [r["spans_received"] for r in runs[name]],
            }
        )
    command_line = "python benchmarks/tracing.py " + " ".join(sys.argv[1:])
    report = {
        "date": started.isoformat(timespec="seconds"),
        "command": command_line.strip(),
        "machine": machine,
        "model": args.model,
        "concurrency": args.concurrency,
        "rows": rows,
        "runs": runs,
    }
    (out / "tracing.json").write_text(json.dumps(report, indent=2, default=str))
    lines = [
        f"{args.model}, concurrency {args.concurrency}, dynamic batching, median of "
        f"{args.rounds} rounds (`{report['command']}`, {harness.describe_machine(machine)}):",
        "",
        "| tracing | infer/s | ratio to off | p50 µs | rounds (infer/s) | spans received |",
        "|---|---:|---:|---:|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['config']} | {row['infer_per_s'] or 0:.0f} | "
            f"{row['ratio_to_off'] or 0:.3f} | {row['p50_us'] or 0:.0f} | "
            + ", ".join(
                f"{x or 0:.0f}{'*' if star else ''}"
                for x, star in zip(row["rounds"], row["stability_25"], strict=True)
            )
            + " | "
            + f"{', '.join(str(x) for x in row['spans_received'])} |"
        )
    lines += [
        "",
        "\\* perf_analyzer could not stabilise within 10%; measured again at "
        "--stability-percentage 25.",
    ]
    (out / "tracing.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
