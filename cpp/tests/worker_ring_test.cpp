#include "inferd/worker_ring.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "inferd/python_worker_executor.h"
#include "inferd/worker_messages.h"
#include "worker_ring_support.h"

namespace inferd::worker {
namespace {

using ring_testing::floats;
using ring_testing::self_pidfd;
using ring_testing::worker_end;
using ring_testing::x_to_y_options;

Message message_of(MessageKind kind, uint64_t batch) {
  Message message;
  message.kind = static_cast<uint32_t>(kind);
  message.batch = batch;
  return message;
}

TEST(RingFds, FormatsAndParsesFiveDescriptors) {
  const RingFds fds{3, 4, 5, 6, 7};
  EXPECT_EQ(fds.format(), "3,4,5,6,7");
  const RingFds parsed = RingFds::parse("3,4,5,6,7");
  EXPECT_EQ(parsed.ring, 3);
  EXPECT_EQ(parsed.to_server, 7);
  for (const char* bad : {"", "3,4,5,6", "3,4,5,6,7,8", "3,,5,6,7", "a,4,5,6,7", "-3,4,5,6,7"}) {
    EXPECT_THROW(RingFds::parse(bad), std::invalid_argument) << bad;
  }
}

TEST(SharedRegion, IsSealedAgainstShrinkingAndCoversWhatTheWriterGrew) {
  SharedRegion writer = SharedRegion::create("test", 4096, false);
  SharedRegion reader = SharedRegion::adopt(::dup(writer.fd()));
  EXPECT_NE(::ftruncate(reader.fd(), 0), 0) << "a shrink must be refused";
  writer.reserve(3 * 4096);
  std::memset(writer.data() + 2 * 4096, 7, 16);
  EXPECT_FALSE(reader.cover(writer.size() + 1));
  ASSERT_TRUE(reader.cover(3 * 4096));
  EXPECT_EQ(static_cast<int>(reader.data()[2 * 4096]), 7);
}

TEST(SharedRegion, RefusesAnUnsealedFile) {
  const int fd = ::memfd_create("plain", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, 4096), 0);
  EXPECT_THROW(SharedRegion::adopt(fd), std::invalid_argument);
}

TEST(WorkerRing, CarriesMessagesBothWaysInOrder) {
  WorkerRing server = WorkerRing::create("test");
  WorkerRing worker = worker_end(server);
  Message got;
  EXPECT_FALSE(worker.receive(&got));
  for (uint64_t i = 1; i <= 3; ++i) ASSERT_TRUE(server.send(message_of(MessageKind::kExecute, i)));
  for (uint64_t i = 1; i <= 3; ++i) {
    ASSERT_TRUE(worker.receive(&got));
    EXPECT_EQ(got.batch, i);
  }
  ASSERT_TRUE(worker.send(message_of(MessageKind::kResult, 9)));
  ASSERT_EQ(server.wait(1000), WorkerRing::Wait::kMessage);
  ASSERT_TRUE(server.receive(&got));
  EXPECT_EQ(got.kind, static_cast<uint32_t>(MessageKind::kResult));
  EXPECT_EQ(got.batch, 9u);
}

TEST(WorkerRing, IsFullAtItsSlotCount) {
  WorkerRing server = WorkerRing::create("test");
  for (uint32_t i = 0; i < kSlotCount; ++i) ASSERT_TRUE(server.send(message_of(MessageKind::kExecute, i)));
  EXPECT_FALSE(server.send(message_of(MessageKind::kExecute, 99)));
}

TEST(WorkerRing, WaitEndsOnASendFromAnotherThreadAndOnWake) {
  WorkerRing server = WorkerRing::create("test");
  WorkerRing worker = worker_end(server);
  std::thread sender([&worker] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    worker.send(message_of(MessageKind::kResult, 1));
  });
  EXPECT_EQ(server.wait(5000), WorkerRing::Wait::kMessage);
  sender.join();
  Message got;
  ASSERT_TRUE(server.receive(&got));
  EXPECT_EQ(server.wait(10), WorkerRing::Wait::kTimeout);
  std::thread waker([&server] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    server.wake();
  });
  EXPECT_EQ(server.wait(5000), WorkerRing::Wait::kWoken);
  waker.join();
}

