#include "inferd/dynamic_batcher.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <unordered_set>

namespace inferd {

std::vector<int64_t> shape_key(const InferenceRequest& request, const Padding& padding) {
  std::vector<int64_t> key;
  for (size_t i = 0; i < request.inputs.size(); ++i) {
    const Tensor& input = request.inputs[i];
    if (input.absent) {
      key.push_back(-1);  // batches only with requests that left it out too
      continue;
    }
    key.push_back(static_cast<int64_t>(input.shape.size()));  // keeps inputs' dims apart
    if (padding.pads_input(i)) continue;                      // any lengths batch together: padded at assembly
    for (size_t d = 1; d < input.shape.size(); ++d) key.push_back(input.shape[d]);
  }
  return key;
}

void BusyArrivalRate::advance(Clock::time_point now, bool busy) {
  if (now <= last_) return;
  const double dt_s = std::chrono::duration<double>(now - last_).count();
  const double memory_s = std::chrono::duration<double>(kMemory).count();
  const double kept = std::exp(-dt_s / memory_s);
  arrivals_ *= kept;
  // Busy throughout [last_, now]: add that span, each instant decayed by its own age.
  busy_s_ = busy_s_ * kept + (busy ? -memory_s * std::expm1(-dt_s / memory_s) : 0.0);
  last_ = now;
}

double BusyArrivalRate::per_second(double prior_s) const {
  const double busy_s = busy_s_ + prior_s;
  return busy_s > 0.0 ? arrivals_ / busy_s : 0.0;
}

DynamicBatcher::DynamicBatcher(BatcherOptions options)
    : options_(std::move(options)), levels_(std::max<uint32_t>(1, options_.priority_levels)) {
  for (uint32_t i = 0; i < levels_.size(); ++i) {
    auto it = options_.level_queue_policies.find(i + 1);
    levels_[i].policy = it != options_.level_queue_policies.end() ? it->second : options_.default_queue_policy;
  }
}

Status DynamicBatcher::enqueue(std::unique_ptr<InferenceRequest>&& request) {
  uint32_t level = request->priority;
  if (options_.priority_levels == 0) {
    level = 1;  // no priority levels configured: one queue, the parameter is ignored
  } else if (level == 0) {
    level = std::max<uint32_t>(1, options_.default_priority_level);
  } else if (level > options_.priority_levels) {
    return Status::Error(StatusCode::kInvalidArgument, "priority " + std::to_string(level) + " is outside 1.." +
                                                           std::to_string(options_.priority_levels));
  }
  std::vector<int64_t> key = options_.dynamic ? shape_key(*request, options_.padding) : std::vector<int64_t>{};
  const auto now = Clock::now();
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (closed_) return Status::Error(StatusCode::kUnavailable, "the model is shutting down");
    Level& target = levels_[level - 1];
    const QueuePolicy& policy = target.policy;
    if (policy.max_queue_size != 0 && target.waiting.size() + target.delayed.size() >= policy.max_queue_size) {
      return Status::Error(StatusCode::kResourceExhausted,
                           "the queue of priority level " + std::to_string(level) + " is full (max_queue_size " +
                               std::to_string(policy.max_queue_size) + "); retry later");
    }
    uint64_t timeout = policy.default_timeout_us;
    if (policy.allow_timeout_override && request->timeout_us != 0 && (timeout == 0 || request->timeout_us < timeout)) {
      timeout = request->timeout_us;  // an override may only shorten the timeout
    }
    request->enqueue_time = now;
    // A timeout past what the clock can hold (a client may send up to 2^64 - 1 µs) is no timeout.
    const auto headroom = std::chrono::duration_cast<std::chrono::microseconds>(Clock::time_point::max() - now);
    request->timeout_at = timeout != 0 && timeout < static_cast<uint64_t>(headroom.count())
                              ? now + std::chrono::microseconds(timeout)
                              : Clock::time_point::max();
    request->shape_key = std::move(key);
    request->sequence = next_sequence_++;
    advance_estimate(now);
    if (busy()) rate_.count_arrival();  // it found company waiting or computing
    const Clock::time_point expiry = std::min(request->deadline, request->timeout_at);
    target.waiting.push_back(std::move(request));
    ++size_;
    if (expiry < expiry_watch_until_) {
      // The expiry watcher sleeps past this one: wake it to sleep less (only then, so requests
      // without a deadline or timeout never wake it).
      expiry_watch_until_ = expiry;
      expiry_changed_.notify_one();
    }
  }
  changed_.notify_all();
  return Status::Ok();
}

