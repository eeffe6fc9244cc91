#include <pybind11/pybind11.h>

#include <stdexcept>
#include <string>

#include "inferd/structured_log.h"

namespace py = pybind11;

namespace inferd::python {

void register_logging(py::module_& m) {
  m.def(
      "set_core_logging",
      [](int minimum_level, bool json) {
        if (minimum_level < 0 || minimum_level > 4) {
          throw std::invalid_argument("core log level " + std::to_string(minimum_level) +
                                      " is not 0 (debug) to 4 (critical)");
        }
        set_core_logging(static_cast<LogLevel>(minimum_level), json);
      },
      py::arg("minimum_level"), py::arg("json"),
      "How the records the core writes itself (ONNX Runtime's, requests the transport answers INTERNAL) "
      "go to stderr: those below minimum_level (0 debug, 1 info, 2 warning, 3 error, 4 critical) are "
      "dropped, the others written one line each, a JSON object like inferd's structlog records when json, "
      "else a readable line. Never calls Python.");
}

}  // namespace inferd::python
