"""Where a model's instances run and which accelerator they use: the config's ``instance_group``
(``count``, ``kind``, ``gpus``) and ``optimization.execution_accelerators``, checked against the
devices this process can see."""

from __future__ import annotations

from dataclasses import dataclass, field

import structlog

import inferd._proto.model_config_pb2 as model_config_pb2
from inferd.errors import ModelLoadError

log = structlog.get_logger(__name__)

_Group = model_config_pb2.ModelInstanceGroup

# Config parameter: "cpu" lets KIND_GPU groups run on the CPU where the server has no GPU.
GPU_FALLBACK = "inferd.gpu_fallback"


@dataclass(frozen=True)
class InstancePlacement:
    """One executor instance: on the CPU (``device_id`` -1) or on CUDA device ``device_id``."""

    group: str
    device_id: int = -1

    @property
    def on_gpu(self) -> bool:
        return self.device_id >= 0


@dataclass(frozen=True)
class GpuAccelerator:
    """``gpu_execution_accelerator``: ``tensorrt`` runs the model through TensorRT (ONNX Runtime's
    TensorRT provider), ``cuda`` sets options of the CUDA provider."""

    name: str
    parameters: dict[str, str] = field(default_factory=dict)


# Parameters each accelerator takes (Triton's ONNX Runtime backend names). Others are refused.
_ACCELERATOR_PARAMETERS = {
    "tensorrt": frozenset(
        {
            "precision_mode",
            "max_workspace_size_bytes",
            "trt_engine_cache_enable",
            "trt_engine_cache_path",
        }
    ),
    "cuda": frozenset({"cudnn_conv_algo_search", "gpu_mem_limit", "arena_extend_strategy"}),
}


def instance_placements(
    config: model_config_pb2.ModelConfig,
    gpu_count: int,
    cuda_description: str,
    max_instances: int | None = None,
) -> list[InstancePlacement]:
    """Every instance the config's groups ask for: ``count`` on the CPU for KIND_CPU, ``count``
    on each listed GPU (default: every visible one) for KIND_GPU. A GPU the process cannot see
    fails the load, naming the group and what the CUDA runtime reported; more than
    ``max_instances`` in all fails it naming --max-instance-count, counted before any placement
    is made (a count of 2^31-1 would be 16 GB of them)."""
    asked = sum(
        max(1, int(g.count)) * ((len(g.gpus) or gpu_count) if g.kind == _Group.KIND_GPU else 1)
        for g in config.instance_group
    )
    if max_instances is not None and asked > max_instances:
        raise ModelLoadError(
            f"model {config.name!r}: its instance groups ask for {asked} instances, more than "
            f"the server's limit of {max_instances} (--max-instance-count)"
        )
    placements: list[InstancePlacement] = []
    for index, group in enumerate(config.instance_group):
        label = group.name or f"{config.name}_{index}"
        where = f"model {config.name!r} instance_group {label!r}"
        count = max(1, int(group.count))
        if group.kind == _Group.KIND_CPU:
            if group.gpus:
                raise ModelLoadError(f"{where}: gpus {list(group.gpus)} given for KIND_CPU")
            placements += [InstancePlacement(label)] * count
            continue
        if group.kind != _Group.KIND_GPU:
            raise ModelLoadError(
                f"{where}: kind {_Group.Kind.Name(group.kind)} is not supported "
                "(KIND_CPU, KIND_GPU, or KIND_AUTO)"
            )
        if gpu_count == 0:
            raise ModelLoadError(
                f"{where}: KIND_GPU needs a CUDA device, this server has none "
                f"({cuda_description}); to run KIND_GPU groups on the CPU where there is no GPU, "
                "give the config "
                f'parameters {{ key: "{GPU_FALLBACK}" value {{ string_value: "cpu" }} }}'
            )
        gpus = list(group.gpus) or list(range(gpu_count))
        for gpu in gpus:
            if not 0 <= gpu < gpu_count:
                raise ModelLoadError(
                    f"{where}: gpus names device {gpu}, this server sees devices 0..{gpu_count - 1}"
                )
        if len(set(gpus)) != len(gpus):
            raise ModelLoadError(f"{where}: gpus {gpus} lists a device twice")
        placements += [InstancePlacement(label, gpu) for gpu in gpus for _ in range(count)]
    return placements


