"""inferd tune's search without servers: the stages in order of risk, a change kept only when it
beats the config so far by MIN_GAIN, the budget, and the objective's scores."""

from __future__ import annotations

from pathlib import Path

from inferd._proto.model_config_pb2 import ModelConfig
from inferd.tune.candidates import Candidate, stated_candidate
from inferd.tune.measure import LoadPoint, Measurement, PointResult
from inferd.tune.search import MIN_GAIN, Objective, search
from inferd.tune.variants import Variant

LOADS = [LoadPoint(1), LoadPoint(16)]


def measured(throughput: float, p99_ms: float) -> Measurement:
    return Measurement(
        points=[
            PointResult(LOADS[0], throughput / 4, p99_ms / 4, p99_ms / 4, p99_ms / 4, 100, 0),
            PointResult(LOADS[1], throughput, p99_ms / 2, p99_ms, p99_ms, 400, 0),
        ],
        cold_start_s=1.0,
    )


def test_the_objective_takes_the_most_throughput_within_p99() -> None:
    objective = Objective(p99_ms=5.0, cost_per_hour=3.6)
    fast = measured(1000.0, 4.0)
    assert objective.score(fast) == 1000.0
    assert objective.score(measured(1000.0, 8.0)) == 250.0  # only c=1 (p99 2 ms) is within
    assert objective.cost_per_1000(objective.best_point(fast)) == 0.001
    failing = Measurement(points=[PointResult(LOADS[1], 900.0, 1.0, 1.0, 1.0, 90, 10, "boom")])
    assert objective.score(failing) == 0.0  # a point with errors never counts


def test_min_throughput_takes_the_lowest_p99_that_serves_it() -> None:
    objective = Objective(min_throughput=500.0)
    assert objective.best_point(measured(1000.0, 8.0)) is not None
    assert objective.score(measured(400.0, 8.0)) == 0.0


def test_stages_run_in_order_of_risk_and_keep_only_real_gains() -> None:
    base = Candidate(max_batch_size=64)
    tried: list[Candidate] = []

    def measure(candidate: Candidate, _index: int) -> Measurement:
        tried.append(candidate)
        if candidate.queue_delay_us == 500 and candidate.max_batch_size == 64:
            return measured(2000.0, 4.0)  # dynamic batching doubles throughput
        if candidate.queue_delay_us == 500 and candidate.instances == 2:
            return measured(2000.0 * (1 + MIN_GAIN / 2), 4.0)  # within noise: not kept
        if candidate.queue_delay_us is not None:
            return measured(1500.0, 4.0)
        return measured(1000.0, 4.0)

    result = search(base, Objective(p99_ms=5.0), LOADS, measure, 3600.0, 1.0, [])
    stages = [t.stage for t in result.trials]
    assert stages[0] == "stated config"
    order = [
        "dynamic batching",
        "max batch size",
        "instances",
        "ONNX Runtime threads",
        "graph optimization level",
    ]
    firsts = [stages.index(s) for s in order]
    assert firsts == sorted(firsts)
    assert result.best.candidate == base.with_(queue_delay_us=500)
    kept = [t.stage for t in result.trials if t.kept]
    assert kept == ["stated config, again", "dynamic batching, again", "confirmation"]
    assert result.trials[-2].candidate == base and result.trials[-1] is result.best
    assert result.confirmed == (1000.0, 2000.0)
    assert len(result.trials) < result.grid_size / 4  # the quick search, not the grid
    assert not result.skipped_stages


def test_the_budget_stops_the_search_and_names_what_it_left() -> None:
    result = search(
        Candidate(max_batch_size=8),
        Objective(p99_ms=5.0),
        LOADS,
        lambda _c, _i: measured(1000.0, 4.0),
        budget_s=10.0,
        estimate_s=60.0,  # no measurement fits after the stated config's
        variants=[],
    )
    assert len(result.trials) == 1
    assert result.skipped_stages[0] == "dynamic batching"


def test_a_refused_variant_is_reported_and_never_tried() -> None:
    refused = Variant("int8", None, 0.5, "outputs differ from FP32's by 0.5 > 1e-09")
    accepted = Variant("fp16", Path("model.onnx"), 0.001)
    result = search(
        Candidate(max_batch_size=0),
        Objective(p99_ms=5.0),
        LOADS,
        lambda _c, _i: measured(1000.0, 4.0),
        3600.0,
        1.0,
        [refused, accepted],
    )
    precisions = [t.candidate.precision for t in result.trials]
    assert "int8" not in precisions and "fp16" in precisions
    assert result.refused_variants == [refused]


def test_the_stated_config_is_the_baseline_and_candidates_change_only_their_fields() -> None:
    stated = ModelConfig(name="m", max_batch_size=16)
    stated.dynamic_batching.max_queue_delay_microseconds = 100
    stated.parameters["intra_op_thread_count"].string_value = "2"
    stated.parameters["other"].string_value = "kept"
    base = stated_candidate(stated, stated)
    assert base == Candidate(16, 100, (), 1, 2)
    config = base.with_(queue_delay_us=None, intra_op_threads=0, instances=3).config(stated)
    assert not config.HasField("dynamic_batching")
    assert "intra_op_thread_count" not in config.parameters
    assert config.parameters["other"].string_value == "kept"
    # A batching model that names no scheduler is served with dynamic_batching { }: so it starts.
    completed = ModelConfig(name="m", max_batch_size=16)
    completed.dynamic_batching.SetInParent()
    assert stated_candidate(ModelConfig(name="m"), completed).queue_delay_us == 0
    assert config.instance_group[0].count == 3
    assert not config.HasField("optimization")
    assert base.with_(graph_level=-1).config(stated).optimization.graph.level == -1


