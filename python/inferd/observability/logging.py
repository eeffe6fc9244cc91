"""structlog set-up: JSON lines by default, readable console output on a terminal.

Every record made while a request's span is current carries its ``trace_id`` and ``span_id``.
The level and the per-request lines (``verbose``) can change at run time through ``LogControl``
(the ``LogSettings`` RPC), which is why filtering is a processor and not a bound-logger class.

Every line the process writes to stderr has one shape: records of the standard library's
``logging`` (the OpenTelemetry exporter's) are rendered by the same processors
(``ProcessorFormatter``), and ONNX Runtime's own records, from the core's native executor, are
written by the core in the same shape (logger ``onnxruntime``), all at the level ``LogControl``
sets.
"""

from __future__ import annotations

import contextlib
import logging
import re
import sys
from collections.abc import Mapping, Sequence
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar

import structlog
from opentelemetry import trace

LEVELS = ("debug", "info", "warning", "error", "critical")

# The gRPC metadata of the request being handled, when tracing is off: a record made inside it
# still carries the caller's trace id (from its traceparent), read only when a record is made.
REQUEST_METADATA: ContextVar[Sequence[tuple[str, Any]] | None] = ContextVar(
    "inferd_request_metadata", default=None
)


@dataclass
class LogControl:
    """What is logged now: records below ``level`` are dropped; ``verbose`` > 0 adds a line for
    every request. Owned by the server; changed on the event loop's thread."""

    level: str = "info"
    verbose: int = 0
    log_format: str = "auto"
    json: bool = True  # whether lines are JSON (else console lines): configure_logging decides

    def __post_init__(self) -> None:
        self.set_level(self.level)

    def set_level(self, level: str) -> None:
        level = level.lower()
        if level not in LEVELS:
            raise ValueError(f"unknown log level {level!r} (one of {', '.join(LEVELS)})")
        self.level = level
        self._minimum = logging.getLevelNamesMapping()[level.upper()]
        if _ACTIVE.get("control") is self:
            _apply_to_other_loggers(self)

    def admits(self, method: str) -> bool:
        return logging.getLevelNamesMapping().get(method.upper(), logging.INFO) >= self._minimum


# The control configure_logging made last: its level also applies to stdlib logging and to ONNX
# Runtime's records (a LogControl made elsewhere, as in tests, changes nothing global).
_ACTIVE: dict[str, LogControl] = {}

# The core's levels (its own records: the transport's INTERNAL failures, ONNX Runtime's).
_CORE_LEVEL = {"debug": 0, "info": 1, "warning": 2, "error": 3, "critical": 4}
# ONNX Runtime's severities (OrtLoggingLevel) kept at each level: its info records are debug ones.
_ONNXRUNTIME_SEVERITY = {"debug": 1, "info": 2, "warning": 2, "error": 3, "critical": 4}


def _apply_to_other_loggers(control: LogControl) -> None:
    logging.getLogger().setLevel(logging.getLevelNamesMapping()[control.level.upper()])
    from inferd import core  # deferred: the core package's modules log through this one

    core.set_core_logging(_CORE_LEVEL[control.level], control.json)
    core.set_onnxruntime_logging(_ONNXRUNTIME_SEVERITY[control.level])


class _StructlogHandler(logging.Handler):
    """Writes stdlib records, rendered by a ``ProcessorFormatter``, to stderr through structlog's
    ``WriteLogger``, whose lock keeps them from cutting into structlog's own lines."""

    def __init__(self) -> None:
        super().__init__()
        self._writer = structlog.WriteLogger(file=sys.stderr)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self._writer.msg(self.format(record))
        except Exception:  # as logging's handlers do: a record that cannot be written is lost
            self.handleError(record)


def _drop_below(control: LogControl) -> structlog.typing.Processor:
    def processor(logger: Any, method: str, event: structlog.typing.EventDict) -> Any:
        if not control.admits(method):
            raise structlog.DropEvent
        return event

    return processor


_LOGGED = "_inferd_logged"


def mark_logged(error: BaseException) -> None:
    """``error`` has had its record: whoever sees it next (the transport's guard) logs no other."""
    # An exception type without attributes of its own is logged twice.
    with contextlib.suppress(AttributeError):
        setattr(error, _LOGGED, True)


def already_logged(error: BaseException) -> bool:
    return bool(getattr(error, _LOGGED, False))


# W3C trace-context's traceparent, as the core's parse_traceparent (trace_sampling.cpp) reads it:
# version-traceid-parentid-flags in lowercase hex, a later version's fields after a "-", blanks
# around. Anything else is the caller's text, not ids: it never reaches a log record.
_TRACEPARENT = re.compile(
    r"[ \t]*(?!ff)([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}(-[^\n\r]*)?[ \t]*"
)
_TRACEPARENT_MAX_LENGTH = 512


def parse_traceparent(value: object) -> tuple[str, str] | None:
    """(trace id, parent span id) of a valid ``traceparent`` header value, else None."""
    if not isinstance(value, str) or len(value) > _TRACEPARENT_MAX_LENGTH:
        return None
    match = _TRACEPARENT.fullmatch(value)
    if match is None:
        return None
    version, trace_id, span_id, extra = match.groups()
    if version == "00" and extra is not None:  # version 00 has no more fields
        return None
    if trace_id == "0" * 32 or span_id == "0" * 16:  # the invalid ids
        return None
    return trace_id, span_id


