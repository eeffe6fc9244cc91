"""Wire-compatibility of inferd's protos with Triton's (as shipped in tritonclient).

Our generated modules live in ``inferd._proto`` and are registered in a private
descriptor pool, so every descriptor of ours is taken from those modules, never
from the default pool (where tritonclient registers the same ``inference.*``
names).

For every message (recursively, including map entries) and enum in
``tritonclient.grpc.service_pb2`` / ``model_config_pb2``, ours must have the same
full name in the same .proto file; every field of theirs must exist in ours
with the same number, type, repeatedness, oneof and message/enum type; every
enum value of theirs must exist in ours with the same number; and every RPC of
their ``GRPCInferenceService`` must exist in ours with the same request/response
types and streaming flags. Ours may have extra fields, values, messages and
methods (Triton's current protos are newer than a given tritonclient).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from types import ModuleType

import pytest
from google.protobuf.descriptor import (
    Descriptor,
    EnumDescriptor,
    FieldDescriptor,
    FileDescriptor,
    ServiceDescriptor,
)
from tritonclient.grpc import model_config_pb2 as triton_model_config_pb2
from tritonclient.grpc import service_pb2 as triton_service_pb2

from inferd._proto import grpc_service_pb2, model_config_pb2

SERVICE_NAME = "GRPCInferenceService"

# (theirs, ours) module pairs; file names and packages must match too.
MODULE_PAIRS: list[tuple[ModuleType, ModuleType]] = [
    (triton_model_config_pb2, model_config_pb2),
    (triton_service_pb2, grpc_service_pb2),
]


def _walk_messages(messages: Iterable[Descriptor]) -> Iterator[Descriptor]:
    for message in messages:
        yield message
        yield from _walk_messages(message.nested_types)


def _all_messages(file: FileDescriptor) -> dict[str, Descriptor]:
    return {m.full_name: m for m in _walk_messages(file.message_types_by_name.values())}


def _all_enums(file: FileDescriptor) -> dict[str, EnumDescriptor]:
    enums: dict[str, EnumDescriptor] = {e.full_name: e for e in file.enum_types_by_name.values()}
    for message in _all_messages(file).values():
        enums.update({e.full_name: e for e in message.enum_types})
    return enums


def _files(index: int) -> list[FileDescriptor]:
    return [pair[index].DESCRIPTOR for pair in MODULE_PAIRS]


THEIR_MESSAGES: dict[str, Descriptor] = {
    k: v for f in _files(0) for k, v in _all_messages(f).items()
}
OUR_MESSAGES: dict[str, Descriptor] = {k: v for f in _files(1) for k, v in _all_messages(f).items()}
THEIR_ENUMS: dict[str, EnumDescriptor] = {k: v for f in _files(0) for k, v in _all_enums(f).items()}
OUR_ENUMS: dict[str, EnumDescriptor] = {k: v for f in _files(1) for k, v in _all_enums(f).items()}


def _is_repeated(field: FieldDescriptor) -> bool:
    # protobuf >= 6 exposes is_repeated; older releases only have label.
    is_repeated = getattr(field, "is_repeated", None)
    if is_repeated is not None:
        return bool(is_repeated)
    return bool(field.label == FieldDescriptor.LABEL_REPEATED)


def _type_name(field: FieldDescriptor) -> str | None:
    if field.message_type is not None:
        return str(field.message_type.full_name)
    if field.enum_type is not None:
        return str(field.enum_type.full_name)
    return None


def _oneof_name(field: FieldDescriptor) -> str | None:
    oneof = field.containing_oneof
    return None if oneof is None else str(oneof.name)


def _our_service() -> ServiceDescriptor:
    service: ServiceDescriptor = grpc_service_pb2.DESCRIPTOR.services_by_name[SERVICE_NAME]
    return service


def test_reference_is_not_empty() -> None:
    # Guard against a vacuous pass if tritonclient's modules change shape.
    assert "inference.ModelInferRequest" in THEIR_MESSAGES
    assert "inference.ModelConfig" in THEIR_MESSAGES
    assert "inference.DataType" in THEIR_ENUMS
    assert len(THEIR_MESSAGES) > 50


@pytest.mark.parametrize(("theirs", "ours"), MODULE_PAIRS, ids=lambda m: str(m.__name__))
def test_file_identity(theirs: ModuleType, ours: ModuleType) -> None:
    their_file: FileDescriptor = theirs.DESCRIPTOR
    our_file: FileDescriptor = ours.DESCRIPTOR
    assert our_file.name == their_file.name
    assert our_file.package == their_file.package == "inference"
    assert sorted(d.name for d in our_file.dependencies) == sorted(
        d.name for d in their_file.dependencies
    )


def test_ours_use_a_private_pool() -> None:
    our_pool = grpc_service_pb2.DESCRIPTOR.pool
    assert model_config_pb2.DESCRIPTOR.pool is our_pool
    assert triton_service_pb2.DESCRIPTOR.pool is not our_pool


@pytest.mark.parametrize("full_name", sorted(THEIR_MESSAGES))
def test_message_compatible(full_name: str) -> None:
    theirs = THEIR_MESSAGES[full_name]
    assert full_name in OUR_MESSAGES, f"missing message {full_name}"
    ours = OUR_MESSAGES[full_name]
    assert ours.file.name == theirs.file.name
    assert ours.GetOptions().map_entry == theirs.GetOptions().map_entry

    our_fields = ours.fields_by_name
    for their_field in theirs.fields:
        where = f"{full_name}.{their_field.name}"
        assert their_field.name in our_fields, f"missing field {where}"
        our_field = our_fields[their_field.name]
        assert our_field.number == their_field.number, f"number of {where}"
        assert our_field.type == their_field.type, f"type of {where}"
        assert _is_repeated(our_field) == _is_repeated(their_field), f"repeatedness of {where}"
        assert _type_name(our_field) == _type_name(their_field), f"message/enum type of {where}"
        assert _oneof_name(our_field) == _oneof_name(their_field), f"oneof of {where}"


@pytest.mark.parametrize("full_name", sorted(THEIR_ENUMS))
def test_enum_compatible(full_name: str) -> None:
    theirs = THEIR_ENUMS[full_name]
    assert full_name in OUR_ENUMS, f"missing enum {full_name}"
    ours = OUR_ENUMS[full_name]
    assert ours.file.name == theirs.file.name
    for their_value in theirs.values:
        where = f"{full_name}.{their_value.name}"
        assert their_value.name in ours.values_by_name, f"missing value {where}"
        assert ours.values_by_name[their_value.name].number == their_value.number, (
            f"number of {where}"
        )


def test_service_methods_compatible() -> None:
    theirs: ServiceDescriptor = triton_service_pb2.DESCRIPTOR.services_by_name[SERVICE_NAME]
    ours = _our_service()
    assert ours.full_name == theirs.full_name == f"inference.{SERVICE_NAME}"
    for their_method in theirs.methods:
        name = their_method.name
        assert name in ours.methods_by_name, f"missing rpc {name}"
        our_method = ours.methods_by_name[name]
        assert our_method.input_type.full_name == their_method.input_type.full_name
        assert our_method.output_type.full_name == their_method.output_type.full_name
        assert our_method.client_streaming == their_method.client_streaming, name
        assert our_method.server_streaming == their_method.server_streaming, name


def test_service_has_all_triton_rpcs() -> None:
    # The full current Triton RPC set, independent of the tritonclient version.
    expected = {
        "ServerLive",
        "ServerReady",
        "ModelReady",
        "ServerMetadata",
        "ModelMetadata",
        "ModelInfer",
        "ModelStreamInfer",
        "ModelConfig",
        "ModelStatistics",
        "RepositoryIndex",
        "RepositoryModelLoad",
        "RepositoryModelUnload",
        "SystemSharedMemoryStatus",
        "SystemSharedMemoryRegister",
        "SystemSharedMemoryUnregister",
        "CudaSharedMemoryStatus",
        "CudaSharedMemoryRegister",
        "CudaSharedMemoryUnregister",
        "TraceSetting",
        "LogSettings",
    }
    assert set(_our_service().methods_by_name) == expected
    stream = _our_service().methods_by_name["ModelStreamInfer"]
    assert stream.client_streaming
    assert stream.server_streaming


def test_round_trip_with_tritonclient_messages() -> None:
    # Bytes produced by ours parse as theirs and back, field for field.
    ours = grpc_service_pb2.ModelInferRequest(model_name="m", model_version="1", id="req-1")
    ours.parameters["priority"].int64_param = 3
    tensor = ours.inputs.add(name="INPUT0", datatype="FP32", shape=[1, 2])
    tensor.parameters["p"].string_param = "v"
    ours.outputs.add(name="OUTPUT0")
    ours.raw_input_contents.append(b"\x00\x00\x80?\x00\x00\x00@")

    theirs = triton_service_pb2.ModelInferRequest.FromString(ours.SerializeToString())
    assert theirs.model_name == "m"
    assert theirs.id == "req-1"
    assert theirs.parameters["priority"].int64_param == 3
    assert list(theirs.inputs[0].shape) == [1, 2]
    assert theirs.inputs[0].parameters["p"].string_param == "v"
    assert theirs.outputs[0].name == "OUTPUT0"

    back = grpc_service_pb2.ModelInferRequest.FromString(theirs.SerializeToString())
    assert back == ours
