"""Triton's response cache through real clients (issue 30): ``--cache-config local,size=BYTES`` on
the server, ``response_cache { enable: true }`` in a model's config. Repeated requests are answered
from the cache, which statistics (gRPC and HTTP) and metrics show under Triton's names; requests
that differ only in shape never share an answer; eviction keeps the cache within its size; a hit
writes shared-memory outputs too; an ensemble's own answer is cached."""

from __future__ import annotations

import json
import shutil
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from prometheus_client.parser import text_string_to_metric_families

from inferd.examples import MLP_SIZES, make_examples, write_identity_model
from tests.integration.conftest import ServerProcess, running_server
from tests.integration.shm_client import client_region, shm, unix_client

CACHED = "response_cache { enable: true }\n"
# Models kept from the examples: mlp, and the ensemble text_embedding with its two steps.
KEPT = ("mlp", "tokenize", "embed", "text_embedding")
MODELS = [*KEPT, "identity_cached"]


def _repository(root: Path) -> Path:
    repository = root / "models"
    for name in make_examples(repository):
        if name not in KEPT:
            shutil.rmtree(repository / name)
    for name in ("mlp", "text_embedding"):
        config = repository / name / "config.pbtxt"
        config.write_text(config.read_text() + CACHED)
    write_identity_model(repository / "identity_cached", "FP32", max_batch_size=8)
    config = repository / "identity_cached" / "config.pbtxt"
    config.write_text(config.read_text() + CACHED)
    return repository


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("response_cache")
    with running_server(_repository(root), MODELS, root, "--cache-config=local,size=8388608") as s:
        yield s


def metrics(server: ServerProcess) -> dict[tuple[str, str], float]:
    """Every sample on /metrics by (name, model label or "")."""
    with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, sample.labels.get("model", "")): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def mlp_input(values: np.ndarray) -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("INPUT0", list(values.shape), "FP32")
    tensor.set_data_from_numpy(values)
    return [tensor]


def inference_stats(client: grpcclient.InferenceServerClient, model: str) -> dict[str, object]:
    stats = client.get_inference_statistics(model, as_json=True)["model_stats"][0]
    assert isinstance(stats, dict)
    return stats


def count(stats: dict[str, object], key: str) -> int:
    inference = stats["inference_stats"]
    assert isinstance(inference, dict)
    return int(inference.get(key, {}).get("count", 0))


def test_repeated_requests_are_answered_from_the_cache_and_counted_as_triton_counts_them(
    server: ServerProcess,
) -> None:
    values = np.random.default_rng(30).standard_normal((1, MLP_SIZES[0])).astype(np.float32)
    with grpcclient.InferenceServerClient(server.url) as client:
        first = client.infer("mlp", mlp_input(values)).as_numpy("OUTPUT0")
        before = inference_stats(client, "mlp")
        for _ in range(20):
            again = client.infer("mlp", mlp_input(values)).as_numpy("OUTPUT0")
            np.testing.assert_array_equal(again, first)
        after = inference_stats(client, "mlp")
    assert count(after, "cache_hit") - count(before, "cache_hit") == 20
    assert count(after, "cache_miss") == count(before, "cache_miss")
    assert count(after, "success") - count(before, "success") == 20  # hits are successes
    # ... but neither inferences nor executions, as in Triton.
    assert int(after["inference_count"]) == int(before["inference_count"])
    assert int(after["execution_count"]) == int(before["execution_count"])
    seen = metrics(server)
    assert seen[("nv_cache_num_hits_per_model", "mlp")] == count(after, "cache_hit")
    assert seen[("nv_cache_num_misses_per_model", "mlp")] == count(after, "cache_miss")
    assert seen[("nv_cache_hit_duration_per_model", "mlp")] > 0
    assert seen[("nv_cache_miss_duration_per_model", "mlp")] > 0
    assert seen[("nv_cache_num_entries", "")] >= 1
    assert seen[("inferd_cache_limit_bytes", "")] == 8388608
    assert 0 < seen[("inferd_cache_bytes", "")] <= 8388608
    # A model whose config does not enable the cache counts none (tokenize: a step, uncached).
    assert seen[("nv_cache_num_hits_per_model", "tokenize")] == 0


def test_http_statistics_carry_cache_hit_and_miss(server: ServerProcess) -> None:
    url = f"http://{server.http_url}/v2/models/mlp/stats"
    with urllib.request.urlopen(url, timeout=10) as response:
        stats = json.loads(response.read())["model_stats"][0]["inference_stats"]
    assert stats["cache_hit"]["count"] > 0
    assert stats["cache_miss"]["count"] > 0


