"""A python model's workers never outlive their server or their model, and a model that
misbehaves (an execute that hangs, a decoupled request that never gets its final flag, a cycle
of model-to-model calls, a crash loop) cannot hold its instance, its unload or the server's stop
for good. Through a real server (SIGTERM, SIGKILL, unload) and tritonclient."""

from __future__ import annotations

import json
import queue
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.integration.conftest import running_server

# Each start appends the worker's pid to <folder>/<model>.pids, and the time it started to
# <model>.starts. BEHAVIOUR (a config parameter) says what the model does:
#   hang          execute never returns
#   slow_init     initialize sleeps an hour
#   crash         the worker exits 0.1 s after initialize
#   echo          Y = X
#   never_final   decoupled: one response, no final flag, execute returns
#   hang_stream   decoupled: one response, then execute never returns
#   spawn         echo, after starting `sleep 3600` (its pid in <model>.children)
#   chatty        echo, after printing a 100,000-character line and two lines at once
#   call          Y = the callee's Y for X (BLS; the callee is the CALLEE parameter), Y = X for
#                 X = 0; a failed call is this request's error, with the call's message
#   late_call     Y = X; execute starts a thread that calls the callee with a 1 s timeout and
#                 writes how the call ended to <name>.late, and returns 0.2 s later (the call
#                 outlives the batch it was made in)
MODEL = """
import json
import os
import subprocess
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        parameters = json.loads(args["model_config"])["parameters"]
        self.behaviour = parameters["BEHAVIOUR"]["string_value"]
        self.callee = parameters.get("CALLEE", {}).get("string_value", "")
        folder = parameters["FOLDER"]["string_value"]
        name = args["model_name"]
        with open(os.path.join(folder, name + ".pids"), "a") as pids:
            pids.write(f"{os.getpid()}\\n")
        with open(os.path.join(folder, name + ".starts"), "a") as starts:
            starts.write(f"{time.time()}\\n")
        self.started = os.path.join(folder, name + ".started")
        if self.behaviour == "slow_init":
            time.sleep(3600)
        if self.behaviour == "crash":
            threading.Timer(0.1, os._exit, args=(3,)).start()
        if self.behaviour == "spawn":
            child = subprocess.Popen(["sleep", "3600"])
            with open(os.path.join(folder, name + ".children"), "a") as children:
                children.write(f"{child.pid}\\n")
        if self.behaviour == "chatty":
            print("a" * 100_000)
            print("one\\ntwo", flush=True)

    def call_late(self, x):
        call = pb_utils.InferenceRequest(
            model_name=self.callee,
            requested_output_names=["Y"],
            inputs=[pb_utils.Tensor("X", x)],
            timeout=1_000_000,
        )
        answer = call.exec()
        ended = answer.error().message() if answer.has_error() else "answered"
        with open(self.started.replace(".started", ".late"), "a") as late:
            late.write(ended + "\\n")

    def execute(self, requests):
        open(self.started, "a").close()
        if self.behaviour == "late_call":
            for request in requests:
                x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
                threading.Thread(target=self.call_late, args=(x,)).start()
            time.sleep(0.2)
            return [
                pb_utils.InferenceResponse(
                    [pb_utils.Tensor("Y", pb_utils.get_input_tensor_by_name(r, "X").as_numpy())]
                )
                for r in requests
            ]
        if self.behaviour == "hang":
            time.sleep(3600)
        if self.behaviour in ("never_final", "hang_stream"):
            for request in requests:
                out = pb_utils.Tensor("Y", np.array([1], np.int32))
                request.get_response_sender().send(pb_utils.InferenceResponse([out]))
            if self.behaviour == "hang_stream":
                time.sleep(3600)
            return None
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if self.behaviour == "call" and x[0] != 0:
                call = pb_utils.InferenceRequest(
                    model_name=self.callee,
                    requested_output_names=["Y"],
                    inputs=[pb_utils.Tensor("X", x)],
                )
                answer = call.exec()
                if answer.has_error():
                    error = pb_utils.TritonError(answer.error().message())
                    responses.append(pb_utils.InferenceResponse(error=error))
                    continue
                x = pb_utils.get_output_tensor_by_name(answer, "Y").as_numpy()
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("Y", x)]))
        return responses
"""


