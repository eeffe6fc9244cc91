#pragma once

// Helpers the CUDA wrappers (CudaStream, CudaEvent, DeviceMemory) share; private to cpp/src.

#include <string>

#include "inferd/cuda_runtime.h"
#include "inferd/status.h"

namespace inferd::cuda_device {

inline const CudaRuntime& cuda() { return CudaRuntime::get(); }

// Whether `device` names a device of a loaded runtime; if not, callers use their host stand-in.
inline bool usable(int device) { return device >= 0 && cuda().available() && device < cuda().device_count(); }

// A runtime error code as a Status naming the call that failed.
inline Status checked(int code, const char* what) {
  if (code == 0) return Status::Ok();
  return Status::Error(StatusCode::kInternal, std::string(what) + ": " + cuda().error_string(code));
}

}  // namespace inferd::cuda_device
