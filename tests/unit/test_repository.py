"""Repository layout, config.pbtxt parsing and completion from the ONNX model."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from inferd.core import BatcherOptions, QueuePolicy
from inferd.errors import InvalidArgument, ModelLoadError, NotFound
from inferd.examples import make_examples, write_identity_model
from inferd.executors.onnxruntime import graph_optimization_level
from inferd.repository import ModelRepository, batcher_options, load_model_config
from inferd.repository.layout import check_model_name


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("repo")
    make_examples(root)
    return root


def config_of(repo: Path, name: str, text: str | None = None, default_mbs: int = 4) -> object:
    repository = ModelRepository(repo)
    model_file = repository.model_file(name, 1)
    config_path = repository.config_path(name)
    if text is not None:
        config_path = repo.parent / f"{name}-{abs(hash(text))}.pbtxt"
        config_path.write_text(text)
    return load_model_config(name, config_path, model_file, default_max_batch_size=default_mbs)


def test_layout_lists_models_and_versions(repo: Path) -> None:
    repository = ModelRepository(repo)
    assert repository.model_names() == [
        "decoder",
        "embed",
        "generate",
        "identity_bytes",
        "identity_fp32",
        "mlp",
        "simple",
        "text_embedding",
        "tokenize",
    ]
    (repo / "simple" / "3").mkdir()
    (repo / "simple" / "07").mkdir()  # leading zero: not a version, as in Triton
    (repo / "simple" / "latest").mkdir()
    assert repository.versions("simple") == [1, 3]
    with pytest.raises(NotFound, match=r"version 3 has no model\.onnx"):
        repository.model_file("simple", 3)
    for extra in ("3", "07", "latest"):
        (repo / "simple" / extra).rmdir()


@pytest.mark.parametrize("name", ["..", "../etc", "/abs", "a/b", "", "x" * 200, "bad name"])
def test_unsafe_model_names_are_refused(name: str) -> None:
    with pytest.raises(InvalidArgument):
        check_model_name(name)


def test_a_symlink_out_of_the_repository_is_refused(repo: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    (outside / "1").mkdir(parents=True)
    link = repo / "escape"
    os.symlink(outside, link)
    try:
        with pytest.raises(InvalidArgument, match="outside"):
            ModelRepository(repo).model_dir("escape")
    finally:
        link.unlink()


def test_a_config_linked_out_of_the_model_is_refused(tmp_path: Path) -> None:
    """issue 13: config.pbtxt must resolve inside the model's folder like its other files."""
    root = tmp_path / "models"
    write_identity_model(root / "linked", "FP32")
    secret = tmp_path / "secret.pbtxt"
    secret.write_text('name: "linked"\n')
    (root / "linked" / "config.pbtxt").unlink(missing_ok=True)
    os.symlink(secret, root / "linked" / "config.pbtxt")
    with pytest.raises(InvalidArgument, match=r"config\.pbtxt resolves outside the model"):
        ModelRepository(root).config_path("linked")
    # A link inside the model's folder is followed, as for model files.
    inside = root / "linked" / "configs" / "a.pbtxt"
    inside.parent.mkdir()
    inside.write_text('name: "linked"\n')
    (root / "linked" / "config.pbtxt").unlink()
    os.symlink(inside, root / "linked" / "config.pbtxt")
    assert ModelRepository(root).config_path("linked") == root / "linked" / "config.pbtxt"


def test_config_is_completed_from_the_model(repo: Path) -> None:
    config = config_of(repo, "identity_fp32")
    assert config.name == "identity_fp32"
    assert config.platform == "onnxruntime_onnx"
    assert config.max_batch_size == 4  # dynamic first dim: batches, with the default
    assert [(i.name, i.data_type, list(i.dims)) for i in config.input] == [("INPUT0", 11, [-1])]
    assert [(o.name, o.data_type, list(o.dims)) for o in config.output] == [("OUTPUT0", 11, [-1])]
    assert config.instance_group[0].count == 1
    # No scheduler named and the model batches: Triton's default, dynamic batching, zero delay.
    assert config.WhichOneof("scheduling_choice") == "dynamic_batching"
    assert config.dynamic_batching == type(config.dynamic_batching)()


