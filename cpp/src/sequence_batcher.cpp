#include "inferd/sequence_batcher.h"

#include <algorithm>
#include <cstring>
#include <utility>

#include "inferd/dynamic_batcher.h"

namespace inferd {
namespace {

bool numeric(DataType dtype) { return dtype != DataType::kBytes; }

// The bytes of `control`'s one element for `flags`.
std::string control_bytes(const SequenceControl& control, const SequenceFlags& flags) {
  auto raw = [](const auto& value) { return std::string(reinterpret_cast<const char*>(&value), sizeof value); };
  if (control.kind == SequenceControl::Kind::kCorrelationId) {
    switch (control.dtype) {
      case DataType::kUint64:
        return raw(flags.id);
      case DataType::kInt64:
        return raw(static_cast<int64_t>(flags.id));
      case DataType::kUint32:
        return raw(static_cast<uint32_t>(flags.id));
      case DataType::kInt32:
        return raw(static_cast<int32_t>(flags.id));
      default: {  // BYTES: one element, its 4-byte length first
        const std::string text = flags.string_id.empty() ? std::to_string(flags.id) : flags.string_id;
        return raw(static_cast<uint32_t>(text.size())) + text;
      }
    }
  }
  const bool on = control.kind == SequenceControl::Kind::kStart ? flags.start
                  : control.kind == SequenceControl::Kind::kEnd ? flags.end
                                                                : flags.ready;  // kReady
  switch (control.dtype) {
    case DataType::kFp32:
      return raw(static_cast<float>(on ? control.true_value : control.false_value));
    case DataType::kBool:
      return raw(static_cast<uint8_t>(on ? 1 : 0));
    default:
      return raw(static_cast<int32_t>(on ? control.true_value : control.false_value));
  }
}

// Writes the control tensors of `request` (one element each, in one buffer it owns).
void write_controls(const std::vector<SequenceControl>& controls, bool batched, InferenceRequest* request) {
  if (controls.empty()) return;
  std::vector<std::string> values;
  size_t total = 0;
  for (const SequenceControl& control : controls) {
    values.push_back(control_bytes(control, request->sequence_flags));
    total += values.back().size();
  }
  auto buffer = std::make_shared<std::vector<std::byte>>(total);
  size_t at = 0;
  for (size_t k = 0; k < controls.size(); ++k) {
    std::memcpy(buffer->data() + at, values[k].data(), values[k].size());
    Tensor tensor;
    tensor.dtype = controls[k].dtype;
    tensor.shape = batched ? std::vector<int64_t>{1, 1} : std::vector<int64_t>{1};
    tensor.data = buffer->data() + at;
    tensor.byte_size = values[k].size();
    tensor.owner = buffer;
    if (request->inputs.size() <= controls[k].input) request->inputs.resize(controls[k].input + 1);
    request->inputs[controls[k].input] = std::move(tensor);
    at += values[k].size();
  }
}

}  // namespace

struct SequenceBatcher::Sequence {
  SequenceFlags id;  // id or string_id only
  std::deque<std::unique_ptr<InferenceRequest>> waiting;
  bool running = false;        // a request of it is out
  uint64_t running_order = 0;  // that request's enqueue order (InferenceRequest::sequence)
  bool closed = false;         // its last request had END: what follows needs START
  bool active = false;         // holds a place
  bool telling = false;        // idle: the request telling the model is queued or running
  size_t instance = 0;         // direct: the instance whose slot it holds
  Clock::time_point last_active{};
  CarriedState state;  // implicit state, while no request of it runs (that request carries it)
};

SequenceBatcher::SequenceBatcher(SequenceOptions options)
    : options_(std::move(options)),
      slots_per_instance_(static_cast<size_t>(std::max<int64_t>(options_.max_batch_size, 1))),
      occupied_(std::max<uint32_t>(options_.instances, 1), 0) {}

SequenceBatcher::~SequenceBatcher() = default;

size_t SequenceBatcher::places() const {
  if (options_.strategy == SequenceOptions::Strategy::kOldest)
    return std::max<uint32_t>(options_.max_candidate_sequences, 1);
  return occupied_.size() * slots_per_instance_;
}

Status SequenceBatcher::enqueue(std::unique_ptr<InferenceRequest>&& request) {
  if (options_.iterative != nullptr) {
    // Each request is a sequence of its own, whatever sequence parameters a client sends
    // (perf_analyzer sends them to every model with sequence_batching).
    request->sequence_flags = SequenceFlags{};
    request->sequence_flags.start = true;
    request->sequence_flags.end = options_.iterative->last_step(*request);
    std::lock_guard<std::mutex> lock(mutex_);
    request->sequence_flags.id = next_iterative_id_++;
  }
  const SequenceFlags flags = request->sequence_flags;
  if (!flags.any()) {
    return Status::Error(StatusCode::kInvalidArgument,
                         "inference request must specify a non-zero or non-empty correlation ID (sequence_id)");
  }
  if (request->batch_size > 1) {
    return Status::Error(StatusCode::kInvalidArgument,
                         "inference request must specify batch-size 1 due to requirements of sequence batcher");
  }
  for (const SequenceControl& control : options_.controls) {
    if (control.kind == SequenceControl::Kind::kCorrelationId && numeric(control.dtype) && !flags.string_id.empty()) {
      return Status::Error(StatusCode::kInvalidArgument,
                           "the model's CORRID control takes a numeric sequence_id, got the string " + flags.shown());
    }
  }
  const Key key{flags.id, flags.string_id};
  request->shape_key = shape_key(*request, Padding{});
  if (flags.start && options_.states != nullptr && options_.states->any()) {
    Status state = options_.states->initial(flags, &request->state);  // before the lock: it allocates
    if (!state.ok()) return state;
  }
  const Clock::time_point now = Clock::now();
  std::lock_guard<std::mutex> lock(mutex_);
  if (closed_) return Status::Error(StatusCode::kUnavailable, "the model is shutting down");
  auto found = sequences_.find(key);
  if ((found == sequences_.end() || found->second->closed) && !flags.start) {
    return Status::Error(StatusCode::kInvalidArgument, "inference request for sequence " + flags.shown() +
                                                           " must specify the START flag on the first request of "
                                                           "the sequence");
  }
  if (found == sequences_.end()) {
    auto sequence = std::make_unique<Sequence>();
    sequence->id.id = flags.id;
    sequence->id.string_id = flags.string_id;
    found = sequences_.emplace(key, std::move(sequence)).first;
    if (!place(*found->second)) backlog_.push_back(key);
  }
  Sequence& sequence = *found->second;
  sequence.closed = flags.end;
  sequence.last_active = now;
  request->enqueue_time = now;
  request->sequence = next_order_++;
  if (request->deadline < expiry_watch_until_) {
    expiry_watch_until_ = request->deadline;
    expiry_changed_.notify_one();
  }
  sequence.waiting.push_back(std::move(request));
  ++size_;
  changed_.notify_all();
  return Status::Ok();
}

bool SequenceBatcher::place(Sequence& sequence) {
  if (active_ >= places()) return false;
  if (options_.strategy == SequenceOptions::Strategy::kDirect) {
    const auto freest = std::min_element(occupied_.begin(), occupied_.end());
    if (*freest >= slots_per_instance_) return false;
    sequence.instance = static_cast<size_t>(freest - occupied_.begin());
    ++*freest;
  }
  sequence.active = true;
  ++active_;
  return true;
}

void SequenceBatcher::end(const Key& key) {
  const auto found = sequences_.find(key);
  if (found == sequences_.end()) return;
  if (found->second->active) {
    --active_;
    if (options_.strategy == SequenceOptions::Strategy::kDirect) --occupied_[found->second->instance];
  } else {
    backlog_.erase(std::remove(backlog_.begin(), backlog_.end(), key), backlog_.end());
  }
  sequences_.erase(found);
  while (!backlog_.empty()) {
    const auto next = sequences_.find(backlog_.front());
    if (next != sequences_.end() && !place(*next->second)) break;
    backlog_.pop_front();
  }
  changed_.notify_all();
}

bool SequenceBatcher::next_batch(uint32_t instance, std::vector<std::unique_ptr<InferenceRequest>>* batch,
                                 std::vector<Rejection>* rejected) {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    const Clock::time_point now = Clock::now();
    expire(now, rejected);
    if (!rejected->empty()) return true;
    const Clock::time_point wake = take_batch(instance, now, batch);
    if (!batch->empty()) {
      if (closed_ && size_ == 0) changed_.notify_all();  // the other instances' last look
      return true;
    }
    if (closed_ && size_ == 0) return false;
    if (wake == Clock::time_point::max()) {
      changed_.wait(lock);
    } else {
      changed_.wait_until(lock, wake);
    }
  }
}

