"""BLS calls run through the data plane: a python model's ``ModelCall`` as a serialized
ModelInferRequest, and the ModelInferResponse's outputs back as arrays (see
``inferd.python_backend.bls`` for the calls' rules: chains, timeouts, cancellation)."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
from typing import TYPE_CHECKING, Any

import numpy as np

import inferd._proto.grpc_service_pb2 as pb
from inferd import errors
from inferd.datatypes import DATATYPES, serialize_bytes
from inferd.python_backend import ipc
from inferd.python_backend.bls import (
    CALL_CHAIN_PARAMETER,
    DEFAULT_CALL_TIMEOUT_S,
    ModelCall,
    ModelOutputs,
)

if TYPE_CHECKING:
    from inferd.dataplane import DataPlane


def _parameter(value: object) -> pb.InferParameter:
    if isinstance(value, bool):
        return pb.InferParameter(bool_param=value)
    if isinstance(value, int):
        return pb.InferParameter(int64_param=value)
    if isinstance(value, str):
        return pb.InferParameter(string_param=value)
    raise errors.InvalidArgument(
        f"a request parameter must be a bool, int or str, got {type(value).__name__}"
    )


def encode_call(call: ModelCall) -> bytes:
    """The call as a serialized ModelInferRequest (raw contents, one entry per input)."""
    request = pb.ModelInferRequest(
        model_name=call.model,
        model_version="" if call.version < 0 else str(call.version),
        id=call.request_id,
    )
    try:
        parameters = json.loads(call.parameters or "{}")
    except json.JSONDecodeError as error:
        raise errors.InvalidArgument(f"request parameters are not JSON: {error}") from None
    if not isinstance(parameters, dict):
        raise errors.InvalidArgument("request parameters must be a JSON object")
    for key, value in parameters.items():
        request.parameters[str(key)].CopyFrom(_parameter(value))
    if call.chain:
        chain = json.dumps(list(call.chain))
        request.parameters[CALL_CHAIN_PARAMETER].CopyFrom(pb.InferParameter(string_param=chain))
    for name, array in call.inputs.items():
        try:
            datatype = ipc.datatype_of(array)
        except TypeError as error:
            raise errors.InvalidArgument(f"input {name!r}: {error}") from None
        tensor = request.inputs.add(name=name, datatype=datatype, shape=list(array.shape))
        del tensor  # the contents go in raw_input_contents, by position
        if datatype == "BYTES":
            elements = [e if isinstance(e, bytes) else str(e).encode() for e in array.reshape(-1)]
            request.raw_input_contents.append(serialize_bytes(elements))
        else:
            contiguous = np.ascontiguousarray(array, dtype=DATATYPES[datatype].numpy)
            request.raw_input_contents.append(contiguous.tobytes())
    for name in call.requested_output_names:
        request.outputs.add(name=name)
    return request.SerializeToString()


def decode_answer(answer: bytes) -> ModelOutputs:
    """A serialized ModelInferResponse's outputs as arrays (BYTES as object arrays of bytes)."""
    response = pb.ModelInferResponse.FromString(answer)
    outputs: ModelOutputs = {}
    for tensor, raw in zip(response.outputs, response.raw_output_contents, strict=False):
        shape = tuple(int(d) for d in tensor.shape)
        if tensor.datatype == "BYTES":
            outputs[tensor.name] = ipc.deserialize_bytes(raw, shape)
        else:
            dtype = DATATYPES[tensor.datatype].numpy
            outputs[tensor.name] = np.frombuffer(raw, dtype=dtype).reshape(shape)
    return outputs


class DataPlaneModelCaller:
    """Runs BLS calls on the server's event loop through its data plane."""

    def __init__(self, dataplane: DataPlane, loop: asyncio.AbstractEventLoop) -> None:
        self._dataplane = dataplane
        self._loop = loop

    def submit(self, call: ModelCall) -> concurrent.futures.Future[ModelOutputs]:
        try:
            request = self._dataplane.parse(encode_call(call))
        except errors.InferdError as error:
            failed: concurrent.futures.Future[ModelOutputs] = concurrent.futures.Future()
            failed.set_exception(error)
            return failed
        deadline_s = call.timeout_us / 1e6 if call.timeout_us > 0 else DEFAULT_CALL_TIMEOUT_S
        return asyncio.run_coroutine_threadsafe(self._run(request, deadline_s), self._loop)

    async def _run(self, request: Any, deadline_s: float | None) -> ModelOutputs:
        return decode_answer(await self._dataplane.infer(request, deadline_s=deadline_s))
