// The messages of the core's gRPC calls as grpc buffers: a received one as one view, and the
// answers written into grpc slices.

#include <grpc/slice.h>

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "inferd/grpc_calls.h"
#include "inferd/infer_response_writer.h"

namespace inferd {

bool receive(const grpc::ByteBuffer& buffer, ReceivedMessage* out) {
  grpc::Slice single;
  if (buffer.TrySingleSlice(&single).ok()) {
    auto held = std::make_shared<grpc::Slice>(std::move(single));
    out->bytes = std::string_view(reinterpret_cast<const char*>(held->begin()), held->size());
    out->owner = std::move(held);
    return true;
  }
  // Large messages arrive in several slices: the parser wants one view, so they are joined once.
  std::vector<grpc::Slice> slices;
  if (!buffer.Dump(&slices).ok()) return false;
  auto joined = std::make_shared<std::string>();
  joined->reserve(buffer.Length());
  for (const grpc::Slice& s : slices) joined->append(reinterpret_cast<const char*>(s.begin()), s.size());
  out->bytes = *joined;
  out->owner = std::move(joined);
  return true;
}

grpc::ByteBuffer message(std::string_view bytes) {
  grpc::Slice slice(bytes.data(), bytes.size());
  return grpc::ByteBuffer(&slice, 1);
}

namespace {

grpc::ByteBuffer written(const InferResponseWriter& writer) {
  grpc_slice raw = grpc_slice_malloc(writer.size());
  writer.write(reinterpret_cast<std::byte*>(GRPC_SLICE_START_PTR(raw)));
  grpc::Slice slice(raw, grpc::Slice::STEAL_REF);
  return grpc::ByteBuffer(&slice, 1);
}

}  // namespace

Status write_answer(const InferenceRequest& request, const std::vector<Tensor>& outputs, grpc::ByteBuffer* out,
                    std::optional<bool> final_response) {
  const InferResponseWriter writer(request, outputs, request.stream, final_response);
  if (!writer.status().ok()) {
    Status status = writer.status();
    if (status.code == StatusCode::kInternal) status.message = "cannot return outputs: " + status.message;
    return status;
  }
  *out = written(writer);
  return Status::Ok();
}

grpc::ByteBuffer empty_final_answer(const InferenceRequest& request) {
  return written(InferResponseWriter::empty_response(request, request.stream, /*final_response=*/true));
}

}  // namespace inferd
