#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "inferd/executor.h"
#include "inferd/model_calls.h"
#include "inferd/worker_answers.h"
#include "inferd/worker_messages.h"
#include "inferd/worker_ring.h"

namespace inferd {

// What the Python side that starts and restarts a python model's worker does for the executor,
// on the rare paths. Each is called on the executor's thread (lock rules: PythonWorkerExecutor).
struct PythonWorkerHooks {
  // No worker is attached (it died, or its restart waits its turn): restart it now if that is due
  // (the hook attaches the new one). Ok when a worker serves afterwards, else the status the batch
  // fails with (UNAVAILABLE while it restarts or stops, INTERNAL when it cannot be restarted).
  std::function<Status()> ensure_serving;
  // The attached worker exited while it held a batch: reaps it and schedules its restart; the
  // status the batch fails with (INTERNAL naming how it ended, UNAVAILABLE when it was stopped).
  std::function<Status()> died;
  // A model-to-model call the core has no route for (ModelCalls::start gave none): the Python
  // side runs it (its registry says why it cannot be run) and answers through `done`, once, from
  // any thread. `inputs` are parallel to call.inputs; both are valid during the hook only.
  std::function<void(const worker::CallDescription& call, const std::vector<Tensor>& inputs, ModelCallDone done)>
      call_unrouted;
  // The answer of call `number` that was still in flight when its batch was answered: the
  // worker's thread that made it waits for it on the control channel. From any thread. Empty:
  // such calls are cancelled when their batch ends.
  std::function<void(uint64_t number, ModelCallAnswer&& answer)> call_answered_late;
};

struct PythonWorkerOptions {
  std::string model_name;
  std::string description;               // "python model 'm' version 1 instance 'm_0'", for messages
  std::vector<std::string> input_names;  // model input order
  std::vector<DataType> input_types;
  std::vector<std::string> output_names;  // model output order
  std::vector<DataType> output_types;
  // How often a waiting batch writes its requests' cancellation flags and looks at the worker.
  std::chrono::milliseconds poll_interval{50};
  // How long a batch of one request looks for its answer awake before sleeping on the doorbell.
  std::chrono::microseconds spin{60};
};

// One instance of a Triton python-backend model whose worker process serves batches over a
// WorkerRing: the batch goes from the scheduler's worker thread to the worker without Python in
// this process. Its inputs are copied once, into the ring's inputs arena, beside a description of
// the batch; the worker answers in its outputs arena, and each answer's tensors are views of that
// arena (leased until the response writer lets go), except BYTES, copied out and checked.
//
// The model-to-model calls (BLS) the worker makes while a batch runs come on the same ring and
// are served by this thread while it waits for the batch: each is copied out of the arena,
// checked against the chain of callers (a call that would wait on itself is refused), routed by
// ModelCalls to the called version's scheduler (what it has no route for goes to
// hooks.call_unrouted) and answered into the inputs arena above the batch; a call past its
// timeout, or of a batch whose requests all ended, is answered at once and its request cancelled.
//
// The worker itself is started, restarted and stopped by the Python side, which attaches each
// started worker (its ring and a pidfd) and detaches it when it goes; a batch that finds none
// attached asks hooks.ensure_serving.
//
// Lock rules: batch_mutex_ is held for a whole batch and by exclusive() (the Python side's stop and
// restart, so that no batch runs on a worker being replaced); link_mutex_ guards link_ and
// leases_ and running_ only, never held across a wait or a hook. ensure_serving is called with
// neither held (it may call exclusive()); died with batch_mutex_ held (it must not).
// One request as the worker gets it: its inputs by name (those it has), viewed while the batch runs.
struct WorkerRequest {
  std::string_view id;
  std::string_view parameters;                      // a JSON object
  std::vector<std::string_view> requested_outputs;  // empty: every output
  std::vector<std::pair<std::string_view, const Tensor*>> inputs;
  RequestCancellation cancellation;
  const SequenceFlags* sequence = nullptr;  // a stateful model's request: pb_utils' correlation_id(), flags()
};

class PythonWorkerExecutor : public Executor {
 public:
  PythonWorkerExecutor(PythonWorkerOptions options, PythonWorkerHooks hooks);
  ~PythonWorkerExecutor() override;

