#include "inferd/load_generator.h"

#include <grpcpp/create_channel.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <random>
#include <thread>
#include <utility>

namespace inferd {
namespace {

using Clock = std::chrono::steady_clock;

constexpr const char* kModelInfer = "/inference.GRPCInferenceService/ModelInfer";

// One run's shared state. Calls are started from the caller's thread (the closed loop's first
// ones, the open loop's all) and from the completion thread (the closed loop's next ones);
// `mutex_` guards the counts and the result. The completion queue and its thread are the run's
// own, shut down and joined before the run ends: no gRPC thread touches the run afterwards.
class Run {
 public:
  explicit Run(const LoadOptions& options)
      : options_(options),
        channel_(grpc::CreateChannel(options.target, grpc::InsecureChannelCredentials())),
        stub_(channel_) {
    start_ = Clock::now();
    counted_from_ = start_ + seconds(options.warmup_s);
    counted_until_ = counted_from_ + seconds(options.measure_s);
    completions_thread_ = std::thread([this] { take_completions(); });
  }

  ~Run() {
    queue_.Shutdown();
    completions_thread_.join();
  }

  LoadResult measure() {
    if (options_.rate > 0) {
      open_loop();
    } else {
      for (uint32_t i = 0; i < options_.concurrency; ++i) start_call(Clock::now());
      std::this_thread::sleep_until(counted_until_);
    }
    std::unique_lock<std::mutex> lock(mutex_);
    stopping_ = true;
    idle_.wait(lock, [&] { return in_flight_ == 0; });
    result_.seconds = options_.measure_s;
    return std::move(result_);
  }

 private:
  struct Call {
    grpc::ClientContext context;
    grpc::ByteBuffer request;
    grpc::ByteBuffer response;
    grpc::Status status;
    std::unique_ptr<grpc::GenericClientAsyncResponseReader> reader;
    Clock::time_point arrival;
  };

  static Clock::duration seconds(double s) {
    return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(s));
  }

  // Poisson arrivals until the window ends; an arrival past `concurrency` calls in flight is
  // dropped, so the schedule never bends to the server's pace.
  void open_loop() {
    std::mt19937_64 random(options_.seed);
    std::exponential_distribution<double> gap(options_.rate);
    Clock::time_point arrival = Clock::now();
    while (true) {
      arrival += seconds(gap(random));
      if (arrival >= counted_until_) break;
      std::this_thread::sleep_until(arrival);
      {
        std::lock_guard<std::mutex> lock(mutex_);
        if (in_flight_ >= options_.concurrency) {
          if (arrival >= counted_from_) ++result_.dropped;
          continue;
        }
      }
      start_call(arrival);
    }
  }

  // Takes a place in flight and sends; nothing once the run is stopping.
  void start_call(Clock::time_point arrival) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (stopping_) return;
      ++in_flight_;
    }
    send(arrival);
  }

  // Sends the next request on a place in flight already taken. The call is owned by its tag
  // until its completion is taken.
  void send(Clock::time_point arrival) {
    size_t index;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      index = next_++ % options_.requests.size();
    }
    auto* call = new Call;
    grpc::Slice bytes(options_.requests[index]);
    call->request = grpc::ByteBuffer(&bytes, 1);
    call->arrival = arrival;
    call->context.set_deadline(std::chrono::system_clock::now() +
                               std::chrono::duration_cast<std::chrono::system_clock::duration>(
                                   std::chrono::duration<double>(options_.timeout_s)));
    call->reader = stub_.PrepareUnaryCall(&call->context, kModelInfer, call->request, &queue_);
    call->reader->StartCall();
    call->reader->Finish(&call->response, &call->status, call);
  }

  void take_completions() {
    void* tag = nullptr;
    bool ok = false;
    while (queue_.Next(&tag, &ok)) {
      std::unique_ptr<Call> call(static_cast<Call*>(tag));
      finished(*call);
    }
  }

  void finished(const Call& call) {
    const Clock::time_point now = Clock::now();
    const bool counted = call.arrival >= counted_from_ && call.arrival < counted_until_;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (counted) {
        if (call.status.ok()) {
          result_.latencies_ns.push_back(
              static_cast<uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(now - call.arrival).count()));
        } else if (result_.errors++ == 0) {
          result_.first_error = call.status.error_message();
        }
      }
      // The closed loop hands this call's place to the next request; otherwise the place is
      // given back, and the last one back wakes measure().
      if (options_.rate > 0 || stopping_ || now >= counted_until_) {
        if (--in_flight_ == 0) idle_.notify_all();
        return;
      }
    }
    send(now);
  }

  const LoadOptions& options_;
  std::shared_ptr<grpc::Channel> channel_;
  grpc::GenericStub stub_;
  grpc::CompletionQueue queue_;
  Clock::time_point start_, counted_from_, counted_until_;
  std::thread completions_thread_;  // takes queue_'s completions until it is shut down

  std::mutex mutex_;
  std::condition_variable idle_;  // notified when in_flight_ reaches 0
  uint32_t in_flight_ = 0;        // guarded by mutex_
  uint64_t next_ = 0;             // guarded by mutex_: the next request to send
  bool stopping_ = false;         // guarded by mutex_: no call starts once set
  LoadResult result_;             // guarded by mutex_
};

}  // namespace

LoadResult LoadGenerator::run(const LoadOptions& options) {
  LoadResult empty;
  if (options.requests.empty() || options.concurrency == 0) {
    empty.first_error = "nothing to send: no requests, or concurrency 0";
    return empty;
  }
  Run run(options);
  return run.measure();
}

}  // namespace inferd
