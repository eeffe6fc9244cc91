"""The core's CUDA pieces for executors that run on a GPU: one stream per instance, a device
buffer pool, and page-locked host arrays for copies back. Without CUDA they are the core's host
stand-ins (copies are memcpy), so the same executor code runs and is tested on a CPU machine."""

from __future__ import annotations

import numpy as np

import inferd._core as _core
from inferd.core.scheduler import HostBufferPool

CudaEvent = _core.CudaEvent
CudaStream = _core.CudaStream
DeviceBuffer = _core.DeviceBuffer
DeviceBufferPool = _core.DeviceBufferPool


def pinned_array(pool: HostBufferPool, size: int) -> np.ndarray:
    """A writable uint8 array of ``size`` bytes in one of the pool's (page-locked) buffers; the
    buffer returns to the pool when the array and its views are gone."""
    return _core.pinned_array(pool.core, size)
