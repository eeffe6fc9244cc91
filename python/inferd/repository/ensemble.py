"""An ensemble's config (Triton's ``platform: "ensemble"`` with ``ensemble_scheduling.step``)
checked against the configs of the models it composes, and resolved into an ``EnsemblePlan``:
the steps in an order that runs each after its producers, their resolved versions, which
ensemble tensors each reads and writes, and which steps can run at the same time.

Every refusal is a ModelLoadError naming the step (its index in ``ensemble_scheduling.step`` and
its model) and the tensor. Shapes are compared as the tensors travel: with the batch dimension
(-1) in front for a model whose ``max_batch_size`` is above 0, so a non-batching model's
``[-1, 4]`` meets a batching model's ``[4]``; -1 matches any size.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import inferd._proto.model_config_pb2 as model_config_pb2
from inferd.datatypes import BY_CONFIG_TYPE
from inferd.errors import ModelLoadError
from inferd.repository.honoured_fields import check_honoured

ModelConfig = model_config_pb2.ModelConfig

# model_version in a step: the latest version the composing model serves.
LATEST_VERSION = -1

# A composing model's served versions and their configs, by model name: a mapping, or a callable
# that answers None for a model it does not know.
ComposingConfigs = (
    Mapping[str, Mapping[int, ModelConfig]] | Callable[[str], Mapping[int, ModelConfig] | None]
)


def check_ensemble_config(name: str, config: ModelConfig) -> None:
    """An ensemble's own fields, before its steps are checked against their models: its name is
    its folder's, it declares its inputs and outputs with datatypes, and it sets nothing of a
    model's own running (instances, batching, warm-up: its steps run and batch in their models)
    or anything else inferd does not honour."""
    where = f"ensemble {name!r}"
    if config.name and config.name != name:
        raise ModelLoadError(
            f"{where}: config.pbtxt names the model {config.name!r}; the name must match the folder"
        )
    own = [
        field
        for field in ("instance_group", "dynamic_batching", "sequence_batching", "model_warmup")
        if (config.HasField(field) if field.endswith("batching") else len(getattr(config, field)))
    ]
    if own:
        raise ModelLoadError(
            f"{where}: an ensemble sets no {', '.join(own)} of its own (its steps run and batch "
            "in their models' instances)"
        )
    if config.model_transaction_policy.decoupled:
        raise ModelLoadError(f"{where}: decoupled ensembles are not served by inferd")
    if not config.input or not config.output:
        raise ModelLoadError(f"{where}: an ensemble's config must list its inputs and outputs")
    tensors: list[model_config_pb2.ModelInput | model_config_pb2.ModelOutput] = [
        *config.input,
        *config.output,
    ]
    for tensor in tensors:
        if tensor.data_type not in BY_CONFIG_TYPE:
            raise ModelLoadError(f"{where} tensor {tensor.name!r}: no valid data_type")
        if tensor.HasField("reshape"):
            raise ModelLoadError(f"{where} tensor {tensor.name!r}: an ensemble reshapes nothing")
    if any(i.optional for i in config.input):
        raise ModelLoadError(f"{where}: an ensemble's inputs cannot be optional")
    without_steps = ModelConfig()
    without_steps.CopyFrom(config)
    without_steps.ClearField("ensemble_scheduling")
    check_honoured(without_steps)


@dataclass(frozen=True)
class TensorBinding:
    """One of a step's model tensors and the ensemble tensor it is read from or written to."""

    model_tensor: str
    ensemble_tensor: str


@dataclass(frozen=True)
class EnsembleStep:
    """One step: ``index`` is its position in ``ensemble_scheduling.step``; ``depends_on``, the
    indexes of the steps that produce its inputs (none: it reads only ensemble inputs)."""

    index: int
    model_name: str
    model_version: int
    inputs: tuple[TensorBinding, ...]
    outputs: tuple[TensorBinding, ...]
    depends_on: frozenset[int]


@dataclass(frozen=True)
class EnsemblePlan:
    """A checked ensemble. ``steps``: every step after the steps it depends on. ``stages``: the
    step indexes in waves; a step's producers are all in earlier waves, so the steps of one wave
    can run concurrently once the waves before it are done."""

    name: str
    max_batch_size: int
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    steps: tuple[EnsembleStep, ...]
    stages: tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class _Tensor:
    """A tensor as it travels: its datatype and its full shape (batch dimension included)."""

    data_type: int
    full_dims: tuple[int, ...]
    described: str  # who declares it, for messages: "ensemble input 'X'", "step[1] ... output"


def _full_dims(dims: Sequence[int], max_batch_size: int) -> tuple[int, ...]:
    return ((-1,) if max_batch_size > 0 else ()) + tuple(dims)


def _type_name(data_type: int) -> str:
    try:
        return model_config_pb2.DataType.Name(data_type)
    except ValueError:
        return str(data_type)


def _dims_text(dims: tuple[int, ...]) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


