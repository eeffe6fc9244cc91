// Calls the core does not answer, relayed to the backend (inferd's Python gRPC server).

#include <mutex>
#include <utility>

#include "inferd/grpc_calls.h"

namespace inferd {
namespace {

// Relays one call of any kind (unary, server streaming such as health Watch, bidi such as
// reflection) to the backend, message by message both ways, with the caller's metadata and
// deadline; the backend's status and trailing metadata come back unchanged. Cancellation goes
// from either side to the other.
//
// Invariants: one message travels each way at a time (the next read on one side starts when the
// write on the other is done), so nothing is buffered here. The backend's call carries two holds,
// one per direction, each released exactly once, when that direction can start nothing more on
// it: its status (OnDone) cannot overtake a message still on its way to the caller, and no op is
// started on it after it is done. The caller -> backend direction ends when the caller half-closes
// or when the backend has ended its side (a backend may answer and finish before the caller
// half-closes; its status must not wait for that); what the caller sends after it is dropped.
// The object lives until both sides are done (OnDone on each).
class ForwardedCall final : public grpc::ServerGenericBidiReactor {
 public:
  ForwardedCall(grpc::GenericCallbackServerContext* context, std::shared_ptr<TransportContext> transport)
      : context_(context), transport_(std::move(transport)), backend_(this) {
    copy_client_metadata(*context_, &client_context_);
    if (const std::optional<PeerCredentials> peer = transport_->peer_credentials(*context_)) {
      client_context_.AddMetadata(
          std::string(kPeerCredentialsKey),
          std::to_string(peer->pid) + " " + std::to_string(peer->uid) + " " + std::to_string(peer->gid));
    }
    transport_->backend->PrepareBidiStreamingCall(&client_context_, context_->method(), grpc::StubOptions(), &backend_);
    backend_.AddMultipleHolds(2);  // caller -> backend writes, backend -> caller reads
    backend_.StartRead(&down_);
    backend_.StartCall();
    StartRead(&up_);
  }

  // Caller -> backend. A read from the caller is in flight whenever no write to the backend is
  // and the direction is open.
  void OnReadDone(bool ok) override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (writes_closed_) return;  // the backend ended first
      if (ok) {
        write_in_flight_ = true;
      } else {
        writes_closed_ = true;
      }
    }
    if (ok) {
      backend_.StartWrite(&up_);
    } else {
      backend_.StartWritesDone();
      backend_.RemoveHold();  // no more writes
    }
  }
  // Backend -> caller.
  void OnWriteDone(bool ok) override {
    if (ok) {
      backend_.StartRead(&down_);
    } else {
      client_context_.TryCancel();  // the caller is gone
      backend_.RemoveHold();        // no more reads
    }
  }
  void OnCancel() override { client_context_.TryCancel(); }
  void OnDone() override { unref(); }

 private:
  class Backend final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
   public:
    explicit Backend(ForwardedCall* call) : call_(call) {}
    void OnWriteDone(bool ok) override {
      bool read_next;
      {
        std::lock_guard<std::mutex> lock(call_->mutex_);
        call_->write_in_flight_ = false;
        read_next = ok && !call_->backend_ended_;
        if (!read_next) call_->writes_closed_ = true;
      }
      if (read_next) {
        call_->StartRead(&call_->up_);  // the next message from the caller
      } else {
        RemoveHold();  // the backend takes no more: no more writes
      }
    }
    void OnReadDone(bool ok) override {
      if (ok) {
        call_->StartWrite(&call_->down_);
        return;
      }
      // The backend's stream ended (its status follows in OnDone): no more reads, and no more
      // writes unless one is in flight, whose OnWriteDone closes the direction.
      bool close_writes;
      {
        std::lock_guard<std::mutex> lock(call_->mutex_);
        call_->backend_ended_ = true;
        close_writes = !call_->write_in_flight_ && !call_->writes_closed_;
        if (close_writes) call_->writes_closed_ = true;
      }
      if (close_writes) RemoveHold();
      RemoveHold();
    }
    void OnDone(const grpc::Status& status) override {
      call_->finish(status);
      call_->unref();
    }

   private:
    ForwardedCall* const call_;
  };

  void finish(const grpc::Status& status) {
    copy_trailing_metadata(client_context_, context_);
    Finish(status);
  }

  void unref() {
    if (refs_.fetch_sub(1, std::memory_order_acq_rel) == 1) delete this;
  }

  grpc::GenericCallbackServerContext* const context_;
  const std::shared_ptr<TransportContext> transport_;
  grpc::ClientContext client_context_;
  Backend backend_;
  grpc::ByteBuffer up_;    // caller -> backend
  grpc::ByteBuffer down_;  // backend -> caller
  std::mutex mutex_;
  bool write_in_flight_ = false;  // guarded by mutex_: a write to the backend awaits OnWriteDone
  bool writes_closed_ = false;    // guarded by mutex_: the write hold is released (or about to be)
  bool backend_ended_ = false;    // guarded by mutex_: the backend's side of the stream ended
  std::atomic<int> refs_{2};      // the caller's side and the backend's side
};

}  // namespace

grpc::ServerGenericBidiReactor* create_forwarded_call(grpc::GenericCallbackServerContext* context,
                                                      std::shared_ptr<TransportContext> transport) {
  return new ForwardedCall(context, std::move(transport));  // deletes itself once both sides are done
}

}  // namespace inferd
