"""issue 13, item 4: the control plane cannot be used to stall or exhaust the server. Load
overrides are capped (config size, instances, warm-up count, bytes and time), a load the client
cancels rolls back (ServerReady, health and RepositoryIndex agree, memory returns), and unloading
unknown names keeps nothing. Control calls go over the Unix socket (answered there by default)."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from inferd.examples import make_examples
from tests.integration.conftest import ServerProcess, running_server, wait_until, without_asan

CALL_TIMEOUT_S = 30.0
RSS_BOUND_BYTES = 64 * 1024 * 1024  # what 30 cancelled loads or 10,000 unknown unloads may add


def rss_bytes(server: ServerProcess) -> int:
    for line in Path(f"/proc/{server.process.pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def simple_warmup(count: int) -> dict[str, Any]:
    return {
        "max_batch_size": 8,
        "model_warmup": [
            {
                "name": "sample",
                "batch_size": 1,
                "count": count,
                "inputs": {
                    name: {"data_type": "TYPE_INT32", "dims": [16], "zero_data": True}
                    for name in ("INPUT0", "INPUT1")
                },
            }
        ],
    }


def load_request(name: str, config: dict[str, Any] | str) -> Any:
    text = config if isinstance(config, str) else json.dumps(config)
    return pb.RepositoryModelLoadRequest(
        model_name=name, parameters={"config": pb.ModelRepositoryParameter(string_param=text)}
    )


def launch(tmp_path_factory: pytest.TempPathFactory, *flags: str) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("limits")
    repository = root / "models"
    names = make_examples(repository)
    with running_server(
        repository, names, root, "--model-control-mode", "explicit", "--load-model", "mlp", *flags
    ) as server:
        yield server


@pytest.fixture(scope="module")
def limited(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """The default limits."""
    yield from launch(tmp_path_factory)


@pytest.fixture(scope="module")
def endless(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """Warm-ups as long as a client asks (only cancellation or the timeout ends them)."""
    yield from launch(
        tmp_path_factory, "--max-warmup-count", str(2**31 - 1), "--warmup-timeout-secs", "4"
    )


@pytest.fixture
def control(limited: ServerProcess) -> Iterator[service_pb2_grpc.GRPCInferenceServiceStub]:
    with grpc.insecure_channel(f"unix:{limited.unix_socket}") as channel:
        yield service_pb2_grpc.GRPCInferenceServiceStub(channel)


def refused(stub: service_pb2_grpc.GRPCInferenceServiceStub, request: Any) -> grpc.RpcError:
    with pytest.raises(grpc.RpcError) as caught:
        stub.RepositoryModelLoad(request, timeout=CALL_TIMEOUT_S)
    return caught.value


def test_an_endless_warmup_count_is_refused(
    control: service_pb2_grpc.GRPCInferenceServiceStub,
) -> None:
    error = refused(control, load_request("simple", simple_warmup(2**31 - 1)))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert "--max-warmup-count" in error.details() and "1000" in error.details()


def test_warmup_bytes_are_capped_before_they_are_allocated(
    control: service_pb2_grpc.GRPCInferenceServiceStub,
) -> None:
    config = {
        "max_batch_size": 4,
        "model_warmup": [
            {
                "name": "huge",
                "batch_size": 1,
                "inputs": {
                    "INPUT0": {"data_type": "TYPE_FP32", "dims": [400_000_000], "zero_data": True}
                },
            }
        ],
    }
    error = refused(control, load_request("identity_fp32", config))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert "--max-warmup-bytes" in error.details()


def test_instance_count_is_capped(control: service_pb2_grpc.GRPCInferenceServiceStub) -> None:
    config = {"max_batch_size": 8, "instance_group": [{"kind": "KIND_CPU", "count": 64}]}
    error = refused(control, load_request("simple", config))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert "--max-instance-count" in error.details() and "16" in error.details()


def test_a_config_override_is_capped_in_size(
    control: service_pb2_grpc.GRPCInferenceServiceStub,
) -> None:
    padding = {"padding": {"string_value": "x" * (2 * 1024 * 1024)}}
    error = refused(control, load_request("simple", {"max_batch_size": 8, "parameters": padding}))
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT, error.details()
    assert "--max-config-override-bytes" in error.details()


@without_asan
def test_unloading_unknown_names_keeps_no_memory(limited: ServerProcess) -> None:
    with grpc.insecure_channel(f"unix:{limited.unix_socket}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)

        def unload_many(first: int, count: int) -> None:
            calls = [
                stub.RepositoryModelUnload.future(
                    pb.RepositoryModelUnloadRequest(model_name=f"{i:08d}" + "u" * 10_000),
                    timeout=CALL_TIMEOUT_S,
                )
                for i in range(first, first + count)
            ]
            for call in calls:
                with pytest.raises(grpc.RpcError) as caught:
                    call.result()
                assert caught.value.code() == grpc.StatusCode.NOT_FOUND

        unload_many(0, 500)  # the allocator's and gRPC's own first growth
        before = rss_bytes(limited)
        for batch in range(1, 21):
            unload_many(batch * 500, 500)
        grown = rss_bytes(limited) - before
    print(f"RSS after 10,000 unloads of unknown 10 KB names: {grown / 2**20:+.1f} MiB")
    assert grown < RSS_BOUND_BYTES


def readiness(stub: service_pb2_grpc.GRPCInferenceServiceStub, channel: grpc.Channel) -> Any:
    """ServerReady, health and simple's RepositoryIndex states, as one tuple."""
    ready = stub.ServerReady(pb.ServerReadyRequest(), timeout=CALL_TIMEOUT_S).ready
    check = health_pb2_grpc.HealthStub(channel).Check(
        health_pb2.HealthCheckRequest(service=""), timeout=CALL_TIMEOUT_S
    )
    index = stub.RepositoryIndex(pb.RepositoryIndexRequest(), timeout=CALL_TIMEOUT_S)
    states = sorted((m.version, m.state) for m in index.models if m.name == "simple")
    return ready, check.status == health_pb2.HealthCheckResponse.SERVING, states


