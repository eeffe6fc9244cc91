"""Triton's HTTP/REST API served by the core (issue 27), checked with real clients over a real
connection: tritonclient.http (sync and aio) and curl against the session server, the same
requests over gRPC and HTTP (the same answers, the same messages, the HTTP status of Triton's
table), and a module server for what the session server does not open: shared memory on TCP
(--shared-memory-listeners all), load/unload (explicit model control), and a slow model on which
an HTTP and a gRPC request meet in one batch, and priority and timeout parameters act.
"""

from __future__ import annotations

import asyncio
import gzip
import http.client
import json
import os
import queue
import shutil
import subprocess
import sys
import threading
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.http.aio as aiohttpclient
from tritonclient.utils import InferenceServerException

from inferd.examples import write_identity_model
from tests.integration.conftest import (
    ALL_DATATYPES,
    NO_BATCH_MODEL,
    ServerProcess,
    identity_model,
    running_server,
    wait_until,
)
from tests.integration.shm_client import client_region, shm
from tests.integration.slow_model import BUSY_LENGTH, occupy, write_long_row_model
from tests.integration.test_datatypes import random_tensor

# Triton's HTTP status for each gRPC code (http_server.cc's HTTPCodeFromStatus: everything it
# does not name is 400), with the two inferd adds (RESOURCE_EXHAUSTED, PERMISSION_DENIED).
HTTP_STATUS_OF_GRPC = {
    "StatusCode.INTERNAL": "500",
    "StatusCode.NOT_FOUND": "404",
    "StatusCode.UNAVAILABLE": "503",
    "StatusCode.UNIMPLEMENTED": "501",
    "StatusCode.RESOURCE_EXHAUSTED": "429",
    "StatusCode.PERMISSION_DENIED": "403",
}

# JSON has no form for FP16 and BF16 (Triton's rule): they travel only in binary.
JSON_DATATYPES = [d for d in ALL_DATATYPES if d not in ("FP16", "BF16")]


def http_status_of(grpc_status: str) -> str:
    return HTTP_STATUS_OF_GRPC.get(grpc_status, "400")


@pytest.fixture(scope="session")
def http_url(server: ServerProcess) -> str:
    """host:port of the session server's HTTP/REST listener."""
    assert server.http_url, "the server logged no http_port"
    return server.http_url


class HttpClient(httpclient.InferenceServerClient):
    """tritonclient.http's client, closed by its fixture in the thread that made it. Its own
    ``__del__`` closes it again (gevent's pool join), which raises InvalidThreadUseError when the
    cyclic collector happens to free it on another thread (a gRPC callback's), into whichever
    test runs then: seen in a fresh-clone CI run, failing a later module's test."""

    def __del__(self) -> None:
        pass


@pytest.fixture
def http_client(http_url: str) -> Iterator[httpclient.InferenceServerClient]:
    triton = HttpClient(http_url)
    try:
        yield triton
    finally:
        triton.close()


def json_safe(datatype: str, data: np.ndarray) -> np.ndarray:
    """``data`` without what JSON cannot carry: infinities and NaN (JSON has no literal for them)
    and BYTES that are not UTF-8 text."""
    if datatype == "BYTES":
        words = [w.decode("utf-8", "replace").encode() for w in data.flatten()]
        return np.array(words, dtype=np.object_).reshape(data.shape)
    if data.dtype.kind == "f":
        return np.where(np.isfinite(data), data, 1.5).astype(data.dtype)
    return data


def http_input(name: str, data: np.ndarray, datatype: str, binary: bool) -> httpclient.InferInput:
    tensor = httpclient.InferInput(name, list(data.shape), datatype)
    tensor.set_data_from_numpy(data, binary_data=binary)
    return tensor


def grpc_input(name: str, data: np.ndarray, datatype: str) -> grpcclient.InferInput:
    tensor = grpcclient.InferInput(name, list(data.shape), datatype)
    tensor.set_data_from_numpy(data)
    return tensor


def without_empty(value: Any) -> Any:
    """protobuf's JSON mapping leaves out strings and lists at their default ('' and []), which
    Triton's HTTP JSON writes (a model's "platform": "", an index entry's "reason": ""). An empty
    message stays: "dynamic_batching": {} is not its absence."""
    if isinstance(value, dict):
        return {k: without_empty(v) for k, v in value.items() if v not in ("", [])}
    if isinstance(value, list):
        return [without_empty(v) for v in value]
    return value


def is_default(value: Any) -> bool:
    """A value protobuf's JSON mapping leaves out and Triton's config JSON prints (its
    always_print_primitive_fields): zero, false, empty, an enum's name (its zero value is one)."""
    if isinstance(value, dict):
        return all(is_default(v) for v in value.values())
    if isinstance(value, str):
        return value == "" or value.isupper()
    return value in (0, False, [])


def assert_holds(http: Any, grpc: Any, where: str = "config") -> None:
    """Every field of the gRPC JSON is in the HTTP JSON with the same value; the HTTP JSON's
    other fields are defaults."""
    if isinstance(grpc, dict):
        assert isinstance(http, dict), where
        for key, value in grpc.items():
            assert key in http, f"{where}.{key} missing over HTTP"
            assert_holds(http[key], value, f"{where}.{key}")
        extra = {k: v for k, v in http.items() if k not in grpc}
        assert all(is_default(v) for v in extra.values()), f"{where}: {extra}"
    elif isinstance(grpc, list):
        assert isinstance(http, list) and len(http) == len(grpc), where
        for i, (h, g) in enumerate(zip(http, grpc, strict=True)):
            assert_holds(h, g, f"{where}[{i}]")
    else:
        assert http == grpc, where


