// gRPC adapter of the producer side: register models, stream samples in.
#ifndef ROLLPACK_SERVER_INGEST_ROLLOUTS_SERVICE_H_
#define ROLLPACK_SERVER_INGEST_ROLLOUTS_SERVICE_H_

#include <functional>
#include <optional>
#include <atomic>
#include <memory>

#include "rollpack/v1/rollouts.grpc.pb.h"
#include "server/cluster/cluster.h"
#include "server/ops/auth.h"
#include "server/ingest/commit_sequencer.h"
#include "server/ingest/put_samples_reactor.h"
#include "server/store/sample_store.h"
#include "server/store/step_directory.h"
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
  // Cluster mode (docs/cluster.md, "Counting steps"): the cluster's live
  // steps of a pool, each once, which GetPool's total reports instead of the
  // sum of the members' holds. Set before serving.
  void CountLiveStepsWith(std::function<absl::StatusOr<int64_t>(const std::string& pool)> count) {
    live_steps_of_pool_ = std::move(count);
  }
  // Whether this member takes new samples (intake_check.h): UNAVAILABLE
  // naming it while it is drained for maintenance.
  absl::Status AcceptsNewSamples() const;

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

  // Where the pool's live steps are (the store's, or the cluster's), for
  // DeletePool; set before serving.
  void AttachSteps(StepDirectory* steps) { steps_ = steps; }
  // Whole pools (rollouts_pools.cc): deleting one (admin token; members ask
  // each other with local_only) and listing its samples' metadata.
  grpc::ServerUnaryReactor* DeletePool(grpc::CallbackServerContext* context,
                                       const v1::DeletePoolRequest* request,
                                       v1::DeletePoolResponse* response) override;
  grpc::ServerUnaryReactor* ListSamples(grpc::CallbackServerContext* context,
                                        const v1::ListSamplesRequest* request,
                                        v1::ListSamplesResponse* response) override;

 private:
  // This server's share of a pool (a single server's whole GetPool).
  absl::StatusOr<v1::PoolInfo> LocalPool(const std::string& pool) const;
  // The whole cluster's share of a pool (GetPool without local_only).
  absl::Status ClusterPool(const std::string& pool, v1::PoolInfo* response);
  absl::StatusOr<v1::DeletePoolResponse> DeletePoolHere(const v1::DeletePoolRequest& request);
  absl::StatusOr<v1::ListSamplesResponse> ListSamplesHere(const v1::ListSamplesRequest& request);

  SampleStore* const store_;
  ServerMetrics* const metrics_;
  const bool cluster_mode_;
  std::atomic<Cluster*> cluster_{nullptr};
  std::function<absl::StatusOr<int64_t>(const std::string& pool)> live_steps_of_pool_;
  StepDirectory* steps_ = nullptr;
  const Authorizer* const auth_;
  const IngestOptions ingest_;
  // Null when messages_in_flight is 1.
  std::unique_ptr<WorkerPool> workers_;
  // PutSamples calls a producer spreads over several streams.
  StripedCalls striped_calls_;
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_INGEST_ROLLOUTS_SERVICE_H_
