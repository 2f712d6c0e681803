#include "base/keep_freed_memory.h"

#include <malloc.h>

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace rollpack {
namespace {

#if defined(__GLIBC__)
// Whether the operator chose this setting: its MALLOC_* variable, or its
// name among GLIBC_TUNABLES.
bool OperatorSet(const char* variable, const char* tunable) {
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  return std::getenv(variable) != nullptr ||
         (tunables != nullptr && std::strstr(tunables, tunable) != nullptr);
}
#endif

}  // namespace

void KeepFreedMemory() {
#if defined(__GLIBC__)
  mallopt(M_MMAP_THRESHOLD, kKeptMmapThresholdBytes);  // payloads from the heap, not one mmap each
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  // The trim threshold holds for the main arena only: another arena's heap
  // (64 MiB at most) that empties is unmapped whatever the threshold, unless
  // the top pad is at least a heap's size. A stream's send buffers are freed
  // and allocated again every micro-batch, so without it they were faulted
  // in anew every time (docs/performance.md, "one stream").
  if (!OperatorSet("MALLOC_TOP_PAD_", "top_pad")) mallopt(M_TOP_PAD, kKeptTopPadBytes);
  if (!OperatorSet("MALLOC_ARENA_MAX", "arena_max")) mallopt(M_ARENA_MAX, 2);
#endif
}

bool KeepReceivedMemory() {
#if defined(__GLIBC__)
  static std::atomic<bool> applied{false};
  if (applied.exchange(true)) return false;
  if (const char* off = std::getenv("ROLLPACK_KEEP_FREED_MEMORY");
      off != nullptr && std::strcmp(off, "0") == 0) {
    return false;
  }
  // Setting the top pad turns glibc's dynamic mmap threshold off, leaving
  // it at 128 KiB: without a threshold of our own every read buffer would be
  // mapped on its own for good.
  if (!OperatorSet("MALLOC_MMAP_THRESHOLD_", "mmap_threshold")) {
    mallopt(M_MMAP_THRESHOLD, kKeptMmapThresholdBytes);
  }
  if (!OperatorSet("MALLOC_TOP_PAD_", "top_pad")) mallopt(M_TOP_PAD, kKeptTopPadBytes);
  return true;
#else
  return false;
#endif
}

}  // namespace rollpack