std::optional<uint64_t> DynamicBatcher::admit_answered() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (closed_) return std::nullopt;
  return next_sequence_++;
}

template <typename Fn>
void DynamicBatcher::for_each_queue(Fn&& fn) {
  for (Level& level : levels_) {
    fn(level, level.waiting, false);
    fn(level, level.delayed, true);
  }
}

void DynamicBatcher::expire(Clock::time_point now, std::vector<Rejection>* rejected) {
  for_each_queue([&](Level& level, Queue& queue, bool is_delayed) {
    for (auto it = queue.begin(); it != queue.end();) {
      InferenceRequest& r = **it;
      if (r.deadline <= now) {
        rejected->emplace_back(std::move(*it),
                               Status::Error(StatusCode::kDeadlineExceeded, "the deadline passed while queued"));
      } else if (!is_delayed && r.timeout_at <= now) {
        if (level.policy.delay_on_timeout) {
          r.timeout_at = Clock::time_point::max();
          level.delayed.push_back(std::move(*it));
          it = queue.erase(it);
          continue;
        }
        rejected->emplace_back(std::move(*it),
                               Status::Error(StatusCode::kUnavailable, "request timeout expired in the queue"));
      } else {
        ++it;
        continue;
      }
      it = queue.erase(it);
      --size_;
    }
  });
}

Clock::time_point DynamicBatcher::earliest_expiry() const {
  Clock::time_point earliest = Clock::time_point::max();
  for (const Level& level : levels_) {
    for (const auto& r : level.waiting) earliest = std::min({earliest, r->deadline, r->timeout_at});
    for (const auto& r : level.delayed) earliest = std::min(earliest, r->deadline);
  }
  return earliest;
}

Clock::time_point DynamicBatcher::take_batch(Clock::time_point now,
                                             std::vector<std::unique_ptr<InferenceRequest>>* batch) {
  const bool batching = options_.dynamic && options_.max_batch_size > 0;
  const InferenceRequest* head = nullptr;
  std::vector<const InferenceRequest*> chosen;
  int64_t rows = 0;
  size_t preferred_count = 0;
  bool full = false;
  Clock::time_point oldest = Clock::time_point::max();
  for_each_queue([&](Level&, Queue& queue, bool) {
    for (const auto& r : queue) {
      if (full || (head != nullptr && !batching)) return;
      if (head == nullptr) head = r.get();
      if (r->shape_key != head->shape_key) continue;  // another shape: keeps its place
      if (batching && rows + r->batch_size > options_.max_batch_size && !chosen.empty()) {
        full = true;
        return;
      }
      chosen.push_back(r.get());
      rows += r->batch_size;
      oldest = std::min(oldest, r->enqueue_time);
      const auto& preferred = options_.preferred_batch_sizes;
      if (std::find(preferred.begin(), preferred.end(), rows) != preferred.end()) preferred_count = chosen.size();
      if (rows >= options_.max_batch_size) full = true;
    }
  });
  if (chosen.empty()) return Clock::time_point::max();

  size_t send = 0;
  const auto due = oldest + std::chrono::microseconds(options_.max_queue_delay_us);
  const bool may_wait = batching && !full && !closed_ && options_.max_queue_delay_us != 0 && now < due;
  const auto stop_waiting = may_wait ? stop_waiting_at(now, due) : now;
  if (now >= stop_waiting) {
    send = chosen.size();  // full, flushing, or no more company expected before `due`
  } else if (preferred_count > 0) {
    send = preferred_count;
  }
  if (send == 0) return stop_waiting;

  const std::unordered_set<const InferenceRequest*> taking(chosen.begin(), chosen.begin() + send);
  for_each_queue([&](Level&, Queue& queue, bool) {
    for (auto it = queue.begin(); it != queue.end();) {
      if (taking.count(it->get()) != 0) {
        batch->push_back(std::move(*it));
        it = queue.erase(it);
      } else {
        ++it;
      }
    }
  });
  size_ -= send;
  return now;
}

