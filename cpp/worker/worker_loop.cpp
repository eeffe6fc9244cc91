#include "worker_loop.h"

#include <pybind11/numpy.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>
#include <stdexcept>
#include <thread>
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

// Whether the model gave `request` back for another step (Triton's
// set_release_flags(TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)).
bool rescheduled(py::handle request) {
  constexpr int kReleaseReschedule = 2;
  return (py::getattr(request, "_release_flags", py::int_(1)).cast<int>() & kReleaseReschedule) != 0;
}

// Why `returned` is not one InferenceResponse per request ("" when it is): None in the place of a
// request the model rescheduled, and only there.
std::string check_responses(py::handle returned, const py::list& requests, py::handle response_type) {
  const size_t expected = requests.size();
  if (!PyList_Check(returned.ptr()) && !PyTuple_Check(returned.ptr())) {
    return "execute must return a list of InferenceResponse, got " + type_name(returned);
  }
  const py::sequence responses = py::reinterpret_borrow<py::sequence>(returned);
  if (responses.size() != expected) {
    return "execute returned " + std::to_string(responses.size()) + " responses for " + std::to_string(expected) +
           " requests: it must return one InferenceResponse per request, in order";
  }
  for (size_t i = 0; i < responses.size(); ++i) {
    const bool again = rescheduled(requests[i]);
    if (again != responses[i].is_none()) {
      return again ? "execute returned a response for request " + std::to_string(i) +
                         ", which it rescheduled (set_release_flags(TRITONSERVER_REQUEST_RELEASE_RESCHEDULE)): "
                         "its place must hold None"
                   : "execute returned None at position " + std::to_string(i) + " for a request it did not reschedule";
    }
    if (!again && !py::isinstance(responses[i], response_type)) {
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
      std::unique_lock<std::mutex> lock(mutex_);
      receive_until(lock, [this] { return !executes_.empty() || woken_; });
      if (!executes_.empty()) {
        message = executes_.front();
        executes_.pop_front();
        received = true;
      } else {
        woken_ = false;
      }
    }
    if (!received) {
      if (callbacks.should_stop().cast<bool>()) return;
      continue;
    }
    run(callbacks, message);
  }
}

template <typename Done>
void WorkerLoop::receive_until(std::unique_lock<std::mutex>& lock, Done done) {
  while (!done()) {
    // Messages are taken only with the lock held: end_batch() sees every answer that came.
    if (take_messages()) continue;
    if (receiving_) {
      changed_.wait(lock);
      continue;
    }
    receiving_ = true;
    lock.unlock();
    const WorkerRing::Wait waited = ring_.wait(-1);  // a message in (not taken), or a wake()
    lock.lock();
    receiving_ = false;
    if (waited == WorkerRing::Wait::kWoken) woken_ = true;
    changed_.notify_all();
  }
}

bool WorkerLoop::take_messages() {
  Message message;
  bool took = false;
  while (ring_.receive(&message)) {
    dispatch(message);
    took = true;
  }
  if (took) changed_.notify_all();
  return took;
}

void WorkerLoop::dispatch(const Message& message) {
  if (message.kind == static_cast<uint32_t>(MessageKind::kExecute)) {
    executes_.push_back(message);
    return;
  }
  if (message.kind != static_cast<uint32_t>(MessageKind::kCallResult)) return;
  auto open = calls_.find(message.batch);
  if (open == calls_.end()) return;  // answered late: the arena may hold the next batch by now
  ++answers_taken_;
  CallReply& reply = open->second->reply;
  SharedRegion& inputs = ring_.inputs();
  Status status;
  CallAnswerDescription answer;
  std::string description;
  if (message.offset > UINT64_MAX - message.length || !inputs.cover(message.offset + message.length)) {
    status = Status::Error(StatusCode::kInternal, "the call's answer lies outside the inputs arena");
  } else {
    description.assign(reinterpret_cast<const char*>(inputs.data() + message.offset), message.length);
    status = decode_call_answer(description, inputs.size(), &answer);
  }
  if (!status.ok()) {
    reply.code = status.code;
    reply.error = status.message;
  } else {
    reply.code = answer.code;
    reply.error = std::string(answer.error);
    for (const TensorPlace& place : answer.outputs) {
      reply.outputs.push_back(
          CallReply::Output{std::string(place.name), place.dtype, place.shape,
                            std::string(reinterpret_cast<const char*>(inputs.data() + place.offset), place.nbytes)});
    }
  }
  open->second->answered = true;
  calls_.erase(open);
}

