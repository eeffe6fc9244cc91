"""The native ONNX Runtime executor (ONNX Runtime's C API inside the core): the same answers as the
Python executor, for the example models and every datatype, through the core's scheduler; clear
load errors; batches computed while Python holds the GIL."""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from structlog.testing import capture_logs

from inferd.core import (
    BatcherOptions,
    CompletionDispatcher,
    CoreTensor,
    CoreTiming,
    HostBufferPool,
    ModelScheduler,
    core_signature,
)
from inferd.core.onnxruntime import load_onnxruntime
from inferd.datatypes import DATATYPES, Datatype, serialize_bytes
from inferd.errors import Internal, InvalidArgument, ModelLoadError
from inferd.examples import IR_VERSION, OPSET, make_examples
from inferd.executors import OnnxRuntimeExecutor, OnnxRuntimeOptions, onnxruntime_native, selection
from inferd.executors.onnxruntime_native import (
    NativeOnnxRuntimeExecutor,
    native_onnxruntime,
    onnxruntime_library,
)
from inferd.repository.instances import InstancePlacement

OPTIONS = OnnxRuntimeOptions(intra_op_thread_count=1, inter_op_thread_count=1)
POOL = HostBufferPool(1 << 26)
FP32 = DATATYPES["FP32"]

pytestmark = pytest.mark.skipif(
    native_onnxruntime().version is None, reason="ONNX Runtime's library cannot be loaded"
)


def write_model(
    path: Path,
    nodes: list[onnx.NodeProto],
    inputs: list[onnx.ValueInfoProto],
    outputs: list[onnx.ValueInfoProto],
    initializers: list[onnx.TensorProto] | None = None,
) -> Path:
    graph = helper.make_graph(nodes, path.stem, inputs, outputs, initializer=initializers or [])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model, full_check=True)
    path.write_bytes(model.SerializeToString())
    return path


