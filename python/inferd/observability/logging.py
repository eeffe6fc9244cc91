"""structlog set-up: JSON lines by default, readable console output on a terminal.

Every record made while a request's span is current carries its ``trace_id`` and ``span_id``.
The level and the per-request lines (``verbose``) can change at run time through ``LogControl``
(the ``LogSettings`` RPC), which is why filtering is a processor and not a bound-logger class.
"""

from __future__ import annotations

import logging
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

    def __post_init__(self) -> None:
        self.set_level(self.level)

    def set_level(self, level: str) -> None:
        level = level.lower()
        if level not in LEVELS:
            raise ValueError(f"unknown log level {level!r} (one of {', '.join(LEVELS)})")
        self.level = level
        self._minimum = logging.getLevelNamesMapping()[level.upper()]

    def admits(self, method: str) -> bool:
        return logging.getLevelNamesMapping().get(method.upper(), logging.INFO) >= self._minimum


def _drop_below(control: LogControl) -> structlog.typing.Processor:
    def processor(logger: Any, method: str, event: structlog.typing.EventDict) -> Any:
        if not control.admits(method):
            raise structlog.DropEvent
        return event

    return processor


def _add_trace_ids(logger: Any, method: str, event: structlog.typing.EventDict) -> Any:
    context = trace.get_current_span().get_span_context()
    if context.is_valid:
        event.setdefault("trace_id", format(context.trace_id, "032x"))
        event.setdefault("span_id", format(context.span_id, "016x"))
        return event
    for key, value in REQUEST_METADATA.get() or ():
        # traceparent: version-traceid-parentid-flags; the caller's ids, as it sent them.
        if key == "traceparent" and isinstance(value, str) and value.count("-") == 3:
            _, trace_id, span_id, _ = value.split("-")
            event.setdefault("trace_id", trace_id)
            event.setdefault("parent_span_id", span_id)
    return event


def configure_logging(
    log_format: str = "auto", level: str = "info", verbose: int = 0
) -> LogControl:
    control = LogControl(level, verbose, log_format)
    use_console = log_format == "console" or (log_format == "auto" and sys.stderr.isatty())
    renderer: structlog.typing.Processor = (
        structlog.dev.ConsoleRenderer() if use_console else structlog.processors.JSONRenderer()
    )
    structlog.configure(
        processors=[
            _drop_below(control),
            structlog.contextvars.merge_contextvars,
            _add_trace_ids,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
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
