// Uint16ExpertIdsValid (expert_id_check.h): the uint16 ids of models with
// more than 256 experts (Kimi K2's 384, ...), which took the per-id check at
// about 1 ns an id (3 ms for an 8k-token choice of a 48-layer top-8 model).
#include <cstring>

#include "server/ingest/expert_id_check.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace rollpack {
namespace {

// One group at a time: each id against the range, and against the ids
// before it in its group (k is small).
bool ScalarValid16(const uint16_t* ids, int64_t num_groups, int k, int num_experts) {
  for (int64_t g = 0; g < num_groups; ++g, ids += k) {
    for (int j = 0; j < k; ++j) {
      uint16_t id;
      std::memcpy(&id, ids + j, sizeof(id));
      if (id >= num_experts) return false;
      for (int i = 0; i < j; ++i) {
        uint16_t other;
        std::memcpy(&other, ids + i, sizeof(other));
        if (other == id) return false;
      }
    }
  }
  return true;
}

#if defined(__SSE2__)

// Rotates every K-lane group of 16-bit lanes of `x` by J lanes. A group
// repeats an id iff it equals one of its rotations by 0 < J <= K / 2 in
// some lane.
template <int K, int J>
inline __m128i RotateGroups16(__m128i x) {
  if constexpr (K == 8) {
    return _mm_or_si128(_mm_srli_si128(x, 2 * J), _mm_slli_si128(x, 16 - 2 * J));
  } else if constexpr (K == 4) {
    return _mm_or_si128(_mm_srli_epi64(x, 16 * J), _mm_slli_epi64(x, 64 - 16 * J));
  } else {
    return _mm_or_si128(_mm_srli_epi32(x, 16), _mm_slli_epi32(x, 16));
  }
}

template <int K>
inline __m128i Repeated16(__m128i x) {
  __m128i eq = _mm_cmpeq_epi16(x, RotateGroups16<K, 1>(x));
  if constexpr (K >= 4) eq = _mm_or_si128(eq, _mm_cmpeq_epi16(x, RotateGroups16<K, 2>(x)));
  if constexpr (K >= 8) {
    eq = _mm_or_si128(eq, _mm_cmpeq_epi16(x, RotateGroups16<K, 3>(x)));
    eq = _mm_or_si128(eq, _mm_cmpeq_epi16(x, RotateGroups16<K, 4>(x)));
  }
  return eq;
}

// 8 ids (16 bytes) at a time; the tail (fewer than 8 ids) one group at a
// time. Unsigned "id < E" as a signed compare of both sides shifted by
// 0x8000 (SSE2 has no unsigned 16-bit compare).
template <int K>
bool VectorValid16(const uint16_t* ids, int64_t num_groups, int num_experts) {
  const int64_t count = num_groups * K;
  const __m128i bias = _mm_set1_epi16(static_cast<int16_t>(0x8000));
  const __m128i limit = _mm_xor_si128(_mm_set1_epi16(static_cast<int16_t>(num_experts)), bias);
  __m128i bad = _mm_setzero_si128();
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {
    const __m128i x = _mm_loadu_si128(reinterpret_cast<const __m128i*>(ids + i));
    const __m128i in_range = _mm_cmplt_epi16(_mm_xor_si128(x, bias), limit);
    bad = _mm_or_si128(bad, _mm_andnot_si128(in_range, _mm_set1_epi16(-1)));
    bad = _mm_or_si128(bad, Repeated16<K>(x));
  }
  if (_mm_movemask_epi8(bad) != 0) return false;
  return ScalarValid16(ids + i, (count - i) / K, K, num_experts);
}

#endif  // __SSE2__

}  // namespace

bool Uint16ExpertIdsValid(const uint16_t* ids, int64_t num_groups, int k, int num_experts) {
  // 65536 experts would make "id < E" true of every uint16; no model has them.
  if (num_experts > 65535) return ScalarValid16(ids, num_groups, k, num_experts);
#if defined(__SSE2__)
  switch (k) {
    case 2:
      return VectorValid16<2>(ids, num_groups, num_experts);
    case 4:
      return VectorValid16<4>(ids, num_groups, num_experts);
    case 8:
      return VectorValid16<8>(ids, num_groups, num_experts);
    default:
      break;
  }
#endif
  return ScalarValid16(ids, num_groups, k, num_experts);
}

}  // namespace rollpack
