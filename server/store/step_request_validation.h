// What a CreateStep's request alone decides, checked once for the single
// server (SampleStore) and the cluster's coordinator (ClusterSteps) alike:
// both refuse a request with the same code and words before they read a
// sample or ask a peer.
#ifndef ROLLPACK_SERVER_STORE_STEP_REQUEST_VALIDATION_H_
#define ROLLPACK_SERVER_STORE_STEP_REQUEST_VALIDATION_H_

#include "absl/status/status.h"
#include "server/store/step_builder.h"

namespace rollpack {

// INVALID_ARGUMENT for a CreateStep's names (names.h), not exactly one of
// sample_ids / num_samples / num_groups / num_tokens, a negative amount,
// topology sizes the scheduler refuses, or an advantage request
// ValidateAdvantageRequest refuses; RESOURCE_EXHAUSTED when the ids it
// lists or the num_samples it asks for are over selection.max_samples
// (CheckStepSize). Each error names the step.
absl::Status ValidateStepRequest(const StepRequest& request);

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_STORE_STEP_REQUEST_VALIDATION_H_