def test_a_written_config_is_kept(repo: Path) -> None:
    config = config_of(repo, "simple")
    assert config.max_batch_size == 8
    assert [i.name for i in config.input] == ["INPUT0", "INPUT1"]
    assert list(config.input[0].dims) == [16]


def test_a_fixed_first_dim_does_not_batch(tmp_path: Path) -> None:
    write_identity_model(tmp_path / "plain", "INT32", max_batch_size=0, with_config=True)
    config = load_model_config(
        "plain",
        tmp_path / "plain" / "config.pbtxt",
        tmp_path / "plain" / "1" / "model.onnx",
        default_max_batch_size=4,
    )
    assert config.max_batch_size == 0
    assert list(config.input[0].dims) == [-1, -1]
    assert config.WhichOneof("scheduling_choice") is None  # nothing to batch: no default


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('name: "other"', "names the model 'other'"),
        ('platform: "tensorrt_plan"', "a tensorrt_plan config must list its inputs and outputs"),
        (
            'max_batch_size: 8 parameters { key: "inferd.executor" value { string_value: "tvm" } }',
            "inferd.executor is 'tvm'",
        ),
        (
            'max_batch_size: 8 input [{ name: "NOPE" data_type: TYPE_INT32 dims: [16] }]',
            "input 'NOPE'.*no such input",
        ),
        (
            'max_batch_size: 8 input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [16] },'
            ' { name: "INPUT1" data_type: TYPE_INT32 dims: [16] }]',
            "TYPE_FP32.*ONNX model says TYPE_INT32",
        ),
        (
            'max_batch_size: 8 input [{ name: "INPUT0" data_type: TYPE_INT32 dims: [15] },'
            ' { name: "INPUT1" data_type: TYPE_INT32 dims: [16] }]',
            r"shape \[-1, 15\].*\[-1, 16\]",
        ),
        (
            'max_batch_size: 8 input [{ name: "INPUT0" data_type: TYPE_INT32 dims: [16] }]',
            r"needs inputs \['INPUT1'\]",
        ),
        ("max_batch_size: 8 bogus_field: 1", "bogus_field"),
        (
            'max_batch_size: 8 input [{ name: "INPUT0" data_type: TYPE_INT32 dims: [16] },'
            ' { name: "INPUT1" data_type: TYPE_INT32 dims: [16] optional: true }]',
            "input 'INPUT1': config.pbtxt makes it optional, the ONNX model requires it",
        ),
        (
            "max_batch_size: 8 optimization { execution_accelerators {"
            ' cpu_execution_accelerator [{ name: "openvino" }] } }',
            "cpu_execution_accelerator 'openvino' is not available",
        ),
        (
            "max_batch_size: 8 optimization { execution_accelerators {"
            ' gpu_execution_accelerator [{ name: "tensorrt" }] } }',
            "'tensorrt' needs a KIND_GPU instance_group",
        ),
        (
            "max_batch_size: 8 optimization { execution_accelerators {"
            ' gpu_execution_accelerator [{ name: "tensorrt"'
            ' parameters { key: "precision_mode" value: "INT4" } }] } }',
            "precision_mode 'INT4' is not FP32/FP16",
        ),
        (
            "max_batch_size: 8 optimization { execution_accelerators {"
            ' gpu_execution_accelerator [{ name: "tensorrt"'
            ' parameters { key: "bogus" value: "1" } }] } }',
            r"unknown parameter\(s\) \['bogus'\]",
        ),
        (
            "max_batch_size: 8 optimization { execution_accelerators {"
            ' gpu_execution_accelerator [{ name: "migraphx" }] } }',
            "'migraphx' is not known",
        ),
    ],
)
def test_config_mismatches_name_both_sides(repo: Path, text: str, message: str) -> None:
    with pytest.raises(ModelLoadError, match=message):
        config_of(repo, "simple", text)


