"""Submitting requests to the core's schedulers and completing them on the asyncio loop.

The core answers on one ``CompletionQueue`` whose eventfd the event loop watches; one wake-up
drains every completion that arrived meanwhile, so a burst of answers costs one loop iteration and
one GIL acquisition, not one per request.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

import inferd._core as _core
from inferd.errors import ErrorCode, error_for_code
from inferd.executors.base import Executor

# (core datatype code, shape, buffer): a tensor as the core takes and returns it.
CoreTensor = tuple[int, Sequence[int], Any]


def check_status_codes() -> None:
    """The core's status codes must mean what inferd.errors.ErrorCode says they mean."""
    for name, value in _core.StatusCode.__members__.items():
        if name != "OK" and ErrorCode[name] != int(value):
            raise ImportError(
                f"core StatusCode.{name} = {int(value)}, ErrorCode says {ErrorCode[name]}"
            )


check_status_codes()


class CompletionDispatcher:
    """Resolves the futures of submitted requests from the core's completion queue.

    Lives on one event loop and is used from that loop's thread only.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue = _core.CompletionQueue()
        self._futures: dict[int, asyncio.Future[list[tuple[int, tuple[int, ...], np.ndarray]]]] = {}
        self._tokens = itertools.count(1)
        loop.add_reader(self._queue.fileno(), self._drain)

    @property
    def queue(self) -> Any:
        return self._queue

    def expect(self) -> tuple[int, asyncio.Future[list[tuple[int, tuple[int, ...], np.ndarray]]]]:
        """A fresh token and the future its completion will resolve."""
        token = next(self._tokens)
        future = self._loop.create_future()
        self._futures[token] = future
        return token, future

    def forget(self, token: int) -> None:
        """Drops a token whose request the core did not accept."""
        self._futures.pop(token, None)

    def close(self) -> None:
        self._loop.remove_reader(self._queue.fileno())
        self._drain()

    def _drain(self) -> None:
        for token, code, message, outputs in self._queue.drain():
            future = self._futures.pop(token, None)
            if future is None or future.done():
                continue  # the caller went away (cancelled); its answer has nowhere to go
            if code == 0:
                future.set_result(outputs)
            else:
                future.set_exception(error_for_code(code, message))


class ModelScheduler:
    """One model version's queue and executor instances in the core."""

    def __init__(
        self,
        dispatcher: CompletionDispatcher,
        model_name: str,
        max_batch_size: int,
        executors: list[Executor],
        output_datatypes: list[int],
    ) -> None:
        self._dispatcher = dispatcher
        self._executors = executors
        self._core = _core.Scheduler(
            model_name, max_batch_size, list(executors), output_datatypes, dispatcher.queue
        )

    async def infer(
        self, inputs: list[CoreTensor], batch_size: int
    ) -> list[tuple[int, tuple[int, ...], np.ndarray]]:
        """Computes one request: inputs in model order; returns every output in model order."""
        token, future = self._dispatcher.expect()
        code, message = self._core.submit(token, batch_size, inputs)
        if code != 0:
            self._dispatcher.forget(token)
            raise error_for_code(code, message)
        return await future

    def statistics(self) -> dict[str, Any]:
        stats: dict[str, Any] = self._core.statistics()
        return stats

    def pending_requests(self) -> int:
        return int(self._core.pending_requests())

    async def close(self, *, reject_queued: bool = False) -> None:
        """Stops intake, lets queued requests finish (or rejects them), joins the workers and
        closes the executors. The join runs off the event loop, which keeps completing requests."""
        await asyncio.get_running_loop().run_in_executor(None, self._core.shutdown, reject_queued)
        for executor in self._executors:
            executor.close()
