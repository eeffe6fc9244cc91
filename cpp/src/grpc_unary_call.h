#pragma once

// The base of the core's unary gRPC calls (InferCall, SnapshotCall): reading the one request,
// finishing the call once, and forwarding the request to the Python backend; private to the
// transport (cpp/src).

#include <grpcpp/generic/async_generic_service.h>
#include <grpcpp/grpcpp.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

#include "inferd/grpc_calls.h"
#include "inferd/grpc_inflight_budget.h"
#include "inferd/serving_snapshot.h"

namespace inferd {

// A call answered with one message. Reads the request, then handle() answers it - at once or
// later, from another thread - with answer(), fail() or forward().
// Invariants: the call is finished exactly once (finished_); the object lives until grpc is done
// with it (OnDone) and every answerer that took a reference (ref()) has let go.
class UnaryCall : public grpc::ServerGenericBidiReactor {
 public:
  UnaryCall(grpc::GenericCallbackServerContext* context, std::shared_ptr<TransportContext> transport)
      : context_(context), transport_(std::move(transport)) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {
      fail(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "the call carried no request message"));
      return;
    }
    ref();  // handle() may finish the call: this object outlives it whatever grpc does meanwhile
    handle();
    unref();
  }

  void OnCancel() override {
    std::shared_ptr<BackendCall> backend;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      cancelled_ = true;
      backend = backend_;
    }
    if (backend) backend->context.TryCancel();
    cancelled();
    // A cancelled call must still be finished for grpc to let it go; a late answer is dropped.
    fail(grpc::Status(grpc::StatusCode::CANCELLED, "the call was cancelled"));
  }

  void OnDone() override { unref(); }

 protected:
  virtual void handle() = 0;  // request_ holds the request
  virtual void cancelled() {}

  // Each finishes the call unless it is finished already. `trailing`: the backend's call whose
  // trailing metadata the client gets. Under finish_mutex_: the server context is valid until the
  // call is finished, and no other thread finishes it meanwhile.
  void answer(grpc::ByteBuffer&& response, const grpc::ClientContext* trailing = nullptr) {
    std::lock_guard<std::mutex> lock(finish_mutex_);
    if (finished_) return;
    finished_ = true;
    if (trailing != nullptr) copy_trailing_metadata(*trailing, context_);
    response_ = std::move(response);
    StartWriteAndFinish(&response_, grpc::WriteOptions(), grpc::Status::OK);
  }

  void fail(const grpc::Status& status, const grpc::ClientContext* trailing = nullptr) {
    std::lock_guard<std::mutex> lock(finish_mutex_);
    if (finished_) return;
    finished_ = true;
    if (trailing != nullptr) copy_trailing_metadata(*trailing, context_);
    Finish(status);
  }

  // Calls `use` with the server context, or with null once the call is finished (grpc frees the
  // context then); no other thread finishes the call meanwhile.
  template <typename Use>
  void with_context(Use&& use) {
    std::lock_guard<std::mutex> lock(finish_mutex_);
    use(finished_ ? nullptr : static_cast<const grpc::ServerContextBase*>(context_));
  }

  // Hands the request, unparsed, to the backend, and its answer and status back to the client;
  // `route`: the one the transport chose (null: none), `sampled`: an inference the transport
  // sampled for tracing.
  void forward(const ModelRoute* route = nullptr, bool sampled = false) {
    auto call = std::make_shared<BackendCall>();
    copy_inference_metadata(*context_, *transport_, route, sampled, &call->context);
    call->request = request_;  // shares the slices
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (cancelled_) return;  // already finished CANCELLED
      backend_ = call;
    }
    ref();
    transport_->backend->UnaryCall(&call->context, context_->method(), grpc::StubOptions(), &call->request,
                                   &call->response, [this, call](grpc::Status status) {
                                     if (status.ok()) {
                                       answer(std::move(call->response), &call->context);
                                     } else {
                                       fail(status, &call->context);
                                     }
                                     unref();
                                   });
  }

  void ref() { refs_.fetch_add(1, std::memory_order_relaxed); }
  void unref() {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

  grpc::GenericCallbackServerContext* const context_;
  const std::shared_ptr<TransportContext> transport_;
  // The request's bytes in the in-flight budget (InferCall). Declared before the buffers, so
  // released once they are freed.
  ByteReservation reservation_;
  grpc::ByteBuffer request_;

 private:
  grpc::ByteBuffer response_;
  std::atomic<int> refs_{1};  // grpc's, released in OnDone
  std::mutex finish_mutex_;
  bool finished_ = false;  // guarded by finish_mutex_
  std::mutex mutex_;
  bool cancelled_ = false;                // guarded by mutex_
  std::shared_ptr<BackendCall> backend_;  // guarded by mutex_
};

}  // namespace inferd
