"""Explicit model control through tritonclient: load, reload with a config override and unload
while traffic flows, with no request lost or failed; versions side by side; safety."""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from inferd.examples import make_examples
from tests.integration.conftest import ServerProcess, running_server, wait_until
from tests.integration.ensemble_models import write_base


@pytest.fixture(scope="module")
def explicit_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("control")
    repository = root / "models"
    names = make_examples(repository)
    # A second version of identity_fp32, served beside the first.
    shutil.copytree(repository / "identity_fp32" / "1", repository / "identity_fp32" / "2")
    (repository / "identity_fp32" / "config.pbtxt").write_text("version_policy { all { } }\n")
    with running_server(
        repository, names, root, "--model-control-mode", "explicit", "--load-model", "simple"
    ) as server:
        yield server


@pytest.fixture
def triton(explicit_server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(explicit_server.url)
    try:
        yield client
    finally:
        client.close()


def simple_inputs(value: int) -> tuple[list[grpcclient.InferInput], np.ndarray]:
    a = np.full((1, 16), value, dtype=np.int32)
    inputs = [
        grpcclient.InferInput("INPUT0", [1, 16], "INT32"),
        grpcclient.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(a)
    return inputs, a * 2


class SimpleTraffic:
    """Client threads sending distinct requests to ``simple`` and checking every answer, for as
    long as the block runs; then ``failures`` (wrong answers and errors) and ``answered``."""

    def __init__(self, url: str, clients: int) -> None:
        self.url = url
        self.failures: list[str] = []
        self.answered = 0
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._send, args=(i * 1000,)) for i in range(clients)
        ]

    def __enter__(self) -> SimpleTraffic:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()

    def wait_for_more(self, count: int = 10) -> None:
        """Until ``count`` more answers than now have come (or a request failed)."""
        target = self.answered + count
        wait_until(lambda: bool(self.failures) or self.answered >= target, f"{count} more answers")

    def _send(self, value: int) -> None:
        client = grpcclient.InferenceServerClient(self.url)
        try:
            while not self._stop.is_set():
                inputs, expected = simple_inputs(value)
                try:
                    result = client.infer("simple", inputs)
                    if not np.array_equal(result.as_numpy("OUTPUT0"), expected):
                        self.failures.append(f"wrong answer for {value}")
                    self.answered += 1
                except InferenceServerException as e:
                    self.failures.append(str(e))
                value += 1
        finally:
            client.close()


def index(client: grpcclient.InferenceServerClient) -> dict[tuple[str, str], str]:
    return {(m.name, m.version): m.state for m in client.get_model_repository_index().models}


def test_only_the_named_model_loads_at_start(triton: grpcclient.InferenceServerClient) -> None:
    states = index(triton)
    assert states[("simple", "1")] == "READY"
    assert states[("mlp", "")] == "UNAVAILABLE"
    assert not triton.is_model_ready("mlp")
    assert triton.is_server_ready()


def test_load_serves_every_version_and_unload_drains(
    triton: grpcclient.InferenceServerClient,
) -> None:
    triton.load_model("identity_fp32")
    assert triton.is_model_ready("identity_fp32", "1")
    assert triton.is_model_ready("identity_fp32", "2")
    assert triton.get_model_metadata("identity_fp32").versions == ["1", "2"]
    values = np.arange(6, dtype=np.float32).reshape(2, 3)
    for version in ("1", "2", ""):
        tensor = grpcclient.InferInput("INPUT0", [2, 3], "FP32")
        tensor.set_data_from_numpy(values)
        result = triton.infer("identity_fp32", [tensor], model_version=version)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), values)
        assert result.get_response().model_version == (version or "2")
    triton.unload_model("identity_fp32")
    assert not triton.is_model_ready("identity_fp32")
    with pytest.raises(InferenceServerException) as gone:
        tensor = grpcclient.InferInput("INPUT0", [2, 3], "FP32")
        tensor.set_data_from_numpy(values)
        triton.infer("identity_fp32", [tensor])
    assert gone.value.status() in ("StatusCode.UNAVAILABLE", "StatusCode.NOT_FOUND")
    assert index(triton)[("identity_fp32", "1")] == "UNAVAILABLE"
    assert triton.is_server_ready()  # an unloaded model is not one that should be serving


