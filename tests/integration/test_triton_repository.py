"""A repository in Triton's layout whose config sets every field inferd honours, served as it is.

``full`` has two versions and a config.pbtxt with every supported field (reshape on inputs and
outputs, an optional input backed by an initializer, all of dynamic_batching, a named instance
group, a version policy, parameters, warm-up samples); ``bare`` has no config at all. Its GPU
variant (KIND_GPU with gpus, a TensorRT accelerator) loads where a GPU is, and fails with a
message naming what is missing elsewhere.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
from google.protobuf import json_format, text_format
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

import inferd._proto.model_config_pb2 as model_config_pb2
from inferd.core import cuda_device_count
from tests.integration.conftest import ServerProcess, running_server

FULL_CONFIG = """
name: "full"
platform: "onnxruntime_onnx"
max_batch_size: 8
default_model_filename: "model.onnx"
version_policy { specific { versions: [1, 2] } }
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [2, 3] reshape { shape: [6] } },
  { name: "SCALE" data_type: TYPE_FP32 dims: [1] optional: true }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [2, 3] reshape { shape: [6] } }
]
dynamic_batching {
  preferred_batch_size: [4, 8]
  max_queue_delay_microseconds: 2000
  preserve_ordering: true
  priority_levels: 2
  default_priority_level: 2
  default_queue_policy {
    timeout_action: REJECT
    default_timeout_microseconds: 5000000
    allow_timeout_override: true
    max_queue_size: 64
  }
  priority_queue_policy {
    key: 1
    value { timeout_action: DELAY default_timeout_microseconds: 1000000 max_queue_size: 16 }
  }
}
instance_group [ { name: "pair" count: 2 kind: KIND_CPU } ]
parameters { key: "intra_op_thread_count" value { string_value: "1" } }
parameters { key: "inter_op_thread_count" value { string_value: "1" } }
model_warmup [
  {
    name: "zeros"
    batch_size: 2
    inputs { key: "INPUT0" value { data_type: TYPE_FP32 dims: [2, 3] zero_data: true } }
  },
  {
    name: "random"
    batch_size: 1
    count: 2
    inputs { key: "INPUT0" value { data_type: TYPE_FP32 dims: [2, 3] random_data: true } }
    inputs { key: "SCALE" value { data_type: TYPE_FP32 dims: [1] random_data: true } }
  }
]
"""

# The same model placed on a GPU through TensorRT: every GPU field of the config.
GPU_CONFIG = FULL_CONFIG.replace(
    'instance_group [ { name: "pair" count: 2 kind: KIND_CPU } ]',
    'instance_group [ { name: "gpu0" count: 1 kind: KIND_GPU gpus: [0] } ]\n'
    "optimization { execution_accelerators { gpu_execution_accelerator [ {\n"
    '  name: "tensorrt"\n'
    '  parameters { key: "precision_mode" value: "FP16" }\n'
    '  parameters { key: "max_workspace_size_bytes" value: "1073741824" }\n'
    "} ] } }",
).replace('name: "full"', 'name: "full_gpu"')


def write_scaled_model(path: Path, factor: float) -> None:
    """OUTPUT0 = INPUT0 * SCALE * factor over [batch, 6]; SCALE [batch, 1] is also an
    initializer (1.0), so a request may leave it out."""
    graph = helper.make_graph(
        [
            helper.make_node("Mul", ["INPUT0", "SCALE"], ["scaled"]),
            helper.make_node("Mul", ["scaled", "FACTOR"], ["OUTPUT0"]),
        ],
        "scaled",
        [
            helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", 6]),
            helper.make_tensor_value_info("SCALE", TensorProto.FLOAT, ["batch", 1]),
        ],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", 6])],
        initializer=[
            helper.make_tensor("SCALE", TensorProto.FLOAT, [1, 1], [1.0]),
            helper.make_tensor("FACTOR", TensorProto.FLOAT, [], [factor]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(model.SerializeToString())


def write_repository(root: Path) -> None:
    for name, config in (("full", FULL_CONFIG), ("full_gpu", GPU_CONFIG)):
        write_scaled_model(root / name / "1" / "model.onnx", 1.0)
        write_scaled_model(root / name / "2" / "model.onnx", 2.0)
        write_scaled_model(root / name / "3" / "model.onnx", 3.0)  # not in the policy
        (root / name / "config.pbtxt").write_text(config)
    bare = helper.make_graph(
        [helper.make_node("Neg", ["X"], ["Y"])],
        "bare",
        [helper.make_tensor_value_info("X", TensorProto.INT64, ["n", 4])],
        [helper.make_tensor_value_info("Y", TensorProto.INT64, ["n", 4])],
    )
    model = helper.make_model(bare, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    (root / "bare" / "1").mkdir(parents=True)
    (root / "bare" / "1" / "model.onnx").write_bytes(model.SerializeToString())


@pytest.fixture(scope="module")
def triton_repo_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("triton-layout")
    write_repository(root / "models")
    with running_server(
        root / "models",
        ["full", "bare"],
        root,
        "--model-control-mode",
        "explicit",
        "--load-model",
        "full,bare",  # full_gpu has its own test
    ) as server:
        yield server


@pytest.fixture
def triton(triton_repo_server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    client = grpcclient.InferenceServerClient(triton_repo_server.url)
    try:
        yield client
    finally:
        client.close()


def served_config(client: grpcclient.InferenceServerClient, name: str) -> object:
    """The served config, parsed into inferd's own ModelConfig message."""
    response = client.get_model_config(name, as_json=True)
    config = model_config_pb2.ModelConfig()
    json_format.ParseDict(response["config"], config)
    return config


