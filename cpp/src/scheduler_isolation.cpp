// Isolating the requests that fail a batch: re-running it in halves (see scheduler.h).

#include <algorithm>
#include <iterator>
#include <string>
#include <utility>
#include <vector>

#include "inferd/scheduler.h"
#include "inferd/structured_log.h"
#include "staged_batch.h"

namespace inferd {
namespace {

// The most extra executions that isolating the culprits of a failed batch of `n` requests may
// cost: enough for two culprits (2*ceil(log2 n) each), never more than the whole bisection tree.
size_t isolation_budget(size_t n) {
  size_t levels = 0;
  while ((size_t{1} << levels) < n) ++levels;
  return std::min(2 * n - 2, 4 * levels);
}

// How the server log names a request: its id, or its token when it has none.
std::string request_label(const InferenceRequest& request) {
  return request.id.empty() ? "#" + std::to_string(request.token) : request.id;
}

std::string request_labels(const RequestBatch& requests) {
  std::string out;
  for (const auto& request : requests) {
    if (!out.empty()) out += ",";
    out += request_label(*request);
  }
  return out;
}

}  // namespace

void Scheduler::isolate_failures(Executor* executor, uint32_t instance, RequestBatch requests, const Status& status) {
  const size_t batch_size = requests.size();
  const std::string labels = request_labels(requests);
  size_t budget = isolation_budget(batch_size);
  size_t executions = 0;
  std::string culprits;
  // Groups that failed as a whole, each with its own run's status; depth first.
  std::vector<std::pair<RequestBatch, Status>> failing;
  failing.emplace_back(std::move(requests), status);
  const Status unresolved = Status::Error(
      StatusCode::kInternal, "model '" + options_.model_name + "' failed a batch of " + std::to_string(batch_size) +
                                 " requests that this request was in, and the request that caused it was not found " +
                                 "within " + std::to_string(budget) + " re-runs; the server log has the reason");
  while (!failing.empty()) {
    auto [group, group_status] = std::move(failing.back());
    failing.pop_back();
    if (group.size() == 1) {  // it failed alone: its own run's message names no other request
      if (!culprits.empty()) culprits += ",";
      culprits += request_label(*group.front());
      fail(std::move(group.front()), group_status);
      continue;
    }
    if (budget < 2) {
      for (auto& request : group) fail(std::move(request), unresolved);
      continue;
    }
    budget -= 2;
    const auto middle = group.begin() + static_cast<std::ptrdiff_t>(group.size() / 2);
    RequestBatch halves[2];
    halves[0].assign(std::make_move_iterator(group.begin()), std::make_move_iterator(middle));
    halves[1].assign(std::make_move_iterator(middle), std::make_move_iterator(group.end()));
    // Pushed second half first, so that the first half is isolated first (depth first).
    std::pair<RequestBatch, Status> failed[2];
    for (int h = 0; h < 2; ++h) {
      StagedBatch staged = stage_batch(executor, &halves[h]);
      ++executions;
      Status half_status = run_batch(executor, instance, &staged);
      if (half_status.ok()) continue;
      if (!staged.executor_failed) {  // gathering failed (no memory): not the requests' doing
        for (auto& request : staged.requests) fail(std::move(request), half_status);
        continue;
      }
      failed[h] = {std::move(staged.requests), std::move(half_status)};
    }
    for (int h = 1; h >= 0; --h) {
      if (!failed[h].first.empty()) failing.push_back(std::move(failed[h]));
    }
  }
  if (core_logs(LogLevel::kWarning)) {
    LogRecord("batch failed; its requests were re-run to find the ones that cause it", LogLevel::kWarning)
        .add("model", options_.model_name)
        .add("reason", status.message)
        .add("requests", labels)
        .add("failed_alone", culprits)
        .add("extra_executions", std::to_string(executions))
        .write();
  }
}

}  // namespace inferd
