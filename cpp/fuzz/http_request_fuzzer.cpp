// libFuzzer target for the HTTP transport's inference codec: decode_http_infer_request on a body
// and an Inference-Header-Content-Length, then build_inference_request against a fixed model
// signature (with a registry holding one small system region, "region0", that tensors may name),
// then encode_http_infer_response over outputs echoing the built inputs, and http_error_body on
// every refusal. Built by -DINFERD_FUZZ=ON with clang, ASan and UBSan (see the INFERD_FUZZ block of
// CMakeLists.txt); run by `make fuzz` and `make fuzz-ci`.
//
// The input: byte 0 picks the model (the URL's name), bytes 1-4 are the header length,
// little-endian (0xFFFFFFFF: no header, the whole body is JSON), the rest is the body.
//
// Besides the sanitizers' findings, the harness aborts when an invariant breaks: a refusal that is
// not INVALID_ARGUMENT or an error body that is not {"error": <the message>}; a built request whose
// tensors do not match their shapes; an answer whose JSON does not parse, whose outputs are not
// the requested ones, whose binary sizes do not add up to what follows the JSON, or whose JSON
// data does not decode back to the output's bytes. Every allocation is freed before the call
// returns (libFuzzer's leak check stays on).

#include <fcntl.h>
#include <rapidjson/document.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
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

#include "inferd/datatype_names.h"
#include "inferd/http_infer_codec.h"
#include "inferd/inference_request.h"
#include "inferd/model_signature.h"
#include "inferd/shared_memory.h"
#include "inferd/tensor.h"

namespace {

using inferd::DataType;
using inferd::InputSignature;
using inferd::ModelSignature;
using inferd::OutputSignature;

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "http_request_fuzzer: invariant broken: %s\n", what);
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

// The models the seeds (make_http_corpus.py) write requests for. Output i mirrors input i, so that
// the request's own inputs stand in for the outputs.
std::vector<std::shared_ptr<const ModelSignature>> make_signatures() {
  std::vector<std::shared_ptr<const ModelSignature>> out;
  // Every datatype, each an optional input named after it.
  auto every = std::make_shared<ModelSignature>();
  every->name = "all_types";
  every->version = "3";
  every->max_batch_size = 16;
  for (int code = 1; code <= 14; ++code) {
    const auto dtype = static_cast<DataType>(code);
    InputSignature in = input(inferd::datatype_name(dtype), dtype, {-1});
    in.optional = true;
    every->inputs.push_back(in);
    every->outputs.push_back(OutputSignature{std::string("OUT_") + inferd::datatype_name(dtype), dtype, {-1}, false});
  }
  out.push_back(every);

  // A batching model: two INT32 inputs [-1, 4], two outputs.
  auto batching = std::make_shared<ModelSignature>();
  batching->name = "batch_int32";
  batching->version = "1";
  batching->max_batch_size = 8;
  batching->inputs = {input("INPUT0", DataType::kInt32, {4}), input("INPUT1", DataType::kInt32, {4})};
  batching->outputs = {OutputSignature{"OUTPUT0", DataType::kInt32, {4}, false},
                       OutputSignature{"OUTPUT1", DataType::kInt32, {4}, false}};
  out.push_back(batching);

  // A non-batching FP32 model, reshaped both ways: [-1, 4] <-> [-1, 2, 2].
  auto reshaped = std::make_shared<ModelSignature>();
  reshaped->name = "reshape_fp32";
  InputSignature x = input("INPUT0", DataType::kFp32, {-1, 4});
  x.has_reshape = true;
  x.reshape = {-1, 2, 2};
  reshaped->inputs = {x};
  reshaped->outputs = {OutputSignature{"OUTPUT0", DataType::kFp32, {-1, 4}, true}};
  out.push_back(reshaped);

  // UTF-8 text (ONNX strings).
  auto strings = std::make_shared<ModelSignature>();
  strings->name = "bytes_text";
  strings->version = "2";
  strings->max_batch_size = 4;
  InputSignature text = input("TEXT", DataType::kBytes, {-1});
  text.utf8 = true;
  strings->inputs = {text};
  strings->outputs = {OutputSignature{"TEXT_OUT", DataType::kBytes, {-1}, false}};
  strings->keeps_parameters = true;
  out.push_back(strings);
  return out;
}

const std::vector<std::shared_ptr<const ModelSignature>>& signatures() {
  static const std::vector<std::shared_ptr<const ModelSignature>> all = make_signatures();
  return all;
}

// One system region, "region0", over an object unlinked at once (the registry keeps its
// descriptor and mapping), filled from each run's own bytes.
constexpr uint64_t kRegionBytes = 4096;

