// The invariants every plan must satisfy before a layout is built on it.
#ifndef ROLLPACK_SCHEDULER_PLAN_VALIDATION_H_
#define ROLLPACK_SCHEDULER_PLAN_VALIDATION_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "scheduler/plan.h"
#include "scheduler/topology.h"

namespace rollpack {

// Checks every invariant the layout relies on: groups tile the ranks with
// allowed aligned power-of-two sizes (static: exactly cp), every sequence
// appears in exactly one group of one micro-batch, the token budget holds, no
// group is empty, the micro-batch count is a multiple of
// microbatch_group_size, padded lengths match section 2.
absl::Status ValidatePlan(const Plan& plan, absl::Span<const int64_t> lengths,
                          const Topology& topology);

}  // namespace rollpack

#endif  // ROLLPACK_SCHEDULER_PLAN_VALIDATION_H_
