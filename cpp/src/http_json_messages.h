#pragma once

// grpc_service.proto's messages as Triton's HTTP/REST API writes them (http_json_messages.cpp):
// what the HTTP transport answers with for the calls Python answers over gRPC.

#include <google/protobuf/message.h>
#include <google/protobuf/repeated_ptr_field.h>

#include <string>
#include <string_view>
#include <vector>

#include "grpc_service.pb.h"
#include "model_config.pb.h"

namespace inferd {

std::string base64(const std::string& bytes);
// Standard or URL-safe base64, padding optional; false for another character.
bool unbase64(std::string_view text, std::string* out);

// Every field, defaults included (Triton writes zero counts), by its proto name: numbers as JSON
// numbers (64-bit ones too, as Triton's statistics), enums by name, bytes as base64, maps as
// objects, a oneof only by its member that is set.
std::string message_json(const google::protobuf::Message& message);
// A JSON array of `messages`' objects (Triton answers the index and shared-memory status as
// arrays, not as the messages around them).
std::string message_array_json(const std::vector<const google::protobuf::Message*>& messages);
template <class Item>
std::string message_array_json(const google::protobuf::RepeatedPtrField<Item>& items) {
  std::vector<const google::protobuf::Message*> messages;
  for (const Item& item : items) messages.push_back(&item);
  return message_array_json(messages);
}
// The values of a map of messages, as a JSON array.
template <class Map>
std::string map_values_json(const Map& map) {
  std::vector<const google::protobuf::Message*> messages;
  for (const auto& [key, value] : map) messages.push_back(&value);
  return message_array_json(messages);
}

// Triton's trace settings answer: trace_level as a list, every other setting as its one string.
std::string trace_settings_json(const inference::TraceSettingResponse& response);
// Triton's log settings answer: each setting as its plain value.
std::string log_settings_json(const inference::LogSettingsResponse& response);
// A model's config as Triton's ModelConfigToJson writes it: protobuf's JSON mapping under the
// proto's own field names, every primitive field printed (defaults included), 64-bit integers as
// numbers. False if protobuf cannot write it.
bool config_json(const inference::ModelConfig& config, std::string* out);

}  // namespace inferd
