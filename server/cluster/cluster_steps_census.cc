// How many steps the cluster has (docs/cluster.md, "Counting steps"): one
// live step is one committed record in etcd, however many members hold its
// samples, plus the steps members made before they joined (their own). What
// a member holds for steps is another count (rollpack_pool_held_steps).
// Kept by the upkeep thread from a keys-only listing each tick (a record is
// read once, when it appears or changes), so a metrics scrape asks etcd
// nothing; GetPool counts afresh.
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "server/cluster/cluster_steps.h"

namespace rollpack {

absl::StatusOr<std::map<std::string, int64_t>> ClusterSteps::RefreshCensus() {
  ASSIGN_OR_RETURN(Cluster * cluster, Joined());
  // Never a wait on an etcd known to be away (GetPool answers at once then).
  if (!cluster->etcd()->reachable()) return absl::UnavailableError("etcd is unreachable");
  const std::string prefix = StepKey(cluster, "");
  ASSIGN_OR_RETURN(auto keys, cluster->etcd()->ListPrefixKeys(prefix));
  std::map<std::string, CensusEntry> known;
  {
    absl::MutexLock lock(&census_mu_);
    known = census_;
  }
  std::map<std::string, CensusEntry> now;
  for (const auto& [key, revision] : keys) {
    const std::string step_id = key.substr(prefix.size());
    auto it = known.find(step_id);
    if (it != known.end() && it->second.revision == revision) {
      now.emplace(step_id, it->second);
      continue;
    }
    ASSIGN_OR_RETURN(std::optional<EtcdKeyValue> entry, cluster->etcd()->GetEntry(key));
    if (!entry.has_value()) continue;  // released since the listing
    v1::ClusterStepRecord record;
    CensusEntry e;
    e.revision = entry->mod_revision;
    // A tombstone, or bytes that are no step of this id, is no live step
    // (ListSteps leaves them out alike).
    e.live = record.ParseFromString(entry->value) && record.aborted_by().empty() &&
             record.step_id() == step_id;
    e.pool = e.live ? record.pool() : "";
    now.emplace(step_id, std::move(e));
  }
  std::map<std::string, int64_t> by_pool;
  for (const auto& [id, e] : now) {
    if (e.live) ++by_pool[e.pool];
  }
  for (const LiveStep& own : store_->ListSteps("")) ++by_pool[own.step->pool];
  absl::MutexLock lock(&census_mu_);
  census_ = std::move(now);
  census_counts_ = by_pool;
  return by_pool;
}

std::vector<LiveStep::Holder> ClusterSteps::Holders(const v1::ClusterStepRecord& record) {
  // The record was checked whole (StepFromRecord) before it was cached.
  std::vector<LiveStep::Holder> holders(record.members_size());
  for (int i = 0; i < record.members_size(); ++i) holders[i].member = record.members(i);
  for (int i = 0; i < record.owner_size(); ++i) {
    holders[record.owner(i)].num_samples++;
    holders[record.owner(i)].num_tokens += record.num_tokens(i);
  }
  std::vector<LiveStep::Holder> out;
  for (LiveStep::Holder& h : holders) {
    if (h.num_samples > 0) out.push_back(std::move(h));
  }
  return out;
}

std::vector<LiveStep::Holder> ClusterSteps::StepHolders(const std::string& step_id) {
  if (store_->GetStep(step_id).ok()) return {};  // made here before joining
  absl::StatusOr<std::shared_ptr<CachedStep>> cached = Find(step_id);
  return cached.ok() ? Holders((*cached)->record) : std::vector<LiveStep::Holder>();
}

std::optional<std::map<std::string, int64_t>> ClusterSteps::LiveStepsByPool() const {
  absl::MutexLock lock(&census_mu_);
  return census_counts_;
}

}  // namespace rollpack
