"""A model's configuration: ``config.pbtxt`` (protobuf text format) or a load request's
override, read, checked for what inferd can run and honours (``honoured_fields``), and completed
from the ONNX model (``autocomplete``). ``load_model_config`` answers with the completed config;
its batching policy is ``batching_config``'s.
"""

from __future__ import annotations

from pathlib import Path

import structlog
from google.protobuf import json_format, text_format

import inferd._proto.model_config_pb2 as model_config_pb2
from inferd.datatypes import BY_CONFIG_TYPE
from inferd.errors import ModelLoadError
from inferd.python_backend.model_config import auto_complete, defines_auto_complete
from inferd.repository.autocomplete import check_against_model, complete_config, read_onnx_signature
from inferd.repository.honoured_fields import check_honoured
from inferd.repository.instances import gpu_accelerator, resolve_instance_kinds
from inferd.repository.layout import CONFIG_FILE, model_file_label

log = structlog.get_logger(__name__)

ModelConfig = model_config_pb2.ModelConfig

ONNX_PLATFORM = "onnxruntime_onnx"
ONNX_BACKEND = "onnxruntime"
TENSORRT_PLATFORM = "tensorrt_plan"
TENSORRT_BACKEND = "tensorrt"
ENSEMBLE_PLATFORM = "ensemble"  # Triton's: the steps run other models (inferd.repository.ensemble)
PYTHON_BACKEND = "python"  # Triton's python backend: <version>/model.py, one process per instance
PYTHON_FILE = "model.py"
ONNX_FILE = "model.onnx"
PLAN_FILE = "model.plan"
# Config parameter: "tensorrt" builds an ONNX model into a TensorRT engine for KIND_GPU instances.
EXECUTOR = "inferd.executor"
# Config parameter: "required" (default) or "optional"; an optional model never holds the server's
# readiness back (--strict-readiness), so a fleet replica serves while it is loading or failed.
READINESS = "inferd.readiness"
RUNNABLE = (
    f"inferd runs ONNX models (platform {ONNX_PLATFORM!r}, backend {ONNX_BACKEND!r}), "
    f"TensorRT engines (platform {TENSORRT_PLATFORM!r}, backend {TENSORRT_BACKEND!r}), "
    f"python-backend models (backend {PYTHON_BACKEND!r}) and ensembles of those "
    f"(platform {ENSEMBLE_PLATFORM!r})"
)


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
    tensorflow ...), saying which ones it runs."""
    where = f"model {name!r}" if name else "the model"
    if config.platform and config.platform not in (
        ONNX_PLATFORM,
        TENSORRT_PLATFORM,
        ENSEMBLE_PLATFORM,
    ):
        raise ModelLoadError(
            f"{where}: platform {config.platform!r} is not one inferd can run; {RUNNABLE}"
        )
    if config.backend and config.backend not in (ONNX_BACKEND, TENSORRT_BACKEND, PYTHON_BACKEND):
        raise ModelLoadError(
            f"{where}: backend {config.backend!r} is not one inferd can run; {RUNNABLE}"
        )


def model_filename(config: ModelConfig) -> str:
    """The file a version folder holds for this config: its default_model_filename, else the
    platform's (model.plan for TensorRT engines, model.onnx otherwise)."""
    if config.default_model_filename:
        return config.default_model_filename
    if config.backend == PYTHON_BACKEND:
        return PYTHON_FILE
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
    check_honoured(config)
    _check_platform(config)
    if (
        config.model_transaction_policy.decoupled
        and config.backend != PYTHON_BACKEND
        and not config.sequence_batching.iterative_sequence
    ):
        raise ModelLoadError(
            f"model {name!r}: model_transaction_policy {{ decoupled: true }} is served for "
            'python models (backend: "python") and iterative sequences '
            "(sequence_batching.iterative_sequence: true, a response per step) only"
        )
    _check_response_cache(config)
    if config.optimization.graph.level and (
        config.platform == TENSORRT_PLATFORM or config.backend in (PYTHON_BACKEND, TENSORRT_BACKEND)
    ):
        raise ModelLoadError(
            f"model {name!r}: optimization.graph.level is ONNX Runtime's graph optimization "
            "level; this model does not run on ONNX Runtime"
        )
    if config.backend == PYTHON_BACKEND and defines_auto_complete(model_path):
        config = auto_complete(config, model_path)
        if config.name != name:
            raise ModelLoadError(f"model {name!r}: auto_complete_config renamed the model")
        check_honoured(config)
    if config.platform == TENSORRT_PLATFORM or config.backend == PYTHON_BACKEND:
        _check_stated_io(config)
        complete_config(config, [], [], default_max_batch_size)
    else:
        inputs, outputs = read_onnx_signature(model_path, model_file_label(name, model_path))
        complete_config(config, inputs, outputs, default_max_batch_size)
        check_against_model(config, inputs, outputs)
    resolve_instance_kinds(config, gpu_count)
    gpu_accelerator(config)  # checked here so that every load path refuses a bad one
    executor = config.parameters[EXECUTOR].string_value if EXECUTOR in config.parameters else ""
    if executor not in ("", "onnxruntime", "tensorrt"):
        raise ModelLoadError(
            f"model {name!r}: parameter {EXECUTOR} is {executor!r} (onnxruntime or tensorrt)"
        )
    readiness_required(config)  # a value other than required or optional fails the load
    return config


