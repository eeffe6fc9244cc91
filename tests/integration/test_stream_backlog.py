"""Answers waiting to be sent on a stream are bounded (issue 25, items 2 and 3): a decoupled python
model that streams 64 KiB responses to a client that reads none made the server hold every one of
them (3.4 GB in 18 s, still held after the client left). Past --stream-max-pending-bytes per call,
or --max-inflight-bytes for every stream together, the request fails RESOURCE_EXHAUSTED and is
cancelled, so the model stops, and the memory is the server's again. Through grpcio streams that
never read (their HTTP/2 window fills) against a real server."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient

import inferd._proto.grpc_service_pb2 as pb
import inferd._proto.grpc_service_pb2_grpc as pb_grpc
from tests.integration.conftest import UNDER_ASAN, ServerProcess, running_server

# Streams COUNT responses of 64 KiB as fast as it can, stopping when told the request was
# cancelled; records how many it sent.
FLOOD = """
import json

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
            sent = 0
            while sent < count and not sender.is_cancelled():
                out = pb_utils.Tensor("OUT", np.full([65536], sent % 256, np.uint8))
                sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
                sent += 1
            with open(self.record, "a") as record:
                record.write(f"{request.request_id()} {sent}\\n")
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""
RESPONSE = 65536
PER_CALL = 8 << 20
COUNT = 4000  # 250 MiB of responses


def write_flood(repository: Path) -> Path:
    model = repository / "flood"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text(FLOOD)
    record = repository.parent / "flood.record"
    (model / "config.pbtxt").write_text(
        'name: "flood"\nbackend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUT" data_type: TYPE_UINT8 dims: [ -1 ] } ]\n'
        "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
        "model_transaction_policy { decoupled: true }\n"
        f'parameters {{ key: "record" value: {{ string_value: "{record}" }} }}\n'
    )
    return record


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("stream-backlog")
    write_flood(root / "models")
    with running_server(
        root / "models",
        ["flood"],
        root,
        "--stream-max-pending-bytes",
        str(PER_CALL),
        "--max-inflight-bytes",
        str(64 << 20),
    ) as running:
        yield running


def sent_by(server: ServerProcess, request_id: str) -> int:
    """How many responses the model sent for ``request_id``, once it has stopped."""
    record = server.repository.parent / "flood.record"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if record.exists():
            for line in record.read_text().splitlines():
                recorded, sent = line.split(" ")
                if recorded == request_id:
                    return int(sent)
        time.sleep(0.02)
    pytest.fail(f"the model never stopped sending for {request_id}")


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def flood_request(request_id: str, count: int) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="flood", id=request_id)
    tensor = request.inputs.add(name="COUNT", datatype="INT32", shape=[1])
    tensor.contents.int_contents.append(count)
    return request


class SilentStream:
    """A ModelStreamInfer call that sends requests and reads nothing until ``read_all``."""

    def __init__(self, channel: grpc.Channel) -> None:
        self._requests: queue.Queue[pb.ModelInferRequest | None] = queue.Queue()
        self.call = pb_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(
            iter(self._requests.get, None), timeout=120
        )

    def send(self, request: pb.ModelInferRequest) -> None:
        self._requests.put(request)

    def close(self) -> None:
        self._requests.put(None)


def test_a_stream_that_reads_nothing_holds_a_bounded_backlog_and_its_request_fails(
    server: ServerProcess,
) -> None:
    before = rss_bytes(server.process.pid)
    with grpc.insecure_channel(server.url) as channel:
        silent = SilentStream(channel)
        silent.send(flood_request("deluge", COUNT))
        sent = sent_by(server, "deluge")
        held = rss_bytes(server.process.pid) - before
        # 8 MiB waiting per call, plus what HTTP/2's windows took: far from all 250 MiB.
        assert sent < COUNT // 4, f"the model sent {sent} responses before it was stopped"
        # Under AddressSanitizer RSS is its allocator's (conftest.UNDER_ASAN): plain runs check it.
        assert UNDER_ASAN or held < 96 << 20, f"the server holds {held / 2**20:.0f} MiB more"
        silent.close()
        answers = list(silent.call)
    errors = [a.error_message for a in answers if a.error_message]
    values = [a.infer_response.raw_output_contents[0][0] for a in answers if not a.error_message]
    assert len(errors) == 1, errors
    assert "waiting to be sent passed their bound (8388608 bytes per call" in errors[0]
    assert answers[-1].error_message, "the error is the request's last answer"
    assert values == [k % 256 for k in range(len(values))], "the responses before it, in order"
    assert PER_CALL // RESPONSE // 2 <= len(values) <= sent


def test_many_silent_streams_together_stay_within_the_servers_budget(
    server: ServerProcess,
) -> None:
    before = rss_bytes(server.process.pid)
    with grpc.insecure_channel(server.url) as channel:
        streams = [SilentStream(channel) for _ in range(6)]
        for index, stream in enumerate(streams):
            stream.send(flood_request(f"silent-{index}", COUNT))
            assert sent_by(server, f"silent-{index}") < COUNT // 4
        held = rss_bytes(server.process.pid) - before
        assert UNDER_ASAN or held < 160 << 20, f"six silent streams hold {held >> 20} MiB more"
        for stream in streams:
            stream.call.cancel()
    # Once they are gone the server serves a client that reads, whole.
    client = grpcclient.InferenceServerClient(server.url)
    answers: queue.Queue[tuple[object, object]] = queue.Queue()
    done = threading.Event()
    try:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        count = grpcclient.InferInput("COUNT", [1], "INT32")
        count.set_data_from_numpy(np.array([5], np.int32))
        client.async_stream_infer("flood", [count], request_id="reader")
        for step in range(5):
            result, error = answers.get(timeout=30)
            assert error is None, error
            assert result.as_numpy("OUT")[0] == step  # type: ignore[attr-defined]
        done.set()
    finally:
        client.stop_stream()
        client.close()
    assert done.is_set()
    assert sent_by(server, "reader") == 5
