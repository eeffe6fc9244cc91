#pragma once

#include <pybind11/pybind11.h>

#include <memory>

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

// Answers of wire requests: the serialized ModelInferResponse (or ModelStreamInferResponse) of a
// computed request, as a Python bytes object written straight from the outputs. Requires the GIL;
// releases it around the copy when the outputs are large.
py::bytes write_response(const InferenceRequest& request, const std::vector<Tensor>& outputs);

}  // namespace inferd::python
