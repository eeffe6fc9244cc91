"""Triton's system shared memory through tritonclient's own utilities (issue 15): regions made
with ``tritonclient.utils.shared_memory``, registered over the server's Unix socket, and requests
whose inputs and outputs live in them, every fixed-size datatype and BYTES as Triton serialises
it, mixed with raw tensors by Triton's raw-index rule; status, unregister, unregister-all; and
concurrent clients, each in its own region, batched together by the core."""

from __future__ import annotations

import contextlib
import io
import re
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import serialize_byte_tensor, serialized_byte_size

from inferd.examples import DATATYPES, make_examples, write_identity_model
from tests.integration.conftest import ServerProcess, running_server
from tests.integration.shm_client import client_region, expect_error, shm, unix_client
from tests.integration.slow_model import write_slow_model

SHARED_MEMORY_DOC = Path(__file__).resolve().parents[2] / "docs" / "shared-memory.md"
FIXED_SIZE = [name for name, datatype in DATATYPES.items() if not datatype.is_bytes]

# A light model (256x256 products a row) with dynamic batching and one instance: a burst of
# clients arrives faster than it serves them one by one, so their requests share executions.
BATCHED_MODEL = "batched_identity"
BATCHED_CONFIG = """
max_batch_size: 16
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
dynamic_batching { max_queue_delay_microseconds: 20000 }
"""


def identity_model(datatype: str) -> str:
    return f"identity_{datatype.lower()}"


@pytest.fixture(scope="module")
def shm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The examples ("simple": two inputs, two outputs), an identity model per datatype and the
    batched model, served with the default shared-memory flags (system and CUDA, Unix socket)."""
    root = tmp_path_factory.mktemp("shm")
    repository = root / "models"
    models = make_examples(repository)
    for datatype in DATATYPES:
        name = identity_model(datatype)
        if name not in models:
            write_identity_model(repository / name, datatype)
            models.append(name)
    write_slow_model(repository / BATCHED_MODEL, BATCHED_CONFIG, 256, "length")
    models.append(BATCHED_MODEL)
    with running_server(repository, sorted(models), root, control_on_tcp=False) as server:
        yield server


@pytest.fixture
def client(shm_server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    with unix_client(shm_server) as triton:
        yield triton
        # Each test leaves nothing registered, whatever it asserted.
        triton.unregister_system_shared_memory()


def registered(client: grpcclient.InferenceServerClient) -> dict[str, Any]:
    """The server's system regions, by name: {name: (key, offset, byte_size)}."""
    status = client.get_system_shared_memory_status()
    return {
        name: (region.key, region.offset, region.byte_size)
        for name, region in status.regions.items()
    }


def sample(rng: np.random.Generator, datatype: str, shape: tuple[int, ...]) -> np.ndarray:
    """Random values of ``datatype`` in its storage dtype (BF16: its 16-bit patterns)."""
    dtype = DATATYPES[datatype].numpy
    raw = rng.integers(0, 256, size=int(np.prod(shape)) * dtype.itemsize, dtype=np.uint8)
    if datatype == "BOOL":
        return (raw % 2).astype(np.bool_).reshape(shape)
    values = raw.view(dtype).reshape(shape)
    if dtype.kind == "f":  # NaN payloads need not survive: keep to finite values
        values = np.where(np.isfinite(values), values, 0).astype(dtype)
    return values


def output_parameters(result: grpcclient.InferResult, name: str) -> dict[str, Any]:
    output = next(o for o in result.get_response().outputs if o.name == name)
    return {
        key: getattr(value, str(value.WhichOneof("parameter_choice")))
        for key, value in output.parameters.items()
    }


def raw_contents(result: grpcclient.InferResult, name: str) -> bytes:
    """The raw_output_contents entry at ``name``'s index among the response's outputs."""
    response = result.get_response()
    index = [o.name for o in response.outputs].index(name)
    assert len(response.raw_output_contents) == len(response.outputs), response
    return bytes(response.raw_output_contents[index])


