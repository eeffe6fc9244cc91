"""The shared-memory control calls over a live server (issue 15, items 1 and 3), with raw gRPC
stubs and objects made by Python's multiprocessing.shared_memory: Triton's register, status and
unregister (an empty name = every region of the kind); a live name, the limits, hostile keys and
bounds refused with a clear status while the server keeps serving; --shared-memory none; and
shared memory served on the Unix socket only unless --shared-memory-listeners all."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from multiprocessing import shared_memory
from pathlib import Path

import grpc
import numpy as np
import pytest

import inferd._core as _core
import inferd._proto.grpc_service_pb2 as pb
import inferd._proto.grpc_service_pb2_grpc as pb_grpc
from inferd.examples import make_examples
from tests.integration.conftest import ServerProcess, running_server

MAX_REGIONS = 4
MAX_BYTES = 64 * 1024
OBJECT_BYTES = 16 * 1024


@contextlib.contextmanager
def serving(root: Path, *flags: str) -> Iterator[ServerProcess]:
    """A server with an empty repository: the control calls need no model."""
    repository = root / "models"
    repository.mkdir()
    with running_server(repository, [], root, *flags) as server:
        yield server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Default listeners (shared memory on the Unix socket only), control calls open on TCP (so
    that refusing shared memory there is the shared-memory rule's doing), small limits."""
    with serving(
        tmp_path_factory.mktemp("shm"),
        "--shared-memory-max-regions",
        str(MAX_REGIONS),
        "--shared-memory-max-bytes",
        str(MAX_BYTES),
    ) as running:
        yield running