def test_the_served_config_is_what_was_written_plus_what_was_completed(
    triton: grpcclient.InferenceServerClient,
) -> None:
    expected = model_config_pb2.ModelConfig()
    text_format.Parse(FULL_CONFIG, expected)
    expected.backend = "onnxruntime"  # the only field the full config leaves to completion
    assert served_config(triton, "full") == expected


def test_a_model_without_config_is_completed_from_the_onnx_model(
    triton: grpcclient.InferenceServerClient,
) -> None:
    expected = model_config_pb2.ModelConfig()
    text_format.Parse(
        """
        name: "bare" platform: "onnxruntime_onnx" backend: "onnxruntime" max_batch_size: 4
        input [{ name: "X" data_type: TYPE_INT64 dims: [4] }]
        output [{ name: "Y" data_type: TYPE_INT64 dims: [4] }]
        instance_group [{ count: 1 kind: KIND_CPU }]
        dynamic_batching { }
        """,
        expected,
    )
    assert served_config(triton, "bare") == expected  # batching, no scheduler: Triton's default
    x = np.arange(8, dtype=np.int64).reshape(2, 4)
    given = grpcclient.InferInput("X", [2, 4], "INT64")
    given.set_data_from_numpy(x)
    np.testing.assert_array_equal(triton.infer("bare", [given]).as_numpy("Y"), -x)


def full_request(x: np.ndarray, scale: np.ndarray | None) -> list[grpcclient.InferInput]:
    inputs = [grpcclient.InferInput("INPUT0", list(x.shape), "FP32")]
    inputs[0].set_data_from_numpy(x)
    if scale is not None:
        inputs.append(grpcclient.InferInput("SCALE", list(scale.shape), "FP32"))
        inputs[1].set_data_from_numpy(scale)
    return inputs


def test_the_version_policy_serves_versions_one_and_two_and_the_default_is_two(
    triton: grpcclient.InferenceServerClient,
) -> None:
    assert triton.is_model_ready("full", "1") and triton.is_model_ready("full", "2")
    assert not triton.is_model_ready("full", "3")
    x = np.arange(12, dtype=np.float32).reshape(2, 2, 3)
    for version, factor in (("1", 1.0), ("2", 2.0), ("", 2.0)):
        result = triton.infer("full", full_request(x, None), model_version=version)
        assert result.get_response().model_version == (version or "2")
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), x * factor)
    with pytest.raises(InferenceServerException, match="no version '3'") as e:
        triton.infer("full", full_request(x, None), model_version="3")
    assert e.value.status() == "StatusCode.NOT_FOUND"
    metadata = triton.get_model_metadata("full", "1")
    assert metadata.versions == ["1"]
    assert [list(t.shape) for t in metadata.inputs] == [[-1, 2, 3], [-1, 1]]


def test_an_optional_input_may_be_left_out_and_requests_with_and_without_it_batch_apart(
    triton: grpcclient.InferenceServerClient, triton_repo_server: ServerProcess
) -> None:
    failures: list[str] = []

    def client(index: int) -> None:
        with grpcclient.InferenceServerClient(triton_repo_server.url) as c:
            for round_ in range(10):
                x = np.full((1, 2, 3), index * 100 + round_, dtype=np.float32)
                scale = np.full((1, 1), 3.0, dtype=np.float32) if index % 2 else None
                out = c.infer("full", full_request(x, scale), model_version="1")
                want = x * (3.0 if scale is not None else 1.0)
                if not np.array_equal(out.as_numpy("OUTPUT0"), want):
                    failures.append(f"client {index} round {round_}")

    before = triton.get_inference_statistics("full", "1").model_stats[0]
    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert failures == []
    after = triton.get_inference_statistics("full", "1").model_stats[0]
    assert after.inference_count - before.inference_count == 80
    # Whether they shared batches depends on whether requests overlapped here: the 2 ms delay is
    # an upper bound, and this model serves a request faster than these clients send the next.
    # The core's RequestsLeavingAnOptionalInputOutBatchApart shows the batching apart itself.
    assert after.execution_count - before.execution_count <= 80


def test_the_gpu_variant_loads_on_a_gpu_and_fails_with_its_reason_elsewhere(
    tmp_path: Path,
) -> None:
    repository = tmp_path / "models"
    write_repository(repository)
    with (
        running_server(
            repository, ["full_gpu"], tmp_path, "--model-control-mode", "explicit"
        ) as server,
        grpcclient.InferenceServerClient(server.url) as client,
    ):
        if cuda_device_count() == 0:
            with pytest.raises(InferenceServerException) as e:
                client.load_model("full_gpu")
            assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
            assert "instance_group 'gpu0': KIND_GPU needs a CUDA device" in str(e.value)
            # The same config with the CPU fallback it may ask for: loads and serves here.
            fallback = model_config_pb2.ModelConfig()
            text_format.Parse(GPU_CONFIG, fallback)
            fallback.parameters["inferd.gpu_fallback"].string_value = "cpu"
            client.load_model("full_gpu", config=json_format.MessageToJson(fallback))
            config = served_config(client, "full_gpu")
            assert [g.kind for g in config.instance_group] == [  # type: ignore[attr-defined]
                model_config_pb2.ModelInstanceGroup.KIND_CPU
            ]
            x = np.ones((1, 2, 3), dtype=np.float32)
            out = client.infer("full_gpu", full_request(x, None)).as_numpy("OUTPUT0")
            np.testing.assert_array_equal(out, 2 * x)
            print(f"no CUDA device here: checked the refusal and the CPU fallback ({e.value})")
            return
        client.load_model("full_gpu")  # on a GPU machine with inferd[gpu]
        x = np.ones((1, 2, 3), dtype=np.float32)
        out = client.infer("full_gpu", full_request(x, None)).as_numpy("OUTPUT0")
        np.testing.assert_allclose(out, 2 * x, rtol=1e-2)
