"""Which model versions are loaded, and the loading itself.

For now every model of the repository loads at start (Triton's ``--model-control-mode none``) and
stays until shutdown; each version gets its own executors and core scheduler.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any

import structlog

from inferd.batching import CompletionDispatcher, HostBufferPool, ModelScheduler
from inferd.datatypes import BY_CONFIG_TYPE, Datatype
from inferd.errors import InferdError, ModelLoadError, NotFound, Unavailable
from inferd.executors import Executor, OnnxRuntimeExecutor, OnnxRuntimeOptions
from inferd.models.warmup import warm_up, warmup_samples
from inferd.repository import ModelRepository, batching_policy, load_model_config

log = structlog.get_logger(__name__)


class ModelState(enum.Enum):
    """A version's place in its lifecycle, with the protocol's RepositoryIndex names."""

    LOADING = "LOADING"  # being read and its executors created; not served yet
    READY = "READY"  # serving requests
    UNAVAILABLE = "UNAVAILABLE"  # failed to load (reason says why) or unloaded


@dataclass(frozen=True)
class TensorSpec:
    """An input or output as the completed config declares it (dims exclude the batch dim)."""

    name: str
    datatype: Datatype
    dims: tuple[int, ...]


@dataclass
class LoadedModel:
    """One ready model version: its completed config, its tensors and its core scheduler."""

    name: str
    version: int
    config: Any  # model_config_pb2.ModelConfig
    inputs: list[TensorSpec]
    outputs: list[TensorSpec]
    scheduler: ModelScheduler

    @property
    def max_batch_size(self) -> int:
        return int(self.config.max_batch_size)


@dataclass(frozen=True)
class ModelStatus:
    name: str
    version: str  # "" when the failure came before any version was known
    state: ModelState
    reason: str = ""


def _specs(tensors: Any) -> list[TensorSpec]:
    return [TensorSpec(t.name, BY_CONFIG_TYPE[t.data_type], tuple(t.dims)) for t in tensors]


def _selected_versions(config: Any, available: list[int]) -> list[int]:
    policy = config.version_policy
    choice = policy.WhichOneof("policy_choice")
    if choice == "all":
        return available
    if choice == "specific":
        return [v for v in available if v in set(policy.specific.versions)]
    count = policy.latest.num_versions if choice == "latest" else 1
    return available[-max(count, 1) :]


class ModelRegistry:
    """The loaded versions of every model, by name. Used from the event loop's thread, except
    ``load_all``, which runs on a worker thread before the server starts serving."""

    def __init__(
        self,
        repository: ModelRepository,
        dispatcher: CompletionDispatcher,
        pool: HostBufferPool,
        *,
        default_max_batch_size: int,
        onnxruntime_options: OnnxRuntimeOptions,
    ) -> None:
        self._repository = repository
        self._dispatcher = dispatcher
        self._pool = pool
        self._default_max_batch_size = default_max_batch_size
        self._ort_options = onnxruntime_options
        self._models: dict[str, dict[int, LoadedModel]] = {}
        self._statuses: dict[tuple[str, str], ModelStatus] = {}

    def load_all(self) -> None:
        """Loads every model in the repository; a model that fails is recorded, not raised."""
        for name in self._repository.model_names():
            try:
                self._load_model(name)
            except InferdError as e:
                log.error("model load failed", model=name, reason=str(e))
                self._statuses[(name, "")] = ModelStatus(name, "", ModelState.UNAVAILABLE, str(e))

    def _load_model(self, name: str) -> None:
        available = self._repository.versions(name)
        if not available:
            raise ModelLoadError(f"model {name!r} has no numeric version folder")
        config_path = self._repository.config_path(name)
        # The newest version's model completes the config (Triton does the same).
        newest_file = self._repository.model_file(name, available[-1])
        config = load_model_config(
            name, config_path, newest_file, default_max_batch_size=self._default_max_batch_size
        )
        versions = _selected_versions(config, available)
        if not versions:
            raise ModelLoadError(f"model {name!r}: the version policy selects none of {available}")
        for version in versions:
            key = (name, str(version))
            self._statuses[key] = ModelStatus(name, str(version), ModelState.LOADING)
            try:
                loaded = self._load_version(name, version, config)
            except InferdError as e:
                log.error("model load failed", model=name, version=version, reason=str(e))
                self._statuses[key] = ModelStatus(
                    name, str(version), ModelState.UNAVAILABLE, str(e)
                )
                continue
            self._models.setdefault(name, {})[version] = loaded
            self._statuses[key] = ModelStatus(name, str(version), ModelState.READY)
            log.info(
                "model loaded",
                model=name,
                version=version,
                max_batch_size=loaded.max_batch_size,
                dynamic_batching=loaded.scheduler.policy.dynamic,
                instances=sum(g.count for g in config.instance_group),
            )

    def _load_version(self, name: str, version: int, config: Any) -> LoadedModel:
        model_file = self._repository.model_file(name, version, config.default_model_filename)
        policy = batching_policy(config)
        parameters = {k: v.string_value for k, v in config.parameters.items()}
        options = OnnxRuntimeOptions.from_parameters(parameters, self._ort_options)
        inputs, outputs = _specs(config.input), _specs(config.output)
        count = sum(g.count for g in config.instance_group)
        executors: list[Executor] = [
            OnnxRuntimeExecutor(
                model_file, [t.name for t in inputs], [t.name for t in outputs], options
            )
            for _ in range(count)
        ]
        # Before the version is ready: every instance runs the config's warm-up samples.
        warm_up(executors, warmup_samples(config, model_file.parent.parent), name)
        scheduler = ModelScheduler(
            self._dispatcher,
            self._pool,
            name,
            policy,
            executors,
            [t.datatype.config_type for t in outputs],
        )
        return LoadedModel(name, version, config, inputs, outputs, scheduler)

    def get(self, name: str, version: str = "") -> LoadedModel:
        """The ready version asked for, or the highest ready one when ``version`` is empty."""
        versions = self._models.get(name)
        if not versions:
            failed = self._statuses.get((name, ""))
            if failed is not None or any(k[0] == name for k in self._statuses):
                raise Unavailable(f"model {name!r} is not ready: {self._reason(name)}")
            raise NotFound(f"unknown model {name!r}")
        if not version:
            return versions[max(versions)]
        try:
            number = int(version)
        except ValueError:
            raise NotFound(f"model {name!r} has no version {version!r}") from None
        if number in versions:
            return versions[number]
        status = self._statuses.get((name, version))
        if status is not None:
            raise Unavailable(f"model {name!r} version {version} is not ready: {status.reason}")
        raise NotFound(f"model {name!r} has no version {version!r}")

    def _reason(self, name: str) -> str:
        reasons = [s.reason for k, s in self._statuses.items() if k[0] == name and s.reason]
        return "; ".join(reasons) or "not loaded"

    def ready_versions(self, name: str) -> list[int]:
        return sorted(self._models.get(name, {}))

    def loaded(self) -> list[LoadedModel]:
        return [m for versions in self._models.values() for m in versions.values()]

    def statuses(self) -> list[ModelStatus]:
        return sorted(self._statuses.values(), key=lambda s: (s.name, s.version))

    def all_ready(self) -> bool:
        """True when every model that should have loaded has (strict readiness)."""
        return all(s.state == ModelState.READY for s in self._statuses.values())

    async def close(self) -> None:
        """Drains and frees every loaded version."""
        for model in self.loaded():
            await model.scheduler.close()
            self._statuses[(model.name, str(model.version))] = ModelStatus(
                model.name, str(model.version), ModelState.UNAVAILABLE, "unloaded"
            )
        self._models.clear()
