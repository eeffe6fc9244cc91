#pragma once

#include <cstddef>

namespace inferd {

// memcpy that survives a SIGBUS in either buffer: what happens when a client shrinks (ftruncate)
// a shared-memory object the server has mapped, and the server touches a page past its new end.
// Returns false when the copy faulted; the destination then holds part of the bytes.
//
// How: the first call installs a SIGBUS handler (SA_NODEFER, chaining to the one it replaces);
// a thread in a guarded copy marks itself, and the handler jumps back out of a fault that thread
// takes. A SIGBUS anywhere else goes to the previous handler (or kills the process as before).
// Thread-safe; costs one thread-local store on each side of the memcpy.
bool guarded_copy(void* dst, const void* src, size_t size);

}  // namespace inferd
