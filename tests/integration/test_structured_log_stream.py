"""The server's log stream is all JSON records after an ONNX Runtime failure and an OTLP export
failure, and the request that failed with INTERNAL has exactly one record, naming the model,
version, request id, trace id and reason.

The server logs these failures at error level on purpose: ``running_server`` excuses exactly
those records (``caused_here``) and still fails on any other."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from inferd.executors.onnxruntime_native import native_onnxruntime
from tests.integration.conftest import running_server, wait_until
from tests.integration.gather_model import write_gather_model

CALLER_TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
TRACEPARENT = f"00-{CALLER_TRACE}-00f067aa0ba902b7-01"

# OUTPUT0 = TABLE[INPUT0]: an index outside 0..3 fails in ONNX Runtime (INTERNAL).
GATHER_CONFIG = """
max_batch_size: 4
input [ { name: "INPUT0" data_type: TYPE_INT64 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

pytestmark = pytest.mark.skipif(
    native_onnxruntime().version is None, reason="ONNX Runtime's library cannot be loaded"
)


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port  # closed again: nothing listens there


def records_of(lines: list[str]) -> list[dict[str, Any]]:
    records = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            pytest.fail(f"a line of the server's log is not JSON: {line!r}\n" + "\n".join(lines))
        assert isinstance(record, dict), line
        records.append(record)
    return records


def caused_here(record: dict[str, object]) -> bool:
    """The error records this test causes: the gather model's failure (ONNX Runtime's record and
    inferd's) and the exporter's failed exports."""
    logger = str(record.get("logger", ""))
    return (
        record.get("model") == "gather"
        or logger in ("onnxruntime",)
        or (logger.startswith("opentelemetry"))
    )


# Traced, the request goes through Python (its span); untraced, the core's transport answers it
# alone: each writes the one record.
@pytest.mark.parametrize("traced", [True, False], ids=["traced", "core-transport-alone"])
def test_the_log_stream_is_structured_and_an_internal_failure_has_one_record(
    tmp_path: Path, traced: bool
) -> None:
    repository = tmp_path / "models"
    write_gather_model(repository / "gather", GATHER_CONFIG)
    env = {
        "OTEL_BSP_SCHEDULE_DELAY": "100",  # ms: export soon after the request
        "OTEL_EXPORTER_OTLP_TRACES_TIMEOUT": "1",  # s: give up on the closed port quickly
    }
    trace_config = ("--trace-config", f"endpoint=127.0.0.1:{closed_port()}") if traced else ()
    with running_server(
        repository, ["gather"], tmp_path, *trace_config, env_extra=env, expected_errors=caused_here
    ) as server:
        with grpcclient.InferenceServerClient(server.url) as client:
            tensor = grpcclient.InferInput("INPUT0", [1, 1], "INT64")
            tensor.set_data_from_numpy(np.array([[9]], np.int64))
            with pytest.raises(InferenceServerException) as failed:
                client.infer(
                    "gather", [tensor], request_id="req-1", headers={"traceparent": TRACEPARENT}
                )
            assert failed.value.status() == "StatusCode.INTERNAL"
        if traced:  # the span's export fails: the exporter's record of it
            wait_until(
                lambda: any(
                    str(r.get("logger", "")).startswith("opentelemetry") for r in server.records()
                ),
                "a record of the failed export",
            )
    records = records_of(server.log().splitlines())

    failures = [r for r in records if r.get("event") == "request failed"]
    assert len(failures) == 1, records
    failure = failures[0]
    assert failure["level"] == "error"
    assert (failure["model"], failure["version"]) == ("gather", "1")
    assert failure["request_id"] == "req-1"
    assert failure["trace_id"] == CALLER_TRACE
    assert "Gather" in str(failure["reason"]) or "indices" in str(failure["reason"]), failure

    assert any(r.get("logger") == "onnxruntime" for r in records), records
    if not traced:
        return
    exporter = [r for r in records if str(r.get("logger", "")).startswith("opentelemetry")]
    assert exporter, records