def write_model(
    repository: Path, name: str, behaviour: str, *, callee: str = "", decoupled: bool = False
) -> None:
    (repository / name / "1").mkdir(parents=True)
    (repository / name / "1" / "model.py").write_text(MODEL)
    parameters = {"BEHAVIOUR": behaviour, "FOLDER": str(repository.parent), "CALLEE": callee}
    (repository / name / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "Y" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        "instance_group [ { count: 1 kind: KIND_CPU } ]\n"
        + ("model_transaction_policy { decoupled: true }\n" if decoupled else "")
        + "".join(
            f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}\n'
            for key, value in parameters.items()
        )
    )


def x_input(value: int = 7) -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("X", [1], "INT32")
    tensor.set_data_from_numpy(np.array([value], np.int32))
    return [tensor]


def wait_for(condition: Any, what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s:g} s"
        time.sleep(0.02)


def worker_pids(root: Path, model: str) -> list[int]:
    path = root / f"{model}.pids"
    return [int(line) for line in path.read_text().split()] if path.exists() else []


def first_worker(root: Path, model: str) -> int:
    wait_for(lambda: worker_pids(root, model), f"{model}'s worker started")
    return worker_pids(root, model)[0]


def gone(pid: int) -> bool:
    """Whether the process has ended (a zombie nobody reaped has)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def wait_gone(pid: int, timeout_s: float) -> None:
    wait_for(lambda: gone(pid), f"worker {pid} ended", timeout_s)


def started(root: Path, model: str) -> None:
    wait_for((root / f"{model}.started").exists, f"{model}'s execute started")


def assert_echo(url: str) -> None:
    with grpcclient.InferenceServerClient(url) as triton:
        result = triton.infer("echo", x_input(5), client_timeout=30)
        assert result.as_numpy("Y").tolist() == [5]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    repository = tmp_path / "models"
    repository.mkdir()
    write_model(repository, "echo", "echo")
    write_model(repository, "hang", "hang")
    write_model(repository, "slow_init", "slow_init")
    write_model(repository, "crash", "crash")
    write_model(repository, "never_final", "never_final", decoupled=True)
    write_model(repository, "hang_stream", "hang_stream", decoupled=True)
    write_model(repository, "ping", "call", callee="pong")
    write_model(repository, "pong", "call", callee="ping")
    write_model(repository, "caller", "call", callee="hang")
    write_model(repository, "late_caller", "late_call", callee="hang")
    return tmp_path


def serve(root: Path, *models: str, exit_timeout_s: int = 3, failing: str = "") -> Any:
    """A server in explicit mode with ``models`` loaded at start. ``failing``: text of the
    error responses a test's models answer on purpose (logged as failed requests)."""

    def expected(record: dict[str, object]) -> bool:
        return bool(failing) and failing in str(record.get("reason", ""))

    return running_server(
        root / "models",
        list(models),
        root,
        "--model-control-mode",
        "explicit",
        "--load-model",
        ",".join(models),
        "--exit-timeout-secs",
        str(exit_timeout_s),
        expected_errors=expected,
    )


def infer_in_background(url: str, model: str) -> queue.Queue[object]:
    """Sends one request and returns where its outcome lands."""
    outcome: queue.Queue[object] = queue.Queue()
    triton = grpcclient.InferenceServerClient(url)
    triton.async_infer(model, x_input(), lambda result, error: outcome.put(error or result))
    return outcome


class _ServerKilled(Exception):
    """Ends a running_server block whose server the test killed itself."""


# Item 5: workers die with their server and with their unload.


def test_sigterm_with_a_hung_execute_stops_in_time_and_kills_its_worker(root: Path) -> None:
    with serve(root, "hang", exit_timeout_s=2) as server:
        pid = first_worker(root, "hang")
        outcome = infer_in_background(server.url, "hang")
        started(root, "hang")
        stopping = time.monotonic()
    # running_server sent SIGTERM and checked exit code 0 and no error record.
    assert time.monotonic() - stopping < 2 + 4  # within --exit-timeout-secs, not its margin
    wait_gone(pid, 2)
    assert isinstance(outcome.get(timeout=10), InferenceServerException)


def test_sigkill_of_the_server_kills_its_workers(root: Path) -> None:
    with pytest.raises(_ServerKilled), serve(root, "echo", "hang") as server:
        pids = [first_worker(root, "echo"), first_worker(root, "hang")]
        infer_in_background(server.url, "hang")
        started(root, "hang")
        server.process.kill()
        server.process.wait()
        for pid in pids:
            wait_gone(pid, 5)
        raise _ServerKilled


