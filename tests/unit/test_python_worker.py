"""Issue 17, item 2's foundation: a python-backend model instance in its own worker process.

Real worker processes (python -m inferd.python_backend.worker) serving small model.py files
written here against Triton's documented python-backend API; tensors cross by shared memory
(python/inferd/python_backend/ipc.py), the parent's handle is PythonModelProcess (process.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
import venv
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from structlog.testing import capture_logs

from inferd.errors import InvalidArgument
from inferd.python_backend import ipc
from inferd.python_backend.process import (
    PythonModelProcess,
    PythonRequest,
    PythonResponse,
    WorkerDied,
    WorkerSpec,
    WorkerStartFailed,
)
from inferd.python_backend.spawn import OUTPUT_LINE_MAX_BYTES

# Triton's add_sub example, written from the documented API.
ADD_SUB = """
import json
import os
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = json.loads(args["model_config"])
        here = os.path.dirname(os.path.abspath(__file__))
        with open(os.path.join(here, "initialize_args.json"), "w") as f:
            json.dump(args, f)

    def execute(self, requests):
        responses = []
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            if in_0.size and in_0.flat[0] == -99:
                # The test's signal to stay in execute until the worker is killed.
                here = os.path.dirname(os.path.abspath(__file__))
                open(os.path.join(here, "in_execute"), "w").close()
                time.sleep(60)
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("OUTPUT0", (in_0 + in_1).astype(np.float32)),
                        pb_utils.Tensor("OUTPUT1", (in_0 - in_1).astype(np.float32)),
                    ]
                )
            )
        return responses

    def finalize(self):
        here = os.path.dirname(os.path.abspath(__file__))
        with open(os.path.join(here, "finalized"), "w") as f:
            f.write("finalize ran")
"""

RAISES_IN_EXECUTE = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        raise ValueError("boom in execute")
"""

ERROR_FOR_NEGATIVE = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            if (x < 0).any():
                error = pb_utils.TritonError("negative input in " + request.request_id())
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=error))
            else:
                responses.append(
                    pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("Y", x * 2)])
                )
        return responses
"""

ASYNC_EXECUTE = """
import asyncio

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        await asyncio.sleep(0.001)
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "X").as_numpy()
            responses.append(
                pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("Y", x * 3)])
            )
        return responses
"""

INITIALIZE_RAISES = """
class TritonPythonModel:
    def initialize(self, args):
        raise RuntimeError("cannot load the weights of " + args["model_name"])

    def execute(self, requests):
        return []
"""

STRINGS = """
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            upper = np.array([t.upper() for t in text.reshape(-1)], dtype=np.object_)
            lengths = np.array([len(t) for t in text.reshape(-1)], dtype=np.int32)
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("UPPER", upper.reshape(text.shape)),
                        pb_utils.Tensor("LENGTH", lengths.reshape(text.shape)),
                    ]
                )
            )
        return responses
"""

TOO_FEW_RESPONSES = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        x = pb_utils.get_input_tensor_by_name(requests[0], "X").as_numpy()
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("Y", x)])]
"""

LOGS = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        pb_utils.Logger.log_warn("a warning from the model")
        print("a print from the model")
        print("x" * 100_000)
        print("line one\\nline two", flush=True)
        return [pb_utils.InferenceResponse(output_tensors=[]) for _ in requests]
