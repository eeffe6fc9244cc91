#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <stdexcept>

#include "inferd/infer_request_parser.h"
#include "inferd/inference_request.h"

namespace inferd::python {

namespace py = pybind11;

// A parsed ModelInferRequest and the Python bytes object its views point into: the views are
// valid while `owner` is held, and every tensor built from them holds `owner` too.
struct WireRequest {
  std::shared_ptr<const void> owner;
  size_t size = 0;  // bytes received
  ParsedInferRequest parsed;
};

// Why a computed request's answer could not be written (InferResponseWriter::status()).
struct ResponseNotWritten : std::runtime_error {
  explicit ResponseNotWritten(const Status& status) : std::runtime_error(status.message), code(status.code) {}
  StatusCode code;
};

// Answers of wire requests: the serialized ModelInferResponse (or ModelStreamInferResponse) of a
// computed request, as a Python bytes object written straight from the outputs (and outputs in
// shared memory written into their slices). Requires the GIL; releases it around the copies when
// they are large. Throws ResponseNotWritten.
py::bytes write_response(const InferenceRequest& request, const std::vector<Tensor>& outputs);

}  // namespace inferd::python
