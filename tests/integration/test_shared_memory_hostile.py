"""A hostile client of Triton's system shared memory (issue 15, item 3): every region, offset and
size it names is checked against what was registered and against the object's real size, names
that are paths are refused, a region unregistered or shrunk under a queued request is survived.
Each row expects a clear status and message, and after each the server still answers a normal
inference."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2, service_pb2_grpc

from inferd.examples import write_identity_model
from tests.integration.conftest import ServerProcess, running_server
from tests.integration.shm_client import (
    Region,
    client_region,
    expect_error,
    shm,
    truncate,
    unix_client,
)
from tests.integration.slow_model import SINGLE_REQUEST_CONFIG, fp32_input, write_slow_model

INT64_MAX = 2**63 - 1
UINT64_MAX = 2**64 - 1
MAX_REGIONS = 4
MAX_BYTES = 1 << 20

# One instance, one request per execution, four 1024x1024 products per row (~100 ms idle, more
# under load): requests sent behind a running one wait in the queue, holding their regions.
SLOW_MODEL = "slow_single"


@pytest.fixture(scope="module")
def hostile_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("shm-hostile")
    repository = root / "models"
    write_identity_model(repository / "identity_fp32", "FP32")
    write_slow_model(repository / SLOW_MODEL, SINGLE_REQUEST_CONFIG)
    with running_server(
        repository,
        ["identity_fp32", SLOW_MODEL],
        root,
        "--shared-memory-max-regions",
        str(MAX_REGIONS),
        "--shared-memory-max-bytes",
        str(MAX_BYTES),
        control_on_tcp=False,
    ) as server:
        yield server


@pytest.fixture
def client(hostile_server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    with unix_client(hostile_server) as triton:
        yield triton
        assert_serving(triton)
        triton.unregister_system_shared_memory()


def assert_serving(client: grpcclient.InferenceServerClient) -> None:
    """A normal inference, raw and over the socket, is answered correctly."""
    values = np.array([[1.5, -2.0, 3.25]], dtype=np.float32)
    tensor = grpcclient.InferInput("INPUT0", [1, 3], "FP32")
    tensor.set_data_from_numpy(values)
    result = client.infer("identity_fp32", [tensor], client_timeout=30)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), values)


def registered(client: grpcclient.InferenceServerClient) -> list[str]:
    return sorted(client.get_system_shared_memory_status().regions)


def shm_input(
    region: str, byte_size: int, offset: int = 0, shape: tuple[int, ...] = (1, 4)
) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("INPUT0", list(shape), "FP32")
    tensor.set_shared_memory(region, byte_size, offset)
    return tensor


def raw_input(shape: tuple[int, ...] = (1, 4)) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("INPUT0", list(shape), "FP32")
    tensor.set_data_from_numpy(np.zeros(shape, dtype=np.float32))
    return tensor


def shm_output(region: str, byte_size: int, offset: int = 0) -> grpcclient.InferRequestedOutput:
    output = grpcclient.InferRequestedOutput("OUTPUT0")
    output.set_shared_memory(region, byte_size, offset)
    return output


@pytest.fixture
def region64(client: grpcclient.InferenceServerClient) -> Iterator[Region]:
    """A registered 64-byte region, "r64", holding 16 FP32 values 0..15."""
    with client_region("r64", 64) as region:
        shm.set_shared_memory_region(region.handle, [np.arange(16, dtype=np.float32)])
        client.register_system_shared_memory(region.name, region.key, 64)
        yield region


# --- register ---------------------------------------------------------------------------------

BAD_KEYS = ["/a/b", "../x", "/dev/shm/../x", "a/b", "..", "/..", ".", "/", ""]


@pytest.mark.parametrize("key", BAD_KEYS)
def test_keys_that_are_paths_are_refused(
    client: grpcclient.InferenceServerClient, key: str
) -> None:
    message = expect_error(
        lambda: client.register_system_shared_memory("pathy", key, 16), "INVALID_ARGUMENT"
    )
    assert "key" in message.lower(), message
    assert registered(client) == []


def test_a_key_naming_no_object_is_refused(client: grpcclient.InferenceServerClient) -> None:
    message = expect_error(
        lambda: client.register_system_shared_memory("ghost", "/inferd-test-no-such-object", 16),
        "INVALID_ARGUMENT",
    )
    assert "inferd-test-no-such-object" in message, message
    assert registered(client) == []


@pytest.mark.parametrize(
    ("offset", "byte_size"),
    [
        (8192, 16),  # offset past the end of the 4096-byte object
        (4096, 1),  # starts exactly at the end
        (0, 4097),  # one byte more than the object
        (4000, 200),  # starts inside, ends outside
        (INT64_MAX, 16),  # offset + byte_size past int64
        (UINT64_MAX - 7, 16),  # offset + byte_size wraps around uint64
        (16, UINT64_MAX),
    ],
)
def test_a_region_outside_its_object_is_refused(
    client: grpcclient.InferenceServerClient, offset: int, byte_size: int
) -> None:
    with client_region("misfit", 4096) as region:
        message = expect_error(
            lambda: client.register_system_shared_memory(
                region.name, region.key, byte_size, offset=offset
            ),
            "INVALID_ARGUMENT",
        )
        assert region.name in message, message
        assert registered(client) == []


def test_the_limits_on_regions_and_bytes(client: grpcclient.InferenceServerClient) -> None:
    with client_region("big", MAX_BYTES + 4096) as big:
        message = expect_error(
            lambda: client.register_system_shared_memory("big", big.key, MAX_BYTES + 1),
            "RESOURCE_EXHAUSTED",
        )
        assert "--shared-memory-max-bytes" in message or str(MAX_BYTES) in message, message
        client.register_system_shared_memory("big", big.key, MAX_BYTES)
        with client_region("more", 16) as more:
            expect_error(
                lambda: client.register_system_shared_memory("more", more.key, 1),
                "RESOURCE_EXHAUSTED",
            )
            client.unregister_system_shared_memory("big")
            for index in range(MAX_REGIONS):
                client.register_system_shared_memory(f"small{index}", more.key, 16)
            message = expect_error(
                lambda: client.register_system_shared_memory("one-too-many", more.key, 16),
                "RESOURCE_EXHAUSTED",
            )
            assert "--shared-memory-max-regions" in message or str(MAX_REGIONS) in message, message
            assert len(registered(client)) == MAX_REGIONS


# --- requests naming a region ---------------------------------------------------------------


def test_an_unknown_region_is_refused(client: grpcclient.InferenceServerClient) -> None:
    message = expect_error(
        lambda: client.infer("identity_fp32", [shm_input("nowhere", 16)]), "INVALID_ARGUMENT"
    )
    assert "nowhere" in message, message
    message = expect_error(
        lambda: client.infer("identity_fp32", [raw_input()], outputs=[shm_output("nowhere", 16)]),
        "INVALID_ARGUMENT",
    )
    assert "nowhere" in message, message


@pytest.mark.parametrize(
    ("offset", "byte_size"),
    [
        (64, 16),  # offset at the region's end
        (1000, 16),  # offset past it
        (56, 16),  # starts inside, ends outside
        (INT64_MAX, 16),  # offset + byte_size overflows int64
        (INT64_MAX - 8, 16),
        (-1, 16),  # negative offset
        (-16, 16),
    ],
)
def test_an_input_slice_outside_its_region_is_refused(
    client: grpcclient.InferenceServerClient, region64: Region, offset: int, byte_size: int
) -> None:
    message = expect_error(
        lambda: client.infer("identity_fp32", [shm_input(region64.name, byte_size, offset)]),
        "INVALID_ARGUMENT",
    )
    # Names the region, or (a negative offset, refused before the region is looked up) the
    # parameter.
    assert region64.name in message or "shared_memory_offset" in message, message
    assert "INPUT0" in message or offset >= 0, message


@pytest.mark.parametrize(("offset", "byte_size"), [(64, 16), (56, 16), (INT64_MAX, 16), (-1, 16)])
def test_an_output_slice_outside_its_region_is_refused(
    client: grpcclient.InferenceServerClient, region64: Region, offset: int, byte_size: int
) -> None:
    message = expect_error(
        lambda: client.infer(
            "identity_fp32", [raw_input()], outputs=[shm_output(region64.name, byte_size, offset)]
        ),
        "INVALID_ARGUMENT",
    )
    assert region64.name in message or "shared_memory_offset" in message, message
    assert "OUTPUT0" in message or offset >= 0, message


def test_a_region_smaller_than_the_tensor(
    client: grpcclient.InferenceServerClient, region64: Region
) -> None:
    # Input: 32 FP32 values are 128 bytes, the region 64.
    message = expect_error(
        lambda: client.infer("identity_fp32", [shm_input(region64.name, 128, shape=(1, 32))]),
        "INVALID_ARGUMENT",
    )
    assert region64.name in message, message
    # Output: asked for 128 bytes of a 64-byte region.
    expect_error(
        lambda: client.infer(
            "identity_fp32", [raw_input((1, 32))], outputs=[shm_output(region64.name, 128)]
        ),
        "INVALID_ARGUMENT",
    )
    # Output: the slice fits the region, the 128-byte result does not fit the slice.
    message = expect_error(
        lambda: client.infer(
            "identity_fp32", [raw_input((1, 32))], outputs=[shm_output(region64.name, 64)]
        ),
        "INVALID_ARGUMENT",
    )
    assert "OUTPUT0" in message, message
    # Nothing was written: the region still holds what the client put there.
    np.testing.assert_array_equal(
        shm.get_contents_as_numpy(region64.handle, np.float32, [16]), np.arange(16)
    )


@pytest.mark.parametrize("byte_size", [8, 15, 17, 32, 0, -16])
def test_an_input_byte_size_that_disagrees_with_its_shape(
    client: grpcclient.InferenceServerClient, region64: Region, byte_size: int
) -> None:
    message = expect_error(
        lambda: client.infer("identity_fp32", [shm_input(region64.name, byte_size)]),
        "INVALID_ARGUMENT",
    )
    assert "INPUT0" in message, message


SHM_16 = {
    "shared_memory_region": ("string_param", "r64"),
    "shared_memory_byte_size": ("int64_param", 16),
}

# case: (the input's parameters, raw_input_contents, typed contents?, what the message names)
MALFORMED: dict[str, tuple[dict[str, tuple[str, Any]], list[bytes], bool, str]] = {
    "no byte size": (
        {"shared_memory_region": ("string_param", "r64")},
        [],
        False,
        "shared_memory_byte_size",
    ),
    "byte size as a string": (
        {**SHM_16, "shared_memory_byte_size": ("string_param", "16")},
        [],
        False,
        "shared_memory_byte_size",
    ),
    "region as a number": (
        {**SHM_16, "shared_memory_region": ("int64_param", 1)},
        [],
        False,
        "shared_memory_region",
    ),
    "offset as a string": (
        {**SHM_16, "shared_memory_offset": ("string_param", "0")},
        [],
        False,
        "shared_memory_offset",
    ),
    # Triton's rule: raw_input_contents holds only the inputs not in shared memory.
    "raw contents for an input in shared memory": (
        SHM_16,
        [bytes(16)],
        False,
        "raw_input_contents",
    ),
    "typed contents for an input in shared memory": (SHM_16, [], True, "contents"),
}


@pytest.mark.parametrize("case", MALFORMED)
def test_malformed_shared_memory_parameters(
    hostile_server: ServerProcess,
    client: grpcclient.InferenceServerClient,
    region64: Region,
    case: str,
) -> None:
    parameters, raw, contents, named = MALFORMED[case]
    request = service_pb2.ModelInferRequest(model_name="identity_fp32")
    tensor = request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 4])
    for key, (kind, value) in parameters.items():
        setattr(tensor.parameters[key], kind, value)
    if contents:
        tensor.contents.fp32_contents.extend([1.0, 2.0, 3.0, 4.0])
    request.raw_input_contents.extend(raw)
    with grpc.insecure_channel(f"unix://{hostile_server.unix_socket}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.RpcError) as raised:
            stub.ModelInfer(request, timeout=30)
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT, raised.value
    assert named in raised.value.details(), raised.value.details()


# --- the client's object changes under the server -------------------------------------------


def test_an_object_truncated_after_register(client: grpcclient.InferenceServerClient) -> None:
    with client_region("shrunk", 4096) as region:
        client.register_system_shared_memory(region.name, region.key, 4096)
        truncate(region, 0)
        message = expect_error(
            lambda: client.infer("identity_fp32", [shm_input(region.name, 16)]),
            "INVALID_ARGUMENT",
        )
        assert region.name in message, message
        assert_serving(client)
        expect_error(
            lambda: client.infer(
                "identity_fp32", [raw_input()], outputs=[shm_output(region.name, 16)]
            ),
            "INVALID_ARGUMENT",
        )
        assert_serving(client)
        # Shrunk to half: the region is refused as a whole, its first half too.
        truncate(region, 2048)
        message = expect_error(
            lambda: client.infer("identity_fp32", [shm_input(region.name, 16)]),
            "INVALID_ARGUMENT",
        )
        assert region.name in message, message
        # Grown back to the region's end: served again (the pages come back as zeros).
        truncate(region, 4096)
        result = client.infer("identity_fp32", [shm_input(region.name, 16, offset=2048)])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.zeros((1, 4), np.float32))
        client.unregister_system_shared_memory(region.name)


def _wait_until(condition: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


BLOCKERS = ("busy1", "busy2", "busy3")


def _completed(client: grpcclient.InferenceServerClient) -> int:
    stats = client.get_inference_statistics(SLOW_MODEL).model_stats[0]
    return int(stats.inference_stats.success.count)


class Queued:
    """A request for the slow model sent behind three raw ones that keep its one instance busy
    (100 ms or more each): once it is in the queue it is the last there, so it is still queued
    (holding its regions, its input unread) while the queue is not empty.

    It is in the queue when queued + completed requests = the blockers: the instance is then
    running one of them, so all four have arrived. (Waiting for exact queue lengths instead raced
    the blockers under load: one could finish between two scrapes.)"""

    def __init__(
        self,
        server: ServerProcess,
        client: grpcclient.InferenceServerClient,
        inputs: list[grpcclient.InferInput],
        outputs: list[grpcclient.InferRequestedOutput],
    ) -> None:
        self.answers: dict[str, tuple[Any, Any]] = {}
        self._done = threading.Event()
        self._server = server
        completed_before = _completed(client)
        for tag in BLOCKERS:
            client.async_infer(
                SLOW_MODEL, fp32_input(np.array([[-1.0]], np.float32)), self._callback(tag)
            )
        client.async_infer(SLOW_MODEL, inputs, self._callback("shm"), outputs=outputs)

        def arrived() -> bool:
            queued = server.pending(SLOW_MODEL)
            return queued >= 1 and queued + _completed(client) - completed_before == len(BLOCKERS)

        _wait_until(arrived)

    def _callback(self, tag: str) -> Callable[[Any, Any], None]:
        def done(result: Any, error: Any) -> None:
            self.answers[tag] = (result, error)
            if len(self.answers) == len(BLOCKERS) + 1:
                self._done.set()

        return done

    def still_queued(self) -> bool:
        return self._server.pending(SLOW_MODEL) >= 1

    def wait(self) -> dict[str, tuple[Any, Any]]:
        assert self._done.wait(120), f"answers: {self.answers}"
        for tag in BLOCKERS:
            assert self.answers[tag][1] is None, self.answers[tag]
        return self.answers


@pytest.mark.parametrize("how", ["by name", "all", "all, object unlinked"])
def test_unregister_while_a_request_is_in_flight(
    hostile_server: ServerProcess, client: grpcclient.InferenceServerClient, how: str
) -> None:
    """The request keeps the old mapping: it reads its input from it and writes its output into
    it after the region was unregistered (and its object's name unlinked: the memory lives while
    mapped), and completes correctly."""
    values = np.array([[42.5]], dtype=np.float32)
    with client_region("leaving", 8) as region:
        shm.set_shared_memory_region(region.handle, [values])
        client.register_system_shared_memory(region.name, region.key, 8)
        queued = Queued(
            hostile_server,
            client,
            [shm_input(region.name, 4, shape=(1, 1))],
            [shm_output(region.name, 4, offset=4)],
        )
        client.unregister_system_shared_memory(region.name if how == "by name" else "")
        if how == "all, object unlinked":
            region.path.unlink()
        assert registered(client) == []
        assert queued.still_queued(), "the request ran before the region was unregistered"

        _, error = queued.wait()["shm"]

        assert error is None, error
        answer = shm.get_contents_as_numpy(region.handle, np.float32, [1, 1], offset=4)
        np.testing.assert_array_equal(answer, values)
        if how == "all, object unlinked":
            region.path.touch()  # for the block's own unlink
            return
        # The name is free: registering it again maps the object afresh.
        client.register_system_shared_memory(region.name, region.key, 8)
        assert registered(client) == [region.name]


def test_an_object_truncated_while_a_request_is_queued(
    hostile_server: ServerProcess, client: grpcclient.InferenceServerClient
) -> None:
    """The request fails cleanly (its input can no longer be read); the requests around it and
    the server do not notice."""
    with client_region("vanishing", 4096) as region:
        shm.set_shared_memory_region(region.handle, [np.array([[3.0]], dtype=np.float32)])
        client.register_system_shared_memory(region.name, region.key, 4096)
        queued = Queued(
            hostile_server,
            client,
            [shm_input(region.name, 4, shape=(1, 1))],
            [shm_output(region.name, 4, offset=2048)],
        )
        truncate(region, 0)
        assert queued.still_queued(), "the request ran before the object was truncated"

        _, error = queued.wait()["shm"]

        assert error is not None, "a request read a truncated object"
        assert error.status() == "StatusCode.INVALID_ARGUMENT", (error.status(), error.message())
        assert region.name in error.message(), error.message()
        client.unregister_system_shared_memory(region.name)
