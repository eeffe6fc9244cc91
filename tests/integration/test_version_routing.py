"""Weighted version routing through a real server, on both serving paths: the core's transport
(the default) and Python's (``--log-verbose 1`` sends every inference through Python). A model
``canary`` serves versions 3, 4 and 5, config parameter inferd.version_weights "3:90,4:10"."""

from __future__ import annotations

import shutil
import threading
import time
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

import inferd._proto.grpc_service_pb2 as pb
import inferd._proto.grpc_service_pb2_grpc as pb_grpc
from inferd._core import choose_weighted_version
from inferd.examples import write_identity_model
from tests.integration.conftest import ServerProcess, running_server

WEIGHTS_90_10 = '"3:90,4:10"'
WEIGHTS_10_90 = '"3:10,4:90"'


def write_canary(repository: Path, weights: str) -> None:
    model_dir = repository / "canary"
    if not model_dir.exists():
        write_identity_model(model_dir, "FP32")
        for version in ("3", "4", "5"):
            shutil.copytree(model_dir / "1", model_dir / version)
        shutil.rmtree(model_dir / "1")
        (model_dir / "base.pbtxt").write_text((model_dir / "config.pbtxt").read_text())
    (model_dir / "config.pbtxt").write_text(
        (model_dir / "base.pbtxt").read_text()
        + "version_policy { all { } }\n"
        + f'parameters {{ key: "inferd.version_weights" value: {{ string_value: {weights} }} }}\n'
    )


def canary_server(tmp_path_factory: pytest.TempPathFactory, *args: str) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("routing")
    write_canary(root / "models", WEIGHTS_90_10)
    with running_server(
        root / "models",
        ["canary"],
        root,
        "--model-control-mode",
        "explicit",
        "--load-model",
        "canary",
        *args,
        expected_errors=lambda r: "inferd.version_weights" in str(r.get("error", "")),
    ) as running:
        yield running


@pytest.fixture(scope="module")
def core_path(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from canary_server(tmp_path_factory)


@pytest.fixture(scope="module")
def python_path(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    yield from canary_server(tmp_path_factory, "--log-verbose", "1")


VALUES = np.arange(4, dtype=np.float32).reshape(1, 4)


def request(version: str = "", routing_key: str | None = None) -> pb.ModelInferRequest:
    message = pb.ModelInferRequest(model_name="canary", model_version=version)
    message.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 4])
    message.raw_input_contents.append(VALUES.tobytes())
    if routing_key is not None:
        message.parameters["inferd.routing_key"].string_param = routing_key
    return message


