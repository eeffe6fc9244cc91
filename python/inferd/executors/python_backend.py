"""Triton python-backend model instances (``backend: "python"``, ``<version>/model.py``) as
executors: each instance is a worker process of its own (``inferd.python_backend.process``), so
model code never holds the server's GIL and its crash does not take the server down.

The core hands an instance the batch's requests, not a gathered batch (the executor answers each
request: ``RequestAnsweringExecutor``), and the model's ``execute(requests)`` gets them as the list
it expects; each request is answered with its own response, an error response failing it alone.
A worker that dies fails the batch it held with INTERNAL naming the model; the next batch (or
the first batch after a worker died idle) starts a fresh worker first.

A decoupled model's instance is a decoupled executor: the core passes ``respond`` with the batch
and each streamed response goes to it as the worker sends it; the instance takes its next batch
once every request of this one has had its final flag.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np
import structlog

from inferd import errors
from inferd.python_backend.bls import ModelCaller
from inferd.python_backend.process import (
    PythonModelProcess,
    PythonRequest,
    PythonResponse,
    WorkerDied,
    WorkerSpec,
)

log = structlog.get_logger(__name__)


class PythonBackendExecutor:
    """One instance of a python-backend model: its worker process, started here (``initialize``
    has run when the constructor returns; its failure fails the load)."""

    def __init__(
        self,
        spec: WorkerSpec,
        inputs: list[str],
        outputs: list[str],
        *,
        start_timeout_s: float = 120.0,
        stop_grace_s: float = 10.0,
        model_caller: ModelCaller | None = None,
    ) -> None:
        self._spec = spec
        self._inputs = inputs
        self._outputs = outputs
        self._stop_grace_s = stop_grace_s
        # Read once by the core: a decoupled executor gets `respond` with each batch.
        self.decoupled = spec.decoupled
        self._process = PythonModelProcess(spec, model_caller)
        self._process.start(start_timeout_s)
        self._needs_restart = False
        self._lock = threading.Lock()  # the core's worker thread, or warm-up before serving

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def execute_requests(
        self,
        requests: list[list[np.ndarray | None]],
        respond: Callable[[int, Any], None] | None = None,
    ) -> list[Any]:
        """One batch through the model's ``execute``: per request its outputs in the config's
        order, or the error that fails it alone; for a decoupled model, each request's final
        answer (None: the final flag alone), its other responses given to ``respond`` (request
        index, outputs or error) as they come."""
        batch = [
            PythonRequest(
                request_id="",
                inputs={
                    name: array
                    for name, array in zip(self._inputs, inputs, strict=True)
                    if array is not None
                },
            )
            for inputs in requests
        ]
        with self._lock:
            if self._needs_restart or not self._process.running:
                log.warning(
                    "restarting a python model's worker",
                    model=self._spec.model_name,
                    instance=self._spec.instance_name,
                )
                try:
                    self._process.restart()
                except errors.ModelLoadError as failed:  # the server's failure, not the client's
                    self._needs_restart = True
                    raise errors.Internal(str(failed)) from failed
                self._needs_restart = False
            try:
                responses = self._process.execute(batch, self._streamed_to(respond))
            except WorkerDied as died:
                log.error(
                    "python model worker died",
                    model=self._spec.model_name,
                    version=self._spec.model_version,
                    instance=self._spec.instance_name,
                    reason=str(died),
                )
                self._needs_restart = True
                raise
        return [None if r is None else self._answer(r) for r in responses]

    def _streamed_to(
        self, respond: Callable[[int, Any], None] | None
    ) -> Callable[[int, PythonResponse], None] | None:
        if respond is None:
            return None

        def streamed(index: int, response: PythonResponse) -> None:
            respond(index, self._answer(response))

        return streamed

    def _answer(self, response: PythonResponse) -> Any:
        """A response as the core takes it: every output in the config's order, or its error."""
        if response.error is not None:
            return errors.Internal(response.error)
        missing = [name for name in self._outputs if name not in response.outputs]
        if missing:
            return errors.Internal(
                f"python model {self._spec.model_name!r}: its response has no output {missing[0]!r}"
            )
        return [response.outputs[name] for name in self._outputs]

    def execute(self, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        """One request on its own (warm-up samples): its outputs, or its error raised (a
        decoupled model's last response; none when it sent only the final flag)."""
        last: list[Any] = [[]]
        (answer,) = self.execute_requests(
            [inputs], lambda _index, streamed: last.__setitem__(0, streamed)
        )
        answer = last[0] if answer is None else answer
        if isinstance(answer, BaseException):
            raise answer
        outputs: list[np.ndarray] = answer
        return outputs

    def close(self) -> None:
        """Runs the model's ``finalize`` (SIGKILL when the grace passes first)."""
        self._process.stop(self._stop_grace_s)
