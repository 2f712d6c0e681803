// A packing plan (the data only): which sequences every DPxCP rank processes in every
// micro-batch step, on which CP group (layout.md sections 3, 7 and 8).
#ifndef ROLLPACK_SCHEDULER_PLAN_H_
#define ROLLPACK_SCHEDULER_PLAN_H_

#include <cstdint>
#include <vector>

#include "scheduler/topology.h"

namespace rollpack {

// One CP group of one micro-batch step: DPxCP ranks
// [first_rank, first_rank + cp_size), rank id = dp * cp + cp_rank.
struct PlanGroup {
  int first_rank = 0;
  int cp_size = 1;
  // Indices into the step's sequence list, in pack order (cu_seqlens order).
  std::vector<int> sequences;
  // Padded length of each sequence on this group (layout.md section 2).
  std::vector<int64_t> padded_lengths;
  // Padded tokens each rank of the group holds: sum(padded_lengths) / cp_size.
  int64_t tokens_per_rank = 0;
  // Work each rank of the group does under the topology's cost model.
  double work_per_rank = 0;
};

// Groups are sorted by first_rank and tile [0, dp*cp) exactly.
struct PlanMicrobatch {
  std::vector<PlanGroup> groups;
};

struct PlanStats {
  int num_microbatches = 0;
  // ceil(sum of padded lengths / (R * T)), padded at the smallest group each
  // sequence fits on.
  int min_microbatches = 0;
  double rank_imbalance = 1.0;
  double sync = 1.0;
  double peak = 0.0;
  double padding_overhead = 0.0;
  double plan_ms = 0.0;
  int64_t num_tokens = 0;
  int64_t num_padded_tokens = 0;
};

struct Plan {
  int num_dpcp_ranks = 1;
  std::vector<PlanMicrobatch> microbatches;
  PlanStats stats;
};

}  // namespace rollpack

#endif  // ROLLPACK_SCHEDULER_PLAN_H_
