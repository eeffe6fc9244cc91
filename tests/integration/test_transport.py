"""The gRPC transport through real connections: TLS and mutual TLS on the TCP port (the Unix
socket stays plaintext), health and reflection on the public port, message-size and stream limits,
keepalive, deadlines and cancellation, streams, and control-plane calls that must not starve
inference.

Servers with their own flags are started the way conftest starts the session's server
(``running_server``); the TLS material is made with the ``openssl`` CLI.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import queue
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from google.protobuf import descriptor_pb2
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2
from grpc_reflection.v1alpha.proto_reflection_descriptor_database import (
    ProtoReflectionDescriptorDatabase,
)
from tritonclient.utils import InferenceServerException

import inferd._proto.grpc_service_pb2 as pb
import inferd._proto.grpc_service_pb2_grpc as pb_grpc
from inferd.examples import make_examples
from tests.integration.certificates import Certificates, make_certificates, openssl_path
from tests.integration.conftest import ServerProcess, SimpleCheck, running_server, wait_until
from tests.integration.slow_model import SINGLE_REQUEST_CONFIG, write_slow_model

SERVICE = "inference.GRPCInferenceService"
HEALTH_SERVICE = "grpc.health.v1.Health"
CALL_TIMEOUT_S = 20.0  # every call in this file is bounded: a hang fails, it does not stall
# Own connection per channel: grpc shares one connection between channels with equal arguments,
# which would hide what a test does to "its" connection (and let a refused client reuse another
# client's accepted TLS connection).
OWN_CONNECTION = ("grpc.use_local_subchannel_pool", 1)


# ---------------------------------------------------------------------------------------------
# Requests and checks shared by the tests


def simple_inputs(a: np.ndarray, b: np.ndarray) -> list[grpcclient.InferInput]:
    inputs = [
        grpcclient.InferInput("INPUT0", list(a.shape), "INT32"),
        grpcclient.InferInput("INPUT1", list(b.shape), "INT32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    return inputs


def infer_simple(client: grpcclient.InferenceServerClient, value: int) -> None:
    """One ``simple`` request made of ``value``; its sum and difference must come back."""
    a = np.full((1, 16), value, dtype=np.int32)
    b = np.arange(16, dtype=np.int32).reshape(1, 16)
    result = client.infer("simple", simple_inputs(a, b), client_timeout=CALL_TIMEOUT_S)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def raw_simple_request(value: int, request_id: str, model: str = "simple") -> Any:
    """A ModelInferRequest (inferd's own proto) for ``simple``, with raw contents."""
    a = np.full((1, 16), value, dtype=np.int32)
    b = np.arange(16, dtype=np.int32).reshape(1, 16)
    return pb.ModelInferRequest(
        model_name=model,
        id=request_id,
        inputs=[
            pb.ModelInferRequest.InferInputTensor(name="INPUT0", datatype="INT32", shape=[1, 16]),
            pb.ModelInferRequest.InferInputTensor(name="INPUT1", datatype="INT32", shape=[1, 16]),
        ],
        raw_input_contents=[a.tobytes(), b.tobytes()],
    )


def check_raw_simple_answer(response: Any, value: int) -> None:
    """``response`` (a ModelInferResponse) is the answer to ``raw_simple_request(value, ...)``."""
    outputs = {
        tensor.name: np.frombuffer(raw, dtype=np.int32)
        for tensor, raw in zip(response.outputs, response.raw_output_contents, strict=True)
    }
    b = np.arange(16, dtype=np.int32)
    np.testing.assert_array_equal(outputs["OUTPUT0"], value + b)
    np.testing.assert_array_equal(outputs["OUTPUT1"], value - b)


def status_of(error: InferenceServerException) -> str:
    status: str = error.status()
    return status


class RequestStream:
    """A ModelStreamInfer call fed from a queue: requests go out as the test sends them, and
    answers are read one at a time, each within ``CALL_TIMEOUT_S``."""

    def __init__(
        self, stub: Any, metadata: tuple[tuple[str, str], ...] = (), timeout: float = 60.0
    ) -> None:
        self._requests: queue.Queue[Any] = queue.Queue()
        self._answers: queue.Queue[Any] = queue.Queue()
        self.call = stub.ModelStreamInfer(self._outgoing(), metadata=metadata, timeout=timeout)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _outgoing(self) -> Iterator[Any]:
        while (request := self._requests.get()) is not None:
            yield request

    def _read(self) -> None:
        try:
            for answer in self.call:
                self._answers.put(answer)
            self._answers.put(None)  # ended with OK
        except grpc.RpcError as error:
            self._answers.put(error)

    def send(self, request: Any) -> None:
        self._requests.put(request)

    def receive(self, timeout: float = CALL_TIMEOUT_S) -> Any:
        """The next answer; None when the call ended with OK; the grpc.RpcError that ended it."""
        return self._answers.get(timeout=timeout)

    def close(self) -> None:
        """Ends the requests (the call then ends once every answer is out)."""
        self._requests.put(None)

    def cancel(self) -> None:
        self.close()
        self.call.cancel()
        self._reader.join(CALL_TIMEOUT_S)


@contextlib.contextmanager
def request_stream(
    channel: grpc.Channel, metadata: tuple[tuple[str, str], ...] = ()
) -> Iterator[RequestStream]:
    stream = RequestStream(pb_grpc.GRPCInferenceServiceStub(channel), metadata)
    try:
        yield stream
    finally:
        stream.cancel()


def examples_server(
    tmp_path_factory: pytest.TempPathFactory, name: str, *args: str
) -> contextlib.AbstractContextManager[ServerProcess]:
    """A server on the example repository (simple, identity_fp32, mlp, identity_bytes)."""
    root = tmp_path_factory.mktemp(name)
    names = make_examples(root / "models")
    return running_server(root / "models", names, root, *args)


# ---------------------------------------------------------------------------------------------
# 1. TLS and mutual TLS


@pytest.fixture(scope="session")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    if openssl_path() is None:
        pytest.skip("the openssl CLI is not installed: no certificates for the TLS tests")
    return make_certificates(tmp_path_factory.mktemp("certificates"))


def tls_flags(certificates: Certificates) -> tuple[str, ...]:
    """Triton's flags for TLS on the gRPC port."""
    return (
        "--grpc-use-ssl",
        "--grpc-server-cert",
        str(certificates.server_cert),
        "--grpc-server-key",
        str(certificates.server_key),
    )


@pytest.fixture(scope="module")
def tls_server(
    tmp_path_factory: pytest.TempPathFactory, certificates: Certificates
) -> Iterator[ServerProcess]:
    with examples_server(tmp_path_factory, "tls", *tls_flags(certificates)) as server:
        yield server


@pytest.fixture(scope="module")
def mtls_server(
    tmp_path_factory: pytest.TempPathFactory, certificates: Certificates
) -> Iterator[ServerProcess]:
    with examples_server(
        tmp_path_factory,
        "mtls",
        "--grpc-use-ssl-mutual=true",
        "--grpc-server-cert",
        str(certificates.server_cert),
        "--grpc-server-key",
        str(certificates.server_key),
        "--grpc-root-cert",
        str(certificates.ca),
    ) as server:
        yield server


def tls_client(
    url: str, root: Path, key: Path | None = None, cert: Path | None = None
) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(
        url,
        ssl=True,
        root_certificates=str(root),
        private_key=None if key is None else str(key),
        certificate_chain=None if cert is None else str(cert),
        channel_args=[OWN_CONNECTION],
    )


def assert_refused(client: grpcclient.InferenceServerClient) -> None:
    """The client's calls fail UNAVAILABLE: the connection is refused, nothing is served."""
    try:
        with pytest.raises(InferenceServerException) as refused:
            infer_simple(client, 1)
        assert status_of(refused.value) == "StatusCode.UNAVAILABLE", refused.value
    finally:
        client.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("host", ["127.0.0.1", "localhost"])
def test_tls_client_infers_and_reads_metadata(
    tls_server: ServerProcess, certificates: Certificates, host: str
) -> None:
    port = tls_server.url.rsplit(":", 1)[1]
    client = tls_client(f"{host}:{port}", certificates.ca)
    try:
        assert client.is_server_ready()
        for value in (3, -40, 1000):
            infer_simple(client, value)
        # The control plane (forwarded to the Python servicer) is reached through TLS too.
        assert client.get_model_metadata("simple").name == "simple"
    finally:
        client.close()


@pytest.mark.timeout(60)
def test_a_stalled_tls_handshake_is_closed_after_the_idle_limit(
    tmp_path_factory: pytest.TempPathFactory, certificates: Certificates
) -> None:
    """Issue 25, item 4: a connection that never finishes its handshake was kept about 125 s
    whatever --grpc-max-connection-idle-secs said (grpc's handshake timeout, 120 s). It now gets
    the idle limit (10 s at most)."""
    flags = (*tls_flags(certificates), "--grpc-max-connection-idle-secs", "2")
    with examples_server(tmp_path_factory, "tls-stall", *flags) as server:
        host, port = server.url.rsplit(":", 1)
        stalled = [socket.create_connection((host, int(port)), timeout=10) for _ in range(4)]
        started = time.monotonic()
        try:
            for s in stalled:
                s.settimeout(15)
                with contextlib.suppress(ConnectionResetError):
                    assert s.recv(1) == b""  # closed, having sent nothing
            assert time.monotonic() - started < 8, "stalled handshakes outlived the idle limit"
        finally:
            for s in stalled:
                s.close()
        client = tls_client(server.url, certificates.ca)
        try:
            infer_simple(client, 2)
        finally:
            client.close()


@pytest.mark.timeout(60)
def test_plaintext_client_is_refused_by_a_tls_port(tls_server: ServerProcess) -> None:
    assert_refused(grpcclient.InferenceServerClient(tls_server.url, channel_args=[OWN_CONNECTION]))


@pytest.mark.timeout(60)
def test_tls_client_refuses_a_server_its_ca_did_not_sign(
    tls_server: ServerProcess, certificates: Certificates
) -> None:
    assert_refused(tls_client(tls_server.url, certificates.other_ca))


@pytest.mark.timeout(60)
def test_mtls_client_with_a_certificate_from_the_ca_infers(
    mtls_server: ServerProcess, certificates: Certificates
) -> None:
    client = tls_client(
        mtls_server.url, certificates.ca, certificates.client_key, certificates.client_cert
    )
    try:
        infer_simple(client, 7)
        assert client.is_model_ready("simple")
    finally:
        client.close()


@pytest.mark.timeout(60)
def test_mtls_client_without_a_certificate_is_refused(
    mtls_server: ServerProcess, certificates: Certificates
) -> None:
    assert_refused(tls_client(mtls_server.url, certificates.ca))


@pytest.mark.timeout(60)
def test_mtls_client_with_a_certificate_from_another_ca_is_refused(
    mtls_server: ServerProcess, certificates: Certificates
) -> None:
    assert_refused(
        tls_client(
            mtls_server.url,
            certificates.ca,
            certificates.other_client_key,
            certificates.other_client_cert,
        )
    )


@pytest.mark.timeout(60)
def test_mtls_plaintext_client_is_refused(mtls_server: ServerProcess) -> None:
    assert_refused(grpcclient.InferenceServerClient(mtls_server.url, channel_args=[OWN_CONNECTION]))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("which", ["tls_server", "mtls_server"])
def test_unix_socket_of_a_tls_server_stays_plaintext(
    request: pytest.FixtureRequest, which: str
) -> None:
    server: ServerProcess = request.getfixturevalue(which)
    client = grpcclient.InferenceServerClient(f"unix:{server.unix_socket}")
    try:
        assert client.is_server_ready()
        infer_simple(client, 11)
    finally:
        client.close()


def https_exchange(
    server: ServerProcess, context: ssl.SSLContext, method: str, path: str, body: bytes = b""
) -> tuple[int, bytes]:
    """One request to the HTTP port over TLS (Python's http.client), its status and body."""
    host, port = server.http_url.rsplit(":", 1)
    connection = http.client.HTTPSConnection(host, int(port), context=context, timeout=10)
    try:
        connection.request(method, path, body=body or None)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def https_infer_simple(server: ServerProcess, context: ssl.SSLContext) -> None:
    """simple over the HTTP port's TLS, its sum checked."""
    first, second = list(range(16)), [3] * 16
    request = {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": first},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": second},
        ],
        "outputs": [{"name": "OUTPUT0"}],
    }
    status, body = https_exchange(
        server, context, "POST", "/v2/models/simple/infer", json.dumps(request).encode()
    )
    assert status == 200, body
    [output] = json.loads(body)["outputs"]
    assert output["data"] == [a + b for a, b in zip(first, second, strict=True)]


