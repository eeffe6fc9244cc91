#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "inferd/infer_request_parser.h"
#include "inferd/model_signature.h"
#include "inferd/request_scheduler.h"
#include "inferd/trace_sampling.h"
#include "inferd/version_routing.h"

namespace inferd {

// One model version as a request names it: its scheduler (a model's Scheduler, or an ensemble's
// EnsembleScheduler) and signature, and the answers to its
// ModelMetadata and ModelConfig calls, serialized by Python with the code that answers them when
// the transport asks Python instead.
//
// The route does not own the scheduler (the snapshot does): a call keeps its route until the
// core lets its request go, which happens on one of the scheduler's workers, and a scheduler
// whose last owner went there would join that worker from itself.
struct ModelRoute {
  std::string model;  // the version's own name and number, for failure counts
  std::string version;
  std::weak_ptr<RequestScheduler> scheduler;
  std::shared_ptr<const ModelSignature> signature;
  std::string metadata_response;  // serialized ModelMetadataResponse
  std::string config_response;    // serialized ModelConfigResponse
};

// What the transport answers without asking Python: a copy of the Python side's state, replaced
// whole on every change of it (load, unload, a version's state, start and stop, tracing and log
// settings). A call that misses it (a name not in `models`, a version written differently, a
// malformed request) is forwarded to Python, which answers with its own messages: the snapshot
// only ever answers what Python would have answered at the time it was published.
struct ServingSnapshot {
  bool live = true;
  bool ready = false;      // ServerReady
  bool accepting = false;  // ModelReady of a routed version; false before start and in shutdown
  // Every inference goes through Python: it traces by a rule the core cannot apply (a sampler
  // other than OpenTelemetry's built-in ones).
  bool forward_inference = false;
  // Otherwise the core runs every inference it has a route for, and reports to Python
  // (TransportContext::observations) each one this rule samples, which Python builds the span
  // of, and every one while `observe_inference` (verbose logs: a line per request).
  TraceSampling tracing;
  // The models whose trace settings override the global ones (Triton's per-model TraceSetting),
  // by the name a request gives: their inferences are sampled by their own rule instead.
  std::map<std::string, TraceSampling, std::less<>> model_tracing;
  bool observe_inference = false;
  // model name -> version as a request gives it ("" = the highest ready version) -> route.
  using Versions = std::map<std::string, std::shared_ptr<const ModelRoute>, std::less<>>;
  std::map<std::string, Versions, std::less<>> models;
  // Keeps every routed version's scheduler alive while the snapshot is current or a call that
  // read it is still submitting.
  std::vector<std::shared_ptr<RequestScheduler>> schedulers;

  // A model's ready weighted versions (config parameter inferd.version_weights): where its
  // inferences that name no version go. Only models with weights are here; one whose weighted
  // versions are all not ready has no "" route at all, so Python answers it as unavailable.
  struct WeightedVersions {
    WeightedChoice choice;
    std::vector<std::shared_ptr<const ModelRoute>> routes;  // one per weight, in the same order
  };
  std::map<std::string, WeightedVersions, std::less<>> weighted;

  // The rule that samples an inference naming `model`: its own, else `tracing`.
  const TraceSampling& tracing_for(std::string_view model) const;
  // The route for a request's model name and version, or null.
  std::shared_ptr<const ModelRoute> find(std::string_view name, std::string_view version) const;
  // The route an inference takes: as find(), except that one naming no version of a model with
  // weights takes a weighted choice - by its routing key (see routing_key()) when it has one, at
  // random otherwise.
  std::shared_ptr<const ModelRoute> find(std::string_view name, std::string_view version,
                                         std::optional<std::string_view> routing_key) const;
};

// Holds the current snapshot. Readers take a reference (a short lock, no copy); publish() swaps
// in a new one. A call that routes a request takes a Reading, counted until it is dropped (once
// the request is submitted): settle() waits until the readings of earlier snapshots are gone, so
// that a version a new snapshot no longer routes to is closed only once no call can still submit
// to it (a reload under traffic loses no request to "the model is shutting down").
// Thread-safe; lock rule: mutex_ guards every member.
class ServingState {
 public:
  // A call's read of the current snapshot, counted while it lives. Move-only.
  class Reading {
   public:
    Reading(const Reading&) = delete;
    Reading& operator=(const Reading&) = delete;
    Reading(Reading&& other) noexcept
        : state_(std::exchange(other.state_, nullptr)), snapshot_(std::move(other.snapshot_)), epoch_(other.epoch_) {}
    Reading& operator=(Reading&&) = delete;
    ~Reading() {
      if (state_ != nullptr) state_->done_reading(epoch_);
    }
    const std::shared_ptr<const ServingSnapshot>& snapshot() const { return snapshot_; }

   private:
    friend class ServingState;
    Reading(const ServingState* state, std::shared_ptr<const ServingSnapshot> snapshot, uint64_t epoch)
        : state_(state), snapshot_(std::move(snapshot)), epoch_(epoch) {}
    const ServingState* state_;
    std::shared_ptr<const ServingSnapshot> snapshot_;
    uint64_t epoch_;
  };

  ServingState() : current_(std::make_shared<const ServingSnapshot>()) {}
  std::shared_ptr<const ServingSnapshot> current() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return current_;
  }
  // The current snapshot for a call that routes and submits a request by it.
  Reading read() const {
    std::lock_guard<std::mutex> lock(mutex_);
    ++readings_[epoch_];
    return Reading(this, current_, epoch_);
  }
  void publish(std::shared_ptr<const ServingSnapshot> snapshot) {
    std::lock_guard<std::mutex> lock(mutex_);
    current_ = std::move(snapshot);
    ++epoch_;
  }
  // Blocks until every Reading taken before the last publish() is dropped, or `timeout` passes
  // (false then).
  bool settle(std::chrono::milliseconds timeout) const {
    std::unique_lock<std::mutex> lock(mutex_);
    const uint64_t published = epoch_;
    return settled_.wait_for(lock, timeout, [&] { return readings_.empty() || readings_.begin()->first >= published; });
  }

 private:
  void done_reading(uint64_t epoch) const {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const auto found = readings_.find(epoch);
      if (--found->second != 0) return;
      readings_.erase(found);
    }
    settled_.notify_all();
  }

  mutable std::mutex mutex_;
  mutable std::condition_variable settled_;
  std::shared_ptr<const ServingSnapshot> current_;  // never null
  uint64_t epoch_ = 0;                              // publishes so far
  mutable std::map<uint64_t, size_t> readings_;     // live Readings by the epoch they read
};

}  // namespace inferd
