"""The search: the stated config measured first (twice), then one kind of change at a time in
the seed's order of risk (batching, batch sizes, instances, ONNX Runtime threads and graph
optimization level, precision), each stage's best option kept only if it beats the config so far
by ``MIN_GAIN`` and a second measurement bears that out, the max batch size climbing on while its
doublings keep winning: a quick search over the full grid's axes, within the time budget (the
stages left when it runs out are named, not run)."""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from inferd.tune.candidates import Candidate
from inferd.tune.measure import LoadPoint, Measurement, PointResult
from inferd.tune.variants import Variant

# A change is kept when it beats the config so far by this much: smaller differences are the
# machine's noise, and the less risky config (the earlier one) wins them, so that two runs agree.
MIN_GAIN = 0.05

# The max batch size stage climbs past twice the stated size, a doubling at a time while each
# beats the last by MIN_GAIN, up to this: a model left at the default of 4 reaches 64 or more.
LARGEST_BATCH_SIZE = 1024


@dataclass(frozen=True)
class Objective:
    """What ``best`` means: the most throughput with p99 within ``p99_ms``; or, with
    ``min_throughput``, the lowest p99 that serves at least that; ``cost_per_hour``: the
    machine's price, for cost per 1,000 predictions."""

    p99_ms: float | None = None
    min_throughput: float | None = None
    cost_per_hour: float | None = None

    def best_point(self, measurement: Measurement) -> PointResult | None:
        clean = [p for p in measurement.points if p.errors == 0 and p.requests > 0]
        if self.p99_ms is not None:
            clean = [p for p in clean if p.p99_ms <= self.p99_ms]
        if self.min_throughput is not None:
            enough = [p for p in clean if p.throughput >= self.min_throughput]
            return min(enough, key=lambda p: p.p99_ms, default=None)
        return max(clean, key=lambda p: p.throughput, default=None)

    def score(self, measurement: Measurement) -> float:
        point = self.best_point(measurement)
        if point is None:
            return 0.0
        return 1000.0 / point.p99_ms if self.min_throughput is not None else point.throughput

    def cost_per_1000(self, point: PointResult | None) -> float | None:
        if self.cost_per_hour is None or point is None or point.throughput <= 0:
            return None
        return self.cost_per_hour / 3600.0 / point.throughput * 1000.0

    @property
    def description(self) -> str:
        parts = []
        if self.p99_ms is not None:
            parts.append(f"p99 <= {self.p99_ms:g} ms")
        if self.min_throughput is not None:
            parts.append(f"throughput >= {self.min_throughput:g}/s, lowest p99")
        else:
            parts.append("the most throughput")
        return ", ".join(parts)


@dataclass
class Trial:
    stage: str
    candidate: Candidate
    measurement: Measurement
    score: float
    kept: bool = False


@dataclass
class TuneResult:
    objective: Objective
    loads: list[LoadPoint]
    trials: list[Trial] = field(default_factory=list)
    refused_variants: list[Variant] = field(default_factory=list)
    skipped_stages: list[str] = field(default_factory=list)
    grid_size: int = 0
    # The stated config's and the winner's mean scores over all their measurements (confirm()).
    confirmed: tuple[float, float] | None = None
    required_gain: float = MIN_GAIN  # what the winner had to beat the stated config by
    elapsed_s: float = 0.0
    budget_s: float = 0.0

    @property
    def baseline(self) -> Trial:
        """The stated config's trial, scored by the mean of its measurements: its confirmation
        when there was one, else its measurement again at the start (or its only one)."""
        stated = self.trials[0].candidate
        again = [t for t in self.trials if t.stage == "confirmation" and t.candidate == stated]
        if again and self.confirmed:
            return again[0]
        return [t for t in self.trials[:2] if t.candidate == stated][-1]

    @property
    def best(self) -> Trial:
        kept = [t for t in self.trials if t.kept]
        return kept[-1] if kept else self.baseline


# Measures a candidate (with its precision's model file); the search's only contact with servers.
Measure = Callable[[Candidate, int], Measurement]


# A stage turns the config so far into the options it tries; its climb, when it has one, turns the
# option it kept (and every option it tried) into the next ones, tried while each is kept.
Options = Callable[[Candidate], list[Candidate]]
Climb = Callable[[Candidate, list[Candidate]], list[Candidate]]


@dataclass(frozen=True)
class Stage:
    name: str
    options: Options
    climb: Climb | None = None