def test_unload_of_a_hung_model_kills_its_worker_and_answers(root: Path) -> None:
    with serve(root, "echo", "hang", exit_timeout_s=2) as server:
        pid = first_worker(root, "hang")
        outcome = infer_in_background(server.url, "hang")
        started(root, "hang")
        with grpcclient.InferenceServerClient(server.url) as triton:
            unloading = time.monotonic()
            triton.unload_model("hang", client_timeout=30)
            # The unload waits for the hung batch --exit-timeout-secs (2 s), then kills it.
            assert time.monotonic() - unloading < 2 + 4
            wait_gone(pid, 5)
            assert isinstance(outcome.get(timeout=10), InferenceServerException)
            assert not triton.is_model_ready("hang")
        assert_echo(server.url)


def test_unload_and_stop_kill_what_the_model_started(root: Path) -> None:
    write_model(root / "models", "spawn", "spawn")
    write_model(root / "models", "spawn_too", "spawn")
    with serve(root, "echo", "spawn", "spawn_too") as server:
        with grpcclient.InferenceServerClient(server.url) as triton:
            triton.unload_model("spawn", client_timeout=30)
        # The worker leads a process group that its stop kills whole.
        [child] = [int(pid) for pid in (root / "spawn.children").read_text().split()]
        wait_gone(child, 5)
        [other] = [int(pid) for pid in (root / "spawn_too.children").read_text().split()]
        assert not gone(other)
        assert_echo(server.url)
    wait_gone(other, 5)  # and the server's stop


def test_a_load_given_up_during_initialize_kills_its_worker(root: Path) -> None:
    with serve(root, "echo") as server:
        with (
            grpcclient.InferenceServerClient(server.url) as triton,
            pytest.raises(InferenceServerException, match="Deadline"),
        ):
            triton.load_model("slow_init", client_timeout=2)
        pid = first_worker(root, "slow_init")
        wait_gone(pid, 5)  # the load was given up at its deadline: its worker with it
        assert_echo(server.url)


# Item 7: a decoupled request whose final flag never comes does not hold its instance.


def open_stream(url: str, model: str, **stream_options: Any) -> Any:
    """A tritonclient stream with one request sent; returns (client, answers)."""
    answers: queue.Queue[tuple[Any, Any]] = queue.Queue()
    triton = grpcclient.InferenceServerClient(url)
    triton.start_stream(
        callback=lambda result, error: answers.put((result, error)), **stream_options
    )
    triton.async_stream_infer(model, x_input())
    return triton, answers


def first_response(answers: queue.Queue[tuple[Any, Any]], timeout_s: float = 30) -> None:
    result, error = answers.get(timeout=timeout_s)
    assert error is None, error
    assert result.as_numpy("Y").tolist() == [1]


@pytest.mark.parametrize("model", ["never_final", "hang_stream"])
def test_a_cancelled_stream_frees_an_instance_whose_model_never_ends_the_request(
    root: Path, model: str
) -> None:
    with serve(root, "echo", model) as server:
        triton, answers = open_stream(server.url, model)
        first_response(answers)
        triton.stop_stream(cancel_requests=True)
        triton.close()
        # The instance takes the next request: at once for a model whose execute returned,
        # after its worker is killed and restarted for one whose execute never returns.
        triton, answers = open_stream(server.url, model)
        first_response(answers, timeout_s=20)
        triton.stop_stream(cancel_requests=True)
        triton.close()
        assert_echo(server.url)


def test_a_stream_past_its_deadline_ends_a_request_that_never_gets_its_final_flag(
    root: Path,
) -> None:
    with serve(root, "never_final") as server:
        triton, answers = open_stream(server.url, "never_final", stream_timeout=3)
        first_response(answers)
        _, error = answers.get(timeout=20)  # the deadline ends the stream
        assert error is not None
        triton.close()
        triton, answers = open_stream(server.url, "never_final")
        first_response(answers, timeout_s=20)
        triton.stop_stream(cancel_requests=True)
        triton.close()


def test_unload_ends_a_request_that_never_gets_its_final_flag(root: Path) -> None:
    with serve(root, "echo", "never_final", exit_timeout_s=2) as server:
        pid = first_worker(root, "never_final")
        stream, answers = open_stream(server.url, "never_final")
        first_response(answers)
        with grpcclient.InferenceServerClient(server.url) as triton:
            unloading = time.monotonic()
            triton.unload_model("never_final", client_timeout=30)
            assert time.monotonic() - unloading < 2 + 4
        wait_gone(pid, 5)
        stream.stop_stream(cancel_requests=True)
        stream.close()
        assert_echo(server.url)


# Item 6: model-to-model calls cannot deadlock.


