"""The response cache's own figures (--cache-config), read from the core at scrape time: what it
holds against its size, and what it dropped. Its hits and misses are per model
(``core_metrics.py``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from inferd.core import ResponseCache


class ResponseCacheCollector(Collector):
    """Triton's cache-wide families where it has them (nv_cache_num_entries, nv_cache_util,
    nv_cache_num_evictions), and the bytes behind them."""

    def __init__(self, cache: ResponseCache) -> None:
        self._cache = cache

    def collect(self) -> Iterator[Metric]:
        stats = self._cache.stats()
        yield GaugeMetricFamily(
            "nv_cache_num_entries", "Number of answers the response cache holds", stats.entries
        )
        yield GaugeMetricFamily(
            "nv_cache_util",
            "Fraction of the response cache's size in use",
            stats.bytes / stats.limit_bytes if stats.limit_bytes else 0.0,
        )
        yield GaugeMetricFamily(
            "inferd_cache_bytes",
            "Bytes charged to the answers the response cache holds (keys, tensors, bookkeeping)",
            stats.bytes,
        )
        yield GaugeMetricFamily(
            "inferd_cache_limit_bytes",
            "The response cache's size (--cache-config local,size=BYTES)",
            stats.limit_bytes,
        )
        evictions = Metric(
            "nv_cache_num_evictions",
            "Answers dropped from the response cache to make room (cumulative)",
            "unknown",
        )
        evictions.add_sample("nv_cache_num_evictions", {}, stats.evictions)
        yield evictions
        yield CounterMetricFamily(
            "inferd_cache_rejected",
            "Answers too large for the whole response cache, never kept",
            stats.rejected,
        )
