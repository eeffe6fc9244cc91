"""The registry in-process: a reload frees the replaced versions' executors; an unload drains."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

import inferd._proto.grpc_service_pb2 as pb
from inferd.core import CompletionDispatcher, HostBufferPool
from inferd.dataplane import DataPlane
from inferd.errors import ModelLoadError, NotFound, Unavailable
from inferd.examples import make_examples
from inferd.executors import OnnxRuntimeOptions
from inferd.models import ModelRegistry, ModelState
from inferd.repository import ModelRepository, load_model_config


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("registry")
    make_examples(root)
    return root


def registry_for(root: Path) -> ModelRegistry:
    return ModelRegistry(
        ModelRepository(root),
        CompletionDispatcher(asyncio.get_running_loop()),
        HostBufferPool(1 << 24),
        default_max_batch_size=4,
        onnxruntime_options=OnnxRuntimeOptions(1, 1),
    )


def simple_inputs(value: int) -> list[tuple[int, tuple[int, ...], np.ndarray]]:
    a = np.full((1, 16), value, dtype=np.int32)
    return [(8, a.shape, a), (8, a.shape, a)]


def holds_a_session(executor: object) -> bool:
    """An executor not yet closed: the native one holds a core session, the Python one its own."""
    return hasattr(executor, "core_session") or hasattr(executor, "_session")


async def test_reload_swaps_versions_and_closes_the_old_executors(repository: Path) -> None:
    registry = registry_for(repository)
    await registry.load("simple")
    old = registry.get("simple")
    # A request queued on the old version while the reload happens is still answered.
    pending = asyncio.ensure_future(old.scheduler.infer(simple_inputs(2), 1))
    await registry.load("simple")
    new = registry.get("simple")
    assert new is not old
    outputs, _ = await pending
    np.testing.assert_array_equal(outputs[0][2], np.full((1, 16), 4, dtype=np.int32))
    assert not any(holds_a_session(e) for e in old.scheduler.executors)  # freed
    assert all(holds_a_session(e) for e in new.scheduler.executors)
    await registry.close()


async def test_unload_refuses_new_requests_and_reports_the_state(repository: Path) -> None:
    registry = registry_for(repository)
    await registry.load("simple")
    await registry.unload("simple")
    with pytest.raises(Unavailable):
        registry.get("simple")
    states = {(s.name, s.version): s.state for s in registry.index()}
    assert states[("simple", "1")] == ModelState.UNAVAILABLE
    assert states[("mlp", "")] == ModelState.UNAVAILABLE  # never loaded
    assert registry.all_ready()  # nothing that should serve is missing
    with pytest.raises(NotFound):
        await registry.unload("mlp")
    await registry.close()


def write_rank1_identity(model_dir: Path, config: str) -> None:
    """An ONNX model whose tensors are [batch] only: clients see [batch, 1] through reshape."""
    import onnx
    from onnx import TensorProto, helper

    (model_dir / "1").mkdir(parents=True)
    graph = helper.make_graph(
        [helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
        "rank1",
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch"])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch"])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, model_dir / "1" / "model.onnx")
    (model_dir / "config.pbtxt").write_text(config)


async def test_reshape_gives_clients_the_configured_dims(tmp_path: Path) -> None:
    write_rank1_identity(
        tmp_path / "rank1",
        """max_batch_size: 8
        input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [1] reshape: { shape: [] } }]
        output [{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [1] reshape: { shape: [] } }]
        dynamic_batching { max_queue_delay_microseconds: 1000 }""",
    )
    registry = registry_for(tmp_path)
    await registry.load("rank1")
    dataplane = DataPlane(registry)
    values = [np.array([[float(i)], [float(i) + 0.5]], dtype=np.float32) for i in range(6)]

    def request(i: int, value: np.ndarray) -> bytes:
        message = pb.ModelInferRequest(model_name="rank1", id=str(i))
        message.inputs.add(name="INPUT0", datatype="FP32", shape=[2, 1])
        message.raw_input_contents.append(value.tobytes())
        return message.SerializeToString()

    answers = await asyncio.gather(
        *(dataplane.infer(dataplane.parse(request(i, v))) for i, v in enumerate(values))
    )
    for i, (value, answer) in enumerate(zip(values, answers, strict=True)):
        response = pb.ModelInferResponse.FromString(answer)
        (output,) = response.outputs
        assert response.id == str(i)
        assert list(output.shape) == [2, 1]  # the API's dims, not the model's [2]
        np.testing.assert_array_equal(
            np.frombuffer(response.raw_output_contents[0], dtype=np.float32).reshape(2, 1), value
        )
    await registry.close()


def test_reshape_must_keep_the_element_count(tmp_path: Path) -> None:
    write_rank1_identity(
        tmp_path / "bad",
        """max_batch_size: 8
        input [{ name: "INPUT0" data_type: TYPE_FP32 dims: [2] reshape: { shape: [] } }]""",
    )
    with pytest.raises(ModelLoadError, match="different numbers of elements"):
        load_model_config(
            "bad",
            tmp_path / "bad" / "config.pbtxt",
            tmp_path / "bad" / "1" / "model.onnx",
            default_max_batch_size=4,
        )
