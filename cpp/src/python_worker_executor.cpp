#include "inferd/python_worker_executor.h"

#include <rapidjson/stringbuffer.h>
#include <rapidjson/writer.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <map>
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

// The model-to-model calls of the batch in flight: started on the executor's thread as the worker
// sends them, answered from the threads that complete them into `answered` (which rings the
// executor's end of the ring), sent to the worker from the executor's thread.
struct PythonWorkerExecutor::BatchCalls {
  using Late = std::function<void(uint64_t, ModelCallAnswer&&)>;
  struct Answered {
    std::mutex mutex;
    std::deque<std::pair<uint64_t, ModelCallAnswer>> answers;  // guarded by mutex
    // Set once the batch ended with calls in flight: where their answers go from then on (the
    // Python side's control channel: the next batch may overwrite an answer on the ring before
    // the worker read it). Guarded by mutex; called without it.
    Late late;
  };
  struct InFlight {
    std::string model;
    std::shared_ptr<ModelCallHandle> handle;
    Clock::time_point deadline;
  };
  const std::shared_ptr<Answered> answered = std::make_shared<Answered>();
  std::map<uint64_t, InFlight> in_flight;  // by the worker's number of the call
  // The answers sent on the ring, in order: those the worker had not taken when it answered the
  // batch (the result says how many it took) are sent again over the control channel.
  std::vector<std::pair<uint64_t, ModelCallAnswer>> sent;
  uint64_t position = 0;  // where the next answer goes in the inputs arena
};

namespace {

// The request parameter carrying a call's chain of calling models to the called python model
// (inferd.python_backend.bls.CALL_CHAIN_PARAMETER).
constexpr std::string_view kCallChainParameter = "inferd_bls_chain";
// A call whose model set no timeout gets this (bls.DEFAULT_CALL_TIMEOUT_S).
constexpr std::chrono::seconds kDefaultCallTimeout{60};

// What a call's request views: its description and input bytes, copied out of the worker's arena.
struct CallBytes {
  std::string description;
  std::string tensors;
  std::string chain;  // the chain parameter's JSON
  std::string version;
  worker::CallDescription call;
};

std::string quoted(std::string_view name) { return "'" + std::string(name) + "'"; }

}  // namespace

PythonWorkerExecutor::PythonWorkerExecutor(PythonWorkerOptions options, PythonWorkerHooks hooks)
    : options_(std::move(options)),
      declared_{options_.model_name, options_.output_names, options_.output_types},
      hooks_(std::move(hooks)) {}

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

