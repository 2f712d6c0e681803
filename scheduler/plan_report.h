// Plan reporting for operators: the statistics table, the JSON document and
// the SVG picture of `rollpack plan` (docs/scheduler.md).
#ifndef ROLLPACK_SCHEDULER_PLAN_REPORT_H_
#define ROLLPACK_SCHEDULER_PLAN_REPORT_H_

#include <cstdint>
#include <string>

#include "absl/types/span.h"
#include "scheduler/plan.h"
#include "scheduler/topology.h"

namespace rollpack {

// The statistics of `rollpack plan`: tok = L, attn = L^2,
// flops = 24576*L + L^2 of the padded length L.
struct PlanReport {
  PlanStats tok, attn, flops;
};
PlanReport ReportPlan(const Plan& plan, absl::Span<const int64_t> lengths,
                      const Topology& topology);

// The human table.
std::string FormatReport(const PlanReport& report);
// The JSON document (see docs/scheduler.md for its fields).
std::string PlanToJson(const Plan& plan, absl::Span<const int64_t> lengths,
                       const Topology& topology, const PlanReport& report);
// Ranks x micro-batches, coloured by attention work per rank.
std::string PlanToSvg(const Plan& plan, const Topology& topology);

}  // namespace rollpack

#endif  // ROLLPACK_SCHEDULER_PLAN_REPORT_H_
