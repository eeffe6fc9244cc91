#include "inferd/onnxruntime_library.h"

#include <dlfcn.h>
#include <onnxruntime_cxx_api.h>  // built with ORT_API_MANUAL_INIT: the API comes from Load
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <memory>
#include <mutex>

namespace inferd {
namespace {

std::mutex load_mutex;
std::unique_ptr<OnnxRuntimeLibrary> loaded_library;  // guarded by load_mutex; set once

struct CloseLibrary {
  void operator()(void* handle) const { dlclose(handle); }
};
using LibraryHandle = std::unique_ptr<void, CloseLibrary>;

// The path as the file system resolves it, so that two spellings of one file are one library.
std::string canonical(const std::string& path) {
  char resolved[PATH_MAX];
  return realpath(path.c_str(), resolved) != nullptr ? std::string(resolved) : path;
}

Status unavailable(const std::string& path, const std::string& what) {
  return Status::Error(StatusCode::kUnavailable, "ONNX Runtime library " + path + ": " + what);
}

// ONNX Runtime's own log records: written by log_record below, as inferd's Python logging writes
// its own (see SetLogging). Records less severe than the threshold are dropped.
std::atomic<int> log_threshold{ORT_LOGGING_LEVEL_WARNING};
std::atomic<bool> log_json{true};

const char* level_name(OrtLoggingLevel severity) {
  switch (severity) {
    case ORT_LOGGING_LEVEL_VERBOSE:
    case ORT_LOGGING_LEVEL_INFO:
      return "debug";  // ORT's info is chatter (graph transformations, thread pools)
    case ORT_LOGGING_LEVEL_WARNING:
      return "warning";
    case ORT_LOGGING_LEVEL_ERROR:
      return "error";
    case ORT_LOGGING_LEVEL_FATAL:
      return "critical";
  }
  return "error";
}

// Length of the valid UTF-8 sequence starting at s (1-4), or 0 when it is not one.
size_t utf8_sequence(const unsigned char* s) {
  const unsigned char c = s[0];
  size_t length;
  if (c >= 0xC2 && c <= 0xDF) {
    length = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    length = 3;
  } else if (c >= 0xF0 && c <= 0xF4) {
    length = 4;
  } else {
    return 0;
  }
  for (size_t i = 1; i < length; ++i) {
    if ((s[i] & 0xC0) != 0x80) return 0;  // also stops at the terminating NUL
  }
  if (c == 0xE0 && s[1] < 0xA0) return 0;   // overlong
  if (c == 0xED && s[1] >= 0xA0) return 0;  // surrogate
  if (c == 0xF0 && s[1] < 0x90) return 0;   // overlong
  if (c == 0xF4 && s[1] >= 0x90) return 0;  // beyond U+10FFFF
  return length;
}

// `text` as a JSON string: quotes, backslashes and control characters escaped, bytes that are not
// UTF-8 replaced by U+FFFD, so that the line is valid JSON whatever ORT puts in a message.
void append_json_string(std::string& out, const char* text) {
  out += '"';
  const auto* s = reinterpret_cast<const unsigned char*>(text != nullptr ? text : "");
  while (*s != 0) {
    const unsigned char c = *s;
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
      ++s;
    } else if (c == '\n') {
      out += "\\n";
      ++s;
    } else if (c < 0x20 || c == 0x7F) {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\u%04x", static_cast<unsigned>(c));
      out += escaped;
      ++s;
    } else if (c < 0x80) {
      out += static_cast<char>(c);
      ++s;
    } else if (size_t length = utf8_sequence(s); length > 0) {
      out.append(reinterpret_cast<const char*>(s), length);
      s += length;
    } else {
      out += "\\ufffd";
      ++s;
    }
  }
  out += '"';
}

// As structlog's TimeStamper(fmt="iso", utc=True) writes it: 2026-01-31T12:34:56.123456Z.
std::string utc_timestamp() {
  const auto now = std::chrono::system_clock::now();
  const auto micros = std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count();
  const std::time_t seconds = static_cast<std::time_t>(micros / 1000000);
  std::tm utc{};
  gmtime_r(&seconds, &utc);
  char text[96];  // room for any int in each field: no truncation warning
  std::snprintf(text, sizeof text, "%04d-%02d-%02dT%02d:%02d:%02d.%06dZ", utc.tm_year + 1900, utc.tm_mon + 1,
                utc.tm_mday, utc.tm_hour, utc.tm_min, utc.tm_sec, static_cast<int>(micros % 1000000));
  return text;
}

// Writes the whole line with as few write()s as the stream takes (one, for a line of a pipe's
// atomic size or a terminal), so that lines of other threads and of Python do not cut into it.
void write_line(const std::string& line) {
  const char* data = line.data();
  size_t left = line.size();
  while (left > 0) {
    const ssize_t written = ::write(STDERR_FILENO, data, left);
    if (written < 0) {
      if (errno == EINTR) continue;
      return;  // nowhere to report it
    }
    data += written;
    left -= static_cast<size_t>(written);
  }
}

// ONNX Runtime's logging function (OrtLoggingFunction). ORT calls it on whichever thread logs
// (its thread pools, a worker running a batch, the thread loading a session), possibly while the
// interpreter finalizes: it never touches Python. It writes one line to stderr in the shape of
// inferd's structlog records: JSON ({"event", "level", "logger": "onnxruntime", "timestamp", ...})
// or, with console output, a readable line. noexcept: an exception must not unwind into ORT.
void ORT_API_CALL log_record(void* /*param*/, OrtLoggingLevel severity, const char* category, const char* logid,
                             const char* code_location, const char* message) noexcept {
  if (static_cast<int>(severity) < log_threshold.load(std::memory_order_relaxed)) return;
  try {
    std::string line;
    line.reserve(256);
    if (log_json.load(std::memory_order_relaxed)) {
      line += "{\"event\": ";
      append_json_string(line, message);
      line += ", \"level\": \"";
      line += level_name(severity);
      line += "\", \"logger\": \"onnxruntime\", \"category\": ";
      append_json_string(line, category);
      if (logid != nullptr && *logid != 0) {
        line += ", \"logid\": ";
        append_json_string(line, logid);
      }
      line += ", \"code_location\": ";
      append_json_string(line, code_location);
      line += ", \"timestamp\": \"" + utc_timestamp() + "\"}\n";
    } else {
      char level[16];
      std::snprintf(level, sizeof level, "%-9s", level_name(severity));
      line += utc_timestamp() + " [" + level + "] ";
      line += message != nullptr ? message : "";
      line += " [onnxruntime] category=";
      line += category != nullptr ? category : "";
      line += " code_location=";
      line += code_location != nullptr ? code_location : "";
      line += '\n';
    }
    write_line(line);
  } catch (...) {  // std::bad_alloc: the record is lost
  }
}

}  // namespace

