#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "inferd/model_signature.h"
#include "inferd/request_scheduler.h"
#include "inferd/response_cache.h"
#include "inferd/scheduler.h"
#include "native_executor.h"
#include "python_executor.h"
#include "python_tensor.h"
#include "wire_request.h"

namespace py = pybind11;

namespace inferd::python {
namespace {

// Python may drop the last reference with the GIL held while workers wait for it to run an
// executor: destroy with the GIL released so their join cannot deadlock. The gRPC transport's
// routes share the scheduler too, and may drop the last reference on one of its threads, which
// does not hold the GIL.
struct DestroyWithoutGil {
  void operator()(Scheduler* scheduler) const {
    if (PyGILState_Check()) {
      py::gil_scoped_release release;
      std::default_delete<Scheduler>()(scheduler);
    } else {
      std::default_delete<Scheduler>()(scheduler);
    }
  }
};

std::shared_ptr<Scheduler> make_scheduler(const std::string& model_name, const BatcherOptions& batching,
                                          const py::list& executors, const std::vector<int>& output_types,
                                          std::shared_ptr<CompletionQueue> completions,
                                          std::shared_ptr<PinnedBufferPool> pool, const SequenceOptions* sequence,
                                          std::shared_ptr<ResponseCache> response_cache) {
  std::vector<DataType> types;
  for (int code : output_types) {
    if (!is_valid_datatype(code)) throw std::invalid_argument("unknown datatype code " + std::to_string(code));
    types.push_back(static_cast<DataType>(code));
  }
  std::vector<std::unique_ptr<Executor>> instances;
  for (py::handle executor : executors) {
    std::unique_ptr<Executor> native = native_executor(executor);  // runs batches without the GIL
    instances.push_back(native ? std::move(native) : std::make_unique<PythonExecutor>(executor, types));
  }
  SchedulerOptions options{model_name, batching};
  options.response_cache = std::move(response_cache);
  if (sequence != nullptr) {
    options.sequence_batching = true;
    options.sequence = *sequence;
  }
  return std::shared_ptr<Scheduler>(
      std::make_unique<Scheduler>(std::move(options), std::move(instances), std::move(completions), std::move(pool))
          .release(),
      DestroyWithoutGil{});
}

// The caller's deadline `us` from now; none for 0 or for one past what the clock can hold.
Clock::time_point deadline_from_now(uint64_t us) {
  const auto now = Clock::now();
  const auto headroom = std::chrono::duration_cast<std::chrono::microseconds>(Clock::time_point::max() - now);
  if (us == 0 || us >= static_cast<uint64_t>(headroom.count())) return Clock::time_point::max();
  return now + std::chrono::microseconds(us);
}

// The statistics as read-only values: what Scheduler.statistics returns, and what tests build.
void register_statistics(py::module_& m) {
  py::class_<Duration>(m, "Duration", "A count of events and their summed duration in ns.")
      .def(py::init([](uint64_t count, uint64_t ns) { return Duration{count, ns}; }), py::arg("count") = 0,
           py::arg("ns") = 0)
      .def_readonly("count", &Duration::count)
      .def_readonly("ns", &Duration::ns)
      .def("__repr__", [](const Duration& d) {
        return "Duration(count=" + std::to_string(d.count) + ", ns=" + std::to_string(d.ns) + ")";
      });
  py::class_<BatchDurations>(m, "BatchDurations", "Durations of the batch executions of one batch size.")
      .def(py::init([](const Duration& compute_input, const Duration& compute_infer, const Duration& compute_output) {
             return BatchDurations{compute_input, compute_infer, compute_output};
           }),
           py::arg("compute_input") = Duration{}, py::arg("compute_infer") = Duration{},
           py::arg("compute_output") = Duration{})
      .def_readonly("compute_input", &BatchDurations::compute_input)
      .def_readonly("compute_infer", &BatchDurations::compute_infer)
      .def_readonly("compute_output", &BatchDurations::compute_output);
  py::class_<LatencyHistogram>(m, "LatencyHistogram",
                               "counts[i] counts values at most bounds_us[i] (and above the bound before it); the "
                               "last count is above every bound. sum_ns: the values' sum.")
      .def(py::init([](const std::optional<std::vector<uint64_t>>& counts, uint64_t sum_ns) {
             LatencyHistogram h;
             if (counts) {
               if (counts->size() != h.counts.size())
                 throw std::invalid_argument("a LatencyHistogram has " + std::to_string(h.counts.size()) +
                                             " counts, not " + std::to_string(counts->size()));
               std::copy(counts->begin(), counts->end(), h.counts.begin());
             }
             h.sum_ns = sum_ns;
             return h;
           }),
           py::arg("counts") = py::none(), py::arg("sum_ns") = 0)
      .def_property_readonly(
          "bounds_us",
          [](const LatencyHistogram&) {
            return std::vector<uint64_t>(LatencyHistogram::kBoundsUs.begin(), LatencyHistogram::kBoundsUs.end());
          },
          "The buckets' upper bounds in µs.")
      .def_readonly("counts", &LatencyHistogram::counts)
      .def_readonly("sum_ns", &LatencyHistogram::sum_ns);
  py::class_<StatisticsSnapshot>(m, "StatisticsSnapshot",
                                 "One model version's cumulative statistics: Triton's InferStatistics, the "
                                 "durations per batch size (rows) and the latency histograms.")
      .def(py::init([](uint64_t last_inference_ms, uint64_t inference_count, uint64_t execution_count,
                       const Duration& success, const Duration& fail, const Duration& queue,
                       const Duration& compute_input, const Duration& compute_infer, const Duration& compute_output,
                       std::map<uint64_t, BatchDurations> batches, const LatencyHistogram& request_duration,
                       const LatencyHistogram& queue_duration, uint64_t responses,
                       const LatencyHistogram& first_response, const Duration& cache_hit, const Duration& cache_miss) {
             return StatisticsSnapshot{last_inference_ms,
                                       inference_count,
                                       execution_count,
                                       success,
                                       fail,
                                       queue,
                                       compute_input,
                                       compute_infer,
                                       compute_output,
                                       std::move(batches),
                                       request_duration,
                                       queue_duration,
                                       responses,
                                       first_response,
                                       cache_hit,
                                       cache_miss};
           }),
           py::kw_only(), py::arg("last_inference_ms") = 0, py::arg("inference_count") = 0,
           py::arg("execution_count") = 0, py::arg("success") = Duration{}, py::arg("fail") = Duration{},
           py::arg("queue") = Duration{}, py::arg("compute_input") = Duration{}, py::arg("compute_infer") = Duration{},
           py::arg("compute_output") = Duration{}, py::arg("batches") = std::map<uint64_t, BatchDurations>{},
           py::arg("request_duration") = LatencyHistogram{}, py::arg("queue_duration") = LatencyHistogram{},
           py::arg("responses") = 0, py::arg("first_response") = LatencyHistogram{}, py::arg("cache_hit") = Duration{},
           py::arg("cache_miss") = Duration{})
      .def_readonly("last_inference_ms", &StatisticsSnapshot::last_inference_ms,
                    "Wall clock, ms since the epoch; 0 = never.")
      .def_readonly("inference_count", &StatisticsSnapshot::inference_count)
      .def_readonly("execution_count", &StatisticsSnapshot::execution_count)
      .def_readonly("success", &StatisticsSnapshot::success)
      .def_readonly("fail", &StatisticsSnapshot::fail)
      .def_readonly("queue", &StatisticsSnapshot::queue)
      .def_readonly("compute_input", &StatisticsSnapshot::compute_input)
      .def_readonly("compute_infer", &StatisticsSnapshot::compute_infer)
      .def_readonly("compute_output", &StatisticsSnapshot::compute_output)
      .def_readonly("batches", &StatisticsSnapshot::batches, "Keyed by batch size (rows); a copy at each read.")
      .def_readonly("request_duration", &StatisticsSnapshot::request_duration)
      .def_readonly("queue_duration", &StatisticsSnapshot::queue_duration)
      .def_readonly("responses", &StatisticsSnapshot::responses,
                    "Responses a decoupled model sent (0 for other models): streamed ones and final ones that carry "
                    "a response.")
      .def_readonly("first_response", &StatisticsSnapshot::first_response,
                    "Per request of a decoupled model (empty for other models), the time from its queueing to its "
                    "first response (or to its final flag, when that came first).")
      .def_readonly("cache_hit", &StatisticsSnapshot::cache_hit,
                    "Requests answered from the response cache, and the time to answer them.")
      .def_readonly("cache_miss", &StatisticsSnapshot::cache_miss,
                    "Response cache misses, and the time their lookups and their answers' inserts took.");
  py::class_<ResponseCacheStats>(m, "ResponseCacheStats", "The response cache's own figures.")
      .def_readonly("bytes", &ResponseCacheStats::bytes, "Charged to the entries held.")
      .def_readonly("limit_bytes", &ResponseCacheStats::limit_bytes)
      .def_readonly("entries", &ResponseCacheStats::entries)
      .def_readonly("evictions", &ResponseCacheStats::evictions, "Entries dropped to make room.")
      .def_readonly("rejected", &ResponseCacheStats::rejected, "Answers too large to hold at all.");
  py::class_<ResponseCache, std::shared_ptr<ResponseCache>>(
      m, "ResponseCache", "The server's response cache (--cache-config local,size=BYTES), shared by its models.")
      .def(py::init<uint64_t>(), py::arg("limit_bytes"))
      .def("stats", &ResponseCache::stats);
}

}  // namespace

void register_decoupled_responses(py::module_& m) {
  py::class_<DecoupledResponses, std::shared_ptr<DecoupledResponses>>(
      m, "DecoupledResponses",
      "A decoupled batch's answers, from any thread, during execute_requests and after it returned "
      "(see python_executor.h): respond(index, answer) (also the object's call) sends one more "
      "response; finish(index, answer) the final one (None: the final flag alone) of a request "
      "execute_requests returned PENDING for. Each returns whether the request was still open.")
      .def("respond", &DecoupledResponses::respond, py::arg("index"), py::arg("answer"))
      .def("__call__", &DecoupledResponses::respond, py::arg("index"), py::arg("answer"))
      .def("finish", &DecoupledResponses::finish, py::arg("index"), py::arg("answer"));
  m.attr("PENDING") = pending_marker();
  m.attr("RESCHEDULED") = rescheduled_marker();
}

void register_scheduler(py::module_& m) {
  register_statistics(m);
  register_decoupled_responses(m);
  py::class_<RequestScheduler, std::shared_ptr<RequestScheduler>>(
      m, "RequestScheduler",
      "What a checked request is handed to: a model version's Scheduler or an EnsembleScheduler.")
      .def(
          "submit_request",
          [](RequestScheduler& scheduler, uint64_t token, const std::shared_ptr<ModelSignature>& signature,
             const WireRequest& wire, uint64_t deadline_us, bool stream,
             const std::shared_ptr<SharedMemoryRegistry>& shared_memory) {
            auto request = std::make_unique<InferenceRequest>();
            request->token = token;
            request->stream = stream;
            request->deadline = deadline_from_now(deadline_us);
            // A large request may decode typed contents or walk many BYTES elements: other Python
            // threads run meanwhile. Safe: the build reads C++ views of bytes that `wire` keeps
            // alive, and copies of `owner` drop no Python reference (wire holds one). A small one
            // keeps the GIL: a thread switch would cost more than the build.
            // Shared memory too: a BYTES input there is copied out, and a slice's object is fstat'ed.
            std::optional<py::gil_scoped_release> release;
            if (wire.size >= (1u << 20) || shared_memory != nullptr) release.emplace();
            Status status =
                build_inference_request(signature, wire.parsed, wire.owner, request.get(), shared_memory.get());
            release.reset();
            // As in Scheduler.submit: the GIL stays held for the bounded push (an ensemble submits its
            // first steps to their schedulers the same way).
            if (status.ok()) status = scheduler.submit(std::move(request));
            return py::make_tuple(static_cast<int>(status.code), status.message);
          },
          py::arg("token"), py::arg("signature"), py::arg("request"), py::arg("deadline_us") = 0,
          py::arg("stream") = false, py::arg("shared_memory") = nullptr,
          "Check a parsed request against the model's signature and queue it; shared_memory: the registry its "
          "tensors may name regions of (None: refused). Returns (status code, message); "
          "the answer, a serialized ModelInferResponse (ModelStreamInferResponse with stream), arrives on the "
          "completion queue.")
      .def("cancel", &RequestScheduler::cancel, py::arg("token"), py::call_guard<py::gil_scoped_release>(),
           "Answer a request that has not started computing CANCELLED; False if it is already running or done.");
  py::class_<Scheduler, RequestScheduler, std::shared_ptr<Scheduler>>(m, "Scheduler")
      .def(py::init(&make_scheduler), py::arg("model_name"), py::arg("batching"), py::arg("executors"),
           py::arg("output_datatypes"), py::arg("completions"), py::arg("pool"), py::arg("sequence") = nullptr,
           py::arg("response_cache") = nullptr,
           "One worker thread per executor object; each must have execute(list[ndarray]) -> list[ndarray]. "
           "sequence: a stateful model's SequenceOptions (its requests then queue by sequence). response_cache: "
           "the server's ResponseCache, when the model's answers are cached.")
      .def(
          "sequence_counts",
          [](const Scheduler& scheduler) {
            const SequenceCounts counts = scheduler.sequence_counts();
            return py::make_tuple(counts.active, counts.backlog, counts.idle_ended);
          },
          "A stateful model's sequences: (active, in the backlog, ended for being idle so far); zeros otherwise.")
      .def(
          "submit",
          [](Scheduler& scheduler, uint64_t token, int64_t batch_size, const py::list& inputs, uint32_t priority,
             uint64_t timeout_us, uint64_t deadline_us) {
            auto request = std::make_unique<InferenceRequest>();
            request->token = token;
            request->batch_size = batch_size;
            request->priority = priority;
            request->timeout_us = timeout_us;
            request->deadline = deadline_from_now(deadline_us);
            for (py::handle item : inputs) {
              auto entry = item.cast<py::tuple>();
              if (entry[2].is_none()) {  // an optional input the request left out
                const int code = entry[0].cast<int>();
                if (!is_valid_datatype(code))
                  throw std::invalid_argument("unknown datatype code " + std::to_string(code));
                request->inputs.push_back(Tensor::Absent(static_cast<DataType>(code)));
                continue;
              }
              request->inputs.push_back(tensor_from_buffer(entry[0].cast<int>(), entry[1], entry[2]));
            }
            // The GIL stays held: submit only takes the batcher's lock for a bounded push, and no
            // thread takes the GIL while holding that lock (workers call executors outside it).
            // Releasing it would hand the GIL to a waiting worker: a thread switch per request.
            Status status = scheduler.submit(std::move(request));
            // On failure the request is still ours and is released here, with the GIL held.
            return py::make_tuple(static_cast<int>(status.code), status.message);
          },
          py::arg("token"), py::arg("batch_size"), py::arg("inputs"), py::arg("priority") = 0,
          py::arg("timeout_us") = 0, py::arg("deadline_us") = 0,
          "Queue a request: inputs are (datatype, shape, C-contiguous buffer or None for an optional "
          "input left out) in model input order; "
          "priority 0 = default level; timeout_us = queue timeout override; deadline_us = the caller's "
          "deadline from now (0 = none). Returns (status code, message); the answer arrives on the "
          "completion queue.")
      .def(
          "shutdown",
          [](Scheduler& scheduler, bool reject_queued) {
            scheduler.shutdown(reject_queued ? Scheduler::ShutdownMode::kReject : Scheduler::ShutdownMode::kDrain);
          },
          py::arg("reject_queued"), py::call_guard<py::gil_scoped_release>(),
          "Close intake, compute (or reject) what is queued, join the workers. Blocks; GIL released.")
      .def("pending_requests", &Scheduler::pending_requests)
      .def_property_readonly(
          "batcher_options", [](const Scheduler& s) { return s.batcher_options(); },
          "A copy of the options the scheduler was built with.")
      .def("statistics", &Scheduler::statistics, "A snapshot of the cumulative statistics.");
}

}  // namespace inferd::python
