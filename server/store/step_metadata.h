// A step's per-sequence metadata (step.h StepMetadata; lifecycle.md section
// 6): group ids, policy versions, the scalars every sample has, and the
// advantages of the step's estimator (scheduler/advantages.h). A single
// server makes it from the samples it takes, a cluster's planner from the
// members' listings and the scalars their holds answer with; both before
// the step exists, so an estimator's refusal leaves nothing taken.
#ifndef ROLLPACK_SERVER_STORE_STEP_METADATA_H_
#define ROLLPACK_SERVER_STORE_STEP_METADATA_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "scheduler/advantages.h"
#include "server/store/step.h"
#include "server/store/stored_sample.h"

namespace rollpack {

// One sample of a step as its metadata sees it. Views into the caller's
// storage.
struct SequenceFacts {
  absl::string_view sample_id;
  absl::string_view group_id;
  int32_t group_size = 0;
  int64_t policy_version = 0;
  // Null: its scalars are not known here (a cluster member whose rollpackd
  // does not send them): the step then carries no scalar.
  const std::map<std::string, double>* scalars = nullptr;
};

// The metadata of a step of `samples`, in its order. `what` prefixes errors
// (e.g. `step "s1"`): ComputeAdvantages' refusals.
absl::StatusOr<StepMetadata> MakeStepMetadata(absl::Span<const SequenceFacts> samples,
                                              const AdvantageRequest& advantage,
                                              absl::string_view what);
absl::StatusOr<StepMetadata> MakeStepMetadata(
    absl::Span<const std::shared_ptr<const StoredSample>> samples,
    const AdvantageRequest& advantage, absl::string_view what);

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_STORE_STEP_METADATA_H_
