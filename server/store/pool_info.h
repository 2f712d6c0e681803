// GetPool's answer (v1::PoolInfo): one store's pool, and a cluster's pool
// summed over its members' shares.
#ifndef ROLLPACK_SERVER_STORE_POOL_INFO_H_
#define ROLLPACK_SERVER_STORE_POOL_INFO_H_

#include <string>

#include "absl/status/statusor.h"
#include "rollpack/v1/rollouts.pb.h"
#include "server/store/sample_store.h"

namespace rollpack {

// A store's pool; with `group_shares`, its incomplete groups too (what a
// member answers a peer that sums the cluster's pool).
v1::PoolInfo PoolInfoToProto(const PoolStats& stats, const StoreStats& store,
                             bool group_shares);

// Adds one member's answer (a local_only PoolInfo, or why it has none) to
// `total`: its share in `total->members`, its counts in the sums. A member
// that never saw the pool (NOT_FOUND) adds an empty share.
void AddPoolShare(const std::string& member, const absl::StatusOr<v1::PoolInfo>& share,
                  v1::PoolInfo* total);

// After every share is added: counts groups over the members (a group whose
// samples sit on several members is complete when their sealed samples
// reach its size) and clears the per-member group lists.
void FinishPoolShares(v1::PoolInfo* total);

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_STORE_POOL_INFO_H_
