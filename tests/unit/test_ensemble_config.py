"""Issue 16, item 2: an ensemble's config checked at load against its composing models' configs,
and planned (order, resolved versions, concurrency). Every refusal names the step and tensor."""

from __future__ import annotations

import pytest
from google.protobuf import text_format

import inferd._proto.model_config_pb2 as model_config_pb2
from inferd.errors import ModelLoadError
from inferd.repository.config import ModelConfig, parse_config_text
from inferd.repository.ensemble import (
    EnsemblePlan,
    EnsembleStep,
    TensorBinding,
    check_ensemble_config,
    plan_ensemble,
)


def config(text: str) -> ModelConfig:
    parsed = ModelConfig()
    text_format.Parse(text, parsed)
    return parsed


def unary(name: str, inp: str, out: str, *, mbs: int = 8, dims: str = "[4]") -> ModelConfig:
    """A composing model with one FP32 input and one FP32 output."""
    return config(
        f'name: "{name}" platform: "onnxruntime_onnx" max_batch_size: {mbs} '
        f'input {{ name: "{inp}" data_type: TYPE_FP32 dims: {dims} }} '
        f'output {{ name: "{out}" data_type: TYPE_FP32 dims: {dims} }}'
    )


COMBINE = config(
    'name: "combine" platform: "onnxruntime_onnx" max_batch_size: 8 '
    'input { name: "A" data_type: TYPE_FP32 dims: [4] } '
    'input { name: "B" data_type: TYPE_FP32 dims: [4] } '
    'input { name: "BIAS" data_type: TYPE_FP32 dims: [4] optional: true } '
    'output { name: "SUM" data_type: TYPE_FP32 dims: [4] }'
)

COMPOSING: dict[str, dict[int, ModelConfig]] = {
    "pre": {1: unary("pre", "RAW", "PRE")},
    "left": {1: unary("left", "X", "Y"), 3: unary("left", "X", "Y")},
    "right": {2: unary("right", "X", "Y")},
    "combine": {1: COMBINE},
    "flat": {1: unary("flat", "X", "Y", mbs=0, dims="[-1, 4]")},
}

# Steps written out of order (the combining step first), so the plan's order is its own.
DIAMOND = """
name: "diamond"
platform: "ensemble"
max_batch_size: 8
input { name: "IN" data_type: TYPE_FP32 dims: [4] }
output { name: "OUT" data_type: TYPE_FP32 dims: [4] }
ensemble_scheduling {
  step {
    model_name: "combine" model_version: -1
    input_map { key: "A" value: "l" }
    input_map { key: "B" value: "r" }
    output_map { key: "SUM" value: "OUT" }
  }
  step {
    model_name: "pre" model_version: -1
    input_map { key: "RAW" value: "IN" }
    output_map { key: "PRE" value: "p" }
  }
  step {
    model_name: "left" model_version: -1
    input_map { key: "X" value: "p" }
    output_map { key: "Y" value: "l" }
  }
  step {
    model_name: "right" model_version: 2
    input_map { key: "X" value: "p" }
    output_map { key: "Y" value: "r" }
  }
}
"""

CHAIN = """
name: "chain"
platform: "ensemble"
max_batch_size: 4
input { name: "IN" data_type: TYPE_FP32 dims: [4] }
output { name: "OUT" data_type: TYPE_FP32 dims: [-1] }
ensemble_scheduling {
  step {
    model_name: "right" model_version: -1
    input_map { key: "X" value: "b" }
    output_map { key: "Y" value: "OUT" }
  }
  step {
    model_name: "pre" model_version: -1
    input_map { key: "RAW" value: "IN" }
    output_map { key: "PRE" value: "a" }
  }
  step {
    model_name: "left" model_version: 1
    input_map { key: "X" value: "a" }
    output_map { key: "Y" value: "b" }
  }
}
"""


