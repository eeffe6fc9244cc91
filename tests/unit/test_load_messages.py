"""What a failed load tells clients: the model, its version and its files relative to the model's
folder, never the server's paths (the log keeps those), and why, in terms a user can act on.

Each model is loaded through the registry, as RepositoryModelLoad does; its reason is then what
RepositoryIndex, ModelReady's lookup and ModelInfer (``registry.get``) answer with."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from google.protobuf import text_format
from onnx import TensorProto, helper, numpy_helper

import inferd._proto.model_config_pb2 as model_config_pb2
from inferd.core import CompletionDispatcher, HostBufferPool, cuda_device_count
from inferd.errors import InferdError, ModelLoadError, NotFound, Unavailable
from inferd.examples import make_examples
from inferd.executors import OnnxRuntimeExecutor, OnnxRuntimeOptions, tensorrt
from inferd.executors.onnxruntime_native import NativeOnnxRuntimeExecutor, native_onnxruntime
from inferd.models import ModelRegistry, ModelState, ModelVersionBuilder
from inferd.repository import InstancePlacement, ModelRepository, instance_placements

OPTIONS = OnnxRuntimeOptions(1, 1)
RUNNABLE = ("onnxruntime_onnx", "onnxruntime", "tensorrt_plan", "tensorrt", "'python'")


def registry_for(root: Path) -> ModelRegistry:
    return ModelRegistry(
        ModelRepository(root),
        CompletionDispatcher(asyncio.get_running_loop()),
        HostBufferPool(1 << 24),
        default_max_batch_size=4,
        onnxruntime_options=OPTIONS,
    )


def onnx_model(node_op: str) -> onnx.ModelProto:
    """X -> Y through ``node_op`` with a weight W (Add: a valid model; anything else: a model
    that parses but ONNX Runtime refuses)."""
    graph = helper.make_graph(
        [helper.make_node(node_op, ["X", "W"], ["Y"])],
        "g",
        [helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", 2])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", 2])],
        [numpy_helper.from_array(np.ones(2, dtype=np.float32), "W")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


def write_model(model_dir: Path, config: str | bytes | None, files: dict[str, Any]) -> None:
    """``files``: name in version folder 1 -> bytes, or an ONNX model; ``config``: config.pbtxt."""
    (model_dir / "1").mkdir(parents=True)
    if isinstance(config, str):
        (model_dir / "config.pbtxt").write_text(config)
    elif config is not None:
        (model_dir / "config.pbtxt").write_bytes(config)
    for name, content in files.items():
        if isinstance(content, onnx.ModelProto):
            onnx.save(content, model_dir / "1" / name)
        else:
            (model_dir / "1" / name).write_bytes(content)


def write_missing_weights(model_dir: Path) -> None:
    """A model whose external weights file is gone: ONNX Runtime names the file's full path."""
    (model_dir / "1").mkdir(parents=True)
    onnx.save(
        onnx_model("Add"),
        model_dir / "1" / "model.onnx",
        save_as_external_data=True,
        location="weights.bin",
        size_threshold=0,
    )
    (model_dir / "1" / "weights.bin").unlink()


@pytest.fixture
def repository(tmp_path: Path) -> Path:
    """A repository under a recognisable folder name, so that a leaked path is plain to see."""
    root = tmp_path / "server-side-secret-folder"
    root.mkdir()
    return root


async def failed_load(root: Path, name: str) -> str:
    """Loads ``name`` as RepositoryModelLoad does; checks that every answer a client can get
    about it names the model and no server path; returns the load's message."""
    registry = registry_for(root)
    try:
        with pytest.raises(InferdError) as failure:
            await registry.load(name)
        message = str(failure.value)
        (status,) = [s for s in registry.index() if s.name == name]
        assert status.state is ModelState.UNAVAILABLE
        with pytest.raises(Unavailable) as not_ready:  # ModelReady, ModelInfer, ModelMetadata
            registry.get(name)
        for told in (message, status.reason, str(not_ready.value)):
            assert f"model {name!r}" in told, told
            assert str(root.parent) not in told, told
            assert "server-side-secret-folder" not in told, told
        return message
    finally:
        await registry.close()


