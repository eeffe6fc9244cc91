#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace inferd::worker {

// The channel between the server and one python-backend worker process: a shared-memory ring of
// fixed-size message slots in each direction, eventfd doorbells, and two tensor arenas. Built by
// the server; the worker adopts the same five descriptors (RingFds), inherited at its spawn.
//
//   ring     a memfd: RingHeader, then to_worker's and to_server's slots (sealed: fixed size)
//   inputs   a memfd the server writes a batch into (its tensors and its description); grown by
//            the server (ftruncate), never shrunk (sealed against shrinking)
//   outputs  a memfd the worker writes its answers into; grown by the worker, never shrunk
//   bells    an eventfd per direction, written when the receiver said it sleeps
//
// No message carries tensor bytes or JSON: a slot names where its description lies in an arena.
// Neither side trusts the other's writes for memory safety: every index is taken modulo the slot
// count, every offset is checked against what is mapped, and a reader maps more only once the
// file has grown (a shrink cannot happen: the seal refuses it), so a wild worker cannot make the
// server read outside its mappings.

// What a slot says. The numbers are the protocol (both sides are built from this header).
enum class MessageKind : uint32_t {
  kExecute = 1,  // server -> worker: a batch is in `inputs` at [offset, offset + length)
  // worker -> server: batch `batch`'s answers are in `outputs` at [offset, ...); `floor`: how
  // many of the batch's call answers (kCallResult) the worker took before it answered.
  kResult = 2,
  // worker -> server: a model-to-model call (BLS) made while batch `floor` runs; `batch` is the
  // call's number, its CallDescription and input tensors in `outputs` at [offset, ...). The
  // worker keeps them there until that batch's result is sent (the server copies them on receipt).
  kCall = 3,
  // server -> worker: call `batch`'s answer (CallAnswerDescription and output tensors) in
  // `inputs` at [offset, ...), above the batch's own bytes. Sent only before the batch's result
  // arrives: the next batch overwrites it, so the worker copies it out on receipt, and takes none
  // after it answered the batch. An answer it did not take (the result counts those it took), and
  // the answer of a call still in flight then, goes over the control channel instead.
  kCallResult = 4,
  // worker -> server: one response of a decoupled model's request, sent as the model sends it:
  // `batch` the server's number of its batch, `count` the request's index in it, `floor` 1 when
  // it is the request's final one. Its ResponseDescription (a list of one) and tensors are in
  // `outputs` at [offset, offset + length); length 0: the final flag alone. The server copies
  // them out on receipt and counts the message in RingHeader::streamed_taken (see there).
  kResponse = 5,
};

// One slot. `floor`: in an execute, the offset in `outputs` from which the worker may write its
// answers (the server still reads answers below it); in a call, the batch it was made in; in a
// result, the call answers taken; unused otherwise.
struct Message {
  uint32_t kind = 0;
  uint32_t count = 0;  // requests (execute) or responses (result)
  uint64_t batch = 0;
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t floor = 0;
  uint64_t reserved[3] = {};
};
static_assert(sizeof(Message) == 64, "a slot is one cache line");

constexpr uint32_t kSlotCount = 64;

// The descriptors of one channel, as they cross to the worker (its command line: format/parse).
struct RingFds {
  int ring = -1;
  int inputs = -1;
  int outputs = -1;
  int to_worker = -1;
  int to_server = -1;

  std::string format() const;  // "ring,inputs,outputs,to_worker,to_server"
  // Throws std::invalid_argument for anything but five non-negative integers.
  static RingFds parse(const std::string& text);
};

// One mmap of a region's file, unmapped when its last holder lets go: a region remapped after its
// file grew keeps the old mapping alive for what still views it (answers leased to the response
// writer on the server, a model's numpy views in the worker).
class Mapping {
 public:
  Mapping(int fd, size_t size);  // throws std::system_error
  ~Mapping();
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  std::byte* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  std::byte* data_ = nullptr;
  size_t size_ = 0;
};

// A memfd mapped into this process. The owner of its contents (the writer) grows it; the reader
// maps what has been written once a message reaches past its mapping (cover()). Move-only; closes
// its descriptor on destruction.
class SharedRegion {
 public:
  SharedRegion() = default;
  // A new memfd of `size` bytes (rounded up to pages), sealed against shrinking (and against
  // growing too when `fixed`). Throws std::system_error.
  static SharedRegion create(const char* name, size_t size, bool fixed);
  // Adopts `fd` (closed with this region), mapping its current size. Throws std::system_error, or
  // std::invalid_argument for a file not sealed against shrinking.
  static SharedRegion adopt(int fd);
  ~SharedRegion();
  SharedRegion(SharedRegion&& other) noexcept;
  SharedRegion& operator=(SharedRegion&& other) noexcept;
  SharedRegion(const SharedRegion&) = delete;
  SharedRegion& operator=(const SharedRegion&) = delete;

  int fd() const { return fd_; }
  std::byte* data() const { return mapping_ ? mapping_->data() : nullptr; }
  size_t size() const { return mapping_ ? mapping_->size() : 0; }
  // The current mapping, for views that must outlive a remap.
  const std::shared_ptr<Mapping>& mapping() const { return mapping_; }