void WorkerLoop::end_batch() {
  take_messages();  // the answers that came: the result says how many were taken
  batch_ = 0;
  for (auto& [number, open] : calls_) open->late = true;
  const bool late = !calls_.empty();
  calls_.clear();
  changed_.notify_all();
  if (late && receiving_) ring_.wake();  // a caller may be the one receiving: it looks again
}

py::object WorkerLoop::call(uint64_t number, const std::string& model, int64_t version, const std::string& id,
                            const py::list& parameters, const std::vector<std::string>& chain,
                            const std::vector<std::string>& requested, uint64_t timeout_us, const py::list& inputs) {
  CallDescription described;
  described.model = model;
  described.version = version;
  described.id = id;
  std::vector<std::string> texts;  // what the parameters' views point at
  texts.reserve(parameters.size() * 2);
  for (py::handle item : parameters) {
    const py::tuple pair = item.cast<py::tuple>();
    CallParameter parameter;
    parameter.key = texts.emplace_back(pair[0].cast<std::string>());
    py::handle value = pair[1];
    if (PyBool_Check(value.ptr())) {
      parameter.kind = CallParameter::Kind::kBool;
      parameter.number = value.cast<bool>() ? 1 : 0;
    } else if (PyLong_Check(value.ptr())) {
      parameter.kind = CallParameter::Kind::kInt64;
      parameter.number = value.cast<int64_t>();
    } else if (PyUnicode_Check(value.ptr())) {
      parameter.kind = CallParameter::Kind::kString;
      parameter.text = texts.emplace_back(value.cast<std::string>());
    } else {
      throw std::invalid_argument("a request parameter must be a bool, int or str, got " + type_name(value));
    }
    described.parameters.push_back(parameter);
  }
  for (const std::string& name : chain) described.chain.push_back(name);
  for (const std::string& name : requested) described.requested_outputs.push_back(name);
  described.timeout_us = timeout_us;
  std::optional<CallReply> reply = send_call(number, described, inputs);
  if (!reply) return py::none();
  if (reply->late) return py::make_tuple(py::none(), 0, "");
  static const py::module_ numpy = py::module_::import("numpy");
  py::list outputs;
  for (CallReply::Output& output : reply->outputs) {
    py::object array;
    if (output.dtype == DataType::kBytes) {
      const auto* data = reinterpret_cast<const std::byte*>(output.bytes.data());
      std::vector<size_t> offsets;
      if (!bytes_element_offsets(data, output.bytes.size(), &offsets)) {
        return py::make_tuple(py::list(), static_cast<int>(StatusCode::kInternal),
                              "output '" + output.name + "' is not a serialized BYTES tensor");
      }
      py::list elements;
      for (size_t k = 0; k + 1 < offsets.size(); ++k) {
        elements.append(py::bytes(output.bytes.data() + offsets[k] + 4, offsets[k + 1] - offsets[k] - 4));
      }
      py::tuple shape(output.shape.size());
      for (size_t k = 0; k < output.shape.size(); ++k) shape[k] = py::int_(output.shape[k]);
      array = numpy.attr("array")(elements, py::arg("dtype") = "object").attr("reshape")(shape);
    } else {
      // The array owns the copied bytes: no second copy.
      auto* owned = new std::string(std::move(output.bytes));
      const py::capsule base(owned, [](void* held) { delete static_cast<std::string*>(held); });
      array = py::array(py::dtype(numpy_name(output.dtype)), output.shape, owned->data(), base);
    }
    outputs.append(py::make_tuple(text_of(output.name), array));
  }
  return py::make_tuple(outputs, static_cast<int>(reply->code), text_of(reply->error));
}

