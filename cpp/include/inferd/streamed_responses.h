#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "inferd/executor.h"
#include "inferd/worker_answers.h"
#include "inferd/worker_ring.h"

namespace inferd {

// Where a streamed response goes when the core does not take it directly (see StreamedResponses):
// batch `batch`'s request `index`, `final` or not, `answer` null for the final flag alone. Called
// on the reader thread, one at a time, in the order the worker sent them.
using StreamedDelivery = std::function<void(uint64_t batch, size_t index, bool final, const WorkerAnswer* answer)>;

// The responses a decoupled python model's worker streams on its WorkerRing (kResponse), each one
// ring message sent as the model sends it, read by a thread of this object's. Each is copied out
// of the outputs arena on receipt (the worker reuses the arena once every response was taken:
// RingHeader::streamed_taken). A response to a request of a batch opened with a LaterResponses
// that is not the request's final one goes straight to the core (in model output order, checked
// against the declared outputs): no Python on its way. The rest - final responses, which end a
// request and so are the Python side's to decide (open_batches.py), and every response of a batch
// opened without one - goes to `deliver`.
//
// Lock rules: mutex_ guards batches_, taken_ and stopped_; the reader thread never holds it while
// it delivers. stop() and the destructor join the thread: the caller must not hold what `deliver`
// takes (the binding releases the GIL).
class StreamedResponses {
 public:
  StreamedResponses(std::shared_ptr<worker::WorkerRing> ring, DeclaredOutputs declared, StreamedDelivery deliver);
  ~StreamedResponses();
  StreamedResponses(const StreamedResponses&) = delete;
  StreamedResponses& operator=(const StreamedResponses&) = delete;

  // Batch `batch` was sent: its requests' responses that are not final go to `later` (null: to
  // `deliver`), each request asking for `requested[index]` (empty: every output).
  void open(uint64_t batch, std::shared_ptr<LaterResponses> later, std::vector<std::vector<std::string>> requested);
  // The batch is over for the Python side: what still comes for it goes to `deliver` (which drops it).
  void forget(uint64_t batch);
  // Returns once every message the worker had put on the ring when this was called is delivered
  // (or the reader stopped): what the worker sent before a later message on another channel.
  void sync();
  // Delivers what the worker sent until now, stops reading and joins the reader. Idempotent.
  void stop();

 private:
  struct OpenBatch {
    std::shared_ptr<LaterResponses> later;
    std::vector<std::vector<std::string>> requested;
    std::vector<std::vector<std::string_view>> views;  // of `requested`, as in_model_order takes them
  };

  void read();
  void take(const worker::Message& message);
  // The message's response copied out of the arena; false for the final flag alone.
  bool copy_out(const worker::Message& message, WorkerAnswer* answer);

  const std::shared_ptr<worker::WorkerRing> ring_;
  const DeclaredOutputs declared_;
  const StreamedDelivery deliver_;
  std::atomic<bool> stopping_{false};
  uint64_t streamed_ = 0;  // kResponse messages copied out (the reader thread's)

  std::mutex mutex_;
  std::condition_variable taken_changed_;
  std::map<uint64_t, std::shared_ptr<const OpenBatch>> batches_;
  uint32_t taken_ = 0;  // messages received and delivered (a free-running count, as the ring's)
  bool stopped_ = false;
  std::thread reader_;  // last: started once the rest is built
};

}  // namespace inferd
