"""Triton python-backend models (``backend: "python"``, ``<version>/model.py``) through a real
server and tritonclient: written here from Triton's documented API (the add_sub example's shape),
each instance in a worker process of its own."""

from __future__ import annotations

import concurrent.futures
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.integration.conftest import ServerProcess, running_server, wait_until

ADD_SUB = """
import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = json.loads(args["model_config"])
        output0_config = pb_utils.get_output_config_by_name(self.model_config, "OUTPUT0")
        self.output0_dtype = pb_utils.triton_string_to_numpy(output0_config["data_type"])
        parameters = self.model_config.get("parameters", {})
        self.delay = float(parameters.get("delay_s", {}).get("string_value", "0"))
        self.marker = parameters.get("finalize_marker", {}).get("string_value", "")
        self.batches = 0
        # A restart (every initialize after the first) takes this long.
        restart_delay = float(parameters.get("restart_delay_s", {}).get("string_value", "0"))
        initialized = os.path.join(os.path.dirname(os.path.abspath(__file__)), "initialized")
        if os.path.exists(initialized):
            time.sleep(restart_delay)
        open(initialized, "w").close()

    def execute(self, requests):
        # A character a batch, before the delay: the tests wait for it to know a request is in.
        executes = os.path.join(os.path.dirname(os.path.abspath(__file__)), "executes")
        with open(executes, "a") as record:
            record.write("x")
        time.sleep(self.delay)
        responses = []
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            if float(in_0.flat[0]) == 13:
                error = pb_utils.TritonError("13 is not a number this model adds")
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=error))
                continue
            if float(in_0.flat[0]) == 66:
                raise pb_utils.TritonModelException("66 breaks the whole batch")
            out_0 = pb_utils.Tensor("OUTPUT0", (in_0 + in_1).astype(self.output0_dtype))
            out_1 = pb_utils.Tensor("OUTPUT1", (in_0 - in_1).astype(self.output0_dtype))
            responses.append(pb_utils.InferenceResponse(output_tensors=[out_0, out_1]))
        return responses

    def finalize(self):
        if self.marker:
            with open(self.marker, "w") as marker:
                marker.write("finalized")
"""


def write_add_sub(
    model_dir: Path,
    *,
    batching: bool,
    delay_s: float = 0.0,
    marker: str = "",
    restart_delay_s: float = 0.0,
) -> None:
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "1" / "model.py").write_text(ADD_SUB)
    dims = "[ 4 ]" if batching else "[ 1, 4 ]"

    def tensors(kind: str) -> str:
        name = kind.upper()
        return (
            f'{kind} [ {{ name: "{name}0" data_type: TYPE_FP32 dims: {dims} }}, '
            f'{{ name: "{name}1" data_type: TYPE_FP32 dims: {dims} }} ]\n'
        )

    parameters = {
        "delay_s": str(delay_s),
        "finalize_marker": marker,
        "restart_delay_s": str(restart_delay_s),
    }
    (model_dir / "config.pbtxt").write_text(
        f'name: "{model_dir.name}"\nbackend: "python"\n'
        f"max_batch_size: {8 if batching else 0}\n"
        + tensors("input")
        + tensors("output")
        + "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
        + ("dynamic_batching { max_queue_delay_microseconds: 20000 }\n" if batching else "")
        + "".join(
            f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}\n'
            for key, value in parameters.items()
            if value
        )
    )


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("python-backend")


@pytest.fixture(scope="module")
def server(root: Path) -> Iterator[ServerProcess]:
    repository = root / "models"
    write_add_sub(repository / "add_sub", batching=True, delay_s=0.05)
    write_add_sub(repository / "add_sub_alone", batching=False)
    write_add_sub(repository / "add_sub_slow", batching=False, delay_s=1.0)
    write_add_sub(
        repository / "add_sub_finalized", batching=False, marker=str(root / "finalized.txt")
    )
    write_add_sub(repository / "add_sub_restart", batching=False, restart_delay_s=2.0)
    names = ["add_sub", "add_sub_alone", "add_sub_slow", "add_sub_finalized", "add_sub_restart"]
    with running_server(
        repository,
        names,
        root,
        "--model-control-mode",
        "explicit",
        "--load-model",
        "*",
        # Every INTERNAL answer leaves an error record: the ones these tests cause on purpose.
        expected_errors=lambda record: (
            "python model worker died" in str(record.get("event"))
            or any(
                cause in str(record.get("reason", ""))
                for cause in ("killed by signal SIGKILL", "13 is not a number", "66 breaks")
            )
        ),
    ) as running:
        yield running