def _batch_size_climb(kept: Candidate, tried: list[Candidate]) -> list[Candidate]:
    """Past the largest size tried, doubling; below the smallest, halving; else nothing."""
    sizes = [c.max_batch_size for c in tried]
    if kept.max_batch_size >= max(sizes) and kept.max_batch_size * 2 <= LARGEST_BATCH_SIZE:
        return [kept.with_(max_batch_size=kept.max_batch_size * 2)]
    if kept.max_batch_size <= min(sizes) and kept.max_batch_size > 1:
        return [kept.with_(max_batch_size=kept.max_batch_size // 2)]
    return []


def stages(base: Candidate, variants: list[Variant]) -> list[Stage]:
    """The stages in order of risk."""
    cores = len(os.sched_getaffinity(0))

    def batching(c: Candidate) -> list[Candidate]:
        if c.max_batch_size == 0:
            return []
        return [c.with_(queue_delay_us=d) for d in (0, 500, 2000) if d != c.queue_delay_us]

    def batch_size(c: Candidate) -> list[Candidate]:
        if c.max_batch_size == 0 or c.queue_delay_us is None:
            return []
        sizes = sorted(
            {max(1, c.max_batch_size // 4), max(1, c.max_batch_size // 2), c.max_batch_size * 2}
        )
        return [
            c.with_(max_batch_size=s, preferred_batch_sizes=())
            for s in sizes
            if s != c.max_batch_size
        ]

    def preferred(c: Candidate) -> list[Candidate]:
        if c.queue_delay_us is None or c.max_batch_size < 2:
            return []
        options = [(c.max_batch_size // 2,), (c.max_batch_size,)]
        return [c.with_(preferred_batch_sizes=p) for p in options if p != c.preferred_batch_sizes]

    def instances(c: Candidate) -> list[Candidate]:
        return [c.with_(instances=n) for n in range(1, min(cores, 4) + 1) if n != c.instances]

    def threads(c: Candidate) -> list[Candidate]:
        return [
            c.with_(intra_op_threads=n)
            for n in range(1, min(cores, 4) + 1)
            if n != c.intra_op_threads
        ]

    def graph(c: Candidate) -> list[Candidate]:
        return [c.with_(graph_level=level) for level in (0, -1, 1) if level != c.graph_level]

    def precision(c: Candidate) -> list[Candidate]:
        return [c.with_(precision=v.precision) for v in variants if v.model_file is not None]

    return [
        Stage("dynamic batching", batching),
        Stage("max batch size", batch_size, _batch_size_climb),
        Stage("preferred batch sizes", preferred),
        Stage("instances", instances),
        Stage("ONNX Runtime threads", threads),
        Stage("graph optimization level", graph),
        Stage("precision", precision),
    ]


def grid_size(base: Candidate, variants: list[Variant]) -> int:
    """The configs the full grid over the same axes holds: every delay (and none), each batch size
    the stage can reach (a quarter and half of the stated one, the stated one, and its doublings up
    to LARGEST_BATCH_SIZE), 3 preferred-size choices, each instance count and thread count (and the
    default), 3 graph optimization levels, and each precision kept."""
    cores = min(len(os.sched_getaffinity(0)), 4)
    precisions = 1 + sum(1 for v in variants if v.model_file is not None)
    batching = 1
    if base.max_batch_size > 0:
        sizes = {max(1, base.max_batch_size // 4), max(1, base.max_batch_size // 2)}
        size = base.max_batch_size
        while size <= max(LARGEST_BATCH_SIZE, base.max_batch_size):
            sizes.add(size)
            size *= 2
        batching = 4 * len(sizes) * 3
    return batching * cores * (cores + 1) * 3 * precisions


def search(
    base: Candidate,
    objective: Objective,
    loads: list[LoadPoint],
    measure: Measure,
    budget_s: float,
    estimate_s: float,
    variants: list[Variant],
    progress: Callable[[str], None] = lambda _: None,
) -> TuneResult:
    """Measures ``base``, then each stage's options; ``estimate_s``: one measurement's expected
    time, so that none starts that the budget cannot hold."""
    result = TuneResult(objective, loads, budget_s=budget_s)
    result.refused_variants = [v for v in variants if v.model_file is None]
    result.grid_size = grid_size(base, variants)
    run = _Run(result, measure, budget_s, estimate_s, progress)
    # The stated config twice: every option is judged against its mean, so one lucky window of the
    # baseline cannot hide every gain (nor an unlucky one invent them); its spread is the noise.
    run.trial("stated config", base)
    current = run.trial("stated config, again", base) if run.fits(1) else result.trials[0]
    current.score = run.mean(base)
    current.kept = True
    for stage in stages(base, variants):
        options = stage.options(current.candidate)
        while options:
            for candidate in options:
                if not run.fits(1):
                    if stage.name not in result.skipped_stages:
                        result.skipped_stages.append(stage.name)
                    continue
                run.trial(stage.name, candidate)
            tried = [t for t in result.trials if t.stage == stage.name]
            rivals = [t for t in tried if t.candidate != current.candidate]
            winner = max(rivals, key=lambda t: t.score, default=None)
            if winner is None or winner.score <= run.mean(current.candidate) * (1 + MIN_GAIN):
                break
            kept = run.bears_out(f"{stage.name}, again", current.candidate, winner)
            if kept is None:
                break
            kept.kept = True
            current = kept
            seen = [current.candidate, *(t.candidate for t in tried)]
            further = stage.climb(current.candidate, seen) if stage.climb else []
            options = [c for c in further if c not in seen]
    confirm(result, base, current, run)
    result.elapsed_s = run.elapsed_s
    return result


class _Run:
    """The search's measurements: each one a trial in the result, and each config's scores so far
    (a config measured again is judged by their mean)."""

    def __init__(
        self,
        result: TuneResult,
        measure: Measure,
        budget_s: float,
        estimate_s: float,
        progress: Callable[[str], None],
    ) -> None:
        self._result = result
        self._measure = measure
        self._budget_s = budget_s
        self._estimate_s = estimate_s
        self._progress = progress
        self._started = time.monotonic()
        self._scores: dict[Candidate, list[float]] = {}

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self._started

    def fits(self, measurements: int) -> bool:
        return self.elapsed_s + measurements * self._estimate_s <= self._budget_s

    def trial(self, stage: str, candidate: Candidate) -> Trial:
        self._progress(f"{stage}: {candidate.label}")
        measurement = self._measure(candidate, len(self._result.trials) + 1)
        trial = Trial(stage, candidate, measurement, self._result.objective.score(measurement))
        self._result.trials.append(trial)
        self._scores.setdefault(candidate, []).append(trial.score)
        return trial

    def mean(self, candidate: Candidate) -> float:
        return statistics.fmean(self._scores[candidate])

    def spread(self, candidate: Candidate) -> float:
        """How far ``candidate``'s own scores lie apart, relative to their mean: the noise."""
        scores, mean = self._scores[candidate], self.mean(candidate)
        return (max(scores) - min(scores)) / mean if mean else 0.0

    def bears_out(self, stage: str, current: Candidate, winner: Trial) -> Trial | None:
        """Measures a stage's winner again, and the config so far too if it has one score only:
        the winner's second trial (scored by its mean) when the means differ by more than MIN_GAIN
        and the config so far's own spread, else None. A stage's best is the luckiest of its
        options, so the one most likely to have had a lucky window. Without the budget for it,
        the one measurement decides."""
        needed = 1 + (len(self._scores[current]) < 2)
        if not self.fits(needed):
            return winner
        if len(self._scores[current]) < 2:
            current_again = self.trial(stage, current)
            current_again.score = self.mean(current)
        again = self.trial(stage, winner.candidate)
        again.score = self.mean(winner.candidate)
        required = max(MIN_GAIN, self.spread(current))
        return again if again.score > self.mean(current) * (1 + required) else None


def confirm(result: TuneResult, base: Candidate, best: Trial, run: _Run) -> None:
    """Measures the stated config and the winner once more, in that order, when the budget holds
    both: the winner stays the best only if the mean of its scores beats the stated config's by
    MIN_GAIN, or by how far the stated config's own scores lie apart if that is more (the
    machine's noise, measured). The stages' changes were each borne out against the config
    before them; this bears out their sum against where the search began (two runs of tune then
    agree)."""
    if best.candidate == base:
        return
    if not run.fits(2):
        result.skipped_stages.append("confirmation")
        return
    stated_again = run.trial("confirmation", base)
    best_again = run.trial("confirmation", best.candidate)
    # The two confirmation trials are scored by the means: the table and the summary show those.
    stated_again.score = run.mean(base)
    best_again.score = run.mean(best.candidate)
    result.required_gain = max(MIN_GAIN, run.spread(base))
    if best_again.score > stated_again.score * (1 + result.required_gain):
        best_again.kept = True
    else:
        for trial in result.trials:
            trial.kept = False
        stated_again.kept = True
    result.confirmed = (stated_again.score, best_again.score)