def _caller_ids(metadata: Sequence[tuple[str, Any]] | None) -> tuple[str, str] | None:
    for key, value in metadata or ():
        if key == "traceparent":
            return parse_traceparent(value)
    return None


def caller_trace_id(metadata: Sequence[tuple[str, Any]] | None) -> str | None:
    """The trace id of the caller's ``traceparent`` (gRPC metadata), or None when it sent none
    or one that is not valid."""
    ids = _caller_ids(metadata)
    return None if ids is None else ids[0]


def _add_trace_ids(logger: Any, method: str, event: structlog.typing.EventDict) -> Any:
    context = trace.get_current_span().get_span_context()
    if context.is_valid:
        event.setdefault("trace_id", format(context.trace_id, "032x"))
        event.setdefault("span_id", format(context.span_id, "016x"))
        return event
    # The caller's ids, once validated.
    if (ids := _caller_ids(REQUEST_METADATA.get())) is not None:
        event.setdefault("trace_id", ids[0])
        event.setdefault("parent_span_id", ids[1])
    return event


def configure_logging(
    log_format: str = "auto", level: str = "info", verbose: int = 0
) -> LogControl:
    """Sets up structlog, the standard library's root logger (its records rendered as structlog's,
    e.g. the OpenTelemetry exporter's) and the core's writer of ONNX Runtime's records: one
    format and one level for every line on stderr. Returns the control that changes the level."""
    control = LogControl(level, verbose, log_format)
    use_console = log_format == "console" or (log_format == "auto" and sys.stderr.isatty())
    control.json = not use_console
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer() if use_console else structlog.processors.JSONRenderer()
    )
    timestamper = structlog.processors.TimeStamper(fmt="iso", utc=True)
    structlog.configure(
        processors=[
            _drop_below(control),
            structlog.contextvars.merge_contextvars,
            _add_trace_ids,
            structlog.processors.add_log_level,
            timestamper,
            structlog.processors.format_exc_info,
            renderer,
        ],
        # WriteLogger, not PrintLogger: print() writes the line and its newline in two writes,
        # between which the core's own line (written by another thread) can land, unbuffered.
        logger_factory=structlog.WriteLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )

    # Records of the standard library's logging: the root logger's one handler renders them as
    # structlog renders its own (the root logger's level is the control's, so that records below
    # it are not even made).
    handler = _StructlogHandler()
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=[
                structlog.stdlib.add_logger_name,
                _add_trace_ids,
                structlog.processors.add_log_level,
                timestamper,
                structlog.processors.format_exc_info,
            ],
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        )
    )
    root = logging.getLogger()
    for old in root.handlers[:]:
        if isinstance(old, _StructlogHandler):  # an earlier configure_logging's
            root.removeHandler(old)
    root.addHandler(handler)

    _ACTIVE["control"] = control
    _apply_to_other_loggers(control)
    return control


LogSettingValue = bool | int | str
_T = TypeVar("_T")


def apply_log_settings(
    control: LogControl, changes: Mapping[str, object]
) -> dict[str, LogSettingValue]:
    """Applies Triton's ``LogSettings`` keys and returns every setting as it now is.

    ``log_info`` / ``log_warning`` / ``log_error`` (bool) set the threshold to the lowest level
    left on (a threshold, not independent switches: all off keeps only critical records);
    ``log_verbose_level`` (uint) > 0 logs every request. ``log_file`` and ``log_format`` are
    fixed at start (stderr, ``--log-format``): asking to change them is an error."""
    from inferd.errors import InvalidArgument

    def expect(key: str, value: object, kind: type[_T]) -> _T:
        if type(value) is not kind:  # not isinstance: a bool is no verbose level
            raise InvalidArgument(f"log setting {key!r} takes a {kind.__name__} value")
        return value

    level_switches = {"log_info": "info", "log_warning": "warning", "log_error": "error"}
    current = {key: control.admits(level) for key, level in level_switches.items()}
    verbose = control.verbose
    for key, value in changes.items():
        if key in level_switches:
            current[key] = expect(key, value, bool)
        elif key == "log_verbose_level":
            verbose = expect(key, value, int)
        elif key == "log_file":
            if value != "":
                raise InvalidArgument("log_file cannot be set: inferd logs to stderr")
        elif key == "log_format":
            if value not in ("default", control.log_format):
                raise InvalidArgument("log_format is fixed at start (--log-format)")
        else:
            raise InvalidArgument(
                f"unknown log setting {key!r} (log_info, log_warning, log_error, "
                "log_verbose_level, log_file, log_format)"
            )
    enabled = [level for key, level in level_switches.items() if current[key]]
    if control.level == "debug" and current["log_info"]:
        enabled.insert(0, "debug")
    control.set_level(enabled[0] if enabled else "critical")
    control.verbose = verbose
    return {
        **{key: control.admits(level) for key, level in level_switches.items()},
        "log_verbose_level": control.verbose,
        "log_file": "",
        "log_format": control.log_format,
    }
