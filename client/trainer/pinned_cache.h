// Pinned host buffers kept between streams. Pinning and unpinning tens of
// megabytes costs milliseconds each (cudaHostAlloc / cudaFreeHost, and the
// latter synchronises the device): a rank that opened a stream per step paid
// it for every staging slot at the start and again at the end of every step,
// on the consumer's thread at the end (measured in docs/performance.md,
// "Direct pulls and one stream"). Streams take slots from here and give
// them back when they close. CUDA builds only; thread-safe.
#ifndef ROLLPACK_CLIENT_TRAINER_PINNED_CACHE_H_
#define ROLLPACK_CLIENT_TRAINER_PINNED_CACHE_H_

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace rollpack::trainer_internal {

struct PinnedSlot {
  void* ptr = nullptr;
  size_t size = 0;
  cudaEvent_t done = nullptr;  // the H2D copy reading it has finished
};

class PinnedCache {
 public:
  // The process's cache (never destroyed: the driver may be gone at exit,
  // and it releases pinned memory with the process). Keeps at most
  // $ROLLPACK_PINNED_CACHE_BYTES (default 2 GiB; 0 keeps nothing).
  static PinnedCache& Get();

  explicit PinnedCache(int64_t capacity_bytes) : capacity_(capacity_bytes) {}

  // The smallest kept slot of `device` holding at least `size` bytes and
  // at most 4x that; its `done` event may still be pending (the taker waits
  // on it before writing). nullopt when none fits.
  std::optional<PinnedSlot> Take(int device, size_t size);
  // Keeps `slot` (ptr may be null: nothing) while the cache has room;
  // otherwise waits for its copy and frees it. Its event is kept with it.
  void Give(int device, PinnedSlot slot);


 private:
  static void Free(PinnedSlot& slot);

  const int64_t capacity_;
  mutable absl::Mutex mu_;
  // (device, size) -> slot.
  std::multimap<std::pair<int, size_t>, PinnedSlot> kept_ ABSL_GUARDED_BY(mu_);
  int64_t kept_bytes_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace rollpack::trainer_internal

#endif  // ROLLPACK_CLIENT_TRAINER_PINNED_CACHE_H_