def refusal(text: str, composing: object = COMPOSING) -> str:
    with pytest.raises(ModelLoadError) as caught:
        plan_ensemble(config(text), composing)  # type: ignore[arg-type]
    return str(caught.value)


def edited(text: str, old: str, new: str) -> str:
    assert old in text, old
    return text.replace(old, new, 1)


def test_diamond_is_planned_in_waves_with_latest_versions() -> None:
    plan = plan_ensemble(config(DIAMOND), COMPOSING)
    assert plan.stages == ((1,), (2, 3), (0,))
    assert [s.index for s in plan.steps] == [1, 2, 3, 0]
    assert [(s.model_name, s.model_version) for s in plan.steps] == [
        ("pre", 1),
        ("left", 3),  # -1: the latest served
        ("right", 2),
        ("combine", 1),
    ]
    combine = plan.steps[-1]
    assert combine == EnsembleStep(
        index=0,
        model_name="combine",
        model_version=1,
        inputs=(TensorBinding("A", "l"), TensorBinding("B", "r")),
        outputs=(TensorBinding("SUM", "OUT"),),
        depends_on=frozenset({2, 3}),
    )
    assert plan.steps[0].depends_on == frozenset()
    assert plan.steps[1].depends_on == plan.steps[2].depends_on == frozenset({1})
    assert (plan.name, plan.max_batch_size, plan.inputs, plan.outputs) == (
        "diamond",
        8,
        ("IN",),
        ("OUT",),
    )


def test_chain_runs_one_step_per_wave() -> None:
    plan = plan_ensemble(config(CHAIN), lambda name: COMPOSING.get(name))
    assert plan.stages == ((1,), (2,), (0,))
    assert [(s.index, s.model_name, s.model_version) for s in plan.steps] == [
        (1, "pre", 1),
        (2, "left", 1),
        (0, "right", 2),
    ]
    assert [s.depends_on for s in plan.steps] == [frozenset(), frozenset({1}), frozenset({2})]


def test_a_non_batching_ensemble_feeds_a_batching_model_with_the_batch_dim_stated() -> None:
    # The ensemble's [-1, 4] is the batching model's [4] with its batch dimension in front, and
    # the non-batching model "flat" ([-1, 4]) reads the batching model's output.
    text = edited(CHAIN, "max_batch_size: 4", "max_batch_size: 0")
    text = edited(
        text,
        'input { name: "IN" data_type: TYPE_FP32 dims: [4] }',
        'input { name: "IN" data_type: TYPE_FP32 dims: [-1, 4] }',
    )
    text = edited(
        text, 'model_name: "right" model_version: -1', 'model_name: "flat" model_version: -1'
    )
    text = edited(text, "dims: [-1] }", "dims: [2, 4] }")
    plan = plan_ensemble(config(text), COMPOSING)
    assert [s.model_name for s in plan.steps] == ["pre", "left", "flat"]


# Triton's own example (docs/user_guide/architecture.md, "Ensemble Models"), as written there.
TRITON_EXAMPLE = """
name: "ensemble_model"
platform: "ensemble"
max_batch_size: 1
input [
  {
    name: "IMAGE"
    data_type: TYPE_STRING
    dims: [ 1 ]
  }
]
output [
  {
    name: "CLASSIFICATION"
    data_type: TYPE_FP32
    dims: [ 1000 ]
  },
  {
    name: "SEGMENTATION"
    data_type: TYPE_FP32
    dims: [ 3, 224, 224 ]
  }
]
ensemble_scheduling {
  step [
    {
      model_name: "image_preprocess_model"
      model_version: -1
      input_map {
        key: "RAW_IMAGE"
        value: "IMAGE"
      }
      output_map {
        key: "PREPROCESSED_OUTPUT"
        value: "preprocessed_image"
      }
    },
    {
      model_name: "classification_model"
      model_version: -1
      input_map {
        key: "FORMATTED_IMAGE"
        value: "preprocessed_image"
      }
      output_map {
        key: "CLASSIFICATION_OUTPUT"
        value: "CLASSIFICATION"
      }
    },
    {
      model_name: "segmentation_model"
      model_version: -1
      input_map {
        key: "FORMATTED_IMAGE"
        value: "preprocessed_image"
      }
      output_map {
        key: "SEGMENTATION_OUTPUT"
        value: "SEGMENTATION"
      }
    }
  ]
}
"""


