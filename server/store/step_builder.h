// Planning a step from metadata only (sample ids and lengths, the model and
// the topology), no sample bytes: the store plans the samples it reserved,
// a cluster member plans samples other members hold.
#ifndef ROLLPACK_SERVER_STORE_STEP_BUILDER_H_
#define ROLLPACK_SERVER_STORE_STEP_BUILDER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "scheduler/advantages.h"
#include "scheduler/model_spec.h"
#include "scheduler/sample_selection.h"
#include "scheduler/topology.h"
#include "server/store/step.h"
#include "server/store/stored_sample.h"

namespace rollpack {

// What a CreateStep asks for: explicit ids, or an amount of free samples
// (lifecycle.md), on a topology.
struct StepRequest {
  std::string step_id;
  std::string pool;
  std::vector<std::string> sample_ids;
  SelectionRequest selection;
  Topology topology;
  bool reuse_samples = false;
  ReplaySourceKind replay_source = ReplaySourceKind::kRollout;
  // The advantages every micro-batch carries (lifecycle.md section 6).
  AdvantageRequest advantage;
  // Replaying the durable log: the ids were checked when the step was made
  // (their staleness then, not now).
  bool replay = false;
};

// The plan and per-rank layout of `samples` (in the step's order) on
// `topology`. INVALID_ARGUMENT when the model's layers do not split over the
// pipeline stages, or naming the first sample that fits on no allowed CP
// group (its length and the longest that fits); the scheduler's errors
// otherwise (FAILED_PRECONDITION for too few samples).
absl::StatusOr<std::shared_ptr<const Step>> BuildStep(
    const std::string& step_id, const std::string& pool, const ModelSpec& model,
    const Topology& topology, std::vector<std::shared_ptr<const StoredSample>> samples,
    int32_t num_groups = 0, bool reuse_samples = false, StepReplay replay = {},
    StepMetadata metadata = {});

// The same plan and layout from the samples' ids and lengths alone; the
// step's `samples` is empty (the bytes are elsewhere).
absl::StatusOr<std::shared_ptr<const Step>> BuildStepFromMetadata(
    const std::string& step_id, const std::string& pool, const ModelSpec& model,
    const Topology& topology, std::vector<std::string> sample_ids,
    const std::vector<int64_t>& num_tokens, int32_t num_groups = 0, bool reuse_samples = false,
    ReplaySourceKind replay_source = ReplaySourceKind::kRollout, StepMetadata metadata = {});

// `step` with `metadata`: a cluster's planner plans before it holds the
// samples and learns their scalars (and so the advantages) from the holds.
std::shared_ptr<const Step> WithMetadata(const Step& step, StepMetadata metadata);

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_STORE_STEP_BUILDER_H_