"""


def _spec(
    tmp_path: Path, source: str, name: str = "add_sub", *, decoupled: bool = False
) -> WorkerSpec:
    """A model folder with ``source`` as its model.py, and the spec of its one instance."""
    version_dir = tmp_path / name / "1"
    version_dir.mkdir(parents=True)
    model_file = version_dir / "model.py"
    model_file.write_text(textwrap.dedent(source))
    config: dict[str, Any] = {"name": name, "backend": "python", "max_batch_size": 8}
    if decoupled:
        config["model_transaction_policy"] = {"decoupled": True}
    return WorkerSpec(
        model_name=name,
        model_version=1,
        instance_name=f"{name}_0",
        model_file=model_file,
        model_config_json=json.dumps(config),
        model_repository=tmp_path / name,
    )


@pytest.fixture
def started(tmp_path: Path) -> Iterator[Any]:
    processes: list[PythonModelProcess] = []

    def start(source: str, name: str = "add_sub") -> PythonModelProcess:
        process = PythonModelProcess(_spec(tmp_path, source, name))
        process.start(timeout_s=30)
        processes.append(process)
        return process

    yield start
    for process in processes:
        process.stop(grace_s=5)


def _request(request_id: str, **inputs: Any) -> PythonRequest:
    return PythonRequest(request_id=request_id, inputs=inputs)


def _ok(response: PythonResponse | None) -> dict[str, Any]:
    assert response is not None and response.error is None, response
    return response.outputs


def test_add_sub_answers_a_batch_of_requests_of_different_sizes(started: Any) -> None:
    process = started(ADD_SUB)
    rng = np.random.default_rng(7)
    batch = []
    for index, rows in enumerate((1, 3, 7)):
        a = rng.standard_normal((rows, 4)).astype(np.float32)
        b = rng.standard_normal((rows, 4)).astype(np.float32)
        batch.append((a, b, _request(f"r{index}", INPUT0=a, INPUT1=b)))
    responses = process.execute([request for _, _, request in batch])
    assert len(responses) == 3
    for (a, b, _), response in zip(batch, responses, strict=True):
        outputs = _ok(response)
        np.testing.assert_array_equal(outputs["OUTPUT0"], a + b)
        np.testing.assert_array_equal(outputs["OUTPUT1"], a - b)
        assert outputs["OUTPUT0"].shape == a.shape
    # A second, larger batch reuses (or regrows) the arenas; the first answers were copies.
    kept = responses[0].outputs["OUTPUT0"].copy()
    big = np.ones((1000, 100), dtype=np.float32)
    second = process.execute([_request("big", INPUT0=big, INPUT1=big)])
    np.testing.assert_array_equal(_ok(second[0])["OUTPUT0"], big * 2)
    np.testing.assert_array_equal(responses[0].outputs["OUTPUT0"], kept)


def test_requested_outputs_only(started: Any) -> None:
    process = started(ADD_SUB)
    x = np.arange(4, dtype=np.float32)
    request = _request("r", INPUT0=x, INPUT1=x)
    request.requested_output_names = ["OUTPUT1"]
    [response] = process.execute([request])
    assert list(_ok(response)) == ["OUTPUT1"]


def test_initialize_receives_tritons_args(started: Any, tmp_path: Path) -> None:
    started(ADD_SUB)
    args = json.loads((tmp_path / "add_sub" / "1" / "initialize_args.json").read_text())
    assert args == {
        "model_config": json.dumps({"name": "add_sub", "backend": "python", "max_batch_size": 8}),
        "model_instance_kind": "CPU",
        "model_instance_name": "add_sub_0",
        "model_instance_device_id": "0",
        "model_repository": str(tmp_path / "add_sub"),
        "model_version": "1",
        "model_name": "add_sub",
    }


def test_an_exception_in_execute_fails_every_request_of_the_batch(started: Any) -> None:
    process = started(RAISES_IN_EXECUTE, "raises")
    x = np.zeros(2, dtype=np.int32)
    responses = process.execute([_request(f"r{i}", X=x) for i in range(3)])
    assert [r.error for r in responses] == ["ValueError: boom in execute"] * 3
    # The worker serves on after the failed batch.
    assert process.execute([_request("again", X=x)])[0].error == "ValueError: boom in execute"


def test_an_error_response_fails_only_its_request(started: Any) -> None:
    process = started(ERROR_FOR_NEGATIVE, "negative")
    xs = [np.array([1, 2], np.int32), np.array([-1], np.int32), np.array([5, 6, 7], np.int32)]
    responses = process.execute([_request(f"r{i}", X=x) for i, x in enumerate(xs)])
    np.testing.assert_array_equal(_ok(responses[0])["Y"], xs[0] * 2)
    assert responses[1].error == "negative input in r1"
    assert responses[1].outputs == {}
    np.testing.assert_array_equal(_ok(responses[2])["Y"], xs[2] * 2)


def test_async_execute(started: Any) -> None:
    process = started(ASYNC_EXECUTE, "async")
    xs = [np.arange(n, dtype=np.int64) for n in (1, 5)]
    responses = process.execute([_request(f"r{i}", X=x) for i, x in enumerate(xs)])
    for x, response in zip(xs, responses, strict=True):
        np.testing.assert_array_equal(_ok(response)["Y"], x * 3)


def test_a_failing_initialize_fails_start_with_the_models_message(tmp_path: Path) -> None:
    process = PythonModelProcess(_spec(tmp_path, INITIALIZE_RAISES, "broken"))
    with pytest.raises(WorkerStartFailed, match="cannot load the weights of broken") as failure:
        process.start(timeout_s=30)
    assert "python model 'broken' version 1 instance 'broken_0'" in str(failure.value)
    assert process.pid is None


def test_bytes_tensors_cross_as_object_arrays(started: Any) -> None:
    process = started(STRINGS, "strings")
    first = np.array([[b"abc", b""], [b"hello", b"x\x00y"]], dtype=np.object_)
    second = np.array(["caf\u00e9"], dtype=np.object_)
    responses = process.execute([_request("a", TEXT=first), _request("b", TEXT=second)])
    upper = _ok(responses[0])["UPPER"]
    assert upper.dtype == np.object_ and upper.shape == (2, 2)
    assert upper.tolist() == [[b"ABC", b""], [b"HELLO", b"X\x00Y"]]
    np.testing.assert_array_equal(_ok(responses[0])["LENGTH"], [[3, 0], [5, 3]])
    assert _ok(responses[1])["UPPER"].tolist() == ["caf\u00e9".encode().upper()]


def test_the_wrong_number_of_responses_fails_the_whole_batch(started: Any) -> None:
    process = started(TOO_FEW_RESPONSES, "too_few")
    x = np.ones(1, np.float32)
    responses = process.execute([_request(f"r{i}", X=x) for i in range(3)])
    assert all(r.error is not None for r in responses)
    assert "returned 1 responses for 3 requests" in str(responses[0].error)


def test_sigkill_mid_execute_raises_worker_died_and_restart_serves_again(
    started: Any, tmp_path: Path
) -> None:
    process = started(ADD_SUB)
    first_pid = process.pid
    assert first_pid is not None
    marker = tmp_path / "add_sub" / "1" / "in_execute"
    outcome: list[BaseException | list[PythonResponse]] = []
    stuck = np.full(2, -99, np.float32)

    def run() -> None:
        try:
            outcome.append(process.execute([_request("stuck", INPUT0=stuck, INPUT1=stuck)]))
        except BaseException as error:
            outcome.append(error)

    caller = threading.Thread(target=run)
    caller.start()
    deadline = time.monotonic() + 20
    while not marker.exists():
        assert time.monotonic() < deadline, "the model never entered execute"
        time.sleep(0.01)
    os.kill(first_pid, signal.SIGKILL)
    caller.join(timeout=20)
    assert not caller.is_alive()
    [died] = outcome
    assert isinstance(died, WorkerDied)
    assert str(died) == (
        f"python model 'add_sub' version 1 instance 'add_sub_0' (pid {first_pid}) died: "
        "killed by signal SIGKILL"
    )
    process.restart()
    assert process.pid not in (None, first_pid)
    x = np.arange(3, dtype=np.float32)
    [response] = process.execute([_request("after", INPUT0=x, INPUT1=x)])
    np.testing.assert_array_equal(_ok(response)["OUTPUT0"], x * 2)


def test_the_command_line_names_model_version_and_instance(started: Any) -> None:
    process = started(ADD_SUB)
    argv = Path(f"/proc/{process.pid}/cmdline").read_bytes().split(b"\0")
    words = [w.decode() for w in argv if w]
    assert words[1:3] == ["-m", "inferd.python_backend.worker"]
    for flag, value in (("--model", "add_sub"), ("--version", "1"), ("--instance", "add_sub_0")):
        assert words[words.index(flag) + 1] == value


def test_stop_runs_finalize_and_the_worker_exits(tmp_path: Path) -> None:
    process = PythonModelProcess(_spec(tmp_path, ADD_SUB))
    process.start(timeout_s=30)
    pid = process.pid
    process.stop(grace_s=10)
    assert (tmp_path / "add_sub" / "1" / "finalized").read_text() == "finalize ran"
    assert process.pid is None
    assert not Path(f"/proc/{pid}").exists()  # reaped, not a zombie


def test_model_logs_reach_the_parent_and_its_output_becomes_records(
    started: Any, capfd: pytest.CaptureFixture[str]
) -> None:
    process = started(LOGS, "chatty")
    identity = {"model": "chatty", "version": 1, "instance": "chatty_0"}
    with capture_logs() as records:
        process.execute([_request("r", X=np.zeros(1, np.int8))])
        process.stop(grace_s=5)  # its output pipe closes with its exit

        def output() -> list[dict[str, Any]]:
            return [r for r in records if r["event"] == "python model output"]

        deadline = time.monotonic() + 10
        while len(output()) < 4:
            assert time.monotonic() < deadline, records
            time.sleep(0.01)
    assert [r for r in records if r["event"] == "a warning from the model"] == [
        {"event": "a warning from the model", "log_level": "warning", **identity}
    ]
    # A record a line, with the instance; a long line is cut at the bound, saying how much.
    assert [(r["line"], r.get("cut_bytes"), r["instance"]) for r in output()] == [
        ("a print from the model", None, "chatty_0"),
        ("x" * OUTPUT_LINE_MAX_BYTES, 100_000 - OUTPUT_LINE_MAX_BYTES, "chatty_0"),
        ("line one", None, "chatty_0"),
        ("line two", None, "chatty_0"),
    ]
    captured = capfd.readouterr()
    assert "a print from the model" not in captured.err + captured.out  # never raw


def test_a_16_mb_tensor_crosses_the_ring_with_no_control_message(
    started: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    process = started(ADD_SUB)
    frames: list[int] = []
    encode, decode = ipc.encode_message, ipc.decode_message

    def recording_encode(message: ipc.Message) -> bytes:
        frame = encode(message)
        frames.append(len(frame))
        return frame

    def recording_decode(body: bytes) -> ipc.Message:
        frames.append(len(body))
        return decode(body)

    monkeypatch.setattr(ipc, "encode_message", recording_encode)
    monkeypatch.setattr(ipc, "decode_message", recording_decode)
    big = np.random.default_rng(1).standard_normal(4 << 20).astype(np.float32)  # 16 MiB
    assert big.nbytes == 16 << 20
    [response] = process.execute([_request("big", INPUT0=big, INPUT1=np.zeros_like(big))])
    np.testing.assert_array_equal(_ok(response)["OUTPUT0"], big)
    # A model that is not decoupled takes its batches over the shared-memory ring: neither the
    # batch nor its answer is a message on the control socket, nor JSON.
    assert frames == []


def test_a_small_tensor_message_carries_its_tensors_inline_and_a_big_one_in_an_arena() -> None:
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    sender, receiver = ipc.Channel(left), ipc.Channel(right)
    try:
        small = np.arange(12, dtype=np.float32).reshape(3, 4)
        text = np.array([[b"a", "\u00e9".encode()]], dtype=np.object_)
        big = np.ones(ipc.INLINE_MAX_BYTES // 4 + 1, dtype=np.float32)
        for tensors, inline in (([("X", small), ("T", text)], True), ([("B", big)], False)):
            with ipc.TensorMessage("test", {"type": "response"}, "outputs", tensors) as placed:
                assert (placed.payload != b"") == inline and (placed.fds == ()) == inline
                sender.send(placed.message, placed.fds, placed.payload)
                # A message and the next one, read as one stream: nothing of the first is left
                # for the second.
                sender.send({"type": "next"})
            received, fds = receiver.receive()
            refs = [ipc.TensorRef.from_message(m) for m in received["outputs"]]
            got = ipc.copy_out(received, fds, refs)
            for name, array in tensors:
                assert got[name].shape == array.shape and got[name].tolist() == array.tolist()
                assert got[name].flags.writeable
            assert receiver.receive()[0] == {"type": "next"}
    finally:
        sender.close()
        receiver.close()


def test_arenas_carry_tensors_zero_copy_and_messages_only_metadata() -> None:
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    sender, receiver = ipc.Channel(left), ipc.Channel(right)
    writer, reader = ipc.ArenaWriter("test-arena"), ipc.ArenaReader()
    try:
        big = np.arange(4 << 20, dtype=np.float32)  # 16 MiB
        text = np.array([b"one", b"two"], dtype=np.object_)
        refs, replaced = writer.place([("BIG", big), ("TEXT", text)])
        assert replaced is not None and replaced.size >= big.nbytes
        message = {"refs": [r.to_message() for r in refs], "arena_size": replaced.size}
        assert len(ipc.encode_message(message)) < 512
        sender.send(message, (replaced.fd,))
        received, fds = receiver.receive()
        reader.adopt(received, fds)
        got = [reader.view(ipc.TensorRef.from_message(m)) for m in received["refs"]]
        np.testing.assert_array_equal(got[0], big)
        assert not got[0].flags.owndata  # a view into the shared pages, not a copy
        assert got[1].tolist() == [b"one", b"two"]
        # The same pages: what the writer places next shows through the reader's mapping.
        again, none = writer.place([("BIG", big[::-1].copy())])
        assert none is None and again[0].offset == 0
        assert got[0][0] == big[-1]
    finally:
        writer.close()
        reader.close()
        sender.close()
        receiver.close()


EXITS_IN_INITIALIZE = """
import os