def values(datatype: Datatype, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    """Random data of a datatype, as the core takes it (BYTES: object array of bytes)."""
    if datatype.is_bytes:
        flat = [f"s{i}-{rng.integers(1000)}".encode() for i in range(int(np.prod(shape)))]
        return np.array(flat, dtype=object).reshape(shape)
    if datatype.name == "BOOL":
        return rng.integers(0, 2, size=shape).astype(bool)
    if datatype.name in ("FP16", "FP32", "FP64"):
        return rng.standard_normal(shape).astype(datatype.numpy)
    if datatype.name == "BF16":  # the raw bits of float32 values, upper half
        return (rng.standard_normal(shape).astype(np.float32).view(np.uint32) >> 16).astype(
            np.uint16
        )
    info = np.iinfo(datatype.numpy)  # type: ignore[type-var]  # an integer type here
    return rng.integers(info.min, info.max, size=shape, dtype=datatype.numpy, endpoint=True)


def core_tensor(datatype: Datatype, array: np.ndarray) -> CoreTensor:
    if datatype.is_bytes:
        return datatype.config_type, array.shape, serialize_bytes(list(array.reshape(-1)))
    return datatype.config_type, array.shape, np.ascontiguousarray(array)


def make_scheduler(
    dispatcher: CompletionDispatcher, executors: list[Any], output_types: list[int], **policy: Any
) -> ModelScheduler:
    signature = core_signature("m", "1", 0, [], [])
    return ModelScheduler(
        dispatcher, POOL, signature, BatcherOptions(**policy), executors, output_types
    )


async def run_through_core(
    executor: Any, requests: list[list[CoreTensor]], output_types: list[int]
) -> list[Any]:
    """Every request's outputs (datatype, shape, array) as the core answers them, batched. The
    scheduler closes the executor."""
    dispatcher = CompletionDispatcher(asyncio.get_running_loop())
    scheduler = make_scheduler(
        dispatcher,
        [executor],
        output_types,
        dynamic=True,
        max_batch_size=64,
        max_queue_delay_us=2000,
    )
    try:
        results = await asyncio.gather(
            *(scheduler.infer(inputs, int(inputs[0][1][0])) for inputs in requests)
        )
    finally:
        await scheduler.close()
        dispatcher.close()
    return [
        [(code, shape, np.asarray(array)) for code, shape, array in outputs]
        for outputs, _ in results
    ]


def assert_same_answers(native: list[Any], python: list[Any], *, exact: bool = True) -> None:
    for ours, theirs in zip(native, python, strict=True):
        for (code, shape, array), (want_code, want_shape, want) in zip(ours, theirs, strict=True):
            assert (code, shape, array.dtype) == (want_code, want_shape, want.dtype)
            if exact or array.dtype.kind != "f":
                np.testing.assert_array_equal(array, want)
            else:  # a batch's rows may round differently with another batch composition
                np.testing.assert_allclose(array, want, rtol=1e-5, atol=1e-6)


@pytest.fixture(scope="module")
def examples(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("examples")
    make_examples(root)
    return root


EXAMPLES = {
    # model: (inputs (name, datatype, dims without batch), outputs (name, datatype))
    "simple": (
        [("INPUT0", "INT32", (16,)), ("INPUT1", "INT32", (16,))],
        [("OUTPUT0", "INT32"), ("OUTPUT1", "INT32")],
    ),
    "identity_fp32": ([("INPUT0", "FP32", (7,))], [("OUTPUT0", "FP32")]),
    "mlp": ([("INPUT0", "FP32", (512,))], [("OUTPUT0", "FP32")]),
    "identity_bytes": ([("INPUT0", "BYTES", (3,))], [("OUTPUT0", "BYTES")]),
}


@pytest.mark.parametrize("model", sorted(EXAMPLES))
async def test_example_models_answer_as_the_python_executor(examples: Path, model: str) -> None:
    inputs, outputs = EXAMPLES[model]
    path = examples / model / "1" / "model.onnx"
    input_names = [name for name, _, _ in inputs]
    output_names = [name for name, _ in outputs]
    output_types = [DATATYPES[t].config_type for _, t in outputs]
    rng = np.random.default_rng(0)

    def request(rows: int) -> list[CoreTensor]:
        return [
            core_tensor(DATATYPES[t], values(DATATYPES[t], (rows, *dims), rng))
            for _, t, dims in inputs
        ]

    def native() -> NativeOnnxRuntimeExecutor:
        return NativeOnnxRuntimeExecutor(path, input_names, output_names, OPTIONS, output_types)

    def python() -> OnnxRuntimeExecutor:
        return OnnxRuntimeExecutor(path, input_names, output_names, OPTIONS)

    requests = [request(int(rng.integers(1, 4))) for _ in range(24)]
    assert_same_answers(
        await run_through_core(native(), requests, output_types),
        await run_through_core(python(), requests, output_types),
        exact=model != "mlp",
    )
    # And directly, as warm-up calls it.
    direct: list[np.ndarray | None] = [
        values(DATATYPES[t], (2, *dims), rng) for _, t, dims in inputs
    ]
    ours_executor, their_executor = native(), python()
    answers = zip(ours_executor.execute(direct), their_executor.execute(direct), strict=True)
    for ours, theirs in answers:
        assert ours.shape == theirs.shape
        if ours.dtype == object:  # ONNX Runtime's Python API returns str, the core bytes
            assert list(ours.reshape(-1)) == [s.encode() for s in theirs.reshape(-1)]
        else:
            assert ours.dtype == theirs.dtype
            np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)
    ours_executor.close()
    their_executor.close()


async def test_requests_queued_behind_a_batch_ride_together(examples: Path) -> None:
    """While the worker computes a full batch, small requests queue; they share the next batch
    and each gets its own rows back."""
    path = examples / "mlp" / "1" / "model.onnx"
    types = [FP32.config_type]
    native = NativeOnnxRuntimeExecutor(path, ["INPUT0"], ["OUTPUT0"], OPTIONS, types)
    dispatcher = CompletionDispatcher(asyncio.get_running_loop())
    scheduler = make_scheduler(
        dispatcher, [native], types, dynamic=True, max_batch_size=64, max_queue_delay_us=2000
    )
    rng = np.random.default_rng(3)
    full = values(FP32, (64, 512), rng)
    small = [values(FP32, (int(rng.integers(1, 4)), 512), rng) for _ in range(8)]
    results = await asyncio.gather(
        scheduler.infer([core_tensor(FP32, full)], 64),
        *(scheduler.infer([core_tensor(FP32, a)], a.shape[0]) for a in small),
    )
    assert scheduler.statistics().execution_count < len(results)
    await scheduler.close()
    dispatcher.close()
    python = OnnxRuntimeExecutor(path, ["INPUT0"], ["OUTPUT0"], OPTIONS)
    for array, (outputs, _) in zip([full, *small], results, strict=True):
        [(code, shape, answer)] = outputs
        assert (code, shape) == (FP32.config_type, (array.shape[0], 10))
        np.testing.assert_allclose(answer, python.execute([array])[0], rtol=1e-5, atol=1e-6)
    python.close()


def identity_model(tmp_path: Path, datatype: Datatype) -> Path:
    shape: list[int | str] = ["batch", 3]
    return write_model(
        tmp_path / f"identity_{datatype.name}.onnx",
        [helper.make_node("Identity", ["X"], ["Y"])],
        [helper.make_tensor_value_info("X", datatype.onnx_type, shape)],
        [helper.make_tensor_value_info("Y", datatype.onnx_type, shape)],
    )


@pytest.mark.parametrize("name", sorted(DATATYPES))
async def test_every_datatype_answers_as_the_python_executor(tmp_path: Path, name: str) -> None:
    datatype = DATATYPES[name]
    path = identity_model(tmp_path, datatype)
    rng = np.random.default_rng(1)
    requests = [
        [core_tensor(datatype, values(datatype, (int(rng.integers(1, 4)), 3), rng))]
        for _ in range(16)
    ]
    types = [datatype.config_type]
    native = NativeOnnxRuntimeExecutor(path, ["X"], ["Y"], OPTIONS, types)
    python = OnnxRuntimeExecutor(path, ["X"], ["Y"], OPTIONS)
    answers = await run_through_core(native, requests, types)
    assert_same_answers(answers, await run_through_core(python, requests, types))
    for request, outputs in zip(requests, answers, strict=True):  # and the identity holds
        sent = request[0][2]
        assert bytes(outputs[0][2]) == (sent if isinstance(sent, bytes) else sent.tobytes())


async def test_bytes_need_not_be_utf8(tmp_path: Path) -> None:
    """ONNX Runtime's C API takes any bytes as a string (the Python executor refuses these)."""
    datatype = DATATYPES["BYTES"]
    path = identity_model(tmp_path, datatype)
    native = NativeOnnxRuntimeExecutor(path, ["X"], ["Y"], OPTIONS, [datatype.config_type])
    elements = [b"\xff\xfe", b"a\x00b", b""]
    [direct] = native.execute([np.array([elements], dtype=object)])
    assert list(direct.reshape(-1)) == elements
    serialized = serialize_bytes(elements)
    answers = await run_through_core(
        native, [[(datatype.config_type, (1, 3), serialized)]] * 2, [datatype.config_type]
    )
    assert all(bytes(answer[0][2]) == serialized for answer in answers)
    python = OnnxRuntimeExecutor(path, ["X"], ["Y"], OPTIONS)
    with pytest.raises(InvalidArgument, match="UTF-8"):
        python.execute([np.array([elements], dtype=object)])


def test_an_optional_input_left_out_takes_the_initializer(tmp_path: Path) -> None:
    path = write_model(
        tmp_path / "optional.onnx",
        [helper.make_node("Add", ["X", "BIAS"], ["Y"])],
        [
            helper.make_tensor_value_info("X", TensorProto.FLOAT, ["batch", 2]),
            helper.make_tensor_value_info("BIAS", TensorProto.FLOAT, [2]),
        ],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, ["batch", 2])],
        [numpy_helper.from_array(np.array([10, 20], dtype=np.float32), "BIAS")],
    )
    native = NativeOnnxRuntimeExecutor(path, ["X", "BIAS"], ["Y"], OPTIONS, [FP32.config_type])
    python = OnnxRuntimeExecutor(path, ["X", "BIAS"], ["Y"], OPTIONS)
    x = np.ones((2, 2), dtype=np.float32)
    for bias in (None, np.array([1, 2], dtype=np.float32)):
        [ours], [theirs] = native.execute([x, bias]), python.execute([x, bias])
        np.testing.assert_array_equal(ours, theirs)
    np.testing.assert_array_equal(native.execute([x, None])[0], [[11, 21], [11, 21]])


