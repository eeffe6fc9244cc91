#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "inferd/ensemble_scheduler.h"
#include "inferd/scheduler.h"

namespace inferd {

// The model versions that serve now, by name and version number: where an ensemble's steps find
// their composing models' Schedulers (its SchedulerResolver). Python publishes it whole on every
// change of what serves, so a reloaded model's next step goes to its new version.
//
// Holds schedulers weakly: their owner (the model version on the Python side) shuts a retired one
// down and keeps it until its workers have exited, so a reference taken here and released later
// on any thread never joins a worker, let alone from that worker itself.
//
// Invariants: readers see one published map or the next, never a mix; find() never blocks beyond
// a short lock. Thread-safe.
class SchedulerDirectory {
 public:
  using Versions = std::map<int64_t, std::weak_ptr<Scheduler>>;
  using Models = std::map<std::string, Versions, std::less<>>;

  void publish(Models models);

  // The scheduler of `model`'s `version` (-1: its highest published version that is still alive),
  // with the version's number; a null scheduler when there is none.
  ResolvedScheduler find(std::string_view model, int64_t version) const;

  // find() as an ensemble's SchedulerResolver; the directory lives as long as the resolver.
  static SchedulerResolver resolver(std::shared_ptr<const SchedulerDirectory> directory);

 private:
  mutable std::mutex mutex_;
  std::shared_ptr<const Models> models_ = std::make_shared<const Models>();  // guarded by mutex_; never null
};

}  // namespace inferd
