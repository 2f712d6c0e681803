// Word-at-a-time accept tests for routed-expert ids: uint8, the layout the
// producers send when E <= 256 (docs/producer.md), and uint16 (E > 256). It only answers "all
// valid?": on false the caller reruns the exact per-id check, which names the
// first bad id, so error messages do not depend on this fast path.
#ifndef ROLLPACK_SERVER_INGEST_EXPERT_ID_CHECK_H_
#define ROLLPACK_SERVER_INGEST_EXPERT_ID_CHECK_H_

#include <cstdint>
#include <vector>

namespace rollpack {

// True when `ids` holds `num_groups` groups of `k` consecutive ids (one
// (token, MoE layer) each) and every id is < num_experts and distinct within
// its group. k >= 1; any k works. On x86-64, k = 2, 4, 8 are checked 16
// bytes at a time (32 with AVX2, picked at run time), k = 3..7 after widening
// each group to 8 bytes, other k one group at a time.
bool Uint8ExpertIdsValid(const uint8_t* ids, int64_t num_groups, int k, int num_experts);

// The same for uint16 ids (what producers send when E > 256, and int16 ids
// without a negative one): groups of k = 2, 4, 8 checked 16 bytes at a
// time on x86-64 (32 with AVX2, picked at run time), other k one group at a
// time.
bool Uint16ExpertIdsValid(const uint16_t* ids, int64_t num_groups, int k, int num_experts);

namespace expert_id_check_internal {
// Uint16ExpertIdsValid without its AVX2 steps, for tests on CPUs that have them.
bool Uint16ExpertIdsValidWithoutAvx2(const uint16_t* ids, int64_t num_groups, int k,
                                     int num_experts);
}  // namespace expert_id_check_internal

// True when, for every layer m < num_layers, some row of `rows` rows of
// [num_layers, k] ids holds a nonzero id in layer m. Real captures pass
// within the first rows: it stops as soon as every layer has shown one.
template <typename Id>
bool EveryLayerNonzero(const Id* ids, int64_t rows, int num_layers, int k) {
  std::vector<uint8_t> seen(num_layers, 0);
  int left = num_layers;
  for (int64_t r = 0; r < rows && left > 0; ++r) {
    for (int m = 0; m < num_layers; ++m) {
      if (seen[m]) continue;
      const Id* group = ids + (r * num_layers + m) * k;
      for (int j = 0; j < k; ++j) {
        if (group[j] != 0) {
          seen[m] = 1;
          --left;
          break;
        }
      }
    }
  }
  return left == 0;
}

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_INGEST_EXPERT_ID_CHECK_H_
