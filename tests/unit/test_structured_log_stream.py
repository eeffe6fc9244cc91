"""Every line the process writes to stderr is a structured record: ONNX Runtime's own log records
(from the core's native executor) and the standard library's (the OpenTelemetry exporter's) come
out in structlog's JSON shape, at the level the operator sets. Each case runs in a subprocess, as
the server does: the log stream is the process's stderr, written by Python and by the core."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from inferd.executors.onnxruntime_native import native_onnxruntime


def run_script(script: str, *args: str) -> tuple[str, list[dict[str, Any]]]:
    """Runs ``script`` in a fresh interpreter; returns its stdout and its stderr's records,
    failing when a line of stderr is not a JSON object."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script), *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    records = []
    for line in done.stderr.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            pytest.fail(f"a line of the log stream is not JSON: {line!r}\n{done.stderr}")
        assert isinstance(record, dict), line
        assert {"event", "level", "timestamp"} <= record.keys(), line
        records.append(record)
    return done.stdout, records


ONNXRUNTIME_FAILURE = """
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from inferd.datatypes import DATATYPES
from inferd.examples import IR_VERSION, OPSET
from inferd.executors import OnnxRuntimeOptions
from inferd.executors.onnxruntime_native import NativeOnnxRuntimeExecutor
from inferd.observability.logging import configure_logging

path, level = Path(sys.argv[1]), sys.argv[2]
control = configure_logging("json", level)
# Y = TABLE[X]: an index outside 0..3 fails in ONNX Runtime, which logs the failure itself.
table = numpy_helper.from_array(np.array([10, 20, 30, 40], np.float32), "table")
graph = helper.make_graph(
    [helper.make_node("Gather", ["table", "X"], ["Y"], axis=0)],
    "gather",
    [helper.make_tensor_value_info("X", TensorProto.INT64, ["n"])],
    [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["n"])],
    initializer=[table],
)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
model.ir_version = IR_VERSION
onnx.save(model, path)
options = OnnxRuntimeOptions(intra_op_thread_count=1, inter_op_thread_count=1)
executor = NativeOnnxRuntimeExecutor(path, ["X"], ["Y"], options, [DATATYPES["FP32"].config_type])
print(executor.execute([np.array([1], np.int64)])[0].tolist())
if len(sys.argv) > 3:
    control.set_level(sys.argv[3])  # as LogSettings does at run time
try:
    executor.execute([np.array([9], np.int64)])
except Exception as e:
    print("failed:", type(e).__name__)
"""

needs_native = pytest.mark.skipif(
    native_onnxruntime().version is None, reason="ONNX Runtime's library cannot be loaded"
)


@needs_native
def test_onnxruntime_records_are_json_records(tmp_path: Path) -> None:
    stdout, records = run_script(ONNXRUNTIME_FAILURE, str(tmp_path / "gather.onnx"), "info")
    assert stdout.splitlines() == ["[20.0]", "failed: Internal"]
    ort = [r for r in records if r.get("logger") == "onnxruntime"]
    assert ort, records
    failure = ort[-1]
    assert failure["level"] == "error"
    assert "Gather" in str(failure["event"])
    assert str(failure["timestamp"]).endswith("Z")
    assert {"category", "code_location"} <= failure.keys()
    # ONNX Runtime's info records are debug ones: not at the default level.
    assert all(r["level"] in ("warning", "error", "critical") for r in ort), ort


PYTHON_API_FAILURE = (
    ONNXRUNTIME_FAILURE.replace(
        "from inferd.executors.onnxruntime_native import NativeOnnxRuntimeExecutor",
        "from inferd.executors.onnxruntime import OnnxRuntimeExecutor",
    )
    .replace(
        "executor = NativeOnnxRuntimeExecutor(",
        "executor = OnnxRuntimeExecutor(",
    )
    .replace(
        ', options, [DATATYPES["FP32"].config_type])',
        ", options)",
    )
)


