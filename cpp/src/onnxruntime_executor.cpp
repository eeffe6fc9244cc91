#include "inferd/onnxruntime_executor.h"

#include <onnxruntime_cxx_api.h>  // built with ORT_API_MANUAL_INIT: the API comes from OnnxRuntimeLibrary

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <map>
#include <utility>

#include "inferd/onnxruntime_library.h"

namespace inferd {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }

bool is_identifier(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
}

// Whether `token` is a source location: "<path>.<source extension>:<line>".
bool is_source_location(std::string_view token) {
  const size_t colon = token.rfind(':');
  if (colon == std::string_view::npos || colon + 1 == token.size()) return false;
  for (size_t i = colon + 1; i < token.size(); ++i) {
    if (token[i] < '0' || token[i] > '9') return false;
  }
  const size_t dot = token.rfind('.', colon);
  if (dot == std::string_view::npos) return false;
  const std::string_view extension = token.substr(dot + 1, colon - dot - 1);
  for (std::string_view known : {"cc", "cpp", "cxx", "c", "h", "hpp", "cu", "cuh", "inl"}) {
    if (extension == known) return true;
  }
  return false;
}

// Length of the C++ function signature ORT writes after a source location ("ns::Class::f(args)"
// and the spaces after it), or 0 when `text` does not start with one.
size_t signature_length(std::string_view text) {
  size_t i = 0;
  while (i < text.size() && (is_identifier(text[i]) || text[i] == ':' || text[i] == '~' || text[i] == '<' ||
                             text[i] == '>' || text[i] == ',')) {
    ++i;
  }
  if (i == 0 || i == text.size() || text[i] != '(') return 0;
  int depth = 0;
  for (; i < text.size(); ++i) {
    if (text[i] == '(') ++depth;
    if (text[i] == ')' && --depth == 0) break;
  }
  if (i == text.size()) return 0;
  ++i;
  while (i < text.size() && is_space(text[i])) ++i;
  return i;
}

struct TypeEntry {
  DataType dtype;
  ONNXTensorElementDataType onnx;
  const char* name;  // as in the KServe protocol
};

constexpr TypeEntry kTypes[] = {
    {DataType::kBool, ONNX_TENSOR_ELEMENT_DATA_TYPE_BOOL, "BOOL"},
    {DataType::kUint8, ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT8, "UINT8"},
    {DataType::kUint16, ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT16, "UINT16"},
    {DataType::kUint32, ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT32, "UINT32"},
    {DataType::kUint64, ONNX_TENSOR_ELEMENT_DATA_TYPE_UINT64, "UINT64"},
    {DataType::kInt8, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT8, "INT8"},
    {DataType::kInt16, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT16, "INT16"},
    {DataType::kInt32, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT32, "INT32"},
    {DataType::kInt64, ONNX_TENSOR_ELEMENT_DATA_TYPE_INT64, "INT64"},
    {DataType::kFp16, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16, "FP16"},
    {DataType::kFp32, ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT, "FP32"},
    {DataType::kFp64, ONNX_TENSOR_ELEMENT_DATA_TYPE_DOUBLE, "FP64"},
    {DataType::kBytes, ONNX_TENSOR_ELEMENT_DATA_TYPE_STRING, "BYTES"},
    {DataType::kBf16, ONNX_TENSOR_ELEMENT_DATA_TYPE_BFLOAT16, "BF16"},
};

const TypeEntry* by_datatype(DataType dtype) {
  for (const TypeEntry& entry : kTypes) {
    if (entry.dtype == dtype) return &entry;
  }
  return nullptr;
}

const TypeEntry* by_onnx(ONNXTensorElementDataType onnx) {
  for (const TypeEntry& entry : kTypes) {
    if (entry.onnx == onnx) return &entry;
  }
  return nullptr;
}

std::string type_name(ONNXTensorElementDataType onnx) {
  const TypeEntry* entry = by_onnx(onnx);
  return entry != nullptr ? entry->name : "ONNX element type " + std::to_string(static_cast<int>(onnx));
}