def policy_of(tmp_path: Path, datatype: str, extra: str, max_batch_size: int = 8) -> object:
    model_dir = tmp_path / "m"
    write_identity_model(model_dir, datatype, max_batch_size=max_batch_size)
    config_path = model_dir / "config.pbtxt"
    config_path.write_text(config_path.read_text() + extra)
    config = load_model_config(
        "m", config_path, model_dir / "1" / "model.onnx", default_max_batch_size=4
    )
    return batcher_options(config)


def test_dynamic_batching_settings_become_the_policy(tmp_path: Path) -> None:
    policy = policy_of(
        tmp_path,
        "FP32",
        """dynamic_batching {
             preferred_batch_size: [2, 4] max_queue_delay_microseconds: 300 preserve_ordering: true
             priority_levels: 3 default_priority_level: 2
             default_queue_policy { max_queue_size: 5 default_timeout_microseconds: 7 }
             priority_queue_policy {
               key: 1 value: { timeout_action: DELAY allow_timeout_override: true }
             }
           }""",
    )
    assert isinstance(policy, BatcherOptions)
    assert policy.dynamic and policy.max_batch_size == 8
    assert policy.preferred_batch_sizes == [2, 4]
    assert policy.max_queue_delay_us == 300 and policy.preserve_ordering
    assert (policy.priority_levels, policy.default_priority_level) == (3, 2)
    assert policy.default_queue_policy == QueuePolicy(max_queue_size=5, default_timeout_us=7)
    assert policy.level_queue_policies == {
        1: QueuePolicy(delay_on_timeout=True, allow_timeout_override=True)
    }


def test_a_batching_model_without_a_scheduler_gets_dynamic_batching(tmp_path: Path) -> None:
    policy = policy_of(tmp_path, "FP32", "")  # max_batch_size: 8, no scheduler named
    assert policy == BatcherOptions(dynamic=True, max_batch_size=8)  # zero delay, one level


def test_a_stated_max_batch_size_of_0_gets_no_scheduler(tmp_path: Path) -> None:
    policy = policy_of(tmp_path, "FP32", "", max_batch_size=0)
    assert policy == BatcherOptions(dynamic=False, max_batch_size=0)  # each request alone


def test_padding_parameters_become_the_policy(tmp_path: Path) -> None:
    policy = policy_of(
        tmp_path,
        "INT32",
        """dynamic_batching { }
           parameters { key: "inferd.pad_inputs" value: { string_value: "INPUT0" } }
           parameters { key: "inferd.pad_value" value: { string_value: "3" } }
           parameters { key: "inferd.pad_outputs" value: { string_value: "OUTPUT0" } }""",
    )
    assert isinstance(policy, BatcherOptions)
    assert policy.padding.inputs == [True]
    assert policy.padding.value == 3.0
    assert policy.padding.reference_input == 0
    assert policy.padding.outputs == [[(1, 1)]]


def pad(key: str, value: str) -> str:
    return f'parameters {{ key: "inferd.pad_{key}" value: {{ string_value: "{value}" }} }} '


@pytest.mark.parametrize(
    ("datatype", "extra", "message"),
    [
        (
            "FP32",
            "dynamic_batching { preferred_batch_size: [9] }",
            r"preferred_batch_size 9 .*1\.\.8",
        ),
        (
            "FP32",
            "dynamic_batching { priority_levels: 2 default_priority_level: 3 }",
            "outside 1..2",
        ),
        (
            "FP32",
            "dynamic_batching { priority_levels: 2 default_priority_level: 1"
            " priority_queue_policy { key: 5 value: {} } }",
            "names level 5",
        ),
        ("FP32", "dynamic_batching { } " + pad("inputs", "X"), "'X', not an input"),
        ("BYTES", "dynamic_batching { } " + pad("inputs", "INPUT0"), "cannot be padded"),
        (
            "FP16",
            "dynamic_batching { } " + pad("inputs", "INPUT0") + pad("value", "1"),
            "pad with 0 only",
        ),
        ("FP32", "dynamic_batching { } " + pad("outputs", "OUTPUT0"), "need inferd.pad_inputs"),
        ("FP32", "sequence_batching { } " + pad("inputs", "INPUT0"), "need dynamic_batching"),
    ],
)
def test_bad_batching_settings_fail_the_load(
    tmp_path: Path, datatype: str, extra: str, message: str
) -> None:
    with pytest.raises(ModelLoadError, match=message):
        policy_of(tmp_path, datatype, extra)