def int_strings_as_ints(value: Any) -> Any:
    """protobuf's JSON mapping writes int64 as strings, which tritonclient.grpc's as_json keeps
    and Triton's HTTP config writes as numbers: the same value either way."""
    if isinstance(value, dict):
        return {k: int_strings_as_ints(v) for k, v in value.items()}
    if isinstance(value, list):
        return [int_strings_as_ints(v) for v in value]
    if isinstance(value, str) and value.lstrip("-").isdigit():
        return int(value)
    return value


# --- health, metadata, config, index, statistics --------------------------------------------


def test_health_and_server_metadata(
    http_client: httpclient.InferenceServerClient, client: grpcclient.InferenceServerClient
) -> None:
    assert http_client.is_server_live()
    assert http_client.is_server_ready()
    over_http = http_client.get_server_metadata()
    over_grpc = client.get_server_metadata(as_json=True)
    assert over_http == over_grpc
    assert over_http["name"] == "inferd"


@pytest.mark.parametrize("model", ["simple", "identity_bytes", NO_BATCH_MODEL, "tokenize"])
def test_model_metadata_and_config_match_grpc(
    http_client: httpclient.InferenceServerClient,
    client: grpcclient.InferenceServerClient,
    model: str,
) -> None:
    metadata = http_client.get_model_metadata(model)
    assert without_empty(int_strings_as_ints(metadata)) == int_strings_as_ints(
        client.get_model_metadata(model, as_json=True)
    )
    assert all(isinstance(d, int) for i in metadata["inputs"] for d in i["shape"])  # Triton's JSON
    config = http_client.get_model_config(model)
    assert config["name"] == model
    assert_holds(
        config, int_strings_as_ints(client.get_model_config(model, as_json=True)["config"])
    )
    # As Triton's ModelConfigToJson writes it: 64-bit integers as numbers, defaults printed.
    assert all(isinstance(d, int) for io in config["input"] + config["output"] for d in io["dims"])
    assert "optional" in config["input"][0]


def test_model_ready_and_versions(http_client: httpclient.InferenceServerClient) -> None:
    assert http_client.is_model_ready("simple")
    assert http_client.is_model_ready("simple", "1")
    assert not http_client.is_model_ready("simple", "9")
    assert not http_client.is_model_ready("no_such_model")
    assert http_client.get_model_metadata("simple", "1")["versions"] == ["1"]


def test_repository_index_matches_grpc(
    http_client: httpclient.InferenceServerClient,
    client: grpcclient.InferenceServerClient,
    server_models: list[str],
) -> None:
    over_http = http_client.get_model_repository_index()
    over_grpc = client.get_model_repository_index(as_json=True)["models"]
    assert sorted(without_empty(over_http), key=lambda m: m["name"]) == sorted(
        over_grpc, key=lambda m: m["name"]
    )
    assert sorted(m["name"] for m in over_http) == server_models


def test_statistics_count_http_inferences(
    http_client: httpclient.InferenceServerClient, client: grpcclient.InferenceServerClient
) -> None:
    model = identity_model("INT16")
    before = http_client.get_inference_statistics(model)["model_stats"][0]
    data = np.arange(6, dtype=np.int16).reshape(2, 3)
    http_client.infer(model, [http_input("INPUT0", data, "INT16", binary=True)])

    def counted() -> dict[str, Any]:
        stats: dict[str, Any] = http_client.get_inference_statistics(model)["model_stats"][0]
        return stats

    wait_until(
        lambda: counted()["inference_count"] == before["inference_count"] + 2, "2 rows counted"
    )
    after = counted()
    assert after["name"] == model
    assert after["execution_count"] == before["execution_count"] + 1
    assert after["inference_stats"]["success"]["count"] == (
        before["inference_stats"]["success"]["count"] + 1
    )
    # The same statistics as gRPC reads them (its JSON writes uint64 as strings).
    over_grpc = client.get_inference_statistics(model, as_json=True)["model_stats"][0]
    assert int_strings_as_ints(over_grpc)["inference_count"] == after["inference_count"]
    assert set(over_grpc) <= set(after)
    every = http_client.get_inference_statistics()["model_stats"]
    assert model in {s["name"] for s in every}


# --- inference ---------------------------------------------------------------------------------


def _round_trip(
    http_client: httpclient.InferenceServerClient,
    datatype: str,
    data: np.ndarray,
    binary_in: bool,
    binary_out: bool,
) -> None:
    result = http_client.infer(
        identity_model(datatype),
        [http_input("INPUT0", data, datatype, binary_in)],
        outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary_out)],
    )
    output = result.get_output("OUTPUT0")
    assert output["datatype"] == datatype
    assert output["shape"] == list(data.shape)
    assert ("binary_data_size" in output.get("parameters", {})) == binary_out
    assert ("data" in output) == (not binary_out)
    got = result.as_numpy("OUTPUT0")
    if data.size == 0:  # tritonclient.http reads an empty binary output as float64
        assert got.size == 0
    elif datatype == "BYTES":
        # tritonclient.http reads a JSON BYTES output as str, a binary one as bytes
        want = data if binary_out else np.vectorize(bytes.decode, otypes=[object])(data)
        assert got.tolist() == want.tolist()
    elif datatype == "BF16":
        assert got.view(np.uint32).tolist() == data.view(np.uint32).tolist()
    else:
        assert got.dtype == data.dtype
        assert got.tobytes() == data.tobytes()  # bit-exact, -0.0 included


