"""Issue 17, items 3 and 4 in the worker: decoupled models' streamed responses and BLS calls.

Real worker processes (PythonModelProcess) serving model.py files written here from Triton's
documented API; BLS calls go to a ModelCaller stand-in that records them (the server's caller,
through the data plane, is covered by the integration tests), and the codec between a call and a
ModelInferRequest is checked against protobuf.
"""

from __future__ import annotations

import concurrent.futures
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import inferd._proto.grpc_service_pb2 as pb
from inferd import errors
from inferd.python_backend import ipc
from inferd.python_backend.bls import ModelCall, ModelOutputs
from inferd.python_backend.process import (
    PythonModelProcess,
    PythonRequest,
    PythonResponse,
)
from inferd.transport.bls import decode_answer, encode_call
from tests.unit.test_python_worker import _spec

REPEAT = """
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.threads = []

    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy().copy()
            sender = request.get_response_sender()
            if values.size and values[0] == -1:  # the final flag alone, from a thread, later
                def later(sender=sender):
                    time.sleep(0.2)
                    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                thread = threading.Thread(target=later)
                thread.start()
                self.threads.append(thread)
                continue
            if values.size and values[0] == -2:  # an error response mid-stream, then more
                sender.send(pb_utils.InferenceResponse(error=pb_utils.TritonError("bad -2")))
            for index, value in enumerate(values):
                sender.send(pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor("OUT", np.array([value], dtype=np.int32)),
                    pb_utils.Tensor("IDX", np.array([index], dtype=np.int32)),
                ]))
            if values.size and values[0] == -3:  # the last response carries the final flag
                sender.send(pb_utils.InferenceResponse(output_tensors=[
                    pb_utils.Tensor("OUT", np.array([99], dtype=np.int32)),
                    pb_utils.Tensor("IDX", np.array([values.size], dtype=np.int32)),
                ]), flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            else:
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            if values.size and values[0] == -4:  # nothing may follow the final flag
                try:
                    sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                except pb_utils.TritonModelException as error:
                    pb_utils.Logger.log_warn("refused: " + error.message())
        return None
"""

RAISES_AFTER_ONE = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        sender = requests[0].get_response_sender()
        sender.send(pb_utils.InferenceResponse(output_tensors=[
            pb_utils.Tensor("OUT", np.array([1], dtype=np.int32)),
            pb_utils.Tensor("IDX", np.array([0], dtype=np.int32)),
        ]))
        raise RuntimeError("generation broke")
"""

RETURNS_RESPONSES = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[]) for _ in requests]
"""

BLS = """
import asyncio
import json

import numpy as np
import triton_python_backend_utils as pb_utils


def call(target, x):
    return pb_utils.InferenceRequest(
        model_name=target,
        requested_output_names=["Y"],
        inputs=[pb_utils.Tensor("X", x), pb_utils.Tensor("TEXT", np.array([b"hi"], dtype=object))],
        request_id="call-" + target,
        parameters={"flavour": "mint"},
    )


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            target = json.loads(request.parameters()).get("target", "double")
            if target == "gather":
                calls = [call("double", x + i).async_exec() for i in range(8)]
                answers = await asyncio.gather(*calls)
            else:
                answers = [call(target, x).exec()]
            error = next((a.error() for a in answers if a.has_error()), None)
            if error is not None:
                responses.append(pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(f"{error.code()}: {error.message()}")))
                continue
            total = sum(pb_utils.get_output_tensor_by_name(a, "Y").as_numpy() for a in answers)
            output = pb_utils.Tensor("Y", total)
            responses.append(pb_utils.InferenceResponse(output_tensors=[output]))
        return responses
"""


class RecordingCaller:
    """A ModelCaller that answers "double" with 2*X on a thread, and fails every other model."""

    def __init__(self) -> None:
        self.calls: list[ModelCall] = []
        self._lock = threading.Lock()
        self._pool = concurrent.futures.ThreadPoolExecutor(4)

    def submit(self, call: ModelCall) -> concurrent.futures.Future[ModelOutputs]:
        with self._lock:
            self.calls.append(call)
        return self._pool.submit(self._answer, call)

    @staticmethod
    def _answer(call: ModelCall) -> ModelOutputs:
        if call.model != "double":
            raise errors.NotFound(f"model {call.model!r} is not served")
        return {"Y": call.inputs["X"] * 2}

    def close(self) -> None:
        self._pool.shutdown()


