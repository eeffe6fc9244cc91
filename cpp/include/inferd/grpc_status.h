#pragma once

// The core's status as the gRPC status a client sees: the gRPC transport's one status table
// (grpc_status.cpp).

#include <grpcpp/grpcpp.h>

#include <cstddef>
#include <string>

#include "inferd/grpc_inflight_budget.h"
#include "inferd/status.h"

namespace inferd {

// The core's status as the gRPC status the client sees (the server's one table: Python's gRPC
// handlers answer by it too, through inferd.core's grpc_status_code).
// Its message is cut to kMaxStatusMessageBytes (shown_message): the names a message echoes come
// from the client, and a status past gRPC's metadata limit reaches the client as another error.
grpc::Status to_grpc_status(const Status& status);
// The longest status message a client gets, in bytes (Python's handlers cut theirs with shown_message too).
inline constexpr size_t kMaxStatusMessageBytes = 1024;
// `message`, or its first bytes (whole UTF-8 characters) and an ellipsis, within kMaxStatusMessageBytes.
std::string shown_message(std::string message);
int grpc_code(StatusCode code);

// The answer to an inference request refused because the in-flight budget is spent.
grpc::Status over_budget(size_t request_bytes, const InflightBudget& budget);

}  // namespace inferd