def test_padding_a_model_that_does_not_batch_fails_the_load(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="need dynamic_batching"):
        policy_of(tmp_path, "FP32", pad("inputs", "INPUT0"), max_batch_size=0)


SIMPLE_IO = (
    "max_batch_size: 8 "
    'input [{ name: "INPUT0" data_type: TYPE_INT32 dims: [16] }, '
    '{ name: "INPUT1" data_type: TYPE_INT32 dims: [16] OPTIONAL }]'
)


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        ('model_operations { op_library_filename: ["ops.so"] }', "model_operations"),
        ("optimization { cuda { graphs: true } }", "optimization.cuda"),
        ('model_repository_agents { agents [{ name: "checksum" }] }', "model_repository_agents"),
        (
            'instance_group [{ count: 1 kind: KIND_CPU host_policy: "numa0" }]',
            "instance_group.host_policy",
        ),
        (SIMPLE_IO.replace("OPTIONAL", "allow_ragged_batch: true"), "input.allow_ragged_batch"),
    ],
)
def test_a_config_field_inferd_does_not_honour_fails_the_load_with_its_name(
    repo: Path, extra: str, named: str
) -> None:
    with pytest.raises(ModelLoadError, match=rf"sets .*{re.escape(named)}.*does not support yet"):
        config_of(repo, "simple", extra)


def test_response_cache_loads_where_an_answer_is_the_request_s_alone(repo: Path) -> None:
    assert config_of(repo, "simple", "response_cache { enable: true }").response_cache.enable


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            "model_transaction_policy { decoupled: true } sequence_batching { "
            "iterative_sequence: true }",
            r"response_cache \{ enable: true \} cannot be used with model_transaction_policy "
            r"\{ decoupled: true \}: a decoupled model's answer is a stream",
        ),
        (
            "sequence_batching { }",
            r"response_cache \{ enable: true \} cannot be used with sequence_batching: a "
            "stateful model's answer depends on its sequence",
        ),
    ],
)
def test_response_cache_on_a_decoupled_or_stateful_model_fails_the_load(
    repo: Path, extra: str, message: str
) -> None:
    with pytest.raises(ModelLoadError, match=message):
        config_of(repo, "simple", f"{extra} response_cache {{ enable: true }}")


def test_a_decoupled_model_that_is_not_a_python_model_fails_the_load(repo: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"decoupled: true \} is served for python models"):
        config_of(repo, "simple", "model_transaction_policy { decoupled: true }")


@pytest.mark.parametrize(
    "extra",
    [
        "optimization { }",
        "model_transaction_policy { decoupled: false }",
        SIMPLE_IO.replace("OPTIONAL", ""),
    ],
)
def test_empty_or_default_sections_are_accepted(repo: Path, extra: str) -> None:
    config = config_of(repo, "simple", extra)
    assert config.name == "simple"


@pytest.mark.parametrize(("level", "ort"), [(0, 99), (-1, 1), (1, 2), (2, 0)])
def test_the_graph_optimization_level_is_triton_s_onnx_runtime_backend_s(
    repo: Path, level: int, ort: int
) -> None:
    config = config_of(repo, "simple", f"optimization {{ graph {{ level: {level} }} }}")
    assert graph_optimization_level(config.optimization.graph.level) == ort


def test_an_unknown_graph_optimization_level_fails_naming_the_ones_there_are() -> None:
    with pytest.raises(ModelLoadError, match=r"level 3: ONNX Runtime models take -1 \(basic\)"):
        graph_optimization_level(3)
