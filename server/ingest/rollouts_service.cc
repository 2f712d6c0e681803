#include "server/ingest/rollouts_service.h"

#include <algorithm>
#include <map>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "server/ops/call_log.h"
#include "server/store/convert.h"
#include "server/store/pool_info.h"

namespace rollpack {
namespace {

// A PutSamples refused before reading anything (authentication).
class RefusedPut final : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  explicit RefusedPut(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

RolloutsService::RolloutsService(SampleStore* store, PoolDirectory* pools,
                                 ServerMetrics* metrics, const Authorizer* auth,
                                 IngestOptions ingest)
    : store_(store), pools_(pools), metrics_(metrics), auth_(auth), ingest_(ingest) {
  if (ingest_.messages_in_flight > 1) {
    const int cores = static_cast<int>(std::thread::hardware_concurrency());
    workers_ = std::make_unique<WorkerPool>(
        ingest_.threads > 0 ? ingest_.threads : std::clamp(cores, 1, 8));
  }
}

grpc::ServerUnaryReactor* RolloutsService::RegisterModel(grpc::CallbackServerContext* context,
                                                         const v1::RegisterModelRequest* request,
                                                         v1::RegisterModelResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (auth_ != nullptr) {
    if (grpc::Status s = auth_->Check(*context, "/rollpack.v1.Rollouts/RegisterModel"); !s.ok()) {
      reactor->Finish(s);
      return reactor;
    }
  }
  std::optional<PoolOptions> options;
  if (request->has_options()) {
    absl::StatusOr<PoolOptions> parsed = FromProto(request->options());
    if (!parsed.ok()) {
      reactor->Finish(ToGrpcStatus(absl::InvalidArgumentError(
          absl::StrCat("pool \"", request->pool(), "\": ", parsed.status().message()))));
      return reactor;
    }
    options = *parsed;
  }
  absl::StatusOr<bool> created = Register(request->pool(), FromProto(request->model()), options);
  if (created.ok()) {
    response->set_created(*created);
    *response->mutable_model() = request->model();
    absl::StatusOr<PoolOptions> held = store_->GetOptions(request->pool());
    if (held.ok()) *response->mutable_options() = ToProto(*held);
  }
  reactor->Finish(ToGrpcStatus(created.status()));
  return reactor;
}

grpc::ServerReadReactor<grpc::ByteBuffer>* RolloutsService::PutSamples(
    grpc::CallbackServerContext* context, grpc::ByteBuffer* response) {
  if (auth_ != nullptr) {
    if (grpc::Status s = auth_->Check(*context, "/rollpack.v1.Rollouts/PutSamples"); !s.ok()) {
      return new RefusedPut(s);
    }
  }
  // Refused at once when drained; a stream open before the drain is
  // refused at its next message.
  if (absl::Status accepts = AcceptsNewSamples(); !accepts.ok()) {
    return new RefusedPut(ToGrpcStatus(accepts));
  }
  std::shared_ptr<CommitSequencer> sequencer;
  int stripe = 0;
  const auto& metadata = context->client_metadata();
  if (auto it = metadata.find(StripedCalls::kMetadataKey); it != metadata.end()) {
    absl::StatusOr<std::shared_ptr<CommitSequencer>> joined =
        striped_calls_.Join(absl::string_view(it->second.data(), it->second.size()), &stripe);
    if (!joined.ok()) return new RefusedPut(ToGrpcStatus(joined.status()));
    sequencer = *std::move(joined);
  } else {
    sequencer = CommitSequencer::Create();
  }
  return NewPutSamplesReactor(store_, metrics_, workers_.get(), ingest_, std::move(sequencer),
                              stripe, response, [this] { return AcceptsNewSamples(); });
}

grpc::ServerUnaryReactor* RolloutsService::GetPool(grpc::CallbackServerContext* context,
                                                   const v1::GetPoolRequest* request,
                                                   v1::PoolInfo* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (auth_ != nullptr) {
    if (grpc::Status s = auth_->Check(*context, "/rollpack.v1.Rollouts/GetPool"); !s.ok()) {
      reactor->Finish(s);
      return reactor;
    }
  }
  if (!request->local_only()) {
    absl::StatusOr<v1::PoolInfo> whole = pools_->GetPool(request->pool());
    if (whole.ok()) *response = *std::move(whole);
    reactor->Finish(ToGrpcStatus(whole.status()));
    return reactor;
  }
  // local_only: this member's share, for a peer summing the cluster's pool.
  absl::StatusOr<v1::PoolInfo> local = pools_->GetPoolHere(request->pool());
  if (local.ok() && request->complete_group_ids_size() > 0) {
    // A peer summing the cluster's pool asks which of its listed groups
    // are complete here (group_census.h).
    absl::StatusOr<std::vector<GroupShareStats>> complete = store_->CompleteGroups(
        request->pool(), {request->complete_group_ids().begin(), request->complete_group_ids().end()});
    if (complete.ok()) {
      AddCompleteGroupShares(*complete, &*local);
    } else {
      local = complete.status();
    }
  }
  if (local.ok()) *response = *std::move(local);
  reactor->Finish(ToGrpcStatus(local.status()));
  return reactor;
}

grpc::ServerUnaryReactor* RolloutsService::ListPools(grpc::CallbackServerContext* context,
                                                     const v1::ListPoolsRequest* /*request*/,
                                                     v1::ListPoolsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (auth_ != nullptr) {
    if (grpc::Status s = auth_->Check(*context, "/rollpack.v1.Rollouts/ListPools"); !s.ok()) {
      reactor->Finish(s);
      return reactor;
    }
  }
  reactor->Finish(ToGrpcStatus([&]() -> absl::Status {
    ASSIGN_OR_RETURN(std::vector<std::string> names, pools_->PoolNames());
    for (const std::string& name : names) {
      absl::StatusOr<v1::PoolInfo> info = pools_->GetPool(name);
      if (absl::IsNotFound(info.status())) continue;
      RETURN_IF_ERROR(info.status());
      *response->add_pools() = *std::move(info);
    }
    return absl::OkStatus();
  }()));
  return reactor;
}

absl::StatusOr<int32_t> RolloutsService::Annotate(const v1::AnnotateSamplesRequest& request) {
  std::vector<ScalarAnnotation> annotations;
  annotations.reserve(request.annotations_size());
  for (const v1::SampleAnnotation& a : request.annotations()) {
    annotations.push_back(ScalarAnnotation{
        a.sample_id(), std::map<std::string, double>(a.scalars().begin(), a.scalars().end())});
  }
  return pools_->Annotate(request.pool(), std::move(annotations));
}

grpc::ServerUnaryReactor* RolloutsService::AnnotateSamples(
    grpc::CallbackServerContext* context, const v1::AnnotateSamplesRequest* request,
    v1::AnnotateSamplesResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  if (auth_ != nullptr) {
    if (grpc::Status s = auth_->Check(*context, "/rollpack.v1.Rollouts/AnnotateSamples");
        !s.ok()) {
      reactor->Finish(s);
      return reactor;
    }
  }
  absl::StatusOr<int32_t> annotated = Annotate(*request);
  if (annotated.ok()) {
    response->set_annotated(*annotated);
    AnnotateCall(context, absl::StrCat("pool \"", request->pool(), "\": ", *annotated,
                                       " samples annotated"));
  }
  reactor->Finish(ToGrpcStatus(annotated.status()));
  return reactor;
}

}  // namespace rollpack
