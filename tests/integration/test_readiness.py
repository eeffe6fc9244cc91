"""issue 14, item 4: readiness over a real server. ServerReady (answered by the core from its
snapshot), the health services "" and inference.GRPCInferenceService (answered by the Python
side) and RepositoryIndex agree under each rule: --strict-readiness on and off, a failed model
marked optional, and no model serving (an empty repository, explicit mode before a load) with and
without --ready-without-models."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc import service_pb2_grpc

from inferd.examples import write_identity_model
from tests.integration.conftest import running_server

CALL_TIMEOUT_S = 30.0
SERVICE = "inference.GRPCInferenceService"
OPTIONAL = 'parameters { key: "inferd.readiness" value: { string_value: "optional" } }\n'

# The warning a server that starts with nothing to serve logs, so the operator knows why.
NO_MODEL_SERVES = (
    "no model serves: the server is not ready until one loads "
    "(--ready-without-models counts it ready)"
)

Readiness = tuple[bool, bool, bool, dict[str, str]]


def load_failed(record: dict[str, object]) -> bool:
    """The error record a model that fails at start logs, on purpose here."""
    return record.get("event") == "model load failed"


def write_repository(root: Path, *, broken_config: str | None) -> list[str]:
    """A model that loads and, unless ``broken_config`` is None, one whose file is no ONNX model
    (its config.pbtxt: ``broken_config``)."""
    write_identity_model(root / "good", "FP32", with_config=False)
    if broken_config is None:
        return ["good"]
    (root / "broken" / "1").mkdir(parents=True)
    (root / "broken" / "1" / "model.onnx").write_bytes(b"not an onnx model")
    if broken_config:
        (root / "broken" / "config.pbtxt").write_text(broken_config)
    return ["broken", "good"]


def workdir(tmp_path: Path, name: str) -> Path:
    """A folder of its own for one of a test's servers (its log and socket)."""
    folder = tmp_path / name
    folder.mkdir()
    return folder


def readiness(url: str) -> Readiness:
    """ServerReady, health "" and health inference.GRPCInferenceService, and each model's
    RepositoryIndex state."""
    with grpc.insecure_channel(url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        health = health_pb2_grpc.HealthStub(channel)
        ready = stub.ServerReady(pb.ServerReadyRequest(), timeout=CALL_TIMEOUT_S).ready
        serving = [
            health.Check(health_pb2.HealthCheckRequest(service=s), timeout=CALL_TIMEOUT_S).status
            == health_pb2.HealthCheckResponse.SERVING
            for s in ("", SERVICE)
        ]
        index = stub.RepositoryIndex(pb.RepositoryIndexRequest(), timeout=CALL_TIMEOUT_S)
    return ready, serving[0], serving[1], {m.name: m.state for m in index.models}


def settled(url: str, expected: Readiness) -> Readiness:
    """The readiness once it equals ``expected``, or as it is after 10 s (health follows a
    change a moment after the core's snapshot)."""
    deadline = time.monotonic() + 10
    while (now := readiness(url)) != expected and time.monotonic() < deadline:
        time.sleep(0.05)
    return now


@pytest.mark.timeout(120)
def test_a_failed_model_holds_readiness_only_with_strict_readiness(tmp_path: Path) -> None:
    names = write_repository(tmp_path / "models", broken_config="")
    states = {"good": "READY", "broken": "UNAVAILABLE"}
    with running_server(
        tmp_path / "models",
        names,
        workdir(tmp_path, "strict"),
        "--exit-on-error=false",
        expected_errors=load_failed,
    ) as strict:
        assert readiness(strict.url) == (False, False, False, states)
    with running_server(
        tmp_path / "models",
        names,
        workdir(tmp_path, "lenient"),
        "--strict-readiness=false",
        "--exit-on-error=false",
        expected_errors=load_failed,
    ) as lenient:
        assert readiness(lenient.url) == (True, True, True, states)


@pytest.mark.timeout(60)
def test_a_failed_optional_model_does_not_hold_readiness(tmp_path: Path) -> None:
    names = write_repository(tmp_path / "models", broken_config=OPTIONAL)
    with running_server(
        tmp_path / "models", names, tmp_path, "--exit-on-error=false", expected_errors=load_failed
    ) as server:
        states = {"good": "READY", "broken": "UNAVAILABLE"}
        assert readiness(server.url) == (True, True, True, states)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("strict", ["true", "false"])
def test_an_empty_repository_is_ready_only_with_ready_without_models(
    tmp_path: Path, strict: str
) -> None:
    (tmp_path / "models").mkdir()
    flag = f"--strict-readiness={strict}"
    with running_server(tmp_path / "models", [], workdir(tmp_path, "default"), flag) as server:
        assert readiness(server.url) == (False, False, False, {})
        assert NO_MODEL_SERVES in [r.get("event") for r in server.records()]
    with running_server(
        tmp_path / "models", [], workdir(tmp_path, "allowed"), flag, "--ready-without-models"
    ) as allowed:
        assert readiness(allowed.url) == (True, True, True, {})
        assert NO_MODEL_SERVES not in [r.get("event") for r in allowed.records()]


@pytest.mark.timeout(60)
def test_explicit_mode_is_ready_once_a_model_has_loaded(tmp_path: Path) -> None:
    names = write_repository(tmp_path / "models", broken_config=None)
    with running_server(
        tmp_path / "models", names, tmp_path, "--model-control-mode", "explicit"
    ) as server:
        assert readiness(server.url) == (False, False, False, {"good": "UNAVAILABLE"})
        with grpc.insecure_channel(server.url) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            stub.RepositoryModelLoad(
                pb.RepositoryModelLoadRequest(model_name="good"), timeout=CALL_TIMEOUT_S
            )
            loaded = (True, True, True, {"good": "READY"})
            assert settled(server.url, loaded) == loaded
            stub.RepositoryModelUnload(
                pb.RepositoryModelUnloadRequest(model_name="good"), timeout=CALL_TIMEOUT_S
            )
            unloaded = (False, False, False, {"good": "UNAVAILABLE"})
            assert settled(server.url, unloaded) == unloaded