def test_triton_example_parses_into_the_plan_of_the_same_ensemble_built_in_code() -> None:
    def model(
        name: str, inp: str, in_type: str, in_dims: str, out: str, out_dims: str
    ) -> ModelConfig:
        return config(
            f'name: "{name}" max_batch_size: 16 '
            f'input {{ name: "{inp}" data_type: {in_type} dims: {in_dims} }} '
            f'output {{ name: "{out}" data_type: TYPE_FP32 dims: {out_dims} }}'
        )

    image = "[3, 224, 224]"
    composing = {
        "image_preprocess_model": {
            1: model(
                "image_preprocess_model",
                "RAW_IMAGE",
                "TYPE_STRING",
                "[1]",
                "PREPROCESSED_OUTPUT",
                image,
            )
        },
        "classification_model": {
            1: model(
                "classification_model",
                "FORMATTED_IMAGE",
                "TYPE_FP32",
                image,
                "CLASSIFICATION_OUTPUT",
                "[1000]",
            )
        },
        "segmentation_model": {
            2: model(
                "segmentation_model",
                "FORMATTED_IMAGE",
                "TYPE_FP32",
                image,
                "SEGMENTATION_OUTPUT",
                image,
            )
        },
    }
    built = ModelConfig(name="ensemble_model", platform="ensemble", max_batch_size=1)
    built.input.add(name="IMAGE", data_type=13, dims=[1])  # 13: TYPE_STRING
    built.output.add(name="CLASSIFICATION", data_type=11, dims=[1000])  # 11: TYPE_FP32
    built.output.add(name="SEGMENTATION", data_type=11, dims=[3, 224, 224])
    for model_name, model_input, tensor, model_output, out in (
        (
            "image_preprocess_model",
            "RAW_IMAGE",
            "IMAGE",
            "PREPROCESSED_OUTPUT",
            "preprocessed_image",
        ),
        (
            "classification_model",
            "FORMATTED_IMAGE",
            "preprocessed_image",
            "CLASSIFICATION_OUTPUT",
            "CLASSIFICATION",
        ),
        (
            "segmentation_model",
            "FORMATTED_IMAGE",
            "preprocessed_image",
            "SEGMENTATION_OUTPUT",
            "SEGMENTATION",
        ),
    ):
        step = built.ensemble_scheduling.step.add(model_name=model_name, model_version=-1)
        step.input_map[model_input] = tensor
        step.output_map[model_output] = out

    parsed = parse_config_text(TRITON_EXAMPLE, "ensemble_model config.pbtxt")
    assert parsed == built
    plan = plan_ensemble(parsed, composing)
    assert plan == plan_ensemble(built, composing)
    assert plan == EnsemblePlan(
        name="ensemble_model",
        max_batch_size=1,
        inputs=("IMAGE",),
        outputs=("CLASSIFICATION", "SEGMENTATION"),
        steps=(
            EnsembleStep(
                0,
                "image_preprocess_model",
                1,
                (TensorBinding("RAW_IMAGE", "IMAGE"),),
                (TensorBinding("PREPROCESSED_OUTPUT", "preprocessed_image"),),
                frozenset(),
            ),
            EnsembleStep(
                1,
                "classification_model",
                1,
                (TensorBinding("FORMATTED_IMAGE", "preprocessed_image"),),
                (TensorBinding("CLASSIFICATION_OUTPUT", "CLASSIFICATION"),),
                frozenset({0}),
            ),
            EnsembleStep(
                2,
                "segmentation_model",
                2,
                (TensorBinding("FORMATTED_IMAGE", "preprocessed_image"),),
                (TensorBinding("SEGMENTATION_OUTPUT", "SEGMENTATION"),),
                frozenset({0}),
            ),
        ),
        stages=((0,), (1, 2)),
    )


