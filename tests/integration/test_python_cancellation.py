"""A python model learns that its request was cancelled while it runs (``request.is_cancelled()``
and the response sender's ``is_cancelled()``, Triton's): a client that cancels its stream or its
call, or whose deadline passes, frees the instance as soon as the model asks, instead of leaving
it generating for nobody. Through a real server and tritonclient."""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.integration.conftest import ServerProcess, running_server
from tests.integration.ensemble_models import _step, ensemble_config, write_ensemble

# Streams COUNT responses, one every 10 ms, asking before each whether the request was cancelled;
# a cancelled request gets its final flag at once. Each request's id, when it starts and how it
# ends, goes to the file named by the "record" parameter.
GENERATE = """
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.record = config["parameters"]["record"]["string_value"]

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy().flat[0])
            with open(self.record, "a") as record:
                record.write(f"{request.request_id()} started\\n")
            ended = "completed"
            for step in range(count):
                if sender.is_cancelled():
                    ended = "cancelled"
                    break
                out = pb_utils.Tensor("OUT", np.array([step], np.int32))
                sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
                time.sleep(0.01)
            with open(self.record, "a") as record:
                record.write(f"{request.request_id()} {ended}\\n")
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""

# Waits up to SECONDS for its request to be cancelled, asking every 10 ms; records as above.
WAIT = """
import json
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.record = config["parameters"]["record"]["string_value"]

    def execute(self, requests):
        responses = []
        for request in requests:
            seconds = pb_utils.get_input_tensor_by_name(request, "SECONDS").as_numpy().flat[0]
            until = time.monotonic() + float(seconds)
            with open(self.record, "a") as record:
                record.write(f"{request.request_id()} started\\n")
            ended = "completed"
            while time.monotonic() < until:
                if request.is_cancelled():
                    ended = "cancelled"
                    break
                time.sleep(0.01)
            with open(self.record, "a") as record:
                record.write(f"{request.request_id()} {ended}\\n")
            out = pb_utils.Tensor("OUT", np.array([1 if ended == "cancelled" else 0], np.int32))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out]))
        return responses
