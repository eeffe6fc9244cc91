"""The transitions of model versions between states: loading, reloading (a swap once the new
versions are ready) and unloading (a drain), and the health of python models' instances.

What serves now, and how a request finds its version, is ``inferd.models.serving``'s (the
registry changes it and answers for it). Building a version (its config, executors, warm-up and
scheduler) is ``inferd.models.builder``'s business; what loads when is the model control mode's
(``inferd.models.control``).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import structlog

from inferd._proto.model_config_pb2 import ModelConfig
from inferd.core import (
    CompletionDispatcher,
    EnsembleScheduler,
    HostBufferPool,
    ResponseCache,
    SchedulerDirectory,
    SequenceStateMemory,
)
from inferd.errors import Cancelled, InferdError, NotFound, Unavailable
from inferd.executors import OnnxRuntimeOptions
from inferd.models.builder import LoadLimits, ModelVersionBuilder
from inferd.models.loaded import LoadedModel
from inferd.models.serving import (
    ModelState,
    ModelStatus,
    ReadinessRules,
    ServedModels,
    StatusKey,
    required,
)
from inferd.repository import ModelRepository, stated_readiness_required

if TYPE_CHECKING:
    from inferd.core import ModelCalls
    from inferd.python_backend.bls import ModelCaller

# The states and readiness rules are ``serving``'s; their callers import them from here too.
__all__ = ["ModelRegistry", "ModelState", "ModelStatus", "ReadinessRules"]

log = structlog.get_logger(__name__)


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
        state_memory: SequenceStateMemory | None = None,
        response_cache: ResponseCache | None = None,
    ) -> None:
        self._repository = repository
        # How long an unload (or the old versions of a reload) waits for a python model's
        # running batches before its workers are killed (None: as long as they take).
        self._drain_timeout_s = drain_timeout_s
        self._served = ServedModels(readiness)
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
            state_memory=state_memory,
            response_cache=response_cache,
        )
        # Set once the server stops (``abandon_loads``, or by the owner of ``abandon``, a signal
        # handler): load_all and loads starting from then end at their next step.
        self._abandon = abandon or threading.Event()
        self._loading: set[threading.Event] = set()  # the abandon flags of loads in progress
        # Python models' instances restarting their worker: (model, instance key) -> why.
        self._faults: dict[tuple[str, int], str] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._locks: dict[str, asyncio.Lock] = {}
        self._listeners: list[Callable[[], None]] = []
        # Wait until no call can still submit to a version the last publish stopped routing to.
        self._settlers: list[Callable[[], object]] = []
        self._load_failure_listeners: list[Callable[[str], None]] = []

    def serve_python_models(
        self,
        caller: ModelCaller,
        loop: asyncio.AbstractEventLoop,
        calls: ModelCalls | None = None,
    ) -> None:
        """Python models built from now on call other models (BLS) through ``calls``, the
        core's router, and ``caller`` for what it has no route for; their instances' worker
        restarts (reported on any thread) change readiness on ``loop``: the model is not ready
        while one of its instances restarts."""
        self._builder.model_caller = caller
        self._builder.model_calls = calls
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

    def add_settler(self, settle: Callable[[], object]) -> None:
        """``settle()`` blocks until no request can still reach a version the serving state no
        longer routes to (a transport that routes by snapshots); a replaced or unloaded version
        is closed only after it, so that a reload under traffic loses no request."""
        self._settlers.append(settle)

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
            for m in self._served.loaded()
            if not isinstance(m.scheduler, EnsembleScheduler)
        )
        self._served.refresh(self._faults)
        for listener in self._listeners:
            listener()

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
            # Wanted from the start of its build: until it loads, it holds readiness back.
            self._served.want(name, True)
            try:
                built = self._builder.build(
                    name, None, self._abandon, self._served.composing_configs()
                )
            except Cancelled:
                break
            except InferdError as e:
                log.error("model load failed", model=name, reason=str(e))
                self._load_failed(name)
                self._served.want(name, self._stated_required(name))
                self._served.set_status(name, "", ModelState.UNAVAILABLE, str(e))
                continue
            self._served.want(name, required(built))
            self._install(name, built)
        self._changed()
        if not self._served.readiness.without_models and not self._served.ready_models():
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
            if not self._served.installed(composed) and not self._builder.composing_models(
                composed
            ):
                await self.load(composed)
        async with self._locks.setdefault(name, asyncio.Lock()):
            await self._load_locked(name, override)

    async def _load_locked(self, name: str, override: ModelConfig | None) -> None:
        """``load``'s work, holding the model's lock."""
        # A model joins the ones that should serve (strict readiness) once it loads: a
        # client's load, until it succeeds, changes nothing of the server's readiness.
        was_wanted = self._served.wanted(name)
        before = self._served.statuses_of(name)
        serving = self._served.installed(name)
        if not serving:
            self._served.set_status(name, "", ModelState.LOADING)
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
                self._served.set_status(name, "", ModelState.UNAVAILABLE, str(e))
            self._changed()
            raise
        except asyncio.CancelledError:
            log.info("model load cancelled by its caller", model=name, kept_serving=serving)
            self._restore(name, was_wanted, before)
            raise
        self._served.want(name, required(built))
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
            None, self._builder.build, name, override, abandon, self._served.composing_configs()
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

    def _stated_required(self, name: str) -> bool:
        """Whether a model that failed to load holds readiness, from its config as written."""
        try:
            config_path = self._repository.config_path(name)
        except InferdError:
            return True  # an unknown or unsafe name given to --load-model: the safe side
        return stated_readiness_required(config_path)

    def _restore(self, name: str, was_wanted: bool, before: dict[StatusKey, ModelStatus]) -> None:
        """Puts the model's states and wanted-ness back as they were before a load."""
        self._served.replace_statuses(name, before)
        if not was_wanted:
            self._served.unwant(name)
        self._changed()

    def abandon_loads(self) -> None:
        """Shutdown: loads in progress stop at their next step (between sessions and warm-up
        runs), and no new load starts. Safe to call from any thread."""
        self._abandon.set()
        for load in list(self._loading):
            load.set()

    async def unload(self, name: str) -> None:
        """Stops admitting requests to ``name``, drains what it has queued, frees it."""
        if not self._served.known(name):
            # Checked before anything is made for the name: an unknown one leaves nothing behind.
            raise NotFound(f"model {name!r} is not loaded")
        async with self._locks.setdefault(name, asyncio.Lock()):
            versions = self._served.remove(name)
            if not versions and not self._served.known(name):
                raise NotFound(f"model {name!r} is not loaded")
            self._served.unwant(name)
            for version in versions:
                self._served.set_status(name, str(version), ModelState.UNLOADING)
            self._changed()  # admits nothing new from here on
            for version, model in versions.items():
                await self._drain(model)
                _log_freed(model)
                self._served.set_status(name, str(version), ModelState.UNAVAILABLE, "unloaded")
            self._served.drop_status(name, "")
            log.info("model unloaded", model=name, versions=sorted(versions))
            self._changed()

    async def _drain(self, model: LoadedModel) -> None:
        """Closes a version that no longer serves, once no call can still submit to it: its
        queued requests are answered; a python model's batch still running after the drain
        timeout has its worker killed (a hung execute must not hold the unload for good)."""
        for settle in self._settlers:
            await asyncio.to_thread(settle)
        if isinstance(model.scheduler, EnsembleScheduler):
            await model.scheduler.close()
        else:
            await model.scheduler.close(abort_after_s=self._drain_timeout_s)

    def _install(self, name: str, built: dict[int, LoadedModel]) -> list[LoadedModel]:
        """Makes ``built`` the served versions of ``name``; returns the versions it replaced.
        Synchronous, so no request sees a half-installed model."""
        old = self._served.install(name, built)
        for version, model in built.items():
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
                dynamic_batching=model.scheduler.batching.dynamic,
                sequence_batching=model.scheduler.sequence_counts() is not None,
                instances=len(model.scheduler.executors),
            )
        self._changed()
        return old

    async def close(self, abort_after_s: float | None = None) -> None:
        """Drains and frees every loaded version; ``abort_after_s``: how long a python model's
        running batches may take before their workers are killed (the server's stop)."""
        for model in self._served.loaded():
            if isinstance(model.scheduler, EnsembleScheduler):
                await model.scheduler.close()
            else:
                await model.scheduler.close(abort_after_s=abort_after_s)
            self._served.set_status(
                model.name, str(model.version), ModelState.UNAVAILABLE, "unloaded"
            )
        self._served.clear()
        self._changed()

    # What serves and how a request finds its version: ``ServedModels``', answered here for
    # the registry's callers (the data plane, the server, the control modes, the health).

    def published(self) -> tuple[LoadedModel, ...]:
        """The loaded versions, as last published; safe to call from any thread."""
        return self._served.published()

    def get(self, name: str, version: str = "") -> LoadedModel:
        """The ready version asked for, or the highest ready one when ``version`` is empty."""
        return self._served.get(name, version)

    def route(self, name: str, version: str, routing_key: str | None) -> LoadedModel:
        """The version an inference runs on (``ServedModels.route``)."""
        return self._served.route(name, version, routing_key)

    def ready_weights(self, name: str) -> dict[int, int]:
        """The weights of ``name``'s ready weighted versions, by ascending version."""
        return self._served.ready_weights(name)

    def weighted(self, name: str) -> bool:
        """Whether ``name``'s config gives its versions traffic weights."""
        return self._served.weighted(name)

    def ready_versions(self, name: str) -> list[int]:
        return self._served.ready_versions(name)

    def ready_models(self) -> list[str]:
        """Names of the models with at least one ready version."""
        return self._served.ready_models()

    def known_models(self) -> list[str]:
        """Every model the registry has a state for: loaded, loading, failed or unloaded."""
        return self._served.known_models()

    def loaded(self) -> list[LoadedModel]:
        return self._served.loaded()

    def index(self) -> list[ModelStatus]:
        """Every model of the repository with its versions' states; one never loaded is
        UNAVAILABLE, "not loaded"."""
        return self._served.index(self._repository.model_names())

    def all_ready(self) -> bool:
        """True when every required model that should be serving is (strict readiness)."""
        return self._served.all_ready()

    def server_ready(self) -> bool:
        """Whether the models make the server ready, by the readiness rules."""
        return self._served.server_ready()
