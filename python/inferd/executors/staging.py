"""Double buffering for GPU executors: a batch's inputs are copied to the device on the
instance's copy stream while the previous batch computes on its compute stream.

``stage`` (called by the core's stager thread, one batch ahead) leases device buffers, queues the
host-to-device copies on the copy stream and records an event after them; ``take`` (called by
``execute``, in staging order) makes the compute stream wait for that event on the GPU, not on the
host. Without a staged batch (an executor used on its own) ``take`` copies inline on the compute
stream. The host arrays and device buffers stay referenced until the batch is done.
"""

from __future__ import annotations

import collections
from dataclasses import dataclass
from typing import Any

import numpy as np

from inferd.core import (
    CudaEvent,
    CudaStream,
    DeviceBuffer,
    DeviceBufferPool,
    HostBufferPool,
    pinned_array,
)
from inferd.errors import Internal, InvalidArgument


@dataclass
class StagedInputs:
    names: list[str]
    arrays: list[np.ndarray]  # the host inputs, kept until the copies are done
    buffers: list[DeviceBuffer]  # their device copies
    ready: CudaEvent | None  # recorded after the copies (None: copied on the compute stream)


class InputStager:
    """Used by two threads, one calling ``stage`` and one calling ``take``: the deque's append and
    popleft are atomic."""

    def __init__(self, device: int, device_pool: DeviceBufferPool, compute_stream: CudaStream):
        self._device = device
        self._pool = device_pool
        self._compute = compute_stream
        self._copy = CudaStream(device)
        self._staged: collections.deque[StagedInputs] = collections.deque()

    def _copy_in(self, feeds: list[tuple[str, np.ndarray]], stream: CudaStream) -> StagedInputs:
        names, arrays, buffers = [], [], []
        for name, array in feeds:
            array = np.ascontiguousarray(array)
            if array.dtype == object:
                raise InvalidArgument(f"input {name!r}: BYTES tensors cannot run on a GPU instance")
            buffer = self._pool.lease(max(array.nbytes, 1))
            stream.copy_to_device(buffer.ptr, array)
            names.append(name)
            arrays.append(array)
            buffers.append(buffer)
        return StagedInputs(names, arrays, buffers, None)

    def stage(self, feeds: list[tuple[str, np.ndarray]]) -> None:
        staged = self._copy_in(feeds, self._copy)
        staged.ready = CudaEvent(self._device)
        staged.ready.record(self._copy)
        self._staged.append(staged)

    def take(self, feeds: list[tuple[str, np.ndarray]]) -> StagedInputs:
        if not self._staged:
            return self._copy_in(feeds, self._compute)
        staged = self._staged.popleft()
        if [a.shape for a in staged.arrays] != [np.shape(a) for _, a in feeds]:
            raise Internal("the batch to execute is not the one staged next")
        if staged.ready is not None:
            staged.ready.make_wait(self._compute)
        return staged

    def pending(self) -> int:
        return len(self._staged)


def copy_back(
    stream: CudaStream,
    host_pool: HostBufferPool,
    outputs: list[tuple[int, tuple[int, ...], np.dtype[Any]]],
) -> list[np.ndarray]:
    """Queues the copies of device outputs (address, shape, dtype) into page-locked host arrays
    on ``stream``, waits for that stream alone and returns the arrays."""
    results: list[np.ndarray] = []
    for address, shape, dtype in outputs:
        size = int(np.prod(shape)) * dtype.itemsize
        out = pinned_array(host_pool, max(size, 1))[:size].view(dtype).reshape(shape)
        if size:
            stream.copy_to_host(out, address)
        results.append(out)
    stream.synchronize()  # this instance's stream only
    return results
