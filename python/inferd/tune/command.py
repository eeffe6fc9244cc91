"""``inferd tune``'s command line: its flags, and the run with a progress bar."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

TUNE_DESCRIPTION = """\
Measures configs of one model on a real inferd (a child process, or the server at --url) with
inferd's own C++ load generator, least risky changes first (dynamic batching, batch sizes,
instances, ONNX Runtime threads, then FP16/INT8 where --precision allows), and writes into --out:
tune.md (every config tried: throughput, p50/p95/p99, server CPU per inference, memory, cold
start, error rate, cost per 1,000 predictions), tune.json, tune.png (throughput against p99) and
the best config.pbtxt."""


def add_tune_command(
    commands: argparse._SubParsersAction[Any],
) -> argparse.ArgumentParser:
    tune: argparse.ArgumentParser = commands.add_parser(
        "tune",
        help="Search a model's serving config by measurement (Model Analyzer's job).",
        description=TUNE_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    tune.add_argument(
        "model", type=Path, help="The model's folder (config.pbtxt, version folders)."
    )
    goal = tune.add_mutually_exclusive_group(required=True)
    goal.add_argument("--p99-ms", type=float, help="The most throughput with p99 within this.")
    goal.add_argument("--min-throughput", type=float, help="The lowest p99 serving this many/s.")
    tune.add_argument(
        "--cost-per-hour", type=float, help="The machine's price, for cost per 1,000."
    )
    tune.add_argument(
        "--concurrency", type=int, nargs="+", default=[1, 4, 16],
        help="Closed-loop load points: requests in flight (default 1 4 16).",
    )  # fmt: skip
    tune.add_argument(
        "--rate", type=float, nargs="+",
        help="Open-loop load points instead: Poisson arrivals per second (at most 256 in flight).",
    )  # fmt: skip
    tune.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="INPUT:D1,D2",
        help="An input's dims where the config says -1 (default 1).",
    )
    tune.add_argument("--samples", type=Path, help="An .npz of sample inputs, one row each.")
    tune.add_argument(
        "--precision", nargs="*", choices=("fp16", "int8"), default=[],
        help="Lower-precision variants to try, each kept only within --tolerance of FP32.",
    )  # fmt: skip
    tune.add_argument(
        "--tolerance",
        type=float,
        default=1e-2,
        help="Largest absolute output difference a variant may have (0.01).",
    )
    tune.add_argument("--budget-minutes", type=float, default=10.0)
    tune.add_argument("--window-s", type=float, default=2.0, help="Seconds measured per point.")
    tune.add_argument("--url", help="Measure on the server at HOST:PORT (explicit control mode).")
    tune.add_argument("--out", type=Path, default=Path("tune-out"))
    return tune


def _shapes(specs: list[str]) -> dict[str, list[int]]:
    shapes = {}
    for spec in specs:
        name, _, dims = spec.rpartition(":")
        try:
            shapes[name] = [int(d) for d in dims.split(",")]
        except ValueError:
            raise SystemExit(f"inferd tune: error: --shape {spec!r}: INPUT:D1,D2,...") from None
    return shapes


def run_tune(args: argparse.Namespace) -> int:
    from inferd.tune.measure import LoadPoint
    from inferd.tune.search import Objective
    from inferd.tune.tool import tune

    loads = (
        [LoadPoint(256, rate) for rate in args.rate]
        if args.rate
        else [LoadPoint(c) for c in args.concurrency]
    )
    objective = Objective(args.p99_ms, args.min_throughput, args.cost_per_hour)
    bar = _progress(args.budget_minutes * 60)
    try:
        result = tune(
            args.model, objective, loads, args.out,
            budget_s=args.budget_minutes * 60, window_s=args.window_s,
            precisions=tuple(args.precision), tolerance=args.tolerance,
            shapes=_shapes(args.shape), samples_file=args.samples, url=args.url,
            progress=bar,
        )  # fmt: skip
    finally:
        bar.close()
    best = result.best
    print(
        f"best: {best.candidate.label} (score {best.score:,.1f}, the stated config's "
        f"{result.baseline.score:,.1f}); wrote {args.out}/config.pbtxt, tune.md, tune.png"
    )
    return 0


class _Progress:
    """A progress bar over the time budget (tqdm's), one step per config measured; a line per
    config where tqdm is not installed."""

    def __init__(self, budget_s: float) -> None:
        try:
            from tqdm import tqdm
        except ImportError:
            self._bar = None
        else:
            self._bar = tqdm(total=round(budget_s), unit="s", file=sys.stderr, dynamic_ncols=True)
        self._total = round(budget_s)
        import time

        self._clock = time.monotonic
        self._started = self._clock()

    def __call__(self, what: str) -> None:
        if self._bar is None:
            print(f"inferd tune: {what}", file=sys.stderr, flush=True)
            return
        self._bar.set_description(what[:60])
        self._bar.n = min(self._total, round(self._clock() - self._started))
        self._bar.refresh()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


def _progress(budget_s: float) -> _Progress:
    return _Progress(budget_s)
