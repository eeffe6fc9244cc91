"""The errors inferd answers with, independent of any transport.

Each error names what went wrong from the caller's point of view; ``code`` says what the caller
can do about it. A transport maps codes to its own status codes in one table, the core's
(``grpc_code`` in cpp/src/grpc_status.cpp, which ``inferd.transport.status`` asks); nothing else
does.
"""

from __future__ import annotations

import enum
from typing import ClassVar


class ErrorCode(enum.IntEnum):
    """What kind of failure.

    Numbered as the core's ``inferd::StatusCode`` (cpp/include/inferd/status.h).
    """

    INVALID_ARGUMENT = 1  # the request is wrong; retrying it unchanged will fail again
    NOT_FOUND = 2  # no such model or version
    UNAVAILABLE = 3  # not ready, unloading or shutting down: try again elsewhere or later
    RESOURCE_EXHAUSTED = 4  # back-pressure: the server is healthy but full, retry later
    DEADLINE_EXCEEDED = 5  # the caller's deadline passed before an answer
    CANCELLED = 6  # the caller went away
    INTERNAL = 7  # a bug or an executor failure; the server keeps serving
    UNIMPLEMENTED = 8  # a protocol feature inferd does not offer
    FAILED_PRECONDITION = 9  # not allowed in the server's current configuration
    ALREADY_EXISTS = 10  # a name already taken (a shared-memory region)
    PERMISSION_DENIED = 11  # not allowed on this listener


class InferdError(Exception):
    """Base of every error inferd answers a request with."""

    code: ClassVar[ErrorCode] = ErrorCode.INTERNAL


class InvalidArgument(InferdError):
    code = ErrorCode.INVALID_ARGUMENT


class NotFound(InferdError):
    code = ErrorCode.NOT_FOUND


class Unavailable(InferdError):
    code = ErrorCode.UNAVAILABLE


class ResourceExhausted(InferdError):
    code = ErrorCode.RESOURCE_EXHAUSTED


class DeadlineExceeded(InferdError):
    code = ErrorCode.DEADLINE_EXCEEDED


class Cancelled(InferdError):
    code = ErrorCode.CANCELLED


class Internal(InferdError):
    code = ErrorCode.INTERNAL


class Unimplemented(InferdError):
    code = ErrorCode.UNIMPLEMENTED


class FailedPrecondition(InferdError):
    code = ErrorCode.FAILED_PRECONDITION


class AlreadyExists(InferdError):
    code = ErrorCode.ALREADY_EXISTS


class PermissionDenied(InferdError):
    code = ErrorCode.PERMISSION_DENIED


class ModelLoadError(InferdError):
    """A model version could not be loaded: its config, its files or its executor."""

    code = ErrorCode.INVALID_ARGUMENT


_BY_CODE: dict[ErrorCode, type[InferdError]] = {
    cls.code: cls
    for cls in (
        InvalidArgument,
        NotFound,
        Unavailable,
        ResourceExhausted,
        DeadlineExceeded,
        Cancelled,
        Internal,
        Unimplemented,
        FailedPrecondition,
        AlreadyExists,
        PermissionDenied,
    )
}


def error_for_code(code: int, message: str) -> InferdError:
    """The error for a status code reported by the core; unknown codes are INTERNAL."""
    try:
        cls = _BY_CODE[ErrorCode(code)]
    except ValueError:
        cls = Internal
    return cls(message)