class TritonPythonModel:
    def initialize(self, args):
        os._exit(3)

    def execute(self, requests):
        return []
"""

FINALIZE_HANGS = """
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[]) for _ in requests]

    def finalize(self):
        time.sleep(60)
"""


def test_a_worker_exiting_during_initialize_fails_start_with_its_exit_status(
    tmp_path: Path,
) -> None:
    process = PythonModelProcess(_spec(tmp_path, EXITS_IN_INITIALIZE, "exits"))
    with pytest.raises(
        WorkerStartFailed,
        match=r"instance 'exits_0' \(pid \d+\) died: exited "
        r"with status 3 before initialize finished",
    ):
        process.start(timeout_s=30)


def test_stop_kills_a_worker_whose_finalize_outlasts_the_grace(tmp_path: Path) -> None:
    process = PythonModelProcess(_spec(tmp_path, FINALIZE_HANGS, "hangs"))
    process.start(timeout_s=30)
    pid = process.pid
    began = time.monotonic()
    process.stop(grace_s=0.5)
    assert time.monotonic() - began < 5
    assert process.pid is None
    assert not Path(f"/proc/{pid}").exists()


def test_an_input_no_datatype_holds_is_refused_before_the_worker(started: Any) -> None:
    process = started(ADD_SUB)
    with pytest.raises(InvalidArgument, match="complex128"):
        process.execute([_request("r", INPUT0=np.zeros(2, np.complex128))])
    x = np.ones(2, np.float32)
    [response] = process.execute([_request("next", INPUT0=x, INPUT1=x)])
    np.testing.assert_array_equal(_ok(response)["OUTPUT0"], x * 2)


def test_execution_env_path_runs_the_virtualenvs_python(tmp_path: Path) -> None:
    env = tmp_path / "env"
    venv.create(env, with_pip=False, symlinks=True)
    # The test's environment lends the new one numpy (a real model environment installs its own).
    [site_packages] = env.glob("lib/python*/site-packages")
    (site_packages / "lent.pth").write_text(str(Path(np.__file__).parent.parent) + "\n")
    spec = dataclasses.replace(_spec(tmp_path, ADD_SUB), execution_env=env)
    process = PythonModelProcess(spec)
    process.start(timeout_s=30)
    try:
        argv0 = Path(f"/proc/{process.pid}/cmdline").read_bytes().split(b"\0")[0].decode()
        assert argv0 == str(env / "bin" / "python")
        x = np.arange(3, dtype=np.float32)
        [response] = process.execute([_request("r", INPUT0=x, INPUT1=x)])
        np.testing.assert_array_equal(_ok(response)["OUTPUT1"], np.zeros(3, np.float32))
    finally:
        process.stop(grace_s=5)
    missing = dataclasses.replace(spec, execution_env=tmp_path / "no_env")
    with pytest.raises(WorkerStartFailed, match="is not a virtualenv directory"):
        PythonModelProcess(missing).start(timeout_s=30)


def test_descriptors_belong_to_the_message_that_announced_them() -> None:
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    sender, receiver = ipc.Channel(left), ipc.Channel(right)
    arena = ipc.Arena.create("test-arena", 4096)
    try:
        # Both frames wait in the socket, so one read returns the first with the second's start.
        sender.send({"type": "log", "message": "before"})
        sender.send({"type": "result"}, (arena.fd,))
        first, first_fds = receiver.receive()
        second, second_fds = receiver.receive()
        assert (first, first_fds) == ({"type": "log", "message": "before"}, [])
        assert second == {"type": "result"} and len(second_fds) == 1
        assert os.fstat(second_fds[0]).st_ino == os.fstat(arena.fd).st_ino
        os.close(second_fds[0])
    finally:
        arena.close()
        sender.close()
        receiver.close()


def test_a_worker_whose_server_is_killed_dies_with_it(tmp_path: Path) -> None:
    # SIGKILL of the server: nothing of it runs, so the kernel ends the worker (its parent-death
    # signal); finalize does not run. Before: the worker lived on, as an orphan.
    spec = _spec(tmp_path, ADD_SUB)
    # A stand-in server: starts the worker, says its pid, then waits to be killed.
    server = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(
                f"""
                import sys, time
                from pathlib import Path
                from inferd.python_backend.process import PythonModelProcess, WorkerSpec
                process = PythonModelProcess(WorkerSpec(
                    "add_sub", 1, "add_sub_0", Path({str(spec.model_file)!r}), "{{}}",
                    Path({str(spec.model_repository)!r})))
                process.start(timeout_s=30)
                print(process.pid, flush=True)
                time.sleep(60)
                """
            ),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        worker_pid = int(server.stdout.readline())
    finally:
        server.kill()
        server.wait()
        if server.stdout is not None:
            server.stdout.close()
    deadline = time.monotonic() + 5
    while _alive(worker_pid):
        assert time.monotonic() < deadline, "the worker outlived its killed server"
        time.sleep(0.02)


def _alive(pid: int) -> bool:
    """Whether pid runs (a zombie awaiting its reaper has exited)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status