def test_register_status_unregister(client: grpcclient.InferenceServerClient) -> None:
    with client_region("a", 64) as a, client_region("b", 4096) as b:
        client.register_system_shared_memory("a", a.key, 64)
        client.register_system_shared_memory("b", b.key, 1024, offset=2048)
        assert registered(client) == {"a": (a.key, 0, 64), "b": (b.key, 2048, 1024)}
        one = client.get_system_shared_memory_status("b")
        assert list(one.regions) == ["b"]
        assert one.regions["b"].name == "b"

        # A live name is not replaced, even by the same object.
        message = expect_error(
            lambda: client.register_system_shared_memory("a", b.key, 64), "ALREADY_EXISTS"
        )
        assert "'a'" in message or '"a"' in message, message
        assert registered(client)["a"] == (a.key, 0, 64)

        expect_error(lambda: client.get_system_shared_memory_status("nothing"), "NOT_FOUND")
        client.unregister_system_shared_memory("nothing")  # unknown names are no error

        client.unregister_system_shared_memory("a")
        assert registered(client) == {"b": (b.key, 2048, 1024)}
        client.register_system_shared_memory("a", a.key, 32, offset=32)  # the name is free again
        assert registered(client)["a"] == (a.key, 32, 32)

        client.unregister_system_shared_memory()  # "": every region
        assert registered(client) == {}


@pytest.mark.parametrize("datatype", FIXED_SIZE)
def test_every_fixed_size_datatype_in_and_out_of_shared_memory(
    client: grpcclient.InferenceServerClient, datatype: str
) -> None:
    values = sample(np.random.default_rng(len(datatype)), datatype, (3, 5))
    size = values.nbytes
    # Input and output in one region, the output after a gap: offsets are honoured.
    output_offset = size + 24
    with client_region(f"io-{datatype.lower()}", output_offset + size) as region:
        shm.set_shared_memory_region(region.handle, [values])
        client.register_system_shared_memory(region.name, region.key, region.byte_size)
        tensor = grpcclient.InferInput("INPUT0", list(values.shape), datatype)
        tensor.set_shared_memory(region.name, size)
        output = grpcclient.InferRequestedOutput("OUTPUT0")
        output.set_shared_memory(region.name, size, offset=output_offset)

        result = client.infer(identity_model(datatype), [tensor], outputs=[output])

        answer = shm.get_contents_as_numpy(
            region.handle, values.dtype, list(values.shape), offset=output_offset
        )
        np.testing.assert_array_equal(answer, values)
        # The output's name, datatype and shape, an empty raw entry (its bytes are in the region,
        # as Triton) and where it went.
        assert raw_contents(result, "OUTPUT0") == b""
        assert output_parameters(result, "OUTPUT0") == {
            "shared_memory_region": region.name,
            "shared_memory_byte_size": size,
            "shared_memory_offset": output_offset,
        }
        response = result.get_response().outputs[0]
        assert (response.datatype, list(response.shape)) == (datatype, [3, 5])
        # The input's bytes were read, not written: still what the client put there.
        np.testing.assert_array_equal(
            shm.get_contents_as_numpy(region.handle, values.dtype, list(values.shape)), values
        )


def test_a_region_registered_at_an_offset_into_its_object(
    client: grpcclient.InferenceServerClient,
) -> None:
    values = np.arange(8, dtype=np.float32).reshape(1, 8) + 0.5
    with client_region("shifted", 8192) as region:
        # The region is the object's second half; the tensor starts 16 bytes into the region.
        shm.set_shared_memory_region(region.handle, [values], offset=4096 + 16)
        client.register_system_shared_memory(region.name, region.key, 4096, offset=4096)
        tensor = grpcclient.InferInput("INPUT0", [1, 8], "FP32")
        tensor.set_shared_memory(region.name, values.nbytes, offset=16)
        output = grpcclient.InferRequestedOutput("OUTPUT0")
        output.set_shared_memory(region.name, values.nbytes, offset=1024)
        client.infer("identity_fp32", [tensor], outputs=[output])
        answer = shm.get_contents_as_numpy(region.handle, np.float32, [1, 8], offset=4096 + 1024)
        np.testing.assert_array_equal(answer, values)


