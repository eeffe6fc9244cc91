#include "native_executor.h"

#include <utility>
#include <vector>

#include "inferd/onnxruntime_executor.h"
#include "inferd/python_worker_executor.h"

namespace inferd::python {
namespace {

// The scheduler owns its executors, but a native one is shared with the Python object that made
// it, so the scheduler's instance holds a share and forwards every call.
class SharedExecutor : public Executor {
 public:
  explicit SharedExecutor(std::shared_ptr<Executor> target) : target_(std::move(target)) {}
  Status execute(const std::vector<Tensor>& inputs, std::vector<Tensor>* outputs) override {
    return target_->execute(inputs, outputs);
  }
  bool pipelined() const override { return target_->pipelined(); }
  Status stage(const std::vector<Tensor>& inputs) override { return target_->stage(inputs); }
  bool answers_each_request() const override { return target_->answers_each_request(); }
  bool decoupled() const override { return target_->decoupled(); }
  Status execute_requests(const std::vector<ExecutorRequest>& requests, std::vector<RequestResult>* results,
                          ResponseStream* responses) override {
    return target_->execute_requests(requests, results, responses);
  }

 private:
  const std::shared_ptr<Executor> target_;
};

}  // namespace

std::unique_ptr<Executor> native_executor(py::handle object) {
  if (py::isinstance<OnnxRuntimeExecutor>(object)) {
    return std::make_unique<SharedExecutor>(object.cast<std::shared_ptr<OnnxRuntimeExecutor>>());
  }
  if (py::isinstance<PythonWorkerExecutor>(object)) {
    return std::make_unique<SharedExecutor>(object.cast<std::shared_ptr<PythonWorkerExecutor>>());
  }
  return nullptr;
}

}  // namespace inferd::python
