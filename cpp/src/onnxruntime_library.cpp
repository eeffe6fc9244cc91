#include "inferd/onnxruntime_library.h"

#include <dlfcn.h>
#include <onnxruntime_cxx_api.h>  // built with ORT_API_MANUAL_INIT: the API comes from Load

#include <climits>
#include <cstdlib>
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

}  // namespace

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
  if (OrtStatus* status = api->CreateEnv(ORT_LOGGING_LEVEL_WARNING, "inferd", &env)) {
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
