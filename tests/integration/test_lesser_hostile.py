"""Issue 25's lesser items, each as a hostile client would find it, through tritonclient against
a real server: config fields out of the core's range, the "server started" record in explicit
mode, the generate example asked for 2^31-1 tokens and cancelled, and a Unix socket flag written
as ``unix:PATH``."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from inferd.examples import make_examples
from tests.integration.conftest import ServerProcess, running_server

# In the repository but broken: one the server is asked to load, one it is not.
REQUESTED_BROKEN = "requested_broken"
UNREQUESTED_BROKEN = "unrequested_broken"
STARTUP_MODELS = ["simple", "generate", REQUESTED_BROKEN]


def is_expected_error(record: dict[str, object]) -> bool:
    """The requested broken model's failed load, and generate's refusal of too many tokens: a
    python model's error response is logged as INTERNAL whatever its TritonError code."""
    text = json.dumps(record)
    return REQUESTED_BROKEN in text or "more than this model generates" in text


@pytest.fixture(scope="module")
def explicit_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("lesser")
    repository = root / "models"
    names = make_examples(repository)
    for broken in (REQUESTED_BROKEN, UNREQUESTED_BROKEN):
        (repository / broken / "1").mkdir(parents=True)
        (repository / broken / "config.pbtxt").write_text("not a config {\n")
    with running_server(
        repository,
        names,
        root,
        "--model-control-mode",
        "explicit",
        "--load-model",
        ",".join(STARTUP_MODELS),
        "--exit-on-error=false",
        expected_errors=is_expected_error,
    ) as server:
        yield server


