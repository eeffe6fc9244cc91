"""How Python's gRPC handlers answer inferd's errors: by the core transport's status table and
message cut (``inferd.core``: one rule for both sides of the server), and the guard every handler
uses."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
import structlog

from inferd import core
from inferd.errors import ErrorCode, InferdError
from inferd.observability.logging import already_logged

log = structlog.get_logger(__name__)

# grpc's own numbering of its codes: the table from inferd's codes to them is the core's.
_GRPC_CODE_BY_NUMBER = {code.value[0]: code for code in grpc.StatusCode}

R = TypeVar("R")


def grpc_code(code: ErrorCode) -> grpc.StatusCode:
    """The gRPC status an error of ``code`` answers with: the core transport's own table, so that
    a call answers alike whichever side of the server it reached."""
    return _GRPC_CODE_BY_NUMBER[core.grpc_status_code(core.StatusCode(code.value))]


def grpc_status(
    error: BaseException, *, log_unexpected: bool = True
) -> tuple[grpc.StatusCode, str]:
    """The status a failed call answers with. Unknown exceptions are bugs: INTERNAL, and logged
    (with ``log_unexpected``) unless their request's record has been written already."""
    if isinstance(error, InferdError):
        return grpc_code(error.code), core.shown_message(str(error))
    if log_unexpected and not already_logged(error):
        log.exception("unexpected error in a request handler", exc_info=error)
    return grpc.StatusCode.INTERNAL, core.shown_message(
        f"internal error: {type(error).__name__}: {error}"
    )


def answers_errors(
    handler: Callable[..., Awaitable[R]],
) -> Callable[..., Awaitable[R]]:
    """Turns exceptions raised by a unary handler into the call's gRPC status."""

    @functools.wraps(handler)
    async def guarded(self: Any, request: Any, context: grpc.aio.ServicerContext) -> R:
        try:
            return await handler(self, request, context)
        except Exception as e:
            code, message = grpc_status(e)
            await context.abort(code, message)
            raise  # unreachable: abort raises

    return guarded
