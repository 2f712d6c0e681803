// Uint16ExpertIdsValid (expert_id_check.h): the uint16 ids of models with
// more than 256 experts (Kimi K2's 384, ...), which took the per-id check at
// about 1 ns an id (3 ms for an 8k-token choice of a 48-layer top-8 model),
// then 0.6 ms with SSE2 (16 bytes a step, three instructions a rotation),
// 0.28 ms with AVX2 (32 bytes a step, one shuffle a rotation; measured
// alone on the 2-core VM; docs/performance.md, "Capture port").
#include <array>
#include <cstring>

#include "server/ingest/expert_id_check.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
// Compiled for AVX2 only and chosen at run time: the binary runs on any
// x86-64 (as expert_id_check.cc's uint8 path).
#define ROLLPACK_AVX2_DISPATCH16 1
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

#if defined(ROLLPACK_AVX2_DISPATCH16)

bool HasAvx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}

// pshufb control rotating each group of K 16-bit lanes by J lanes (AVX2
// shuffles within 16-byte halves, which a group never crosses).
template <int K, int J>
struct Rotation16 {
  static constexpr std::array<uint8_t, 32> Make() {
    std::array<uint8_t, 32> control{};
    for (int i = 0; i < 32; ++i) {
      const int lane = (i % 16) / 2;
      const int to = lane - lane % K + (lane % K + J) % K;
      control[i] = static_cast<uint8_t>(2 * to + i % 2);
    }
    return control;
  }
  static constexpr std::array<uint8_t, 32> kControl = Make();
};

template <int K, int J>
__attribute__((target("avx2"))) inline __m256i Rotation16Control() {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(Rotation16<K, J>::kControl.data()));
}

// 16 ids (32 bytes) a step: one shuffle per rotation, and "id < E" as the
// unsigned saturating id - (E - 1), zero exactly for ids in range. Returns
// the ids scanned (a multiple of 16) if all of them are valid, else -1.
template <int K>
__attribute__((target("avx2"))) int64_t Avx2Valid16(const uint16_t* ids, int64_t count,
                                                    int num_experts) {
  const __m256i r1 = Rotation16Control<K, 1>();
  const __m256i r2 = Rotation16Control<K, K >= 4 ? 2 : 1>();
  const __m256i r3 = Rotation16Control<K, K == 8 ? 3 : 1>();
  const __m256i r4 = Rotation16Control<K, K == 8 ? 4 : 1>();
  const __m256i largest = _mm256_set1_epi16(static_cast<int16_t>(num_experts - 1));
  __m256i bad = _mm256_setzero_si256();
  int64_t i = 0;
  for (; i + 16 <= count; i += 16) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ids + i));
    bad = _mm256_or_si256(bad, _mm256_subs_epu16(x, largest));
    __m256i eq = _mm256_cmpeq_epi16(x, _mm256_shuffle_epi8(x, r1));
    if constexpr (K >= 4) eq = _mm256_or_si256(eq, _mm256_cmpeq_epi16(x, _mm256_shuffle_epi8(x, r2)));
    if constexpr (K == 8) {
      eq = _mm256_or_si256(eq, _mm256_cmpeq_epi16(x, _mm256_shuffle_epi8(x, r3)));
      eq = _mm256_or_si256(eq, _mm256_cmpeq_epi16(x, _mm256_shuffle_epi8(x, r4)));
    }
    bad = _mm256_or_si256(bad, eq);
  }
  return _mm256_testz_si256(bad, bad) ? i : -1;
}

#endif  // ROLLPACK_AVX2_DISPATCH16

#if defined(__SSE2__)
// K ids a group: the AVX2 steps where the CPU has them, then SSE2 and the
// scalar tail.
template <int K>
bool DispatchValid16(const uint16_t* ids, int64_t num_groups, int num_experts) {
  int64_t done = 0;
#if defined(ROLLPACK_AVX2_DISPATCH16)
  if (HasAvx2() && num_experts >= 1) {
    done = Avx2Valid16<K>(ids, num_groups * K, num_experts);
    if (done < 0) return false;
  }
#endif
  return VectorValid16<K>(ids + done, num_groups - done / K, num_experts);
}
#endif  // __SSE2__

}  // namespace

namespace expert_id_check_internal {

bool Uint16ExpertIdsValidWithoutAvx2(const uint16_t* ids, int64_t num_groups, int k,
                                     int num_experts) {
#if defined(__SSE2__)
  if (num_experts <= 65535) {
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
  }
#endif
  return ScalarValid16(ids, num_groups, k, num_experts);
}

}  // namespace expert_id_check_internal

bool Uint16ExpertIdsValid(const uint16_t* ids, int64_t num_groups, int k, int num_experts) {
  // 65536 experts would make "id < E" true of every uint16; no model has them.
  if (num_experts > 65535) return ScalarValid16(ids, num_groups, k, num_experts);
#if defined(__SSE2__)
  switch (k) {
    case 2:
      return DispatchValid16<2>(ids, num_groups, num_experts);
    case 4:
      return DispatchValid16<4>(ids, num_groups, num_experts);
    case 8:
      return DispatchValid16<8>(ids, num_groups, num_experts);
    default:
      break;
  }
#endif
  return ScalarValid16(ids, num_groups, k, num_experts);
}

}  // namespace rollpack
