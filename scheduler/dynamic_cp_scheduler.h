// Dynamic CP (hybrid DPxCP, layout.md section 8): per micro-batch, the
// R = dp*cp ranks split into aligned power-of-two CP groups.
#ifndef ROLLPACK_SCHEDULER_DYNAMIC_CP_SCHEDULER_H_
#define ROLLPACK_SCHEDULER_DYNAMIC_CP_SCHEDULER_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "scheduler/plan.h"
#include "scheduler/topology.h"

namespace rollpack {

struct DynamicCpOptions {
  // Let a sequence whose work alone exceeds the average work of a rank in a
  // step run on a larger group than it needs (section 8 allows it).
  bool allow_widening = true;
};

// Plan without statistics (ComputePlan fills them in). `topology` must have
// passed ValidateTopologySizes and have scheduler == kDynamicCp.
absl::StatusOr<Plan> ComputeDynamicCpPlan(absl::Span<const int64_t> lengths,
                                          const Topology& topology,
                                          const DynamicCpOptions& options = {});

}  // namespace rollpack

#endif  // ROLLPACK_SCHEDULER_DYNAMIC_CP_SCHEDULER_H_
