#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "inferd/shared_memory.h"

namespace py = pybind11;

namespace inferd::python {
namespace {

SharedMemoryKind kind_named(const std::string& kind) {
  if (kind == "system") return SharedMemoryKind::kSystem;
  if (kind == "cuda") return SharedMemoryKind::kCuda;
  throw std::invalid_argument("shared memory kind must be 'system' or 'cuda', not '" + kind + "'");
}

py::tuple result(const Status& status) { return py::make_tuple(static_cast<int>(status.code), status.message); }

std::shared_ptr<SharedMemoryRegistry> make_registry(bool system, bool cuda, size_t max_regions, uint64_t max_bytes) {
  SharedMemoryOptions options;
  options.system = system;
  options.cuda = cuda;
  options.max_regions = max_regions;
  options.max_bytes = max_bytes;
  return std::make_shared<SharedMemoryRegistry>(options);
}

}  // namespace

void register_shared_memory(py::module_& m) {
  py::class_<SharedMemoryRegionStatus>(m, "SharedMemoryRegionStatus")
      .def_readonly("name", &SharedMemoryRegionStatus::name)
      .def_readonly("key", &SharedMemoryRegionStatus::key)
      .def_readonly("offset", &SharedMemoryRegionStatus::offset)
      .def_readonly("byte_size", &SharedMemoryRegionStatus::byte_size)
      .def_readonly("device_id", &SharedMemoryRegionStatus::device_id);
  // Held by shared_ptr: the core's gRPC server and the schedulers' requests share the registry.
  py::class_<SharedMemoryRegistry, std::shared_ptr<SharedMemoryRegistry>>(m, "SharedMemoryRegistry")
      .def(py::init(&make_registry), py::arg("system"), py::arg("cuda"), py::arg("max_regions"), py::arg("max_bytes"),
           "The registered regions of one server: which kinds it accepts and how many regions and bytes at most.")
      .def_property_readonly("system", [](const SharedMemoryRegistry& r) { return r.options().system; })
      .def_property_readonly("cuda", [](const SharedMemoryRegistry& r) { return r.options().cuda; })
      // Opening and mapping (shm_open, mmap; the CUDA runtime) and unmapping may block: GIL released.
      .def(
          "register_system",
          [](SharedMemoryRegistry& r, const std::string& name, const std::string& key, uint64_t offset,
             uint64_t byte_size, std::optional<std::tuple<int64_t, int64_t, int64_t>> caller) {
            std::optional<PeerCredentials> peer;
            if (caller) {
              const auto [pid, uid, gid] = *caller;
              peer = PeerCredentials{static_cast<pid_t>(pid), static_cast<uid_t>(uid), static_cast<gid_t>(gid)};
            }
            Status status;
            {
              py::gil_scoped_release release;
              status = r.register_system(name, key, offset, byte_size, peer ? &*peer : nullptr);
            }
            return result(status);
          },
          py::arg("name"), py::arg("key"), py::arg("offset"), py::arg("byte_size"), py::arg("caller") = py::none(),
          "SystemSharedMemoryRegister. caller: (pid, uid, gid) of a client on the Unix socket, whose access to the "
          "object is checked; None: not checked. Returns (StatusCode, message).")
      .def(
          "register_cuda",
          [](SharedMemoryRegistry& r, const std::string& name, const py::bytes& raw_handle, int64_t device_id,
             uint64_t byte_size) {
            std::string handle = raw_handle;  // copied with the GIL held
            Status status;
            {
              py::gil_scoped_release release;
              status = r.register_cuda(name, handle, device_id, byte_size);
            }
            return result(status);
          },
          py::arg("name"), py::arg("raw_handle"), py::arg("device_id"), py::arg("byte_size"),
          "CudaSharedMemoryRegister (raw_handle: a cudaIpcMemHandle_t's bytes). Returns (StatusCode, message).")
      .def(
          "unregister",
          [](SharedMemoryRegistry& r, const std::string& kind, const std::string& name) {
            const SharedMemoryKind k = kind_named(kind);
            Status status;
            {
              py::gil_scoped_release release;
              status = r.unregister(k, name);
            }
            return result(status);
          },
          py::arg("kind"), py::arg("name"),
          "*SharedMemoryUnregister of kind 'system' or 'cuda': the region named, or all of the kind when name is "
          "empty. Returns (StatusCode, message).")
      .def(
          "status",
          [](const SharedMemoryRegistry& r, const std::string& kind, const std::string& name) {
            std::vector<SharedMemoryRegionStatus> regions;
            Status status = r.status(kind_named(kind), name, &regions);
            return py::make_tuple(static_cast<int>(status.code), status.message, regions);
          },
          py::arg("kind"), py::arg("name"),
          "*SharedMemoryStatus of kind 'system' or 'cuda': the region named, or all of the kind when name is "
          "empty. Returns (StatusCode, message, [SharedMemoryRegionStatus]).")
      .def("region_count", &SharedMemoryRegistry::region_count)
      .def("registered_bytes", &SharedMemoryRegistry::registered_bytes);
}

}  // namespace inferd::python