def test_a_cycle_is_refused_naming_its_steps_and_tensors() -> None:
    # pre now reads "l" (written by left) instead of IN: pre -> left -> pre.
    text = edited(
        DIAMOND, 'input_map { key: "RAW" value: "IN" }', 'input_map { key: "RAW" value: "l" }'
    )
    message = refusal(text)
    assert "cycle" in message
    assert (
        "step[1] (model 'pre' version 1) reads tensor 'l' from step[2] (model 'left' version 3)"
        in message
    )
    assert (
        "step[2] (model 'left' version 3) reads tensor 'p' from step[1] (model 'pre' version 1)"
        in message
    )


def test_a_step_reading_its_own_output_is_a_cycle() -> None:
    text = edited(CHAIN, 'input_map { key: "X" value: "b" }', 'input_map { key: "X" value: "OUT" }')
    message = refusal(text)
    assert "cycle" in message
    assert "step[0] (model 'right' version 2) reads tensor 'OUT' from step[0]" in message


def test_an_unknown_composing_model_is_refused() -> None:
    message = refusal(edited(DIAMOND, '"left"', '"lefty"'))
    assert message == "ensemble 'diamond' step[2] (model 'lefty'): no model 'lefty' is served"


def test_an_unknown_composing_version_is_refused_with_the_served_ones() -> None:
    message = refusal(edited(DIAMOND, "model_version: 2", "model_version: 7"))
    assert message == (
        "ensemble 'diamond' step[3] (model 'right'): model_version 7 is not served "
        "(served: 2; -1 is the latest)"
    )


def test_a_composing_model_with_no_served_version_is_refused() -> None:
    message = refusal(DIAMOND, lambda name: {} if name == "pre" else COMPOSING.get(name))
    assert message == "ensemble 'diamond' step[1] (model 'pre'): no model 'pre' is served"


def test_a_step_input_fed_by_nothing_is_refused() -> None:
    message = refusal(
        edited(
            DIAMOND, 'input_map { key: "B" value: "r" }', 'input_map { key: "B" value: "nowhere" }'
        )
    )
    assert "step[0] (model 'combine' version 1)" in message
    assert "input 'B' reads tensor 'nowhere', which is fed by nothing" in message


def test_an_ensemble_output_produced_by_no_step_is_refused() -> None:
    text = edited(
        DIAMOND,
        'output { name: "OUT"',
        'output { name: "EXTRA" data_type: TYPE_FP32 dims: [4] }\noutput { name: "OUT"',
    )
    message = refusal(text)
    assert (
        message == "ensemble 'diamond': output 'EXTRA' is produced by no step "
        "(no step's output_map writes it)"
    )


def test_an_ensemble_output_named_as_an_input_but_written_by_no_step_is_refused() -> None:
    text = edited(
        CHAIN,
        'output { name: "OUT" data_type: TYPE_FP32 dims: [-1] }',
        'output { name: "IN" data_type: TYPE_FP32 dims: [4] }',
    )
    text = edited(text, 'value: "OUT"', 'value: "unused"')
    assert "output 'IN' is produced by no step" in refusal(text)


def test_a_tensor_written_by_two_steps_is_refused() -> None:
    message = refusal(
        edited(DIAMOND, 'output_map { key: "Y" value: "r" }', 'output_map { key: "Y" value: "l" }')
    )
    assert message == (
        "ensemble 'diamond' step[3] (model 'right' version 2): output 'Y' writes tensor 'l', "
        "which is written by step[2] (model 'left' version 3); a tensor has one producer"
    )


