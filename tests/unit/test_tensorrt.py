"""The native TensorRT executor's logic, with a stand-in for the ``tensorrt`` module (which needs a
GPU): engine cache keys, optimization profiles, the build calls, and execution through the core's
stream and buffers (host stand-ins here), binding by address and copying back."""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from inferd.core import CudaStream, DeviceBufferPool, HostBufferPool
from inferd.errors import Internal, InvalidArgument, ModelLoadError
from inferd.executors.selection import create_executors
from inferd.executors.tensorrt import (
    TensorRtExecutor,
    cached_engine,
    engine_cache_path,
    optimization_profile,
    profile_shapes,
)
from inferd.repository import InstancePlacement, load_model_config
from inferd.repository.config import stated_config


def test_the_profile_covers_one_to_max_with_the_largest_preferred_size_as_optimum() -> None:
    assert optimization_profile(64, []) == (1, 64, 64)
    assert optimization_profile(64, [8, 32]) == (1, 32, 64)
    assert optimization_profile(0, []) == (1, 1, 1)
    assert profile_shapes("x", (3, 4), (1, 32, 64), batched=True) == (
        (1, 3, 4),
        (32, 3, 4),
        (64, 3, 4),
    )
    with pytest.raises(ModelLoadError, match="variable dim"):
        profile_shapes("x", (-1,), (1, 8, 8), batched=True)


def test_the_cache_key_changes_with_gpu_version_precision_profile_and_model(tmp_path: Path) -> None:
    base = engine_cache_path(tmp_path, "NVIDIA H200", "10.9", b"model", "fp16", (1, 8, 64))
    assert base.parent == tmp_path and base.name.startswith("NVIDIA-H200-trt10.9-fp16-b1-8-64-")
    others = [
        engine_cache_path(tmp_path, "NVIDIA A100", "10.9", b"model", "fp16", (1, 8, 64)),
        engine_cache_path(tmp_path, "NVIDIA H200", "10.10", b"model", "fp16", (1, 8, 64)),
        engine_cache_path(tmp_path, "NVIDIA H200", "10.9", b"model", "fp32", (1, 8, 64)),
        engine_cache_path(tmp_path, "NVIDIA H200", "10.9", b"model", "fp16", (1, 16, 64)),
        engine_cache_path(tmp_path, "NVIDIA H200", "10.9", b"other", "fp16", (1, 8, 64)),
    ]
    assert len({base, *others}) == 6


def test_an_engine_is_built_once_then_read_from_the_cache(tmp_path: Path) -> None:
    builds: list[int] = []

    def build() -> bytes:
        builds.append(1)
        return b"engine"

    path = tmp_path / "cache" / "x.plan"
    assert cached_engine(path, build) == b"engine"
    assert cached_engine(path, build) == b"engine"
    assert builds == [1] and path.read_bytes() == b"engine"


class FakeTrt:
    """Enough of ``tensorrt`` to run an engine that doubles INPUT0 into OUTPUT0 (FP32), reading
    and writing the bound addresses the way TensorRT would (host memory here)."""

    class Logger:
        WARNING = 2

        def __init__(self, level: int) -> None:
            pass

    class TensorIOMode:
        INPUT = "input"
        OUTPUT = "output"

    class Runtime:
        def __init__(self, logger: Any) -> None:
            pass

        def deserialize_cuda_engine(self, data: bytes) -> Any:
            return FakeEngine() if data == b"doubler" else None

    @staticmethod
    def nptype(dtype: Any) -> Any:
        return np.float32


class FakeEngine:
    num_io_tensors = 2

    def get_tensor_name(self, i: int) -> str:
        return ["INPUT0", "OUTPUT0"][i]

    def get_tensor_mode(self, name: str) -> str:
        return "input" if name == "INPUT0" else "output"

    def get_tensor_dtype(self, name: str) -> str:
        return "float"

    def create_execution_context(self) -> Any:
        return FakeContext()


class FakeContext:
    def __init__(self) -> None:
        self.shape: tuple[int, ...] = ()
        self.addresses: dict[str, int] = {}
        self.streams: list[int] = []

    def set_input_shape(self, name: str, shape: tuple[int, ...]) -> bool:
        self.shape = shape
        return shape[0] <= 8  # the profile's max batch

    def set_tensor_address(self, name: str, address: int) -> None:
        self.addresses[name] = address

    def get_tensor_shape(self, name: str) -> tuple[int, ...]:
        return self.shape

    def execute_async_v3(self, stream: int) -> bool:
        self.streams.append(stream)
        count = int(np.prod(self.shape))
        source = (ctypes.c_float * count).from_address(self.addresses["INPUT0"])
        target = (ctypes.c_float * count).from_address(self.addresses["OUTPUT0"])
        for i in range(count):
            target[i] = 2 * source[i]
        return True


def make_executor(engine: bytes = b"doubler") -> TensorRtExecutor:
    return TensorRtExecutor(
        FakeTrt,
        engine,
        ["INPUT0"],
        ["OUTPUT0"],
        CudaStream(-1),
        DeviceBufferPool(-1, 1 << 20),
        HostBufferPool(1 << 20),
    )


def test_execution_binds_addresses_runs_on_the_stream_and_copies_back() -> None:
    executor = make_executor()
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    (out,) = executor.execute([x])
    np.testing.assert_array_equal(out, 2 * x)
    assert executor._context.streams == [0]  # the stand-in stream's handle
    with pytest.raises(InvalidArgument, match="outside the engine's profile"):
        executor.execute([np.zeros((9, 4), dtype=np.float32)])
    with pytest.raises(InvalidArgument, match="take every input"):
        executor.execute([None])
    executor.close()


def test_a_failed_enqueue_is_internal_and_a_bad_engine_fails_the_load() -> None:
    executor = make_executor()
    executor._context.execute_async_v3 = lambda stream: False  # type: ignore[method-assign]
    with pytest.raises(Internal, match="failed to enqueue"):
        executor.execute([np.zeros((1, 4), dtype=np.float32)])
    with pytest.raises(ModelLoadError, match="cannot deserialize"):
        make_executor(b"garbage")


PLAN_CONFIG = """
platform: "tensorrt_plan" max_batch_size: 8
input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [4] }]
output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [4] }]
"""


def test_a_plan_config_loads_here_and_its_executor_asks_for_a_gpu(tmp_path: Path) -> None:
    config_path = tmp_path / "config.pbtxt"
    config_path.write_text(PLAN_CONFIG)
    config = load_model_config(
        "plan", config_path, tmp_path / "1" / "model.plan", default_max_batch_size=4
    )
    assert config.backend == "tensorrt"
    assert stated_config(config_path).platform == "tensorrt_plan"
    with pytest.raises(ModelLoadError, match="TensorRT runs on KIND_GPU instances"):
        create_executors(
            config, tmp_path, [InstancePlacement("plan_0")], None, None,  # type: ignore[arg-type]
            HostBufferPool(1 << 20), tmp_path,
        )  # fmt: skip


def test_staged_batches_execute_in_staging_order() -> None:
    executor = make_executor()
    a = np.ones((2, 4), dtype=np.float32)
    b = np.full((1, 4), 3, dtype=np.float32)
    executor.stage([a])
    executor.stage([b])
    np.testing.assert_array_equal(executor.execute([a])[0], 2 * a)
    np.testing.assert_array_equal(executor.execute([b])[0], 2 * b)
    executor.stage([a])
    with pytest.raises(Internal, match="not the one staged next"):
        executor.execute([b])
