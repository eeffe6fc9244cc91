"""Implicit state (sequence_batching.state) of ONNX models through a real server and
tritonclient's sequence API: the core keeps each sequence's state between its requests and feeds
it into the batch the next one joins. An accumulator (a fixed-size state, zero to start) under
``direct`` and ``oldest``, on ``infer`` and ``async_stream_infer``; a history that grows every
step (dims -1), starts from an initial_state data_file and whose state the client may ask for;
and the bound on every sequence's state bytes (--max-sequence-state-bytes), on a server of its
own."""

from __future__ import annotations

import queue
import time
import urllib.request
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from inferd.examples import IR_VERSION, OPSET
from tests.integration.conftest import ServerProcess, running_server
from tests.integration.test_sequences import interleaved_sums


def save_model(repository: Path, name: str, graph: onnx.GraphProto, config: str) -> None:
    (repository / name / "1").mkdir(parents=True)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    onnx.save(model, repository / name / "1" / "model.onnx")
    (repository / name / "config.pbtxt").write_text(config)


def write_accumulator(repository: Path, name: str, strategy: str) -> None:
    """OUTPUT = INPUT + STATE_IN; STATE_OUT = OUTPUT: each sequence's running sum, kept by the
    core (the model keeps nothing)."""
    rows = ["batch", 1]
    graph = helper.make_graph(
        [
            helper.make_node("Add", ["INPUT", "STATE_IN"], ["OUTPUT"]),
            helper.make_node("Identity", ["OUTPUT"], ["STATE_OUT"]),
        ],
        name,
        [
            helper.make_tensor_value_info("INPUT", TensorProto.INT32, rows),
            helper.make_tensor_value_info("STATE_IN", TensorProto.INT32, rows),
        ],
        [
            helper.make_tensor_value_info("OUTPUT", TensorProto.INT32, rows),
            helper.make_tensor_value_info("STATE_OUT", TensorProto.INT32, rows),
        ],
    )
    save_model(
        repository,
        name,
        graph,
        f'name: "{name}"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        f"sequence_batching {{\n{strategy}\n"
        '  state [ { input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_INT32\n'
        "            dims: [ 1 ]\n"
        "            initial_state { data_type: TYPE_INT32 dims: [ 1 ] zero_data: true"
        ' name: "zero" } } ]\n}\n',
    )


def write_history(repository: Path) -> None:
    """HISTORY_OUT = HISTORY_IN then INPUT (one longer each step); OUTPUT = its sum. The history
    starts as [100] (initial_state/start), and the config lists HISTORY_OUT, so a client may ask
    for it."""
    history = ["batch", "length"]
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [1])
    graph = helper.make_graph(
        [
            helper.make_node("Concat", ["HISTORY_IN", "INPUT"], ["HISTORY_OUT"], axis=1),
            helper.make_node("ReduceSum", ["HISTORY_OUT", "axes"], ["OUTPUT"], keepdims=1),
        ],
        "history",
        [
            helper.make_tensor_value_info("INPUT", TensorProto.INT32, ["batch", 1]),
            helper.make_tensor_value_info("HISTORY_IN", TensorProto.INT32, history),
        ],
        [
            helper.make_tensor_value_info("OUTPUT", TensorProto.INT32, ["batch", 1]),
            helper.make_tensor_value_info("HISTORY_OUT", TensorProto.INT32, ["batch", "grown"]),
        ],
        initializer=[axes],
    )
    save_model(
        repository,
        "history",
        graph,
        'name: "history"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] },\n'
        '         { name: "HISTORY_OUT" data_type: TYPE_INT32 dims: [ -1 ] } ]\n'
        "sequence_batching {\n"
        "  oldest { max_candidate_sequences: 8 }\n"
        '  state [ { input_name: "HISTORY_IN" output_name: "HISTORY_OUT" data_type: TYPE_INT32\n'
        "            dims: [ -1 ]\n"
        '            initial_state { data_type: TYPE_INT32 dims: [ 1 ] data_file: "start"'
        ' name: "start" } } ]\n}\n',
    )
    (repository / "history" / "initial_state").mkdir()
    (repository / "history" / "initial_state" / "start").write_bytes(
        np.array([100], np.int32).tobytes()
    )


# Every step of a doubling sequence grows its state; its sequences end by idling out.
DOUBLING_IDLE_US = 2_000_000