Clock::time_point SequenceBatcher::take_batch(uint32_t instance, Clock::time_point now,
                                              std::vector<std::unique_ptr<InferenceRequest>>* batch) {
  const bool oldest = options_.strategy == SequenceOptions::Strategy::kOldest;
  std::vector<Sequence*> ready;
  for (auto& [key, sequence] : sequences_) {
    if (sequence->active && !sequence->running && !sequence->waiting.empty() &&
        (oldest || sequence->instance == instance)) {
      ready.push_back(sequence.get());
    }
  }
  if (ready.empty()) return Clock::time_point::max();
  std::sort(ready.begin(), ready.end(), [](const Sequence* a, const Sequence* b) {
    return a->waiting.front()->sequence < b->waiting.front()->sequence;
  });
  const std::vector<int64_t> shape = batch_key(*ready.front());
  ready.erase(std::remove_if(ready.begin() + 1, ready.end(), [&](const Sequence* s) { return batch_key(*s) != shape; }),
              ready.end());
  const size_t most = static_cast<size_t>(std::max<int64_t>(options_.max_batch_size, 1));
  const size_t count = std::min(ready.size(), most);
  const Clock::time_point waited_enough = ready.front()->waiting.front()->enqueue_time + options_.max_queue_delay;
  bool due = count >= most || now >= waited_enough;
  if (!oldest) {
    due = due || static_cast<double>(count) >= options_.minimum_slot_utilization * static_cast<double>(most);
  } else {
    const auto& preferred = options_.preferred_batch_sizes;
    due = due || std::find(preferred.begin(), preferred.end(), static_cast<int64_t>(count)) != preferred.end();
  }
  if (!due) return waited_enough;
  for (size_t i = 0; i < count; ++i) hand_out(*ready[i], batch);
  return Clock::time_point::max();
}

