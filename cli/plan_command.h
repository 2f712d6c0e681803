// `rollpack plan`: offline capacity planning and benchmarking of the
// scheduler (docs/scheduler.md). Depends only on rollpack_scheduler and absl.
#ifndef ROLLPACK_CLI_PLAN_COMMAND_H_
#define ROLLPACK_CLI_PLAN_COMMAND_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "scheduler/plan.h"
#include "scheduler/topology.h"

namespace rollpack {

// argv[0] is "plan". Returns the process exit code (0 ok, 2 usage error,
// 1 planning error).
int RunPlanCommand(int argc, char** argv);

namespace plan_cli {

// One sequence length per line; blank lines and lines starting with '#' are
// skipped.
absl::StatusOr<std::vector<int64_t>> ReadLengthsFile(const std::string& path);

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

}  // namespace plan_cli
}  // namespace rollpack

#endif  // ROLLPACK_CLI_PLAN_COMMAND_H_
