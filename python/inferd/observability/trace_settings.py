"""Triton's trace settings (the TraceSetting call, on gRPC and HTTP alike) over inferd's
OpenTelemetry sampling: read and changed at run time, globally or per model.

Keys, as Triton's opentelemetry trace mode has them:

- ``trace_level``: ``["OFF"]`` traces nothing (not even a request whose caller's parent was
  sampled); ``["TIMESTAMPS"]`` traces. ``TENSORS`` is refused: spans carry times, not tensors.
- ``trace_rate``: N, one request in N starts a trace (the sampler's ratio becomes 1/N; 0: none).
  A ``parentbased_`` sampler still follows a caller's sampled flag, as OpenTelemetry's do. Until
  it is set, the configured sampler's ratio applies, reported as the nearest whole N.
- ``trace_count``: the traces left to take (-1: unlimited); once spent, nothing is traced. Its
  budget is shared by the core and Python, and the value read back is what is left.
- ``trace_mode``: ``opentelemetry``, the only one; setting it to that is accepted.
- ``log_frequency``: accepted (a whole number, as Triton checks it) with no effect: spans leave
  through OpenTelemetry's batch processor, not in trace files. Not reported, as Triton's
  opentelemetry mode does not report it.
- ``trace_file``: refused (UNIMPLEMENTED, Triton's message): there are no trace files.

A model's setting overrides the global one; a setting given with no value clears the override
(a model's goes back to the global value, a global one to the value at start). An update is checked
whole before any of it applies. Used on the event loop's thread.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

from inferd.core import TraceBudget
from inferd.errors import FailedPrecondition, InvalidArgument, Unimplemented
from inferd.observability.tracing import CoreSampledSampler, SamplingRule

Setting = dict[str, list[str]]

_UINT32_MAX = 2**32 - 1
_INT32_MAX = 2**31 - 1
_INTEGER = re.compile(r"-?[0-9]+")
MODE = "opentelemetry"
KEYS = ("trace_level", "trace_rate", "trace_count", "trace_mode", "log_frequency", "trace_file")


class _Clear:
    """A setting given with no value: its override is removed."""


_CLEAR = _Clear()
# A value of a scope's overrides: a level, a rate, a count's budget (None: unlimited).
_Value = tuple[str, ...] | int | TraceBudget | None


class TraceSettings:
    """The trace settings in force, over ``sampler`` (None: tracing is off, and cannot be turned
    on at run time: there is no exporter). ``apply`` hands the sampler the rules they make, global
    and per model; the core's snapshot reads them from it when republished."""

    def __init__(self, sampler: CoreSampledSampler | None) -> None:
        self._sampler = sampler
        rule = sampler.rule if sampler is not None else None
        self._parent_based = rule.parent_based if rule is not None else False
        self._configured_ratio = rule.ratio if rule is not None else 0.0
        # The values at start; trace_rate None: the configured ratio.
        self._initial: dict[str, _Value] = {
            "trace_level": ("TIMESTAMPS",) if rule is not None else ("OFF",),
            "trace_rate": None,
            "trace_count": None,
        }
        self._global: dict[str, _Value] = {}
        self._models: dict[str, dict[str, _Value]] = {}

    def current(self, model: str = "") -> Setting:
        """Every setting in force for ``model`` ("" = the global ones)."""
        level = self._value(model, "trace_level")
        rate = self._value(model, "trace_rate")
        budget = self._value(model, "trace_count")
        assert isinstance(level, tuple) and (rate is None or isinstance(rate, int))
        return {
            "trace_level": list(level),
            "trace_rate": [str(_rate_of(self._configured_ratio) if rate is None else rate)],
            "trace_count": [str(budget.remaining if isinstance(budget, TraceBudget) else -1)],
            "trace_mode": [MODE],
        }

    def update(self, model: str, changes: Mapping[str, Sequence[str]]) -> Setting:
        """Applies ``changes`` to ``model``'s settings ("" = the global ones) and returns every
        setting then in force for it. Raises InvalidArgument for an unknown key or a bad value,
        Unimplemented for trace_file, FailedPrecondition while tracing is off; then nothing
        changed."""
        if not changes:
            return self.current(model)
        parsed = {key: _parse(key, list(values)) for key, values in changes.items()}
        if self._sampler is None:
            raise FailedPrecondition(
                "tracing is off: start inferd with --trace-config endpoint=HOST:PORT or "
                "OTEL_EXPORTER_OTLP_ENDPOINT to change trace settings"
            )
        scope = self._models.setdefault(model, {}) if model else self._global
        for key, value in parsed.items():
            if key in ("trace_mode", "log_frequency"):
                continue  # checked, no effect (see the module's docstring)
            if isinstance(value, _Clear):
                scope.pop(key, None)
            elif key == "trace_count":
                assert isinstance(value, int)
                scope[key] = TraceBudget(value) if value >= 0 else None
            else:
                scope[key] = value
        if model and not scope:
            del self._models[model]
        self._apply()
        return self.current(model)

    def rule(self, model: str = "") -> SamplingRule:
        """The rule that samples ``model``'s requests ("" = those of every other model)."""
        level = self._value(model, "trace_level")
        rate = self._value(model, "trace_rate")
        budget = self._value(model, "trace_count")
        if level == ("OFF",):
            return SamplingRule(parent_based=False, ratio=0.0)
        assert rate is None or isinstance(rate, int)
        ratio = self._configured_ratio if rate is None else (1.0 / rate if rate else 0.0)
        return SamplingRule(
            self._parent_based, ratio, budget if isinstance(budget, TraceBudget) else None
        )

    def _apply(self) -> None:
        assert self._sampler is not None
        self._sampler.configure(self.rule(), {model: self.rule(model) for model in self._models})

    def _value(self, model: str, key: str) -> _Value:
        for scope in (self._models.get(model, {}), self._global, self._initial):
            if key in scope:
                return scope[key]
        raise KeyError(key)