TEST(WorkerRing, ASpinningWaitTakesAMessageAwakeAndMissesNoWake) {
  WorkerRing server = WorkerRing::create("test");
  WorkerRing worker = worker_end(server);
  const auto long_spin = std::chrono::microseconds(2'000'000);
  std::thread sender([&worker] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    worker.send(message_of(MessageKind::kResult, 1));
  });
  const auto started = std::chrono::steady_clock::now();
  EXPECT_EQ(server.wait(5000, -1, long_spin), WorkerRing::Wait::kMessage);
  EXPECT_LT(std::chrono::steady_clock::now() - started, std::chrono::milliseconds(1500));  // not the spin's end
  sender.join();
  Message got;
  ASSERT_TRUE(server.receive(&got));
  // A wake() while it spins (no doorbell wait yet) still ends the wait once it sleeps.
  std::thread waker([&server] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    server.wake();
  });
  EXPECT_EQ(server.wait(5000, -1, std::chrono::microseconds(100'000)), WorkerRing::Wait::kWoken);
  waker.join();
  // A spin longer than the timeout ends with it; a timeout of 0 means no spin.
  const auto before = std::chrono::steady_clock::now();
  EXPECT_EQ(server.wait(10, -1, long_spin), WorkerRing::Wait::kTimeout);
  EXPECT_EQ(server.wait(0, -1, long_spin), WorkerRing::Wait::kTimeout);
  EXPECT_LT(std::chrono::steady_clock::now() - before, std::chrono::milliseconds(1000));
}

TEST(WorkerRing, WaitSeesAnotherDescriptor) {
  WorkerRing server = WorkerRing::create("test");
  int pipe_fds[2];
  ASSERT_EQ(::pipe(pipe_fds), 0);
  ASSERT_EQ(::write(pipe_fds[1], "x", 1), 1);
  EXPECT_EQ(server.wait(5000, pipe_fds[0]), WorkerRing::Wait::kOther);
  ::close(pipe_fds[0]);
  ::close(pipe_fds[1]);
}

TEST(WorkerRing, RefusesARegionOfAnotherProtocol) {
  WorkerRing server = WorkerRing::create("test");
  const RingFds fds = server.fds();
  SharedRegion other = SharedRegion::create("other", sizeof(RingHeader), true);
  EXPECT_THROW(WorkerRing::adopt(RingFds{::dup(other.fd()), ::dup(fds.inputs), ::dup(fds.outputs), ::dup(fds.to_worker),
                                         ::dup(fds.to_server)}),
               std::invalid_argument);
}

TEST(WorkerMessages, BatchesRoundTrip) {
  BatchDescription batch;
  batch.cancel_offset = 0;
  RequestDescription request;
  request.id = "r1";
  request.parameters = R"({"a":1})";
  request.correlation_string = "session-a";
  request.flags = 3;
  request.requested_outputs = {"y"};
  request.inputs.push_back(TensorPlace{"x", DataType::kFp32, {2, 3}, 64, 24});
  batch.requests.push_back(request);
  request.correlation_string = {};
  request.correlation_id = 42;
  batch.requests.push_back(request);
  const std::string bytes = encode_batch(batch);
  BatchDescription decoded;
  ASSERT_TRUE(decode_batch(bytes, 4096, &decoded).ok());
  ASSERT_EQ(decoded.requests.size(), 2u);
  EXPECT_EQ(decoded.requests[0].id, "r1");
  EXPECT_EQ(decoded.requests[0].parameters, R"({"a":1})");
  EXPECT_EQ(decoded.requests[0].correlation_string, "session-a");
  EXPECT_EQ(decoded.requests[0].flags, 3u);
  EXPECT_EQ(decoded.requests[1].correlation_id, 42u);
  EXPECT_EQ(decoded.requests[1].flags, 3u);
  ASSERT_EQ(decoded.requests[0].inputs.size(), 1u);
  EXPECT_EQ(decoded.requests[0].inputs[0].shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(decoded.requests[0].inputs[0].offset, 64u);
  for (size_t cut = 0; cut < bytes.size(); ++cut) {
    EXPECT_FALSE(decode_batch(std::string_view(bytes).substr(0, cut), 4096, &decoded).ok()) << cut;
  }
}

TEST(WorkerMessages, AResponseIsAnErrorAnAnswerOrARescheduledRequest) {
  std::vector<ResponseDescription> sent(3);
  sent[0].ok = false;
  sent[0].error = "boom";
  sent[1].outputs.push_back(TensorPlace{"y", DataType::kFp32, {1}, 0, 4});
  sent[2].rescheduled = true;
  const std::string bytes = encode_responses(sent);  // what the decoded views point into
  std::vector<ResponseDescription> got;
  ASSERT_TRUE(decode_responses(bytes, 1024, &got).ok());
  ASSERT_EQ(got.size(), 3u);
  EXPECT_FALSE(got[0].ok);
  EXPECT_EQ(got[0].error, "boom");
  EXPECT_TRUE(got[1].ok);
  EXPECT_FALSE(got[1].rescheduled);
  EXPECT_EQ(got[1].outputs.size(), 1u);
  EXPECT_TRUE(got[2].ok);
  EXPECT_TRUE(got[2].rescheduled);
}

TEST(WorkerMessages, RefusesTensorsOutsideTheArenaOrOfTheWrongSize) {
  auto decoded_with = [](TensorPlace place) {
    ResponseDescription response;
    response.outputs.push_back(place);
    std::vector<ResponseDescription> responses;
    return decode_responses(encode_responses({response}), 1024, &responses);
  };
  EXPECT_TRUE(decoded_with(TensorPlace{"y", DataType::kFp32, {4}, 0, 16}).ok());
  EXPECT_FALSE(decoded_with(TensorPlace{"y", DataType::kFp32, {4}, 1020, 16}).ok());
  EXPECT_FALSE(decoded_with(TensorPlace{"y", DataType::kFp32, {4}, UINT64_MAX - 4, 16}).ok());
  EXPECT_FALSE(decoded_with(TensorPlace{"y", DataType::kFp32, {5}, 0, 16}).ok());
  EXPECT_FALSE(decoded_with(TensorPlace{"y", DataType::kFp32, {-1}, 0, 0}).ok());
  EXPECT_FALSE(decoded_with(TensorPlace{"y", static_cast<DataType>(99), {4}, 0, 16}).ok());
  EXPECT_TRUE(decoded_with(TensorPlace{"s", DataType::kBytes, {2}, 0, 10}).ok());  // checked when copied
}

// A worker of the test's own, in a thread: answers each execute with `answer` (the batch, the
// arena's base) until told to stop.
class FakeWorker {
 public:
  using Answer = std::function<std::vector<ResponseDescription>(const BatchDescription&, SharedRegion& outputs,
                                                                uint64_t floor, const std::byte* inputs)>;
  FakeWorker(const WorkerRing& server, Answer answer) : ring_(worker_end(server)), answer_(std::move(answer)) {
    thread_ = std::thread([this] { run(); });
  }
  ~FakeWorker() {
    stop_ = true;
    ring_.wake();
    thread_.join();
  }
  std::atomic<int> batches{0};

 private:
  void run() {
    while (!stop_) {
      Message execute;
      if (!ring_.receive(&execute)) {
        ring_.wait(100);
        continue;
      }
      ASSERT_TRUE(ring_.inputs().cover(execute.offset + execute.length));
      const std::string bytes(reinterpret_cast<const char*>(ring_.inputs().data() + execute.offset), execute.length);
      BatchDescription batch;
      ASSERT_TRUE(decode_batch(bytes, ring_.inputs().size(), &batch).ok());
      std::vector<ResponseDescription> responses =
          answer_(batch, ring_.outputs(), execute.floor, ring_.inputs().data());
      const std::string description = encode_responses(responses);
      const size_t at = aligned(execute.floor + 4096);
      ring_.outputs().reserve(at + description.size());
      std::memcpy(ring_.outputs().data() + at, description.data(), description.size());
      Message result = message_of(MessageKind::kResult, execute.batch);
      result.count = static_cast<uint32_t>(responses.size());
      result.offset = at;
      result.length = description.size();
      ++batches;  // before the answer: the test reads it once its batch is answered
      ring_.send(result);
    }
  }

  WorkerRing ring_;
  Answer answer_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Echo: output y is input x, written at the floor.
std::vector<ResponseDescription> echo(const BatchDescription& batch, SharedRegion& outputs, uint64_t floor,
                                      const std::byte* inputs) {
  std::vector<ResponseDescription> responses;
  uint64_t at = floor;
  for (const RequestDescription& request : batch.requests) {
    const TensorPlace& x = request.inputs.at(0);
    outputs.reserve(at + x.nbytes + 4096 * 2);
    std::memcpy(outputs.data() + at, inputs + x.offset, x.nbytes);
    ResponseDescription response;
    response.outputs.push_back(TensorPlace{"y", x.dtype, x.shape, at, x.nbytes});
    responses.push_back(response);
    at += aligned(x.nbytes);
  }
  return responses;
}

ExecutorRequest request_of(const std::vector<float>& values, std::string_view id) {
  ExecutorRequest request;
  Tensor x;
  x.dtype = DataType::kFp32;
  x.shape = {static_cast<int64_t>(values.size())};
  x.data = reinterpret_cast<const std::byte*>(values.data());
  x.byte_size = values.size() * sizeof(float);
  request.inputs.push_back(x);
  request.id = id;
  return request;
}

TEST(PythonWorkerExecutor, ABatchCrossesTheRingAndItsAnswersViewTheArena) {
  auto ring = std::make_shared<WorkerRing>(WorkerRing::create("test"));
  FakeWorker worker(*ring, echo);
  int served = 0;
  PythonWorkerExecutor executor(x_to_y_options("m"),
                                {[&served] { return ++served, Status::Ok(); }, [] { return Status::Ok(); }, {}, {}});
  executor.attach(ring, self_pidfd());
  const std::vector<float> a = {1, 2, 3};
  const std::vector<float> b = {4, 5};
  std::vector<RequestResult> first;
  ASSERT_TRUE(executor.execute_requests({request_of(a, "a"), request_of(b, "b")}, &first, nullptr).ok());
  ASSERT_EQ(first.size(), 2u);
  ASSERT_TRUE(first[0].status.ok()) << first[0].status.message;
  EXPECT_EQ(floats(first[0].outputs[0]), a);
  EXPECT_EQ(floats(first[1].outputs[0]), b);
  // While the first answers are held, the next batch's land above them.
  std::vector<RequestResult> second;
  ASSERT_TRUE(executor.execute_requests({request_of(b, "c")}, &second, nullptr).ok());
  EXPECT_EQ(floats(first[0].outputs[0]), a);
  EXPECT_EQ(floats(second[0].outputs[0]), b);
  EXPECT_GT(second[0].outputs[0].data, first[1].outputs[0].data);
  EXPECT_EQ(served, 0);
  EXPECT_EQ(worker.batches, 2);
}

TEST(PythonWorkerExecutor, AMissingOrMistypedOutputFailsItsRequestAlone) {
  auto ring = std::make_shared<WorkerRing>(WorkerRing::create("test"));
  FakeWorker worker(*ring, [](const BatchDescription& batch, SharedRegion&, uint64_t floor, const std::byte*) {
    std::vector<ResponseDescription> responses(batch.requests.size());
    responses[0].outputs.push_back(TensorPlace{"y", DataType::kFp64, {1}, floor, 8});
    ResponseDescription& error = responses[1];
    error.ok = false;
    error.error = "the model's own error";
    return responses;  // the third has no output at all
  });
  PythonWorkerExecutor executor(x_to_y_options("m"),
                                {[] { return Status::Ok(); }, [] { return Status::Ok(); }, {}, {}});
  executor.attach(ring, self_pidfd());
  const std::vector<float> a = {1};
  std::vector<RequestResult> results;
  ASSERT_TRUE(
      executor.execute_requests({request_of(a, "a"), request_of(a, "b"), request_of(a, "c")}, &results, nullptr).ok());
  EXPECT_EQ(results[0].status.message, "python model 'm': output 'y' is FP64, the model declares FP32");
  EXPECT_EQ(results[1].status.message, "the model's own error");
  EXPECT_EQ(results[2].status.message, "python model 'm': its response has no output 'y'");
}

// The worker holds the batch until its flag is set and the test has seen the batch abandoned, so
// batch_abandoned() is looked at while the batch is surely in flight (a canceller that only polled
// it could miss the few milliseconds a batch takes, and loop for ever).
TEST(PythonWorkerExecutor, CancellationReachesTheWorkerWhileItRuns) {
  auto ring = std::make_shared<WorkerRing>(WorkerRing::create("test"));
  std::atomic<bool> saw_flag{false};
  std::atomic<bool> seen_abandoned{false};
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  FakeWorker worker(*ring, [&](const BatchDescription& batch, SharedRegion&, uint64_t, const std::byte* inputs) {
    const auto* flag = reinterpret_cast<const uint8_t*>(inputs + batch.cancel_offset);
    while (__atomic_load_n(flag, __ATOMIC_ACQUIRE) == 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    saw_flag = __atomic_load_n(flag, __ATOMIC_ACQUIRE) != 0;
    while (!seen_abandoned && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    ResponseDescription failed;
    failed.ok = false;
    failed.error = "cancelled";
    return std::vector<ResponseDescription>(batch.requests.size(), failed);
  });
  PythonWorkerExecutor executor(x_to_y_options("m"),
                                {[] { return Status::Ok(); }, [] { return Status::Ok(); }, {}, {}});
  executor.attach(ring, self_pidfd());
  const std::vector<float> a = {1};
  ExecutorRequest request = request_of(a, "a");
  auto flag = std::make_shared<std::atomic<bool>>(false);
  request.cancellation.flag = flag;
  std::thread canceller([&] {
    flag->store(true);
    while (!executor.batch_abandoned() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    seen_abandoned = executor.batch_abandoned();
  });
  std::vector<RequestResult> results;
  ASSERT_TRUE(executor.execute_requests({request}, &results, nullptr).ok());
  canceller.join();
  EXPECT_TRUE(saw_flag);
  EXPECT_TRUE(seen_abandoned);
  EXPECT_EQ(results[0].status.message, "cancelled");
  EXPECT_FALSE(executor.batch_abandoned());  // no batch in flight
}

TEST(PythonWorkerExecutor, AWorkerThatExitsFailsTheBatchWithWhatDiedSays) {
  auto ring = std::make_shared<WorkerRing>(WorkerRing::create("test"));  // nobody answers it
  const pid_t child = ::fork();
  if (child == 0) ::_exit(3);
  const int pidfd = static_cast<int>(::syscall(SYS_pidfd_open, child, 0));
  ASSERT_GE(pidfd, 0);
  int died = 0;
  PythonWorkerExecutor executor(x_to_y_options("m"),
                                {[] { return Status::Error(StatusCode::kUnavailable, "restarting"); },
                                 [&died] {
                                   ++died;
                                   return Status::Error(StatusCode::kInternal, "it died: status 3");
                                 },
                                 {},
                                 {}});
  executor.attach(ring, pidfd);
  const std::vector<float> a = {1};
  std::vector<RequestResult> results;
  const Status status = executor.execute_requests({request_of(a, "a")}, &results, nullptr);
  EXPECT_EQ(status.message, "it died: status 3");
  EXPECT_EQ(died, 1);
  EXPECT_FALSE(executor.attached());
  // With none attached, a batch asks ensure_serving and fails with its word.
  EXPECT_EQ(executor.execute_requests({request_of(a, "b")}, &results, nullptr).message, "restarting");
  ::waitpid(child, nullptr, 0);
}

TEST(PythonWorkerExecutor, ACorruptAnswerIsTheWorkersDeath) {
  auto ring = std::make_shared<WorkerRing>(WorkerRing::create("test"));
  FakeWorker worker(*ring, [](const BatchDescription&, SharedRegion&, uint64_t floor, const std::byte*) {
    ResponseDescription response;
    response.outputs.push_back(TensorPlace{"y", DataType::kFp32, {1}, floor + (uint64_t{1} << 40), 4});
    return std::vector<ResponseDescription>{response};
  });
  int died = 0;
  PythonWorkerExecutor executor(x_to_y_options("m"), {[] { return Status::Ok(); },
                                                      [&died] {
                                                        ++died;
                                                        return Status::Error(StatusCode::kInternal, "killed");
                                                      },
                                                      {},
                                                      {}});
  executor.attach(ring, self_pidfd());
  const std::vector<float> a = {1};
  std::vector<RequestResult> results;
  EXPECT_EQ(executor.execute_requests({request_of(a, "a")}, &results, nullptr).message, "killed");
  EXPECT_EQ(died, 1);
}

}  // namespace
}  // namespace inferd::worker
