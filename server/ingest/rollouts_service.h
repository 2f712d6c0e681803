// gRPC adapter of the producer side: register models, stream samples in.
#ifndef ROLLPACK_SERVER_INGEST_ROLLOUTS_SERVICE_H_
#define ROLLPACK_SERVER_INGEST_ROLLOUTS_SERVICE_H_

#include <memory>
#include <optional>

#include "rollpack/v1/rollouts.grpc.pb.h"
#include "server/ops/auth.h"
#include "server/ingest/commit_sequencer.h"
#include "server/ingest/put_samples_reactor.h"
#include "server/store/pool_directory.h"
#include "server/store/sample_store.h"
#include "server/ops/server_metrics.h"
#include "base/worker_pool.h"

namespace rollpack {

// PutSamples is served raw: its messages are parsed on the ingest worker pool
// (server/ingest/put_samples_reactor.h), not on gRPC's thread.
class RolloutsService final
    : public v1::Rollouts::WithRawCallbackMethod_PutSamples<v1::Rollouts::CallbackService> {
 public:
  // `pools`: where pools are registered and whole-pool calls answered (the
  // store's own, or a cluster's: pool_directory.h). `metrics` and `auth`
  // may be null (no metrics, no auth).
  RolloutsService(SampleStore* store, PoolDirectory* pools, ServerMetrics* metrics = nullptr,
                  const Authorizer* auth = nullptr, IngestOptions ingest = {});

  // Whether this member takes new samples (PoolDirectory::AcceptsNewSamples).
  absl::Status AcceptsNewSamples() const { return pools_->AcceptsNewSamples(); }

  // RegisterModel without a call (rollpackd --capture-model):
  // PoolDirectory::Register.
  absl::StatusOr<bool> Register(const std::string& pool, const ModelSpec& model,
                                const std::optional<PoolOptions>& options) {
    return pools_->Register(pool, model, options);
  }

  grpc::ServerUnaryReactor* RegisterModel(grpc::CallbackServerContext* context,
                                          const v1::RegisterModelRequest* request,
                                          v1::RegisterModelResponse* response) override;
  grpc::ServerReadReactor<grpc::ByteBuffer>* PutSamples(grpc::CallbackServerContext* context,
                                                        grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* GetPool(grpc::CallbackServerContext* context,
                                    const v1::GetPoolRequest* request,
                                    v1::PoolInfo* response) override;
  grpc::ServerUnaryReactor* ListPools(grpc::CallbackServerContext* context,
                                      const v1::ListPoolsRequest* request,
                                      v1::ListPoolsResponse* response) override;
  // AnnotateSamples without the call (the capture port's POST
  // /rollpack/v1/annotate): the entries of the accepted request.
  absl::StatusOr<int32_t> Annotate(const v1::AnnotateSamplesRequest& request);

  // Scalars added to stored samples (lifecycle.md section 6), all or nothing.
  grpc::ServerUnaryReactor* AnnotateSamples(grpc::CallbackServerContext* context,
                                            const v1::AnnotateSamplesRequest* request,
                                            v1::AnnotateSamplesResponse* response) override;

  // Whole pools (rollouts_pools.cc): deleting one (admin token; members ask
  // each other with local_only) and listing its samples' metadata.
  grpc::ServerUnaryReactor* DeletePool(grpc::CallbackServerContext* context,
                                       const v1::DeletePoolRequest* request,
                                       v1::DeletePoolResponse* response) override;
  grpc::ServerUnaryReactor* ListSamples(grpc::CallbackServerContext* context,
                                        const v1::ListSamplesRequest* request,
                                        v1::ListSamplesResponse* response) override;

 private:
  SampleStore* const store_;
  PoolDirectory* const pools_;
  ServerMetrics* const metrics_;
  const Authorizer* const auth_;
  const IngestOptions ingest_;
  // Null when messages_in_flight is 1.
  std::unique_ptr<WorkerPool> workers_;
  // PutSamples calls a producer spreads over several streams.
  StripedCalls striped_calls_;
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_INGEST_ROLLOUTS_SERVICE_H_