@pytest.fixture
def client(explicit_server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    triton = grpcclient.InferenceServerClient(explicit_server.url)
    try:
        yield triton
    finally:
        triton.close()


def assert_simple_serves(client: grpcclient.InferenceServerClient) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [
        grpcclient.InferInput("INPUT0", [1, 16], "INT32"),
        grpcclient.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(a)
    result = client.infer("simple", inputs, client_timeout=10)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)


def simple_override(**fields: object) -> str:
    return json.dumps({"max_batch_size": 8, **fields})


# Each crossed into the core as a narrower C++ integer (pybind11's TypeError text reached the
# client) or overflowed the core's clock arithmetic (loaded as is).
OUT_OF_RANGE = {
    "priority_levels": (
        simple_override(dynamic_batching={"priority_levels": 2**40, "default_priority_level": 1}),
        f"dynamic_batching.priority_levels {2**40} is outside 0..1024",
    ),
    "max_queue_delay": (
        simple_override(dynamic_batching={"max_queue_delay_microseconds": str(2**64 - 1)}),
        f"dynamic_batching.max_queue_delay_microseconds {2**64 - 1} is outside 0..86400000000",
    ),
    # Not a C++ integer, but 2^31-1 placements were listed (16 GB) before the limit was checked.
    "instances": (
        simple_override(instance_group=[{"kind": "KIND_CPU", "count": 2**31 - 1}]),
        f"ask for {2**31 - 1} instances, more than the server's limit of 16 (--max-instance-count)",
    ),
    "threads": (
        simple_override(parameters={"intra_op_thread_count": {"string_value": str(2**40)}}),
        f"parameter 'intra_op_thread_count' {2**40} is outside 0..1024",
    ),
}


@pytest.mark.parametrize("case", sorted(OUT_OF_RANGE))
def test_a_config_field_out_of_the_cores_range_is_refused_in_our_words(
    client: grpcclient.InferenceServerClient, case: str
) -> None:
    override, message = OUT_OF_RANGE[case]
    with pytest.raises(InferenceServerException) as refused:
        client.load_model("simple", config=override)
    assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert message in refused.value.message(), refused.value.message()
    assert "TypeError" not in refused.value.message()
    assert_simple_serves(client)  # the failed reload left the old version serving


def test_a_default_priority_level_without_levels_is_ignored_as_in_triton(
    client: grpcclient.InferenceServerClient,
) -> None:
    """Before: 2^40 crossed into the core's uint32 and failed the load with a TypeError."""
    override = simple_override(dynamic_batching={"default_priority_level": str(2**40)})
    try:
        client.load_model("simple", config=override)
        assert_simple_serves(client)
    finally:
        client.load_model("simple")


def test_models_failed_names_only_the_models_asked_for(explicit_server: ServerProcess) -> None:
    """Before: every model of the repository not loaded at start, asked for or not."""
    (started,) = [r for r in explicit_server.records() if r.get("event") == "server started"]
    assert started["models_loaded"] == ["generate", "simple"], started
    assert started["models_failed"] == [REQUESTED_BROKEN], started


GENERATE_LIMIT = 1_000_000  # the example's MAX_TOKENS_LIMIT
RSS_SLACK_BYTES = 50 << 20  # before the fix the worker grew ~70 MB/s, cancelled or not


def generate_inputs(prompt: bytes, max_tokens: int) -> list[grpcclient.InferInput]:
    tensors = [
        grpcclient.InferInput("PROMPT", [1], "BYTES"),
        grpcclient.InferInput("MAX_TOKENS", [1], "INT32"),
    ]
    tensors[0].set_data_from_numpy(np.array([prompt], dtype=np.object_))
    tensors[1].set_data_from_numpy(np.array([max_tokens], dtype=np.int32))
    return tensors


def descends_from(pid: int, ancestor: int) -> bool:
    for _ in range(8):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            return False
        pid = int(status.split("PPid:")[1].split()[0])
        if pid == ancestor:
            return True
    return False


def worker_rss(server: ServerProcess, instance: str) -> int:
    """Resident bytes of the server's python worker for ``instance``."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if instance.encode() in argv and descends_from(int(entry.name), server.process.pid):
            return int((entry / "statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    pytest.fail(f"no worker for {instance}")


def stream_generate(
    client: grpcclient.InferenceServerClient, prompt: bytes, max_tokens: int
) -> queue.Queue[tuple[grpcclient.InferResult | None, Exception | None]]:
    answers: queue.Queue[tuple[grpcclient.InferResult | None, Exception | None]] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    client.async_stream_infer("generate", generate_inputs(prompt, max_tokens))
    return answers


def assert_generates(client: grpcclient.InferenceServerClient, words: list[bytes]) -> None:
    """One whole generation on a new stream, its tokens as asked (the instance is free)."""
    answers = stream_generate(client, b" ".join(words), len(words))
    tokens = []
    for _ in words:
        result, error = answers.get(timeout=30)
        assert error is None and result is not None, error
        tokens.append(result.as_numpy("TOKEN")[0])
    client.stop_stream()
    assert tokens == words


def test_generate_refuses_max_tokens_past_its_limit_without_growing(
    explicit_server: ServerProcess, client: grpcclient.InferenceServerClient
) -> None:
    """Before: the worker built a list of 2^31-1 tokens (~70 MB/s) and never answered."""
    before = worker_rss(explicit_server, "generate_0")
    answers = stream_generate(client, b"a b", 2**31 - 1)
    result, error = answers.get(timeout=30)
    client.stop_stream()
    assert result is None and error is not None
    assert f"MAX_TOKENS {2**31 - 1} is more than this model generates ({GENERATE_LIMIT})" in str(
        error
    )
    assert worker_rss(explicit_server, "generate_0") < before + RSS_SLACK_BYTES
    assert_generates(client, [b"a", b"b"])


def test_a_cancelled_generation_stops(
    explicit_server: ServerProcess, client: grpcclient.InferenceServerClient
) -> None:
    """A million tokens take minutes; cancelled after three, the one instance is free at once
    (before: it generated on, and the worker grew, after the client had gone)."""
    before = worker_rss(explicit_server, "generate_0")
    answers = stream_generate(client, b"to be or not", GENERATE_LIMIT)
    for _ in range(3):
        _, error = answers.get(timeout=30)
        assert error is None, error
    client.stop_stream(cancel_requests=True)
    assert_generates(client, [b"to", b"be"])
    assert worker_rss(explicit_server, "generate_0") < before + RSS_SLACK_BYTES


@pytest.mark.parametrize("scheme", ["unix:", "unix://"])
def test_a_unix_socket_flag_written_as_grpc_writes_it_is_served(
    tmp_path: Path, scheme: str
) -> None:
    """Before: ``--grpc-unix-socket unix:/p`` stopped the start ("unix:unix:/p")."""
    socket_path = tmp_path / "flag.sock"
    names = make_examples(tmp_path / "models")
    address = f"{scheme}{socket_path}"
    with running_server(tmp_path / "models", names, tmp_path, "--grpc-unix-socket", address):
        assert socket_path.is_socket()
        client = grpcclient.InferenceServerClient(f"unix:{socket_path}")
        try:
            assert_simple_serves(client)
        finally:
            client.close()
        # `inferd health` reads the same variable as the server: unix:PATH there too.
        health = subprocess.run(
            [sys.executable, "-m", "inferd", "health"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
            env={"INFERD_GRPC_UNIX_SOCKET": address, "PATH": "/usr/bin:/bin"},
        )
        assert health.returncode == 0, health
        assert health.stdout.startswith(f"unix:{socket_path} "), health.stdout
