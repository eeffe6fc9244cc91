"""ONNX Runtime on a GPU without hidden copies or device-wide syncs.

Each instance owns a CUDA stream (the core's ``CudaStream``) that ONNX Runtime also computes on
(``user_compute_stream``). A batch's inputs, already gathered by the core in page-locked host
memory, are copied into the instance's device buffers on that stream and bound with IOBinding;
ONNX Runtime allocates the outputs on the device; they are copied back into page-locked host
arrays on the same stream, and only that stream is waited for. Stream order alone sequences copy,
compute and copy back: the run is told not to synchronise the providers.

Without CUDA the core's stream and buffers are host stand-ins and the same code binds CPU memory,
which is how CI tests it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from inferd.batching import CudaStream, DeviceBuffer, DeviceBufferPool, HostBufferPool, pinned_array
from inferd.errors import InvalidArgument

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
        self._device_pool = device_pool
        self._host_pool = host_pool
        self._output_names = output_names
        self._device_type = "cuda" if stream.on_device else "cpu"
        self._device_id = max(stream.device, 0)
        self._run_options = ort.RunOptions()
        # Our stream orders the copy back after the compute; a provider-wide sync is not needed.
        self._run_options.add_run_config_entry("disable_synchronize_execution_providers", "1")

    def run(self, feeds: list[tuple[str, np.ndarray]]) -> list[np.ndarray]:
        binding = self._session.io_binding()
        leased: list[DeviceBuffer] = []  # alive until the stream has passed the copies
        for name, array in feeds:
            array = np.ascontiguousarray(array)
            if array.dtype == object:
                raise InvalidArgument(f"input {name!r}: BYTES tensors cannot run on a GPU instance")
            buffer = self._device_pool.lease(max(array.nbytes, 1))
            leased.append(buffer)
            self._stream.copy_to_device(buffer.ptr, array)
            binding.bind_input(
                name, self._device_type, self._device_id, array.dtype, list(array.shape), buffer.ptr
            )
        for name in self._output_names:
            binding.bind_output(name, self._device_type, self._device_id)
        self._session.run_with_iobinding(binding, self._run_options)
        values = binding.get_outputs()  # on the device; kept alive until the copies are done
        results: list[np.ndarray] = []
        for name, value in zip(self._output_names, values, strict=True):
            dtype = _ORT_NUMPY.get(value.data_type())
            if dtype is None:
                raise InvalidArgument(
                    f"output {name!r} of type {value.data_type()} cannot leave a GPU"
                )
            shape = tuple(value.shape())
            host = pinned_array(
                self._host_pool, max(int(np.prod(shape)) * np.dtype(dtype).itemsize, 1)
            )
            out = host[: int(np.prod(shape)) * np.dtype(dtype).itemsize].view(dtype).reshape(shape)
            if out.nbytes:
                self._stream.copy_to_host(out, value.data_ptr())
            results.append(out)
        self._stream.synchronize()  # this instance's stream only
        del values, leased
        return results
