"""The clients of the hostile soak (benchmarks/hostile_soak.py; not a script itself).

Each client is a loop run in a thread of its own until ``stop`` is set, on loopback only, and
records what it got in a ``Tally``: answers by kind, and failures (a valid request that failed, a
hostile one that got an answer it must not get). Hostile: malformed ModelInfer requests (random
bytes, wrong shapes and dtypes, unknown models), method-path near misses (must be UNIMPLEMENTED),
connection churn (connect, HTTP/2 preface, close), silent readers (ModelStreamInfer streams on the
decoupled ``flood`` model that never read, cancelled after a while) and stalled connections (TCP
connections that send nothing). Valid: an mlp checker comparing every answer with the first and a
flood reader reading its stream whole, beside perf_analyzer; the health prober times a
grpc.health.v1 Check every ~100 ms on its own channel, in a process of its own.
"""

from __future__ import annotations

import multiprocessing
import queue
import random
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.queues import Queue as QueueType
from multiprocessing.synchronize import Event as EventType
from typing import Any

import grpc
import numpy as np
import tritonclient.grpc as grpcclient  # type: ignore[import-untyped]
from grpc_health.v1 import health_pb2

import inferd._proto.grpc_service_pb2 as pb
import inferd._proto.grpc_service_pb2_grpc as pb_grpc

# Streams COUNT responses of 64 KiB as fast as it can, stopping when its request is cancelled
# (tests/integration/test_stream_backlog.py's model, without its record file).
FLOOD_MODEL = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            count = int(pb_utils.get_input_tensor_by_name(request, "COUNT").as_numpy().flat[0])
            sent = 0
            while sent < count and not sender.is_cancelled():
                out = pb_utils.Tensor("OUT", np.full([65536], sent % 256, np.uint8))
                sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
                sent += 1
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""
FLOOD_CONFIG = (
    'name: "flood"\nbackend: "python"\nmax_batch_size: 0\n'
    'input [ { name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
    'output [ { name: "OUT" data_type: TYPE_UINT8 dims: [ -1 ] } ]\n'
    "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
    "model_transaction_policy { decoupled: true }\n"
)
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
SERVICE = "/inference.GRPCInferenceService/"
TIMEOUT_S = 30.0  # for valid calls: generous, the 2 cores are shared with the load
# A malformed request may be refused with these; anything else (OK above all) is a failure.
REFUSALS = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND}


@dataclass
class Tally:
    """What one client got. Thread-safe: ``add`` and ``fail`` take the lock."""

    name: str
    answers: Counter[str] = field(default_factory=Counter)
    failures: int = 0
    examples: list[str] = field(default_factory=list)  # the first few failures, for the report
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, kind: str, count: int = 1) -> None:
        with self._lock:
            self.answers[kind] += count

    def fail(self, what: str) -> None:
        with self._lock:
            self.failures += 1
            if len(self.examples) < 5:
                self.examples.append(what[:300])

    def summary(self) -> dict[str, object]:
        with self._lock:
            return {
                "answers": dict(self.answers),
                "failures": self.failures,
                "examples": list(self.examples),
            }


@dataclass(frozen=True)
class Target:
    """The server under attack and the soak's pacing."""

    port: int
    churn_pause_s: float = 0.002  # between two churned connections, per thread
    stalled_count: int = 16  # stalled connections held at once
    stalled_hold_s: float = 3.0
    silent_hold_s: float = 2.0  # a silent stream lives this long, then is cancelled

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"


def code_of(call: Callable[..., object], body: bytes) -> grpc.StatusCode:
    """The status ``call(body)`` is answered with."""
    try:
        call(body, timeout=TIMEOUT_S)
    except grpc.RpcError as error:
        return error.code()
    return grpc.StatusCode.OK


def mlp_request(model: str, shape: list[int], values: int, datatype: str = "FP32") -> bytes:
    request = pb.ModelInferRequest(model_name=model)
    request.inputs.add(name="INPUT0", datatype=datatype, shape=shape)
    request.raw_input_contents.append(b"\0" * 4 * values)
    return request.SerializeToString()


