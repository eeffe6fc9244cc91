"""Integer config fields that cross into the core as C++ integers are checked against their
range where the config is checked (issue 25, item 9): the largest allowed value reaches the
core's options, one past it is refused naming the field, its value and the range."""

from __future__ import annotations

import pytest

from inferd._proto.model_config_pb2 import ModelConfig, ModelInstanceGroup
from inferd.errors import ModelLoadError
from inferd.executors.onnxruntime import OnnxRuntimeOptions
from inferd.repository import batcher_options, instance_placements
from inferd.repository.ranges import MAX_PRIORITY_LEVELS, MAX_QUEUE_DELAY_US, MAX_THREAD_COUNT

DEFAULTS = OnnxRuntimeOptions(intra_op_thread_count=1, inter_op_thread_count=1)


def batching(**section: int) -> ModelConfig:
    config = ModelConfig(name="m", max_batch_size=8)
    config.dynamic_batching.SetInParent()
    for key, value in section.items():
        setattr(config.dynamic_batching, key, value)
    return config


def test_the_largest_allowed_values_reach_the_core() -> None:
    options = batcher_options(
        batching(
            priority_levels=MAX_PRIORITY_LEVELS,
            default_priority_level=MAX_PRIORITY_LEVELS,
            max_queue_delay_microseconds=MAX_QUEUE_DELAY_US,
        )
    )
    assert options.priority_levels == options.default_priority_level == MAX_PRIORITY_LEVELS
    assert options.max_queue_delay_us == MAX_QUEUE_DELAY_US


@pytest.mark.parametrize(
    ("section", "message"),
    [
        (
            {"priority_levels": 2**40, "default_priority_level": 1},
            f"model 'm': dynamic_batching.priority_levels {2**40} is outside 0..1024",
        ),
        (
            {"priority_levels": MAX_PRIORITY_LEVELS + 1},
            "dynamic_batching.priority_levels 1025 is outside 0..1024",
        ),
        (
            {"max_queue_delay_microseconds": 2**64 - 1},
            f"max_queue_delay_microseconds {2**64 - 1} is outside 0..{MAX_QUEUE_DELAY_US}",
        ),
        (
            {"priority_levels": 2, "default_priority_level": 2**40},
            f"default_priority_level {2**40} is outside 1..2 (priority_levels)",
        ),
    ],
)
def test_a_value_past_the_range_is_refused_naming_it(section: dict[str, int], message: str) -> None:
    with pytest.raises(ModelLoadError) as refused:
        batcher_options(batching(**section))
    assert message in str(refused.value)


def test_without_priority_levels_the_default_level_does_not_reach_the_core() -> None:
    options = batcher_options(batching(default_priority_level=2**40))
    assert (options.priority_levels, options.default_priority_level) == (0, 0)


@pytest.mark.parametrize("value", [-1, MAX_THREAD_COUNT + 1, 2**40])
def test_thread_counts_past_the_range_are_refused(value: int) -> None:
    with pytest.raises(ModelLoadError) as refused:
        OnnxRuntimeOptions.from_parameters({"intra_op_thread_count": str(value)}, DEFAULTS)
    assert f"parameter 'intra_op_thread_count' {value} is outside 0..1024" in str(refused.value)
    allowed = {"inter_op_thread_count": str(MAX_THREAD_COUNT)}
    assert OnnxRuntimeOptions.from_parameters(allowed, DEFAULTS).inter_op_thread_count == 1024


def test_an_instance_count_past_the_limit_is_refused_before_any_placement_is_made() -> None:
    config = ModelConfig(name="m")
    group = config.instance_group.add(kind=ModelInstanceGroup.KIND_CPU)
    group.count = 2**31 - 1  # 16 GB of placements, were they listed first
    with pytest.raises(ModelLoadError) as refused:
        instance_placements(config, 0, "no CUDA", max_instances=16)
    assert f"ask for {2**31 - 1} instances" in str(refused.value)
    assert "limit of 16 (--max-instance-count)" in str(refused.value)
    group.count = 16
    assert len(instance_placements(config, 0, "no CUDA", max_instances=16)) == 16
