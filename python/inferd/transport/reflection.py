"""Server reflection under both of its names: ``grpc.reflection.v1alpha`` and
``grpc.reflection.v1``.

grpcio-reflection ships v1alpha only. v1 is the same protocol under another package (the messages
are identical field for field), so one servicer answers both: its descriptor is v1alpha's file
under v1's package and file name, added to inferd's descriptor pool so that clients can ask for it.
"""

from __future__ import annotations

import grpc
from google.protobuf import descriptor_pb2
from google.protobuf.descriptor_pool import DescriptorPool
from grpc_reflection.v1alpha import reflection as reflection_module
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

V1ALPHA_SERVICE = "grpc.reflection.v1alpha.ServerReflection"
V1_SERVICE = "grpc.reflection.v1.ServerReflection"
_V1_FILE = "grpc/reflection/v1/reflection.proto"


def _renamed(type_name: str) -> str:
    return type_name.replace(".grpc.reflection.v1alpha.", ".grpc.reflection.v1.")


def _rename_message(message: descriptor_pb2.DescriptorProto) -> None:
    for field in message.field:
        if field.type_name:
            field.type_name = _renamed(field.type_name)
    for nested in message.nested_type:
        _rename_message(nested)


def _add_v1_descriptor(pool: DescriptorPool) -> None:
    try:
        pool.FindFileByName(_V1_FILE)
        return
    except KeyError:
        pass
    file = descriptor_pb2.FileDescriptorProto.FromString(reflection_pb2.DESCRIPTOR.serialized_pb)
    file.name = _V1_FILE
    file.package = "grpc.reflection.v1"
    for message in file.message_type:
        _rename_message(message)
    for service in file.service:
        for method in service.method:
            method.input_type = _renamed(method.input_type)
            method.output_type = _renamed(method.output_type)
    pool.Add(file)


def enable_reflection(
    server: grpc.aio.Server, service_names: list[str], pool: DescriptorPool
) -> None:
    """Serves reflection v1alpha and v1 on ``server``, describing ``service_names`` (and both
    reflection services) from ``pool``."""
    try:
        pool.FindFileByName(reflection_pb2.DESCRIPTOR.name)
    except KeyError:
        pool.AddSerializedFile(reflection_pb2.DESCRIPTOR.serialized_pb)
    _add_v1_descriptor(pool)
    servicer = reflection_module.aio.ReflectionServicer(
        [*service_names, V1ALPHA_SERVICE, V1_SERVICE], pool=pool
    )
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)
    handler = grpc.stream_stream_rpc_method_handler(
        servicer.ServerReflectionInfo,
        request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
        response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(V1_SERVICE, {"ServerReflectionInfo": handler}),)
    )
