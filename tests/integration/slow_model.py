"""Models whose work scales with their input, so that requests queue behind them: the tests that
need batches to form, or a queue to build up, use them. ``write_slow_model``'s work scales with
the rows; ``write_long_row_model``'s with the rows times their length, so that one long request
keeps an instance busy while short ones compute in no time (``occupy``)."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import tritonclient.grpc as grpcclient
from onnx import TensorProto, helper

from tests.integration.conftest import ServerProcess

SLOW_SIZE = 1024  # per row: SLOW_PRODUCTS products of SLOW_SIZE^2 matrices, ~2 GFLOP each
SLOW_PRODUCTS = 4


# One instance on one thread, one request per execution: each request computes alone while
# later ones wait in the queue.
SINGLE_REQUEST_CONFIG = """
max_batch_size: 1
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
parameters { key: "intra_op_thread_count" value: { string_value: "1" } }
dynamic_batching { }
"""


def _write_products_model(
    model_dir: Path,
    config: str,
    name: str,
    size: int,
    length: str | int,
    first: list[onnx.NodeProto],
    initializers: list[onnx.TensorProto],
) -> None:
    """INPUT0 FP32 [batch, length] -> OUTPUT0 = INPUT0, after SLOW_PRODUCTS products
    p(k+1) = p(k) @ a / N of size x size matrices a built from each row's mean (x3, [batch, 1, 1]);
    `first` makes p0 from x3 and `initializers` are its own."""
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    nodes = [
        helper.make_node("ReduceMean", ["INPUT0"], ["row_mean"], axes=[1], keepdims=1),
        helper.make_node("Reshape", ["row_mean", "shape3"], ["x3"]),  # [batch, 1, 1]
        helper.make_node("Expand", ["x3", "square"], ["a"]),  # [batch, N, N]
        *first,
        *(
            node
            for k in range(SLOW_PRODUCTS)  # bounded values
            for node in (
                helper.make_node("MatMul", [f"p{k}", "a"], [f"q{k}"]),
                helper.make_node("Mul", [f"q{k}", "inverse_n"], [f"p{k + 1}"]),
            )
        ),
        helper.make_node(
            "ReduceMean", [f"p{SLOW_PRODUCTS}"], ["m"], axes=[1, 2], keepdims=0
        ),  # [batch]
        helper.make_node("Unsqueeze", ["m", "axis1"], ["m2"]),  # [batch, 1]
        helper.make_node("Mul", ["m2", "zero"], ["z"]),
        helper.make_node("Add", ["INPUT0", "z"], ["OUTPUT0"]),
    ]
    shared = [
        helper.make_tensor("shape3", TensorProto.INT64, [3], [-1, 1, 1]),
        helper.make_tensor("square", TensorProto.INT64, [3], [1, size, size]),
        helper.make_tensor("axis1", TensorProto.INT64, [1], [1]),
        helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0]),
        helper.make_tensor("inverse_n", TensorProto.FLOAT, [], [1.0 / size]),
    ]
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info("INPUT0", TensorProto.FLOAT, ["batch", length])],
        [helper.make_tensor_value_info("OUTPUT0", TensorProto.FLOAT, ["batch", length])],
        shared + initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, model_dir / "1" / "model.onnx")
    (model_dir / "config.pbtxt").write_text(config)


def write_slow_model(
    model_dir: Path, config: str, size: int = SLOW_SIZE, length: str | int = 1
) -> None:
    """INPUT0 FP32 [batch, length] -> OUTPUT0 = INPUT0, after work that scales with the rows
    (SLOW_PRODUCTS products of size x size matrices built from each row's mean)."""
    first = [helper.make_node("Identity", ["a"], ["p0"])]
    _write_products_model(model_dir, config, "slow", size, length, first, [])


# The length of a busy request's row for a long-row model: 0.5-1 s of compute at size 1024 on one
# thread here (0.1 s at 512). A queue that holds behind it for that long is seen by a metrics poll
# under AddressSanitizer on a loaded machine too.
BUSY_LENGTH = 4096


def write_long_row_model(model_dir: Path, config: str, size: int = 1024) -> None:
    """INPUT0 FP32 [batch, length] -> OUTPUT0 = INPUT0, after work that scales with rows x
    length: each row, repeated to [length, size], is multiplied SLOW_PRODUCTS times by a
    size x size matrix built from its mean. A row of length 1 costs about a thousandth of one of
    length 1024."""
    first = [
        helper.make_node("Shape", ["INPUT0"], ["input_shape"]),
        helper.make_node("Gather", ["input_shape", "axis1"], ["length"]),  # [1]
        helper.make_node("Concat", ["one", "length", "width"], ["long_shape"], axis=0),
        helper.make_node("Expand", ["x3", "long_shape"], ["p0"]),  # [batch, length, N]
    ]
    initializers = [
        helper.make_tensor("one", TensorProto.INT64, [1], [1]),
        helper.make_tensor("width", TensorProto.INT64, [1], [size]),
    ]
    _write_products_model(model_dir, config, "long_row", size, "length", first, initializers)


def occupy(
    client: grpcclient.InferenceServerClient,
    server: ServerProcess,
    model: str,
    callback: Callable[[str], Callable[[Any, Any], None]],
    rows: int = 1,
    length: int = BUSY_LENGTH,
) -> None:
    """Keeps a long-row model's only instance busy: sends two busy requests ("busy0", "busy1";
    ``rows`` rows each, the model's max_batch_size, so that they cannot share a batch) and returns
    once one is seen queued. One computes while the other waits for the whole computation,
    whichever a loaded machine delivered first, so a request sent next queues behind it. The
    channel connects first: two calls on a connecting channel reach the server in any order."""
    assert client.is_server_live()
    busy = np.full((rows, length), -1.0, np.float32)
    for tag in ("busy0", "busy1"):
        client.async_infer(model, fp32_input(busy), callback(tag))
    server.wait_for_pending(model, 1)


def fill_queue_of_one(
    client: grpcclient.InferenceServerClient,
    server: ServerProcess,
    model: str,
    callback: Callable[[str], Callable[[Any, Any], None]],
    timeout_s: float = 30.0,
) -> None:
    """``occupy`` for a long-row model whose queue holds one request. Of two busy requests sent
    together, the second can arrive while the first still waits for the instance, and is refused
    (RESOURCE_EXHAUSTED); a refused one is sent again until one computes and the other is queued,
    the queue seen full on consecutive polls 50 ms apart (the instance takes the head of its queue
    at once). The refusals on the way count as REJECTED failures; ``callback`` gets each busy
    request's final answer."""
    assert client.is_server_live()
    busy = fp32_input(np.full((1, BUSY_LENGTH), -1.0, np.float32))
    refused: queue.Queue[str] = queue.Queue()
    settled = threading.Event()

    def send(tag: str) -> None:
        def done(result: Any, error: Any) -> None:
            exhausted = error is not None and error.status() == "StatusCode.RESOURCE_EXHAUSTED"
            if exhausted and not settled.is_set():
                refused.put(tag)
            else:
                callback(tag)(result, error)

        client.async_infer(model, busy, done)

    for tag in ("busy0", "busy1"):
        send(tag)
    deadline = time.monotonic() + timeout_s
    full_since: float | None = None
    while full_since is None or time.monotonic() - full_since < 0.05:
        assert time.monotonic() < deadline, f"{model}: its queue of one never held a request"
        try:
            send(refused.get(timeout=0.01))
            full_since = None
            continue
        except queue.Empty:
            pass
        if server.pending(model) != 1:
            full_since = None
        elif full_since is None:
            full_since = time.monotonic()
    # Both busy requests are in: one computes, the other is the queue's one.
    settled.set()


def fp32_input(values: np.ndarray) -> list[grpcclient.InferInput]:
    """The slow model's INPUT0."""
    tensor = grpcclient.InferInput("INPUT0", list(values.shape), "FP32")
    tensor.set_data_from_numpy(values)
    return [tensor]
