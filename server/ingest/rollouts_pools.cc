// RolloutsService's whole-pool calls (rollouts_service.h): DeletePool and
// ListSamples, on a single server and through any member of a cluster
// (PoolDirectory::DeletePool, ::ListSamples).
#include <string>

#include "absl/strings/str_cat.h"
#include "server/ingest/rollouts_service.h"
#include "server/ops/call_log.h"
#include "server/store/convert.h"

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
  absl::StatusOr<v1::DeletePoolResponse> deleted = pools_->DeletePool(*request);
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
  absl::StatusOr<v1::ListSamplesResponse> page = pools_->ListSamples(*request);
  if (page.ok()) *response = *std::move(page);
  reactor->Finish(ToGrpcStatus(page.status()));
  return reactor;
}

}  // namespace rollpack
