#include "inferd/response_cache.h"

#include <cstring>
#include <functional>
#include <utility>

#include "inferd/model_signature.h"
#include "inferd/shared_memory.h"

namespace inferd {

namespace {

// What an entry costs beyond its key and tensor bytes: the list node, the index slot, the stored
// answer and each tensor's shape, roughly, so that many tiny answers still fill the cache.
constexpr uint64_t kEntryOverhead = 256;
constexpr uint64_t kTensorOverhead = sizeof(Tensor) + 64;

class KeyWriter {
 public:
  explicit KeyWriter(size_t reserve) { bytes_.reserve(reserve); }
  void u64(uint64_t value) { raw(&value, sizeof(value)); }
  void raw(const void* data, size_t size) { bytes_.append(static_cast<const char*>(data), size); }
  // Room for `size` bytes, written by the caller.
  std::byte* extend(size_t size) {
    const size_t at = bytes_.size();
    bytes_.resize(at + size);
    return reinterpret_cast<std::byte*>(bytes_.data() + at);
  }
  std::string take() { return std::move(bytes_); }

 private:
  std::string bytes_;
};

}  // namespace

CacheKey::CacheKey(uint64_t scope, std::string bytes)
    : scope_(scope), bytes_(std::move(bytes)), hash_(std::hash<std::string_view>{}(bytes_)) {}

std::optional<CacheKey> CacheKey::of(uint64_t scope, const InferenceRequest& request) {
  size_t size = 64 + request.parameters_json.size() + 8 * request.requested_outputs.size();
  for (const Tensor& input : request.inputs) size += 32 + 8 * input.shape.size() + input.byte_size;
  KeyWriter key(size);
  key.u64(scope);
  key.u64(request.inputs.size());
  for (const Tensor& input : request.inputs) {
    key.u64(input.absent ? 1 : 0);
    key.u64(static_cast<uint64_t>(input.dtype));
    key.u64(input.shape.size());
    for (int64_t dim : input.shape) key.u64(static_cast<uint64_t>(dim));
    key.u64(input.byte_size);
    if (input.byte_size == 0) continue;
    std::byte* to = key.extend(input.byte_size);
    if (input.client_memory != nullptr) {
      std::string error;  // the request fails its own way when it reads the slice again
      if (!copy_from_slice(to, *input.client_memory, input.byte_size, &error)) return std::nullopt;
    } else {
      std::memcpy(to, input.data, input.byte_size);
    }
  }
  key.u64(request.requested_outputs.size());
  for (uint32_t output : request.requested_outputs) key.u64(output);
  key.u64(request.parameters_json.size());
  key.raw(request.parameters_json.data(), request.parameters_json.size());
  return CacheKey(scope, key.take());
}

// An entry's answer: one buffer holding every output's bytes, and the tensors viewing it.
struct ResponseCache::StoredAnswer {
  std::unique_ptr<std::byte[]> bytes;
  std::vector<Tensor> outputs;  // owner unset: a hit's copies share the StoredAnswer itself
};

ResponseCache::ResponseCache(uint64_t limit_bytes) : limit_bytes_(limit_bytes) {}

std::optional<std::vector<Tensor>> ResponseCache::lookup(const CacheKey& key) {
  std::shared_ptr<const StoredAnswer> answer;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    auto found = index_.find(KeyView{key.bytes(), key.hash()});
    if (found == index_.end()) return std::nullopt;
    entries_.splice(entries_.begin(), entries_, found->second);  // most recently used
    answer = found->second->answer;
  }
  std::vector<Tensor> outputs = answer->outputs;
  for (Tensor& output : outputs) output.owner = answer;
  return outputs;
}

