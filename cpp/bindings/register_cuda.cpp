#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>

#include <memory>
#include <stdexcept>

#include "inferd/cuda_event.h"
#include "inferd/cuda_runtime.h"
#include "inferd/cuda_stream.h"
#include "inferd/device_buffer_pool.h"
#include "inferd/pinned_buffer_pool.h"

namespace py = pybind11;

namespace inferd::python {
namespace {

void raise_unless_ok(const Status& status) {
  if (!status.ok()) throw std::runtime_error(status.message);
}

// The start and length of a C-contiguous buffer; `writable` asks for a writable one.
std::pair<void*, size_t> contiguous(const py::buffer& buffer, bool writable) {
  py::buffer_info info = buffer.request(writable);
  if (!PyBuffer_IsContiguous(info.view(), 'C')) throw std::invalid_argument("buffer is not C-contiguous");
  return {info.ptr, static_cast<size_t>(info.size * info.itemsize)};
}

}  // namespace

void register_cuda(py::module_& m) {
  m.def(
      "cuda_runtime_description", [] { return CudaRuntime::get().description(); },
      "Which CUDA runtime the core found at run time, or why none.");
  m.def(
      "cuda_device_count", [] { return CudaRuntime::get().device_count(); },
      "CUDA devices the core's run-time libcudart sees; 0 without CUDA.");

  // Copies release the GIL: the caller's buffer objects stay referenced by the call's arguments.
  py::class_<CudaStream, std::shared_ptr<CudaStream>>(m, "CudaStream")
      .def(py::init<int>(), py::arg("device"), "A stream on `device` (-1 or no CUDA: the host stand-in).")
      .def_property_readonly("on_device", &CudaStream::on_device)
      .def_property_readonly("device", &CudaStream::device)
      .def_property_readonly(
          "handle", [](const CudaStream& s) { return reinterpret_cast<uintptr_t>(s.handle()); },
          "The cudaStream_t as an integer (0 on the host), e.g. for user_compute_stream.")
      .def(
          "copy_to_device",
          [](CudaStream& stream, uintptr_t dst, const py::buffer& src) {
            auto [ptr, size] = contiguous(src, false);
            py::gil_scoped_release release;
            raise_unless_ok(stream.copy_to_device(reinterpret_cast<void*>(dst), ptr, size));
          },
          py::arg("dst"), py::arg("src"), "Queue a copy of `src` (host) to device address `dst`.")
      .def(
          "copy_to_host",
          [](CudaStream& stream, const py::buffer& dst, uintptr_t src) {
            auto [ptr, size] = contiguous(dst, true);
            py::gil_scoped_release release;
            raise_unless_ok(stream.copy_to_host(ptr, reinterpret_cast<const void*>(src), size));
          },
          py::arg("dst"), py::arg("src"), "Queue a copy of len(dst) bytes from device address `src` into `dst`.")
      .def(
          "synchronize", [](CudaStream& stream) { raise_unless_ok(stream.synchronize()); },
          py::call_guard<py::gil_scoped_release>(), "Wait for this stream's work (not the whole device).");

  py::class_<CudaEvent, std::shared_ptr<CudaEvent>>(m, "CudaEvent")
      .def(py::init<int>(), py::arg("device"), "An event on `device` (-1 or no CUDA: the host clock).")
      .def(
          "record", [](CudaEvent& e, const CudaStream& s) { raise_unless_ok(e.record(s)); }, py::arg("stream"),
          py::call_guard<py::gil_scoped_release>(), "Mark this point of `stream`'s work.")
      .def(
          "make_wait", [](const CudaEvent& e, const CudaStream& s) { raise_unless_ok(e.make_wait(s)); },
          py::arg("stream"), py::call_guard<py::gil_scoped_release>(),
          "Work queued on `stream` from now on starts after this event (no host wait).")
      .def(
          "synchronize", [](CudaEvent& e) { raise_unless_ok(e.synchronize()); },
          py::call_guard<py::gil_scoped_release>(), "Wait for the recorded point.")
      .def_static(
          "elapsed_ms",
          [](const CudaEvent& start, const CudaEvent& end) {
            float ms = 0;
            raise_unless_ok(CudaEvent::elapsed_ms(start, end, &ms));
            return ms;
          },
          py::arg("start"), py::arg("end"));

  py::class_<DeviceBufferPool::Buffer, std::shared_ptr<DeviceBufferPool::Buffer>>(m, "DeviceBuffer")
      .def_property_readonly("ptr",
                             [](const DeviceBufferPool::Buffer& b) { return reinterpret_cast<uintptr_t>(b.data); })
      .def_property_readonly("size", [](const DeviceBufferPool::Buffer& b) { return b.size; });

  py::class_<DeviceBufferPool, std::shared_ptr<DeviceBufferPool>>(m, "DeviceBufferPool")
      .def(py::init<int, size_t>(), py::arg("device"), py::arg("capacity_bytes"))
      .def("lease", &DeviceBufferPool::lease, py::arg("size"), py::call_guard<py::gil_scoped_release>(),
           "A buffer of at least `size` bytes, back to the pool when dropped.")
      .def_property_readonly("device", &DeviceBufferPool::device)
      .def("stats", [](const DeviceBufferPool& pool) {
        const auto s = pool.stats();
        return py::dict(py::arg("capacity_bytes") = s.capacity_bytes, py::arg("pooled_bytes") = s.pooled_bytes,
                        py::arg("leased_bytes") = s.leased_bytes, py::arg("allocations") = s.allocations,
                        py::arg("reuses") = s.reuses, py::arg("fallbacks") = s.fallbacks,
                        py::arg("on_device") = s.on_device);
      });

  m.def(
      "pinned_array",
      [](PinnedBufferPool& pool, size_t size) {
        auto buffer = pool.lease(size);
        auto keep = std::make_unique<std::shared_ptr<PooledBuffer>>(buffer);
        py::capsule base(keep.get(), [](void* p) {
          std::default_delete<std::shared_ptr<PooledBuffer>>()(static_cast<std::shared_ptr<PooledBuffer>*>(p));
        });
        keep.release();
        return py::array(py::dtype("uint8"), {static_cast<py::ssize_t>(size)}, {}, buffer->data, base);
      },
      py::arg("pool"), py::arg("size"),
      "A writable uint8 array of `size` bytes in a pool buffer (page-locked with CUDA), for device-to-host copies.");
}

}  // namespace inferd::python
