// --step-ttl over a cluster (docs/cluster.md, "Step expiry"). A trainer
// rank streams from whichever member it reaches, so no member alone knows
// that a step is abandoned. One member decides: the first live member by id.
// A step is released when it has been idle here for the TTL (no stream open,
// none started or ended, and known here that long) and every other member
// answers that none of its streams of the step is open or ended within the
// TTL. A member that does not answer stops this round: it may be serving
// the step.
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/clock.h"
#include "server/cluster/cluster_steps.h"
#include "server/cluster/peer_calls.h"
#include "spdlog/spdlog.h"

namespace rollpack {

std::vector<std::pair<std::string, ReleaseResult>> ClusterSteps::ExpireIdleSteps(
    StepActivity* activity, absl::Duration ttl) {
  std::vector<std::pair<std::string, ReleaseResult>> expired;
  absl::StatusOr<Cluster*> joined = Joined();
  if (!joined.ok()) return expired;
  Cluster* const cluster = *joined;
  absl::StatusOr<std::vector<ClusterMember>> members = cluster->Members();
  if (!members.ok() || members->empty()) return expired;
  // Steps made here before joining are served here alone: this member's
  // streams are all of them, whichever member expires the cluster's.
  std::vector<std::string> own;
  for (const LiveStep& s : store_->ListSteps("")) own.push_back(s.step->step_id);
  for (const std::string& id : activity->Idle(own, absl::Now(), ttl)) {
    if (!activity->StillIdle(id, absl::Now(), ttl)) continue;
    absl::StatusOr<ReleaseResult> released = ReleaseStep(id);
    if (released.ok()) expired.emplace_back(id, *released);
  }
  // Members() is in id order. While membership changes two members may each
  // see themselves first for a moment; a step both release is released once
  // (the second finds no record) but may be counted by both.
  if (members->front().id != cluster->self().id) return expired;
  const absl::Time cutoff = absl::Now();
  if (!RefreshCensus().ok()) return expired;  // etcd away: nothing is decided
  std::vector<std::string> live;
  {
    absl::MutexLock lock(&census_mu_);
    for (const auto& [id, entry] : census_) {
      if (entry.live) live.push_back(id);
    }
  }
  std::vector<std::string> all = live;
  all.insert(all.end(), own.begin(), own.end());
  activity->Retain(all, cutoff);
  const absl::Time now = absl::Now();
  std::vector<std::string> idle = activity->Idle(live, now, ttl);
  std::set<std::string> busy;
  if (!idle.empty()) {
    v1::StepStreamsRequest request;
    for (const std::string& id : idle) request.add_step_ids(id);
    for (const ClusterMember& member : *members) {
      if (member.id == cluster->self().id) continue;
      v1::StepStreamsResponse response;
      grpc::ClientContext context;
      SetDeadline(&context, options_.member_timeout);
      const absl::Status asked = FromPeer(
          cluster->MemberStub(member)->StepStreams(&context, request, &response), member.id,
          "StepStreams");
      if (!asked.ok()) {
        spdlog::warn("rollpackd: --step-ttl: {}; no cluster step expires until it answers",
                     asked.ToString());
        return expired;
      }
      for (const v1::StepStreams& s : response.steps()) {
        const bool recent = s.last_stream_unix_nanos() > 0 &&
                            now - absl::FromUnixNanos(s.last_stream_unix_nanos()) < ttl;
        if (s.streams_open() > 0 || recent) busy.insert(s.step_id());
      }
    }
  }
  for (const std::string& id : idle) {
    // Checked again right before: a stream here may have started since.
    if (busy.count(id) || !activity->StillIdle(id, absl::Now(), ttl)) continue;
    absl::StatusOr<ReleaseResult> released = ReleaseStep(id);
    if (released.ok()) expired.emplace_back(id, *released);
  }
  return expired;
}

}  // namespace rollpack
