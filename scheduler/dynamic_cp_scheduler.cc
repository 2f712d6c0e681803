#include "scheduler/dynamic_cp_scheduler.h"

#include <vector>

#include "scheduler/packing.h"

namespace rollpack {

absl::StatusOr<Plan> ComputeDynamicCpPlan(absl::Span<const int64_t> lengths,
                                          const Topology& topology,
                                          const DynamicCpOptions& options) {
  internal::PackOptions pack;
  pack.unit_width = topology.min_cp;
  pack.max_width = MaxCpGroupSize(topology);
  pack.allow_widening = options.allow_widening;
  if (absl::Status s = internal::ComputeMinWidths(lengths, topology,
                                                  pack.max_width,
                                                  &pack.min_width);
      !s.ok()) {
    return s;
  }
  return internal::PackWithFewestMicrobatches(lengths, topology, pack);
}

}  // namespace rollpack
