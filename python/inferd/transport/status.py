"""The one table from inferd's errors to gRPC status codes, and the guard every handler uses."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
import structlog

from inferd.errors import ErrorCode, InferdError
from inferd.observability.logging import already_logged

log = structlog.get_logger(__name__)

GRPC_CODES: dict[ErrorCode, grpc.StatusCode] = {
    ErrorCode.INVALID_ARGUMENT: grpc.StatusCode.INVALID_ARGUMENT,
    ErrorCode.NOT_FOUND: grpc.StatusCode.NOT_FOUND,
    ErrorCode.UNAVAILABLE: grpc.StatusCode.UNAVAILABLE,
    ErrorCode.RESOURCE_EXHAUSTED: grpc.StatusCode.RESOURCE_EXHAUSTED,
    ErrorCode.DEADLINE_EXCEEDED: grpc.StatusCode.DEADLINE_EXCEEDED,
    ErrorCode.CANCELLED: grpc.StatusCode.CANCELLED,
    ErrorCode.INTERNAL: grpc.StatusCode.INTERNAL,
    ErrorCode.UNIMPLEMENTED: grpc.StatusCode.UNIMPLEMENTED,
    ErrorCode.FAILED_PRECONDITION: grpc.StatusCode.FAILED_PRECONDITION,
}

R = TypeVar("R")


def grpc_status(
    error: BaseException, *, log_unexpected: bool = True
) -> tuple[grpc.StatusCode, str]:
    """The status a failed call answers with. Unknown exceptions are bugs: INTERNAL, and logged
    (with ``log_unexpected``) unless their request's record has been written already."""
    if isinstance(error, InferdError):
        return GRPC_CODES[error.code], str(error)
    if log_unexpected and not already_logged(error):
        log.exception("unexpected error in a request handler", exc_info=error)
    return grpc.StatusCode.INTERNAL, f"internal error: {type(error).__name__}: {error}"


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
