"""``/metrics`` of a server subprocess: the failure series from a version's load, a failed load
counted, the host figures, no ``*_created`` series, and 404 off ``/metrics``."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from inferd.examples import make_examples
from inferd.server import create_server
from inferd.settings import ServerSettings
from tests.integration.conftest import ServerProcess, running_server
from tests.unit.test_metrics import get

OPENMETRICS = "application/openmetrics-text; version=1.0.0"


@pytest.fixture(scope="module")
def explicit_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("metrics")
    repository = root / "models"
    names = make_examples(repository)
    broken = repository / "broken" / "1"
    broken.mkdir(parents=True)
    (broken / "model.onnx").write_bytes(b"not an ONNX model")
    args = ("--model-control-mode", "explicit", "--load-model", "simple")
    with running_server(repository, [*names, "broken"], root, *args) as server:
        yield server


def values(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    return {
        tuple(sorted(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    }


def load_failures(server: ServerProcess) -> float:
    text = get(server.metrics_url)[1]
    return values(text, "inferd_model_load_failures_total").get((("model", "broken"),), 0)


def fail_to_load_broken(client: grpcclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException):
        client.load_model("broken")


def test_failure_series_are_zero_from_the_load_and_a_failed_load_is_counted(
    explicit_server: ServerProcess,
) -> None:
    status, text = get(explicit_server.metrics_url)
    assert status == 200
    # No request has been sent: every reason is there, at 0, for the loaded version only.
    assert values(text, "nv_inference_request_failure") == {
        (("model", "simple"), ("reason", reason), ("version", "1")): 0
        for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER")
    }
    before = load_failures(explicit_server)
    with grpcclient.InferenceServerClient(explicit_server.url) as client:
        fail_to_load_broken(client)
        client.load_model("mlp")
    text = get(explicit_server.metrics_url)[1]
    assert values(text, "inferd_model_load_failures_total") == {(("model", "broken"),): before + 1}
    failure_models = {dict(k)["model"] for k in values(text, "nv_inference_request_failure")}
    assert failure_models == {"simple", "mlp"}  # mlp's from its load on


def test_host_figures_and_no_created_series(explicit_server: ServerProcess) -> None:
    with grpcclient.InferenceServerClient(explicit_server.url) as client:
        fail_to_load_broken(client)  # a prometheus_client Counter: it would write a _created
    for accept in (None, OPENMETRICS):
        status, text = get(explicit_server.metrics_url, accept)
        assert status == 200
        assert "_created" not in text, accept
        for name in ("nv_cpu_utilization", "nv_cpu_memory_total_bytes", "nv_cpu_memory_used_bytes"):
            assert name in text, (name, accept)
    text = get(explicit_server.metrics_url)[1]
    (utilisation,) = values(text, "nv_cpu_utilization").values()
    assert 0.0 <= utilisation <= 1.0
    (total,) = values(text, "nv_cpu_memory_total_bytes").values()
    (used,) = values(text, "nv_cpu_memory_used_bytes").values()
    assert 0 < used < total


def test_only_metrics_answers(explicit_server: ServerProcess) -> None:
    base = explicit_server.metrics_url.removesuffix("/metrics")
    assert get(base + "/metrics")[0] == 200
    for path in ("/", "/favicon.ico", "/metrics/", "/v2/metrics", "/anything"):
        assert get(base + path)[0] == 404, path


async def test_a_model_that_fails_at_startup_is_counted(tmp_path: Path) -> None:
    """In-process (a failed startup load is logged as an error, which ``running_server`` treats
    as a server bug): the metrics exist before the first load, so it is counted."""
    names = make_examples(tmp_path)
    (tmp_path / "broken" / "1").mkdir(parents=True)
    (tmp_path / "broken" / "1" / "model.onnx").write_bytes(b"not an ONNX model")
    settings = ServerSettings(
        model_repository=tmp_path,
        host="127.0.0.1",
        grpc_port=0,
        metrics_port=0,
        http_port=0,
        load_model="simple,broken",
        model_control_mode="explicit",
    )
    server = await create_server(settings)
    try:
        assert names and server.metrics_port is not None
        loop = asyncio.get_running_loop()
        url = f"http://127.0.0.1:{server.metrics_port}/metrics"
        status, text = await loop.run_in_executor(None, get, url)
        assert status == 200
        assert values(text, "inferd_model_load_failures_total") == {(("model", "broken"),): 1}
        assert len(values(text, "nv_inference_request_failure")) == 4  # simple's, from its load
    finally:
        await server.stop(0)
