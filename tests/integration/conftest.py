"""One inferd server for the whole integration session, reached over a real gRPC connection.

The session fixture writes a model repository (the examples, an identity model per protocol
datatype and one identity model without batching), starts ``python -m inferd serve`` as a
subprocess on a free port, and stops it with SIGTERM at the end, checking that it exits cleanly.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import signal
import subprocess
import sys
import time
import urllib.request
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.grpc import service_pb2_grpc

from inferd.examples import DATATYPES, make_examples, write_identity_model

# The server's RSS under AddressSanitizer (`make test-asan-python` preloads libasan into it) is
# ASan's allocator's: freed memory waits in its quarantine and malloc_trim is not glibc's. Memory
# bounds are checked by the plain run.
UNDER_ASAN = "libasan" in os.environ.get("LD_PRELOAD", "")
without_asan = pytest.mark.skipif(
    UNDER_ASAN,
    reason="RSS bounds are checked without AddressSanitizer (its quarantine holds freed memory)",
)

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 30.0

# pytest's filterwarnings ("error") cannot see into the server subprocess, so the server runs with
# every Python warning shown (PYTHONWARNINGS=default: ResourceWarning and DeprecationWarning
# included) and its stderr is checked for them, and for exceptions ignored in __del__ and the
# like, when it stops. A warning line reads "path:line: SomeWarning: message"; JSON records
# start with "{" and never match.
PYTHON_WARNING = re.compile(
    r"^(?:[^{\n].*?:\d+: \w*Warning: |Exception ignored in).*$", re.MULTILINE
)

# Every protocol datatype, with its identity model's name (identity_<datatype lowercase>).
ALL_DATATYPES: list[str] = list(DATATYPES)
NO_BATCH_MODEL = "identity_nobatch"


def identity_model(datatype: str) -> str:
    return f"identity_{datatype.lower()}"


def _write_repository(root: Path) -> list[str]:
    names = make_examples(root)
    for datatype in ALL_DATATYPES:
        name = identity_model(datatype)
        if name not in names:  # identity_fp32 (no config) and identity_bytes come from examples
            write_identity_model(root / name, datatype)
            names.append(name)
    write_identity_model(root / NO_BATCH_MODEL, "FP32", max_batch_size=0)
    names.append(NO_BATCH_MODEL)
    return sorted(names)


def _records(log_path: Path) -> list[dict[str, object]]:
    """The JSON records of the server's log (other lines, such as tracebacks, are skipped)."""
    records: list[dict[str, object]] = []
    for line in log_path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def _started_record(log_path: Path) -> dict[str, object] | None:
    """The "server started" record in the server's log, if it is there yet."""
    for record in _records(log_path):
        if record.get("event") == "server started":
            return record
    return None


def _limit_open_files(limit: tuple[int, int]) -> Callable[[], None]:
    def limit_in_child() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, limit)

    return limit_in_child