def test_onnxruntime_python_api_writes_no_unstructured_lines(tmp_path: Path) -> None:
    """The Python API's sessions (GPU instances, and CPU ones where the native library cannot
    load) cannot be given a logging function: they keep only fatal records, and the failure
    reaches inferd as an exception."""
    assert PYTHON_API_FAILURE != ONNXRUNTIME_FAILURE
    stdout, records = run_script(PYTHON_API_FAILURE, str(tmp_path / "gather.onnx"), "debug")
    assert stdout.splitlines()[0] == "[20.0]"
    assert stdout.splitlines()[1].startswith("failed: "), stdout
    assert not [r for r in records if r.get("logger") == "onnxruntime"], records


@needs_native
def test_onnxruntime_records_below_the_level_are_dropped(tmp_path: Path) -> None:
    stdout, records = run_script(ONNXRUNTIME_FAILURE, str(tmp_path / "gather.onnx"), "critical")
    assert stdout.splitlines() == ["[20.0]", "failed: Internal"]
    assert records == []


@needs_native
def test_a_level_set_at_run_time_applies_to_onnxruntime_records(tmp_path: Path) -> None:
    path = str(tmp_path / "gather.onnx")
    stdout, records = run_script(ONNXRUNTIME_FAILURE, path, "info", "critical")
    assert stdout.splitlines() == ["[20.0]", "failed: Internal"]
    assert [r for r in records if r.get("logger") == "onnxruntime"] == []


@needs_native
def test_onnxruntime_info_records_appear_at_debug(tmp_path: Path) -> None:
    _, records = run_script(ONNXRUNTIME_FAILURE, str(tmp_path / "gather.onnx"), "debug")
    levels = {r["level"] for r in records if r.get("logger") == "onnxruntime"}
    assert {"debug", "error"} <= levels, records


OTLP_EXPORT_FAILURE = """
import logging
import socket
import sys

from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from inferd.observability.logging import configure_logging

control = configure_logging("json", sys.argv[1])
closed = socket.socket()
closed.bind(("127.0.0.1", 0))
port = closed.getsockname()[1]
closed.close()  # nothing listens there: every export fails
exporter = OTLPSpanExporter(endpoint=f"127.0.0.1:{port}", insecure=True, timeout=1)
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
provider.get_tracer("test").start_span("lost").end()
provider.shutdown()
logging.getLogger("some.library").warning("a %s record", "stdlib")
control.set_level("error")  # as LogSettings does at run time
logging.getLogger("some.library").warning("dropped")
"""


def test_opentelemetry_exporter_records_are_json_records() -> None:
    _, records = run_script(OTLP_EXPORT_FAILURE, "info")
    exporter = [r for r in records if str(r.get("logger", "")).startswith("opentelemetry")]
    assert exporter, records
    assert any("export" in str(r["event"]).lower() for r in exporter), exporter
    library = [r for r in records if r.get("logger") == "some.library"]
    assert [(r["event"], r["level"]) for r in library] == [("a stdlib record", "warning")]


def test_stdlib_records_below_the_level_are_dropped() -> None:
    _, records = run_script(OTLP_EXPORT_FAILURE, "critical")
    assert records == []


ONE_WRITE_PER_RECORD = """
import json
import logging
import sys

import structlog

from inferd.observability.logging import configure_logging


class RecordingStream:
    # What the stream was handed, call by call.
    def __init__(self) -> None:
        self.writes: list[str] = []

    def write(self, text: str) -> int:
        self.writes.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


stream = RecordingStream()
sys.stderr = stream
configure_logging("json", "info")
structlog.get_logger().info("a structlog record", n=1)
logging.getLogger("some.library").warning("a stdlib record")
sys.stderr = sys.__stderr__
print(json.dumps(stream.writes))
"""


def test_each_record_is_one_write_of_the_whole_line() -> None:
    # The core writes its records to the same descriptor with write(2), from other threads: a
    # record handed to the stream in two writes (print's line, then its newline) could have a
    # core line land between them, and both be lost to a reader of JSON lines.
    stdout, _ = run_script(ONE_WRITE_PER_RECORD)
    writes = json.loads(stdout)
    assert len(writes) == 2, writes
    for text in writes:
        assert text.endswith("\n") and text.count("\n") == 1, writes
        assert json.loads(text)["event"] in ("a structlog record", "a stdlib record")
