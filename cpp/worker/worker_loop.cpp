#include "worker_loop.h"

#include <pybind11/numpy.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <utility>
#include <vector>

#include "inferd/worker_messages.h"

namespace inferd::worker {
namespace {

// numpy's name of each datatype's element type (BF16 travels as its bits: uint16).
const char* numpy_name(DataType dtype) {
  switch (dtype) {
    case DataType::kBool:
      return "bool";
    case DataType::kUint8:
      return "uint8";
    case DataType::kUint16:
    case DataType::kBf16:
      return "uint16";
    case DataType::kUint32:
      return "uint32";
    case DataType::kUint64:
      return "uint64";
    case DataType::kInt8:
      return "int8";
    case DataType::kInt16:
      return "int16";
    case DataType::kInt32:
      return "int32";
    case DataType::kInt64:
      return "int64";
    case DataType::kFp16:
      return "float16";
    case DataType::kFp32:
      return "float32";
    case DataType::kFp64:
      return "float64";
    case DataType::kBytes:
      return "object";
  }
  return "object";
}

// The protocol datatype holding a fixed-width numpy dtype; false for one none holds.
bool datatype_of(char kind, py::ssize_t itemsize, DataType* out) {
  static const std::pair<DataType, py::ssize_t> kUnsigned[] = {
      {DataType::kUint8, 1}, {DataType::kUint16, 2}, {DataType::kUint32, 4}, {DataType::kUint64, 8}};
  static const std::pair<DataType, py::ssize_t> kSigned[] = {
      {DataType::kInt8, 1}, {DataType::kInt16, 2}, {DataType::kInt32, 4}, {DataType::kInt64, 8}};
  static const std::pair<DataType, py::ssize_t> kFloat[] = {
      {DataType::kFp16, 2}, {DataType::kFp32, 4}, {DataType::kFp64, 8}};
  if (kind == 'b' && itemsize == 1) {
    *out = DataType::kBool;
    return true;
  }
  auto find = [&](const auto& table) {
    for (const auto& [dtype, size] : table) {
      if (size == itemsize) {
        *out = dtype;
        return true;
      }
    }
    return false;
  };
  if (kind == 'u') return find(kUnsigned);
  if (kind == 'i') return find(kSigned);
  if (kind == 'f') return find(kFloat);
  return false;
}

// Text from the server (ids, parameters, names) as str; never raises for bytes that are not UTF-8.
py::str text_of(std::string_view text) {
  PyObject* value = PyUnicode_DecodeUTF8(text.data(), static_cast<Py_ssize_t>(text.size()), "replace");
  if (value == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::str>(value);
}

std::string type_name(py::handle object) { return py::str(py::type::of(object).attr("__name__")).cast<std::string>(); }

}  // namespace

// One answer tensor, ready to be copied into the outputs arena.
struct PlacedOutput {
  std::string name;
  DataType dtype = DataType::kFp32;
  std::vector<int64_t> shape;
  py::object keep;                  // the array whose buffer `data` is (fixed-width types)
  std::string serialized;           // BYTES, as the protocol serializes them
  const std::byte* data = nullptr;  // fixed-width types: `keep`'s buffer
  size_t nbytes = 0;