def tls_context(certificates: Certificates, client: tuple[Path, Path] | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(certificates.ca))
    if client is not None:
        context.load_cert_chain(str(client[0]), str(client[1]))
    return context


@pytest.mark.timeout(60)
def test_the_http_port_serves_tls_with_the_grpc_ports_certificate(
    tls_server: ServerProcess, certificates: Certificates
) -> None:
    context = tls_context(certificates, None)
    assert https_exchange(tls_server, context, "GET", "/v2/health/ready")[0] == 200
    https_infer_simple(tls_server, context)
    # A plaintext request on the TLS port is answered by no HTTP status.
    host, port = tls_server.http_url.rsplit(":", 1)
    plain = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        with pytest.raises((http.client.HTTPException, OSError)):
            plain.request("GET", "/v2/health/ready")
            plain.getresponse()
    finally:
        plain.close()
    # A client that does not trust the server's CA refuses it.
    with pytest.raises(ssl.SSLError):
        https_exchange(tls_server, ssl.create_default_context(), "GET", "/v2/health/ready")


@pytest.mark.timeout(60)
def test_mutual_tls_on_the_http_port_serves_only_clients_its_ca_signed(
    mtls_server: ServerProcess, certificates: Certificates
) -> None:
    signed = tls_context(certificates, (certificates.client_cert, certificates.client_key))
    https_infer_simple(mtls_server, signed)
    other = (certificates.other_client_cert, certificates.other_client_key)
    for refused in (tls_context(certificates, None), tls_context(certificates, other)):
        # TLS 1.3 tells a refused client certificate at the first read, not in the handshake.
        with pytest.raises((ssl.SSLError, OSError, http.client.HTTPException)):
            https_exchange(mtls_server, refused, "GET", "/v2/health/ready")
    https_infer_simple(mtls_server, signed)  # and the port serves on


