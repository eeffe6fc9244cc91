"""A decoupled python model's responses as they cross the worker's ring: each one ring message,
its tensors in the worker's outputs arena, reused from its start once the server took every
response, grown for one bigger than the arena. Responses larger than the arena, many more bytes
than it holds in all, error responses between them, two requests sending from threads at once,
and a final response with outputs: every byte checked at a real tritonclient stream."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.integration.conftest import ServerProcess, running_server

# SIZES (INT32 [n]): one response per size, OUT = `size` bytes of (seed + i) % 251, sent by a thread
# of the model's; a size of -1 sends an error response instead. The final response carries
# OUT = [seed] itself.
SIZES = """
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


def pattern(seed, size):
    return ((np.arange(size, dtype=np.int64) + seed) % 251).astype(np.uint8)


class TritonPythonModel:
    def _send(self, request):
        sender = request.get_response_sender()
        sizes = pb_utils.get_input_tensor_by_name(request, "SIZES").as_numpy()
        seed = int(pb_utils.get_input_tensor_by_name(request, "SEED").as_numpy()[0])
        for k, size in enumerate(sizes):
            if size < 0:
                error = pb_utils.TritonError(f"step {k} failed")
                sender.send(pb_utils.InferenceResponse(error=error))
                continue
            out = pb_utils.Tensor("OUT", pattern(seed + k, int(size)))
            sender.send(pb_utils.InferenceResponse(output_tensors=[out]))
        last = pb_utils.Tensor("OUT", np.array([seed % 251], np.uint8))
        sender.send(
            pb_utils.InferenceResponse(output_tensors=[last]),
            flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL,
        )

    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self._send, args=(request,), daemon=True).start()
        return None
"""

CONFIG = """name: "sizes"
backend: "python"
max_batch_size: 0
input [ { name: "SIZES" data_type: TYPE_INT32 dims: [ -1 ] },
        { name: "SEED" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_UINT8 dims: [ -1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
model_transaction_policy { decoupled: true }
"""

MIB = 1 << 20  # the outputs arena's first size (worker_ring.cpp)


def pattern(seed: int, size: int) -> np.ndarray:
    return ((np.arange(size, dtype=np.int64) + seed) % 251).astype(np.uint8)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("python-streamed")
    model = root / "models" / "sizes"
    (model / "1").mkdir(parents=True)
    (model / "1" / "model.py").write_text(SIZES)
    (model / "config.pbtxt").write_text(CONFIG)
    with running_server(Path(root / "models"), ["sizes"], root) as running:
        yield running


def stream_sizes(server: ServerProcess, sizes: list[int], seed: int) -> list[Any]:
    """The answers of one request on a stream of its own, to the final one: each an array, or
    the error's message."""
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    client = grpcclient.InferenceServerClient(server.url)
    try:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        inputs = [grpcclient.InferInput("SIZES", [len(sizes)], "INT32")]
        inputs[0].set_data_from_numpy(np.array(sizes, np.int32))
        inputs.append(grpcclient.InferInput("SEED", [1], "INT32"))
        inputs[1].set_data_from_numpy(np.array([seed], np.int32))
        client.async_stream_infer("sizes", inputs, enable_empty_final_response=True)
        got: list[Any] = []
        while True:
            result, error = answers.get(timeout=60)
            if error is not None:
                got.append(str(error.message()))
                continue
            got.append(result.as_numpy("OUT"))
            if result.get_response().parameters["triton_final_response"].bool_param:
                return got
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()


def check(got: list[Any], sizes: list[int], seed: int) -> None:
    assert len(got) == len(sizes) + 1
    for k, size in enumerate(sizes):
        if size < 0:
            assert got[k] == f"step {k} failed"
        else:
            assert isinstance(got[k], np.ndarray), got[k]
            np.testing.assert_array_equal(got[k], pattern(seed + k, size))
    np.testing.assert_array_equal(got[-1], np.array([seed % 251], np.uint8))


def test_responses_past_the_arena_and_bigger_than_it_arrive_whole(server: ServerProcess) -> None:
    # 12 of 200 KB: the arena is full twice over and written from its start again; then 3 MB,
    # which grows it; error responses in between go on to the next response.
    sizes = [1000] * 5 + [200_000] * 12 + [-1] + [3 * MIB] + [-1, 10, 0, 7]
    check(stream_sizes(server, sizes, seed=3), sizes, seed=3)


def test_two_requests_streaming_from_threads_at_once_each_get_their_own_bytes(
    server: ServerProcess,
) -> None:
    sizes = [50_000, 300, 120_000] * 12
    results: dict[int, list[Any]] = {}

    def run(seed: int) -> None:
        results[seed] = stream_sizes(server, sizes, seed)

    threads = [threading.Thread(target=run, args=(seed,)) for seed in (11, 97)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    for seed in (11, 97):
        check(results[seed], sizes, seed)
