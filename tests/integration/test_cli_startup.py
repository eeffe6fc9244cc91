"""Start-up mistakes (issue 14, item 7): each is one line on stderr naming what is wrong, exit
status 2, no traceback; and a second server on a gRPC port already taken fails instead of
sharing it (grpc sets SO_REUSEPORT unless told not to). A model failing at start stops the
server unless --exit-on-error=false, and Triton's flags start it (issue 27, item 6)."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient

from inferd.examples import make_examples
from tests.integration.conftest import ServerProcess, running_server

# A server that fails at start does so within this; one that does not is killed and fails the test.
START_FAILURE_TIMEOUT_S = 60.0


def _serve(*args: str, repository: Path, python_code: str = "") -> subprocess.CompletedProcess[str]:
    """``inferd serve`` on an empty repository, with free ports unless ``args`` say otherwise;
    only errors are logged, so what stderr holds is the mistake's report."""
    launcher = (
        [
            sys.executable,
            "-c",
            f"{python_code}\nimport sys\nfrom inferd.cli import main\nsys.exit(main(sys.argv[1:]))",
        ]
        if python_code
        else [sys.executable, "-m", "inferd"]
    )
    command = [
        *launcher,
        "serve",
        "--model-repository",
        str(repository),
        "--host",
        "127.0.0.1",
        "--grpc-port",
        "0",
        "--metrics-port",
        "0",
        "--http-port",
        "0",
        "--log-format",
        "json",
        "--log-level",
        "error",
        *args,
    ]
    try:
        return subprocess.run(
            command,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=START_FAILURE_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"inferd was still running {START_FAILURE_TIMEOUT_S:.0f} s after start: {e}")


def _one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2, f"exit status {result.returncode}, stderr:\n{result.stderr}"
    assert len(lines) == 1, f"not one line on stderr:\n{result.stderr}"
    assert "Traceback" not in result.stderr
    assert lines[0].startswith("inferd serve: error: "), lines[0]
    return lines[0]


@pytest.fixture
def empty_repository(tmp_path: Path) -> Path:
    repository = tmp_path / "models"
    repository.mkdir()
    return repository


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A TCP port on 127.0.0.1 held by a listening socket (no SO_REUSEPORT)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield int(held.getsockname()[1])


def test_missing_repository_is_one_line(tmp_path: Path) -> None:
    line = _one_line_error(_serve(repository=tmp_path / "no-such-folder"))
    assert "--model-repository" in line and "no-such-folder" in line


@pytest.mark.parametrize(
    ("flag", "value"),
    [
        ("--grpc-port", "70000"),
        ("--grpc-port", "eighty"),
        ("--model-control-mode", "sometimes"),
        ("--log-level", "loud"),
        ("--grpc-unix-socket-mode", "0999"),
        ("--max-instance-count", "many"),
    ],
)
def test_bad_flag_value_is_one_line(empty_repository: Path, flag: str, value: str) -> None:
    line = _one_line_error(_serve(flag, value, repository=empty_repository))
    assert flag in line and value in line


@pytest.mark.parametrize(
    ("flag", "value", "why"),
    [
        ("--shared-memory", "some", "invalid choice"),
        ("--shared-memory-listeners", "tcp", "invalid choice"),
        ("--shared-memory-max-regions", "-1", "must be >= 0"),
        ("--shared-memory-max-bytes", "-5", "must be >= 0"),
    ],
)
def test_bad_shared_memory_setting_is_one_line_saying_why(
    empty_repository: Path, flag: str, value: str, why: str
) -> None:
    line = _one_line_error(_serve(flag, value, repository=empty_repository))
    assert flag in line and value in line and why in line, line


def test_grpc_port_in_use_is_one_line_naming_it(empty_repository: Path, taken_port: int) -> None:
    line = _one_line_error(_serve("--grpc-port", str(taken_port), repository=empty_repository))
    assert f"gRPC on 127.0.0.1:{taken_port}" in line


def test_metrics_port_in_use_is_one_line_naming_it(empty_repository: Path, taken_port: int) -> None:
    line = _one_line_error(_serve("--metrics-port", str(taken_port), repository=empty_repository))
    assert f"metrics on 127.0.0.1:{taken_port}" in line and "--metrics-port" in line


