#include "scheduler/planner.h"

#include <chrono>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "scheduler/dynamic_cp_scheduler.h"
#include "scheduler/plan_stats.h"
#include "scheduler/static_cp_scheduler.h"

namespace rollpack {
namespace {

absl::StatusOr<Plan> ComputePlanOfKind(absl::Span<const int64_t> lengths,
                                       const Topology& topology) {
  switch (topology.scheduler) {
    case SchedulerKind::kStaticCp:
      return ComputeStaticCpPlan(lengths, topology);
    case SchedulerKind::kDynamicCp:
      return ComputeDynamicCpPlan(lengths, topology);
  }
  return absl::InternalError(absl::StrCat("topology: scheduler kind ",
                                          static_cast<int>(topology.scheduler), " has no planner"));
}

}  // namespace

absl::StatusOr<Plan> ComputePlan(absl::Span<const int64_t> lengths,
                                 const Topology& topology) {
  const auto start = std::chrono::steady_clock::now();
  RETURN_IF_ERROR(ValidateTopologySizes(topology));
  if (lengths.empty()) {
    return absl::FailedPreconditionError(
        "no sequences: a plan needs at least one sequence per group");
  }
  ASSIGN_OR_RETURN(Plan plan, ComputePlanOfKind(lengths, topology));
  const double ms = std::chrono::duration<double, std::milli>(
                        std::chrono::steady_clock::now() - start)
                        .count();
  plan.stats.plan_ms = ms;
  plan.stats = ComputePlanStats(plan, lengths, topology, topology.cost);
  return plan;
}

}  // namespace rollpack
