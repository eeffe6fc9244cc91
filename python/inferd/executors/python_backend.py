"""Triton python-backend model instances (``backend: "python"``, ``<version>/model.py``) as
executors: each instance is a worker process of its own (``inferd.python_backend.process``), so
model code never holds the server's GIL and its crash does not take the server down.

The core hands an instance the batch's requests, not a gathered batch (the executor answers each
request: ``RequestAnsweringExecutor``), and the model's ``execute(requests)`` gets them as the list
it expects; each request is answered with its own response, an error response failing it alone.
A worker that dies fails the batch it held with INTERNAL naming the model and is restarted on a
thread of its own; one that dies idle is seen by a watch on its process (a pidfd) and restarted
the same way. The first restart is at once; a worker that dies again within ``STABLE_S`` of its
start (or a restart that fails) waits before the next one, doubling from ``BACKOFF_FIRST_S`` to
``BACKOFF_MAX_S``, and the log and the instance's health say how many in a row and when the next
is. Until a restart completes the instance reports itself unhealthy (``health``), which makes
the model not ready; a batch that comes meanwhile waits for the restart, or fails UNAVAILABLE
while the restart waits its turn.

A decoupled model's instance is a decoupled executor: the core passes ``respond`` with the batch,
and each response and final flag goes to it as the worker sends it. As in Triton, the instance
takes its next batch once the model's ``execute`` has returned, whether or not its requests have
had their final flags: each is left PENDING and answered later, from the thread that reads the
worker's socket.
"""

from __future__ import annotations

import json
import os
import select
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any, Final, TypeVar

import numpy as np
import structlog

from inferd import errors
from inferd.core import PENDING, RESCHEDULED, DecoupledResponses, ModelCalls
from inferd.python_backend import pb_utils
from inferd.python_backend.bls import ModelCaller
from inferd.python_backend.process import (
    PythonModelProcess,
    PythonRequest,
    PythonResponse,
    WorkerDied,
    WorkerSpec,
)

log = structlog.get_logger(__name__)

_Result = TypeVar("_Result")

# Told why an instance cannot serve (its worker is restarting), or None once it serves again.
InstanceHealth = Callable[[str | None], None]

# A worker that dies within this long of its start counts as one more crash in a row.
STABLE_S: Final = 30.0
# The wait before the second restart of crashes in a row, doubled for each after it, at most max.
BACKOFF_FIRST_S: Final = 1.0
BACKOFF_MAX_S: Final = 60.0


def _never() -> bool:
    return False


def _close_fds(*fds: int) -> None:
    for fd in fds:
        os.close(fd)


