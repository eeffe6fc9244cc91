"""Python models continuously batched through Triton's request rescheduling
(``request.set_release_flags(TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)``) under
``sequence_batching { iterative_sequence: true }``: each request comes back for another execute
until the model answers it, batched with requests at other steps. A model that is not decoupled
puts None in the request's place; a decoupled one streams a response per execute and sends the
final flag at the last. Also what a model that reschedules wrongly is answered."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.integration.conftest import ServerProcess, running_server

# STEPS = how many executes the request took: N, counted by the model per correlation id (the
# core gives each request its own), START resetting it.
COUNTDOWN = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.counts = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            key = request.correlation_id()
            start = request.flags() & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START
            if start or key not in self.counts:  # a model without sequences: no START
                self.counts[key] = 0
            self.counts[key] += 1
            wanted = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy().flat[0])
            if wanted == -1:  # a request this model answers wrongly: None, not rescheduled
                responses.append(None)
                continue
            if self.counts[key] < wanted:
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
                responses.append(None)
                continue
            steps = np.array([[self.counts.pop(key)]], np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("STEPS", steps)]))
        return responses
"""


# The same count, decoupled: each execute streams the count so far, the last with the final flag.
STREAMING_COUNTDOWN = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.counts = {}

    def execute(self, requests):
        for request in requests:
            key = request.correlation_id()
            if request.flags() & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
                self.counts[key] = 0
            self.counts[key] += 1
            wanted = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy().flat[0])
            steps = np.array([[self.counts[key]]], np.int32)
            response = pb_utils.InferenceResponse([pb_utils.Tensor("STEPS", steps)])
            sender = request.get_response_sender()
            if self.counts[key] < wanted:
                sender.send(response)
                request.set_release_flags(pb_utils.TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)
            else:
                del self.counts[key]
                sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        return None
"""


def config(name: str, iterative: bool, decoupled: bool = False) -> str:
    return (
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 8\n'
        'input [ { name: "N" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "STEPS" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
        + ("model_transaction_policy { decoupled: true }\n" if decoupled else "")
        + (
            "sequence_batching { iterative_sequence: true\n"
            "  oldest { max_candidate_sequences: 16 } }\n"
            if iterative
            else ""
        )
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("reschedule")
    repository = root / "models"
    for name, iterative, decoupled in (
        ("countdown", True, False),
        ("not_iterative", False, False),
        ("streaming_countdown", True, True),
    ):
        (repository / name / "1").mkdir(parents=True)
        model = STREAMING_COUNTDOWN if decoupled else COUNTDOWN
        (repository / name / "1" / "model.py").write_text(model)
        (repository / name / "config.pbtxt").write_text(config(name, iterative, decoupled))
    with running_server(
        repository,
        ["countdown", "not_iterative", "streaming_countdown"],
        root,
        # The second test's requests fail on purpose, INTERNAL: the model's fault.
        expected_errors=lambda r: (
            r.get("event") == "request failed" and r.get("code") == "INTERNAL"
        ),
    ) as running:
        yield running


def steps(url: str, model: str, wanted: int) -> int:
    tensor = grpcclient.InferInput("N", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[wanted]], np.int32))
    with grpcclient.InferenceServerClient(url) as client:
        return int(client.infer(model, [tensor]).as_numpy("STEPS")[0][0])


def test_each_request_comes_back_until_the_model_answers_it(server: ServerProcess) -> None:
    wanted = [1, 7, 3, 12, 5, 9, 2, 15, 4, 6, 11, 8]
    got: dict[int, int] = {}
    failures: list[str] = []

    def run(index: int) -> None:
        try:
            got[index] = steps(server.url, "countdown", wanted[index])
        except Exception as error:  # reported below, with the request that met it
            failures.append(f"request {index}: {error}")

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(wanted))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not failures, failures
    assert [got[i] for i in range(len(wanted))] == wanted
    with grpcclient.InferenceServerClient(server.url) as client:
        stats = client.get_inference_statistics("countdown", as_json=True)["model_stats"][0]
    assert int(stats["inference_count"]) == sum(wanted)  # a row per execute of each request
    assert int(stats["inference_stats"]["success"]["count"]) == len(wanted)
    assert int(stats["execution_count"]) < sum(wanted)  # requests at different steps batched


def test_rescheduling_wrongly_is_answered_with_what_went_wrong(server: ServerProcess) -> None:
    with pytest.raises(InferenceServerException) as not_iterative:
        steps(server.url, "not_iterative", 3)
    assert "that needs sequence_batching { iterative_sequence: true }" in str(
        not_iterative.value.message()
    )
    with pytest.raises(InferenceServerException) as none:
        steps(server.url, "countdown", -1)
    assert "returned None at position 0 for a request it did not reschedule" in str(
        none.value.message()
    )
    assert steps(server.url, "countdown", 2) == 2  # the model goes on serving


def streamed_counts(url: str, wanted: list[int]) -> dict[int, list[tuple[int, bool]]]:
    """Each request's (STEPS, final flag) per response, all sent at once on one stream."""
    answers: queue.Queue[tuple[grpcclient.InferResult | None, Exception | None]] = queue.Queue()
    got: dict[int, list[tuple[int, bool]]] = {i: [] for i in range(len(wanted))}
    with grpcclient.InferenceServerClient(url) as client:
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        for index, n in enumerate(wanted):
            tensor = grpcclient.InferInput("N", [1, 1], "INT32")
            tensor.set_data_from_numpy(np.array([[n]], np.int32))
            client.async_stream_infer("streaming_countdown", [tensor], request_id=str(index))
        finals = 0
        while finals < len(wanted):
            result, error = answers.get(timeout=30)
            if error is not None:
                raise error
            assert result is not None
            response = result.get_response()
            final = bool(response.parameters["triton_final_response"].bool_param)
            got[int(response.id)].append((int(result.as_numpy("STEPS")[0][0]), final))
            finals += final
        client.stop_stream()
    return got


def test_a_decoupled_model_streams_a_response_per_execute_until_its_final_flag(
    server: ServerProcess,
) -> None:
    wanted = [4, 1, 7, 2, 5]
    got = streamed_counts(server.url, wanted)
    for index, n in enumerate(wanted):
        expected = [(k, k == n) for k in range(1, n + 1)]
        assert got[index] == expected, f"request {index}"
    with grpcclient.InferenceServerClient(server.url) as client:
        stats = client.get_inference_statistics("streaming_countdown", as_json=True)
    model = stats["model_stats"][0]
    assert int(model["inference_count"]) == sum(wanted)
    assert int(model["execution_count"]) < sum(wanted)  # rescheduled requests shared executes