def test_a_cycle_of_model_to_model_calls_is_refused_naming_it(root: Path) -> None:
    with serve(root, "echo", "ping", "pong", failing="cycle") as server:
        with grpcclient.InferenceServerClient(server.url) as triton:
            answered = time.monotonic()
            with pytest.raises(InferenceServerException, match="ping -> pong -> ping"):
                triton.infer("ping", x_input(), client_timeout=20)
            assert time.monotonic() - answered < 10
            # Neither model is held: both answer again at once, and health is right.
            for model in ("ping", "pong"):
                with pytest.raises(InferenceServerException, match="cycle"):
                    triton.infer(model, x_input(), client_timeout=20)
                assert triton.is_model_ready(model)
        assert_echo(server.url)


def test_a_model_to_model_call_ends_with_its_callers_deadline(root: Path) -> None:
    # caller -> hang: the call never returns by itself.
    with serve(
        root, "echo", "caller", "hang", exit_timeout_s=2, failing="call cancelled"
    ) as server:
        with grpcclient.InferenceServerClient(server.url) as triton:
            with pytest.raises(InferenceServerException, match="Deadline"):
                triton.infer("caller", x_input(), client_timeout=2)
            started(root, "hang")
            # caller's instance is free again (its call was cancelled with its request): its
            # next request, which calls nobody, is answered.
            result = triton.infer("caller", x_input(0), client_timeout=10)
            assert result.as_numpy("Y").tolist() == [0]
        assert_echo(server.url)


def test_a_model_to_model_call_that_outlives_its_batch_still_ends_with_its_timeout(
    root: Path,
) -> None:
    # late_caller -> hang, from a thread of late_caller's, with a 1 s timeout: the batch that
    # made the call is answered first, and nothing of the server's waits on the call any more.
    with serve(root, "echo", "late_caller", "hang", exit_timeout_s=2) as server:
        with grpcclient.InferenceServerClient(server.url) as triton:
            result = triton.infer("late_caller", x_input(), client_timeout=10)
            assert result.as_numpy("Y").tolist() == [7]
            late = root / "late_caller.late"
            wait_for(lambda: late.exists() and late.read_text(), "the late call's end", 15)
            assert "passed its deadline" in late.read_text(), late.read_text()
        assert_echo(server.url)


# Item 9: a worker that crashes right after initialize is restarted with a back-off.


def test_a_crash_loop_backs_off_and_says_so(root: Path) -> None:
    with serve(root, "echo", "crash") as server:

        def backoffs() -> list[object]:
            return [
                r["restart_in_s"]
                for r in server.records()
                if r.get("event") == "a python model's worker will restart"
            ]

        wait_for(lambda: len(backoffs()) >= 3, "three restarts", timeout_s=60)
        # Restarted at once, then after 1 s, then 2 s... (before: at once, forever).
        assert backoffs()[:3] == [0.0, 1.0, 2.0], backoffs()
        wait_for(lambda: len(worker_pids(root, "crash")) >= 4, "the fourth start", timeout_s=60)
        starts = [float(t) for t in (root / "crash.starts").read_text().split()]
        assert starts[2] - starts[1] >= 1.0, starts  # the 1 s wait, on top of the worker's life
        assert starts[3] - starts[2] >= 2.0, starts
        with grpcclient.InferenceServerClient(server.url) as triton:

            def says_it_backs_off() -> bool:
                index = triton.get_model_repository_index(as_json=True)["models"]
                reason = str({m["name"]: m for m in index}["crash"].get("reason", ""))
                return "in a row, next attempt in" in reason and not triton.is_model_ready("crash")

            wait_for(says_it_backs_off, "readiness names the back-off")
        assert_echo(server.url)


def test_worker_output_is_logged_as_records_cut_at_a_bound(root: Path) -> None:
    write_model(root / "models", "chatty", "chatty")
    with serve(root, "chatty") as server:
        first_worker(root, "chatty")

        def output() -> list[dict[str, object]]:
            return [r for r in server.records() if r.get("event") == "python model output"]

        wait_for(lambda: len(output()) >= 3, "the model's prints logged")
        lines = [(r["line"], r.get("cut_bytes"), r["model"]) for r in output()]
        assert lines == [
            ("a" * 16384, 100_000 - 16384, "chatty"),
            ("one", None, "chatty"),
            ("two", None, "chatty"),
        ]
    for line in server.log().splitlines():
        assert len(line) < 20_000
        json.loads(line)  # every line of the server's log is a JSON record