def _rate_of(ratio: float) -> int:
    """The whole N closest to one in 1/``ratio`` (0: no new trace)."""
    return 0 if ratio <= 0.0 else max(1, round(1.0 / ratio))


def _parse(key: str, values: list[str]) -> _Value | _Clear:
    """One setting's values, checked as Triton checks them; no values: clear it."""
    if key == "trace_file":
        raise Unimplemented("trace file location can not be updated through network protocol")
    if key not in KEYS:
        raise InvalidArgument(
            f"unknown trace setting '{key}' (trace_level, trace_rate, trace_count, trace_mode, "
            "log_frequency)"
        )
    if not values:
        return _CLEAR
    if key == "trace_level":
        return _level(values)
    if len(values) != 1:
        raise InvalidArgument(f"expect only 1 value for '{key}'")
    value = values[0]
    if key == "trace_mode":
        if value != MODE:
            raise InvalidArgument(
                f"trace_mode is '{MODE}', the only mode inferd traces in; got: {value}"
            )
        return None  # checked: the one mode there is
    low, high = (-1, _INT32_MAX) if key == "trace_count" else (0, _UINT32_MAX)
    if not _INTEGER.fullmatch(value):
        raise InvalidArgument(f"Unable to parse '{key}', got: {value}")
    number = int(value)
    if not low <= number <= high:
        if key == "trace_count" and number < low:
            raise InvalidArgument(
                f"Unable to parse '{key}'. Expecting value >= {low}, got: {value}"
            )
        raise InvalidArgument(
            f"Unable to parse '{key}', value is out of range [ {low}, {high} ], got: {value}"
        )
    return number


def _level(values: list[str]) -> tuple[str, ...]:
    for level in values:
        if level == "OFF" and len(values) > 1:
            raise InvalidArgument("Expect only one trace level 'OFF' is specified")
        if level == "TENSORS":
            raise InvalidArgument(
                "trace level 'TENSORS' is not supported in opentelemetry mode: spans carry "
                "timestamps, not tensors"
            )
        if level not in ("OFF", "TIMESTAMPS"):
            raise InvalidArgument(f"unknown trace level '{level}' (OFF, TIMESTAMPS)")
    return tuple(dict.fromkeys(values))  # TIMESTAMPS given twice is TIMESTAMPS
