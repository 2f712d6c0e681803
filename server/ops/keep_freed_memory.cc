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
  if (std::getenv("MALLOC_ARENA_MAX") == nullptr &&
      (tunables == nullptr || std::strstr(tunables, "arena_max") == nullptr)) {
    mallopt(M_ARENA_MAX, 2);
  }
#endif
}

}  // namespace rollpack