@pytest.fixture
def process_of(tmp_path: Path) -> Iterator[Callable[..., PythonModelProcess]]:
    started: list[PythonModelProcess] = []

    def start(
        source: str, name: str, decoupled: bool = False, caller: Any = None
    ) -> PythonModelProcess:
        process = PythonModelProcess(_spec(tmp_path, source, name, decoupled=decoupled), caller)
        process.start(timeout_s=30)
        started.append(process)
        return process

    yield start
    for process in started:
        process.stop(grace_s=5)


def _request(values: list[int]) -> PythonRequest:
    return PythonRequest(request_id="", inputs={"IN": np.array(values, dtype=np.int32)})


def _streamed(
    process: PythonModelProcess, batch: list[PythonRequest]
) -> tuple[list[tuple[int, PythonResponse]], list[PythonResponse | None]]:
    streamed: list[tuple[int, PythonResponse]] = []
    finals = process.execute(batch, lambda index, response: streamed.append((index, response)))
    return streamed, finals


def test_a_decoupled_batch_streams_each_requests_responses_in_order_then_its_final(
    process_of: Callable[..., PythonModelProcess],
) -> None:
    process = process_of(REPEAT, "repeat", decoupled=True)
    streamed, finals = _streamed(process, [_request([5, 6, 7]), _request([]), _request([-3, 4])])
    by_request: dict[int, list[tuple[int, int]]] = {0: [], 1: [], 2: []}
    for index, response in streamed:
        assert response.error is None
        by_request[index].append((int(response.outputs["IDX"][0]), int(response.outputs["OUT"][0])))
    assert by_request == {0: [(0, 5), (1, 6), (2, 7)], 1: [], 2: [(0, -3), (1, 4)]}
    assert finals[0] is None and finals[1] is None  # the final flag alone
    last = finals[2]
    assert last is not None and int(last.outputs["OUT"][0]) == 99  # sent with the final flag


def test_a_final_flag_sent_from_a_thread_after_execute_returned_ends_the_batch(
    process_of: Callable[..., PythonModelProcess],
) -> None:
    process = process_of(REPEAT, "repeat", decoupled=True)
    streamed, finals = _streamed(process, [_request([-1]), _request([3])])
    assert [(i, int(r.outputs["OUT"][0])) for i, r in streamed] == [(1, 3)]
    assert finals == [None, None]
    # The instance serves the next batch afterwards.
    streamed, finals = _streamed(process, [_request([8])])
    assert [int(r.outputs["OUT"][0]) for _, r in streamed] == [8] and finals == [None]


def test_an_error_response_mid_stream_is_streamed_and_the_request_goes_on(
    process_of: Callable[..., PythonModelProcess],
) -> None:
    process = process_of(REPEAT, "repeat", decoupled=True)
    streamed, finals = _streamed(process, [_request([-2, 1])])
    assert streamed[0][1].error == "bad -2"
    assert [int(r.outputs["OUT"][0]) for _, r in streamed[1:]] == [-2, 1]
    assert finals == [None]


def test_nothing_follows_a_final_flag(process_of: Callable[..., PythonModelProcess]) -> None:
    process = process_of(REPEAT, "repeat", decoupled=True)
    streamed, finals = _streamed(process, [_request([-4])])
    assert len(streamed) == 1 and finals == [None]
    streamed, finals = _streamed(process, [_request([2])])  # and the instance goes on
    assert len(streamed) == 1 and finals == [None]


def test_execute_raising_ends_every_open_request_with_its_message(
    process_of: Callable[..., PythonModelProcess],
) -> None:
    process = process_of(RAISES_AFTER_ONE, "raises", decoupled=True)
    streamed, finals = _streamed(process, [_request([1]), _request([2])])
    assert [i for i, _ in streamed] == [0]
    assert [f.error if f else None for f in finals] == ["RuntimeError: generation broke"] * 2