void PythonWorkerExecutor::set_model_calls(std::shared_ptr<ModelCalls> calls) {
  std::lock_guard<std::mutex> lock(link_mutex_);
  model_calls_ = std::move(calls);
}

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
    WorkerRequest worker_request{request.id, request.parameters,   request.requested_outputs,
                                 {},         request.cancellation, request.sequence};
    for (size_t i = 0; i < request.inputs.size(); ++i) {
      if (!request.inputs[i].absent) worker_request.inputs.emplace_back(options_.input_names[i], &request.inputs[i]);
    }
    named.push_back(std::move(worker_request));
  }
  std::vector<WorkerAnswer> answers;
  Status status = run(named, &answers);
  if (!status.ok()) return status;
  results->clear();
  for (size_t i = 0; i < answers.size(); ++i) {
    results->push_back(in_model_order(std::move(answers[i]), requests[i].requested_outputs, declared_));
  }
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
    if (request.sequence != nullptr) {
      described.correlation_id = request.sequence->id;
      described.correlation_string = request.sequence->string_id;
      described.flags = (request.sequence->start ? 1u : 0u) | (request.sequence->end ? 2u : 0u);
    }
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
  batch_end_ = worker::aligned(position + description.size());
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
  BatchCalls calls;
  calls.position = batch_end_;
  // Calls still in flight when the worker answers the batch are the model's threads' (Triton
  // lets them outlive execute): their answers, and those the worker had not taken, go over the
  // control channel (hooks.call_answered_late). When the batch ends any other way (the worker
  // died, or broke the protocol), or when nobody takes late answers, they are cancelled: their
  // requests would run for nobody.
  struct EndCalls {
    BatchCalls& calls;
    const BatchCalls::Late& late;
    bool answered = false;
    uint64_t taken = 0;  // the answers on the ring the worker took
    ~EndCalls() {
      if (answered && late) {
        for (size_t k = taken; k < calls.sent.size(); ++k) late(calls.sent[k].first, std::move(calls.sent[k].second));
      }
      if (calls.in_flight.empty()) return;
      if (answered && late) {
        std::deque<std::pair<uint64_t, ModelCallAnswer>> waiting;
        {
          std::lock_guard<std::mutex> lock(calls.answered->mutex);
          calls.answered->late = late;
          waiting.swap(calls.answered->answers);
        }
        for (auto& [number, answer] : waiting) {
          if (calls.in_flight.count(number) != 0) late(number, std::move(answer));
        }
        return;
      }
      for (auto& [number, call] : calls.in_flight) {
        if (call.handle) call.handle->cancel(Status::Error(StatusCode::kCancelled, "the calling batch ended"));
      }
    }
  } end_calls{calls, hooks_.call_answered_late};
  const auto poll = options_.poll_interval;
  while (true) {
    while (link.ring->receive(result)) {
      if (result->kind == static_cast<uint32_t>(MessageKind::kResult) && result->batch == batch) {
        end_calls.answered = true;
        end_calls.taken = result->floor;
        return Status::Ok();
      }
      if (result->kind == static_cast<uint32_t>(MessageKind::kCall) && result->floor == batch) {
        start_call(link, *result, calls);
      }
      // Anything else is stale (a batch this side already gave up on): dropped.
    }
    std::deque<std::pair<uint64_t, ModelCallAnswer>> answers;
    {
      std::lock_guard<std::mutex> lock(calls.answered->mutex);
      answers.swap(calls.answered->answers);
    }
    for (auto& [number, answer] : answers) {
      if (calls.in_flight.erase(number) == 0) continue;
      if (!send_call_answer(link, number, answer, calls)) {
        return Status::Error(StatusCode::kInternal, options_.description + ": its ring is full");
      }
      calls.sent.emplace_back(number, std::move(answer));
    }
    // The flags' place: the arena may have been remapped to hold an answer.
    auto* flags = reinterpret_cast<uint8_t*>(link.ring->inputs().data());  // batch.cancel_offset is 0
    bool every_request_ended = !requests.empty();
    for (size_t i = 0; i < requests.size(); ++i) {
      if (!flagged[i] && requests[i].cancellation.requested()) {
        __atomic_store_n(flags + i, uint8_t{1}, __ATOMIC_RELEASE);  // the worker's is_cancelled()
        flagged[i] = true;
      }
      every_request_ended = every_request_ended && flagged[i];
    }
    const Clock::time_point now = Clock::now();
    Clock::time_point wake_at = now + poll;
    for (auto& [number, call] : calls.in_flight) {
      if (call.handle == nullptr) continue;
      if (every_request_ended) {
        // As Python's calls (calls.py): nobody waits for the batch, so none for its calls.
        call.handle->cancel(Status::Error(StatusCode::kCancelled,
                                          "model-to-model call cancelled: every request of the calling batch was "
                                          "cancelled or passed its deadline"));
      } else if (call.deadline <= now) {
        call.handle->cancel(Status::Error(StatusCode::kDeadlineExceeded,
                                          "model-to-model call to " + quoted(call.model) + " passed its deadline"));
      } else {
        wake_at = std::min(wake_at, call.deadline);
      }
    }
    const auto wait = std::chrono::ceil<std::chrono::milliseconds>(wake_at - now);
    {
      std::lock_guard<std::mutex> lock(calls.answered->mutex);
      if (!calls.answered->answers.empty()) continue;  // a cancel above answered at once
    }
    // A batch of one is what an idle server runs: its answer is looked for awake a moment first;
    // not while a call is in flight (its answer comes from the core, with a wake()).
    const bool spins = requests.size() == 1 && calls.in_flight.empty();
    const std::chrono::microseconds spin = spins ? options_.spin : std::chrono::microseconds{0};
    if (link.ring->wait(static_cast<int>(std::max<int64_t>(wait.count(), 0)), link.pidfd, spin) ==
        worker::WorkerRing::Wait::kOther) {
      *exited = true;
      return Status::Error(StatusCode::kInternal, options_.description + " exited");
    }
  }
}

