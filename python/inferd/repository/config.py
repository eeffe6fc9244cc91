"""A model's configuration: ``config.pbtxt`` (protobuf text format) completed from the ONNX model.

What the config leaves out (inputs, outputs, dims, ``max_batch_size``) is read from the model, as
Triton's auto-complete does, and a model that batches without naming a scheduler gets
``dynamic_batching { }``; what it states is checked against the model, and a mismatch fails the
load with a message naming both sides. ``ModelConfig`` answers with the completed config.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
from google.protobuf import json_format, text_format
from google.protobuf.message import Message

import inferd._proto.model_config_pb2 as model_config_pb2
from inferd.batching.policy import BatchingPolicy, Padding, QueuePolicy
from inferd.datatypes import BY_CONFIG_TYPE, BY_ONNX_TYPE, Datatype
from inferd.errors import ModelLoadError
from inferd.repository.instances import gpu_accelerator, resolve_instance_kinds
from inferd.repository.layout import CONFIG_FILE, model_file_label, without_model_dir

log = structlog.get_logger(__name__)

ModelConfig = model_config_pb2.ModelConfig

ONNX_PLATFORM = "onnxruntime_onnx"
ONNX_BACKEND = "onnxruntime"
TENSORRT_PLATFORM = "tensorrt_plan"
TENSORRT_BACKEND = "tensorrt"
ONNX_FILE = "model.onnx"
PLAN_FILE = "model.plan"
# Config parameter: "tensorrt" builds an ONNX model into a TensorRT engine for KIND_GPU instances.
EXECUTOR = "inferd.executor"
RUNNABLE = (
    f"inferd runs ONNX models (platform {ONNX_PLATFORM!r}, backend {ONNX_BACKEND!r}) and "
    f"TensorRT engines (platform {TENSORRT_PLATFORM!r}, backend {TENSORRT_BACKEND!r})"
)


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


def parse_config_text(text: str, source: str) -> ModelConfig:
    """config.pbtxt text -> ModelConfig; ModelLoadError naming the line on a syntax error."""
    config = ModelConfig()
    try:
        text_format.Parse(text, config)
    except text_format.ParseError as e:
        raise ModelLoadError(f"{source}: {e}") from e
    return config


def parse_config_json(text: str, source: str) -> ModelConfig:
    """A config given as JSON (Triton's load-request override) -> ModelConfig."""
    config = ModelConfig()
    try:
        json_format.Parse(text, config, descriptor_pool=model_config_pb2.DESCRIPTOR.pool)
    except json_format.ParseError as e:
        raise ModelLoadError(f"{source}: {e}") from e
    return config


def stated_config(
    config_path: Path | None, override: ModelConfig | None = None, *, name: str = ""
) -> ModelConfig:
    """The config as written (``override``, a load request's, replaces config.pbtxt), before
    completion; an empty one without either. A backend or platform inferd cannot run is refused
    here, before anything looks for the model's file. ``name``: the model's, for messages
    (default: the name of config.pbtxt's folder, else the config's own)."""
    if not name and config_path is not None:
        name = config_path.parent.name
    config = ModelConfig()
    if override is not None:
        config.CopyFrom(override)
    elif config_path is not None:
        where = f"model {name!r} {CONFIG_FILE}"
        try:
            text = config_path.read_text(encoding="utf-8")
        except UnicodeDecodeError as e:
            raise ModelLoadError(f"{where} is not UTF-8 text: {e.reason} at byte {e.start}") from e
        except OSError as e:
            log.warning("cannot read a model's config", path=str(config_path), error=str(e))
            raise ModelLoadError(
                f"{where} cannot be read ({e.strerror or type(e).__name__})"
            ) from e
        config = parse_config_text(text, where)
    _check_runnable(config, name or config.name)
    return config


def _check_runnable(config: ModelConfig, name: str) -> None:
    """Refuses a platform or backend that inferd has no executor for (Triton's python, pytorch,
    tensorflow, ensemble ...), saying which ones it runs."""
    where = f"model {name!r}" if name else "the model"
    if config.platform and config.platform not in (ONNX_PLATFORM, TENSORRT_PLATFORM):
        raise ModelLoadError(
            f"{where}: platform {config.platform!r} is not one inferd can run; {RUNNABLE}"
        )
    if config.backend and config.backend not in (ONNX_BACKEND, TENSORRT_BACKEND):
        raise ModelLoadError(
            f"{where}: backend {config.backend!r} is not one inferd can run; {RUNNABLE}"
        )


def model_filename(config: ModelConfig) -> str:
    """The file a version folder holds for this config: its default_model_filename, else the
    platform's (model.plan for TensorRT engines, model.onnx otherwise)."""
    if config.default_model_filename:
        return config.default_model_filename
    return PLAN_FILE if config.platform == TENSORRT_PLATFORM else ONNX_FILE


def load_model_config(
    name: str,
    config_path: Path | None,
    model_path: Path,
    *,
    default_max_batch_size: int,
    override: ModelConfig | None = None,
    gpu_count: int = 0,
) -> ModelConfig:
    """The completed, checked config of model ``name`` whose model file is ``model_path``.
    ``override``, a ModelConfig, replaces config.pbtxt (a load request's config); ``gpu_count``,
    the CUDA devices this process sees, decides where KIND_AUTO instances go. A TensorRT engine
    (platform tensorrt_plan) is not read here: its config must state its inputs and outputs,
    and the engine is checked against them when it is loaded on a GPU."""
    config = stated_config(config_path, override, name=name)
    if config.name and config.name != name:
        raise ModelLoadError(
            f"model {name!r}: config.pbtxt names the model {config.name!r}; "
            "the name must match the folder"
        )
    config.name = name
    _check_supported(config)
    _check_platform(config)
    if config.platform == TENSORRT_PLATFORM:
        _check_stated_io(config)
        _complete(config, [], [], default_max_batch_size)
    else:
        inputs, outputs = read_onnx_signature(model_path, model_file_label(name, model_path))
        _complete(config, inputs, outputs, default_max_batch_size)
        _check_against_model(config, inputs, outputs)
    resolve_instance_kinds(config, gpu_count)
    gpu_accelerator(config)  # checked here so that every load path refuses a bad one
    executor = config.parameters[EXECUTOR].string_value if EXECUTOR in config.parameters else ""
    if executor not in ("", "onnxruntime", "tensorrt"):
        raise ModelLoadError(
            f"model {name!r}: parameter {EXECUTOR} is {executor!r} (onnxruntime or tensorrt)"
        )
    return config


def _check_stated_io(config: ModelConfig) -> None:
    if not config.input or not config.output:
        raise ModelLoadError(
            f"model {config.name!r}: a tensorrt_plan config must list its inputs and outputs "
            "(inferd checks the engine against them when it loads it on a GPU)"
        )
    tensors: list[model_config_pb2.ModelInput | model_config_pb2.ModelOutput] = [
        *config.input,
        *config.output,
    ]
    for tensor in tensors:
        if tensor.data_type not in BY_CONFIG_TYPE:
            raise ModelLoadError(
                f"model {config.name!r} tensor {tensor.name!r}: "
                "config.pbtxt sets no valid data_type"
            )


# What config.pbtxt may set: whole subtrees, and single fields (paths through repeated fields
# name the field once: "input.dims"). Anything else with a value is refused at load, never ignored.
_SUPPORTED_TREES = frozenset(
    {
        "version_policy",
        "dynamic_batching",
        "parameters",
        "model_warmup",
        "input.reshape",
        "output.reshape",
        "optimization.execution_accelerators",
    }
)
_SUPPORTED_FIELDS = frozenset(
    {
        "name",
        "platform",
        "backend",
        "max_batch_size",
        "default_model_filename",
        "input.name",
        "input.data_type",
        "input.dims",
        "input.optional",
        "output.name",
        "output.data_type",
        "output.dims",
        "instance_group.name",
        "instance_group.count",
        "instance_group.kind",
        "instance_group.gpus",
    }
)


def _unsupported_paths(message: Message, prefix: str = "") -> list[str]:
    """Paths of the fields set in ``message`` that inferd does not honour (yet)."""
    found: list[str] = []
    for field, value in message.ListFields():
        path = prefix + field.name
        if path in _SUPPORTED_FIELDS or path in _SUPPORTED_TREES:
            continue
        is_message = (
            field.message_type is not None and not field.message_type.GetOptions().map_entry
        )
        has_supported_children = any(
            s.startswith(path + ".") for s in _SUPPORTED_FIELDS | _SUPPORTED_TREES
        )
        if is_message and has_supported_children:
            children = value if field.is_repeated else [value]
            for child in children:
                found += [p for p in _unsupported_paths(child, path + ".") if p not in found]
        elif is_message and not field.is_repeated and not value.ListFields():
            continue  # an empty section, e.g. `optimization { }`: asks for nothing
        else:
            found.append(path)
    return found


def _check_supported(config: ModelConfig) -> None:
    unsupported = _unsupported_paths(config)
    if unsupported:
        raise ModelLoadError(
            f"model {config.name!r}: config.pbtxt sets {', '.join(unsupported)}, which inferd "
            "does not support yet (refused rather than ignored)"
        )


def _check_platform(config: ModelConfig) -> None:
    """Completes platform and backend (either names the other); ``stated_config`` has refused
    what inferd cannot run."""
    if config.platform == TENSORRT_PLATFORM or config.backend == TENSORRT_BACKEND:
        config.platform, config.backend = TENSORRT_PLATFORM, TENSORRT_BACKEND
        return
    config.platform = ONNX_PLATFORM
    config.backend = ONNX_BACKEND


def _batchable(tensors: list[ModelTensor]) -> bool:
    return all(len(t.shape) >= 1 and t.shape[0] == -1 for t in tensors)


def _complete(
    config: ModelConfig,
    inputs: list[ModelTensor],
    outputs: list[ModelTensor],
    default_max_batch_size: int,
) -> None:
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
        # override stay out unless the config names them.
        for t in (t for t in inputs if not t.has_default):
            config.input.add(name=t.name, data_type=t.datatype.config_type, dims=t.shape[skip:])
    if not config.output:
        for t in outputs:
            config.output.add(name=t.name, data_type=t.datatype.config_type, dims=t.shape[skip:])
    if not config.instance_group:
        config.instance_group.add(count=1, kind=model_config_pb2.ModelInstanceGroup.KIND_CPU)
    for group in config.instance_group:
        if group.count == 0:
            group.count = 1


def _check_against_model(
    config: ModelConfig, inputs: list[ModelTensor], outputs: list[ModelTensor]
) -> None:
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
            missing = sorted(required - seen)
            if missing:
                raise ModelLoadError(
                    f"model {config.name!r}: the ONNX model needs {kind}s {missing}, "
                    "config.pbtxt does not list them"
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


def batching_policy(config: ModelConfig) -> BatchingPolicy:
    """The completed config's dynamic_batching section as a BatchingPolicy, checked."""
    name = config.name
    if config.WhichOneof("scheduling_choice") not in (None, "dynamic_batching"):
        raise ModelLoadError(
            f"model {name!r}: {config.WhichOneof('scheduling_choice')} is not supported"
        )
    if not config.HasField("dynamic_batching"):
        if any(key in config.parameters for key in PADDING_KEYS):
            raise ModelLoadError(f"model {name!r}: padding parameters need dynamic_batching")
        return BatchingPolicy(dynamic=False, max_batch_size=int(config.max_batch_size))
    section = config.dynamic_batching
    max_batch_size = int(config.max_batch_size)
    if max_batch_size == 0:
        raise ModelLoadError(
            f"model {name!r}: dynamic_batching needs max_batch_size > 0 (the model does not batch)"
        )
    for size in section.preferred_batch_size:
        if not 1 <= size <= max_batch_size:
            raise ModelLoadError(
                f"model {name!r}: dynamic_batching.preferred_batch_size {size} is outside "
                f"1..{max_batch_size} (max_batch_size)"
            )
    levels = int(section.priority_levels)
    if levels and not 1 <= section.default_priority_level <= levels:
        raise ModelLoadError(
            f"model {name!r}: dynamic_batching.default_priority_level "
            f"{section.default_priority_level} is outside 1..{levels} (priority_levels)"
        )
    for level in section.priority_queue_policy:
        if not 1 <= level <= levels:
            raise ModelLoadError(
                f"model {name!r}: dynamic_batching.priority_queue_policy names level {level}, "
                f"outside 1..{levels} (priority_levels)"
            )

    def queue_policy(policy: model_config_pb2.ModelQueuePolicy) -> QueuePolicy:
        return QueuePolicy(
            delay_on_timeout=policy.timeout_action == model_config_pb2.ModelQueuePolicy.DELAY,
            default_timeout_us=int(policy.default_timeout_microseconds),
            allow_timeout_override=bool(policy.allow_timeout_override),
            max_queue_size=int(policy.max_queue_size),
        )

    return BatchingPolicy(
        padding=_padding(config),
        dynamic=True,
        max_batch_size=max_batch_size,
        preferred_batch_sizes=tuple(int(s) for s in section.preferred_batch_size),
        max_queue_delay_us=int(section.max_queue_delay_microseconds),
        priority_levels=levels,
        default_priority_level=int(section.default_priority_level),
        default_queue_policy=queue_policy(section.default_queue_policy),
        level_queue_policies={
            int(level): queue_policy(p) for level, p in section.priority_queue_policy.items()
        },
        preserve_ordering=bool(section.preserve_ordering),
    )


# Config parameters that turn on padding of variable-length inputs (inferd's, beyond Triton):
PAD_INPUTS = "inferd.pad_inputs"  # comma-separated inputs padded to the longest in their batch
PAD_VALUE = "inferd.pad_value"  # the number written into the padding (default 0)
PAD_OUTPUTS = "inferd.pad_outputs"  # outputs sliced back to each request's own lengths
PADDING_KEYS = (PAD_INPUTS, PAD_VALUE, PAD_OUTPUTS)


def _names(config: ModelConfig, key: str) -> list[str]:
    value = config.parameters[key].string_value if key in config.parameters else ""
    return [n.strip() for n in value.split(",") if n.strip()]


def _padding(config: ModelConfig) -> Padding:
    """The padding the config's parameters ask for; the first padded input is the reference
    whose lengths the padded outputs' variable dims follow, in order."""
    name = config.name
    pad_inputs = _names(config, PAD_INPUTS)
    if not pad_inputs:
        if any(key in config.parameters for key in (PAD_VALUE, PAD_OUTPUTS)):
            raise ModelLoadError(f"model {name!r}: {PAD_VALUE}/{PAD_OUTPUTS} need {PAD_INPUTS}")
        return Padding()
    inputs = {t.name: (i, t) for i, t in enumerate(config.input)}
    outputs = {t.name: (i, t) for i, t in enumerate(config.output)}
    try:
        value = (
            float(config.parameters[PAD_VALUE].string_value or 0)
            if PAD_VALUE in config.parameters
            else 0.0
        )
    except ValueError:
        raise ModelLoadError(f"model {name!r}: {PAD_VALUE} must be a number") from None
    flags = [False] * len(config.input)
    for input_name in pad_inputs:
        if input_name not in inputs:
            raise ModelLoadError(f"model {name!r}: {PAD_INPUTS} names {input_name!r}, not an input")
        index, tensor = inputs[input_name]
        datatype = BY_CONFIG_TYPE[tensor.data_type]
        if datatype.is_bytes:
            raise ModelLoadError(f"model {name!r}: BYTES input {input_name!r} cannot be padded")
        if datatype.name in ("FP16", "BF16") and value != 0:
            raise ModelLoadError(f"model {name!r}: {datatype.name} inputs pad with 0 only")
        if -1 not in tensor.dims:
            raise ModelLoadError(
                f"model {name!r}: {PAD_INPUTS} names {input_name!r}, which has no variable dim"
            )
        flags[index] = True
    reference_index, reference = inputs[pad_inputs[0]]
    reference_dims = [d + 1 for d, size in enumerate(reference.dims) if size == -1]
    slices: list[tuple[tuple[int, int], ...]] = [() for _ in config.output]
    for output_name in _names(config, PAD_OUTPUTS):
        if output_name not in outputs:
            raise ModelLoadError(
                f"model {name!r}: {PAD_OUTPUTS} names {output_name!r}, not an output"
            )
        index, output = outputs[output_name]
        variable = [d + 1 for d, size in enumerate(output.dims) if size == -1]
        if not variable or len(variable) > len(reference_dims):
            raise ModelLoadError(
                f"model {name!r}: output {output_name!r} has {len(variable)} variable dims "
                f"to slice, input {pad_inputs[0]!r} has {len(reference_dims)}"
            )
        slices[index] = tuple(zip(variable, reference_dims, strict=False))
    return Padding(
        inputs=tuple(flags), value=value, reference_input=reference_index, outputs=tuple(slices)
    )
