"""Triton's ``--cache-config`` as inferd reads it: the local cache and its size in bytes. Pure
Python, so that the command line checks it before anything starts."""

from __future__ import annotations

from inferd.errors import InferdError

CACHE_FLAG = "--cache-config"


class CacheConfigError(InferdError):
    """A --cache-config inferd cannot serve."""


def cache_size(config: str) -> int | None:
    """The byte size ``config`` gives the cache, in Triton's syntax ``local,size=BYTES``; None
    for an empty config (no cache). Triton's other caches (redis) are refused naming the one that
    is served."""
    if not config:
        return None
    name, _, settings = config.partition(",")
    if name != "local":
        raise CacheConfigError(
            f"{CACHE_FLAG} {config!r}: inferd has the local cache only "
            f"({CACHE_FLAG} local,size=BYTES), not {name!r}"
        )
    size: int | None = None
    for setting in filter(None, settings.split(",")):
        key, _, value = setting.partition("=")
        if key != "size":
            raise CacheConfigError(
                f"{CACHE_FLAG} {config!r}: the local cache takes size=BYTES only, not {key!r}"
            )
        try:
            size = int(value)
        except ValueError:
            raise CacheConfigError(
                f"{CACHE_FLAG} {config!r}: size must be a whole number of bytes, not {value!r}"
            ) from None
        if size < 0:
            raise CacheConfigError(f"{CACHE_FLAG} {config!r}: size must not be negative")
    if size is None:
        raise CacheConfigError(f"{CACHE_FLAG} {config!r}: say its size (local,size=BYTES)")
    return size