std::optional<WorkerLoop::CallReply> WorkerLoop::send_call(uint64_t number, const CallDescription& described,
                                                           const py::list& inputs) {
  std::vector<PlacedOutput> placed;
  for (py::handle input : inputs) {
    const py::tuple named = input.cast<py::tuple>();
    placed.push_back(place_output(named[0].cast<std::string>(), named[1]));
  }
  py::gil_scoped_release release;
  std::unique_lock<std::mutex> lock(mutex_);
  if (batch_ == 0) return std::nullopt;
  CallDescription call = described;
  uint64_t position = scratch_;
  call.inputs.clear();
  for (const PlacedOutput& input : placed) {
    call.inputs.push_back(TensorPlace{input.name, input.dtype, input.shape, position, input.nbytes});
    position += aligned(input.nbytes);
  }
  const std::string description = encode_call(call);
  SharedRegion& outputs = ring_.outputs();
  outputs.reserve(position + description.size());
  std::byte* arena = outputs.data();
  for (size_t k = 0; k < placed.size(); ++k) {
    if (placed[k].nbytes != 0) std::memcpy(arena + call.inputs[k].offset, placed[k].bytes(), placed[k].nbytes);
  }
  std::memcpy(arena + position, description.data(), description.size());
  scratch_ = aligned(position + description.size());
  Message message;
  message.kind = static_cast<uint32_t>(MessageKind::kCall);
  message.batch = number;
  message.floor = batch_;
  message.offset = position;
  message.length = description.size();
  if (!ring_.send(message)) throw std::runtime_error("the server takes no calls: its ring is full");
  auto open = std::make_shared<OpenCall>();
  calls_[message.batch] = open;
  receive_until(lock, [&open] { return open->answered || open->late; });
  if (!open->answered) {
    CallReply late;
    late.late = true;
    return late;
  }
  return std::move(open->reply);
  // `placed` holds arrays: it goes after `release` took the GIL back.
}

void WorkerLoop::respond(uint64_t batch, uint32_t index, bool final, const py::object& outputs,
                         const py::object& error) {
  std::vector<PlacedOutput> placed;
  ResponseDescription response;
  std::string message;  // what response.error views
  const bool responds = !outputs.is_none() || !error.is_none();
  if (!error.is_none()) {
    message = error.cast<std::string>();
    response.ok = false;
    response.error = message;
  } else if (!outputs.is_none()) {
    for (py::handle output : outputs) {
      const py::tuple named = output.cast<py::tuple>();
      placed.push_back(place_output(named[0].cast<std::string>(), named[1]));
    }
  }
  py::gil_scoped_release release;
  std::unique_lock<std::mutex> lock(mutex_);
  // Waits, the lock let go, until `ready()`: the server's reader takes messages as they come, so
  // a wait is short unless the server stops (which kills this process).
  auto wait_for = [&lock](auto ready) {
    auto pause = std::chrono::microseconds(20);
    while (!ready()) {
      lock.unlock();
      std::this_thread::sleep_for(pause);
      pause = std::min<std::chrono::microseconds>(pause * 2, std::chrono::milliseconds(1));
      lock.lock();
    }
  };
  std::string description;
  uint64_t position = 0;
  // Places the tensors from `start` on and describes them; returns where the description goes.
  auto place_from = [&](uint64_t start) {
    response.outputs.clear();
    for (const PlacedOutput& output : placed) {
      response.outputs.push_back(TensorPlace{output.name, output.dtype, output.shape, start, output.nbytes});
      start += aligned(output.nbytes);
    }
    description = encode_responses({response});
    return start;
  };
  SharedRegion& arena = ring_.outputs();
  Message sent;
  sent.kind = static_cast<uint32_t>(MessageKind::kResponse);
  sent.batch = batch;
  sent.count = index;
  sent.floor = final ? 1 : 0;
  if (responds) {
    position = place_from(stream_position_);
    if (position + description.size() > arena.size()) {
      // From the start again, once the server has copied out every response in the arena.
      wait_for([this] { return ring_.streamed_taken() == streamed_sent_; });
      position = place_from(0);
      arena.reserve(position + description.size());
    }
    std::byte* data = arena.data();
    for (size_t k = 0; k < placed.size(); ++k) {
      if (placed[k].nbytes != 0) std::memcpy(data + response.outputs[k].offset, placed[k].bytes(), placed[k].nbytes);
    }
    std::memcpy(data + position, description.data(), description.size());
    sent.offset = position;
    sent.length = description.size();
    stream_position_ = aligned(position + description.size());
  }
  wait_for([&] { return ring_.send(sent); });
  ++streamed_sent_;
  lock.unlock();
  // `placed` holds arrays: it goes after `release` took the GIL back.
}

