// The routes and the tracing rule of the serving snapshot (serving_snapshot.h).

#include "inferd/serving_snapshot.h"

#include <memory>
#include <optional>
#include <string_view>

namespace inferd {

const TraceSampling& ServingSnapshot::tracing_for(std::string_view model) const {
  const auto found = model_tracing.find(model);
  return found == model_tracing.end() ? tracing : found->second;
}

std::shared_ptr<const ModelRoute> ServingSnapshot::find(std::string_view name, std::string_view version) const {
  const auto model = models.find(name);
  if (model == models.end()) return nullptr;
  const auto route = model->second.find(version);
  return route == model->second.end() ? nullptr : route->second;
}

std::shared_ptr<const ModelRoute> ServingSnapshot::find(std::string_view name, std::string_view version,
                                                        std::optional<std::string_view> routing_key) const {
  if (!version.empty()) return find(name, version);
  const auto model = weighted.find(name);
  if (model == weighted.end()) return find(name, version);
  const WeightedChoice& choice = model->second.choice;
  return model->second.routes[routing_key ? choice.pick(*routing_key) : choice.pick_random()];
}

}  // namespace inferd
