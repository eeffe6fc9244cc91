// libFuzzer target for the request path of the core: parse_infer_request on the raw bytes, then
// build_inference_request against a fixed model signature (once without shared memory, once with
// a registry holding one small system region, "region0", that tensors may name), then
// InferResponseWriter over fake outputs and stream_error_response. Built by -DINFERD_FUZZ=ON with clang, ASan and UBSan
// (see the INFERD_FUZZ block of CMakeLists.txt); run by `make fuzz` and `make fuzz-ci`.
//
// Besides the sanitizers' findings, the harness aborts when an invariant of the core breaks:
// a built request whose tensors do not match their own shapes, a response writer that leaves a
// byte of its size() unwritten, an answer that does not parse back to what was written, a request
// that builds without shared memory but not with it, or a shared-memory slice outside its region.
// Every allocation is freed before the call returns (libFuzzer's leak check stays on).

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "inferd/infer_request_parser.h"
#include "inferd/infer_response_writer.h"
#include "inferd/inference_request.h"
#include "inferd/model_signature.h"
#include "inferd/shared_memory.h"
#include "inferd/tensor.h"
#include "inferd/wire_format.h"

namespace {

using inferd::DataType;
using inferd::InputSignature;
using inferd::ModelSignature;
using inferd::OutputSignature;

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "infer_request_fuzzer: invariant broken: %s\n", what);
  std::abort();
}

#define FUZZ_CHECK(cond)      \
  do {                        \
    if (!(cond)) fail(#cond); \
  } while (0)

InputSignature input(std::string name, DataType dtype, std::vector<int64_t> dims) {
  InputSignature s;
  s.name = std::move(name);
  s.dtype = dtype;
  s.dims = std::move(dims);
  return s;
}

OutputSignature output(std::string name, DataType dtype, std::vector<int64_t> dims, bool has_reshape = false) {
  return OutputSignature{std::move(name), dtype, std::move(dims), has_reshape};
}

// The models the corpus (make_corpus.py) writes requests for. Each output i mirrors input i, so
// that the request's own inputs can stand in for the outputs.
std::vector<std::shared_ptr<const ModelSignature>> make_signatures() {
  std::vector<std::shared_ptr<const ModelSignature>> out;

  // A batching model: two INT32 inputs [-1, 16], two outputs.
  auto batching = std::make_shared<ModelSignature>();
  batching->name = "batch_int32";
  batching->version = "1";
  batching->max_batch_size = 8;
  batching->inputs = {input("INPUT0", DataType::kInt32, {16}), input("INPUT1", DataType::kInt32, {16})};
  batching->outputs = {output("OUTPUT0", DataType::kInt32, {16}), output("OUTPUT1", DataType::kInt32, {16})};
  out.push_back(batching);

  // A non-batching FP32 model whose input and output are reshaped: [-1, 4] <-> [-1, 2, 2].
  auto reshaped = std::make_shared<ModelSignature>();
  reshaped->name = "reshape_fp32";
  reshaped->version = "";
  reshaped->max_batch_size = 0;
  InputSignature x = input("INPUT0", DataType::kFp32, {-1, 4});
  x.has_reshape = true;
  x.reshape = {-1, 2, 2};
  reshaped->inputs = {x};
  reshaped->outputs = {output("OUTPUT0", DataType::kFp32, {-1, 4}, /*has_reshape=*/true)};
  out.push_back(reshaped);

  // Reshape with a variable dim on both sides, as the repository allows: FP32 [-1] <-> [-1, 2].
  auto variable = std::make_shared<ModelSignature>();
  variable->name = "reshape_var_fp32";
  variable->version = "1";
  variable->max_batch_size = 4;
  InputSignature v = input("INPUT0", DataType::kFp32, {-1});
  v.has_reshape = true;
  v.reshape = {-1, 2};
  variable->inputs = {v};
  variable->outputs = {output("OUTPUT0", DataType::kFp32, {-1}, /*has_reshape=*/true)};
  out.push_back(variable);

  // BYTES: UTF-8 text (ONNX strings) and an optional input that takes any bytes.
  auto strings = std::make_shared<ModelSignature>();
  strings->name = "bytes_text";
  strings->version = "2";
  strings->max_batch_size = 4;
  InputSignature text = input("TEXT", DataType::kBytes, {-1});
  text.utf8 = true;
  InputSignature extra = input("EXTRA", DataType::kBytes, {2});
  extra.optional = true;
  strings->inputs = {text, extra};
  strings->outputs = {output("TEXT_OUT", DataType::kBytes, {-1}), output("EXTRA_OUT", DataType::kBytes, {2})};
  out.push_back(strings);

  // Every datatype, each an optional input named after it (FP16 and BF16 can only come raw).
  auto every = std::make_shared<ModelSignature>();
  every->name = "all_types";
  every->version = "3";
  every->max_batch_size = 16;
  for (int code = 1; code <= 14; ++code) {
    const auto dtype = static_cast<DataType>(code);
    InputSignature in = input(inferd::datatype_name(dtype), dtype, {-1});
    in.optional = true;
    every->inputs.push_back(in);
    every->outputs.push_back(output(std::string("OUT_") + inferd::datatype_name(dtype), dtype, {-1}));
  }
  out.push_back(every);
  return out;
}

const std::vector<std::shared_ptr<const ModelSignature>>& signatures() {
  static const std::vector<std::shared_ptr<const ModelSignature>> all = make_signatures();
  return all;
}

// The model named by the request, else one chosen by the first byte.
const std::shared_ptr<const ModelSignature>& pick(std::string_view model_name, uint8_t first_byte) {
  for (const auto& s : signatures()) {
    if (s->name == model_name) return s;
  }
  return signatures()[first_byte % signatures().size()];
}

// The registry requests may name shared memory in: one system region, "region0", of
// kRegionBytes, over an object unlinked at once (the registry keeps its descriptor and mapping),
// so that nothing is left in /dev/shm. Each run fills it from the run's own bytes (deterministic:
// the same input finds the same region), which BYTES inputs in shared memory are parsed from.
constexpr uint64_t kRegionBytes = 4096;
constexpr const char* kRegionName = "region0";

const inferd::SharedMemoryRegistry& shared_memory() {
  static const std::unique_ptr<inferd::SharedMemoryRegistry> registry = [] {
    auto out = std::make_unique<inferd::SharedMemoryRegistry>();
    const std::string key = "/inferd-fuzz-" + std::to_string(getpid());
    const int fd = shm_open(key.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(kRegionBytes)) != 0) fail("cannot create a shared-memory object");
    close(fd);
    const inferd::Status status = out->register_system(kRegionName, key, 0, kRegionBytes);
    shm_unlink(key.c_str());
    if (!status.ok()) fail(status.message.c_str());
    return out;
  }();
  return *registry;
}

