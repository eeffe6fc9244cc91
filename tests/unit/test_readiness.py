"""issue 14, item 4: when the models make the server ready (ReadinessRules): strict readiness as
Triton's, models marked optional in their config, and no model serving."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from inferd.core import CompletionDispatcher, HostBufferPool
from inferd.errors import ModelLoadError
from inferd.examples import write_identity_model
from inferd.executors import OnnxRuntimeOptions
from inferd.models import ModelRegistry, ReadinessRules
from inferd.repository import ModelRepository

OPTIONAL = 'parameters { key: "inferd.readiness" value: { string_value: "optional" } }\n'


def write_broken_model(model_dir: Path, config: str = "") -> None:
    """A model whose file is no ONNX model: its load fails; ``config``: its config.pbtxt."""
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "1" / "model.onnx").write_bytes(b"not an onnx model")
    if config:
        (model_dir / "config.pbtxt").write_text(config)


def registry_for(root: Path, rules: ReadinessRules) -> ModelRegistry:
    return ModelRegistry(
        ModelRepository(root),
        CompletionDispatcher(asyncio.get_running_loop()),
        HostBufferPool(1 << 20),
        default_max_batch_size=4,
        onnxruntime_options=OnnxRuntimeOptions(1, 1),
        readiness=rules,
    )


async def load_all(registry: ModelRegistry, names: list[str] | None = None) -> None:
    """The start-up load, on a worker thread as the server runs it."""
    await asyncio.get_running_loop().run_in_executor(None, registry.load_all, names)


@pytest.fixture
def good_and_broken(tmp_path: Path) -> Path:
    write_identity_model(tmp_path / "good", "FP32", with_config=False)
    write_broken_model(tmp_path / "broken")
    return tmp_path


async def test_a_failed_model_holds_readiness_only_when_strict(good_and_broken: Path) -> None:
    strict = registry_for(good_and_broken, ReadinessRules(strict=True))
    lenient = registry_for(good_and_broken, ReadinessRules(strict=False))
    for registry in (strict, lenient):
        await load_all(registry)
        assert registry.ready_models() == ["good"]
    assert not strict.server_ready()
    assert lenient.server_ready()
    await strict.close()
    await lenient.close()


async def test_a_failed_optional_model_does_not_hold_readiness(tmp_path: Path) -> None:
    write_identity_model(tmp_path / "good", "FP32", with_config=False)
    write_broken_model(tmp_path / "broken", OPTIONAL)
    registry = registry_for(tmp_path, ReadinessRules(strict=True))
    await load_all(registry)
    assert registry.ready_models() == ["good"]
    assert registry.server_ready()
    await registry.close()


async def test_a_loaded_optional_model_serves_and_does_not_hold_readiness_once_unloaded(
    tmp_path: Path,
) -> None:
    write_identity_model(tmp_path / "good", "FP32", with_config=False)
    write_identity_model(tmp_path / "extra", "FP32", with_config=False)
    with (tmp_path / "extra" / "config.pbtxt").open("a") as config:
        config.write(OPTIONAL)
    registry = registry_for(tmp_path, ReadinessRules(strict=True))
    await load_all(registry)
    assert sorted(registry.ready_models()) == ["extra", "good"]
    assert registry.server_ready()
    await registry.unload("good")
    assert registry.server_ready()  # the optional model still serves
    await registry.unload("extra")
    assert not registry.server_ready()  # nothing serves
    await registry.close()


async def test_an_unknown_readiness_value_fails_the_load_and_holds_readiness(
    tmp_path: Path,
) -> None:
    write_identity_model(tmp_path / "good", "FP32", with_config=False)
    write_identity_model(tmp_path / "odd", "FP32", with_config=False)
    with (tmp_path / "odd" / "config.pbtxt").open("a") as config:
        config.write(OPTIONAL.replace("optional", "sometimes"))
    registry = registry_for(tmp_path, ReadinessRules(strict=True))
    await load_all(registry)
    assert registry.ready_models() == ["good"]
    assert not registry.server_ready()
    [status] = [s for s in registry.index() if s.name == "odd"]
    assert "inferd.readiness" in status.reason and "'sometimes'" in status.reason
    with pytest.raises(ModelLoadError, match=r"inferd\.readiness is 'sometimes'"):
        await registry.load("odd")
    await registry.close()


@pytest.mark.parametrize("strict", [True, False])
async def test_an_empty_repository_is_not_ready_unless_allowed(
    tmp_path: Path, strict: bool
) -> None:
    registry = registry_for(tmp_path, ReadinessRules(strict=strict))
    await load_all(registry)
    assert not registry.server_ready()
    allowed = registry_for(tmp_path, ReadinessRules(strict=strict, without_models=True))
    await load_all(allowed)
    assert allowed.server_ready()


async def test_explicit_mode_is_ready_once_a_load_request_has_loaded_a_model(
    tmp_path: Path,
) -> None:
    write_identity_model(tmp_path / "good", "FP32", with_config=False)
    registry = registry_for(tmp_path, ReadinessRules(strict=True))
    await load_all(registry, [])  # explicit mode without --load-model
    assert not registry.server_ready()
    await registry.load("good")
    assert registry.server_ready()
    await registry.unload("good")
    assert not registry.server_ready()
    await registry.close()
