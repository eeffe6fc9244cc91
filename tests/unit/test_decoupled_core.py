"""Decoupled models through the core's own gRPC transport, with a decoupled Python executor on a
core Scheduler routed by a published snapshot (no model repository): tritonclient streams get
each request's responses in order, then its final flag (``triton_final_response``) when they ask
for it; ModelInfer on such a model answers UNIMPLEMENTED."""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

import inferd._core as _core
from inferd._proto import grpc_service_pb2 as pb
from inferd.errors import ErrorCode, InvalidArgument

INT32 = 8  # DataType code of INT32 (TYPE_INT32)
FINAL = "triton_final_response"


class Counter:
    """A decoupled model: a request [n] gets n responses [0] .. [n-1], then its final answer: the
    final flag alone when n is even, a last response [100 + n] when n is odd. A request [7]
    sends an error response after its response [2] and goes on. Each call also tries what
    ``respond`` must refuse, and records what it raised."""

    decoupled = True

    def __init__(self) -> None:
        self.refusals: list[type[BaseException]] = []
        self.batches = 0

    def execute(self, inputs: list[np.ndarray]) -> list[np.ndarray]:
        raise AssertionError("execute() called on a decoupled executor")

    def execute_requests(
        self, requests: list[list[np.ndarray]], respond: Callable[[int, Any], None]
    ) -> list[Any]:
        for bad_index, bad_answer in ((len(requests), [np.zeros(1, np.int32)]), (0, [object()])):
            try:
                respond(bad_index, bad_answer)
            except (IndexError, TypeError, ValueError) as e:
                self.refusals.append(type(e))
        self.batches += 1
        finals: list[Any] = []
        for index, inputs in enumerate(requests):
            finals.append(self.answer(int(inputs[0][0]), index, respond))
        return finals

    @staticmethod
    def answer(n: int, index: int, respond: Any) -> Any:
        """Request ``index`` = [n]'s responses through ``respond``; its final answer."""
        for k in range(n):
            respond(index, [np.array([k], dtype=np.int32)])
            if n == 7 and k == 2:
                respond(index, InvalidArgument("7 stumbles after 2"))
        return None if n % 2 == 0 else [np.array([100 + n], dtype=np.int32)]

    def close(self) -> None:
        pass


