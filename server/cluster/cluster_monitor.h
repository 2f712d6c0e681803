// What a cluster member tells its operator about etcd and the other
// members (docs/operations.md, "Metrics" and "Health"; docs/cluster.md,
// "When etcd is away"): the rollpack_cluster_* gauges and counters, and the
// grpc.health status of the services that need etcd.
#ifndef ROLLPACK_SERVER_CLUSTER_CLUSTER_MONITOR_H_
#define ROLLPACK_SERVER_CLUSTER_CLUSTER_MONITOR_H_

#include <functional>
#include <memory>

#include "absl/synchronization/mutex.h"
#include "grpcpp/health_check_service_interface.h"
#include "server/cluster/cluster.h"
#include "server/ops/metrics/scrape_registry.h"

namespace rollpack {

// Declares rollpack_cluster_members, rollpack_cluster_etcd_up,
// rollpack_cluster_etcd_unreachable_seconds,
// rollpack_cluster_etcd_outages_total and rollpack_cluster_member_up{member}
// in `registry`, read at each scrape through `cluster` (null once the member
// left its cluster: the series then stay as last read).
void AddClusterMetrics(metrics::ScrapeRegistry& registry,
                       std::function<const Cluster*()> cluster);

// The services that cannot work while etcd is unreachable: creating and
// releasing steps (rollpack.v1.Scheduler). The others stay SERVING (puts to
// known pools, fetches of known steps and peers' calls go on), and so does
// the server's overall status (""), so that a probe does not restart a
// member that is waiting for etcd.
class EtcdHealth {
 public:
  // Sets the statuses from `cluster`'s etcd now and at each change of its
  // reachability, until destroyed. `health` outlives this; once it is shut
  // down (RollpackServer::Shutdown), gRPC keeps every status NOT_SERVING.
  EtcdHealth(Cluster* cluster, grpc::HealthCheckServiceInterface* health);
  ~EtcdHealth();
  EtcdHealth(const EtcdHealth&) = delete;
  EtcdHealth& operator=(const EtcdHealth&) = delete;

 private:
  // Shared with the listener, which may run on an etcd caller's thread a
  // moment after this is destroyed: it then does nothing.
  struct State {
    absl::Mutex mu;
    Cluster* cluster ABSL_GUARDED_BY(mu);  // null once detached
    grpc::HealthCheckServiceInterface* health;
  };
  // Sets the statuses from the state etcd is in now: changes seen by
  // several threads apply in the order they take the lock.
  static void Apply(State& state);

  Cluster* const cluster_;
  const std::shared_ptr<State> state_;
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_CLUSTER_CLUSTER_MONITOR_H_
