"""Who may call what (issue 13, item 6): control calls only on the Unix socket unless the operator
opens them on TCP or protects them; Triton's --grpc-restricted-protocol, its secret read from a
file or the environment; settings it cannot enforce stop the server."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

import inferd._proto.grpc_service_pb2 as pb
import inferd._proto.grpc_service_pb2_grpc as pb_grpc
from inferd.examples import make_examples
from tests.integration.conftest import ServerProcess, running_server

INFER_KEY = "infer-secret-4f1c"  # from the environment
ADMIN_KEY = "admin-secret-9b2e"  # from a file
RESTRICTED = "This protocol is restricted, expecting header 'triton-grpc-protocol-{}'"


def infer_simple(client: grpcclient.InferenceServerClient, **kwargs: object) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [
        grpcclient.InferInput("INPUT0", [1, 16], "INT32"),
        grpcclient.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(a)
    result = client.infer("simple", inputs, **kwargs)  # type: ignore[arg-type]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)


def refusal(call: object) -> tuple[grpc.StatusCode, str]:
    """The code and message of the RpcError ``call`` (a callable) raises."""
    assert callable(call)
    with pytest.raises(grpc.RpcError) as raised:
        call()
    error = raised.value
    return error.code(), error.details()  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def closed_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Defaults: control calls are not opened on TCP."""
    root = tmp_path_factory.mktemp("closed")
    names = make_examples(root / "models")
    with running_server(
        root / "models",
        names,
        root,
        "--model-control-mode",
        "explicit",
        "--load-model",
        "*",
        control_on_tcp=False,
    ) as server:
        yield server


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("method", "request_message"),
    [
        ("RepositoryModelUnload", pb.RepositoryModelUnloadRequest(model_name="simple")),
        ("RepositoryModelLoad", pb.RepositoryModelLoadRequest(model_name="simple")),
        ("LogSettings", pb.LogSettingsRequest()),
    ],
)
def test_control_calls_over_tcp_are_refused_by_default(
    closed_server: ServerProcess, method: str, request_message: object
) -> None:
    with grpc.insecure_channel(closed_server.url) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        code, message = refusal(lambda: getattr(stub, method)(request_message, timeout=10))
        assert code == grpc.StatusCode.PERMISSION_DENIED
        assert "--grpc-control-on-tcp" in message and "--grpc-unix-socket" in message, message
        # Nothing was changed: simple is still served, inference and reads go on over TCP.
        assert stub.ModelReady(pb.ModelReadyRequest(name="simple"), timeout=10).ready
        assert stub.RepositoryIndex(pb.RepositoryIndexRequest(), timeout=10).models


@pytest.mark.timeout(60)
def test_control_calls_on_the_unix_socket_are_answered(closed_server: ServerProcess) -> None:
    local = grpcclient.InferenceServerClient(f"unix:{closed_server.unix_socket}")
    remote = grpcclient.InferenceServerClient(closed_server.url)
    try:
        assert "log_info" in local.get_log_settings(as_json=True)["settings"]
        local.unload_model("simple")
        assert not remote.is_model_ready("simple")
        local.load_model("simple")
        assert remote.is_model_ready("simple")
        infer_simple(remote)
    finally:
        local.close()
        remote.close()


@pytest.mark.timeout(120)
def test_control_on_tcp_answers_control_calls_on_the_port(tmp_path: Path) -> None:
    names = make_examples(tmp_path / "models")
    with running_server(
        tmp_path / "models",
        names,
        tmp_path,
        "--model-control-mode",
        "explicit",
        "--load-model",
        "*",
        "--grpc-control-on-tcp=true",
        control_on_tcp=False,  # the flag above, as an operator writes it
    ) as server:
        client = grpcclient.InferenceServerClient(server.url)
        try:
            assert "log_info" in client.get_log_settings(as_json=True)["settings"]
            client.unload_model("simple")
            assert not client.is_model_ready("simple")
            client.load_model("simple")
            infer_simple(client)
        finally:
            client.close()


