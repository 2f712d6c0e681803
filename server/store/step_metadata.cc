#include "server/store/step_metadata.h"

#include <utility>
#include <vector>

#include "base/status_macros.h"

namespace rollpack {

absl::StatusOr<StepMetadata> MakeStepMetadata(absl::Span<const SequenceFacts> samples,
                                              const AdvantageRequest& advantage,
                                              absl::string_view what) {
  StepMetadata out;
  out.advantage = advantage;
  const std::string& scalar = advantage.scalar_name();
  std::vector<AdvantageSample> inputs;
  inputs.reserve(samples.size());
  out.group_ids.reserve(samples.size());
  out.policy_versions.reserve(samples.size());
  bool scalars_known = !samples.empty();
  for (const SequenceFacts& s : samples) {
    const bool grouped = s.group_size > 0 && !s.group_id.empty();
    out.group_ids.emplace_back(grouped ? s.group_id : absl::string_view());
    out.policy_versions.push_back(s.policy_version);
    const double* value = nullptr;
    if (s.scalars == nullptr) {
      scalars_known = false;
    } else if (auto it = s.scalars->find(scalar); it != s.scalars->end()) {
      value = &it->second;
    }
    inputs.push_back({s.sample_id, s.group_id, s.group_size, value});
  }
  ASSIGN_OR_RETURN(out.advantages, ComputeAdvantages(inputs, advantage, what));
  if (!scalars_known) return out;
  // The names every sample has: the first sample's, kept while each later
  // sample has them too. An empty name is no name a trainer can look up.
  for (const auto& [name, value] : *samples[0].scalars) {
    if (name.empty()) continue;
    std::vector<double> values;
    values.reserve(samples.size());
    for (const SequenceFacts& s : samples) {
      auto it = s.scalars->find(name);
      if (it == s.scalars->end()) break;
      values.push_back(it->second);
    }
    if (values.size() == samples.size()) out.scalars.emplace(name, std::move(values));
  }
  return out;
}

absl::StatusOr<StepMetadata> MakeStepMetadata(
    absl::Span<const std::shared_ptr<const StoredSample>> samples,
    const AdvantageRequest& advantage, absl::string_view what) {
  std::vector<SequenceFacts> facts;
  facts.reserve(samples.size());
  for (const auto& s : samples) {
    facts.push_back({s->sample_id, s->group_id, s->group_size, s->policy_version, &s->scalars});
  }
  return MakeStepMetadata(facts, advantage, what);
}

}  // namespace rollpack
