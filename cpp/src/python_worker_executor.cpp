#include "inferd/python_worker_executor.h"

#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <exception>
#include <string_view>
#include <system_error>
#include <utility>

#include "inferd/datatype_names.h"
#include "inferd/shared_memory.h"

namespace inferd {

using worker::Message;
using worker::MessageKind;
using worker::ResponseDescription;
using worker::TensorPlace;

// An attached worker: its channel and its pidfd, released together.
struct PythonWorkerExecutor::Link {
  std::shared_ptr<worker::WorkerRing> ring;
  int pidfd = -1;

  Link(std::shared_ptr<worker::WorkerRing> r, int fd) : ring(std::move(r)), pidfd(fd) {}
  ~Link() {
    if (pidfd >= 0) ::close(pidfd);
  }
  Link(const Link&) = delete;
  Link& operator=(const Link&) = delete;
};

// A batch's answers in the outputs arena, held by every tensor that views them: the worker writes
// the next batches above `end` until the last holder lets go.
struct PythonWorkerExecutor::OutputLease {
  std::shared_ptr<worker::Mapping> mapping;
  uint64_t end = 0;
};

namespace {

bool holds(DataType declared, DataType sent) {
  // BF16 has no numpy type: a model returns its bits as 16-bit integers.
  return sent == declared || (declared == DataType::kBf16 && (sent == DataType::kUint16 || sent == DataType::kInt16));
}

}  // namespace

PythonWorkerExecutor::PythonWorkerExecutor(PythonWorkerOptions options, PythonWorkerHooks hooks)
    : options_(std::move(options)), hooks_(std::move(hooks)) {}

PythonWorkerExecutor::~PythonWorkerExecutor() = default;

void PythonWorkerExecutor::attach(std::shared_ptr<worker::WorkerRing> ring, int pidfd) {
  auto link = std::make_shared<Link>(std::move(ring), pidfd);
  std::lock_guard<std::mutex> lock(link_mutex_);
  link_ = std::move(link);
  leases_.clear();  // a new worker writes its own arena
}

void PythonWorkerExecutor::detach() {
  std::shared_ptr<Link> gone;
  std::lock_guard<std::mutex> lock(link_mutex_);
  gone = std::move(link_);
}

bool PythonWorkerExecutor::attached() const { return link() != nullptr; }

std::shared_ptr<PythonWorkerExecutor::Link> PythonWorkerExecutor::link() const {
  std::lock_guard<std::mutex> lock(link_mutex_);
  return link_;
}

std::unique_lock<std::mutex> PythonWorkerExecutor::exclusive() { return std::unique_lock<std::mutex>(batch_mutex_); }

bool PythonWorkerExecutor::batch_abandoned() const {
  std::lock_guard<std::mutex> lock(link_mutex_);
  if (running_.empty()) return false;
  return std::all_of(running_.begin(), running_.end(),
                     [](const RequestCancellation& cancellation) { return cancellation.requested(); });
}

Status PythonWorkerExecutor::execute(const std::vector<Tensor>&, std::vector<Tensor>*) {
  return Status::Error(StatusCode::kUnimplemented, options_.description + " takes its batches as requests");
}

Status PythonWorkerExecutor::execute_requests(const std::vector<ExecutorRequest>& requests,
                                              std::vector<RequestResult>* results, ResponseStream*) {
  std::vector<WorkerRequest> named;
  named.reserve(requests.size());
  for (const ExecutorRequest& request : requests) {
    if (request.inputs.size() != options_.input_names.size()) {
      return Status::Error(StatusCode::kInternal, options_.description + ": a request with " +
                                                      std::to_string(request.inputs.size()) + " inputs");
    }
    WorkerRequest worker_request{request.id, request.parameters, request.requested_outputs, {}, request.cancellation};
    for (size_t i = 0; i < request.inputs.size(); ++i) {
      if (!request.inputs[i].absent) worker_request.inputs.emplace_back(options_.input_names[i], &request.inputs[i]);
    }
    named.push_back(std::move(worker_request));
  }
  std::vector<WorkerAnswer> answers;
  Status status = run(named, &answers);
  if (!status.ok()) return status;
  results->clear();
  for (size_t i = 0; i < answers.size(); ++i) results->push_back(in_model_order(std::move(answers[i]), requests[i]));
  return Status::Ok();
}

Status PythonWorkerExecutor::run(const std::vector<WorkerRequest>& requests, std::vector<WorkerAnswer>* answers) {
  if (link() == nullptr) {
    Status serving = hooks_.ensure_serving();
    if (!serving.ok()) return serving;
  }
  std::lock_guard<std::mutex> batch(batch_mutex_);
  std::shared_ptr<Link> current = link();
  if (current == nullptr) {
    return Status::Error(StatusCode::kUnavailable, options_.description + " is restarting its worker");
  }
  {
    std::lock_guard<std::mutex> lock(link_mutex_);
    running_.clear();
    for (const WorkerRequest& request : requests) running_.push_back(request.cancellation);
  }
  Status status = run_batch(*current, requests, answers);
  std::lock_guard<std::mutex> lock(link_mutex_);
  running_.clear();
  return status;
}

Status PythonWorkerExecutor::run_batch(Link& link, const std::vector<WorkerRequest>& requests,
                                       std::vector<WorkerAnswer>* answers) {
  bool broken = false;
  Status status;
  try {
    Message execute;
    status = place_batch(link, requests, &execute);
    if (!status.ok()) return status;
    if (!link.ring->send(execute)) {
      broken = true;
      status = Status::Error(StatusCode::kInternal, options_.description + ": its ring is full");
    } else {
      Message result;
      status = await_result(link, requests, execute.batch, &result, &broken);
      if (status.ok()) status = read_answers(link, requests.size(), result, answers);
      // An answer that breaks the protocol is the worker's fault as much as its death is.
      if (!status.ok()) broken = true;
    }
  } catch (const std::system_error& error) {
    // The arenas could not grow (memory): the batch fails, the worker serves on.
    return Status::Error(StatusCode::kInternal, options_.description + ": " + error.what());
  } catch (const std::exception& error) {
    broken = true;
    status = Status::Error(StatusCode::kInternal, options_.description + ": " + error.what());
  }
  if (!broken) return status;
  // The worker is dead or broke the protocol: the Python side kills and reaps it, says how it
  // ended and restarts it; this batch fails with its word.
  detach();
  Status died = hooks_.died();
  return died.ok() ? status : died;
}

Status PythonWorkerExecutor::place_batch(Link& link, const std::vector<WorkerRequest>& requests, Message* message) {
  worker::BatchDescription batch;
  batch.cancel_offset = 0;
  size_t position = worker::aligned(requests.size());  // the cancellation flags come first
  std::vector<std::pair<const Tensor*, size_t>> copies;
  for (const WorkerRequest& request : requests) {
    worker::RequestDescription described;
    described.id = request.id;
    described.parameters = request.parameters;
    described.requested_outputs = request.requested_outputs;
    for (const auto& [name, tensor] : request.inputs) {
      described.inputs.push_back(TensorPlace{name, tensor->dtype, tensor->shape, position, tensor->byte_size});
      copies.emplace_back(tensor, position);
      position += worker::aligned(tensor->byte_size);
    }
    batch.requests.push_back(std::move(described));
  }
  const std::string description = worker::encode_batch(batch);
  worker::SharedRegion& inputs = link.ring->inputs();
  inputs.reserve(position + description.size());
  std::byte* arena = inputs.data();
  // The flags are written before the batch is sent: a request already cancelled must read so
  // from the model's first is_cancelled(), which may come before await_result's first look.
  for (size_t i = 0; i < requests.size(); ++i) {
    arena[i] = std::byte{static_cast<uint8_t>(requests[i].cancellation.requested() ? 1 : 0)};
  }
  for (const auto& [tensor, offset] : copies) {
    if (tensor->client_memory != nullptr) {
      std::string error;
      if (!copy_from_slice(arena + offset, *tensor->client_memory, tensor->byte_size, &error)) {
        return Status::Error(StatusCode::kInvalidArgument, error);
      }
    } else if (tensor->byte_size != 0) {
      std::memcpy(arena + offset, tensor->data, tensor->byte_size);
    }
  }
  std::memcpy(arena + position, description.data(), description.size());
  *message = Message{};
  message->kind = static_cast<uint32_t>(MessageKind::kExecute);
  message->count = static_cast<uint32_t>(requests.size());
  message->batch = next_batch_++;
  message->offset = position;
  message->length = description.size();
  message->floor = outputs_floor();
  return Status::Ok();
}

Status PythonWorkerExecutor::await_result(Link& link, const std::vector<WorkerRequest>& requests, uint64_t batch,
                                          Message* result, bool* exited) {
  std::vector<bool> flagged(requests.size(), false);
  auto* flags = reinterpret_cast<uint8_t*>(link.ring->inputs().data());  // batch.cancel_offset is 0
  const int poll_ms = static_cast<int>(options_.poll_interval.count());
  while (true) {
    while (link.ring->receive(result)) {
      if (result->kind == static_cast<uint32_t>(MessageKind::kResult) && result->batch == batch) return Status::Ok();
      // Anything else is stale (a batch this side already gave up on): dropped.
    }
    for (size_t i = 0; i < requests.size(); ++i) {
      if (!flagged[i] && requests[i].cancellation.requested()) {
        __atomic_store_n(flags + i, uint8_t{1}, __ATOMIC_RELEASE);  // the worker's is_cancelled()
        flagged[i] = true;
      }
    }
    if (link.ring->wait(poll_ms, link.pidfd) == worker::WorkerRing::Wait::kOther) {
      *exited = true;
      return Status::Error(StatusCode::kInternal, options_.description + " exited");
    }
  }
}

Status PythonWorkerExecutor::read_answers(Link& link, size_t count, const Message& result,
                                          std::vector<WorkerAnswer>* answers) {
  worker::SharedRegion& outputs = link.ring->outputs();
  if (result.offset > UINT64_MAX - result.length || !outputs.cover(result.offset + result.length)) {
    return Status::Error(StatusCode::kInternal, options_.description + ": its answer lies outside its arena");
  }
  // A copy: the worker cannot change the description while it is read.
  const std::string description(reinterpret_cast<const char*>(outputs.data() + result.offset), result.length);
  std::vector<ResponseDescription> responses;
  Status status = worker::decode_responses(description, outputs.size(), &responses);
  if (!status.ok()) return status;
  if (responses.size() != count) {
    return Status::Error(StatusCode::kInternal, options_.description + ": malformed reply from the worker");
  }
  auto lease = std::make_shared<OutputLease>();
  lease->mapping = outputs.mapping();
  for (const ResponseDescription& response : responses) {
    for (const TensorPlace& place : response.outputs) {
      lease->end = std::max<uint64_t>(lease->end, place.offset + place.nbytes);
    }
  }
  {
    std::lock_guard<std::mutex> lock(link_mutex_);
    leases_.push_back(lease);
  }
  answers->clear();
  for (const ResponseDescription& response : responses) {
    WorkerAnswer answer;
    if (!response.ok) {
      answer.status = Status::Error(StatusCode::kInternal, std::string(response.error));
      answers->push_back(std::move(answer));
      continue;
    }
    for (const TensorPlace& place : response.outputs) {
      Tensor tensor;
      tensor.dtype = place.dtype;
      tensor.shape = place.shape;
      const std::byte* data = lease->mapping->data() + place.offset;
      if (place.dtype == DataType::kBytes) {
        // Copied out before it is checked: the response writer walks the lengths again later.
        auto owned = std::make_shared<std::vector<std::byte>>(data, data + place.nbytes);
        std::vector<size_t> offsets;
        if (!bytes_element_offsets(owned->data(), owned->size(), &offsets) ||
            static_cast<int64_t>(offsets.size() - 1) != element_count(place.shape)) {
          answer.status = Status::Error(StatusCode::kInternal, "python model '" + options_.model_name + "': output '" +
                                                                   std::string(place.name) +
                                                                   "' is not a BYTES tensor of its shape");
          break;
        }
        tensor.data = owned->data();
        tensor.byte_size = owned->size();
        tensor.owner = std::move(owned);
      } else {
        tensor.data = data;
        tensor.byte_size = place.nbytes;
        tensor.owner = lease;
      }
      answer.outputs.emplace_back(std::string(place.name), std::move(tensor));
    }
    if (!answer.status.ok()) answer.outputs.clear();
    answers->push_back(std::move(answer));
  }
  return Status::Ok();
}

RequestResult PythonWorkerExecutor::in_model_order(WorkerAnswer&& answer, const ExecutorRequest& request) const {
  if (!answer.status.ok()) return RequestResult{std::move(answer.status), {}};
  const std::string model = "python model '" + options_.model_name + "'";
  RequestResult result;
  for (size_t k = 0; k < options_.output_names.size(); ++k) {
    const std::string& name = options_.output_names[k];
    const DataType declared = options_.output_types[k];
    auto sent = std::find_if(answer.outputs.begin(), answer.outputs.end(),
                             [&name](const auto& output) { return output.first == name; });
    if (sent == answer.outputs.end()) {
      const auto& asked = request.requested_outputs;
      if (asked.empty() || std::find(asked.begin(), asked.end(), name) != asked.end()) {
        return RequestResult{
            Status::Error(StatusCode::kInternal, model + ": its response has no output '" + name + "'"), {}};
      }
      Tensor stand_in;  // not asked for, not computed: no answer carries it
      stand_in.dtype = declared;
      stand_in.shape = {0};
      result.outputs.push_back(std::move(stand_in));
      continue;
    }
    if (!holds(declared, sent->second.dtype)) {
      return RequestResult{Status::Error(StatusCode::kInternal, model + ": output '" + name + "' is " +
                                                                    datatype_name(sent->second.dtype) +
                                                                    ", the model declares " + datatype_name(declared)),
                           {}};
    }
    sent->second.dtype = declared;
    result.outputs.push_back(std::move(sent->second));
  }
  return result;
}

uint64_t PythonWorkerExecutor::outputs_floor() {
  std::lock_guard<std::mutex> lock(link_mutex_);
  uint64_t floor = 0;
  leases_.erase(std::remove_if(leases_.begin(), leases_.end(),
                               [&floor](const std::weak_ptr<OutputLease>& weak) {
                                 std::shared_ptr<OutputLease> lease = weak.lock();
                                 if (lease == nullptr) return true;
                                 floor = std::max(floor, lease->end);
                                 return false;
                               }),
                leases_.end());
  return worker::aligned(floor);
}

}  // namespace inferd
