#include "inferd/sequence_batcher.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace inferd {
namespace {

using namespace std::chrono_literals;
using Batch = std::vector<std::unique_ptr<InferenceRequest>>;

// A request of sequence `id` (or `string_id`) with one FP32 input of dims [4] (no data: the
// batcher reads shapes only) and room for `controls` control inputs after it.
std::unique_ptr<InferenceRequest> step(uint64_t token, uint64_t id, bool start, bool end, size_t controls = 0,
                                       const std::string& string_id = "") {
  auto r = std::make_unique<InferenceRequest>();
  r->token = token;
  r->inputs.push_back(Tensor{DataType::kFp32, {1, 4}, nullptr, 0, nullptr});
  for (size_t k = 0; k < controls; ++k) r->inputs.push_back(Tensor::Absent(DataType::kInt32));
  r->sequence_flags.id = id;
  r->sequence_flags.string_id = string_id;
  r->sequence_flags.start = start;
  r->sequence_flags.end = end;
  return r;
}

SequenceOptions direct(int64_t max_batch_size, uint32_t instances = 1) {
  SequenceOptions o;
  o.max_batch_size = max_batch_size;
  o.instances = instances;
  return o;
}

std::vector<uint64_t> tokens(const Batch& batch) {
  std::vector<uint64_t> out;
  for (const auto& r : batch) out.push_back(r->token);
  return out;
}

// The next batch for `instance`, failing the test if only rejections came or none came in 2 s.
Batch next(SequenceBatcher& batcher, uint32_t instance = 0) {
  Batch batch;
  std::vector<Rejection> rejected;
  EXPECT_TRUE(batcher.next_batch(instance, &batch, &rejected));
  EXPECT_TRUE(rejected.empty());
  return batch;
}

// Whether `instance` gets a batch within `wait` (taken in a thread; the batcher is closed after,
// so that the thread ends).
class Taker {
 public:
  Taker(SequenceBatcher& batcher, uint32_t instance) {
    future_ = std::async(std::launch::async, [&batcher, instance] {
      Batch batch;
      std::vector<Rejection> rejected;
      while (batch.empty() && batcher.next_batch(instance, &batch, &rejected)) rejected.clear();
      return batch;
    });
  }
  bool ready(std::chrono::milliseconds wait) { return future_.wait_for(wait) == std::future_status::ready; }
  Batch get() { return future_.get(); }

