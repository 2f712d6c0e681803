// The metrics rollpackd exports (docs/operations.md lists them): families
// registered once per server, updated by the services and by the gRPC
// interceptor below, and gauges read from the store at scrape time.
#ifndef ROLLPACK_SERVER_OPS_SERVER_METRICS_H_
#define ROLLPACK_SERVER_OPS_SERVER_METRICS_H_

#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <set>
#include <string>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "grpcpp/support/server_interceptor.h"
#include "server/ops/metrics/scrape_registry.h"
#include "server/store/sample_store.h"
#include "server/store/step.h"

namespace rollpack {

class ServerMetrics {
 public:
  // Registers every family in `registry` and a scrape-time callback reading
  // `store` (both must outlive this object's registry use).
  ServerMetrics(metrics::ScrapeRegistry* registry, SampleStore* store);

  metrics::ScrapeRegistry& registry() { return *registry_; }

  // Ingest: samples newly stored (duplicates counted apart) and their bytes.
  void OnPut(const std::string& pool, int64_t accepted, int64_t duplicates, int64_t bytes);
  // A refused PutSamples message; reason = the status code, lower case.
  void OnPutRefused(const std::string& pool, absl::StatusCode code);
  void OnStepCreated(const Step& step);
  void OnStepReleased(int64_t samples, int64_t bytes);
  // A step released by --step-ttl (after OnStepReleased).
  void OnStepExpired();
  // Trainer streams.
  void OnStreamStart(bool resumed);
  void OnStreamEnd();
  void OnMicrobatchSent(int64_t bytes);
  void OnStreamRefused();
  // Refused at --max-streams-per-client; ended at --stream-write-timeout.
  void OnClientStreamRefused();
  void OnStreamStalled();
  // R2 (docs/layout.md section 11): an UploadRouting call and the rows it
  // placed; a CommitRouting call.
  void OnRoutingUpload(bool ok, int64_t rows);
  void OnRoutingCommit(bool ok);
  // The pool was deleted here (Rollouts.DeletePool): every series labelled
  // with it goes, so /metrics stays bounded by the pools that exist. Gauges
  // of pools gone since the last scrape are removed by the scrape too.
  void ForgetPool(const std::string& pool);

  // Cluster mode (docs/cluster.md, "Counting steps"): the cluster's live
  // steps by pool (nullopt: not known yet), which rollpack_live_steps and
  // rollpack_pool_live_steps report instead of this store's, so that every
  // member reports the same cluster-wide numbers; what this member holds
  // samples for goes to rollpack_pool_held_steps. Set once, at start.
  void SetClusterLiveSteps(
      std::function<std::optional<std::map<std::string, int64_t>>()> source);

  // Per-method RPC latency and status codes.
  std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface> InterceptorFactory();
  void OnRpcDone(const std::string& method, grpc::StatusCode code, double seconds);

 private:
  void Collect();
  // Every series labelled `pool = pool`.
  void RemovePoolSeries(const std::string& pool);

  metrics::ScrapeRegistry* const registry_;
  SampleStore* const store_;

  metrics::Family<metrics::Counter>& samples_ingested_;
  metrics::Family<metrics::Counter>& duplicate_samples_;
  metrics::Family<metrics::Counter>& bytes_ingested_;
  metrics::Family<metrics::Counter>& put_refusals_;
  metrics::Family<metrics::Gauge>& store_bytes_;
  metrics::Family<metrics::Gauge>& store_max_bytes_;
  metrics::Family<metrics::Gauge>& pool_max_bytes_;
  metrics::Family<metrics::Gauge>& store_samples_;
  metrics::Family<metrics::Gauge>& live_steps_;
  metrics::Family<metrics::Gauge>& pool_bytes_;
  metrics::Family<metrics::Gauge>& pool_samples_;
  metrics::Family<metrics::Gauge>& pool_free_samples_;
  metrics::Family<metrics::Gauge>& pool_live_steps_;
  metrics::Family<metrics::Gauge>& pool_open_samples_;
  // Cluster mode: steps holding samples on this member, by pool.
  metrics::Family<metrics::Gauge>& pool_held_steps_;
  absl::Mutex cluster_live_steps_mu_;
  std::function<std::optional<std::map<std::string, int64_t>>()> cluster_live_steps_
      ABSL_GUARDED_BY(cluster_live_steps_mu_);
  // The sample lifecycle (docs/lifecycle.md), mirrored from the store.
  metrics::Family<metrics::Gauge>& pool_complete_groups_;
  metrics::Family<metrics::Gauge>& pool_incomplete_groups_;
  metrics::Family<metrics::Gauge>& pool_policy_version_;
  metrics::Family<metrics::Gauge>& pool_stale_samples_;
  metrics::Family<metrics::Gauge>& pool_unannotated_samples_;
  metrics::Family<metrics::Gauge>& pool_stale_dropped_;
  metrics::Family<metrics::Gauge>& pool_incomplete_groups_dropped_;
  metrics::Family<metrics::Counter>& steps_created_;
  metrics::Family<metrics::Counter>& steps_released_;
  metrics::Family<metrics::Counter>& steps_expired_;
  metrics::Family<metrics::Counter>& released_samples_;
  metrics::Family<metrics::Counter>& released_bytes_;
  metrics::Family<metrics::Histogram>& plan_seconds_;
  metrics::Family<metrics::Gauge>& plan_rank_imbalance_;
  metrics::Family<metrics::Gauge>& plan_sync_;
  metrics::Family<metrics::Gauge>& plan_padding_overhead_;
  metrics::Family<metrics::Gauge>& plan_microbatches_;
  metrics::Family<metrics::Counter>& microbatches_streamed_;
  metrics::Family<metrics::Counter>& bytes_streamed_;
  metrics::Family<metrics::Gauge>& active_streams_;
  metrics::Family<metrics::Counter>& stream_resumes_;
  metrics::Family<metrics::Counter>& streams_refused_;
  metrics::Family<metrics::Counter>& client_streams_refused_;
  metrics::Family<metrics::Counter>& streams_stalled_;
  metrics::Family<metrics::Counter>& routing_uploads_;
  metrics::Family<metrics::Counter>& routing_upload_rows_;
  metrics::Family<metrics::Counter>& routing_commits_;
  metrics::Family<metrics::Counter>& rpcs_handled_;
  metrics::Family<metrics::Histogram>& rpc_seconds_;
  // The pools the last scrape reported (Collect runs one scrape at a time).
  std::set<std::string> collected_pools_;
};

// "/rollpack.v1.Rollouts/PutSamples" -> {"rollpack.v1.Rollouts", "PutSamples"}.
std::pair<std::string, std::string> SplitMethod(const std::string& full_method);
// grpc::StatusCode -> "OK", "NOT_FOUND", ... (grpc_code label values).
const char* StatusCodeName(int code);

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_OPS_SERVER_METRICS_H_
