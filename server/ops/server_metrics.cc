#include "server/ops/server_metrics.h"

#include <chrono>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "google/protobuf/descriptor.h"

namespace rollpack {
namespace {

using metrics::Histogram;

// 100 us .. ~52 s: unary calls are sub-millisecond, a trainer stream of a
// large step lasts seconds.
Histogram::BucketBoundaries RpcBuckets() { return metrics::ExponentialBuckets(1e-4, 2.0, 20); }
// 100 us .. ~6.5 s for planning.
Histogram::BucketBoundaries PlanBuckets() { return metrics::ExponentialBuckets(1e-4, 2.0, 17); }

class MetricsInterceptor final : public grpc::experimental::Interceptor {
 public:
  MetricsInterceptor(ServerMetrics* metrics, const char* method)
      : metrics_(metrics),
        method_(method != nullptr ? method : "/unknown/unknown"),
        start_(std::chrono::steady_clock::now()) {}

  ~MetricsInterceptor() override {
    // No status went out (the call was cancelled before the handler finished).
    if (!recorded_) Record(grpc::StatusCode::CANCELLED);
  }

  void Intercept(grpc::experimental::InterceptorBatchMethods* methods) override {
    if (methods->QueryInterceptionHookPoint(
            grpc::experimental::InterceptionHookPoints::PRE_SEND_STATUS)) {
      Record(methods->GetSendStatus().error_code());
    }
    methods->Proceed();
  }

 private:
  void Record(grpc::StatusCode code) {
    if (recorded_) return;
    recorded_ = true;
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    metrics_->OnRpcDone(method_, code, seconds);
  }

