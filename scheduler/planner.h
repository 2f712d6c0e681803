// Planning a step: the CP scheduler the topology names, then the plan's
// statistics under the topology's cost model.
#ifndef ROLLPACK_SCHEDULER_PLANNER_H_
#define ROLLPACK_SCHEDULER_PLANNER_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "scheduler/plan.h"
#include "scheduler/topology.h"

namespace rollpack {

// Computes the plan for sequences of the given lengths (in arrival order:
// ties are broken by it, so equal inputs give equal plans).
// INVALID_ARGUMENT when a sequence fits on no allowed CP group (naming its
// index, its length and the largest length that fits); FAILED_PRECONDITION
// when there are too few sequences to give every rank a non-empty
// micro-batch in every step (naming the minimum).
absl::StatusOr<Plan> ComputePlan(absl::Span<const int64_t> lengths,
                                 const Topology& topology);

}  // namespace rollpack

#endif  // ROLLPACK_SCHEDULER_PLANNER_H_
