"""Triton python-backend model instances (``backend: "python"``, ``<version>/model.py``) as
executors: each instance is a worker process of its own (``inferd.python_backend.process``), so
model code never holds the server's GIL and its crash does not take the server down.

The core hands an instance the batch's requests, not a gathered batch (the executor answers each
request: ``RequestAnsweringExecutor``), and the model's ``execute(requests)`` gets them as the list
it expects; each request is answered with its own response, an error response failing it alone.
A worker that dies fails the batch it held with INTERNAL naming the model; the next batch (or
the first batch after a worker died idle) starts a fresh worker first.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import structlog

from inferd import errors
from inferd.python_backend.process import PythonModelProcess, PythonRequest, WorkerDied, WorkerSpec

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
    ) -> None:
        self._spec = spec
        self._inputs = inputs
        self._outputs = outputs
        self._stop_grace_s = stop_grace_s
        self._process = PythonModelProcess(spec)
        self._process.start(start_timeout_s)
        self._needs_restart = False
        self._lock = threading.Lock()  # the core's worker thread, or warm-up before serving

    @property
    def pid(self) -> int | None:
        return self._process.pid

    def execute_requests(self, requests: list[list[np.ndarray | None]]) -> list[Any]:
        """One batch through the model's ``execute``: per request its outputs in the config's
        order, or the error that fails it alone."""
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
                responses = self._process.execute(batch)
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
        answers: list[Any] = []
        for response in responses:
            if response.error is not None:
                answers.append(errors.Internal(response.error))
                continue
            missing = [name for name in self._outputs if name not in response.outputs]
            if missing:
                answers.append(
                    errors.Internal(
                        f"python model {self._spec.model_name!r}: its response has no output "
                        f"{missing[0]!r}"
                    )
                )
                continue
            answers.append([response.outputs[name] for name in self._outputs])
        return answers

    def execute(self, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        """One request on its own (warm-up samples): its outputs, or its error raised."""
        (answer,) = self.execute_requests([inputs])
        if isinstance(answer, BaseException):
            raise answer
        outputs: list[np.ndarray] = answer
        return outputs

    def close(self) -> None:
        """Runs the model's ``finalize`` (SIGKILL when the grace passes first)."""
        self._process.stop(self._stop_grace_s)
