// The keep-alive thread's view of the member list (member_health.h): log
// lines when members join, leave or are lost, and what the metric
// rollpack_cluster_member_up reports.
#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "server/cluster/cluster.h"
#include "spdlog/spdlog.h"

namespace rollpack {
namespace {

// Lines per list change: after an etcd outage many members may join again
// at once.
constexpr int kMaxLinesPerChange = 10;

}  // namespace

std::vector<ClusterMember> Cluster::LastMembers() const {
  // Every member that had joined and was not lost, as the keep-alive thread
  // saw the list: right after etcd revoked the leases that ran out while it
  // was away, etcd lists only the members that have joined again yet, and
  // the settled list may predate the last join.
  {
    absl::MutexLock lock(&health_mu_);
    if (member_health_.started()) {
      std::vector<ClusterMember> members;
      for (const auto& [id, up] : member_health_.up()) {
        if (up) members.push_back({id, id});  // a member's id is its address
      }
      return members;
    }
  }
  absl::MutexLock lock(&mu_);
  return settled_;
}

std::map<std::string, bool> Cluster::MemberUp() const {
  absl::MutexLock lock(&health_mu_);
  return member_health_.up();
}

void Cluster::WatchMembers(const std::vector<ClusterMember>& listed) {
  std::set<std::string> ids;
  for (const ClusterMember& m : listed) ids.insert(m.id);
  bool rejoin_window = false;
  {
    absl::MutexLock lock(&mu_);
    rejoin_window = absl::Now() < RejoinDeadline();
  }
  // The roster tells a member that left (it revoked its entry) from one
  // that was lost (its entry outlives its key): read when a member is
  // missing, and now and then while lost ones wait for their entries to
  // run out (the roster lease's renewal period).
  const absl::Duration roster_period =
      std::max(options_.roster_ttl, 10 * options_.lease_ttl) / 10;
  bool read_roster = false;
  {
    absl::MutexLock lock(&health_mu_);
    read_roster = (member_health_.NeedsRoster(ids) && !rejoin_window) ||
                  !member_health_.started() ||
                  (member_health_.HasLost() && absl::Now() - roster_checked_ >= roster_period);
  }
  std::optional<std::set<std::string>> roster;
  if (read_roster) {
    absl::StatusOr<std::map<std::string, int64_t>> entries = Roster();
    // Unread, nothing missing is decided: the next renewal asks again.
    if (entries.ok()) {
      roster.emplace();
      for (const auto& [id, revision] : *entries) roster->insert(id);
    }
  }
  absl::MutexLock lock(&health_mu_);
  if (roster.has_value()) roster_checked_ = absl::Now();
  if (!member_health_.started()) {
    member_health_.Update(ids, roster, rejoin_window);
    spdlog::info("rollpackd: cluster \"{}\": {} member(s): {}", options_.name, ids.size(),
                 absl::StrJoin(ids, ", "));
    return;
  }
  const std::vector<MemberHealth::Event> events = member_health_.Update(ids, roster, rejoin_window);
  int logged = 0;
  for (const MemberHealth::Event& e : events) {
    if (logged++ == kMaxLinesPerChange) {
      spdlog::info("rollpackd: cluster \"{}\": {} more member changes; {} member(s) now",
                   options_.name, events.size() - kMaxLinesPerChange, ids.size());
      break;
    }
    switch (e.kind) {
      case MemberHealth::Event::Kind::kJoined:
        spdlog::info("rollpackd: cluster member {} joined ({} member(s))", e.member, ids.size());
        break;
      case MemberHealth::Event::Kind::kLeft:
        spdlog::info("rollpackd: cluster member {} left ({} member(s))", e.member, ids.size());
        break;
      case MemberHealth::Event::Kind::kLost:
        spdlog::warn("rollpackd: cluster member {} lost: its lease ran out without it leaving "
                     "(killed, frozen or cut off from etcd); {} member(s)",
                     e.member, ids.size());
        break;
    }
  }
}

}  // namespace rollpack
