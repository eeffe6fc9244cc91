"""The server's handle on one python-backend model instance's worker process.

``PythonModelProcess`` starts the worker (worker.py), hands it whole batches and reads back one
answer per request. A model that is not decoupled is served over a shared-memory ring by the
core (``session``: a ``PythonWorkerSession``, cpp/include/inferd/python_worker_executor.h), which
the core's scheduler runs without Python in this process; this handle starts the worker with
the ring's descriptors and attaches each started worker to the session. A decoupled model's
batches go over the control socket as JSON (``execute``) and its responses come back on its ring,
each read by the core (``StreamedResponses``, cpp/include/inferd/streamed_responses.h): the call
returns once the model's ``execute`` has, and each request's answers go on reaching its batch's
``DecoupledAnswers`` (open_batches.py) until its final one, those that are not final straight
from the core's reader to the core, the final ones through ``_deliver_streamed``.

A thread per started worker reads its control socket: the model's log records, its BLS calls and
``is_cancelled`` questions are handled there as they come, everything else is queued for the
caller waiting on the worker; when the socket ends, it stops the worker's StreamedResponses
(which first delivers what the worker streamed) before the worker's open requests fail. Calls
block; they are meant for one core worker thread at a time (locks make concurrent callers wait
their turn). Lock order: the session's ``exclusive()``, then ``_lock``; ``_open_lock`` is taken
alone.

A worker that dies (a crash, SIGKILL, ``os._exit`` in model code) makes the call in flight raise
``WorkerDied`` naming the model, version, instance and how the process ended; ``restart()``
brings up a fresh one with the same arguments.

A worker never outlives its server: it is started by a thread that lives exactly as long as it
(the kernel's parent-death signal, which the worker asks for at its start, fires when the
*thread* that forked it ends, not the process), and in a process group of its own, which every
kill of the worker kills whole (what the model started goes with it). Its stdout and stderr come
back through a pipe and are logged as records, a line each, cut at a bound (spawn.py).

While a batch is in flight the worker may also send BLS calls (relayed by calls.py: their
answers are sent back from whichever thread completes them, under a send lock) and
``is_cancelled`` queries about a request of an open batch (answered at once).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import queue
import select
import signal
import socket
import subprocess
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

import numpy as np
import structlog

from inferd import errors
from inferd.core import (
    CancellationFlag,
    ModelCalls,
    PythonWorkerSession,
    StreamedResponses,
    WorkerRing,
)
from inferd.datatypes import DATATYPES
from inferd.python_backend import ipc
from inferd.python_backend.bls import ModelCall, ModelCaller, call_chain
from inferd.python_backend.calls import CallDone, CallRelay
from inferd.python_backend.model_config import python_of
from inferd.python_backend.open_batches import DecoupledAnswers, OpenBatch, request_ended
from inferd.python_backend.spawn import forward_output, kill_group, launch, wait_exited
from inferd.python_backend.worker_io import (
    PythonRequest,
    PythonResponse,
    Respond,
    WorkerDied,
    WorkerSpec,
    WorkerStartFailed,
)

# What crosses to the worker is worker_io's; its callers import it from here too.
__all__ = [
    "PythonModelProcess",
    "PythonRequest",
    "PythonResponse",
    "Respond",
    "WorkerDied",
    "WorkerSpec",
    "WorkerStartFailed",
]

log = structlog.get_logger(__name__)

# How often a wait on the worker wakes to check that the process still lives (a process the
# model started may hold the socket open after the worker itself died), and whether the
# requests of the batch were cancelled (or passed their deadline).
_LIVENESS_POLL_S: Final = 0.2
# A decoupled request cancelled (or past its deadline) that the model has not ended this long
# after the server saw it is ended by the server (a model that asks is_cancelled() ends its own).
CANCELLED_GRACE_S: Final = 1.0
# A decoupled batch whose every request has ended, one of them by the server (cancelled, past
# its deadline), while the model's execute still runs: how long execute may take to return
# before the worker is killed (and restarted), since nothing else frees the instance.
HUNG_EXECUTE_GRACE_S: Final = 5.0
_LOG_LEVELS: Final = {
    "VERBOSE": logging.DEBUG,
    "INFO": logging.INFO,
    "WARNING": logging.WARNING,
    "ERROR": logging.ERROR,
}


def _exit_description(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"killed by signal {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exited with status {returncode}"


# Told, with the GIL and no lock of the process held, that a batch found no worker attached:
# restarts one if that is due, else raises why none serves (the executor's back-off).
Serving = Callable[[], None]
# Told that the worker died (or broke the ring's protocol) while it held a batch: the error
# that batch fails with (the executor schedules the restart).
Died = Callable[[WorkerDied], errors.InferdError]

_CONFIG_TYPES: Final = {d.config_name: d.config_type for d in DATATYPES.values()}


def _worker_module() -> str:
    """Where inferd._worker lies: the worker loads it from there, since an editable install keeps
    it outside the source tree that the worker's PYTHONPATH names."""
    spec = importlib.util.find_spec("inferd._worker")
    if spec is None or spec.origin is None:
        raise WorkerStartFailed("inferd._worker is not built: rebuild inferd (make build)")
    return spec.origin