class _CoreAnswers:
    """A decoupled batch's answers from the worker to the core's ``DecoupledResponses``, each
    as the core takes it (``PythonBackendExecutor._answer``)."""

    def __init__(
        self,
        executor: PythonBackendExecutor,
        respond: DecoupledResponses,
        batch: list[PythonRequest],
    ) -> None:
        self._executor = executor
        self._respond = respond
        self.core: DecoupledResponses | None = respond
        self._requested = [request.requested_output_names for request in batch]

    def respond(self, index: int, response: PythonResponse) -> None:
        self._respond(index, self._executor._answer(response, self._requested[index]))

    def finish(self, index: int, response: PythonResponse | None) -> None:
        answer: Any = None
        if response is not None and response.worker_gone and self._executor.closing:
            # Killed by the stop or an unload past its drain time: the model went away.
            answer = errors.Unavailable(
                f"{self._executor.describe()} was stopped while it ran the request: "
                f"{response.error}"
            )
        elif response is not None:
            answer = self._executor._answer(response, self._requested[index])
        self._respond.finish(index, answer)


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
        model_calls: ModelCalls | None = None,
        health: InstanceHealth | None = None,
        abandon: threading.Event | None = None,
    ) -> None:
        self._spec = spec
        self._inputs = inputs
        self._outputs = outputs
        self._stop_grace_s = stop_grace_s
        self._health = health
        # Read once by the core: a decoupled executor gets `respond` with each batch, and every
        # batch comes with its requests' ids and requested outputs.
        self.decoupled = spec.decoupled
        self.takes_request_details = True
        self._output_dtypes = {
            str(output["name"]): pb_utils.triton_string_to_numpy(str(output["data_type"]))
            for output in json.loads(spec.model_config_json).get("output", [])
        }
        self._process = PythonModelProcess(
            spec,
            model_caller,
            serving=self._serving,
            died=self._died_mid_batch,
            model_calls=model_calls,
        )
        # A model that is not decoupled is run by the core over its worker's ring: the core's
        # scheduler takes this session instead of calling execute_requests.
        if self._process.session is not None:
            self.core_session = self._process.session
        # abandon: the load was given up (its worker is killed, errors.Cancelled raised).
        self._process.start(start_timeout_s, abandon)
        self._lock = threading.Lock()  # held by a batch or a restart, one at a time
        # Guarded by _state: a restart is due (the worker died, or its restart failed); the
        # executor is closing; which worker the watches are for (one per started worker); the
        # crashes in a row, when the worker last started and when the next restart may run.
        self._state = threading.Lock()
        self._needs_restart = False
        self._closing = False
        self._generation = 0
        self._crashes = 0
        self._restart_scheduled = False
        self._started_at = time.monotonic()
        self._retry_at = 0.0
        self._closed = threading.Event()  # set with _closing: ends a restart's wait
        self._wake_r, self._wake_w = os.pipe()  # written at close: ends every watch
        # Closed with the executor, not at close(): a watch may still be about to select on it.
        weakref.finalize(self, _close_fds, self._wake_r, self._wake_w)
        self._watch(self._process.pid)

    @property
    def pid(self) -> int | None:
        return self._process.pid

    @property
    def closing(self) -> bool:
        """Whether the instance is being stopped (its worker's end is then no failure)."""
        with self._state:
            return self._closing

    def describe(self) -> str:
        return self._spec.describe()

    def execute_requests(
        self,
        requests: list[list[np.ndarray | None]],
        respond: DecoupledResponses | None = None,
        details: list[tuple[str, list[str], str, Callable[[], bool], int | str, int]] | None = None,
    ) -> list[Any]:
        """One batch through the model's ``execute``: per request its outputs in the config's
        order, or the error that fails it alone; for a decoupled model, PENDING for each request
        once the model's ``execute`` returned, its responses and final answer given to
        ``respond`` (and ``respond.finish``) as the worker sends them. ``details``: each
        request's id, the outputs it asked for, its parameters as JSON, whether it was
        cancelled while it runs, and a stateful model's sequence id and flags
        (``request_id()``, ``requested_output_names()``, ``parameters()``,
        ``is_cancelled()``, ``correlation_id()``, ``flags()``)."""
        described = (
            details if details is not None else [("", [], "{}", _never, 0, 0)] * len(requests)
        )
        batch: list[PythonRequest] = []
        for inputs, (request_id, requested, parameters, cancelled, correlation, flags) in zip(
            requests, described, strict=True
        ):
            batch.append(
                PythonRequest(
                    request_id=request_id,
                    inputs={
                        name: array
                        for name, array in zip(self._inputs, inputs, strict=True)
                        if array is not None
                    },
                    requested_output_names=list(requested),
                    parameters=parameters,
                    cancelled=cancelled,
                    correlation_id=correlation,
                    flags=flags,
                )
            )
        if self._process.session is not None:
            # The session finds a worker itself (``_serving``) and reports a death
            # (``_died_mid_batch``); holding ``_lock`` here would block the restart it needs.
            responses = self._process.execute(batch)
            return [
                None if response is None else self._answer(response, request.requested_output_names)
                for response, request in zip(responses, batch, strict=True)
            ]
        if respond is None:
            raise errors.Internal(f"{self._spec.describe()} is decoupled: its batch needs respond")
        rescheduled = set(
            self._run_decoupled(
                lambda: self._process.execute_decoupled(batch, _CoreAnswers(self, respond, batch))
            )
        )
        # Each request's answers go on through `respond`, the instance free for the next batch;
        # a rescheduled one comes back in a later batch.
        return [RESCHEDULED if i in rescheduled else PENDING for i in range(len(batch))]

    def _run_decoupled(self, run: Callable[[], _Result]) -> _Result:
        """``run`` (a decoupled batch handed to the worker) with a worker serving; a worker that
        dies meanwhile is logged and restarted, and its error raised (UNAVAILABLE when the
        instance was being stopped)."""
        with self._lock:
            self._serving_locked()
            try:
                return run()
            except WorkerDied as died:
                with self._state:
                    closing = self._closing
                if closing:
                    # Killed by the stop or an unload past its drain time: the batch's end is
                    # the model's going away, not a failure of the server.
                    raise errors.Unavailable(
                        f"{self._spec.describe()} was stopped while it ran the request: {died}"
                    ) from died
                log.error(
                    "python model worker died",
                    model=self._spec.model_name,
                    version=self._spec.model_version,
                    instance=self._spec.instance_name,
                    reason=str(died),
                )
                self._restart_soon(str(died))
                raise

    def _serving(self) -> None:
        """The core's session found no worker attached: one serves once this returns (restarted
        now if it is due), else this raises why not."""
        with self._lock:
            self._serving_locked()

    def _died_mid_batch(self, died: WorkerDied) -> errors.InferdError:
        """The session's worker died while it ran a batch: the error that batch fails with; the
        restart is scheduled."""
        with self._state:
            closing = self._closing
        if closing:
            return errors.Unavailable(
                f"{self._spec.describe()} was stopped while it ran the request: {died}"
            )
        log.error(
            "python model worker died",
            model=self._spec.model_name,
            version=self._spec.model_version,
            instance=self._spec.instance_name,
            reason=str(died),
        )
        self._restart_soon(str(died))
        return died

    def _serving_locked(self) -> None:
        """Returns once a worker serves (restarted now if it is due); holds ``_lock``. Raises
        UNAVAILABLE while stopping or while a restart waits its turn, INTERNAL when the restart
        fails."""
        if self._restart_if_due_locked():
            return
        with self._state:
            closing, wait_s = self._closing, self._retry_at - time.monotonic()
        if closing:
            raise errors.Unavailable(f"{self._spec.describe()} is stopping")
        if wait_s > 0:
            raise errors.Unavailable(
                f"{self._spec.describe()} is restarting its worker: next attempt in {wait_s:.1f} s"
            )
        raise errors.Internal(f"{self._spec.describe()}: its worker cannot be restarted")

    def _restart_soon(self, reason: str) -> None:
        """The worker died (or its restart failed): the instance is unhealthy until a thread of
        its own restarts it, at once or after the back-off of crashes in a row."""
        now = time.monotonic()
        with self._state:
            if self._closing or self._restart_scheduled:
                return  # the same death, seen by the batch and by the watch
            self._restart_scheduled = True
            self._needs_restart = True
            self._crashes = self._crashes + 1 if now - self._started_at < STABLE_S else 1
            crashes = self._crashes
            delay = (
                0.0 if crashes <= 1 else min(BACKOFF_FIRST_S * 2 ** (crashes - 2), BACKOFF_MAX_S)
            )
            self._retry_at = now + delay
        log.warning(
            "a python model's worker will restart",
            model=self._spec.model_name,
            instance=self._spec.instance_name,
            crashes_in_a_row=crashes,
            restart_in_s=delay,
            reason=reason,
        )
        if self._health is not None:
            self._health(
                f"{self._spec.describe()} is restarting its worker ({reason}; "
                f"{crashes} in a row, next attempt in {delay:g} s)"
            )
        threading.Thread(
            target=self._restart,
            args=(delay,),
            name=f"inferd-restart-{self._spec.instance_name}",
            daemon=True,
        ).start()

    def _restart(self, delay_s: float) -> None:
        if self._closed.wait(delay_s):
            return  # closed meanwhile
        with self._lock:
            self._restart_if_due_locked()

    def _restart_if_due_locked(self) -> bool:
        """Restarts the worker when it died (also while idle) and its back-off has passed;
        whether one serves now. Holds ``_lock``. A failed restart leaves the instance unhealthy,
        saying why, and schedules the next one."""
        with self._state:
            if self._closing:
                return False
            due = self._needs_restart or not self._process.running
            if not due:
                return True
            self._needs_restart = True
            if time.monotonic() < self._retry_at:
                return False  # backing off: the restart thread comes back then
            self._restart_scheduled = False  # from here a failure schedules the next one
            self._generation += 1  # the old worker's watch is stale from here
            generation = self._generation
        log.warning(
            "restarting a python model's worker",
            model=self._spec.model_name,
            instance=self._spec.instance_name,
        )
        try:
            self._process.restart()
        except errors.ModelLoadError as failed:  # the server's failure, not the client's
            log.error("a python model's worker failed to restart", reason=str(failed))
            with self._state:
                self._started_at = time.monotonic()  # a failed start is a crash in a row
            self._restart_soon(f"its worker failed to restart: {failed}")
            return False
        with self._state:
            self._started_at = time.monotonic()
            if generation != self._generation or self._closing:
                return True  # closed meanwhile: close() stops this worker
            self._needs_restart = False
        self._watch(self._process.pid)
        if self._health is not None:
            self._health(None)
        return True

    def _watch(self, pid: int | None) -> None:
        """Watches the worker ``pid`` on a thread: its death while idle starts a restart."""
        if pid is None:
            return
        try:
            pidfd = os.pidfd_open(pid)
        except OSError:  # no pidfd (an old kernel): an idle death is found by the next batch
            return
        with self._state:
            generation = self._generation
        threading.Thread(
            target=self._await_exit,
            args=(pidfd, pid, generation),
            name=f"inferd-watch-{self._spec.instance_name}",
            daemon=True,
        ).start()

    def _await_exit(self, pidfd: int, pid: int, generation: int) -> None:
        try:
            readable, _, _ = select.select([pidfd, self._wake_r], [], [])
        finally:
            os.close(pidfd)
        if pidfd not in readable:
            return  # closing
        with self._state:
            current = generation == self._generation and not self._closing
        if current:
            self._restart_soon(f"pid {pid} exited")

    def _answer(self, response: PythonResponse, requested: list[str]) -> Any:
        """A response as the core takes it: every output in the config's order, or its error.
        An output the request did not ask for may be missing (the worker drops those, and a
        model may not compute them): an empty stand-in takes its place, which the answer never
        carries."""
        if response.error is not None:
            return (errors.Cancelled if response.cancelled else errors.Internal)(response.error)
        outputs: list[np.ndarray] = []
        for name in self._outputs:
            if name in response.outputs:
                outputs.append(response.outputs[name])
            elif requested and name not in requested:
                outputs.append(np.empty(0, dtype=self._output_dtypes[name]))
            else:
                return errors.Internal(
                    f"python model {self._spec.model_name!r}: its response has no output {name!r}"
                )
        return outputs

    def execute(self, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
        """One request on its own (warm-up samples): its outputs, or its error raised (a
        decoupled model's last response; none when it sent only the final flag)."""
        if not self.decoupled:
            (answer,) = self.execute_requests([inputs])
        else:
            last: list[PythonResponse] = []
            request = PythonRequest(
                request_id="",
                inputs={n: a for n, a in zip(self._inputs, inputs, strict=True) if a is not None},
            )
            (final,) = self._run_decoupled(
                lambda: self._process.execute([request], lambda _i, streamed: last.append(streamed))
            )
            response = final if final is not None else (last[-1] if last else None)
            answer = [] if response is None else self._answer(response, [])
        if isinstance(answer, BaseException):
            raise answer
        outputs: list[np.ndarray] = answer
        return outputs

    def abort(self) -> None:
        """Kills the worker now (the server's stop, past its deadline): the batch it runs fails
        with INTERNAL, and batches after it fail at once (no restart)."""
        with self._state:
            self._closing = True
        self._closed.set()
        os.write(self._wake_w, b"x")
        self._process.kill()

    def close(self) -> None:
        """Runs the model's ``finalize`` (SIGKILL when the grace passes first)."""
        with self._state:
            self._closing = True
        self._closed.set()
        os.write(self._wake_w, b"x")  # ends the watches, which would take the exit for a death
        self._process.stop(self._stop_grace_s)
        if self._health is not None:
            self._health(None)  # a closed instance holds nothing back
