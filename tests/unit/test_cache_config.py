"""--cache-config as Triton writes it (local,size=BYTES), and what inferd refuses of it."""

from __future__ import annotations

import pytest

from inferd.cache_config import CacheConfigError, cache_size
from inferd.core import response_cache
from inferd.triton_flags import translate


@pytest.mark.parametrize(
    ("config", "size"),
    [("", None), ("local,size=1048576", 1048576), ("local,size=0", 0), ("local,size=1,", 1)],
)
def test_the_local_cache_and_its_size(config: str, size: int | None) -> None:
    assert cache_size(config) == size


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ("redis,host=localhost", "inferd has the local cache only"),
        ("local", r"say its size \(local,size=BYTES\)"),
        ("local,size=1MB", "size must be a whole number of bytes, not '1MB'"),
        ("local,size=-1", "size must not be negative"),
        ("local,capacity=5", "the local cache takes size=BYTES only, not 'capacity'"),
    ],
)
def test_what_inferd_cannot_serve_is_refused_naming_it(config: str, message: str) -> None:
    with pytest.raises(CacheConfigError, match=message):
        cache_size(config)


def test_no_cache_without_a_size_and_one_of_that_size_with_it() -> None:
    assert response_cache("") is None
    assert response_cache("local,size=0") is None  # Triton: size 0 is no cache
    cache = response_cache("local,size=4096")
    assert cache is not None
    assert cache.stats().limit_bytes == 4096
    assert cache.stats().entries == 0


def test_triton_s_cache_flags_are_inferd_s() -> None:
    assert translate(["--cache-config", "local,size=100"]).args == [
        "--cache-config",
        "local,size=100",
    ]
    # Triton's deprecated flag: its byte size becomes the local cache's.
    assert translate(["--response-cache-byte-size", "2048"]).args == [
        "--cache-config=local,size=2048"
    ]