def test_bytes_in_shared_memory_as_triton_serialises_them(
    client: grpcclient.InferenceServerClient,
) -> None:
    values = np.array(
        [
            [b"", "h\u00e9llo".encode(), "\u65e5\u672c".encode(), b"x" * 300],
            [b"a", b"bc", b"def", b"\xf0\x9f\x98\x80"],
        ],
        dtype=np.object_,
    )
    serialized = serialize_byte_tensor(values)
    size = serialized_byte_size(serialized)
    assert size == sum(4 + len(v) for v in values.flat)
    with client_region("text-in", size) as inputs, client_region("text-out", size) as outputs:
        shm.set_shared_memory_region(inputs.handle, [serialized])
        client.register_system_shared_memory(inputs.name, inputs.key, size)
        client.register_system_shared_memory(outputs.name, outputs.key, size)
        tensor = grpcclient.InferInput("INPUT0", [2, 4], "BYTES")
        tensor.set_shared_memory(inputs.name, size)
        output = grpcclient.InferRequestedOutput("OUTPUT0")
        output.set_shared_memory(outputs.name, size)

        result = client.infer("identity_bytes", [tensor], outputs=[output])

        answer = shm.get_contents_as_numpy(outputs.handle, np.object_, [2, 4])
        np.testing.assert_array_equal(answer, values)
        assert raw_contents(result, "OUTPUT0") == b""


@pytest.mark.parametrize("in_shm", ["INPUT0", "INPUT1"])
def test_mixed_shared_memory_and_raw_inputs(
    client: grpcclient.InferenceServerClient, in_shm: str
) -> None:
    """Triton's rule: raw_input_contents holds the inputs not in shared memory, in order (one
    entry here, whichever input is in the region)."""
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 100, dtype=np.int32) - 3 * a
    data = {"INPUT0": a, "INPUT1": b}
    with client_region(f"mixed-{in_shm.lower()}", 64) as region:
        shm.set_shared_memory_region(region.handle, [data[in_shm]])
        client.register_system_shared_memory(region.name, region.key, 64)
        inputs = []
        for name, values in data.items():
            tensor = grpcclient.InferInput(name, [1, 16], "INT32")
            if name == in_shm:
                tensor.set_shared_memory(region.name, 64)
            else:
                tensor.set_data_from_numpy(values)
            inputs.append(tensor)
        result = client.infer("simple", inputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


@pytest.mark.parametrize("out_shm", ["OUTPUT0", "OUTPUT1"])
def test_outputs_partly_in_shared_memory_partly_raw(
    client: grpcclient.InferenceServerClient, out_shm: str
) -> None:
    """The shared-memory output's raw_output_contents entry is empty, so that tritonclient's
    as_numpy still finds the raw one at its output's index."""
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 7, dtype=np.int32)
    expected = {"OUTPUT0": a + b, "OUTPUT1": a - b}
    out_raw = "OUTPUT1" if out_shm == "OUTPUT0" else "OUTPUT0"
    with client_region(f"half-{out_shm.lower()}", 64) as region:
        client.register_system_shared_memory(region.name, region.key, 64)
        inputs = []
        for name, values in (("INPUT0", a), ("INPUT1", b)):
            tensor = grpcclient.InferInput(name, [1, 16], "INT32")
            tensor.set_data_from_numpy(values)
            inputs.append(tensor)
        in_region = grpcclient.InferRequestedOutput(out_shm)
        in_region.set_shared_memory(region.name, 64)
        # The shared-memory output first: the raw one's index is then 1.
        outputs = [in_region, grpcclient.InferRequestedOutput(out_raw)]

        result = client.infer("simple", inputs, outputs=outputs)

        np.testing.assert_array_equal(result.as_numpy(out_raw), expected[out_raw])
        np.testing.assert_array_equal(
            shm.get_contents_as_numpy(region.handle, np.int32, [1, 16]), expected[out_shm]
        )
        assert raw_contents(result, out_shm) == b""
        assert raw_contents(result, out_raw) == expected[out_raw].tobytes()


