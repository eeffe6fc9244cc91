"""A python-backend model instance's own process.

Run by ``PythonModelProcess`` (process.py) as::

    python -m inferd.python_backend.worker --model NAME --version N --instance NAME_K \\
        --model-file PATH --fd FD

The command line names the model, version and instance so that operators find the process
with ``ps``. ``--fd`` is the worker's end of the control socket (ipc.py). The worker imports
``model.py`` from its path with inferd's ``triton_python_backend_utils`` in place, builds
``TritonPythonModel``, calls ``initialize(args)`` with the args Triton documents (every value a
string), then serves batches one at a time until told to stop, when it calls ``finalize()``.

Failures, as Triton's python backend has them: an exception raised by ``execute`` fails every
request of its batch with the exception's message; an ``InferenceResponse`` with an error fails
only its own request; ``execute`` returning anything but one response per request fails the
whole batch saying so.

Logs: ``pb_utils.Logger`` records go to the parent as structured ``log`` messages (the parent
logs them with the model, version and instance); ``print`` and anything else written to stdout or
stderr goes to the server's stderr (the worker's stdout is pointed at its stderr, which it
inherits), so stdout never mixes with the parent's own output.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import inspect
import os
import signal
import socket
import sys
import threading
import traceback
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import numpy.typing as npt

from inferd.python_backend import ipc, pb_utils


def _parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="inferd.python_backend.worker")
    parser.add_argument("--model", required=True, help="the model's name")
    parser.add_argument("--version", required=True, type=int, help="the model version")
    parser.add_argument("--instance", required=True, help="the instance's name, e.g. add_sub_0")
    parser.add_argument("--model-file", required=True, type=Path, help="the version's model.py")
    parser.add_argument("--fd", required=True, type=int, help="the control socket's descriptor")
    return parser.parse_args(argv)


def _describe(error: BaseException) -> str:
    text = str(error)
    if isinstance(error, pb_utils.TritonModelException | pb_utils.TritonError):
        return text or type(error).__name__
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


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


class ModelWorker:
    """Serves one model instance over its control channel."""

    def __init__(self, options: argparse.Namespace, channel: ipc.Channel) -> None:
        self._options = options
        self._channel = channel
        self._send_lock = threading.Lock()  # the model may log from threads of its own
        self._inputs = ipc.ArenaReader()
        self._outputs = ipc.ArenaWriter(f"inferd-outputs-{options.instance}")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._model: Any = None

    def send(self, message: ipc.Message, fds: tuple[int, ...] = ()) -> None:
        with self._send_lock:
            self._channel.send(message, fds)

    def _log(self, level: str, message: str) -> None:
        """pb_utils' log sink: a structured record to the parent, which logs it."""
        self.send({"type": "log", "level": level, "message": message})

    def run(self) -> int:
        message, fds = self._channel.receive()
        for fd in fds:
            os.close(fd)
        if message.get("type") != "initialize":
            raise ValueError(f"expected 'initialize' first, got {message.get('type')!r}")
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

    def _serve_batches(self) -> None:
        """Executes batches until the server says stop."""
        while True:
            message, fds = self._channel.receive()
            kind = message.get("type")
            if kind == "stop":
                return
            if kind != "execute":
                raise ValueError(f"unknown control message {kind!r}")
            self._inputs.adopt(message, fds)
            self._execute(list(message["requests"]))

    def _initialize(self, args: dict[str, str]) -> bool:
        sys.modules["triton_python_backend_utils"] = pb_utils
        pb_utils.set_log_sink(self._log)
        try:
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
        self.send({"type": "ready"})
        return True

    def _await(self, result: object) -> object:
        """``result`` itself, or what it resolves to when model code returned a coroutine."""
        if not inspect.isawaitable(result):
            return result
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
        return self._loop.run_until_complete(_resolve(result))

    def _execute(self, wire_requests: list[ipc.Message]) -> None:
        requests = [self._request(r) for r in wire_requests]
        try:
            responses = self._await(self._model.execute(requests))
            self._check_responses(responses, len(requests))
        except Exception as error:
            traceback.print_exc()
            self._reply_all_failed(len(requests), _describe(error))
            return
        assert isinstance(responses, list | tuple)
        self._reply(list(responses), wire_requests)

    @staticmethod
    def _check_responses(responses: object, expected: int) -> None:
        if not isinstance(responses, list | tuple):
            raise pb_utils.TritonModelException(
                f"execute must return a list of InferenceResponse, got {type(responses).__name__}"
            )
        if len(responses) != expected:
            raise pb_utils.TritonModelException(
                f"execute returned {len(responses)} responses for {expected} requests: "
                "it must return one InferenceResponse per request, in order"
            )
        for index, response in enumerate(responses):
            if not isinstance(response, pb_utils.InferenceResponse):
                raise pb_utils.TritonModelException(
                    f"execute returned a {type(response).__name__} at position {index}, "
                    "not an InferenceResponse"
                )

    def _request(self, wire: ipc.Message) -> pb_utils.InferenceRequest:
        inputs = [
            pb_utils.Tensor(ref.name, self._inputs.view(ref))
            for ref in (ipc.TensorRef.from_message(m) for m in wire["inputs"])
        ]
        return pb_utils.InferenceRequest(
            model_name=self._options.model,
            inputs=inputs,
            requested_output_names=list(wire["requested_output_names"]),
            model_version=self._options.version,
            request_id=str(wire["request_id"]),
            correlation_id=wire.get("correlation_id", 0),
            flags=int(wire.get("flags", 0)),
            timeout=int(wire.get("timeout", 0)),
            parameters=str(wire.get("parameters", "{}")),
        )

    def _reply_all_failed(self, count: int, message: str) -> None:
        self.send({"type": "result", "responses": [{"error": message}] * count})

    def _reply(self, responses: list[Any], wire_requests: list[ipc.Message]) -> None:
        answers: list[ipc.Message] = []
        placed: list[tuple[str, npt.NDArray[Any]]] = []
        spans: list[tuple[int, int]] = []  # per successful response: its outputs in `placed`
        for response, wire in zip(responses, wire_requests, strict=True):
            if response.has_error():
                answers.append({"error": str(response.error().message())})
                continue
            try:
                outputs = _outputs_of(response, list(wire["requested_output_names"]))
            except (TypeError, ValueError) as error:
                answers.append({"error": str(error)})
                continue
            spans.append((len(placed), len(placed) + len(outputs)))
            placed.extend(outputs)
            answers.append({"outputs": []})
        try:
            refs, replaced = self._outputs.place(placed)
        except (TypeError, ValueError) as error:
            self._reply_all_failed(len(responses), str(error))
            return
        ok = iter(spans)
        for answer in answers:
            if "outputs" in answer:
                start, end = next(ok)
                answer["outputs"] = [ref.to_message() for ref in refs[start:end]]
        message: ipc.Message = {"type": "result", "responses": answers}
        if replaced is None:
            self.send(message)
        else:
            message["arena_size"] = replaced.size
            self.send(message, (replaced.fd,))

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


def main(argv: Sequence[str] | None = None) -> int:
    options = _parse_args(sys.argv[1:] if argv is None else argv)
    # The server stops its workers itself; a terminal's Ctrl-C reaches the whole process group.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # stdout joins stderr: model prints reach the server's log, never its stdout.
    os.dup2(2, 1)
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    os.set_inheritable(options.fd, False)  # processes the model starts must not hold the socket
    channel = ipc.Channel(socket.socket(fileno=options.fd))
    try:
        return ModelWorker(options, channel).run()
    finally:
        channel.close()


if __name__ == "__main__":
    sys.exit(main())
