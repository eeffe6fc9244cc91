#include "http_json_messages.h"

#include <google/protobuf/util/json_util.h>
#include <rapidjson/document.h>
#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>

#include <cstdlib>
#include <map>
#include <string>

namespace inferd {
namespace {

namespace pb = google::protobuf;
using JsonWriter = rapidjson::Writer<rapidjson::StringBuffer>;

void write_message(const pb::Message& message, JsonWriter* writer);

// One value of `field` (index `index` when repeated): numbers as JSON numbers (Triton writes its
// counts so), enums by name, bytes as base64.
void write_value(const pb::Message& message, const pb::FieldDescriptor* field, int index, JsonWriter* writer) {
  const pb::Reflection* r = message.GetReflection();
  const bool repeated = index >= 0;
  switch (field->cpp_type()) {
    case pb::FieldDescriptor::CPPTYPE_INT32:
      writer->Int(repeated ? r->GetRepeatedInt32(message, field, index) : r->GetInt32(message, field));
      break;
    case pb::FieldDescriptor::CPPTYPE_INT64:
      writer->Int64(repeated ? r->GetRepeatedInt64(message, field, index) : r->GetInt64(message, field));
      break;
    case pb::FieldDescriptor::CPPTYPE_UINT32:
      writer->Uint(repeated ? r->GetRepeatedUInt32(message, field, index) : r->GetUInt32(message, field));
      break;
    case pb::FieldDescriptor::CPPTYPE_UINT64:
      writer->Uint64(repeated ? r->GetRepeatedUInt64(message, field, index) : r->GetUInt64(message, field));
      break;
    case pb::FieldDescriptor::CPPTYPE_DOUBLE:
      writer->Double(repeated ? r->GetRepeatedDouble(message, field, index) : r->GetDouble(message, field));
      break;
    case pb::FieldDescriptor::CPPTYPE_FLOAT:
      writer->Double(repeated ? r->GetRepeatedFloat(message, field, index) : r->GetFloat(message, field));
      break;
    case pb::FieldDescriptor::CPPTYPE_BOOL:
      writer->Bool(repeated ? r->GetRepeatedBool(message, field, index) : r->GetBool(message, field));
      break;
    case pb::FieldDescriptor::CPPTYPE_ENUM: {
      const pb::EnumValueDescriptor* e =
          repeated ? r->GetRepeatedEnum(message, field, index) : r->GetEnum(message, field);
      writer->String(e->name().c_str(), static_cast<rapidjson::SizeType>(e->name().size()));
      break;
    }
    case pb::FieldDescriptor::CPPTYPE_STRING: {
      std::string scratch;
      const std::string& value = repeated ? r->GetRepeatedStringReference(message, field, index, &scratch)
                                          : r->GetStringReference(message, field, &scratch);
      const std::string shown = field->type() == pb::FieldDescriptor::TYPE_BYTES ? base64(value) : value;
      writer->String(shown.data(), static_cast<rapidjson::SizeType>(shown.size()));
      break;
    }
    case pb::FieldDescriptor::CPPTYPE_MESSAGE:
      write_message(repeated ? r->GetRepeatedMessage(message, field, index) : r->GetMessage(message, field), writer);
      break;
  }
}

// A map entry's key as the JSON key it becomes.
std::string map_key(const pb::Message& entry) {
  const pb::FieldDescriptor* key = entry.GetDescriptor()->map_key();
  const pb::Reflection* r = entry.GetReflection();
  switch (key->cpp_type()) {
    case pb::FieldDescriptor::CPPTYPE_STRING:
      return r->GetString(entry, key);
    case pb::FieldDescriptor::CPPTYPE_INT64:
      return std::to_string(r->GetInt64(entry, key));
    case pb::FieldDescriptor::CPPTYPE_UINT64:
      return std::to_string(r->GetUInt64(entry, key));
    case pb::FieldDescriptor::CPPTYPE_INT32:
      return std::to_string(r->GetInt32(entry, key));
    case pb::FieldDescriptor::CPPTYPE_UINT32:
      return std::to_string(r->GetUInt32(entry, key));
    case pb::FieldDescriptor::CPPTYPE_BOOL:
      return r->GetBool(entry, key) ? "true" : "false";
    default:
      return "";
  }
}

// Every field, defaults included (Triton writes zero counts), by its proto name; maps as objects;
// a oneof only by the member that is set.
void write_message(const pb::Message& message, JsonWriter* writer) {
  const pb::Descriptor* d = message.GetDescriptor();
  const pb::Reflection* r = message.GetReflection();
  writer->StartObject();
  for (int i = 0; i < d->field_count(); ++i) {
    const pb::FieldDescriptor* field = d->field(i);
    if (field->real_containing_oneof() != nullptr && !r->HasField(message, field)) continue;
    writer->Key(field->name().c_str(), static_cast<rapidjson::SizeType>(field->name().size()));
    if (field->is_map()) {
      writer->StartObject();
      for (int j = 0; j < r->FieldSize(message, field); ++j) {
        const pb::Message& entry = r->GetRepeatedMessage(message, field, j);
        const std::string key = map_key(entry);
        writer->Key(key.c_str(), static_cast<rapidjson::SizeType>(key.size()));
        write_value(entry, entry.GetDescriptor()->map_value(), -1, writer);
      }
      writer->EndObject();
    } else if (field->is_repeated()) {
      writer->StartArray();
      for (int j = 0; j < r->FieldSize(message, field); ++j) write_value(message, field, j, writer);
      writer->EndArray();
    } else {
      write_value(message, field, -1, writer);
    }
  }
  writer->EndObject();
}

// protobuf's JSON mapping writes 64-bit integers as strings; Triton's config has them as numbers
// (its ModelConfigToJson fixes each int64 field of ModelConfig: dims, reshape, versions, delays,
// timeouts, ...). Walks `object` (a `d` as protobuf wrote it) and turns every such string into
// its number.
void int64_strings_to_numbers(const pb::Descriptor* d, rapidjson::Value* object) {
  auto number = [](const pb::FieldDescriptor* field, rapidjson::Value* v) {
    if (!v->IsString()) return;
    if (field->cpp_type() == pb::FieldDescriptor::CPPTYPE_INT64) {
      v->SetInt64(std::strtoll(v->GetString(), nullptr, 10));
    } else {
      v->SetUint64(std::strtoull(v->GetString(), nullptr, 10));
    }
  };
  auto is_64 = [](const pb::FieldDescriptor* field) {
    return field->cpp_type() == pb::FieldDescriptor::CPPTYPE_INT64 ||
           field->cpp_type() == pb::FieldDescriptor::CPPTYPE_UINT64;
  };
  for (int i = 0; i < d->field_count(); ++i) {
    const pb::FieldDescriptor* field = d->field(i);
    auto member = object->FindMember(field->name().c_str());
    if (member == object->MemberEnd()) continue;
    rapidjson::Value& v = member->value;
    if (field->is_map()) {
      const pb::FieldDescriptor* value_field = field->message_type()->map_value();
      if (!v.IsObject()) continue;
      for (auto& entry : v.GetObject()) {
        if (is_64(value_field)) number(value_field, &entry.value);
        if (value_field->message_type() != nullptr && entry.value.IsObject()) {
          int64_strings_to_numbers(value_field->message_type(), &entry.value);
        }
      }
    } else if (field->is_repeated() && v.IsArray()) {
      for (auto& item : v.GetArray()) {
        if (is_64(field)) number(field, &item);
        if (field->message_type() != nullptr && item.IsObject()) int64_strings_to_numbers(field->message_type(), &item);
      }
    } else if (is_64(field)) {
      number(field, &v);
    } else if (field->message_type() != nullptr && v.IsObject()) {
      int64_strings_to_numbers(field->message_type(), &v);
    }
  }
}

}  // namespace

std::string base64(const std::string& bytes) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  for (size_t i = 0; i < bytes.size(); i += 3) {
    const uint32_t chunk =
        (static_cast<uint32_t>(static_cast<unsigned char>(bytes[i])) << 16) |
        (i + 1 < bytes.size() ? static_cast<uint32_t>(static_cast<unsigned char>(bytes[i + 1])) << 8 : 0) |
        (i + 2 < bytes.size() ? static_cast<uint32_t>(static_cast<unsigned char>(bytes[i + 2])) : 0);
    out.push_back(kAlphabet[(chunk >> 18) & 63]);
    out.push_back(kAlphabet[(chunk >> 12) & 63]);
    out.push_back(i + 1 < bytes.size() ? kAlphabet[(chunk >> 6) & 63] : '=');
    out.push_back(i + 2 < bytes.size() ? kAlphabet[chunk & 63] : '=');
  }
  return out;
}

