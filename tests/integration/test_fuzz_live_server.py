"""A fuzzer against a live server (issue 13, item 7): hypothesis builds arbitrary ModelInferRequest
messages (names, versions, inputs of any datatype, shape, typed or raw contents, parameters,
requested outputs) and byte strings that are mostly not protobuf, sends them to a server of its
own, and after every one sends a good request that must still get the right answer.

Whatever it is sent, the server must not crash or stall, must never answer UNKNOWN or INTERNAL,
answers only with the statuses a client can act on (ALLOWED), and an identity model that accepts
a request returns exactly what it was given.

Profiles (``INFERD_FUZZ_PROFILE``): ``ci`` (default) is deterministic (derandomized, no example
database) and bounded: CI_EXAMPLES examples per test, each call with a deadline. ``long`` (what
``make fuzz`` runs) draws new examples every run, FUZZ_LONG_EXAMPLES (INFERD_FUZZ_EXAMPLES) per
test, and keeps failing examples in .hypothesis/ (ignored by git) to replay them first next time.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import cast

import grpc
import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from tritonclient.grpc import service_pb2

from inferd.examples import DATATYPES
from tests.integration.conftest import ServerProcess
from tests.integration.hostile_server import (
    GOOD_MODEL,
    INFER,
    NO_BATCH_MODEL,
    SERVICE,
    STREAM_INFER,
    check_good_answer,
    good_request,
    hostile_server,
    identity_model,
)

Request = service_pb2.ModelInferRequest
CI_EXAMPLES = 200
FUZZ_LONG_EXAMPLES = int(os.environ.get("INFERD_FUZZ_EXAMPLES", "5000"))
# A call that takes longer than this is a stall, and fails the example.
FUZZ_CALL_TIMEOUT_S = 10.0

_COMMON = {
    "deadline": None,  # the calls carry their own deadline (FUZZ_CALL_TIMEOUT_S)
    # The server fixture is module-scoped: one server for every example, which is the point.
    "suppress_health_check": [HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
}
settings.register_profile(
    "ci", max_examples=CI_EXAMPLES, derandomize=True, database=None, print_blob=True, **_COMMON
)
settings.register_profile("long", max_examples=FUZZ_LONG_EXAMPLES, print_blob=True, **_COMMON)
PROFILE = os.environ.get("INFERD_FUZZ_PROFILE", "ci")
if PROFILE not in ("ci", "long"):
    raise ValueError(f"INFERD_FUZZ_PROFILE={PROFILE!r}: use 'ci' or 'long'")
FUZZ_SETTINGS = settings.get_profile(PROFILE)

# Every status a hostile request may get. UNKNOWN and INTERNAL are server bugs; DEADLINE_EXCEEDED
# is the call's own deadline (a stall: the fuzzer's timeouts are never below a second).
# UNAVAILABLE is Triton's answer for a queue timeout or a full queue. RESOURCE_EXHAUSTED is not
# among them: every message here is tens of KB at most, far below any byte budget, and it is what
# the client reports when a status message is too long to reach it (a 20 KB name echoed).
ALLOWED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.UNIMPLEMENTED,
    grpc.StatusCode.UNAVAILABLE,
}
MODELS = [GOOD_MODEL, NO_BATCH_MODEL, *(identity_model(d) for d in DATATYPES)]
UNARY_RPCS = [
    "ModelInfer",
    "ServerLive",
    "ServerReady",
    "ServerMetadata",
    "ModelReady",
    "ModelMetadata",
    "ModelConfig",
    "ModelStatistics",
    "RepositoryIndex",
]


# --- Strategies -------------------------------------------------------------------------------

INT32 = st.integers(-(2**31), 2**31 - 1)
INT64 = st.integers(-(2**63), 2**63 - 1)
UINT32 = st.integers(0, 2**32 - 1)
UINT64 = st.integers(0, 2**64 - 1)
TYPED_VALUES: dict[str, st.SearchStrategy[object]] = {
    "bool_contents": st.booleans(),
    "int_contents": INT32,
    "int64_contents": INT64,
    "uint_contents": UINT32,
    "uint64_contents": UINT64,
    "fp32_contents": st.floats(width=32, allow_nan=True),
    "fp64_contents": st.floats(allow_nan=True),
    "bytes_contents": st.binary(max_size=16),
}
FIELD_OF = {name: d.contents_field for name, d in DATATYPES.items() if d.contents_field}
SHORT_TEXT = st.text(max_size=12)
names = st.one_of(
    st.sampled_from(["INPUT0", "INPUT1", "INPUT7", "OUTPUT0", "OUTPUT1", ""]), SHORT_TEXT
)
datatypes = st.one_of(st.sampled_from([*DATATYPES, "FP8", "", "fp32", "TYPE_FP32"]), SHORT_TEXT)
# Mostly small dims (the data stays small), some hostile ones.
dims = st.one_of(
    st.integers(0, 8),
    st.integers(0, 8),
    st.integers(0, 8),
    st.sampled_from([-1, -(2**63), 2**31, 2**32, 2**62, 2**63 - 1]),
    INT64,
)
shapes = st.lists(dims, max_size=4)
model_names = st.one_of(
    st.sampled_from(MODELS), st.sampled_from(MODELS), SHORT_TEXT, st.just("m" * 20_000)
)
versions = st.one_of(
    st.sampled_from(["", "1", "2", " 1", "1 ", "0_1", "-1", "+1", "99999999999999999999"]),
    SHORT_TEXT,
)


@st.composite
def parameter_values(draw: st.DrawFn) -> service_pb2.InferParameter:
    kind = draw(st.sampled_from(["bool", "int64", "uint64", "string", "double", "none"]))
    parameter = service_pb2.InferParameter()
    if kind == "bool":
        parameter.bool_param = draw(st.booleans())
    elif kind == "int64":
        # A well-typed timeout below a second could expire in a queue: that answer is right.
        parameter.int64_param = draw(st.one_of(st.integers(-5, 0), st.integers(10**6, 2**63 - 1)))
    elif kind == "uint64":
        parameter.uint64_param = draw(st.one_of(st.just(0), st.integers(10**6, 2**64 - 1)))
    elif kind == "string":
        parameter.string_param = draw(SHORT_TEXT)
    elif kind == "double":
        parameter.double_param = draw(st.floats())
    return parameter


parameter_keys = st.one_of(
    st.sampled_from(
        ["priority", "timeout", "binary_data_output", "sequence_id", "triton_x", "headers"]
    ),
    SHORT_TEXT,
)
parameter_maps = st.dictionaries(parameter_keys, parameter_values(), max_size=3)


def _raw_for(datatype: str, shape: list[int], draw: st.DrawFn) -> bytes:
    """Data that fits ``shape`` of ``datatype`` (when it can be small), so that some requests get
    past the checks and reach the model."""
    info = DATATYPES.get(datatype)
    count = 1
    for d in shape:
        count *= d
    if info is None or not 0 <= count <= 64 or any(d < 0 for d in shape):
        return draw(st.binary(max_size=64))
    if info.is_bytes:
        elements = draw(st.lists(st.binary(max_size=8), min_size=count, max_size=count))
        return b"".join(len(e).to_bytes(4, "little") + e for e in elements)
    return draw(st.binary(min_size=count * info.itemsize, max_size=count * info.itemsize))


def _signature(model: str) -> list[tuple[str, str, int | None]]:
    """The inputs of the repository's models: name, datatype, the fixed last dim (None: any)."""
    if model == GOOD_MODEL:
        return [("INPUT0", "INT32", 16), ("INPUT1", "INT32", 16)]
    if model == NO_BATCH_MODEL:
        return [("INPUT0", "FP32", None)]
    return [("INPUT0", model.removeprefix("identity_").upper(), None)]