def _tensors(config: dict[str, Any], key: str) -> tuple[list[str], list[int]]:
    """The config's inputs or outputs: their names and datatype codes, in order."""
    names: list[str] = []
    codes: list[int] = []
    for tensor in config.get(key, []):
        names.append(str(tensor["name"]))
        codes.append(_CONFIG_TYPES.get(str(tensor.get("data_type", "TYPE_FP32")), 0))
    return names, codes


def _session_of(process: PythonModelProcess, spec: WorkerSpec) -> PythonWorkerSession:
    """The core's session for ``spec``'s instance; its hooks hold the process weakly (the core's
    references are invisible to the cyclic collector)."""
    handle = weakref.ref(process)

    def ensure_serving() -> None:
        alive = handle()
        if alive is None:
            raise errors.Unavailable(f"{spec.describe()} is gone")
        alive._ensure_serving()

    def died() -> None:
        alive = handle()
        if alive is None:
            raise errors.Unavailable(f"{spec.describe()} is gone")
        raise alive._session_died()

    def call_unrouted(
        model: str,
        version: int,
        request_id: str,
        parameters: dict[str, bool | int | str],
        chain: list[str],
        requested: list[str],
        timeout_us: int,
        inputs: list[tuple[str, Any]],
        done: CallDone,
    ) -> None:
        alive = handle()
        if alive is None:
            done(None, int(errors.ErrorCode.UNAVAILABLE), f"{spec.describe()} is gone")
            return
        call = ModelCall(
            model=model,
            version=version,
            inputs={name: np.array(array, copy=True) for name, array in inputs},
            requested_output_names=requested,
            request_id=request_id,
            parameters=json.dumps(parameters),
            timeout_us=timeout_us,
            chain=call_chain([chain], spec.model_name),
        )
        alive._calls.run(call, done)

    def call_answered_late(
        number: int, outputs: list[tuple[str, Any]] | None, code: int, message: str
    ) -> None:
        alive = handle()
        if alive is not None:
            alive._calls.answer_late(alive._channel, number, outputs, code, message)

    config = json.loads(spec.model_config_json)
    input_names, input_types = _tensors(config, "input")
    # A stateful model's control inputs follow, written by the core into each request.
    input_names += [name for name, _ in spec.controls]
    input_types += [code for _, code in spec.controls]
    output_names, output_types = _tensors(config, "output")
    return PythonWorkerSession(
        spec.model_name,
        spec.describe(),
        input_names,
        input_types,
        output_names,
        output_types,
        ensure_serving,
        died,
        call_unrouted,
        call_answered_late,
    )


def _streams_of(
    process: PythonModelProcess, spec: WorkerSpec, ring: WorkerRing
) -> StreamedResponses:
    """The core's reader of a decoupled instance's streamed responses; what it does not hand to
    the core itself goes to the process, held weakly (as in ``_session_of``)."""
    handle = weakref.ref(process)

    def deliver(
        batch: int,
        index: int,
        final: bool,
        response: tuple[list[tuple[str, Any]] | None, str | None] | None,
    ) -> None:
        alive = handle()
        if alive is not None:
            alive._deliver_streamed(batch, index, final, response)

    output_names, output_types = _tensors(json.loads(spec.model_config_json), "output")
    return StreamedResponses(ring, spec.model_name, output_names, output_types, deliver)


def _watch_cancellations(
    flags: list[tuple[Callable[[], bool], CancellationFlag]], done: threading.Event
) -> None:
    """Sets each flag once its request says it is cancelled, until the batch is done."""
    pending = list(flags)
    while pending:
        for cancelled, flag in list(pending):
            if cancelled():
                flag.set()
                pending.remove((cancelled, flag))
        if done.wait(0.01):
            return


