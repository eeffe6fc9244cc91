"""The compute limit: ONNX Runtime alone, in this process, no server, no transport.

    python benchmarks/raw_engine.py --model-repository examples-repo --model mlp \
        [--batch-sizes 1 8 32 64] [--min-seconds 2] [--json OUT.json]
    python benchmarks/raw_engine.py --model mlp --batch-sizes 12 17 23 \
        --intra-op-thread-count 1 --no-spinning       # inferd's own session options on 2 cores

For each batch size (any list): one InferenceSession (intra-op threads = cores unless the model's
parameters or ``--intra-op-thread-count`` say, inter-op 1; CPU provider; ``--no-spinning`` as
inferd's sessions, whose pool threads do not spin after a run), fixed-seed inputs built once,
warm-up runs, then ``session.run`` back to back for at least ``--min-seconds``. Prints rows/s
(inferences/s, what perf_analyzer counts) and batches/s with the per-batch latency; ``--json``
writes the same figures. ``best`` is the highest rows/s among the sizes the model's
``max_batch_size`` admits (sizes above it are measured and marked, not counted).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

import harness
from transport_floor import example_inputs


def measure(
    session: Any,
    outputs: list[str],
    feeds: dict[str, np.ndarray],
    min_seconds: float,
    warmup: int,
) -> dict[str, float]:
    for _ in range(warmup):
        session.run(outputs, feeds)
    times: list[float] = []
    start = time.perf_counter()
    now = start
    while now - start < min_seconds or len(times) < 10:
        before = now
        session.run(outputs, feeds)
        now = time.perf_counter()
        times.append(now - before)
    elapsed = now - start
    ms = np.array(times) * 1e3
    return {
        "runs": len(times),
        "seconds": elapsed,
        "batches_per_s": len(times) / elapsed,
        "mean_ms": float(ms.mean()),
        "p50_ms": float(np.percentile(ms, 50)),
        "p99_ms": float(np.percentile(ms, 99)),
    }


def run(
    repository: Path,
    model_name: str,
    batch_sizes: list[int],
    min_seconds: float,
    warmup: int,
    intra: int,
    inter: int,
    spinning: bool = True,
) -> dict[str, Any]:
    model = harness.load_model(repository, model_name)
    intra, inter = harness.session_threads(model.config, intra, inter)
    session = harness.ort_session(model.onnx_path, intra, inter, spinning)
    outputs = [t.name for t in model.config.output]
    max_batch = int(model.config.max_batch_size)
    sizes = batch_sizes if max_batch > 0 else [1]  # no batch dim: one shape only
    rows: list[dict[str, Any]] = []
    for batch in sizes:
        feeds = example_inputs(model.config, batch, seed=batch)
        figures = measure(session, outputs, feeds, min_seconds, warmup)
        rows.append(
            {
                "batch_size": batch,
                "rows_per_s": figures["batches_per_s"] * batch,
                **figures,
                "within_max_batch_size": max_batch == 0 or batch <= max_batch,
            }
        )
    counted = [r for r in rows if r["within_max_batch_size"]] or rows
    best = max(counted, key=lambda r: r["rows_per_s"])
    return {
        "model": model_name,
        "max_batch_size": max_batch,
        "intra_op_threads": intra,
        "inter_op_threads": inter,
        "spinning": spinning,
        "min_seconds": min_seconds,
        "warmup_runs": warmup,
        "rows": rows,
        "best_rows_per_s": best["rows_per_s"],
        "best_batch_size": best["batch_size"],
    }


def markdown(result: dict[str, Any]) -> str:
    lines = [
        f"raw engine: {result['model']} (max_batch_size {result['max_batch_size']}), "
        f"ONNX Runtime CPU, intra-op {result['intra_op_threads']}, "
        f"inter-op {result['inter_op_threads']}, "
        f"{'spinning' if result['spinning'] else 'no spinning'}, "
        f">= {result['min_seconds']} s per size",
        "",
        "| model | batch | rows/s | batches/s | mean ms/batch | p50 ms | p99 ms | runs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        mark = "" if r["within_max_batch_size"] else " (> max_batch_size)"
        lines.append(
            f"| {result['model']} | {r['batch_size']}{mark} | {r['rows_per_s']:.0f} | "
            f"{r['batches_per_s']:.1f} | {r['mean_ms']:.3f} | {r['p50_ms']:.3f} | "
            f"{r['p99_ms']:.3f} | {r['runs']} |"
        )
    lines.append(
        f"\nbest: {result['best_rows_per_s']:.0f} rows/s at batch {result['best_batch_size']}"
    )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model-repository", type=Path, default=Path("examples-repo"))
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--min-seconds", type=float, default=2.0, help="timed runs per size")
    parser.add_argument("--warmup", type=int, default=20, help="untimed runs per size")
    parser.add_argument(
        "--intra-op-thread-count", type=int, default=0, help="0 = one per core (inferd: cores - 1)"
    )
    parser.add_argument("--inter-op-thread-count", type=int, default=1)
    parser.add_argument(
        "--no-spinning", action="store_true", help="pool threads do not spin (as inferd's)"
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()

    result = run(
        args.model_repository,
        args.model,
        args.batch_sizes,
        args.min_seconds,
        args.warmup,
        args.intra_op_thread_count,
        args.inter_op_thread_count,
        spinning=not args.no_spinning,
    )
    print(markdown(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
