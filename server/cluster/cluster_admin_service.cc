#include "server/cluster/cluster_admin_service.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "grpcpp/client_context.h"
#include "server/cluster/member_status.h"
#include "server/cluster/peer_calls.h"
#include "server/store/convert.h"

namespace rollpack {

ClusterAdminService::ClusterAdminService(const SampleStore* store, const Authorizer* auth,
                                         bool cluster_mode,
                                         std::function<std::string()> self_address,
                                         metrics::ScrapeRegistry* registry)
    : store_(store),
      auth_(auth),
      cluster_mode_(cluster_mode),
      self_address_(std::move(self_address)) {
  if (registry == nullptr) return;
  registry->AddCollectCallback(
      [this, gauge = &registry->AddGauge(
                 "rollpack_cluster_member_draining",
                 "1 while this member is drained for maintenance (rollpack member drain): it "
                 "refuses new samples and steps take its free samples first; 0 otherwise.")] {
        const Cluster* cluster = cluster_.load();
        gauge->Add({}).Set(cluster != nullptr && cluster->self_drained() ? 1 : 0);
      });
}

absl::StatusOr<Cluster*> ClusterAdminService::Joined() const {
  Cluster* const cluster = cluster_.load();
  if (cluster == nullptr) return absl::UnavailableError("this member is still joining its cluster");
  return cluster;
}

grpc::ServerUnaryReactor* ClusterAdminService::Serve(grpc::CallbackServerContext* context,
                                                     const char* method,
                                                     std::function<absl::Status()> work) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (auth_ != nullptr) {
    if (grpc::Status s = auth_->Check(*context, method); !s.ok()) {
      reactor->Finish(s);
      return reactor;
    }
  }
  calls_.Schedule([reactor, work = std::move(work)] { reactor->Finish(ToGrpcStatus(work())); });
  return reactor;
}

grpc::ServerUnaryReactor* ClusterAdminService::GetClusterStatus(
    grpc::CallbackServerContext* context, const v1::GetClusterStatusRequest* /*request*/,
    v1::ClusterStatus* response) {
  return Serve(context, "/rollpack.v1.ClusterAdmin/GetClusterStatus",
               [this, response]() -> absl::Status {
                 ASSIGN_OR_RETURN(*response, Status());
                 return absl::OkStatus();
               });
}

grpc::ServerUnaryReactor* ClusterAdminService::DrainMember(grpc::CallbackServerContext* context,
                                                           const v1::DrainMemberRequest* request,
                                                           v1::DrainMemberResponse* response) {
  return Serve(context, "/rollpack.v1.ClusterAdmin/DrainMember",
               [this, request, response]() -> absl::Status {
                 ASSIGN_OR_RETURN(*response, SetDrained(request->member(), true));
                 return absl::OkStatus();
               });
}

grpc::ServerUnaryReactor* ClusterAdminService::UndrainMember(grpc::CallbackServerContext* context,
                                                             const v1::DrainMemberRequest* request,
                                                             v1::DrainMemberResponse* response) {
  return Serve(context, "/rollpack.v1.ClusterAdmin/UndrainMember",
               [this, request, response]() -> absl::Status {
                 ASSIGN_OR_RETURN(*response, SetDrained(request->member(), false));
                 return absl::OkStatus();
               });
}

v1::ClusterMemberStatus ClusterAdminService::AskMember(Cluster* cluster,
                                                       const ClusterMember& member,
                                                       bool reread_drain) {
  const absl::Time start = absl::Now();
  if (member.id == cluster->self().id) {
    absl::Status reread = reread_drain ? cluster->RefreshSelfDrained() : absl::OkStatus();
    v1::ClusterMemberStatus status = LocalMemberStatus(*store_, member.id, cluster->self_drained());
    status.set_self(true);
    if (!reread.ok()) status.set_error(reread.ToString());
    return status;
  }
  v1::LocalStatusRequest request;
  request.set_reread_drain(reread_drain);
  v1::ClusterMemberStatus status;
  grpc::ClientContext context;
  SetDeadline(&context, member_timeout_);
  absl::Status answered =
      FromPeer(cluster->MemberStub(member)->LocalStatus(&context, request, &status), member.id,
               "LocalStatus");
  if (!answered.ok()) {
    status.Clear();
    status.set_error(std::string(answered.message()));
  } else if (status.member() != member.id) {
    // Another process answers at that address: its counts are not this
    // member's.
    const std::string answering = status.member();
    status.Clear();
    status.set_error(absl::StrCat("the rollpackd at ", member.address, " says it is member \"",
                                  answering, "\""));
  }
  status.set_member(member.id);
  status.set_answer_micros(absl::ToInt64Microseconds(absl::Now() - start));
  return status;
}

