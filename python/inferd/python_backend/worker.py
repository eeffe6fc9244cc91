"""A python-backend model instance's own process.

Run by ``PythonModelProcess`` (process.py) as::

    python -m inferd.python_backend.worker --model NAME --version N --instance NAME_K \\
        --model-file PATH --fd FD

The command line names the model, version and instance so that operators find the process
with ``ps``. ``--fd`` is the worker's end of the control socket (ipc.py). Every worker also gets
``--ring`` (the shared-memory ring's five descriptors) and ``--worker-module`` (inferd._worker's
file). A model that is not decoupled takes its batches over the ring, and the loop that serves
them is C++ (cpp/worker/worker_loop.h), calling the model's ``execute``; the control socket then
carries the rest (initialize, stop, log records, BLS calls). A decoupled model takes its batches
over the control socket and sends its responses on the ring (``WorkerLoop.respond``). The worker
imports ``model.py`` from its path with inferd's ``triton_python_backend_utils`` in place, builds
``TritonPythonModel``, calls ``initialize(args)`` with the args Triton documents (every value a
string), then serves batches one at a time until told to stop, when it calls ``finalize()``.

Failures, as Triton's python backend has them: an exception raised by ``execute`` fails every
request of its batch with the exception's message; an ``InferenceResponse`` with an error fails
only its own request; ``execute`` returning anything but one response per request fails the
whole batch saying so.

Decoupled models (``model_transaction_policy { decoupled: true }``): each request carries a
response sender; every ``send`` goes to the parent at once as one ring message (its tensors in
the ring's outputs arena, which the parent copies them out of as they come), the final flag
included.
``execute`` returns None; a batch is over for the parent once ``execute`` has returned and every
request has sent its final flag (from ``execute`` or from a thread of the model's own).

Model-to-model calls (BLS, ``InferenceRequest.exec``/``async_exec``): made while a ring's batch
runs, they go on the ring (``WorkerLoop.call``; the parent's core routes them) and an answer that
comes after the batch was answered comes as ``bls_result``; otherwise a ``bls`` message with the
inputs in an arena of their own, which the parent runs on the named model through the core's
scheduler and answers ``bls_result``. ``request.is_cancelled()`` and the response
sender's ask the same way (``is_cancelled``, answered ``cancelled``). A reader thread receives
every message, so that calls made from execute (and several at once from ``async_exec``) get
their answers while the main thread is inside model code.

Logs: ``pb_utils.Logger`` records go to the parent as structured ``log`` messages (the parent
logs them with the model, version and instance); ``print`` and anything else written to stdout or
stderr goes to a pipe the parent reads (the worker's stdout is pointed at its stderr), logged
there a record a line, with the model, version and instance, each cut at a bound.

Lifetime: with ``--parent-pid`` (the server always passes it) the worker asks the kernel for
SIGKILL when its server ends, first thing, and exits at once if that already happened. A
decoupled request the server ended (cancelled, past its deadline: ``close``) drops what the
model sends for it from then on.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import functools
import importlib.util
import inspect
import json
import os
import queue
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import numpy.typing as npt

from inferd.errors import ErrorCode
from inferd.python_backend import ipc, pb_utils
from inferd.python_backend.bls import DEFAULT_CALL_TIMEOUT_S, call_chain, split_chain
from inferd.python_backend.worker_requests import BatchCancellation, PendingCalls, ResponseSender


def _parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="inferd.python_backend.worker")
    parser.add_argument("--model", required=True, help="the model's name")
    parser.add_argument("--model-file", required=True, type=Path, help="the version's model.py")
    parser.add_argument(
        "--auto-complete-config",
        action="store_true",
        help="run auto_complete_config on the config JSON read from stdin, write the result to "
        "stdout and exit (at load, before any instance starts)",
    )
    parser.add_argument("--version", type=int, help="the model version")
    parser.add_argument("--instance", help="the instance's name, e.g. add_sub_0")
    parser.add_argument("--fd", type=int, help="the control socket's descriptor")
    parser.add_argument(
        "--parent-pid", type=int, help="the server's pid: the worker dies with it (SIGKILL)"
    )
    parser.add_argument("--ring", help="the batch ring's descriptors (ring,inputs,outputs,bells)")
    parser.add_argument("--worker-module", help="the file of inferd._worker, which serves the ring")
    options = parser.parse_args(argv)
    if not options.auto_complete_config and None in (options.version, options.instance, options.fd):
        parser.error("--version, --instance and --fd are required to serve an instance")
    return options


def _describe(error: BaseException) -> str:
    text = str(error)
    if isinstance(error, pb_utils.TritonModelException | pb_utils.TritonError):
        return text or type(error).__name__
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _load_worker_module(path: str) -> ModuleType:
    """inferd._worker from the file the server named (built for the server's Python: a model's
    EXECUTION_ENV_PATH must be a virtualenv of that same Python version)."""
    spec = importlib.util.spec_from_file_location("inferd._worker", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load inferd._worker from {path}")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
    except ImportError as error:
        raise ImportError(
            f"{sys.executable} (Python {sys.version.split()[0]}) cannot load inferd._worker from "
            f"{path}: {error}; a model's EXECUTION_ENV_PATH must be a virtualenv of the server's "
            "Python version"
        ) from error
    return module


def _import_model(model_file: Path) -> ModuleType:
    """Imports model.py as module ``model``; its directory joins sys.path for its own imports."""
    sys.path.insert(0, str(model_file.parent))
    spec = importlib.util.spec_from_file_location("model", model_file)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import {model_file}")
    module = importlib.util.module_from_spec(spec)
    sys.modules["model"] = module
    spec.loader.exec_module(module)
    return module


# How long a worker whose server went away may take to finalize before it exits anyway.
_ORPHAN_GRACE_S = 10.0

# ErrorCode names (the server's) as TritonError codes, for a BLS call's failure.
_TRITON_CODES = {
    "NOT_FOUND": pb_utils.TritonError.NOT_FOUND,
    "INVALID_ARGUMENT": pb_utils.TritonError.INVALID_ARG,
    "UNAVAILABLE": pb_utils.TritonError.UNAVAILABLE,
    "UNIMPLEMENTED": pb_utils.TritonError.UNSUPPORTED,
    "ALREADY_EXISTS": pb_utils.TritonError.ALREADY_EXISTS,
    "CANCELLED": pb_utils.TritonError.CANCELLED,
}


class ModelWorker:
    """Serves one model instance over its control channel."""

    def __init__(self, options: argparse.Namespace, channel: ipc.Channel) -> None:
        self._options = options
        self._channel = channel
        self._send_lock = threading.Lock()  # the model may log from threads of its own
        self._inputs = ipc.ArenaReader()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._ring: Any = None  # inferd._worker.WorkerLoop, serving the batch ring
        self._model: Any = None
        self._decoupled = False
        # The chains of the models whose BLS calls led to the batch's requests (bls.py).
        self._batch_chains: list[tuple[str, ...]] = []
        # Messages for the main thread (execute, stop); None once the channel closed.
        self._inbox: queue.Queue[tuple[ipc.Message, list[int]] | None] = queue.Queue()
        self.calls = PendingCalls()
        # A decoupled model's batches with a request still open, by the server's number: the
        # server may end one of their requests (``close``). Under _batches_lock.
        self._batches_lock = threading.Lock()
        self._open_batches: dict[int, list[ResponseSender]] = {}

    def send(self, message: ipc.Message, fds: tuple[int, ...] = (), payload: bytes = b"") -> None:
        with self._send_lock:
            self._channel.send(message, fds, payload)

    def _log(self, level: str, message: str) -> None:
        """pb_utils' log sink: a structured record to the parent, which logs it."""
        self.send({"type": "log", "level": level, "message": message})

    def run(self) -> int:
        message, fds = self._channel.receive()
        for fd in fds:
            os.close(fd)
        if message.get("type") != "initialize":
            raise ValueError(f"expected 'initialize' first, got {message.get('type')!r}")
        # Before initialize, which may already call other models.
        threading.Thread(target=self._read, name="inferd-worker-reader", daemon=True).start()
        if not self._initialize(dict(message["args"])):
            return 1
        try:
            self._serve_batches()
        except (ipc.ChannelClosed, ConnectionError):
            # The server went away without a stop (maybe mid-batch): finalize all the same.
            self._finalize()
            return 0
        error = self._finalize()
        with contextlib.suppress(ConnectionError):
            self.send({"type": "stopped", "error": error})
        return 0

    def _read(self) -> None:
        """The reader thread: BLS answers to their callers, everything else to the main thread."""
        try:
            while True:
                message, fds = self._channel.receive()
                if message.get("type") in ("bls_result", "cancelled"):
                    self.calls.answer(message, fds)
                elif message.get("type") == "close":
                    self._end_request(message)
                else:
                    self._inbox.put((message, fds))
                    self._wake_ring()
        except (ipc.ChannelClosed, OSError, ValueError):
            self.calls.close("the server closed the worker's channel")
            self._inbox.put(None)
            self._wake_ring()
        # The server is gone (or stopping it): the main thread finalizes and exits, unless model
        # code holds it; then the process ends here, so that no worker outlives its server.
        time.sleep(_ORPHAN_GRACE_S)
        os._exit(1)

    def _end_request(self, message: ipc.Message) -> None:
        """The server ended a decoupled request (cancelled, past its deadline): its sender drops
        what the model sends from now on, and is_cancelled() says so."""
        with self._batches_lock:
            senders = self._open_batches.get(int(message.get("batch", 0)), [])
            index = int(message.get("index", -1))
            sender = senders[index] if 0 <= index < len(senders) else None
        if sender is not None:
            sender.end()

    def _wake_ring(self) -> None:
        """Makes the ring's loop look at the inbox (a stop, or the channel's end)."""
        if self._ring is not None:
            self._ring.wake()

    def _serve_batches(self) -> None:
        """Executes batches until the server says stop."""
        if self._ring is not None and not self._decoupled:
            self._ring.serve(
                self._model.execute,
                self._ring_request,
                self._await,
                self._report,
                pb_utils.InferenceResponse,
                lambda: not self._inbox.empty(),
            )
        while True:
            received = self._inbox.get()
            if received is None:
                raise ipc.ChannelClosed("the server closed the worker's channel")
            message, fds = received
            kind = message.get("type")
            if kind == "stop":
                return
            # Only a decoupled model's batches come here; the others' come on the ring.
            if kind != "execute" or not self._decoupled:
                raise ValueError(f"unknown control message {kind!r}")
            self._inputs.adopt(message, fds)
            self._execute(int(message.get("batch", 0)), list(message["requests"]))

    def _initialize(self, args: dict[str, str]) -> bool:
        sys.modules["triton_python_backend_utils"] = pb_utils
        pb_utils.set_log_sink(self._log)
        pb_utils.set_bls_executor(self._call_model)
        try:
            self._decoupled = pb_utils.using_decoupled_model_transaction_policy(
                json.loads(args["model_config"])
            )
            if self._options.ring is not None:
                worker_module = _load_worker_module(str(self._options.worker_module))
                self._ring = worker_module.WorkerLoop(self._options.ring)
            module = _import_model(self._options.model_file)
            model_class = getattr(module, "TritonPythonModel", None)
            if model_class is None:
                raise AttributeError(f"{self._options.model_file} defines no TritonPythonModel")
            self._model = model_class()
            initialize = getattr(self._model, "initialize", None)
            if initialize is not None:
                self._await(initialize(args))
        except Exception as error:
            traceback.print_exc()
            self.send({"type": "initialize_failed", "message": _describe(error)})
            return False
        self.send({"type": "ready", "ring": self._ring is not None})
        return True

    def _await(self, result: object) -> object:
        """``result`` itself, or what it resolves to when model code returned a coroutine."""
        if not inspect.isawaitable(result):
            return result
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(_resolve(result))

    def _execute(self, batch: int, wire_requests: list[ipc.Message]) -> None:
        self._batch_chains = []
        requests = [self._request(r) for r in wire_requests]
        cancellation = BatchCancellation(self, batch, len(requests))
        for index, request in enumerate(requests):
            request._attach_cancellation(functools.partial(cancellation.ask, index))
        self._execute_decoupled(requests, wire_requests, cancellation)

    def _execute_decoupled(
        self,
        requests: list[pb_utils.InferenceRequest],
        wire_requests: list[ipc.Message],
        cancellation: BatchCancellation,
    ) -> None:
        """A decoupled model's batch: its responses go out through the senders as they are
        sent; ``result`` says that execute returned (with its failure, which ends every request
        still open)."""
        senders = [
            ResponseSender(self, index, list(wire["requested_output_names"]), cancellation)
            for index, wire in enumerate(wire_requests)
        ]
        for request, sender in zip(requests, senders, strict=True):
            request._attach_response_sender(sender)
        with self._batches_lock:
            # Batches whose every request had its final flag are over: forgotten.
            self._open_batches = {
                number: old
                for number, old in self._open_batches.items()
                if any(s.open for s in old)
            }
            self._open_batches[cancellation.batch] = senders
        try:
            returned = self._await(self._model.execute(requests))
            if returned is not None:
                raise pb_utils.TritonModelException(
                    "a decoupled model's execute must return None (its responses go through "
                    f"each request's response sender), got {type(returned).__name__}"
                )
        except Exception as error:
            traceback.print_exc()
            for sender in senders:
                sender.close()
            with cancellation.closing(range(len(requests))):
                self.send({"type": "result", "error": _describe(error)})
            return
        # Requests the model gave back for another execute (an iterative model's): their senders
        # close here (a request whose final flag went out has ended: its rescheduling is moot).
        again = pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE
        rescheduled = [
            index
            for index, (request, sender) in enumerate(zip(requests, senders, strict=True))
            if request._release_flags == again and sender.close()
        ]
        self.send(
            {"type": "result", "rescheduled": rescheduled} if rescheduled else {"type": "result"}
        )

    def send_response(
        self,
        batch: int,
        index: int,
        response: pb_utils.InferenceResponse | None,
        final: bool,
        requested: list[str],
    ) -> None:
        """One response of a decoupled request (None: the final flag alone) to the parent: one
        ring message, its tensors in the ring's outputs arena."""
        outputs: list[tuple[str, npt.NDArray[Any]]] | None = None
        error: str | None = None
        if response is not None and response.has_error():
            failure = response.error()
            error = "" if failure is None else str(failure.message())
        elif response is not None:
            try:
                outputs = _outputs_of(response, requested)
            except (TypeError, ValueError) as failure:
                raise pb_utils.TritonModelException(str(failure)) from failure
        try:
            self._ring.respond(batch, index, final, outputs, error)
        except ValueError as failure:
            raise pb_utils.TritonModelException(str(failure)) from failure

    def _call_model(
        self, request: pb_utils.InferenceRequest, decoupled: bool
    ) -> pb_utils.InferenceResponse:
        """A BLS call (``InferenceRequest.exec``): the parent runs it on the named model through
        the core's scheduler. A failure of the call is the response's error, as in Triton."""
        if decoupled:
            raise pb_utils.TritonModelException(
                "InferenceRequest.exec(decoupled=True) is not supported by inferd: BLS calls "
                "models that answer once per request"
            )
        chain = list(call_chain(self._batch_chains, self._options.model)[:-1])
        timeout_us = max(int(request.timeout()), 0)
        deadline = time.monotonic() + (timeout_us / 1e6 if timeout_us else DEFAULT_CALL_TIMEOUT_S)
        call_id, answer = self.calls.open()
        if self._ring is not None:
            try:
                answered = self._call_on_ring(call_id, request, chain)
            except BaseException:
                self.calls.forget(call_id)
                raise
            if isinstance(answered, pb_utils.InferenceResponse):
                self.calls.forget(call_id)
                return answered
            if answered:  # its batch was answered first: the answer comes on the channel
                # Its timeout is kept here: no batch of the server's watches it any more.
                try:
                    late = answer.get(timeout=max(deadline - time.monotonic(), 0.0))
                except queue.Empty:
                    self.calls.forget(call_id)
                    return pb_utils.InferenceResponse(
                        error=pb_utils.TritonError(
                            f"model-to-model call to {request.model_name()!r} passed its deadline"
                        )
                    )
                return self._channel_answer(*late)
        # Outside a batch (initialize, a thread of the model's between batches), or a worker
        # without a ring: over the control channel.
        message: ipc.Message = {
            "type": "bls",
            "id": call_id,
            "model": request.model_name(),
            "version": request.model_version(),
            "requested_output_names": request.requested_output_names(),
            "request_id": request.request_id(),
            "parameters": request.parameters(),
            "timeout": request.timeout(),
            "chain": chain,
        }
        try:
            tensors = [(t.name(), np.asarray(t.as_numpy())) for t in request.inputs()]
            placed = ipc.TensorMessage(
                f"inferd-bls-{self._options.instance}", message, "inputs", tensors
            )
        except (TypeError, ValueError) as error:
            self.calls.forget(call_id)
            raise pb_utils.TritonModelException(str(error)) from error
        with placed:
            self.send(placed.message, placed.fds, placed.payload)
        return self._channel_answer(*answer.get())

    @staticmethod
    def _channel_answer(reply: ipc.Message, fds: list[int]) -> pb_utils.InferenceResponse:
        """A call's answer as the control channel brought it."""
        if "error" in reply:
            for fd in fds:
                os.close(fd)
            code = _TRITON_CODES.get(str(reply.get("code")), pb_utils.TritonError.INTERNAL)
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(str(reply["error"]), code))
        output_refs = [ipc.TensorRef.from_message(m) for m in reply["outputs"]]
        outputs = ipc.copy_out(reply, fds, output_refs)
        return pb_utils.InferenceResponse(
            output_tensors=[pb_utils.Tensor(ref.name, outputs[ref.name]) for ref in output_refs]
        )

    def _call_on_ring(
        self, call_id: int, request: pb_utils.InferenceRequest, chain: list[str]
    ) -> pb_utils.InferenceResponse | bool:
        """A BLS call on the ring, routed by the server's core: its answer; True when the answer
        comes on the control channel (its batch was answered first); False between batches (it
        was not sent)."""
        try:
            parameters = json.loads(request.parameters() or "{}")
            if not isinstance(parameters, dict):
                raise ValueError("request parameters must be a JSON object")
            inputs = [(t.name(), np.asarray(t.as_numpy())) for t in request.inputs()]
            answer = self._ring.call(
                call_id,
                request.model_name(),
                request.model_version(),
                request.request_id(),
                list(parameters.items()),
                chain,
                request.requested_output_names(),
                max(int(request.timeout()), 0),
                inputs,
            )
        except (TypeError, ValueError) as error:
            raise pb_utils.TritonModelException(str(error)) from error
        if answer is None:
            return False
        outputs, code, message = answer
        if outputs is None and code == 0:
            return True
        if code != 0:
            try:
                name = ErrorCode(code).name
            except ValueError:
                name = "INTERNAL"
            triton_code = _TRITON_CODES.get(name, pb_utils.TritonError.INTERNAL)
            return pb_utils.InferenceResponse(error=pb_utils.TritonError(message, triton_code))
        return pb_utils.InferenceResponse(
            output_tensors=[pb_utils.Tensor(name, array) for name, array in outputs]
        )

    def _ring_request(
        self,
        index: int,
        request_id: str,
        inputs: list[tuple[str, npt.NDArray[Any]]],
        requested: list[str],
        parameters: str,
        cancelled: Callable[[], bool],
        correlation_id: int | str = 0,
        flags: int = 0,
    ) -> pb_utils.InferenceRequest:
        """One request of a batch the ring brought, as the model gets it (the loop's
        ``make_request``); a stateful model's carries its sequence (``correlation_id()``,
        ``flags()``)."""
        if index == 0:
            self._batch_chains = []
        chain, parameters = split_chain(parameters)
        self._batch_chains.append(chain)
        request = pb_utils.InferenceRequest(
            model_name=self._options.model,
            inputs=[pb_utils.Tensor(name, array) for name, array in inputs],
            requested_output_names=requested,
            model_version=self._options.version,
            request_id=request_id,
            parameters=parameters,
            correlation_id=correlation_id,
            flags=flags,
        )
        request._attach_cancellation(cancelled)
        return request

    @staticmethod
    def _report(error: BaseException) -> str:
        """An exception from execute: its traceback to stderr (the server's log), and the message
        the batch's requests fail with."""
        traceback.print_exception(error)
        return _describe(error)

    def _request(self, wire: ipc.Message) -> pb_utils.InferenceRequest:
        # A decoupled request may outlive its batch (answered by a thread of the model's after
        # execute returned) while the server's next batch rewrites or replaces the arena: its
        # inputs are copied out. Others are views, used only while execute runs.
        copied = self._decoupled
        inputs = [
            pb_utils.Tensor(
                ref.name,
                np.array(self._inputs.view(ref), copy=True) if copied else self._inputs.view(ref),
            )
            for ref in (ipc.TensorRef.from_message(m) for m in wire["inputs"])
        ]
        chain, parameters = split_chain(str(wire.get("parameters", "{}")))
        self._batch_chains.append(chain)
        return pb_utils.InferenceRequest(
            model_name=self._options.model,
            inputs=inputs,
            requested_output_names=list(wire["requested_output_names"]),
            model_version=self._options.version,
            request_id=str(wire["request_id"]),
            correlation_id=wire.get("correlation_id", 0),
            flags=int(wire.get("flags", 0)),
            timeout=int(wire.get("timeout", 0)),
            parameters=parameters,
        )

    def _finalize(self) -> str | None:
        """Calls the model's finalize; its failure's text, or None."""
        finalize = getattr(self._model, "finalize", None)
        error: str | None = None
        if finalize is not None:
            try:
                self._await(finalize())
            except Exception as failure:
                traceback.print_exc()
                error = _describe(failure)
        if self._loop is not None:
            self._loop.close()
        return error


