// GetPool's answer (v1::PoolInfo): one store's pool, and a cluster's pool
// summed over its members' shares.
#ifndef ROLLPACK_SERVER_STORE_POOL_INFO_H_
#define ROLLPACK_SERVER_STORE_POOL_INFO_H_

#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "rollpack/v1/rollouts.pb.h"
#include "server/store/sample_store.h"

namespace rollpack {

// A store's pool; with `group_shares`, its incomplete groups too (what a
// member answers a peer that sums the cluster's pool).
v1::PoolInfo PoolInfoToProto(const PoolStats& stats, const StoreStats& store,
                             bool group_shares);

// A member's answer to GetPoolRequest.complete_group_ids
// (SampleStore::CompleteGroups).
void AddCompleteGroupShares(const std::vector<GroupShareStats>& complete, v1::PoolInfo* info);

// Adds one member's answer (a local_only PoolInfo, or why it has none) to
// `total`: its share in `total->members`, its counts in the sums. A member
// that never saw the pool (NOT_FOUND) adds an empty share.
void AddPoolShare(const std::string& member, const absl::StatusOr<v1::PoolInfo>& share,
                  v1::PoolInfo* total);

// After every share is added: the groups incomplete on some member whose
// summed sealed samples do not exceed their size, in id order. Each may
// still be complete on a member that did not list it (lists hold only the
// groups incomplete there): a cluster asks the members
// (GetPoolRequest.complete_group_ids) before it finishes the sum.
std::vector<std::string> GroupsToCheckForComplete(const v1::PoolInfo& total);

// After every share is added: counts groups over the members and clears
// the per-member group lists. A group whose samples sit on several members
// is complete when their sealed samples reach its size; with more than its
// size, or held complete by a member (`complete_holders`: how many members
// hold each id complete, from their complete_group_shares) and listed
// incomplete by another, it is over-full: neither complete nor incomplete
// (docs/lifecycle.md, "Cluster mode").
void FinishPoolShares(v1::PoolInfo* total,
                      const absl::flat_hash_map<std::string, int>& complete_holders = {});

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_STORE_POOL_INFO_H_