@pytest.fixture(scope="module")
def restricted_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """inference needs the key from INFER_KEY; model-repository and logging the one in a file."""
    root = tmp_path_factory.mktemp("restricted")
    names = make_examples(root / "models")
    secret = root / "admin.key"
    secret.write_text(ADMIN_KEY + "\n")
    secret.chmod(0o600)
    with running_server(
        root / "models",
        names,
        root,
        "--model-control-mode",
        "explicit",
        "--load-model",
        "*",
        "--grpc-restricted-protocol",
        "inference:infer=env:INFERD_TEST_INFER_KEY",
        f"--grpc-restricted-protocol=model-repository,logging:admin=@{secret}",
        env_extra={"INFERD_TEST_INFER_KEY": INFER_KEY},
        control_on_tcp=False,
    ) as server:
        yield server


@pytest.mark.timeout(60)
@pytest.mark.parametrize("sent", [None, "wrong", INFER_KEY[:-1], INFER_KEY + "x", ADMIN_KEY])
def test_a_restricted_group_without_its_header_is_unavailable(
    restricted_server: ServerProcess, sent: str | None
) -> None:
    headers = {} if sent is None else {"triton-grpc-protocol-infer": sent}
    client = grpcclient.InferenceServerClient(restricted_server.url)
    try:
        with pytest.raises(InferenceServerException) as refused:
            infer_simple(client, headers=headers)
        assert refused.value.status() == "StatusCode.UNAVAILABLE"
        assert refused.value.message() == RESTRICTED.format("infer")
        # A stream is refused the same way.
        with grpc.insecure_channel(restricted_server.url) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            stream = stub.ModelStreamInfer(iter([pb.ModelInferRequest(model_name="simple")]))
            code, message = refusal(lambda: list(stream))
            assert (code, message) == (grpc.StatusCode.UNAVAILABLE, RESTRICTED.format("infer"))
        # Groups left open need nothing.
        assert client.is_server_ready()
        assert client.get_model_metadata("simple").name == "simple"
    finally:
        client.close()


