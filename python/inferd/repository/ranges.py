"""Ranges of the integer config fields that cross into the core as C++ integers, checked once
where the config is checked: a value out of range fails the load with one message shape (the
field, its value, the allowed range), never with pybind11's conversion error or a C++ overflow."""

from __future__ import annotations

from inferd.errors import ModelLoadError

# dynamic_batching.priority_levels: the core keeps two queues per level and walks every one of
# them for each batch it forms (uint32 in the core; a level costs about 1 KB).
MAX_PRIORITY_LEVELS = 1024
# dynamic_batching.max_queue_delay_microseconds: added to a steady-clock time held in int64
# nanoseconds, which a uint64 count of µs overflows. One day is far past any batching delay.
MAX_QUEUE_DELAY_US = 86_400 * 1_000_000
# ONNX Runtime's intra_op_thread_count / inter_op_thread_count parameters (C++ int): threads the
# session starts, each with its own stack.
MAX_THREAD_COUNT = 1024


def check_range(
    field: str, value: int, low: int, high: int, *, model: str = "", reason: str = ""
) -> int:
    """``value`` when ``low <= value <= high``; else raises ModelLoadError "[model 'm': ]FIELD
    VALUE is outside LOW..HIGH[ (REASON)]"."""
    if low <= value <= high:
        return value
    where = f"model {model!r}: " if model else ""
    why = f" ({reason})" if reason else ""
    raise ModelLoadError(f"{where}{field} {value} is outside {low}..{high}{why}")
