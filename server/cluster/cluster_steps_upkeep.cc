// ClusterSteps' releases and upkeep on each member (cluster_steps.h):
// ReleaseStep, releases decided while this member was away, holds whose
// planner never committed, and cached plans of steps released elsewhere
// (one thread, every tick).
#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "proto/wire/deterministic_bytes.h"
#include "server/cluster/cluster_steps.h"
#include "server/cluster/group_census.h"
#include "server/cluster/peer_calls.h"
#include "server/cluster/step_owners.h"
#include "server/store/names.h"
#include "spdlog/spdlog.h"

namespace rollpack {

absl::StatusOr<ReleaseResult> ClusterSteps::ReleaseStep(const std::string& step_id) {
  RETURN_IF_ERROR(ValidateName("step_id", step_id, kMaxStepIdBytes));
  if (store_->GetStep(step_id).ok()) {
    absl::StatusOr<ReleaseResult> released = store_->ReleaseStep(step_id);
    uploads_.DropStale();
    return released;
  }
  ASSIGN_OR_RETURN(Cluster * cluster, Joined());
  ASSIGN_OR_RETURN(v1::ClusterStepRecord record, ReadRecord(cluster, step_id));
  std::vector<bool> owns(record.members_size(), false);
  for (int32_t o : record.owner()) owns[o] = true;
  // Pending releases first: whatever happens next, every owner finds out.
  for (int i = 0; i < record.members_size(); ++i) {
    if (owns[i]) {
      RETURN_IF_ERROR(cluster->etcd()->Put(ReleaseKey(cluster, record.members(i), step_id), ""));
    }
  }
  RETURN_IF_ERROR(cluster->etcd()->Delete(StepKey(cluster, step_id)));
  {
    absl::MutexLock lock(&mu_);
    cache_.erase(step_id);
  }
  std::vector<absl::StatusOr<ReleaseResult>> results(record.members_size(), ReleaseResult{});
  // Released, or not held there (released already): the pending release
  // is done. Otherwise the owner finishes it when it is back.
  auto settle = [&](int i) {
    const std::string& member = record.members(i);
    if (results[i].ok() || absl::IsNotFound(results[i].status())) {
      cluster->etcd()->Delete(ReleaseKey(cluster, member, step_id)).IgnoreError();
    } else {
      spdlog::warn("rollpackd: step \"{}\": member {} will release its samples when it is back: {}",
                   step_id, member, results[i].status().ToString());
    }
  };
  ForEachOwner(
      cluster, record, options_.member_timeout,
      [&](int i) {
        results[i] = store_->ReleaseStep(step_id);
        settle(i);
      },
      [&](int i, v1::Member::Stub* stub, grpc::ClientContext* context) {
        v1::StepHoldRequest request;
        request.set_step_id(step_id);
        v1::DropHoldResponse response;
        absl::Status s = FromPeer(stub->ReleaseHold(context, request, &response),
                                  record.members(i), "ReleaseHold");
        if (s.ok()) {
          results[i] = ReleaseResult{response.released_samples(), response.freed_bytes(),
                                     response.returned_samples()};
        } else {
          results[i] = s;
        }
        settle(i);
      });
  uploads_.DropStale();  // this member's R2 stage of the step gives its memory back
  ReleaseResult total;
  for (const auto& r : results) {
    if (!r.ok()) continue;
    total.released_samples += r->released_samples;
    total.freed_bytes += r->freed_bytes;
    total.returned_samples += r->returned_samples;
  }
  return total;
}

void ClusterSteps::BackgroundLoop() {
  while (true) {
    Cluster* cluster = cluster_.load();
    // Releases before stale holds: a hold whose step was released while
    // this member was away must be deleted, not given back.
    if (cluster != nullptr && !lost_shares_reported_) ReportLostShares(cluster);
    if (cluster != nullptr && FinishPendingReleases(cluster)) {
      ResolveStaleHolds(cluster);
      ReleaseOrphanedHolds(cluster);
      PruneCache(cluster);
      RefreshCensus().IgnoreError();  // etcd away: the counts read last stand
      DropExpiredGroups(cluster);
    }
    // R2 stages of holds released or dropped meanwhile give their memory back.
    uploads_.DropStale();
    absl::MutexLock lock(&mu_);
    if (mu_.AwaitWithTimeout(absl::Condition(&stop_), options_.tick)) return;
  }
}

bool ClusterSteps::FinishPendingReleases(Cluster* cluster) {
  const std::string prefix = ReleaseKey(cluster, cluster->self().id, "");
  absl::StatusOr<std::vector<std::pair<std::string, std::string>>> pending =
      cluster->etcd()->GetPrefix(prefix);
  if (!pending.ok()) return false;  // etcd away: next tick
  for (const auto& [key, unused] : *pending) {
    const std::string step_id = key.substr(prefix.size());
    // Only once the release is decided (the record deleted): a release
    // that failed half-way leaves the step live, and its samples with it.
    absl::StatusOr<int64_t> live = cluster->etcd()->CreateRevision(StepKey(cluster, step_id));
    if (!live.ok()) return false;
    if (*live != 0) continue;
    absl::StatusOr<ReleaseResult> released = store_->ReleaseStep(step_id);
    if (released.ok() || absl::IsNotFound(released.status())) {
      if (released.ok()) {
        spdlog::info("rollpackd: step \"{}\": released {} samples held here (a release pending "
                     "while this member was away)",
                     step_id, released->released_samples);
      }
      cluster->etcd()->Delete(key).IgnoreError();
    }
  }
  return true;
}

void ClusterSteps::ResolveStaleHolds(Cluster* cluster) {
  for (const std::string& step_id : store_->UnconfirmedHolds(options_.hold_grace)) {
    v1::ClusterStepRecord tombstone;
    tombstone.set_step_id(step_id);
    tombstone.set_aborted_by(cluster->self().id);
    tombstone.set_created_unix_nanos(absl::GetCurrentTimeNanos());
    const std::string bytes = DeterministicBytes(tombstone);
    absl::StatusOr<int64_t> lease = cluster->etcd()->GrantLease(options_.tombstone_ttl);
    if (!lease.ok()) return;
    bool created = false;
    absl::StatusOr<std::string> holder =
        cluster->etcd()->CreateIfAbsent(StepKey(cluster, step_id), bytes, &created, *lease);
    if (!holder.ok()) return;
    // A retried create whose first try committed finds this very tombstone.
    if (*holder == bytes) created = true;
    if (!created) cluster->etcd()->RevokeLease(*lease).IgnoreError();
    v1::ClusterStepRecord record;
    const bool is_record = !created && record.ParseFromString(*holder) &&
                           record.aborted_by().empty();
    bool ours = false;  // the record of the attempt that took this hold
    if (is_record && store_->HoldAttempt(step_id) == record.created_unix_nanos()) {
      for (const std::string& m : record.members()) ours = ours || m == cluster->self().id;
    }
    if (ours) {
      store_->ConfirmHold(step_id).IgnoreError();
      continue;
    }
    // Not committed (or committed by another attempt). Released meanwhile
    // by a ReleaseStep elsewhere: delete, never give back.
    absl::StatusOr<std::optional<std::string>> released =
        cluster->etcd()->Get(ReleaseKey(cluster, cluster->self().id, step_id));
    if (!released.ok()) return;
    if (released->has_value() && !is_record) {
      store_->ReleaseStep(step_id).IgnoreError();
      cluster->etcd()->Delete(ReleaseKey(cluster, cluster->self().id, step_id)).IgnoreError();
      continue;
    }
    spdlog::warn("rollpackd: step \"{}\": the attempt that held samples here was never "
                 "committed; they are free again",
                 step_id);
    store_->DropHold(step_id, store_->HoldAttempt(step_id)).IgnoreError();
  }
}

void ClusterSteps::ReleaseOrphanedHolds(Cluster* cluster) {
  const std::vector<std::string> unconfirmed = store_->UnconfirmedHolds(absl::ZeroDuration());
  std::map<std::string, absl::Time> still_missing;
  const absl::Time now = absl::Now();
  for (const std::string& step_id : store_->HoldIds()) {
    if (std::find(unconfirmed.begin(), unconfirmed.end(), step_id) != unconfirmed.end()) {
      continue;  // ResolveStaleHolds' case
    }
    absl::StatusOr<int64_t> live = cluster->etcd()->CreateRevision(StepKey(cluster, step_id));
    if (!live.ok()) return;  // etcd away: nothing is decided
    if (*live != 0) continue;
    auto seen = record_missing_since_.find(step_id);
    const absl::Time since = seen == record_missing_since_.end() ? now : seen->second;
    if (now - since < options_.hold_grace) {
      still_missing[step_id] = since;
      continue;
    }
    absl::StatusOr<ReleaseResult> released = store_->ReleaseStep(step_id);
    if (released.ok()) {
      spdlog::warn("rollpackd: step \"{}\": its record left etcd without a ReleaseStep; its {} "
                   "samples held here are released",
                   step_id, released->released_samples);
    }
  }
  record_missing_since_ = std::move(still_missing);
}

void ClusterSteps::PruneCache(Cluster* cluster) {
  std::vector<std::pair<std::string, int64_t>> known;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, cached] : cache_) known.emplace_back(id, cached->revision);
  }
  // Plans of records gone or put over since (their pulled samples with
  // them); a step still looked up is planned again from its record.
  for (const auto& [id, built_from] : known) {
    absl::StatusOr<int64_t> revision = cluster->etcd()->ModRevision(StepKey(cluster, id));
    if (!revision.ok()) return;
    if (*revision != built_from) {
      absl::MutexLock lock(&mu_);
      auto it = cache_.find(id);
      if (it != cache_.end() && it->second->revision == built_from) cache_.erase(it);
    }
  }
}

