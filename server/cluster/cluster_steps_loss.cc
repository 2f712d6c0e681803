// Samples lost with a member restarted without its data (docs/cluster.md,
// "Data loss"). A step's record names the incarnation of each member that
// held its samples (HoldAll); a member running as another incarnation holds
// nothing of that step, and never will: it answers DATA_LOSS naming the
// samples instead of NOT_FOUND, and once after it starts it reports every
// live step that lost samples with it (an error in its log, and
// rollpack_cluster_lost_samples_total), each step once cluster-wide even
// when it restarts empty again (a marker in etcd, deleted with the step).
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "server/cluster/cluster_steps.h"
#include "server/cluster/incarnation.h"
#include "spdlog/spdlog.h"

namespace rollpack {
namespace {

// How many ids a message names before it says how many more there are.
constexpr size_t kNamedIds = 5;

std::string NameIds(const std::vector<std::string>& ids) {
  std::vector<std::string> quoted;
  for (size_t i = 0; i < ids.size() && i < kNamedIds; ++i) {
    quoted.push_back(absl::StrCat("\"", ids[i], "\""));
  }
  std::string out = absl::StrJoin(quoted, ", ");
  if (ids.size() > kNamedIds) absl::StrAppend(&out, " and ", ids.size() - kNamedIds, " more");
  return out;
}

}  // namespace

std::string ClusterSteps::incarnation() const {
  Cluster* cluster = cluster_.load();
  return cluster == nullptr ? std::string() : cluster->options().incarnation;
}

std::optional<ClusterSteps::LostShare> ClusterSteps::LostHere(
    const v1::ClusterStepRecord& record) const {
  Cluster* cluster = cluster_.load();
  if (cluster == nullptr) return std::nullopt;
  const std::string& now = cluster->options().incarnation;
  // Read from etcd: only a well-formed record is believed.
  if (record.member_incarnations_size() != record.members_size()) return std::nullopt;
  int self = -1;
  for (int i = 0; i < record.members_size(); ++i) {
    if (record.members(i) == cluster->self().id) self = i;
  }
  if (self < 0) return std::nullopt;
  const std::string& then = record.member_incarnations(self);
  if (!IsIncarnation(then) || then == now) return std::nullopt;
  // A hold of the step here would be this incarnation's: none can exist
  // while the record does (its id is taken), but a record forged over
  // another step's must not make this member deny what it holds.
  if (store_->HoldAttempt(record.step_id()) != 0) return std::nullopt;
  LostShare lost{cluster->self().id, then, now, {}};
  for (int i = 0; i < record.owner_size() && i < record.sample_ids_size(); ++i) {
    if (record.owner(i) == self) lost.sample_ids.push_back(record.sample_ids(i));
  }
  if (lost.sample_ids.empty()) return std::nullopt;
  return lost;
}

absl::Status ClusterSteps::LostError(const v1::ClusterStepRecord& record, const LostShare& lost,
                                     const std::vector<std::string>& asked) {
  const std::vector<std::string>& named = asked.empty() ? lost.sample_ids : asked;
  return absl::DataLossError(absl::StrCat(
      "step \"", record.step_id(), "\": member ", lost.member,
      " was restarted without its data (it held this step's samples as incarnation ",
      lost.then, ", it runs as ", lost.now, "): ", lost.sample_ids.size(),
      " of the step's samples held there are lost, ", named.size(),
      " of them asked for: ", NameIds(named),
      "; release the step and create another (docs/cluster.md, \"Data loss\")"));
}

absl::Status ClusterSteps::MissingHere(const v1::ClusterStepRecord& record,
                                       const std::vector<std::string>& sample_ids,
                                       absl::Status missing) const {
  if (!absl::IsNotFound(missing)) return missing;
  std::optional<LostShare> lost = LostHere(record);
  if (!lost.has_value()) return missing;
  return LostError(record, *lost, sample_ids);
}

absl::Status ClusterSteps::ExplainMissingHold(const std::string& step_id,
                                              const std::vector<std::string>& sample_ids,
                                              absl::Status missing) {
  if (!absl::IsNotFound(missing) || store_->GetStep(step_id).ok()) return missing;
  absl::StatusOr<std::shared_ptr<CachedStep>> cached = Find(step_id);
  if (!cached.ok()) return missing;
  return MissingHere((*cached)->record, sample_ids, std::move(missing));
}

void ClusterSteps::ReportLostShares(Cluster* cluster) {
  const std::string marker_prefix = cluster->Key("lost", absl::StrCat(cluster->self().id, "/"));
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> records =
      cluster->etcd()->GetPrefix(StepKey(cluster, ""));
  if (!records.ok()) return;  // etcd away: the next tick
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> markers =
      cluster->etcd()->GetPrefix(marker_prefix);
  if (!markers.ok()) return;
  absl::flat_hash_set<std::string> live;
  for (const auto& [key, value] : *records) {
    v1::ClusterStepRecord record;
    if (!record.ParseFromString(value) || !record.aborted_by().empty()) continue;
    const std::string step_id = key.substr(StepKey(cluster, "").size());
    if (record.step_id() != step_id) continue;
    live.insert(step_id);
    std::optional<LostShare> lost = LostHere(record);
    if (!lost.has_value()) continue;
    // Reported once for the step, whichever incarnation finds it first; a
    // marker of an earlier step of the same id is replaced.
    const std::string attempt = absl::StrCat(record.created_unix_nanos());
    bool created = false;
    absl::StatusOr<std::string> holder =
        cluster->etcd()->CreateIfAbsent(marker_prefix + step_id, attempt, &created);
    if (!holder.ok()) return;
    if (!created && *holder != attempt) {
      if (!cluster->etcd()->Put(marker_prefix + step_id, attempt).ok()) return;
      created = true;
    }
    spdlog::error("rollpackd: step \"{}\" of pool \"{}\": {} of its samples were held by this "
                  "member ({}) as incarnation {} and are lost (it started as {} without that "
                  "data): {}; its trainer ranks that need them get DATA_LOSS: release the step{}",
                  step_id, record.pool(), lost->sample_ids.size(), lost->member, lost->then,
                  lost->now,
                  NameIds(lost->sample_ids),
                  created ? "" : " (reported before, by an earlier start of this member)");
    if (created) {
      absl::MutexLock lock(&lost_mu_);
      lost_samples_[record.pool()] += static_cast<int64_t>(lost->sample_ids.size());
    }
  }
  // Markers of steps released since: the step ids may be used again.
  for (const auto& [key, unused] : *markers) {
    if (!live.contains(key.substr(marker_prefix.size()))) {
      cluster->etcd()->Delete(key).IgnoreError();
    }
  }
  lost_shares_reported_ = true;
}

std::map<std::string, int64_t> ClusterSteps::lost_samples() const {
  absl::MutexLock lock(&lost_mu_);
  return lost_samples_;
}

}  // namespace rollpack