@pytest.mark.parametrize("datatype", ALL_DATATYPES)
def test_every_datatype_in_binary(
    http_client: httpclient.InferenceServerClient, rng: np.random.Generator, datatype: str
) -> None:
    for shape in ((1, 1), (3, 7), (2, 0)):
        _round_trip(http_client, datatype, random_tensor(rng, datatype, shape), True, True)


@pytest.mark.parametrize("datatype", JSON_DATATYPES)
def test_every_datatype_as_json(
    http_client: httpclient.InferenceServerClient, rng: np.random.Generator, datatype: str
) -> None:
    for shape in ((1, 1), (3, 7)):
        data = json_safe(datatype, random_tensor(rng, datatype, shape))
        _round_trip(http_client, datatype, data, False, False)
        _round_trip(http_client, datatype, data, False, True)  # JSON in, binary out
        _round_trip(http_client, datatype, data, True, False)  # and the other way


@pytest.mark.parametrize("datatype", ["FP16", "BF16"])
def test_half_floats_are_refused_as_json_output(
    http_client: httpclient.InferenceServerClient, datatype: str
) -> None:
    data = np.zeros((1, 2), np.float16 if datatype == "FP16" else np.float32)
    with pytest.raises(InferenceServerException) as refused:
        http_client.infer(
            identity_model(datatype),
            [http_input("INPUT0", data, datatype, binary=True)],
            outputs=[httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)],
        )
    assert refused.value.status() == "400"
    assert f"sending {datatype} data via JSON is not supported" in str(refused.value.message())


def _simple_inputs(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    a = rng.integers(-1000, 1000, size=(2, 16), dtype=np.int32)
    b = rng.integers(-1000, 1000, size=(2, 16), dtype=np.int32)
    return a, b


def test_mixed_binary_and_json_in_one_request(
    http_client: httpclient.InferenceServerClient, rng: np.random.Generator
) -> None:
    a, b = _simple_inputs(rng)
    result = http_client.infer(
        "simple",
        [http_input("INPUT0", a, "INT32", True), http_input("INPUT1", b, "INT32", False)],
        outputs=[
            httpclient.InferRequestedOutput("OUTPUT0", binary_data=False),
            httpclient.InferRequestedOutput("OUTPUT1", binary_data=True),
        ],
    )
    assert result.get_output("OUTPUT0")["data"] == (a + b).flatten().tolist()
    assert "binary_data_size" in result.get_output("OUTPUT1")["parameters"]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def test_requested_outputs_only(
    http_client: httpclient.InferenceServerClient, rng: np.random.Generator
) -> None:
    a, b = _simple_inputs(rng)
    inputs = [http_input("INPUT0", a, "INT32", True), http_input("INPUT1", b, "INT32", True)]
    result = http_client.infer(
        "simple", inputs, outputs=[httpclient.InferRequestedOutput("OUTPUT1")]
    )
    assert result.get_output("OUTPUT0") is None
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    every = http_client.infer("simple", inputs)  # no outputs named: all of them
    assert {o["name"] for o in every.get_response()["outputs"]} == {"OUTPUT0", "OUTPUT1"}


def test_request_id_and_model_are_echoed(
    http_client: httpclient.InferenceServerClient, rng: np.random.Generator
) -> None:
    a, b = _simple_inputs(rng)
    inputs = [http_input("INPUT0", a, "INT32", True), http_input("INPUT1", b, "INT32", True)]
    response = http_client.infer("simple", inputs, request_id="req-\u00e9-42").get_response()
    assert response["id"] == "req-\u00e9-42"
    assert response["model_name"] == "simple"
    assert response["model_version"] == "1"
    assert "id" not in http_client.infer("simple", inputs).get_response()


@pytest.mark.parametrize("request_compression", [None, "gzip", "deflate"])
@pytest.mark.parametrize("response_compression", [None, "gzip", "deflate"])
def test_compression_both_ways(
    http_client: httpclient.InferenceServerClient,
    rng: np.random.Generator,
    request_compression: str | None,
    response_compression: str | None,
) -> None:
    a, b = _simple_inputs(rng)
    result = http_client.infer(
        "simple",
        [http_input("INPUT0", a, "INT32", True), http_input("INPUT1", b, "INT32", False)],
        request_compression_algorithm=request_compression,
        response_compression_algorithm=response_compression,
    )
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)


def _post(
    http_url: str, path: str, body: bytes, headers: dict[str, str]
) -> tuple[int, dict[str, str], bytes]:
    connection = http.client.HTTPConnection(http_url, timeout=10)
    try:
        connection.request("POST", path, body=body, headers=headers)
        response = connection.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        connection.close()


