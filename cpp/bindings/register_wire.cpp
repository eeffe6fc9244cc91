#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <optional>
#include <stdexcept>

#include "inferd/infer_request_parser.h"
#include "inferd/infer_response_writer.h"
#include "inferd/model_signature.h"
#include "inferd/version_routing.h"
#include "python_tensor.h"
#include "wire_request.h"

namespace py = pybind11;

namespace inferd::python {
namespace {

DataType datatype(int code) {
  if (!is_valid_datatype(code)) throw std::invalid_argument("unknown datatype code " + std::to_string(code));
  return static_cast<DataType>(code);
}

std::shared_ptr<ModelSignature> make_signature(std::string name, std::string version, int64_t max_batch_size,
                                               const std::vector<py::tuple>& inputs,
                                               const std::vector<py::tuple>& outputs, bool decoupled,
                                               bool keeps_parameters, bool sequence_batching) {
  auto signature = std::make_shared<ModelSignature>();
  signature->name = std::move(name);
  signature->version = std::move(version);
  signature->max_batch_size = max_batch_size;
  signature->decoupled = decoupled;
  signature->keeps_parameters = keeps_parameters;
  signature->sequence_batching = sequence_batching;
  for (const py::tuple& t : inputs) {
    InputSignature in;
    in.name = t[0].cast<std::string>();
    in.dtype = datatype(t[1].cast<int>());
    in.dims = t[2].cast<std::vector<int64_t>>();
    in.has_reshape = !t[3].is_none();
    if (in.has_reshape) in.reshape = t[3].cast<std::vector<int64_t>>();
    in.optional = t[4].cast<bool>();
    in.utf8 = t[5].cast<bool>();
    in.core_written = t.size() > 6 && t[6].cast<bool>();
    signature->inputs.push_back(std::move(in));
  }
  for (const py::tuple& t : outputs) {
    OutputSignature out;
    out.name = t[0].cast<std::string>();
    out.dtype = datatype(t[1].cast<int>());
    out.dims = t[2].cast<std::vector<int64_t>>();
    out.has_reshape = t[3].cast<bool>();
    signature->outputs.push_back(std::move(out));
  }
  return signature;
}

std::unique_ptr<WireRequest> parse(const py::bytes& data) {
  auto request = std::make_unique<WireRequest>();
  request->owner = hold_reference(data);
  const std::string_view bytes(PyBytes_AS_STRING(data.ptr()), static_cast<size_t>(PyBytes_GET_SIZE(data.ptr())));
  request->size = bytes.size();
  // The GIL stays held: the walk visits each field once and skips tensor bytes by their length,
  // so even a large request costs microseconds; releasing would cost a thread switch.
  Status status = parse_infer_request(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size(), &request->parsed);
  if (!status.ok()) throw std::invalid_argument(status.message);
  return request;
}

py::str text(std::string_view s) { return py::str(s.data(), s.size()); }

}  // namespace

py::bytes write_response(const InferenceRequest& request, const std::vector<Tensor>& outputs) {
  std::optional<InferResponseWriter> placed;
  if (request.shared_memory_outputs.empty()) {
    placed.emplace(request, outputs, request.stream);
  } else {
    // The constructor copies outputs into the client's shared memory: no Python object is touched.
    py::gil_scoped_release release;
    placed.emplace(request, outputs, request.stream);
  }
  const InferResponseWriter& writer = *placed;
  if (!writer.status().ok()) throw ResponseNotWritten(writer.status());
  py::object bytes =
      py::reinterpret_steal<py::object>(PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(writer.size())));
  if (!bytes) throw py::error_already_set();
  auto* out = reinterpret_cast<std::byte*>(PyBytes_AS_STRING(bytes.ptr()));
  if (writer.data_bytes() < (64u << 10)) {
    writer.write(out);  // small: a thread switch would cost more than the copy
  } else {
    // The new bytes object is ours alone until returned; the outputs are held by their tensors and
    // nobody writes them.
    py::gil_scoped_release release;
    writer.write(out);
  }
  return py::reinterpret_steal<py::bytes>(bytes.release());
}

void register_wire(py::module_& m) {
  py::class_<ModelSignature, std::shared_ptr<ModelSignature>>(m, "ModelSignature")
      .def(
          py::init(&make_signature), py::arg("name"), py::arg("version"), py::arg("max_batch_size"), py::arg("inputs"),
          py::arg("outputs"), py::arg("decoupled") = false, py::arg("keeps_parameters") = false,
          py::arg("sequence_batching") = false,
          "inputs: (name, datatype code, dims, reshape or None, optional, utf8[, control]); outputs: (name, datatype "
          "code, "
          "dims, has_reshape); decoupled: model_transaction_policy { decoupled: true } (served on "
          "ModelStreamInfer only); keeps_parameters: requests keep their own parameters as JSON (python "
          "models); sequence_batching: requests belong to sequences, control inputs written by the core. What the core "
          "checks requests against and writes answers from.")
      .def_property_readonly("name", [](const ModelSignature& s) { return s.name; })
      .def_property_readonly("version", [](const ModelSignature& s) { return s.version; })
      .def_property_readonly("decoupled", [](const ModelSignature& s) { return s.decoupled; });

  py::class_<WireRequest>(m, "WireRequest")
      .def_property_readonly("model_name", [](const WireRequest& r) { return text(r.parsed.model_name); })
      .def_property_readonly("model_version", [](const WireRequest& r) { return text(r.parsed.model_version); })
      .def_property_readonly("id", [](const WireRequest& r) { return text(r.parsed.id); })
      .def_property_readonly(
          "routing_key",
          [](const WireRequest& r) -> std::optional<std::string> {
            std::optional<std::string_view> key;
            const Status status = routing_key(r.parsed.parameters, &key);
            if (!status.ok()) throw std::invalid_argument(status.message);
            if (!key) return std::nullopt;
            return text(*key);
          },
          "The request's inferd.routing_key string parameter, or None. Raises ValueError when it is not a "
          "string.");

  m.def("parse_infer_request", &parse, py::arg("data"),
        "A serialized ModelInferRequest -> WireRequest, viewing (and holding) the bytes. Raises ValueError "
        "naming the field when the bytes are not a well-formed ModelInferRequest.");
}

}  // namespace inferd::python