@pytest.mark.parametrize(
    ("config", "file", "what"),
    [
        ('backend: "pytorch"\n', "model.pt", "backend 'pytorch'"),
        ('platform: "pytorch_libtorch"\n', "model.pt", "platform 'pytorch_libtorch'"),
        ('platform: "tensorflow_savedmodel"\n', "model.savedmodel", "platform 'tensorflow_"),
        ('platform: "onnxruntime_ensemble"\n', "", "platform 'onnxruntime_ensemble'"),
    ],
)
async def test_a_backend_inferd_cannot_run_is_named_as_such(
    repository: Path, config: str, file: str, what: str
) -> None:
    write_model(repository / "other", config, {file: b""} if file else {})
    message = await failed_load(repository, "other")
    assert what in message and "not one inferd can run" in message
    assert all(runnable in message for runnable in RUNNABLE), message
    assert "has no model.onnx" not in message


async def test_a_backend_named_by_a_load_requests_config_is_refused_likewise(
    repository: Path,
) -> None:
    make_examples(repository)
    registry = registry_for(repository)
    override = model_config_pb2.ModelConfig()
    text_format.Parse('backend: "pytorch"', override)
    with pytest.raises(ModelLoadError, match="model 'simple': backend 'pytorch' is not one"):
        await registry.load("simple", override)
    await registry.close()


async def test_a_config_that_does_not_parse_is_named_by_model_not_path(repository: Path) -> None:
    write_model(repository / "typo", "max_batch_size: 8\nbogus_field: 1\n", {})
    message = await failed_load(repository, "typo")
    assert message.startswith("model 'typo' config.pbtxt: 2:1 : ")
    assert "bogus_field" in message


async def test_a_config_that_is_not_text_fails_the_load(repository: Path) -> None:
    write_model(repository / "binary", b"\xff\xfe\x00max_batch_size", {})
    message = await failed_load(repository, "binary")
    assert message.startswith("model 'binary' config.pbtxt is not UTF-8 text")


async def test_a_corrupt_model_file_is_named_by_model_version_and_file(repository: Path) -> None:
    write_model(repository / "corrupt", None, {"model.onnx": b"not an ONNX model"})
    message = await failed_load(repository, "corrupt")
    assert message.startswith("model 'corrupt' version 1 (model.onnx): not a readable ONNX model")


async def test_what_onnx_runtime_refuses_loses_the_path_from_its_message(repository: Path) -> None:
    """The file parses, so the executor gets it; ONNX Runtime's message names the file."""
    write_model(repository / "bad_graph", None, {"model.onnx": onnx_model("NoSuchOp")})
    message = await failed_load(repository, "bad_graph")
    assert message.startswith("model 'bad_graph' version 1 (model.onnx): ")
    assert "NoSuchOp" in message and "ONNX Runtime cannot load it" in message
    assert "1/model.onnx" in message  # ONNX Runtime's "Load model from <path>", made relative


async def test_missing_external_weights_are_named_relative_to_the_model(repository: Path) -> None:
    write_missing_weights(repository / "weightless")
    message = await failed_load(repository, "weightless")
    assert message.startswith("model 'weightless' version 1 (model.onnx): ")
    assert "1/weights.bin" in message


async def test_a_version_folder_without_its_file_names_the_version(repository: Path) -> None:
    write_model(repository / "empty", None, {"weights.bin": b""})
    message = await failed_load(repository, "empty")
    assert message == "model 'empty' version 1 has no model.onnx"


async def test_a_model_folder_that_loops_is_refused_without_its_path(repository: Path) -> None:
    (repository / "loop").symlink_to(repository / "loop")
    registry = registry_for(repository)
    with pytest.raises(InferdError) as failure:
        await registry.load("loop")
    assert "model 'loop'" in str(failure.value)
    assert "server-side-secret-folder" not in str(failure.value)
    await registry.close()


def test_a_missing_repository_is_not_named_to_clients(tmp_path: Path) -> None:
    """RepositoryIndex lists the repository: a client must not learn where it is."""
    with pytest.raises(NotFound) as failure:
        ModelRepository(tmp_path / "server-side-secret-folder").model_names()
    assert "server-side-secret-folder" not in str(failure.value)
    assert "model repository" in str(failure.value)