@pytest.mark.parametrize("encoding", ["gzip", "deflate"])
def test_response_is_compressed_as_asked(http_url: str, encoding: str) -> None:
    """tritonclient decompresses without saying: the header and the bytes, seen raw."""
    request = {
        "inputs": [
            {"name": "INPUT0", "shape": [1, 16], "datatype": "INT32", "data": list(range(16))},
            {"name": "INPUT1", "shape": [1, 16], "datatype": "INT32", "data": [1] * 16},
        ]
    }
    raw = json.dumps(request).encode()
    body = gzip.compress(raw) if encoding == "gzip" else zlib.compress(raw)
    status, headers, answer = _post(
        http_url,
        "/v2/models/simple/infer",
        body,
        {
            "Content-Type": "application/json",
            "Content-Encoding": encoding,
            "Accept-Encoding": encoding,
        },
    )
    assert status == 200, answer
    assert headers.get("Content-Encoding") == encoding
    plain = gzip.decompress(answer) if encoding == "gzip" else zlib.decompress(answer)
    outputs = {o["name"]: o["data"] for o in json.loads(plain)["outputs"]}
    assert outputs["OUTPUT0"] == [i + 1 for i in range(16)]


def test_only_infer_answers_are_compressed(http_url: str) -> None:
    """Triton compresses an infer answer only (GetResponseCompressionType is asked for infer
    requests alone): aiohttp, under tritonclient.http.aio, asks for gzip on every request and
    does not inflate what it gets."""
    for path in ("/v2", "/v2/models/simple", "/v2/models/simple/config"):
        connection = http.client.HTTPConnection(http_url, timeout=10)
        try:
            connection.request("GET", path, headers={"Accept-Encoding": "gzip, deflate"})
            response = connection.getresponse()
            body = response.read()
        finally:
            connection.close()
        assert response.status == 200, body
        assert response.getheader("Content-Encoding") is None, path
        assert json.loads(body)


def test_aio_client(http_url: str, rng: np.random.Generator) -> None:
    a, b = _simple_inputs(rng)

    async def session() -> tuple[bool, bool, dict[str, Any], np.ndarray, np.ndarray]:
        async with aiohttpclient.InferenceServerClient(http_url) as triton:
            inputs = [
                http_input("INPUT0", a, "INT32", True),
                http_input("INPUT1", b, "INT32", False),
            ]
            results = await asyncio.gather(*(triton.infer("simple", inputs) for _ in range(8)))
            return (
                await triton.is_server_live(),
                await triton.is_model_ready("simple"),
                await triton.get_model_metadata("simple"),
                results[0].as_numpy("OUTPUT0"),
                results[-1].as_numpy("OUTPUT1"),
            )

    live, ready, metadata, sums, differences = asyncio.run(session())
    assert live and ready
    assert metadata["name"] == "simple"
    np.testing.assert_array_equal(sums, a + b)
    np.testing.assert_array_equal(differences, a - b)


# --- the same requests over gRPC and HTTP ------------------------------------------------------


def _ints(shape: tuple[int, ...]) -> np.ndarray:
    return np.arange(int(np.prod(shape)), dtype=np.int32).reshape(shape)


# (model, version, inputs as (name, data, datatype, shape sent), outputs requested).
Request = tuple[str, str, list[tuple[str, np.ndarray, str, list[int]]], list[str]]

GOOD_INPUTS = [
    ("INPUT0", _ints((2, 16)), "INT32", [2, 16]),
    ("INPUT1", _ints((2, 16)), "INT32", [2, 16]),
]
BAD_REQUESTS: dict[str, Request] = {
    "unknown model": ("no_such_model", "", GOOD_INPUTS, []),
    "unknown version": ("simple", "9", GOOD_INPUTS, []),
    "wrong shape": (
        "simple",
        "",
        [("INPUT0", _ints((2, 8)), "INT32", [2, 8]), GOOD_INPUTS[1]],
        [],
    ),
    "wrong datatype": (
        "simple",
        "",
        [("INPUT0", _ints((2, 16)).astype(np.float32), "FP32", [2, 16]), GOOD_INPUTS[1]],
        [],
    ),
    "missing input": ("simple", "", GOOD_INPUTS[:1], []),
    "unknown input": (
        "simple",
        "",
        [*GOOD_INPUTS, ("INPUT9", _ints((2, 16)), "INT32", [2, 16])],
        [],
    ),
    "bad element count": (
        "simple",
        "",
        [("INPUT0", _ints((2, 8)), "INT32", [2, 16]), GOOD_INPUTS[1]],
        [],
    ),
    "unknown output": ("simple", "", GOOD_INPUTS, ["NO_SUCH_OUTPUT"]),
    "batch too large": (
        identity_model("INT8"),
        "",
        [("INPUT0", np.zeros((9, 1), np.int8), "INT8", [9, 1])],
        [],
    ),
}
GOOD_REQUESTS: dict[str, Request] = {
    "simple": ("simple", "", GOOD_INPUTS, []),
    "simple OUTPUT1 of version 1": ("simple", "1", GOOD_INPUTS, ["OUTPUT1"]),
    "bytes": (
        "identity_bytes",
        "",
        [("INPUT0", np.array([[b"a", "\u00e9\x00".encode()]], np.object_), "BYTES", [1, 2])],
        [],
    ),
    "no batching": (
        NO_BATCH_MODEL,
        "",
        [("INPUT0", np.ones((3, 5), np.float32), "FP32", [3, 5])],
        [],
    ),
}