const inferd::SharedMemoryRegistry& shared_memory() {
  static const std::unique_ptr<inferd::SharedMemoryRegistry> registry = [] {
    auto out = std::make_unique<inferd::SharedMemoryRegistry>();
    const std::string key = "/inferd-http-fuzz-" + std::to_string(getpid());
    const int fd = shm_open(key.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0 || ftruncate(fd, static_cast<off_t>(kRegionBytes)) != 0) fail("cannot create a shared-memory object");
    close(fd);
    const inferd::Status status = out->register_system("region0", key, 0, kRegionBytes);
    shm_unlink(key.c_str());
    if (!status.ok()) fail(status.message.c_str());
    return out;
  }();
  return *registry;
}

void fill_region(const uint8_t* data, size_t size) {
  inferd::SharedMemorySlice region;
  FUZZ_CHECK(shared_memory().slice("region0", 0, kRegionBytes, &region).ok());
  std::vector<std::byte> bytes(kRegionBytes);
  if (size > 0) std::memcpy(bytes.data(), data, std::min<size_t>(size, kRegionBytes));
  std::string error;
  FUZZ_CHECK(inferd::copy_to_slice(region, bytes.data(), bytes.size(), &error));
}

// A refusal: INVALID_ARGUMENT (or what the core answers), and an error body that parses back to it.
void check_refusal(const inferd::Status& status) {
  FUZZ_CHECK(!status.ok() && !status.message.empty());
  const std::string body = inferd::http_error_body(status.message);
  rapidjson::Document document;
  document.Parse(body.data(), body.size());
  FUZZ_CHECK(!document.HasParseError() && document.IsObject() && document.MemberCount() == 1);
  const auto error = document.FindMember("error");
  FUZZ_CHECK(error != document.MemberEnd() && error->value.IsString());
  const std::string_view text(error->value.GetString(), error->value.GetStringLength());
  FUZZ_CHECK(inferd::is_valid_utf8(text));
  FUZZ_CHECK(!inferd::is_valid_utf8(status.message) || text == status.message);
}

