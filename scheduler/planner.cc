#include "scheduler/planner.h"

#include <chrono>

#include "base/status_macros.h"
#include "scheduler/dynamic_cp_scheduler.h"
#include "scheduler/plan_stats.h"
#include "scheduler/static_cp_scheduler.h"

namespace rollpack {

absl::StatusOr<Plan> ComputePlan(absl::Span<const int64_t> lengths,
                                 const Topology& topology) {
  const auto start = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(ValidateTopologySizes(topology));
  if (lengths.empty()) {
    return absl::FailedPreconditionError(
        "no sequences: a plan needs at least one sequence per group");
  }
  ASSIGN_OR_RETURN(Plan plan, topology.scheduler == SchedulerKind::kStaticCp
                                   ? ComputeStaticCpPlan(lengths, topology)
                                   : ComputeDynamicCpPlan(lengths, topology));
  const double ms = std::chrono::duration<double, std::milli>(
                        std::chrono::steady_clock::now() - start)
                        .count();
  plan.stats.plan_ms = ms;
  plan.stats = ComputePlanStats(plan, lengths, topology, topology.cost);
  return plan;
}

}  // namespace rollpack