def _send_grpc(triton: grpcclient.InferenceServerClient, request: Request) -> Any:
    model, version, inputs, outputs = request
    tensors = []
    for name, data, datatype, shape in inputs:
        tensor = grpc_input(name, data, datatype)
        tensor.set_shape(shape)  # after the data: a shape its data does not fill
        tensors.append(tensor)
    return triton.infer(
        model,
        tensors,
        model_version=version,
        outputs=[grpcclient.InferRequestedOutput(o) for o in outputs] or None,
    )


def _send_http(triton: httpclient.InferenceServerClient, request: Request) -> Any:
    model, version, inputs, outputs = request
    tensors = []
    for name, data, datatype, shape in inputs:
        tensor = http_input(name, data, datatype, binary=True)
        tensor.set_shape(shape)
        tensors.append(tensor)
    return triton.infer(
        model,
        tensors,
        model_version=version,
        outputs=[httpclient.InferRequestedOutput(o) for o in outputs] or None,
    )


@pytest.mark.parametrize("case", list(BAD_REQUESTS))
def test_bad_requests_answer_alike_over_both_protocols(
    client: grpcclient.InferenceServerClient,
    http_client: httpclient.InferenceServerClient,
    case: str,
) -> None:
    with pytest.raises(InferenceServerException) as over_grpc:
        _send_grpc(client, BAD_REQUESTS[case])
    with pytest.raises(InferenceServerException) as over_http:
        _send_http(http_client, BAD_REQUESTS[case])
    assert over_http.value.message() == over_grpc.value.message()
    assert over_http.value.status() == http_status_of(str(over_grpc.value.status()))


@pytest.mark.parametrize("case", list(GOOD_REQUESTS))
def test_good_requests_answer_alike_over_both_protocols(
    client: grpcclient.InferenceServerClient,
    http_client: httpclient.InferenceServerClient,
    case: str,
) -> None:
    over_grpc = _send_grpc(client, GOOD_REQUESTS[case])
    over_http = _send_http(http_client, GOOD_REQUESTS[case])
    grpc_outputs = {o.name: o for o in over_grpc.get_response().outputs}
    http_outputs = {o["name"]: o for o in over_http.get_response()["outputs"]}
    assert set(grpc_outputs) == set(http_outputs)
    for name, output in grpc_outputs.items():
        assert http_outputs[name]["datatype"] == output.datatype
        assert http_outputs[name]["shape"] == list(output.shape)
        got, want = over_http.as_numpy(name), over_grpc.as_numpy(name)
        assert got.dtype == want.dtype
        assert got.tolist() == want.tolist()


# Calls other than infer that fail the same way over both clients (the session server: model
# control mode none, shared memory on its Unix socket only).
BAD_CALLS: dict[str, Callable[[Any], object]] = {
    "load in mode none": lambda c: c.load_model("simple"),
    "unload in mode none": lambda c: c.unload_model("simple"),
    "CUDA shared memory on TCP": lambda c: c.get_cuda_shared_memory_status(),
    "metadata of an unknown model": lambda c: c.get_model_metadata("no_such_model"),
    "config of an unknown model": lambda c: c.get_model_config("no_such_model"),
    "statistics of an unknown model": lambda c: c.get_inference_statistics("no_such_model"),
    "trace setting of an unknown model": lambda c: c.update_trace_settings(
        "no_such_model", {"trace_rate": "2"}
    ),
}


@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_bad_calls_answer_alike_over_both_protocols(
    client: grpcclient.InferenceServerClient,
    http_client: httpclient.InferenceServerClient,
    case: str,
) -> None:
    with pytest.raises(InferenceServerException) as over_grpc:
        BAD_CALLS[case](client)
    with pytest.raises(InferenceServerException) as over_http:
        BAD_CALLS[case](http_client)
    assert over_http.value.message() == over_grpc.value.message()
    assert over_http.value.status() == http_status_of(str(over_grpc.value.status()))


def test_shared_memory_is_refused_on_tcp_as_over_grpc(
    client: grpcclient.InferenceServerClient, http_client: httpclient.InferenceServerClient
) -> None:
    """The session server serves shared memory on its Unix socket only (the default
    --shared-memory-listeners): HTTP on TCP follows the same rule, in the same words."""
    with pytest.raises(InferenceServerException) as over_grpc:
        client.register_system_shared_memory("region", "/no_such_object", 64)
    with pytest.raises(InferenceServerException) as over_http:
        http_client.register_system_shared_memory("region", "/no_such_object", 64)
    assert over_http.value.message() == over_grpc.value.message()
    assert over_http.value.status() == http_status_of(str(over_grpc.value.status()))
    assert "--shared-memory-listeners" in str(over_http.value.message())


# --- curl --------------------------------------------------------------------------------------

CURL = shutil.which("curl")
needs_curl = pytest.mark.skipif(CURL is None, reason="curl is not installed")


