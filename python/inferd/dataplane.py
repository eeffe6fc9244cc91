"""The data plane: what the Python side's callers of inference use (the requests the core's
transport forwards, to be answered in the registry's words or traced by a sampler of Python's own,
and python models' BLS calls). Finds the model version a request goes to, unless the transport
already chose it, and hands the request to the core, which checks it, runs it and writes its
answer. Knows nothing of gRPC."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

from inferd.core import CoreTiming, WireRequest, parse_infer_request
from inferd.errors import InferdError, InvalidArgument
from inferd.models import LoadedModel, ModelRegistry

if TYPE_CHECKING:
    from inferd._core import SharedMemoryRegistry, StatisticsSnapshot


class RequestObserver(Protocol):
    """What the data plane tells whoever observes a request (the telemetry's per-request record
    satisfies it)."""

    def resolved(self, model: str, version: str) -> None:
        """The version that will answer was found."""

    def computed(self, timing: CoreTiming) -> None:
        """The core computed the request, with these timings."""


# Told ``(model, version, error)`` when a request fails once its version is known.
FailureCallback = Callable[[str, str, BaseException], None]


class DataPlane:
    def __init__(self, registry: ModelRegistry) -> None:
        self._registry = registry

    def parse(self, data: bytes) -> WireRequest:
        """A serialized ModelInferRequest, parsed by the core: the model's name and version and
        the request's id are readable; every other check happens in ``infer``."""
        return parse_infer_request(data)

    async def infer(
        self,
        request: WireRequest,
        *,
        deadline_s: float | None = None,
        observed: RequestObserver | None = None,
        on_failure: FailureCallback | None = None,
        shared_memory: SharedMemoryRegistry | None = None,
        routed_version: str | None = None,
    ) -> bytes:
        """Runs ``request`` on the version it names (default: the highest ready) and returns the
        serialized ModelInferResponse. The core checks
        the request against the model, batches, runs and writes the answer. ``deadline_s``:
        seconds the caller will still wait, if it said; ``observed`` is told the version that
        answers and the core's timings; ``on_failure(model, version, error)`` is told of a failure
        once the version is known (when nothing observes the request); ``shared_memory``: the
        regions the request's tensors may name (None: naming one is refused);
        ``routed_version``: the version the core's transport routed the request to, when it did
        (and forwarded it): it runs there, without a second choice."""
        if routed_version is not None:
            model = self._registry.get(request.model_name, routed_version)
        else:
            try:
                routing_key = request.routing_key  # the core's rule for the key (a string)
            except ValueError as e:
                raise InvalidArgument(str(e)) from None
            model = self._registry.route(request.model_name, request.model_version, routing_key)
        if observed is not None:
            observed.resolved(model.name, str(model.version))
        try:
            answer, timing = await model.scheduler.infer_request(
                request, deadline_s=deadline_s, shared_memory=shared_memory
            )
        except BaseException as e:
            if on_failure is not None:
                on_failure(model.name, str(model.version), e)
            raise
        if observed is not None:
            observed.computed(timing)
        answer_bytes: bytes = answer
        return answer_bytes

    def metadata(self, name: str, version: str) -> tuple[LoadedModel, list[int]]:
        """The version asked for (default: the highest ready) and the versions to report: that
        one when the request names it, else every ready version (as Triton answers)."""
        model = self._registry.get(name, version)
        return model, [model.version] if version else self._registry.ready_versions(name)

    def statistics(self, name: str, version: str) -> list[tuple[LoadedModel, StatisticsSnapshot]]:
        """Each loaded version's statistics: one model (and version) or, with no name, all."""
        models = [self._registry.get(name, version)] if name else self._registry.loaded()
        if name and not version:
            models = [self._registry.get(name, str(v)) for v in self._registry.ready_versions(name)]
        return [(m, m.scheduler.statistics()) for m in models]

    def server_ready(self) -> bool:
        """Whether the models make the server ready (``ReadinessRules``: strict readiness,
        optional models, no model serving)."""
        return self._registry.server_ready()

    def ready(self, name: str, version: str) -> bool:
        """Whether the version asked for (default: the highest) is ready to answer."""
        try:
            self._registry.get(name, version)
        except InferdError:
            return False
        return True

    def model_readiness(self) -> dict[str, bool]:
        """Every model the server has a state for (loaded, loading, failed or unloaded), with
        whether it has a ready version."""
        serving = set(self._registry.ready_models())
        return {name: name in serving for name in {*serving, *self._registry.known_models()}}

    def ready_versions(self) -> dict[str, list[int]]:
        """Each model with a ready version, with its ready versions."""
        ready = {
            name: self._registry.ready_versions(name) for name in self._registry.ready_models()
        }
        return {name: versions for name, versions in ready.items() if versions}

    def version_weights(self, name: str) -> dict[int, int] | None:
        """Where ``name``'s inferences naming no version go: the weights of its ready weighted
        versions (empty: it has weights, none of those versions is ready), or None when its
        config gives no weights."""
        return self._registry.ready_weights(name) if self._registry.weighted(name) else None

    def config(self, name: str, version: str) -> Any:
        """The completed ModelConfig of the version asked for (default: the highest ready)."""
        return self._registry.get(name, version).config