void ClusterSteps::DropExpiredGroups(Cluster* cluster) {
  // A group complete over the cluster but not here stays a candidate: its
  // check (a GetPool of every member) runs at most every few seconds.
  const absl::Time now = absl::Now();
  if (now < next_group_check_) return;
  const std::map<std::string, std::vector<std::string>> expired = store_->ExpiredGroups(now);
  if (expired.empty()) return;
  next_group_check_ = now + absl::Seconds(2);
  absl::StatusOr<std::vector<ClusterMember>> members = cluster->Members();
  if (!members.ok()) return;
  for (const auto& [pool, candidates] : expired) {
    // Sealed samples of each group over every member.
    struct Share {
      int32_t size = 0;
      int64_t sealed = 0;
      // The first member in id order holding sealed samples of it: the one
      // that counts the drop, so a group over k members is counted once.
      // (A member with only open samples of it never puts it forward: its
      // clock starts at a sealed one.)
      std::string first_holder;
    };
    absl::flat_hash_map<std::string, Share> shares;
    bool everyone = true;
    std::vector<bool> hold_complete_groups(members->size());
    auto add = [&](const std::string& group, int32_t size, int64_t count,
                   const std::string& member) {
      Share& share = shares[group];
      share.size = size;
      share.sealed += count;
      if (share.first_holder.empty() && count > 0) share.first_holder = member;
    };
    for (size_t i = 0; i < members->size(); ++i) {
      const ClusterMember& member = (*members)[i];
      if (member.id == cluster->self().id) {
        absl::StatusOr<PoolStats> stats = store_->GetPool(pool);
        if (!stats.ok()) {
          everyone = false;
          break;
        }
        for (const GroupShareStats& g : stats->incomplete_groups) {
          add(g.group_id, g.group_size, g.num_sealed, member.id);
        }
        hold_complete_groups[i] = stats->num_complete_groups > 0;
        continue;
      }
      absl::StatusOr<v1::PoolInfo> share = cluster->GetPoolOf(member, pool);
      if (absl::IsNotFound(share.status())) continue;  // holds none of the pool
      if (!share.ok()) {
        everyone = false;  // a member away may hold the missing samples
        break;
      }
      for (const v1::GroupShare& g : share->incomplete_group_shares()) {
        add(g.group_id(), g.group_size(), g.num_sealed(), member.id);
      }
      hold_complete_groups[i] = share->num_complete_groups() > 0;
    }
    if (!everyone) continue;
    // Only the group's first holder acts: it asks the other holders to
    // drop their shares, then drops (and counts) its own. Another member
    // whose clock ran out first waits for it.
    std::vector<std::string> doomed;
    for (const std::string& group : candidates) {
      auto it = shares.find(group);
      if (it == shares.end() || it->second.sealed >= it->second.size) continue;
      if (it->second.first_holder == cluster->self().id) doomed.push_back(group);
    }
    if (doomed.empty()) continue;
    // A group complete on a member that did not list it, with more samples
    // elsewhere, is over-full: the cluster holds at least its size, so it
    // is never dropped as incomplete. Unknown (a member away): none is.
    absl::StatusOr<absl::flat_hash_map<std::string, int>> complete_holders =
        CountCompleteHolders(*cluster, *store_, *members, hold_complete_groups, pool, doomed);
    if (!complete_holders.ok()) continue;
    doomed.erase(std::remove_if(doomed.begin(), doomed.end(),
                                [&](const std::string& group) {
                                  return complete_holders->contains(group);
                                }),
                 doomed.end());
    if (doomed.empty()) continue;
    bool others_dropped = true;
    for (const ClusterMember& member : *members) {
      if (member.id == cluster->self().id) continue;
      v1::DropGroupsRequest request;
      request.set_pool(pool);
      for (const std::string& group : doomed) request.add_group_ids(group);
      v1::DropGroupsResponse response;
      grpc::ClientContext context;
      SetDeadline(&context, options_.member_timeout);
      absl::Status s = FromPeer(cluster->MemberStub(member)->DropGroups(&context, request, &response),
                                member.id, "DropGroups");
      if (!s.ok() && !absl::IsNotFound(s)) {
        spdlog::warn("rollpackd: pool \"{}\": dropping expired groups: {}", pool, s.ToString());
        others_dropped = false;
      }
    }
    // Counted once every share is gone, so that a retry does not count twice.
    if (!others_dropped) continue;
    absl::StatusOr<DropResult> dropped = store_->DropGroups(pool, doomed, /*count=*/true);
    if (dropped.ok() && dropped->groups > 0) {
      spdlog::warn("rollpackd: pool \"{}\": dropped {} groups ({} samples held here) still "
                   "incomplete over the cluster after incomplete_group_timeout_ms",
                   pool, dropped->groups, dropped->group_samples);
    }
  }
}

}  // namespace rollpack
