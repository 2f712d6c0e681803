#include "server/cluster/group_census.h"

#include <algorithm>

#include "server/cluster/peer_calls.h"

namespace rollpack {
namespace {

// Ids per request: a few hundred kilobytes at most, far under any member's
// message limit.
constexpr size_t kIdsPerRequest = 4096;

}  // namespace

absl::StatusOr<absl::flat_hash_map<std::string, int>> CountCompleteHolders(
    Cluster& cluster, const SampleStore& store, const std::vector<ClusterMember>& members,
    const std::vector<bool>& ask, const std::string& pool,
    const std::vector<std::string>& group_ids) {
  absl::flat_hash_map<std::string, int> holders;
  if (group_ids.empty()) return holders;
  std::vector<absl::StatusOr<std::vector<std::string>>> held(members.size(),
                                                             std::vector<std::string>{});
  ForEachParallel(members.size(), [&](size_t i) {
    if (i >= ask.size() || !ask[i]) return;
    std::vector<std::string> complete;
    for (size_t begin = 0; begin < group_ids.size(); begin += kIdsPerRequest) {
      const size_t end = std::min(group_ids.size(), begin + kIdsPerRequest);
      const std::vector<std::string> chunk(group_ids.begin() + begin, group_ids.begin() + end);
      if (members[i].id == cluster.self().id) {
        absl::StatusOr<std::vector<GroupShareStats>> here = store.CompleteGroups(pool, chunk);
        if (absl::IsNotFound(here.status())) return;  // the pool is gone here
        if (!here.ok()) {
          held[i] = here.status();
          return;
        }
        for (const GroupShareStats& g : *here) complete.push_back(g.group_id);
        continue;
      }
      absl::StatusOr<v1::PoolInfo> share = cluster.GetPoolOf(members[i], pool, chunk);
      if (absl::IsNotFound(share.status())) return;  // holds none of the pool any more
      if (!share.ok()) {
        held[i] = share.status();
        return;
      }
      for (const v1::GroupShare& g : share->complete_group_shares()) {
        complete.push_back(g.group_id());
      }
    }
    held[i] = std::move(complete);
  });
  for (size_t i = 0; i < members.size(); ++i) {
    if (!held[i].ok()) return held[i].status();
    for (const std::string& id : *held[i]) ++holders[id];
  }
  return holders;
}

}  // namespace rollpack
