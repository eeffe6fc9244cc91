"""The server maps a client's shared-memory object only when the client could open it itself
(issue 25, item 8). A client running as uid 65534 could not read /dev/shm/atk-secret (root's,
mode 0600), yet over the Unix socket it registered the object, read it back through an identity
model and overwrote it through an output region: the server opened it with its own rights. The
core now reads the peer's credentials from the socket (SO_PEERCRED) and checks them against the
object's owner and mode before mapping it.

The client here is this test process with its effective uid set to 65534 while its connection is
made: the kernel records the connecting process's credentials, which is what the server checks."""

from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest

import inferd._proto.grpc_service_pb2 as pb
import inferd._proto.grpc_service_pb2_grpc as pb_grpc
from inferd.examples import write_identity_model
from tests.integration.conftest import ServerProcess, running_server

NOBODY = 65534

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="acting as another user (uid 65534) needs root; this run is not root"
)


@contextlib.contextmanager
def acting_as(uid: int) -> Iterator[None]:
    """The process's effective uid and gid are ``uid`` inside the block."""
    os.setegid(uid)
    os.seteuid(uid)
    try:
        yield
    finally:
        os.seteuid(0)
        os.setegid(0)


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    # A folder other users may enter, and a socket they may connect to: the test's own client
    # is uid 65534.
    root = Path(tempfile.mkdtemp(prefix="inferd-creds-"))
    root.chmod(0o755)
    repository = root / "models"
    write_identity_model(repository / "identity_fp32", "FP32")
    with running_server(
        repository, ["identity_fp32"], root, "--grpc-unix-socket-mode", "0666"
    ) as running:
        yield running


def shm_object(owner: int, mode: int, data: bytes) -> str:
    """A POSIX shared-memory object of ``owner`` with ``mode`` holding ``data``; its key."""
    key = f"inferd-creds-{uuid.uuid4().hex[:12]}"
    path = Path("/dev/shm") / key
    with acting_as(owner) if owner != 0 else contextlib.nullcontext():
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, mode)
        os.write(fd, data)
        os.close(fd)
    return key


def connect_as(server: ServerProcess, uid: int) -> grpc.Channel:
    channel = grpc.insecure_channel(f"unix:{server.unix_socket}")
    with acting_as(uid):
        grpc.channel_ready_future(channel).result(timeout=10)
    return channel


def register(channel: grpc.Channel, name: str, key: str) -> None:
    stub = pb_grpc.GRPCInferenceServiceStub(channel)
    request = pb.SystemSharedMemoryRegisterRequest(name=name, key=key, offset=0, byte_size=16)
    stub.SystemSharedMemoryRegister(request, timeout=10)


def infer_from_region(channel: grpc.Channel, region: str) -> np.ndarray:
    request = pb.ModelInferRequest(model_name="identity_fp32")
    tensor = request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 4])
    tensor.parameters["shared_memory_region"].string_param = region
    tensor.parameters["shared_memory_byte_size"].int64_param = 16
    answer = pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(request, timeout=10)
    return np.frombuffer(answer.raw_output_contents[0], np.float32)


def test_a_client_cannot_register_an_object_it_could_not_open_itself(
    server: ServerProcess,
) -> None:
    secret = np.array([1.5, 2.5, 3.5, 4.5], np.float32)
    key = shm_object(0, 0o600, secret.tobytes())
    own_values = np.array([7, 8, 9, 10], np.float32)
    own = shm_object(NOBODY, 0o600, own_values.tobytes())
    group_readable = shm_object(0, 0o640, secret.tobytes())  # read is not enough: outputs write
    try:
        nobody = connect_as(server, NOBODY)
        with nobody:
            for stolen in (key, group_readable):
                with pytest.raises(grpc.RpcError) as refused:
                    register(nobody, "stolen", stolen)
                error: Any = refused.value
                assert error.code() == grpc.StatusCode.PERMISSION_DENIED, error.details()
                assert "uid 65534" in error.details(), error.details()
                assert "may not read and write it" in error.details(), error.details()
            # Its own object is served, and so is root's for root.
            register(nobody, "own", own)
            np.testing.assert_array_equal(infer_from_region(nobody, "own"), own_values)
        with connect_as(server, 0) as as_root:
            register(as_root, "roots", key)
            np.testing.assert_array_equal(infer_from_region(as_root, "roots"), secret)
            stub = pb_grpc.GRPCInferenceServiceStub(as_root)
            stub.SystemSharedMemoryUnregister(pb.SystemSharedMemoryUnregisterRequest(), timeout=10)
    finally:
        for k in (key, own, group_readable):
            (Path("/dev/shm") / k).unlink(missing_ok=True)


def test_a_client_cannot_forge_the_credentials_header(server: ServerProcess) -> None:
    key = shm_object(0, 0o600, bytes(16))
    try:
        with connect_as(server, NOBODY) as nobody:
            stub = pb_grpc.GRPCInferenceServiceStub(nobody)
            request = pb.SystemSharedMemoryRegisterRequest(name="forged", key=key, byte_size=16)
            with pytest.raises(grpc.RpcError) as refused:
                stub.SystemSharedMemoryRegister(
                    request, metadata=[("inferd-peer-credentials", "1 0 0")], timeout=10
                )
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED  # type: ignore[attr-defined]
    finally:
        (Path("/dev/shm") / key).unlink(missing_ok=True)
