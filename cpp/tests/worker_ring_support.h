#pragma once

// What the worker ring's tests share (worker_ring_test.cpp, model_calls_test.cpp): the worker's
// end of a channel, a pidfd that never becomes readable, a python model of one FP32 input "x"
// and one FP32 output "y", and a tensor's floats.

#include <sys/syscall.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "inferd/python_worker_executor.h"
#include "inferd/tensor.h"
#include "inferd/worker_ring.h"

namespace inferd::worker::ring_testing {

// The worker's end of `server`, as a worker process adopts it (its own copies of the descriptors).
inline WorkerRing worker_end(const WorkerRing& server) {
  const RingFds fds = server.fds();
  return WorkerRing::adopt(
      RingFds{::dup(fds.ring), ::dup(fds.inputs), ::dup(fds.outputs), ::dup(fds.to_worker), ::dup(fds.to_server)});
}

// This process's pidfd: the "worker" never exits while the test runs.
inline int self_pidfd() { return static_cast<int>(::syscall(SYS_pidfd_open, ::getpid(), 0)); }

// Python model `model` (FP32 "x" -> FP32 "y"), its batches looked at every 5 ms.
inline PythonWorkerOptions x_to_y_options(const std::string& model) {
  PythonWorkerOptions options;
  options.model_name = model;
  options.description = "python model '" + model + "' version 1 instance '" + model + "_0'";
  options.input_names = {"x"};
  options.input_types = {DataType::kFp32};
  options.output_names = {"y"};
  options.output_types = {DataType::kFp32};
  options.poll_interval = std::chrono::milliseconds(5);
  return options;
}

inline std::vector<float> floats(const Tensor& tensor) {
  std::vector<float> values(tensor.byte_size / sizeof(float));
  std::memcpy(values.data(), tensor.data, tensor.byte_size);
  return values;
}

}  // namespace inferd::worker::ring_testing