def serve_until_it_exits(repository: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``inferd serve`` with settings it must refuse: it exits before serving."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INFERD_", "OTEL_"))}
    return subprocess.run(
        [
            *(sys.executable, "-m", "inferd", "serve", "--model-repository", str(repository)),
            *("--host", "127.0.0.1", "--grpc-port", "0", "--metrics-port", "-1"),
            *("--http-port", "0", *args),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--grpc-use-ssl",), "needs --grpc-server-cert and --grpc-server-key"),
        (("--grpc-use-ssl-mutual", "--cert", "--key"), "needs --grpc-root-cert"),
        (("--cert", "--key"), "TLS is off: add --grpc-use-ssl"),
    ],
)
def test_tls_settings_that_would_not_serve_what_they_say_stop_the_server(
    tmp_path: Path, certificates: Certificates, flags: tuple[str, ...], message: str
) -> None:
    """Triton serves plaintext when a certificate is given without --grpc-use-ssl; inferd refuses
    to start instead, as it does when TLS lacks its files."""
    files = {
        "--cert": ("--grpc-server-cert", str(certificates.server_cert)),
        "--key": ("--grpc-server-key", str(certificates.server_key)),
    }
    args = [a for flag in flags for a in files.get(flag, (flag,))]
    make_examples(tmp_path / "models")
    done = serve_until_it_exits(tmp_path / "models", *args)
    assert done.returncode != 0
    assert message in done.stderr, done.stderr


# ---------------------------------------------------------------------------------------------
# 2. Health through the public port


@pytest.mark.timeout(60)
@pytest.mark.parametrize("service", ["", SERVICE, f"{SERVICE}/simple"])
def test_health_check_through_the_public_port(server: ServerProcess, service: str) -> None:
    with grpc.insecure_channel(server.url) as channel:
        answer = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=service), timeout=CALL_TIMEOUT_S
        )
    assert answer.status == health_pb2.HealthCheckResponse.SERVING