def _curl(*args: str) -> str:
    assert CURL is not None
    # Not ours to sanitize: `make test-asan-python`'s preloaded libasan hangs curl.
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    done = subprocess.run(
        [CURL, "-sS", "--max-time", "10", *args], capture_output=True, timeout=20, env=env
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.decode()  # as it came: HTTP's CRLF kept


@needs_curl
@pytest.mark.parametrize("nested", [True, False])
def test_curl_json_infer(http_url: str, nested: bool) -> None:
    first = [[i for i in range(16)], [i * 2 for i in range(16)]]
    second = [[1] * 16, [-1] * 16]

    def data(rows: list[list[int]]) -> list[Any]:
        return rows if nested else [v for row in rows for v in row]

    request = {
        "id": "curl-1",
        "inputs": [
            {"name": "INPUT0", "shape": [2, 16], "datatype": "INT32", "data": data(first)},
            {"name": "INPUT1", "shape": [2, 16], "datatype": "INT32", "data": data(second)},
        ],
        "outputs": [{"name": "OUTPUT0"}],
    }
    answer = json.loads(
        _curl(
            "-X",
            "POST",
            "-H",
            "Content-Type: application/json",
            "--data-binary",
            json.dumps(request),
            f"http://{http_url}/v2/models/simple/infer",
        )
    )
    assert answer["id"] == "curl-1"
    assert answer["model_name"] == "simple"
    [output] = answer["outputs"]
    assert output["name"] == "OUTPUT0"
    assert output["shape"] == [2, 16]
    assert output["data"] == [
        a + b for ra, rb in zip(first, second, strict=True) for a, b in zip(ra, rb, strict=True)
    ]


def _status_headers_body(response: str) -> tuple[str, dict[str, str], str]:
    head, _, body = response.partition("\r\n\r\n")
    status, *lines = head.split("\r\n")
    headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines)}
    return status, headers, body


@needs_curl
def test_curl_health(http_url: str) -> None:
    for path in ("/v2/health/ready", "/v2/health/live"):
        status, headers, body = _status_headers_body(_curl("-i", f"http://{http_url}{path}"))
        assert status.startswith("HTTP/1.1 200"), status
        assert headers.get("content-length") == str(len(body.encode()))
        # The status says it (Triton's clients read only that); the body says it to KServe's.
        key = path.rsplit("/", 1)[1]
        assert json.loads(body) == {key: True}


@needs_curl
def test_curl_unknown_path_is_404_with_a_json_error(http_url: str) -> None:
    status, headers, body = _status_headers_body(_curl("-i", f"http://{http_url}/v2/nowhere"))
    assert status.startswith("HTTP/1.1 404"), status
    assert headers.get("content-type") == "application/json"
    assert "/v2/nowhere" in json.loads(body)["error"]
    status, _, body = _status_headers_body(_curl("-i", f"http://{http_url}/metrics"))
    assert status.startswith("HTTP/1.1 404"), status
    assert "error" in json.loads(body)


@needs_curl
def test_curl_wrong_method_is_405(http_url: str) -> None:
    status, _, body = _status_headers_body(
        _curl("-i", "-X", "DELETE", f"http://{http_url}/v2/health/ready")
    )
    assert status.startswith("HTTP/1.1 405"), status
    assert json.loads(body)["error"] == "'/v2/health/ready' takes GET"
    status, _, body = _status_headers_body(_curl("-i", f"http://{http_url}/v2/models/simple/infer"))
    assert status.startswith("HTTP/1.1 405"), status
    assert json.loads(body)["error"] == "'/v2/models/simple/infer' takes POST"


# --- perf_analyzer -----------------------------------------------------------------------------

PERF_ANALYZER = Path(sys.executable).parent / "inferd-perf-analyzer"


@pytest.mark.skipif(not PERF_ANALYZER.exists(), reason="inferd-perf-analyzer is not installed")
def test_perf_analyzer_over_http(http_url: str, tmp_path: Path) -> None:
    report = tmp_path / "report.csv"
    done = subprocess.run(
        [
            str(PERF_ANALYZER),
            "-m",
            "simple",
            "-u",
            http_url,
            "-i",
            "http",
            "--concurrency-range",
            "4",
            "--measurement-interval",
            "1000",
            "--max-trials",
            "3",
            "--stability-percentage",
            "100",
            "-f",
            str(report),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "LD_PRELOAD"},  # see _curl
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "error" not in done.stdout.lower(), done.stdout
    header, row = report.read_text().splitlines()[:2]
    throughput = float(
        dict(zip(header.split(","), row.split(","), strict=True))["Inferences/Second"]
    )
    assert throughput > 0, row


# --- the KServe Python SDK ---------------------------------------------------------------------

# A virtualenv with the KServe SDK (pip install kserve: about 450 MB and half a minute here), made
# at this path when missing. The test runs only where asked: CI does not pay for it.
KSERVE_VENV = os.environ.get("INFERD_TEST_KSERVE_VENV", "")


def _kserve_python() -> Path:
    venv = Path(KSERVE_VENV)
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "kserve"], check=True, timeout=900
        )
    return python


