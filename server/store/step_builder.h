// Planning a step from the samples the store reserved for it: metadata only
// (sample lengths, the model and the topology), no sample bytes.
#ifndef ROLLPACK_SERVER_STORE_STEP_BUILDER_H_
#define ROLLPACK_SERVER_STORE_STEP_BUILDER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "scheduler/model_spec.h"
#include "scheduler/topology.h"
#include "server/store/step.h"
#include "server/store/stored_sample.h"

namespace rollpack {

// The plan and per-rank layout of `samples` (in the step's order) on
// `topology`. INVALID_ARGUMENT when the model's layers do not split over the
// pipeline stages, or naming the first sample that fits on no allowed CP
// group (its length and the longest that fits); the scheduler's errors
// otherwise (FAILED_PRECONDITION for too few samples).
absl::StatusOr<std::shared_ptr<const Step>> BuildStep(
    const std::string& step_id, const std::string& pool, const ModelSpec& model,
    const Topology& topology, std::vector<std::shared_ptr<const StoredSample>> samples);

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_STORE_STEP_BUILDER_H_
