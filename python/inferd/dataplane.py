"""The data plane: what every transport calls. Checks a request against its model, runs it through
the core, and picks the outputs asked for. Knows nothing of gRPC."""

from __future__ import annotations

import math
from typing import Any

from inferd.batching import CoreTensor
from inferd.datatypes import count_bytes_elements
from inferd.errors import InvalidArgument
from inferd.models import LoadedModel, ModelRegistry, TensorSpec
from inferd.observability.telemetry import RequestTelemetry
from inferd.tensors import InferRequest, InferResponse, ParameterValue, Tensor


class DataPlane:
    def __init__(self, registry: ModelRegistry) -> None:
        self.registry = registry

    async def infer(
        self,
        request: InferRequest,
        *,
        deadline_s: float | None = None,
        observed: RequestTelemetry | None = None,
    ) -> InferResponse:
        """Runs ``request``. ``deadline_s``: seconds the caller will still wait, if it said;
        ``observed`` is told the version that answers and the core's timings."""
        model = self.registry.get(request.model_name, request.model_version)
        if observed is not None:
            observed.resolved(model.name, str(model.version))
        inputs, batch_size = _core_inputs(model, request.inputs)
        selected = _selected_outputs(model, request.outputs)
        results, timing = await model.scheduler.infer(
            inputs,
            batch_size,
            # Past 2^32 - 1 no model has the level; the core answers INVALID_ARGUMENT for it.
            priority=min(_non_negative(request.parameters, "priority"), 2**32 - 1),
            timeout_us=min(_non_negative(request.parameters, "timeout"), 2**64 - 1),
            deadline_s=deadline_s,
        )
        if observed is not None:
            observed.computed(timing)
        outputs = [
            Tensor(
                model.outputs[i].name,
                model.outputs[i].datatype.name,
                # The model's shape, back in the API's dims when the config reshapes the output.
                _reshaped(model, tuple(results[i][1]), model.outputs[i].dims)
                if model.outputs[i].reshape is not None
                else tuple(results[i][1]),
                results[i][2],
            )
            for i in selected
        ]
        return InferResponse(model.name, str(model.version), request.id, outputs)

    def metadata(self, name: str, version: str) -> tuple[LoadedModel, list[int]]:
        """The version asked for (default: the highest ready) and the versions to report: that
        one when the request names it, else every ready version (as Triton answers)."""
        model = self.registry.get(name, version)
        return model, [model.version] if version else self.registry.ready_versions(name)

    def statistics(self, name: str, version: str) -> list[tuple[LoadedModel, dict[str, Any]]]:
        """Each loaded version's statistics: one model (and version) or, with no name, all."""
        models = [self.registry.get(name, version)] if name else self.registry.loaded()
        if name and not version:
            models = [self.registry.get(name, str(v)) for v in self.registry.ready_versions(name)]
        return [(m, m.scheduler.statistics()) for m in models]


def _non_negative(parameters: dict[str, ParameterValue], key: str) -> int:
    """A reserved integer request parameter (``priority``, ``timeout`` in µs); 0 if absent."""
    value = parameters.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgument(f"request parameter {key!r} must be a non-negative integer")
    return value


def _reshaped(
    model: LoadedModel, shape: tuple[int, ...], dims: tuple[int, ...] | None
) -> tuple[int, ...]:
    """``shape`` (batch dim first when the model batches) with its other dims replaced by
    ``dims``, whose one -1 takes what is left of the element count. ``dims`` None: unchanged."""
    if dims is None:
        return shape
    batch = shape[:1] if model.max_batch_size > 0 else ()
    count = math.prod(shape[len(batch) :])
    known = math.prod(d for d in dims if d != -1)
    resolved = tuple(count // known if d == -1 and known else d for d in dims)
    return batch + resolved


def _core_inputs(model: LoadedModel, given: list[Tensor]) -> tuple[list[CoreTensor], int]:
    by_name: dict[str, Tensor] = {}
    for tensor in given:
        if tensor.name in by_name:
            raise InvalidArgument(f"input {tensor.name!r} is given twice")
        by_name[tensor.name] = tensor
    expected = {spec.name for spec in model.inputs}
    unexpected = sorted(set(by_name) - expected)
    if unexpected:
        raise InvalidArgument(
            f"model {model.name!r} has no input(s) {unexpected}; its inputs are {sorted(expected)}"
        )
    batch_size: int | None = None
    first = ""
    core: list[CoreTensor] = []
    for spec in model.inputs:
        found = by_name.get(spec.name)
        if found is None:
            if spec.optional:
                core.append((spec.datatype.config_type, (), None))  # the core: absent
                continue
            raise InvalidArgument(f"model {model.name!r} needs input {spec.name!r}, it is missing")
        rows = _check_input(model, spec, found)
        if batch_size is None:
            batch_size, first = rows, spec.name
        elif rows != batch_size:
            raise InvalidArgument(
                f"input {spec.name!r} has batch size {rows}, input {first!r} has {batch_size}"
            )
        core.append(
            (spec.datatype.config_type, _reshaped(model, found.shape, spec.reshape), found.data)
        )
    if batch_size is None:
        raise InvalidArgument(f"model {model.name!r}: a request must give at least one input")
    return core, batch_size


def _check_input(model: LoadedModel, spec: TensorSpec, tensor: Tensor) -> int:
    """Checks datatype, shape and byte size; returns the request's batch size (1 if none)."""
    where = f"input {spec.name!r} of model {model.name!r}"
    if tensor.datatype != spec.datatype.name:
        raise InvalidArgument(f"{where} takes {spec.datatype.name}, got {tensor.datatype}")
    shape = tensor.shape
    if any(d < 0 for d in shape):
        raise InvalidArgument(f"{where}: shape {list(shape)} has a negative dimension")
    batched = model.max_batch_size > 0
    want = ((-1,) if batched else ()) + spec.dims
    if len(shape) != len(want) or any(w != -1 and w != s for w, s in zip(want, shape, strict=True)):
        raise InvalidArgument(f"{where} takes shape {list(want)} (-1 = any), got {list(shape)}")
    rows = shape[0] if batched else 1
    if batched and not 1 <= rows <= model.max_batch_size:
        raise InvalidArgument(
            f"{where}: batch size {rows} is outside 1..{model.max_batch_size} (max_batch_size)"
        )
    elements = math.prod(shape)
    data = tensor.data if isinstance(tensor.data, bytes) else tensor.data.tobytes()
    size = len(data)
    if spec.datatype.is_bytes:
        try:
            count = count_bytes_elements(data)
        except ValueError as e:
            raise InvalidArgument(f"{where}: malformed BYTES data: {e}") from None
        if count != elements:
            raise InvalidArgument(f"{where}: {count} BYTES elements for shape {list(shape)}")
    elif size != elements * spec.datatype.itemsize:
        raise InvalidArgument(
            f"{where}: {size} bytes of data, shape {list(shape)} of {spec.datatype.name} "
            f"needs {elements * spec.datatype.itemsize}"
        )
    return rows


def _selected_outputs(model: LoadedModel, requested: list[str]) -> list[int]:
    index = {spec.name: i for i, spec in enumerate(model.outputs)}
    if not requested:
        return list(range(len(model.outputs)))
    selected: list[int] = []
    for name in requested:
        if name not in index:
            raise InvalidArgument(
                f"model {model.name!r} has no output {name!r}; its outputs are {sorted(index)}"
            )
        selected.append(index[name])
    return selected
