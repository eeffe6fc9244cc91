#pragma once

#include <string>
#include <utility>

namespace inferd {

// Outcome codes of the core, transport-neutral. The Python layer maps them to its domain errors,
// and only the transport maps those to gRPC codes.
enum class StatusCode : int {
  kOk = 0,
  kInvalidArgument = 1,
  kNotFound = 2,
  kUnavailable = 3,        // not ready or shutting down: retry elsewhere
  kResourceExhausted = 4,  // back-pressure (queue full): retry later
  kDeadlineExceeded = 5,
  kCancelled = 6,
  kInternal = 7,
  kUnimplemented = 8,       // a protocol feature inferd does not offer
  kFailedPrecondition = 9,  // not allowed in the server's current configuration
  kAlreadyExists = 10,      // a name already taken (a shared-memory region)
  kPermissionDenied = 11,   // not allowed on this listener
};

// A status code with a human-readable message; cheap to copy when ok.
struct Status {
  StatusCode code = StatusCode::kOk;
  std::string message;

  static Status Ok() { return {}; }
  static Status Error(StatusCode c, std::string msg) { return {c, std::move(msg)}; }
  bool ok() const { return code == StatusCode::kOk; }
};

}  // namespace inferd
