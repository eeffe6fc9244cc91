"""Protocol messages <-> inferd's model, statistics and settings types: the only place that reads
or builds ``inference.*`` messages' model fields. Inference requests and responses are not here:
the core parses and writes those bytes itself (``inferd.core.parse_infer_request``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import inferd._proto.grpc_service_pb2 as pb
from inferd.models import LoadedModel, ModelStatus

if TYPE_CHECKING:
    from inferd._core import Duration, StatisticsSnapshot

ParameterValue = bool | int | float | str


def parameters(
    fields: Mapping[str, pb.InferParameter | pb.LogSettingsRequest.SettingValue],
) -> dict[str, ParameterValue]:
    """A protocol map of one-of values (InferParameter, LogSettings' SettingValue) -> plain
    values; an entry with no value set is skipped."""
    out: dict[str, ParameterValue] = {}
    for key, value in fields.items():
        choice = value.WhichOneof("parameter_choice")
        if choice is not None:
            out[key] = getattr(value, choice)
    return out


def _shape(model: LoadedModel, dims: tuple[int, ...]) -> list[int]:
    return ([-1] if model.max_batch_size > 0 else []) + list(dims)


def encode_model_metadata(model: LoadedModel, versions: list[int]) -> pb.ModelMetadataResponse:
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


def _duration(target: pb.StatisticDuration, source: Duration) -> None:
    target.count = source.count
    target.ns = source.ns


def encode_model_statistics(
    entries: list[tuple[LoadedModel, StatisticsSnapshot]],
) -> pb.ModelStatisticsResponse:
    message = pb.ModelStatisticsResponse()
    for model, stats in entries:
        out = message.model_stats.add(
            name=model.name,
            version=str(model.version),
            last_inference=stats.last_inference_ms,
            inference_count=stats.inference_count,
            execution_count=stats.execution_count,
        )
        infer = out.inference_stats
        _duration(infer.success, stats.success)
        _duration(infer.fail, stats.fail)
        _duration(infer.queue, stats.queue)
        _duration(infer.compute_input, stats.compute_input)
        _duration(infer.compute_infer, stats.compute_infer)
        _duration(infer.compute_output, stats.compute_output)
        _duration(infer.cache_hit, stats.cache_hit)
        _duration(infer.cache_miss, stats.cache_miss)
        for size, batch in sorted(stats.batches.items()):
            entry = out.batch_stats.add(batch_size=size)
            _duration(entry.compute_input, batch.compute_input)
            _duration(entry.compute_infer, batch.compute_infer)
            _duration(entry.compute_output, batch.compute_output)
    return message


def encode_repository_index(
    statuses: list[ModelStatus], ready_only: bool
) -> pb.RepositoryIndexResponse:
    message = pb.RepositoryIndexResponse()
    for status in statuses:
        if ready_only and status.state.value != "READY":
            continue
        message.models.add(
            name=status.name, version=status.version, state=status.state.value, reason=status.reason
        )
    return message


def encode_log_settings(settings: dict[str, bool | int | str]) -> pb.LogSettingsResponse:
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


def trace_settings(
    fields: Mapping[str, pb.TraceSettingRequest.SettingValue],
) -> dict[str, list[str]]:
    """TraceSetting's request map -> {key: values} (no values: clear the setting)."""
    return {key: list(value.value) for key, value in fields.items()}


def encode_trace_settings(settings: Mapping[str, list[str]]) -> pb.TraceSettingResponse:
    return pb.TraceSettingResponse(
        settings={
            key: pb.TraceSettingResponse.SettingValue(value=values)
            for key, values in settings.items()
        }
    )
