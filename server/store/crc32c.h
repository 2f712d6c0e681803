// CRC-32C (Castagnoli), the durable log's checksum: hardware accelerated
// where the CPU has SSE4.2.
#ifndef ROLLPACK_SERVER_STORE_CRC32C_H_
#define ROLLPACK_SERVER_STORE_CRC32C_H_

#include <cstdint>

#include "absl/strings/string_view.h"

namespace rollpack {

// The CRC of `data` continuing from `crc` (the CRC of the bytes before it):
// Crc32c(b, Crc32c(a)) == Crc32c(a + b).
uint32_t Crc32c(absl::string_view data, uint32_t crc = 0);

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_STORE_CRC32C_H_
