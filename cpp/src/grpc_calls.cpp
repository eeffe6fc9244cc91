// The calls of the core's gRPC server: which call a method is, and the reactor that serves it
// (grpc_infer_call.cpp, grpc_snapshot_call.cpp, grpc_stream_call.cpp, grpc_forwarded_call.cpp).

#include "inferd/grpc_calls.h"

#include <memory>
#include <string_view>
#include <utility>

namespace inferd {

CallKind call_kind(std::string_view method) {
  constexpr std::string_view kService = "/inference.GRPCInferenceService/";
  if (method.substr(0, kService.size()) != kService) return CallKind::kForwarded;
  const std::string_view name = method.substr(kService.size());
  if (name == "ModelInfer") return CallKind::kInfer;
  if (name == "ModelStreamInfer") return CallKind::kStreamInfer;
  if (name == "ServerLive") return CallKind::kServerLive;
  if (name == "ServerReady") return CallKind::kServerReady;
  if (name == "ModelReady") return CallKind::kModelReady;
  if (name == "ModelMetadata") return CallKind::kModelMetadata;
  if (name == "ModelConfig") return CallKind::kModelConfig;
  return CallKind::kForwarded;
}

grpc::ServerGenericBidiReactor* create_call(grpc::GenericCallbackServerContext* context,
                                            std::shared_ptr<TransportContext> transport) {
  switch (const CallKind kind = call_kind(context->method())) {
    case CallKind::kInfer:
      return create_infer_call(context, std::move(transport));
    case CallKind::kStreamInfer:
      return create_stream_infer_call(context, std::move(transport));
    case CallKind::kForwarded:
      return create_forwarded_call(context, std::move(transport));
    default:
      return create_snapshot_call(context, std::move(transport), kind);
  }
}

}  // namespace inferd
