"""Stateful models under Triton's sequence batcher, through a real server and tritonclient's
sequence API (``sequence_id``, ``sequence_start``, ``sequence_end``): a python accumulator that
keeps each sequence's sum by its CORRID control input, under the ``direct`` and ``oldest``
strategies; an ONNX model that shows its control inputs; Triton's refusals; the idle timeout."""

from __future__ import annotations

import random
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from onnx import TensorProto, helper
from tritonclient.utils import InferenceServerException

from inferd.examples import IR_VERSION, OPSET
from tests.integration.conftest import ServerProcess, running_server

# OUTPUT = the sequence's running sum of INPUT: reset by START, kept by CORRID between requests,
# dropped at END. READY is 1 on every request the core sends.
ACCUMULATE = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            def value(name):
                return pb_utils.get_input_tensor_by_name(request, name).as_numpy().flat[0]

            key = value("CORRID")  # a number, or bytes for a string id
            if value("START"):
                self.sums[key] = 0
            if not value("READY"):
                raise ValueError("a request without READY")
            self.sums[key] = self.sums.get(key, 0) + int(value("INPUT"))
            out = np.array([[self.sums[key]]], np.int32)
            if value("END"):
                del self.sums[key]
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", out)]))
        return responses
"""

CONTROLS = """  control_input [
    { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
    { name: "END" control [ { kind: CONTROL_SEQUENCE_END int32_false_true: [ 0, 1 ] } ] },
    { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] } ] },
    { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
  ]
