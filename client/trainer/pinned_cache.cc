#include "client/trainer/pinned_cache.h"

#include <cstdlib>
#include <utility>

namespace rollpack::trainer_internal {

PinnedCache& PinnedCache::Get() {
  static PinnedCache* const cache = [] {
    int64_t capacity = int64_t{2} << 30;
    if (const char* env = std::getenv("ROLLPACK_PINNED_CACHE_BYTES"); env != nullptr) {
      char* end = nullptr;
      const long long v = std::strtoll(env, &end, 10);
      if (end != env && *end == '\0' && v >= 0) capacity = v;
    }
    return new PinnedCache(capacity);
  }();
  return *cache;
}

std::optional<PinnedSlot> PinnedCache::Take(int device, size_t size) {
  absl::MutexLock lock(&mu_);
  auto it = kept_.lower_bound({device, size});
  // Not a slot far larger than asked: it may serve a larger stream later.
  if (it == kept_.end() || it->first.first != device || it->first.second / 4 > size) {
    return std::nullopt;
  }
  PinnedSlot slot = it->second;
  kept_.erase(it);
  kept_bytes_ -= static_cast<int64_t>(slot.size);
  return slot;
}

void PinnedCache::Give(int device, PinnedSlot slot) {
  if (slot.ptr == nullptr) {
    if (slot.done != nullptr) cudaEventDestroy(slot.done);
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    if (kept_bytes_ + static_cast<int64_t>(slot.size) <= capacity_) {
      kept_bytes_ += static_cast<int64_t>(slot.size);
      kept_.emplace(std::make_pair(device, slot.size), slot);
      return;
    }
  }
  Free(slot);
}

void PinnedCache::Free(PinnedSlot& slot) {
  if (slot.done != nullptr) {
    cudaEventSynchronize(slot.done);
    cudaEventDestroy(slot.done);
  }
  cudaFreeHost(slot.ptr);
  slot = PinnedSlot{};
}

}  // namespace rollpack::trainer_internal
