// The fan-out every phase of a cluster step's protocol shares (cluster_steps.h:
// hold, drop, confirm, release, and the routing commit's check and store): one
// call to each member that owns samples of the step, all at once, this
// member's own share straight to its store.
#ifndef ROLLPACK_SERVER_CLUSTER_STEP_OWNERS_H_
#define ROLLPACK_SERVER_CLUSTER_STEP_OWNERS_H_

#include "absl/functional/function_ref.h"
#include "absl/time/time.h"
#include "grpcpp/client_context.h"
#include "rollpack/v1/member.grpc.pb.h"
#include "rollpack/v1/member.pb.h"
#include "server/cluster/cluster.h"

namespace rollpack {

// Calls each member of `record` that owns samples of the step (a member
// without any is not called), each on a thread of its own, and returns when
// all have: `local(i)` where member i is this one, else `remote(i, stub,
// context)` with the context's deadline `timeout` from the call. `i` indexes
// record.members; each call writes only its own slot of what it fills.
void ForEachOwner(
    Cluster* cluster, const v1::ClusterStepRecord& record, absl::Duration timeout,
    absl::FunctionRef<void(int i)> local,
    absl::FunctionRef<void(int i, v1::Member::Stub* stub, grpc::ClientContext* context)> remote);

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_CLUSTER_STEP_OWNERS_H_