std::string type_name(DataType dtype) {
  const TypeEntry* entry = by_datatype(dtype);
  return entry != nullptr ? entry->name : "datatype " + std::to_string(static_cast<int>(dtype));
}

// The element type of a tensor input or output; UNDEFINED for anything else (a sequence, a map).
ONNXTensorElementDataType element_type(const Ort::TypeInfo& info) {
  if (info.GetONNXType() != ONNX_TYPE_TENSOR) return ONNX_TENSOR_ELEMENT_DATA_TYPE_UNDEFINED;
  return info.GetTensorTypeAndShapeInfo().GetElementType();
}

// Session's constructor takes an Ort::Env, which would release the environment it wraps; the
// library owns the process's one and never releases it (see OnnxRuntimeLibrary).
class BorrowedEnv {
 public:
  explicit BorrowedEnv(OrtEnv* env) : env_(env) {}
  ~BorrowedEnv() { env_.release(); }
  BorrowedEnv(const BorrowedEnv&) = delete;
  BorrowedEnv& operator=(const BorrowedEnv&) = delete;
  const Ort::Env& get() const { return env_; }

 private:
  Ort::Env env_;
};

std::string join(const std::vector<std::string>& names) {
  std::string out;
  for (const std::string& name : names) out += (out.empty() ? "" : ", ") + name;
  return out;
}

}  // namespace

struct OnnxRuntimeExecutor::Session {
  OnnxRuntimeExecutorOptions options;
  Ort::Session session{nullptr};
  Ort::MemoryInfo cpu{nullptr};           // where inputs live: ordinary host memory
  std::vector<const char*> input_names;   // point into options.input_names
  std::vector<const char*> output_names;  // point into options.output_names
  std::vector<DataType> input_types;
};

OnnxRuntimeExecutor::OnnxRuntimeExecutor(Key, std::unique_ptr<Session> session) : session_(std::move(session)) {}

OnnxRuntimeExecutor::~OnnxRuntimeExecutor() = default;

const std::vector<DataType>& OnnxRuntimeExecutor::input_types() const { return session_->input_types; }

