"""The data plane: what every transport calls. Finds the model version a request names and hands
the request to the core, which checks it, runs it and writes its answer. Knows nothing of gRPC."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from inferd.batching import WireRequest, parse_infer_request
from inferd.models import LoadedModel, ModelRegistry
from inferd.observability.telemetry import RequestTelemetry


class DataPlane:
    def __init__(self, registry: ModelRegistry) -> None:
        self.registry = registry

    def parse(self, data: bytes) -> WireRequest:
        """A serialized ModelInferRequest, parsed by the core: the model's name and version and
        the request's id are readable; every other check happens in ``infer``."""
        return parse_infer_request(data)

    async def infer(
        self,
        request: WireRequest,
        *,
        deadline_s: float | None = None,
        observed: RequestTelemetry | None = None,
        on_failure: Callable[[str, str, BaseException], None] | None = None,
    ) -> bytes:
        """Runs ``request`` on the version it names (default: the highest ready) and returns the
        serialized ModelInferResponse. The core checks
        the request against the model, batches, runs and writes the answer. ``deadline_s``:
        seconds the caller will still wait, if it said; ``observed`` is told the version that
        answers and the core's timings; ``on_failure(model, version, error)`` is told of a failure
        once the version is known (when nothing observes the request)."""
        model = self.registry.get(request.model_name, request.model_version)
        if observed is not None:
            observed.resolved(model.name, str(model.version))
        try:
            answer, timing = await model.scheduler.infer_request(request, deadline_s=deadline_s)
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
        model = self.registry.get(name, version)
        return model, [model.version] if version else self.registry.ready_versions(name)

    def statistics(self, name: str, version: str) -> list[tuple[LoadedModel, dict[str, Any]]]:
        """Each loaded version's statistics: one model (and version) or, with no name, all."""
        models = [self.registry.get(name, version)] if name else self.registry.loaded()
        if name and not version:
            models = [self.registry.get(name, str(v)) for v in self.registry.ready_versions(name)]
        return [(m, m.scheduler.statistics()) for m in models]
