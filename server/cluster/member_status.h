// One member's line of ClusterAdmin.GetClusterStatus (cluster_admin.proto),
// made from its own store: what the member answering the status reports for
// itself, and what every other member answers Member.LocalStatus with.
#ifndef ROLLPACK_SERVER_CLUSTER_MEMBER_STATUS_H_
#define ROLLPACK_SERVER_CLUSTER_MEMBER_STATUS_H_

#include <string>

#include "rollpack/v1/cluster_admin.pb.h"
#include "server/store/sample_store.h"

namespace rollpack {

// `member`'s pools (every pool registered in `store`, by name) with their
// counts and the sums, its version and `draining` as it applies it
// (reports_draining). reachable is set; live, draining (the etcd view) and
// answer_micros are the caller's to fill.
v1::ClusterMemberStatus LocalMemberStatus(const SampleStore& store, const std::string& member,
                                          bool draining);

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_CLUSTER_MEMBER_STATUS_H_