 private:
  std::future<Batch> future_;
};

template <typename T>
T value(const Tensor& tensor) {
  T out;
  std::memcpy(&out, tensor.data, sizeof out);
  return out;
}

TEST(SequenceBatcher, RefusesWhatTritonRefuses) {
  SequenceBatcher batcher(direct(4));
  auto none = step(1, 0, true, false);
  Status status = batcher.enqueue(std::move(none));
  EXPECT_EQ(status.code, StatusCode::kInvalidArgument);
  EXPECT_NE(status.message.find("non-zero or non-empty correlation ID"), std::string::npos) << status.message;

  auto rows = step(2, 5, true, false);
  rows->batch_size = 2;
  status = batcher.enqueue(std::move(rows));
  EXPECT_EQ(status.code, StatusCode::kInvalidArgument);
  EXPECT_NE(status.message.find("batch-size 1"), std::string::npos) << status.message;

  status = batcher.enqueue(step(3, 5, false, false));
  EXPECT_EQ(status.code, StatusCode::kInvalidArgument);
  EXPECT_EQ(status.message,
            "inference request for sequence 5 must specify the START flag on the first request of the sequence");

  // After its END, the id needs START again.
  ASSERT_TRUE(batcher.enqueue(step(4, 5, true, true)).ok());
  status = batcher.enqueue(step(5, 5, false, false));
  EXPECT_EQ(status.code, StatusCode::kInvalidArgument);
  EXPECT_TRUE(batcher.enqueue(step(6, 5, true, false)).ok());
}

TEST(SequenceBatcher, ASequencesRequestsRunOneAtATimeInTheirOrder) {
  SequenceBatcher batcher(direct(4));
  ASSERT_TRUE(batcher.enqueue(step(1, 7, true, false)).ok());
  ASSERT_TRUE(batcher.enqueue(step(2, 7, false, false)).ok());
  ASSERT_TRUE(batcher.enqueue(step(3, 7, false, true)).ok());
  Batch first = next(batcher);
  EXPECT_EQ(tokens(first), std::vector<uint64_t>{1});
  Taker second(batcher, 0);
  EXPECT_FALSE(second.ready(100ms));  // the first has no answer yet
  batcher.finished(*first[0]);
  ASSERT_TRUE(second.ready(2s));
  Batch got = second.get();
  EXPECT_EQ(tokens(got), std::vector<uint64_t>{2});
  batcher.finished(*got[0]);
  Batch third = next(batcher);
  EXPECT_EQ(tokens(third), std::vector<uint64_t>{3});
  batcher.finished(*third[0]);
  EXPECT_EQ(batcher.active_sequences(), 0u);  // its END had its answer
}

TEST(SequenceBatcher, ABatchTakesOneRequestOfEachReadySequence) {
  SequenceBatcher batcher(direct(4));
  for (uint64_t id = 1; id <= 3; ++id) {
    ASSERT_TRUE(batcher.enqueue(step(id * 10, id, true, false)).ok());
    ASSERT_TRUE(batcher.enqueue(step(id * 10 + 1, id, false, true)).ok());
  }
  Batch batch = next(batcher);
  EXPECT_EQ(tokens(batch), (std::vector<uint64_t>{10, 20, 30}));
  for (const auto& r : batch) batcher.finished(*r);
  batch = next(batcher);
  EXPECT_EQ(tokens(batch), (std::vector<uint64_t>{11, 21, 31}));
}

TEST(SequenceBatcher, ControlTensorsSayStartEndReadyAndTheId) {
  SequenceOptions options = direct(8);
  options.controls = {
      {SequenceControl::Kind::kStart, 1, DataType::kInt32, 0, 1},
      {SequenceControl::Kind::kEnd, 2, DataType::kFp32, 0.5, 2.5},
      {SequenceControl::Kind::kReady, 3, DataType::kBool, 0, 1},
      {SequenceControl::Kind::kCorrelationId, 4, DataType::kUint64, 0, 1},
  };
  SequenceBatcher batcher(options);
  ASSERT_TRUE(batcher.enqueue(step(1, 99, true, false, 4)).ok());
  ASSERT_TRUE(batcher.enqueue(step(2, 99, false, true, 4)).ok());
  Batch batch = next(batcher);
  InferenceRequest& first = *batch[0];
  ASSERT_EQ(first.inputs.size(), 5u);
  EXPECT_EQ(first.inputs[1].shape, (std::vector<int64_t>{1, 1}));  // a batching model's: [1, 1]
  EXPECT_EQ(value<int32_t>(first.inputs[1]), 1);
  EXPECT_EQ(value<float>(first.inputs[2]), 0.5f);
  EXPECT_EQ(value<uint8_t>(first.inputs[3]), 1);
  EXPECT_EQ(value<uint64_t>(first.inputs[4]), 99u);
  EXPECT_TRUE(validate_tensor(first.inputs[4]).ok());
  batcher.finished(first);
  batch = next(batcher);
  EXPECT_EQ(value<int32_t>(batch[0]->inputs[1]), 0);
  EXPECT_EQ(value<float>(batch[0]->inputs[2]), 2.5f);
}

TEST(SequenceBatcher, AStringIdReachesABytesCorrelationControlAndANumericOneRefusesIt) {
  SequenceOptions options = direct(0);
  options.controls = {{SequenceControl::Kind::kCorrelationId, 1, DataType::kBytes, 0, 1}};
  SequenceBatcher batcher(options);
  ASSERT_TRUE(batcher.enqueue(step(1, 0, true, false, 1, "session-a")).ok());
  Batch batch = next(batcher);
  const Tensor& id = batch[0]->inputs[1];
  EXPECT_EQ(id.shape, std::vector<int64_t>{1});  // a model that does not batch: [1]
  ASSERT_TRUE(validate_tensor(id).ok());
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(id.data) + 4, id.byte_size - 4), "session-a");

  SequenceOptions numeric = direct(0);
  numeric.controls = {{SequenceControl::Kind::kCorrelationId, 1, DataType::kInt64, 0, 1}};
  SequenceBatcher refusing(numeric);
  const Status status = refusing.enqueue(step(1, 0, true, false, 1, "session-a"));
  EXPECT_EQ(status.code, StatusCode::kInvalidArgument);
  EXPECT_NE(status.message.find("numeric sequence_id"), std::string::npos) << status.message;
}