def _dims_match(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    return len(a) == len(b) and all(x == y or x == -1 or y == -1 for x, y in zip(a, b, strict=True))


def _check_consistent(where: str, tensor: str, producer: _Tensor, consumer: _Tensor) -> None:
    if producer.data_type != consumer.data_type:
        raise ModelLoadError(
            f"{where}: tensor {tensor!r} is {_type_name(producer.data_type)} as "
            f"{producer.described} but {_type_name(consumer.data_type)} as {consumer.described}"
        )
    if not _dims_match(producer.full_dims, consumer.full_dims):
        raise ModelLoadError(
            f"{where}: tensor {tensor!r} has shape {_dims_text(producer.full_dims)} as "
            f"{producer.described} but {_dims_text(consumer.full_dims)} as {consumer.described} "
            "(batch dimension included; -1 matches any size)"
        )


def _served_versions(composing: ComposingConfigs, model: str) -> Mapping[int, ModelConfig] | None:
    if callable(composing):
        return composing(model)
    return composing.get(model)


@dataclass(frozen=True)
class _ResolvedStep:
    index: int
    label: str  # "step[1] (model 'm' version 2)"
    model_name: str
    version: int
    config: ModelConfig


def _resolve_step(
    ensemble: str,
    index: int,
    step: model_config_pb2.ModelEnsembling.Step,
    composing: ComposingConfigs,
) -> _ResolvedStep:
    label = f"step[{index}] (model {step.model_name!r})"
    where = f"ensemble {ensemble!r} {label}"
    if not step.model_name:
        raise ModelLoadError(f"{where}: model_name is empty")
    versions = _served_versions(composing, step.model_name)
    if not versions:
        raise ModelLoadError(f"{where}: no model {step.model_name!r} is served")
    if step.model_version == LATEST_VERSION:
        version = max(versions)
    elif step.model_version in versions:
        version = step.model_version
    else:
        served = ", ".join(str(v) for v in sorted(versions))
        raise ModelLoadError(
            f"{where}: model_version {step.model_version} is not served "
            f"(served: {served}; -1 is the latest)"
        )
    if versions[version].model_transaction_policy.decoupled:
        raise ModelLoadError(
            f"{where}: the model is decoupled (any number of responses per request); an "
            "ensemble's steps answer once, so inferd does not serve it in an ensemble"
        )
    return _ResolvedStep(
        index,
        f"step[{index}] (model {step.model_name!r} version {version})",
        step.model_name,
        version,
        versions[version],
    )


def _check_step_maps(
    ensemble: ModelConfig, resolved: _ResolvedStep, step: model_config_pb2.ModelEnsembling.Step
) -> None:
    where = f"ensemble {ensemble.name!r} {resolved.label}"
    config = resolved.config
    if ensemble.max_batch_size > config.max_batch_size:
        raise ModelLoadError(
            f"{where}: the ensemble's max_batch_size {ensemble.max_batch_size} is larger than "
            f"the model's {config.max_batch_size}"
        )
    model_inputs = {i.name: i for i in config.input}
    model_outputs = {o.name for o in config.output}
    for model_input, tensor in sorted(step.input_map.items()):
        if model_input not in model_inputs:
            raise ModelLoadError(
                f"{where}: input_map maps tensor {tensor!r} to input {model_input!r}, which the "
                f"model does not have (inputs: {', '.join(sorted(model_inputs))})"
            )
        if not tensor:
            raise ModelLoadError(f"{where}: input_map gives input {model_input!r} no tensor")
    for name, model_input_config in sorted(model_inputs.items()):
        if name not in step.input_map and not model_input_config.optional:
            raise ModelLoadError(
                f"{where}: input_map does not feed the model's required input {name!r}"
            )
    for model_output, tensor in sorted(step.output_map.items()):
        if model_output not in model_outputs:
            raise ModelLoadError(
                f"{where}: output_map maps output {model_output!r} to tensor {tensor!r}, but the "
                f"model has no such output (outputs: {', '.join(sorted(model_outputs))})"
            )
        if not tensor:
            raise ModelLoadError(f"{where}: output_map gives output {model_output!r} no tensor")


def _find_cycle(
    ensemble: str,
    blocked: Sequence[int],
    needs: Mapping[int, Mapping[int, str]],
    labels: Sequence[str],
) -> ModelLoadError:
    """A cycle among the steps that never became ready, as an error naming each step and the
    tensor it waits for."""
    # Every blocked step waits for another blocked step; walking those waits must revisit a step.
    blocked_set = set(blocked)
    path: list[int] = [blocked[0]]
    while True:
        current = path[-1]
        successor = min(p for p in needs[current] if p in blocked_set)
        if successor in path:
            cycle = [*path[path.index(successor) :], successor]
            break
        path.append(successor)
    links = [
        f"{labels[a]} reads tensor {needs[a][b]!r} from {labels[b]}"
        for a, b in itertools.pairwise(cycle)
    ]
    return ModelLoadError(f"ensemble {ensemble!r}: the steps form a cycle: " + "; ".join(links))


def plan_ensemble(ensemble: ModelConfig, composing: ComposingConfigs) -> EnsemblePlan:
    """Checks ``ensemble`` against its composing models' configs and plans it; ModelLoadError
    naming the step and the tensor for the first thing wrong."""
    name = ensemble.name
    steps = list(ensemble.ensemble_scheduling.step)
    if not steps:
        raise ModelLoadError(f"ensemble {name!r}: ensemble_scheduling has no step")
    resolved = [_resolve_step(name, i, step, composing) for i, step in enumerate(steps)]
    for r, step in zip(resolved, steps, strict=True):
        _check_step_maps(ensemble, r, step)
    labels = [r.label for r in resolved]

    # Who writes each ensemble tensor: an ensemble input (None) or a step (its index).
    producers: dict[str, tuple[int | None, _Tensor]] = {}
    for declared in ensemble.input:
        producers[declared.name] = (
            None,
            _Tensor(
                declared.data_type,
                _full_dims(declared.dims, ensemble.max_batch_size),
                f"ensemble input {declared.name!r}",
            ),
        )
    for r, step in zip(resolved, steps, strict=True):
        model_outputs = {o.name: o for o in r.config.output}
        for model_output, tensor in sorted(step.output_map.items()):
            where = f"ensemble {name!r} {r.label}"
            if tensor in producers:
                earlier = producers[tensor][0]
                first = "an ensemble input" if earlier is None else f"written by {labels[earlier]}"
                raise ModelLoadError(
                    f"{where}: output {model_output!r} writes tensor {tensor!r}, which is "
                    f"{first}; a tensor has one producer"
                )
            declared_output = model_outputs[model_output]
            producers[tensor] = (
                r.index,
                _Tensor(
                    declared_output.data_type,
                    _full_dims(declared_output.dims, r.config.max_batch_size),
                    f"{r.label} output {model_output!r}",
                ),
            )

    # needs[step][producer step] = a tensor the step reads from that producer.
    needs: dict[int, dict[int, str]] = {r.index: {} for r in resolved}
    for r, step in zip(resolved, steps, strict=True):
        where = f"ensemble {name!r} {r.label}"
        model_inputs = {i.name: i for i in r.config.input}
        for model_input, tensor in sorted(step.input_map.items()):
            if tensor not in producers:
                raise ModelLoadError(
                    f"{where}: input {model_input!r} reads tensor {tensor!r}, which is fed by "
                    "nothing (neither an ensemble input nor another step's output)"
                )
            producer_step, produced = producers[tensor]
            declared_input = model_inputs[model_input]
            consumer = _Tensor(
                declared_input.data_type,
                _full_dims(declared_input.dims, r.config.max_batch_size),
                f"{r.label} input {model_input!r}",
            )
            _check_consistent(where, tensor, produced, consumer)
            if producer_step is not None:
                needs[r.index].setdefault(producer_step, tensor)

    for ensemble_output in ensemble.output:
        tensor = ensemble_output.name
        producer_step = producers[tensor][0] if tensor in producers else None
        if producer_step is None:
            raise ModelLoadError(
                f"ensemble {name!r}: output {tensor!r} is produced by no step "
                "(no step's output_map writes it)"
            )
        _check_consistent(
            f"ensemble {name!r} {labels[producer_step]}",
            tensor,
            producers[tensor][1],
            _Tensor(
                ensemble_output.data_type,
                _full_dims(ensemble_output.dims, ensemble.max_batch_size),
                f"ensemble output {tensor!r}",
            ),
        )

    # Waves: a step joins the first wave after all of its producers' waves.
    stages: list[tuple[int, ...]] = []
    placed: set[int] = set()
    while len(placed) < len(resolved):
        wave = tuple(
            r.index
            for r in resolved
            if r.index not in placed and all(p in placed for p in needs[r.index])
        )
        if not wave:
            blocked = [r.index for r in resolved if r.index not in placed]
            raise _find_cycle(name, blocked, needs, labels)
        stages.append(wave)
        placed.update(wave)

    planned = {
        r.index: EnsembleStep(
            index=r.index,
            model_name=r.model_name,
            model_version=r.version,
            inputs=tuple(TensorBinding(k, v) for k, v in sorted(step.input_map.items())),
            outputs=tuple(TensorBinding(k, v) for k, v in sorted(step.output_map.items())),
            depends_on=frozenset(needs[r.index]),
        )
        for r, step in zip(resolved, steps, strict=True)
    }
    return EnsemblePlan(
        name=name,
        max_batch_size=ensemble.max_batch_size,
        inputs=tuple(i.name for i in ensemble.input),
        outputs=tuple(o.name for o in ensemble.output),
        steps=tuple(planned[i] for wave in stages for i in wave),
        stages=tuple(stages),
    )
