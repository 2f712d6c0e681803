#include "server/cluster/step_record.h"

#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "scheduler/model_spec.h"
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
  std::vector<std::string> ids(record.sample_ids().begin(), record.sample_ids().end());
  const std::vector<int64_t> lengths(record.num_tokens().begin(), record.num_tokens().end());
  absl::StatusOr<std::shared_ptr<const Step>> step =
      BuildStepFromMetadata(step_id, record.pool(), model, *topology,
                            std::move(ids), lengths, record.num_groups(), record.reuse_samples(),
                            record.replay_source() == v1::REPLAY_SOURCE_RECOMPUTE
                                ? ReplaySourceKind::kRecompute
                                : ReplaySourceKind::kRollout);
  // The planner planned this record: one that no longer plans was changed
  // behind the cluster's back (or members run different versions).
  if (!step.ok()) return Corrupt(step_id, absl::StrCat("does not plan: ", step.status().message()));
  return step;
}

}  // namespace rollpack