def malformed_bodies(rng: random.Random) -> list[tuple[str, bytes]]:
    """(kind, ModelInfer body) pairs, none of which may be answered OK."""
    missing = pb.ModelInferRequest(model_name="mlp").SerializeToString()
    return [
        ("random bytes", rng.randbytes(rng.randint(1, 4096))),
        ("short shape", mlp_request("mlp", [1, 511], 511)),
        ("contents shorter than shape", mlp_request("mlp", [1, 512], 100)),
        ("wrong dtype", mlp_request("mlp", [1, 512], 512, "INT64")),
        ("batch past max_batch_size", mlp_request("mlp", [65, 512], 65 * 512)),
        ("claims 2^40 elements", mlp_request("mlp", [1 << 30, 1024], 512)),
        ("missing input", missing),
        ("unknown model", mlp_request("no-such-model", [1, 512], 512)),
        ("traversal in name", mlp_request("../mlp", [1, 512], 512)),
        ("NUL in name", mlp_request("mlp\0", [1, 512], 512)),
    ]


def run_malformed(target: Target, stop: threading.Event, tally: Tally) -> None:
    rng = random.Random(25)
    with grpc.insecure_channel(target.address) as channel:
        infer = channel.unary_unary(SERVICE + "ModelInfer")
        while not stop.is_set():
            for kind, body in malformed_bodies(rng):
                code = code_of(infer, body)
                tally.add(f"{kind}: {code.name}")
                if code not in REFUSALS:
                    tally.fail(f"{kind} answered {code.name}")


def near_misses() -> list[tuple[str, bytes]]:
    """(method path, body) pairs that are not a method the server serves. The bodies are what
    the method they resemble takes, so that one forwarded would act (unload mlp, say)."""
    unload = pb.RepositoryModelUnloadRequest(model_name="mlp").SerializeToString()
    load = pb.RepositoryModelLoadRequest(model_name="mlp").SerializeToString()
    log = pb.LogSettingsRequest()
    log.settings["log_verbose_level"].uint32_param = 1
    register = pb.SystemSharedMemoryRegisterRequest(name="r", key="/x", byte_size=1)
    infer = mlp_request("mlp", [1, 512], 512)
    unloads = [
        SERVICE + "RepositoryModelUnload\0",
        SERVICE + "RepositoryModelUnload\0x",
        SERVICE + "RepositoryModelUnload/",
        SERVICE + "repositorymodelunload",
        SERVICE + "REPOSITORYMODELUNLOAD",
        SERVICE + "RepositoryModelUnl\u043ead",  # a Cyrillic o
        SERVICE + "RepositoryModelUnload ",
        SERVICE + "RepositoryModelUnloa",
        "/inference.GRPCInferenceService//RepositoryModelUnload",
        "/inference.grpcinferenceservice/RepositoryModelUnload",
        "//inference.GRPCInferenceService/RepositoryModelUnload",
    ]
    return [
        *((path, unload) for path in unloads),
        (SERVICE + "RepositoryModelLoad\0", load),
        (SERVICE + "RepositoryIndex\0", b""),
        (SERVICE + "LogSettings\0", log.SerializeToString()),
        (SERVICE + "SystemSharedMemoryRegister\0", register.SerializeToString()),
        (SERVICE + "SystemSharedMemoryUnregister\0", b""),
        (SERVICE + "ModelInfer\0", infer),
        (SERVICE + "ServerLive/", b""),
        ("/grpc.health.v1.Health/Check\0", b""),
        (SERVICE, b""),
    ]


