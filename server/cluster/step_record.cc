#include "server/cluster/step_record.h"

#include <cmath>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "scheduler/model_spec.h"
#include "server/cluster/incarnation.h"
#include "scheduler/topology.h"
#include "server/store/convert.h"
#include "server/store/names.h"
#include "server/store/step_builder.h"

namespace rollpack {
namespace {

absl::Status Corrupt(const std::string& step_id, const std::string& what) {
  return absl::DataLossError(absl::StrCat("step \"", step_id, "\": its record ", what));
}

}  // namespace

absl::StatusOr<std::shared_ptr<const Step>> StepFromRecord(const std::string& step_id,
                                                           const v1::ClusterStepRecord& record) {
  if (record.step_id() != step_id) {
    return Corrupt(step_id, absl::StrCat("names step \"", record.step_id(), "\""));
  }
  // Every owner is an index into the members: the layout's owner lookups
  // (pieces, R2's split) index with it.
  const int n = record.sample_ids_size();
  if (record.owner_size() != n || record.num_tokens_size() != n) {
    return Corrupt(step_id, absl::StrCat("has ", record.owner_size(), " owners and ",
                                         record.num_tokens_size(), " lengths for ", n,
                                         " samples"));
  }
  for (int i = 0; i < n; ++i) {
    if (!ValidateName("sample_id", record.sample_ids(i), kMaxSampleIdBytes).ok()) {
      return Corrupt(step_id, absl::StrCat("holds an invalid sample id at ", i));
    }
    if (record.num_tokens(i) <= 0) {
      return Corrupt(step_id, absl::StrCat("gives sample \"", record.sample_ids(i), "\" ",
                                           record.num_tokens(i), " tokens"));
    }
    if (record.owner(i) < 0 || record.owner(i) >= record.members_size()) {
      return Corrupt(step_id, absl::StrCat("names owner ", record.owner(i), " of ",
                                           record.members_size(), " members"));
    }
  }
  for (const std::string& member : record.members()) {
    if (member.empty() || member.size() > 255 || member.rfind(':') == std::string::npos) {
      return Corrupt(step_id, "lists a member that is not a host:port");
    }
  }
  // What tells a member restarted empty from one that kept its data
  // (incarnation.h): none (an older planner), or one per member.
  if (record.member_incarnations_size() != 0 &&
      record.member_incarnations_size() != record.members_size()) {
    return Corrupt(step_id, absl::StrCat("has ", record.member_incarnations_size(),
                                         " incarnations for ", record.members_size(),
                                         " members"));
  }
  for (const std::string& incarnation : record.member_incarnations()) {
    if (!incarnation.empty() && !IsIncarnation(incarnation)) {
      return Corrupt(step_id, "names an incarnation that is not 32 hex digits");
    }
  }
  const ModelSpec model = FromProto(record.model());
  if (absl::Status s = ValidateModelSpec(model); !s.ok()) {
    return Corrupt(step_id, absl::StrCat("model: ", s.message()));
  }
  absl::StatusOr<Topology> topology = NormalizeTopology(record.topology());
  if (!topology.ok()) return Corrupt(step_id, absl::StrCat("topology: ", topology.status().message()));
  // Before planning: the planner's arithmetic trusts the sizes (dp * cp of
  // 126 x 757052407 overflowed; step_record_fuzzer).
  if (absl::Status s = ValidateTopologySizes(*topology); !s.ok()) {
    return Corrupt(step_id, std::string(s.message()));
  }
  ASSIGN_OR_RETURN(StepMetadata metadata, RecordMetadata(step_id, record));
  std::vector<std::string> ids(record.sample_ids().begin(), record.sample_ids().end());
  const std::vector<int64_t> lengths(record.num_tokens().begin(), record.num_tokens().end());
  absl::StatusOr<std::shared_ptr<const Step>> step =
      BuildStepFromMetadata(step_id, record.pool(), model, *topology,
                            std::move(ids), lengths, record.num_groups(), record.reuse_samples(),
                            record.replay_source() == v1::REPLAY_SOURCE_RECOMPUTE
                                ? ReplaySourceKind::kRecompute
                                : ReplaySourceKind::kRollout,
                            std::move(metadata));
  // The planner planned this record: one that no longer plans was changed
  // behind the cluster's back (or members run different versions).
  if (!step.ok()) return Corrupt(step_id, absl::StrCat("does not plan: ", step.status().message()));
  return step;
}

void SetRecordMetadata(const StepMetadata& metadata, v1::ClusterStepRecord* record) {
  for (const std::string& group : metadata.group_ids) record->add_group_ids(group);
  record->mutable_policy_versions()->Assign(metadata.policy_versions.begin(),
                                            metadata.policy_versions.end());
  for (const auto& [name, values] : metadata.scalars) {
    v1::StepScalar* scalar = record->add_scalars();
    scalar->set_name(name);
    scalar->mutable_values()->Assign(values.begin(), values.end());
  }
  record->set_advantage(static_cast<v1::AdvantageEstimator>(metadata.advantage.estimator));
  record->mutable_advantages()->Assign(metadata.advantages.begin(), metadata.advantages.end());
}

absl::StatusOr<StepMetadata> RecordMetadata(const std::string& step_id,
                                            const v1::ClusterStepRecord& record) {
  // The encoder indexes every column by sequence and writes each value out
  // whole: a short column would read past it.
  const int n = record.sample_ids_size();
  StepMetadata out;
  const bool legacy = record.group_ids_size() == 0 && record.policy_versions_size() == 0;
  if (!legacy && (record.group_ids_size() != n || record.policy_versions_size() != n)) {
    return Corrupt(step_id, absl::StrCat("has ", record.group_ids_size(), " group ids and ",
                                         record.policy_versions_size(), " policy versions for ",
                                         n, " samples"));
  }
  out.group_ids.assign(record.group_ids().begin(), record.group_ids().end());
  out.policy_versions.assign(record.policy_versions().begin(), record.policy_versions().end());
  for (const v1::StepScalar& scalar : record.scalars()) {
    if (scalar.name().empty() || legacy || scalar.values_size() != n) {
      return Corrupt(step_id, absl::StrCat("has scalar \"", scalar.name(), "\" with ",
                                           scalar.values_size(), " values for ",
                                           legacy ? 0 : n, " samples"));
    }
    auto [it, inserted] = out.scalars.try_emplace(scalar.name(), scalar.values().begin(),
                                                  scalar.values().end());
    if (!inserted) {
      return Corrupt(step_id, absl::StrCat("has scalar \"", scalar.name(), "\" twice"));
    }
  }
  out.advantage.estimator = static_cast<AdvantageEstimator>(record.advantage());
  if (!ValidateAdvantageRequest(out.advantage, "").ok()) {
    return Corrupt(step_id, absl::StrCat("names advantage estimator ",
                                         static_cast<int>(record.advantage())));
  }
  const int want = out.advantage.estimator == AdvantageEstimator::kNone || legacy ? 0 : n;
  if (record.advantages_size() != want || (legacy && record.advantage() != 0)) {
    return Corrupt(step_id, absl::StrCat("has ", record.advantages_size(), " advantages (",
                                         AdvantageEstimatorName(out.advantage.estimator),
                                         ") for ", n, " samples"));
  }
  for (int i = 0; i < record.advantages_size(); ++i) {
    if (!std::isfinite(record.advantages(i))) {
      return Corrupt(step_id, absl::StrCat("gives sample \"", record.sample_ids(i),
                                           "\" advantage ", record.advantages(i)));
    }
  }
  out.advantages.assign(record.advantages().begin(), record.advantages().end());
  return out;
}

}  // namespace rollpack