@pytest.mark.timeout(60)
def test_health_check_of_an_unknown_model_is_not_found(server: ServerProcess) -> None:
    with grpc.insecure_channel(server.url) as channel, pytest.raises(grpc.RpcError) as unknown:
        health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=f"{SERVICE}/no_such_model"),
            timeout=CALL_TIMEOUT_S,
        )
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.timeout(90)
def test_health_watch_sees_serving_then_not_serving_at_sigterm(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """Today's behaviour, pinned: the stream sends SERVING, then NOT_SERVING once SIGTERM starts
    the shutdown, then ends (well before the server's grace period is over)."""
    seen: list[str] = []
    ended: list[grpc.StatusCode] = []
    serving = threading.Event()

    def watch(url: str) -> None:
        with grpc.insecure_channel(url) as channel:
            stub = health_pb2_grpc.HealthStub(channel)
            try:
                for answer in stub.Watch(health_pb2.HealthCheckRequest(service=""), timeout=60):
                    seen.append(health_pb2.HealthCheckResponse.ServingStatus.Name(answer.status))
                    serving.set()
                ended.append(grpc.StatusCode.OK)
            except grpc.RpcError as error:
                ended.append(error.code())

    with examples_server(tmp_path_factory, "watch") as server:
        watcher = threading.Thread(target=watch, args=(server.url,), daemon=True)
        watcher.start()
        assert serving.wait(CALL_TIMEOUT_S), "Watch sent nothing"
        assert seen == ["SERVING"]
        server.process.send_signal(signal.SIGTERM)
        started = time.monotonic()
        watcher.join(CALL_TIMEOUT_S)
        assert not watcher.is_alive(), f"Watch did not end after SIGTERM; saw {seen}"
        assert time.monotonic() - started < 10.0
        server.process.wait(timeout=30)  # running_server then checks the exit code and the log
    assert seen == ["SERVING", "NOT_SERVING"]
    assert ended == [grpc.StatusCode.OK], f"the stream ended with {ended}"


# ---------------------------------------------------------------------------------------------
# 3. Reflection, v1alpha and v1, through the public port

REFLECTION_METHODS = {
    # grpcio-reflection ships only the v1alpha messages; v1's are the same messages under
    # another package (same fields, same numbers), so v1 is called with them over the wire.
    "v1alpha": "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo",
    "v1": "/grpc.reflection.v1.ServerReflection/ServerReflectionInfo",
}


def reflect(channel: grpc.Channel, version: str, request: Any) -> Any:
    call = channel.stream_stream(
        REFLECTION_METHODS[version],
        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
    )
    answers = list(call(iter([request]), timeout=CALL_TIMEOUT_S))
    assert len(answers) == 1
    return answers[0]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("version", list(REFLECTION_METHODS))
def test_reflection_lists_the_services(server: ServerProcess, version: str) -> None:
    with grpc.insecure_channel(server.url) as channel:
        answer = reflect(channel, version, reflection_pb2.ServerReflectionRequest(list_services=""))
    assert answer.WhichOneof("message_response") == "list_services_response", answer
    services = {s.name for s in answer.list_services_response.service}
    assert {SERVICE, HEALTH_SERVICE} <= services


@pytest.mark.timeout(60)
@pytest.mark.parametrize("version", list(REFLECTION_METHODS))
def test_reflection_describes_the_inference_service(server: ServerProcess, version: str) -> None:
    with grpc.insecure_channel(server.url) as channel:
        answer = reflect(
            channel, version, reflection_pb2.ServerReflectionRequest(file_containing_symbol=SERVICE)
        )
    assert answer.WhichOneof("message_response") == "file_descriptor_response", answer
    files = [
        descriptor_pb2.FileDescriptorProto.FromString(raw)
        for raw in answer.file_descriptor_response.file_descriptor_proto
    ]
    services = {
        f"{f.package}.{s.name}": {m.name for m in s.method} for f in files for s in f.service
    }
    assert {"ModelInfer", "ModelStreamInfer", "ModelMetadata"} <= services[SERVICE]


@pytest.mark.timeout(60)
def test_reflection_client_builds_the_inference_service(server: ServerProcess) -> None:
    """grpcio-reflection's own client (v1alpha) resolves the service and its messages."""
    with grpc.insecure_channel(server.url) as channel:
        database = ProtoReflectionDescriptorDatabase(channel)
        assert {SERVICE, HEALTH_SERVICE} <= set(database.get_services())
        service = DescriptorPool(database).FindServiceByName(SERVICE)
        infer = service.FindMethodByName("ModelInfer")
        assert infer.input_type.full_name == "inference.ModelInferRequest"
        assert "raw_input_contents" in infer.input_type.fields_by_name


# ---------------------------------------------------------------------------------------------
# 4 and 6. Message-size limit; deadlines and cancellation (a server with a slow model)

SMALL_LIMIT = 65536
# The slow model's matrices: ~0.7 s a request on an idle core here, more on a loaded one, a
# window wide enough to see a request queued behind it.
BUSY_SIZE = 2560


@pytest.fixture(scope="module")
def limits_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("limits")
    names = make_examples(root / "models")
    write_slow_model(root / "models" / "slow", SINGLE_REQUEST_CONFIG, size=BUSY_SIZE)
    with running_server(
        root / "models",
        [*names, "slow"],
        root,
        "--grpc-max-message-bytes",
        str(SMALL_LIMIT),
    ) as server:
        yield server


@pytest.fixture
def limits_client(limits_server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(limits_server.url)
    try:
        yield client
    finally:
        client.close()


def fp32_row(values: np.ndarray) -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("INPUT0", list(values.shape), "FP32")
    tensor.set_data_from_numpy(values)
    return [tensor]


@pytest.mark.timeout(60)
def test_a_request_over_the_message_limit_is_resource_exhausted(
    limits_client: grpcclient.InferenceServerClient, assert_serving: SimpleCheck
) -> None:
    large = np.ones((1, 20000), dtype=np.float32)  # 80 kB of tensor data alone
    with pytest.raises(InferenceServerException) as too_large:
        limits_client.infer("identity_fp32", fp32_row(large), client_timeout=CALL_TIMEOUT_S)
    assert status_of(too_large.value) == "StatusCode.RESOURCE_EXHAUSTED", too_large.value
    # Just under the limit, both ways (the identity answers as much as it is sent).
    under = np.arange(15000, dtype=np.float32).reshape(1, 15000)  # 60 kB
    result = limits_client.infer("identity_fp32", fp32_row(under), client_timeout=CALL_TIMEOUT_S)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), under)
    assert_serving(limits_client)


