// Cluster mode: the server's side of operating cluster steps (docs/cluster.md,
// "Steps in operation"): the counts of live steps GetPool and the metrics
// report (the cluster's, each step once), samples lost with this member's
// data counted, and --step-ttl over every member's streams.
#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "server/cluster/cluster_pool_directory.h"
#include "server/cluster/cluster_steps.h"
#include "server/server.h"
#include "spdlog/spdlog.h"

namespace rollpack {

void RollpackServer::AttachClusterSteps(Cluster* cluster) {
  ClusterSteps* const steps = cluster_steps_;
  // Before the cluster is attached: GetPool reads it from then on.
  cluster_pools_->CountLiveStepsWith([steps](const std::string& pool) -> absl::StatusOr<int64_t> {
    absl::StatusOr<std::map<std::string, int64_t>> by_pool = steps->RefreshCensus();
    if (!by_pool.ok()) {
      // etcd away: the count the upkeep read last, as GetPool's
      // stale_membership says.
      std::optional<std::map<std::string, int64_t>> last = steps->LiveStepsByPool();
      if (!last.has_value()) return by_pool.status();
      by_pool = *std::move(last);
    }
    auto it = by_pool->find(pool);
    return it == by_pool->end() ? 0 : it->second;
  });
  cluster_pools_->Attach(cluster);
  steps->Attach(cluster);
  metrics_->SetClusterLiveSteps([steps] { return steps->LiveStepsByPool(); });
  registry_->AddCollectCallback(
      [steps, store = store_.get(),
       lost = &registry_->AddCounter(
           "rollpack_cluster_lost_samples_total",
           "Samples of live steps lost with this member's data: it was restarted without "
           "them (docs/cluster.md, \"Data loss\"); each step counted once cluster-wide.")] {
        // Every pool at 0 from the start, so that an alert sees the rise.
        for (const std::string& pool : store->PoolNames()) lost->Add({{"pool", pool}});
        for (const auto& [pool, samples] : steps->lost_samples()) {
          metrics::Counter& c = lost->Add({{"pool", pool}});
          c.Increment(static_cast<double>(samples) - c.Value());
        }
      });
}

void RollpackServer::StartClusterStepExpiry(absl::Duration ttl) {
  // Each member sees only the streams it serves: one member releases the
  // cluster's idle steps once every other says none of its streams is open
  // or recent (ClusterSteps::ExpireIdleSteps).
  ClusterSteps* const steps = cluster_steps_;
  StepActivity* const activity = step_activity_.get();
  ServerMetrics* const metrics = metrics_.get();
  step_expiry_ = std::make_unique<PeriodicThread>(
      std::clamp(ttl / 4, absl::Milliseconds(100), absl::Seconds(1)),
      [steps, activity, metrics, ttl] {
        for (const auto& [id, released] : steps->ExpireIdleSteps(activity, ttl)) {
          activity->StepReleased(id);
          metrics->OnStepReleased(released.released_samples, released.freed_bytes);
          metrics->OnStepExpired();
          spdlog::warn("rollpackd: released cluster step \"{}\" ({} samples deleted, {} "
                       "returned): no trainer stream on any member and no activity for "
                       "--step-ttl {}",
                       id, released.released_samples, released.returned_samples,
                       absl::FormatDuration(ttl));
        }
      });
}

}  // namespace rollpack
