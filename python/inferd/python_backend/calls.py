"""The server's side of one worker's model-to-model calls (BLS; bls.py runs them) that Python
runs: those made over the control channel (outside a batch, or by a decoupled model), and those
the core's router (``ModelCalls``) had no route for on the ring. It also sends over the control
channel the answers of ring calls whose batch was answered before them (``answer_late``).

A ``bls`` message from the worker becomes a ``ModelCall`` that the ``ModelCaller`` runs; its
answer (outputs, or the failure with its code) goes back on the channel the call came on, from
whichever thread completes it; a ring's call is answered through the core's ``done``. A call
that would deadlock is refused at once: one to the calling model itself, and one to a model
already in the chain of calls that led to the calling batch (a cycle). Calls in flight can be
cancelled together (``cancel_all``) once nobody waits for them.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import structlog

from inferd import errors
from inferd.datatypes import DATATYPES
from inferd.python_backend import ipc
from inferd.python_backend.bls import ModelCall, ModelCaller, ModelOutputs, call_chain

if TYPE_CHECKING:
    from inferd.python_backend.worker_io import WorkerSpec

log = structlog.get_logger(__name__)


# How a ring's call is answered (the core's): outputs as [(name, datatype code, array)] or None,
# the status code (0: ok) and the failure's message.
CallDone = Callable[[list[tuple[str, int, Any]] | None, int, str], None]


def _names(value: object) -> list[str]:
    """A chain as the worker sent it: its names (anything else counts for none)."""
    return [n for n in value if isinstance(n, str)] if isinstance(value, list) else []


class CallRelay:
    """One worker's BLS calls: started from the thread reading the worker, answered from the
    threads that complete them; every send holds ``send_lock``. Thread-safe."""

    def __init__(
        self, caller: ModelCaller | None, spec: WorkerSpec, send_lock: threading.Lock
    ) -> None:
        self._caller = caller
        self._spec = spec
        self._send_lock = send_lock
        self._lock = threading.Lock()
        self._in_flight: set[concurrent.futures.Future[ModelOutputs]] = set()  # under _lock

    def start(
        self,
        message: ipc.Message,
        fds: list[int],
        channel: ipc.Channel | None,
    ) -> None:
        """Starts the call ``message``; never blocks for its computation. Its ``chain`` is what
        the worker's batch says led to it (the models whose calls made its requests)."""
        call_id = message.get("id")
        try:
            refs = [ipc.TensorRef.from_message(m) for m in message.get("inputs", ())]
            call = ModelCall(
                model=str(message["model"]),
                version=int(message.get("version", -1)),
                inputs=ipc.copy_out(message, fds, refs),
                requested_output_names=[str(n) for n in message.get("requested_output_names", ())],
                request_id=str(message.get("request_id", "")),
                parameters=str(message.get("parameters", "{}")),
                timeout_us=int(message.get("timeout", 0)),
                chain=call_chain([_names(message.get("chain", []))], self._spec.model_name),
            )
        except (KeyError, TypeError, ValueError) as error:
            self._answer(channel, call_id, errors.InvalidArgument(f"a malformed call: {error}"))
            return
        refused = self._refusal(call)
        if refused is not None:
            self._answer(channel, call_id, refused)
            return
        assert self._caller is not None
        future = self._caller.submit(call)
        with self._lock:
            self._in_flight.add(future)
        future.add_done_callback(lambda done: self._done(channel, call_id, done))

    def run(self, call: ModelCall, done: CallDone) -> None:
        """Runs a call from the ring the core had no route for; ``done`` is called once, from
        whichever thread completes it."""
        refused = self._refusal(call)
        if refused is not None:
            done(None, int(refused.code), str(refused))
            return
        assert self._caller is not None
        future = self._caller.submit(call)
        with self._lock:
            self._in_flight.add(future)

        def answer(finished: concurrent.futures.Future[ModelOutputs]) -> None:
            with self._lock:
                self._in_flight.discard(finished)
            try:
                outputs = self._outcome(finished)
                placed = [
                    (name, DATATYPES[ipc.datatype_of(array)].config_type, array)
                    for name, array in outputs.items()
                ]
            except errors.InferdError as error:
                done(None, int(error.code), str(error))
                return
            except TypeError as error:  # an output no protocol datatype holds
                done(None, int(errors.ErrorCode.INTERNAL), f"model-to-model call failed: {error}")
                return
            done(placed, 0, "")

        future.add_done_callback(answer)

    def answer_late(
        self,
        channel: ipc.Channel | None,
        call_id: int,
        outputs: list[tuple[str, Any]] | None,
        code: int,
        message: str,
    ) -> None:
        """The answer of a ring's call whose batch was answered before it (the core's
        ``call_answered_late``): over the control channel, where its caller waits."""
        outcome = (
            dict(outputs)
            if outputs is not None
            else errors.error_for_code(code, message or "model-to-model call failed")
        )
        self._answer(channel, call_id, outcome)

    def _outcome(self, done: concurrent.futures.Future[ModelOutputs]) -> ModelOutputs:
        """A finished call's outputs; its failure as an InferdError."""
        if done.cancelled():
            raise errors.Cancelled(
                "model-to-model call cancelled: every request of the calling batch was "
                "cancelled or passed its deadline"
            )
        try:
            return done.result()
        except errors.InferdError:
            raise
        except Exception as error:  # the caller's own failure: the worker still gets an answer
            spec = self._spec
            log.exception(
                "a model-to-model call failed",
                model=spec.model_name,
                version=spec.model_version,
                instance=spec.instance_name,
            )
            raise errors.Internal(f"model-to-model call failed: {error}") from error

    def _refusal(self, call: ModelCall) -> errors.InferdError | None:
        """Why the call cannot be made, or None."""
        caller = self._spec.model_name
        if self._caller is None:
            return errors.Unavailable("model-to-model calls are not available in this server")
        if call.model == caller:
            # Its batch would wait behind the one making the call: a deadlock.
            return errors.InvalidArgument(f"python model {caller!r} cannot call itself")
        if call.model in call.chain:
            # Its batch would wait behind a model that waits on this one: a deadlock.
            cycle = " -> ".join((*call.chain, call.model))
            return errors.InvalidArgument(
                f"python model {caller!r} cannot call {call.model!r}: the call would close a "
                f"cycle of model-to-model calls ({cycle})"
            )
        return None

    def cancel_all(self) -> None:
        """Cancels every call in flight (each is answered CANCELLED)."""
        with self._lock:
            calls = list(self._in_flight)
        for call in calls:
            call.cancel()

    def _done(
        self,
        channel: ipc.Channel | None,
        call_id: object,
        done: concurrent.futures.Future[ModelOutputs],
    ) -> None:
        with self._lock:
            self._in_flight.discard(done)
        self._answer(channel, call_id, done)

    def _answer(
        self,
        channel: ipc.Channel | None,
        call_id: object,
        outcome: concurrent.futures.Future[ModelOutputs] | ModelOutputs | errors.InferdError,
    ) -> None:
        """A call's outputs or failure to the worker that made it (unless it is gone)."""
        answer: ipc.Message = {"type": "bls_result", "id": call_id}
        name = f"inferd-bls-answer-{self._spec.instance_name}"
        try:
            if isinstance(outcome, errors.InferdError):
                raise outcome
            outputs = outcome if isinstance(outcome, dict) else self._outcome(outcome)
            placed = ipc.TensorMessage(name, answer, "outputs", list(outputs.items()))
        except errors.InferdError as error:
            failed = {**answer, "error": str(error), "code": error.code.name}
            placed = ipc.TensorMessage(name, failed, "outputs", [])
        except (TypeError, ValueError) as error:  # outputs no message can carry
            reason = f"model-to-model call failed: {error}"
            placed = ipc.TensorMessage(
                name, {**answer, "error": reason, "code": "INTERNAL"}, "outputs", []
            )
        with placed, contextlib.suppress(OSError):  # OSError: the worker is gone
            if channel is not None:
                with self._send_lock:
                    channel.send(placed.message, placed.fds, placed.payload)