@pytest.mark.skipif(
    not KSERVE_VENV, reason="INFERD_TEST_KSERVE_VENV (a virtualenv path for the KServe SDK) unset"
)
def test_kserve_v2_rest_client(http_url: str) -> None:
    """kserve.InferenceRESTClient (protocol v2), in a virtualenv of its own, runs
    kserve_v2_client.py against the server."""
    done = subprocess.run(
        [
            str(_kserve_python()),
            str(Path(__file__).with_name("kserve_v2_client.py")),
            f"http://{http_url}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    # The KServe SDK reads server health from a JSON body ({"live": true}, as KServe's protocol
    # document shows it); Triton answers 200 with no body.
    assert seen["live"] is True, seen
    assert seen["ready"] is True, seen
    assert seen["model_ready"] is True, seen
    for binary in (True, False):
        assert seen[f"binary={binary}"] == {
            "id": f"kserve-{binary}",
            "sum_ok": True,
            "difference_ok": True,
        }, seen


# --- a module server: shared memory on TCP, load/unload, batching, priority, timeout -------------

QUEUED_MODEL = "queued"  # one slow instance; two priority levels; timeouts may be shortened
QUEUED_BATCH = 3
QUEUED_CONFIG = f"""
max_batch_size: {QUEUED_BATCH}
input [ {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
output [ {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ -1 ] }} ]
instance_group [ {{ count: 1 kind: KIND_CPU }} ]
parameters {{ key: "intra_op_thread_count" value: {{ string_value: "1" }} }}
dynamic_batching {{
  priority_levels: 2 default_priority_level: 2
  default_queue_policy {{ default_timeout_microseconds: 60000000 allow_timeout_override: true }}
}}
"""
SHM_MODEL = identity_model("INT32")
SPARE_MODEL = "spare"  # not loaded at start


@pytest.fixture(scope="module")
def open_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("http_open")
    repository = root / "models"
    write_long_row_model(repository / QUEUED_MODEL, QUEUED_CONFIG)
    write_identity_model(repository / SHM_MODEL, "INT32")
    write_identity_model(repository / SPARE_MODEL, "FP64")
    with running_server(
        repository,
        [QUEUED_MODEL, SHM_MODEL, SPARE_MODEL],
        root,
        "--shared-memory-listeners",
        "all",
        "--model-control-mode",
        "explicit",
        "--load-model",
        f"{QUEUED_MODEL},{SHM_MODEL}",
    ) as running:
        yield running


@pytest.fixture
def open_http(open_server: ServerProcess) -> Iterator[httpclient.InferenceServerClient]:
    triton = HttpClient(open_server.http_url, concurrency=4)
    try:
        yield triton
    finally:
        triton.close()


@pytest.fixture
def open_grpc(open_server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    triton = grpcclient.InferenceServerClient(open_server.url)
    try:
        yield triton
    finally:
        triton.close()


def test_system_shared_memory_over_http(
    open_http: httpclient.InferenceServerClient, rng: np.random.Generator
) -> None:
    data = rng.integers(-(2**31), 2**31 - 1, size=(2, 8), dtype=np.int32, endpoint=True)
    size = data.nbytes
    with client_region("io", 2 * size) as region:
        shm.set_shared_memory_region(region.handle, [data])
        open_http.register_system_shared_memory("io", region.key, 2 * size)
        try:
            status = open_http.get_system_shared_memory_status()
            assert [(r["name"], r["key"], r["byte_size"]) for r in status] == [
                ("io", region.key, 2 * size)
            ]
            tensor = httpclient.InferInput("INPUT0", list(data.shape), "INT32")
            tensor.set_shared_memory("io", size)
            output = httpclient.InferRequestedOutput("OUTPUT0")
            output.set_shared_memory("io", size, offset=size)
            result = open_http.infer(SHM_MODEL, [tensor], outputs=[output])
            answered = result.get_output("OUTPUT0")
            assert answered["parameters"]["shared_memory_region"] == "io"
            assert answered["parameters"]["shared_memory_byte_size"] == size
            assert "data" not in answered
            got = shm.get_contents_as_numpy(region.handle, np.int32, list(data.shape), size)
            np.testing.assert_array_equal(got, data)
            open_http.unregister_system_shared_memory("io")
            assert open_http.get_system_shared_memory_status() == []
            with pytest.raises(InferenceServerException) as unregistered:
                open_http.infer(SHM_MODEL, [tensor])
            assert unregistered.value.status() == "400"
            assert "io" in str(unregistered.value.message())
        finally:
            open_http.unregister_system_shared_memory()


def test_config_writes_64_bit_fields_as_numbers(
    open_http: httpclient.InferenceServerClient,
) -> None:
    """Triton's config JSON: the queue policy's int64 timeout a number, as the dims are."""
    batching = open_http.get_model_config(QUEUED_MODEL)["dynamic_batching"]
    assert batching["default_queue_policy"]["default_timeout_microseconds"] == 60_000_000
    assert batching["max_queue_delay_microseconds"] == 0
    assert batching["priority_levels"] == 2


def test_load_and_unload_over_http(
    open_http: httpclient.InferenceServerClient, open_grpc: grpcclient.InferenceServerClient
) -> None:
    assert not open_http.is_model_ready(SPARE_MODEL)
    open_http.load_model(SPARE_MODEL)
    assert open_http.is_model_ready(SPARE_MODEL)
    assert open_grpc.is_model_ready(SPARE_MODEL)
    data = np.array([[1.25, -2.5]], np.float64)
    result = open_http.infer(SPARE_MODEL, [http_input("INPUT0", data, "FP64", False)])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)
    open_http.unload_model(SPARE_MODEL)
    wait_until(lambda: not open_grpc.is_model_ready(SPARE_MODEL), f"{SPARE_MODEL} unloaded")
    index = {m["name"]: m for m in open_http.get_model_repository_index()}
    assert index[SPARE_MODEL]["state"] == "UNAVAILABLE"
    with pytest.raises(InferenceServerException) as unknown:
        open_http.load_model("no_such_model")
    with pytest.raises(InferenceServerException) as unknown_grpc:
        open_grpc.load_model("no_such_model")
    assert unknown.value.message() == unknown_grpc.value.message()


class Answers:
    """Completions in order: (tag, error or None), from gRPC callbacks and HTTP threads."""

    def __init__(self) -> None:
        self.done: queue.Queue[tuple[str, Any]] = queue.Queue()

    def callback(self, tag: str) -> Callable[[Any, Any], None]:
        return lambda result, error: self.done.put((tag, error))

    def wait(self, count: int, timeout: float = 60.0) -> list[tuple[str, Any]]:
        return [self.done.get(timeout=timeout) for _ in range(count)]


def _row(value: float) -> np.ndarray:
    return np.array([[value]], np.float32)


def _http_in_background(url: str, answers: Answers, tag: str, priority: int = 0) -> None:
    """An HTTP inference of one row whose completion lands in ``answers``, sent from a thread
    with the standard library's http.client (JSON data): tritonclient.http's gevent connections
    belong to the hub of the thread that made them, and a client made in a thread and freed
    later elsewhere raised InvalidThreadUseError from its __del__ into whichever test ran then."""
    parameters = {"priority": priority} if priority else {}
    body = json.dumps(
        {
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [1.0]}],
            "parameters": parameters,
        }
    )

    def send() -> None:
        host, port = url.rsplit(":", 1)
        connection = http.client.HTTPConnection(host, int(port), timeout=60)
        try:
            connection.request("POST", f"/v2/models/{QUEUED_MODEL}/infer", body)
            response = connection.getresponse()
            answer = response.read()
            error = None if response.status == 200 else f"{response.status}: {answer!r}"
        except OSError as e:
            error = repr(e)
        finally:
            connection.close()
        answers.done.put((tag, error))

    threading.Thread(target=send, daemon=True).start()


