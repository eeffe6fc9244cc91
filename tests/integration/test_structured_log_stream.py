"""The server's log stream is all JSON records after an ONNX Runtime failure and an OTLP export
failure, and the request that failed with INTERNAL has exactly one record, naming the model,
version, request id, trace id and reason.

Runs its own server subprocess: the shared ``running_server`` fails a server that logged at error
level, which this server must."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
from onnx import TensorProto, helper, numpy_helper
from tritonclient.utils import InferenceServerException

from inferd.examples import IR_VERSION, OPSET
from inferd.executors.onnxruntime_native import native_onnxruntime

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


def write_gather_model(model_dir: Path) -> None:
    (model_dir / "1").mkdir(parents=True)
    table = numpy_helper.from_array(np.array([10, 20, 30, 40], np.float32), "table")
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "INPUT0"], ["OUTPUT0"], axis=0)],
        "gather",
        [helper.make_tensor_value_info("INPUT0", TensorProto.INT64, ["batch", 1])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", 1])],
        initializer=[table],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    onnx.save(model, model_dir / "1" / "model.onnx")
    (model_dir / "config.pbtxt").write_text(GATHER_CONFIG)


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


def test_the_log_stream_is_structured_and_an_internal_failure_has_one_record(
    tmp_path: Path,
) -> None:
    repository = tmp_path / "models"
    write_gather_model(repository / "gather")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INFERD_", "OTEL_"))}
    env.update(
        PYTHONUNBUFFERED="1",
        OTEL_BSP_SCHEDULE_DELAY="100",  # ms: export soon after the request
        OTEL_EXPORTER_OTLP_TRACES_TIMEOUT="1",  # s: give up on the closed port quickly
    )
    log_path = tmp_path / "server.log"
    command = [
        sys.executable,
        "-m",
        "inferd",
        "serve",
        "--model-repository",
        str(repository),
        "--grpc-port",
        "0",
        "--host",
        "127.0.0.1",
        "--log-format",
        "json",
        "--grpc-unix-socket",
        str(tmp_path / "inferd.sock"),
        "--metrics-port",
        "-1",
        "--trace-config",
        f"endpoint=127.0.0.1:{closed_port()}",
    ]
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            command, stdin=subprocess.DEVNULL, stdout=log_file, stderr=log_file, env=env
        )
    try:
        deadline = time.monotonic() + 60
        started = None
        while started is None:
            assert process.poll() is None, log_path.read_text()
            assert time.monotonic() < deadline, log_path.read_text()
            time.sleep(0.05)
            for line in log_path.read_text().splitlines():
                if '"server started"' in line:
                    started = json.loads(line)
        with grpcclient.InferenceServerClient(f"127.0.0.1:{started['port']}") as client:
            tensor = grpcclient.InferInput("INPUT0", [1, 1], "INT64")
            tensor.set_data_from_numpy(np.array([[9]], np.int64))
            with pytest.raises(InferenceServerException) as failed:
                client.infer(
                    "gather", [tensor], request_id="req-1", headers={"traceparent": TRACEPARENT}
                )
            assert failed.value.status() == "StatusCode.INTERNAL"
        time.sleep(2.5)  # the span's export fails meanwhile
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            code = process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise
    lines = log_path.read_text().splitlines()
    assert code == 0, "\n".join(lines)
    records = records_of(lines)

    failures = [r for r in records if r.get("event") == "request failed"]
    assert len(failures) == 1, records
    failure = failures[0]
    assert failure["level"] == "error"
    assert (failure["model"], failure["version"]) == ("gather", "1")
    assert failure["request_id"] == "req-1"
    assert failure["trace_id"] == CALLER_TRACE
    assert "Gather" in str(failure["reason"]) or "indices" in str(failure["reason"]), failure

    assert any(r.get("logger") == "onnxruntime" for r in records), records
    exporter = [r for r in records if str(r.get("logger", "")).startswith("opentelemetry")]
    assert exporter, records
