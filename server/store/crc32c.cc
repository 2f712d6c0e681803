#include "server/store/crc32c.h"

#include <cstddef>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace rollpack {
namespace {

struct Crc32cTable {
  uint32_t t[256];
  Crc32cTable() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
  }
};

uint32_t Crc32cSoftware(const unsigned char* p, size_t n, uint32_t crc) {
  static const Crc32cTable table;
  for (size_t i = 0; i < n; ++i) crc = table.t[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
  return crc;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t Crc32cHardware(const unsigned char* p, size_t n,
                                                          uint32_t crc) {
  uint64_t c = crc;
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = static_cast<uint32_t>(c);
  while (n > 0) {
    c32 = _mm_crc32_u8(c32, *p++);
    --n;
  }
  return c32;
}
#endif

uint32_t Crc32cRaw(const unsigned char* p, size_t n, uint32_t crc) {
#if defined(__x86_64__)
  static const bool has_sse42 = __builtin_cpu_supports("sse4.2");
  if (has_sse42) return Crc32cHardware(p, n, crc);
#endif
  return Crc32cSoftware(p, n, crc);
}

}  // namespace

uint32_t Crc32c(absl::string_view data, uint32_t crc) {
  return Crc32cRaw(reinterpret_cast<const unsigned char*>(data.data()), data.size(),
                   crc ^ 0xFFFFFFFFu) ^
         0xFFFFFFFFu;
}

}  // namespace rollpack