def test_a_decoupled_execute_must_return_none(
    process_of: Callable[..., PythonModelProcess],
) -> None:
    process = process_of(RETURNS_RESPONSES, "returns", decoupled=True)
    _, finals = _streamed(process, [_request([1])])
    assert finals[0] is not None and "must return None" in str(finals[0].error)


ASKS = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.decoupled = pb_utils.using_decoupled_model_transaction_policy(
            __import__("json").loads(args["model_config"]))

    def execute(self, requests):
        responses = []
        for request in requests:
            asked = [request.is_cancelled()]
            if self.decoupled:
                asked.append(request.get_response_sender().is_cancelled())
            out = pb_utils.Tensor("OUT", np.array(asked, dtype=np.int32))
            response = pb_utils.InferenceResponse(output_tensors=[out])
            if not self.decoupled:
                responses.append(response)
                continue
            sender = request.get_response_sender()
            sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
            asked_after = sender.is_cancelled()  # closed: answered from what was last heard
            assert asked_after == asked[1], (asked_after, asked)
        return None if self.decoupled else responses
"""


@pytest.mark.parametrize("decoupled", [False, True])
def test_is_cancelled_asks_the_server_about_each_request_of_the_batch(
    process_of: Callable[..., PythonModelProcess], decoupled: bool
) -> None:
    process = process_of(ASKS, "asks", decoupled=decoupled)
    batch = [_request([0]), _request([1]), _request([2])]
    batch[0].cancelled = lambda: True
    batch[1].cancelled = lambda: False  # batch[2]: not tracked
    answers = process.execute(batch, lambda index, response: None)
    outputs = [answer.outputs["OUT"].tolist() for answer in answers if answer is not None]
    assert all(answer is not None and answer.error is None for answer in answers), answers
    if decoupled:
        assert outputs == [[1, 1], [0, 0], [0, 0]]
    else:
        assert outputs == [[1], [0], [0]]


def _bls_request(target: str) -> PythonRequest:
    x = np.array([[1.0, 2.0]], dtype=np.float32)
    return PythonRequest(request_id="", inputs={"X": x}, parameters=json.dumps({"target": target}))


def test_bls_calls_reach_the_model_caller_and_their_answers_come_back(
    process_of: Callable[..., PythonModelProcess],
) -> None:
    caller = RecordingCaller()
    try:
        process = process_of(BLS, "bls", caller=caller)
        (answer,) = process.execute([_bls_request("double")])
        assert answer is not None and answer.error is None
        np.testing.assert_array_equal(answer.outputs["Y"], [[2.0, 4.0]])
        (call,) = caller.calls
        assert (call.model, call.version, call.requested_output_names) == ("double", -1, ["Y"])
        assert call.request_id == "call-double" and json.loads(call.parameters) == {
            "flavour": "mint"
        }
        assert call.inputs["TEXT"].tolist() == [b"hi"]
    finally:
        caller.close()


def test_concurrent_async_bls_calls_each_get_their_own_answer(
    process_of: Callable[..., PythonModelProcess],
) -> None:
    caller = RecordingCaller()
    try:
        process = process_of(BLS, "bls", caller=caller)
        (answer,) = process.execute([_bls_request("gather")])
        assert answer is not None and answer.error is None
        # sum over i of 2 * (x + i), i = 0..7
        np.testing.assert_array_equal(answer.outputs["Y"], [[2 * 8 * 1.0 + 56, 2 * 8 * 2.0 + 56]])
        assert len(caller.calls) == 8
    finally:
        caller.close()


def test_a_failed_bls_call_is_the_responses_error_with_tritons_code(
    process_of: Callable[..., PythonModelProcess],
) -> None:
    caller = RecordingCaller()
    try:
        process = process_of(BLS, "bls", caller=caller)
        (missing, itself) = process.execute([_bls_request("missing"), _bls_request("bls")])
        assert (
            missing is not None and missing.error == "2: model 'missing' is not served"
        )  # NOT_FOUND
        assert itself is not None and itself.error == "3: python model 'bls' cannot call itself"
        assert [c.model for c in caller.calls] == ["missing"]  # the self-call never left
    finally:
        caller.close()


def test_without_a_model_caller_bls_answers_unavailable(
    process_of: Callable[..., PythonModelProcess],
) -> None:
    process = process_of(BLS, "bls")
    (answer,) = process.execute([_bls_request("double")])
    assert answer is not None and answer.error is not None
    assert answer.error.startswith("4: ") and "not available" in answer.error


def test_a_call_encodes_as_the_model_infer_request_protobuf_reads() -> None:
    call = ModelCall(
        model="m",
        version=3,
        inputs={
            "A": np.arange(6, dtype=np.float32).reshape(2, 3),
            "S": np.array([b"x", "y\u00e9"], dtype=object),
        },
        requested_output_names=["B"],
        request_id="r1",
        parameters='{"on": true, "n": 7, "s": "t"}',
    )
    request = pb.ModelInferRequest.FromString(encode_call(call))
    assert (request.model_name, request.model_version, request.id) == ("m", "3", "r1")
    assert [(t.name, t.datatype, list(t.shape)) for t in request.inputs] == [
        ("A", "FP32", [2, 3]),
        ("S", "BYTES", [2]),
    ]
    assert np.frombuffer(request.raw_input_contents[0], np.float32).tolist() == list(range(6))
    assert request.raw_input_contents[1] == b"\x01\x00\x00\x00x\x03\x00\x00\x00y\xc3\xa9"
    assert [o.name for o in request.outputs] == ["B"]
    assert request.parameters["on"].bool_param is True
    assert request.parameters["n"].int64_param == 7
    assert request.parameters["s"].string_param == "t"
    assert pb.ModelInferRequest.FromString(encode_call(ModelCall("m", -1, {}))).model_version == ""
    with pytest.raises(errors.InvalidArgument, match="bool, int or str"):
        encode_call(ModelCall("m", -1, {}, parameters='{"f": 1.5}'))


def test_an_answer_decodes_from_model_infer_response_bytes() -> None:
    response = pb.ModelInferResponse(model_name="m")
    response.outputs.add(name="Y", datatype="INT64", shape=[2])
    response.outputs.add(name="T", datatype="BYTES", shape=[1, 1])
    response.raw_output_contents.append(np.array([4, 5], dtype=np.int64).tobytes())
    response.raw_output_contents.append(b"\x02\x00\x00\x00ok")
    outputs = decode_answer(response.SerializeToString())
    assert outputs["Y"].tolist() == [4, 5] and outputs["T"].tolist() == [[b"ok"]]


SLEEPS = """
import os
import time


