#include "server/ingest/expert_id_check.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
// AVX2 code is compiled for that target only and chosen at run time, so the
// binary still runs on any x86-64.
#define ROLLPACK_AVX2_DISPATCH 1
#endif

namespace rollpack {
namespace {

// One group at a time with a 256-bit "seen" set: no per-id branch, and no
// table to clear between groups. Used for k outside {2, 4, 8}, for the tail
// of the vector path, and where SSE2 is missing.
bool ScalarValid(const uint8_t* ids, int64_t num_groups, int k, int num_experts) {
  uint8_t max = 0;
  uint64_t repeat = 0;
  for (int64_t g = 0; g < num_groups; ++g, ids += k) {
    uint64_t seen[4] = {0, 0, 0, 0};
    for (int j = 0; j < k; ++j) {
      const uint8_t id = ids[j];
      const uint64_t bit = uint64_t{1} << (id & 63);
      repeat |= seen[id >> 6] & bit;
      seen[id >> 6] |= bit;
      max = std::max(max, id);
    }
  }
  return repeat == 0 && max < num_experts;
}

#if defined(__SSE2__)

// Rotates every k-byte lane of `x` by J bytes. A group of k ids repeats one
// iff it equals some rotation of itself by J bytes (0 < J < k) in some byte;
// J and k - J find the same pairs, so J <= k / 2 suffices.
template <int K, int J>
inline __m128i RotateLanes(__m128i x) {
  if constexpr (K == 8) {
    return _mm_or_si128(_mm_srli_epi64(x, 8 * J), _mm_slli_epi64(x, 64 - 8 * J));
  } else if constexpr (K == 4) {
    return _mm_or_si128(_mm_srli_epi32(x, 8 * J), _mm_slli_epi32(x, 32 - 8 * J));
  } else {
    return _mm_or_si128(_mm_srli_epi16(x, 8), _mm_slli_epi16(x, 8));
  }
}

// 0xff in every byte that equals another byte of its group.
template <int K>
inline __m128i RepeatedBytes(__m128i x) {
  __m128i eq = _mm_cmpeq_epi8(x, RotateLanes<K, 1>(x));
  if constexpr (K >= 4) eq = _mm_or_si128(eq, _mm_cmpeq_epi8(x, RotateLanes<K, 2>(x)));
  if constexpr (K == 8) {
    eq = _mm_or_si128(eq, _mm_cmpeq_epi8(x, RotateLanes<K, 3>(x)));
    eq = _mm_or_si128(eq, _mm_cmpeq_epi8(x, RotateLanes<K, 4>(x)));
  }
  return eq;
}

// 16 bytes (16 / K whole groups) per step: the range by an unsigned byte
// max, repeats by comparing each lane with its rotations (none for K = 1).
// Both accumulate, so valid input (the common case) runs without branches.
// Returns the bytes scanned, a multiple of 16; the caller checks the rest.
template <int K>
int64_t VectorScan(const uint8_t* ids, int64_t bytes, __m128i* max, __m128i* repeat) {
  int64_t i = 0;
  for (; i + 32 <= bytes; i += 32) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(ids + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(ids + i + 16));
    *max = _mm_max_epu8(*max, _mm_max_epu8(a, b));
    if constexpr (K > 1) {
      *repeat = _mm_or_si128(*repeat, _mm_or_si128(RepeatedBytes<K>(a), RepeatedBytes<K>(b)));
    }
  }
  for (; i + 16 <= bytes; i += 16) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(ids + i));
    *max = _mm_max_epu8(*max, a);
    if constexpr (K > 1) *repeat = _mm_or_si128(*repeat, RepeatedBytes<K>(a));
  }
  return i;
}

uint8_t MaxLane(__m128i max) {
  alignas(16) uint8_t lanes[16];
  _mm_store_si128(reinterpret_cast<__m128i*>(lanes), max);
  return *std::max_element(lanes, lanes + 16);
}

#if defined(ROLLPACK_AVX2_DISPATCH)

bool HasAvx2() {
  static const bool has = __builtin_cpu_supports("avx2");
  return has;
}

// pshufb control rotating each K-byte lane by J bytes (AVX2 shuffles within
// 16-byte halves, which K divides).
template <int K, int J>
struct Rotation {
  static constexpr std::array<uint8_t, 32> Make() {
    std::array<uint8_t, 32> control{};
    for (int i = 0; i < 32; ++i) {
      const int at = i % 16;
      control[i] = static_cast<uint8_t>(at - at % K + (at % K + J) % K);
    }
    return control;
  }
  static constexpr std::array<uint8_t, 32> kControl = Make();
};

template <int K, int J>
__attribute__((target("avx2"))) inline __m256i RotationControl() {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(Rotation<K, J>::kControl.data()));
}