def test_a_model_that_cannot_load_says_why(tmp_path: Path) -> None:
    garbage = tmp_path / "garbage.onnx"
    garbage.write_bytes(b"not a model")
    with pytest.raises(ModelLoadError, match=f"{garbage}: ONNX Runtime cannot load it: .+"):
        NativeOnnxRuntimeExecutor(garbage, ["X"], ["Y"], OPTIONS, [FP32.config_type])
    path = identity_model(tmp_path, FP32)
    with pytest.raises(ModelLoadError, match=r"no input 'Z' \(its inputs: X\)"):
        NativeOnnxRuntimeExecutor(path, ["Z"], ["Y"], OPTIONS, [FP32.config_type])
    with pytest.raises(ModelLoadError, match="output 'Y' is FP32, declared INT64"):
        NativeOnnxRuntimeExecutor(path, ["X"], ["Y"], OPTIONS, [DATATYPES["INT64"].config_type])


async def test_a_failed_batch_is_internal(tmp_path: Path) -> None:
    """The core checks requests before they batch: what ORT refuses is the executor's failure."""
    path = identity_model(tmp_path, FP32)
    native = NativeOnnxRuntimeExecutor(path, ["X"], ["Y"], OPTIONS, [FP32.config_type])
    wrong = np.ones((1, 4), dtype=np.float32)  # the model takes 3 columns
    with pytest.raises(Internal, match="ONNX Runtime"):
        native.execute([wrong])
    with pytest.raises(Internal, match="ONNX Runtime"):
        await run_through_core(native, [[core_tensor(FP32, wrong)]] * 2, [FP32.config_type])


