"""The server's response cache (Triton's ``--cache-config local,size=BYTES``): the core keeps
successful answers of the models whose config says ``response_cache { enable: true }``, by their
requests' full keys, least recently used out first."""

from __future__ import annotations

from inferd import _core
from inferd.cache_config import cache_size

ResponseCache = _core.ResponseCache
ResponseCacheStats = _core.ResponseCacheStats


def response_cache(config: str) -> _core.ResponseCache | None:
    """The cache ``config`` asks for; None without one (an empty config, or size 0, which
    Triton also takes as no cache)."""
    size = cache_size(config)
    return ResponseCache(size) if size else None