def test_shared_memory_over_a_stream(client: grpcclient.InferenceServerClient) -> None:
    values = np.linspace(-1, 1, 12, dtype=np.float32).reshape(2, 6)
    answers: list[tuple[Any, Any]] = []
    done = threading.Event()

    def callback(result: Any, error: Any) -> None:
        answers.append((result, error))
        done.set()

    with client_region("stream", 2 * values.nbytes) as region:
        shm.set_shared_memory_region(region.handle, [values])
        client.register_system_shared_memory(region.name, region.key, region.byte_size)
        tensor = grpcclient.InferInput("INPUT0", [2, 6], "FP32")
        tensor.set_shared_memory(region.name, values.nbytes)
        output = grpcclient.InferRequestedOutput("OUTPUT0")
        output.set_shared_memory(region.name, values.nbytes, offset=values.nbytes)
        client.start_stream(callback)
        try:
            client.async_stream_infer("identity_fp32", [tensor], outputs=[output])
            assert done.wait(30), "no answer on the stream"
        finally:
            client.stop_stream()
        [(result, error)] = answers
        assert error is None, error
        assert raw_contents(result, "OUTPUT0") == b""
        answer = shm.get_contents_as_numpy(region.handle, np.float32, [2, 6], offset=values.nbytes)
        np.testing.assert_array_equal(answer, values)


CLIENTS = 16
REQUESTS_PER_CLIENT = 6


def test_concurrent_clients_each_in_their_own_region_share_executions(
    shm_server: ServerProcess,
) -> None:
    """16 clients, each with its own connection and region, send at once: the core batches their
    requests (fewer executions than requests) and every answer lands in its own region."""
    barrier = threading.Barrier(CLIENTS)
    failures: list[str] = []

    def one_client(index: int) -> None:
        rng = np.random.default_rng(index)
        length = 4 + index % 3  # mixed shapes too
        size = 4 * length
        try:
            with unix_client(shm_server) as triton, client_region(f"c{index}", 2 * size) as region:
                triton.register_system_shared_memory(region.name, region.key, 2 * size)
                try:
                    barrier.wait(timeout=60)
                    for request in range(REQUESTS_PER_CLIENT):
                        values = rng.standard_normal((1, length)).astype(np.float32) + index
                        shm.set_shared_memory_region(region.handle, [values])
                        tensor = grpcclient.InferInput("INPUT0", [1, length], "FP32")
                        tensor.set_shared_memory(region.name, size)
                        output = grpcclient.InferRequestedOutput("OUTPUT0")
                        output.set_shared_memory(region.name, size, offset=size)
                        triton.infer(BATCHED_MODEL, [tensor], outputs=[output], client_timeout=60)
                        answer = shm.get_contents_as_numpy(
                            region.handle, np.float32, [1, length], offset=size
                        )
                        if not np.array_equal(answer, values):
                            failures.append(f"client {index} request {request}: {answer}")
                finally:
                    triton.unregister_system_shared_memory(region.name)
        except Exception as error:  # collected: a thread's exception would be lost
            failures.append(f"client {index}: {error!r}")

    with unix_client(shm_server) as triton:
        before = triton.get_inference_statistics(BATCHED_MODEL).model_stats[0]
        threads = [threading.Thread(target=one_client, args=(i,)) for i in range(CLIENTS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert not any(thread.is_alive() for thread in threads), "a client hung"
        assert not failures, "\n".join(failures)
        after = triton.get_inference_statistics(BATCHED_MODEL).model_stats[0]
        assert registered(triton) == {}
    requests = after.inference_count - before.inference_count
    executions = after.execution_count - before.execution_count
    assert requests == CLIENTS * REQUESTS_PER_CLIENT
    print(f"{requests} requests in {executions} executions")
    assert executions < requests, "no two requests shared an execution"


def test_tcp_with_the_unix_listener_default_is_refused(
    shm_server: ServerProcess, client: grpcclient.InferenceServerClient
) -> None:
    """--shared-memory-listeners unix (the default): a region is the client's memory on this
    machine, so the TCP port answers neither the calls nor a request naming a region."""
    values = np.ones((1, 4), dtype=np.float32)
    with (
        client_region("via-tcp", 16) as region,
        grpcclient.InferenceServerClient(shm_server.url) as tcp,
    ):
        shm.set_shared_memory_region(region.handle, [values])
        expect_error(
            lambda: tcp.register_system_shared_memory(region.name, region.key, 16),
            "PERMISSION_DENIED",
        )
        expect_error(lambda: tcp.get_system_shared_memory_status(), "PERMISSION_DENIED")
        expect_error(lambda: tcp.unregister_system_shared_memory(), "PERMISSION_DENIED")
        client.register_system_shared_memory(region.name, region.key, 16)  # on the socket
        tensor = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        tensor.set_shared_memory(region.name, 16)
        message = expect_error(lambda: tcp.infer("identity_fp32", [tensor]), "PERMISSION_DENIED")
        assert "shared" in message.lower(), message
        output = grpcclient.InferRequestedOutput("OUTPUT0")
        output.set_shared_memory(region.name, 16)
        raw = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        raw.set_data_from_numpy(values)
        expect_error(
            lambda: tcp.infer("identity_fp32", [raw], outputs=[output]), "PERMISSION_DENIED"
        )
        # The same request over the socket is served; a raw one over TCP still is.
        client.infer("identity_fp32", [tensor])
        result = tcp.infer("identity_fp32", [raw])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), values)


