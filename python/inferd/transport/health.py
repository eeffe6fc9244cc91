"""``grpc.health.v1`` statuses that follow the server and its models.

``""`` and ``inference.GRPCInferenceService`` are SERVING while the server accepts calls and its
models make it ready (ServerReady's meaning: ``inferd.models.registry.ReadinessRules``);
``inference.GRPCInferenceService/<model>`` is SERVING while the model has a ready version.
Statuses are recomputed from the data plane after each change, one update at a time, so ``Watch``
sees the transitions in order. Health never touches the executors: it reads the models' states
only.
"""

from __future__ import annotations

import asyncio
from typing import Any

from grpc_health.v1 import health, health_pb2

from inferd.dataplane import DataPlane
from inferd.transport.servicer import ServerState

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class DrainingHealthServicer(health.aio.HealthServicer):  # type: ignore[misc]
    """grpcio's health servicer, except that ``Watch`` streams end once they have sent
    NOT_SERVING at shutdown: open streams would otherwise hold the server's whole grace period."""

    def __init__(self) -> None:
        super().__init__()
        self._shutting_down = asyncio.Event()

    async def Watch(self, request: Any, context: Any) -> None:
        recorder = _LastStatus(context)
        watching = asyncio.ensure_future(super().Watch(request, recorder))
        stopping = asyncio.ensure_future(self._shutting_down.wait())
        try:
            await asyncio.wait({watching, stopping}, return_when=asyncio.FIRST_COMPLETED)
            for _ in range(100):  # the last status on its way out: NOT_SERVING (up to 1 s)
                if watching.done() or recorder.last == NOT_SERVING:
                    break
                await asyncio.sleep(0.01)
        finally:
            watching.cancel()
            stopping.cancel()

    async def enter_graceful_shutdown(self) -> None:
        await super().enter_graceful_shutdown()
        self._shutting_down.set()


class _LastStatus:
    """A servicer context that remembers the last status written through it."""

    def __init__(self, context: Any) -> None:
        self._context = context
        self.last: int | None = None

    async def write(self, response: Any) -> None:
        await self._context.write(response)
        self.last = response.status

    def __getattr__(self, name: str) -> Any:
        return getattr(self._context, name)


class HealthReporter:
    def __init__(
        self,
        servicer: DrainingHealthServicer,
        dataplane: DataPlane,
        state: ServerState,
        service_name: str,
    ) -> None:
        self._servicer = servicer
        self._dataplane = dataplane
        self._state = state
        self._service_name = service_name
        self._reported: dict[str, int] = {}
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._follow())
        self.changed()

    def changed(self) -> None:
        """Something readiness depends on changed: the statuses are recomputed soon."""
        self._changed.set()

    async def update(self) -> None:
        ready = self._state.accepting and self._dataplane.server_ready()
        wanted = {"": ready, self._service_name: ready}
        for name, model_ready in self._dataplane.model_readiness().items():
            wanted[f"{self._service_name}/{name}"] = self._state.accepting and model_ready
        for service in self._reported.keys() - wanted.keys():
            wanted[service] = False  # a model that left the repository
        for service, serving in wanted.items():
            status = SERVING if serving else NOT_SERVING
            if self._reported.get(service) != status:
                self._reported[service] = status
                await self._servicer.set(service, status)

    async def shut_down(self) -> None:
        """Every service NOT_SERVING, first of the shutdown steps, so that load balancers stop
        sending before the drain; later changes are ignored."""
        if self._task is not None:
            self._task.cancel()
        await self._servicer.enter_graceful_shutdown()

    async def _follow(self) -> None:
        while True:
            await self._changed.wait()
            self._changed.clear()
            await self.update()
