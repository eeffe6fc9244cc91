// The gRPC transport's status table, and the message cut every status it sends goes through.

#include "inferd/grpc_status.h"

#include <string>

namespace inferd {

int grpc_code(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return grpc::StatusCode::OK;
    case StatusCode::kInvalidArgument:
      return grpc::StatusCode::INVALID_ARGUMENT;
    case StatusCode::kNotFound:
      return grpc::StatusCode::NOT_FOUND;
    case StatusCode::kUnavailable:
      return grpc::StatusCode::UNAVAILABLE;
    case StatusCode::kResourceExhausted:
      return grpc::StatusCode::RESOURCE_EXHAUSTED;
    case StatusCode::kDeadlineExceeded:
      return grpc::StatusCode::DEADLINE_EXCEEDED;
    case StatusCode::kCancelled:
      return grpc::StatusCode::CANCELLED;
    case StatusCode::kInternal:
      return grpc::StatusCode::INTERNAL;
    case StatusCode::kUnimplemented:
      return grpc::StatusCode::UNIMPLEMENTED;
    case StatusCode::kFailedPrecondition:
      return grpc::StatusCode::FAILED_PRECONDITION;
    case StatusCode::kAlreadyExists:
      return grpc::StatusCode::ALREADY_EXISTS;
    case StatusCode::kPermissionDenied:
      return grpc::StatusCode::PERMISSION_DENIED;
  }
  return grpc::StatusCode::INTERNAL;
}

std::string shown_message(std::string message) {
  if (message.size() <= kMaxStatusMessageBytes) return message;
  size_t cut = kMaxStatusMessageBytes - 3;                                             // room for the ellipsis
  while (cut > 0 && (static_cast<unsigned char>(message[cut]) & 0xC0) == 0x80) --cut;  // not inside a character
  message.resize(cut);
  return message + "\u2026";
}

grpc::Status to_grpc_status(const Status& status) {
  return grpc::Status(static_cast<grpc::StatusCode>(grpc_code(status.code)), shown_message(status.message));
}

grpc::Status over_budget(size_t request_bytes, const InflightBudget& budget) {
  return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED,
                      "the server holds too many request bytes to take this request's " +
                          std::to_string(request_bytes) + " (--max-inflight-bytes " + std::to_string(budget.limit()) +
                          "); retry later");
}

}  // namespace inferd