void PythonWorkerExecutor::start_call(Link& link, const Message& message, BatchCalls& calls) {
  const uint64_t number = message.batch;
  std::shared_ptr<BatchCalls::Answered> answered = calls.answered;
  std::weak_ptr<worker::WorkerRing> ring = link.ring;
  ModelCallDone done = [answered, ring, number](ModelCallAnswer&& answer) {
    BatchCalls::Late late;
    {
      std::lock_guard<std::mutex> lock(answered->mutex);
      if (!answered->late) {
        answered->answers.emplace_back(number, std::move(answer));
      } else {
        late = answered->late;
      }
    }
    if (late) return late(number, std::move(answer));
    if (std::shared_ptr<worker::WorkerRing> woken = ring.lock()) woken->wake();
  };
  // A call refused here is answered by a handle of its own, sent as the others are.
  auto failed = [&](const Status& status) {
    auto handle = std::make_shared<ModelCallHandle>(std::weak_ptr<RequestScheduler>(), 0, done);
    calls.in_flight[number] = BatchCalls::InFlight{"", handle, Clock::time_point::max()};
    handle->fail(status);
  };
  if (calls.in_flight.count(number) != 0) return;  // a number twice: the first keeps it
  // Copied out of the arena first: the worker cannot change what is checked and run.
  auto bytes = std::make_shared<CallBytes>();
  worker::SharedRegion& outputs = link.ring->outputs();
  if (message.offset > UINT64_MAX - message.length || !outputs.cover(message.offset + message.length)) {
    return failed(Status::Error(StatusCode::kInternal, "the call lies outside the worker's arena"));
  }
  bytes->description.assign(reinterpret_cast<const char*>(outputs.data() + message.offset), message.length);
  Status status = worker::decode_call(bytes->description, outputs.size(), &bytes->call);
  if (!status.ok()) return failed(status);
  worker::CallDescription& call = bytes->call;
  size_t total = 0;
  for (const TensorPlace& input : call.inputs) total += input.nbytes;
  bytes->tensors.resize(total);
  std::vector<Tensor> inputs;
  size_t at = 0;
  for (const TensorPlace& input : call.inputs) {
    std::memcpy(bytes->tensors.data() + at, outputs.data() + input.offset, input.nbytes);
    Tensor tensor;
    tensor.dtype = input.dtype;
    tensor.shape = input.shape;
    tensor.data = reinterpret_cast<const std::byte*>(bytes->tensors.data() + at);
    tensor.byte_size = input.nbytes;
    tensor.owner = bytes;
    inputs.push_back(std::move(tensor));
    at += input.nbytes;
  }
  // A call that would wait on itself is refused at once, as Python's are (calls.py).
  const std::string caller = options_.model_name;
  if (call.model == caller) {
    return failed(
        Status::Error(StatusCode::kInvalidArgument, "python model " + quoted(caller) + " cannot call itself"));
  }
  std::vector<std::string_view> chain;
  for (std::string_view name : call.chain) {
    if (std::find(chain.begin(), chain.end(), name) == chain.end()) chain.push_back(name);
  }
  if (std::find(chain.begin(), chain.end(), caller) == chain.end()) chain.push_back(caller);
  if (std::find(chain.begin(), chain.end(), call.model) != chain.end()) {
    std::string cycle;
    for (std::string_view name : chain) cycle += std::string(name) + " -> ";
    return failed(Status::Error(StatusCode::kInvalidArgument,
                                "python model " + quoted(caller) + " cannot call " + quoted(call.model) +
                                    ": the call would close a cycle of model-to-model calls (" + cycle +
                                    std::string(call.model) + ")"));
  }
  const Clock::time_point deadline =
      Clock::now() + (call.timeout_us > 0
                          ? std::chrono::duration_cast<Clock::duration>(std::chrono::microseconds(call.timeout_us))
                          : std::chrono::duration_cast<Clock::duration>(kDefaultCallTimeout));
  calls.in_flight[number] = BatchCalls::InFlight{std::string(call.model), nullptr, deadline};

  std::shared_ptr<ModelCalls> model_calls;
  {
    std::lock_guard<std::mutex> lock(link_mutex_);
    model_calls = model_calls_;
  }
  if (model_calls != nullptr) {
    rapidjson::StringBuffer json;
    rapidjson::Writer<rapidjson::StringBuffer> writer(json);
    writer.StartArray();
    for (std::string_view name : chain) writer.String(name.data(), static_cast<rapidjson::SizeType>(name.size()));
    writer.EndArray();
    bytes->chain.assign(json.GetString(), json.GetSize());
    bytes->version = call.version < 0 ? "" : std::to_string(call.version);
    ModelCall request;
    request.parsed.model_name = call.model;
    request.parsed.model_version = bytes->version;
    request.parsed.id = call.id;
    for (const worker::CallParameter& parameter : call.parameters) {
      WireParameter wire;
      wire.key = parameter.key;
      switch (parameter.kind) {
        case worker::CallParameter::Kind::kBool:
          wire.kind = WireParameter::Kind::kBool;
          wire.bool_value = parameter.number != 0;
          break;
        case worker::CallParameter::Kind::kInt64:
          wire.kind = WireParameter::Kind::kInt64;
          wire.int64_value = parameter.number;
          break;
        case worker::CallParameter::Kind::kString:
          wire.kind = WireParameter::Kind::kString;
          wire.string_value = parameter.text;
          break;
      }
      request.parsed.parameters.push_back(wire);
    }
    WireParameter chained;
    chained.key = kCallChainParameter;
    chained.kind = WireParameter::Kind::kString;
    chained.string_value = bytes->chain;
    request.parsed.parameters.push_back(chained);
    for (size_t k = 0; k < call.inputs.size(); ++k) {
      WireInput input;
      input.name = call.inputs[k].name;
      input.datatype = datatype_name(call.inputs[k].dtype);
      input.shape = call.inputs[k].shape;
      request.parsed.inputs.push_back(std::move(input));
      request.parsed.raw_input_contents.emplace_back(reinterpret_cast<const char*>(inputs[k].data),
                                                     inputs[k].byte_size);
    }
    for (std::string_view name : call.requested_outputs) request.parsed.outputs.push_back(WireOutput{name, {}});
    request.owner = bytes;
    request.deadline = deadline;
    std::shared_ptr<ModelCallHandle> handle = model_calls->start(std::move(request), done);
    if (handle != nullptr) {
      calls.in_flight[number].handle = std::move(handle);
      return;
    }
  }
  // No route: Python runs it, or says why it cannot be run.
  auto handle = std::make_shared<ModelCallHandle>(std::weak_ptr<RequestScheduler>(), 0, done);
  calls.in_flight[number].handle = handle;
  if (!hooks_.call_unrouted) {
    return handle->fail(
        Status::Error(StatusCode::kUnavailable, "model-to-model calls are not available in this server"));
  }
  hooks_.call_unrouted(call, inputs, [handle](ModelCallAnswer&& answer) { handle->answer(std::move(answer)); });
}