  // A started worker: its channel's server end and a pidfd (owned from here) readable once it exits.
  void attach(std::shared_ptr<worker::WorkerRing> ring, int pidfd);
  // The worker is gone or being replaced: batches find none attached from here.
  void detach();
  bool attached() const;
  const PythonWorkerOptions& options() const { return options_; }
  // Waits for the batch in flight to end and holds the next one back while the lock is held.
  std::unique_lock<std::mutex> exclusive();
  // Whether the batch in flight has requests and every one was cancelled or passed its deadline
  // (its model-to-model calls are then abandoned). Thread-safe.
  bool batch_abandoned() const;

  // Where the batches' model-to-model calls are routed (null: every call goes to
  // hooks.call_unrouted). Thread-safe.
  void set_model_calls(std::shared_ptr<ModelCalls> calls);

  // One batch as the worker takes it, with the answers it sent as they are (the Python side's
  // execute, for warm-up and tests). A failure of the whole batch is returned.
  Status run(const std::vector<WorkerRequest>& requests, std::vector<WorkerAnswer>* answers);

  bool answers_each_request() const override { return true; }
  Status execute(const std::vector<Tensor>& inputs, std::vector<Tensor>* outputs) override;
  // The scheduler's: inputs in model input order, each answer's outputs in model output order
  // (an output the request did not ask for and the model did not send: an empty stand-in).
  Status execute_requests(const std::vector<ExecutorRequest>& requests, std::vector<RequestResult>* results,
                          ResponseStream* responses) override;

 private:
  struct Link;
  struct OutputLease;
  struct BatchCalls;

  std::shared_ptr<Link> link() const;
  Status run_batch(Link& link, const std::vector<WorkerRequest>& requests, std::vector<WorkerAnswer>* answers);
  Status place_batch(Link& link, const std::vector<WorkerRequest>& requests, worker::Message* message);
  // Waits for batch `batch`'s result; writes cancellation flags meanwhile. kInternal when the
  // worker exited (`exited` set).
  // Meanwhile starts the batch's model-to-model calls and sends their answers.
  Status await_result(Link& link, const std::vector<WorkerRequest>& requests, uint64_t batch, worker::Message* result,
                      bool* exited);
  // A call the worker sent while the batch runs: started, or answered at once when it cannot be.
  void start_call(Link& link, const worker::Message& message, BatchCalls& calls);
  // The call's answer into the inputs arena, above what the batch and earlier answers use; false
  // when the worker takes no messages.
  bool send_call_answer(Link& link, uint64_t call, const ModelCallAnswer& answer, BatchCalls& calls);
  Status read_answers(Link& link, size_t count, const worker::Message& result, std::vector<WorkerAnswer>* answers);
  // The lowest offset of the outputs arena no answer still in use lies at or above.
  uint64_t outputs_floor();

  const PythonWorkerOptions options_;
  const DeclaredOutputs declared_;  // options_' outputs
  const PythonWorkerHooks hooks_;
  std::mutex batch_mutex_;
  mutable std::mutex link_mutex_;
  std::shared_ptr<Link> link_;                      // guarded by link_mutex_
  std::vector<std::weak_ptr<OutputLease>> leases_;  // guarded by link_mutex_
  uint64_t next_batch_ = 1;                         // guarded by batch_mutex_
  uint64_t batch_end_ = 0;                   // the end of the batch in flight's bytes in the inputs arena; batch_mutex_
  std::shared_ptr<ModelCalls> model_calls_;  // guarded by link_mutex_
  // The batch in flight's cancellations, for batch_abandoned(); guarded by link_mutex_.
  std::vector<RequestCancellation> running_;
};

}  // namespace inferd
