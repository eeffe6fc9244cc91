"""Python's gRPC handlers answer by the core transport's rules: its status table and its cut of a
long message (inferd.transport.status asks inferd.core), so a call answers alike whichever side of
the server it reached."""

from __future__ import annotations

import grpc

import inferd._core as _core
from inferd.errors import ErrorCode, InvalidArgument
from inferd.transport.status import grpc_code, grpc_status


def test_python_numbers_its_error_codes_as_the_core() -> None:
    core_codes = {name: int(code) for name, code in _core.StatusCode.__members__.items()}
    assert core_codes.pop("OK") == 0
    assert core_codes == {code.name: code.value for code in ErrorCode}


def test_each_code_answers_the_grpc_status_of_its_name() -> None:
    # The oracle is the protocol's naming: inferd's codes are named as gRPC's.
    for code in ErrorCode:
        assert grpc_code(code) == grpc.StatusCode[code.name], code


def test_a_long_message_is_cut_as_the_core_cuts_it() -> None:
    long = "é" * 2000  # 4000 UTF-8 bytes
    code, message = grpc_status(InvalidArgument(long))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert message == _core.shown_message(long)
    assert len(message.encode()) <= 1024 and message.endswith("\u2026")
    assert message[:-1] == "é" * len(message[:-1])  # whole characters only
    assert grpc_status(InvalidArgument("short"))[1] == "short"