TEST(SequenceBatcher, DirectGivesEachSequenceASlotOfOneInstanceAndTheRestWaitInTheBacklog) {
  SequenceBatcher batcher(direct(1, 2));  // 2 instances of 1 slot
  for (uint64_t id = 1; id <= 3; ++id) ASSERT_TRUE(batcher.enqueue(step(id, id, true, id != 3)).ok());
  EXPECT_EQ(batcher.active_sequences(), 2u);
  EXPECT_EQ(batcher.backlog_sequences(), 1u);
  Batch on_zero = next(batcher, 0);
  Batch on_one = next(batcher, 1);
  EXPECT_EQ(tokens(on_zero), std::vector<uint64_t>{1});
  EXPECT_EQ(tokens(on_one), std::vector<uint64_t>{2});
  Taker waiting(batcher, 0);
  EXPECT_FALSE(waiting.ready(100ms));  // sequence 3 has no slot yet
  batcher.finished(*on_zero[0]);       // sequence 1 ended: its slot on instance 0 goes to 3
  ASSERT_TRUE(waiting.ready(2s));
  EXPECT_EQ(tokens(waiting.get()), std::vector<uint64_t>{3});
  EXPECT_EQ(batcher.backlog_sequences(), 0u);
}

TEST(SequenceBatcher, OldestBatchesTheOldestReadyRequestsOfItsCandidates) {
  SequenceOptions options = direct(2, 1);
  options.strategy = SequenceOptions::Strategy::kOldest;
  options.max_candidate_sequences = 3;
  SequenceBatcher batcher(options);
  for (uint64_t id = 1; id <= 4; ++id) ASSERT_TRUE(batcher.enqueue(step(id, id, true, true)).ok());
  EXPECT_EQ(batcher.active_sequences(), 3u);
  EXPECT_EQ(batcher.backlog_sequences(), 1u);
  Batch batch = next(batcher, 0);
  EXPECT_EQ(tokens(batch), (std::vector<uint64_t>{1, 2}));  // the most per batch: 2
  Batch other = next(batcher, 0);                           // any instance takes a candidate's
  EXPECT_EQ(tokens(other), std::vector<uint64_t>{3});
  batcher.finished(*batch[0]);  // sequence 1 ends: 4 becomes a candidate
  EXPECT_EQ(tokens(next(batcher, 0)), std::vector<uint64_t>{4});
}

TEST(SequenceBatcher, OldestWaitsForAPreferredSizeUntilTheDelay) {
  SequenceOptions options = direct(4, 1);
  options.strategy = SequenceOptions::Strategy::kOldest;
  options.max_candidate_sequences = 4;
  options.preferred_batch_sizes = {2};
  options.max_queue_delay = 300ms;
  SequenceBatcher batcher(options);
  ASSERT_TRUE(batcher.enqueue(step(1, 1, true, false)).ok());
  Taker taker(batcher, 0);
  EXPECT_FALSE(taker.ready(100ms));  // one request: waits for company
  ASSERT_TRUE(batcher.enqueue(step(2, 2, true, false)).ok());
  ASSERT_TRUE(taker.ready(2s));
  EXPECT_EQ(tokens(taker.get()), (std::vector<uint64_t>{1, 2}));
  ASSERT_TRUE(batcher.enqueue(step(3, 3, true, false)).ok());
  const auto start = std::chrono::steady_clock::now();
  EXPECT_EQ(tokens(next(batcher, 0)), std::vector<uint64_t>{3});  // alone, after the delay
  EXPECT_GE(std::chrono::steady_clock::now() - start, 250ms);
}

TEST(SequenceBatcher, ASequenceIdlePastItsTimeoutIsReapedAndItsNextRequestNeedsStart) {
  SequenceOptions options = direct(2);
  options.max_sequence_idle = 100ms;
  std::mutex mutex;
  std::vector<std::string> ended;
  options.idle_ended = [&](const SequenceFlags& sequence) {
    std::lock_guard<std::mutex> lock(mutex);
    ended.push_back(sequence.shown());
  };
  SequenceBatcher batcher(options);
  std::thread watcher([&batcher] {
    std::vector<Rejection> rejected;
    while (batcher.next_expired(&rejected)) rejected.clear();
  });
  ASSERT_TRUE(batcher.enqueue(step(1, 42, true, false)).ok());
  Batch batch = next(batcher);
  batcher.finished(*batch[0]);
  EXPECT_EQ(batcher.active_sequences(), 1u);
  std::this_thread::sleep_for(400ms);
  EXPECT_EQ(batcher.active_sequences(), 0u);
  EXPECT_EQ(batcher.idle_ended(), 1u);
  {
    std::lock_guard<std::mutex> lock(mutex);
    EXPECT_EQ(ended, std::vector<std::string>{"42"});
  }
  EXPECT_EQ(batcher.enqueue(step(2, 42, false, false)).code, StatusCode::kInvalidArgument);
  batcher.close();
  watcher.join();
}