"""


def python_config(name: str, strategy: str, idle_us: int = 0, corrid: str = "TYPE_UINT64") -> str:
    return (
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
        f"sequence_batching {{\n  max_sequence_idle_microseconds: {idle_us}\n{strategy}\n"
        f"{CONTROLS.replace('TYPE_UINT64', corrid)}}}\n"
    )


def write_python(
    repository: Path, name: str, strategy: str, idle_us: int = 0, corrid: str = "TYPE_UINT64"
) -> None:
    (repository / name / "1").mkdir(parents=True)
    (repository / name / "1" / "model.py").write_text(ACCUMULATE)
    (repository / name / "config.pbtxt").write_text(python_config(name, strategy, idle_us, corrid))


def write_onnx_controls(repository: Path) -> None:
    """OUTPUT = INPUT + 10 START + 100 END + 1000 READY (INT32), ID = CORRID: what the core
    wrote."""
    model_dir = repository / "controls_onnx"
    (model_dir / "1").mkdir(parents=True)
    scale = [helper.make_tensor(f"k{k}", TensorProto.INT32, [], [k]) for k in (10, 100, 1000)]
    nodes = [
        helper.make_node("Mul", ["START", "k10"], ["s"]),
        helper.make_node("Mul", ["END", "k100"], ["e"]),
        helper.make_node("Mul", ["READY", "k1000"], ["r"]),
        helper.make_node("Add", ["INPUT", "s"], ["a"]),
        helper.make_node("Add", ["a", "e"], ["b"]),
        helper.make_node("Add", ["b", "r"], ["OUTPUT"]),
        helper.make_node("Identity", ["CORRID"], ["ID"]),
    ]
    flag = ["batch", 1]
    graph = helper.make_graph(
        nodes,
        "controls",
        [
            helper.make_tensor_value_info("INPUT", TensorProto.INT32, flag),
            helper.make_tensor_value_info("START", TensorProto.INT32, flag),
            helper.make_tensor_value_info("END", TensorProto.INT32, flag),
            helper.make_tensor_value_info("READY", TensorProto.INT32, flag),
            helper.make_tensor_value_info("CORRID", TensorProto.UINT64, flag),
        ],
        [
            helper.make_tensor_value_info("OUTPUT", TensorProto.INT32, flag),
            helper.make_tensor_value_info("ID", TensorProto.UINT64, flag),
        ],
        initializer=scale,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = IR_VERSION
    onnx.save(model, model_dir / "1" / "model.onnx")
    (model_dir / "config.pbtxt").write_text(
        'name: "controls_onnx"\nplatform: "onnxruntime_onnx"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] },\n'
        '         { name: "ID" data_type: TYPE_UINT64 dims: [ 1 ] } ]\n'
        f"sequence_batching {{\n{CONTROLS}}}\n"
    )


MODELS = [
    "accumulate_direct",
    "accumulate_oldest",
    "accumulate_idle",
    "accumulate_strings",
    "by_correlation",
    "told",
    "controls_onnx",
]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    root = tmp_path_factory.mktemp("sequences")
    repository = root / "models"
    write_python(repository, "accumulate_direct", "")
    oldest = "  oldest { max_candidate_sequences: 16 max_queue_delay_microseconds: 3000 }"
    write_python(repository, "accumulate_oldest", oldest)
    write_python(repository, "accumulate_idle", "", idle_us=300_000)
    write_python(repository, "accumulate_strings", "", corrid="TYPE_STRING")
    by_correlation = repository / "by_correlation"
    (by_correlation / "1").mkdir(parents=True)
    (by_correlation / "1" / "model.py").write_text(BY_CORRELATION)
    (by_correlation / "config.pbtxt").write_text(
        python_config("by_correlation", "").replace(CONTROLS, "")
    )
    told = repository / "told"
    (told / "1").mkdir(parents=True)
    (told / "1" / "model.py").write_text(TOLD)
    (told / "config.pbtxt").write_text(
        python_config("told", "", idle_us=300_000)
        + 'parameters { key: "inferd.sequence_idle_end" value: { string_value: "tell" } }\n'
        + f'parameters {{ key: "record" value: {{ string_value: "{root / "told.record"}" }} }}\n'
    )
    write_onnx_controls(repository)
    with running_server(repository, MODELS, root) as running:
        yield running


@pytest.fixture
def client(server: ServerProcess) -> Iterator[grpcclient.InferenceServerClient]:
    with grpcclient.InferenceServerClient(server.url) as c:
        yield c


def step_input(value: int) -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("INPUT", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[value]], np.int32))
    return [tensor]


def send(
    client: grpcclient.InferenceServerClient,
    model: str,
    sequence: int | str,
    value: int,
    *,
    start: bool = False,
    end: bool = False,
) -> int:
    result = client.infer(
        model,
        step_input(value),
        sequence_id=sequence,
        sequence_start=start,
        sequence_end=end,
    )
    return int(result.as_numpy("OUTPUT")[0][0])


def interleaved_sums(url: str, model: str, clients: int = 16) -> list[str]:
    """``clients`` clients, each running 3 sequences of 2 to 8 random values one after another,
    all at once, against an accumulator (OUTPUT = the sequence's running sum of INPUT): what any
    of them got wrong."""
    failures: list[str] = []

    def run(client_index: int) -> None:
        rng = random.Random(client_index)
        with grpcclient.InferenceServerClient(url) as own:
            for round_ in range(3):
                sequence = 1000 * (client_index + 1) + round_
                values = [rng.randint(-50, 50) for _ in range(rng.randint(2, 8))]
                total = 0
                for k, value in enumerate(values):
                    total += value
                    got = send(own, model, sequence, value, start=k == 0, end=k == len(values) - 1)
                    if got != total:
                        failures.append(f"{model} sequence {sequence} step {k}: {got} != {total}")

    threads = [threading.Thread(target=run, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return failures


@pytest.mark.parametrize("model", ["accumulate_direct", "accumulate_oldest"])
def test_sixteen_clients_interleaving_sequences_each_get_their_own_sums(
    server: ServerProcess, model: str
) -> None:
    failures = interleaved_sums(server.url, model)
    assert not failures, failures[:5]


def test_oldest_batches_requests_of_several_sequences(
    server: ServerProcess, client: grpcclient.InferenceServerClient
) -> None:
    # The 16-client test ran first on this module's server: its statistics show batches above 1.
    stats = client.get_inference_statistics("accumulate_oldest", as_json=True)
    sizes = {int(b["batch_size"]) for b in stats["model_stats"][0].get("batch_stats", [])}
    assert max(sizes, default=0) > 1, stats


def test_string_sequence_ids_keep_their_own_state(client: grpcclient.InferenceServerClient) -> None:
    # CORRID is TYPE_STRING: the model keys its sums by the id's bytes.
    assert send(client, "accumulate_strings", "session-a", 1, start=True) == 1
    assert send(client, "accumulate_strings", "session-b", 10, start=True) == 10
    assert send(client, "accumulate_strings", "session-a", 2) == 3
    assert send(client, "accumulate_strings", "session-b", 20, end=True) == 30
    assert send(client, "accumulate_strings", "session-a", 3, end=True) == 6
    # A UINT64 CORRID takes no string id: refused, naming it.
    with pytest.raises(InferenceServerException) as refused:
        send(client, "accumulate_direct", "session-a", 1, start=True)
    assert "numeric sequence_id, got the string 'session-a'" in refused.value.message()


def test_tritons_refusals(client: grpcclient.InferenceServerClient) -> None:
    with pytest.raises(InferenceServerException) as no_start:
        send(client, "accumulate_direct", 777, 1)
    assert no_start.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert "must specify the START flag on the first request of the sequence" in (
        no_start.value.message()
    )
    with pytest.raises(InferenceServerException) as no_id:
        client.infer("accumulate_direct", step_input(1))
    assert "non-zero or non-empty correlation ID" in no_id.value.message()
    rows = grpcclient.InferInput("INPUT", [2, 1], "INT32")
    rows.set_data_from_numpy(np.array([[1], [2]], np.int32))
    with pytest.raises(InferenceServerException) as batched:
        client.infer("accumulate_direct", [rows], sequence_id=778, sequence_start=True)
    assert "batch-size 1" in batched.value.message()
    # A client may not give a control input itself.
    start = grpcclient.InferInput("START", [1, 1], "INT32")
    start.set_data_from_numpy(np.array([[1]], np.int32))
    with pytest.raises(InferenceServerException) as control:
        client.infer("accumulate_direct", [*step_input(1), start], sequence_id=779)
    assert "has no input(s) ['START']; its inputs are ['INPUT']" in control.value.message()


def test_an_onnx_model_gets_its_control_inputs(client: grpcclient.InferenceServerClient) -> None:
    def run(value: int, **flags: bool) -> tuple[int, int]:
        result = client.infer("controls_onnx", step_input(value), sequence_id=424242, **flags)
        return int(result.as_numpy("OUTPUT")[0][0]), int(result.as_numpy("ID")[0][0])

    assert run(5, sequence_start=True) == (5 + 10 + 1000, 424242)
    assert run(6) == (6 + 1000, 424242)
    assert run(7, sequence_end=True) == (7 + 100 + 1000, 424242)


def test_a_sequence_idle_past_its_timeout_ends_and_needs_start_again(
    server: ServerProcess, client: grpcclient.InferenceServerClient
) -> None:
    assert send(client, "accumulate_idle", 55, 4, start=True) == 4
    assert send(client, "accumulate_idle", 55, 3) == 7
    time.sleep(1.0)  # past its 0.3 s
    with pytest.raises(InferenceServerException) as ended:
        send(client, "accumulate_idle", 55, 1)
    assert "must specify the START flag" in ended.value.message()
    assert send(client, "accumulate_idle", 55, 2, start=True, end=True) == 2
    logged = [
        r
        for r in server.records()
        if r.get("event") == "sequence ended: idle past max_sequence_idle_microseconds"
    ]
    assert any(r.get("sequence_id") == "55" and r.get("model") == "accumulate_idle" for r in logged)
    with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
        metrics = response.read().decode()
    assert 'inferd_sequences_idle_ended_total{model="accumulate_idle",version="1"} 1.0' in metrics
    assert 'inferd_sequences_active{model="accumulate_idle",version="1"} 0.0' in metrics


def test_server_metadata_lists_the_sequence_extensions(
    client: grpcclient.InferenceServerClient,
) -> None:
    extensions = client.get_server_metadata().extensions
    assert "sequence" in extensions and "sequence(string_id)" in extensions


def test_a_sequence_over_http(server: ServerProcess) -> None:
    with httpclient.InferenceServerClient(server.http_url) as http:

        def send_http(value: int, **flags: bool) -> int:
            tensor = httpclient.InferInput("INPUT", [1, 1], "INT32")
            tensor.set_data_from_numpy(np.array([[value]], np.int32))
            result = http.infer("accumulate_direct", [tensor], sequence_id=9090, **flags)
            return int(result.as_numpy("OUTPUT")[0][0])

        assert send_http(2, sequence_start=True) == 2
        assert send_http(5) == 7
        assert send_http(1, sequence_end=True) == 8


# The same sums from a python model without control inputs: it reads the sequence from
# request.correlation_id() and request.flags(), as Triton's python backend gives them.
BY_CORRELATION = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            key = request.correlation_id()
            flags = request.flags()
            if flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START:
                self.sums[key] = 0
            value = int(pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy().flat[0])
            self.sums[key] += value
            out = np.array([[self.sums[key]]], np.int32)
            if flags & pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END:
                del self.sums[key]
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", out)]))
        return responses
"""


def test_a_python_model_reads_its_sequence_from_correlation_id_and_flags(
    client: grpcclient.InferenceServerClient,
) -> None:
    assert send(client, "by_correlation", 31, 5, start=True) == 5
    assert send(client, "by_correlation", "thirty-two", 1, start=True) == 1
    assert send(client, "by_correlation", 31, 6) == 11
    assert send(client, "by_correlation", "thirty-two", 2, end=True) == 3
    assert send(client, "by_correlation", 31, 7, end=True) == 18


# Told of an idle end (inferd.sequence_idle_end: "tell"): the request with READY 0 writes the
# sequence's id to the file the "record" parameter names.
TOLD = """
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        config = json.loads(args["model_config"])
        self.record = config["parameters"]["record"]["string_value"]

    def execute(self, requests):
        responses = []
        for request in requests:
            def value(name):
                return pb_utils.get_input_tensor_by_name(request, name).as_numpy().flat[0]

            if not value("READY"):
                assert pb_utils.get_input_tensor_by_name(request, "INPUT") is None
                with open(self.record, "a") as record:
                    record.write(f"{int(value('CORRID'))} {int(value('END'))}\\n")
                zero = np.zeros((1, 1), np.int32)  # dropped by the server
                responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", zero)]))
                continue
            out = np.array([[int(value("INPUT"))]], np.int32)
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUTPUT", out)]))
        return responses
"""


def test_with_tell_an_idle_sequences_model_gets_one_more_request(
    server: ServerProcess, client: grpcclient.InferenceServerClient
) -> None:
    assert send(client, "told", 606, 1, start=True) == 1
    record = server.repository.parent / "told.record"
    deadline = time.monotonic() + 10
    while not (record.exists() and record.read_text()):
        assert time.monotonic() < deadline, "the model was not told"
        time.sleep(0.05)
    assert record.read_text() == "606 1\n"  # its CORRID, END true, READY false
    with pytest.raises(InferenceServerException) as ended:
        send(client, "told", 606, 1)
    assert "must specify the START flag" in ended.value.message()
    assert send(client, "told", 606, 2, start=True, end=True) == 2
