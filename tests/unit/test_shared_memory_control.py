"""The shared-memory control plane without a server (issue 15, items 3 and 5): which kinds
--shared-memory switches on, what a switched-off kind answers, and which forwarded inferences the
servicer lets name a region (only those the core's server marks as coming from a listener that
serves shared memory)."""

from __future__ import annotations

from collections.abc import Sequence
from multiprocessing import shared_memory
from typing import Any

import pytest

import inferd._proto.grpc_service_pb2 as pb
from inferd.errors import AlreadyExists, InvalidArgument, NotFound, Unimplemented
from inferd.observability.logging import LogControl
from inferd.observability.telemetry import Telemetry
from inferd.shared_memory import SharedMemory, SharedMemoryKind, SharedMemoryRegion
from inferd.transport.servicer import InferenceServicer, ServerState


def test_modes_switch_kinds_and_extensions() -> None:
    assert SharedMemory("all", max_regions=1, max_bytes=1).extensions() == [
        "system_shared_memory",
        "cuda_shared_memory",
    ]
    assert SharedMemory("system", max_regions=1, max_bytes=1).extensions() == [
        "system_shared_memory"
    ]
    assert SharedMemory("cuda", max_regions=1, max_bytes=1).extensions() == ["cuda_shared_memory"]
    off = SharedMemory("none", max_regions=1, max_bytes=1)
    assert off.extensions() == []
    assert not off.enabled


@pytest.mark.parametrize(
    ("mode", "max_regions", "max_bytes", "flag"),
    [
        ("some", 1, 1, "--shared-memory "),
        ("all", -1, 1, "--shared-memory-max-regions"),
        ("all", 1, -1, "--shared-memory-max-bytes"),
    ],
)
def test_bad_settings_name_their_flag(
    mode: str, max_regions: int, max_bytes: int, flag: str
) -> None:
    with pytest.raises(ValueError, match=flag):
        SharedMemory(mode, max_regions=max_regions, max_bytes=max_bytes)


async def test_a_switched_off_kind_is_unimplemented_for_every_call() -> None:
    system_only = SharedMemory("system", max_regions=4, max_bytes=1 << 20)
    with pytest.raises(Unimplemented, match=r"CUDA shared memory is switched off.*--shared-memory"):
        system_only.status(SharedMemoryKind.CUDA, "")
    with pytest.raises(Unimplemented, match="--shared-memory"):
        await system_only.unregister(SharedMemoryKind.CUDA, "")
    with pytest.raises(Unimplemented, match="--shared-memory"):
        await system_only.register_cuda("r", b"\0" * 64, 0, 64)
    cuda_only = SharedMemory("cuda", max_regions=4, max_bytes=1 << 20)
    with pytest.raises(Unimplemented, match="system shared memory is switched off"):
        await cuda_only.register_system("r", "k", 0, 64)
    with pytest.raises(Unimplemented, match="system shared memory is switched off"):
        cuda_only.status(SharedMemoryKind.SYSTEM, "")


async def test_core_codes_become_domain_errors() -> None:
    """The registry's status codes reach the caller as the matching domain errors."""
    memory = SharedMemory("system", max_regions=4, max_bytes=1 << 20)
    obj = shared_memory.SharedMemory(create=True, size=4096)
    try:
        await memory.register_system("r", obj.name, 0, 4096)
        assert memory.status(SharedMemoryKind.SYSTEM, "") == [
            SharedMemoryRegion("r", obj.name, 0, 4096, 0)
        ]
        with pytest.raises(AlreadyExists):
            await memory.register_system("r", obj.name, 0, 4096)
        with pytest.raises(InvalidArgument):
            await memory.register_system("s", "../" + obj.name, 0, 4096)
        await memory.unregister(SharedMemoryKind.SYSTEM, "r")
        with pytest.raises(NotFound):
            memory.status(SharedMemoryKind.SYSTEM, "r")
        assert memory.core.region_count() == 0
    finally:
        obj.close()
        obj.unlink()


class RecordingDataPlane:
    """Records the shared-memory registry each inference is given."""

    def __init__(self) -> None:
        self.given: list[Any] = []

    def parse(self, data: bytes) -> Any:
        return pb.ModelInferRequest(model_name="m")

    async def infer(self, request: Any, *, shared_memory: Any = None, **kwargs: Any) -> bytes:
        self.given.append(shared_memory)
        return b""


class Context:
    def __init__(self, metadata: Sequence[tuple[str, str]]) -> None:
        self._metadata = tuple(metadata)

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata

    def time_remaining(self) -> float | None:
        return None


def servicer(dataplane: RecordingDataPlane, memory: SharedMemory) -> InferenceServicer:
    return InferenceServicer(
        dataplane,  # type: ignore[arg-type]
        None,  # type: ignore[arg-type]
        ServerState(),
        Telemetry(LogControl()),
        shared_memory=memory,
    )


@pytest.mark.parametrize(
    ("mode", "metadata", "gets_registry"),
    [
        ("all", [("inferd-shared-memory", "1")], True),
        ("system", [("inferd-shared-memory", "1")], True),
        ("all", [], False),  # a listener that does not serve shared memory
        ("all", [("inferd-shared-memory", "0")], False),
        ("none", [("inferd-shared-memory", "1")], False),
    ],
)
async def test_model_infer_passes_the_registry_only_where_shared_memory_is_served(
    mode: str, metadata: list[tuple[str, str]], gets_registry: bool
) -> None:
    memory = SharedMemory(mode, max_regions=4, max_bytes=1 << 20)
    dataplane = RecordingDataPlane()
    await servicer(dataplane, memory).ModelInfer(b"", Context(metadata))  # type: ignore[arg-type]
    assert dataplane.given == [memory.core if gets_registry else None]


@pytest.mark.parametrize(
    ("mode", "added"),
    [
        ("all", ["system_shared_memory", "cuda_shared_memory"]),
        ("system", ["system_shared_memory"]),
        ("none", []),
    ],
)
async def test_server_metadata_lists_the_enabled_extensions(mode: str, added: list[str]) -> None:
    memory = SharedMemory(mode, max_regions=4, max_bytes=1 << 20)
    answer = await servicer(RecordingDataPlane(), memory).ServerMetadata(
        pb.ServerMetadataRequest(),
        Context([]),  # type: ignore[arg-type]
    )
    shared = [e for e in answer.extensions if e.endswith("_shared_memory")]
    assert shared == added
