"""Ensembles in the core: an ensemble version's scheduler, whose requests run through the
composing models' own schedulers, and the directory where its steps find them.

The steps' requests enter the composing versions' batchers beside their direct traffic; tensors
pass from step to step inside the core. Nothing here waits on a step: the core answers the
ensemble request once its outputs exist (or a step fails) on the same completion queue as any
other request.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import inferd._core as _core
from inferd.core.executor import Executor
from inferd.core.scheduler import (
    CompletionDispatcher,
    CoreResult,
    ModelScheduler,
    ModelSignature,
    TensorSignature,
    WireRequest,
    run_parsed_request,
)

if TYPE_CHECKING:
    from inferd._core import SharedMemoryRegistry


class SchedulerDirectory:
    """The model versions that serve now, where ensembles' steps find their schedulers; the
    registry publishes it on every change of what serves. The core holds them weakly: a
    version's owner shuts it down before letting it go."""

    def __init__(self) -> None:
        self.core = _core.SchedulerDirectory()

    def publish(self, versions: Iterable[tuple[str, int, ModelScheduler]]) -> None:
        models: dict[str, dict[int, Any]] = {}
        for name, version, scheduler in versions:
            models.setdefault(name, {})[version] = scheduler.core
        self.core.publish(models)


@dataclass(frozen=True)
class CoreEnsembleStep:
    """One step as the core runs it: the composing model and version (-1 = its latest serving),
    ``inputs``: (model input, ensemble tensor) for every input of the model in its input order,
    ``outputs``: (model output index, model output, ensemble tensor) for the outputs kept."""

    model: str
    version: int
    inputs: tuple[tuple[str, str], ...]
    outputs: tuple[tuple[int, str, str], ...]


class EnsembleScheduler:
    """One ensemble version in the core (Triton's ``platform: "ensemble"``): its requests run
    as a dataflow graph over the composing models' schedulers, found per step in ``directory``.
    Presents what a model version's ``ModelScheduler`` presents to the registry, the data plane
    and the transport."""

    def __init__(
        self,
        dispatcher: CompletionDispatcher,
        directory: SchedulerDirectory,
        signature: ModelSignature,
        inputs: Sequence[TensorSignature],
        outputs: Sequence[TensorSignature],
        steps: Sequence[CoreEnsembleStep],
        max_batch_size: int,
        response_cache: _core.ResponseCache | None = None,
    ) -> None:
        self._dispatcher = dispatcher
        self._signature = signature
        self.steps = tuple(steps)
        self._core = _core.EnsembleScheduler(
            signature.name,
            max_batch_size,
            [(t.name, t.datatype.config_type, list(t.dims)) for t in inputs],
            [(t.name, t.datatype.config_type, list(t.dims)) for t in outputs],
            [(s.model, s.version, list(s.inputs), list(s.outputs)) for s in self.steps],
            directory.core,
            dispatcher.queue,
            response_cache,
        )

    async def infer_request(
        self,
        request: WireRequest,
        *,
        deadline_s: float | None = None,
        stream: bool = False,
        shared_memory: SharedMemoryRegistry | None = None,
    ) -> CoreResult:
        """As ``ModelScheduler.infer_request``: the answer comes once every ensemble output
        exists; a failing step fails it with a message naming the step."""
        return await run_parsed_request(
            self._core,
            self._dispatcher,
            self._signature,
            request,
            deadline_s=deadline_s,
            stream=stream,
            shared_memory=shared_memory,
        )

    @property
    def executors(self) -> list[Executor]:
        return []

    @property
    def core(self) -> Any:
        """The core's EnsembleScheduler, which the core's gRPC server submits requests to."""
        return self._core

    @property
    def signature(self) -> ModelSignature:
        return self._signature

    def pending_requests(self) -> int:
        """Requests accepted and not yet answered (their steps queue in the composing models)."""
        return int(self._core.pending_requests())

    def sequence_counts(self) -> None:
        """An ensemble has no sequences of its own (its config may not set sequence_batching)."""
        return None

    def statistics(self) -> _core.StatisticsSnapshot:
        """The ensemble's own statistics in a model's shape, as Triton reports an ensemble: one
        execution per request, rows as inferences, queue and compute durations its steps' summed."""
        return self._core.statistics()

    def step_statistics(self) -> list[_core.EnsembleStepStatistics]:
        """Per step, in the config's order: successes and failures, submission to answer."""
        return list(self._core.step_statistics())

    async def close(self, *, reject_queued: bool = False) -> None:
        """Stops intake and lets running requests finish (their steps run on in the composing
        models), or answers them UNAVAILABLE with ``reject_queued``."""
        if reject_queued:
            self._core.shutdown()
            return
        await asyncio.get_running_loop().run_in_executor(None, self._core.drain)

    def close_now(self) -> None:
        """For an ensemble that never served (a load that failed half-way)."""
        self._core.shutdown()
