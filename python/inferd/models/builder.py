"""Building a model's versions from the repository: its config completed, the versions its
version policy selects, each with its executors (one per instance), warmed up, and its core
scheduler. Nothing here is installed or served: that is ``inferd.models.registry``'s business."""

from __future__ import annotations

import dataclasses
import itertools
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from inferd._proto.model_config_pb2 import ModelConfig, ModelInput, ModelOutput
from inferd.core import (
    CompletionDispatcher,
    CoreEnsembleStep,
    EnsembleScheduler,
    HostBufferPool,
    ModelScheduler,
    SchedulerDirectory,
    SequenceStateMemory,
    core_signature,
    cuda_device_count,
    cuda_runtime_description,
)
from inferd.datatypes import BY_CONFIG_TYPE
from inferd.errors import Cancelled, InferdError, ModelLoadError
from inferd.executors import OnnxRuntimeOptions
from inferd.executors.onnxruntime import graph_optimization_level
from inferd.executors.selection import create_executors
from inferd.models.loaded import LoadedModel, TensorSpec
from inferd.models.warmup import WarmupLimits, warm_up, warmup_samples
from inferd.repository import (
    ModelRepository,
    batcher_options,
    control_inputs,
    gpu_accelerator,
    implicit_states,
    instance_placements,
    load_model_config,
    model_filename,
    model_output_types,
    sequence_options,
    sequence_state_memory,
    stated_config,
)
from inferd.repository.config import ENSEMBLE_PLATFORM, PYTHON_BACKEND
from inferd.repository.ensemble import EnsemblePlan, check_ensemble_config, plan_ensemble
from inferd.repository.layout import without_model_dir
from inferd.repository.version_weights import version_weights

if TYPE_CHECKING:
    from inferd.core import ModelCalls, ResponseCache
    from inferd.executors.python_backend import InstanceHealth
    from inferd.python_backend.bls import ModelCaller

log = structlog.get_logger(__name__)


