// Rollouts.AnnotateSamples over a cluster (../shared/spec/lifecycle.md
// section 6): any member takes the call for samples on any member, all or
// nothing. The member finds each sample's owner (ListFreeSamples with the
// ids, as an explicit-id CreateStep does), prepares every owner's share
// (Member.PrepareAnnotations: checked as a single server checks it, the
// samples reserved), then commits every share, or aborts every share when
// one owner refused.
#ifndef ROLLPACK_SERVER_CLUSTER_CLUSTER_ANNOTATIONS_H_
#define ROLLPACK_SERVER_CLUSTER_CLUSTER_ANNOTATIONS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/cluster/cluster.h"
#include "server/store/sample_store.h"
#include "server/store/scalar_annotation.h"

namespace rollpack {

struct ClusterAnnotateOptions {
  // Each call to a member.
  absl::Duration member_timeout = absl::Seconds(5);
  // How long a prepared share holds its samples at most (a member that
  // took the call and died leaves nothing reserved past it).
  absl::Duration reservation_ttl = absl::Seconds(30);
};

// The refusals of SampleStore::AnnotateSamples, named by the member that
// gave them; UNAVAILABLE naming a member that does not answer (nothing is
// applied when it fails to answer a prepare). When a commit goes
// unanswered after other shares were committed, UNAVAILABLE says so: the
// same call again completes it (what was applied is a no-op the second time).
// Returns the number of entries, as a single server does.
absl::StatusOr<int32_t> AnnotateOverCluster(Cluster* cluster, SampleStore* store,
                                            const std::string& pool,
                                            std::vector<ScalarAnnotation> annotations,
                                            const ClusterAnnotateOptions& options = {});

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_CLUSTER_CLUSTER_ANNOTATIONS_H_
