#include "server/rollouts_service.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/convert.h"
#include "server/sample_validation.h"

namespace rollpack {
namespace {

// Validates and commits one request message at a time, all or nothing. The
// first refused message ends the stream; earlier ones stay committed.
class PutSamplesReactor final : public grpc::ServerReadReactor<v1::PutSamplesRequest> {
 public:
  PutSamplesReactor(SampleStore* store, ServerMetrics* metrics, v1::PutSamplesResponse* response)
      : store_(store), metrics_(metrics), response_(response) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // The client closed its side: everything was committed.
      Finish(grpc::Status::OK);
      return;
    }
    if (absl::Status s = Commit(); !s.ok()) {
      if (metrics_ != nullptr) metrics_->OnPutRefused(pool_, s.code());
      Finish(ToGrpcStatus(absl::Status(
          s.code(), absl::StrCat(s.message(), " [", response_->accepted(),
                                 " samples of earlier messages of this stream were committed; "
                                 "this message's were not]"))));
      return;
    }
    StartRead(&request_);
  }

  void OnDone() override { delete this; }

 private:
  absl::Status Commit() {
    if (!request_.pool().empty()) pool_ = request_.pool();
    if (pool_.empty()) return absl::InvalidArgumentError("PutSamplesRequest.pool is empty");
    absl::StatusOr<ModelSpec> model = store_->GetModel(pool_);
    if (!model.ok()) return model.status();
    std::vector<StoredSample> samples;
    samples.reserve(request_.samples_size());
    for (v1::Sample& sample : *request_.mutable_samples()) {
      absl::StatusOr<StoredSample> stored = ValidateAndTakeSample(&sample, *model);
      if (!stored.ok()) return stored.status();
      samples.push_back(*std::move(stored));
    }
    absl::StatusOr<PutResult> result = store_->Put(pool_, std::move(samples));
    if (!result.ok()) return result.status();
    if (metrics_ != nullptr) {
      metrics_->OnPut(pool_, result->accepted, result->duplicates, result->stored_bytes);
    }
    response_->set_accepted(response_->accepted() + result->accepted);
    response_->set_duplicates(response_->duplicates() + result->duplicates);
    response_->set_stored_bytes(response_->stored_bytes() + result->stored_bytes);
    return absl::OkStatus();
  }

  SampleStore* const store_;
  ServerMetrics* const metrics_;
  v1::PutSamplesResponse* const response_;
  v1::PutSamplesRequest request_;
  std::string pool_;
};

// A PutSamples refused before reading anything (authentication).
class RefusedPut final : public grpc::ServerReadReactor<v1::PutSamplesRequest> {
 public:
  explicit RefusedPut(const grpc::Status& status) { Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

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

grpc::ServerReadReactor<v1::PutSamplesRequest>* RolloutsService::PutSamples(
    grpc::CallbackServerContext* context, v1::PutSamplesResponse* response) {
  if (auth_ != nullptr) {
    if (grpc::Status s = auth_->Check(*context, "/rollpack.v1.Rollouts/PutSamples"); !s.ok()) {
      return new RefusedPut(s);
    }
  }
  return new PutSamplesReactor(store_, metrics_, response);
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
