"""Continuous batching of generations (issue 29): the example decoder (a GRU, 3.4 MB,
python/inferd/example_decoder.py) served as an iterative sequence, against the same network
served the classic way, each request a whole generation run to completion inside its batch.

    python benchmarks/continuous_batching.py                 # 32 streams, lengths 8..256
    python benchmarks/continuous_batching.py --measurement-interval 3000 --rounds 1

- ``decoder``: ``sequence_batching { iterative_sequence: true }``, decoupled. One request is
  one generation; the core runs it one step per batch, streams each token as a response, and
  new generations join the running batch at the next step while finished ones leave.
- ``decoder_final``: the same, not decoupled: one answer per generation (its last step's), so
  that it differs from the baseline only in how it batches, not in streaming each token.
- ``decoder_whole``: the baseline, ``dynamic_batching { }``. The same weights in an ONNX Loop:
  a batch runs as many steps as its longest request asks, and each request is answered once,
  with all its tokens.

The load is perf_analyzer at concurrency ``--streams`` (``--streaming`` for the decoder, one
stream per request in flight), every request TOKEN [1] and LENGTH [1] from one data file of
``--entries`` lengths drawn uniformly from ``--min-length`` to ``--max-length`` (seeded), the
same for both. Tokens per second are perf_analyzer's requests per second times the entries'
mean length. Time to first token: from each request's send to its first response, from
perf_analyzer's profile export (the baseline's first response is its only one). One step's
compute under that load: the decoder's ONNX Runtime time per execution over the run, from the
model's statistics (compute_infer / execution_count), beside its mean batch size. Server CPU:
utime + stime over the whole perf_analyzer run, per token. The state memory the core holds for
the decoder's generations (``inferd_sequence_state_bytes``) is sampled every 20 ms against the
bound the server is started with (``--state-bytes``). Rounds alternate which model goes first;
each runs on a fresh server. Writes results.json and results.md into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import tempfile
import threading
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import tritonclient.grpc as grpcclient

import harness
from inferd.example_decoder import write_decoder, write_whole_decoder

CONTINUOUS, FINAL, WHOLE = "decoder", "decoder_final", "decoder_whole"
MODELS = (CONTINUOUS, FINAL, WHOLE)


def write_final_decoder(model_dir: Path) -> None:
    """The decoder, iterative but not decoupled: one answer per generation (its last step's),
    as the baseline answers, so that the two differ only in how they batch."""
    write_decoder(model_dir)
    config = (model_dir / "config.pbtxt").read_text()
    config = config.replace('name: "decoder"', f'name: "{FINAL}"')
    (model_dir / "config.pbtxt").write_text(
        config.replace("model_transaction_policy { decoupled: true }\n", "")
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def write_data(path: Path, args: argparse.Namespace) -> list[int]:
    """perf_analyzer's input data: ``--entries`` requests, their lengths drawn uniformly."""
    rng = np.random.default_rng(args.seed)
    lengths = [int(n) for n in rng.integers(args.min_length, args.max_length + 1, args.entries)]
    firsts = [int(t) for t in rng.integers(0, 512, args.entries)]
    entries = [
        {"TOKEN": {"content": [t], "shape": [1]}, "LENGTH": {"content": [n], "shape": [1]}}
        for t, n in zip(firsts, lengths, strict=True)
    ]
    path.write_text(json.dumps({"data": entries}))
    return lengths


def model_counts(port: int, model: str) -> dict[str, float]:
    with grpcclient.InferenceServerClient(f"127.0.0.1:{port}") as client:
        stats = client.get_inference_statistics(model, as_json=True)["model_stats"][0]
    inference = stats.get("inference_stats", {})
    # Per batch size, each execution's own compute (the model-wide figure charges it to every
    # request of the batch).
    batches = [b.get("compute_infer", {}) for b in stats.get("batch_stats", [])]
    return {
        "inferences": float(stats.get("inference_count", 0)),
        "executions": float(stats.get("execution_count", 0)),
        "requests": float(inference.get("success", {}).get("count", 0)),
        "execution_ns": sum(float(b.get("ns", 0)) for b in batches),
        "timed_executions": sum(float(b.get("count", 0)) for b in batches),
    }


class StateSampler:
    """The highest ``inferd_sequence_state_bytes`` seen on /metrics, every 20 ms."""

    def __init__(self, metrics_port: int) -> None:
        self._url = f"http://127.0.0.1:{metrics_port}/metrics"
        self.highest = 0.0
        self.limit = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            with urllib.request.urlopen(self._url, timeout=5) as response:
                for line in response.read().decode().splitlines():
                    if line.startswith("inferd_sequence_state_bytes "):
                        self.highest = max(self.highest, float(line.split()[1]))
                    elif line.startswith("inferd_sequence_state_limit_bytes "):
                        self.limit = float(line.split()[1])

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def first_token_us(export: Path) -> list[float]:
    """Each request's time from its send to its first response, from a profile export."""
    document = json.loads(export.read_text())
    out = []
    for experiment in document.get("experiments", []):
        for request in experiment.get("requests", []):
            responses = request.get("response_timestamps", [])
            if responses:
                out.append((responses[0] - request["timestamp"]) / 1e3)
    return out


def run(
    server: harness.Server,
    pa: harness.PerfAnalyzer,
    model: str,
    args: argparse.Namespace,
    data: Path,
    mean_length: float,
    metrics_port: int,
    log: Path,
) -> dict[str, Any]:
    export = log.with_suffix(".export.json")
    extra = ["--input-data", str(data), "--stability-percentage", "25"]
    extra += ["--profile-export-file", str(export)]
    if model == CONTINUOUS:
        extra.append("--streaming")
    else:
        extra.append("--async")
    sampler = StateSampler(metrics_port)
    before, ticks_before = model_counts(server.port, model), harness.process_ticks(server.pid)
    try:
        result = pa.measure(model, server.port, args.streams, args.measurement_interval, extra, log)
    finally:
        sampler.stop()
    after, ticks_after = model_counts(server.port, model), harness.process_ticks(server.pid)
    if result.error is not None:
        raise RuntimeError(f"perf_analyzer on {model}: {result.error}")
    summary = result.summary()
    delta = {key: after[key] - before[key] for key in after}
    tokens_run = delta["inferences"] if model != WHOLE else delta["requests"] * mean_length
    cpu_s = sum(ticks_after) - sum(ticks_before)
    firsts = first_token_us(export)
    return {
        "model": model,
        "streams": args.streams,
        "requests_per_s": summary["infer_per_s"],
        "tokens_per_s": summary["infer_per_s"] * mean_length,
        "first_token_p50_ms": float(np.percentile(firsts, 50)) / 1e3,
        "first_token_p99_ms": float(np.percentile(firsts, 99)) / 1e3,
        "first_tokens_measured": len(firsts),
        "request_p99_ms": summary["p99_us"] / 1e3,
        # The decoder's: one step; the baseline's: one batch's whole generation.
        "execution_compute_ms": delta["execution_ns"] / max(delta["timed_executions"], 1) / 1e6,
        "executions": delta["executions"],
        # Wall time per execution over the run: the step's whole cycle (gather, compute, keep,
        # respond, reschedule) while the load lasted.
        "execution_wall_ms": 1e3 * result.seconds / max(delta["executions"], 1),
        "mean_batch_rows": delta["inferences"] / max(delta["executions"], 1),
        "server_cpu_us_per_token": 1e6 * cpu_s / os.sysconf("SC_CLK_TCK") / max(tokens_run, 1),
        "state_bytes_highest": sampler.highest,
        "state_bytes_limit": sampler.limit,
        "command": summary["command"],
    }


def markdown(report: dict[str, Any]) -> str:
    rows = report["rows"]

    def median(model: str, key: str) -> float:
        return float(np.median([r[key] for r in rows if r["model"] == model]))

    continuous, whole = median(CONTINUOUS, "tokens_per_s"), median(WHOLE, "tokens_per_s")
    step = median(CONTINUOUS, "execution_compute_ms")
    ttft = median(CONTINUOUS, "first_token_p99_ms")
    lines = [
        f"{report['streams']} streams, lengths {report['min_length']}..{report['max_length']} "
        f"(mean {report['mean_length']:.1f}), medians of {report['rounds']} rounds:",
        "",
        "| model | tokens/s | first token p50 / p99 (ms) | compute per execution (ms) | "
        "mean batch rows | server CPU µs/token | state bytes, highest / bound |",
        "|---|---|---|---|---|---|---|",
    ]
    for model in MODELS:
        lines.append(
            f"| {model} | {median(model, 'tokens_per_s'):,.0f} | "
            f"{median(model, 'first_token_p50_ms'):.1f} / {median(model, 'first_token_p99_ms'):.1f}"
            f" | {median(model, 'execution_compute_ms'):.2f}"
            f" | {median(model, 'mean_batch_rows'):.1f} | "
            f"{median(model, 'server_cpu_us_per_token'):.1f} | "
            + (
                f"{median(model, 'state_bytes_highest'):,.0f} / "
                f"{median(model, 'state_bytes_limit'):,.0f} |"
                if model != WHOLE
                else "- |"
            )
        )
    lines += [
        "",
        f"- tokens/s, continuous ÷ whole: {continuous / whole:.2f} (target ≥ 2); without "
        f"streaming each token ({FINAL}): {median(FINAL, 'tokens_per_s') / whole:.2f}",
        f"- first token p99 {ttft:.2f} ms ÷ one step's compute under the load {step:.2f} ms: "
        f"{ttft / step:.2f} (target ≤ 3); ÷ one step's whole cycle "
        f"{median(CONTINUOUS, 'execution_wall_ms'):.2f} ms: "
        f"{ttft / median(CONTINUOUS, 'execution_wall_ms'):.2f}",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    signal.signal(signal.SIGINT, signal.default_int_handler)
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--python", default=sys.executable, help="Python with inferd installed")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--streams", type=int, default=32)
    parser.add_argument("--min-length", type=int, default=8)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--entries", type=int, default=512, help="requests in the data file")
    parser.add_argument("--seed", type=int, default=29)
    parser.add_argument("--measurement-interval", type=int, default=8000, help="ms per window")
    parser.add_argument("--state-bytes", type=int, default=1 << 20, help="the server's bound")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    args.python = str(Path(args.python).absolute()) if os.sep in args.python else args.python
    started = datetime.now()
    out = args.out or harness.BENCHMARKS / "out" / started.strftime(
        "continuous-batching-%Y%m%d-%H%M%S"
    )
    (out / "logs").mkdir(parents=True, exist_ok=True)
    machine = harness.machine_info(args.python)
    print(f"machine: {harness.describe_machine(machine)}\nout: {out}", flush=True)
    pa = harness.PerfAnalyzer.find(args.python)
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="inferd-continuous-") as tmp:
        repository = Path(tmp) / "repository"
        write_decoder(repository / CONTINUOUS)
        write_final_decoder(repository / FINAL)
        write_whole_decoder(repository / WHOLE)
        data = Path(tmp) / "data.json"
        lengths = write_data(data, args)
        mean_length = float(np.mean(lengths))
        for round_ in range(1, args.rounds + 1):
            order = list(MODELS) if round_ % 2 else list(reversed(MODELS))
            for model in order:
                metrics_port = free_port()
                extra = [
                    "--metrics-port", str(metrics_port),
                    "--max-sequence-state-bytes", str(args.state_bytes),
                ]  # fmt: skip
                server = harness.start_server(
                    harness.inferd_command(args.python, repository, extra),
                    out / "logs" / f"server-{model}-r{round_}.log",
                )
                with harness.running(server):
                    log = out / "logs" / f"pa-{model}-r{round_}.log"
                    row = run(server, pa, model, args, data, mean_length, metrics_port, log)
                rows.append({"round": round_, **row})
                print(
                    f"round {round_} {model}: {row['tokens_per_s']:,.0f} tokens/s, first token "
                    f"p99 {row['first_token_p99_ms']:.1f} ms, batch rows "
                    f"{row['mean_batch_rows']:.1f}, {row['server_cpu_us_per_token']:.1f} µs "
                    "CPU/token",
                    flush=True,
                )
    report = {
        "machine": machine,
        "streams": args.streams,
        "min_length": args.min_length,
        "max_length": args.max_length,
        "mean_length": mean_length,
        "rounds": args.rounds,
        "rows": rows,
    }
    (out / "results.json").write_text(json.dumps(report, indent=2))
    text = markdown(report)
    (out / "results.md").write_text(f"{harness.describe_machine(machine)}\n\n{text}")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
