#pragma once

#include <string>
#include <utility>

#include "inferd/status.h"

// ONNX Runtime's C types, declared here so that users of this header need not see its headers.
struct OrtApi;
struct OrtEnv;

namespace inferd {

// ONNX Runtime's shared library (libonnxruntime.so, e.g. the one the onnxruntime wheel ships),
// loaded at run time, so that the core builds and runs without it and serves whichever version
// is installed. The core is compiled against the C API of ORT 1.21 (ORT_API_VERSION 21) and asks
// the library for exactly that version, which every later release also provides.
//
// Invariants: at most one library per process (ONNX Runtime's C++ wrappers keep the API table in
// one global, set here with Ort::InitApi); once loaded it is never unloaded and its environment is
// never released: sessions and output tensors may outlive any owner we could name, and ORT's
// threads and static destructors must not run after its code is unmapped. A failed load leaves no
// state behind, so a later load may try another path.
class OnnxRuntimeLibrary {
 public:
  // Loads the library at `path` (dlopen), gets API version 21 from its OrtGetApiBase(), makes it
  // the API of the C++ wrappers and creates the process's OrtEnv. Loading the path already loaded
  // returns the same library; any other path is refused (INVALID_ARGUMENT) once one is loaded.
  // Errors name the path and the step that failed (UNAVAILABLE: no such library, no
  // OrtGetApiBase, or a version older than 1.21; INTERNAL: the environment could not be made).
  // On success `*out` points at the process-wide library, valid until exit; on failure it is left
  // unchanged. Thread-safe; blocks while another thread loads (dlopen takes tens of milliseconds).
  static Status Load(const std::string& path, const OnnxRuntimeLibrary** out);

  // Which of ONNX Runtime's own log records are written, from now on (before or after Load):
  // those less severe than `minimum_severity` (an OrtLoggingLevel: 0 verbose ... 4 fatal; default
  // 2, warning) are dropped; the others are written to stderr as the core's LogRecords (logger
  // "onnxruntime", in the format set_core_logging sets). ORT's verbose and info records are at
  // level "debug", warning/error/fatal at warning/error/critical. Thread-safe, lock-free.
  static void SetLogging(int minimum_severity);

  // The loaded library, or null when none is. Thread-safe, non-blocking beyond a mutex.
  static const OnnxRuntimeLibrary* Loaded();

  // Thread-safe (immutable after Load).
  const std::string& path() const { return path_; }
  const std::string& version() const { return version_; }  // the library's GetVersionString()
  const OrtApi* api() const { return api_; }
  OrtEnv* env() const { return env_; }  // for Ort::Session; owned by the library (never freed)

  // Made by Load only (the key is private).
  class Key {
    friend class OnnxRuntimeLibrary;
    Key() = default;
  };
  OnnxRuntimeLibrary(Key, std::string path, std::string version, const OrtApi* api, OrtEnv* env)
      : path_(std::move(path)), version_(std::move(version)), api_(api), env_(env) {}
  OnnxRuntimeLibrary(const OnnxRuntimeLibrary&) = delete;
  OnnxRuntimeLibrary& operator=(const OnnxRuntimeLibrary&) = delete;

 private:
  const std::string path_;
  const std::string version_;
  const OrtApi* const api_;
  OrtEnv* const env_;
};

}  // namespace inferd
