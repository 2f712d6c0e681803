// gRPC adapter of the producer side: register models, stream samples in.
#ifndef ROLLPACK_SERVER_INGEST_ROLLOUTS_SERVICE_H_
#define ROLLPACK_SERVER_INGEST_ROLLOUTS_SERVICE_H_

#include <optional>
#include <atomic>
#include <memory>

#include "rollpack/v1/rollouts.grpc.pb.h"
#include "server/cluster/cluster.h"
#include "server/ops/auth.h"
#include "server/ingest/commit_sequencer.h"
#include "server/ingest/put_samples_reactor.h"
#include "server/store/sample_store.h"
#include "server/ops/server_metrics.h"
#include "base/worker_pool.h"

namespace rollpack {

// PutSamples is served raw: its messages are parsed on the ingest worker pool
// (server/ingest/put_samples_reactor.h), not on gRPC's thread.
class RolloutsService final
    : public v1::Rollouts::WithRawCallbackMethod_PutSamples<v1::Rollouts::CallbackService> {
 public:
  // `metrics` and `auth` may be null (no metrics, no auth).
  // `metrics` and `auth` may be null (no metrics, no auth). With
  // `cluster_mode`, control calls answer UNAVAILABLE until AttachCluster.
  explicit RolloutsService(SampleStore* store, ServerMetrics* metrics = nullptr,
                           const Authorizer* auth = nullptr, IngestOptions ingest = {},
                           bool cluster_mode = false);

  // The cluster this member joined once its port was known.
  void AttachCluster(Cluster* cluster) { cluster_.store(cluster); }

  // RegisterModel without a call (rollpackd --capture-model): in cluster
  // mode the pool's model and options are fixed cluster-wide first (etcd),
  // then here. True when the pool was created. `options`: nullopt leaves
  // them as they are.
  absl::StatusOr<bool> Register(const std::string& pool, const ModelSpec& model,
                                const std::optional<PoolOptions>& options);

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

 private:
  // This server's share of a pool (a single server's whole GetPool).
  absl::StatusOr<v1::PoolInfo> LocalPool(const std::string& pool) const;
  // The whole cluster's share of a pool (GetPool without local_only).
  absl::Status ClusterPool(const std::string& pool, v1::PoolInfo* response);

  SampleStore* const store_;
  ServerMetrics* const metrics_;
  const bool cluster_mode_;
  std::atomic<Cluster*> cluster_{nullptr};
  const Authorizer* const auth_;
  const IngestOptions ingest_;
  // Null when messages_in_flight is 1.
  std::unique_ptr<WorkerPool> workers_;
  // PutSamples calls a producer spreads over several streams.
  StripedCalls striped_calls_;
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_INGEST_ROLLOUTS_SERVICE_H_
