"""The core's load generator (``inferd tune`` drives servers with it): ModelInfer from C++, a
closed loop at a concurrency or Poisson arrivals at a rate."""

from __future__ import annotations

from inferd import _core

LoadResult = _core.LoadResult


def generate_load(
    target: str,
    requests: list[bytes],
    *,
    concurrency: int,
    rate: float = 0.0,
    warmup_s: float = 1.0,
    measure_s: float = 5.0,
) -> _core.LoadResult:
    """Sends ``requests`` (serialized ModelInferRequests, in turn) to ``target`` for
    ``warmup_s`` + ``measure_s``; blocks with the GIL released. ``rate`` > 0: open loop, at most
    ``concurrency`` in flight."""
    options = _core.LoadOptions()
    options.target = target
    options.requests = requests
    options.concurrency = concurrency
    options.rate = rate
    options.warmup_s = warmup_s
    options.measure_s = measure_s
    return _core.LoadGenerator.run(options)
