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
    ErrorCode.ALREADY_EXISTS: grpc.StatusCode.ALREADY_EXISTS,
    ErrorCode.PERMISSION_DENIED: grpc.StatusCode.PERMISSION_DENIED,
}

# The longest status message a client gets, in UTF-8 bytes, as the core's transport cuts its own
# (kMaxStatusMessageBytes in grpc_calls.h): messages echo names the client sent, and a status past
# gRPC's metadata limit reaches the client as RESOURCE_EXHAUSTED instead of what it is.
MAX_STATUS_MESSAGE_BYTES = 1024

R = TypeVar("R")


def shown_message(message: str) -> str:
    """``message``, or its first whole characters and an ellipsis, within the limit."""
    encoded = message.encode("utf-8", errors="replace")
    if len(encoded) <= MAX_STATUS_MESSAGE_BYTES:
        return message
    cut = encoded[: MAX_STATUS_MESSAGE_BYTES - 3].decode("utf-8", errors="ignore")
    return cut + "\u2026"


def grpc_status(
    error: BaseException, *, log_unexpected: bool = True
) -> tuple[grpc.StatusCode, str]:
    """The status a failed call answers with. Unknown exceptions are bugs: INTERNAL, and logged
    (with ``log_unexpected``) unless their request's record has been written already."""
    if isinstance(error, InferdError):
        return GRPC_CODES[error.code], shown_message(str(error))
    if log_unexpected and not already_logged(error):
        log.exception("unexpected error in a request handler", exc_info=error)
    return grpc.StatusCode.INTERNAL, shown_message(
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