def test_a_step_writing_an_ensemble_input_is_refused() -> None:
    message = refusal(
        edited(
            DIAMOND, 'output_map { key: "PRE" value: "p" }', 'output_map { key: "PRE" value: "IN" }'
        )
    )
    assert message == (
        "ensemble 'diamond' step[1] (model 'pre' version 1): output 'PRE' writes tensor 'IN', "
        "which is an ensemble input; a tensor has one producer"
    )


@pytest.mark.parametrize(
    ("old", "new", "expected"),
    [
        pytest.param(
            'input { name: "IN" data_type: TYPE_FP32 dims: [4] }',
            'input { name: "IN" data_type: TYPE_INT32 dims: [4] }',
            "ensemble 'diamond' step[1] (model 'pre' version 1): tensor 'IN' is TYPE_INT32 as "
            "ensemble input 'IN' but TYPE_FP32 as step[1] (model 'pre' version 1) input 'RAW'",
            id="datatype-ensemble-input-to-step",
        ),
        pytest.param(
            'input { name: "IN" data_type: TYPE_FP32 dims: [4] }',
            'input { name: "IN" data_type: TYPE_FP32 dims: [5] }',
            "ensemble 'diamond' step[1] (model 'pre' version 1): tensor 'IN' has shape [-1, 5] "
            "as ensemble input 'IN' but [-1, 4] as step[1] (model 'pre' version 1) input 'RAW'",
            id="shape-ensemble-input-to-step",
        ),
        pytest.param(
            'output { name: "OUT" data_type: TYPE_FP32 dims: [4] }',
            'output { name: "OUT" data_type: TYPE_FP16 dims: [4] }',
            "ensemble 'diamond' step[0] (model 'combine' version 1): tensor 'OUT' is TYPE_FP32 as "
            "step[0] (model 'combine' version 1) output 'SUM' but TYPE_FP16 as ensemble output "
            "'OUT'",
            id="datatype-step-to-ensemble-output",
        ),
        pytest.param(
            'output { name: "OUT" data_type: TYPE_FP32 dims: [4] }',
            'output { name: "OUT" data_type: TYPE_FP32 dims: [4, 1] }',
            "ensemble 'diamond' step[0] (model 'combine' version 1): tensor 'OUT' has shape "
            "[-1, 4] as step[0] (model 'combine' version 1) output 'SUM' but [-1, 4, 1] as "
            "ensemble output 'OUT'",
            id="shape-step-to-ensemble-output",
        ),
    ],
)
def test_a_mismatch_with_the_ensemble_declarations_is_refused(
    old: str, new: str, expected: str
) -> None:
    assert refusal(edited(DIAMOND, old, new)).startswith(expected)


def test_a_datatype_mismatch_between_steps_is_refused() -> None:
    composing = dict(COMPOSING)
    right = unary("right", "X", "Y")
    right.output[0].data_type = model_config_pb2.TYPE_FP64
    composing["right"] = {2: right}
    assert refusal(DIAMOND, composing) == (
        "ensemble 'diamond' step[0] (model 'combine' version 1): tensor 'r' is TYPE_FP64 as "
        "step[3] (model 'right' version 2) output 'Y' but TYPE_FP32 as step[0] (model 'combine' "
        "version 1) input 'B'"
    )


def test_a_shape_mismatch_between_steps_is_refused_and_minus_one_is_a_wildcard() -> None:
    composing = dict(COMPOSING)
    composing["right"] = {2: unary("right", "X", "Y", dims="[-1]")}  # any size: accepted
    plan_ensemble(config(DIAMOND), composing)
    right = unary("right", "X", "Y")
    right.input[0].dims[:] = [3]
    composing["right"] = {2: right}
    message = refusal(DIAMOND, composing)
    assert message.startswith(
        "ensemble 'diamond' step[3] (model 'right' version 2): tensor 'p' has shape [-1, 4] as "
        "step[1] (model 'pre' version 1) output 'PRE' but [-1, 3] as step[3] (model 'right' "
        "version 2) input 'X'"
    )