Status OnnxRuntimeExecutor::Create(OnnxRuntimeExecutorOptions options, std::unique_ptr<OnnxRuntimeExecutor>* out) {
  const OnnxRuntimeLibrary* library = OnnxRuntimeLibrary::Loaded();
  if (library == nullptr) {
    return Status::Error(
        StatusCode::kUnavailable,
        options.model_path + ": ONNX Runtime's library is not loaded, so the native executor cannot run it");
  }
  if (options.output_names.size() != options.output_types.size()) {
    return Status::Error(StatusCode::kInvalidArgument,
                         options.model_path + ": " + std::to_string(options.output_names.size()) +
                             " output names but " + std::to_string(options.output_types.size()) + " datatypes");
  }
  auto session = std::make_unique<Session>();
  session->options = std::move(options);
  const OnnxRuntimeExecutorOptions& opts = session->options;
  std::map<std::string, ONNXTensorElementDataType> model_inputs;
  std::map<std::string, ONNXTensorElementDataType> model_outputs;
  try {
    Ort::SessionOptions session_options;
    session_options.SetIntraOpNumThreads(opts.intra_op_threads);
    session_options.SetInterOpNumThreads(opts.inter_op_threads);
    // ORT's pool threads spin after each run by default, taking the cores the gRPC front end and
    // the core's workers need between batches.
    session_options.AddConfigEntry("session.intra_op.allow_spinning", "0");
    session_options.AddConfigEntry("session.inter_op.allow_spinning", "0");
    session_options.SetGraphOptimizationLevel(static_cast<GraphOptimizationLevel>(opts.graph_optimization_level));
    BorrowedEnv env(library->env());
    session->session = Ort::Session(env.get(), opts.model_path.c_str(), session_options);
    session->cpu = Ort::MemoryInfo::CreateCpu(OrtArenaAllocator, OrtMemTypeDefault);

    Ort::AllocatorWithDefaultOptions allocator;
    const Ort::Session& s = session->session;
    for (size_t i = 0; i < s.GetInputCount(); ++i) {
      model_inputs[s.GetInputNameAllocated(i, allocator).get()] = element_type(s.GetInputTypeInfo(i));
    }
    // Optional inputs: initializers a request may override.
    for (size_t i = 0; i < s.GetOverridableInitializerCount(); ++i) {
      model_inputs[s.GetOverridableInitializerNameAllocated(i, allocator).get()] =
          element_type(s.GetOverridableInitializerTypeInfo(i));
    }
    for (size_t i = 0; i < s.GetOutputCount(); ++i) {
      model_outputs[s.GetOutputNameAllocated(i, allocator).get()] = element_type(s.GetOutputTypeInfo(i));
    }
  } catch (const std::exception& error) {  // Ort::Exception, or bad_alloc
    return Status::Error(StatusCode::kInvalidArgument,
                         opts.model_path + ": ONNX Runtime cannot load it: " + error.what());
  }

  auto model_names = [](const std::map<std::string, ONNXTensorElementDataType>& tensors) {
    std::vector<std::string> names;
    for (const auto& entry : tensors) names.push_back(entry.first);
    return join(names);
  };
  for (const std::string& name : opts.input_names) {
    auto found = model_inputs.find(name);
    if (found == model_inputs.end()) {
      return Status::Error(StatusCode::kInvalidArgument, opts.model_path + ": the model has no input '" + name +
                                                             "' (its inputs: " + model_names(model_inputs) + ")");
    }
    const TypeEntry* type = by_onnx(found->second);
    if (type == nullptr) {
      return Status::Error(
          StatusCode::kInvalidArgument,
          opts.model_path + ": input '" + name + "' is " + type_name(found->second) + ", which inferd does not carry");
    }
    session->input_types.push_back(type->dtype);
    session->input_names.push_back(name.c_str());
  }
  for (size_t i = 0; i < opts.output_names.size(); ++i) {
    const std::string& name = opts.output_names[i];
    auto found = model_outputs.find(name);
    if (found == model_outputs.end()) {
      return Status::Error(StatusCode::kInvalidArgument, opts.model_path + ": the model has no output '" + name +
                                                             "' (its outputs: " + model_names(model_outputs) + ")");
    }
    const TypeEntry* declared = by_datatype(opts.output_types[i]);
    if (declared == nullptr || declared->onnx != found->second) {
      return Status::Error(StatusCode::kInvalidArgument, opts.model_path + ": output '" + name + "' is " +
                                                             type_name(found->second) + ", declared " +
                                                             type_name(opts.output_types[i]));
    }
    session->output_names.push_back(name.c_str());
  }
  *out = std::make_unique<OnnxRuntimeExecutor>(Key{}, std::move(session));
  return Status::Ok();
}