def _add_data(
    request: Request, entry: Request.InferInputTensor, raw: bool, draw: st.DrawFn
) -> None:
    if raw:
        request.raw_input_contents.append(_raw_for(entry.datatype, list(entry.shape), draw))
    elif draw(st.integers(0, 9)) > 0:  # sometimes no data at all
        field = FIELD_OF.get(entry.datatype, "fp32_contents")
        if draw(st.integers(0, 4)) == 0:
            field = draw(st.sampled_from(sorted(TYPED_VALUES)))
        count = 1
        for d in entry.shape:
            count *= d
        # Often exactly the shape's count, so that typed requests reach the model too.
        exact = 0 <= count <= 64 and draw(st.booleans())
        size = {"min_size": count, "max_size": count} if exact else {"max_size": 16}
        getattr(entry.contents, field).extend(draw(st.lists(TYPED_VALUES[field], **size)))


@st.composite
def infer_requests(draw: st.DrawFn) -> Request:
    """Half follow a model's signature (then may be bent in one place), half are arbitrary."""
    # Mostly a model and version that exist: the rest of the request is what is being tried.
    model = draw(st.sampled_from(MODELS) if draw(st.integers(0, 9)) < 8 else model_names)
    version = draw(st.sampled_from(["", "1"]) if draw(st.integers(0, 9)) < 8 else versions)
    request = Request(model_name=model, model_version=version, id=draw(SHORT_TEXT))
    if draw(st.integers(0, 3)) == 0:
        for key, value in draw(parameter_maps).items():
            request.parameters[key].CopyFrom(value)
    mode = draw(st.sampled_from(["raw", "raw", "typed", "mixed"]))
    if model in MODELS and draw(st.booleans()):
        rows = draw(st.integers(1, 8)) if model != NO_BATCH_MODEL else draw(st.integers(0, 4))
        for name, datatype, last in _signature(model):
            shape = [rows, last if last is not None else draw(st.integers(0, 8))]
            if draw(st.integers(0, 5)) == 0:
                shape[draw(st.integers(0, 1))] = draw(dims)
            if draw(st.integers(0, 7)) == 0:
                datatype = draw(datatypes)
            entry = request.inputs.add(name=name, datatype=datatype, shape=shape)
            _add_data(request, entry, mode != "typed", draw)
    else:
        for _ in range(draw(st.integers(0, 3))):
            entry = request.inputs.add(
                name=draw(names), datatype=draw(datatypes), shape=draw(shapes)
            )
            raw = mode == "raw" or (mode == "mixed" and draw(st.booleans()))
            _add_data(request, entry, raw, draw)
        if request.inputs:
            for key, value in draw(parameter_maps).items():
                request.inputs[0].parameters[key].CopyFrom(value)
    if mode == "raw" and draw(st.integers(0, 7)) == 0:
        request.raw_input_contents.append(draw(st.binary(max_size=16)))  # one too many
    for _ in range(draw(st.integers(0, 2)) if draw(st.integers(0, 3)) == 0 else 0):
        output = request.outputs.add(name=draw(names))
        if draw(st.integers(0, 5)) == 0:
            output.parameters[draw(parameter_keys)].CopyFrom(draw(parameter_values()))
    return request


