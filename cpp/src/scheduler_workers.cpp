// The Scheduler's threads: each instance's worker loop (and a pipelined instance's stager), what a
// worker does with one batch, and the expiry watch.

#include <pthread.h>

#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "inferd/scheduler.h"
#include "staged_batch.h"

namespace inferd {

bool Scheduler::take_batch(uint32_t instance, std::vector<std::unique_ptr<InferenceRequest>>* batch) {
  batch->clear();
  std::vector<Rejection> rejected;
  // next_batch returns false only once the batcher is closed and empty: nothing accepted is left.
  while (batcher_->next_batch(instance, batch, &rejected)) {
    for (auto& [request, status] : rejected) fail(std::move(request), status);
    rejected.clear();
    if (!batch->empty()) return true;
  }
  return false;
}

void Scheduler::run_expiry_watch() {
  pthread_setname_np(pthread_self(), "inferd-expiry");
  std::vector<Rejection> rejected;
  while (batcher_->next_expired(&rejected)) {
    for (auto& [request, status] : rejected) fail(std::move(request), status);
    rejected.clear();
  }
}

void Scheduler::run_instance(Executor* executor, uint32_t instance) {
  pthread_setname_np(pthread_self(), "inferd-worker");  // benchmarks group per-thread CPU by name
  std::vector<std::unique_ptr<InferenceRequest>> batch;
  while (take_batch(instance, &batch)) {
    StagedBatch staged = stage_batch(executor, &batch);
    execute_batch(executor, instance, &staged, nullptr);
  }
}

void Scheduler::run_pipelined_instance(Executor* executor, uint32_t instance) {
  pthread_setname_np(pthread_self(), "inferd-worker");
  StagedBatchSlot slot;
  // The stager takes and stages batch N+1 while this thread computes batch N. It ends once the
  // batcher is closed and empty, so this thread, which drains the slot, answers everything.
  std::thread stager([&] {
    pthread_setname_np(pthread_self(), "inferd-stager");
    std::vector<std::unique_ptr<InferenceRequest>> batch;
    while (take_batch(instance, &batch)) {
      slot.begin_staging();
      slot.put(stage_batch(executor, &batch));
    }
    slot.finish();
  });
  StagedBatch staged;
  while (slot.take(&staged)) execute_batch(executor, instance, &staged, &slot);
  stager.join();
}
void Scheduler::execute_batch(Executor* executor, uint32_t instance, StagedBatch* staged, StagedBatchSlot* slot) {
  const Status status = run_batch(executor, instance, staged);
  if (status.ok()) return;
  if (!staged->executor_failed || staged->requests.size() < 2) {
    for (auto& request : staged->requests) fail(std::move(request), status);
    staged->requests.clear();
    return;
  }
  if (slot == nullptr) {
    isolate_failures(executor, instance, std::move(staged->requests), status);
    staged->requests.clear();
    return;
  }
  // Batches already staged on a pipelined executor execute first, in staging order; isolation
  // then stages and executes one group at a time while the stager waits.
  std::vector<std::pair<RequestBatch, Status>> failed;
  failed.emplace_back(std::move(staged->requests), status);
  staged->requests.clear();
  for (StagedBatch& next : slot->pause()) {
    const Status next_status = run_batch(executor, instance, &next);
    if (next_status.ok()) continue;
    if (next.executor_failed && next.requests.size() > 1) {
      failed.emplace_back(std::move(next.requests), next_status);
    } else {
      for (auto& request : next.requests) fail(std::move(request), next_status);
    }
  }
  for (auto& [requests, batch_status] : failed) isolate_failures(executor, instance, std::move(requests), batch_status);
  slot->resume();
}

}  // namespace inferd