std::vector<int64_t> SequenceBatcher::batch_key(const Sequence& sequence) const {
  const InferenceRequest& next = *sequence.waiting.front();
  if (options_.states == nullptr || !options_.states->any()) return next.shape_key;
  std::vector<int64_t> key = next.shape_key;
  options_.states->add_shapes(next.sequence_flags.start ? next.state : sequence.state, &key);
  return key;
}

void SequenceBatcher::hand_out(Sequence& sequence, std::vector<std::unique_ptr<InferenceRequest>>* batch) {
  std::unique_ptr<InferenceRequest> request = std::move(sequence.waiting.front());
  sequence.waiting.pop_front();
  --size_;
  sequence.running = true;
  sequence.running_order = request->sequence;
  write_controls(options_.controls, options_.max_batch_size > 0, request.get());
  if (options_.states != nullptr && options_.states->any()) {
    // A START request brought its initial state; any other carries its sequence's.
    if (!request->sequence_flags.start) request->state = std::move(sequence.state);
    options_.states->feed(request->state, request.get());
  }
  batch->push_back(std::move(request));
}

void SequenceBatcher::finished(InferenceRequest& request) {
  if (!request.sequence_flags.any()) return;
  const Key key{request.sequence_flags.id, request.sequence_flags.string_id};
  std::lock_guard<std::mutex> lock(mutex_);
  const auto found = sequences_.find(key);
  if (found == sequences_.end()) return;
  Sequence& sequence = *found->second;
  // An iterative request is its whole sequence, however it ended (run, or left waiting: cancelled,
  // past its deadline).
  if (options_.iterative != nullptr) return end(key);
  if (!sequence.running || sequence.running_order != request.sequence) return;  // not handed out: it left waiting
  sequence.running = false;
  sequence.state = std::move(request.state);
  sequence.last_active = Clock::now();
  if (!request.sequence_flags.ready) sequence.telling = false;  // the model was told
  if (!sequence.waiting.empty()) {
    changed_.notify_all();
    return;
  }
  if (request.sequence_flags.end) return end(key);
  watch_idle(sequence);
}

bool SequenceBatcher::reschedule(std::unique_ptr<InferenceRequest>& request) {
  const Key key{request->sequence_flags.id, request->sequence_flags.string_id};
  request->sequence_flags.start = false;
  request->sequence_flags.end = options_.iterative != nullptr && options_.iterative->last_step(*request);
  request->shape_key = shape_key(*request, Padding{});  // what was fed back may have another shape
  std::lock_guard<std::mutex> lock(mutex_);
  const auto found = sequences_.find(key);
  if (emptied_ || found == sequences_.end()) return false;
  Sequence& sequence = *found->second;
  sequence.running = false;
  sequence.state = std::move(request->state);
  sequence.last_active = Clock::now();
  if (request->deadline < expiry_watch_until_) {
    expiry_watch_until_ = request->deadline;
    expiry_changed_.notify_one();
  }
  sequence.waiting.push_front(std::move(request));
  ++size_;
  changed_.notify_all();
  return true;
}

void SequenceBatcher::watch_idle(const Sequence& sequence) {
  if (sequence.running || !sequence.waiting.empty()) return;
  const Clock::time_point reap_at = sequence.last_active + options_.max_sequence_idle;
  if (reap_at < expiry_watch_until_) {
    expiry_watch_until_ = reap_at;
    expiry_changed_.notify_one();
  }
}