class _GatheredAnswers:
    """A decoupled batch's answers waited out: streamed responses to ``respond`` (dropped
    without one), each request's final answer kept for ``wait``."""

    core = None  # every answer comes through Python

    def __init__(self, count: int, respond: Respond | None) -> None:
        self._respond = respond
        self._finals: dict[int, PythonResponse | None] = {}
        self._count = count
        self._done = threading.Condition()

    def respond(self, index: int, response: PythonResponse) -> None:
        if self._respond is not None:
            self._respond(index, response)

    def finish(self, index: int, response: PythonResponse | None) -> None:
        with self._done:
            self._finals[index] = response
            self._done.notify_all()

    def wait(self) -> list[PythonResponse | None]:
        with self._done:
            self._done.wait_for(lambda: len(self._finals) == self._count)
            return [self._finals[index] for index in range(self._count)]


class PythonModelProcess:
    """One model instance's worker process and the channel to it.

    Invariants: at most one batch is in flight; the input arena is written only between
    batches; ``_process``, ``_channel`` and ``_inbox`` are all set (a started worker) or all
    None; every send on the channel holds ``_send_lock`` (BLS answers are sent from other
    threads); the session (ring mode) has the started worker attached, or none while there is
    none.
    """

    def __init__(
        self,
        spec: WorkerSpec,
        model_caller: ModelCaller | None = None,
        *,
        serving: Serving | None = None,
        died: Died | None = None,
        model_calls: ModelCalls | None = None,
    ) -> None:
        self._spec = spec
        self._decoupled = spec.decoupled
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._channel: ipc.Channel | None = None
        self._inbox: queue.Queue[tuple[ipc.Message, list[int]] | None] | None = None
        self._inputs: ipc.ArenaWriter | None = None
        # A decoupled model's started worker: the core's reader of its streamed responses.
        self._streams: StreamedResponses | None = None
        self._start_timeout_s = 60.0
        # A decoupled model's batch whose execute runs, and every batch with a request still
        # open, by number (the worker's messages name theirs): under _open_lock.
        self._batch: OpenBatch | None = None
        self._batch_id = 0
        self._open_lock = threading.Lock()
        self._open: dict[int, OpenBatch] = {}
        self._calls = CallRelay(model_caller, spec, self._send_lock)
        self._serving = serving
        self._on_died = died
        # The death a session's batch failed with, raised again to a Python caller of execute.
        self._last_died: WorkerDied | None = None
        self.session: PythonWorkerSession | None = (
            None if self._decoupled else _session_of(self, spec)
        )
        if self.session is not None and model_calls is not None:
            self.session.set_model_calls(model_calls)

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    @property
    def running(self) -> bool:
        """Whether a started worker is still alive (one that died idle is found here, before a
        batch is handed to it). Asks the kernel too: ``poll()`` answers None while another
        thread holds Popen's wait lock, even for a worker that is already a zombie."""
        if self._process is None or self._process.poll() is not None:
            return False
        try:
            stat = Path(f"/proc/{self._process.pid}/stat").read_text()
        except OSError:
            return False
        return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")

    def _python(self) -> str:
        try:
            return python_of(self._spec.execution_env, self._spec.describe())
        except errors.ModelLoadError as error:
            raise WorkerStartFailed(str(error)) from None

    def _command(self, python: str, fd: int, ring: WorkerRing | None) -> list[str]:
        spec = self._spec
        command = [
            python,
            "-m",
            "inferd.python_backend.worker",
            "--model",
            spec.model_name,
            "--version",
            str(spec.model_version),
            "--instance",
            spec.instance_name,
            "--model-file",
            str(spec.model_file),
            "--fd",
            str(fd),
            "--parent-pid",  # the worker dies with this process (PR_SET_PDEATHSIG)
            str(os.getpid()),
        ]
        if ring is not None:
            command += ["--ring", ring.fds, "--worker-module", _worker_module()]
        return command

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Holds the batch in flight back (the session's, waited out) and then ``_lock``."""
        with contextlib.ExitStack() as held:
            if self.session is not None:
                held.enter_context(self.session.exclusive())
            held.enter_context(self._lock)
            yield

    def start(self, timeout_s: float = 60.0, abandon: threading.Event | None = None) -> None:
        """Spawns the worker and returns once the model's ``initialize`` has finished.

        Raises ``WorkerStartFailed`` with the model's message when initialize raises, when the
        worker exits first, or when initialize takes longer than ``timeout_s``; and
        ``errors.Cancelled`` once ``abandon`` is set (the load was given up). The worker is
        killed whenever this raises.
        """
        with self._locked():
            self._start_timeout_s = timeout_s
            self._start_locked(timeout_s, abandon)

    def _start_locked(self, timeout_s: float, abandon: threading.Event | None = None) -> None:
        if self._process is not None:
            raise errors.FailedPrecondition(f"{self._spec.describe()} is already started")
        python = self._python()
        try:
            ring = WorkerRing(self._spec.instance_name)
        except OSError as error:
            reason = f"{self._spec.describe()}: no shared memory: {error}"
            raise WorkerStartFailed(reason) from error
        streams = None if self.session is not None else _streams_of(self, self._spec, ring)
        parent_end, child_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        passed = (child_end.fileno(), *ring.descriptors)
        try:
            self._process = launch(
                self._command(python, child_end.fileno(), ring), passed, self._spec.instance_name
            )
        except OSError as error:
            if streams is not None:
                streams.stop()
            parent_end.close()
            reason = f"{self._spec.describe()}: cannot start {python}: {error}"
            raise WorkerStartFailed(reason) from error
        finally:
            child_end.close()
        assert self._process.stderr is not None
        threading.Thread(
            target=forward_output,
            args=(self._process.stderr, self._identity()),
            name=f"inferd-output-{self._spec.instance_name}",
            daemon=True,
        ).start()
        self._channel = ipc.Channel(parent_end)
        self._inbox = queue.Queue()
        self._streams = streams
        threading.Thread(
            target=self._read,
            args=(self._channel, self._inbox, streams),
            name=f"inferd-read-{self._spec.instance_name}",
            daemon=True,
        ).start()
        self._inputs = ipc.ArenaWriter(f"inferd-inputs-{self._spec.instance_name}")
        try:
            self._send({"type": "initialize", "args": self._spec.initialize_args()})
            message = self._receive(time.monotonic() + timeout_s, abandon)
        except WorkerDied as died:
            raise WorkerStartFailed(f"{died} before initialize finished") from died
        except OSError as error:  # the socket broke before initialize was sent or answered
            self._kill_and_discard()
            raise WorkerStartFailed(f"{self._spec.describe()}: {error}") from error
        except TimeoutError:
            self._kill_and_discard()
            raise WorkerStartFailed(
                f"{self._spec.describe()}: initialize did not finish within {timeout_s:g} s"
            ) from None
        except errors.Cancelled:
            self._kill_and_discard()
            raise
        if message.get("type") == "initialize_failed":
            self._kill_and_discard()
            raise WorkerStartFailed(
                f"{self._spec.describe()}: initialize failed: {message['message']}"
            )
        if message.get("type") != "ready":
            self._kill_and_discard()
            raise WorkerStartFailed(f"{self._spec.describe()}: unexpected {message.get('type')!r}")
        if not message.get("ring"):
            self._kill_and_discard()
            raise WorkerStartFailed(f"{self._spec.describe()}: the worker took no ring")
        if self.session is not None:
            self.session.attach(ring, os.pidfd_open(self._process.pid))

    def execute(
        self, requests: list[PythonRequest], respond: Respond | None = None
    ) -> list[PythonResponse | None]:
        """Runs one batch through the model's ``execute``: one response per request, in order.
        A decoupled model's batch is waited out to each request's final answer (None: the final
        flag alone), its streamed responses given to ``respond`` (dropped without one) as they
        come; the server serves such batches with ``execute_decoupled``, which does not wait.

        Raises ``WorkerDied`` when the worker ends before answering (its requests are lost;
        ``restart()`` serves again) and ``errors.Unavailable`` when no worker is running.
        """
        if self.session is not None:
            return self._execute_on_ring(self.session, requests)
        gathered = _GatheredAnswers(len(requests), respond)
        for index in self.execute_decoupled(requests, gathered):
            gathered.finish(index, None)  # rescheduled: this one execute (a warm-up's) ends it
        return gathered.wait()

    def execute_decoupled(
        self, requests: list[PythonRequest], answers: DecoupledAnswers
    ) -> list[int]:
        """Hands a decoupled model's batch to the worker and returns once the model's ``execute``
        has returned; each request's responses and its one final answer go to ``answers`` as the
        worker sends them, from the thread reading its socket, also after this returned. The
        server ends a request the model does not: ``execute`` raising, the request cancelled (or
        past its deadline) ``CANCELLED_GRACE_S`` ago, the worker's end. An ``execute`` still
        running ``HUNG_EXECUTE_GRACE_S`` after every request of its batch ended, one of them by
        the server, has its worker killed.

        Returns the requests the model rescheduled (set_release_flags(RESCHEDULE)), by their
        place in the batch: they end here, unanswered, and go back to the core for another step.

        Raises ``WorkerDied`` when the worker ends before ``execute`` returned (the caller fails
        the batch) and ``errors.Unavailable`` when no worker is running.
        """
        with self._lock:
            channel, streams = self._channel, self._streams
            if channel is None or self._inputs is None or streams is None:
                raise errors.Unavailable(f"{self._spec.describe()} is not running")
            message, fds = self._batch_message(requests)
            self._batch_id += 1
            message["batch"] = self._batch_id
            batch = OpenBatch(self._batch_id, requests, answers, channel)
            # Before the send: the readers route the batch's answers and questions.
            with self._open_lock:
                self._open[batch.number] = batch
            requested = [list(request.requested_output_names) for request in requests]
            streams.open(batch.number, answers.core, requested)
            self._batch = batch
            with contextlib.suppress(OSError):  # the worker is gone: _receive names how it ended
                self._send(message, fds)
            try:
                return self._await_executed(batch, streams)
            finally:
                self._batch = None
                batch.executed = True
                self._forget_if_done(batch)

    def _batch_message(self, requests: list[PythonRequest]) -> tuple[ipc.Message, tuple[int, ...]]:
        """The ``execute`` message of a batch, its inputs placed in the inputs arena (with the
        arena's descriptor when it was replaced)."""
        assert self._inputs is not None
        tensors = [(name, array) for r in requests for name, array in r.inputs.items()]
        try:
            refs, replaced = self._inputs.place(tensors)
        except TypeError as error:
            raise errors.InvalidArgument(f"{self._spec.describe()}: {error}") from error
        wire: list[ipc.Message] = []
        position = 0
        for request in requests:
            count = len(request.inputs)
            wire.append(
                {
                    "request_id": request.request_id,
                    "inputs": [ref.to_message() for ref in refs[position : position + count]],
                    "requested_output_names": request.requested_output_names,
                    "parameters": request.parameters,
                    "correlation_id": request.correlation_id,
                    "flags": request.flags,
                    "timeout": request.timeout_us,
                }
            )
            position += count
        message: ipc.Message = {"type": "execute", "requests": wire}
        if replaced is None:
            return message, ()
        message["arena_size"] = replaced.size
        return message, (replaced.fd,)

    def _await_executed(self, batch: OpenBatch, streams: StreamedResponses) -> list[int]:
        """Waits for the worker's word that ``execute`` returned (its failure ends every request
        still open, after what the model streamed before it), ending overdue requests and
        cancelling abandoned BLS calls meanwhile. Returns the requests the model rescheduled
        (their places in the batch), which end here without an answer."""
        all_ended_at: float | None = None
        check_at = time.monotonic()
        while True:
            now = time.monotonic()
            if now >= check_at:
                check_at = now + _LIVENESS_POLL_S
                self._end_overdue(batch, now)
                self._cancel_abandoned_calls()
                # Only once the server ended one of them: a model may work on after its finals.
                if batch.all_ended() and batch.ended_by_server():
                    all_ended_at = now if all_ended_at is None else all_ended_at
                    if now - all_ended_at >= HUNG_EXECUTE_GRACE_S:
                        self._kill_hung_execute()
                        return []
            try:
                message, fds = self._receive_message(check_at)
            except TimeoutError:
                continue
            for fd in fds:
                os.close(fd)
            if message.get("type") != "result":
                raise errors.Internal(f"{self._spec.describe()}: malformed reply from the worker")
            if message.get("error") is not None:  # execute raised: it ends every open request
                streams.sync()
                batch.finish_open(PythonResponse(error=str(message["error"])))
                return []
            rescheduled = [int(i) for i in message.get("rescheduled", [])]
            if any(not 0 <= i < len(batch.requests) for i in rescheduled):
                raise errors.Internal(f"{self._spec.describe()}: malformed reply from the worker")
            if rescheduled:
                streams.sync()  # what the model streamed for them comes before their next step's
            for index in rescheduled:
                batch.let_go(index)
            return rescheduled

    def _deliver_streamed(
        self,
        number: int,
        index: int,
        final: bool,
        response: tuple[list[tuple[str, Any]] | None, str | None] | None,
    ) -> None:
        """A streamed response the core's reader did not hand to the core itself (a final one,
        or one of a batch answered through Python): to its batch's answers (dropped when the
        request or its batch already ended)."""
        with self._open_lock:
            batch = self._open.get(number)
        if batch is None or not 0 <= index < len(batch.requests):
            return
        streamed: PythonResponse | None = None
        if response is not None:
            outputs, error = response
            streamed = (
                PythonResponse(error=error)
                if error is not None
                else PythonResponse(outputs=dict(outputs or ()))
            )
        if final:
            batch.finish(index, streamed)
            self._forget_if_done(batch)
        elif streamed is not None:
            batch.respond(index, streamed)

    def _forget_if_done(self, batch: OpenBatch) -> None:
        if batch.executed and batch.all_ended():
            with self._open_lock:
                self._open.pop(batch.number, None)
            streams = self._streams
            if streams is not None:
                streams.forget(batch.number)

    def _end_overdue(self, batch: OpenBatch, now: float) -> None:
        """Ends each open request of ``batch`` that was cancelled or passed its deadline at
        least ``CANCELLED_GRACE_S`` ago: its answer says so, and the worker closes its sender
        (later sends are dropped)."""

        def ending(_index: int) -> PythonResponse:
            return PythonResponse(
                error=f"the request was cancelled, or its deadline passed, before "
                f"{self._spec.describe()} sent its final response",
                cancelled=True,
            )

        for index in batch.end_overdue(now, CANCELLED_GRACE_S, ending):
            with self._send_lock, contextlib.suppress(OSError):
                # Only to the worker it was sent to (gone: the batch ended with it).
                if self._channel is batch.channel:
                    batch.channel.send({"type": "close", "batch": batch.number, "index": index})
        self._forget_if_done(batch)

    def _end_overdue_open(self) -> None:
        """The reader thread's round over the batches whose execute returned."""
        with self._open_lock:
            batches = [batch for batch in self._open.values() if batch.executed]
        now = time.monotonic()
        for batch in batches:
            self._end_overdue(batch, now)

    def _fail_open(self, channel: ipc.Channel) -> None:
        """The worker behind ``channel`` ended: its batches' open requests end with that."""
        with self._open_lock:
            gone = [b for b in self._open.values() if b.channel is channel]
            for batch in gone:
                del self._open[batch.number]
        ended = PythonResponse(
            error=f"{self._spec.describe()} ended before it sent the request's final response",
            worker_gone=True,
        )
        for batch in gone:
            batch.finish_open(ended)

    def _execute_on_ring(
        self, session: PythonWorkerSession, requests: list[PythonRequest]
    ) -> list[PythonResponse | None]:
        """A batch through the core's session, as its scheduler runs them (warm-up, tests); each
        request's ``cancelled`` is watched by a thread of this call's, which sets its flag."""
        batch: list[tuple[str, list[tuple[str, int, Any]], list[str], str, CancellationFlag]] = []
        flags: list[tuple[Callable[[], bool], CancellationFlag]] = []
        for request in requests:
            try:
                inputs = [
                    (name, DATATYPES[ipc.datatype_of(array)].config_type, array)
                    for name, array in request.inputs.items()
                ]
            except TypeError as error:
                raise errors.InvalidArgument(f"{self._spec.describe()}: {error}") from error
            flag = CancellationFlag()
            if request_ended(request):
                flag.set()  # before the send: the worker may ask before a watcher runs
            elif request.cancelled is not None:
                flags.append((request.cancelled, flag))
            requested = request.requested_output_names
            batch.append((request.request_id, inputs, requested, request.parameters, flag))
        self._last_died = None
        done = threading.Event()
        if flags:
            threading.Thread(
                target=_watch_cancellations, args=(flags, done), name="inferd-cancel", daemon=True
            ).start()
        try:
            answers = session.run(batch)
        except (RuntimeError, ValueError) as failed:
            died = self._last_died
            if died is not None and str(died) == str(failed):
                raise died from None
            raise errors.error_for_code(int(getattr(failed, "code", 7)), str(failed)) from None
        finally:
            done.set()
        responses: list[PythonResponse | None] = []
        for answer in answers:
            if isinstance(answer, tuple):
                responses.append(PythonResponse(error=str(answer[1])))
            else:
                # Copies: the answers' memory is the worker's arena, reused by later batches.
                responses.append(
                    PythonResponse(
                        outputs={name: np.array(array, copy=True) for name, array in answer.items()}
                    )
                )
        return responses

    def _ensure_serving(self) -> None:
        """The session found no worker attached: the executor restarts one if that is due."""
        if self._serving is not None:
            self._serving()
        assert self.session is not None
        if not self.session.attached:
            raise errors.Unavailable(f"{self._spec.describe()} is not running")

    def _session_died(self) -> errors.InferdError:
        """The attached worker exited or broke the ring's protocol while it held a batch (the
        session holds exclusive(), and has detached it): killed, reaped, described; the error
        its batch fails with."""
        self.kill()
        with self._lock:
            if self._process is None:
                died = WorkerDied(f"{self._spec.describe()} died")
            else:
                died = self._died()
        self._last_died = died
        return died if self._on_died is None else self._on_died(died)

    def _kill_hung_execute(self) -> None:
        """Every request of the batch ended long ago and execute still runs: nothing else can
        free the instance. The worker is killed; the next batch (or the executor's watch)
        starts a fresh one."""
        log.warning(
            "execute did not return after every request of its batch ended: worker killed",
            grace_s=HUNG_EXECUTE_GRACE_S,
            **self._identity(),
        )
        self._kill_and_discard()

    def _cancel_abandoned_calls(self) -> None:
        """Cancels the batch's BLS calls in flight once every request of the batch was cancelled
        or passed its deadline: the calls carry the callers' end, so a stuck call (a hung or
        cyclic model) cannot hold this instance for good."""
        if self.session is not None:
            abandoned = self.session.batch_abandoned()
        else:
            batch = self._batch
            abandoned = batch is not None and all(request_ended(r) for r in batch.requests)
        if abandoned:
            self._calls.cancel_all()

    def _receive(
        self, deadline: float | None, abandon: threading.Event | None = None
    ) -> ipc.Message:
        """The worker's next message of its start and stop (``ready``, ``stopped``...); none
        carries descriptors.

        Raises ``WorkerDied`` when the worker ends first, ``TimeoutError`` at ``deadline`` and
        ``errors.Cancelled`` once ``abandon`` is set.
        """
        message, fds = self._receive_message(deadline, abandon)
        for fd in fds:
            os.close(fd)
        return message

    def _receive_message(
        self, deadline: float | None, abandon: threading.Event | None = None
    ) -> tuple[ipc.Message, list[int]]:
        """The worker's next message other than a log line, a BLS call or an ``is_cancelled``
        question (the reader thread handles those), with its descriptors.

        Raises ``WorkerDied`` when the worker ends first, ``TimeoutError`` at ``deadline`` and
        ``errors.Cancelled`` once ``abandon`` is set.
        """
        assert self._inbox is not None
        while True:
            wait = _LIVENESS_POLL_S
            if deadline is not None:
                wait = min(wait, max(deadline - time.monotonic(), 0.001))
            try:
                received = self._inbox.get(timeout=wait)
            except queue.Empty:
                if self._process is not None and self._process.poll() is not None:
                    raise self._died() from None
                if deadline is not None and time.monotonic() >= deadline:
                    raise TimeoutError from None
                if abandon is not None and abandon.is_set():
                    reason = f"{self._spec.describe()}: the load was abandoned"
                    raise errors.Cancelled(reason) from None
                continue
            if received is None:
                raise self._died()
            return received

    def _read(
        self,
        channel: ipc.Channel,
        inbox: queue.Queue[tuple[ipc.Message, list[int]] | None],
        streams: StreamedResponses | None,
    ) -> None:
        """The reader of one started worker's control socket, until it closes (the worker ended,
        or the server discarded it): log lines logged, BLS calls started, ``is_cancelled``
        answered, everything else queued for whoever waits on the worker (None at the end).
        While the worker is silent, the batch's BLS calls are cancelled once its every request
        ended. At the end, the worker's streamed responses (a decoupled model's) are delivered
        and their reader stopped before its open requests fail, and the channel is closed."""
        check_at = time.monotonic() + _LIVENESS_POLL_S
        try:
            while True:
                if time.monotonic() >= check_at:
                    check_at = time.monotonic() + _LIVENESS_POLL_S
                    self._cancel_abandoned_calls()
                    self._end_overdue_open()
                if not channel.buffered():
                    readable, _, _ = select.select([channel.socket], [], [], _LIVENESS_POLL_S)
                    if not readable:
                        continue
                message, fds = channel.receive()
                kind = message.get("type")
                if kind == "log":
                    self._log_record(message)
                    for fd in fds:
                        os.close(fd)
                elif kind == "bls":
                    self._calls.start(message, fds, channel)
                elif kind == "is_cancelled":
                    for fd in fds:
                        os.close(fd)
                    self._answer_cancelled(message)
                else:
                    inbox.put((message, fds))
        except (ipc.ChannelClosed, OSError, ValueError):
            if streams is not None:
                streams.stop()
            self._fail_open(channel)
            inbox.put(None)
        finally:
            if streams is not None:
                streams.stop()
            channel.close()

    def _answer_cancelled(self, message: ipc.Message) -> None:
        """Whether request ``index`` of an open batch was cancelled; a request of a batch that
        is over for the server (the question crossed its end) was."""
        index = message.get("index")
        with self._open_lock:
            batch = self._open.get(message.get("batch", self._batch_id))
        cancelled = True
        if batch is not None and isinstance(index, int) and 0 <= index < len(batch.requests):
            cancelled = request_ended(batch.requests[index])
        with contextlib.suppress(OSError):  # the worker is gone: the batch fails with it
            self._send({"type": "cancelled", "id": message.get("id"), "cancelled": cancelled})

    def _send(self, message: ipc.Message, fds: tuple[int, ...] = ()) -> None:
        assert self._channel is not None
        with self._send_lock:
            self._channel.send(message, fds)

    def _log_record(self, message: ipc.Message) -> None:
        """A pb_utils.Logger record from model code, logged with the instance that made it."""
        log.log(
            _LOG_LEVELS.get(str(message.get("level")), logging.INFO),
            str(message.get("message", "")),
            **self._identity(),
        )

    def _identity(self) -> dict[str, str | int]:
        spec = self._spec
        return {
            "model": spec.model_name,
            "version": spec.model_version,
            "instance": spec.instance_name,
        }

    def _died(self) -> WorkerDied:
        """Reaps the ended worker and describes how it ended."""
        assert self._process is not None
        pid = self._process.pid
        kill_group(pid)  # before it is reaped: what the model started goes with it
        try:
            returncode = self._process.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            # Its socket closed yet it lives on (a wedged exit): it is of no further use.
            self._process.kill()
            returncode = self._process.wait()
        self._discard()
        return WorkerDied(
            f"{self._spec.describe()} (pid {pid}) died: {_exit_description(returncode)}"
        )

    def stop(self, grace_s: float = 10.0) -> None:
        """Asks the worker to run ``finalize`` and exit; SIGKILL when ``grace_s`` passes first."""
        with self._locked():
            self._stop_locked(grace_s)

    def _stop_locked(self, grace_s: float) -> None:
        if self._process is None or self._channel is None:
            return
        deadline = time.monotonic() + grace_s
        try:
            self._send({"type": "stop"})
            reply = self._receive(deadline)
            if reply.get("error"):
                log.warning("finalize failed", error=reply["error"], **self._identity())
            # finalize is done: a second more for the interpreter's exit, even past the grace.
            # Not reaped yet: its pid still names its group, killed whole below.
            wait_exited(self._process.pid, max(deadline - time.monotonic(), 1.0))
        except WorkerDied:
            return  # already reaped and discarded
        except (OSError, TimeoutError):
            log.warning(
                "did not stop within the grace, killed", grace_s=grace_s, **self._identity()
            )
        self._kill_and_discard()

    def kill(self) -> None:
        """SIGKILL for the worker and its process group, from any thread (a batch waiting on it
        then fails with ``WorkerDied``); its handle is discarded by whoever holds the lock next."""
        process = self._process
        if process is not None and process.returncode is None:
            kill_group(process.pid)

    def restart(self) -> None:
        """Replaces the worker (killed if still running) by a fresh one, initialized again."""
        with self._locked():
            self._kill_and_discard()
            self._start_locked(self._start_timeout_s)

    def _kill_and_discard(self) -> None:
        if self._process is not None and self._process.returncode is None:
            kill_group(self._process.pid)  # not yet reaped: its pid still names its group
            self._process.wait()
        self._discard()

    def _discard(self) -> None:
        if self.session is not None:
            self.session.detach()
        if self._channel is not None:
            # The reader thread sees the end and closes the channel itself.
            with contextlib.suppress(OSError):
                self._channel.socket.shutdown(socket.SHUT_RDWR)
        if self._inputs is not None:
            self._inputs.close()
        self._channel = None
        self._inbox = None
        self._inputs = None
        self._streams = None  # stopped by its reader thread, which sees the channel's end
        self._process = None
