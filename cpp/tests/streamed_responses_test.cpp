#include "inferd/streamed_responses.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "inferd/worker_messages.h"
#include "worker_ring_support.h"

namespace inferd {
namespace {

using worker::Message;
using worker::MessageKind;
using worker::WorkerRing;
using worker::ring_testing::floats;
using worker::ring_testing::worker_end;

// A batch's LaterResponses as the core's would take them: every call recorded.
class RecordedResponses : public LaterResponses {
 public:
  bool respond(size_t index, RequestResult&& response) override {
    std::lock_guard<std::mutex> lock(mutex);
    responses.emplace_back(index, std::move(response));
    return true;
  }
  bool finish(size_t index, RequestResult&& result) override {
    std::lock_guard<std::mutex> lock(mutex);
    finals.emplace_back(index, std::move(result));
    return true;
  }
  std::mutex mutex;
  std::vector<std::pair<size_t, RequestResult>> responses;
  std::vector<std::pair<size_t, RequestResult>> finals;
};

// What reached `deliver`: (batch, index, final, the answer's floats of "y" or its error).
struct Delivered {
  uint64_t batch;
  size_t index;
  bool final;
  bool responds;
  std::string error;
  std::vector<float> y;
};

DeclaredOutputs x_to_y() { return DeclaredOutputs{"m", {"y"}, {DataType::kFp32}}; }

// The worker's side, as WorkerLoop::respond writes a response: "y" = `values` (none: the final
// flag alone; `error`: an error response) at `position` of the outputs arena, then its slot.
class StreamingWorker {
 public:
  explicit StreamingWorker(const WorkerRing& server) : ring_(worker_end(server)) {}

  uint64_t send(uint64_t batch, uint32_t index, bool final, std::optional<std::vector<float>> values,
                const std::string& error = "", uint64_t position = 0) {
    Message message;
    message.kind = static_cast<uint32_t>(MessageKind::kResponse);
    message.batch = batch;
    message.count = index;
    message.floor = final ? 1 : 0;
    if (values || !error.empty()) {
      worker::ResponseDescription response;
      const size_t bytes = values ? values->size() * sizeof(float) : 0;
      if (!error.empty()) {
        response.ok = false;
        response.error = error;
      } else {
        response.outputs.push_back(
            worker::TensorPlace{"y", DataType::kFp32, {static_cast<int64_t>(values->size())}, position, bytes});
      }
      const std::string description = worker::encode_responses({response});
      const uint64_t at = worker::aligned(position + bytes);
      ring_.outputs().reserve(at + description.size());
      if (bytes != 0) std::memcpy(ring_.outputs().data() + position, values->data(), bytes);
      std::memcpy(ring_.outputs().data() + at, description.data(), description.size());
      message.offset = at;
      message.length = description.size();
    }
    EXPECT_TRUE(ring_.send(message));
    return message.offset + message.length;
  }

  WorkerRing& ring() { return ring_; }

 private:
  WorkerRing ring_;
};

class StreamedResponsesTest : public ::testing::Test {
 protected:
  StreamedResponsesTest()
      : server_(std::make_shared<WorkerRing>(WorkerRing::create("streamed-test"))),
        worker_(*server_),
        streamed_(server_, x_to_y(), [this](uint64_t batch, size_t index, bool final, const WorkerAnswer* answer) {
          Delivered delivered{batch, index, final, answer != nullptr, "", {}};
          if (answer != nullptr && !answer->status.ok()) delivered.error = answer->status.message;
          if (answer != nullptr && answer->status.ok() && !answer->outputs.empty()) {
            delivered.y = floats(answer->outputs[0].second);
          }
          std::lock_guard<std::mutex> lock(mutex_);
          delivered_.push_back(std::move(delivered));
        }) {}

  std::vector<Delivered> delivered() {
    std::lock_guard<std::mutex> lock(mutex_);
    return delivered_;
  }

  std::shared_ptr<WorkerRing> server_;
  StreamingWorker worker_;
  std::mutex mutex_;
  std::vector<Delivered> delivered_;
  StreamedResponses streamed_;  // last: its reader delivers into the members above
};

TEST_F(StreamedResponsesTest, ResponsesThatAreNotFinalGoToTheBatchsLaterResponsesAndTheFinalToDeliver) {
  auto later = std::make_shared<RecordedResponses>();
  streamed_.open(7, later, {{}, {"y"}});
  uint64_t position = 0;
  for (int k = 0; k < 3; ++k) position = worker_.send(7, 1, false, std::vector<float>{float(k)}, "", position);
  worker_.send(7, 1, true, std::nullopt);
  streamed_.sync();

  ASSERT_EQ(later->responses.size(), 3u);
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(later->responses[k].first, 1u);
    ASSERT_TRUE(later->responses[k].second.status.ok()) << later->responses[k].second.status.message;
    EXPECT_EQ(floats(later->responses[k].second.outputs.at(0)), std::vector<float>{float(k)});
  }
  EXPECT_TRUE(later->finals.empty());  // the Python side decides the end of a request
  const std::vector<Delivered> seen = delivered();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0].batch, 7u);
  EXPECT_EQ(seen[0].index, 1u);
  EXPECT_TRUE(seen[0].final);
  EXPECT_FALSE(seen[0].responds);  // the final flag alone
  // Every response was copied out: the worker may write the arena from its start again.
  EXPECT_EQ(worker_.ring().streamed_taken(), 4u);
}