def add_sub(
    client: grpcclient.InferenceServerClient, model: str, value: float
) -> tuple[np.ndarray, np.ndarray]:
    shape = [1, 4]
    a = np.full(shape, value, dtype=np.float32)
    b = np.arange(4, dtype=np.float32).reshape(shape)
    inputs = [grpcclient.InferInput(f"INPUT{i}", shape, "FP32") for i in range(2)]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(b)
    result = client.infer(model, inputs)
    return result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1")


def worker_pids(model: str) -> list[int]:
    """The pids of the workers whose command line names ``model``'s instances (what `ps` shows)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"inferd.python_backend.worker" in argv and f"{model}_0".encode() in argv:
            found.append(int(entry))
    return found


def wait_for_restart(client: grpcclient.InferenceServerClient, model: str, died: int) -> None:
    """Until a new worker serves ``model`` (its death is seen asynchronously: right after it,
    the model may still look ready)."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if [p for p in worker_pids(model) if p != died] and client.is_model_ready(model):
            return
        time.sleep(0.05)
    pytest.fail(f"{model} was not served by a new worker within 20 s")


def model_health(server: ServerProcess, model: str) -> str:
    """The gRPC health status of the model's own health service."""
    with grpc.insecure_channel(server.url) as channel:
        response = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service=f"inference.GRPCInferenceService/{model}"),
            timeout=5,
        )
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(response.status))


def dead(pid: int) -> bool:
    """Whether ``pid`` has ended: a zombie waiting for its parent, or gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def test_a_python_model_answers_batches_of_requests_as_lists(server: ServerProcess) -> None:
    before = grpcclient.InferenceServerClient(server.url).get_inference_statistics("add_sub")
    done_before = before.model_stats[0].execution_count

    def call(value: int) -> tuple[int, np.ndarray, np.ndarray]:
        with grpcclient.InferenceServerClient(server.url) as client:
            return (value, *add_sub(client, "add_sub", value))

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(call, [v for v in range(32) if v not in (13, 66)]))
    b = np.arange(4, dtype=np.float32)
    for value, out_0, out_1 in answers:
        np.testing.assert_array_equal(out_0[0], value + b)
        np.testing.assert_array_equal(out_1[0], value - b)
    after = grpcclient.InferenceServerClient(server.url).get_inference_statistics("add_sub")
    executions = after.model_stats[0].execution_count - done_before
    assert 0 < executions < len(answers), executions  # execute(requests) got several at once


def test_an_error_response_fails_only_its_request(server: ServerProcess) -> None:
    def call(value: int) -> str:
        with grpcclient.InferenceServerClient(server.url) as client:
            try:
                add_sub(client, "add_sub", value)
            except InferenceServerException as e:
                return f"{e.status()} {e.message()}"
            return "ok"

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(call, [13, *range(20, 36)]))
    assert answers[0] == "StatusCode.INTERNAL 13 is not a number this model adds", answers[0]
    assert answers[1:] == ["ok"] * 16


def test_an_exception_in_execute_fails_with_the_models_message_and_the_model_serves_on(
    server: ServerProcess,
) -> None:
    with grpcclient.InferenceServerClient(server.url) as client:
        with pytest.raises(InferenceServerException, match="66 breaks the whole batch"):
            add_sub(client, "add_sub_alone", 66)
        out_0, _ = add_sub(client, "add_sub_alone", 5)  # the model still serves
        np.testing.assert_array_equal(out_0[0], 5 + np.arange(4, dtype=np.float32))


def executes(model_dir: Path) -> int:
    """The batches the model's execute has begun (its own record, ``1/executes``)."""
    path = model_dir / "1" / "executes"
    return len(path.read_text()) if path.exists() else 0


def wait_for_execute(model_dir: Path, begun: int) -> None:
    """Until the model's execute has begun more than ``begun`` batches."""
    wait_until(lambda: executes(model_dir) > begun, f"{model_dir.name}'s execute begun")


