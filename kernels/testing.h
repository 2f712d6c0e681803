// What the kernels' tests share (test-only: never linked into a library):
// ids written in each IndexType, random distinct ids, and the GPU tests'
// check tally. The GPU tests' CUDA helpers are in kernels/testing_cuda.h.
#ifndef ROLLPACK_KERNELS_TESTING_H_
#define ROLLPACK_KERNELS_TESTING_H_

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kernels/common.h"

namespace rollpack::kernels::test_support {

// Writes id `v` at element `off` of a buffer of type `t`, little endian.
inline void StoreIdx(std::vector<uint8_t>& buf, IndexType t, int64_t off, int64_t v) {
  switch (t) {
    case IndexType::kU8: buf[off] = uint8_t(v); break;
    case IndexType::kU16: { uint16_t x = uint16_t(v); std::memcpy(&buf[off * 2], &x, 2); break; }
    case IndexType::kI32: { int32_t x = int32_t(v); std::memcpy(&buf[off * 4], &x, 4); break; }
    case IndexType::kI64: { int64_t x = v; std::memcpy(&buf[off * 8], &x, 8); break; }
  }
}

// `v` encoded as type `t`, with 8 bytes of slack so that a kernel reading
// a vector past the end stays inside the buffer.
inline std::vector<uint8_t> EncodeIds(const std::vector<int64_t>& v, IndexType t) {
  std::vector<uint8_t> buf(v.size() * IndexTypeSize(t) + 8);
  for (size_t i = 0; i < v.size(); ++i) StoreIdx(buf, t, int64_t(i), v[i]);
  return buf;
}

// `k` distinct ids of [0, e), in random order.
inline std::vector<int64_t> DistinctIds(std::mt19937_64& rng, int e, int k) {
  std::vector<int64_t> all(e);
  for (int i = 0; i < e; ++i) all[i] = i;
  for (int i = 0; i < k; ++i) {
    std::swap(all[i], all[std::uniform_int_distribution<int>(i, e - 1)(rng)]);
  }
  all.resize(k);
  return all;
}

// The GPU tests' tally (they are plain programs: exit 1 on any failure,
// 77 without a GPU): every check counted, the first 40 failures printed.
inline int g_checks = 0;
inline int g_fail = 0;

inline void Check(bool ok, const std::string& what) {
  ++g_checks;
  if (!ok && ++g_fail <= 40) std::printf("FAIL %s\n", what.c_str());
}

}  // namespace rollpack::kernels::test_support

#endif  // ROLLPACK_KERNELS_TESTING_H_