def write_doubling(repository: Path) -> None:
    """STATE_OUT = STATE_IN twice over (FP32, 1024 elements to start: 4 KiB, then 8, 16, 32 KiB);
    OUTPUT = INPUT + the state's sum (zeros)."""
    axes = helper.make_tensor("axes", TensorProto.INT64, [1], [1])
    graph = helper.make_graph(
        [
            helper.make_node("Concat", ["STATE_IN", "STATE_IN"], ["STATE_OUT"], axis=1),
            helper.make_node("ReduceSum", ["STATE_OUT", "axes"], ["total"], keepdims=1),
            helper.make_node("Add", ["INPUT", "total"], ["OUTPUT"]),
        ],
        "doubling",
        [
            helper.make_tensor_value_info("INPUT", TensorProto.FLOAT, ["batch", 1]),
            helper.make_tensor_value_info("STATE_IN", TensorProto.FLOAT, ["batch", "n"]),
        ],
        [
            helper.make_tensor_value_info("OUTPUT", TensorProto.FLOAT, ["batch", 1]),
            helper.make_tensor_value_info("STATE_OUT", TensorProto.FLOAT, ["batch", "twice"]),
        ],
        initializer=[axes],
    )
    save_model(
        repository,
        "doubling",
        graph,
        'name: "doubling"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUTPUT" data_type: TYPE_FP32 dims: [ 1 ] } ]\n'
        "sequence_batching {\n"
        f"  max_sequence_idle_microseconds: {DOUBLING_IDLE_US}\n"
        '  state [ { input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_FP32\n'
        "            dims: [ -1 ]\n"
        "            initial_state { data_type: TYPE_FP32 dims: [ 1024 ] zero_data: true"
        ' name: "zero" } } ]\n}\n',
    )


