"""The registry in-process: a reload frees the replaced versions' executors; an unload drains."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from inferd.batching import CompletionDispatcher, HostBufferPool
from inferd.errors import NotFound, Unavailable
from inferd.examples import make_examples
from inferd.executors import OnnxRuntimeOptions
from inferd.models import ModelRegistry, ModelState
from inferd.repository import ModelRepository


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("registry")
    make_examples(root)
    return root


def registry_for(root: Path) -> ModelRegistry:
    return ModelRegistry(
        ModelRepository(root),
        CompletionDispatcher(asyncio.get_running_loop()),
        HostBufferPool(1 << 24),
        default_max_batch_size=4,
        onnxruntime_options=OnnxRuntimeOptions(1, 1),
    )


def simple_inputs(value: int) -> list[tuple[int, tuple[int, ...], np.ndarray]]:
    a = np.full((1, 16), value, dtype=np.int32)
    return [(8, a.shape, a), (8, a.shape, a)]


async def test_reload_swaps_versions_and_closes_the_old_executors(repository: Path) -> None:
    registry = registry_for(repository)
    await registry.load("simple")
    old = registry.get("simple")
    # A request queued on the old version while the reload happens is still answered.
    pending = asyncio.ensure_future(old.scheduler.infer(simple_inputs(2), 1))
    await registry.load("simple")
    new = registry.get("simple")
    assert new is not old
    outputs = await pending
    np.testing.assert_array_equal(outputs[0][2], np.full((1, 16), 4, dtype=np.int32))
    assert all(not hasattr(e, "_session") for e in old.scheduler.executors)  # freed
    assert all(hasattr(e, "_session") for e in new.scheduler.executors)
    await registry.close()


async def test_unload_refuses_new_requests_and_reports_the_state(repository: Path) -> None:
    registry = registry_for(repository)
    await registry.load("simple")
    await registry.unload("simple")
    with pytest.raises(Unavailable):
        registry.get("simple")
    states = {(s.name, s.version): s.state for s in registry.index()}
    assert states[("simple", "1")] == ModelState.UNAVAILABLE
    assert states[("mlp", "")] == ModelState.UNAVAILABLE  # never loaded
    assert registry.all_ready()  # nothing that should serve is missing
    with pytest.raises(NotFound):
        await registry.unload("mlp")
    await registry.close()