def _occupy(
    triton: grpcclient.InferenceServerClient, server: ServerProcess, answers: Answers
) -> None:
    """Two busy requests of QUEUED_BATCH rows (they cannot share a batch), each as long to
    compute as slow_model's one busy row."""
    occupy(
        triton, server, QUEUED_MODEL, answers.callback, QUEUED_BATCH, BUSY_LENGTH // QUEUED_BATCH
    )


def _queued_stats(triton: grpcclient.InferenceServerClient) -> Any:
    return triton.get_inference_statistics(QUEUED_MODEL).model_stats[0]


def test_an_http_and_a_grpc_request_share_a_batch(
    open_server: ServerProcess, open_grpc: grpcclient.InferenceServerClient
) -> None:
    answers = Answers()
    before = _queued_stats(open_grpc)
    _occupy(open_grpc, open_server, answers)
    open_grpc.async_infer(
        QUEUED_MODEL, [grpc_input("INPUT0", _row(1.0), "FP32")], answers.callback("grpc")
    )
    open_server.wait_for_pending(QUEUED_MODEL, 2)
    _http_in_background(open_server.http_url, answers, "http")
    open_server.wait_for_pending(QUEUED_MODEL, 3)
    done = answers.wait(4)
    assert all(error is None for _, error in done), done
    wait_until(
        lambda: (
            _queued_stats(open_grpc).inference_count
            >= before.inference_count + 2 * QUEUED_BATCH + 2
        ),
        "every inference counted",
    )
    after = _queued_stats(open_grpc)
    assert after.execution_count - before.execution_count == 3  # two busy ones, then the pair
    pairs = {b.batch_size: b.compute_infer.count for b in after.batch_stats}
    pairs_before = {b.batch_size: b.compute_infer.count for b in before.batch_stats}
    assert pairs.get(2, 0) - pairs_before.get(2, 0) == 1, after.batch_stats


def test_http_priority_overtakes_queued_requests(
    open_server: ServerProcess, open_grpc: grpcclient.InferenceServerClient
) -> None:
    answers = Answers()
    _occupy(open_grpc, open_server, answers)
    # "low" is of another length than "high": the two cannot share a batch.
    open_grpc.async_infer(
        QUEUED_MODEL,
        [grpc_input("INPUT0", np.ones((1, 2), np.float32), "FP32")],
        answers.callback("low"),
    )
    open_server.wait_for_pending(QUEUED_MODEL, 2)
    _http_in_background(open_server.http_url, answers, "high", priority=1)
    open_server.wait_for_pending(QUEUED_MODEL, 3)
    order = [tag for tag, error in answers.wait(4) if error is None]
    # busy0 was computing when "high" came; "high" overtook busy1 and "low", both queued before
    # it. (busy0's gRPC answer may be delivered after the short "high" one's HTTP answer: only
    # the requests that waited in the queue are ordered here, each a whole computation apart.)
    assert order.index("high") < order.index("busy1") < order.index("low"), order


def test_http_timeout_parameter_shortens_the_queue_timeout(
    open_server: ServerProcess,
    open_grpc: grpcclient.InferenceServerClient,
    open_http: httpclient.InferenceServerClient,
) -> None:
    answers = Answers()
    _occupy(open_grpc, open_server, answers)
    with pytest.raises(InferenceServerException) as timed_out:
        open_http.infer(QUEUED_MODEL, [http_input("INPUT0", _row(1.0), "FP32", True)], timeout=5000)
    assert timed_out.value.status() == "503"  # UNAVAILABLE, as over gRPC
    assert "timeout" in str(timed_out.value.message())
    assert all(error is None for _, error in answers.wait(2))
