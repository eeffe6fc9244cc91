// ServerLive, ServerReady, ModelReady, ModelMetadata and ModelConfig on the core's gRPC server:
// answered from the published serving snapshot, or forwarded to Python.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "grpc_unary_call.h"
#include "inferd/grpc_calls.h"
#include "inferd/infer_request_parser.h"
#include "inferd/wire_format.h"

namespace inferd {
namespace {

// The calls the serving snapshot answers when it knows the answer; the others go to the backend.
class SnapshotCall final : public UnaryCall {
 public:
  SnapshotCall(grpc::GenericCallbackServerContext* context, std::shared_ptr<TransportContext> transport, CallKind kind)
      : UnaryCall(context, std::move(transport)), kind_(kind) {}

 private:
  static grpc::ByteBuffer bool_message(bool value) {
    return value ? message(std::string_view("\x08\x01", 2)) : message(std::string_view());
  }

  // ModelReadyRequest, ModelMetadataRequest and ModelConfigRequest: name = 1, version = 2.
  static bool read_name_version(std::string_view bytes, std::string_view* name, std::string_view* version) {
    WireReader reader(bytes);
    while (!reader.done()) {
      uint32_t field;
      WireType type;
      if (!reader.read_tag(&field, &type)) return false;
      if ((field == 1 || field == 2) && type == WireType::kLengthDelimited) {
        if (!reader.read_bytes(field == 1 ? name : version)) return false;
      } else if (!reader.skip(type)) {
        return false;
      }
    }
    return is_valid_utf8(*name) && is_valid_utf8(*version);
  }

  // ServerLiveRequest and ServerReadyRequest have no fields; unknown ones are skipped.
  static bool is_message(std::string_view bytes) {
    WireReader reader(bytes);
    while (!reader.done()) {
      uint32_t field;
      WireType type;
      if (!reader.read_tag(&field, &type) || !reader.skip(type)) return false;
    }
    return true;
  }

  void handle() override {
    const std::shared_ptr<const ServingSnapshot> snapshot = transport_->state.current();
    ReceivedMessage received;
    if (kind_ == CallKind::kServerLive || kind_ == CallKind::kServerReady) {
      if (!receive(request_, &received) || !is_message(received.bytes)) {
        return fail(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                                 "the request of " + context_->method() + " is not a valid protobuf message"));
      }
      return answer(bool_message(kind_ == CallKind::kServerLive ? snapshot->live : snapshot->ready));
    }
    std::string_view name, version;
    if (!receive(request_, &received) || !read_name_version(received.bytes, &name, &version)) return forward();
    const std::shared_ptr<const ModelRoute> route = snapshot->find(name, version);
    if (route == nullptr) return forward();  // Python says why, in its words
    switch (kind_) {
      case CallKind::kModelReady:
        return answer(bool_message(snapshot->accepting));
      case CallKind::kModelMetadata:
        return answer(message(route->metadata_response));
      case CallKind::kModelConfig:
        return answer(message(route->config_response));
      default:
        return forward();
    }
  }

  const CallKind kind_;
};

}  // namespace

grpc::ServerGenericBidiReactor* create_snapshot_call(grpc::GenericCallbackServerContext* context,
                                                     std::shared_ptr<TransportContext> transport, CallKind kind) {
  // Raw new: grpc's callback API takes a reactor that deletes itself (UnaryCall::unref).
  return new SnapshotCall(context, std::move(transport), kind);
}

}  // namespace inferd
