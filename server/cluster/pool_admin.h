// Rollouts.DeletePool and Rollouts.ListSamples over a cluster
// (docs/cluster.md, "Deleting and listing a pool"): any member takes the
// call and asks every live member for its own share (local_only).
#ifndef ROLLPACK_SERVER_CLUSTER_POOL_ADMIN_H_
#define ROLLPACK_SERVER_CLUSTER_POOL_ADMIN_H_

#include <functional>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "rollpack/v1/rollouts.pb.h"
#include "server/cluster/cluster.h"
#include "server/store/sample_store.h"
#include "server/store/step_directory.h"

namespace rollpack {

struct ClusterPoolsOptions {
  // Each call to a member (a deletion syncs the member's log).
  absl::Duration member_timeout = absl::Seconds(10);
  // Told of each live step a forced deletion released, as ReleaseStep's
  // caller is (rollpack_steps_released_total counts them too).
  std::function<void(const ReleaseResult&)> on_step_released;
};

// This member's own share of a deletion (a single server's whole one, and
// what a member answers a local_only call with).
absl::StatusOr<v1::MemberPoolDeletion> DeleteLocalPool(SampleStore* store,
                                                       const v1::DeletePoolRequest& request);

// Deletes the pool on every live member and its facts in etcd (model,
// options, schema), so the name can be registered again:
//  1. the cluster's live steps of the pool (etcd's records): without
//     `force`, FAILED_PRECONDITION naming them; every member is then asked
//     to check its share (a dry run: a hold of the pool, a member that does
//     not answer) before anything changes;
//  2. with `force`, the steps are released (StepDirectory::ReleaseStep: as
//     ReleaseStep through any member would);
//  3. the pool's etcd keys are deleted, in one transaction;
//  4. every member deletes its share (durably, on its log).
// A member that fails step 4 makes the call UNAVAILABLE naming it (or its
// refusal's code: a hold taken meanwhile) and saying which shares were
// deleted; the same call again finishes it (also
// once the pool is gone from etcd: a share anywhere is still found).
// NOT_FOUND when neither etcd nor any member has the pool.
absl::StatusOr<v1::DeletePoolResponse> DeletePoolOverCluster(
    Cluster* cluster, StepDirectory* steps, SampleStore* store,
    const v1::DeletePoolRequest& request, const ClusterPoolsOptions& options = {});

// A page of the pool's samples over every live member, each with its owner,
// merged in sample id order (an id held by two members: once per member, in
// member order, never split over two pages). UNAVAILABLE naming a member
// that does not answer (a page without its samples would look complete);
// NOT_FOUND when no member has the pool.
absl::StatusOr<v1::ListSamplesResponse> ListSamplesOverCluster(
    Cluster* cluster, SampleStore* store, const v1::ListSamplesRequest& request,
    const ClusterPoolsOptions& options = {});

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_CLUSTER_POOL_ADMIN_H_
