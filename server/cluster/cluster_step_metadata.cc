// ClusterSteps' per-sequence metadata of a step (lifecycle.md section 6):
// group ids and versions from the members' listings, scalars from their
// holds, advantages computed once here by the planner and written into the
// step's record, which every member encodes from (step_record.h).
#include <utility>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "server/cluster/cluster_steps.h"
#include "server/store/step_metadata.h"

namespace rollpack {

absl::Status ClusterSteps::ScalarsOfHold(
    const v1::HoldSamplesResponse& response, const std::string& member, size_t count,
    std::optional<std::vector<std::map<std::string, double>>>* out) {
  if (static_cast<size_t>(response.scalars_size()) != count) {
    return absl::DataLossError(absl::StrCat("member ", member, " answered HoldSamples with ",
                                            response.scalars_size(), " samples' scalars for ",
                                            count, " samples"));
  }
  out->emplace();
  (*out)->reserve(count);
  for (const v1::SampleScalars& scalars : response.scalars()) {
    (*out)->emplace_back(scalars.values().begin(), scalars.values().end());
  }
  return absl::OkStatus();
}

absl::Status ClusterSteps::OwnHeldScalars(
    const std::string& step_id, const std::vector<std::string>& ids,
    std::optional<std::vector<std::map<std::string, double>>>* out) {
  ASSIGN_OR_RETURN(std::vector<std::shared_ptr<const StoredSample>> held,
                   store_->HeldSamples(step_id, ids));
  out->emplace();
  (*out)->reserve(held.size());
  for (const auto& sample : held) (*out)->push_back(sample->scalars);
  return absl::OkStatus();
}

absl::StatusOr<StepMetadata> ClusterSteps::ChoiceMetadata(const Choice& choice,
                                                          const v1::ClusterStepRecord& record,
                                                          const HeldScalars* scalars,
                                                          const StepRequest& request) {
  const std::string what = absl::StrCat("step \"", request.step_id, "\"");
  const size_t n = choice.sample_ids.size();
  if (choice.group_ids.size() != n || choice.group_sizes.size() != n ||
      choice.policy_versions.size() != n || choice.owner.size() != n) {
    return absl::InternalError(absl::StrCat(what, ": metadata of ", choice.group_ids.size(),
                                            " samples for ", n));
  }
  // HoldAll asked each owner for its samples in step order: its k-th answer
  // is its k-th sample here.
  std::vector<size_t> next(record.members_size(), 0);
  std::vector<SequenceFacts> facts(n);
  for (size_t i = 0; i < n; ++i) {
    const int32_t owner = choice.owner[i];
    SequenceFacts& f = facts[i];
    f.sample_id = choice.sample_ids[i];
    f.group_id = choice.group_ids[i];
    f.group_size = choice.group_sizes[i];
    f.policy_version = choice.policy_versions[i];
    if (scalars == nullptr) continue;
    const auto& held = (*scalars)[owner];
    if (!held.has_value()) {
      if (request.advantage.estimator == AdvantageEstimator::kNone) continue;  // no scalars then
      return absl::FailedPreconditionError(absl::StrCat(
          what, ": member ", record.members(owner), " runs a rollpackd that does not send its "
          "samples' scalars with a hold; ", AdvantageEstimatorName(request.advantage.estimator),
          " needs them (every member must run the same version: docs/cluster.md)"));
    }
    if (next[owner] >= held->size()) {
      return absl::InternalError(absl::StrCat(what, ": member ", record.members(owner),
                                              " held fewer samples than it was asked"));
    }
    f.scalars = &(*held)[next[owner]++];
  }
  if (scalars == nullptr) {
    // Before holding: the group checks alone (no scalar is known yet).
    std::vector<AdvantageSample> samples;
    samples.reserve(n);
    for (const SequenceFacts& f : facts) {
      samples.push_back({f.sample_id, f.group_id, f.group_size, nullptr});
    }
    RETURN_IF_ERROR(CheckAdvantageGroups(samples, request.advantage, what));
    return StepMetadata();
  }
  return MakeStepMetadata(facts, request.advantage, what);
}

}  // namespace rollpack