  // The writer's side: makes the region at least `bytes` long (doubling), remapped. Throws
  // std::system_error when the memory cannot be had.
  void reserve(size_t bytes);
  // The reader's side: whether [0, end) is mapped, remapping to the file's current size first
  // when it is not (the writer grew it). False when the file is shorter than `end`.
  bool cover(size_t end);

 private:
  int fd_ = -1;
  std::shared_ptr<Mapping> mapping_;
};

// An eventfd. ring() adds one; drain() reads it to zero. Move-only, closed on destruction.
class Doorbell {
 public:
  Doorbell() = default;
  static Doorbell create();  // throws std::system_error
  static Doorbell adopt(int fd);
  ~Doorbell();
  Doorbell(Doorbell&& other) noexcept;
  Doorbell& operator=(Doorbell&& other) noexcept;
  Doorbell(const Doorbell&) = delete;
  Doorbell& operator=(const Doorbell&) = delete;

  int fd() const { return fd_; }
  void ring() const;
  void drain() const;

 private:
  int fd_ = -1;
};

// One direction's single-producer, single-consumer queue of slots, in the ring region.
// `head` is written by the consumer only, `tail` by the producer only, `sleeping` by the consumer
// (set before it waits on the doorbell, cleared after). Both counters run freely (wrapping); a
// slot is `counter % kSlotCount`.
struct SlotQueue {
  alignas(64) std::atomic<uint32_t> head;
  alignas(64) std::atomic<uint32_t> tail;
  alignas(64) std::atomic<uint32_t> sleeping;
  alignas(64) Message slots[kSlotCount];
};
static_assert(std::atomic<uint32_t>::is_always_lock_free, "the queues are shared between processes");

struct RingHeader {
  uint32_t magic;
  uint32_t version;
  uint32_t slot_count;
  uint32_t slot_bytes;
  SlotQueue to_worker;
  SlotQueue to_server;
  // A decoupled model's worker streams responses (kResponse) through `outputs`, written one after
  // another; the server counts each it has copied out here (written by the server only). The
  // worker starts again at the arena's start only once every response it sent was taken.
  alignas(64) std::atomic<uint64_t> streamed_taken;
};

// One end of a channel: the server's or the worker's. Thread rules: one thread sends and one
// thread receives at a time on each end (on the server, the executor's worker thread; in the
// worker, sends are serialized by its loop's lock and receiving is taken in turns, see
// WorkerLoop); wake() may be called from any thread.
class WorkerRing {
 public:
  enum class Side { kServer, kWorker };
  // kWoken: the doorbell rang with no message in (wake(), or a stale ring); kOther: `also` became
  // readable.
  enum class Wait { kMessage, kWoken, kTimeout, kOther };

  // The server's end of a new channel. Throws std::system_error.
  static WorkerRing create(const std::string& name);
  // The worker's end, from the descriptors it inherited (each owned from here on). Throws
  // std::invalid_argument for a region that is not a ring of this protocol.
  static WorkerRing adopt(const RingFds& fds);

  Side side() const { return side_; }
  RingFds fds() const;
  SharedRegion& inputs() { return inputs_; }
  SharedRegion& outputs() { return outputs_; }

  // Puts `message` on the outbound queue and rings the receiver if it sleeps. False when the
  // queue is full (the receiver is not taking messages).
  bool send(const Message& message);
  // The next inbound message, if one is in. Never blocks.
  bool receive(Message* message);
  // Blocks until an inbound message is in (not taken), `also` is readable (a descriptor of the
  // caller's: a pidfd, a socket; -1 for none), or `timeout_ms` passes (-1: no limit). EINTR is
  // retried. `spin`: how long to look at the queue first, awake, before sleeping on the doorbell
  // (an answer due within microseconds then costs the sender no write and this side no wake-up).
  Wait wait(int timeout_ms, int also = -1, std::chrono::microseconds spin = std::chrono::microseconds{0});
  // Ends a wait() of this end from another thread: it returns kWoken (or kMessage if one is in).
  void wake() const;
  // How many messages the other side has put on the inbound queue so far (a free-running count,
  // as the queue's counters): what a receiver has to take to have taken everything sent by now.
  uint32_t inbound_sent() const;
  // RingHeader::streamed_taken: the server's count of streamed responses copied out.
  uint64_t streamed_taken() const;
  void set_streamed_taken(uint64_t taken);

 private:
  WorkerRing(Side side, SharedRegion ring, SharedRegion inputs, SharedRegion outputs, Doorbell to_worker,
             Doorbell to_server);
  SlotQueue& outbound() const;
  SlotQueue& inbound() const;
  const Doorbell& inbound_bell() const { return side_ == Side::kServer ? to_server_ : to_worker_; }
  const Doorbell& outbound_bell() const { return side_ == Side::kServer ? to_worker_ : to_server_; }

  Side side_;
  SharedRegion ring_;
  SharedRegion inputs_;
  SharedRegion outputs_;
  Doorbell to_worker_;
  Doorbell to_server_;
  RingHeader* header_;
};

}  // namespace inferd::worker