absl::StatusOr<v1::ClusterStatus> ClusterAdminService::Status() {
  v1::ClusterStatus out;
  out.set_cluster_mode(cluster_mode_);
  if (!cluster_mode_) {
    v1::ClusterMemberStatus* self = out.add_members();
    *self = LocalMemberStatus(*store_, self_address_(), /*draining=*/false);
    self->set_live(true);
    self->set_self(true);
    out.set_answered_by(self->member());
    return out;
  }
  ASSIGN_OR_RETURN(Cluster * cluster, Joined());
  out.set_cluster_name(cluster->options().name);
  out.set_answered_by(cluster->self().id);
  v1::EtcdStatus* etcd = out.mutable_etcd();
  for (const std::string& endpoint : cluster->options().etcd.endpoints) {
    etcd->add_endpoints(endpoint);
  }
  // etcd's answer to one read, timed: the drain keys, then the members.
  // While etcd is known to be away (and a quick look agrees), nothing waits
  // for it: the operator sees at once that it is away, since when, and the
  // members as this member last saw them (EtcdClient's budget is 8 s a call).
  const absl::Time asked = absl::Now();
  int64_t revision = 0;
  const bool away =
      !cluster->etcd_reachable() && !cluster->etcd()->Probe(absl::Milliseconds(200));
  absl::StatusOr<std::set<std::string>> drained =
      away ? absl::StatusOr<std::set<std::string>>(cluster->EtcdAway("the cluster's status"))
           : cluster->DrainedMembers(&revision);
  etcd->set_answer_micros(absl::ToInt64Microseconds(absl::Now() - asked));
  etcd->set_reachable(drained.ok());
  etcd->set_revision(revision);
  if (!drained.ok()) etcd->set_error(drained.status().ToString());
  absl::StatusOr<std::vector<ClusterMember>> live =
      drained.ok() ? cluster->Members()
                   : absl::StatusOr<std::vector<ClusterMember>>(drained.status());
  // Every live member and every drained one, by id. Without etcd: the
  // members this member listed while etcd was well, asked directly (each
  // line says whether it answers; live stays false: etcd cannot say).
  std::map<std::string, bool> ids;
  std::set<std::string> ask_anyway;
  if (live.ok()) {
    for (const ClusterMember& m : *live) ids[m.id] = true;
  } else {
    ids[cluster->self().id] = false;
    for (const ClusterMember& m : cluster->LastMembers()) {
      ids.emplace(m.id, false);
      ask_anyway.insert(m.id);
    }
  }
  if (drained.ok()) {
    for (const std::string& id : *drained) ids.emplace(id, false);
  }
  std::vector<std::pair<std::string, bool>> members(ids.begin(), ids.end());
  std::vector<v1::ClusterMemberStatus> lines(members.size());
  ForEachParallel(members.size(), [&](size_t i) {
    const auto& [id, is_live] = members[i];
    if (!is_live && id != cluster->self().id && ask_anyway.count(id) == 0) {
      lines[i].set_member(id);
      lines[i].set_error(
          "no live member key in etcd: a member that stopped, or is gone for good "
          "(rollpack member undrain clears its drain)");
      return;
    }
    lines[i] = AskMember(cluster, ClusterMember{id, id}, /*reread_drain=*/false);
  });
  for (size_t i = 0; i < members.size(); ++i) {
    v1::ClusterMemberStatus& line = lines[i];
    line.set_live(members[i].second);
    line.set_draining(drained.ok() ? drained->count(members[i].first) > 0
                                   : cluster->self_drained());
    *out.add_members() = std::move(line);
  }
  return out;
}

absl::StatusOr<v1::DrainMemberResponse> ClusterAdminService::SetDrained(const std::string& member,
                                                                        bool drained) {
  if (!cluster_mode_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rollpackd at ", self_address_(),
        " is not in cluster mode (no --cluster-etcd): only a "
        "cluster member can be drained, its samples going to steps through the others"));
  }
  ASSIGN_OR_RETURN(Cluster * cluster, Joined());
  RETURN_IF_ERROR(cluster->SetDrained(member, drained));
  v1::DrainMemberResponse response;
  response.set_member(member);
  response.set_draining(drained);
  // The member applies it now rather than at its next renewal.
  *response.mutable_status() = AskMember(cluster, ClusterMember{member, member},
                                         /*reread_drain=*/true);
  response.mutable_status()->set_draining(drained);
  return response;
}

}  // namespace rollpack
