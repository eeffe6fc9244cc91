"""A worker's side of the requests of its batches: questions it asks the server and waits on
(``PendingCalls``: BLS calls, ``is_cancelled``), whether each request of a batch was cancelled
(``BatchCancellation``) and a decoupled request's response sender (``ResponseSender``). Used by
worker.py's ``ModelWorker`` through the ``Worker`` protocol."""

from __future__ import annotations

import contextlib
import itertools
import os
import queue
import threading
from collections.abc import Iterator, Sequence
from typing import Protocol

from inferd.python_backend import ipc, pb_utils


class Worker(Protocol):
    """What the request objects need of the worker: its questions and its channel."""

    calls: PendingCalls

    def send(
        self, message: ipc.Message, fds: tuple[int, ...] = (), payload: bytes = b""
    ) -> None: ...

    def send_response(
        self,
        batch: int,
        index: int,
        response: pb_utils.InferenceResponse | None,
        final: bool,
        requested: list[str],
    ) -> None: ...


class PendingCalls:
    """Questions sent to the parent and not yet answered (BLS calls, ``is_cancelled``), by id.
    Thread-safe: model code may call from several threads (``async_exec`` runs ``exec`` on a
    thread pool)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._waiting: dict[int, queue.Queue[tuple[ipc.Message, list[int]]]] = {}
        self._closed: str | None = None

    def open(self) -> tuple[int, queue.Queue[tuple[ipc.Message, list[int]]]]:
        with self._lock:
            if self._closed is not None:
                raise pb_utils.TritonModelException(self._closed)
            call_id = next(self._ids)
            slot: queue.Queue[tuple[ipc.Message, list[int]]] = queue.Queue(maxsize=1)
            self._waiting[call_id] = slot
            return call_id, slot

    def forget(self, call_id: int) -> None:
        """The call was answered another way (the ring): nobody waits for ``call_id`` here."""
        with self._lock:
            self._waiting.pop(call_id, None)

    def answer(self, message: ipc.Message, fds: list[int]) -> None:
        with self._lock:
            slot = self._waiting.pop(int(message.get("id", 0)), None)
        if slot is None:  # an answer nobody waits for: its arena goes
            for fd in fds:
                os.close(fd)
            return
        slot.put((message, fds))

    def close(self, reason: str) -> None:
        """Fails every waiting call and every later one with ``reason``."""
        with self._lock:
            self._closed = reason
            waiting, self._waiting = self._waiting, {}
        for slot in waiting.values():
            slot.put(({"error": reason}, []))


class BatchCancellation:
    """Whether each request of the batch being executed was cancelled, asked of the parent
    (``is_cancelled()``), which reads the worker's messages until the batch is over: execute has
    returned and, for a decoupled model, every request has had its final flag. A question sent
    after that would wait for the next batch, so a request is closed before its last message
    goes out, under the lock its questions are sent under; a closed request answers with what was
    last heard. Once cancelled, a request stays cancelled. Thread-safe."""

    def __init__(self, worker: Worker, batch: int, count: int) -> None:
        self._worker = worker
        self.batch = batch  # the server's number for the batch: its messages carry it
        self._lock = threading.Lock()
        self._open = [True] * count
        self._cancelled = [False] * count

    def ask(self, index: int) -> bool:
        with self._lock:
            if self._cancelled[index] or not self._open[index]:
                return self._cancelled[index]
            try:
                call_id, answer = self._worker.calls.open()
            except pb_utils.TritonModelException:  # the server is gone
                return False
            message = {"type": "is_cancelled", "id": call_id, "batch": self.batch, "index": index}
            self._worker.send(message)
        while True:
            try:
                reply, fds = answer.get(timeout=0.1)
                break
            except queue.Empty:
                # The server ended the request meanwhile (``cancel``): the question may wait
                # for its next batch, the answer is known.
                with self._lock:
                    if self._cancelled[index]:
                        return True
        for fd in fds:
            os.close(fd)
        cancelled = bool(reply.get("cancelled", False))
        if cancelled:
            with self._lock:
                self._cancelled[index] = True
        return cancelled

    def cancel(self, index: int) -> None:
        """The server ended request ``index`` (cancelled, or past its deadline)."""
        with self._lock:
            self._cancelled[index] = True
            self._open[index] = False

    @contextlib.contextmanager
    def closing(self, indices: Sequence[int]) -> Iterator[None]:
        """Holds the questions back while the last message of ``indices`` goes out."""
        with self._lock:
            for index in indices:
                self._open[index] = False
            yield


class ResponseSender:
    """A decoupled request's ``InferenceResponseSender``: each ``send`` goes to the parent at
    once; nothing may follow the final flag. Once the server ended the request (cancelled, past
    its deadline: ``end``), sends are dropped and ``is_cancelled()`` is true. Thread-safe (model
    code may send from threads)."""

    def __init__(
        self,
        worker: Worker,
        index: int,
        requested: list[str],
        cancellation: BatchCancellation,
    ) -> None:
        self._worker = worker
        self._index = index
        self._requested = requested
        self._cancellation = cancellation
        self._lock = threading.Lock()
        self._final = False
        self._ended = False  # by the server: later sends are dropped, not refused

    def send(self, response: pb_utils.InferenceResponse | None = None, flags: int = 0) -> None:
        final = bool(flags & pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        if response is not None and not isinstance(response, pb_utils.InferenceResponse):
            raise pb_utils.TritonModelException(
                f"send takes an InferenceResponse or None, got {type(response).__name__}"
            )
        if response is None and not final:
            raise pb_utils.TritonModelException(
                "send needs a response, or flags=TRITONSERVER_RESPONSE_COMPLETE_FINAL"
            )
        with self._lock:
            if self._ended:
                return
            if self._final:
                raise pb_utils.TritonModelException(
                    "this request's final flag was already sent: nothing can follow it"
                )
            if not final:
                self._worker.send_response(
                    self._cancellation.batch, self._index, response, final, self._requested
                )
                return
            with self._cancellation.closing([self._index]):
                self._worker.send_response(
                    self._cancellation.batch, self._index, response, final, self._requested
                )
            self._final = True

    def is_cancelled(self) -> bool:
        return self._cancellation.ask(self._index)

    def close(self) -> bool:
        """Ends the request on the worker's side (its execute failed); whether it was open."""
        with self._lock:
            was_open = not self._final
            self._final = True
            return was_open

    def end(self) -> None:
        """The server ended the request: what the model sends from now on is dropped."""
        with self._lock:
            self._ended = True
            self._final = True
        self._cancellation.cancel(self._index)

    @property
    def open(self) -> bool:
        with self._lock:
            return not self._final