@contextlib.contextmanager
def stub_on(address: str) -> Iterator[pb_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(address) as channel:
        yield pb_grpc.GRPCInferenceServiceStub(channel)


@pytest.fixture
def unix(server: ServerProcess) -> Iterator[pb_grpc.GRPCInferenceServiceStub]:
    """A stub on the Unix socket; every region is unregistered after the test."""
    with stub_on(f"unix:{server.unix_socket}") as stub:
        yield stub
        stub.SystemSharedMemoryUnregister(pb.SystemSharedMemoryUnregisterRequest(), timeout=10)
        assert stub.SystemSharedMemoryStatus(pb.SystemSharedMemoryStatusRequest()).regions == {}


@pytest.fixture
def shm_object() -> Iterator[Callable[[int], str]]:
    """Makes POSIX shared-memory objects of a size and returns their names; unlinks them after."""
    made: list[shared_memory.SharedMemory] = []

    def make(size: int = OBJECT_BYTES) -> str:
        made.append(shared_memory.SharedMemory(create=True, size=size))
        return made[-1].name

    yield make
    for obj in made:
        obj.close()
        obj.unlink()


def refusal(call: Callable[[], object]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as raised:
        call()
    return raised.value.code(), raised.value.details()  # type: ignore[attr-defined]


def register(
    stub: pb_grpc.GRPCInferenceServiceStub, name: str, key: str, offset: int, byte_size: int
) -> None:
    stub.SystemSharedMemoryRegister(
        pb.SystemSharedMemoryRegisterRequest(
            name=name, key=key, offset=offset, byte_size=byte_size
        ),
        timeout=10,
    )


def status(stub: pb_grpc.GRPCInferenceServiceStub, name: str = "") -> dict[str, tuple[object, ...]]:
    answer = stub.SystemSharedMemoryStatus(
        pb.SystemSharedMemoryStatusRequest(name=name), timeout=10
    )
    return {k: (r.name, r.key, r.offset, r.byte_size) for k, r in answer.regions.items()}


def still_serving(stub: pb_grpc.GRPCInferenceServiceStub) -> None:
    assert stub.ServerLive(pb.ServerLiveRequest(), timeout=10).live


@pytest.mark.timeout(60)
def test_register_status_unregister(
    unix: pb_grpc.GRPCInferenceServiceStub, shm_object: Callable[[int], str]
) -> None:
    key = shm_object(OBJECT_BYTES)
    register(unix, "inputs", key, 0, 4096)
    register(unix, "outputs", "/" + key, 4096, 8192)  # shm_open's leading '/' is allowed
    assert status(unix) == {
        "inputs": ("inputs", key, 0, 4096),
        "outputs": ("outputs", "/" + key, 4096, 8192),
    }
    assert status(unix, "outputs") == {"outputs": ("outputs", "/" + key, 4096, 8192)}
    unix.SystemSharedMemoryUnregister(pb.SystemSharedMemoryUnregisterRequest(name="inputs"))
    assert status(unix) == {"outputs": ("outputs", "/" + key, 4096, 8192)}
    code, message = refusal(lambda: status(unix, "inputs"))
    assert code == grpc.StatusCode.NOT_FOUND
    assert "inputs" in message
    # Unregistering an unknown name is no error, as in Triton.
    unix.SystemSharedMemoryUnregister(pb.SystemSharedMemoryUnregisterRequest(name="inputs"))
    # A name is free again once unregistered.
    register(unix, "inputs", key, 0, 4096)
    assert set(status(unix)) == {"inputs", "outputs"}


@pytest.mark.timeout(60)
def test_unregister_with_no_name_removes_every_region_of_its_kind(
    unix: pb_grpc.GRPCInferenceServiceStub, shm_object: Callable[[int], str]
) -> None:
    key = shm_object(OBJECT_BYTES)
    for i in range(3):
        register(unix, f"r{i}", key, i * 1024, 1024)
    # The CUDA kind's unregister-all leaves system regions alone.
    unix.CudaSharedMemoryUnregister(pb.CudaSharedMemoryUnregisterRequest(), timeout=10)
    assert set(status(unix)) == {"r0", "r1", "r2"}
    unix.SystemSharedMemoryUnregister(pb.SystemSharedMemoryUnregisterRequest(), timeout=10)
    assert status(unix) == {}
    # Their bytes and places are free again: the limits count registered regions only.
    for i in range(MAX_REGIONS):
        register(unix, f"again{i}", key, 0, 1024)


@pytest.mark.timeout(60)
def test_a_live_name_is_not_registered_again(
    unix: pb_grpc.GRPCInferenceServiceStub, shm_object: Callable[[int], str]
) -> None:
    first, second = shm_object(OBJECT_BYTES), shm_object(OBJECT_BYTES)
    register(unix, "r", first, 0, 1024)
    code, message = refusal(lambda: register(unix, "r", second, 0, 2048))
    assert code == grpc.StatusCode.ALREADY_EXISTS
    assert "'r'" in message or '"r"' in message, message
    assert status(unix) == {"r": ("r", first, 0, 1024)}  # not replaced


@pytest.mark.timeout(60)
def test_limits_on_regions_and_bytes(
    unix: pb_grpc.GRPCInferenceServiceStub, shm_object: Callable[[int], str]
) -> None:
    key = shm_object(MAX_BYTES)
    for i in range(MAX_REGIONS):
        register(unix, f"r{i}", key, 0, 1)
    code, message = refusal(lambda: register(unix, "one-more", key, 0, 1))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "--shared-memory-max-regions" in message
    unix.SystemSharedMemoryUnregister(pb.SystemSharedMemoryUnregisterRequest())
    register(unix, "most", key, 0, MAX_BYTES - 100)
    code, message = refusal(lambda: register(unix, "past", key, 0, 101))
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "--shared-memory-max-bytes" in message
    register(unix, "rest", key, 0, 100)  # exactly up to the limit
    still_serving(unix)


HOSTILE_KEYS = [
    "../etc/passwd",
    "..",
    "/..",
    ".",
    "/dev/shm/KEY",
    "KEY/../KEY",
    "a/b",
    "//KEY",
    "",
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("key", HOSTILE_KEYS)
def test_keys_with_paths_are_invalid(
    unix: pb_grpc.GRPCInferenceServiceStub, shm_object: Callable[[int], str], key: str
) -> None:
    real = shm_object(OBJECT_BYTES)
    hostile = key.replace("KEY", real)
    code, message = refusal(lambda: register(unix, "r", hostile, 0, 1024))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "shared memory" in message
    assert status(unix) == {}
    still_serving(unix)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("offset", "byte_size", "words"),
    [
        (OBJECT_BYTES, 1, "past the end"),  # starts at the end
        (0, OBJECT_BYTES + 1, "past the end"),
        (OBJECT_BYTES - 10, 11, "past the end"),
        (2**64 - 1, 2, "overflows"),  # offset + byte_size wraps around uint64
        (2**63, 2**63, "overflows"),
        (0, 2**64 - 1, "past the end"),
        (0, 0, "byte_size"),
    ],
)
def test_bounds_outside_the_object_are_invalid(
    unix: pb_grpc.GRPCInferenceServiceStub,
    shm_object: Callable[[int], str],
    offset: int,
    byte_size: int,
    words: str,
) -> None:
    key = shm_object(OBJECT_BYTES)
    code, message = refusal(lambda: register(unix, "r", key, offset, byte_size))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert words in message, message
    assert status(unix) == {}
    still_serving(unix)


@pytest.mark.timeout(60)
def test_an_unknown_object_is_invalid(unix: pb_grpc.GRPCInferenceServiceStub) -> None:
    code, message = refusal(lambda: register(unix, "r", "inferd-no-such-object", 0, 64))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "inferd-no-such-object" in message
    still_serving(unix)


@pytest.mark.timeout(60)
def test_cuda_register_without_cuda_is_unimplemented(
    unix: pb_grpc.GRPCInferenceServiceStub,
) -> None:
    if _core.cuda_device_count() > 0:
        pytest.skip("this machine has a CUDA device: the GPU check covers CUDA registration")
    code, message = refusal(
        lambda: unix.CudaSharedMemoryRegister(
            pb.CudaSharedMemoryRegisterRequest(
                name="gpu", raw_handle=b"\0" * 64, device_id=0, byte_size=64
            ),
            timeout=10,
        )
    )
    assert code == grpc.StatusCode.UNIMPLEMENTED
    assert "CUDA" in message
    assert unix.CudaSharedMemoryStatus(pb.CudaSharedMemoryStatusRequest()).regions == {}
    still_serving(unix)


def test_server_metadata_lists_both_extensions(unix: pb_grpc.GRPCInferenceServiceStub) -> None:
    extensions = unix.ServerMetadata(pb.ServerMetadataRequest(), timeout=10).extensions
    assert {"system_shared_memory", "cuda_shared_memory"} <= set(extensions)


SHARED_MEMORY_CALLS: list[tuple[str, object]] = [
    ("SystemSharedMemoryStatus", pb.SystemSharedMemoryStatusRequest()),
    ("SystemSharedMemoryRegister", pb.SystemSharedMemoryRegisterRequest(name="r", byte_size=1)),
    ("SystemSharedMemoryUnregister", pb.SystemSharedMemoryUnregisterRequest()),
    ("CudaSharedMemoryStatus", pb.CudaSharedMemoryStatusRequest()),
    ("CudaSharedMemoryRegister", pb.CudaSharedMemoryRegisterRequest(name="r", byte_size=1)),
    ("CudaSharedMemoryUnregister", pb.CudaSharedMemoryUnregisterRequest()),
]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("method", "request_message"), SHARED_MEMORY_CALLS)
def test_shared_memory_on_tcp_is_refused_by_default(
    server: ServerProcess, method: str, request_message: object
) -> None:
    with stub_on(server.url) as tcp:
        code, message = refusal(lambda: getattr(tcp, method)(request_message, timeout=10))
        assert code == grpc.StatusCode.PERMISSION_DENIED, message
        assert "--shared-memory-listeners" in message
        still_serving(tcp)


@pytest.fixture(scope="module")
def switched_off(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with serving(tmp_path_factory.mktemp("shm-none"), "--shared-memory", "none") as running:
        yield running


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("method", "request_message"), SHARED_MEMORY_CALLS)
def test_switched_off_shared_memory_is_unimplemented(
    switched_off: ServerProcess, method: str, request_message: object
) -> None:
    with stub_on(f"unix:{switched_off.unix_socket}") as unix:
        code, message = refusal(lambda: getattr(unix, method)(request_message, timeout=10))
        assert code == grpc.StatusCode.UNIMPLEMENTED
        assert "shared memory is switched off on this server (--shared-memory)" in message
        extensions = unix.ServerMetadata(pb.ServerMetadataRequest(), timeout=10).extensions
        assert not [e for e in extensions if "shared_memory" in e]


@pytest.mark.timeout(90)
def test_shared_memory_listeners_all_serves_it_on_tcp(
    tmp_path_factory: pytest.TempPathFactory, shm_object: Callable[[int], str]
) -> None:
    key = shm_object(OBJECT_BYTES)
    root = tmp_path_factory.mktemp("shm-tcp")
    with serving(root, "--shared-memory-listeners", "all") as server, stub_on(server.url) as tcp:
        register(tcp, "r", key, 0, 1024)
        assert status(tcp) == {"r": ("r", key, 0, 1024)}
        tcp.SystemSharedMemoryUnregister(pb.SystemSharedMemoryUnregisterRequest())
        assert status(tcp) == {}


# Inference through the Python service (issue 15, item 5): with --log-verbose 1 the core's server
# forwards every inference to Python, which logs each; the region is read and written by the core
# all the same, given the registry only for a request from a listener that serves shared memory.
ROW = 16 * 4  # one row of the simple example's INT32 [16] tensors


@pytest.fixture(scope="module")
def verbose_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("shm-verbose")
    names = make_examples(root / "models")
    with running_server(
        root / "models",
        names,
        root,
        "--log-verbose",
        "1",
        expected_errors=lambda r: False,
    ) as running:
        yield running


def _shm(name: str, offset: int, byte_size: int) -> dict[str, pb.InferParameter]:
    return {
        "shared_memory_region": pb.InferParameter(string_param=name),
        "shared_memory_offset": pb.InferParameter(int64_param=offset),
        "shared_memory_byte_size": pb.InferParameter(int64_param=byte_size),
    }


def simple_in_shared_memory(region: str) -> pb.ModelInferRequest:
    """INPUT0 at 0, INPUT1 at ROW, OUTPUT0 written at 2 * ROW, all in ``region``."""
    request = pb.ModelInferRequest(model_name="simple", id="shm")
    for i, name in enumerate(("INPUT0", "INPUT1")):
        request.inputs.add(
            name=name, datatype="INT32", shape=[1, 16], parameters=_shm(region, i * ROW, ROW)
        )
    request.outputs.add(name="OUTPUT0", parameters=_shm(region, 2 * ROW, ROW))
    return request


def inference_records(server: ServerProcess) -> list[dict[str, object]]:
    return [r for r in server.records() if r.get("event") == "inference"]


@pytest.mark.timeout(60)
def test_forwarded_inference_reads_and_writes_the_region_on_the_unix_socket(
    verbose_server: ServerProcess,
) -> None:
    obj = shared_memory.SharedMemory(create=True, size=3 * ROW)
    try:
        a = np.arange(16, dtype=np.int32)
        b = np.full(16, 100, dtype=np.int32)
        obj.buf[:ROW] = a.tobytes()
        obj.buf[ROW : 2 * ROW] = b.tobytes()
        with stub_on(f"unix:{verbose_server.unix_socket}") as unix:
            register(unix, "io", obj.name, 0, 3 * ROW)
            before = len(inference_records(verbose_server))
            try:
                answer = unix.ModelInfer(simple_in_shared_memory("io"), timeout=20)
            finally:
                unix.SystemSharedMemoryUnregister(pb.SystemSharedMemoryUnregisterRequest())
        np.testing.assert_array_equal(
            np.frombuffer(obj.buf[2 * ROW : 3 * ROW], dtype=np.int32), a + b
        )
        assert [o.name for o in answer.outputs] == ["OUTPUT0"]
        assert list(answer.raw_output_contents) == [b""]  # the bytes are in the region
        # The answer says where they went, as the request asked.
        assert answer.outputs[0].parameters == _shm("io", 2 * ROW, ROW)
        # Python answered it (its verbose line), not the core's own path.
        assert len(inference_records(verbose_server)) == before + 1
    finally:
        obj.close()
        obj.unlink()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("forged", [False, True])
def test_forwarded_inference_naming_a_region_on_tcp_is_refused(
    verbose_server: ServerProcess, forged: bool
) -> None:
    """Over TCP (default listeners) Python is not given the registry, even for a client that
    sends the core's own header itself."""
    obj = shared_memory.SharedMemory(create=True, size=3 * ROW)
    try:
        with stub_on(f"unix:{verbose_server.unix_socket}") as unix:
            register(unix, "io", obj.name, 0, 3 * ROW)
            try:
                with stub_on(verbose_server.url) as tcp:
                    metadata = [("inferd-shared-memory", "1")] if forged else []
                    code, message = refusal(
                        lambda: tcp.ModelInfer(
                            simple_in_shared_memory("io"), metadata=metadata, timeout=20
                        )
                    )
            finally:
                unix.SystemSharedMemoryUnregister(pb.SystemSharedMemoryUnregisterRequest())
        assert code == grpc.StatusCode.PERMISSION_DENIED, message
        assert "--shared-memory-listeners" in message
        assert bytes(obj.buf[2 * ROW : 3 * ROW]) == bytes(ROW)  # nothing written
        assert inference_records(verbose_server)[-1]["outcome"] == "PERMISSION_DENIED"
    finally:
        obj.close()
        obj.unlink()
