"""Completing a config from its ONNX model, as Triton's auto-complete does: what config.pbtxt
leaves out (inputs, outputs, dims, ``max_batch_size``) is read from the model, a model that
batches without naming a scheduler gets ``dynamic_batching { }``, and what the config states is
checked against the model, a mismatch failing the load with a message naming both sides.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import inferd._proto.model_config_pb2 as model_config_pb2
from inferd._proto.model_config_pb2 import ModelConfig
from inferd.datatypes import BY_CONFIG_TYPE, BY_ONNX_TYPE, Datatype
from inferd.errors import ModelLoadError
from inferd.repository.layout import without_model_dir


@dataclass(frozen=True)
class ModelTensor:
    """A tensor as the ONNX model declares it: full shape, -1 for a symbolic or unknown dim.
    ``has_default``: an input backed by an initializer, which a request may leave out."""

    name: str
    datatype: Datatype
    shape: tuple[int, ...]
    has_default: bool = False


def read_onnx_signature(path: Path, where: str = "") -> tuple[list[ModelTensor], list[ModelTensor]]:
    """The graph's inputs and outputs, without loading weights. Inputs that are also
    initializers (overridable weights, IR version 4 and later) are marked ``has_default``.
    ``where`` names the file in messages (default: its path)."""
    import onnx  # deferred: only loading a model needs it

    where = where or str(path)
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:
        raise ModelLoadError(
            f"{where}: not a readable ONNX model: {without_model_dir(str(e), path)}"
        ) from e
    initializers = {init.name for init in model.graph.initializer}

    def tensor(value_info: Any, has_default: bool = False) -> ModelTensor:
        tensor_type = value_info.type.tensor_type
        datatype = BY_ONNX_TYPE.get(tensor_type.elem_type)
        if datatype is None:
            raise ModelLoadError(
                f"{where}: tensor {value_info.name!r} has ONNX element type "
                f"{tensor_type.elem_type}, which the protocol cannot carry"
            )
        dims = tuple(d.dim_value if d.HasField("dim_value") else -1 for d in tensor_type.shape.dim)
        return ModelTensor(value_info.name, datatype, dims, has_default)

    overridable = model.ir_version >= 4
    inputs = [
        tensor(v, has_default=v.name in initializers)
        for v in model.graph.input
        if overridable or v.name not in initializers
    ]
    outputs = [tensor(v) for v in model.graph.output]
    return inputs, outputs


def _batchable(tensors: list[ModelTensor]) -> bool:
    return all(len(t.shape) >= 1 and t.shape[0] == -1 for t in tensors)


def complete_config(
    config: ModelConfig,
    inputs: list[ModelTensor],
    outputs: list[ModelTensor],
    default_max_batch_size: int,
) -> None:
    """Fills in what the config leaves out from the model's declared tensors: max_batch_size
    (when every tensor has a variable first dim), ``dynamic_batching { }`` for a batching model
    that names no scheduler, the inputs and outputs, and one CPU instance."""
    stated_io = bool(config.input) or bool(config.output)
    if config.max_batch_size == 0 and not stated_io and _batchable(inputs + outputs):
        # A dynamic first dim on every tensor: the model batches (Triton's ORT default is 4).
        config.max_batch_size = default_max_batch_size
    if config.max_batch_size > 0 and config.WhichOneof("scheduling_choice") is None:
        # No scheduler named: Triton's ONNX Runtime backend completes `dynamic_batching { }`
        # (zero delay), so a batching model batches without a config.pbtxt.
        config.dynamic_batching.SetInParent()
    skip = 1 if config.max_batch_size > 0 else 0
    if not config.input:
        # Triton's completion lists the inputs a request must give; weights that a request may
        # override stay out unless the config names them, and so do the control inputs the core
        # writes (sequence_batching).
        written = {c.name for c in config.sequence_batching.control_input} | {
            s.input_name for s in config.sequence_batching.state
        }
        for t in (t for t in inputs if not t.has_default and t.name not in written):
            config.input.add(name=t.name, data_type=t.datatype.config_type, dims=t.shape[skip:])
    if not config.output:
        # An implicit state's output stays the core's unless the config lists it.
        kept = {s.output_name for s in config.sequence_batching.state}
        for t in (t for t in outputs if t.name not in kept):
            config.output.add(name=t.name, data_type=t.datatype.config_type, dims=t.shape[skip:])
    if not config.instance_group:
        config.instance_group.add(count=1, kind=model_config_pb2.ModelInstanceGroup.KIND_CPU)
    for group in config.instance_group:
        if group.count == 0:
            group.count = 1


def check_against_model(
    config: ModelConfig, inputs: list[ModelTensor], outputs: list[ModelTensor]
) -> None:
    """Checks what the completed config states against the model; a mismatch fails the load
    with a message naming both sides."""
    batched = config.max_batch_size > 0
    if config.max_batch_size < 0:
        raise ModelLoadError(f"model {config.name!r}: max_batch_size must not be negative")
    for kind, stated, declared, complete in (
        ("input", config.input, inputs, True),
        ("output", config.output, outputs, False),
    ):
        by_name = {t.name: t for t in declared}
        seen: set[str] = set()
        for tensor in stated:
            where = f"model {config.name!r} {kind} {tensor.name!r}"
            if tensor.name in seen:
                raise ModelLoadError(f"{where}: listed twice in config.pbtxt")
            seen.add(tensor.name)
            model_tensor = by_name.get(tensor.name)
            if model_tensor is None:
                raise ModelLoadError(
                    f"{where}: config.pbtxt names it, the ONNX model has no such {kind} "
                    f"(it has {sorted(by_name)})"
                )
            optional = isinstance(tensor, model_config_pb2.ModelInput) and tensor.optional
            if optional and not model_tensor.has_default:
                raise ModelLoadError(
                    f"{where}: config.pbtxt makes it optional, the ONNX model requires it "
                    "(only an input backed by an initializer can be left out)"
                )
            configured = BY_CONFIG_TYPE.get(tensor.data_type)
            if configured is None:
                raise ModelLoadError(f"{where}: config.pbtxt sets no valid data_type")
            if configured != model_tensor.datatype:
                raise ModelLoadError(
                    f"{where}: config.pbtxt says {configured.config_name}, "
                    f"the ONNX model says {model_tensor.datatype.config_name}"
                )
            # With `reshape`, the model sees reshape.shape where clients see dims.
            model_dims = tuple(tensor.reshape.shape) if tensor.HasField("reshape") else None
            if model_dims is not None:
                _check_reshape(where, tuple(tensor.dims), model_dims)
            full = ((-1,) if batched else ()) + (
                model_dims if model_dims is not None else tuple(tensor.dims)
            )
            if len(full) != len(model_tensor.shape) or any(
                c != m and m != -1 for c, m in zip(full, model_tensor.shape, strict=True)
            ):
                raise ModelLoadError(
                    f"{where}: config.pbtxt gives shape {list(full)} "
                    f"({'batch dim + ' if batched else ''}dims), "
                    f"the ONNX model has {list(model_tensor.shape)} (-1 = variable)"
                )
            if batched and model_tensor.shape[0] != -1:
                raise ModelLoadError(
                    f"{where}: max_batch_size > 0 needs a variable first dim, "
                    f"the ONNX model fixes it to {model_tensor.shape[0]}"
                )
        if complete:
            required = {t.name for t in declared if not t.has_default}
            if kind == "input":  # the core writes a stateful model's control inputs and states
                seen |= {c.name for c in config.sequence_batching.control_input}
                seen |= {s.input_name for s in config.sequence_batching.state}
            missing = sorted(required - seen)
            if missing:
                raise ModelLoadError(
                    f"model {config.name!r}: the ONNX model needs {kind}s {missing}, "
                    "config.pbtxt does not list them"
                )
    _check_states(config, inputs, outputs)


def _check_states(
    config: ModelConfig, inputs: list[ModelTensor], outputs: list[ModelTensor]
) -> None:
    """Each implicit state's input and output are the ONNX model's, of the state's data_type
    and of a shape its dims allow (after the batch dim when the model batches)."""
    batched = config.max_batch_size > 0
    for state in config.sequence_batching.state:
        full = ((-1,) if batched else ()) + tuple(state.dims)
        for kind, name, declared in (
            ("input", state.input_name, inputs),
            ("output", state.output_name, outputs),
        ):
            where = f"model {config.name!r}: sequence_batching.state {kind} {name!r}"
            model_tensor = next((t for t in declared if t.name == name), None)
            if model_tensor is None:
                raise ModelLoadError(
                    f"{where}: the ONNX model has no such {kind} "
                    f"(it has {sorted(t.name for t in declared)})"
                )
            stated = BY_CONFIG_TYPE.get(state.data_type)
            if stated is None or model_tensor.datatype != stated:
                raise ModelLoadError(
                    f"{where}: the state is {stated.config_name if stated else 'no valid type'}, "
                    f"the ONNX model says {model_tensor.datatype.config_name}"
                )
            if len(full) != len(model_tensor.shape) or any(
                c != m and -1 not in (c, m) for c, m in zip(full, model_tensor.shape, strict=True)
            ):
                raise ModelLoadError(
                    f"{where}: the state's shape is {list(full)}, "
                    f"the ONNX model has {list(model_tensor.shape)} (-1 = variable)"
                )


def _check_reshape(where: str, dims: tuple[int, ...], reshape: tuple[int, ...]) -> None:
    """dims and reshape.shape must hold the same number of elements; each may leave one -1."""
    for label, shape in (("dims", dims), ("reshape", reshape)):
        if shape.count(-1) > 1 or any(d < -1 for d in shape):
            raise ModelLoadError(f"{where}: {label} {list(shape)} may have one -1 at most")
    if -1 not in dims and -1 not in reshape and math.prod(dims) != math.prod(reshape):
        raise ModelLoadError(
            f"{where}: dims {list(dims)} and reshape {list(reshape)} hold different numbers "
            "of elements"
        )
    if (-1 in dims) != (-1 in reshape):
        raise ModelLoadError(
            f"{where}: dims {list(dims)} and reshape {list(reshape)} must both be variable or "
            "both be fixed"
        )
