"""The client's side of Triton's system shared memory, as a user of tritonclient has it: regions
made with ``tritonclient.utils.shared_memory`` (POSIX objects in /dev/shm) and a client over the
server's Unix socket, where inferd serves shared memory by default (--shared-memory-listeners).

tritonclient 2.41's ``utils.shared_memory`` finds its C library through ``pkg_resources``, which
setuptools 81 removed: the dev extra pins setuptools below 81 (docs/shared-memory.md). Setuptools
80 warns at that import (UserWarning, "pkg_resources is deprecated as an API"); it is ignored here,
for that one import and that one message, since pytest makes every warning an error.
"""

from __future__ import annotations

import contextlib
import os
import uuid
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

with warnings.catch_warnings():
    warnings.filterwarnings(
        "ignore", message="pkg_resources is deprecated as an API", category=UserWarning
    )
    import tritonclient.utils.shared_memory as shm

from tests.integration.conftest import ServerProcess

__all__ = [
    "Region",
    "client_region",
    "expect_error",
    "shm",
    "truncate",
    "unix_client",
]


def unix_client(server: ServerProcess) -> grpcclient.InferenceServerClient:
    """tritonclient over the server's Unix socket (tritonclient passes the url to grpc as is)."""
    return grpcclient.InferenceServerClient(f"unix://{server.unix_socket}")


class Region:
    """A POSIX shared-memory object this process made and mapped (tritonclient's handle)."""

    def __init__(self, name: str, key: str, byte_size: int, handle: Any) -> None:
        self.name = name  # the region's name on the server
        self.key = key  # the object's name, as shm_open takes it ("/inferd-...")
        self.byte_size = byte_size
        self.handle = handle

    @property
    def path(self) -> Path:
        """The object as a file (Linux keeps POSIX shared memory in /dev/shm)."""
        return Path("/dev/shm") / self.key.lstrip("/")


@contextlib.contextmanager
def client_region(name: str, byte_size: int) -> Iterator[Region]:
    """A new object of ``byte_size`` bytes with a key of its own, unlinked when the block ends
    (the server's mapping, if it still holds one, outlives the name)."""
    key = f"/inferd-test-{name}-{uuid.uuid4().hex[:12]}"
    handle = shm.create_shared_memory_region(name, key, byte_size)
    try:
        yield Region(name, key, byte_size, handle)
    finally:
        shm.destroy_shared_memory_region(handle)


def truncate(region: Region, size: int = 0) -> None:
    """Shrinks the object under the server's mapping, as a hostile client would (ftruncate on the
    object's descriptor). This process must not touch its own mapping of it afterwards."""
    fd = os.open(region.path, os.O_RDWR)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)


def expect_error(call: Callable[[], object], status: str) -> str:
    """Runs ``call``, which must fail with gRPC status ``status`` (e.g. "INVALID_ARGUMENT");
    returns the error's message."""
    with pytest.raises(InferenceServerException) as raised:
        call()
    assert raised.value.status() == f"StatusCode.{status}", (
        raised.value.status(),
        raised.value.message(),
    )
    message = raised.value.message()
    assert isinstance(message, str) and message, "an error without a message"
    return message