class ServerProcess:
    """A running ``inferd serve`` and its captured stderr."""

    def __init__(
        self,
        process: subprocess.Popen[bytes],
        log_path: Path,
        repository: Path,
        models: list[str],
    ) -> None:
        self.process = process
        self.log_path = log_path
        self.repository = repository
        self.models = models
        self.url = ""
        self.http_url = ""  # host:port of the HTTP/REST listener
        self.metrics_url = ""
        self.unix_socket = Path()

    def log(self) -> str:
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def records(self) -> list[dict[str, object]]:
        """The server's JSON log records so far."""
        return _records(self.log_path)

    def pending(self, model: str) -> int:
        """The model's queued requests now (``nv_inference_pending_request_count``)."""
        with urllib.request.urlopen(self.metrics_url, timeout=10) as response:
            text = response.read().decode()
        for family in text_string_to_metric_families(text):
            if family.name == "nv_inference_pending_request_count":
                for sample in family.samples:
                    if sample.labels.get("model") == model:
                        return int(sample.value)
        return 0

    def wait_for_pending(self, model: str, count: int, timeout_s: float = 30.0) -> None:
        """Wait until ``count`` requests are queued for the model."""
        deadline = time.monotonic() + timeout_s
        while self.pending(model) != count:
            assert time.monotonic() < deadline, f"{model}: never {count} queued"
            time.sleep(0.005)  # the poll's period


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    """Polls ``condition`` until it holds; fails naming ``what`` after ``timeout_s``. For
    conditions that stay true once they hold (a count reached, a record written)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"never {what} (waited {timeout_s:.0f} s)"
        time.sleep(0.01)  # the poll's period


@contextlib.contextmanager
def running_server(
    repository: Path,
    models: list[str],
    workdir: Path,
    *extra_args: str,
    env_extra: dict[str, str] | None = None,
    expected_errors: Callable[[dict[str, object]], bool] | None = None,
    control_on_tcp: bool = True,
    open_file_limit: tuple[int, int] | None = None,
) -> Iterator[ServerProcess]:
    """``inferd serve`` on ``repository`` as a subprocess, until the block ends; then SIGTERM,
    and the exit code and the error-level log records are checked (``expected_errors``: those
    a test causes on purpose). ``control_on_tcp``: the tests load, unload and set logs over the
    TCP port (``--grpc-control-on-tcp``), which a server answers only on its Unix socket by
    default. ``open_file_limit``: the server's RLIMIT_NOFILE at start, (soft, hard)."""
    log_path = workdir / "server.log"
    # Hermetic: the caller's INFERD_* and OTEL_* settings must not change the server under test.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INFERD_", "OTEL_"))}
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONWARNINGS"] = "default"  # see PYTHON_WARNING
    env.update(env_extra or {})
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
        str(workdir / "inferd.sock"),
        "--metrics-port",
        "0",  # a free port: test servers run side by side
        "--http-port",
        "0",
        *(["--grpc-control-on-tcp"] if control_on_tcp else []),
        *extra_args,
    ]
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            command,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=log_file,
            env=env,
            preexec_fn=None if open_file_limit is None else _limit_open_files(open_file_limit),
        )
    running = ServerProcess(process, log_path, repository, models)
    running.unix_socket = workdir / "inferd.sock"
    deadline = time.monotonic() + START_TIMEOUT_S
    try:
        while (started := _started_record(log_path)) is None:
            if process.poll() is not None:
                pytest.fail(
                    f"inferd exited with code {process.returncode} before it started:\n"
                    f"{running.log()}"
                )
            if time.monotonic() > deadline:
                pytest.fail(
                    f"inferd did not start within {START_TIMEOUT_S:.0f} s:\n{running.log()}"
                )
            time.sleep(0.05)
    except BaseException:
        process.kill()
        process.wait()
        raise
    running.url = f"127.0.0.1:{started['port']}"
    if started.get("http_port") is not None:
        running.http_url = f"127.0.0.1:{started['http_port']}"
    if started.get("metrics_port") is not None:
        running.metrics_url = f"http://127.0.0.1:{started['metrics_port']}/metrics"

    try:
        yield running
    except BaseException:
        # The test failed inside the block: the server (and its python workers, which end with
        # their channel) must not outlive it and confuse the tests after it.
        process.kill()
        process.wait()
        raise

    process.send_signal(signal.SIGTERM)
    try:
        code = process.wait(timeout=STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        pytest.fail(
            f"inferd did not stop within {STOP_TIMEOUT_S:.0f} s of SIGTERM:\n{running.log()}"
        )
    assert code == 0, f"inferd exited with code {code} after SIGTERM:\n{running.log()}"
    # Bad requests are answered, not logged as failures: an error record means a server bug
    # (an unexpected exception in a handler answers INTERNAL and is logged at "error").
    problems = [
        r
        for r in _records(log_path)
        if r.get("level") in ("error", "critical")
        and not (expected_errors is not None and expected_errors(r))
    ]
    assert not problems, "inferd logged errors:\n" + "\n".join(json.dumps(r) for r in problems)
    warned = PYTHON_WARNING.findall(running.log())
    assert not warned, "inferd emitted Python warnings:\n" + "\n".join(warned)


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("integration")
    repository = root / "models"
    models = _write_repository(repository)
    with running_server(repository, models, root) as running:
        yield running


@pytest.fixture(scope="session")
def url(server: ServerProcess) -> str:
    """host:port of the running server."""
    return server.url


@pytest.fixture(scope="session")
def server_models(server: ServerProcess) -> list[str]:
    """Names of every model in the served repository, sorted."""
    return server.models


@pytest.fixture(scope="session")
def repository(server: ServerProcess) -> Path:
    """The served model repository."""
    return server.repository


@pytest.fixture
def client(url: str) -> Iterator[grpcclient.InferenceServerClient]:
    """tritonclient's gRPC client; one per test, so a test's stream cannot leak into another."""
    triton = grpcclient.InferenceServerClient(url=url)
    try:
        yield triton
    finally:
        triton.close()


@pytest.fixture(scope="session")
def channel(url: str) -> Iterator[grpc.Channel]:
    """A plain gRPC channel, for what tritonclient cannot send (typed contents, bad raw data)."""
    with grpc.insecure_channel(url) as plain:
        yield plain


@pytest.fixture(scope="session")
def stub(channel: grpc.Channel) -> service_pb2_grpc.GRPCInferenceServiceStub:
    return service_pb2_grpc.GRPCInferenceServiceStub(channel)


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    """A generator seeded from the test's id: reproducible, and different in every test."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


SimpleCheck = Callable[[grpcclient.InferenceServerClient], None]


@pytest.fixture
def assert_serving(rng: np.random.Generator) -> SimpleCheck:
    """Sends a good request to ``simple`` and checks its sum and difference: the server is still
    serving correctly (used after every error)."""

    def check(triton: grpcclient.InferenceServerClient) -> None:
        a = rng.integers(-1000, 1000, size=(2, 16), dtype=np.int32)
        b = rng.integers(-1000, 1000, size=(2, 16), dtype=np.int32)
        inputs = [
            grpcclient.InferInput("INPUT0", [2, 16], "INT32"),
            grpcclient.InferInput("INPUT1", [2, 16], "INT32"),
        ]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        result = triton.infer("simple", inputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)

    return check