async def _resolve(awaitable: Any) -> object:
    return await awaitable


def _outputs_of(response: Any, requested: list[str]) -> list[tuple[str, npt.NDArray[Any]]]:
    """A response's output arrays, only the requested ones when the request named any."""
    outputs: list[tuple[str, npt.NDArray[Any]]] = []
    for tensor in response.output_tensors():
        name = str(tensor.name())
        if requested and name not in requested:
            continue
        array = np.asarray(tensor.as_numpy())
        ipc.datatype_of(array)  # raises TypeError naming the dtype no protocol datatype holds
        outputs.append((name, array))
    return outputs


def _auto_complete_config(options: argparse.Namespace, result_fd: int) -> int:
    """Runs the model's auto_complete_config on the config read from stdin and writes the
    completed config's JSON to ``result_fd``; on failure the last stderr line says why."""
    sys.modules["triton_python_backend_utils"] = pb_utils
    try:
        config = pb_utils.ModelConfig(sys.stdin.read())
        model_class = _import_model(options.model_file).TritonPythonModel
        completed = model_class.auto_complete_config(config)
        if not isinstance(completed, pb_utils.ModelConfig):
            raise pb_utils.TritonModelException(
                "auto_complete_config must return the ModelConfig it was given, "
                f"got {type(completed).__name__}"
            )
    except Exception as error:
        traceback.print_exc()
        print(_describe(error), file=sys.stderr)
        return 1
    with os.fdopen(result_fd, "w") as result:
        json.dump(completed.as_dict(), result)
    return 0


# prctl(2)'s option: the signal this process gets when its parent (thread) ends.
_PR_SET_PDEATHSIG = 1


def _die_with_parent(parent_pid: int) -> None:
    """SIGKILL when the server ends, however it ends (its SIGKILL included); and an exit now if
    it already has (the signal is only for deaths after the call)."""
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() != parent_pid:
        os._exit(1)


def main(argv: Sequence[str] | None = None) -> int:
    options = _parse_args(sys.argv[1:] if argv is None else argv)
    if options.parent_pid is not None:
        _die_with_parent(options.parent_pid)
    # The server stops its workers itself; a terminal's Ctrl-C reaches the whole process group.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    result_fd = os.dup(1)
    # stdout joins stderr: model prints reach the server's log, never its stdout.
    os.dup2(2, 1)
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    if options.auto_complete_config:
        return _auto_complete_config(options, result_fd)
    os.close(result_fd)
    os.set_inheritable(options.fd, False)  # processes the model starts must not hold the socket
    channel = ipc.Channel(socket.socket(fileno=options.fd))
    try:
        return ModelWorker(options, channel).run()
    finally:
        channel.close()


if __name__ == "__main__":
    sys.exit(main())