class Answers:
    """async_infer callbacks, in completion order: (tag, result, error)."""

    def __init__(self) -> None:
        self.done: queue.Queue[tuple[str, Any, Any]] = queue.Queue()

    def callback(self, tag: str) -> Callable[[Any, Any], None]:
        return lambda result, error: self.done.put((tag, result, error))

    def wait(self, count: int) -> list[tuple[str, Any, Any]]:
        return [self.done.get(timeout=CALL_TIMEOUT_S) for _ in range(count)]


def slow_stats(client: grpcclient.InferenceServerClient) -> Any:
    return client.get_inference_statistics("slow").model_stats[0]


BUSY = 2  # requests ahead of the one under test: one computes while the other waits queued


def occupy_slow(
    server: ServerProcess, client: grpcclient.InferenceServerClient, answers: Answers
) -> None:
    """BUSY requests that keep the slow model's only instance busy, one at a time (max_batch_size
    1), for far longer than the short deadlines below. Whichever the server took first, one
    computes (~0.7 s) while the other is queued: the request under test is sent once that is seen,
    so it queues behind a whole computation however slowly the machine delivered the calls."""
    for _ in range(BUSY):
        client.async_infer(
            "slow", fp32_row(np.array([[-1.0]], np.float32)), answers.callback("busy")
        )
    server.wait_for_pending("slow", BUSY - 1)


def assert_slow_serves(client: grpcclient.InferenceServerClient) -> None:
    result = client.infer(
        "slow", fp32_row(np.array([[2.5]], np.float32)), client_timeout=CALL_TIMEOUT_S
    )
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), [[2.5]])


def assert_only_the_busy_ones_computed(
    client: grpcclient.InferenceServerClient, before: Any
) -> None:
    """The request under test failed and was never computed: a request sent after the busy ones
    have answered would be computed after it, had it stayed queued, so once that request is
    counted the counts are exact (the busy ones and it; one request an execution)."""
    assert_slow_serves(client)
    wait_until(
        lambda: slow_stats(client).execution_count - before.execution_count >= BUSY + 1,
        "the last request to slow counted",
    )
    after = slow_stats(client)
    assert after.execution_count - before.execution_count == BUSY + 1
    assert after.inference_count - before.inference_count == BUSY + 1
    assert after.inference_stats.fail.count == before.inference_stats.fail.count + 1


@pytest.mark.timeout(60)
def test_a_short_deadline_fails_promptly_and_the_late_request_is_not_computed(
    limits_server: ServerProcess,
    limits_client: grpcclient.InferenceServerClient,
    assert_serving: SimpleCheck,
) -> None:
    answers = Answers()
    before = slow_stats(limits_client)
    occupy_slow(limits_server, limits_client, answers)
    started = time.monotonic()
    with pytest.raises(InferenceServerException) as late:
        limits_client.infer("slow", fp32_row(np.array([[1.0]], np.float32)), client_timeout=0.05)
    elapsed = time.monotonic() - started
    assert status_of(late.value) == "StatusCode.DEADLINE_EXCEEDED", late.value
    assert elapsed < 1.0, f"DEADLINE_EXCEEDED after {elapsed:.2f} s for a 50 ms deadline"
    for _, busy, error in answers.wait(BUSY):
        assert error is None and busy is not None, error
    assert_only_the_busy_ones_computed(limits_client, before)
    assert_serving(limits_client)


@pytest.mark.timeout(60)
def test_a_cancelled_call_is_dropped_and_the_server_keeps_serving(
    limits_server: ServerProcess,
    limits_client: grpcclient.InferenceServerClient,
    assert_serving: SimpleCheck,
) -> None:
    answers = Answers()
    before = slow_stats(limits_client)
    occupy_slow(limits_server, limits_client, answers)
    call = limits_client.async_infer(
        "slow", fp32_row(np.array([[1.0]], np.float32)), answers.callback("cancelled")
    )
    # On the server and queued behind the busy ones (one of them computing).
    limits_server.wait_for_pending("slow", BUSY)
    call.cancel()
    results = answers.wait(BUSY + 1)
    assert all(error is None for tag, _, error in results if tag == "busy"), results
    [cancelled] = [error for tag, _, error in results if tag == "cancelled"]
    assert cancelled is not None and status_of(cancelled) == "StatusCode.CANCELLED", cancelled
    assert_only_the_busy_ones_computed(limits_client, before)
    assert_serving(limits_client)


# ---------------------------------------------------------------------------------------------
# 5. --grpc-max-concurrent-streams


@pytest.fixture(scope="module")
def one_stream_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with examples_server(
        tmp_path_factory, "one_stream", "--grpc-max-concurrent-streams", "1"
    ) as server:
        yield server