void WorkerLoop::run(const LoopCallbacks& callbacks, const Message& execute) {
  Batch batch;
  batch.execute = execute;
  Status status;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    SharedRegion& inputs = ring_.inputs();
    if (execute.offset > UINT64_MAX - execute.length || !inputs.cover(execute.offset + execute.length)) {
      status = Status::Error(StatusCode::kInternal, "the batch lies outside the inputs arena");
    } else {
      batch.description.assign(reinterpret_cast<const char*>(inputs.data() + execute.offset), execute.length);
      status = decode_batch(batch.description, inputs.size(), &batch.described);
    }
    batch.mapping = inputs.mapping();
    batch_ = execute.batch;
    scratch_ = execute.floor;
    answers_taken_ = 0;
  }
  const size_t count = status.ok() ? batch.described.requests.size() : execute.count;
  std::string failure = status.ok() ? "" : status.message;
  py::object returned;
  py::list requests;
  if (failure.empty()) {
    try {
      requests = requests_of(callbacks, batch);
      returned = callbacks.execute(requests);
      if (!PyList_Check(returned.ptr()) && !PyTuple_Check(returned.ptr())) returned = callbacks.resolve(returned);
      failure = check_responses(returned, requests, callbacks.response_type);
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
  std::vector<bool> again(count, false);                // rescheduled
  for (size_t i = 0; i < count && failure.empty(); ++i) {
    py::handle response = py::reinterpret_borrow<py::sequence>(returned)[i];
    if (response.is_none()) {  // checked: the model rescheduled it
      again[i] = true;
      continue;
    }
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
  write_answers(execute, errors, placed, spans, again);
}

void WorkerLoop::write_answers(const Message& execute, const std::vector<std::string>& errors,
                               const std::vector<PlacedOutput>& placed,
                               const std::vector<std::pair<size_t, size_t>>& spans,
                               const std::vector<bool>& rescheduled) {
  py::gil_scoped_release release;
  std::lock_guard<std::mutex> lock(mutex_);
  end_batch();
  // Every tensor's place, above the floor the server still reads below and the batch's calls; the
  // description after.
  size_t position = std::max<uint64_t>(execute.floor, scratch_);
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
    responses[i].rescheduled = i < rescheduled.size() && rescheduled[i];
    for (size_t k = spans[i].first; k < spans[i].second; ++k) {
      responses[i].outputs.push_back(
          TensorPlace{placed[k].name, placed[k].dtype, placed[k].shape, offsets[k], placed[k].nbytes});
    }
  }
  const std::string description = encode_responses(responses);
  SharedRegion& outputs = ring_.outputs();
  outputs.reserve(position + description.size());
  std::byte* arena = outputs.data();
  for (size_t k = 0; k < placed.size(); ++k) {
    if (placed[k].nbytes != 0) std::memcpy(arena + offsets[k], placed[k].bytes(), placed[k].nbytes);
  }
  std::memcpy(arena + position, description.data(), description.size());
  Message result;
  result.kind = static_cast<uint32_t>(MessageKind::kResult);
  result.count = static_cast<uint32_t>(errors.size());
  result.batch = execute.batch;
  result.offset = position;
  result.length = description.size();
  result.floor = answers_taken_;
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
    // pb_utils' correlation_id(): the string id when the sequence has one, else the number.
    const py::object correlation = request.correlation_string.empty() ? py::object(py::int_(request.correlation_id))
                                                                      : py::object(text_of(request.correlation_string));
    py::cpp_function cancelled([mapping, flag]() {
      return __atomic_load_n(reinterpret_cast<const uint8_t*>(mapping->data() + flag), __ATOMIC_ACQUIRE) != 0;
    });
    requests.append(callbacks.make_request(i, text_of(request.id), inputs, requested, text_of(request.parameters),
                                           cancelled, correlation, request.flags));
  }
  return requests;
}

}  // namespace inferd::worker
