// Static CP ("DP-balanced packing", layout.md section 2): every micro-batch
// has dp groups, group d on ranks [d*cp, (d+1)*cp).
#ifndef ROLLPACK_SCHEDULER_STATIC_CP_SCHEDULER_H_
#define ROLLPACK_SCHEDULER_STATIC_CP_SCHEDULER_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "scheduler/plan.h"
#include "scheduler/topology.h"

namespace rollpack {

// Plan without statistics (ComputePlan fills them in). `topology` must have
// passed ValidateTopologySizes and have scheduler == kStaticCp.
absl::StatusOr<Plan> ComputeStaticCpPlan(absl::Span<const int64_t> lengths,
                                         const Topology& topology);

}  // namespace rollpack

#endif  // ROLLPACK_SCHEDULER_STATIC_CP_SCHEDULER_H_
