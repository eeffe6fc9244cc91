#include "inferd/streamed_responses.h"

#include <algorithm>
#include <cstring>
#include <exception>
#include <utility>

#include "inferd/worker_messages.h"

namespace inferd {

using worker::Message;
using worker::MessageKind;

StreamedResponses::StreamedResponses(std::shared_ptr<worker::WorkerRing> ring, DeclaredOutputs declared,
                                     StreamedDelivery deliver)
    : ring_(std::move(ring)), declared_(std::move(declared)), deliver_(std::move(deliver)) {
  reader_ = std::thread([this] { read(); });
}

StreamedResponses::~StreamedResponses() { stop(); }

void StreamedResponses::open(uint64_t batch, std::shared_ptr<LaterResponses> later,
                             std::vector<std::vector<std::string>> requested) {
  auto opened = std::make_shared<OpenBatch>();
  opened->later = std::move(later);
  opened->requested = std::move(requested);
  for (const auto& names : opened->requested) opened->views.emplace_back(names.begin(), names.end());
  std::lock_guard<std::mutex> lock(mutex_);
  batches_[batch] = std::move(opened);
}

void StreamedResponses::forget(uint64_t batch) {
  std::shared_ptr<const OpenBatch> gone;  // let go of after the lock
  std::lock_guard<std::mutex> lock(mutex_);
  const auto found = batches_.find(batch);
  if (found == batches_.end()) return;
  gone = std::move(found->second);
  batches_.erase(found);
}

void StreamedResponses::sync() {
  const uint32_t sent = ring_->inbound_sent();
  std::unique_lock<std::mutex> lock(mutex_);
  taken_changed_.wait(lock, [&] { return stopped_ || static_cast<int32_t>(taken_ - sent) >= 0; });
}

void StreamedResponses::stop() {
  if (!stopping_.exchange(true)) ring_->wake();
  if (reader_.joinable()) {
    // From the reader itself (a delivery that stopped it): it ends once that delivery returns.
    if (reader_.get_id() == std::this_thread::get_id()) {
      reader_.detach();
    } else {
      reader_.join();
    }
  }
  std::map<uint64_t, std::shared_ptr<const OpenBatch>> gone;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopped_ = true;
    gone.swap(batches_);
  }
  taken_changed_.notify_all();
}

void StreamedResponses::read() {
  Message message;
  while (true) {
    try {
      while (ring_->receive(&message)) {
        take(message);
        {
          std::lock_guard<std::mutex> lock(mutex_);
          ++taken_;
        }
        taken_changed_.notify_all();
      }
      if (stopping_.load()) break;
      ring_->wait(-1);  // a message, or stop()'s wake()
    } catch (const std::exception&) {
      break;  // the ring's counters are corrupt (a wild worker): nothing more is read from it
    }
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopped_ = true;
  }
  taken_changed_.notify_all();
}

bool StreamedResponses::copy_out(const Message& message, WorkerAnswer* answer) {
  if (message.length == 0) return false;
  worker::SharedRegion& outputs = ring_->outputs();
  std::vector<worker::ResponseDescription> responses;
  std::string description;
  Status status;
  if (message.offset > UINT64_MAX - message.length || !outputs.cover(message.offset + message.length)) {
    status = Status::Error(StatusCode::kInternal, "the response lies outside the worker's arena");
  } else {
    // A copy: the worker cannot change the description while it is read.
    description.assign(reinterpret_cast<const char*>(outputs.data() + message.offset), message.length);
    status = worker::decode_responses(description, outputs.size(), &responses);
    if (status.ok() && responses.size() != 1) {
      status = Status::Error(StatusCode::kInternal,
                             "a streamed response describes " + std::to_string(responses.size()) + " responses");
    }
  }
  if (!status.ok()) {
    answer->status =
        Status::Error(StatusCode::kInternal, "python model '" + declared_.model_name +
                                                 "': malformed response from its worker: " + status.message);
    return true;
  }
  uint64_t low = UINT64_MAX;
  uint64_t high = 0;
  for (const worker::TensorPlace& place : responses[0].outputs) {
    low = std::min<uint64_t>(low, place.offset);
    high = std::max<uint64_t>(high, place.offset + place.nbytes);
  }
  if (high == 0) low = 0;
  // The tensors copied out together (decode_responses checked them inside the arena).
  auto bytes = std::make_shared<std::vector<std::byte>>(outputs.data() + low, outputs.data() + high);
  *answer = answer_of(responses[0], bytes->data(), low, bytes, declared_.model_name);
  return true;
}

void StreamedResponses::take(const Message& message) {
  if (message.kind != static_cast<uint32_t>(MessageKind::kResponse)) return;  // nothing else comes this way
  WorkerAnswer answer;
  const bool responds = copy_out(message, &answer);
  ring_->set_streamed_taken(++streamed_);  // the arena's bytes are free for the worker
  const bool final = message.floor != 0;
  const size_t index = message.count;
  std::shared_ptr<const OpenBatch> batch;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto found = batches_.find(message.batch);
    if (found != batches_.end()) batch = found->second;
  }
  if (!final && responds && batch != nullptr && batch->later != nullptr && index < batch->views.size()) {
    batch->later->respond(index, in_model_order(std::move(answer), batch->views[index], declared_));
    return;
  }
  deliver_(message.batch, index, final, responds ? &answer : nullptr);
}

}  // namespace inferd
