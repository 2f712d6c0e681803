#include "server/store/step_builder.h"

#include <cstdint>
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "scheduler/layout.h"
#include "scheduler/pipeline_layers.h"
#include "scheduler/plan.h"
#include "scheduler/planner.h"

namespace rollpack {
namespace {

// The encoder indexes every column by sequence: each has one entry per
// sample (or none, for a step without metadata or advantages).
absl::Status CheckMetadataSizes(const std::string& step_id, const StepMetadata& metadata,
                                size_t n) {
  bool ok = metadata.empty() ? metadata.scalars.empty()
                             : metadata.group_ids.size() == n && metadata.policy_versions.size() == n;
  for (const auto& [name, values] : metadata.scalars) ok = ok && values.size() == n;
  const bool estimated = metadata.advantage.estimator != AdvantageEstimator::kNone;
  ok = ok && metadata.advantages.size() == (estimated ? n : 0);
  if (ok) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("step \"", step_id, "\": per-sequence metadata of ",
                                          metadata.group_ids.size(), " samples (",
                                          metadata.advantages.size(), " advantages) for ", n));
}

absl::StatusOr<std::shared_ptr<const Step>> Build(
    const std::string& step_id, const std::string& pool, const ModelSpec& model,
    const Topology& topology, std::vector<std::string> sample_ids,
    const std::vector<int64_t>& lengths,
    std::vector<std::shared_ptr<const StoredSample>> samples, int32_t num_groups,
    bool reuse_samples, StepReplay replay, StepMetadata metadata) {
  RETURN_IF_ERROR(PipelineLayers::Create(model, topology));
  if (lengths.size() != sample_ids.size()) {
    return absl::InternalError(absl::StrCat("step \"", step_id, "\": ", sample_ids.size(),
                                            " sample ids, ", lengths.size(), " lengths"));
  }
  const int largest = MaxCpGroupSize(topology);
  for (size_t i = 0; i < lengths.size(); ++i) {
    if (MinCpGroupSizeFor(topology, lengths[i]) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sample \"", sample_ids[i], "\" has ", lengths[i],
          " tokens; the longest that fits on the largest CP group (", largest, " ranks x ",
          topology.max_tokens_per_rank, " max_tokens_per_rank) is ",
          LargestLengthThatFits(topology, largest)));
    }
  }
  RETURN_IF_ERROR(CheckMetadataSizes(step_id, metadata, sample_ids.size()));
  ASSIGN_OR_RETURN(Plan plan, ComputePlan(lengths, topology));
  ASSIGN_OR_RETURN(StepLayout layout, StepLayout::Create(plan, lengths, topology, model));
  return std::make_shared<const Step>(step_id, pool, model, topology, std::move(sample_ids),
                                      std::move(samples), std::move(plan), std::move(layout),
                                      num_groups, reuse_samples, std::move(replay),
                                      std::move(metadata));
}

}  // namespace

absl::StatusOr<std::shared_ptr<const Step>> BuildStep(
    const std::string& step_id, const std::string& pool, const ModelSpec& model,
    const Topology& topology, std::vector<std::shared_ptr<const StoredSample>> samples,
    int32_t num_groups, bool reuse_samples, StepReplay replay, StepMetadata metadata) {
  std::vector<std::string> ids;
  std::vector<int64_t> lengths;
  ids.reserve(samples.size());
  lengths.reserve(samples.size());
  for (const auto& sample : samples) {
    ids.push_back(sample->sample_id);
    lengths.push_back(sample->num_tokens());
  }
  return Build(step_id, pool, model, topology, std::move(ids), lengths, std::move(samples),
               num_groups, reuse_samples, std::move(replay), std::move(metadata));
}

absl::StatusOr<std::shared_ptr<const Step>> BuildStepFromMetadata(
    const std::string& step_id, const std::string& pool, const ModelSpec& model,
    const Topology& topology, std::vector<std::string> sample_ids,
    const std::vector<int64_t>& num_tokens, int32_t num_groups, bool reuse_samples,
    ReplaySourceKind replay_source, StepMetadata metadata) {
  // A cluster's RECOMPUTE step: the routing stays with the samples' owners
  // (RankStep::recompute_routing).
  StepReplay replay;
  replay.source = replay_source;
  return Build(step_id, pool, model, topology, std::move(sample_ids), num_tokens, {}, num_groups,
               reuse_samples, std::move(replay), std::move(metadata));
}

std::shared_ptr<const Step> WithMetadata(const Step& step, StepMetadata metadata) {
  // Copies the plan and layout (linear in the samples), where planning again
  // would cost the packer's search.
  return std::make_shared<const Step>(step.step_id, step.pool, step.model, step.topology,
                                      step.sample_ids, step.samples, step.plan, step.layout,
                                      step.num_groups, step.reuse_samples, step.replay,
                                      std::move(metadata));
}

}  // namespace rollpack
