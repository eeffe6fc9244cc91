#include "inferd/sequence_state.h"

#include <gtest/gtest.h>
#include <poll.h>

#include <chrono>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "inferd/scheduler.h"
#include "inferd/sequence_batcher.h"
#include "int_tensors.h"

namespace inferd {
namespace {

using Batch = std::vector<std::unique_ptr<InferenceRequest>>;

constexpr uint64_t kUnbounded = std::numeric_limits<uint64_t>::max();

// An INT32 state fed as input 1 (after one client input) and kept from output 1 (after the one
// output the client sees), of dims `dims`, a new sequence's shape `initial_dims`.
StateSpec int_state(std::vector<int64_t> dims, std::vector<int64_t> initial_dims, std::vector<int32_t> initial = {}) {
  StateSpec spec;
  spec.input_name = "STATE_IN";
  spec.input = 1;
  spec.output = 1;
  spec.dtype = DataType::kInt32;
  spec.dims = std::move(dims);
  spec.initial_dims = std::move(initial_dims);
  spec.initial.resize(initial.size() * sizeof(int32_t));
  if (!initial.empty()) std::memcpy(spec.initial.data(), initial.data(), spec.initial.size());
  return spec;
}

std::shared_ptr<PinnedBufferPool> test_pool() { return std::make_shared<PinnedBufferPool>(1 << 20, false); }
using int_tensors::int_tensor;
using int_tensors::ints;

std::unique_ptr<InferenceRequest> request_of(uint64_t token, uint64_t id, bool start, bool end,
                                             std::vector<int64_t> shape = {1, 1}) {
  auto r = std::make_unique<InferenceRequest>();
  r->token = token;
  r->inputs.push_back(Tensor{DataType::kInt32, std::move(shape), nullptr, 0, nullptr});
  r->inputs.push_back(Tensor::Absent(DataType::kInt32));  // the state's place
  r->sequence_flags.id = id;
  r->sequence_flags.start = start;
  r->sequence_flags.end = end;
  return r;
}

TEST(SequenceStates, ANewSequenceStartsFromZerosOrTheConfigsData) {
  auto memory = std::make_shared<SequenceStateMemory>(kUnbounded, "--max-sequence-state-bytes");
  SequenceStates zeros({int_state({-1}, {3})}, true, 1, memory, test_pool());
  SequenceFlags flags;
  flags.id = 7;
  CarriedState state;
  ASSERT_TRUE(zeros.initial(flags, &state).ok());
  auto request = request_of(1, 7, true, false);
  zeros.feed(state, request.get());
  EXPECT_EQ(request->inputs[1].shape, (std::vector<int64_t>{1, 3}));  // a batching model's: a batch dim of 1
  EXPECT_EQ(ints(request->inputs[1]), (std::vector<int32_t>{0, 0, 0}));

  SequenceStates data({int_state({2}, {2}, {5, 6})}, false, 1, memory, test_pool());
  CarriedState from_file;
  ASSERT_TRUE(data.initial(flags, &from_file).ok());
  data.feed(from_file, request.get());
  EXPECT_EQ(request->inputs[1].shape, (std::vector<int64_t>{2}));
  EXPECT_EQ(ints(request->inputs[1]), (std::vector<int32_t>{5, 6}));
  EXPECT_EQ(memory->used(), 12u + 8u);  // what the two states hold
}

TEST(SequenceStates, KeepTakesTheOutputStateIntoTheSequencesOwnBufferAndHidesIt) {
  auto memory = std::make_shared<SequenceStateMemory>(kUnbounded, "--max-sequence-state-bytes");
  SequenceStates states({int_state({-1}, {1})}, true, 1, memory, test_pool());
  SequenceFlags flags;
  flags.id = 1;
  auto request = request_of(1, 1, true, false);
  ASSERT_TRUE(states.initial(flags, &request->state).ok());
  states.feed(request->state, request.get());
  // Growing from [1] to [2]: a new buffer.
  std::vector<Tensor> outputs{int_tensor({1, 1}, {42}), int_tensor({1, 2}, {3, 4})};
  ASSERT_TRUE(states.keep(request.get(), &outputs).ok());
  ASSERT_EQ(outputs.size(), 1u);  // the state output is not the client's
  EXPECT_EQ(request->state.dims[0], (std::vector<int64_t>{2}));
  const StateBuffer* grown = request->state.buffers[0].get();
  EXPECT_EQ(memory->used(), 8u);  // the [1] buffer went: the request's spent input no longer views it
  EXPECT_TRUE(request->inputs[1].absent);
  // Shrinking back to [1] fits the buffer it has: written in place, no new memory.
  states.feed(request->state, request.get());
  std::vector<Tensor> next{int_tensor({1, 1}, {0}), int_tensor({1, 1}, {9})};
  ASSERT_TRUE(states.keep(request.get(), &next).ok());
  EXPECT_EQ(request->state.buffers[0].get(), grown);
  states.feed(request->state, request.get());
  EXPECT_EQ(ints(request->inputs[1]), (std::vector<int32_t>{9}));
  request.reset();
  EXPECT_EQ(memory->used(), 0u);  // every buffer went with the request that held it
}

TEST(SequenceStates, AnOutputStateTheConfigDoesNotAllowIsRefusedAndTheStateStays) {
  auto memory = std::make_shared<SequenceStateMemory>(kUnbounded, "--max-sequence-state-bytes");
  SequenceStates states({int_state({2}, {2}, {1, 2})}, true, 1, memory, test_pool());
  SequenceFlags flags;
  flags.id = 1;
  auto request = request_of(1, 1, true, false);
  ASSERT_TRUE(states.initial(flags, &request->state).ok());
  for (std::vector<Tensor> outputs : {
           std::vector<Tensor>{int_tensor({1, 1}, {0}), int_tensor({1, 3}, {1, 2, 3})},     // a fixed dim differs
           std::vector<Tensor>{int_tensor({1, 1}, {0}), int_tensor({2, 2}, {1, 2, 3, 4})},  // two rows
           std::vector<Tensor>{int_tensor({1, 1}, {0})},                                    // none
       }) {
    const Status status = states.keep(request.get(), &outputs);
    EXPECT_EQ(status.code, StatusCode::kInternal);
    EXPECT_NE(status.message.find("STATE_IN"), std::string::npos) << status.message;
  }
  states.feed(request->state, request.get());
  EXPECT_EQ(ints(request->inputs[1]), (std::vector<int32_t>{1, 2}));
}

TEST(SequenceStates, TheBoundRefusesANewSequenceAndAGrowthNamingItsFlag) {
  auto memory = std::make_shared<SequenceStateMemory>(20, "--max-sequence-state-bytes");
  SequenceStates states({int_state({-1}, {2})}, false, 1, memory, test_pool());
  SequenceFlags flags;
  flags.id = 1;
  CarriedState first, second, third;
  ASSERT_TRUE(states.initial(flags, &first).ok());
  ASSERT_TRUE(states.initial(flags, &second).ok());
  const Status refused = states.initial(flags, &third);
  EXPECT_EQ(refused.code, StatusCode::kResourceExhausted);
  EXPECT_NE(refused.message.find("--max-sequence-state-bytes"), std::string::npos) << refused.message;
  EXPECT_TRUE(third.empty());

  auto request = request_of(1, 1, false, false, {1});
  request->state = std::move(first);
  std::vector<Tensor> outputs{int_tensor({1}, {0}), int_tensor({3}, {1, 2, 3})};
  const Status grown = states.keep(request.get(), &outputs);
  EXPECT_EQ(grown.code, StatusCode::kResourceExhausted);
  EXPECT_EQ(request->state.dims[0], (std::vector<int64_t>{2}));  // unchanged
  second = CarriedState{};                                       // a sequence ends: its memory is free
  outputs = {int_tensor({1}, {0}), int_tensor({3}, {1, 2, 3})};
  EXPECT_TRUE(states.keep(request.get(), &outputs).ok());
  EXPECT_EQ(memory->used(), 12u);  // the old [2] buffer went once the state no longer held it
}

// The batcher's side: a START request brings the initial state, each next request of the sequence
// is fed what the one before left, requests batch only with equal state shapes, and an ended
// sequence's state is freed.
TEST(SequenceBatcherState, EachRequestIsFedTheStateTheLastOneLeft) {
  auto memory = std::make_shared<SequenceStateMemory>(kUnbounded, "--max-sequence-state-bytes");
  SequenceOptions options;
  options.max_batch_size = 4;
  options.states =
      std::make_shared<SequenceStates>(std::vector<StateSpec>{int_state({-1}, {1})}, true, 1, memory, test_pool());
  SequenceBatcher batcher(options);
  auto run = [&](uint64_t token, uint64_t id, bool start, bool end, std::vector<int32_t> next_state) {
    EXPECT_TRUE(batcher.enqueue(request_of(token, id, start, end)).ok());
    Batch batch;
    std::vector<Rejection> rejected;
    EXPECT_TRUE(batcher.next_batch(0, &batch, &rejected));
    EXPECT_EQ(batch.size(), 1u);
    std::vector<int32_t> fed = ints(batch[0]->inputs[1]);
    const auto length = static_cast<int64_t>(next_state.size());
    std::vector<Tensor> outputs{int_tensor({1, 1}, {0}), int_tensor({1, length}, std::move(next_state))};
    EXPECT_TRUE(options.states->keep(batch[0].get(), &outputs).ok());
    batcher.finished(*batch[0]);
    return fed;
  };
  EXPECT_EQ(run(1, 5, true, false, {1, 2}), (std::vector<int32_t>{0}));
  EXPECT_EQ(run(2, 5, false, false, {3, 4, 5}), (std::vector<int32_t>{1, 2}));
  EXPECT_EQ(run(3, 6, true, false, {7}), (std::vector<int32_t>{0}));  // another sequence: its own
  EXPECT_EQ(run(4, 5, false, true, {0}), (std::vector<int32_t>{3, 4, 5}));
  EXPECT_EQ(memory->used(), 4u);  // sequence 5 ended; 6 holds [7]

  // Sequences whose states differ in shape do not share a batch.
  EXPECT_EQ(run(5, 8, true, false, {1, 1}), (std::vector<int32_t>{0}));
  ASSERT_TRUE(batcher.enqueue(request_of(6, 6, false, false)).ok());  // state [1]
  ASSERT_TRUE(batcher.enqueue(request_of(7, 8, false, false)).ok());  // state [2]
  Batch batch;
  std::vector<Rejection> rejected;
  ASSERT_TRUE(batcher.next_batch(0, &batch, &rejected));
  EXPECT_EQ(batch.size(), 1u);
}

TEST(SequenceBatcherState, AStartBeyondTheBoundIsRefusedAndAFailedStepKeepsTheState) {
  auto memory = std::make_shared<SequenceStateMemory>(4, "--max-sequence-state-bytes");
  SequenceOptions options;
  options.max_batch_size = 0;
  options.states = std::make_shared<SequenceStates>(std::vector<StateSpec>{int_state({1}, {1}, {11})}, false, 1, memory,
                                                    test_pool());
  SequenceBatcher batcher(options);
  ASSERT_TRUE(batcher.enqueue(request_of(1, 1, true, false, {1})).ok());
  const Status refused = batcher.enqueue(request_of(2, 2, true, false, {1}));
  EXPECT_EQ(refused.code, StatusCode::kResourceExhausted);
  EXPECT_NE(refused.message.find("--max-sequence-state-bytes"), std::string::npos) << refused.message;
  Batch batch;
  std::vector<Rejection> rejected;
  ASSERT_TRUE(batcher.next_batch(0, &batch, &rejected));
  batcher.finished(*batch[0]);  // failed: nothing kept
  ASSERT_TRUE(batcher.enqueue(request_of(3, 1, false, true, {1})).ok());
  batch.clear();
  ASSERT_TRUE(batcher.next_batch(0, &batch, &rejected));
  EXPECT_EQ(ints(batch[0]->inputs[1]), (std::vector<int32_t>{11}));  // the initial state still
  batcher.finished(*batch[0]);
  batch.clear();
  EXPECT_EQ(memory->used(), 0u);
}

// An accumulator over a gathered batch: OUT = STATE_IN + INPUT, STATE_OUT = OUT (rows in order).
class AccumulatingExecutor : public Executor {
 public:
  Status execute(const std::vector<Tensor>& inputs, std::vector<Tensor>* outputs) override {
    const std::vector<int32_t> in = ints(inputs.at(0));
    const std::vector<int32_t> state = ints(inputs.at(1));
    std::vector<int32_t> sum(in.size());
    for (size_t i = 0; i < in.size(); ++i) sum[i] = in[i] + state[i];
    const auto rows = static_cast<int64_t>(in.size());
    outputs->push_back(int_tensor({rows, 1}, sum));
    outputs->push_back(int_tensor({rows, 1}, sum));
    batches.fetch_add(1);
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // the others' requests queue meanwhile
    return Status::Ok();
  }
  std::atomic<int> batches{0};
};

std::unique_ptr<InferenceRequest> add(uint64_t token, uint64_t id, bool start, bool end, int32_t value) {
  auto r = request_of(token, id, start, end);
  r->inputs[0] = int_tensor({1, 1}, {value});
  return r;
}

// Through the Scheduler: 8 sequences interleaved, each request answered with its own running
// sum, the state output never in an answer, and every state freed once the sequences end.
TEST(SchedulerState, InterleavedSequencesEachGetTheirOwnRunningSum) {
  auto memory = std::make_shared<SequenceStateMemory>(kUnbounded, "--max-sequence-state-bytes");
  SchedulerOptions options;
  options.model_name = "accumulate";
  options.batching.max_batch_size = 4;
  options.sequence_batching = true;
  options.sequence.strategy = SequenceOptions::Strategy::kOldest;
  options.sequence.max_candidate_sequences = 8;
  options.sequence.state_specs = {int_state({1}, {1})};
  options.sequence.visible_outputs = 1;
  options.sequence.state_memory = memory;
  auto executor = std::make_unique<AccumulatingExecutor>();
  AccumulatingExecutor* accumulating = executor.get();
  std::vector<std::unique_ptr<Executor>> instances;
  instances.push_back(std::move(executor));
  auto queue = std::make_shared<CompletionQueue>();
  Scheduler scheduler(options, std::move(instances), queue, test_pool());

  constexpr int kSequences = 8, kSteps = 5;
  std::map<uint64_t, int32_t> expected;
  for (int step = 0; step < kSteps; ++step) {
    for (int s = 0; s < kSequences; ++s) {
      const uint64_t token = static_cast<uint64_t>(step * kSequences + s + 1);
      const int32_t value = (s + 1) * 10 + step;
      ASSERT_TRUE(
          scheduler.submit(add(token, static_cast<uint64_t>(s + 1), step == 0, step == kSteps - 1, value)).ok());
      int32_t sum = 0;
      for (int k = 0; k <= step; ++k) sum += (s + 1) * 10 + k;
      expected[token] = sum;
    }
  }
  std::map<uint64_t, Completion> answers;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (answers.size() < expected.size() && std::chrono::steady_clock::now() < deadline) {
    pollfd p{queue->fd(), POLLIN, 0};
    ::poll(&p, 1, 100);
    for (auto& c : queue->drain()) answers.emplace(c.token, std::move(c));
  }
  ASSERT_EQ(answers.size(), expected.size());
  for (const auto& [token, sum] : expected) {
    const Completion& answer = answers.at(token);
    ASSERT_TRUE(answer.status.ok()) << answer.status.message;
    ASSERT_EQ(answer.outputs.size(), 1u) << "the state output reached the answer";
    EXPECT_EQ(ints(answer.outputs[0]), std::vector<int32_t>{sum}) << "request " << token;
  }
  EXPECT_LT(accumulating->batches.load(), kSequences * kSteps);  // sequences shared batches
  answers.clear();
  for (int i = 0; i < 100 && memory->used() != 0; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(memory->used(), 0u);
}

}  // namespace
}  // namespace inferd
