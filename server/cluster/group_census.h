// Groups spread over a cluster's members (docs/lifecycle.md, "Cluster
// mode"). A member lists only the groups incomplete on it, so a group held
// complete by one member with more samples on another would be summed from
// the extra samples alone and called incomplete (and dropped by the
// incomplete-group timeout). The members that hold complete groups are
// asked which of the listed groups they hold complete: such a group is
// over-full, never incomplete.
#ifndef ROLLPACK_SERVER_CLUSTER_GROUP_CENSUS_H_
#define ROLLPACK_SERVER_CLUSTER_GROUP_CENSUS_H_

#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "server/cluster/cluster.h"
#include "server/store/sample_store.h"

namespace rollpack {

// How many of `members` hold each of `group_ids` of `pool` complete (ids
// held complete by none are absent). Only the members with `ask[i]` are
// asked (a member whose pool share counts no complete group holds none);
// the member itself answers from `store`. The ids go in requests of at
// most a few thousand, each member's at once. UNAVAILABLE naming the first
// member that does not answer: a caller that drops groups must not act on
// a partial count.
absl::StatusOr<absl::flat_hash_map<std::string, int>> CountCompleteHolders(
    Cluster& cluster, const SampleStore& store, const std::vector<ClusterMember>& members,
    const std::vector<bool>& ask, const std::string& pool,
    const std::vector<std::string>& group_ids);

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_CLUSTER_GROUP_CENSUS_H_
