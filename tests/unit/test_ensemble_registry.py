"""Ensembles in the registry, in-process: they load after (and with) the models they compose,
run through the data plane's Python path with each step's timing, are not ready while a
composing model is not served, and refuse at load what the core does not run."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

import inferd._proto.grpc_service_pb2 as pb
from inferd.core import CompletionDispatcher, CoreTiming, EnsembleScheduler, HostBufferPool
from inferd.dataplane import DataPlane
from inferd.errors import ModelLoadError, Unavailable
from inferd.executors import OnnxRuntimeOptions
from inferd.models import ModelRegistry, ModelState
from inferd.repository import ModelRepository
from tests.integration.ensemble_models import (
    CHAIN,
    FP32_ROW,
    ensemble_config,
    write_base,
    write_ensemble,
)


def step(model: str, inputs: dict[str, str], outputs: dict[str, str]) -> str:
    maps = [f'input_map {{ key: "{k}" value: "{v}" }}' for k, v in inputs.items()]
    maps += [f'output_map {{ key: "{k}" value: "{v}" }}' for k, v in outputs.items()]
    return f'{{ model_name: "{model}" model_version: -1 {" ".join(maps)} }}'


def registry_for(root: Path) -> ModelRegistry:
    return ModelRegistry(
        ModelRepository(root),
        CompletionDispatcher(asyncio.get_running_loop()),
        HostBufferPool(1 << 24),
        default_max_batch_size=4,
        onnxruntime_options=OnnxRuntimeOptions(1, 1),
    )


def chain_request(x: np.ndarray) -> bytes:
    request = pb.ModelInferRequest(model_name="chain", id="r-7")
    request.inputs.add(name="IN", datatype="FP32", shape=list(x.shape))
    request.raw_input_contents.append(x.astype(np.float32).tobytes())
    return request.SerializeToString()


class Timings:
    """Records what the data plane tells an observer."""

    def __init__(self) -> None:
        self.models: list[tuple[str, str]] = []
        self.timings: list[CoreTiming] = []

    def resolved(self, model: str, version: str) -> None:
        self.models.append((model, version))

    def computed(self, timing: CoreTiming) -> None:
        self.timings.append(timing)


async def test_an_ensemble_runs_through_the_python_path_with_each_steps_timing(
    tmp_path: Path,
) -> None:
    write_base(tmp_path)
    registry = registry_for(tmp_path)
    try:
        await asyncio.get_running_loop().run_in_executor(None, registry.load_all)
        chain = registry.get("chain")
        assert isinstance(chain.scheduler, EnsembleScheduler)
        assert chain.composing == (("pre", -1), ("left", -1), ("right", -1))
        plane = DataPlane(registry)
        x = np.arange(8, dtype=np.float32).reshape(2, 4)
        observed = Timings()
        answer = pb.ModelInferResponse.FromString(
            await plane.infer(plane.parse(chain_request(x)), observed=observed)
        )
        assert answer.model_name == "chain" and answer.id == "r-7"
        out = np.frombuffer(answer.raw_output_contents[0], dtype=np.float32).reshape(2, 4)
        np.testing.assert_allclose(out, ((x + 1) * 2) ** 2)
        assert observed.models == [("chain", "1")]
        (timing,) = observed.timings
        assert [(s.step, s.model, s.version) for s in timing.steps] == [
            (0, "pre", 1),
            (1, "left", 1),
            (2, "right", 1),
        ]
        for step in timing.steps:
            assert timing.enqueued <= step.submitted <= step.answered <= timing.compute_end
            assert step.timing.batch_id > 0
        # Triton's ensemble statistics: one execution per request, its rows as inferences.
        stats = chain.scheduler.statistics()
        assert (stats.execution_count, stats.inference_count, stats.success.count) == (1, 2, 1)
        assert [s.success.count for s in chain.scheduler.step_statistics()] == [1, 1, 1]
        assert registry.get("pre").scheduler.statistics().inference_count == 2
    finally:
        await registry.close()


async def test_an_ensemble_is_not_ready_while_a_composing_model_is_not_served(
    tmp_path: Path,
) -> None:
    write_base(tmp_path)
    registry = registry_for(tmp_path)
    try:
        await asyncio.get_running_loop().run_in_executor(None, registry.load_all)
        assert {"chain", "diamond"} <= set(registry.ready_models()) and registry.server_ready()
        await registry.unload("left")
        for name in ("chain", "diamond"):
            with pytest.raises(Unavailable, match="composing model 'left'"):
                registry.get(name)
            assert registry.ready_versions(name) == []
        assert not {"chain", "diamond"} & set(registry.ready_models())
        states = {(s.name, s.version): s for s in registry.index()}
        assert states[("chain", "1")].state is ModelState.UNAVAILABLE
        assert "composing model 'left'" in states[("chain", "1")].reason
        assert not registry.server_ready()  # strict readiness: chain should serve and does not
        await registry.load("left")
        assert registry.get("chain").version == 1
        assert {(s.name, s.state) for s in registry.index() if s.name == "chain"} == {
            ("chain", ModelState.READY)
        }
        assert registry.server_ready()
    finally:
        await registry.close()


async def test_loading_an_ensemble_loads_the_models_it_composes(tmp_path: Path) -> None:
    write_base(tmp_path)
    registry = registry_for(tmp_path)
    try:
        await registry.load("chain")
        assert sorted(registry.ready_models()) == ["chain", "left", "pre", "right"]
    finally:
        await registry.close()


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            ensemble_config(
                "outer",
                {"IN": FP32_ROW},
                {"OUT": FP32_ROW},
                [step("chain", {"IN": "IN"}, {"OUT": "OUT"})],
            ),
            "step[0] (model 'chain'): the model is an ensemble; ensembles of ensembles are not "
            "served",
        ),
        (
            ensemble_config(
                "outer",
                {"IN": "TYPE_FP32 [ -1, 4 ]"},
                {"OUT": "TYPE_FP32 [ -1, 4 ]"},
                [step("pre", {"RAW": "IN"}, {"PRE": "OUT"})],
                max_batch_size=0,
            ),
            "the model batches (max_batch_size 8) and the ensemble does not",
        ),
        (
            CHAIN.replace('name: "chain"', 'name: "outer"').replace(
                "ensemble_scheduling",
                "instance_group [ { count: 2 kind: KIND_CPU } ]\nensemble_scheduling",
            ),
            "an ensemble sets no instance_group of its own",
        ),
        (CHAIN, "config.pbtxt names the model 'chain'; the name must match the folder"),
    ],
)
async def test_what_the_core_does_not_run_is_refused_at_load(
    tmp_path: Path, config: str, message: str
) -> None:
    write_base(tmp_path)
    write_ensemble(tmp_path / "outer", config)
    registry = registry_for(tmp_path)
    try:
        await asyncio.get_running_loop().run_in_executor(None, registry.load_all)
        with pytest.raises(ModelLoadError) as refused:
            await registry.load("outer")
        assert message in str(refused.value), str(refused.value)
        assert "outer" not in registry.ready_models()
    finally:
        await registry.close()