@pytest.mark.timeout(90)
def test_one_stream_per_connection_serves_sequences_and_concurrent_calls(
    one_stream_server: ServerProcess,
) -> None:
    client = grpcclient.InferenceServerClient(one_stream_server.url)
    try:
        for value in range(20):
            infer_simple(client, value)
    finally:
        client.close()

    # Four channels (two sharing grpc's connection, two with their own), three threads each:
    # calls beyond a connection's one stream wait for it; none fails.
    clients = [
        grpcclient.InferenceServerClient(one_stream_server.url),
        grpcclient.InferenceServerClient(one_stream_server.url),
        grpcclient.InferenceServerClient(one_stream_server.url, channel_args=[OWN_CONNECTION]),
        grpcclient.InferenceServerClient(one_stream_server.url, channel_args=[OWN_CONNECTION]),
    ]
    failures: list[str] = []
    answered: list[int] = []

    def send(client: grpcclient.InferenceServerClient, first: int) -> None:
        for value in range(first, first + 15):
            try:
                infer_simple(client, value)
                answered.append(value)
            except (InferenceServerException, AssertionError) as error:
                failures.append(f"{value}: {error}")

    threads = [
        threading.Thread(target=send, args=(c, 1000 * (i * 3 + j)))
        for i, c in enumerate(clients)
        for j in range(3)
    ]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    finally:
        for c in clients:
            c.close()
    assert not failures, failures[:5]
    assert len(answered) == 4 * 3 * 15


@pytest.mark.timeout(60)
def test_one_stream_per_connection_is_enforced(one_stream_server: ServerProcess) -> None:
    """An open ModelStreamInfer holds its connection's only stream: a unary call on the same
    connection waits (here until its deadline), another connection is served, and once the stream
    ends the first connection serves again."""
    with (
        grpc.insecure_channel(one_stream_server.url, options=[OWN_CONNECTION]) as held,
        grpc.insecure_channel(one_stream_server.url, options=[OWN_CONNECTION]) as other,
    ):
        held_stub = pb_grpc.GRPCInferenceServiceStub(held)
        with request_stream(held) as stream:
            stream.send(raw_simple_request(5, "open"))
            answer = stream.receive()
            assert answer.error_message == ""
            check_raw_simple_answer(answer.infer_response, 5)
            with pytest.raises(grpc.RpcError) as waiting:
                held_stub.ServerReady(pb.ServerReadyRequest(), timeout=1.0)
            assert waiting.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            other_stub = pb_grpc.GRPCInferenceServiceStub(other)
            assert other_stub.ServerReady(pb.ServerReadyRequest(), timeout=CALL_TIMEOUT_S).ready
            check_raw_simple_answer(
                other_stub.ModelInfer(raw_simple_request(6, "other"), timeout=CALL_TIMEOUT_S), 6
            )
            stream.close()
            assert stream.receive() is None  # the stream ended with OK
        assert held_stub.ServerReady(pb.ServerReadyRequest(), timeout=CALL_TIMEOUT_S).ready


# ---------------------------------------------------------------------------------------------
# Keepalive: the server's pings, seen by a relay between client and server