def _check_response_cache(config: ModelConfig) -> None:
    """Refuses ``response_cache`` where one request's answer is not a function of the request
    alone: a decoupled model's answer is a stream, a stateful model's depends on its sequence
    (Triton does not cache either)."""
    if not config.response_cache.enable:
        return
    if config.model_transaction_policy.decoupled:
        raise ModelLoadError(
            f"model {config.name!r}: response_cache {{ enable: true }} cannot be used with "
            "model_transaction_policy { decoupled: true }: a decoupled model's answer is a "
            "stream of responses, never one response to keep"
        )
    if config.HasField("sequence_batching"):
        raise ModelLoadError(
            f"model {config.name!r}: response_cache {{ enable: true }} cannot be used with "
            "sequence_batching: a stateful model's answer depends on its sequence, not on the "
            "request alone"
        )


def readiness_required(config: ModelConfig) -> bool:
    """Whether the model holds the server's readiness: parameter inferd.readiness "required"
    (the default) or "optional"; ModelLoadError for any other value."""
    value = config.parameters[READINESS].string_value if READINESS in config.parameters else ""
    if value not in ("", "required", "optional"):
        raise ModelLoadError(
            f"model {config.name!r}: parameter {READINESS} is {value!r} (required or optional)"
        )
    return value != "optional"


def stated_readiness_required(config_path: Path | None) -> bool:
    """``readiness_required`` for a model whose load failed, from its config.pbtxt as written;
    a config that cannot be read, or has no valid value, holds readiness (the safe side)."""
    if config_path is None:
        return True
    try:
        config = parse_config_text(config_path.read_text(encoding="utf-8"), str(config_path))
        return readiness_required(config)
    except (OSError, UnicodeDecodeError, ModelLoadError):
        return True


def _check_stated_io(config: ModelConfig) -> None:
    if not config.input or not config.output:
        raise ModelLoadError(
            f"model {config.name!r}: a {config.platform or config.backend} config must list its "
            "inputs and outputs (a TensorRT engine is checked against them when it loads on a GPU; "
            "a python model's responses must carry them)"
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


def _check_platform(config: ModelConfig) -> None:
    """Completes platform and backend (either names the other); ``stated_config`` has refused
    what inferd cannot run."""
    if config.platform == TENSORRT_PLATFORM or config.backend == TENSORRT_BACKEND:
        config.platform, config.backend = TENSORRT_PLATFORM, TENSORRT_BACKEND
        return
    if config.backend == PYTHON_BACKEND:
        return  # Triton's python models name no platform
    config.platform = ONNX_PLATFORM
    config.backend = ONNX_BACKEND