@st.composite
def byte_strings(draw: st.DrawFn) -> bytes:
    """Bytes that are mostly not a valid message: random, or a good request truncated or with
    bytes flipped."""
    if draw(st.booleans()):
        return draw(st.binary(max_size=512))
    payload = bytearray(good_request(np.random.default_rng(0))[0].SerializeToString())
    payload = payload[: draw(st.integers(0, len(payload)))] if draw(st.booleans()) else payload
    for _ in range(draw(st.integers(1, 8))):
        if payload:
            payload[draw(st.integers(0, len(payload) - 1))] = draw(st.integers(0, 255))
    return bytes(payload)


# --- The live server --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with hostile_server(tmp_path_factory.mktemp("fuzz")) as server:
        yield server


@pytest.fixture(scope="module")
def fuzz_channel(fuzzed: ServerProcess) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(fuzzed.url) as channel:
        yield channel


def _call(channel: grpc.Channel, method: str, payload: bytes) -> tuple[grpc.StatusCode, str, bytes]:
    call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
    try:
        answer: bytes = call(payload, timeout=FUZZ_CALL_TIMEOUT_S)
    except grpc.RpcError as error:
        rpc = cast(grpc.Call, error)
        return rpc.code(), rpc.details() or "", b""
    return grpc.StatusCode.OK, "", answer


