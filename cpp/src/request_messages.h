#pragma once

// The pieces of the request checks' error messages (build_inference_request and the steps it calls:
// typed_contents.cpp, shared_memory_params.cpp), so that every message quotes names and writes
// shapes the same way; private to cpp/src.

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "inferd/status.h"

namespace inferd::request_messages {

inline Status invalid(std::string message) { return Status::Error(StatusCode::kInvalidArgument, std::move(message)); }

// 'name'
inline std::string quoted(std::string_view text) { return "'" + std::string(text) + "'"; }

// [2, 3]
inline std::string shape_text(const std::vector<int64_t>& shape) {
  std::string out = "[";
  for (size_t i = 0; i < shape.size(); ++i) out += (i ? ", " : "") + std::to_string(shape[i]);
  return out + "]";
}

// ['a', 'b'], in the order `names` iterates.
template <typename Names>
std::string names_text(const Names& names) {
  std::string out = "[";
  bool first = true;
  for (const auto& name : names) {
    out += (first ? "" : ", ") + quoted(name);
    first = false;
  }
  return out + "]";
}

}  // namespace inferd::request_messages