void OnnxRuntimeLibrary::SetLogging(int minimum_severity, bool json) {
  log_threshold.store(minimum_severity, std::memory_order_relaxed);
  log_json.store(json, std::memory_order_relaxed);
}

Status OnnxRuntimeLibrary::Load(const std::string& path, const OnnxRuntimeLibrary** out) {
  std::lock_guard<std::mutex> lock(load_mutex);
  const std::string resolved = canonical(path);
  if (loaded_library != nullptr) {
    if (loaded_library->path() == resolved) {
      *out = loaded_library.get();
      return Status::Ok();
    }
    return Status::Error(StatusCode::kInvalidArgument, "ONNX Runtime is already loaded from " + loaded_library->path() +
                                                           "; cannot also load " + path);
  }

  // RTLD_LOCAL: ORT's symbols stay out of the global namespace, where another copy of ORT (the
  // onnxruntime Python module's) may live in the same process.
  LibraryHandle handle(dlopen(resolved.c_str(), RTLD_NOW | RTLD_LOCAL));
  if (handle == nullptr) {
    const char* error = dlerror();
    return unavailable(path, std::string("cannot be loaded: ") + (error != nullptr ? error : "dlopen failed"));
  }
  using GetApiBase = const OrtApiBase* (*)();
  auto get_api_base = reinterpret_cast<GetApiBase>(dlsym(handle.get(), "OrtGetApiBase"));
  if (get_api_base == nullptr) return unavailable(path, "has no OrtGetApiBase: not an ONNX Runtime library");
  const OrtApiBase* base = get_api_base();
  const std::string version = base->GetVersionString();
  const OrtApi* api = base->GetApi(ORT_API_VERSION);
  if (api == nullptr) {
    return unavailable(path, "version " + version + " does not provide API version " + std::to_string(ORT_API_VERSION) +
                                 " (ONNX Runtime 1." + std::to_string(ORT_API_VERSION) + " or later is needed)");
  }

  OrtEnv* env = nullptr;
  // ORT's records go to log_record, which drops those below the threshold SetLogging sets; ORT
  // itself drops its verbose records (per-node chatter) before formatting them.
  if (OrtStatus* status = api->CreateEnvWithCustomLogger(log_record, nullptr, ORT_LOGGING_LEVEL_INFO, "inferd", &env)) {
    const std::string message = api->GetErrorMessage(status);
    api->ReleaseStatus(status);
    return Status::Error(StatusCode::kInternal,
                         "ONNX Runtime library " + path + ": cannot create its environment: " + message);
  }
  Ort::InitApi(api);
  // From here on the library is never closed (see the class comment): the handle is dropped.
  handle.release();
  loaded_library = std::make_unique<OnnxRuntimeLibrary>(Key{}, resolved, version, api, env);
  *out = loaded_library.get();
  return Status::Ok();
}

const OnnxRuntimeLibrary* OnnxRuntimeLibrary::Loaded() {
  std::lock_guard<std::mutex> lock(load_mutex);
  return loaded_library.get();
}

}  // namespace inferd