Clock::time_point DynamicBatcher::stop_waiting_at(Clock::time_point now, Clock::time_point due) const {
  const double delay_s = static_cast<double>(options_.max_queue_delay_us) * 1e-6;
  const double rate = rate_.per_second(kPriorDelays * delay_s);
  const double left_s = std::chrono::duration<double>(due - now).count();
  if (rate * left_s < 1.0) return now;  // not one more request expected in time: go now
  // Worth waiting while at least one more is expected before `due`, i.e. until 1/rate is left.
  // 1/rate <= left_s <= the delay here, so the conversion cannot overflow.
  return due - std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(1.0 / rate));
}

bool DynamicBatcher::next_batch(std::vector<std::unique_ptr<InferenceRequest>>* batch,
                                std::vector<Rejection>* rejected) {
  std::unique_lock<std::mutex> lock(mutex_);
  // The caller is back, so the batch it took last has finished. A first call, or one after a
  // rejections-only return, has none: the count stays at 0 rather than wrap (at worst it
  // undercounts briefly, which only makes the estimate lean to not waiting).
  advance_estimate(Clock::now());
  if (batches_out_ > 0) --batches_out_;
  for (;;) {
    const auto now = Clock::now();
    advance_estimate(now);
    expire(now, rejected);
    if (!rejected->empty()) return true;  // answer those before anything waits
    if (size_ == 0) {
      if (closed_) return false;
      changed_.wait(lock);
      continue;
    }
    const auto again = take_batch(now, batch);
    if (!batch->empty()) {
      ++batches_out_;
      return true;
    }
    changed_.wait_until(lock, std::min(again, earliest_expiry()));
  }
}

bool DynamicBatcher::next_expired(std::vector<Rejection>* rejected) {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    if (closed_) return false;  // what is left leaves through next_batch or take_all
    const auto now = Clock::now();
    advance_estimate(now);
    expire(now, rejected);
    if (!rejected->empty()) {
      expiry_watch_until_ = Clock::time_point::max();  // set again on the next call
      return true;
    }
    expiry_watch_until_ = earliest_expiry();
    if (expiry_watch_until_ == Clock::time_point::max()) {
      expiry_changed_.wait(lock);
    } else {
      expiry_changed_.wait_until(lock, expiry_watch_until_);
    }
  }
}

std::unique_ptr<InferenceRequest> DynamicBatcher::cancel(uint64_t token) {
  std::unique_ptr<InferenceRequest> found;
  std::lock_guard<std::mutex> lock(mutex_);
  advance_estimate(Clock::now());
  for_each_queue([&](Level&, Queue& queue, bool) {
    if (found) return;
    for (auto it = queue.begin(); it != queue.end(); ++it) {
      if ((*it)->token == token) {
        found = std::move(*it);
        queue.erase(it);
        --size_;
        return;
      }
    }
  });
  return found;
}

void DynamicBatcher::close() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    closed_ = true;
  }
  changed_.notify_all();
  expiry_changed_.notify_all();
}

std::vector<std::unique_ptr<InferenceRequest>> DynamicBatcher::take_all() {
  std::vector<std::unique_ptr<InferenceRequest>> all;
  std::lock_guard<std::mutex> lock(mutex_);
  advance_estimate(Clock::now());
  for_each_queue([&](Level&, Queue& queue, bool) {
    for (auto& r : queue) all.push_back(std::move(r));
    queue.clear();
  });
  size_ = 0;
  return all;
}

size_t DynamicBatcher::size() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return size_;
}

double DynamicBatcher::busy_arrival_rate() const {
  std::lock_guard<std::mutex> lock(mutex_);
  BusyArrivalRate now = rate_;  // a copy brought to now: reading does not move the estimate
  now.advance(Clock::now(), busy());
  return now.per_second(kPriorDelays * static_cast<double>(options_.max_queue_delay_us) * 1e-6);
}

}  // namespace inferd
