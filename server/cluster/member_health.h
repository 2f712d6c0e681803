// Which members have joined the cluster and whether etcd lists them now, as
// this member's keep-alive thread sees the member list change: what the
// "cluster member ... joined / left / lost" log lines and the metric
// rollpack_cluster_member_up{member} say (docs/cluster.md, "When etcd is
// away"; docs/operations.md).
//
// A member that stops cleanly revokes its member key and its roster entry
// (cluster.h) at once: it left, and is no longer tracked. One whose member
// key ran out while its roster entry lives (killed, frozen, cut off from
// etcd) is lost: tracked as down until it joins again or its roster entry
// runs out too (the roster lease, 10 minutes), when it is forgotten.
#ifndef ROLLPACK_SERVER_CLUSTER_MEMBER_HEALTH_H_
#define ROLLPACK_SERVER_CLUSTER_MEMBER_HEALTH_H_

#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

namespace rollpack {

class MemberHealth {
 public:
  struct Event {
    enum class Kind { kJoined, kLeft, kLost };
    Kind kind;
    std::string member;
  };

  // Whether the next Update needs the roster (the ids with a roster entry)
  // to decide: the first one, or a member up until now is missing from
  // `listed`.
  bool NeedsRoster(const std::set<std::string>& listed) const;
  // Whether lost members are tracked (each until its roster entry runs out,
  // which an Update given the roster finds).
  bool HasLost() const;

  // etcd lists `listed` now. `roster`: read when NeedsRoster asked for it
  // (nullopt otherwise: nothing missing is decided). `rejoin_window`: etcd
  // gave trouble a moment ago and a member missing from `listed` may be one
  // whose lease etcd revoked while it was away and which joins again within
  // moments (Cluster::Members): it is neither lost nor left yet. The first
  // call takes `listed` (and the roster's other entries, as lost) as they
  // are, with no event.
  std::vector<Event> Update(const std::set<std::string>& listed,
                            const std::optional<std::set<std::string>>& roster,
                            bool rejoin_window);

  // Every tracked member: true while etcd lists it, false when it is lost.
  const std::map<std::string, bool>& up() const { return up_; }
  bool started() const { return started_; }

 private:
  bool started_ = false;
  std::map<std::string, bool> up_;
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_CLUSTER_MEMBER_HEALTH_H_
