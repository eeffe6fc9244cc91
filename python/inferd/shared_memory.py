"""Triton's shared-memory extensions as this server offers them: clients register regions of their
own memory (POSIX shared-memory objects, CUDA IPC handles) by name, and requests then name a region
instead of carrying a tensor's bytes.

The regions live in the core's ``SharedMemoryRegistry`` (``cpp/include/inferd/shared_memory.h``),
which checks every key, bound and limit; this module switches the kinds on and off, runs the calls
that map or unmap off the event loop and turns the core's status codes into domain errors. Knows
nothing of gRPC."""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass

from inferd.core import SharedMemoryRegistry
from inferd.errors import Unimplemented, error_for_code


class SharedMemoryKind(enum.Enum):
    SYSTEM = "system"  # POSIX shared-memory objects
    CUDA = "cuda"  # CUDA IPC handles


@dataclass(frozen=True)
class PeerCredentials:
    """A client on the Unix socket, as the kernel recorded it when it connected (SO_PEERCRED)."""

    pid: int
    uid: int
    gid: int


@dataclass(frozen=True)
class SharedMemoryRegion:
    """One registered region as the *SharedMemoryStatus calls report it."""

    name: str
    key: str  # system: the object's name
    offset: int  # system: where the region starts in the object
    byte_size: int
    device_id: int  # cuda


class SharedMemory:
    """The server's registered regions and which kinds clients may register (``--shared-memory``).

    ``core`` is the registry the core's gRPC server and the schedulers read requests' regions
    from; it is the same one these calls change."""

    def __init__(self, mode: str, *, max_regions: int, max_bytes: int) -> None:
        """``mode``: none, system, cuda or all. Raises ValueError for a mode or a limit it cannot
        take, naming the flag."""
        if mode not in ("none", "system", "cuda", "all"):
            raise ValueError(f"--shared-memory must be none, system, cuda or all, not {mode!r}")
        if max_regions < 0:
            raise ValueError(f"--shared-memory-max-regions must be >= 0, not {max_regions}")
        if max_bytes < 0:
            raise ValueError(f"--shared-memory-max-bytes must be >= 0, not {max_bytes}")
        self._enabled = {
            SharedMemoryKind.SYSTEM: mode in ("system", "all"),
            SharedMemoryKind.CUDA: mode in ("cuda", "all"),
        }
        self.core = SharedMemoryRegistry(
            self._enabled[SharedMemoryKind.SYSTEM],
            self._enabled[SharedMemoryKind.CUDA],
            max_regions,
            max_bytes,
        )

    @property
    def enabled(self) -> bool:
        """Whether clients may use any kind."""
        return any(self._enabled.values())

    def extensions(self) -> list[str]:
        """The protocol extensions these kinds add to ServerMetadata's list."""
        return [f"{kind.value}_shared_memory" for kind, enabled in self._enabled.items() if enabled]

    async def register_system(
        self,
        name: str,
        key: str,
        offset: int,
        byte_size: int,
        caller: PeerCredentials | None = None,
    ) -> None:
        """Maps [offset, offset + byte_size) of the POSIX shared-memory object ``key`` as region
        ``name``. ``caller``: a client on this machine, who must be able to open the object for
        reading and writing itself (None: a TCP client, trusted by --shared-memory-listeners all).
        InvalidArgument (bad key, region outside the object), AlreadyExists (a live name),
        PermissionDenied (the caller may not use the object), ResourceExhausted (past a limit),
        Unimplemented (switched off)."""
        self._check_enabled(SharedMemoryKind.SYSTEM)
        who = None if caller is None else (caller.pid, caller.uid, caller.gid)
        # mmap and shm_open may block (the core releases the GIL): off the event loop.
        code, message = await asyncio.to_thread(
            self.core.register_system, name, key, offset, byte_size, who
        )
        _raise_unless_ok(code, message)

    async def register_cuda(
        self, name: str, raw_handle: bytes, device_id: int, byte_size: int
    ) -> None:
        """Opens the CUDA IPC handle ``raw_handle`` on ``device_id`` as region ``name``. Errors as
        ``register_system``; Unimplemented too where there is no CUDA."""
        self._check_enabled(SharedMemoryKind.CUDA)
        code, message = await asyncio.to_thread(
            self.core.register_cuda, name, raw_handle, device_id, byte_size
        )
        _raise_unless_ok(code, message)

    async def unregister(self, kind: SharedMemoryKind, name: str) -> None:
        """Region ``name`` of ``kind``, or every region of ``kind`` when ``name`` is empty; an
        unknown name is no error (as in Triton). Requests using a region finish on it first."""
        self._check_enabled(kind)
        code, message = await asyncio.to_thread(self.core.unregister, kind.value, name)
        _raise_unless_ok(code, message)

    def status(self, kind: SharedMemoryKind, name: str) -> list[SharedMemoryRegion]:
        """Every region of ``kind``, or the one named (NotFound if it is not registered)."""
        self._check_enabled(kind)
        code, message, regions = self.core.status(kind.value, name)
        _raise_unless_ok(code, message)
        return [
            SharedMemoryRegion(r.name, r.key, r.offset, r.byte_size, r.device_id) for r in regions
        ]

    def _check_enabled(self, kind: SharedMemoryKind) -> None:
        if not self._enabled[kind]:
            label = "CUDA" if kind is SharedMemoryKind.CUDA else "system"
            raise Unimplemented(
                f"{label} shared memory is switched off on this server (--shared-memory)"
            )


def _raise_unless_ok(code: int, message: str) -> None:
    if code != 0:
        raise error_for_code(code, message)