bool unbase64(std::string_view text, std::string* out) {
  auto value = [](char c) -> int {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+' || c == '-') return 62;
    if (c == '/' || c == '_') return 63;
    return -1;
  };
  out->clear();
  uint32_t bits = 0;
  int count = 0;
  for (char c : text) {
    if (c == '=') break;
    const int v = value(c);
    if (v < 0) return false;
    bits = (bits << 6) | static_cast<uint32_t>(v);
    count += 6;
    if (count >= 8) {
      count -= 8;
      out->push_back(static_cast<char>((bits >> count) & 0xFF));
    }
  }
  return true;
}

std::string message_json(const pb::Message& message) {
  rapidjson::StringBuffer buffer;
  JsonWriter writer(buffer);
  write_message(message, &writer);
  return std::string(buffer.GetString(), buffer.GetSize());
}

std::string message_array_json(const std::vector<const pb::Message*>& messages) {
  rapidjson::StringBuffer buffer;
  JsonWriter writer(buffer);
  writer.StartArray();
  for (const pb::Message* message : messages) write_message(*message, &writer);
  writer.EndArray();
  return std::string(buffer.GetString(), buffer.GetSize());
}

// Triton's trace settings answer: trace_level as a list, every other setting as its one string.
std::string trace_settings_json(const inference::TraceSettingResponse& response) {
  rapidjson::StringBuffer buffer;
  JsonWriter writer(buffer);
  writer.StartObject();
  std::map<std::string, const inference::TraceSettingResponse::SettingValue*> sorted;
  for (const auto& [key, value] : response.settings()) sorted[key] = &value;
  for (const auto& [key, value] : sorted) {
    writer.Key(key.c_str(), static_cast<rapidjson::SizeType>(key.size()));
    if (key == "trace_level" || value->value_size() != 1) {
      writer.StartArray();
      for (const std::string& v : value->value()) writer.String(v.c_str(), static_cast<rapidjson::SizeType>(v.size()));
      writer.EndArray();
    } else {
      writer.String(value->value(0).c_str(), static_cast<rapidjson::SizeType>(value->value(0).size()));
    }
  }
  writer.EndObject();
  return std::string(buffer.GetString(), buffer.GetSize());
}