def default_engine_cache_dir() -> Path:
    """Where TensorRT engines built at load time are kept: $XDG_CACHE_HOME/inferd/engines."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "inferd" / "engines"


@dataclass(frozen=True)
class LoadLimits:
    """What building one version may cost (a config or a load request's override asking for
    more is refused before anything is built). ``None``: no limit."""

    max_instance_count: int | None = None  # executor instances per version (--max-instance-count)
    warmup: WarmupLimits = field(default_factory=WarmupLimits)


def _specs(tensors: Iterable[ModelInput] | Iterable[ModelOutput]) -> list[TensorSpec]:
    return [
        TensorSpec(
            t.name,
            BY_CONFIG_TYPE[t.data_type],
            tuple(t.dims),
            tuple(t.reshape.shape) if t.HasField("reshape") else None,
            bool(getattr(t, "optional", False)),  # outputs have no such field
        )
        for t in tensors
    ]


def _selected_versions(config: ModelConfig, available: list[int]) -> list[int]:
    policy = config.version_policy
    choice = policy.WhichOneof("policy_choice")
    if choice == "all":
        return available
    if choice == "specific":
        return [v for v in available if v in set(policy.specific.versions)]
    count = policy.latest.num_versions if choice == "latest" else 1
    return available[-max(count, 1) :]


class ModelVersionBuilder:
    """Builds the versions of a repository's models, ready to serve but not installed. Blocking
    (config reading, sessions, warm-up): called on a worker thread."""

    def __init__(
        self,
        repository: ModelRepository,
        dispatcher: CompletionDispatcher,
        pool: HostBufferPool,
        directory: SchedulerDirectory,
        *,
        default_max_batch_size: int,
        onnxruntime_options: OnnxRuntimeOptions,
        engine_cache_dir: Path | None = None,
        limits: LoadLimits | None = None,
        state_memory: SequenceStateMemory | None = None,
        response_cache: ResponseCache | None = None,
    ) -> None:
        self._limits = limits or LoadLimits()
        # The server's response cache (--cache-config), for models with response_cache.
        self._response_cache = response_cache
        # The bound every stateful model's sequences share (--max-sequence-state-bytes).
        self.state_memory = state_memory if state_memory is not None else sequence_state_memory()
        self._repository = repository
        self._dispatcher = dispatcher
        self._pool = pool
        self._directory = directory
        self._default_max_batch_size = default_max_batch_size
        self._ort_options = onnxruntime_options
        self._engine_cache_dir = engine_cache_dir or default_engine_cache_dir()
        # Runs python models' calls to other models (BLS); set by the server once its data
        # plane exists (None: such calls answer UNAVAILABLE).
        self.model_caller: ModelCaller | None = None
        # The core's router of the same calls (BLS on a worker's ring): model_caller takes what
        # it has no route for.
        self.model_calls: ModelCalls | None = None
        # Told (model name, instance key, why it cannot serve or None) when a python model's
        # instance restarts its worker; keys are unique per instance built.
        self.instance_health: Callable[[str, int, str | None], None] | None = None
        self._instance_keys = itertools.count(1)

    def composing_models(self, name: str, override: ModelConfig | None = None) -> list[str]:
        """The models an ensemble's steps run, as its config states them (none for a model
        that is not an ensemble, or whose config cannot be read: its load says why)."""
        try:
            stated = stated_config(self._repository.config_path(name), override, name=name)
        except InferdError:
            return []
        if stated.platform != ENSEMBLE_PLATFORM:
            return []
        return list(dict.fromkeys(s.model_name for s in stated.ensemble_scheduling.step))

    def composing_in_repository(self, name: str, override: ModelConfig | None = None) -> list[str]:
        """The models an ensemble composes that the repository has, which load before it (one
        it lacks is left to the ensemble's own load, which names its step)."""
        composing = self.composing_models(name, override)
        present = set(self._repository.model_names()) if composing else set()
        return [m for m in composing if m in present and m != name]

    def build(
        self,
        name: str,
        override: ModelConfig | None,
        abandon: threading.Event | None = None,
        composing: Mapping[str, Mapping[int, ModelConfig]] | None = None,
    ) -> dict[int, LoadedModel]:
        """Builds every version the policy selects, warmed up (``override``: a ModelConfig
        replacing config.pbtxt). Raises (after freeing what it built) if any version fails, and
        Cancelled once ``abandon`` is set (checked between steps and warm-up runs: a session
        being created or a run in progress is not interrupted). ``composing``: the served
        models' versions and completed configs, which an ensemble's steps are checked against."""
        abandon = abandon or threading.Event()
        available = self._repository.versions(name)
        if not available:
            raise ModelLoadError(f"model {name!r} has no numeric version folder")
        config_path = self._repository.config_path(name)
        # The newest version's model completes the config (Triton does the same).
        stated = stated_config(config_path, override, name=name)
        if stated.platform == ENSEMBLE_PLATFORM:
            return self._build_ensemble(name, stated, available, composing or {})
        newest_file = self._repository.model_file(name, available[-1], model_filename(stated))
        config = load_model_config(
            name,
            config_path,
            newest_file,
            default_max_batch_size=self._default_max_batch_size,
            override=override,
            gpu_count=cuda_device_count(),
        )
        versions = _selected_versions(config, available)
        if not versions:
            raise ModelLoadError(f"model {name!r}: the version policy selects none of {available}")
        version_weights(config, versions)  # refused here, before any version is built
        built: dict[int, LoadedModel] = {}
        try:
            for version in versions:
                if abandon.is_set():
                    raise Cancelled(f"model {name!r}: the load was abandoned")
                try:
                    built[version] = self._build_version(name, version, config, abandon)
                except InferdError:
                    raise
                except Exception as e:  # a model file or library surprise: a failed load
                    log.exception("unexpected error while loading", model=name, version=version)
                    # The client's message names files relative to the model's folder (no checks
                    # here: the file may be what went wrong).
                    model_dir = self._repository.model_dir(name)
                    version_file = model_dir / str(version) / model_filename(config)
                    reason = without_model_dir(str(e), version_file)
                    raise ModelLoadError(
                        f"model {name!r} version {version}: {type(e).__name__}: {reason}"
                    ) from e
        except BaseException:
            for model in built.values():
                model.scheduler.close_now()
            raise
        return built

    def _build_version(
        self, name: str, version: int, config: ModelConfig, abandon: threading.Event
    ) -> LoadedModel:
        model_file = self._repository.model_file(name, version, model_filename(config))
        batching = batcher_options(config)
        sequence = sequence_options(config, model_file.parent.parent, self.state_memory)
        parameters = {k: v.string_value for k, v in config.parameters.items()}
        options = dataclasses.replace(
            OnnxRuntimeOptions.from_parameters(parameters, self._ort_options),
            graph_optimization_level=graph_optimization_level(config.optimization.graph.level),
        )
        inputs, outputs = _specs(config.input), _specs(config.output)
        placements = instance_placements(
            config,
            cuda_device_count(),
            cuda_runtime_description(),
            max_instances=self._limits.max_instance_count,
        )
        accelerator = gpu_accelerator(config)
        warmup = self._limits.warmup
        samples = warmup_samples(config, model_file.parent.parent, warmup)  # checked before
        executors = create_executors(
            config,
            model_file,
            placements,
            accelerator,
            options,
            self._pool,
            self._engine_cache_dir,
            self.model_caller,
            self._health_callbacks(name),
            abandon,
            self.model_calls,
        )
        try:
            # Before the version is ready: every instance runs the config's warm-up samples.
            warm_up(executors, samples, name, timeout_s=warmup.timeout_s, abandon=abandon)
        except BaseException:
            for executor in executors:
                executor.close()
            raise
        scheduler = ModelScheduler(
            self._dispatcher,
            self._pool,
            core_signature(
                name,
                str(version),
                int(config.max_batch_size),
                inputs,
                outputs,
                decoupled=config.model_transaction_policy.decoupled,
                # A python model reads its requests' parameters and takes BYTES as any bytes.
                keeps_parameters=config.backend == PYTHON_BACKEND,
                bytes_are_text=config.backend != PYTHON_BACKEND,
                core_inputs=[*control_inputs(config), *implicit_states(config)],
                sequence_batching=sequence is not None,
            ),
            batching,
            executors,
            model_output_types(config),  # with the states' the config does not list
            sequence,
            self._cache_for(config),
        )
        return LoadedModel(name, version, config, inputs, outputs, scheduler)

    def _cache_for(self, config: ModelConfig) -> ResponseCache | None:
        """The response cache a model's answers are kept in: the server's, when its config
        enables response_cache (config.py refused it where answers cannot be cached)."""
        if not config.response_cache.enable:
            return None
        if self._response_cache is None:
            # Triton loads such a model and serves it uncached too.
            log.warning(
                "response_cache is enabled but the server has no cache: answers are not cached",
                model=config.name,
                flag="--cache-config local,size=BYTES",
            )
        return self._response_cache

    def _health_callbacks(self, name: str) -> Callable[[], InstanceHealth] | None:
        """A factory of one health callback per instance of model ``name``."""
        listener = self.instance_health
        if listener is None:
            return None

        def callback() -> InstanceHealth:
            key = next(self._instance_keys)
            return lambda reason: listener(name, key, reason)

        return callback

    def _build_ensemble(
        self,
        name: str,
        config: ModelConfig,
        available: list[int],
        composing: Mapping[str, Mapping[int, ModelConfig]],
    ) -> dict[int, LoadedModel]:
        """An ensemble's versions: its config checked, its steps checked against the composing
        models' served configs (``plan_ensemble``), one core EnsembleScheduler per version."""
        check_ensemble_config(name, config)
        config.name = name
        plan = plan_ensemble(config, composing)
        steps = _core_steps(name, config, plan, composing)
        versions = _selected_versions(config, available)
        if not versions:
            raise ModelLoadError(f"model {name!r}: the version policy selects none of {available}")
        version_weights(config, versions)
        inputs, outputs = _specs(config.input), _specs(config.output)
        built: dict[int, LoadedModel] = {}
        for version in versions:
            scheduler = EnsembleScheduler(
                self._dispatcher,
                self._directory,
                # Never decoupled: check_ensemble_config refuses a decoupled ensemble.
                core_signature(name, str(version), int(config.max_batch_size), inputs, outputs),
                inputs,
                outputs,
                steps,
                int(config.max_batch_size),
                self._cache_for(config),
            )
            composed = tuple((s.model, s.version) for s in steps)
            built[version] = LoadedModel(
                name, version, config, inputs, outputs, scheduler, composing=composed
            )
        return built


def _core_steps(
    name: str,
    config: ModelConfig,
    plan: EnsemblePlan,
    composing: Mapping[str, Mapping[int, ModelConfig]],
) -> list[CoreEnsembleStep]:
    """The plan's steps as the core runs them, in the config's order (so that messages name a
    step by its index there): every input of the composing model in its input order, outputs by
    their index in the model's outputs. The version stays as configured: -1 finds the latest
    served version at each request, so a model reloaded with a new version is used."""
    planned = {step.index: step for step in plan.steps}
    steps: list[CoreEnsembleStep] = []
    for index, stated in enumerate(config.ensemble_scheduling.step):
        step = planned[index]
        model = composing[step.model_name][step.model_version]
        where = f"ensemble {name!r} step[{index}] (model {step.model_name!r})"
        if model.platform == ENSEMBLE_PLATFORM:
            raise ModelLoadError(
                f"{where}: the model is an ensemble; ensembles of ensembles are not served"
            )
        if config.max_batch_size == 0 and model.max_batch_size > 0:
            raise ModelLoadError(
                f"{where}: the model batches (max_batch_size {model.max_batch_size}) and the "
                "ensemble does not (max_batch_size 0); give the ensemble a max_batch_size"
            )
        feeds = {b.model_tensor: b.ensemble_tensor for b in step.inputs}
        unfed = [i.name for i in model.input if i.name not in feeds]
        if unfed:
            raise ModelLoadError(
                f"{where}: input_map leaves the model's optional input {unfed[0]!r} unfed; "
                "an ensemble step feeds every input of its model"
            )
        output_index = {o.name: i for i, o in enumerate(model.output)}
        steps.append(
            CoreEnsembleStep(
                model=step.model_name,
                version=int(stated.model_version),
                inputs=tuple((i.name, feeds[i.name]) for i in model.input),
                outputs=tuple(
                    (output_index[b.model_tensor], b.model_tensor, b.ensemble_tensor)
                    for b in step.outputs
                ),
            )
        )
    return steps