@without_asan
def test_cancelled_loads_roll_back_and_return_memory(endless: ServerProcess) -> None:
    with grpc.insecure_channel(f"unix:{endless.unix_socket}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        before = readiness(stub, channel)
        assert before == (True, True, [("", "UNAVAILABLE")])

        def cancelled_load() -> None:
            with pytest.raises(grpc.RpcError) as caught:
                stub.RepositoryModelLoad(
                    load_request("simple", simple_warmup(2**31 - 1)), timeout=1.5
                )
            assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED

        def settled() -> Any:
            deadline = time.monotonic() + 10  # the rollback waits for the warm-up's next step
            while (now := readiness(stub, channel)) != before and time.monotonic() < deadline:
                time.sleep(0.05)  # the poll's period
            return now

        # While the load runs, the model is LOADING; the server stays ready (a model joins the
        # ones that should serve once it has loaded), and health says the same.
        loading = threading.Thread(target=cancelled_load)
        loading.start()
        wait_until(lambda: readiness(stub, channel)[2] == [("", "LOADING")], "simple LOADING")
        during = readiness(stub, channel)  # the load runs 1.5 s: still LOADING
        loading.join()
        assert during == (True, True, [("", "LOADING")])
        assert settled() == before  # not LOADING forever, the server ready again
        start_rss = rss_bytes(endless)
        for _ in range(29):
            cancelled_load()
        assert settled() == before
        grown = rss_bytes(endless) - start_rss
        print(f"RSS after 29 more cancelled loads: {grown / 2**20:+.1f} MiB")
        assert grown < RSS_BOUND_BYTES
        # The model still loads, and serves.
        stub.RepositoryModelLoad(load_request("simple", {"max_batch_size": 8}), timeout=60)
        assert stub.ModelReady(pb.ModelReadyRequest(name="simple"), timeout=CALL_TIMEOUT_S).ready


def test_a_warmup_past_its_time_fails_the_load(endless: ServerProcess) -> None:
    with grpc.insecure_channel(f"unix:{endless.unix_socket}") as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        started = time.monotonic()
        with pytest.raises(grpc.RpcError) as caught:
            stub.RepositoryModelLoad(
                load_request("identity_fp32", {"max_batch_size": 4, **_fp32_warmup()}),
                timeout=CALL_TIMEOUT_S,
            )
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT, caught.value.details()
        assert "--warmup-timeout-secs" in caught.value.details()
        assert time.monotonic() - started < 4 + 10
        assert stub.ServerReady(pb.ServerReadyRequest(), timeout=CALL_TIMEOUT_S).ready


def _fp32_warmup() -> dict[str, Any]:
    sample = {"data_type": "TYPE_FP32", "dims": [4], "zero_data": True}
    return {
        "model_warmup": [
            {"name": "long", "batch_size": 1, "count": 2**31 - 1, "inputs": {"INPUT0": sample}}
        ]
    }