def test_a_port_in_use_fails_the_start_before_any_model_loads(
    tmp_path: Path, taken_port: int
) -> None:
    # A python model whose initialize leaves a mark: loading it would take the worker's start.
    marker = tmp_path / "initialized"
    model = tmp_path / "models" / "marks"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
    )
    (model / "1" / "model.py").write_text(
        "class TritonPythonModel:\n"
        "    def initialize(self, args):\n"
        f"        open({str(marker)!r}, 'w').write('loaded')\n"
        "    def execute(self, requests):\n"
        "        return []\n"
    )
    for flag in ("--grpc-port", "--metrics-port"):
        line = _one_line_error(_serve(flag, str(taken_port), repository=tmp_path / "models"))
        assert f"127.0.0.1:{taken_port}" in line and flag in line, line
    assert not marker.exists()
    # The same model loads when the ports are free (the mark is what a load leaves).
    with running_server(tmp_path / "models", ["marks"], tmp_path):
        assert marker.read_text() == "loaded"


def test_missing_onnxruntime_is_one_line_naming_the_install(empty_repository: Path) -> None:
    # sys.modules[name] = None: the import system reports the module as not installed.
    result = _serve(
        repository=empty_repository, python_code="import sys\nsys.modules['onnxruntime'] = None"
    )
    line = _one_line_error(result)
    assert "pip install onnxruntime" in line


def test_second_server_on_a_taken_grpc_port_fails(tmp_path: Path, empty_repository: Path) -> None:
    first_dir = tmp_path / "first"
    first_dir.mkdir()
    with running_server(empty_repository, [], first_dir) as first:
        port = first.url.rsplit(":", 1)[1]
        line = _one_line_error(_serve("--grpc-port", port, repository=empty_repository))
        assert f"gRPC on 127.0.0.1:{port}" in line
        _still_serving(first)


def _still_serving(server: ServerProcess) -> None:
    assert server.process.poll() is None, server.log()


def _broken_repository(root: Path) -> Path:
    """A repository of one good model (simple, from the examples) and one that cannot load."""
    repository = root / "models"
    make_examples(repository)
    for name in list(repository.iterdir()):
        if name.name != "simple":
            shutil.rmtree(name)
    (repository / "broken" / "1").mkdir(parents=True)
    (repository / "broken" / "1" / "model.onnx").write_bytes(b"not an ONNX model")
    return repository


def test_a_model_failing_at_start_stops_the_server_by_default(tmp_path: Path) -> None:
    started = time.monotonic()
    result = _serve(repository=_broken_repository(tmp_path))
    took_s = time.monotonic() - started
    assert result.returncode == 2, result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last == (
        "inferd serve: error: models failed to load at start: broken (see the log; "
        "--exit-on-error=false serves the others, not ready)"
    )
    assert "Traceback" not in result.stderr
    # The model's own error is logged first, naming why.
    assert "not a readable ONNX model" in result.stderr
    assert took_s < 30, f"took {took_s:.1f} s to exit"


def test_exit_on_error_false_serves_the_others_not_ready(tmp_path: Path) -> None:
    with (
        running_server(
            _broken_repository(tmp_path),
            ["simple"],
            tmp_path,
            "--exit-on-error=false",
            expected_errors=lambda record: record.get("model") == "broken",
        ) as server,
        grpcclient.InferenceServerClient(server.url) as client,
    ):
        started = next(r for r in server.records() if r.get("event") == "server started")
        assert started["models_failed"] == ["broken"] and started["models_loaded"] == ["simple"]
        assert client.is_model_ready("simple") and not client.is_server_ready()
        _still_serving(server)


def test_tritons_flags_start_the_server_and_the_ignored_ones_are_logged(tmp_path: Path) -> None:
    repository = tmp_path / "models"
    names = make_examples(repository)
    triton_flags = (
        "--allow-grpc=true",
        "--allow-http=true",
        "--strict-model-config=false",
        "--model-load-thread-count",
        "4",
        "--backend-directory=/opt/tritonserver/backends",
    )
    with running_server(repository, names, tmp_path, *triton_flags) as server:
        ignored = [r for r in server.records() if r.get("event") == "Triton flag ignored"]
        assert [r["flag"] for r in ignored] == [
            "--strict-model-config=false",
            "--model-load-thread-count 4",
            "--backend-directory=/opt/tritonserver/backends",
        ]
        assert all(r["why"] for r in ignored)
        with grpcclient.InferenceServerClient(server.url) as client:
            assert client.is_server_ready()
