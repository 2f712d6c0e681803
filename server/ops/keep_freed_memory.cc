#include "server/ops/keep_freed_memory.h"

#include <malloc.h>

#include <cstdlib>
#include <cstring>

namespace rollpack {

void KeepFreedMemory() {
#if defined(__GLIBC__)
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // payloads from the heap, not one mmap each
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  const char* tunables = std::getenv("GLIBC_TUNABLES");
  // The trim threshold holds for the main arena only: another arena's heap
  // (64 MiB at most) that empties is unmapped whatever the threshold, unless
  // the top pad is at least a heap's size. A stream's send buffers are freed
  // and allocated again every micro-batch, so without it they were faulted
  // in anew every time (docs/performance.md, "one stream").
  if (std::getenv("MALLOC_TOP_PAD_") == nullptr &&
      (tunables == nullptr || std::strstr(tunables, "top_pad") == nullptr)) {
    mallopt(M_TOP_PAD, kKeptTopPadBytes);
  }
  if (std::getenv("MALLOC_ARENA_MAX") == nullptr &&
      (tunables == nullptr || std::strstr(tunables, "arena_max") == nullptr)) {
    mallopt(M_ARENA_MAX, 2);
  }
#endif
}

}  // namespace rollpack