def test_a_worker_killed_mid_batch_fails_its_request_and_the_next_is_served(
    server: ServerProcess,
) -> None:
    (pid,) = worker_pids("add_sub_slow")  # the command line names model, version and instance
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    assert cmdline[3:7] == [b"--model", b"add_sub_slow", b"--version", b"1"], cmdline
    failure: list[str] = []

    def in_flight() -> None:
        with grpcclient.InferenceServerClient(server.url) as client:
            try:
                add_sub(client, "add_sub_slow", 1)
                failure.append("answered")
            except InferenceServerException as e:
                failure.append(f"{e.status()} {e.message()}")

    begun = executes(server.repository / "add_sub_slow")
    thread = threading.Thread(target=in_flight)
    thread.start()
    wait_for_execute(server.repository / "add_sub_slow", begun)  # in its 1 s execute
    os.kill(pid, signal.SIGKILL)
    thread.join(10)
    assert failure and failure[0].startswith("StatusCode.INTERNAL python model 'add_sub_slow'"), (
        failure
    )
    assert "killed by signal SIGKILL" in failure[0], failure
    with grpcclient.InferenceServerClient(server.url) as client:
        wait_for_restart(client, "add_sub_slow", pid)  # not ready while the worker restarts
        out_0, _ = add_sub(client, "add_sub_slow", 2)  # a fresh worker serves
        np.testing.assert_array_equal(out_0[0], 2 + np.arange(4, dtype=np.float32))
        assert client.is_server_live()
    (restarted,) = worker_pids("add_sub_slow")
    assert restarted != pid


def test_unloading_a_python_model_runs_its_finalize(server: ServerProcess, root: Path) -> None:
    marker = root / "finalized.txt"
    with grpcclient.InferenceServerClient(server.url) as client:
        add_sub(client, "add_sub_finalized", 1)
        assert worker_pids("add_sub_finalized")
        assert not marker.exists()
        client.unload_model("add_sub_finalized")
        deadline = time.monotonic() + 10
        while worker_pids("add_sub_finalized") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not worker_pids("add_sub_finalized")  # the worker exited
    assert marker.read_text() == "finalized"