def run_near_misses(target: Target, stop: threading.Event, tally: Tally) -> None:
    """Every near miss must be UNIMPLEMENTED; and the exact unload path, without the restricted
    protocol's key, must not be OK."""
    with grpc.insecure_channel(target.address) as channel:
        exact = channel.unary_unary(SERVICE + "RepositoryModelUnload")
        unload = pb.RepositoryModelUnloadRequest(model_name="mlp").SerializeToString()
        calls = [(path, channel.unary_unary(path), body) for path, body in near_misses()]
        while not stop.is_set():
            for path, call, body in calls:
                code = code_of(call, body)
                tally.add(code.name)
                if code != grpc.StatusCode.UNIMPLEMENTED:
                    tally.fail(f"{path!r} answered {code.name}")
            code = code_of(exact, unload)
            tally.add(f"exact unload without key: {code.name}")
            if code == grpc.StatusCode.OK:
                tally.fail("the exact unload path without the key answered OK")
            stop.wait(0.05)


def run_churn(target: Target, stop: threading.Event, tally: Tally) -> None:
    while not stop.is_set():
        try:
            with socket.create_connection(("127.0.0.1", target.port), timeout=5) as sock:
                sock.sendall(PREFACE)
            tally.add("connections")
        except OSError as error:
            tally.add(f"connect error {error.errno}")
        stop.wait(target.churn_pause_s)


def run_stalled(target: Target, stop: threading.Event, tally: Tally) -> None:
    """Holds ``stalled_count`` connections that send nothing (half of them the preface first)
    for ``stalled_hold_s``, closes them, and again."""
    while not stop.is_set():
        held: list[socket.socket] = []
        try:
            for index in range(target.stalled_count):
                sock = socket.create_connection(("127.0.0.1", target.port), timeout=5)
                held.append(sock)
                if index % 2:
                    sock.sendall(PREFACE)
            tally.add("connections", len(held))
            stop.wait(target.stalled_hold_s)
        except OSError as error:
            tally.add(f"connect error {error.errno}")
        finally:
            for sock in held:
                sock.close()


def flood_request(count: int, request_id: str = "") -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="flood", id=request_id)
    tensor = request.inputs.add(name="COUNT", datatype="INT32", shape=[1])
    tensor.contents.int_contents.append(count)
    return request


def run_silent_readers(target: Target, stop: threading.Event, tally: Tally) -> None:
    """A stream asking for 4000 responses of 64 KiB (250 MiB) that reads none, cancelled after
    ``silent_hold_s``; then another on the same channel."""
    with grpc.insecure_channel(target.address) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        while not stop.is_set():
            requests: queue.Queue[pb.ModelInferRequest | None] = queue.Queue()
            call = stub.ModelStreamInfer(iter(requests.get, None), timeout=120)
            requests.put(flood_request(4000))
            stop.wait(target.silent_hold_s)
            call.cancel()
            requests.put(None)
            tally.add("streams cancelled")


def run_mlp_checker(target: Target, stop: threading.Event, tally: Tally) -> None:
    """Valid: tritonclient infers on mlp with one input; every answer must equal the first."""
    rng = np.random.default_rng(25)
    data = rng.standard_normal((1, 512), dtype=np.float32)
    client = grpcclient.InferenceServerClient(target.address)
    expected: np.ndarray | None = None
    try:
        while not stop.is_set():
            tensor = grpcclient.InferInput("INPUT0", [1, 512], "FP32")
            tensor.set_data_from_numpy(data)
            try:
                result = client.infer("mlp", [tensor], client_timeout=TIMEOUT_S)
                out = result.as_numpy("OUTPUT0")
            except Exception as error:  # any failure of a valid request is the soak's finding
                tally.fail(f"mlp infer: {error}")
                continue
            if expected is None:
                expected = out
            if out is None or not np.allclose(out, expected, rtol=1e-5, atol=1e-6):
                tally.fail("mlp answered a different output for the same input")
            else:
                tally.add("ok")
    finally:
        client.close()