void ResponseCache::insert(const CacheKey& key, const std::vector<Tensor>& outputs) {
  uint64_t charge = kEntryOverhead + key.bytes().size();
  size_t tensor_bytes = 0;
  for (const Tensor& output : outputs) {
    charge += kTensorOverhead + output.byte_size + 8 * output.shape.size();
    tensor_bytes += output.byte_size;
  }
  if (charge > limit_bytes_) {
    std::lock_guard<std::mutex> lock(mutex_);
    ++rejected_;
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (index_.count(KeyView{key.bytes(), key.hash()}) != 0) return;  // kept by another miss
  }
  auto answer = std::make_shared<StoredAnswer>();
  answer->bytes = std::make_unique<std::byte[]>(tensor_bytes == 0 ? 1 : tensor_bytes);
  size_t offset = 0;
  for (const Tensor& output : outputs) {
    Tensor copy;
    copy.dtype = output.dtype;
    copy.shape = output.shape;
    copy.absent = output.absent;
    copy.byte_size = output.byte_size;
    if (output.byte_size != 0) {
      std::memcpy(answer->bytes.get() + offset, output.data, output.byte_size);
      copy.data = answer->bytes.get() + offset;
      offset += output.byte_size;
    }
    answer->outputs.push_back(std::move(copy));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  if (index_.count(KeyView{key.bytes(), key.hash()}) != 0) return;
  while (bytes_ + charge > limit_bytes_ && !entries_.empty()) {
    erase_locked(std::prev(entries_.end()));
    ++evictions_;
  }
  entries_.push_front(Entry{key, std::move(answer), charge});
  const Entry& entry = entries_.front();
  index_.emplace(KeyView{entry.key.bytes(), entry.key.hash()}, entries_.begin());
  bytes_ += charge;
}

void ResponseCache::forget(uint64_t scope) {
  std::lock_guard<std::mutex> lock(mutex_);
  for (auto entry = entries_.begin(); entry != entries_.end();) {
    auto next = std::next(entry);
    if (entry->key.scope() == scope) erase_locked(entry);
    entry = next;
  }
}

void ResponseCache::erase_locked(Entries::iterator entry) {
  index_.erase(KeyView{entry->key.bytes(), entry->key.hash()});
  bytes_ -= entry->charge;
  entries_.erase(entry);
}

ResponseCacheStats ResponseCache::stats() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return ResponseCacheStats{bytes_, limit_bytes_, entries_.size(), evictions_, rejected_};
}

VersionCache::VersionCache(std::shared_ptr<ResponseCache> cache, ModelStatistics* statistics)
    : cache_(std::move(cache)), statistics_(statistics), scope_(cache_ ? cache_->new_scope() : 0) {}

VersionCache::~VersionCache() {
  if (cache_) cache_->forget(scope_);
}

std::optional<std::vector<Tensor>> VersionCache::lookup(InferenceRequest* request, Clock::time_point start) {
  if (!cache_) return std::nullopt;
  // A decoupled model's answer is a stream, never one response to keep (its config is refused
  // at load; this holds for any caller of the core).
  if (request->signature != nullptr && request->signature->decoupled) return std::nullopt;
  std::optional<CacheKey> key = CacheKey::of(scope_, *request);
  if (!key) return std::nullopt;
  if (auto outputs = cache_->lookup(*key)) return outputs;
  statistics_->record_cache_miss(1, ns_between(start, Clock::now()));
  request->cache_key = std::make_shared<const CacheKey>(std::move(*key));
  return std::nullopt;
}

Completion VersionCache::answer(std::unique_ptr<InferenceRequest> request, std::vector<Tensor>&& outputs,
                                Clock::time_point start) {
  Completion completion;
  completion.token = request->token;
  completion.outputs = std::move(outputs);
  completion.timing.enqueued = start;
  completion.timing.compute_end = Clock::now();
  completion.request = std::move(request);
  statistics_->record_cache_hit(ns_between(start, completion.timing.compute_end));
  return completion;
}

void VersionCache::remember(const Completion& completion) {
  if (!cache_ || completion.request == nullptr || completion.request->cache_key == nullptr) return;
  if (!completion.status.ok() || !completion.respond || completion.outputs.empty()) return;
  const auto start = Clock::now();
  cache_->insert(*completion.request->cache_key, completion.outputs);
  statistics_->record_cache_miss(0, ns_between(start, Clock::now()));
}

}  // namespace inferd