def test_the_library_loads_once(tmp_path: Path) -> None:
    library = str(onnxruntime_library())
    assert load_onnxruntime(library) == native_onnxruntime().version
    with pytest.raises(ValueError, match="already loaded"):
        load_onnxruntime("/nonexistent/libonnxruntime.so.1")


@pytest.fixture
def forget_the_library() -> Iterator[None]:
    native_onnxruntime.cache_clear()
    yield
    native_onnxruntime.cache_clear()


def test_cpu_instances_run_native_and_fall_back_when_the_library_is_missing(
    examples: Path, monkeypatch: pytest.MonkeyPatch, forget_the_library: None
) -> None:
    from inferd.repository import load_model_config

    model_dir = examples / "simple"
    config = load_model_config(
        "simple",
        model_dir / "config.pbtxt",
        model_dir / "1" / "model.onnx",
        default_max_batch_size=4,
    )

    def create() -> list[Any]:
        return selection.create_executors(
            config,
            model_dir / "1" / "model.onnx",
            [InstancePlacement("cpu")],
            None,
            OPTIONS,
            POOL,
            examples / "engines",
        )

    [native] = create()
    assert isinstance(native, NativeOnnxRuntimeExecutor)
    native.close()

    def missing() -> Path:
        raise FileNotFoundError("no libonnxruntime.so* here")

    native_onnxruntime.cache_clear()
    monkeypatch.setattr(onnxruntime_native, "onnxruntime_library", missing)
    with capture_logs() as logs:
        executors = create() + create()
    assert all(isinstance(e, OnnxRuntimeExecutor) for e in executors)
    warnings = [log for log in logs if log["log_level"] == "warning"]
    assert len(warnings) == 1 and "no libonnxruntime.so* here" in warnings[0]["reason"]
    for executor in executors:
        executor.close()


async def test_batches_compute_while_python_holds_the_gil(examples: Path) -> None:
    """A thread that holds the GIL (a long switch interval keeps it) does not stop the native
    executor's batch; it does stop the Python executor's, whose worker needs the GIL."""
    path = examples / "mlp" / "1" / "model.onnx"
    types = [FP32.config_type]
    native = NativeOnnxRuntimeExecutor(path, ["INPUT0"], ["OUTPUT0"], OPTIONS, types)
    python = OnnxRuntimeExecutor(path, ["INPUT0"], ["OUTPUT0"], OPTIONS)
    batch = np.random.default_rng(2).standard_normal((64, 512)).astype(np.float32)

    async def computed_while_held(executor: Any) -> bool:
        """Whether the batch's computation ended while this thread held the GIL."""
        dispatcher = CompletionDispatcher(asyncio.get_running_loop())
        scheduler = make_scheduler(dispatcher, [executor], types, max_batch_size=64)
        await scheduler.infer([core_tensor(FP32, batch)], 64)  # ORT's first run, outside
        interval = sys.getswitchinterval()
        sys.setswitchinterval(10.0)
        try:
            request = asyncio.ensure_future(scheduler.infer([core_tensor(FP32, batch)], 64))
            await asyncio.sleep(0)  # the request is submitted
            held_from = CoreTiming.now_ns()
            spin_until = time.monotonic() + 0.5
            while time.monotonic() < spin_until:  # pure Python: the GIL stays with this thread
                pass
            held_until = CoreTiming.now_ns()
        finally:
            sys.setswitchinterval(interval)
        _, timing = await request
        await scheduler.close()
        dispatcher.close()
        assert timing.compute_start < timing.infer_done
        return held_from < timing.infer_done <= held_until

    assert await computed_while_held(native)
    assert not await computed_while_held(python)
