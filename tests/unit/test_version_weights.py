"""Weighted version routing in-process: the config key's parsing and refusals, the choice both
serving paths share (FNV-1a 64 of the routing key, checked against an independent
implementation), and the registry's routing of inferences that name no version."""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path

import pytest

from inferd._core import choose_weighted_version
from inferd._proto.model_config_pb2 import ModelConfig
from inferd.core import CompletionDispatcher, HostBufferPool
from inferd.errors import ModelLoadError
from inferd.examples import write_identity_model
from inferd.executors import OnnxRuntimeOptions
from inferd.models import ModelRegistry
from inferd.repository import ModelRepository
from inferd.repository.version_weights import VERSION_WEIGHTS, version_weights


def weighted_config(value: str) -> ModelConfig:
    config = ModelConfig(name="canary")
    config.parameters[VERSION_WEIGHTS].string_value = value
    return config


def test_weights_parse_and_zero_weights_are_left_out() -> None:
    assert version_weights(weighted_config(" 3:90 , 4:10,5:0"), [3, 4, 5]) == {3: 90, 4: 10}


def test_no_key_means_no_weights() -> None:
    assert version_weights(ModelConfig(name="canary"), [1, 2]) == {}


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("3:90,4", "'4' is not VERSION:WEIGHT"),
        ("3:ninety", "'3:ninety' is not VERSION:WEIGHT"),
        ("", "'' is not VERSION:WEIGHT"),
        ("3:90,4:-1", "version 4 has a negative weight"),
        # Their sum would wrap the core's 64-bit cumulative weights.
        ("3:18446744073709551615,4:10", "version 3's weight is above the largest, 1000000"),
        ("3:0,4:0", "every weight is zero"),
        ("3:1,3:2", "version 3 is given twice"),
        ("3:90,7:10", "version 7 is not served (the version policy serves [3, 4])"),
    ],
)
def test_malformed_weights_are_refused_naming_the_key(value: str, says: str) -> None:
    with pytest.raises(ModelLoadError) as refused:
        version_weights(weighted_config(value), [3, 4])
    assert f"parameter {VERSION_WEIGHTS}" in str(refused.value)
    assert says in str(refused.value)


def fnv1a64(data: bytes) -> int:
    """FNV-1a 64, written here from its definition (not the core's code)."""
    value = 0xCBF29CE484222325
    for byte in data:
        value = ((value ^ byte) * 0x100000001B3) % (1 << 64)
    return value


def test_a_routing_key_picks_by_its_fnv1a64_point() -> None:
    weights = [90, 10]
    for i in range(2000):
        key = f"user-{i}-é"  # UTF-8 bytes above ASCII too
        point = fnv1a64(key.encode()) % 100
        assert choose_weighted_version(weights, key) == (0 if point < 90 else 1), key


def test_no_routing_key_picks_at_random_by_the_weights() -> None:
    # 20,000 picks at 90/10: the 10% count is binomial, sigma = sqrt(n p (1-p)) ~ 42.4; the test
    # allows 5 sigma either side of 2,000.
    picks = [choose_weighted_version([90, 10], None) for _ in range(20000)]
    assert abs(picks.count(1) - 2000) <= 5 * (20000 * 0.1 * 0.9) ** 0.5


def test_the_choice_refuses_a_zero_weight() -> None:
    with pytest.raises(ValueError, match="zero"):
        choose_weighted_version([3, 0], "key")


@pytest.fixture
def canary_repository(tmp_path: Path) -> Path:
    model_dir = tmp_path / "canary"
    write_identity_model(model_dir, "FP32")
    for version in ("3", "4", "5"):
        shutil.copytree(model_dir / "1", model_dir / version)
    shutil.rmtree(model_dir / "1")
    config = (model_dir / "config.pbtxt").read_text()
    (model_dir / "config.pbtxt").write_text(
        config
        + "version_policy { all { } }\n"
        + f'parameters {{ key: "{VERSION_WEIGHTS}" value: {{ string_value: "3:90,4:10" }} }}\n'
    )
    return tmp_path


def registry_for(root: Path) -> ModelRegistry:
    return ModelRegistry(
        ModelRepository(root),
        CompletionDispatcher(asyncio.get_running_loop()),
        HostBufferPool(1 << 24),
        default_max_batch_size=4,
        onnxruntime_options=OnnxRuntimeOptions(1, 1),
    )


async def test_the_registry_routes_unnamed_inferences_by_weight(canary_repository: Path) -> None:
    registry = registry_for(canary_repository)
    await registry.load("canary")
    try:
        assert registry.ready_weights("canary") == {3: 90, 4: 10}
        for i in range(200):
            key = f"user-{i}"
            expected = 3 if fnv1a64(key.encode()) % 100 < 90 else 4
            assert registry.route("canary", "", key).version == expected
        assert registry.route("canary", "5", "user-1").version == 5  # a named version
        assert registry.get("canary").version == 5  # metadata's default: the highest ready
        # Version 5 has no weight: the unnamed traffic never reaches it.
        assert {registry.route("canary", "", None).version for _ in range(500)} == {3, 4}
    finally:
        await registry.close()


async def test_a_load_with_a_version_the_policy_does_not_serve_fails(
    canary_repository: Path,
) -> None:
    config_path = canary_repository / "canary" / "config.pbtxt"
    config_path.write_text(config_path.read_text().replace("3:90,4:10", "3:90,9:10"))
    registry = registry_for(canary_repository)
    with pytest.raises(ModelLoadError, match=f"parameter {VERSION_WEIGHTS} .*version 9 is not"):
        await registry.load("canary")
    await registry.close()