class TritonPythonModel:
    def execute(self, requests):
        here = os.path.dirname(os.path.abspath(__file__))
        open(os.path.join(here, "in_execute"), "w").close()  # the test waits for it
        time.sleep(60)
        return None
"""


def test_a_worker_whose_server_is_gone_exits_even_inside_execute(tmp_path: Path) -> None:
    # Decoupled: its batches come over the control socket (the others' come on a ring, which a
    # test driving the socket alone does not have).
    spec = _spec(tmp_path, SLEEPS, "sleeps", decoupled=True)
    parent, child = socket.socketpair()
    command = [sys.executable, "-m", "inferd.python_backend.worker", "--model", "sleeps"]
    command += ["--version", "1", "--instance", "sleeps_0", "--model-file", str(spec.model_file)]
    worker = subprocess.Popen([*command, "--fd", str(child.fileno())], pass_fds=(child.fileno(),))
    child.close()
    try:
        channel = ipc.Channel(parent)
        channel.send({"type": "initialize", "args": spec.initialize_args()})
        assert channel.receive()[0]["type"] == "ready"
        channel.send({"type": "execute", "requests": []})
        in_execute = spec.model_file.parent / "in_execute"
        deadline = time.monotonic() + 30
        while not in_execute.exists():  # inside its 60 s execute
            assert time.monotonic() < deadline, "the model never entered execute"
            time.sleep(0.01)  # the poll's period
        started = time.monotonic()
        parent.close()  # the server is gone
        assert worker.wait(timeout=30) == 1
        print(f"the orphaned worker exited {time.monotonic() - started:.1f} s later")
    finally:
        worker.kill()
        worker.wait()