def test_the_same_bytes_in_another_shape_never_share_an_answer(server: ServerProcess) -> None:
    values = np.arange(8, dtype=np.float32)
    with grpcclient.InferenceServerClient(server.url) as client:
        before = inference_stats(client, "identity_cached")
        for shape in ((1, 8), (2, 4), (4, 2), (1, 8), (2, 4)):
            tensor = grpcclient.InferInput("INPUT0", list(shape), "FP32")
            tensor.set_data_from_numpy(values.reshape(shape))
            answer = client.infer("identity_cached", [tensor]).as_numpy("OUTPUT0")
            assert answer.shape == shape
            np.testing.assert_array_equal(answer, values.reshape(shape))
        after = inference_stats(client, "identity_cached")
    assert count(after, "cache_miss") - count(before, "cache_miss") == 3
    assert count(after, "cache_hit") - count(before, "cache_hit") == 2


def test_an_ensemble_answer_is_cached_and_its_steps_do_not_run_again(server: ServerProcess) -> None:
    text = grpcclient.InferInput("TEXT", [1, 1], "BYTES")
    text.set_data_from_numpy(np.array([[b"popular text"]], dtype=object))
    with grpcclient.InferenceServerClient(server.url) as client:
        first = client.infer("text_embedding", [text]).as_numpy("EMBEDDING")
        steps_before = inference_stats(client, "tokenize")
        before = inference_stats(client, "text_embedding")
        for _ in range(5):
            again = client.infer("text_embedding", [text]).as_numpy("EMBEDDING")
            np.testing.assert_array_equal(again, first)
        after = inference_stats(client, "text_embedding")
        steps_after = inference_stats(client, "tokenize")
    assert count(after, "cache_hit") - count(before, "cache_hit") == 5
    assert int(steps_after["execution_count"]) == int(steps_before["execution_count"])


def test_a_hit_writes_shared_memory_outputs_too(server: ServerProcess) -> None:
    values = np.random.default_rng(31).standard_normal((1, MLP_SIZES[0])).astype(np.float32)
    out_bytes = 4 * MLP_SIZES[-1]
    with client_region("cache_out", out_bytes) as region, unix_client(server) as client:
        client.register_system_shared_memory(region.name, region.key, out_bytes)
        try:
            answers = []
            for _ in range(2):  # a miss, then a hit
                shm.set_shared_memory_region(region.handle, [np.zeros(MLP_SIZES[-1], np.float32)])
                output = grpcclient.InferRequestedOutput("OUTPUT0")
                output.set_shared_memory(region.name, out_bytes)
                result = client.infer("mlp", mlp_input(values), outputs=[output])
                assert result.get_output("OUTPUT0") is not None
                answers.append(
                    shm.get_contents_as_numpy(region.handle, np.float32, [1, MLP_SIZES[-1]]).copy()
                )
            stats = inference_stats(client, "mlp")
        finally:
            client.unregister_system_shared_memory(region.name)
    assert count(stats, "cache_hit") >= 1
    assert np.any(answers[0] != 0)
    np.testing.assert_array_equal(answers[1], answers[0])


@pytest.fixture(scope="module")
def small_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("response_cache_small")
    repository = root / "models"
    write_identity_model(repository / "identity_cached", "FP32", max_batch_size=8)
    config = repository / "identity_cached" / "config.pbtxt"
    config.write_text(config.read_text() + CACHED)
    with running_server(
        repository, ["identity_cached"], root, "--cache-config", "local,size=65536"
    ) as running:
        yield running


def test_eviction_keeps_the_cache_within_its_size(small_cache: ServerProcess) -> None:
    # Each answer holds 4 KiB of input in its key and 4 KiB of output: 65,536 bytes hold a few.
    rows = [np.full((1, 1024), i, np.float32) for i in range(40)]
    with grpcclient.InferenceServerClient(small_cache.url) as client:

        def infer(row: np.ndarray) -> None:
            tensor = grpcclient.InferInput("INPUT0", [1, 1024], "FP32")
            tensor.set_data_from_numpy(row)
            np.testing.assert_array_equal(
                client.infer("identity_cached", [tensor]).as_numpy("OUTPUT0"), row
            )

        for row in rows:
            infer(row)
            seen = metrics(small_cache)
            assert seen[("inferd_cache_bytes", "")] <= 65536
        assert seen[("nv_cache_num_evictions", "")] > 0
        assert 0 < seen[("nv_cache_num_entries", "")] < 40
        before = inference_stats(client, "identity_cached")
        infer(rows[0])  # evicted long ago: a miss again
        infer(rows[-1])  # the newest: a hit
        after = inference_stats(client, "identity_cached")
    assert count(after, "cache_miss") - count(before, "cache_miss") == 1
    assert count(after, "cache_hit") - count(before, "cache_hit") == 1
