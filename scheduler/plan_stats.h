// How good a plan is: balance across ranks, synchronisation cost, peak
// budget use, padding (docs/scheduler.md).
#ifndef ROLLPACK_SCHEDULER_PLAN_STATS_H_
#define ROLLPACK_SCHEDULER_PLAN_STATS_H_

#include <cstdint>

#include "absl/functional/function_ref.h"
#include "absl/types/span.h"
#include "scheduler/plan.h"
#include "scheduler/topology.h"

namespace rollpack {

// Statistics of `plan` for an arbitrary per-sequence work function of the
// padded length (tok, attn, flops in `rollpack plan`).
PlanStats ComputePlanStats(const Plan& plan, absl::Span<const int64_t> lengths,
                           const Topology& topology,
                           absl::FunctionRef<double(int64_t)> work);

}  // namespace rollpack

#endif  // ROLLPACK_SCHEDULER_PLAN_STATS_H_