class LaterCounter(Counter):
    """The Counter's answers, given after execute_requests returned each request PENDING (as a
    python model's own thread sends them): a thread per batch answers once ``release`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.release = threading.Event()
        self.threads: list[threading.Thread] = []

    def execute_requests(
        self, requests: list[list[np.ndarray]], respond: Callable[[int, Any], None]
    ) -> list[Any]:
        self.batches += 1
        ns = [int(inputs[0][0]) for inputs in requests]

        def answer_later() -> None:
            self.release.wait(20)
            for index, n in enumerate(ns):
                assert respond.finish(index, self.answer(n, index, respond))  # type: ignore[attr-defined]
                # Ended: what follows is dropped.
                assert not respond(index, [np.array([-1], dtype=np.int32)])

        thread = threading.Thread(target=answer_later, daemon=True)
        thread.start()
        self.threads.append(thread)
        return [_core.PENDING] * len(requests)


class Served:
    def __init__(self, server: Any, routes: list[Any], scheduler: Any, executor: Counter) -> None:
        self.url = f"127.0.0.1:{server.ports[0]}"
        self.server = server
        self.routes = routes
        self.scheduler = scheduler
        self.executor = executor


@pytest.fixture(params=[1024])
def served(request: pytest.FixtureRequest) -> Iterator[Served]:
    with serve(Counter(), int(request.param)) as served:
        yield served


@contextlib.contextmanager
def serve(executor: Counter, max_stream_outstanding: int) -> Iterator[Served]:
    signature = _core.ModelSignature(
        "counter",
        "1",
        0,
        [("N", INT32, [1], None, False, False)],
        [("K", INT32, [1], False)],
        decoupled=True,
    )
    options = _core.BatcherOptions(dynamic=True, max_batch_size=8)
    scheduler = _core.Scheduler(
        "counter",
        options,
        [executor],
        [INT32],
        _core.CompletionQueue(),
        _core.PinnedBufferPool(1 << 20, False),
    )
    # Nothing listens on the backend: every call this test makes is answered in the core.
    server = _core.GrpcServer(
        ["127.0.0.1:0"],
        "unix:/nonexistent/inferd-backend",
        1 << 22,
        max_stream_outstanding=max_stream_outstanding,
    )
    routes = [
        ("counter", version, "counter", "1", scheduler, signature, b"", b"")
        for version in ("", "1")
    ]
    server.publish(True, True, True, False, _core.TraceSampling(), routes)
    try:
        yield Served(server, routes, scheduler, executor)
    finally:
        server.shutdown(1.0)
        scheduler.shutdown(False)


def request_input(n: int) -> grpcclient.InferInput:
    value = grpcclient.InferInput("N", [1], "INT32")
    value.set_data_from_numpy(np.array([n], dtype=np.int32))
    return value


# One streamed answer: (request id, K or None for the empty response, final flag or None when
# the response has none) or (request id, error message).
Answer = tuple[str, int | None, bool | None] | tuple[str, str]


def stream(url: str, ns: list[int], *, final_flag: bool) -> list[Answer]:
    """Sends one request per n on one stream (ids "r<n>"), then closes it once every answer
    arrived; returns the answers in arrival order."""
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(url)
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    for n in ns:
        client.async_stream_infer(
            "counter",
            [request_input(n)],
            request_id=f"r{n}",
            enable_empty_final_response=final_flag,
        )
    client.stop_stream()  # returns once the server ended the stream: every answer is in
    client.close()
    out: list[Answer] = []
    while not answers.empty():
        result, error = answers.get()
        if error is not None:
            out.append(("?", str(error.message())))
            continue
        response = result.get_response()
        flag = response.parameters[FINAL].bool_param if FINAL in response.parameters else None
        k = result.as_numpy("K")
        out.append((response.id, None if k is None else int(k[0]), flag))
    return out


def expected(n: int, *, final_flag: bool) -> list[Answer]:
    """What request [n] gets, in order: a decoupled model's responses always carry
    triton_final_response (as Triton's); the empty final response needs the request's opt-in."""
    answers: list[Answer] = []
    for k in range(n):
        answers.append((f"r{n}", k, False))
        if n == 7 and k == 2:
            answers.append(("?", "7 stumbles after 2"))
    if n % 2 == 1:
        answers.append((f"r{n}", 100 + n, True))
    elif final_flag:
        answers.append((f"r{n}", None, True))  # the empty final response
    return answers


def of_request(answers: list[Answer], n: int) -> list[Answer]:
    return [a for a in answers if a[0] == f"r{n}" or (n == 7 and a[0] == "?")]


def test_each_request_gets_its_responses_in_order_then_its_final_flag(served: Served) -> None:
    ns = [0, 1, 2, 5, 7]
    answers = stream(served.url, ns, final_flag=True)
    for n in ns:
        assert of_request(answers, n) == expected(n, final_flag=True), n
    assert len(answers) == sum(len(expected(n, final_flag=True)) for n in ns)
    statistics = served.scheduler.statistics()
    # Streamed: 0 + 1 + 2 + 5 + 7 (+ 1 error); finals with a response: 1, 5 and 7.
    assert statistics.responses == 15 + 1 + 3
    assert sum(statistics.first_response.counts) == len(ns)
    # respond() refused an index outside the batch and an answer that is no array, each call.
    assert set(served.executor.refusals) == {IndexError, ValueError}


def test_answers_may_come_after_execute_returned_and_the_instance_takes_its_next_batch() -> None:
    executor = LaterCounter()
    with serve(executor, 1024) as served:
        results: dict[int, list[Answer]] = {}
        clients = [
            threading.Thread(
                target=lambda n=n: results.update({n: stream(served.url, [n], final_flag=True)})
            )
            for n in (3, 4)
        ]
        clients[0].start()
        deadline = time.monotonic() + 10
        while executor.batches < 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        clients[1].start()
        # Request 3's batch is still open (nothing answered yet); the one instance takes 4's.
        while executor.batches < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert executor.batches == 2
        executor.release.set()
        for client in clients:
            client.join(20)
        for thread in executor.threads:
            thread.join(20)
        assert results == {n: expected(n, final_flag=True) for n in (3, 4)}
        statistics = served.scheduler.statistics()
        assert statistics.execution_count == 2
        assert statistics.responses == 3 + 4 + 1  # 3 streamed + its last; 4 streamed


def test_without_the_opt_in_no_empty_final_response_arrives(served: Served) -> None:
    ns = [2, 3, 4]
    answers = stream(served.url, ns, final_flag=False)
    for n in ns:
        assert of_request(answers, n) == expected(n, final_flag=False), n
    assert len(answers) == 2 + 4 + 4  # no empty response for the even ones


def test_sixteen_concurrent_streams_each_get_their_answers_in_order(served: Served) -> None:
    ns = [3, 6, 1, 4]
    results: list[list[Answer]] = [[] for _ in range(16)]

    def run(i: int) -> None:
        results[i] = stream(served.url, ns, final_flag=True)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for answers in results:
        for n in ns:
            assert of_request(answers, n) == expected(n, final_flag=True), n


def test_model_infer_on_a_decoupled_model_is_unimplemented(served: Served) -> None:
    client = grpcclient.InferenceServerClient(served.url)
    with pytest.raises(InferenceServerException) as refused:
        client.infer("counter", [request_input(1)])
    client.close()
    assert refused.value.status() == "StatusCode.UNIMPLEMENTED"
    assert "model 'counter' is decoupled" in str(refused.value.message())
    assert "use ModelStreamInfer" in str(refused.value.message())
    failures = [(m, v, ErrorCode(code), p, n) for m, v, code, p, n in served.server.failures()]
    assert failures == [("counter", "1", ErrorCode.UNIMPLEMENTED, "grpc", 1)]


def test_decoupled_requests_stay_in_the_core_when_python_would_observe_them(
    served: Served,
) -> None:
    # Every inference forwarded to Python, and every one sampled for tracing: the backend is not
    # there, so a forwarded request would fail; a decoupled one is still answered in the core.
    everything = _core.TraceSampling(True, False, 1.0)
    served.server.publish(True, True, True, True, everything, served.routes)
    answers = stream(served.url, [3], final_flag=True)
    assert answers == expected(3, final_flag=True)


def test_a_traced_decoupled_request_is_run_in_the_core_and_reported_with_its_answers(
    served: Served,
) -> None:
    # Sampled for tracing, with nothing behind the backend address: the requests run in the core,
    # and each one's record (for Python's span) comes once it has ended, with its answers counted.
    served.server.publish(
        True, True, True, False, _core.TraceSampling(True, False, 1.0), served.routes
    )
    assert served.server.observations.drain() == []
    answers = stream(served.url, [3, 4], final_flag=True)
    for n in (3, 4):
        assert of_request(answers, n) == expected(n, final_flag=True), n
    records = {r.id: r for r in served.server.observations.drain()}
    assert set(records) == {"r3", "r4"}
    for n, record in ((3, records["r3"]), (4, records["r4"])):
        assert (record.model, record.version, record.sampled, record.streamed) == (
            "counter",
            "1",
            True,
            True,
        )
        assert record.code == _core.StatusCode.OK
        # n responses, then the last one (n odd) or the empty final response (n even).
        assert record.responses == n + 1
        assert record.received <= record.timing.enqueued <= record.timing.compute_end
        assert record.timing.compute_end <= record.answered
    assert served.server.observations.dropped() == 0


@pytest.mark.parametrize("served", [1], indirect=True)
def test_streamed_responses_do_not_count_as_answered_requests(served: Served) -> None:
    # One request read and not finally answered at a time: the stream reads the next request only
    # once the last one's final answer is sent, however many responses came before it.
    ns = [3, 2, 4, 1]
    done: list[list[Answer]] = []
    client = threading.Thread(target=lambda: done.append(stream(served.url, ns, final_flag=True)))
    client.start()
    client.join(20)
    assert done, "the stream did not finish"
    assert done[0] == [a for n in ns for a in expected(n, final_flag=True)]  # one at a time


def raw_stream(
    url: str, requests: list[bytes], metadata: tuple[tuple[str, str], ...] = ()
) -> list[Any]:
    """The ModelStreamInferResponses of one stream, as protobuf parses them; a call that ends
    with an error status adds that grpc.RpcError last."""
    answers: list[Any] = []
    with grpc.insecure_channel(url) as channel:
        call = channel.stream_stream(
            "/inference.GRPCInferenceService/ModelStreamInfer",
            response_deserializer=pb.ModelStreamInferResponse.FromString,
        )
        try:
            for answer in call(iter(requests), timeout=20, metadata=metadata):
                answers.append(answer)
        except grpc.RpcError as error:
            answers.append(error)
    return answers


def counter_request(n: int, *, final_flag: bool) -> bytes:
    request = pb.ModelInferRequest(model_name="counter", id=f"r{n}")
    request.inputs.add(name="N", datatype="INT32", shape=[1])
    request.raw_input_contents.append(np.array([n], dtype=np.int32).tobytes())
    request.parameters["triton_enable_empty_final_response"].bool_param = final_flag
    return request.SerializeToString()


def test_an_error_response_says_whether_it_ends_the_request(served: Served) -> None:
    answers = raw_stream(served.url, [counter_request(7, final_flag=True)])
    errors = [a for a in answers if a.error_message]
    assert [e.error_message for e in errors] == ["7 stumbles after 2"]
    (error,) = errors
    assert error.infer_response.id == "r7"
    assert all(FINAL in a.infer_response.parameters for a in answers)
    assert not error.infer_response.parameters[FINAL].bool_param  # request 7 goes on
    assert [a.infer_response.parameters[FINAL].bool_param for a in answers] == [False] * 8 + [True]


def test_with_triton_grpc_error_an_error_response_ends_the_call(served: Served) -> None:
    answers = raw_stream(
        served.url, [counter_request(7, final_flag=True)], (("triton_grpc_error", "true"),)
    )
    *responses, ended = answers
    assert isinstance(ended, grpc.RpcError)
    assert ended.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert ended.details() == "7 stumbles after 2"
    # The call ends at once, as with any error under triton_grpc_error: responses still queued
    # for sending are dropped, so those before the error arrive as a prefix, in order.
    values = [
        int(np.frombuffer(a.infer_response.raw_output_contents[0], np.int32)[0]) for a in responses
    ]
    assert values == [0, 1, 2][: len(values)]


@pytest.fixture
def forwarding(tmp_path: Path) -> Iterator[str]:
    """A core server whose every inference goes to a backend that answers K = [41]."""

    def model_infer(request: bytes, context: grpc.ServicerContext) -> bytes:
        asked = pb.ModelInferRequest.FromString(request)
        answer = pb.ModelInferResponse(model_name=asked.model_name, id=asked.id)
        answer.outputs.add(name="K", datatype="INT32", shape=[1])
        answer.raw_output_contents.append(np.array([41], dtype=np.int32).tobytes())
        return bytes(answer.SerializeToString())

    backend = grpc.server(ThreadPoolExecutor(2))
    backend.add_generic_rpc_handlers(
        (
            grpc.method_handlers_generic_handler(
                "inference.GRPCInferenceService",
                {"ModelInfer": grpc.unary_unary_rpc_method_handler(model_infer)},
            ),
        )
    )
    address = f"unix:{tmp_path / 'backend.sock'}"
    backend.add_insecure_port(address)
    backend.start()
    server = _core.GrpcServer(["127.0.0.1:0"], address, 1 << 22)
    server.publish(True, True, True, True, _core.TraceSampling(), [])
    try:
        yield f"127.0.0.1:{server.ports[0]}"
    finally:
        server.shutdown(1.0)
        backend.stop(None)


def test_a_forwarded_answer_carries_the_final_flag_when_asked(forwarding: str) -> None:
    answers = raw_stream(
        forwarding,
        [counter_request(1, final_flag=True), counter_request(2, final_flag=False)],
    )
    # Forwarded answers come as they complete, in either order.
    flagged, plain = sorted(answers, key=lambda a: str(a.infer_response.id))
    assert not flagged.error_message and not plain.error_message
    # Appended after the backend's outputs: protobuf reads the map entry there.
    assert flagged.infer_response.id == "r1"
    assert flagged.infer_response.parameters[FINAL].bool_param
    assert flagged.infer_response.raw_output_contents == [np.array([41], np.int32).tobytes()]
    assert plain.infer_response.id == "r2"
    assert FINAL not in plain.infer_response.parameters


def test_a_request_from_python_on_a_decoupled_model_is_refused_by_the_same_rule(
    served: Served,
) -> None:
    # The Python side's path (forwarded inferences, BLS calls) submits with no stream to carry the
    # responses: the core's scheduler refuses it as it refuses the transport's ModelInfer.
    request = pb.ModelInferRequest(model_name="counter")
    request.inputs.add(name="N", datatype="INT32", shape=[1])
    request.raw_input_contents.append(np.array([1], np.int32).tobytes())
    wire = _core.parse_infer_request(request.SerializeToString())
    signature = served.routes[0][5]
    code, message = served.scheduler.submit_request(1, signature, wire)
    assert ErrorCode(code) == ErrorCode.UNIMPLEMENTED
    assert "model 'counter' is decoupled" in message and "use ModelStreamInfer" in message
