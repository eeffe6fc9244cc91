"""Model-to-model calls from python models (Triton's Business Logic Scripting).

A worker's ``InferenceRequest.exec`` reaches the server as a ``ModelCall``; ``DataPlaneModelCaller``
runs it as a ModelInferRequest through the data plane, exactly as a client's request arrives:
the named model (and version, or the highest ready), the core's checks of every tensor, the
model's scheduler and batcher, batched with the model's other traffic - without gRPC. The
answer's tensors go back to the worker.

Cycles: each call carries the chain of python models whose calls led to it (the request
parameter ``CALL_CHAIN_PARAMETER``, a JSON list, which the called model's ``parameters()`` does
not show). A call to a model already in its chain (A -> B -> A) would wait behind a batch that
waits on it, so it is refused, naming the chain. A call without a timeout of its own gets
``DEFAULT_CALL_TIMEOUT_S``; either way it is cancelled once every request of the calling batch
was cancelled or passed its deadline.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Protocol

import numpy as np
import numpy.typing as npt

import inferd._proto.grpc_service_pb2 as pb
from inferd import errors
from inferd.datatypes import DATATYPES, serialize_bytes
from inferd.python_backend import ipc

if TYPE_CHECKING:
    from inferd.dataplane import DataPlane
    from inferd.python_backend.process import PythonRequest

ModelOutputs = dict[str, npt.NDArray[Any]]

# The request parameter carrying a BLS call's chain of calling models (a JSON list of names).
CALL_CHAIN_PARAMETER: Final = "inferd_bls_chain"
# A call whose model set no timeout (InferenceRequest(timeout=...), in microseconds) has this.
DEFAULT_CALL_TIMEOUT_S: Final = 60.0


@dataclass
class ModelCall:
    """One BLS request, as the calling model built it."""

    model: str
    version: int  # -1: the highest ready version
    inputs: dict[str, npt.NDArray[Any]]  # BYTES inputs as object arrays of bytes or str
    requested_output_names: list[str] = field(default_factory=list)  # empty: every output
    request_id: str = ""
    parameters: str = "{}"  # a JSON object of bool, int and str values
    timeout_us: int = 0  # 0: DEFAULT_CALL_TIMEOUT_S
    chain: tuple[str, ...] = ()  # the calling models, first caller first, the caller last


def call_chain(batch: Sequence[PythonRequest], caller: str) -> tuple[str, ...]:
    """The chain a call made from ``batch`` by model ``caller`` carries: every model that led to
    a request of the batch (any of them may wait on this batch), then the caller."""
    seen = [model for request in batch for model in request.call_chain]
    return (*dict.fromkeys(seen), caller)


def split_chain(parameters: str) -> tuple[tuple[str, ...], str]:
    """A request's call chain and its parameters without it (the model does not see it). A
    chain that is not a JSON list of names (a client's own parameter) counts as none."""
    if CALL_CHAIN_PARAMETER not in parameters:  # a client's request: no JSON to read
        return (), parameters
    try:
        decoded = json.loads(parameters)
    except json.JSONDecodeError:
        return (), parameters
    if not isinstance(decoded, dict) or CALL_CHAIN_PARAMETER not in decoded:
        return (), parameters
    raw = decoded.pop(CALL_CHAIN_PARAMETER)
    try:
        names = json.loads(raw) if isinstance(raw, str) else None
    except json.JSONDecodeError:
        names = None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        names = []
    return tuple(names), json.dumps(decoded)


class ModelCaller(Protocol):
    """Runs BLS calls; thread-safe, never blocks the caller for the computation."""

    def submit(self, call: ModelCall) -> concurrent.futures.Future[ModelOutputs]: ...


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