def test_the_tcp_port_serves_shared_memory_when_the_listeners_flag_says_all(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    root = tmp_path_factory.mktemp("shm-tcp")
    repository = root / "models"
    write_identity_model(repository / "identity_fp32", "FP32")
    values = np.arange(6, dtype=np.float32).reshape(2, 3)
    with (
        running_server(
            repository,
            ["identity_fp32"],
            root,
            "--shared-memory-listeners",
            "all",
            control_on_tcp=False,
        ) as server,
        grpcclient.InferenceServerClient(server.url) as tcp,
        client_region("tcp-all", 2 * values.nbytes) as region,
    ):
        shm.set_shared_memory_region(region.handle, [values])
        tcp.register_system_shared_memory(region.name, region.key, region.byte_size)
        tensor = grpcclient.InferInput("INPUT0", [2, 3], "FP32")
        tensor.set_shared_memory(region.name, values.nbytes)
        output = grpcclient.InferRequestedOutput("OUTPUT0")
        output.set_shared_memory(region.name, values.nbytes, offset=values.nbytes)
        tcp.infer("identity_fp32", [tensor], outputs=[output])
        answer = shm.get_contents_as_numpy(region.handle, np.float32, [2, 3], offset=values.nbytes)
        np.testing.assert_array_equal(answer, values)
        tcp.unregister_system_shared_memory()


def test_the_docs_shared_memory_snippet_runs(shm_server: ServerProcess) -> None:
    """docs/shared-memory.md: the tritonclient snippet, with this server's socket and a key of
    its own, prints the identity model's answer from the region."""
    [code] = [
        block
        for block in re.findall(r"```python\n(.*?)```", SHARED_MEMORY_DOC.read_text(), flags=re.S)
        if "register_system_shared_memory" in block
    ]
    code = code.replace("unix:///run/inferd/inferd.sock", f"unix://{shm_server.unix_socket}")
    key = f"/inferd-test-readme-{uuid.uuid4().hex[:12]}"
    code = code.replace("/my-app-io", key)
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(compile(code, str(SHARED_MEMORY_DOC), "exec"), {})
    finally:  # where the server fails, the snippet never reaches its destroy: unlink here
        (Path("/dev/shm") / key.lstrip("/")).unlink(missing_ok=True)
    assert out.getvalue().startswith("[[ 0.  1.  2.  3."), out.getvalue()
