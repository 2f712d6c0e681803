#include "server/ingest/rollouts_service.h"

#include <algorithm>
#include <thread>

#include "server/store/convert.h"

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
                                 const Authorizer* auth, IngestOptions ingest)
    : store_(store), metrics_(metrics), auth_(auth), ingest_(ingest) {
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
  absl::StatusOr<bool> created = store_->RegisterModel(request->pool(), FromProto(request->model()));
  if (created.ok()) {
    response->set_created(*created);
    *response->mutable_model() = request->model();
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
  absl::StatusOr<PoolStats> stats = store_->GetPool(request->pool());
  if (stats.ok()) {
    response->set_pool(stats->pool);
    *response->mutable_model() = ToProto(stats->model);
    response->set_num_samples(stats->num_samples);
    response->set_num_free_samples(stats->num_free_samples);
    response->set_num_live_steps(stats->num_live_steps);
    response->set_stored_bytes(stats->stored_bytes);
    for (const auto& [name, field] : stats->token_fields) {
      (*response->mutable_token_field_dtypes())[name] = field.dtype;
    }
    const StoreStats store = store_->Stats();
    response->set_server_stored_bytes(store.stored_bytes);
    response->set_server_max_memory_bytes(store.max_memory_bytes);
  }
  reactor->Finish(ToGrpcStatus(stats.status()));
  return reactor;
}

}  // namespace rollpack