void fill_region(const uint8_t* data, size_t size) {
  inferd::SharedMemorySlice region;
  FUZZ_CHECK(shared_memory().slice(kRegionName, 0, kRegionBytes, &region).ok());
  std::vector<std::byte> bytes(kRegionBytes);
  if (size > 0) std::memcpy(bytes.data(), data, std::min<size_t>(size, kRegionBytes));
  std::string error;
  FUZZ_CHECK(inferd::copy_to_slice(region, bytes.data(), bytes.size(), &error));
}

// Whether [data, data + size) lies within region0's mapping.
bool within_region(const std::byte* data, size_t size) {
  inferd::SharedMemorySlice region;
  FUZZ_CHECK(shared_memory().slice(kRegionName, 0, kRegionBytes, &region).ok());
  return data >= region.data && size <= kRegionBytes &&
         data - region.data <= static_cast<ptrdiff_t>(kRegionBytes - size);
}

// The shared-memory output of `index`, if the request asked for one.
const inferd::SharedMemoryOutput* shared_memory_output(const inferd::InferenceRequest& request, uint32_t index) {
  for (const auto& target : request.shared_memory_outputs) {
    if (target.output == index) return &target;
  }
  return nullptr;
}

// Walks a serialized message; returns false unless it is a well-formed sequence of fields.
bool well_formed(std::string_view bytes) {
  inferd::WireReader reader(bytes);
  while (!reader.done()) {
    uint32_t field = 0;
    inferd::WireType type{};
    if (!reader.read_tag(&field, &type) || !reader.skip(type)) return false;
  }
  return true;
}

// The fields `field` of a message, as views (length-delimited fields only; aborts on others).
std::vector<std::string_view> fields(std::string_view message, uint32_t wanted) {
  std::vector<std::string_view> out;
  inferd::WireReader reader(message);
  while (!reader.done()) {
    uint32_t field = 0;
    inferd::WireType type{};
    FUZZ_CHECK(reader.read_tag(&field, &type));
    if (field == wanted) {
      std::string_view value;
      FUZZ_CHECK(type == inferd::WireType::kLengthDelimited && reader.read_bytes(&value));
      out.push_back(value);
    } else {
      FUZZ_CHECK(reader.skip(type));
    }
  }
  return out;
}

