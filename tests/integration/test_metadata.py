"""Health, metadata, configuration and repository index, through tritonclient and plain gRPC."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import grpc
import pytest
import tritonclient.grpc as grpcclient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from tritonclient.grpc import model_config_pb2
from tritonclient.utils import InferenceServerException

from inferd.examples import DATATYPES

SERVICE = "inference.GRPCInferenceService"


def test_server_live_and_ready(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_server_live()
    assert client.is_server_ready()


def test_model_ready(client: grpcclient.InferenceServerClient) -> None:
    assert client.is_model_ready("simple")
    assert client.is_model_ready("simple", "1")
    assert client.is_model_ready("identity_fp32")
    assert not client.is_model_ready("no_such_model")
    assert not client.is_model_ready("simple", "2")
    assert not client.is_model_ready("simple", "latest")


def test_server_metadata(client: grpcclient.InferenceServerClient) -> None:
    metadata = client.get_server_metadata()
    assert metadata.name == "inferd"
    assert metadata.version
    assert {"statistics", "model_configuration"} <= set(metadata.extensions)


def _tensors(entries: Iterable[Any]) -> list[tuple[str, str, list[int]]]:
    return [(t.name, t.datatype, list(t.shape)) for t in entries]


def test_model_metadata_simple(client: grpcclient.InferenceServerClient) -> None:
    metadata = client.get_model_metadata("simple")
    assert metadata.name == "simple"
    assert list(metadata.versions) == ["1"]
    assert metadata.platform == "onnxruntime_onnx"
    assert _tensors(metadata.inputs) == [
        ("INPUT0", "INT32", [-1, 16]),
        ("INPUT1", "INT32", [-1, 16]),
    ]
    assert _tensors(metadata.outputs) == [
        ("OUTPUT0", "INT32", [-1, 16]),
        ("OUTPUT1", "INT32", [-1, 16]),
    ]
    assert client.get_model_metadata("simple", "1") == metadata


def test_model_metadata_every_datatype(client: grpcclient.InferenceServerClient) -> None:
    for datatype in DATATYPES:
        metadata = client.get_model_metadata(f"identity_{datatype.lower()}")
        assert _tensors(metadata.inputs) == [("INPUT0", datatype, [-1, -1])]
        assert _tensors(metadata.outputs) == [("OUTPUT0", datatype, [-1, -1])]


def test_model_metadata_without_batching(client: grpcclient.InferenceServerClient) -> None:
    metadata = client.get_model_metadata("identity_nobatch")
    # max_batch_size 0: the shape is the config's dims, with no batch dim in front.
    assert _tensors(metadata.inputs) == [("INPUT0", "FP32", [-1, -1])]
    assert _tensors(metadata.outputs) == [("OUTPUT0", "FP32", [-1, -1])]


def test_model_config_completed_from_onnx(client: grpcclient.InferenceServerClient) -> None:
    # identity_fp32 has no config.pbtxt: everything comes from the ONNX model and the defaults.
    config = client.get_model_config("identity_fp32").config
    assert config.name == "identity_fp32"
    assert config.platform == "onnxruntime_onnx"
    assert config.max_batch_size == 4
    assert [(t.name, t.data_type, list(t.dims)) for t in config.input] == [
        ("INPUT0", model_config_pb2.TYPE_FP32, [-1])
    ]
    assert [(t.name, t.data_type, list(t.dims)) for t in config.output] == [
        ("OUTPUT0", model_config_pb2.TYPE_FP32, [-1])
    ]
    assert [g.count for g in config.instance_group] == [1]
    assert config.instance_group[0].kind == model_config_pb2.ModelInstanceGroup.KIND_CPU
    # It batches and names no scheduler: dynamic_batching { } (zero delay), as Triton completes it.
    assert config.WhichOneof("scheduling_choice") == "dynamic_batching"
    assert config.dynamic_batching == model_config_pb2.ModelDynamicBatching()


def test_model_config_as_written(client: grpcclient.InferenceServerClient) -> None:
    config = client.get_model_config("simple", "1").config
    assert config.name == "simple"
    assert config.platform == "onnxruntime_onnx"
    assert config.max_batch_size == 8
    assert [(t.name, t.data_type, list(t.dims)) for t in config.input] == [
        ("INPUT0", model_config_pb2.TYPE_INT32, [16]),
        ("INPUT1", model_config_pb2.TYPE_INT32, [16]),
    ]
    assert [(t.name, t.data_type, list(t.dims)) for t in config.output] == [
        ("OUTPUT0", model_config_pb2.TYPE_INT32, [16]),
        ("OUTPUT1", model_config_pb2.TYPE_INT32, [16]),
    ]
    nobatch = client.get_model_config("identity_nobatch").config
    assert nobatch.max_batch_size == 0
    assert nobatch.WhichOneof("scheduling_choice") is None  # does not batch: no scheduler added
    assert [list(t.dims) for t in nobatch.input] == [[-1, -1]]
    bytes_config = client.get_model_config("identity_bytes").config
    assert [t.data_type for t in bytes_config.input] == [model_config_pb2.TYPE_STRING]


@pytest.mark.parametrize(
    ("call", "name", "version", "says"),
    [
        ("get_model_metadata", "no_such_model", "", "'no_such_model'"),
        ("get_model_config", "no_such_model", "", "'no_such_model'"),
        ("get_model_metadata", "simple", "7", "'7'"),
        ("get_model_config", "simple", "7", "'7'"),
    ],
)
def test_metadata_and_config_of_unknown_model(
    client: grpcclient.InferenceServerClient,
    assert_serving: Callable[[grpcclient.InferenceServerClient], None],
    call: str,
    name: str,
    version: str,
    says: str,
) -> None:
    with pytest.raises(InferenceServerException) as excinfo:
        getattr(client, call)(name, version)
    assert excinfo.value.status() == "StatusCode.NOT_FOUND"
    assert says in excinfo.value.message()
    assert_serving(client)


def test_repository_index(
    client: grpcclient.InferenceServerClient, server_models: list[str]
) -> None:
    index = client.get_model_repository_index()
    assert sorted(m.name for m in index.models) == server_models
    for model in index.models:
        assert (model.version, model.state, model.reason) == ("1", "READY", ""), model


def test_grpc_health(channel: grpc.Channel) -> None:
    health = health_pb2_grpc.HealthStub(channel)
    for service in ("", SERVICE):
        response = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        assert response.status == health_pb2.HealthCheckResponse.SERVING, service


def test_server_reflection_lists_the_service(channel: grpc.Channel) -> None:
    reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
    request = reflection_pb2.ServerReflectionRequest(list_services="")
    responses = list(reflection.ServerReflectionInfo(iter([request]), timeout=10))
    assert len(responses) == 1
    services = {s.name for s in responses[0].list_services_response.service}
    assert SERVICE in services
    assert "grpc.health.v1.Health" in services


def test_server_reflection_describes_the_service(channel: grpc.Channel) -> None:
    reflection = reflection_pb2_grpc.ServerReflectionStub(channel)
    request = reflection_pb2.ServerReflectionRequest(file_containing_symbol=SERVICE)
    (response,) = reflection.ServerReflectionInfo(iter([request]), timeout=10)
    assert not response.HasField("error_response"), response.error_response
    assert response.file_descriptor_response.file_descriptor_proto