Clock::time_point SequenceBatcher::expire(Clock::time_point now, std::vector<Rejection>* rejected) {
  Clock::time_point next = Clock::time_point::max();
  for (auto& [key, sequence] : sequences_) {
    auto& waiting = sequence->waiting;
    for (auto it = waiting.begin(); it != waiting.end();) {
      if ((*it)->deadline <= now) {
        rejected->emplace_back(std::move(*it),
                               Status::Error(StatusCode::kDeadlineExceeded, "the deadline passed while queued"));
        it = waiting.erase(it);
        --size_;
        watch_idle(*sequence);
      } else {
        next = std::min(next, (*it)->deadline);
        ++it;
      }
    }
  }
  return next;
}

Clock::time_point SequenceBatcher::reap(Clock::time_point now, std::vector<SequenceFlags>* ended) {
  Clock::time_point next = Clock::time_point::max();
  std::vector<Key> idle;
  for (auto& [key, sequence] : sequences_) {
    if (sequence->running || !sequence->waiting.empty() || sequence->telling) continue;
    const Clock::time_point at = sequence->last_active + options_.max_sequence_idle;
    if (at <= now) {
      idle.push_back(key);
      ended->push_back(sequence->id);
    } else {
      next = std::min(next, at);
    }
  }
  for (const Key& key : idle) {
    if (options_.tell_idle_end) {
      tell_idle_end(*sequences_.at(key), now);
    } else {
      end(key);
    }
  }
  idle_ended_ += idle.size();
  return next;
}

namespace {

// Where the answer of a request the core made itself goes: nowhere.
class DroppedAnswer final : public CompletionSink {
 public:
  void complete(Completion&&) override {}
};

}  // namespace

void SequenceBatcher::tell_idle_end(Sequence& sequence, Clock::time_point now) {
  auto request = std::make_unique<InferenceRequest>();
  for (DataType dtype : options_.input_types) request->inputs.push_back(Tensor::Absent(dtype));
  request->sequence_flags = sequence.id;
  request->sequence_flags.end = true;
  request->sequence_flags.ready = false;
  request->checked = true;
  request->sink = std::make_shared<DroppedAnswer>();
  request->shape_key = shape_key(*request, Padding{});
  request->enqueue_time = now;
  request->sequence = next_order_++;
  sequence.waiting.push_back(std::move(request));
  sequence.telling = true;
  sequence.closed = true;  // what follows starts anew
  ++size_;
  changed_.notify_all();
}

bool SequenceBatcher::next_expired(std::vector<Rejection>* rejected) {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!closed_) {
    const Clock::time_point now = Clock::now();
    std::vector<SequenceFlags> ended;
    const Clock::time_point next = std::min(expire(now, rejected), reap(now, &ended));
    if (!rejected->empty() || !ended.empty()) {
      lock.unlock();
      report(std::move(ended));
      return true;
    }
    expiry_watch_until_ = next;
    if (next == Clock::time_point::max()) {
      expiry_changed_.wait(lock);
    } else {
      expiry_changed_.wait_until(lock, next);
    }
  }
  return false;
}

void SequenceBatcher::report(std::vector<SequenceFlags>&& ended) {
  if (!options_.idle_ended) return;
  for (const SequenceFlags& sequence : ended) options_.idle_ended(sequence);
}

std::unique_ptr<InferenceRequest> SequenceBatcher::cancel(uint64_t token) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto& [key, sequence] : sequences_) {
    auto& waiting = sequence->waiting;
    const auto found = std::find_if(waiting.begin(), waiting.end(),
                                    [token](const std::unique_ptr<InferenceRequest>& r) { return r->token == token; });
    if (found == waiting.end()) continue;
    std::unique_ptr<InferenceRequest> request = std::move(*found);
    waiting.erase(found);
    --size_;
    watch_idle(*sequence);
    changed_.notify_all();
    return request;
  }
  return nullptr;
}

void SequenceBatcher::close() {
  std::lock_guard<std::mutex> lock(mutex_);
  closed_ = true;
  changed_.notify_all();
  expiry_changed_.notify_all();
}

std::vector<std::unique_ptr<InferenceRequest>> SequenceBatcher::take_all() {
  std::vector<std::unique_ptr<InferenceRequest>> all;
  std::lock_guard<std::mutex> lock(mutex_);
  emptied_ = true;
  for (auto& [key, sequence] : sequences_) {
    for (auto& request : sequence->waiting) all.push_back(std::move(request));
    sequence->waiting.clear();
  }
  size_ = 0;
  changed_.notify_all();
  return all;
}

size_t SequenceBatcher::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return size_;
}

size_t SequenceBatcher::active_sequences() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return active_;
}

size_t SequenceBatcher::backlog_sequences() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return backlog_.size();
}

uint64_t SequenceBatcher::idle_ended() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return idle_ended_;
}

}  // namespace inferd