namespace {

// A read-only ORT view of a fixed-width tensor's bytes; `*fed` is the tensor as fed. A misaligned
// buffer (possible for a view of a request's wire bytes) is copied first: ORT's kernels read
// whole elements.
Ort::Value fixed_width_value(const OrtMemoryInfo* cpu, const Tensor& tensor, ONNXTensorElementDataType type,
                             Tensor* fed) {
  static std::max_align_t empty;  // ORT wants a non-null address even for zero elements
  *fed = tensor;
  if (fed->data == nullptr) {
    fed->data = reinterpret_cast<const std::byte*>(&empty);
  } else if (reinterpret_cast<uintptr_t>(fed->data) % element_size(tensor.dtype) != 0) {
    // operator new aligns for any scalar type.
    auto copy = std::make_shared<std::vector<std::byte>>(tensor.data, tensor.data + tensor.byte_size);
    fed->data = copy->data();
    fed->owner = std::move(copy);
  }
  // ORT's signature takes void*, but it only reads an input's memory.
  return Ort::Value::CreateTensor(cpu, const_cast<std::byte*>(fed->data), tensor.byte_size, tensor.shape.data(),
                                  tensor.shape.size(), type);
}

// An ORT string tensor holding the elements of a serialized BYTES tensor (copied: ORT owns
// std::strings). Elements may hold any bytes, NULs included.
Status string_value(const Tensor& tensor, const std::string& name, Ort::Value* out) {
  std::vector<size_t> offsets;
  if (!bytes_element_offsets(tensor.data, tensor.byte_size, &offsets) ||
      static_cast<int64_t>(offsets.size() - 1) != element_count(tensor.shape)) {
    return Status::Error(StatusCode::kInvalidArgument, "input '" + name + "': malformed BYTES tensor for its shape");
  }
  Ort::AllocatorWithDefaultOptions allocator;
  Ort::Value value = Ort::Value::CreateTensor(allocator, tensor.shape.data(), tensor.shape.size(),
                                              ONNX_TENSOR_ELEMENT_DATA_TYPE_STRING);
  for (size_t i = 0; i + 1 < offsets.size(); ++i) {
    const size_t begin = offsets[i] + 4;  // past the length prefix
    const size_t size = offsets[i + 1] - begin;
    char* element = value.GetResizedStringTensorElementBuffer(i, size);
    if (size > 0) std::memcpy(element, tensor.data + begin, size);
  }
  *out = std::move(value);
  return Status::Ok();
}

// An ORT string tensor in inferd's BYTES form (4-byte little-endian length, then the bytes).
Status serialize_strings(const Ort::Value& value, size_t count, const std::string& name, Tensor* out) {
  auto serialized = std::make_shared<std::vector<std::byte>>();
  if (count > 0) {
    const size_t length = value.GetStringTensorDataLength();
    std::vector<char> content(length + 1);  // + 1: a valid buffer when every string is empty
    std::vector<size_t> offsets(count);
    value.GetStringTensorContent(content.data(), length, offsets.data(), count);
    serialized->reserve(length + 4 * count);
    for (size_t i = 0; i < count; ++i) {
      const size_t end = i + 1 < count ? offsets[i + 1] : length;
      const size_t size = end - offsets[i];
      if (size > 0xFFFFFFFFu) {
        return Status::Error(StatusCode::kInternal, "output '" + name + "': element longer than 4 GiB");
      }
      for (int shift = 0; shift < 32; shift += 8) serialized->push_back(static_cast<std::byte>((size >> shift) & 0xFF));
      const auto* bytes = reinterpret_cast<const std::byte*>(content.data() + offsets[i]);
      serialized->insert(serialized->end(), bytes, bytes + size);
    }
  }
  out->data = serialized->data();
  out->byte_size = serialized->size();
  out->owner = std::move(serialized);
  return Status::Ok();
}

// Output `value` as a Tensor of the declared type: a view that owns the ORT value, or for
// strings a serialized copy. `fed`: the fixed-width inputs as fed.
Status output_tensor(Ort::Value value, const std::string& name, DataType declared, const std::vector<Tensor>& fed,
                     Tensor* out) {
  if (!value.IsTensor()) return Status::Error(StatusCode::kInternal, "output '" + name + "' is not a tensor");
  const Ort::TensorTypeAndShapeInfo info = value.GetTensorTypeAndShapeInfo();
  const ONNXTensorElementDataType type = info.GetElementType();
  const TypeEntry* entry = by_datatype(declared);
  if (entry == nullptr || entry->onnx != type) {
    return Status::Error(StatusCode::kInternal, "output '" + name + "' is " + type_name(type) +
                                                    ", the model's config declares " + type_name(declared));
  }
  out->dtype = declared;
  out->shape = info.GetShape();
  const size_t count = info.GetElementCount();
  if (declared == DataType::kBytes) return serialize_strings(value, count, name, out);
  auto owned = std::make_shared<Ort::Value>(std::move(value));
  out->data = static_cast<const std::byte*>(owned->GetTensorRawData());
  out->byte_size = count * element_size(declared);
  out->owner = std::move(owned);
  // ORT allocates outputs itself, but should a kernel ever hand back a view of a fed input, the
  // output keeps that input's memory (a pooled batch buffer, say) alive as well.
  for (const Tensor& input : fed) {
    if (out->byte_size > 0 && out->data >= input.data && out->data < input.data + input.byte_size) {
      out->owner = std::make_shared<std::pair<std::shared_ptr<const void>, std::shared_ptr<const void>>>(
          std::move(out->owner), input.owner);
      break;
    }
  }
  return Status::Ok();
}

}  // namespace