def test_reloads_under_traffic_lose_no_request(
    triton: grpcclient.InferenceServerClient, explicit_server: ServerProcess
) -> None:
    with SimpleTraffic(explicit_server.url, clients=4) as traffic:
        triton.load_model("simple")  # reload as it is
        override = {
            "max_batch_size": 8,
            "input": [
                {"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [16]},
                {"name": "INPUT1", "data_type": "TYPE_INT32", "dims": [16]},
            ],
            "output": [
                {"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [16]},
                {"name": "OUTPUT1", "data_type": "TYPE_INT32", "dims": [16]},
            ],
            "dynamic_batching": {"max_queue_delay_microseconds": "500"},
            "instance_group": [{"count": 2, "kind": "KIND_CPU"}],
        }
        triton.load_model("simple", config=json.dumps(override))  # reload with another config
        config = triton.get_model_config("simple").config
        assert config.dynamic_batching.max_queue_delay_microseconds == 500
        assert config.instance_group[0].count == 2
        triton.load_model("simple")  # and back to config.pbtxt (no scheduler: the default one)
        config = triton.get_model_config("simple").config
        assert config.dynamic_batching.max_queue_delay_microseconds == 0
        assert config.instance_group[0].count == 1
    assert traffic.failures == []
    assert traffic.answered > 10  # traffic really flowed across the reloads


def freed_versions(server: ServerProcess, model: str) -> list[int]:
    """Versions of ``model`` whose executors the server's log says it closed."""
    return [
        int(str(r["version"]))
        for r in server.records()
        if r.get("event") == "model version freed" and r.get("model") == model
    ]


def test_a_new_version_replaces_the_old_under_traffic(
    triton: grpcclient.InferenceServerClient, explicit_server: ServerProcess
) -> None:
    model_dir = explicit_server.repository / "simple"
    freed_before = freed_versions(explicit_server, "simple").count(1)
    shutil.copytree(model_dir / "1", model_dir / "2")
    try:
        with SimpleTraffic(explicit_server.url, clients=4) as traffic:
            traffic.wait_for_more()  # traffic before the change, and after it
            triton.load_model("simple")  # the policy (latest 1) now selects version 2
            assert triton.get_model_metadata("simple").versions == ["2"]
            assert not triton.is_model_ready("simple", "1")
            traffic.wait_for_more()
        assert traffic.failures == []
        assert traffic.answered > 10
        # v1's executors were closed once it drained.
        assert freed_versions(explicit_server, "simple").count(1) == freed_before + 1
    finally:
        shutil.rmtree(model_dir / "2")
        triton.load_model("simple")
    assert triton.get_model_metadata("simple").versions == ["1"]


def test_a_failed_reload_leaves_the_old_version_serving(
    triton: grpcclient.InferenceServerClient,
) -> None:
    bad = {
        "max_batch_size": 8,
        "input": [{"name": "NOPE", "data_type": "TYPE_INT32", "dims": [16]}],
    }
    with pytest.raises(InferenceServerException) as refused:
        triton.load_model("simple", config=json.dumps(bad))
    assert "NOPE" in refused.value.message()
    inputs, expected = simple_inputs(7)
    np.testing.assert_array_equal(triton.infer("simple", inputs).as_numpy("OUTPUT0"), expected)
    assert triton.is_model_ready("simple")


@pytest.mark.parametrize("name", ["../simple", "/etc", "simple/../../x", ".."])
def test_names_that_escape_the_repository_are_refused(
    triton: grpcclient.InferenceServerClient, name: str
) -> None:
    with pytest.raises(InferenceServerException) as refused:
        triton.load_model(name)
    assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"


def test_file_parameters_are_refused(triton: grpcclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as refused:
        triton.load_model("simple", files={"file:1/model.onnx": b"x"})
    assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert triton.is_model_ready("simple")


def test_control_is_refused_in_none_mode(client: grpcclient.InferenceServerClient) -> None:
    for call in (lambda: client.load_model("simple"), lambda: client.unload_model("simple")):
        with pytest.raises(InferenceServerException) as refused:
            call()
        assert refused.value.status() == "StatusCode.FAILED_PRECONDITION"
    assert client.is_model_ready("simple")


@pytest.fixture(scope="module")
def polled(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("poll")
    repository = root / "models"
    names = make_examples(repository)
    shutil.rmtree(repository / "mlp")  # keep the repository small
    names.remove("mlp")
    with running_server(
        repository, names, root, "--model-control-mode", "poll", "--repository-poll-secs", "0.2"
    ) as server:
        yield server


def wait_for(condition: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "the poller did not apply the change in time"
        time.sleep(0.1)  # the poll's period


def test_poll_mode_follows_the_repository(polled: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(polled.url)
    try:
        with pytest.raises(InferenceServerException) as refused:
            client.load_model("simple")
        assert refused.value.status() == "StatusCode.FAILED_PRECONDITION"
        # A new model appears: loaded.
        shutil.copytree(polled.repository / "simple", polled.repository / "simple_copy")
        config = polled.repository / "simple_copy" / "config.pbtxt"
        config.write_text(config.read_text().replace('name: "simple"', 'name: "simple_copy"'))
        wait_for(lambda: client.is_model_ready("simple_copy"))
        inputs, expected = simple_inputs(3)
        result = client.infer("simple_copy", inputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), expected)
        # Its config changes: reloaded with the new one.
        config.write_text(config.read_text().replace("max_batch_size: 8", "max_batch_size: 4"))
        wait_for(lambda: client.get_model_config("simple_copy").config.max_batch_size == 4)
        # It goes away: unloaded; the others keep serving.
        shutil.rmtree(polled.repository / "simple_copy")
        wait_for(lambda: not client.is_model_ready("simple_copy"))
        assert client.is_model_ready("simple")
        assert client.is_server_ready()
    finally:
        client.close()


def batching_delay(client: grpcclient.InferenceServerClient) -> int | None:
    """The served config's max_queue_delay_microseconds; None without dynamic_batching."""
    config = client.get_model_config("simple").config
    if not config.HasField("dynamic_batching"):
        return None
    return int(config.dynamic_batching.max_queue_delay_microseconds)


def test_poll_picks_up_a_new_version_under_traffic(polled: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(polled.url)
    model_dir = polled.repository / "simple"
    freed_before = freed_versions(polled, "simple").count(1)
    try:
        with SimpleTraffic(polled.url, clients=3) as traffic:
            traffic.wait_for_more()  # traffic before the change, and after it
            shutil.copytree(model_dir / "1", model_dir / "2")
            wait_for(lambda: client.get_model_metadata("simple").versions == ["2"])
            traffic.wait_for_more()
        assert traffic.failures == []
        assert traffic.answered > 10
        wait_for(lambda: freed_versions(polled, "simple").count(1) == freed_before + 1)
    finally:
        shutil.rmtree(model_dir / "2", ignore_errors=True)
        wait_for(lambda: client.get_model_metadata("simple").versions == ["1"])
        client.close()


def test_poll_reloads_under_traffic_lose_no_request(polled: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(polled.url)
    config = polled.repository / "simple" / "config.pbtxt"
    original = config.read_text()
    try:
        with SimpleTraffic(polled.url, clients=3) as traffic:
            for delay in (500, 300):  # two reloads, each a changed config the poller picks up
                config.write_text(
                    original + f"dynamic_batching {{ max_queue_delay_microseconds: {delay} }}\n"
                )
                wait_for(lambda delay=delay: batching_delay(client) == delay)
    finally:
        config.write_text(original)
        client.close()
    assert traffic.failures == []
    assert traffic.answered > 10


def test_an_ensemble_named_at_start_brings_its_composing_models(tmp_path: Path) -> None:
    # Triton loads an ensemble's composing models with it: --load-model chain alone serves chain.
    repository = tmp_path / "models"
    names = write_base(repository)
    with running_server(
        repository, names, tmp_path, "--model-control-mode", "explicit", "--load-model", "chain"
    ) as server:
        client = grpcclient.InferenceServerClient(server.url)
        try:
            ready = {m: client.is_model_ready(m) for m in names}
            assert ready == {m: m in ("chain", "pre", "left", "right") for m in names}, ready
            x = np.arange(8, dtype=np.float32).reshape(2, 4)
            given = grpcclient.InferInput("IN", [2, 4], "FP32")
            given.set_data_from_numpy(x)
            answer = client.infer("chain", [given]).as_numpy("OUT")
            np.testing.assert_allclose(answer, ((x + 1) * 2) ** 2)
        finally:
            client.close()