def read_flood(stub: pb_grpc.GRPCInferenceServiceStub, count: int) -> str | None:
    """One valid flood stream read whole: None, or what was wrong."""
    call = stub.ModelStreamInfer(iter([flood_request(count, "reader")]), timeout=TIMEOUT_S)
    values = []
    try:
        for answer in call:
            if answer.error_message:
                return f"flood answered {answer.error_message!r}"
            params = answer.infer_response.parameters
            if "triton_final_response" in params and params["triton_final_response"].bool_param:
                break
            values.append(answer.infer_response.raw_output_contents[0][0])
    except grpc.RpcError as error:
        return f"flood stream: {error.code().name} {error.details()}"
    finally:
        call.cancel()
    if values != [k % 256 for k in range(count)]:
        return f"flood streamed {len(values)} responses, not {count} in order"
    return None


def run_flood_reader(target: Target, stop: threading.Event, tally: Tally) -> None:
    """Valid: a stream on the flood model asking for 8 responses and reading them all, while the
    silent readers hold the same model's one instance."""
    with grpc.insecure_channel(target.address) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        while not stop.is_set():
            problem = read_flood(stub, 8)
            if problem is None:
                tally.add("ok")
            else:
                tally.fail(problem)
            stop.wait(0.1)


def probe_health(port: int, stop: EventType, results: QueueType[tuple[float, str | None]]) -> None:
    """One grpc.health.v1 Check per ~100 ms on a channel of its own, each put in ``results`` as
    (ms, what was wrong or None), until ``stop`` is set. Run in a process of its own: in the soak's
    process the client threads hold the GIL, which would add their time to the latencies."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        check = channel.unary_unary(
            "/grpc.health.v1.Health/Check",
            request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb2.HealthCheckResponse.FromString,
        )
        while not stop.is_set():
            began = time.monotonic()
            problem = None
            try:
                answer = check(health_pb2.HealthCheckRequest(), timeout=5)
                if answer.status != health_pb2.HealthCheckResponse.SERVING:
                    problem = f"health answered {answer.status}"
            except grpc.RpcError as error:
                problem = f"health Check: {error.code().name}"
            elapsed = time.monotonic() - began
            results.put((elapsed * 1000, problem))
            stop.wait(max(0.0, 0.1 - elapsed))


@dataclass
class HealthProbe:
    """probe_health in a child process (spawned: this process runs gRPC threads already), and
    what it measured. Not thread-safe: one thread calls start, drain and stop."""

    tally: Tally = field(default_factory=lambda: Tally("health"))
    latencies_ms: list[float] = field(default_factory=list)
    _context: Any = field(default_factory=lambda: multiprocessing.get_context("spawn"))
    _process: Any = None
    _stop: Any = None
    _results: Any = None

    def start(self, port: int) -> None:
        self._stop, self._results = self._context.Event(), self._context.Queue()
        self._process = self._context.Process(
            target=probe_health, args=(port, self._stop, self._results), name="health"
        )
        self._process.start()

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process is not None else None

    def drain(self) -> list[float]:
        """The latencies measured since the last drain (never blocks)."""
        new = []
        while True:
            try:
                elapsed, problem = self._results.get_nowait()
            except queue.Empty:
                break
            new.append(elapsed)
            if problem is None:
                self.tally.add("SERVING")
            else:
                self.tally.fail(problem)
        self.latencies_ms += new
        return new

    def stop(self) -> None:
        """Stops the probe (blocks: up to ~10 s, a Check's timeout and the process's exit)."""
        self._stop.set()
        deadline = time.monotonic() + 10
        # Drained while it exits: a process whose queue is not read may never end.
        while self._process.is_alive() and time.monotonic() < deadline:
            self.drain()
            self._process.join(0.1)
        if self._process.is_alive():
            self._process.kill()
        self.drain()


HOSTILE: dict[str, Callable[[Target, threading.Event, Tally], None]] = {
    "malformed": run_malformed,
    "near misses": run_near_misses,
    "churn": run_churn,
    "silent readers": run_silent_readers,
    "stalled": run_stalled,
}
VALID: dict[str, Callable[[Target, threading.Event, Tally], None]] = {
    "mlp checker": run_mlp_checker,
    "flood reader": run_flood_reader,
}