def test_a_stage_winner_a_second_measurement_does_not_bear_out_is_not_kept() -> None:
    base = Candidate(max_batch_size=0)
    measured_again: list[Candidate] = []

    def measure(candidate: Candidate, _index: int) -> Measurement:
        if candidate.instances == 2:
            lucky = candidate not in measured_again
            measured_again.append(candidate)
            return measured(1500.0 if lucky else 500.0, 4.0)  # lucky once, not twice
        return measured(1000.0, 4.0)

    result = search(base, Objective(p99_ms=5.0), LOADS, measure, 3600.0, 1.0, [])
    again = [t for t in result.trials if t.stage == "instances, again"]
    # The winner again (the stated config was measured twice at the start): a mean of 1000.
    assert [(t.candidate.instances, t.score) for t in again] == [(2, 1000.0)]
    assert result.best.candidate == base
    assert [t.stage for t in result.trials if t.kept] == ["stated config, again"]
    assert result.confirmed is None  # nothing left to confirm


def test_a_stage_winner_must_beat_the_noise_the_config_so_far_shows() -> None:
    base = Candidate(max_batch_size=0)
    stated_scores = iter([1000.0, 1300.0])  # the stated config twice at the start: 26 % apart

    def measure(candidate: Candidate, _index: int) -> Measurement:
        if candidate == base:
            return measured(next(stated_scores), 4.0)
        return measured(1300.0 if candidate.instances == 2 else 900.0, 4.0)

    result = search(base, Objective(p99_ms=5.0), LOADS, measure, 3600.0, 1.0, [])
    assert [t.stage for t in result.trials[:2]] == ["stated config", "stated config, again"]
    assert result.trials[1].score == 1150.0  # judged by the mean
    # 1300 against a mean of 1150 is 1.13x: more than 5 %, less than the stated config's spread.
    again = [t for t in result.trials if t.stage == "instances, again"]
    assert [t.score for t in again] == [1300.0]
    assert result.best.candidate == base


def test_the_confirmation_bears_out_the_stages_sum_against_the_stated_config() -> None:
    # The stage's winner holds at 1.3x over two measurements each; the stated config's third,
    # at the end, lies far from its first two: the spread it shows then is more than the gain.
    base = Candidate(max_batch_size=0)
    stated_scores = iter([1000.0, 1000.0, 1500.0])

    def measure(candidate: Candidate, _index: int) -> Measurement:
        if candidate == base:
            return measured(next(stated_scores), 4.0)
        return measured(1300.0 if candidate.instances == 2 else 900.0, 4.0)

    result = search(base, Objective(p99_ms=5.0), LOADS, measure, 3600.0, 1.0, [])
    assert result.confirmed is not None
    stated_mean, best_mean = result.confirmed
    assert abs(stated_mean - 3500.0 / 3) < 1e-9 and best_mean == 1300.0
    assert abs(result.required_gain - 500.0 / stated_mean) < 1e-9
    assert result.best.candidate == base
    assert [t.stage for t in result.trials if t.kept] == ["confirmation"]


def test_the_max_batch_size_climbs_while_its_doublings_win() -> None:
    # Throughput grows with the batch up to 64 rows, then no more: from Triton's default of 4,
    # the stage doubles on to 64, tries 128, and keeps 64.
    tried: list[int] = []

    def measure(candidate: Candidate, _index: int) -> Measurement:
        tried.append(candidate.max_batch_size)
        return measured(100.0 * min(candidate.max_batch_size, 64), 4.0)

    base = Candidate(max_batch_size=4, queue_delay_us=0)
    result = search(base, Objective(p99_ms=5.0), LOADS, measure, 3600.0, 1.0, [])
    climb = [t.candidate.max_batch_size for t in result.trials if t.stage == "max batch size"]
    assert climb == [1, 2, 8, 16, 32, 64, 128]
    assert result.best.candidate.max_batch_size == 64
    assert result.best.stage == "confirmation"


def test_the_max_batch_size_climbs_down_when_the_smallest_wins() -> None:
    def measure(candidate: Candidate, _index: int) -> Measurement:
        return measured(10000.0 / max(candidate.max_batch_size, 4), 4.0)  # smaller is faster to 4

    base = Candidate(max_batch_size=64, queue_delay_us=0)
    result = search(base, Objective(p99_ms=5.0), LOADS, measure, 3600.0, 1.0, [])
    climb = [t.candidate.max_batch_size for t in result.trials if t.stage == "max batch size"]
    assert climb == [16, 32, 128, 8, 4, 2]
    assert result.best.candidate.max_batch_size == 4