// VectorScan with 32 bytes per step and one shuffle per rotation. Returns
// the bytes scanned (a multiple of 32) and folds their max and repeats into
// the SSE2 accumulators.
template <int K>
__attribute__((target("avx2"))) int64_t Avx2Scan(const uint8_t* ids, int64_t bytes,
                                                 __m128i* max, __m128i* repeat) {
  const __m256i r1 = RotationControl<K, 1>();
  const __m256i r2 = RotationControl<K, K >= 4 ? 2 : 1>();
  const __m256i r3 = RotationControl<K, K == 8 ? 3 : 1>();
  const __m256i r4 = RotationControl<K, K == 8 ? 4 : 1>();
  __m256i wide_max = _mm256_setzero_si256();
  __m256i wide_repeat = _mm256_setzero_si256();
  int64_t i = 0;
  for (; i + 32 <= bytes; i += 32) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ids + i));
    wide_max = _mm256_max_epu8(wide_max, x);
    __m256i eq = _mm256_cmpeq_epi8(x, _mm256_shuffle_epi8(x, r1));
    if constexpr (K >= 4) eq = _mm256_or_si256(eq, _mm256_cmpeq_epi8(x, _mm256_shuffle_epi8(x, r2)));
    if constexpr (K == 8) {
      eq = _mm256_or_si256(eq, _mm256_cmpeq_epi8(x, _mm256_shuffle_epi8(x, r3)));
      eq = _mm256_or_si256(eq, _mm256_cmpeq_epi8(x, _mm256_shuffle_epi8(x, r4)));
    }
    wide_repeat = _mm256_or_si256(wide_repeat, eq);
  }
  *max = _mm_max_epu8(*max, _mm_max_epu8(_mm256_castsi256_si128(wide_max),
                                         _mm256_extracti128_si256(wide_max, 1)));
  *repeat = _mm_or_si128(*repeat, _mm_or_si128(_mm256_castsi256_si128(wide_repeat),
                                               _mm256_extracti128_si256(wide_repeat, 1)));
  return i;
}

#endif  // ROLLPACK_AVX2_DISPATCH

template <int K>
bool VectorValid(const uint8_t* ids, int64_t num_groups, int num_experts) {
  const int64_t bytes = num_groups * K;
  __m128i max = _mm_setzero_si128();
  __m128i repeat = _mm_setzero_si128();
  int64_t done = 0;
#if defined(ROLLPACK_AVX2_DISPATCH)
  if (HasAvx2()) done = Avx2Scan<K>(ids, bytes, &max, &repeat);
#endif
  done += VectorScan<K>(ids + done, bytes - done, &max, &repeat);
  if (_mm_movemask_epi8(repeat) != 0 || MaxLane(max) >= num_experts) return false;
  return ScalarValid(ids + done, (bytes - done) / K, K, num_experts);
}

// k in [3, 7] (DeepSeek-V2's 6): the range over the raw bytes, then each
// group widened to 8 bytes whose gap holds 255, 254, ...: values no valid id
// takes when E <= 256 - (8 - k), so they add no repeat.
bool PaddedValid(const uint8_t* ids, int64_t num_groups, int k, int num_experts) {
  const int64_t bytes = num_groups * k;
  __m128i max = _mm_setzero_si128();
  __m128i unused = _mm_setzero_si128();
  const int64_t done = VectorScan<1>(ids, bytes, &max, &unused);
  const uint8_t tail_max = done < bytes ? *std::max_element(ids + done, ids + bytes) : 0;
  if (std::max(MaxLane(max), tail_max) >= num_experts) return false;
  const uint64_t keep = (uint64_t{1} << (8 * k)) - 1;
  uint64_t pad = 0;
  for (int j = k; j < 8; ++j) pad |= uint64_t{255 - static_cast<unsigned>(j - k)} << (8 * j);
  constexpr int kChunk = 256;
  uint64_t words[kChunk];
  __m128i repeat = _mm_setzero_si128();
  for (int64_t g = 0; g < num_groups; g += kChunk) {
    const int n = static_cast<int>(std::min<int64_t>(kChunk, num_groups - g));
    for (int i = 0; i < n; ++i) {
      const int64_t at = (g + i) * k;
      uint64_t word = 0;
      // Little endian (x86): byte j of the group lands in bits [8j, 8j + 8).
      std::memcpy(&word, ids + at, at + 8 <= bytes ? 8 : k);
      words[i] = (word & keep) | pad;
    }
    __m128i unused_max = _mm_setzero_si128();
    const int64_t scanned = VectorScan<8>(reinterpret_cast<const uint8_t*>(words), int64_t{n} * 8,
                                          &unused_max, &repeat);
    // An odd group count leaves one word: check it alone.
    if (scanned < int64_t{n} * 8 &&
        !ScalarValid(reinterpret_cast<const uint8_t*>(&words[n - 1]), 1, 8, 256)) {
      return false;
    }
  }
  return _mm_movemask_epi8(repeat) == 0;
}

#endif  // __SSE2__

}  // namespace

bool Uint8ExpertIdsValid(const uint8_t* ids, int64_t num_groups, int k, int num_experts) {
#if defined(__SSE2__)
  switch (k) {
    case 2:
      return VectorValid<2>(ids, num_groups, num_experts);
    case 4:
      return VectorValid<4>(ids, num_groups, num_experts);
    case 8:
      return VectorValid<8>(ids, num_groups, num_experts);
    default:
      if (k >= 3 && k <= 7 && num_experts <= 256 - (8 - k)) {
        return PaddedValid(ids, num_groups, k, num_experts);
      }
      break;
  }
#endif
  return ScalarValid(ids, num_groups, k, num_experts);
}

}  // namespace rollpack
