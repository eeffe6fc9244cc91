"""Triton's TraceSetting against a server subprocess, with tritonclient.grpc over the Unix socket:
the settings read and changed at run time, and the spans the core then exports over OTLP to a
real receiver (the rate, level OFF, the trace count, a model's own settings and their clearing);
bad values refused; the call refused on TCP while control is not opened there."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from inferd.examples import make_examples
from tests.integration.conftest import ServerProcess, running_server
from tests.integration.otlp_receiver import OtlpTraceReceiver

# Every key cleared: the global settings go back to those at start, a model's to the global ones.
CLEARED: dict[str, Any] = {"trace_level": None, "trace_rate": None, "trace_count": None}


@pytest.fixture(scope="module")
def receiver() -> Iterator[OtlpTraceReceiver]:
    otlp = OtlpTraceReceiver()
    yield otlp
    otlp.stop()


@pytest.fixture(scope="module")
def server(
    tmp_path_factory: pytest.TempPathFactory, receiver: OtlpTraceReceiver
) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("trace_settings")
    names = make_examples(root / "models")
    env = {
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": receiver.endpoint,
        "OTEL_BSP_SCHEDULE_DELAY": "50",  # export quickly: the tests wait for the spans
    }
    # Control is not opened on TCP (the default): TraceSetting is answered on the Unix socket.
    with running_server(root / "models", names, root, env_extra=env, control_on_tcp=False) as s:
        yield s


@pytest.fixture
def unix(server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(f"unix:{server.unix_socket}")
    yield client
    # Each test starts from the settings at start.
    client.update_trace_settings(model_name="simple", settings=CLEARED)
    client.update_trace_settings(settings=CLEARED)
    client.close()


def settings(client: grpcclient.InferenceServerClient, model: str | None = None) -> dict[str, Any]:
    answer = client.get_trace_settings(model_name=model, as_json=True)
    return {key: value["value"] for key, value in answer["settings"].items()}


def expected(level: str = "TIMESTAMPS", rate: str = "1", count: str = "-1") -> dict[str, Any]:
    return {
        "trace_level": [level],
        "trace_rate": [rate],
        "trace_count": [count],
        "trace_mode": ["opentelemetry"],
    }


def infer(client: grpcclient.InferenceServerClient, model: str, headers: dict[str, str]) -> None:
    if model == "simple":
        data = np.arange(16, dtype=np.int32).reshape(1, 16)
        inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    else:
        data = np.ones((1, 4), dtype=np.float32)
        inputs = [grpcclient.InferInput("INPUT0", [1, 4], "FP32")]
    for tensor in inputs:
        tensor.set_data_from_numpy(data)
    client.infer(model, inputs, headers=headers)


class Spans:
    """Counts the request spans the server exports from here on. ``settle`` makes sure every span
    of the requests sent before it has arrived: it clears the settings, sends one request whose
    caller's trace is sampled, and waits for its span, which the server exports after theirs (the
    core reports requests in the order it answers them; one processor exports in order)."""

    def __init__(self, receiver: OtlpTraceReceiver, client: grpcclient.InferenceServerClient):
        self._receiver = receiver
        self._client = client
        self._start = len(receiver.spans())
        self._markers: set[str] = set()

    def settle(self) -> None:
        self._client.update_trace_settings(model_name="simple", settings=CLEARED)
        self._client.update_trace_settings(settings=CLEARED)
        trace_id = secrets.token_hex(16)
        self._markers.add(trace_id)
        header = f"00-{trace_id}-{secrets.token_hex(8)}-01"
        infer(self._client, "simple", {"traceparent": header})
        deadline = time.monotonic() + 20.0
        while not any(s.trace_id.hex() == trace_id for s in self._receiver.spans()):
            assert time.monotonic() < deadline, "the settling request's span never arrived"
            time.sleep(0.05)

    def of(self, model: str) -> int:
        """Request spans of ``model`` since this object was made, the settling ones aside."""
        found = 0
        for span in self._receiver.spans()[self._start :]:
            if span.name != "ModelInfer" or span.trace_id.hex() in self._markers:
                continue
            names = {kv.key: kv.value.string_value for kv in span.attributes}
            found += names.get("inferd.model") == model
        return found


def send(client: grpcclient.InferenceServerClient, model: str, count: int) -> None:
    for _ in range(count):
        infer(client, model, {})


def test_the_settings_at_start_are_read_over_the_unix_socket(
    unix: grpcclient.InferenceServerClient,
) -> None:
    # OTEL_TRACES_SAMPLER unset: parentbased_always_on, every request traced.
    assert settings(unix) == expected()
    assert settings(unix, "simple") == expected()


def test_the_rate_decides_how_many_requests_the_core_traces(
    unix: grpcclient.InferenceServerClient, receiver: OtlpTraceReceiver
) -> None:
    spans = Spans(receiver, unix)
    answer = unix.update_trace_settings(settings={"trace_rate": "2"}, as_json=True)
    assert answer["settings"]["trace_rate"]["value"] == ["2"]
    send(unix, "simple", 200)
    spans.settle()
    # One in two: 100 expected, 60..140 is over 5 standard deviations (7.1) either way.
    assert 60 <= spans.of("simple") <= 140, spans.of("simple")
    spans = Spans(receiver, unix)
    unix.update_trace_settings(settings={"trace_rate": "4294967295"})
    send(unix, "simple", 50)
    spans.settle()
    assert spans.of("simple") == 0


def test_level_off_stops_every_span_even_a_sampled_callers(
    unix: grpcclient.InferenceServerClient, receiver: OtlpTraceReceiver
) -> None:
    spans = Spans(receiver, unix)
    answer = unix.update_trace_settings(settings={"trace_level": ["OFF"]}, as_json=True)
    assert answer["settings"]["trace_level"]["value"] == ["OFF"]
    send(unix, "simple", 10)
    for _ in range(5):
        header = f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"
        infer(unix, "simple", {"traceparent": header})
    spans.settle()
    assert spans.of("simple") == 0


def test_the_trace_count_stops_tracing_after_that_many(
    unix: grpcclient.InferenceServerClient, receiver: OtlpTraceReceiver
) -> None:
    spans = Spans(receiver, unix)
    assert settings(unix) == expected()
    unix.update_trace_settings(settings={"trace_count": "3"})
    send(unix, "simple", 10)
    assert settings(unix) == expected(count="0")  # what is left
    spans.settle()
    assert spans.of("simple") == 3


def test_a_models_settings_override_the_global_ones_until_cleared(
    unix: grpcclient.InferenceServerClient, receiver: OtlpTraceReceiver
) -> None:
    spans = Spans(receiver, unix)
    unix.update_trace_settings(settings={"trace_level": ["OFF"], "trace_rate": "5"})
    answer = unix.update_trace_settings(
        model_name="simple", settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "1"}
    )
    assert {k: v["value"] for k, v in answer_settings(answer).items()} == expected()
    assert settings(unix, "identity_fp32") == expected(level="OFF", rate="5")
    send(unix, "simple", 5)
    send(unix, "identity_fp32", 5)
    # Cleared: simple follows the global settings again, and is traced no more.
    answer = unix.update_trace_settings(model_name="simple", settings={"trace_level": None})
    assert {k: v["value"] for k, v in answer_settings(answer).items()} == expected(level="OFF")
    send(unix, "simple", 5)
    spans.settle()
    assert spans.of("simple") == 5
    assert spans.of("identity_fp32") == 0


def test_a_streams_requests_follow_their_models_settings(
    unix: grpcclient.InferenceServerClient, receiver: OtlpTraceReceiver
) -> None:
    spans = Spans(receiver, unix)
    unix.update_trace_settings(settings={"trace_level": ["OFF"]})
    unix.update_trace_settings(
        model_name="simple", settings={"trace_level": ["TIMESTAMPS"], "trace_count": "2"}
    )
    answers: list[Any] = []
    unix.start_stream(callback=lambda result, error: answers.append(error or result))
    data = np.arange(16, dtype=np.int32).reshape(1, 16)
    for model in ("simple",) * 4 + ("identity_fp32",) * 2:
        if model == "simple":
            inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
            for tensor in inputs:
                tensor.set_data_from_numpy(data)
        else:
            inputs = [grpcclient.InferInput("INPUT0", [1, 4], "FP32")]
            inputs[0].set_data_from_numpy(np.ones((1, 4), dtype=np.float32))
        unix.async_stream_infer(model, inputs)
    unix.stop_stream()  # waits for the answers
    assert len(answers) == 6 and not any(isinstance(a, Exception) for a in answers), answers
    spans.settle()
    # simple's own level and budget: two of its four; identity_fp32 has the global OFF.
    assert spans.of("simple") == 2
    assert spans.of("identity_fp32") == 0


def answer_settings(answer: Any) -> dict[str, Any]:
    """A TraceSettingResponse (protobuf) as {key: {"value": [...]}}."""
    return {key: {"value": list(value.value)} for key, value in answer.settings.items()}


@pytest.mark.parametrize(
    ("model", "changes", "code", "message"),
    [
        (
            "",
            {"trace_rate": "often"},
            "INVALID_ARGUMENT",
            "Unable to parse 'trace_rate', got: often",
        ),
        ("", {"trace_count": "-5"}, "INVALID_ARGUMENT", "Expecting value >= -1, got: -5"),
        ("", {"trace_level": ["OFF", "TIMESTAMPS"]}, "INVALID_ARGUMENT", "only one trace level"),
        ("", {"trace_sampler": "always_on"}, "INVALID_ARGUMENT", "unknown trace setting"),
        ("", {"trace_file": "/tmp/trace.json"}, "UNIMPLEMENTED", "trace file location"),
        ("nope", {"trace_rate": "1"}, "INVALID_ARGUMENT", "Request for unknown model : nope"),
    ],
)
def test_bad_values_are_refused_and_change_nothing(
    unix: grpcclient.InferenceServerClient,
    model: str,
    changes: dict[str, Any],
    code: str,
    message: str,
) -> None:
    with pytest.raises(InferenceServerException) as refused:
        unix.update_trace_settings(model_name=model, settings={"trace_rate": "3", **changes})
    assert refused.value.status() == f"StatusCode.{code}"
    assert message in refused.value.message()
    assert settings(unix) == expected()
    assert settings(unix, "simple") == expected()


def test_trace_setting_is_refused_on_tcp_while_control_is_not_opened(
    server: ServerProcess, unix: grpcclient.InferenceServerClient
) -> None:
    tcp = grpcclient.InferenceServerClient(server.url)
    try:
        for call in (
            lambda: tcp.get_trace_settings(),
            lambda: tcp.update_trace_settings(settings={"trace_level": ["OFF"]}),
        ):
            with pytest.raises(InferenceServerException) as refused:
                call()
            assert refused.value.status() == str(grpc.StatusCode.PERMISSION_DENIED)
            assert "--grpc-control-on-tcp" in refused.value.message()
        assert settings(unix) == expected()  # nothing changed
        infer(tcp, "simple", {})  # and inference goes on over TCP
    finally:
        tcp.close()