def test_the_batch_dimension_counts_in_a_shape_mismatch() -> None:
    # A non-batching ensemble's [4] is not a batching model's [4], which travels as [batch, 4].
    text = edited(CHAIN, "max_batch_size: 4", "max_batch_size: 0")
    message = refusal(text)
    assert message.startswith(
        "ensemble 'chain' step[1] (model 'pre' version 1): tensor 'IN' has shape [4] as "
        "ensemble input 'IN' but [-1, 4] as step[1] (model 'pre' version 1) input 'RAW'"
    )


def test_an_input_map_naming_an_input_the_model_lacks_is_refused() -> None:
    message = refusal(
        edited(
            DIAMOND,
            'input_map { key: "X" value: "p" }',
            'input_map { key: "X" value: "p" }\n    input_map { key: "Z" value: "IN" }',
        )
    )
    assert message == (
        "ensemble 'diamond' step[2] (model 'left' version 3): input_map maps tensor 'IN' to "
        "input 'Z', which the model does not have (inputs: X)"
    )


def test_an_input_map_missing_a_required_input_is_refused_but_an_optional_one_may_be_left_out() -> (
    None
):
    # combine's BIAS is optional and unmapped in DIAMOND, which plans; B is required.
    message = refusal(edited(DIAMOND, '    input_map { key: "B" value: "r" }\n', ""))
    assert message == (
        "ensemble 'diamond' step[0] (model 'combine' version 1): input_map does not feed the "
        "model's required input 'B'"
    )


def test_an_output_map_naming_an_output_the_model_lacks_is_refused() -> None:
    message = refusal(
        edited(DIAMOND, 'output_map { key: "Y" value: "l" }', 'output_map { key: "YY" value: "l" }')
    )
    assert message == (
        "ensemble 'diamond' step[2] (model 'left' version 3): output_map maps output 'YY' to "
        "tensor 'l', but the model has no such output (outputs: Y)"
    )


@pytest.mark.parametrize("ensemble_mbs", [9, 1])
def test_an_ensemble_batching_more_than_a_composing_model_is_refused(ensemble_mbs: int) -> None:
    # mbs 9 exceeds every model's 8 (the first step is named); at 1, only "flat" (0) is exceeded.
    text = edited(CHAIN, "max_batch_size: 4", f"max_batch_size: {ensemble_mbs}")
    if ensemble_mbs == 1:
        text = edited(text, 'model_name: "right"', 'model_name: "flat"')
    model, mbs = ("right", 8) if ensemble_mbs == 9 else ("flat", 0)
    version = 2 if model == "right" else 1
    assert refusal(text) == (
        f"ensemble 'chain' step[0] (model '{model}' version {version}): the ensemble's "
        f"max_batch_size {ensemble_mbs} is larger than the model's {mbs}"
    )


def test_an_ensemble_without_steps_is_refused() -> None:
    message = refusal('name: "empty" platform: "ensemble" max_batch_size: 8')
    assert message == "ensemble 'empty': ensemble_scheduling has no step"


def test_a_decoupled_composing_model_is_refused() -> None:
    decoupled = unary("pre", "RAW", "PRE")
    decoupled.model_transaction_policy.decoupled = True
    message = refusal(
        DIAMOND, lambda name: {1: decoupled} if name == "pre" else COMPOSING.get(name)
    )
    assert message.startswith("ensemble 'diamond' step[1] (model 'pre'): the model is decoupled")


def test_a_decoupled_ensemble_is_refused() -> None:
    ensemble = config(DIAMOND)
    ensemble.model_transaction_policy.decoupled = True
    with pytest.raises(ModelLoadError, match="decoupled ensembles are not served"):
        check_ensemble_config("diamond", ensemble)
