"""The two transports' status tables agree: the core's gRPC server (C++) answers the status that
inferd.transport.status.GRPC_CODES gives Python's handlers, for every code the core produces."""

from __future__ import annotations

import inferd._core as _core
from inferd.errors import ErrorCode
from inferd.transport.status import GRPC_CODES


def test_core_and_python_map_every_core_status_code_alike() -> None:
    checked = 0
    for name, code in _core.StatusCode.__members__.items():
        if name == "OK":
            assert _core.grpc_status_code(code) == 0
            continue
        expected = GRPC_CODES[ErrorCode[name]].value[0]
        assert _core.grpc_status_code(code) == expected, name
        checked += 1
    assert checked == len(_core.StatusCode.__members__) - 1 >= 8