  const void* bytes() const { return dtype == DataType::kBytes ? static_cast<const void*>(serialized.data()) : data; }
};

namespace {

void append_element(std::string* out, const char* data, size_t size) {
  const auto length = static_cast<uint32_t>(size);
  out->append(reinterpret_cast<const char*>(&length), sizeof length);
  out->append(data, size);
}

// `object` (a tensor's as_numpy()) as an answer tensor; throws std::invalid_argument with the
// message its request fails with.
PlacedOutput place_output(std::string name, py::handle object) {
  PlacedOutput placed;
  placed.name = std::move(name);
  py::array array = py::array::ensure(object);
  if (!array) throw std::invalid_argument("output '" + placed.name + "' is not an array");
  for (py::ssize_t i = 0; i < array.ndim(); ++i) placed.shape.push_back(array.shape(i));
  const char kind = array.dtype().kind();
  if (kind == 'O' || kind == 'S' || kind == 'U') {
    placed.dtype = DataType::kBytes;
    for (py::handle item : array.attr("ravel")()) {
      if (PyBytes_Check(item.ptr())) {
        append_element(&placed.serialized, PyBytes_AS_STRING(item.ptr()),
                       static_cast<size_t>(PyBytes_GET_SIZE(item.ptr())));
      } else if (PyUnicode_Check(item.ptr())) {
        Py_ssize_t size = 0;
        const char* utf8 = PyUnicode_AsUTF8AndSize(item.ptr(), &size);
        if (utf8 == nullptr) throw py::error_already_set();
        append_element(&placed.serialized, utf8, static_cast<size_t>(size));
      } else {
        throw std::invalid_argument("a BYTES element must be bytes or str, got " + type_name(item));
      }
    }
    placed.nbytes = placed.serialized.size();  // its bytes are `serialized`'s wherever it moves
    return placed;
  }
  if (!datatype_of(kind, array.itemsize(), &placed.dtype)) {
    throw std::invalid_argument("no protocol datatype holds numpy dtype " + py::str(array.dtype()).cast<std::string>());
  }
  if (array.dtype().attr("byteorder").cast<std::string>() == ">") {
    array = array.attr("astype")(array.dtype().attr("newbyteorder")("="));
  }
  array = py::array::ensure(array, py::array::c_style);
  placed.data = static_cast<const std::byte*>(array.data());
  placed.nbytes = static_cast<size_t>(array.nbytes());
  placed.keep = std::move(array);
  return placed;
}

// Why `returned` is not one InferenceResponse per request ("" when it is).
std::string check_responses(py::handle returned, size_t expected, py::handle response_type) {
  if (!PyList_Check(returned.ptr()) && !PyTuple_Check(returned.ptr())) {
    return "execute must return a list of InferenceResponse, got " + type_name(returned);
  }
  const py::sequence responses = py::reinterpret_borrow<py::sequence>(returned);
  if (responses.size() != expected) {
    return "execute returned " + std::to_string(responses.size()) + " responses for " + std::to_string(expected) +
           " requests: it must return one InferenceResponse per request, in order";
  }
  for (size_t i = 0; i < responses.size(); ++i) {
    if (!py::isinstance(responses[i], response_type)) {
      return "execute returned a " + type_name(responses[i]) + " at position " + std::to_string(i) +
             ", not an InferenceResponse";
    }
  }
  return {};
}

}  // namespace

// A batch as received: its description copied out of the arena (the views below point into it).
struct WorkerLoop::Batch {
  Message execute;
  std::string description;
  BatchDescription described;
  std::shared_ptr<Mapping> mapping;  // the inputs arena as mapped when the batch came
};

WorkerLoop::WorkerLoop(const std::string& fds) : ring_(WorkerRing::adopt(RingFds::parse(fds))) {}

void WorkerLoop::serve(const LoopCallbacks& callbacks) {
  while (true) {
    Message message;
    bool received = false;
    {
      py::gil_scoped_release release;
      while (!(received = ring_.receive(&message))) {
        if (ring_.wait(-1) != WorkerRing::Wait::kMessage) break;
      }
    }
    if (!received) {
      if (callbacks.should_stop().cast<bool>()) return;
      continue;
    }
    if (message.kind == static_cast<uint32_t>(MessageKind::kExecute)) run(callbacks, message);
  }
}

void WorkerLoop::run(const LoopCallbacks& callbacks, const Message& execute) {
  Batch batch;
  batch.execute = execute;
  SharedRegion& inputs = ring_.inputs();
  Status status;
  if (execute.offset > UINT64_MAX - execute.length || !inputs.cover(execute.offset + execute.length)) {
    status = Status::Error(StatusCode::kInternal, "the batch lies outside the inputs arena");
  } else {
    batch.description.assign(reinterpret_cast<const char*>(inputs.data() + execute.offset), execute.length);
    status = decode_batch(batch.description, inputs.size(), &batch.described);
  }
  const size_t count = status.ok() ? batch.described.requests.size() : execute.count;
  std::string failure = status.ok() ? "" : status.message;
  py::object returned;
  if (failure.empty()) {
    batch.mapping = inputs.mapping();
    try {
      returned = callbacks.execute(requests_of(callbacks, batch));
      if (!PyList_Check(returned.ptr()) && !PyTuple_Check(returned.ptr())) returned = callbacks.resolve(returned);
      failure = check_responses(returned, count, callbacks.response_type);
    } catch (py::error_already_set& error) {
      if (!error.matches(PyExc_Exception)) throw;  // SystemExit, KeyboardInterrupt: the worker ends
      failure = callbacks.report(error.value()).cast<std::string>();
    } catch (const std::invalid_argument& error) {
      failure = error.what();
    }
  }
  std::vector<std::string> errors(count, failure);  // per response: why it failed ("" when it did not)
  std::vector<PlacedOutput> placed;
  std::vector<std::pair<size_t, size_t>> spans(count);  // each response's outputs in `placed`
  for (size_t i = 0; i < count && failure.empty(); ++i) {
    py::handle response = py::reinterpret_borrow<py::sequence>(returned)[i];
    if (response.attr("has_error")().cast<bool>()) {
      py::object error = response.attr("error")();
      errors[i] = error.is_none() ? "" : py::str(error.attr("message")()).cast<std::string>();
      if (errors[i].empty()) errors[i] = "the model's response has an error with no message";
      continue;
    }
    const auto& requested = batch.described.requests[i].requested_outputs;
    const size_t first = placed.size();
    try {
      for (py::handle tensor : response.attr("output_tensors")()) {
        std::string name = py::str(tensor.attr("name")()).cast<std::string>();
        if (!requested.empty() && std::find(requested.begin(), requested.end(), name) == requested.end()) continue;
        placed.push_back(place_output(std::move(name), tensor.attr("as_numpy")()));
      }
      spans[i] = {first, placed.size()};
    } catch (const std::invalid_argument& error) {
      placed.resize(first);
      errors[i] = error.what();
    }
  }
  write_answers(execute, errors, placed, spans);
}

void WorkerLoop::write_answers(const Message& execute, const std::vector<std::string>& errors,
                               const std::vector<PlacedOutput>& placed,
                               const std::vector<std::pair<size_t, size_t>>& spans) {
  // Every tensor's place, above the floor the server still reads below; the description after.
  size_t position = execute.floor;
  std::vector<size_t> offsets(placed.size());
  for (size_t k = 0; k < placed.size(); ++k) {
    offsets[k] = position;
    position += aligned(placed[k].nbytes);
  }
  std::vector<ResponseDescription> responses(errors.size());
  for (size_t i = 0; i < errors.size(); ++i) {
    if (!errors[i].empty()) {
      responses[i].ok = false;
      responses[i].error = errors[i];
      continue;
    }
    for (size_t k = spans[i].first; k < spans[i].second; ++k) {
      responses[i].outputs.push_back(
          TensorPlace{placed[k].name, placed[k].dtype, placed[k].shape, offsets[k], placed[k].nbytes});
    }
  }
  const std::string description = encode_responses(responses);
  SharedRegion& outputs = ring_.outputs();
  outputs.reserve(position + description.size());
  {
    py::gil_scoped_release release;
    std::byte* arena = outputs.data();
    for (size_t k = 0; k < placed.size(); ++k) {
      if (placed[k].nbytes != 0) std::memcpy(arena + offsets[k], placed[k].bytes(), placed[k].nbytes);
    }
    std::memcpy(arena + position, description.data(), description.size());
  }
  Message result;
  result.kind = static_cast<uint32_t>(MessageKind::kResult);
  result.count = static_cast<uint32_t>(errors.size());
  result.batch = execute.batch;
  result.offset = position;
  result.length = description.size();
  if (!ring_.send(result)) throw std::runtime_error("the server takes no answers: its ring is full");
}

py::list WorkerLoop::requests_of(const LoopCallbacks& callbacks, const Batch& batch) {
  static const py::module_ numpy = py::module_::import("numpy");
  // Every view of the batch keeps the mapping it views alive, past a remap of the arena.
  const py::capsule base(new std::shared_ptr<Mapping>(batch.mapping),
                         [](void* held) { delete static_cast<std::shared_ptr<Mapping>*>(held); });
  std::byte* arena = batch.mapping->data();
  py::list requests;
  for (size_t i = 0; i < batch.described.requests.size(); ++i) {
    const RequestDescription& request = batch.described.requests[i];
    py::list inputs;
    for (const TensorPlace& place : request.inputs) {
      py::object array;
      if (place.dtype == DataType::kBytes) {
        std::vector<size_t> offsets;
        if (!bytes_element_offsets(arena + place.offset, place.nbytes, &offsets)) {
          throw std::invalid_argument("input '" + std::string(place.name) + "' is not a serialized BYTES tensor");
        }
        py::list elements;
        for (size_t k = 0; k + 1 < offsets.size(); ++k) {
          const char* element = reinterpret_cast<const char*>(arena + place.offset + offsets[k] + 4);
          elements.append(py::bytes(element, offsets[k + 1] - offsets[k] - 4));
        }
        py::tuple shape(place.shape.size());
        for (size_t k = 0; k < place.shape.size(); ++k) shape[k] = py::int_(place.shape[k]);
        array = numpy.attr("array")(elements, py::arg("dtype") = "object").attr("reshape")(shape);
      } else {
        array = py::array(py::dtype(numpy_name(place.dtype)), place.shape, arena + place.offset, base);
      }
      inputs.append(py::make_tuple(text_of(place.name), array));
    }
    py::list requested;
    for (std::string_view name : request.requested_outputs) requested.append(text_of(name));
    const std::shared_ptr<Mapping> mapping = batch.mapping;
    const uint64_t flag = batch.described.cancel_offset + i;
    py::cpp_function cancelled([mapping, flag]() {
      return __atomic_load_n(reinterpret_cast<const uint8_t*>(mapping->data() + flag), __ATOMIC_ACQUIRE) != 0;
    });
    requests.append(
        callbacks.make_request(i, text_of(request.id), inputs, requested, text_of(request.parameters), cancelled));
  }
  return requests;
}

}  // namespace inferd::worker
