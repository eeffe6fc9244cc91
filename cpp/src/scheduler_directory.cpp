#include "inferd/scheduler_directory.h"

#include <utility>

namespace inferd {

void SchedulerDirectory::publish(Models models) {
  auto published = std::make_shared<const Models>(std::move(models));
  std::lock_guard<std::mutex> lock(mutex_);
  models_ = std::move(published);
}

ResolvedScheduler SchedulerDirectory::find(std::string_view model, int64_t version) const {
  std::shared_ptr<const Models> models;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    models = models_;
  }
  auto it = models->find(model);
  if (it == models->end()) return {};
  const Versions& versions = it->second;
  if (version >= 0) {
    auto found = versions.find(version);
    if (found == versions.end()) return {};
    return {found->second.lock(), version};
  }
  for (auto v = versions.rbegin(); v != versions.rend(); ++v) {
    if (std::shared_ptr<Scheduler> scheduler = v->second.lock()) return {std::move(scheduler), v->first};
  }
  return {};
}

SchedulerResolver SchedulerDirectory::resolver(std::shared_ptr<const SchedulerDirectory> directory) {
  return [directory = std::move(directory)](const std::string& model, int64_t version) {
    return directory->find(model, version);
  };
}

}  // namespace inferd
