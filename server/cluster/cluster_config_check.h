// Start-up checks of a member's cluster settings that catch mistakes which
// otherwise form a working but wrong cluster (docs/cluster.md, "Mistakes
// refused or warned about"):
//
// - CheckAdvertisable: a wildcard --listen (0.0.0.0, [::]) without
//   --cluster-advertise, or a wildcard --cluster-advertise, is refused: the
//   member would advertise 127.0.0.1 (what a wildcard listen reads as
//   locally), and every other member would dial itself.
// - LoopbackAdvertiseWarning: a member that advertises a loopback address
//   while etcd is elsewhere is reachable by no member on another host; a
//   warning, since one host may run the whole cluster with a remote etcd.
// - WarnIfClusterLooksMisnamed (at join): no other member of this cluster
//   in etcd but members of other clusters: a typo'd --cluster-name forms a
//   separate cluster of one. A warning, since the first member of a new
//   cluster looks the same.
#ifndef ROLLPACK_SERVER_CLUSTER_CLUSTER_CONFIG_CHECK_H_
#define ROLLPACK_SERVER_CLUSTER_CLUSTER_CONFIG_CHECK_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace rollpack {

class KeyValueStore;

// Whether `host` (of a host:port, brackets kept) listens on every address.
bool IsWildcardHost(const std::string& host);
// Whether `host` is a loopback address or "localhost".
bool IsLoopbackHost(const std::string& host);

// INVALID_ARGUMENT naming the flags when the member's advertised address
// would be a wildcard's stand-in; OK otherwise.
absl::Status CheckAdvertisable(const std::string& listen, const std::string& advertise);

// The warning to log when the address advertised (`advertise`, else the
// --listen one) is loopback and an etcd endpoint is not; nullopt otherwise.
std::optional<std::string> LoopbackAdvertiseWarning(const std::string& listen,
                                                    const std::string& advertise,
                                                    const std::vector<std::string>& etcd);

// Members per cluster name among etcd keys ("/<name>/members/<id>" and
// "/<name>/roster/<id>"), `self_id` of `name` not counted.
std::map<std::string, int> MembersByCluster(const std::vector<std::string>& keys,
                                            const std::string& name, const std::string& self_id);

// The warning for a member of `name` that etcd shows alone while other
// clusters have members there; nullopt when it is not alone or nobody else
// is there.
std::optional<std::string> MisnamedClusterWarning(const std::map<std::string, int>& members,
                                                  const std::string& name);

// Reads the member keys etcd holds and logs MisnamedClusterWarning's
// warning. Quiet when etcd denies reading outside the cluster's prefix
// (etcd auth) or fails: it is advice, never a reason not to join.
void WarnIfClusterLooksMisnamed(KeyValueStore& etcd, const std::string& name,
                                const std::string& self_id);

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_CLUSTER_CLUSTER_CONFIG_CHECK_H_