TEST_F(StreamedResponsesTest, AnAnswerIsACopyTheWorkerCannotChangeOnceItWasTaken) {
  auto later = std::make_shared<RecordedResponses>();
  streamed_.open(1, later, {{}});
  worker_.send(1, 0, false, std::vector<float>{1.5f, 2.5f});
  streamed_.sync();
  const float overwrite[2] = {9.0f, 9.0f};
  std::memcpy(worker_.ring().outputs().data(), overwrite, sizeof overwrite);  // the next response, from 0
  ASSERT_EQ(later->responses.size(), 1u);
  EXPECT_EQ(floats(later->responses[0].second.outputs.at(0)), (std::vector<float>{1.5f, 2.5f}));
}

TEST_F(StreamedResponsesTest, WhatNoCoreObjectTakesGoesToDeliverInTheOrderSent) {
  // A batch opened without a LaterResponses (answered through Python), and one never opened.
  streamed_.open(2, nullptr, {{}});
  uint64_t position = worker_.send(2, 0, false, std::vector<float>{1});
  position = worker_.send(2, 0, false, std::nullopt, "the model's error", position);
  position = worker_.send(3, 0, false, std::vector<float>{3}, "", position);
  worker_.send(2, 0, true, std::vector<float>{2}, "", position);
  streamed_.sync();
  const std::vector<Delivered> seen = delivered();
  ASSERT_EQ(seen.size(), 4u);
  EXPECT_EQ(seen[0].y, std::vector<float>{1});
  EXPECT_EQ(seen[1].error, "the model's error");
  EXPECT_EQ(seen[2].batch, 3u);
  EXPECT_EQ(seen[3].y, std::vector<float>{2});
  EXPECT_TRUE(seen[3].final);
}

TEST_F(StreamedResponsesTest, AForgottenBatchsResponsesGoToDeliver) {
  auto later = std::make_shared<RecordedResponses>();
  streamed_.open(4, later, {{}});
  streamed_.forget(4);
  worker_.send(4, 0, false, std::vector<float>{1});
  streamed_.sync();
  EXPECT_TRUE(later->responses.empty());
  EXPECT_EQ(delivered().size(), 1u);
}

TEST_F(StreamedResponsesTest, AnErrorOrMalformedResponseFailsAloneAndTheRequestGoesOn) {
  auto later = std::make_shared<RecordedResponses>();
  streamed_.open(5, later, {{}});
  // An error response and a malformed description: each an error response, the request goes on.
  uint64_t position = worker_.send(5, 0, false, std::nullopt, "bad step");
  Message wild;
  wild.kind = static_cast<uint32_t>(MessageKind::kResponse);
  wild.batch = 5;
  wild.offset = position;
  wild.length = 3;  // no description is three bytes long
  ASSERT_TRUE(worker_.ring().send(wild));
  Message outside = wild;
  outside.offset = uint64_t{1} << 40;  // beyond the arena
  ASSERT_TRUE(worker_.ring().send(outside));
  worker_.send(5, 0, false, std::vector<float>{4}, "", position);
  streamed_.sync();
  ASSERT_EQ(later->responses.size(), 4u);
  EXPECT_EQ(later->responses[0].second.status.message, "bad step");
  EXPECT_EQ(later->responses[0].second.status.code, StatusCode::kInternal);
  EXPECT_NE(later->responses[1].second.status.message.find("malformed response"), std::string::npos);
  EXPECT_NE(later->responses[2].second.status.message.find("outside the worker's arena"), std::string::npos);
  EXPECT_TRUE(later->responses[3].second.status.ok());
}

TEST_F(StreamedResponsesTest, StopDeliversWhatWasSentThenReadsNoMore) {
  auto later = std::make_shared<RecordedResponses>();
  streamed_.open(6, later, {{}});
  uint64_t position = 0;
  for (int k = 0; k < 10; ++k) position = worker_.send(6, 0, false, std::vector<float>{float(k)}, "", position);
  worker_.send(6, 0, true, std::nullopt);
  streamed_.stop();
  EXPECT_EQ(later->responses.size(), 10u);
  EXPECT_EQ(delivered().size(), 1u);
  worker_.send(6, 0, false, std::vector<float>{1});
  streamed_.sync();  // returns at once: nobody reads
  streamed_.stop();  // again: nothing happens
  EXPECT_EQ(later->responses.size(), 10u);
}

}  // namespace
}  // namespace inferd
