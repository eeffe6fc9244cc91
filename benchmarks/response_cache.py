"""The response cache (issue 30) on the example mlp, in one run: what a hit costs against a miss,
and against the same model without a cache, with perf_analyzer as the load, rounds taking turns.

    python benchmarks/response_cache.py                # c=1 and c=16, 2 rounds
    python benchmarks/response_cache.py --rounds 3 --out benchmarks/out/cache

One server (``--cache-config local,size=131072``) serves ``mlp`` with ``response_cache`` and
``mlp_plain``, the same files without it. Hits: every request carries one input (perf_analyzer's
``--input-data`` with one entry), so all but the first are answered from the cache. Misses: 256
distinct inputs in turn, more than the 128 KiB cache holds (about 48 answers of the mlp: each
keeps its 2 KiB input as its key), so the least recently used one is always the next asked for and
every request misses (at c=1 only: perf_analyzer's concurrent contexts send the same entries
together, so they would hit). Issue 30's target: a hit's p50 <= 0.2 x a miss's. Server CPU per
request beside each row (a hit is not an inference in the statistics). Writes ``cache.json`` and
``cache.md`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import statistics
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np

import harness
import server_usage

CACHE_BYTES = 131072
DISTINCT = 256
WIDTH = 512  # the mlp's input width (inferd.examples.MLP_SIZES[0])
# (name, model, data file) for each kind of run.
KINDS = (
    ("hit", "mlp", "one.json"),
    ("miss", "mlp", "many.json"),
    ("no cache", "mlp_plain", "many.json"),
)


def write_repository(python: str, out: Path) -> Path:
    """The example mlp twice: with response_cache and (mlp_plain) without it."""
    repository = out / "models"
    examples = out / "examples"
    subprocess.run([python, "-m", "inferd", "make-examples", str(examples)], check=True)
    for name in ("mlp", "mlp_plain"):
        shutil.copytree(examples / "mlp", repository / name)
        config = repository / name / "config.pbtxt"
        text = config.read_text().replace('name: "mlp"', f'name: "{name}"')
        if name == "mlp":
            text += "response_cache { enable: true }\n"
        config.write_text(text)
    return repository


def write_data(out: Path) -> None:
    rng = np.random.default_rng(30)

    def entry() -> dict[str, Any]:
        values = rng.standard_normal(WIDTH).astype(np.float32)
        return {"INPUT0": {"content": values.tolist(), "shape": [WIDTH]}}

    (out / "one.json").write_text(json.dumps({"data": [entry()]}))
    (out / "many.json").write_text(json.dumps({"data": [entry() for _ in range(DISTINCT)]}))


def measure(
    pa: harness.PerfAnalyzer, server: harness.Server, model: str, data: Path, concurrency: int,
    interval_ms: int, log: Path,
) -> dict[str, Any]:  # fmt: skip
    # Misses vary more than hits on a shared 2-core machine: windows within 50 % count as stable.
    flags = ["--input-data", str(data), "--stability-percentage", "50"]
    start = server_usage.sample(server.pid, None, model)
    result = pa.measure(model, server.port, concurrency, interval_ms, flags, log)
    end = server_usage.sample(server.pid, None, model)
    out = result.summary()
    out["usage"] = server_usage.usage(server.pid, start, end)
    return out


def cache_counts(server: harness.Server, model: str) -> tuple[int, int, int]:
    """(hits, misses, successful requests) of ``model`` so far, from its statistics. A hit is
    neither an inference nor an execution (as in Triton), so CPU is counted per request here."""
    import tritonclient.grpc as grpcclient

    with grpcclient.InferenceServerClient(f"127.0.0.1:{server.port}") as client:
        answer = client.get_inference_statistics(model_name=model, client_timeout=30)
    inference = answer.model_stats[0].inference_stats
    return inference.cache_hit.count, inference.cache_miss.count, inference.success.count


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--python", default=sys.executable, help="Python with inferd installed")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 16])
    parser.add_argument("--interval-ms", type=int, default=4000, help="perf_analyzer window")
    parser.add_argument("--out", type=Path, help="default benchmarks/out/cache-<timestamp>/")
    args = parser.parse_args()

    python = str(Path(args.python).absolute()) if "/" in args.python else args.python
    started = datetime.now()
    out = args.out or harness.BENCHMARKS / "out" / f"cache-{started.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    repository = write_repository(python, out)
    write_data(out)
    pa = harness.PerfAnalyzer.find(python)
    machine = harness.machine_info(python)
    print(f"machine: {harness.describe_machine(machine)}\nout: {out}", flush=True)
    command = harness.inferd_command(
        python, repository, ["--cache-config", f"local,size={CACHE_BYTES}"]
    )
    runs: list[dict[str, Any]] = []
    with harness.running(harness.start_server(command, out / "server.log")) as server:
        for round_index in range(args.rounds):
            kinds = KINDS if round_index % 2 == 0 else tuple(reversed(KINDS))
            for concurrency in args.concurrency:
                for kind, model, data in kinds:
                    if kind == "miss" and concurrency > 1:
                        # perf_analyzer's concurrent contexts walk the data entries together:
                        # they send the same input at once, and most of a "miss" run hits.
                        continue
                    before = cache_counts(server, model)
                    log = out / f"pa-{kind.replace(' ', '_')}-c{concurrency}-r{round_index}.log"
                    run = measure(pa, server, model, out / data, concurrency, args.interval_ms, log)
                    after = cache_counts(server, model)
                    requests = after[2] - before[2]
                    cpu_s = run["usage"]["server_cpu_s"]
                    run.update(
                        kind=kind,
                        round=round_index,
                        hits=after[0] - before[0],
                        misses=after[1] - before[1],
                        requests=requests,
                        cpu_us_per_request=cpu_s * 1e6 / requests if requests else None,
                    )
                    runs.append(run)
                    print(
                        f"round {round_index} c={concurrency} {kind}: "
                        f"{run['infer_per_s']} infer/s, p50 {run['p50_us']} us, "
                        f"hits {run['hits']} misses {run['misses']}",
                        flush=True,
                    )
    report = {"machine": machine, "command": shlex.join(sys.argv), "runs": runs}
    (out / "cache.json").write_text(json.dumps(report, indent=2))
    (out / "cache.md").write_text(markdown(runs, args.concurrency))
    print((out / "cache.md").read_text())
    return 0


def markdown(runs: list[dict[str, Any]], concurrencies: list[int]) -> str:
    def median(kind: str, concurrency: int, key: str) -> float | None:
        values = [
            r[key] if key in r else r["usage"].get(key)
            for r in runs
            if r["kind"] == kind and r["concurrency"] == concurrency and not r["error"]
        ]
        values = [v for v in values if v is not None]
        return statistics.median(values) if values else None

    lines = [
        "| c | kind | infer/s | p50 µs | p99 µs | server CPU µs/request | hits | misses |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for concurrency in concurrencies:
        for kind, _model, _data in KINDS:
            cells = [
                median(kind, concurrency, key)
                for key in ("infer_per_s", "p50_us", "p99_us", "cpu_us_per_request")
            ]
            hits = sum(
                r["hits"] for r in runs if r["kind"] == kind and r["concurrency"] == concurrency
            )
            misses = sum(
                r["misses"] for r in runs if r["kind"] == kind and r["concurrency"] == concurrency
            )
            shown = ["-" if c is None else f"{c:,.0f}" for c in cells]
            lines.append(f"| {concurrency} | {kind} | {' | '.join(shown)} | {hits} | {misses} |")
        hit = median("hit", concurrency, "p50_us")
        miss = median("miss", concurrency, "p50_us")
        if hit and miss:
            lines.append(f"\nc={concurrency}: a hit's p50 is {hit / miss:.2f} x a miss's.\n")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