def resolve_instance_kinds(config: model_config_pb2.ModelConfig, gpu_count: int) -> None:
    """KIND_AUTO means a GPU when there is one, else the CPU (Triton's rule). Without a GPU,
    KIND_GPU groups move to the CPU when the config's ``inferd.gpu_fallback`` parameter says
    "cpu" (their GPU accelerators are dropped); otherwise they stay and the load fails, saying
    why. Completes the config in place, so ``ModelConfig`` shows where the instances went."""
    fallback = (
        config.parameters[GPU_FALLBACK].string_value if GPU_FALLBACK in config.parameters else ""
    )
    if fallback not in ("", "cpu"):
        raise ModelLoadError(
            f"model {config.name!r}: parameter {GPU_FALLBACK} is {fallback!r}; the only "
            'fallback is "cpu"'
        )
    for group in config.instance_group:
        if group.kind == _Group.KIND_AUTO:
            group.kind = _Group.KIND_GPU if gpu_count > 0 else _Group.KIND_CPU
        elif group.kind == _Group.KIND_GPU and gpu_count == 0 and fallback == "cpu":
            group.kind = _Group.KIND_CPU
            del group.gpus[:]
            log.warning("no GPU: KIND_GPU instances run on the CPU", model=config.name)
    if fallback and not any(g.kind == _Group.KIND_GPU for g in config.instance_group):
        del config.optimization.execution_accelerators.gpu_execution_accelerator[:]


def gpu_accelerator(config: model_config_pb2.ModelConfig) -> GpuAccelerator | None:
    """The config's GPU accelerator, checked; None when it names none. CPU accelerators
    (OpenVINO) are not available in inferd and are refused by name."""
    accelerators = config.optimization.execution_accelerators
    for accelerator in accelerators.cpu_execution_accelerator:
        raise ModelLoadError(
            f"model {config.name!r}: optimization.execution_accelerators."
            f"cpu_execution_accelerator {accelerator.name!r} is not available in inferd"
        )
    chosen = list(accelerators.gpu_execution_accelerator)
    if not chosen:
        return None
    names = [a.name for a in chosen]
    where = f"model {config.name!r}: optimization.execution_accelerators.gpu_execution_accelerator"
    for name in names:
        if name not in _ACCELERATOR_PARAMETERS:
            raise ModelLoadError(
                f"{where} {name!r} is not known (known: {sorted(_ACCELERATOR_PARAMETERS)})"
            )
    if len(chosen) > 1:
        raise ModelLoadError(f"{where} lists {names}; inferd takes one")
    accelerator = chosen[0]
    unknown = sorted(set(accelerator.parameters) - _ACCELERATOR_PARAMETERS[accelerator.name])
    if unknown:
        raise ModelLoadError(
            f"{where} {accelerator.name!r}: unknown parameter(s) {unknown} "
            f"(known: {sorted(_ACCELERATOR_PARAMETERS[accelerator.name])})"
        )
    parameters = dict(accelerator.parameters)
    precision = parameters.get("precision_mode", "FP32")
    if precision not in ("FP32", "FP16"):
        raise ModelLoadError(f"{where} 'tensorrt': precision_mode {precision!r} is not FP32/FP16")
    for key in ("max_workspace_size_bytes", "gpu_mem_limit"):
        if key in parameters and not parameters[key].isdigit():
            raise ModelLoadError(f"{where} {accelerator.name!r}: {key} must be a byte count")
    if parameters.get("trt_engine_cache_enable", "false").lower() not in (
        "true",
        "false",
        "1",
        "0",
    ):
        raise ModelLoadError(f"{where} 'tensorrt': trt_engine_cache_enable must be true or false")
    if config.instance_group and not any(g.kind == _Group.KIND_GPU for g in config.instance_group):
        raise ModelLoadError(
            f"{where} {accelerator.name!r} needs a KIND_GPU instance_group; every group runs "
            "on the CPU"
        )
    return GpuAccelerator(accelerator.name, parameters)