def _assert_good_still_answered(server: ServerProcess, channel: grpc.Channel, seed: int) -> None:
    assert server.process.poll() is None, f"the server exited:\n{server.log()[-4000:]}"
    request, a, b = good_request(np.random.default_rng(seed))
    code, details, answer = _call(channel, INFER, request.SerializeToString())
    assert code == grpc.StatusCode.OK, (code, details)
    check_good_answer(answer, a, b)


def _check_identity(request: Request, answer: bytes) -> None:
    """An identity model that accepted raw data returns it unchanged."""
    if not request.model_name.startswith("identity_") or not request.raw_input_contents:
        return
    if any(o.name != "OUTPUT0" for o in request.outputs):
        return
    response = service_pb2.ModelInferResponse.FromString(answer)
    assert [o.name for o in response.outputs] == ["OUTPUT0"], response.outputs
    assert list(response.outputs[0].shape) == list(request.inputs[0].shape)
    assert response.raw_output_contents[0] == request.raw_input_contents[0]


@FUZZ_SETTINGS
@given(request=infer_requests())
def test_fuzz_infer_request(
    fuzzed: ServerProcess, fuzz_channel: grpc.Channel, request: Request
) -> None:
    code, details, answer = _call(fuzz_channel, INFER, request.SerializeToString())
    event(code.name)  # --hypothesis-show-statistics: how many got how far
    assert code in ALLOWED, (code, details[:500], request.model_name[:64])
    if code == grpc.StatusCode.OK:
        _check_identity(request, answer)
    _assert_good_still_answered(fuzzed, fuzz_channel, len(answer))


@FUZZ_SETTINGS
@given(payload=byte_strings(), rpc=st.sampled_from(UNARY_RPCS))
def test_fuzz_bytes(
    fuzzed: ServerProcess, fuzz_channel: grpc.Channel, payload: bytes, rpc: str
) -> None:
    code, details, _ = _call(fuzz_channel, SERVICE + rpc, payload)
    event(code.name)
    assert code in ALLOWED, (rpc, code, details[:500])
    _assert_good_still_answered(fuzzed, fuzz_channel, len(payload))


# Not a message in any schema: a varint longer than ten bytes.
MALFORMED = b"\xff" * 16


@FUZZ_SETTINGS
@given(
    requests=st.lists(st.one_of(infer_requests(), st.none()), min_size=1, max_size=6),
    malformed_last=st.booleans(),
)
def test_fuzz_stream(
    fuzzed: ServerProcess,
    fuzz_channel: grpc.Channel,
    requests: list[Request | None],
    malformed_last: bool,
) -> None:
    """Well-formed requests, good ones (None) among them, on one stream, sometimes followed by a
    malformed message: each well-formed one gets exactly one response, the good ones their right
    answer, and the stream ends OK, or INVALID_ARGUMENT after the malformed one."""
    rng = np.random.default_rng(len(requests))
    messages: list[bytes] = []
    goods: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    for index, request in enumerate(requests):
        if request is None:
            good, a, b = good_request(rng)
            good.id = f"good-{index}"
            goods[good.id] = (a, b)
            request = good
        messages.append(request.SerializeToString())
    call = fuzz_channel.stream_stream(
        STREAM_INFER, request_serializer=None, response_deserializer=None
    )
    replies: list[service_pb2.ModelStreamInferResponse] = []
    code, details = grpc.StatusCode.OK, ""
    try:
        sent = [*messages, MALFORMED] if malformed_last else messages
        for raw in call(iter(sent), timeout=FUZZ_CALL_TIMEOUT_S):
            replies.append(service_pb2.ModelStreamInferResponse.FromString(raw))
    except grpc.RpcError as error:
        rpc = cast(grpc.Call, error)
        code, details = rpc.code(), rpc.details() or ""
    expected = grpc.StatusCode.INVALID_ARGUMENT if malformed_last else grpc.StatusCode.OK
    assert code == expected, (code, details[:500])
    assert len(replies) == len(messages), [r.error_message[:200] for r in replies]
    answered = {r.infer_response.id: r for r in replies if not r.error_message}
    for request_id, (a, b) in goods.items():
        assert request_id in answered, [r.error_message[:200] for r in replies]
        check_good_answer(answered[request_id].infer_response.SerializeToString(), a, b)
    _assert_good_still_answered(fuzzed, fuzz_channel, len(messages))
