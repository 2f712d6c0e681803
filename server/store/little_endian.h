// Fixed-width little-endian integers of the durable log's framing and record
// payloads.
#ifndef ROLLPACK_SERVER_STORE_LITTLE_ENDIAN_H_
#define ROLLPACK_SERVER_STORE_LITTLE_ENDIAN_H_

#include <cstdint>
#include <string>

namespace rollpack {

inline void PutU32(std::string* out, uint32_t v) {
  char b[4];
  for (int i = 0; i < 4; ++i) b[i] = static_cast<char>((v >> (8 * i)) & 0xFF);
  out->append(b, 4);
}

inline uint32_t GetU32(const char* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  return v;
}

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_STORE_LITTLE_ENDIAN_H_
