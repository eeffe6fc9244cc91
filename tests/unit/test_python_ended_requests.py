"""A decoupled request the server ends (cancelled, past its deadline) while its model never
sends the final flag: the batch is over for the server, later sends are dropped, and an execute
that never returns has its worker killed; a model that merely works on after its final flags is
left alone. Through a real worker process (PythonModelProcess)."""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np
import pytest

from inferd.python_backend import process as process_module
from inferd.python_backend.process import PythonModelProcess, PythonRequest
from tests.unit.test_python_streams_and_calls import process_of

__all__ = ["process_of"]  # the fixture, used by name

# IN[0] says what execute does after sending one response per request: 0 returns without a final
# flag, 1 never returns, 2 sends each final flag and then works on for 1.5 s before returning.
MODEL = """
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        mode = 0
        for request in requests:
            mode = int(pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0])
            sender = request.get_response_sender()
            out = pb_utils.Tensor("OUT", np.array([1], np.int32))
            sender.send(pb_utils.InferenceResponse([out]))
            if mode == 2:
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        if mode == 1:
            time.sleep(3600)
        if mode == 2:
            time.sleep(1.5)
        return None
"""


@pytest.fixture(autouse=True)
def short_graces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(process_module, "CANCELLED_GRACE_S", 0.2)
    monkeypatch.setattr(process_module, "HUNG_EXECUTE_GRACE_S", 0.5)


def _request(mode: int, cancelled: bool) -> PythonRequest:
    return PythonRequest("", {"IN": np.array([mode], np.int32)}, cancelled=lambda: cancelled)


def test_a_cancelled_request_without_its_final_flag_is_ended_by_the_server(
    process_of: Callable[..., PythonModelProcess],
) -> None:
    process = process_of(MODEL, "ended", decoupled=True)
    pid = process.pid
    [final] = process.execute([_request(0, cancelled=True)], lambda index, response: None)
    assert final is not None and final.cancelled and "cancelled" in str(final.error)
    # The worker goes on: the next batch is served by the same process.
    [final] = process.execute([_request(2, cancelled=False)], lambda index, response: None)
    assert final is None  # the final flag alone
    assert process.pid == pid and process.running


def test_an_execute_that_never_returns_after_its_requests_ended_has_its_worker_killed(
    process_of: Callable[..., PythonModelProcess],
) -> None:
    process = process_of(MODEL, "hung", decoupled=True)
    began = time.monotonic()
    [final] = process.execute([_request(1, cancelled=True)], lambda index, response: None)
    assert final is not None and final.cancelled
    assert time.monotonic() - began < 10
    assert not process.running  # killed: the executor restarts it


def test_a_model_that_works_on_after_its_final_flags_is_not_killed(
    process_of: Callable[..., PythonModelProcess],
) -> None:
    process = process_of(MODEL, "works_on", decoupled=True)
    pid = process.pid
    [final] = process.execute([_request(2, cancelled=False)], lambda index, response: None)
    assert final is None
    assert process.pid == pid and process.running  # 1.5 s past the 0.5 s grace, left alone
