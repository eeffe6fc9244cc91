#pragma once

#include "inferd/inference_request.h"
#include "inferd/signalled_queue.h"

namespace inferd {

// The completions of the requests a caller submitted without a sink of its own (Python's), for it
// to drain: unbounded, since every accepted request gets its answer.
using CompletionQueue = SignalledQueue<Completion>;

}  // namespace inferd