def versions_answering(
    url: str, messages: list[pb.ModelInferRequest], clients: int = 4
) -> Counter[str]:
    """Sends ``messages`` over ``clients`` threads; the count of each answering version. Every
    answer is checked (the identity's output is its input)."""
    counts: Counter[str] = Counter()
    lock = threading.Lock()

    def send(part: list[pb.ModelInferRequest]) -> None:
        with grpc.insecure_channel(url) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            for message in part:
                answer = stub.ModelInfer(message)
                assert answer.raw_output_contents[0] == VALUES.tobytes()
                with lock:
                    counts[answer.model_version] += 1

    threads = [threading.Thread(target=send, args=(messages[i::clients],)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sum(counts.values()) == len(messages)  # no thread died on a failed request
    return counts


def within_5_sigma(count: int, n: int, p: float) -> bool:
    """Whether a binomial(n, p) count is within 5 standard deviations of its mean n p."""
    return abs(count - n * p) <= 5 * (n * p * (1 - p)) ** 0.5


def inference_counts(url: str) -> dict[str, int]:
    with grpc.insecure_channel(url) as channel:
        stats = pb_grpc.GRPCInferenceServiceStub(channel).ModelStatistics(
            pb.ModelStatisticsRequest(name="canary")
        )
    return {s.version: s.inference_count for s in stats.model_stats}


def test_10000_unnamed_requests_split_90_10_and_statistics_agree(
    core_path: ServerProcess,
) -> None:
    # The count on version 4 is binomial(10000, 0.1): mean 1000, sigma 30; allowed: 5 sigma
    # (850..1150), which a correct router misses with probability below 1e-6.
    before = inference_counts(core_path.url)
    scraped_before = success_counts(core_path)
    counts = versions_answering(core_path.url, [request() for _ in range(10000)])
    assert set(counts) == {"3", "4"}, counts  # version 5 has no weight: none of this traffic
    assert within_5_sigma(counts["4"], 10000, 0.1), counts
    after = inference_counts(core_path.url)
    # Per-version statistics make the comparison: each version counted what it answered.
    assert {v: after[v] - before.get(v, 0) for v in after} == {
        "3": counts["3"],
        "4": counts["4"],
        "5": 0,
    }
    # And so do the per-version Prometheus series.
    scraped = success_counts(core_path)
    assert {v: scraped[v] - scraped_before.get(v, 0) for v in scraped} == {
        "3": counts["3"],
        "4": counts["4"],
        "5": 0,
    }


def success_counts(server: ServerProcess) -> dict[str, int]:
    """nv_inference_request_success of the canary, by version, from /metrics."""
    with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
        text = response.read().decode()
    return {
        sample.labels["version"]: int(sample.value)
        for family in text_string_to_metric_families(text)
        if family.name == "nv_inference_request_success"
        for sample in family.samples
        if sample.labels.get("model") == "canary"
    }


def expected_version(key: str) -> str:
    return ("3", "4")[choose_weighted_version([90, 10], key)]


def sticky_keys() -> list[str]:
    """Ten keys that the weights send to version 3 and ten to version 4."""
    keys = [f"user-{i}" for i in range(1000)]
    return [k for k in keys if expected_version(k) == "3"][:10] + [
        k for k in keys if expected_version(k) == "4"
    ][:10]


@pytest.mark.parametrize("path", ["core_path", "python_path"])
def test_a_routing_key_stays_on_its_version(
    path: str, request_fixture: pytest.FixtureRequest
) -> None:
    server: ServerProcess = request_fixture.getfixturevalue(path)
    for key in sticky_keys():
        counts = versions_answering(server.url, [request(routing_key=key)] * 100, clients=2)
        # The same version each time, and the one the shared hash picks: both paths agree.
        assert counts == Counter({expected_version(key): 100}), (key, counts)


@pytest.fixture
def request_fixture(request: pytest.FixtureRequest) -> pytest.FixtureRequest:
    return request


@pytest.mark.parametrize("path", ["core_path", "python_path"])
def test_a_named_version_bypasses_the_weights(
    path: str, request_fixture: pytest.FixtureRequest
) -> None:
    server: ServerProcess = request_fixture.getfixturevalue(path)
    key = sticky_keys()[0]  # unnamed, the weights send it to version 3
    assert versions_answering(server.url, [request("", key)] * 100) == Counter({"3": 100})
    for version in ("5", "4"):
        counts = versions_answering(server.url, [request(version, key)] * 100, clients=2)
        assert counts == Counter({version: 100})


def test_the_python_path_splits_by_the_weights_too(python_path: ServerProcess) -> None:
    # 2,000 requests: version 4's count is binomial(2000, 0.1), sigma ~ 13.4; allowed 5 sigma.
    counts = versions_answering(python_path.url, [request() for _ in range(2000)])
    assert set(counts) == {"3", "4"}, counts
    assert within_5_sigma(counts["4"], 2000, 0.1), counts


@pytest.mark.parametrize("path", ["core_path", "python_path"])
def test_a_non_string_routing_key_is_refused(
    path: str, request_fixture: pytest.FixtureRequest
) -> None:
    server: ServerProcess = request_fixture.getfixturevalue(path)
    message = request()
    message.parameters["inferd.routing_key"].int64_param = 7
    with grpc.insecure_channel(server.url) as channel, pytest.raises(grpc.RpcError) as refused:
        pb_grpc.GRPCInferenceServiceStub(channel).ModelInfer(message)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.details() == "the parameter 'inferd.routing_key' must be a string"


def test_a_forwarded_request_runs_where_the_core_routed_it(python_path: ServerProcess) -> None:
    # Every inference goes to Python here (verbose logs), carrying the version the core's route
    # chose; a client's own header of that name is dropped, so it can choose nothing: a request
    # naming version 3, or keyed to it, runs on 3 whatever the header says.
    key = next(k for k in (f"user-{i}" for i in range(100)) if expected_version(k) == "3")
    with grpc.insecure_channel(python_path.url) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        for message in (request("3"), request("", key)):
            answer = stub.ModelInfer(message, metadata=[("inferd-routed-version", "4")])
            assert answer.model_version == "3"


@pytest.mark.parametrize("path", ["core_path", "python_path"])
def test_a_weight_change_by_reload_under_traffic_loses_nothing(
    path: str, request_fixture: pytest.FixtureRequest
) -> None:
    server: ServerProcess = request_fixture.getfixturevalue(path)
    failures: list[str] = []
    answered = Counter[str]()
    stop = threading.Event()
    lock = threading.Lock()

    def answered_at_least(count: int) -> None:
        """Waits (up to 60 s) until the traffic has ``count`` answers."""
        for _ in range(600):
            with lock:
                if sum(answered.values()) >= count or failures:
                    return
            time.sleep(0.1)

    def traffic(client_number: int) -> None:
        with grpc.insecure_channel(server.url) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            i = 0
            while not stop.is_set():
                key = f"client-{client_number}-{i}" if i % 2 else None
                try:
                    answer = stub.ModelInfer(request(routing_key=key))
                    if answer.raw_output_contents[0] != VALUES.tobytes():
                        failures.append("wrong answer")
                    with lock:
                        answered[answer.model_version] += 1
                except grpc.RpcError as e:
                    failures.append(f"{e.code()}: {e.details()}")
                i += 1

    threads = [threading.Thread(target=traffic, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    client = grpcclient.InferenceServerClient(server.url)
    try:
        answered_at_least(20)  # traffic flows before the reload
        write_canary(server.repository, WEIGHTS_10_90)
        client.load_model("canary")  # the same model, its config changed
        assert (
            client.get_model_config("canary")
            .config.parameters["inferd.version_weights"]
            .string_value
            == "3:10,4:90"
        )
        with lock:
            reloaded_at = sum(answered.values())
        answered_at_least(reloaded_at + 20)  # and after it
        stop.set()
        for thread in threads:
            thread.join()
        assert failures == []
        assert sum(answered.values()) >= reloaded_at + 20
        # Now version 4 has 90%: its count of 2,000 is binomial(2000, 0.9), allowed 5 sigma.
        counts = versions_answering(server.url, [request() for _ in range(2000)])
        assert within_5_sigma(counts["4"], 2000, 0.9), counts
    finally:
        stop.set()
        for thread in threads:
            thread.join()
        write_canary(server.repository, WEIGHTS_90_10)
        client.load_model("canary")
        client.close()


def test_weights_naming_an_unserved_version_fail_the_load(core_path: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(core_path.url)
    try:
        write_canary(core_path.repository, '"3:90,8:10"')
        with pytest.raises(
            InferenceServerException, match=r"inferd\.version_weights .*version 8 is not served"
        ):
            client.load_model("canary")
    finally:
        write_canary(core_path.repository, WEIGHTS_90_10)
        client.load_model("canary")
        client.close()


def test_a_stream_routes_by_the_weights_too(core_path: ServerProcess) -> None:
    messages = []
    for key in sticky_keys():
        for _ in range(5):
            message = request(routing_key=key)
            message.id = key
            messages.append(message)
    with grpc.insecure_channel(core_path.url) as channel:
        answers = list(pb_grpc.GRPCInferenceServiceStub(channel).ModelStreamInfer(iter(messages)))
    assert len(answers) == len(messages)
    for answer in answers:
        assert answer.error_message == ""
        response = answer.infer_response
        assert response.model_version == expected_version(response.id), response.id