// Every model output, in model order: input i's tensor where its datatype matches, copied out of
// shared memory as the batch's gather does; else an empty tensor of the output's datatype.
std::vector<inferd::Tensor> echo_outputs(const ModelSignature& model, const inferd::InferenceRequest& request) {
  std::vector<inferd::Tensor> outputs;
  for (size_t i = 0; i < model.outputs.size(); ++i) {
    if (i < request.inputs.size() && !request.inputs[i].absent && request.inputs[i].dtype == model.outputs[i].dtype) {
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

std::string to_json(const rapidjson::Value& value) {
  rapidjson::StringBuffer buffer;
  rapidjson::Writer<rapidjson::StringBuffer> writer(buffer);
  FUZZ_CHECK(value.Accept(writer));
  return std::string(buffer.GetString(), buffer.GetSize());
}

bool finite_floats(const inferd::Tensor& t) {
  for (size_t i = 0; t.dtype == DataType::kFp32 && i + 4 <= t.byte_size; i += 4) {
    float f;
    std::memcpy(&f, t.data + i, 4);
    if (!std::isfinite(f)) return false;
  }
  for (size_t i = 0; t.dtype == DataType::kFp64 && i + 8 <= t.byte_size; i += 8) {
    double d;
    std::memcpy(&d, t.data + i, 8);
    if (!std::isfinite(d)) return false;
  }
  return true;
}

// An output answered as JSON data decodes back, as an input, to the output's own bytes (BOOL:
// any non-zero byte is true).
void check_round_trip(const rapidjson::Value& output, const inferd::Tensor& tensor) {
  if (!finite_floats(tensor)) return;  // NaN and infinities are written as Python's json writes them
  const std::string body = "{\"inputs\":[" + to_json(output) + "]}";
  std::shared_ptr<inferd::HttpInferRequest> back;
  const inferd::Status status = inferd::decode_http_infer_request("m", "", std::make_shared<std::string>(body),
                                                                  std::nullopt, inferd::HttpDecodeLimits{}, &back);
  FUZZ_CHECK(status.ok());
  FUZZ_CHECK(back->parsed.raw_input_contents.size() == 1);
  const std::string_view raw = back->parsed.raw_input_contents[0];
  FUZZ_CHECK(raw.size() == tensor.byte_size);
  for (size_t i = 0; i < raw.size(); ++i) {
    const auto byte = static_cast<unsigned char>(raw[i]);
    const auto want = std::to_integer<unsigned char>(tensor.data[i]);
    FUZZ_CHECK(tensor.dtype == DataType::kBool ? byte == (want != 0) : byte == want);
  }
}

void check_answer(const inferd::InferenceRequest& request, const std::vector<inferd::Tensor>& outputs,
                  const inferd::HttpAnswerFormat& format, bool final_flag) {
  std::string answer;
  size_t json_length = 0;
  const std::optional<bool> final_response =
      final_flag ? std::optional<bool>(request.id.size() % 2 == 0) : std::nullopt;
  const inferd::Status status =
      inferd::encode_http_infer_response(request, outputs, format, &answer, &json_length, final_response);
  if (!status.ok()) {
    // Outputs echo inputs that passed the same checks: only what JSON cannot carry (FP16, BF16,
    // BYTES that are not UTF-8) and shared-memory slices too small are refused.
    FUZZ_CHECK(status.code == inferd::StatusCode::kInvalidArgument);
    check_refusal(status);
    return;
  }
  FUZZ_CHECK(json_length <= answer.size());
  // Full precision: the numbers must read back exactly to be written again exactly (our writer
  // writes no zero with an exponent, where RapidJSON's full-precision conversion is UB).
  rapidjson::Document document;
  document.Parse<rapidjson::kParseFullPrecisionFlag | rapidjson::kParseNanAndInfFlag>(answer.data(), json_length);
  FUZZ_CHECK(!document.HasParseError() && document.IsObject());
  FUZZ_CHECK(document.HasMember("outputs") && document["outputs"].IsArray());
  FUZZ_CHECK(document.HasMember("parameters") == final_response.has_value());
  const auto& listed = document["outputs"];
  const size_t expected = request.requested_outputs.empty() ? outputs.size() : request.requested_outputs.size();
  FUZZ_CHECK(listed.Size() == expected);
  size_t binary = 0;
  for (rapidjson::SizeType i = 0; i < listed.Size(); ++i) {
    const uint32_t index = request.requested_outputs.empty() ? i : request.requested_outputs[i];
    const inferd::Tensor& tensor = outputs[index];
    const rapidjson::Value& output = listed[i];
    FUZZ_CHECK(output.IsObject() && output["name"].IsString());
    FUZZ_CHECK(request.signature->outputs[index].name == output["name"].GetString());
    if (output.HasMember("data")) {
      check_round_trip(output, tensor);
      continue;
    }
    FUZZ_CHECK(output.HasMember("parameters") && output["parameters"].IsObject());
    const rapidjson::Value& parameters = output["parameters"];
    if (parameters.HasMember("binary_data_size")) {
      FUZZ_CHECK(parameters["binary_data_size"].IsUint64());
      FUZZ_CHECK(parameters["binary_data_size"].GetUint64() == tensor.byte_size);
      FUZZ_CHECK(tensor.byte_size == 0 ||
                 std::memcmp(answer.data() + json_length + binary, tensor.data, tensor.byte_size) == 0);
      binary += tensor.byte_size;
    } else {
      FUZZ_CHECK(parameters.HasMember("shared_memory_region"));
    }
  }
  FUZZ_CHECK(json_length + binary == answer.size());
}

// What a built request promises: the model's inputs in order, each matching its own shape.
void check_built(const ModelSignature& model, const inferd::InferenceRequest& request) {
  FUZZ_CHECK(request.checked && request.inputs.size() == model.inputs.size());
  for (size_t i = 0; i < model.inputs.size(); ++i) {
    const inferd::Tensor& t = request.inputs[i];
    FUZZ_CHECK(t.dtype == model.inputs[i].dtype);
    FUZZ_CHECK(inferd::validate_tensor(t).ok());
  }
  for (uint32_t index : request.requested_outputs) FUZZ_CHECK(index < model.outputs.size());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 5) return 0;
  const std::shared_ptr<const ModelSignature>& signature = signatures()[data[0] % signatures().size()];
  uint32_t length = 0;
  for (int i = 3; i >= 0; --i) length = (length << 8) | data[1 + i];
  const std::optional<size_t> json_length = length == 0xFFFFFFFFu ? std::nullopt : std::optional<size_t>(length);
  // The body exactly sized, as the server's; decoded in place.
  auto body = std::make_shared<std::string>(reinterpret_cast<const char*>(data + 5), size - 5);

  std::shared_ptr<inferd::HttpInferRequest> http;
  inferd::Status status = inferd::decode_http_infer_request(signature->name, signature->version, body, json_length,
                                                            inferd::HttpDecodeLimits{}, &http);
  if (!status.ok()) {
    FUZZ_CHECK(status.code == inferd::StatusCode::kInvalidArgument && http == nullptr);
    check_refusal(status);
    return 0;
  }
  FUZZ_CHECK(http != nullptr);
  fill_region(data, size);
  inferd::InferenceRequest request;
  status = inferd::build_inference_request(signature, http->parsed, http, &request, &shared_memory());
  if (!status.ok()) {
    FUZZ_CHECK(status.code == inferd::StatusCode::kInvalidArgument ||
               status.code == inferd::StatusCode::kUnimplemented);
    check_refusal(status);
    return 0;
  }
  check_built(*signature, request);
  const std::vector<inferd::Tensor> outputs = echo_outputs(*signature, request);
  check_answer(request, outputs, http->format, /*final_flag=*/false);
  check_answer(request, outputs, http->format, /*final_flag=*/true);
  return 0;
}