"""


def write_model(model_dir: Path, code: str, tensor: str, datatype: str, extra: str) -> Path:
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "1" / "model.py").write_text(code)
    record = model_dir.parent.parent / f"{model_dir.name}.record"
    (model_dir / "config.pbtxt").write_text(
        f'name: "{model_dir.name}"\nbackend: "python"\nmax_batch_size: 0\n'
        f'input [ {{ name: "{tensor}" data_type: {datatype} dims: [ 1 ] }} ]\n'
        'output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
        f'parameters {{ key: "record" value: {{ string_value: "{record}" }} }}\n' + extra
    )
    return record


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("python-cancellation")
    repository = root / "models"
    decoupled = "model_transaction_policy { decoupled: true }\n"
    write_model(repository / "generate", GENERATE, "COUNT", "TYPE_INT32", decoupled)
    write_model(repository / "wait", WAIT, "SECONDS", "TYPE_FP32", "")
    # An ensemble whose only step is `wait`.
    step = _step("wait", {"SECONDS": "SECONDS"}, {"OUT": "OUT"})
    write_ensemble(
        repository / "wait_chain",
        ensemble_config(
            "wait_chain", {"SECONDS": "TYPE_FP32 [ 1 ]"}, {"OUT": "TYPE_INT32 [ 1 ]"}, [step], 0
        ),
    )
    with running_server(repository, ["generate", "wait", "wait_chain"], root) as running:
        yield running


@pytest.fixture
def client(server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    triton = grpcclient.InferenceServerClient(server.url)
    try:
        yield triton
    finally:
        triton.close()


def recorded(server: ServerProcess, model: str, request_id: str, started: bool) -> str:
    """What the model recorded of ``request_id`` (that it started, or how it ended), once it
    has."""
    record = server.repository.parent / f"{model}.record"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if record.exists():
            for line in record.read_text().splitlines():
                recorded_id, what = line.split(" ", 1)
                if recorded_id == request_id and (what == "started") == started:
                    return what
        time.sleep(0.01)
    pytest.fail(f"{model} recorded nothing of {request_id} within 30 s")


def ended(server: ServerProcess, model: str, request_id: str) -> str:
    return recorded(server, model, request_id, started=False)


def wait_until_running(server: ServerProcess, model: str, request_id: str) -> None:
    recorded(server, model, request_id, started=True)


def count_input(count: int) -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("COUNT", [1], "INT32")
    tensor.set_data_from_numpy(np.array([count], np.int32))
    return [tensor]


def seconds_input(seconds: float) -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("SECONDS", [1], "FP32")
    tensor.set_data_from_numpy(np.array([seconds], np.float32))
    return [tensor]


def stream(
    client: grpcclient.InferenceServerClient, count: int, request_id: str
) -> queue.Queue[tuple[Any, Any]]:
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    client.async_stream_infer("generate", count_input(count), request_id=request_id)
    return answers


def test_a_stream_cancelled_mid_generation_ends_the_generation(
    server: ServerProcess, client: grpcclient.InferenceServerClient
) -> None:
    answers = stream(client, 3000, "long")  # 30 s of responses, unless cancelled
    for step in range(3):
        result, error = answers.get(timeout=30)
        assert error is None, error
        assert result.as_numpy("OUT").tolist() == [step]
    started = time.monotonic()
    client.stop_stream(cancel_requests=True)
    assert ended(server, "generate", "long") == "cancelled"
    assert time.monotonic() - started < 5
    # The instance is free again: the next stream is answered in full, never told it was cancelled.
    answers = stream(client, 3, "short")
    outputs = []
    for _ in range(3):
        result, error = answers.get(timeout=30)
        assert error is None, error
        outputs.append(result.as_numpy("OUT").tolist())
    client.stop_stream()
    assert outputs == [[0], [1], [2]]
    assert ended(server, "generate", "short") == "completed"


def test_a_cancelled_call_is_cancelled_for_the_model(
    server: ServerProcess, client: grpcclient.InferenceServerClient
) -> None:
    answers: queue.Queue[Any] = queue.Queue()
    call = client.async_infer(
        "wait", seconds_input(30), lambda result, error: answers.put(error), request_id="cancel"
    )
    wait_until_running(server, "wait", "cancel")  # a queued request would leave the queue
    call.cancel()
    error = answers.get(timeout=30)
    assert isinstance(error, InferenceServerException) and "CANCELLED" in str(error.status())
    assert ended(server, "wait", "cancel") == "cancelled"


def test_a_cancelled_ensemble_call_is_cancelled_for_its_running_python_step(
    server: ServerProcess, client: grpcclient.InferenceServerClient
) -> None:
    answers: queue.Queue[Any] = queue.Queue()
    call = client.async_infer(
        "wait_chain",
        seconds_input(30),
        lambda result, error: answers.put(error),
        request_id="ensemble",
    )
    wait_until_running(server, "wait", "ensemble")
    call.cancel()
    error = answers.get(timeout=30)
    assert isinstance(error, InferenceServerException) and "CANCELLED" in str(error.status())
    assert ended(server, "wait", "ensemble") == "cancelled"


def test_a_call_past_its_deadline_is_cancelled_for_the_model(
    server: ServerProcess, client: grpcclient.InferenceServerClient
) -> None:
    # 2 s: time enough to reach the model on a loaded machine (queued, it would expire there).
    with pytest.raises(InferenceServerException) as late:
        client.infer("wait", seconds_input(30), request_id="deadline", client_timeout=2)
    assert late.value.status() == "StatusCode.DEADLINE_EXCEEDED"
    assert ended(server, "wait", "deadline") == "cancelled"


def test_a_call_that_is_not_cancelled_is_never_told_it_was(
    server: ServerProcess, client: grpcclient.InferenceServerClient
) -> None:
    result = client.infer("wait", seconds_input(0.2), request_id="whole")
    assert result.as_numpy("OUT").tolist() == [0]
    assert ended(server, "wait", "whole") == "completed"
