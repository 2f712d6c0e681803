// RolloutsService's whole-pool calls (rollouts_service.h): DeletePool and
// ListSamples, on a single server and through any member of a cluster
// (server/cluster/pool_admin.h).
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "server/cluster/pool_admin.h"
#include "server/ingest/rollouts_service.h"
#include "server/ops/call_log.h"
#include "server/store/convert.h"
#include "server/store/sample_pages.h"

namespace rollpack {
namespace {

constexpr char kDeletePool[] = "/rollpack.v1.Rollouts/DeletePool";
constexpr char kListSamples[] = "/rollpack.v1.Rollouts/ListSamples";

}  // namespace

grpc::ServerUnaryReactor* RolloutsService::DeletePool(grpc::CallbackServerContext* context,
                                                      const v1::DeletePoolRequest* request,
                                                      v1::DeletePoolResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (auth_ != nullptr) {
    // A member's certificate deletes its peer's share only: the deletion of
    // the whole pool takes the operator's (admin) token.
    grpc::Status s;
    if (request->local_only()) {
      s = auth_->Check(*context, kDeletePool);
    } else {
      const auto& md = context->client_metadata();
      const auto it = md.find("authorization");
      s = auth_->CheckHeader(
          it == md.end() ? std::string() : std::string(it->second.data(), it->second.size()),
          kDeletePool);
    }
    if (!s.ok()) {
      reactor->Finish(s);
      return reactor;
    }
  }
  absl::StatusOr<v1::DeletePoolResponse> deleted = DeletePoolHere(*request);
  // Whatever the outcome, a pool no longer here keeps no metric series.
  if (metrics_ != nullptr && absl::IsNotFound(store_->GetModel(request->pool()).status())) {
    metrics_->ForgetPool(request->pool());
  }
  if (deleted.ok()) {
    *response = *std::move(deleted);
    if (!request->local_only() && !request->dry_run()) {
      AnnotateCall(context, absl::StrCat("pool \"", request->pool(), "\" deleted: ",
                                         response->deleted_samples(), " samples, ",
                                         response->deleted_bytes(), " bytes, ",
                                         response->released_steps_size(), " steps released"));
    }
  }
  reactor->Finish(ToGrpcStatus(deleted.status()));
  return reactor;
}

absl::StatusOr<v1::DeletePoolResponse> RolloutsService::DeletePoolHere(
    const v1::DeletePoolRequest& request) {
  v1::DeletePoolResponse response;
  response.set_pool(request.pool());
  response.set_dry_run(request.dry_run());
  if (!cluster_mode_) {
    // Forced: the live steps are released as ReleaseStep would (their R2
    // stages give their memory back too); a step created meanwhile is ended
    // by the store with the pool, under the lock that deletes it.
    std::set<std::string> released;
    if (request.force() && !request.dry_run() && steps_ != nullptr) {
      absl::StatusOr<std::vector<LiveStep>> live = steps_->ListSteps(request.pool());
      for (const LiveStep& step : live.ok() ? *live : std::vector<LiveStep>()) {
        absl::StatusOr<ReleaseResult> r = steps_->ReleaseStep(step.step->step_id);
        if (!r.ok()) continue;
        released.insert(step.step->step_id);
        if (metrics_ != nullptr) metrics_->OnStepReleased(r->released_samples, r->freed_bytes);
      }
    }
    ASSIGN_OR_RETURN(SampleStore::PoolDeletion deletion,
                     store_->DeletePool(request.pool(), request.force(), request.dry_run()));
    response.set_deleted_samples(deletion.samples);
    response.set_deleted_bytes(deletion.bytes);
    released.insert(deletion.ended_steps.begin(), deletion.ended_steps.end());
    for (const std::string& id : released) response.add_released_steps(id);
    return response;
  }
  Cluster* const cluster = cluster_.load();
  if (cluster == nullptr || steps_ == nullptr) {
    return absl::UnavailableError("this member is still joining its cluster");
  }
  if (!request.local_only()) {
    ClusterPoolsOptions options;
    options.on_step_released = [metrics = metrics_](const ReleaseResult& r) {
      if (metrics != nullptr) metrics->OnStepReleased(r.released_samples, r.freed_bytes);
    };
    absl::StatusOr<v1::DeletePoolResponse> deleted =
        DeletePoolOverCluster(cluster, steps_, store_, request, options);
    // What this member remembers of the pool's etcd facts (answered while
    // etcd is away) goes with them.
    if (deleted.ok() && !request.dry_run()) cluster->ForgetPool(request.pool());
    return deleted;
  }
  ASSIGN_OR_RETURN(v1::MemberPoolDeletion share, DeleteLocalPool(store_, request));
  if (!request.dry_run()) cluster->ForgetPool(request.pool());
  share.set_member(cluster->self().id);
  response.set_deleted_samples(share.deleted_samples());
  response.set_deleted_bytes(share.deleted_bytes());
  *response.add_members() = std::move(share);
  return response;
}

grpc::ServerUnaryReactor* RolloutsService::ListSamples(grpc::CallbackServerContext* context,
                                                       const v1::ListSamplesRequest* request,
                                                       v1::ListSamplesResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (auth_ != nullptr) {
    if (grpc::Status s = auth_->Check(*context, kListSamples); !s.ok()) {
      reactor->Finish(s);
      return reactor;
    }
  }
  absl::StatusOr<v1::ListSamplesResponse> page = ListSamplesHere(*request);
  if (page.ok()) *response = *std::move(page);
  reactor->Finish(ToGrpcStatus(page.status()));
  return reactor;
}

absl::StatusOr<v1::ListSamplesResponse> RolloutsService::ListSamplesHere(
    const v1::ListSamplesRequest& request) {
  if (!cluster_mode_) return ListLocalSamples(store_, request, /*member=*/"");
  Cluster* const cluster = cluster_.load();
  if (cluster == nullptr) return absl::UnavailableError("this member is still joining its cluster");
  if (request.local_only()) return ListLocalSamples(store_, request, cluster->self().id);
  return ListSamplesOverCluster(cluster, store_, request);
}

}  // namespace rollpack
