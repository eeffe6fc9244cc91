#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "inferd/inference_request.h"
#include "inferd/model_statistics.h"
#include "inferd/tensor.h"

namespace inferd {

// Everything a request's answer depends on, written out whole: the loaded model version it went
// to (`scope`), then for every input its index, whether it was left out, datatype, shape and
// bytes, then the outputs it asked for and its own parameters (a python model reads them). Two
// requests that differ in any of these - the same bytes under another shape or datatype among
// them - never share an answer. Triton's key is a hash of names and bytes alone; here the hash
// only picks the bucket, and a hit compares the whole key, so a collision cannot serve another
// request's answer.
class CacheKey {
 public:
  // The key of `request` to the version `scope`; nullopt when it cannot be read (an input in a
  // client's shared memory that shrank under the copy: the request then fails its own way).
  static std::optional<CacheKey> of(uint64_t scope, const InferenceRequest& request);

  std::string_view bytes() const { return bytes_; }
  size_t hash() const { return hash_; }
  uint64_t scope() const { return scope_; }

 private:
  CacheKey(uint64_t scope, std::string bytes);
  uint64_t scope_;
  std::string bytes_;
  size_t hash_;
};

// The cache's own figures, for metrics.
struct ResponseCacheStats {
  uint64_t bytes = 0;        // charged to the entries held (keys, outputs and bookkeeping)
  uint64_t limit_bytes = 0;  // --cache-config local,size=
  uint64_t entries = 0;
  uint64_t evictions = 0;  // entries dropped to make room
  uint64_t rejected = 0;   // answers too large to hold at all
};

// The server's response cache (Triton's `--cache-config local,size=BYTES`): successful answers by
// their requests' full keys, shared by every model that enables `response_cache`, least recently
// used first out when an answer needs room.
//
// Invariants: the bytes charged to the entries never exceed the limit (an answer larger than the
// whole cache is not kept); an entry's tensors are a copy the cache owns, immutable, kept alive by
// every hit still answering from them after the entry is evicted; a scope's entries are dropped
// when its version is unloaded (forget). Thread-safe: one mutex, held for map and list operations
// and the key comparison only (keys are built and hashed, outputs copied, outside it).
class ResponseCache {
 public:
  explicit ResponseCache(uint64_t limit_bytes);
  ResponseCache(const ResponseCache&) = delete;
  ResponseCache& operator=(const ResponseCache&) = delete;

  // A number no other model version's scope has: a version's entries are its own, so a version
  // reloaded with new files never answers from the old one's.
  uint64_t new_scope() { return next_scope_.fetch_add(1, std::memory_order_relaxed); }

  // The answer kept for `key`, its tensors sharing the entry's buffer, which becomes the most
  // recently used; nullopt on a miss.
  std::optional<std::vector<Tensor>> lookup(const CacheKey& key);
  // Keeps a copy of `outputs` as the answer for `key`, evicting the least recently used entries
  // until it fits. An answer already kept under the key stays (two misses computed it alike).
  void insert(const CacheKey& key, const std::vector<Tensor>& outputs);
  // Drops every entry of `scope` (its version was unloaded).
  void forget(uint64_t scope);

  ResponseCacheStats stats() const;

 private:
  struct StoredAnswer;
  struct Entry {
    CacheKey key;
    std::shared_ptr<const StoredAnswer> answer;
    uint64_t charge = 0;
  };
  struct KeyView {
    std::string_view bytes;
    size_t hash = 0;
  };
  struct KeyViewHash {
    size_t operator()(const KeyView& key) const { return key.hash; }
  };
  struct KeyViewEqual {
    bool operator()(const KeyView& a, const KeyView& b) const { return a.hash == b.hash && a.bytes == b.bytes; }
  };
  using Entries = std::list<Entry>;

  void erase_locked(Entries::iterator entry);

  const uint64_t limit_bytes_;
  std::atomic<uint64_t> next_scope_{1};
  mutable std::mutex mutex_;
  Entries entries_;  // guarded by mutex_: most recently used first
  // Guarded by mutex_: every entry by its key, the bytes charged to them, and what was dropped.
  std::unordered_map<KeyView, Entries::iterator, KeyViewHash, KeyViewEqual> index_;
  uint64_t bytes_ = 0;
  uint64_t evictions_ = 0;
  uint64_t rejected_ = 0;
};

// One model version's use of the server's ResponseCache, for its RequestScheduler (a Scheduler or
// an EnsembleScheduler): the lookup at submit, the insert of a successful answer, and the version's
// statistics as Triton counts them (a hit is a success and a queue entry of its lookup's duration,
// and its cache_hit; a miss's lookup and insert are its cache_miss; a hit is neither an inference
// nor an execution). Disabled (every call a no-op) when built without a cache. Thread-safe.
class VersionCache {
 public:
  VersionCache() = default;
  VersionCache(std::shared_ptr<ResponseCache> cache, ModelStatistics* statistics);
  // Drops the version's entries from the cache.
  ~VersionCache();
  VersionCache(const VersionCache&) = delete;
  VersionCache& operator=(const VersionCache&) = delete;

  bool enabled() const { return cache_ != nullptr; }
  // The cached answer of `request`, whose lookup began at `start`. On a miss the miss is recorded
  // and the key stays on the request for remember(); a hit is recorded by answer().
  std::optional<std::vector<Tensor>> lookup(InferenceRequest* request, Clock::time_point start);
  // The completion of a request that hit, with the cached `outputs`; records the hit.
  Completion answer(std::unique_ptr<InferenceRequest> request, std::vector<Tensor>&& outputs, Clock::time_point start);
  // Keeps a successful answer of a request that missed; a no-op for any other.
  void remember(const Completion& completion);

 private:
  std::shared_ptr<ResponseCache> cache_;
  ModelStatistics* statistics_ = nullptr;
  uint64_t scope_ = 0;
};

}  // namespace inferd
