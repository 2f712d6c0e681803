// A packing plan: which sequences every DPxCP rank processes in every
// micro-batch step, on which CP group (layout.md sections 3, 7 and 8).
#ifndef ROLLPACK_SCHEDULER_PLAN_H_
#define ROLLPACK_SCHEDULER_PLAN_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/functional/function_ref.h"
#include "absl/types/span.h"
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

// Computes the plan for sequences of the given lengths (in arrival order:
// ties are broken by it, so equal inputs give equal plans).
// INVALID_ARGUMENT when a sequence fits on no allowed CP group (naming its
// index, its length and the largest length that fits); FAILED_PRECONDITION
// when there are too few sequences to give every rank a non-empty
// micro-batch in every step (naming the minimum).
absl::StatusOr<Plan> ComputePlan(absl::Span<const int64_t> lengths,
                                 const Topology& topology);

// Checks every invariant the layout relies on: groups tile the ranks with
// allowed aligned power-of-two sizes (static: exactly cp), every sequence
// appears in exactly one group of one micro-batch, the token budget holds, no
// group is empty, the micro-batch count is a multiple of
// microbatch_group_size, padded lengths match section 2.
absl::Status ValidatePlan(const Plan& plan, absl::Span<const int64_t> lengths,
                          const Topology& topology);

// Statistics of `plan` for an arbitrary per-sequence work function of the
// padded length (tok, attn, flops in `rollpack plan`).
PlanStats ComputePlanStats(const Plan& plan, absl::Span<const int64_t> lengths,
                           const Topology& topology,
                           absl::FunctionRef<double(int64_t)> work);

}  // namespace rollpack

#endif  // ROLLPACK_SCHEDULER_PLAN_H_