  ServerMetrics* const metrics_;
  const std::string method_;
  const std::chrono::steady_clock::time_point start_;
  bool recorded_ = false;
};

class MetricsInterceptorFactory final
    : public grpc::experimental::ServerInterceptorFactoryInterface {
 public:
  explicit MetricsInterceptorFactory(ServerMetrics* metrics) : metrics_(metrics) {}
  grpc::experimental::Interceptor* CreateServerInterceptor(
      grpc::experimental::ServerRpcInfo* info) override {
    return new MetricsInterceptor(metrics_, info->method());
  }

 private:
  ServerMetrics* const metrics_;
};

}  // namespace

std::pair<std::string, std::string> SplitMethod(const std::string& full_method) {
  std::string m = full_method;
  if (!m.empty() && m[0] == '/') m.erase(0, 1);
  const size_t slash = m.rfind('/');
  if (slash == std::string::npos) return {"unknown", m.empty() ? "unknown" : m};
  return {m.substr(0, slash), m.substr(slash + 1)};
}

const char* StatusCodeName(int code) {
  static const char* const kNames[] = {
      "OK",           "CANCELLED",         "UNKNOWN",        "INVALID_ARGUMENT",
      "DEADLINE_EXCEEDED", "NOT_FOUND",    "ALREADY_EXISTS", "PERMISSION_DENIED",
      "RESOURCE_EXHAUSTED", "FAILED_PRECONDITION", "ABORTED", "OUT_OF_RANGE",
      "UNIMPLEMENTED", "INTERNAL",         "UNAVAILABLE",    "DATA_LOSS",
      "UNAUTHENTICATED"};
  if (code < 0 || code > 16) return "UNKNOWN";
  return kNames[code];
}

ServerMetrics::ServerMetrics(metrics::ScrapeRegistry* registry, SampleStore* store)
    : registry_(registry),
      store_(store),
      samples_ingested_(registry->AddCounter(
          "rollpack_ingested_samples_total",
          "Samples newly stored by PutSamples (identical re-sends excluded), by pool.")),
      duplicate_samples_(registry->AddCounter(
          "rollpack_duplicate_samples_total",
          "Identical re-sends of stored samples accepted as no-ops, by pool.")),
      bytes_ingested_(registry->AddCounter(
          "rollpack_ingested_bytes_total", "Bytes stored for newly ingested samples, by pool.")),
      put_refusals_(registry->AddCounter(
          "rollpack_put_refusals_total",
          "PutSamples request messages refused, by pool and reason (status code).")),
      store_bytes_(registry->AddGauge("rollpack_store_bytes",
                                      "Bytes of samples held by the store (all pools).")),
      store_max_bytes_(registry->AddGauge(
          "rollpack_store_max_bytes",
          "Memory limit of the store (--max-memory); PutSamples past it is refused.")),
      pool_max_bytes_(registry->AddGauge(
          "rollpack_pool_max_bytes",
          "Per-pool memory limit (--max-pool-memory); 0 = only the store limit applies.")),
      store_samples_(registry->AddGauge("rollpack_store_samples", "Samples held (all pools).")),
      live_steps_(registry->AddGauge("rollpack_live_steps", "Steps created and not released.")),
      pool_bytes_(registry->AddGauge("rollpack_pool_bytes", "Bytes of samples held, by pool.")),
      pool_samples_(registry->AddGauge("rollpack_pool_samples",
                                       "Samples held (free or in steps), by pool.")),
      pool_free_samples_(registry->AddGauge("rollpack_pool_free_samples",
                                            "Samples in no live step, by pool.")),
      pool_live_steps_(registry->AddGauge("rollpack_pool_live_steps", "Live steps, by pool.")),
      pool_open_samples_(registry->AddGauge(
          "rollpack_pool_open_samples",
          "Samples still receiving pieces (not selectable until sealed), by pool.")),
      pool_held_steps_(registry->AddGauge(
          "rollpack_pool_held_steps",
          "Cluster mode: steps holding samples on this member, by pool (a step over k members "
          "counts on each of them; rollpack_pool_live_steps counts it once).")),
      pool_complete_groups_(registry->AddGauge(
          "rollpack_pool_complete_groups", "Groups with all their samples stored, by pool.")),
      pool_incomplete_groups_(registry->AddGauge(
          "rollpack_pool_incomplete_groups", "Groups still missing samples, by pool.")),
      pool_policy_version_(registry->AddGauge(
          "rollpack_pool_policy_version", "The trainer's policy version last reported, by pool.")),
      pool_stale_samples_(registry->AddGauge(
          "rollpack_pool_stale_samples",
          "Free samples older than the policy version minus max_staleness, by pool.")),
      pool_unannotated_samples_(registry->AddGauge(
          "rollpack_pool_unannotated_samples",
          "Sealed samples still missing a required scalar (not selectable until annotated), "
          "by pool.")),
      pool_stale_dropped_(registry->AddGauge(
          "rollpack_pool_stale_dropped_samples",
          "Samples deleted as stale (drop_stale) since the pool was created, by pool.")),
      pool_incomplete_groups_dropped_(registry->AddGauge(
          "rollpack_pool_incomplete_groups_dropped",
          "Groups deleted for staying incomplete past incomplete_group_timeout_ms, by pool.")),
      steps_created_(registry->AddCounter("rollpack_steps_created_total",
                                          "Steps created (planned), by pool.")),
      steps_released_(registry->AddCounter("rollpack_steps_released_total", "Steps released.")),
      steps_expired_(registry->AddCounter(
          "rollpack_steps_expired_total",
          "Steps released by --step-ttl: no trainer stream and no activity for that long.")),
      released_samples_(registry->AddCounter("rollpack_released_samples_total",
                                             "Samples freed by ReleaseStep.")),
      released_bytes_(registry->AddCounter("rollpack_released_bytes_total",
                                           "Bytes freed by ReleaseStep.")),
      plan_seconds_(registry->AddHistogram("rollpack_plan_duration_seconds",
                                           "Time to compute a step's plan, by pool.")),
      plan_rank_imbalance_(registry->AddGauge(
          "rollpack_last_plan_rank_imbalance_ratio",
          "Last plan's max rank work / mean rank work (1 = perfect), by pool.")),
      plan_sync_(registry->AddGauge(
          "rollpack_last_plan_sync_ratio",
          "Last plan's sum over micro-batches of the slowest rank's work / mean work, by pool.")),
      plan_padding_overhead_(registry->AddGauge(
          "rollpack_last_plan_padding_overhead_ratio",
          "Last plan's padded tokens / real tokens - 1, by pool.")),
      plan_microbatches_(registry->AddGauge("rollpack_last_plan_microbatches",
                                            "Micro-batches per rank of the last plan, by pool.")),
      microbatches_streamed_(registry->AddCounter("rollpack_streamed_microbatches_total",
                                                  "Micro-batches written to trainer streams.")),
      bytes_streamed_(registry->AddCounter(
          "rollpack_streamed_bytes_total",
          "Serialized bytes of micro-batches written to trainer streams.")),
      active_streams_(registry->AddGauge("rollpack_active_streams",
                                         "FetchMicrobatches streams in flight.")),
      stream_resumes_(registry->AddCounter(
          "rollpack_stream_resumes_total",
          "FetchMicrobatches streams started at start_index > 0 (resumed).")),
      streams_refused_(registry->AddCounter(
          "rollpack_streams_refused_total",
          "FetchMicrobatches refused because --max-concurrent-streams were in flight.")),
      client_streams_refused_(registry->AddCounter(
          "rollpack_client_streams_refused_total",
          "FetchMicrobatches refused because the client's host had --max-streams-per-client in "
          "flight.")),
      streams_stalled_(registry->AddCounter(
          "rollpack_streams_stalled_total",
          "FetchMicrobatches ended because the client took no micro-batch for "
          "--stream-write-timeout.")),
      routing_uploads_(registry->AddCounter(
          "rollpack_recompute_uploads_total",
          "Trainer.UploadRouting calls (R2 recorded routing of one micro-batch), by result "
          "(ok, refused).")),
      routing_upload_rows_(registry->AddCounter(
          "rollpack_recompute_upload_rows_total",
          "Real-token rows of recorded routing placed by accepted UploadRouting calls.")),
      routing_commits_(registry->AddCounter(
          "rollpack_recompute_commits_total",
          "Trainer.CommitRouting calls, by result (ok, refused).")),
      rpcs_handled_(registry->AddCounter(
          "rollpack_grpc_server_handled_total",
          "RPCs completed, by service, method and status code.")),
      rpc_seconds_(registry->AddHistogram(
          "rollpack_grpc_server_handling_seconds",
          "Time from the call's arrival to its status, by service and method.")) {
  // Series that exist from the start, so rate() and alerts see 0 not nothing.
  steps_released_.Add({});
  steps_expired_.Add({});
  released_samples_.Add({});
  released_bytes_.Add({});
  microbatches_streamed_.Add({});
  bytes_streamed_.Add({});
  active_streams_.Add({});
  stream_resumes_.Add({});
  streams_refused_.Add({});
  client_streams_refused_.Add({});
  streams_stalled_.Add({});
  for (const char* result : {"ok", "refused"}) {
    routing_uploads_.Add({{"result", result}});
    routing_commits_.Add({{"result", result}});
  }
  routing_upload_rows_.Add({});
  registry_->AddCollectCallback([this] { Collect(); });
}

void ServerMetrics::OnPut(const std::string& pool, int64_t accepted, int64_t duplicates,
                          int64_t bytes) {
  samples_ingested_.Add({{"pool", pool}}).Increment(static_cast<double>(accepted - duplicates));
  duplicate_samples_.Add({{"pool", pool}}).Increment(static_cast<double>(duplicates));
  bytes_ingested_.Add({{"pool", pool}}).Increment(static_cast<double>(bytes));
}

void ServerMetrics::OnPutRefused(const std::string& pool, absl::StatusCode code) {
  // Pool names come from clients: only registered pools get their own
  // series, so a client cannot create unbounded label values.
  const bool known = store_->GetModel(pool).ok();
  put_refusals_
      .Add({{"pool", known ? pool : "(unregistered)"},
            {"reason", absl::AsciiStrToLower(StatusCodeName(static_cast<int>(code)))}})
      .Increment();
}

void ServerMetrics::OnStepCreated(const Step& step) {
  const metrics::Labels pool{{"pool", step.pool}};
  const PlanStats& s = step.plan.stats;
  steps_created_.Add(pool).Increment();
  plan_seconds_.Add(pool, PlanBuckets()).Observe(s.plan_ms / 1000.0);
  plan_rank_imbalance_.Add(pool).Set(s.rank_imbalance);
  plan_sync_.Add(pool).Set(s.sync);
  plan_padding_overhead_.Add(pool).Set(s.padding_overhead);
  plan_microbatches_.Add(pool).Set(s.num_microbatches);
}

void ServerMetrics::OnStepExpired() { steps_expired_.Add({}).Increment(); }

void ServerMetrics::OnStepReleased(int64_t samples, int64_t bytes) {
  steps_released_.Add({}).Increment();
  released_samples_.Add({}).Increment(static_cast<double>(samples));
  released_bytes_.Add({}).Increment(static_cast<double>(bytes));
}

void ServerMetrics::OnStreamStart(bool resumed) {
  active_streams_.Add({}).Increment();
  if (resumed) stream_resumes_.Add({}).Increment();
}

void ServerMetrics::OnStreamEnd() { active_streams_.Add({}).Decrement(); }

void ServerMetrics::OnMicrobatchSent(int64_t bytes) {
  microbatches_streamed_.Add({}).Increment();
  bytes_streamed_.Add({}).Increment(static_cast<double>(bytes));
}

void ServerMetrics::OnStreamRefused() { streams_refused_.Add({}).Increment(); }

void ServerMetrics::OnClientStreamRefused() { client_streams_refused_.Add({}).Increment(); }

void ServerMetrics::OnStreamStalled() { streams_stalled_.Add({}).Increment(); }

void ServerMetrics::OnRoutingUpload(bool ok, int64_t rows) {
  routing_uploads_.Add({{"result", ok ? "ok" : "refused"}}).Increment();
  if (ok) routing_upload_rows_.Add({}).Increment(static_cast<double>(rows));
}

void ServerMetrics::OnRoutingCommit(bool ok) {
  routing_commits_.Add({{"result", ok ? "ok" : "refused"}}).Increment();
}

void ServerMetrics::OnRpcDone(const std::string& method, grpc::StatusCode code, double seconds) {
  auto [service, name] = SplitMethod(method);
  // Only methods the server knows (rollpack, health, reflection) get their
  // own series; anything else a client makes up is "unknown".
  if (google::protobuf::DescriptorPool::generated_pool()->FindMethodByName(
          absl::StrCat(service, ".", name)) == nullptr) {
    service = "unknown";
    name = "unknown";
  }
  rpcs_handled_
      .Add({{"grpc_service", service},
            {"grpc_method", name},
            {"grpc_code", StatusCodeName(static_cast<int>(code))}})
      .Increment();
  rpc_seconds_.Add({{"grpc_service", service}, {"grpc_method", name}}, RpcBuckets())
      .Observe(seconds);
}

std::unique_ptr<grpc::experimental::ServerInterceptorFactoryInterface>
ServerMetrics::InterceptorFactory() {
  return std::make_unique<MetricsInterceptorFactory>(this);
}

void ServerMetrics::ForgetPool(const std::string& pool) { RemovePoolSeries(pool); }

void ServerMetrics::RemovePoolSeries(const std::string& pool) {
  const metrics::Labels l{{"pool", pool}};
  auto remove = [&l](auto& family) {
    if (family.Has(l)) family.Remove(&family.Add(l));
  };
  for (auto* family : {&samples_ingested_, &duplicate_samples_, &bytes_ingested_, &steps_created_}) {
    remove(*family);
  }
  for (auto* family :
       {&pool_bytes_, &pool_samples_, &pool_free_samples_, &pool_live_steps_, &pool_open_samples_,
        &pool_held_steps_,
        &pool_complete_groups_, &pool_incomplete_groups_, &pool_policy_version_,
        &pool_stale_samples_, &pool_unannotated_samples_, &pool_stale_dropped_,
        &pool_incomplete_groups_dropped_, &plan_rank_imbalance_, &plan_sync_,
        &plan_padding_overhead_, &plan_microbatches_}) {
    remove(*family);
  }
  if (plan_seconds_.Has(l)) plan_seconds_.Remove(&plan_seconds_.Add(l, PlanBuckets()));
  for (int code = 0; code <= 16; ++code) {
    const metrics::Labels refused{{"pool", pool},
                                  {"reason", absl::AsciiStrToLower(StatusCodeName(code))}};
    if (put_refusals_.Has(refused)) put_refusals_.Remove(&put_refusals_.Add(refused));
  }
}

void ServerMetrics::Collect() {
  const StoreStats stats = store_->Stats();
  store_bytes_.Add({}).Set(static_cast<double>(stats.stored_bytes));
  store_max_bytes_.Add({}).Set(static_cast<double>(stats.max_memory_bytes));
  pool_max_bytes_.Add({}).Set(static_cast<double>(store_->max_pool_bytes()));
  store_samples_.Add({}).Set(static_cast<double>(stats.num_samples));
  live_steps_.Add({}).Set(static_cast<double>(stats.num_live_steps));
  const std::vector<std::string> pools = store_->PoolNames();
  // A pool deleted since the last scrape (or while it ran) leaves no gauge
  // at its last value.
  std::set<std::string> current(pools.begin(), pools.end());
  for (const std::string& gone : collected_pools_) {
    if (!current.count(gone)) RemovePoolSeries(gone);
  }
  for (const std::string& pool : pools) {
    absl::StatusOr<PoolStats> p = store_->GetPool(pool);
    if (!p.ok()) current.erase(pool);
    if (!p.ok()) continue;
    const metrics::Labels l{{"pool", pool}};
    pool_bytes_.Add(l).Set(static_cast<double>(p->stored_bytes));
    pool_samples_.Add(l).Set(static_cast<double>(p->num_samples));
    pool_free_samples_.Add(l).Set(static_cast<double>(p->num_free_samples));
    pool_live_steps_.Add(l).Set(static_cast<double>(p->num_live_steps));
    pool_open_samples_.Add(l).Set(static_cast<double>(p->num_open_samples));
    pool_complete_groups_.Add(l).Set(static_cast<double>(p->num_complete_groups));
    pool_incomplete_groups_.Add(l).Set(static_cast<double>(p->num_incomplete_groups));
    pool_policy_version_.Add(l).Set(static_cast<double>(p->policy_version));
    pool_stale_samples_.Add(l).Set(static_cast<double>(p->num_stale_samples));
    pool_unannotated_samples_.Add(l).Set(static_cast<double>(p->num_unannotated_samples));
    pool_stale_dropped_.Add(l).Set(static_cast<double>(p->num_stale_dropped));
    pool_incomplete_groups_dropped_.Add(l).Set(
        static_cast<double>(p->num_incomplete_groups_dropped));
  }
  collected_pools_ = std::move(current);
  std::optional<std::map<std::string, int64_t>> cluster;
  {
    absl::MutexLock lock(&cluster_live_steps_mu_);
    if (cluster_live_steps_) cluster = cluster_live_steps_();
  }
  if (!cluster.has_value()) return;
  // The cluster's steps, each once; this store's count is what it holds.
  int64_t total = 0;
  for (const auto& [pool, steps] : *cluster) {
    total += steps;
    pool_live_steps_.Add({{"pool", pool}}).Set(static_cast<double>(steps));
  }
  live_steps_.Add({}).Set(static_cast<double>(total));
  for (const std::string& pool : collected_pools_) {
    absl::StatusOr<PoolStats> p = store_->GetPool(pool);
    if (!p.ok()) continue;
    const metrics::Labels l{{"pool", pool}};
    pool_held_steps_.Add(l).Set(static_cast<double>(p->num_live_steps));
    if (!cluster->count(pool)) pool_live_steps_.Add(l).Set(0);
  }
}

void ServerMetrics::SetClusterLiveSteps(
    std::function<std::optional<std::map<std::string, int64_t>>()> source) {
  absl::MutexLock lock(&cluster_live_steps_mu_);
  cluster_live_steps_ = std::move(source);
}

}  // namespace rollpack