// Writes the answer into two buffers of exactly size() bytes, pre-filled differently: a byte the
// writer left out differs between them. Then reads the answer back.
void check_writer(const inferd::InferenceRequest& request, const std::vector<inferd::Tensor>& outputs, bool stream) {
  const inferd::InferResponseWriter writer(request, outputs, stream);
  // The fake outputs are the built inputs, whose shapes passed the same reshape: always writable,
  // unless a shared-memory slice the request gave is too small for its output.
  if (!writer.status().ok()) {
    FUZZ_CHECK(writer.status().code == inferd::StatusCode::kInvalidArgument && !request.shared_memory_outputs.empty());
    return;
  }
  const size_t size = writer.size();
  std::unique_ptr<std::byte[]> a(new std::byte[size]);
  std::unique_ptr<std::byte[]> b(new std::byte[size]);
  if (size > 0) {
    std::memset(a.get(), 0x00, size);
    std::memset(b.get(), 0xFF, size);
  }
  writer.write(a.get());
  writer.write(b.get());
  FUZZ_CHECK(size == 0 || std::memcmp(a.get(), b.get(), size) == 0);

  std::string_view message(reinterpret_cast<const char*>(a.get()), size);
  if (stream) {
    const auto wrapped = fields(message, 2);
    FUZZ_CHECK(wrapped.size() == 1);
    FUZZ_CHECK(inferd::length_delimited_size(2, wrapped[0].size()) == size);
    message = wrapped[0];
  }
  FUZZ_CHECK(well_formed(message));
  const auto tensors = fields(message, 5);
  const auto raw = fields(message, 6);
  const size_t expected = request.requested_outputs.empty() ? outputs.size() : request.requested_outputs.size();
  FUZZ_CHECK(tensors.size() == expected && raw.size() == expected);
  size_t data_bytes = 0;
  for (size_t i = 0; i < expected; ++i) {
    const uint32_t index = request.requested_outputs.empty() ? static_cast<uint32_t>(i) : request.requested_outputs[i];
    const inferd::Tensor& t = outputs[index];
    FUZZ_CHECK(well_formed(tensors[i]));
    if (const inferd::SharedMemoryOutput* target = shared_memory_output(request, index)) {
      // Written into the region (an empty raw entry here), unless a later output overlapped it.
      FUZZ_CHECK(raw[i].empty());
      FUZZ_CHECK(t.byte_size <= target->slice.size);
      bool overlapped = false;
      for (const auto& other : request.shared_memory_outputs) {
        overlapped |= &other != target && other.slice.data < target->slice.data + t.byte_size &&
                      target->slice.data < other.slice.data + other.slice.size;
      }
      FUZZ_CHECK(overlapped || t.byte_size == 0 || std::memcmp(target->slice.data, t.data, t.byte_size) == 0);
      continue;
    }
    FUZZ_CHECK(raw[i].size() == t.byte_size);
    FUZZ_CHECK(t.byte_size == 0 || std::memcmp(raw[i].data(), t.data, t.byte_size) == 0);
    const auto names = fields(tensors[i], 1);
    const std::string& want = request.signature->outputs[index].name;
    FUZZ_CHECK(names.empty() ? want.empty() : names.back() == want);
    data_bytes += t.byte_size;
  }
  FUZZ_CHECK(data_bytes == writer.data_bytes());
}

void check_stream_error(const std::string& message, std::string_view id) {
  const std::string answer = inferd::stream_error_response(message, id);
  FUZZ_CHECK(well_formed(answer));
  const auto errors = fields(answer, 1);
  FUZZ_CHECK(message.empty() ? errors.empty() : (errors.size() == 1 && errors[0] == message));
  const auto responses = fields(answer, 2);
  FUZZ_CHECK(responses.size() == 1);
  const auto ids = fields(responses[0], 3);
  FUZZ_CHECK(id.empty() ? ids.empty() : (ids.size() == 1 && ids[0] == id));
}

