#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "inferd/executor.h"
#include "inferd/status.h"
#include "inferd/tensor.h"

namespace inferd {

// `message` (an ONNX Runtime error) as a client may read it: without the source locations ORT
// writes into its messages, a "path/file.h:91" token and the C++ function that follows it
// ("/onnxruntime_src/.../reshape_helper.h:91 onnxruntime::ReshapeHelper::ReshapeHelper(...) "),
// which tell clients about the server's build, not about their request. Thread-safe.
std::string without_source_locations(std::string_view message);

struct OnnxRuntimeExecutorOptions {
  std::string model_path;
  std::vector<std::string> input_names;   // the config's input order: the order execute() takes
  std::vector<std::string> output_names;  // the config's output order: the order execute() fills
  std::vector<DataType> output_types;     // the config's output datatypes, in output order
  int intra_op_threads = 0;               // ORT's intra-op pool; 0 = one thread per core
  int inter_op_threads = 0;               // ORT's inter-op pool; 0 = its default
  // ORT's GraphOptimizationLevel: 0 none, 1 basic, 2 extended, 99 all (ORT's default).
  int graph_optimization_level = 99;
};

// Runs an ONNX model with ONNX Runtime's CPU provider through its C API, in the calling thread
// and ORT's own pools, with no Python involved: a worker thread computes batches without the GIL.
// Configured as the Python executor (python/inferd/executors/onnxruntime.py) configures its
// sessions: the thread counts of the options, and pool threads that do not spin between runs.
// GPU instances (CUDA/TensorRT providers on the instance's stream, IOBinding, staging) stay with
// the Python executor for now.
//
// Inputs are fed without a copy: ORT tensors are made over the Tensors' bytes (read-only to ORT),
// except BYTES, which become ORT string tensors (any bytes, no UTF-8 requirement). An absent
// input is not fed, so the model's initializer stands in. FP16, BF16 and BOOL pass as their ONNX
// types. Outputs are ORT's own tensors, kept alive by the output Tensors' owners (no copy);
// string outputs are serialized into inferd's BYTES form.
//
// Requires OnnxRuntimeLibrary to be loaded. Thread-safety: execute() keeps no state between
// calls, and an ORT session runs concurrent calls, so it is thread-safe (the scheduler still
// gives each executor one worker). Destroying the executor must wait for running calls.
class OnnxRuntimeExecutor : public Executor {
 public:
  // Loads the model and checks the options against it: every input and output name exists, and
  // each output's element type is the declared datatype. On success `*out` owns the executor; on
  // failure it is left unchanged and the status says why (UNAVAILABLE: ONNX Runtime is not
  // loaded; INVALID_ARGUMENT: the model cannot be loaded or does not match the options). Blocks
  // while ORT reads and optimizes the model; thread-safe.
  static Status Create(OnnxRuntimeExecutorOptions options, std::unique_ptr<OnnxRuntimeExecutor>* out);

  // See Executor::execute. Errors: INVALID_ARGUMENT when an input is not of the model's type or
  // ORT refuses an input; INTERNAL for an output that is not of the declared type and for any
  // other ORT failure. ORT's messages reach the caller without source locations (the full text
  // is in ORT's own error record). Never throws.
  Status execute(const std::vector<Tensor>& inputs, std::vector<Tensor>* outputs) override;

  // The model's datatype of each configured input, in input order. Thread-safe.
  const std::vector<DataType>& input_types() const;

  // ORT's objects, kept out of this header so that its users need not see ORT's headers.
  struct Session;
  // Made by Create only (the key is private).
  class Key {
    friend class OnnxRuntimeExecutor;
    Key() = default;
  };
  OnnxRuntimeExecutor(Key, std::unique_ptr<Session> session);
  ~OnnxRuntimeExecutor() override;
  OnnxRuntimeExecutor(const OnnxRuntimeExecutor&) = delete;
  OnnxRuntimeExecutor& operator=(const OnnxRuntimeExecutor&) = delete;

 private:
  Status run(const std::vector<Tensor>& inputs, std::vector<Tensor>* outputs);

  const std::unique_ptr<Session> session_;
};

}  // namespace inferd
