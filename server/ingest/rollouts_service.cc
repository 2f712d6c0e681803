#include "server/ingest/rollouts_service.h"

#include <algorithm>
#include <thread>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "scheduler/model_spec.h"
#include "server/store/convert.h"
#include "server/store/names.h"

namespace rollpack {
namespace {

// A PutSamples refused before reading anything (authentication).
class RefusedPut final : public grpc::ServerReadReactor<grpc::ByteBuffer> {
 public:
  explicit RefusedPut(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

RolloutsService::RolloutsService(SampleStore* store, ServerMetrics* metrics,
                                 const Authorizer* auth, IngestOptions ingest, bool cluster_mode)
    : store_(store), metrics_(metrics), cluster_mode_(cluster_mode), auth_(auth), ingest_(ingest) {
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
  absl::StatusOr<bool> created = RegisterHere(request->pool(), FromProto(request->model()));
  if (created.ok()) {
    response->set_created(*created);
    *response->mutable_model() = request->model();
  }
  reactor->Finish(ToGrpcStatus(created.status()));
  return reactor;
}

absl::StatusOr<bool> RolloutsService::RegisterHere(const std::string& pool,
                                                   const ModelSpec& model) {
  Cluster* const cluster = cluster_.load();
  if (!cluster_mode_) return store_->RegisterModel(pool, model);
  if (cluster == nullptr) return absl::UnavailableError("this member is still joining its cluster");
  // Checked before anything is fixed for the whole cluster.
  RETURN_IF_ERROR(ValidateName("pool name", pool, kMaxPoolNameBytes));
  RETURN_IF_ERROR(ValidateModelSpec(model));
  bool created = false;
  ASSIGN_OR_RETURN(ModelSpec held, cluster->RegisterPool(pool, model, &created));
  if (!(held == model)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "pool \"", pool, "\" already holds model \"", held.name,
        "\" with another spec in cluster \"", cluster->options().name,
        "\"; a pool holds one model"));
  }
  RETURN_IF_ERROR(store_->RegisterModel(pool, model));
  return created;
}

grpc::ServerReadReactor<grpc::ByteBuffer>* RolloutsService::PutSamples(
    grpc::CallbackServerContext* context, grpc::ByteBuffer* response) {
  if (auth_ != nullptr) {
    if (grpc::Status s = auth_->Check(*context, "/rollpack.v1.Rollouts/PutSamples"); !s.ok()) {
      return new RefusedPut(s);
    }
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
  return NewPutSamplesReactor(store_, metrics_, workers_.get(), ingest_.messages_in_flight,
                              std::move(sequencer), stripe, response);
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
  if (cluster_mode_ && !request->local_only()) {
    reactor->Finish(ToGrpcStatus(ClusterPool(request->pool(), response)));
    return reactor;
  }
  absl::StatusOr<v1::PoolInfo> local = LocalPool(request->pool());
  if (local.ok()) *response = *std::move(local);
  reactor->Finish(ToGrpcStatus(local.status()));
  return reactor;
}

absl::StatusOr<v1::PoolInfo> RolloutsService::LocalPool(const std::string& pool) const {
  ASSIGN_OR_RETURN(PoolStats stats, store_->GetPool(pool));
  v1::PoolInfo info;
  info.set_pool(stats.pool);
  *info.mutable_model() = ToProto(stats.model);
  info.set_num_samples(stats.num_samples);
  info.set_num_free_samples(stats.num_free_samples);
  info.set_num_live_steps(stats.num_live_steps);
  info.set_stored_bytes(stats.stored_bytes);
  for (const auto& [name, field] : stats.token_fields) {
    (*info.mutable_token_field_dtypes())[name] = field.dtype;
  }
  const StoreStats store = store_->Stats();
  info.set_server_stored_bytes(store.stored_bytes);
  info.set_server_max_memory_bytes(store.max_memory_bytes);
  return info;
}

absl::Status RolloutsService::ClusterPool(const std::string& pool, v1::PoolInfo* response) {
  RETURN_IF_ERROR(ValidateName("pool name", pool, kMaxPoolNameBytes));
  Cluster* const cluster = cluster_.load();
  if (cluster == nullptr) return absl::UnavailableError("this member is still joining its cluster");
  ASSIGN_OR_RETURN(std::optional<ModelSpec> model, cluster->LookupPool(pool));
  if (!model.has_value()) {
    return absl::NotFoundError(absl::StrCat("pool \"", pool, "\" has no registered model in cluster \"",
                                            cluster->options().name, "\""));
  }
  ASSIGN_OR_RETURN(std::vector<ClusterMember> members, cluster->Members());
  response->set_pool(pool);
  *response->mutable_model() = ToProto(*model);
  for (const ClusterMember& member : members) {
    v1::MemberPoolInfo* share = response->add_members();
    share->set_member(member.id);
    absl::StatusOr<v1::PoolInfo> info = member.id == cluster->self().id
                                             ? LocalPool(pool)
                                             : cluster->GetPoolOf(member, pool);
    if (absl::IsNotFound(info.status())) continue;  // no sample of the pool there yet
    if (!info.ok()) {
      share->set_error(std::string(info.status().message()));
      continue;
    }
    share->set_num_samples(info->num_samples());
    share->set_num_free_samples(info->num_free_samples());
    share->set_stored_bytes(info->stored_bytes());
    share->set_server_stored_bytes(info->server_stored_bytes());
    share->set_server_max_memory_bytes(info->server_max_memory_bytes());
    response->set_num_samples(response->num_samples() + info->num_samples());
    response->set_num_free_samples(response->num_free_samples() + info->num_free_samples());
    response->set_num_live_steps(response->num_live_steps() + info->num_live_steps());
    response->set_stored_bytes(response->stored_bytes() + info->stored_bytes());
    response->set_server_stored_bytes(response->server_stored_bytes() +
                                      info->server_stored_bytes());
    response->set_server_max_memory_bytes(response->server_max_memory_bytes() +
                                          info->server_max_memory_bytes());
    for (const auto& [name, dtype] : info->token_field_dtypes()) {
      (*response->mutable_token_field_dtypes())[name] = dtype;
    }
  }
  return absl::OkStatus();
}

}  // namespace rollpack