def test_a_worker_that_died_idle_is_restarted_before_the_next_request(
    server: ServerProcess,
) -> None:
    (pid,) = worker_pids("add_sub_alone")
    os.kill(pid, signal.SIGKILL)
    # Dead, not dying: a zombie (or reaped). While the kernel still tears the process down its
    # command line is already gone but the server cannot yet see the death (that request is
    # then lost with the worker, as any request a worker dies under).
    deadline = time.monotonic() + 5
    while not dead(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert dead(pid)
    with grpcclient.InferenceServerClient(server.url) as client:
        wait_for_restart(client, "add_sub_alone", pid)  # not ready while the worker restarts
        out_0, _ = add_sub(client, "add_sub_alone", 3)  # no request is lost to the dead worker
        np.testing.assert_array_equal(out_0[0], 3 + np.arange(4, dtype=np.float32))
    (restarted,) = worker_pids("add_sub_alone")
    assert restarted != pid


def test_a_worker_restart_makes_the_model_not_ready_until_it_serves_again(
    server: ServerProcess,
) -> None:
    (pid,) = worker_pids("add_sub_restart")
    with grpcclient.InferenceServerClient(server.url) as client:
        assert client.is_model_ready("add_sub_restart")
        os.kill(pid, signal.SIGKILL)  # idle: the server's watch on the process sees it
        deadline = time.monotonic() + 5
        while client.is_model_ready("add_sub_restart") and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not client.is_model_ready("add_sub_restart")  # the restart takes 2 s
        assert model_health(server, "add_sub_restart") == "NOT_SERVING"
        index = {m["name"]: m for m in client.get_model_repository_index(as_json=True)["models"]}
        assert index["add_sub_restart"]["state"] == "UNAVAILABLE"
        assert "restarting its worker" in index["add_sub_restart"]["reason"]
        with pytest.raises(InferenceServerException, match="restarting its worker") as caught:
            add_sub(client, "add_sub_restart", 1)
        assert caught.value.status() == "StatusCode.UNAVAILABLE"
        assert client.is_model_ready("add_sub")  # the other models serve on
        wait_for_restart(client, "add_sub_restart", pid)
        assert model_health(server, "add_sub_restart") == "SERVING"
        out_0, _ = add_sub(client, "add_sub_restart", 2)
        np.testing.assert_array_equal(out_0[0], 2 + np.arange(4, dtype=np.float32))
    (restarted,) = worker_pids("add_sub_restart")
    assert restarted != pid


def test_the_stop_kills_a_worker_whose_execute_never_returns(tmp_path: Path) -> None:
    repository = tmp_path / "models"
    write_add_sub(repository / "add_sub_hangs", batching=False, delay_s=600.0)
    outcome: list[str] = []
    with running_server(
        repository,
        ["add_sub_hangs"],
        tmp_path,
        "--exit-timeout-secs",
        "1",
        expected_errors=lambda record: (
            "python model worker died" in str(record.get("event"))
            or "killed by signal SIGKILL" in str(record.get("reason", ""))
        ),
    ) as server:
        (pid,) = worker_pids("add_sub_hangs")

        def in_flight() -> None:
            with grpcclient.InferenceServerClient(server.url) as client:
                try:
                    add_sub(client, "add_sub_hangs", 1)
                    outcome.append("answered")
                except InferenceServerException as e:
                    outcome.append(str(e.status()))

        thread = threading.Thread(target=in_flight)
        thread.start()
        wait_for_execute(repository / "add_sub_hangs", 0)  # in its 600 s execute
        stop_started = time.monotonic()
    # The block's end sent SIGTERM and saw the server exit 0: past --exit-timeout-secs the
    # worker was killed instead of waited for.
    stopped_after = time.monotonic() - stop_started
    thread.join(10)
    print(f"stopped {stopped_after:.1f} s after SIGTERM; the request answered {outcome}")
    assert stopped_after < 15
    assert outcome and outcome[0] != "answered"
    assert dead(pid)


REQUEST_DETAILS = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            requested = request.requested_output_names()
            blob = pb_utils.get_input_tensor_by_name(request, "BLOB").as_numpy()
            outputs = [
                pb_utils.Tensor("ID", np.array([request.request_id().encode()], dtype=object)),
                pb_utils.Tensor("COUNT", np.array([len(requested)], dtype=np.int32)),
                pb_utils.Tensor("PARAMETERS", np.array([request.parameters()], dtype=object)),
                pb_utils.Tensor("BLOB_OUT", blob),
            ]
            if not requested or "UNUSED" in requested:  # computed only when asked for
                outputs.append(pb_utils.Tensor("UNUSED", np.zeros(1, dtype=np.float32)))
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
"""


def test_execute_sees_the_requests_id_parameters_and_requested_outputs(tmp_path: Path) -> None:
    repository = tmp_path / "models"
    (repository / "details" / "1").mkdir(parents=True)
    (repository / "details" / "1" / "model.py").write_text(REQUEST_DETAILS)
    (repository / "details" / "config.pbtxt").write_text(
        'backend: "python"\nmax_batch_size: 0\n'
        'input [{ name: "BLOB" data_type: TYPE_STRING dims: [1] }]\n'
        'output [{ name: "ID" data_type: TYPE_STRING dims: [1] }, '
        '{ name: "COUNT" data_type: TYPE_INT32 dims: [1] }, '
        '{ name: "PARAMETERS" data_type: TYPE_STRING dims: [1] }, '
        '{ name: "BLOB_OUT" data_type: TYPE_STRING dims: [1] }, '
        '{ name: "UNUSED" data_type: TYPE_FP32 dims: [1] }]\n'
    )
    with (
        running_server(repository, ["details"], tmp_path) as server,
        grpcclient.InferenceServerClient(server.url) as client,
    ):
        x = grpcclient.InferInput("BLOB", [1], "BYTES")
        x.set_data_from_numpy(np.array([b"\xff\x00\xfe"], dtype=object))  # bytes, not text
        asked = [grpcclient.InferRequestedOutput(n) for n in ("ID", "COUNT", "PARAMETERS")]
        parameters = {"top_k": 40, "greedy": True, "stop": 'say "end"'}  # no floats in tritonclient
        result = client.infer(
            "details", [x], outputs=asked, request_id="req-7", parameters=parameters
        )
        assert result.as_numpy("ID").tolist() == [b"req-7"]
        assert result.as_numpy("COUNT").tolist() == [3]
        assert json.loads(result.as_numpy("PARAMETERS")[0]) == parameters
        assert result.as_numpy("UNUSED") is None  # not asked for: the model left it out
        every = client.infer("details", [x], request_id="")
        assert every.as_numpy("ID").tolist() == [b""]
        assert every.as_numpy("COUNT").tolist() == [0]  # none named: every output
        assert json.loads(every.as_numpy("PARAMETERS")[0]) == {}
        assert every.as_numpy("BLOB_OUT").tolist() == [b"\xff\x00\xfe"]
        assert every.as_numpy("UNUSED").tolist() == [0.0]