bool PythonWorkerExecutor::send_call_answer(Link& link, uint64_t call, const ModelCallAnswer& answer,
                                            BatchCalls& calls) {
  worker::CallAnswerDescription described;
  described.code = answer.status.code;
  described.error = answer.status.message;
  uint64_t position = calls.position;
  for (const auto& [name, tensor] : answer.outputs) {
    described.outputs.push_back(TensorPlace{name, tensor.dtype, tensor.shape, position, tensor.byte_size});
    position += worker::aligned(tensor.byte_size);
  }
  const std::string description = worker::encode_call_answer(described);
  worker::SharedRegion& inputs = link.ring->inputs();
  inputs.reserve(position + description.size());
  std::byte* arena = inputs.data();
  for (size_t k = 0; k < answer.outputs.size(); ++k) {
    const Tensor& tensor = answer.outputs[k].second;
    if (tensor.byte_size != 0) std::memcpy(arena + described.outputs[k].offset, tensor.data, tensor.byte_size);
  }
  std::memcpy(arena + position, description.data(), description.size());
  Message message;
  message.kind = static_cast<uint32_t>(MessageKind::kCallResult);
  message.batch = call;
  message.offset = position;
  message.length = description.size();
  calls.position = worker::aligned(position + description.size());
  return link.ring->send(message);
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
    answers->push_back(answer_of(response, lease->mapping->data(), 0, lease, options_.model_name));
  }
  return Status::Ok();
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