@pytest.mark.timeout(60)
def test_a_restricted_group_with_its_header_is_served(restricted_server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(restricted_server.url)
    try:
        infer_simple(client, headers={"triton-grpc-protocol-infer": INFER_KEY})
    finally:
        client.close()
    log = restricted_server.log()
    assert INFER_KEY not in log and ADMIN_KEY not in log


@pytest.mark.timeout(60)
def test_protecting_the_control_groups_opens_them_on_tcp_to_whoever_has_the_key(
    restricted_server: ServerProcess,
) -> None:
    admin = {"triton-grpc-protocol-admin": ADMIN_KEY}
    client = grpcclient.InferenceServerClient(restricted_server.url)
    local = grpcclient.InferenceServerClient(f"unix:{restricted_server.unix_socket}")
    try:
        for who in (client, local):  # the key is asked for on the socket too
            with pytest.raises(InferenceServerException) as refused:
                who.unload_model("simple")
            assert refused.value.status() == "StatusCode.UNAVAILABLE"
            assert refused.value.message() == RESTRICTED.format("admin")
        assert client.get_log_settings(headers=admin, as_json=True)["settings"]
        client.unload_model("simple", headers=admin)
        assert not client.is_model_ready("simple")
        client.load_model("simple", headers=admin)
        assert client.is_model_ready("simple")
    finally:
        client.close()
        local.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("inferences:k=v", "unknown API group 'inferences'"),
        ("inference:k", "wants GROUPS:KEY=VALUE"),
        ("inference:k=env:INFERD_TEST_NOT_SET", "INFERD_TEST_NOT_SET is not set"),
        ("inference:k=@/nonexistent/inferd-key", "cannot read /nonexistent/inferd-key"),
        ("inference:k=", "is empty"),
        ("inference:bad key=v", "character gRPC refuses"),
    ],
)
def test_a_restricted_protocol_it_cannot_enforce_stops_the_server(
    tmp_path: Path, spec: str, message: str
) -> None:
    repository = tmp_path / "models"
    make_examples(repository)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INFERD_", "OTEL_"))}
    done = subprocess.run(
        [
            *(sys.executable, "-m", "inferd", "serve", "--model-repository", str(repository)),
            *("--host", "127.0.0.1", "--grpc-port", "0", "--metrics-port", "-1"),
            *("--http-port", "0", f"--grpc-restricted-protocol={spec}"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    assert done.returncode != 0
    assert message in done.stderr, done.stderr


# Issue 25, item 1: grpcio (the backend behind the core) matches a method only up to a NUL byte,
# so a path with one after the name used to pass the core's table unmatched and reach the method
# without its rule. Every path that is not exactly a served method is now UNIMPLEMENTED.
NEAR_MISSES = ["\x00", "\x00x", "/", " ", "\u00e9", "%00"]


def raw_call(channel: grpc.Channel, path: str, message: object) -> tuple[grpc.StatusCode, str]:
    call = channel.unary_unary(
        path,
        request_serializer=lambda m: m.SerializeToString(),  # type: ignore[attr-defined]
        response_deserializer=lambda b: b,
    )
    return refusal(lambda: call(message, timeout=10))


@pytest.mark.timeout(120)
@pytest.mark.parametrize("suffix", NEAR_MISSES)
def test_a_near_miss_of_a_method_path_passes_no_rule(
    restricted_server: ServerProcess, suffix: str
) -> None:
    service = "/inference.GRPCInferenceService/"
    verbose = pb.LogSettingsRequest()
    verbose.settings["log_verbose_level"].uint32_param = 1
    calls: list[tuple[str, object]] = [
        ("RepositoryModelUnload", pb.RepositoryModelUnloadRequest(model_name="simple")),
        ("RepositoryModelLoad", pb.RepositoryModelLoadRequest(model_name="simple")),
        ("RepositoryIndex", pb.RepositoryIndexRequest()),
        ("LogSettings", verbose),
        ("ModelInfer", pb.ModelInferRequest(model_name="simple")),
    ]
    with grpc.insecure_channel(restricted_server.url) as channel:
        for name, message in calls:
            code, details = raw_call(channel, service + name + suffix, message)
            assert code == grpc.StatusCode.UNIMPLEMENTED, (name, details)
            assert details.startswith("unknown method '/inference.GRPCInferenceService/"), details
        # Case and doubled slashes are other methods too.
        for path in (service.lower() + "RepositoryModelUnload", service + "/RepositoryModelUnload"):
            code, _ = raw_call(channel, path, calls[0][1])
            assert code == grpc.StatusCode.UNIMPLEMENTED, path
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        assert stub.ModelReady(pb.ModelReadyRequest(name="simple"), timeout=10).ready
    client = grpcclient.InferenceServerClient(restricted_server.url)
    try:
        infer_simple(client, headers={"triton-grpc-protocol-infer": INFER_KEY})
        settings = client.get_log_settings(
            headers={"triton-grpc-protocol-admin": ADMIN_KEY}, as_json=True
        )["settings"]
        assert settings["log_verbose_level"] == {"uint32_param": 0}, settings  # not changed
    finally:
        client.close()


@pytest.mark.timeout(60)
def test_a_restricted_header_given_twice_needs_the_key_both_times(
    restricted_server: ServerProcess,
) -> None:
    with grpc.insecure_channel(restricted_server.url) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        request = pb.RepositoryModelUnloadRequest(model_name="simple")
        for pair in ((ADMIN_KEY, "wrong"), ("wrong", ADMIN_KEY)):
            metadata = [("triton-grpc-protocol-admin", value) for value in pair]
            code, message = refusal(
                lambda m=metadata: stub.RepositoryModelUnload(request, metadata=m, timeout=10)
            )
            assert (code, message) == (grpc.StatusCode.UNAVAILABLE, RESTRICTED.format("admin"))
        assert stub.ModelReady(pb.ModelReadyRequest(name="simple"), timeout=10).ready


@pytest.mark.timeout(60)
def test_shared_memory_calls_with_a_nul_are_refused_on_tcp(closed_server: ServerProcess) -> None:
    with grpc.insecure_channel(closed_server.url) as channel:
        for name, message in (
            ("SystemSharedMemoryRegister", pb.SystemSharedMemoryRegisterRequest(name="r")),
            ("SystemSharedMemoryUnregister", pb.SystemSharedMemoryUnregisterRequest()),
            ("LogSettings", pb.LogSettingsRequest()),
        ):
            path = f"/inference.GRPCInferenceService/{name}\x00"
            assert raw_call(channel, path, message)[0] == grpc.StatusCode.UNIMPLEMENTED, name
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        assert stub.ModelReady(pb.ModelReadyRequest(name="simple"), timeout=10).ready
