#include "inferd/model_signature.h"

#include <algorithm>
#include <set>
#include <string>
#include <string_view>

#include "inferd/request_parameters.h"
#include "inferd/shared_memory_params.h"
#include "inferd/typed_contents.h"
#include "request_messages.h"

namespace inferd {
namespace {

using request_messages::invalid;
using request_messages::names_text;
using request_messages::quoted;
using request_messages::shape_text;

// Where the wire tensors' bytes are, as the protocol alone says. raw_input_contents holds the
// inputs not in shared memory, in input order (Triton's rule, which tritonclient follows):
// raw_index[i] is input i's entry, -1 for one in shared memory.
struct WireLayout {
  std::vector<SharedMemoryParams> input_shm;   // by wire input
  std::vector<int> raw_index;                  // by wire input
  std::vector<SharedMemoryParams> output_shm;  // by wire output
};

// What every step of one build reads.
struct BuildContext {
  const ModelSignature& model;
  const ParsedInferRequest& parsed;
  const std::shared_ptr<const void>& owner;  // keeps the request's bytes alive
  const SharedMemoryRegistry* shared_memory;
  const std::string model_text;  // "model 'M'", for the messages
  WireLayout layout;
};

// What the protocol alone says is wrong with the inputs, before the model is consulted: their
// shared-memory parameters, datatype names, and contents beside raw_input_contents or shared
// memory; and raw_input_contents' entry count. Fills layout's input_shm and raw_index.
Status check_wire_inputs(const ParsedInferRequest& parsed, WireLayout* layout) {
  const bool raw = !parsed.raw_input_contents.empty();
  layout->input_shm.resize(parsed.inputs.size());
  layout->raw_index.assign(parsed.inputs.size(), -1);
  int raw_count = 0;
  for (size_t i = 0; i < parsed.inputs.size(); ++i) {
    const WireInput& input = parsed.inputs[i];
    const std::string tensor = "input " + quoted(input.name);
    Status status = shared_memory_params(input.parameters, tensor, &layout->input_shm[i]);
    if (!status.ok()) return status;
    DataType ignored{};
    if (!datatype_from_name(input.datatype, &ignored))
      return invalid(tensor + ": unknown datatype " + quoted(input.datatype));
    if (layout->input_shm[i].present) {
      if (input.has_contents) return invalid(tensor + ": contents must not be set for an input in shared memory");
      continue;
    }
    layout->raw_index[i] = raw_count++;
    if (raw && input.has_contents) {
      return invalid(tensor + ": contents must not be set when raw_input_contents is used");
    }
  }
  if (raw && parsed.raw_input_contents.size() != static_cast<size_t>(raw_count)) {
    return invalid("raw_input_contents has " + std::to_string(parsed.raw_input_contents.size()) + " entries for " +
                   std::to_string(raw_count) + " inputs not in shared memory; give one per such input, in input order");
  }
  return Status::Ok();
}

// The same for the requested outputs: their shared-memory parameters (into layout's output_shm)
// and the classification extension, which is UNIMPLEMENTED.
Status check_wire_outputs(const ParsedInferRequest& parsed, WireLayout* layout) {
  layout->output_shm.resize(parsed.outputs.size());
  for (size_t o = 0; o < parsed.outputs.size(); ++o) {
    const WireOutput& output = parsed.outputs[o];
    Status status = shared_memory_params(output.parameters, "output " + quoted(output.name), &layout->output_shm[o]);
    if (!status.ok()) return status;
    if (find_parameter(output.parameters, "classification") != nullptr) {
      return Status::Error(StatusCode::kUnimplemented,
                           "output " + quoted(output.name) + ": the classification extension is not supported");
    }
  }
  return Status::Ok();
}

// Each given input's wire index by the model's input index (-1: not given), into `given`. An
// input given twice, or one the model does not have (all such named at once), is refused.
Status match_inputs(const BuildContext& build, std::vector<int>* given) {
  const ModelSignature& model = build.model;
  given->assign(model.inputs.size(), -1);
  std::set<std::string_view> unexpected;
  for (size_t i = 0; i < build.parsed.inputs.size(); ++i) {
    const std::string_view name = build.parsed.inputs[i].name;
    auto spec = std::find_if(model.inputs.begin(), model.inputs.end(),
                             [&](const InputSignature& s) { return s.name == name && !s.core_written; });
    if (spec == model.inputs.end()) {
      unexpected.insert(name);
      continue;
    }
    int& slot = (*given)[static_cast<size_t>(spec - model.inputs.begin())];
    if (slot >= 0) return invalid("input " + quoted(name) + " is given twice");
    slot = static_cast<int>(i);
  }
  if (!unexpected.empty()) {
    std::set<std::string_view> expected;
    for (const InputSignature& s : model.inputs) {
      if (!s.core_written) expected.insert(s.name);
    }
    return invalid(build.model_text + " has no input(s) " + names_text(unexpected) + "; its inputs are " +
                   names_text(expected));
  }
  return Status::Ok();
}

// Checks an input's datatype and shape against `spec`: the dims (-1 = any), the batch size within
// max_batch_size, an element count a request could carry, and the model's reshape. Sets
// tensor's dtype and shape (the model's), its rows (1 when the model does not batch) and element count.
Status check_input_shape(const ModelSignature& model, const InputSignature& spec, const WireInput& input,
                         const std::string& where, Tensor* tensor, int64_t* rows, int64_t* elements) {
  DataType dtype{};
  datatype_from_name(input.datatype, &dtype);  // known: check_wire_inputs
  if (dtype != spec.dtype) {
    return invalid(where + " takes " + datatype_name(spec.dtype) + ", got " + std::string(input.datatype));
  }
  const std::vector<int64_t>& shape = input.shape;
  if (std::any_of(shape.begin(), shape.end(), [](int64_t d) { return d < 0; })) {
    return invalid(where + ": shape " + shape_text(shape) + " has a negative dimension");
  }
  const bool batched = model.max_batch_size > 0;
  std::vector<int64_t> want;
  if (batched) want.push_back(-1);
  want.insert(want.end(), spec.dims.begin(), spec.dims.end());
  bool matches = want.size() == shape.size();
  for (size_t d = 0; matches && d < want.size(); ++d) matches = want[d] == -1 || want[d] == shape[d];
  if (!matches) return invalid(where + " takes shape " + shape_text(want) + " (-1 = any), got " + shape_text(shape));
  *rows = batched ? shape[0] : 1;
  if (batched && (*rows < 1 || *rows > model.max_batch_size)) {
    return invalid(where + ": batch size " + std::to_string(*rows) + " is outside 1.." +
                   std::to_string(model.max_batch_size) + " (max_batch_size)");
  }
  *elements = element_count(shape);
  // Beyond 2^56 elements no request can carry the bytes; refusing here keeps the sizes below exact.
  if (*elements < 0 || *elements > (int64_t{1} << 56))
    return invalid(where + ": shape " + shape_text(shape) + " has too many elements");

  tensor->dtype = spec.dtype;
  tensor->shape = shape;
  if (spec.has_reshape && !reshape_dims(shape, spec.reshape, batched, &tensor->shape)) {
    return invalid(where + ": shape " + shape_text(shape) + " cannot take the model's shape " +
                   shape_text(spec.reshape) + " (reshape)");
  }
  return Status::Ok();
}

// A typed-contents buffer owned by the request's tensor.
std::shared_ptr<const void> own(std::vector<std::byte>&& buffer) {
  return std::make_shared<const std::vector<std::byte>>(std::move(buffer));
}

// An input in shared memory, into `tensor`: a BYTES input copied out, any other a view of the
// client's slice.
Status shared_memory_input(const BuildContext& build, const SharedMemoryParams& params, DataType dtype,
                           const std::string& where, Tensor* tensor) {
  auto slice = std::make_shared<SharedMemorySlice>();
  Status status = shared_memory_slice(build.shared_memory, params, where, slice.get());
  if (!status.ok()) return status;
  if (dtype == DataType::kBytes) {
    // Copied once, here: the length prefixes are checked on bytes the client can no longer
    // change, so everything that walks them later walks what was checked.
    std::vector<std::byte> buffer(slice->size);
    std::string error;
    if (!copy_from_slice(buffer.data(), *slice, slice->size, &error)) return invalid(where + ": " + error);
    tensor->data = buffer.data();
    tensor->byte_size = buffer.size();
    tensor->owner = own(std::move(buffer));
  } else {
    // Fixed-size elements: the size is all that is checked, so the batch reads the region itself
    // (copy_from_slice, at gather); the client's writes meanwhile change only values.
    tensor->data = slice->data;
    tensor->byte_size = slice->size;
    tensor->owner = slice->region;
    tensor->client_memory = std::move(slice);
  }
  return Status::Ok();
}

// Wire input `index`'s bytes into `tensor`, wherever the request put them: shared memory, its
// raw_input_contents entry (a view; `owner` keeps it alive), or typed contents, decoded.
Status input_bytes(const BuildContext& build, const InputSignature& spec, size_t index, const std::string& where,
                   int64_t elements, Tensor* tensor) {
  const WireInput& input = build.parsed.inputs[index];
  if (build.layout.input_shm[index].present) {
    return shared_memory_input(build, build.layout.input_shm[index], spec.dtype, where, tensor);
  }
  if (!build.parsed.raw_input_contents.empty()) {
    const std::string_view bytes = build.parsed.raw_input_contents[static_cast<size_t>(build.layout.raw_index[index])];
    tensor->data = reinterpret_cast<const std::byte*>(bytes.data());
    tensor->byte_size = bytes.size();
    tensor->owner = build.owner;
    return Status::Ok();
  }
  std::vector<std::byte> buffer;
  Status status = typed_contents(input, spec.dtype, where, elements, input.shape, &buffer);
  if (!status.ok()) return status;
  tensor->data = buffer.data();
  tensor->byte_size = buffer.size();
  tensor->owner = own(std::move(buffer));  // the vector's heap block does not move with it
  return Status::Ok();
}

// Checks a BYTES buffer's length prefixes (walked once): the element count and, for ONNX
// strings, that every element is UTF-8.
Status check_bytes(const std::byte* data, size_t size, bool utf8, const std::string& where, int64_t elements,
                   const std::vector<int64_t>& shape) {
  size_t pos = 0;
  int64_t count = 0;
  while (pos < size) {
    if (size - pos < 4) return invalid(where + ": malformed BYTES data: a length prefix is cut off");
    uint32_t len = 0;
    for (int i = 3; i >= 0; --i) len = (len << 8) | std::to_integer<uint32_t>(data[pos + i]);
    if (size - pos - 4 < len) {
      return invalid(where + ": malformed BYTES data: element " + std::to_string(count) + " claims " +
                     std::to_string(len) + " bytes, " + std::to_string(size - pos - 4) + " remain");
    }
    if (utf8 && !is_valid_utf8(std::string_view(reinterpret_cast<const char*>(data + pos + 4), len))) {
      return invalid(where + " element " + std::to_string(count) +
                     " is not UTF-8 text, which ONNX Runtime strings require");
    }
    pos += 4 + static_cast<size_t>(len);
    if (++count > elements) {  // stops here: the rest of a flood of elements is never walked
      return invalid(where + ": more BYTES elements than shape " + shape_text(shape) + " holds (" +
                     std::to_string(elements) + ")");
    }
  }
  if (count != elements) {
    return invalid(where + ": " + std::to_string(count) + " BYTES elements for shape " + shape_text(shape));
  }
  return Status::Ok();
}

// Checks that an input's bytes hold what its shape says: BYTES elements walked (check_bytes),
// any other datatype by its byte count.
Status check_input_size(const InputSignature& spec, const Tensor& tensor, const std::string& where, int64_t elements,
                        const std::vector<int64_t>& shape) {
  if (spec.dtype == DataType::kBytes)
    return check_bytes(tensor.data, tensor.byte_size, spec.utf8, where, elements, shape);
  const uint64_t need = static_cast<uint64_t>(elements) * element_size(spec.dtype);
  if (tensor.byte_size != need) {
    return invalid(where + ": " + std::to_string(tensor.byte_size) + " bytes of data, shape " + shape_text(shape) +
                   " of " + datatype_name(spec.dtype) + " needs " + std::to_string(need));
  }
  return Status::Ok();
}

// One given input (wire input `index`), checked against `spec`, into `tensor`; its rows into `rows`.
Status build_input(const BuildContext& build, const InputSignature& spec, size_t index, Tensor* tensor, int64_t* rows) {
  const WireInput& input = build.parsed.inputs[index];
  const std::string where = "input " + quoted(spec.name) + " of " + build.model_text;
  int64_t elements = 0;
  Status status = check_input_shape(build.model, spec, input, where, tensor, rows, &elements);
  if (status.ok()) status = input_bytes(build, spec, index, where, elements, tensor);
  if (status.ok()) status = check_input_size(spec, *tensor, where, elements, input.shape);
  return status;
}

// The inputs step: every model input, in model order, into out->inputs (an optional one not given
// is Tensor::Absent), and the batch size they agree on into out->batch_size.
Status build_inputs(const BuildContext& build, InferenceRequest* out) {
  const ModelSignature& model = build.model;
  std::vector<int> given;
  Status status = match_inputs(build, &given);
  if (!status.ok()) return status;
  int64_t batch_size = -1;
  std::string_view first;
  out->inputs.reserve(model.inputs.size());
  for (size_t m = 0; m < model.inputs.size(); ++m) {
    const InputSignature& spec = model.inputs[m];
    if (given[m] < 0) {
      if (spec.optional || spec.core_written) {  // a control input or a state: written at batching
        out->inputs.push_back(Tensor::Absent(spec.dtype));
        continue;
      }
      return invalid(build.model_text + " needs input " + quoted(spec.name) + ", it is missing");
    }
    Tensor tensor;
    int64_t rows = 0;
    status = build_input(build, spec, static_cast<size_t>(given[m]), &tensor, &rows);
    if (!status.ok()) return status;
    if (batch_size < 0) {
      batch_size = rows;
      first = spec.name;
    } else if (rows != batch_size) {
      return invalid("input " + quoted(spec.name) + " has batch size " + std::to_string(rows) + ", input " +
                     quoted(first) + " has " + std::to_string(batch_size));
    }
    out->inputs.push_back(std::move(tensor));
  }
  if (batch_size < 0) return invalid(build.model_text + ": a request must give at least one input");
  out->batch_size = batch_size;
  return Status::Ok();
}

// The outputs step: each requested output, by the model's output index, into
// out->requested_outputs (once each, as Triton), and those in shared memory into
// out->shared_memory_outputs.
Status build_outputs(const BuildContext& build, InferenceRequest* out) {
  const ModelSignature& model = build.model;
  for (size_t o = 0; o < build.parsed.outputs.size(); ++o) {
    const WireOutput& output = build.parsed.outputs[o];
    auto spec = std::find_if(model.outputs.begin(), model.outputs.end(),
                             [&](const OutputSignature& s) { return s.name == output.name; });
    if (spec == model.outputs.end()) {
      std::set<std::string_view> names;
      for (const OutputSignature& s : model.outputs) names.insert(s.name);
      return invalid(build.model_text + " has no output " + quoted(output.name) + "; its outputs are " +
                     names_text(names));
    }
    const auto index = static_cast<uint32_t>(spec - model.outputs.begin());
    if (std::find(out->requested_outputs.begin(), out->requested_outputs.end(), index) !=
        out->requested_outputs.end()) {
      return invalid("output " + quoted(output.name) + " already exists in request");  // Triton's words
    }
    out->requested_outputs.push_back(index);
    if (build.layout.output_shm[o].present) {
      SharedMemoryOutput target;
      target.output = index;
      Status status = shared_memory_slice(build.shared_memory, build.layout.output_shm[o],
                                          "output " + quoted(output.name), &target.slice);
      if (!status.ok()) return status;
      out->shared_memory_outputs.push_back(std::move(target));
    }
  }
  return Status::Ok();
}

}  // namespace

bool reshape_dims(const std::vector<int64_t>& shape, const std::vector<int64_t>& dims, bool batched,
                  std::vector<int64_t>* out) {
  out->clear();
  int64_t count = 1, known = 1;
  size_t first = 0;
  if (batched && !shape.empty()) {
    out->push_back(shape[0]);
    first = 1;
  }
  for (size_t i = first; i < shape.size(); ++i) count *= shape[i];
  for (int64_t d : dims) known *= d == -1 ? 1 : d;
  int64_t resolved = 1;
  for (int64_t d : dims) {
    out->push_back(d == -1 && known != 0 ? count / known : d);
    resolved *= out->back();
  }
  return resolved == count;
}

Status build_inference_request(const std::shared_ptr<const ModelSignature>& signature, const ParsedInferRequest& parsed,
                               const std::shared_ptr<const void>& owner, InferenceRequest* out,
                               const SharedMemoryRegistry* shared_memory) {
  BuildContext build{*signature, parsed, owner, shared_memory, "model " + quoted(signature->name), {}};
  // What the protocol alone says is wrong comes first, before the model is consulted.
  Status status = check_wire_inputs(parsed, &build.layout);
  if (status.ok()) status = check_wire_outputs(parsed, &build.layout);
  if (status.ok()) status = build_inputs(build, out);
  if (status.ok()) status = build_outputs(build, out);
  if (status.ok()) status = read_request_parameters(parsed, *signature, out);
  if (!status.ok()) return status;
  out->checked = true;
  out->signature = signature;
  out->id = std::string(parsed.id);
  return Status::Ok();
}

}  // namespace inferd
