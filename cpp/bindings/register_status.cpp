#include <pybind11/pybind11.h>

#include "inferd/status.h"

namespace py = pybind11;

namespace inferd::python {

void register_status(py::module_& m) {
  py::enum_<StatusCode>(m, "StatusCode")
      .value("OK", StatusCode::kOk)
      .value("INVALID_ARGUMENT", StatusCode::kInvalidArgument)
      .value("NOT_FOUND", StatusCode::kNotFound)
      .value("UNAVAILABLE", StatusCode::kUnavailable)
      .value("RESOURCE_EXHAUSTED", StatusCode::kResourceExhausted)
      .value("DEADLINE_EXCEEDED", StatusCode::kDeadlineExceeded)
      .value("CANCELLED", StatusCode::kCancelled)
      .value("INTERNAL", StatusCode::kInternal)
      .value("UNIMPLEMENTED", StatusCode::kUnimplemented)
      .value("FAILED_PRECONDITION", StatusCode::kFailedPrecondition)
      .value("ALREADY_EXISTS", StatusCode::kAlreadyExists)
      .value("PERMISSION_DENIED", StatusCode::kPermissionDenied);
}

}  // namespace inferd::python