TEST(SequenceBatcher, WithTellIdleEndTheModelGetsOneMoreRequestOfAnIdleSequence) {
  SequenceOptions options = direct(2);
  options.max_sequence_idle = 100ms;
  options.tell_idle_end = true;
  options.input_types = {DataType::kFp32, DataType::kInt32, DataType::kInt32};
  options.controls = {{SequenceControl::Kind::kEnd, 1, DataType::kInt32, 0, 1},
                      {SequenceControl::Kind::kReady, 2, DataType::kInt32, 0, 1}};
  SequenceBatcher batcher(options);
  std::thread watcher([&batcher] {
    std::vector<Rejection> rejected;
    while (batcher.next_expired(&rejected)) rejected.clear();
  });
  ASSERT_TRUE(batcher.enqueue(step(1, 8, true, false, 2)).ok());
  Batch first = next(batcher);
  batcher.finished(*first[0]);
  // Idle: the model is told, in a request of its own: END, READY false, no input of the client's.
  Batch told = next(batcher);
  ASSERT_EQ(told.size(), 1u);
  InferenceRequest& tell = *told[0];
  EXPECT_TRUE(tell.inputs[0].absent);
  EXPECT_EQ(value<int32_t>(tell.inputs[1]), 1);  // END
  EXPECT_EQ(value<int32_t>(tell.inputs[2]), 0);  // READY
  EXPECT_EQ(tell.sequence_flags.id, 8u);
  ASSERT_NE(tell.sink, nullptr);  // its answer goes nowhere
  EXPECT_EQ(batcher.idle_ended(), 1u);
  // Its sequence needs START from here; a new one queues behind the telling request.
  EXPECT_EQ(batcher.enqueue(step(2, 8, false, false, 2)).code, StatusCode::kInvalidArgument);
  ASSERT_TRUE(batcher.enqueue(step(3, 8, true, true, 2)).ok());
  batcher.finished(tell);
  Batch again = next(batcher);
  EXPECT_EQ(tokens(again), std::vector<uint64_t>{3});
  EXPECT_EQ(value<int32_t>(again[0]->inputs[2]), 1);  // a client's request: READY
  batcher.finished(*again[0]);
  EXPECT_EQ(batcher.active_sequences(), 0u);
  batcher.close();
  watcher.join();
}

TEST(SequenceBatcher, AWaitingRequestPastItsDeadlineOrCancelledLeavesItsSequenceGoingOn) {
  SequenceBatcher batcher(direct(2));
  ASSERT_TRUE(batcher.enqueue(step(1, 3, true, false)).ok());
  auto late = step(2, 3, false, false);
  late->deadline = Clock::now() + 50ms;
  ASSERT_TRUE(batcher.enqueue(std::move(late)).ok());
  ASSERT_TRUE(batcher.enqueue(step(3, 3, false, false)).ok());
  Batch first = next(batcher);
  std::this_thread::sleep_for(100ms);
  std::unique_ptr<InferenceRequest> cancelled = batcher.cancel(3);
  ASSERT_NE(cancelled, nullptr);
  EXPECT_EQ(batcher.cancel(3), nullptr);
  ASSERT_TRUE(batcher.enqueue(step(4, 3, false, true)).ok());
  batcher.finished(*first[0]);
  Batch batch;
  std::vector<Rejection> rejected;
  ASSERT_TRUE(batcher.next_batch(0, &batch, &rejected));
  ASSERT_EQ(rejected.size(), 1u);
  EXPECT_EQ(rejected[0].first->token, 2u);
  EXPECT_EQ(rejected[0].second.code, StatusCode::kDeadlineExceeded);
  EXPECT_EQ(tokens(next(batcher)), std::vector<uint64_t>{4});
}

TEST(SequenceBatcher, AClosedBatcherHandsOutWhatWaitsInOrderThenEnds) {
  SequenceBatcher batcher(direct(1, 2));
  ASSERT_TRUE(batcher.enqueue(step(1, 1, true, false)).ok());
  ASSERT_TRUE(batcher.enqueue(step(2, 1, false, true)).ok());
  batcher.close();
  EXPECT_EQ(batcher.enqueue(step(3, 2, true, false)).code, StatusCode::kUnavailable);
  Taker idle_instance(batcher, 1);  // holds no sequence: ends once nothing waits
  Batch first = next(batcher, 0);
  batcher.finished(*first[0]);
  Batch second = next(batcher, 0);
  EXPECT_EQ(tokens(second), std::vector<uint64_t>{2});
  ASSERT_TRUE(idle_instance.ready(2s));
  EXPECT_TRUE(idle_instance.get().empty());
  Batch none;
  std::vector<Rejection> rejected;
  EXPECT_FALSE(batcher.next_batch(0, &none, &rejected));
}

}  // namespace
}  // namespace inferd
