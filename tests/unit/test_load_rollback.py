"""issue 13, item 4: a load its caller cancels, or that fails, or that shutdown abandons, leaves the
registry as it was (states, strict readiness) and frees what it built; unknown names leave
nothing behind."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from inferd.core import CompletionDispatcher, HostBufferPool
from inferd.errors import ModelLoadError, NotFound, Unavailable
from inferd.examples import make_examples
from inferd.executors import OnnxRuntimeOptions
from inferd.models import ModelRegistry, ModelState
from inferd.models import builder as builder_module
from inferd.models import warmup as warmup_module
from inferd.repository import ModelRepository, parse_config_json

# simple's config with a warm-up that would run for days: only cancellation ends it.
ENDLESS_WARMUP = {
    "max_batch_size": 8,
    "model_warmup": [
        {
            "name": "endless",
            "batch_size": 1,
            "count": 2**31 - 1,
            "inputs": {
                name: {"data_type": "TYPE_INT32", "dims": [16], "zero_data": True}
                for name in ("INPUT0", "INPUT1")
            },
        }
    ],
}


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    make_examples(tmp_path)
    return tmp_path


@pytest.fixture
def created(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Every executor the builder creates."""
    executors: list[Any] = []
    create = builder_module.create_executors  # type: ignore[attr-defined]

    def recording(*args: Any, **kwargs: Any) -> Any:
        made = create(*args, **kwargs)
        executors.extend(made)
        return made

    monkeypatch.setattr(builder_module, "create_executors", recording)
    return executors


class RunRecorder:
    """warmup.py's logger, recording the "warm-up run" record it writes as each run begins."""

    def __init__(self, log: Any) -> None:
        self.runs: list[dict[str, Any]] = []
        self._log = log

    def debug(self, event: str, **fields: Any) -> None:
        if event == "warm-up run":
            self.runs.append(fields)
        self._log.debug(event, **fields)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._log, name)


@pytest.fixture
def warm_up_runs(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """The warm-up runs begun, as warmup.py records them (model, sample, run)."""
    recorder = RunRecorder(warmup_module.log)
    monkeypatch.setattr(warmup_module, "log", recorder)
    return recorder.runs


def registry_for(root: Path) -> ModelRegistry:
    return ModelRegistry(
        ModelRepository(root),
        CompletionDispatcher(asyncio.get_running_loop()),
        HostBufferPool(1 << 24),
        default_max_batch_size=4,
        onnxruntime_options=OnnxRuntimeOptions(1, 1),
    )


def holds_a_session(executor: object) -> bool:
    return hasattr(executor, "core_session") or hasattr(executor, "_session")


async def warming_up(created: list[Any], runs: list[dict[str, Any]]) -> None:
    """Waits until simple's endless warm-up runs on an executor the load created."""
    deadline = time.monotonic() + 30
    while not created or not any(run["model"] == "simple" for run in runs):
        assert time.monotonic() < deadline, "the load never began its warm-up"
        await asyncio.sleep(0.05)  # the poll's period


def states(registry: ModelRegistry, name: str) -> list[tuple[str, ModelState, str]]:
    return [(s.version, s.state, s.reason) for s in registry.index() if s.name == name]


async def test_a_cancelled_load_rolls_back_and_frees_what_it_built(
    repository: Path, created: list[Any], warm_up_runs: list[dict[str, Any]]
) -> None:
    registry = registry_for(repository)
    await registry.load("mlp")
    readiness: list[bool] = []
    registry.add_listener(lambda: readiness.append(registry.all_ready()))
    before = states(registry, "simple")
    assert registry.all_ready() and before == [("", ModelState.UNAVAILABLE, "not loaded")]
    load = asyncio.ensure_future(
        registry.load("simple", parse_config_json(json.dumps(ENDLESS_WARMUP), "test"))
    )
    await warming_up(created, warm_up_runs)
    assert states(registry, "simple") == [("", ModelState.LOADING, "")]
    assert registry.all_ready()  # a model joins the ones that should serve once it loads
    started = time.monotonic()
    load.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(load, 30)
    assert time.monotonic() - started < 10  # the warm-up stopped at its next run
    assert states(registry, "simple") == before
    assert registry.all_ready()
    assert readiness[-1] is True  # listeners (health, the core's snapshot) saw it come back
    simple_executors = [e for e in created if e not in registry.get("mlp").scheduler.executors]
    assert simple_executors and not any(holds_a_session(e) for e in simple_executors)
    with pytest.raises(NotFound):
        registry.get("simple")
    # And the model still loads afterwards.
    await registry.load("simple")
    assert registry.ready_versions("simple") == [1]
    await registry.close()


async def test_a_failed_load_of_a_new_model_leaves_the_server_ready(repository: Path) -> None:
    registry = registry_for(repository)
    await registry.load("mlp")
    with pytest.raises(ModelLoadError):
        await registry.load("simple", parse_config_json('{"max_batch_size": -3}', "test"))
    assert registry.all_ready()
    [(version, state, reason)] = states(registry, "simple")
    assert (version, state) == ("", ModelState.UNAVAILABLE) and reason
    await registry.close()


async def test_shutdown_abandons_a_load_in_warm_up(
    repository: Path, created: list[Any], warm_up_runs: list[dict[str, Any]]
) -> None:
    registry = registry_for(repository)
    load = asyncio.ensure_future(
        registry.load("simple", parse_config_json(json.dumps(ENDLESS_WARMUP), "test"))
    )
    await warming_up(created, warm_up_runs)
    registry.abandon_loads()
    with pytest.raises(Unavailable, match="shutting down"):
        await asyncio.wait_for(load, 30)
    assert created and not any(holds_a_session(e) for e in created)
    assert states(registry, "simple") == [("", ModelState.UNAVAILABLE, "not loaded")]
    await registry.close()


async def test_unloading_unknown_names_keeps_nothing(repository: Path) -> None:
    registry = registry_for(repository)
    await registry.load("mlp")

    def sizes() -> dict[str, int]:
        return {k: len(v) for k, v in vars(registry).items() if isinstance(v, dict | set | list)}

    kept = sizes()
    for i in range(1000):
        with pytest.raises(NotFound):
            await registry.unload(f"nothing-{i}")
    assert sizes() == kept
    await registry.close()