MODELS = ["accumulate_direct", "accumulate_oldest", "history"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("implicit_state")
    repository = root / "models"
    write_accumulator(repository, "accumulate_direct", "  direct { }")
    write_accumulator(
        repository,
        "accumulate_oldest",
        "  oldest { max_candidate_sequences: 16 max_queue_delay_microseconds: 3000 }",
    )
    write_history(repository)
    with running_server(repository, MODELS, root) as running:
        yield running


def int_input(value: int, datatype: str = "INT32") -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("INPUT", [1, 1], datatype)
    dtype = np.int32 if datatype == "INT32" else np.float32
    tensor.set_data_from_numpy(np.array([[value]], dtype))
    return [tensor]


@pytest.mark.parametrize("model", ["accumulate_direct", "accumulate_oldest"])
def test_sixteen_clients_interleaving_sequences_each_get_their_own_sums(
    server: ServerProcess, model: str
) -> None:
    failures = interleaved_sums(server.url, model)  # the same load as test_sequences.py's
    assert not failures, failures[:5]


def test_oldest_batches_the_states_of_several_sequences(server: ServerProcess) -> None:
    # The 16-client test ran first on this module's server: its statistics show batches above 1.
    with grpcclient.InferenceServerClient(server.url) as client:
        stats = client.get_inference_statistics("accumulate_oldest", as_json=True)
    sizes = {int(b["batch_size"]) for b in stats["model_stats"][0].get("batch_stats", [])}
    assert max(sizes, default=0) > 1, stats


def test_sequences_on_one_stream_keep_their_own_state(server: ServerProcess) -> None:
    answers: queue.Queue[tuple[int, int] | str] = queue.Queue()

    def on_answer(result: grpcclient.InferResult | None, error: Exception | None) -> None:
        if error is not None or result is None:
            answers.put(str(error))
            return
        request_id = int(result.get_response().id)
        answers.put((request_id, int(result.as_numpy("OUTPUT")[0][0])))

    # Two sequences, their requests interleaved on one stream; each waits for its answer so
    # that a sequence's next step follows its last (the order tritonclient's users keep).
    expected = {}
    with grpcclient.InferenceServerClient(server.url) as client:
        client.start_stream(callback=partial(on_answer))
        try:
            sums = {71: 0, 72: 0}
            steps = [(71, 3), (72, 10), (71, 4), (72, 20), (71, 5), (72, 30)]
            for k, (sequence, value) in enumerate(steps):
                sums[sequence] += value
                expected[k] = sums[sequence]
                client.async_stream_infer(
                    "accumulate_oldest",
                    int_input(value),
                    request_id=str(k),
                    sequence_id=sequence,
                    sequence_start=k < 2,
                    sequence_end=k >= len(steps) - 2,
                )
            got = dict(answers.get(timeout=30) for _ in steps)  # type: ignore[misc]
        finally:
            client.stop_stream()
    assert got == expected


def test_a_growing_state_starts_from_its_data_file_and_the_client_may_ask_for_it(
    server: ServerProcess,
) -> None:
    with grpcclient.InferenceServerClient(server.url) as client:

        def step(sequence: int, value: int, **flags: bool) -> tuple[int, list[int]]:
            outputs = [
                grpcclient.InferRequestedOutput("OUTPUT"),
                grpcclient.InferRequestedOutput("HISTORY_OUT"),
            ]
            result = client.infer(
                "history", int_input(value), outputs=outputs, sequence_id=sequence, **flags
            )
            history = result.as_numpy("HISTORY_OUT")
            assert history is not None
            return int(result.as_numpy("OUTPUT")[0][0]), history[0].tolist()

        assert step(5, 1, sequence_start=True) == (101, [100, 1])
        assert step(6, 7, sequence_start=True) == (107, [100, 7])  # its own, from the file
        assert step(5, 2) == (103, [100, 1, 2])
        assert step(5, 3) == (106, [100, 1, 2, 3])
        assert step(6, 8, sequence_end=True) == (115, [100, 7, 8])
        # Asking for OUTPUT alone leaves the state out of the answer.
        result = client.infer(
            "history",
            int_input(4),
            outputs=[grpcclient.InferRequestedOutput("OUTPUT")],
            sequence_id=5,
            sequence_end=True,
        )
        assert int(result.as_numpy("OUTPUT")[0][0]) == 110
        assert result.as_numpy("HISTORY_OUT") is None


def test_a_client_may_not_give_a_state_input(server: ServerProcess) -> None:
    state = grpcclient.InferInput("STATE_IN", [1, 1], "INT32")
    state.set_data_from_numpy(np.array([[1]], np.int32))
    with (
        grpcclient.InferenceServerClient(server.url) as client,
        pytest.raises(InferenceServerException) as refused,
    ):
        client.infer(
            "accumulate_direct",
            [*int_input(1), state],
            sequence_id=88,
            sequence_start=True,
        )
    assert "has no input(s) ['STATE_IN']; its inputs are ['INPUT']" in refused.value.message()


# 40,000 bytes. A doubling sequence holds 4 KiB at its start and 8, 16, 32 KiB after each step;
# a step holds the old state and the new one at once while it copies the new one in.
STATE_BYTES = 40_000


@pytest.fixture(scope="module")
def bounded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("bounded_state")
    repository = root / "models"
    write_doubling(repository)
    with running_server(
        repository, ["doubling"], root, f"--max-sequence-state-bytes={STATE_BYTES}"
    ) as running:
        yield running


def state_bytes(server: ServerProcess) -> float:
    with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
        metrics = response.read().decode()
    assert f"inferd_sequence_state_limit_bytes {float(STATE_BYTES)}" in metrics
    line = next(m for m in metrics.splitlines() if m.startswith("inferd_sequence_state_bytes "))
    return float(line.split()[1])


def test_the_state_bound_refuses_a_growth_and_a_new_sequence_naming_its_flag(
    bounded: ServerProcess,
) -> None:
    with grpcclient.InferenceServerClient(bounded.url) as client:

        def step(sequence: int, **flags: bool) -> None:
            client.infer("doubling", int_input(1, "FP32"), sequence_id=sequence, **flags)

        def refused(sequence: int, **flags: bool) -> str:
            with pytest.raises(InferenceServerException) as error:
                step(sequence, **flags)
            assert error.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
            message = str(error.value.message())
            assert "--max-sequence-state-bytes" in message
            return message

        step(1, sequence_start=True)  # 4 KiB, then 8
        step(1)  # 16 KiB
        assert state_bytes(bounded) == 16384
        assert "of sequence 1" in refused(1)  # 16 + 32 KiB at once: past the bound
        assert state_bytes(bounded) == 16384  # the state it had stays

        step(2, sequence_start=True)  # 16 + 8 KiB held
        step(3, sequence_start=True)  # 16 + 8 + 8
        # Sequence 4 starts (4 KiB fit), but its first step's 8 KiB do not.
        assert "of sequence 4" in refused(4, sequence_start=True)
        assert state_bytes(bounded) == 16384 + 8192 + 8192 + 4096
        # Sequence 5's 4 KiB do not fit: refused before it queues.
        assert "new sequence 5" in refused(5, sequence_start=True)

        # Sequences that end (here: idle past max_sequence_idle_microseconds) free their state.
        deadline = time.monotonic() + 10 * DOUBLING_IDLE_US / 1e6
        while state_bytes(bounded) != 0:
            assert time.monotonic() < deadline, "the idle sequences' state was not freed"
            time.sleep(0.1)
        step(5, sequence_start=True, sequence_end=True)
        assert state_bytes(bounded) == 0
