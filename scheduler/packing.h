// The packing engine shared by the static and dynamic CP schedulers
// (docs/scheduler.md). Internal to the scheduler library.
//
// Both schedulers reduce to the same problem in "rank slots": a step has R
// ranks, each with a budget of T padded tokens. A bin is one CP group of one
// step: `width` ranks (unit << k: cp, of any size, under static CP; a power
// of two from min_cp under dynamic CP), `width * T` padded tokens, its
// sequences padded at the group's alignment. Static CP is the special case
// where every bin has width cp; dynamic CP mixes widths from min_cp up.
#ifndef ROLLPACK_SCHEDULER_PACKING_H_
#define ROLLPACK_SCHEDULER_PACKING_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "scheduler/pack_options.h"
#include "scheduler/plan.h"
#include "scheduler/topology.h"

namespace rollpack {
namespace internal {

// Packs `lengths` into exactly `num_microbatches` steps. Returns
// RESOURCE_EXHAUSTED when the sequences do not fit in that many steps (the
// caller tries more), FAILED_PRECONDITION when there are too few sequences to
// give every group of every step at least one.
absl::StatusOr<Plan> PackIntoMicrobatches(absl::Span<const int64_t> lengths,
                                          const Topology& topology,
                                          const PackOptions& options,
                                          int num_microbatches);

// Shared driver: starts at the lower bound on the micro-batch count (rounded
// up to microbatch_group_size) and raises it until the packing succeeds.
absl::StatusOr<Plan> PackWithFewestMicrobatches(
    absl::Span<const int64_t> lengths, const Topology& topology,
    const PackOptions& options);

// INVALID_ARGUMENT naming the first sequence that fits on no group of at
// most max_width ranks; min_width[i] is filled in on success.
absl::Status ComputeMinWidths(absl::Span<const int64_t> lengths,
                              const Topology& topology, int max_width,
                              std::vector<int>* min_width);

// ceil(sum of padded lengths / (R * T)), each sequence padded at its
// smallest allowed group.
int MicrobatchLowerBound(absl::Span<const int64_t> lengths,
                         const Topology& topology,
                         absl::Span<const int> min_width);

}  // namespace internal
}  // namespace rollpack

#endif  // ROLLPACK_SCHEDULER_PACKING_H_
