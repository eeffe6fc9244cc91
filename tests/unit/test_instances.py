"""Instance placement (instance_group count/kind/gpus), GPU accelerators and the ONNX Runtime
providers they select, checked against pretend device counts and provider lists."""

from __future__ import annotations

import pytest
from google.protobuf import text_format

import inferd._proto.model_config_pb2 as model_config_pb2
from inferd.errors import ModelLoadError
from inferd.executors.onnxruntime import onnxruntime_providers
from inferd.repository import GpuAccelerator, InstancePlacement, gpu_accelerator
from inferd.repository import instance_placements as placements_of
from inferd.repository.instances import resolve_instance_kinds

CPU_ONLY = ["CPUExecutionProvider"]
WITH_CUDA = ["CUDAExecutionProvider", "CPUExecutionProvider"]
WITH_TENSORRT = ["TensorrtExecutionProvider", *WITH_CUDA]


def config(text: str) -> object:
    message = model_config_pb2.ModelConfig(name="m")
    text_format.Parse(text, message)
    return message


def test_cpu_groups_give_count_instances_each() -> None:
    c = config(
        'instance_group [{ count: 2 kind: KIND_CPU }, { name: "b" count: 1 kind: KIND_CPU }]'
    )
    assert placements_of(c, 0, "none") == [
        InstancePlacement("m_0"),
        InstancePlacement("m_0"),
        InstancePlacement("b"),
    ]


def test_gpu_groups_place_count_instances_on_each_listed_device() -> None:
    c = config('instance_group [{ name: "g" count: 2 kind: KIND_GPU gpus: [1, 3] }]')
    assert [p.device_id for p in placements_of(c, 4, "4 devices")] == [1, 1, 3, 3]
    every = config("instance_group [{ count: 1 kind: KIND_GPU }]")
    assert [p.device_id for p in placements_of(every, 2, "2 devices")] == [0, 1]


@pytest.mark.parametrize(
    ("text", "gpus", "message"),
    [
        (
            "instance_group [{ kind: KIND_GPU }]",
            0,
            r"KIND_GPU needs a CUDA device.*\(no libcudart\)",
        ),
        ("instance_group [{ kind: KIND_GPU gpus: [2] }]", 2, r"device 2, .* sees devices 0\.\.1"),
        ("instance_group [{ kind: KIND_GPU gpus: [0, 0] }]", 1, "lists a device twice"),
        ("instance_group [{ kind: KIND_CPU gpus: [0] }]", 1, r"gpus \[0\] given for KIND_CPU"),
        ("instance_group [{ kind: KIND_MODEL }]", 1, "KIND_MODEL is not supported"),
    ],
)
def test_impossible_placements_fail_the_load_naming_the_group(
    text: str, gpus: int, message: str
) -> None:
    with pytest.raises(ModelLoadError, match=message):
        placements_of(config(text), gpus, "no libcudart")


def test_kind_auto_means_a_gpu_when_there_is_one() -> None:
    for gpus, kind in ((0, "KIND_CPU"), (1, "KIND_GPU")):
        c = config("instance_group [{ kind: KIND_AUTO }]")
        resolve_instance_kinds(c, gpus)
        assert model_config_pb2.ModelInstanceGroup.Kind.Name(c.instance_group[0].kind) == kind


def test_kind_gpu_falls_back_to_the_cpu_only_when_the_config_says_so() -> None:
    text = (
        "instance_group [{ count: 2 kind: KIND_GPU gpus: [0] }] "
        'parameters { key: "inferd.gpu_fallback" value { string_value: "cpu" } } '
        "optimization { execution_accelerators {"
        ' gpu_execution_accelerator [{ name: "tensorrt" }] } }'
    )
    c = config(text)
    resolve_instance_kinds(c, 0)
    assert placements_of(c, 0, "none") == [InstancePlacement("m_0")] * 2
    assert gpu_accelerator(c) is None  # dropped with the GPU
    kept = config(text)
    resolve_instance_kinds(kept, 1)  # a GPU is there: nothing changes
    assert [p.device_id for p in placements_of(kept, 1, "1 device")] == [0, 0]
    with pytest.raises(ModelLoadError, match="the only fallback is"):
        resolve_instance_kinds(
            config('parameters { key: "inferd.gpu_fallback" value { string_value: "tpu" } }'), 0
        )


def test_a_tensorrt_accelerator_is_read_with_its_parameters() -> None:
    c = config(
        "instance_group [{ kind: KIND_GPU }] optimization { execution_accelerators {"
        ' gpu_execution_accelerator [{ name: "tensorrt"'
        ' parameters { key: "precision_mode" value: "FP16" }'
        ' parameters { key: "trt_engine_cache_enable" value: "true" }'
        ' parameters { key: "trt_engine_cache_path" value: "/cache" } }] } }'
    )
    assert gpu_accelerator(c) == GpuAccelerator(
        "tensorrt",
        {
            "precision_mode": "FP16",
            "trt_engine_cache_enable": "true",
            "trt_engine_cache_path": "/cache",
        },
    )
    assert gpu_accelerator(config("")) is None


def test_providers_for_a_cpu_instance() -> None:
    assert onnxruntime_providers(InstancePlacement("g"), None, CPU_ONLY) == [
        ("CPUExecutionProvider", {})
    ]


def test_a_gpu_instance_gets_cuda_on_its_device() -> None:
    providers = onnxruntime_providers(InstancePlacement("g", 1), None, WITH_CUDA)
    assert providers == [("CUDAExecutionProvider", {"device_id": "1"})]


def test_tensorrt_comes_first_with_its_options() -> None:
    accelerator = GpuAccelerator(
        "tensorrt",
        {
            "precision_mode": "FP16",
            "max_workspace_size_bytes": "1024",
            "trt_engine_cache_enable": "true",
            "trt_engine_cache_path": "/cache",
        },
    )
    providers = onnxruntime_providers(InstancePlacement("g", 0), accelerator, WITH_TENSORRT)
    assert providers == [
        (
            "TensorrtExecutionProvider",
            {
                "device_id": "0",
                "trt_fp16_enable": "True",
                "trt_max_workspace_size": "1024",
                "trt_engine_cache_enable": "True",
                "trt_engine_cache_path": "/cache",
            },
        ),
        ("CUDAExecutionProvider", {"device_id": "0"}),
    ]


def test_a_provider_the_installed_onnxruntime_lacks_fails_the_load_by_name() -> None:
    with pytest.raises(ModelLoadError, match=r"needs CUDAExecutionProvider.*inferd\[gpu\]"):
        onnxruntime_providers(InstancePlacement("g", 0), None, CPU_ONLY)
    with pytest.raises(ModelLoadError, match="needs TensorrtExecutionProvider"):
        onnxruntime_providers(InstancePlacement("g", 0), GpuAccelerator("tensorrt"), WITH_CUDA)