// What a built request promises: model order, the model's datatypes, tensors that match their
// shapes (after reshape), a batch size within the model's bounds.
void check_built(const ModelSignature& model, const inferd::InferenceRequest& request) {
  FUZZ_CHECK(request.checked);
  FUZZ_CHECK(request.inputs.size() == model.inputs.size());
  if (model.max_batch_size > 0) {
    FUZZ_CHECK(request.batch_size >= 1 && request.batch_size <= model.max_batch_size);
  } else {
    FUZZ_CHECK(request.batch_size == 1);
  }
  for (size_t i = 0; i < model.inputs.size(); ++i) {
    const inferd::Tensor& t = request.inputs[i];
    FUZZ_CHECK(t.dtype == model.inputs[i].dtype);
    FUZZ_CHECK(!t.absent || model.inputs[i].optional);
    FUZZ_CHECK(inferd::validate_tensor(t).ok());
    if (t.client_memory != nullptr) {
      FUZZ_CHECK(t.data == t.client_memory->data && t.byte_size == t.client_memory->size);
      FUZZ_CHECK(within_region(t.data, t.byte_size));
    }
    if (!t.absent && model.max_batch_size > 0) FUZZ_CHECK(!t.shape.empty() && t.shape[0] == request.batch_size);
  }
  for (uint32_t index : request.requested_outputs) FUZZ_CHECK(index < model.outputs.size());
  for (const auto& target : request.shared_memory_outputs) {
    FUZZ_CHECK(std::find(request.requested_outputs.begin(), request.requested_outputs.end(), target.output) !=
               request.requested_outputs.end());
    FUZZ_CHECK(within_region(target.slice.data, target.slice.size));
  }
}

// Every model output, in model order: input i's tensor where its datatype matches (each
// model mirrors its inputs), else an empty tensor of the output's datatype. An input in shared
// memory is copied out first (copy_from_slice), as the batch's gather does: an executor's
// outputs are never the client's region.
std::vector<inferd::Tensor> fake_outputs(const ModelSignature& model, const inferd::InferenceRequest& request) {
  std::vector<inferd::Tensor> outputs;
  for (size_t i = 0; i < model.outputs.size(); ++i) {
    if (i < request.inputs.size() && request.inputs[i].dtype == model.outputs[i].dtype) {
      inferd::Tensor tensor = request.inputs[i];
      if (tensor.client_memory != nullptr) {
        auto copy = std::make_shared<std::vector<std::byte>>(tensor.byte_size);
        std::string error;
        FUZZ_CHECK(inferd::copy_from_slice(copy->data(), *tensor.client_memory, tensor.byte_size, &error));
        tensor.data = copy->data();
        tensor.owner = copy;
        tensor.client_memory = nullptr;
      }
      outputs.push_back(std::move(tensor));
    } else {
      inferd::Tensor empty;
      empty.dtype = model.outputs[i].dtype;
      empty.shape = {0};
      outputs.push_back(empty);
    }
  }
  return outputs;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The request owns a copy of its bytes (exactly sized, so ASan sees any read past the end), as
  // the binding's WireRequest owns the Python bytes object.
  auto bytes = std::make_shared<std::vector<std::byte>>(size);
  if (size > 0) std::memcpy(bytes->data(), data, size);

  inferd::ParsedInferRequest parsed;
  inferd::Status status = inferd::parse_infer_request(bytes->data(), bytes->size(), &parsed);
  if (!status.ok()) {
    FUZZ_CHECK(status.code == inferd::StatusCode::kInvalidArgument && !status.message.empty());
    check_stream_error(status.message, {});
    return 0;
  }
  const std::shared_ptr<const ModelSignature>& signature = pick(parsed.model_name, size > 0 ? data[0] : 0);
  // Where shared memory is not allowed (a listener without it): refused, never read.
  inferd::InferenceRequest without;
  const inferd::Status refused = inferd::build_inference_request(signature, parsed, bytes, &without, nullptr);
  FUZZ_CHECK(refused.ok() || refused.code == inferd::StatusCode::kInvalidArgument ||
             refused.code == inferd::StatusCode::kUnimplemented ||
             refused.code == inferd::StatusCode::kPermissionDenied);
  if (!refused.ok()) check_stream_error(refused.message, parsed.id);

  fill_region(data, size);
  inferd::InferenceRequest request;
  status = inferd::build_inference_request(signature, parsed, bytes, &request, &shared_memory());
  // What builds without shared memory builds the same with it.
  FUZZ_CHECK(!refused.ok() || status.ok());
  if (!status.ok()) {
    FUZZ_CHECK(status.code == inferd::StatusCode::kInvalidArgument ||
               status.code == inferd::StatusCode::kUnimplemented);
    check_stream_error(status.message, parsed.id);
    return 0;
  }
  check_built(*signature, request);
  const std::vector<inferd::Tensor> outputs = fake_outputs(*signature, request);
  check_writer(request, outputs, /*stream=*/false);
  check_writer(request, outputs, /*stream=*/true);
  return 0;
}
