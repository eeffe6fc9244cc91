"""Protocol messages <-> inferd's own request, response and model types. The only place that
reads or builds ``inference.*`` messages' tensor and model fields."""

from __future__ import annotations

from typing import Any

import numpy as np

import inferd._proto.grpc_service_pb2 as pb
from inferd.datatypes import DATATYPES, serialize_bytes
from inferd.errors import InvalidArgument, Unimplemented
from inferd.models import LoadedModel, ModelStatus
from inferd.tensors import InferRequest, InferResponse, ParameterValue, Tensor

# Which InferTensorContents field carries each datatype (FP16 and BF16 have none: raw only).
_CONTENTS_FIELD: dict[str, str] = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
_SHARED_MEMORY_KEYS = ("shared_memory_region", "shared_memory_byte_size", "shared_memory_offset")


def parameters(fields: Any) -> dict[str, ParameterValue]:
    """map<string, InferParameter> -> plain values."""
    out: dict[str, ParameterValue] = {}
    for key, value in fields.items():
        choice = value.WhichOneof("parameter_choice")
        if choice is not None:
            out[key] = getattr(value, choice)
    return out


def decode_infer_request(request: Any) -> InferRequest:
    raw = request.raw_input_contents
    if raw and len(raw) != len(request.inputs):
        raise InvalidArgument(
            f"raw_input_contents has {len(raw)} entries for {len(request.inputs)} inputs; "
            "give one per input, in input order"
        )
    inputs: list[Tensor] = []
    for index, tensor in enumerate(request.inputs):
        if any(key in tensor.parameters for key in _SHARED_MEMORY_KEYS):
            raise Unimplemented(f"input {tensor.name!r}: shared-memory tensors are not supported")
        if tensor.datatype not in DATATYPES:
            raise InvalidArgument(f"input {tensor.name!r}: unknown datatype {tensor.datatype!r}")
        shape = tuple(int(d) for d in tensor.shape)
        if raw:
            if tensor.HasField("contents"):
                raise InvalidArgument(
                    f"input {tensor.name!r}: contents must not be set "
                    "when raw_input_contents is used"
                )
            data = raw[index]
        else:
            data = _typed_contents(tensor.name, tensor.datatype, tensor.contents)
        inputs.append(Tensor(tensor.name, tensor.datatype, shape, data))
    outputs: list[str] = []
    for output in request.outputs:
        if any(key in output.parameters for key in _SHARED_MEMORY_KEYS):
            raise Unimplemented(f"output {output.name!r}: shared-memory tensors are not supported")
        if "classification" in output.parameters:
            raise Unimplemented(
                f"output {output.name!r}: the classification extension is not supported"
            )
        outputs.append(output.name)
    return InferRequest(
        model_name=request.model_name,
        model_version=request.model_version,
        id=request.id,
        inputs=inputs,
        outputs=outputs,
        parameters=parameters(request.parameters),
    )


def _typed_contents(name: str, datatype: str, contents: Any) -> bytes:
    field = _CONTENTS_FIELD.get(datatype)
    if field is None:
        raise InvalidArgument(
            f"input {name!r}: {datatype} has no typed contents field; send it in raw_input_contents"
        )
    values = getattr(contents, field)
    if datatype == "BYTES":
        return serialize_bytes(list(values))
    try:
        array = np.array(list(values), dtype=DATATYPES[datatype].numpy)
    except (OverflowError, ValueError) as e:
        raise InvalidArgument(f"input {name!r}: {field} does not fit {datatype}: {e}") from None
    return array.tobytes()


def encode_infer_response(response: InferResponse) -> Any:
    message = pb.ModelInferResponse(
        model_name=response.model_name, model_version=response.model_version, id=response.id
    )
    for tensor in response.outputs:
        message.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        # Outputs always travel raw: tritonclient reads only raw_output_contents.
        data = tensor.data
        message.raw_output_contents.append(data if isinstance(data, bytes) else data.tobytes())
    return message


def _shape(model: LoadedModel, dims: tuple[int, ...]) -> list[int]:
    return ([-1] if model.max_batch_size > 0 else []) + list(dims)


def encode_model_metadata(model: LoadedModel, versions: list[int]) -> Any:
    message = pb.ModelMetadataResponse(
        name=model.name, versions=[str(v) for v in versions], platform=model.config.platform
    )
    for spec in model.inputs:
        message.inputs.add(
            name=spec.name, datatype=spec.datatype.name, shape=_shape(model, spec.dims)
        )
    for spec in model.outputs:
        message.outputs.add(
            name=spec.name, datatype=spec.datatype.name, shape=_shape(model, spec.dims)
        )
    return message


def _duration(target: Any, source: dict[str, int]) -> None:
    target.count = source["count"]
    target.ns = source["ns"]


def encode_model_statistics(entries: list[tuple[LoadedModel, dict[str, Any]]]) -> Any:
    message = pb.ModelStatisticsResponse()
    for model, stats in entries:
        out = message.model_stats.add(
            name=model.name,
            version=str(model.version),
            last_inference=stats["last_inference_ms"],
            inference_count=stats["inference_count"],
            execution_count=stats["execution_count"],
        )
        for key in ("success", "fail", "queue", "compute_input", "compute_infer", "compute_output"):
            _duration(getattr(out.inference_stats, key), stats[key])
        for size, batch in sorted(stats["batches"].items()):
            entry = out.batch_stats.add(batch_size=size)
            for key in ("compute_input", "compute_infer", "compute_output"):
                _duration(getattr(entry, key), batch[key])
    return message


def encode_repository_index(statuses: list[ModelStatus], ready_only: bool) -> Any:
    message = pb.RepositoryIndexResponse()
    for status in statuses:
        if ready_only and status.state.value != "READY":
            continue
        message.models.add(
            name=status.name, version=status.version, state=status.state.value, reason=status.reason
        )
    return message


def log_settings(request: Any) -> dict[str, bool | int | str]:
    """LogSettingsRequest.settings -> plain values (settings with no value are skipped)."""
    out: dict[str, bool | int | str] = {}
    for key, value in request.settings.items():
        choice = value.WhichOneof("parameter_choice")
        if choice is not None:
            out[key] = getattr(value, choice)
    return out


def encode_log_settings(settings: dict[str, bool | int | str]) -> Any:
    message = pb.LogSettingsResponse()
    for key, value in settings.items():
        entry = message.settings[key]
        if isinstance(value, bool):
            entry.bool_param = value
        elif isinstance(value, int):
            entry.uint32_param = value
        else:
            entry.string_param = value
    return message
