// Cluster's drain keys (docs/cluster.md, "Maintenance: draining a member"):
// /<cluster>/drained/<id>, written by whichever member takes DrainMember,
// read by the drained member itself (to refuse new samples) and by the
// status view. The member's free samples are taken first by steps: each
// member says it is drained in its ListFreeSamples answers
// (cluster_choice.cc).
#include <algorithm>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "server/cluster/cluster.h"
#include "spdlog/spdlog.h"

namespace rollpack {

bool Cluster::ValidDrainValue(const std::string& key, const std::string& member,
                              const std::string& value) {
  // What SetDrained writes: the id, then a line of its own. Anything else
  // (a key put by hand with another value) drains nobody.
  if (!member.empty() && value.substr(0, value.find('\n')) == member) return true;
  absl::MutexLock lock(&mu_);
  if (ignored_keys_.insert(key).second) {
    spdlog::warn(
        "rollpackd: etcd key {} does not hold the id it names ({}); no member is "
        "drained by it",
        key, member);
  }
  return false;
}

absl::Status Cluster::SetDrained(const std::string& member, bool drained) {
  if (member.empty()) {
    return absl::InvalidArgumentError(
        "member is empty: give its host:port as the cluster lists it");
  }
  const std::string key = Key("drained", member);
  ASSIGN_OR_RETURN(std::vector<ClusterMember> members, ListMembers());
  const bool live = std::any_of(members.begin(), members.end(),
                                [&](const ClusterMember& m) { return m.id == member; });
  if (drained) {
    if (!live) {
      std::vector<std::string> ids;
      for (const ClusterMember& m : members) ids.push_back(m.id);
      return absl::NotFoundError(absl::StrCat("member ", member,
                                              " is not a live member of cluster \"", options_.name,
                                              "\" (live: ", absl::StrJoin(ids, ", "), ")"));
    }
    RETURN_IF_ERROR(etcd_->Put(
        key, absl::StrCat(member, "\n", absl::FormatTime(absl::Now()), " through ", self_.id)));
    spdlog::warn(
        "rollpackd: member {} drained for maintenance (through this member): it "
        "refuses new samples and steps take its free samples first",
        member);
    return absl::OkStatus();
  }
  ASSIGN_OR_RETURN(std::optional<std::string> held, etcd_->Get(key));
  if (!held.has_value()) {
    if (live) return absl::OkStatus();  // not drained: nothing to do
    return absl::NotFoundError(absl::StrCat("member ", member, " is neither live in cluster \"",
                                            options_.name, "\" nor drained"));
  }
  RETURN_IF_ERROR(etcd_->Delete(key));
  spdlog::warn("rollpackd: member {} undrained (through this member): it accepts new samples",
               member);
  return absl::OkStatus();
}

absl::StatusOr<std::set<std::string>> Cluster::DrainedMembers(int64_t* revision) {
  const std::string prefix = Key("drained", "");
  ASSIGN_OR_RETURN(std::vector<EtcdKeyValue> kvs, etcd_->ListPrefix(prefix, revision));
  std::set<std::string> drained;
  for (const EtcdKeyValue& kv : kvs) {
    std::string id = kv.key.substr(prefix.size());
    if (ValidDrainValue(kv.key, id, kv.value)) drained.insert(std::move(id));
  }
  return drained;
}

absl::Status Cluster::RefreshSelfDrained() {
  const std::string key = Key("drained", self_.id);
  ASSIGN_OR_RETURN(std::optional<std::string> held, etcd_->Get(key));
  const bool drained = held.has_value() && ValidDrainValue(key, self_.id, *held);
  if (self_drained_.exchange(drained) != drained) {
    if (drained) {
      spdlog::warn(
          "rollpackd: this member ({}) is drained for maintenance: new samples are "
          "refused (UNAVAILABLE) and steps take its free samples first",
          self_.id);
    } else {
      spdlog::warn("rollpackd: this member ({}) is no longer drained: it accepts new samples",
                   self_.id);
    }
  }
  return absl::OkStatus();
}

absl::Status Cluster::AcceptsNewSamples() const {
  if (!self_drained()) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat("member ", self_.id,
                   " is drained for maintenance: it takes no new samples; send them "
                   "to another member (rollpack member undrain ",
                   self_.id, " ends the drain)"));
}

}  // namespace rollpack