std::string log_settings_json(const inference::LogSettingsResponse& response) {
  rapidjson::StringBuffer buffer;
  JsonWriter writer(buffer);
  writer.StartObject();
  std::map<std::string, const inference::LogSettingsResponse::SettingValue*> sorted;
  for (const auto& [key, value] : response.settings()) sorted[key] = &value;
  for (const auto& [key, value] : sorted) {
    writer.Key(key.c_str(), static_cast<rapidjson::SizeType>(key.size()));
    switch (value->parameter_choice_case()) {
      case inference::LogSettingsResponse::SettingValue::kBoolParam:
        writer.Bool(value->bool_param());
        break;
      case inference::LogSettingsResponse::SettingValue::kUint32Param:
        writer.Uint(value->uint32_param());
        break;
      case inference::LogSettingsResponse::SettingValue::kStringParam:
        writer.String(value->string_param().c_str(), static_cast<rapidjson::SizeType>(value->string_param().size()));
        break;
      default:
        writer.Null();
    }
  }
  writer.EndObject();
  return std::string(buffer.GetString(), buffer.GetSize());
}

bool config_json(const inference::ModelConfig& config, std::string* out) {
  std::string json;
  pb::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  if (!pb::util::MessageToJsonString(config, &json, options).ok()) return false;
  rapidjson::Document document;
  if (document.Parse(json.data(), json.size()).HasParseError() || !document.IsObject()) return false;
  int64_strings_to_numbers(config.GetDescriptor(), &document);
  rapidjson::StringBuffer buffer;
  JsonWriter writer(buffer);
  document.Accept(writer);
  out->assign(buffer.GetString(), buffer.GetSize());
  return true;
}

}  // namespace inferd
