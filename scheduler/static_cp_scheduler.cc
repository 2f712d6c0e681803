#include "scheduler/static_cp_scheduler.h"

#include <vector>

#include "scheduler/packing.h"

namespace rollpack {

absl::StatusOr<Plan> ComputeStaticCpPlan(absl::Span<const int64_t> lengths,
                                         const Topology& topology) {
  internal::PackOptions options;
  options.unit_width = topology.cp;
  options.max_width = topology.cp;
  options.allow_widening = false;
  if (absl::Status s = internal::ComputeMinWidths(
          lengths, topology, topology.cp, &options.min_width);
      !s.ok()) {
    return s;
  }
  return internal::PackWithFewestMicrobatches(lengths, topology, options);
}

}  // namespace rollpack