@pytest.mark.parametrize("model", ["bad_graph", "weightless"])
def test_both_onnx_runtime_executors_name_the_model_not_the_path(
    repository: Path, model: str
) -> None:
    if model == "bad_graph":
        write_model(repository / model, None, {"model.onnx": onnx_model("NoSuchOp")})
    else:
        write_missing_weights(repository / model)
    path = repository / model / "1" / "model.onnx"
    attempts: list[Any] = [
        lambda: OnnxRuntimeExecutor(path, ["X"], ["Y"], OPTIONS, model=model),
    ]
    if native_onnxruntime().version is not None:
        attempts.append(
            lambda: NativeOnnxRuntimeExecutor(
                path, ["X"], ["Y"], OPTIONS, [TensorProto.FLOAT], model=model
            )
        )
    for attempt in attempts:
        with pytest.raises(ModelLoadError) as failure:
            attempt()
        message = str(failure.value)
        assert message.startswith(f"model {model!r} version 1 (model.onnx): ONNX Runtime cannot")
        assert "server-side-secret-folder" not in message


def test_kind_gpu_without_a_gpu_points_at_the_cpu_fallback() -> None:
    config = model_config_pb2.ModelConfig(name="m")
    text_format.Parse('instance_group [{ name: "g" kind: KIND_GPU }]', config)
    with pytest.raises(ModelLoadError) as failure:
        instance_placements(config, 0, "no libcudart")
    message = str(failure.value)
    assert "KIND_GPU needs a CUDA device" in message
    # The remedy is in the config's own syntax: it parses as the parameter it names.
    remedy = message[message.index("parameters {") :]
    text_format.Parse(remedy, config)
    assert config.parameters["inferd.gpu_fallback"].string_value == "cpu"


@pytest.mark.skipif(cuda_device_count() > 0, reason="needs a machine without a CUDA device")
async def test_a_kind_gpu_load_without_a_gpu_says_how_to_fall_back(repository: Path) -> None:
    write_model(
        repository / "gpu",
        "instance_group [{ kind: KIND_GPU }]\n",
        {"model.onnx": onnx_model("Add")},
    )
    message = await failed_load(repository, "gpu")
    assert "KIND_GPU needs a CUDA device" in message and "inferd.gpu_fallback" in message


def test_an_unusable_engine_cache_is_not_named_to_clients(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The engine cache is the server's folder: its path stays in the log."""
    model_file = tmp_path / "m" / "1" / "model.onnx"
    model_file.parent.mkdir(parents=True)
    model_file.write_bytes(b"onnx")
    cache = tmp_path / "server-side-secret-folder"
    cache.write_bytes(b"a file where the cache's folder should be")
    monkeypatch.setattr(tensorrt, "build_engine", lambda *args, **kwargs: b"engine")
    config = model_config_pb2.ModelConfig(name="m", max_batch_size=4)
    text_format.Parse('input [{ name: "X" data_type: TYPE_FP32 dims: [2] }]', config)

    class Trt:
        __version__ = "10.0"

    with pytest.raises(ModelLoadError) as failure:
        tensorrt._engine_bytes(
            Trt, config, model_file, None, cache / "engines", [InstancePlacement("g", 0)]
        )
    message = str(failure.value)
    assert message.startswith("model 'm': the TensorRT engine cache cannot be used")
    assert "server-side-secret-folder" not in message


async def test_a_surprise_during_a_versions_load_is_told_without_paths(
    repository: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Any other exception from a version's load (a library's, an OSError naming a file) is a
    failed load whose message names files relative to the model's folder."""
    write_model(repository / "surprised", None, {"model.onnx": onnx_model("Add")})
    version_dir = repository / "surprised" / "1"

    def fail(*args: Any, **kwargs: Any) -> None:
        raise OSError(f"[Errno 5] Input/output error: '{version_dir / 'warmup' / 'x.bin'}'")

    monkeypatch.setattr(ModelVersionBuilder, "_build_version", fail)
    message = await failed_load(repository, "surprised")
    assert message.startswith("model 'surprised' version 1: OSError: ")
    assert "1/warmup/x.bin" in message
