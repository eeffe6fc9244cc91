"""Which model versions are loaded and in what state, and the transitions between states:
loading, reloading (a swap once the new versions are ready) and unloading (a drain).

Building a version (its config, executors, warm-up and scheduler) is ``inferd.models.builder``'s
business; what loads when is the model control mode's (``inferd.models.control``).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from inferd._proto.model_config_pb2 import ModelConfig
from inferd.core import (
    CompletionDispatcher,
    EnsembleScheduler,
    HostBufferPool,
    SchedulerDirectory,
    choose_weighted_version,
)
from inferd.errors import Cancelled, InferdError, NotFound, Unavailable
from inferd.executors import OnnxRuntimeOptions
from inferd.models.builder import LoadLimits, ModelVersionBuilder
from inferd.models.loaded import LoadedModel
from inferd.repository import ModelRepository, readiness_required, stated_readiness_required
from inferd.repository.version_weights import version_weights

if TYPE_CHECKING:
    from inferd.python_backend.bls import ModelCaller

log = structlog.get_logger(__name__)


class ModelState(enum.Enum):
    """A version's place in its lifecycle, with the protocol's RepositoryIndex names."""

    LOADING = "LOADING"  # being read and its executors created; not served yet
    READY = "READY"  # serving requests
    UNLOADING = "UNLOADING"  # admits nothing new; draining what it has queued
    UNAVAILABLE = "UNAVAILABLE"  # failed to load (reason says why) or unloaded


@dataclass(frozen=True)
class ModelStatus:
    name: str
    version: str  # "" when the failure came before any version was known
    state: ModelState
    reason: str = ""


@dataclass(frozen=True)
class ReadinessRules:
    """When the models make the server ready (ServerReady; health ``""`` and
    ``inference.GRPCInferenceService``), the server also accepting calls.

    ``strict`` (Triton's ``--strict-readiness``): every model that should serve and is required
    serves; a model whose config sets ``inferd.readiness`` to ``optional`` never holds it back.
    Otherwise the models' states do not matter. Either way a server with no model serving is not
    ready unless ``without_models``: a fleet replica with nothing to serve must get no traffic.
    """

    strict: bool = True
    without_models: bool = False


def _log_freed(model: LoadedModel) -> None:
    log.info(
        "model version freed",
        model=model.name,
        version=model.version,
        executors_closed=len(model.scheduler.executors),
    )


class ModelRegistry:
    """The loaded versions of every model, by name, and their loading and unloading.

    Used from the event loop's thread, except ``load_all``, which runs on a worker thread before
    the server serves. A (re)load builds the new versions beside the old ones and swaps them in
    only when all are ready; the old ones then drain (what they have queued is still computed)
    before they are freed, so no request is lost or failed by the change. A failed load, or one
    its caller cancels, leaves the model's states and readiness as they were before it, and frees
    what it built. ``abandon_loads`` (shutdown) stops every load in progress at its next step.
    """

    def __init__(
        self,
        repository: ModelRepository,
        dispatcher: CompletionDispatcher,
        pool: HostBufferPool,
        *,
        default_max_batch_size: int,
        onnxruntime_options: OnnxRuntimeOptions,
        engine_cache_dir: Path | None = None,
        limits: LoadLimits | None = None,
        abandon: threading.Event | None = None,
        readiness: ReadinessRules | None = None,
        drain_timeout_s: float | None = None,
    ) -> None:
        self._repository = repository
        # How long an unload (or the old versions of a reload) waits for a python model's
        # running batches before its workers are killed (None: as long as they take).
        self._drain_timeout_s = drain_timeout_s
        self._readiness = readiness or ReadinessRules()
        # Where ensembles' steps find the composing versions that serve now.
        self._directory = SchedulerDirectory()
        self._builder = ModelVersionBuilder(
            repository,
            dispatcher,
            pool,
            self._directory,
            default_max_batch_size=default_max_batch_size,
            onnxruntime_options=onnxruntime_options,
            engine_cache_dir=engine_cache_dir,
            limits=limits,
        )
        # Set once the server stops (``abandon_loads``, or by the owner of ``abandon``, a signal
        # handler): load_all and loads starting from then end at their next step.
        self._abandon = abandon or threading.Event()
        self._loading: set[threading.Event] = set()  # the abandon flags of loads in progress
        self._models: dict[str, dict[int, LoadedModel]] = {}
        # Each served model's positive version weights (inferd.version_weights; none: no entry).
        self._weights: dict[str, dict[int, int]] = {}
        self._statuses: dict[tuple[str, str], ModelStatus] = {}
        # Loaded models that cannot serve, with why: an ensemble's composing model is not
        # served, or a python model's instance restarts its worker (``_faults``).
        self._blocked: dict[str, str] = {}
        self._faults: dict[tuple[str, int], str] = {}  # (model, instance key) -> why
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wanted: set[str] = set()  # models that should be serving (strict readiness)
        self._optional: set[str] = set()  # of those, the ones that never hold readiness back
        self._locks: dict[str, asyncio.Lock] = {}
        # What other threads (the metrics endpoint) may read: replaced whole, never mutated.
        self._published: tuple[LoadedModel, ...] = ()
        self._listeners: list[Callable[[], None]] = []
        self._load_failure_listeners: list[Callable[[str], None]] = []

    def serve_python_models(self, caller: ModelCaller, loop: asyncio.AbstractEventLoop) -> None:
        """Python models built from now on call other models (BLS) through ``caller``, and
        their instances' worker restarts (reported on any thread) change readiness on ``loop``:
        the model is not ready while one of its instances restarts."""
        self._builder.model_caller = caller
        self._loop = loop
        self._builder.instance_health = self._instance_health

    def _instance_health(self, name: str, key: int, reason: str | None) -> None:
        loop = self._loop
        if loop is None:
            return
        with contextlib.suppress(RuntimeError):  # a closed loop: the server is gone
            loop.call_soon_threadsafe(self._set_instance_fault, name, key, reason)

    def _set_instance_fault(self, name: str, key: int, reason: str | None) -> None:
        if reason is None:
            if self._faults.pop((name, key), None) is None:
                return
        elif self._faults.get((name, key)) == reason:
            return
        else:
            self._faults[(name, key)] = reason
        log.info("model readiness", model=name, not_ready_because=reason)
        self._changed()

    def add_listener(self, listener: Callable[[], None]) -> None:
        """``listener`` is called (on the loop's thread) after every change of what serves."""
        self._listeners.append(listener)

    def add_load_failure_listener(self, listener: Callable[[str], None]) -> None:
        """``listener`` is called with the model's name each time a load of it fails (its
        config, or any version it selects); on ``load_all``'s worker thread or the loop's."""
        self._load_failure_listeners.append(listener)

    def _load_failed(self, name: str) -> None:
        for listener in self._load_failure_listeners:
            listener(name)

    def _changed(self) -> None:
        self._directory.publish(
            (m.name, m.version, m.scheduler)
            for m in self.loaded()
            if not isinstance(m.scheduler, EnsembleScheduler)
        )
        self._blocked = {
            name: reason for (name, _), reason in self._faults.items() if name in self._models
        }
        for name, versions in self._models.items():
            missing = (
                [
                    (model, version)
                    for model, version in next(iter(versions.values())).composing
                    if not self._serves(model, version)
                ]
                if versions
                else []
            )
            if missing:
                model, version = missing[0]
                which = "its latest version" if version < 0 else f"version {version}"
                self._blocked[name] = f"composing model {model!r} ({which}) is not ready"
        self._published = tuple(self.loaded())
        for listener in self._listeners:
            listener()

    def published(self) -> tuple[LoadedModel, ...]:
        """The loaded versions, as last published; safe to call from any thread."""
        return self._published

    def _serves(self, model: str, version: int) -> bool:
        """Whether a composing step's model version (-1: any) is loaded and not itself blocked."""
        versions = self._models.get(model)
        if not versions or model in self._blocked:
            return False
        return version < 0 or version in versions

    def _composing_configs(self) -> dict[str, dict[int, ModelConfig]]:
        """The served versions' completed configs, which an ensemble is checked against."""
        return {
            name: {v: m.config for v, m in versions.items()}
            for name, versions in self._models.items()
            if versions
        }

    def load_all(self, names: list[str] | None = None) -> None:
        """Loads ``names`` (default: every model in the repository) before serving starts; a
        model that fails is recorded, not raised. Ensembles load after the models they compose."""
        chosen = self._repository.model_names() if names is None else names
        # An ensemble named alone (--load-model) brings the models it composes, as Triton does.
        composed = [
            m for n in chosen for m in self._builder.composing_in_repository(n) if m not in chosen
        ]
        chosen = list(dict.fromkeys([*composed, *chosen]))
        ensembles = {n for n in chosen if self._builder.composing_models(n)}
        for name in [n for n in chosen if n not in ensembles] + [
            n for n in chosen if n in ensembles
        ]:
            if self._abandon.is_set():
                break  # stopping: what is left is not loaded
            self._wanted.add(name)
            try:
                built = self._builder.build(name, None, self._abandon, self._composing_configs())
            except Cancelled:
                break
            except InferdError as e:
                log.error("model load failed", model=name, reason=str(e))
                self._load_failed(name)
                self._mark_required(name, self._stated_required(name))
                self._statuses[(name, "")] = ModelStatus(name, "", ModelState.UNAVAILABLE, str(e))
                continue
            self._mark_required(name, _required(built))
            self._install(name, built)
        self._changed()
        if not self._readiness.without_models and not self.ready_models():
            log.warning(
                "no model serves: the server is not ready until one loads "
                "(--ready-without-models counts it ready)"
            )

    async def load(self, name: str, override: ModelConfig | None = None) -> None:
        """Loads or reloads ``name`` (``override``: a ModelConfig replacing config.pbtxt). If the
        caller is cancelled, the build is abandoned, what it built freed and the model's states
        put back before the CancelledError goes on."""
        self._repository.model_dir(name)  # refuses unsafe or unknown names first
        if self._abandon.is_set():
            raise Unavailable("the server is shutting down")
        # An ensemble loads the models it composes first, as Triton does (those already served
        # stay as they are).
        for composed in self._builder.composing_in_repository(name, override):
            # An ensemble composing another is refused by its own load (and two naming each
            # other must not recurse here).
            if composed not in self._models and not self._builder.composing_models(composed):
                await self.load(composed)
        async with self._locks.setdefault(name, asyncio.Lock()):
            # A model joins the ones that should serve (strict readiness) once it loads: a
            # client's load, until it succeeds, changes nothing of the server's readiness.
            was_wanted = name in self._wanted
            before = {k: s for k, s in self._statuses.items() if k[0] == name}
            serving = name in self._models
            if not serving:
                self._statuses[(name, "")] = ModelStatus(name, "", ModelState.LOADING)
                self._changed()  # the model's readiness and health follow the LOADING state
            try:
                built = await self._build(name, override)
            except InferdError as e:
                if self._abandon.is_set():  # the server is stopping: nothing failed
                    log.info("model load abandoned at shutdown", model=name, kept_serving=serving)
                    self._restore(name, was_wanted, before)
                    raise
                # The caller is told; the log keeps the reason. Not an error of the server's.
                log.warning("model load failed", model=name, reason=str(e), kept_serving=serving)
                self._load_failed(name)
                if not serving:
                    self._statuses[(name, "")] = ModelStatus(
                        name, "", ModelState.UNAVAILABLE, str(e)
                    )
                self._changed()
                raise
            except asyncio.CancelledError:
                log.info("model load cancelled by its caller", model=name, kept_serving=serving)
                self._restore(name, was_wanted, before)
                raise
            self._wanted.add(name)
            self._mark_required(name, _required(built))
            old = self._install(name, built)
            for model in old:
                await self._drain(model)  # its queued requests are still answered
                _log_freed(model)

    async def _build(self, name: str, override: ModelConfig | None) -> dict[int, LoadedModel]:
        """The builder's work on a worker thread. Cancelled, it tells the build to stop and waits
        for it (a thread cannot be interrupted: the step in progress ends first), frees what was
        built and raises CancelledError; so the caller's cancellation leaves nothing behind."""
        abandon = threading.Event()
        self._loading.add(abandon)
        if self._abandon.is_set():
            abandon.set()
        build = asyncio.get_running_loop().run_in_executor(
            None, self._builder.build, name, override, abandon, self._composing_configs()
        )
        cancelled = False
        try:
            while True:
                try:
                    built = await asyncio.shield(build)
                    break
                except asyncio.CancelledError:
                    cancelled = True
                    abandon.set()  # and wait again: the build ends at its next step
                except Cancelled:
                    if cancelled:
                        raise asyncio.CancelledError from None
                    raise Unavailable(
                        f"model {name!r}: not loaded, the server is shutting down"
                    ) from None
                except BaseException:
                    if cancelled:
                        raise asyncio.CancelledError from None
                    raise
        finally:
            self._loading.discard(abandon)
        if abandon.is_set():  # cancelled, or the server stopping, after the last step
            for model in built.values():
                model.scheduler.close_now()
            if cancelled:
                raise asyncio.CancelledError
            raise Unavailable(f"model {name!r}: not loaded, the server is shutting down")
        return built

    def _mark_required(self, name: str, required: bool) -> None:
        if required:
            self._optional.discard(name)
        else:
            self._optional.add(name)

    def _stated_required(self, name: str) -> bool:
        """Whether a model that failed to load holds readiness, from its config as written."""
        try:
            config_path = self._repository.config_path(name)
        except InferdError:
            return True  # an unknown or unsafe name given to --load-model: the safe side
        return stated_readiness_required(config_path)

    def _restore(
        self, name: str, was_wanted: bool, before: dict[tuple[str, str], ModelStatus]
    ) -> None:
        """Puts the model's states and wanted-ness back as they were before a load."""
        for key in [k for k in self._statuses if k[0] == name]:
            del self._statuses[key]
        self._statuses.update(before)
        if not was_wanted:
            self._wanted.discard(name)
        self._changed()

    def abandon_loads(self) -> None:
        """Shutdown: loads in progress stop at their next step (between sessions and warm-up
        runs), and no new load starts. Safe to call from any thread."""
        self._abandon.set()
        for load in list(self._loading):
            load.set()

    async def unload(self, name: str) -> None:
        """Stops admitting requests to ``name``, drains what it has queued, frees it."""
        if name not in self._models and not any(k[0] == name for k in self._statuses):
            # Checked before anything is made for the name: an unknown one leaves nothing behind.
            raise NotFound(f"model {name!r} is not loaded")
        async with self._locks.setdefault(name, asyncio.Lock()):
            versions = self._models.pop(name, {})
            self._weights.pop(name, None)
            if not versions and not any(k[0] == name for k in self._statuses):
                raise NotFound(f"model {name!r} is not loaded")
            self._wanted.discard(name)
            self._optional.discard(name)
            for version in versions:
                self._statuses[(name, str(version))] = ModelStatus(
                    name, str(version), ModelState.UNLOADING
                )
            self._changed()  # admits nothing new from here on
            for version, model in versions.items():
                await self._drain(model)
                _log_freed(model)
                self._statuses[(name, str(version))] = ModelStatus(
                    name, str(version), ModelState.UNAVAILABLE, "unloaded"
                )
            self._statuses.pop((name, ""), None)
            log.info("model unloaded", model=name, versions=sorted(versions))
            self._changed()

    async def _drain(self, model: LoadedModel) -> None:
        """Closes a version that no longer serves: its queued requests are answered; a python
        model's batch still running after the drain timeout has its worker killed (a hung
        execute must not hold the unload for good)."""
        if isinstance(model.scheduler, EnsembleScheduler):
            await model.scheduler.close()
        else:
            await model.scheduler.close(abort_after_s=self._drain_timeout_s)

    def _install(self, name: str, built: dict[int, LoadedModel]) -> list[LoadedModel]:
        """Makes ``built`` the served versions of ``name``; returns the versions it replaced.
        Synchronous, so no request sees a half-installed model."""
        old = list(self._models.get(name, {}).values())
        self._models[name] = built
        # Every version shares the model's config; the builder has checked its weights.
        weights = version_weights(next(iter(built.values())).config, sorted(built)) if built else {}
        if weights:
            self._weights[name] = weights
        else:
            self._weights.pop(name, None)
        for key in [k for k in self._statuses if k[0] == name]:
            del self._statuses[key]
        for version, model in built.items():
            self._statuses[(name, str(version))] = ModelStatus(name, str(version), ModelState.READY)
            if isinstance(model.scheduler, EnsembleScheduler):
                log.info(
                    "ensemble loaded",
                    model=name,
                    version=version,
                    max_batch_size=model.max_batch_size,
                    steps=[f"{m}:{v}" for m, v in model.composing],
                )
                continue
            log.info(
                "model loaded",
                model=name,
                version=version,
                max_batch_size=model.max_batch_size,
                dynamic_batching=model.scheduler.policy.dynamic,
                instances=len(model.scheduler.executors),
            )
        self._changed()
        return old

    def get(self, name: str, version: str = "") -> LoadedModel:
        """The ready version asked for, or the highest ready one when ``version`` is empty."""
        versions = self._models.get(name)
        if not versions:
            failed = self._statuses.get((name, ""))
            if failed is not None or any(k[0] == name for k in self._statuses):
                raise Unavailable(f"model {name!r} is not ready: {self._reason(name)}")
            raise NotFound(f"unknown model {name!r}")
        if name in self._blocked:
            kind = "ensemble" if next(iter(versions.values())).composing else "model"
            raise Unavailable(f"{kind} {name!r} is not ready: {self._blocked[name]}")
        if not version:
            return versions[max(versions)]
        return self._numbered(name, versions, version)

    def route(self, name: str, version: str, routing_key: str | None) -> LoadedModel:
        """The version an inference runs on: the one it names; else, for a model with version
        weights, a weighted choice among its ready weighted versions (by ``routing_key``'s hash
        when given, at random otherwise: the transport's own choice); else the highest ready."""
        weights = self.ready_weights(name)
        if version or name not in self._weights:
            return self.get(name, version)
        if not weights:
            raise Unavailable(
                f"model {name!r} is not ready: none of its weighted versions is ready"
            )
        chosen = list(weights)[choose_weighted_version(list(weights.values()), routing_key)]
        return self._models[name][chosen]

    def ready_weights(self, name: str) -> dict[int, int]:
        """The weights of ``name``'s ready weighted versions, by ascending version (empty: the
        model has no weights, or none of its weighted versions is ready)."""
        ready = {} if name in self._blocked else self._models.get(name, {})
        return {v: w for v, w in sorted(self._weights.get(name, {}).items()) if v in ready}

    def weighted(self, name: str) -> bool:
        """Whether ``name``'s config gives its versions traffic weights."""
        return name in self._weights

    def _numbered(self, name: str, versions: dict[int, LoadedModel], version: str) -> LoadedModel:
        number = version_number(version)
        if number is None:
            raise NotFound(f"model {name!r} has no version {version!r}")
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
        return [] if name in self._blocked else sorted(self._models.get(name, {}))

    def ready_models(self) -> list[str]:
        """Names of the models with at least one ready version."""
        return [
            name
            for name, versions in self._models.items()
            if versions and name not in self._blocked
        ]

    def known_models(self) -> list[str]:
        """Every model the registry has a state for: loaded, loading, failed or unloaded."""
        return sorted({*self._models, *(name for name, _ in self._statuses)})

    def loaded(self) -> list[LoadedModel]:
        return [m for versions in self._models.values() for m in versions.values()]

    def index(self) -> list[ModelStatus]:
        """Every model of the repository with its versions' states; one never loaded is
        UNAVAILABLE, "not loaded"."""
        known = {s.name for s in self._statuses.values()}
        never = [
            ModelStatus(name, "", ModelState.UNAVAILABLE, "not loaded")
            for name in self._repository.model_names()
            if name not in known
        ]
        statuses = [
            ModelStatus(s.name, s.version, ModelState.UNAVAILABLE, self._blocked[s.name])
            if s.name in self._blocked and s.state is ModelState.READY
            else s
            for s in self._statuses.values()
        ]
        return sorted([*statuses, *never], key=lambda s: (s.name, s.version))

    def all_ready(self) -> bool:
        """True when every required model that should be serving is (strict readiness)."""
        return all(
            name in self._models and name not in self._blocked
            for name in self._wanted - self._optional
        )

    def server_ready(self) -> bool:
        """Whether the models make the server ready, by the readiness rules."""
        if self._readiness.strict and not self.all_ready():
            return False
        return self._readiness.without_models or bool(self.ready_models())

    async def close(self, abort_after_s: float | None = None) -> None:
        """Drains and frees every loaded version; ``abort_after_s``: how long a python model's
        running batches may take before their workers are killed (the server's stop)."""
        for model in self.loaded():
            if isinstance(model.scheduler, EnsembleScheduler):
                await model.scheduler.close()
            else:
                await model.scheduler.close(abort_after_s=abort_after_s)
            self._statuses[(model.name, str(model.version))] = ModelStatus(
                model.name, str(model.version), ModelState.UNAVAILABLE, "unloaded"
            )
        self._models.clear()
        self._weights.clear()
        self._changed()


def _required(built: dict[int, LoadedModel]) -> bool:
    """Whether a model just built holds readiness (every version shares the model's config)."""
    return readiness_required(next(iter(built.values())).config)


def version_number(text: str) -> int | None:
    """The version a request names, written as the server writes it (a canonical decimal: no
    sign, spaces, underscores, leading zeros or non-ASCII digits, all of which ``int`` takes);
    None otherwise, so that " 1" or "0_1" is no name of version 1."""
    if not text.isascii() or not text.isdigit() or (len(text) > 1 and text[0] == "0"):
        return None
    if len(text) > 19:  # more than any version folder (and int() refuses 4,300 digits and more)
        return None
    return int(text)
