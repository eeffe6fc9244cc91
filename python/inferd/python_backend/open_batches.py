"""A decoupled model's batches whose requests are still open, as the server's handle on the
worker (process.py) tracks them.

Each request's responses and its one final answer go to its batch's ``DecoupledAnswers`` as the
worker sends them, from the thread that reads the worker's socket, also after the model's
``execute`` returned: Triton's python backend lets a model return from ``execute`` and send from
a thread of its own, and the instance takes its next batch meanwhile. The server ends a request
the model does not end: cancelled or past its deadline for longer than a grace, ``execute``
raising, or the worker's end. Whatever ends a request, its final answer is given once; what the
worker sends for it afterwards is dropped.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Protocol

from inferd.core import DecoupledResponses
from inferd.python_backend import ipc
from inferd.python_backend.worker_io import PythonRequest, PythonResponse


class DecoupledAnswers(Protocol):
    """Where a decoupled batch's answers go, by request index, from any thread. ``core``: the
    core's object behind them, which takes a request's responses that are not final straight
    from the core's reader of the worker's ring (None: every answer comes through here)."""

    @property
    def core(self) -> DecoupledResponses | None: ...

    def respond(self, index: int, response: PythonResponse) -> object:
        """One more response, not the last."""

    def finish(self, index: int, response: PythonResponse | None) -> object:
        """The final answer (None: the final flag alone); called once per request."""


def request_ended(request: PythonRequest) -> bool:
    """Whether the request's client went (cancelled, or its deadline passed)."""
    return request.cancelled is not None and bool(request.cancelled())


class OpenBatch:
    """One decoupled batch from its send until every request has its final answer.

    ``channel`` names the worker it was sent to: only that worker's end fails it. Thread-safe:
    answers are handed over under the batch's lock, so that a request's final answer is given
    once and nothing follows it.
    """

    def __init__(
        self,
        number: int,
        requests: list[PythonRequest],
        answers: DecoupledAnswers,
        channel: ipc.Channel,
    ) -> None:
        self.number = number
        self.requests = requests
        self.channel = channel
        self._answers = answers
        self._lock = threading.Lock()
        self._ended: set[int] = set()
        self._ended_by_server: set[int] = set()
        self._cancelled_at: dict[int, float] = {}
        self.executed = False  # the model's execute returned

    def respond(self, index: int, response: PythonResponse) -> None:
        with self._lock:
            if index not in self._ended:
                self._answers.respond(index, response)

    def finish(
        self, index: int, response: PythonResponse | None, *, by_server: bool = False
    ) -> bool:
        """Ends request ``index`` with ``response``; False when it had ended already."""
        with self._lock:
            if index in self._ended:
                return False
            self._ended.add(index)
            if by_server:
                self._ended_by_server.add(index)
            self._answers.finish(index, response)
            return True

    def let_go(self, index: int) -> None:
        """Request ``index`` went back to the core for another execute (rescheduled): it ends
        here without an answer (the core answers it later, from another batch)."""
        with self._lock:
            self._ended.add(index)

    def finish_open(self, response: PythonResponse) -> None:
        """Ends every request still open with ``response``."""
        for index in range(len(self.requests)):
            self.finish(index, response)

    def ended(self, index: int) -> bool:
        with self._lock:
            return index in self._ended

    def all_ended(self) -> bool:
        with self._lock:
            return len(self._ended) == len(self.requests)

    def ended_by_server(self) -> bool:
        """Whether the server ended one of its requests (the model did not)."""
        with self._lock:
            return bool(self._ended_by_server)

    def end_overdue(
        self, now: float, grace_s: float, ending: Callable[[int], PythonResponse]
    ) -> list[int]:
        """Ends each open request whose client went at least ``grace_s`` ago (first seen at
        ``now``) with ``ending(index)``; returns their indexes (the worker is told to close
        their senders)."""
        overdue: list[int] = []
        for index, request in enumerate(self.requests):
            if self.ended(index) or not request_ended(request):
                continue
            with self._lock:
                seen_at = self._cancelled_at.setdefault(index, now)
            if now - seen_at < grace_s:
                continue
            if self.finish(index, ending(index), by_server=True):
                overdue.append(index)
        return overdue
