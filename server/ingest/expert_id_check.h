// Word-at-a-time accept test for uint8 routed-expert ids, the layout the
// producers send when E <= 256 (docs/producer.md). It only answers "all
// valid?": on false the caller reruns the exact per-id check, which names the
// first bad id, so error messages do not depend on this fast path.
#ifndef ROLLPACK_SERVER_INGEST_EXPERT_ID_CHECK_H_
#define ROLLPACK_SERVER_INGEST_EXPERT_ID_CHECK_H_

#include <cstdint>

namespace rollpack {

// True when `ids` holds `num_groups` groups of `k` consecutive ids (one
// (token, MoE layer) each) and every id is < num_experts and distinct within
// its group. k >= 1; any k works. On x86-64, k = 2, 4, 8 are checked 16
// bytes at a time (32 with AVX2, picked at run time), k = 3..7 after widening
// each group to 8 bytes, other k one group at a time.
bool Uint8ExpertIdsValid(const uint8_t* ids, int64_t num_groups, int k, int num_experts);

// True when, for every layer m < num_layers, some row of `rows` rows of
// [num_layers, k] uint8 ids holds a nonzero id in layer m.
bool EveryLayerNonzero(const uint8_t* ids, int64_t rows, int num_layers, int k);

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_INGEST_EXPERT_ID_CHECK_H_