class PingCountingRelay:
    """A TCP relay in front of a plaintext gRPC port. It counts the HTTP/2 PING frames the
    server sends (not the ACKs), notes when the server closes a connection, and can stop passing
    the client's bytes on (a client that vanished without closing its connection)."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self._target = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._lock = threading.Lock()
        self._pings = 0
        self.server_closed = threading.Event()
        self._frozen = threading.Event()
        self._sockets: list[socket.socket] = []
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    @property
    def pings(self) -> int:
        with self._lock:
            return self._pings

    def freeze(self) -> None:
        """From now on the client's bytes are dropped: the server's pings go unanswered."""
        self._frozen.set()

    def _accept(self) -> None:
        while True:
            try:
                downstream, _ = self._listener.accept()
            except OSError:
                return  # closed
            upstream = socket.create_connection(self._target, timeout=CALL_TIMEOUT_S)
            upstream.settimeout(None)
            with self._lock:
                self._sockets += [downstream, upstream]
            for target in (self._client_to_server, self._server_to_client):
                thread = threading.Thread(target=target, args=(downstream, upstream), daemon=True)
                thread.start()
                self._threads.append(thread)

    def _client_to_server(self, downstream: socket.socket, upstream: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := downstream.recv(65536):
                if not self._frozen.is_set():
                    upstream.sendall(data)
        with contextlib.suppress(OSError):
            upstream.shutdown(socket.SHUT_WR)

    def _server_to_client(self, downstream: socket.socket, upstream: socket.socket) -> None:
        pending = b""  # the server's side is HTTP/2 frames from its first byte
        with contextlib.suppress(OSError):
            while data := upstream.recv(65536):
                pending += data
                while len(pending) >= 9:
                    length = int.from_bytes(pending[:3], "big")
                    if len(pending) < 9 + length:
                        break
                    kind, flags = pending[3], pending[4]
                    if kind == 0x6 and not flags & 0x1:  # PING, not an ACK
                        with self._lock:
                            self._pings += 1
                    pending = pending[9 + length :]
                downstream.sendall(data)
        self.server_closed.set()
        with contextlib.suppress(OSError):
            downstream.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept (close alone does not)
        self._listener.close()
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        for thread in self._threads:
            thread.join(5)


@contextlib.contextmanager
def relay(target: str) -> Iterator[PingCountingRelay]:
    running = PingCountingRelay(target)
    try:
        yield running
    finally:
        running.close()


KEEPALIVE_TIME_S = 0.5
KEEPALIVE_TIMEOUT_S = 1.0


@pytest.fixture(scope="module")
def keepalive_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with examples_server(
        tmp_path_factory,
        "keepalive",
        "--grpc-keepalive-time-secs",
        str(KEEPALIVE_TIME_S),
        "--grpc-keepalive-timeout-secs",
        str(KEEPALIVE_TIMEOUT_S),
    ) as server:
        yield server


def open_answered_stream(stack: contextlib.ExitStack, url: str) -> RequestStream:
    """A ModelStreamInfer over ``url`` that has answered one request."""
    channel = stack.enter_context(grpc.insecure_channel(url, options=[OWN_CONNECTION]))
    stream = stack.enter_context(request_stream(channel))
    stream.send(raw_simple_request(1, "first"))
    check_raw_simple_answer(stream.receive().infer_response, 1)
    return stream


@pytest.mark.timeout(60)
def test_keepalive_pings_an_idle_stream_which_stays_open(
    keepalive_server: ServerProcess, server: ServerProcess
) -> None:
    """The keepalive server pings an idle connection every KEEPALIVE_TIME_S; the session's server
    (the default keepalive: hours) does not. An answering client keeps its stream."""
    with (
        relay(keepalive_server.url) as pinged,
        relay(server.url) as default,
        contextlib.ExitStack() as stack,
    ):
        pinged_stream = open_answered_stream(stack, pinged.url)
        default_stream = open_answered_stream(stack, default.url)
        time.sleep(0.2)  # any ping that the requests themselves prompted is out
        pinged_before, default_before = pinged.pings, default.pings
        time.sleep(4 * KEEPALIVE_TIME_S)  # time is what is tested: pings within this window
        assert pinged.pings - pinged_before >= 1
        assert default.pings == default_before
        for stream in (pinged_stream, default_stream):
            stream.send(raw_simple_request(2, "after"))
            answer = stream.receive()
            assert answer.infer_response.id == "after"
            check_raw_simple_answer(answer.infer_response, 2)
        assert not pinged.server_closed.is_set()


@pytest.mark.timeout(60)
def test_keepalive_drops_a_connection_whose_client_stopped_answering(
    keepalive_server: ServerProcess,
) -> None:
    with relay(keepalive_server.url) as silent, contextlib.ExitStack() as stack:
        stream = open_answered_stream(stack, silent.url)
        silent.freeze()
        started = time.monotonic()
        limit = 4 * (KEEPALIVE_TIME_S + KEEPALIVE_TIMEOUT_S)
        assert silent.server_closed.wait(limit), f"still connected after {limit} s of silence"
        # Not at once: after a ping went unanswered for the timeout.
        assert time.monotonic() - started >= KEEPALIVE_TIMEOUT_S * 0.5
        ended = stream.receive()
        assert isinstance(ended, grpc.RpcError) and ended.code() == grpc.StatusCode.UNAVAILABLE
    client = grpcclient.InferenceServerClient(keepalive_server.url)
    try:
        infer_simple(client, 9)
    finally:
        client.close()


# ---------------------------------------------------------------------------------------------
# 7. A control-plane storm does not starve inference

TRAFFIC_THREADS = 3
POLLERS = 2
ROUNDS = 3
WINDOW_S = 1.0
MIN_RATIO = 0.3
TOGGLED = "identity_fp32"


class Traffic:
    """``simple`` requests from a few threads, each with its own client, every answer checked,
    until ``stop``; ``answered`` counts the correct answers and ``failures`` the rest."""

    def __init__(self, url: str, threads: int) -> None:
        self.url = url
        self.answered = 0
        self.failures: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._send, args=(100_000 * i,)) for i in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    def _send(self, value: int) -> None:
        client = grpcclient.InferenceServerClient(self.url)
        try:
            while not self._stop.is_set():
                try:
                    infer_simple(client, value)
                    with self._lock:
                        self.answered += 1
                except (InferenceServerException, AssertionError) as error:
                    with self._lock:
                        self.failures.append(f"{value}: {error}")
                value += 1
        finally:
            client.close()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(CALL_TIMEOUT_S + 5)


class Storm:
    """Control-plane calls in a loop from several threads while ``storming`` is set, each call
    checked: metadata, config, readiness and the repository index; one thread loads and unloads
    TOGGLED."""

    def __init__(self, url: str, pollers: int) -> None:
        self.url = url
        self.calls: dict[str, int] = {}
        self.failures: list[str] = []
        self.storming = threading.Event()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._poll) for _ in range(pollers)]
        self._threads.append(threading.Thread(target=self._toggle))
        for thread in self._threads:
            thread.start()

    def _running(self) -> bool:
        """Waits while the storm is paused; False once it is stopped."""
        while not self._stop.is_set():
            if self.storming.wait(0.05):
                return True
        return False

    def _run(self, name: str, call: Callable[[], object]) -> None:
        try:
            call()
            with self._lock:
                self.calls[name] = self.calls.get(name, 0) + 1
        except (InferenceServerException, AssertionError) as error:
            with self._lock:
                self.failures.append(f"{name}: {error!r}")

    def _poll(self) -> None:
        client = grpcclient.InferenceServerClient(self.url)

        def metadata() -> None:
            answer = client.get_model_metadata("simple", client_timeout=CALL_TIMEOUT_S)
            assert answer.name == "simple"

        def config() -> None:
            answer = client.get_model_config("simple", client_timeout=CALL_TIMEOUT_S)
            assert answer.config.max_batch_size == 8

        def model_ready() -> None:
            assert client.is_model_ready("simple", client_timeout=CALL_TIMEOUT_S)
            client.is_model_ready(TOGGLED, client_timeout=CALL_TIMEOUT_S)  # either answer

        def server_ready() -> None:
            client.is_server_ready(client_timeout=CALL_TIMEOUT_S)  # either answer

        def index() -> None:
            models = client.get_model_repository_index(client_timeout=CALL_TIMEOUT_S).models
            assert {"simple", TOGGLED} <= {m.name for m in models}

        calls = {
            "ModelMetadata": metadata,
            "ModelConfig": config,
            "ModelReady": model_ready,
            "ServerReady": server_ready,
            "RepositoryIndex": index,
        }
        try:
            while self._running():
                for name, call in calls.items():
                    self._run(name, call)
        finally:
            client.close()

    def _toggle(self) -> None:
        client = grpcclient.InferenceServerClient(self.url)
        try:
            while self._running():
                self._run(
                    "RepositoryModelLoad",
                    lambda: client.load_model(TOGGLED, client_timeout=CALL_TIMEOUT_S),
                )
                self._run(
                    "RepositoryModelUnload",
                    lambda: client.unload_model(TOGGLED, client_timeout=CALL_TIMEOUT_S),
                )
        finally:
            client.close()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(CALL_TIMEOUT_S + 5)


@pytest.mark.timeout(120)
def test_a_control_plane_storm_does_not_starve_inference(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """The same ``simple`` traffic runs throughout; windows with and without the storm alternate
    (so that other load on the machine weighs on both alike), and the answers in each kind of
    window are compared: a ratio, not absolute rates."""
    answered = {"alone": 0, "storm": 0}
    with examples_server(
        tmp_path_factory, "storm", "--model-control-mode", "explicit", "--load-model", "simple"
    ) as server:
        traffic = Traffic(server.url, TRAFFIC_THREADS)
        storm = Storm(server.url, POLLERS)
        try:
            warmed = time.monotonic() + CALL_TIMEOUT_S
            while traffic.answered < 50 and time.monotonic() < warmed:
                time.sleep(0.05)  # the clients connect and the first answers are in
            for _ in range(ROUNDS):
                for kind in ("alone", "storm"):
                    if kind == "storm":
                        storm.storming.set()
                    before = traffic.answered
                    time.sleep(WINDOW_S)  # time is what is tested: answers per window
                    answered[kind] += traffic.answered - before
                    storm.storming.clear()
        finally:
            storm.stop()
            traffic.stop()

    print(f"\nsimple answers in {ROUNDS} x {WINDOW_S} s: {answered}; storm calls: {storm.calls}")
    assert not traffic.failures, traffic.failures[:5]
    assert not storm.failures, storm.failures[:5]
    assert answered["alone"] > 0
    for name in (
        "ModelMetadata",
        "ModelConfig",
        "ModelReady",
        "ServerReady",
        "RepositoryIndex",
        "RepositoryModelLoad",
        "RepositoryModelUnload",
    ):
        assert storm.calls.get(name, 0) > 0, storm.calls
    assert answered["storm"] >= MIN_RATIO * answered["alone"], answered


# ---------------------------------------------------------------------------------------------
# 8. ModelStreamInfer over the public port


@pytest.mark.timeout(60)
def test_stream_answers_requests_in_flight_with_their_ids(server: ServerProcess) -> None:
    with (
        grpc.insecure_channel(server.url) as channel,
        request_stream(channel) as stream,
    ):
        values = {f"req-{i}": i * 7 - 20 for i in range(8)}
        for request_id, value in list(values.items())[:4]:
            stream.send(raw_simple_request(value, request_id))
        stream.send(raw_simple_request(0, "bad-1", model="no_such_model"))
        for request_id, value in list(values.items())[4:]:
            stream.send(raw_simple_request(value, request_id))
        answers: dict[str, Any] = {}
        errors: dict[str, str] = {}
        for _ in range(len(values) + 1):
            answer = stream.receive()
            assert answer is not None and not isinstance(answer, grpc.RpcError), answer
            if answer.error_message:
                errors[answer.infer_response.id] = answer.error_message
            else:
                answers[answer.infer_response.id] = answer.infer_response
        assert set(errors) == {"bad-1"}
        assert "no_such_model" in errors["bad-1"]
        assert set(answers) == set(values)
        for request_id, value in values.items():
            assert answers[request_id].model_name == "simple"
            check_raw_simple_answer(answers[request_id], value)
        # The stream goes on after the error.
        stream.send(raw_simple_request(99, "after-error"))
        answer = stream.receive()
        assert answer.error_message == ""
        assert answer.infer_response.id == "after-error"
        check_raw_simple_answer(answer.infer_response, 99)
        stream.close()
        assert stream.receive() is None  # ended with OK


@pytest.mark.timeout(60)
def test_stream_with_triton_grpc_error_ends_with_the_status(server: ServerProcess) -> None:
    with (
        grpc.insecure_channel(server.url) as channel,
        request_stream(channel, metadata=(("triton_grpc_error", "true"),)) as stream,
    ):
        stream.send(raw_simple_request(4, "good"))
        answer = stream.receive()
        assert answer.infer_response.id == "good"
        check_raw_simple_answer(answer.infer_response, 4)
        stream.send(raw_simple_request(0, "bad", model="no_such_model"))
        ended = stream.receive()
        assert isinstance(ended, grpc.RpcError), ended
        assert ended.code() == grpc.StatusCode.NOT_FOUND
        assert "no_such_model" in (ended.details() or "")


@pytest.mark.timeout(60)
def test_stream_through_tritonclient(server: ServerProcess) -> None:
    """tritonclient's stream API over the public port: answers come back with their ids."""
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.url)
    try:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        for value in range(5):
            a = np.full((1, 16), value, dtype=np.int32)
            client.async_stream_infer("simple", simple_inputs(a, a), request_id=f"t-{value}")
        seen: dict[str, np.ndarray] = {}
        for _ in range(5):
            result, error = answers.get(timeout=CALL_TIMEOUT_S)
            assert error is None, error
            seen[result.get_response().id] = result.as_numpy("OUTPUT0")
        for value in range(5):
            np.testing.assert_array_equal(seen[f"t-{value}"], np.full((1, 16), 2 * value))
    finally:
        client.stop_stream()
        client.close()
