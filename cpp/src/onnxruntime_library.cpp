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

#include "inferd/structured_log.h"

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

LogLevel log_level(OrtLoggingLevel severity) {
  switch (severity) {
    case ORT_LOGGING_LEVEL_VERBOSE:
    case ORT_LOGGING_LEVEL_INFO:
      return LogLevel::kDebug;  // ORT's info is chatter (graph transformations, thread pools)
    case ORT_LOGGING_LEVEL_WARNING:
      return LogLevel::kWarning;
    case ORT_LOGGING_LEVEL_ERROR:
      return LogLevel::kError;
    case ORT_LOGGING_LEVEL_FATAL:
      return LogLevel::kCritical;
  }
  return LogLevel::kError;
}

// ONNX Runtime's logging function (OrtLoggingFunction). ORT calls it on whichever thread logs
// (its thread pools, a worker running a batch, the thread loading a session), possibly while the
// interpreter finalizes: it never touches Python. It writes one line to stderr in the shape of
// inferd's structlog records (LogRecord, logger "onnxruntime"). noexcept: an exception must not
// unwind into ORT.
void ORT_API_CALL log_record(void* /*param*/, OrtLoggingLevel severity, const char* category, const char* logid,
                             const char* code_location, const char* message) noexcept {
  if (static_cast<int>(severity) < log_threshold.load(std::memory_order_relaxed)) return;
  try {
    LogRecord record(message != nullptr ? message : "", log_level(severity));
    record.add("logger", "onnxruntime").add("category", category != nullptr ? category : "");
    if (logid != nullptr && *logid != 0) record.add("logid", logid);
    record.add("code_location", code_location != nullptr ? code_location : "").write();
  } catch (...) {  // std::bad_alloc: the record is lost
  }
}

}  // namespace

void OnnxRuntimeLibrary::SetLogging(int minimum_severity) {
  log_threshold.store(minimum_severity, std::memory_order_relaxed);
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