std::string without_source_locations(std::string_view message) {
  std::string out;
  out.reserve(message.size());
  size_t i = 0;
  while (i < message.size()) {
    if (is_space(message[i])) {
      out += message[i++];
      continue;
    }
    size_t end = i;
    while (end < message.size() && !is_space(message[end])) ++end;
    const std::string_view token = message.substr(i, end - i);
    if (!is_source_location(token)) {
      out += token;
      i = end;
      continue;
    }
    while (end < message.size() && is_space(message[end])) ++end;
    i = end + signature_length(message.substr(end));
  }
  while (!out.empty() && is_space(out.back())) out.pop_back();
  return out;
}

Status OnnxRuntimeExecutor::execute(const std::vector<Tensor>& inputs, std::vector<Tensor>* outputs) {
  try {
    return run(inputs, outputs);
  } catch (const Ort::Exception& error) {
    // INTERNAL whatever ORT's code: the core checked every request of the batch against the
    // model's signature, so a failure here is the executor's, not one client's. The client's
    // message leaves out where in ORT's source it failed; ORT's own error record (through
    // OnnxRuntimeLibrary's logging function) keeps the full text in the server log.
    return Status::Error(StatusCode::kInternal, "ONNX Runtime: " + without_source_locations(error.what()));
  } catch (const std::exception& error) {
    return Status::Error(StatusCode::kInternal, error.what());
  } catch (...) {
    return Status::Error(StatusCode::kInternal, "unknown exception in the ONNX Runtime executor");
  }
}

Status OnnxRuntimeExecutor::run(const std::vector<Tensor>& inputs, std::vector<Tensor>* outputs) {
  Session& s = *session_;
  const std::vector<std::string>& input_names = s.options.input_names;
  if (inputs.size() != input_names.size()) {
    return Status::Error(StatusCode::kInternal, "executor got " + std::to_string(inputs.size()) +
                                                    " inputs, the model has " + std::to_string(input_names.size()));
  }
  std::vector<const char*> names;
  std::vector<Ort::Value> values;
  std::vector<Tensor> fed;  // fixed-width inputs as ORT sees them, for output_tensor
  names.reserve(inputs.size());
  values.reserve(inputs.size());
  fed.reserve(inputs.size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& input = inputs[i];
    if (input.absent) continue;  // not fed: the model's initializer stands in
    if (input.dtype != s.input_types[i]) {
      return Status::Error(StatusCode::kInternal, "input '" + input_names[i] + "' is " + type_name(input.dtype) +
                                                      ", the model takes " + type_name(s.input_types[i]));
    }
    if (input.dtype == DataType::kBytes) {
      Ort::Value value{nullptr};
      Status status = string_value(input, input_names[i], &value);
      if (!status.ok()) return status;
      values.push_back(std::move(value));
    } else {
      fed.emplace_back();
      values.push_back(fixed_width_value(s.cpu, input, by_datatype(input.dtype)->onnx, &fed.back()));
    }
    names.push_back(s.input_names[i]);
  }
  std::vector<Ort::Value> results = s.session.Run(Ort::RunOptions{nullptr}, names.data(), values.data(), values.size(),
                                                  s.output_names.data(), s.output_names.size());
  std::vector<Tensor> computed(results.size());
  for (size_t i = 0; i < results.size(); ++i) {
    Status status =
        output_tensor(std::move(results[i]), s.options.output_names[i], s.options.output_types[i], fed, &computed[i]);
    if (!status.ok()) return status;
  }
  *outputs = std::move(computed);
  return Status::Ok();
}

}  // namespace inferd
