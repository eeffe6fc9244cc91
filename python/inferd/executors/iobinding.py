"""ONNX Runtime on a GPU without hidden copies or device-wide syncs.

Each instance owns a CUDA stream (the core's ``CudaStream``) that ONNX Runtime also computes on
(``user_compute_stream``). A batch's inputs, already gathered by the core in page-locked host
memory, are copied into the instance's device buffers on a copy stream one batch ahead
(``stage``, see ``inferd.executors.staging``) and bound with IOBinding; ONNX Runtime allocates
the outputs on the device; they are copied back into page-locked host arrays on the compute
stream, and only that stream is waited for. Events and stream order sequence copy, compute and
copy back: the run is told not to synchronise the providers.

Without CUDA the core's stream and buffers are host stand-ins and the same code binds CPU memory,
which is how CI tests it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from inferd.core import CudaStream, DeviceBufferPool, HostBufferPool
from inferd.errors import InvalidArgument
from inferd.executors.staging import InputStager, copy_back

# ONNX Runtime's tensor type names -> numpy dtypes, for outputs it allocated on the device.
_ORT_NUMPY = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(int8)": np.int8,
    "tensor(int16)": np.int16,
    "tensor(int32)": np.int32,
    "tensor(int64)": np.int64,
    "tensor(uint8)": np.uint8,
    "tensor(uint16)": np.uint16,
    "tensor(uint32)": np.uint32,
    "tensor(uint64)": np.uint64,
    "tensor(bool)": np.bool_,
}


class IoBindingRunner:
    """Runs one session through IOBinding on ``stream``. Used by one worker thread at a time."""

    def __init__(
        self,
        ort: Any,
        session: Any,
        stream: CudaStream,
        device_pool: DeviceBufferPool,
        host_pool: HostBufferPool,
        output_names: list[str],
    ) -> None:
        self._session = session
        self._stream = stream
        self._stager = InputStager(stream.device, device_pool, stream)
        self._host_pool = host_pool
        self._output_names = output_names
        self._device_type = "cuda" if stream.on_device else "cpu"
        self._device_id = max(stream.device, 0)
        self._run_options = ort.RunOptions()
        # Our stream orders the copy back after the compute; a provider-wide sync is not needed.
        self._run_options.add_run_config_entry("disable_synchronize_execution_providers", "1")

    def stage(self, feeds: list[tuple[str, np.ndarray]]) -> None:
        """Queues the copies of a batch's inputs one batch ahead (the core's stager thread)."""
        self._stager.stage(feeds)

    def run(self, feeds: list[tuple[str, np.ndarray]]) -> list[np.ndarray]:
        binding = self._session.io_binding()
        staged = self._stager.take(feeds)  # alive until the stream has passed the copies
        for name, array, buffer in zip(staged.names, staged.arrays, staged.buffers, strict=True):
            binding.bind_input(
                name, self._device_type, self._device_id, array.dtype, list(array.shape), buffer.ptr
            )
        for name in self._output_names:
            binding.bind_output(name, self._device_type, self._device_id)
        self._session.run_with_iobinding(binding, self._run_options)
        values = binding.get_outputs()  # on the device; kept alive until the copies are done
        outputs = []
        for name, value in zip(self._output_names, values, strict=True):
            dtype = _ORT_NUMPY.get(value.data_type())
            if dtype is None:
                raise InvalidArgument(
                    f"output {name!r} of type {value.data_type()} cannot leave a GPU"
                )
            outputs.append((value.data_ptr(), tuple(value.shape()), np.dtype(dtype)))
        results = copy_back(self._stream, self._host_pool, outputs)
        del values, staged
        return results
