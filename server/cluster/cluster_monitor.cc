#include "server/cluster/cluster_monitor.h"

#include <map>
#include <string>
#include <utility>

#include "absl/time/clock.h"
#include "rollpack/v1/scheduler.grpc.pb.h"

namespace rollpack {

void AddClusterMetrics(metrics::ScrapeRegistry& registry,
                       std::function<const Cluster*()> cluster) {
  // The member series made so far, to drop those of members no longer
  // tracked (scrapes are serialized: no lock).
  auto member_series = std::make_shared<std::map<std::string, metrics::Gauge*>>();
  registry.AddCollectCallback(
      [cluster = std::move(cluster), member_series,
       members = &registry.AddGauge(
           "rollpack_cluster_members",
           "Members of this member's cluster in the list etcd gave at its last lease renewal "
           "that read one; while rollpack_cluster_etcd_up is 0, the list it had when etcd went "
           "away."),
       up = &registry.AddGauge(
           "rollpack_cluster_etcd_up",
           "1 while etcd answers this member, 0 once no etcd call has succeeded for one "
           "attempt's deadline (3 s) and until one does (docs/cluster.md, \"When etcd is "
           "away\")."),
       unreachable = &registry.AddGauge(
           "rollpack_cluster_etcd_unreachable_seconds",
           "How long etcd has not answered this member, counted from the first failed call of "
           "the outage; 0 while it answers."),
       outages = &registry.AddCounter(
           "rollpack_cluster_etcd_outages_total",
           "Times etcd became unreachable from this member (rollpack_cluster_etcd_up going "
           "from 1 to 0)."),
       member_up = &registry.AddGauge(
           "rollpack_cluster_member_up",
           "Per member that has joined the cluster (as this member saw it): 1 while etcd lists "
           "it, 0 once its lease ran out without it leaving (killed, frozen, cut off), until it "
           "joins again or its roster entry runs out (10 min). A member that stops cleanly is "
           "dropped at once. Stale while rollpack_cluster_etcd_up is 0.")] {
        const Cluster* c = cluster();
        if (c == nullptr) return;
        members->Add({}).Set(c->last_member_count());
        const EtcdReachability& etcd = c->etcd_reachability();
        const EtcdReachability::State state = etcd.state();
        up->Add({}).Set(state.reachable ? 1 : 0);
        unreachable->Add({}).Set(absl::ToDoubleSeconds(etcd.UnreachableFor(absl::Now())));
        metrics::Counter& counter = outages->Add({});
        counter.Increment(static_cast<double>(state.outages) - counter.Value());
        const std::map<std::string, bool> now = c->MemberUp();
        for (auto it = member_series->begin(); it != member_series->end();) {
          if (now.count(it->first) == 0) {
            member_up->Remove(it->second);
            it = member_series->erase(it);
          } else {
            ++it;
          }
        }
        for (const auto& [member, is_up] : now) {
          metrics::Gauge*& gauge = (*member_series)[member];
          if (gauge == nullptr) gauge = &member_up->Add({{"member", member}});
          gauge->Set(is_up ? 1 : 0);
        }
      });
}

EtcdHealth::EtcdHealth(Cluster* cluster, grpc::HealthCheckServiceInterface* health)
    : cluster_(cluster), state_(std::make_shared<State>()) {
  {
    absl::MutexLock lock(&state_->mu);
    state_->cluster = cluster;
    state_->health = health;
  }
  cluster_->SetEtcdListener([state = state_](bool) { Apply(*state); });
  Apply(*state_);
}

EtcdHealth::~EtcdHealth() {
  cluster_->SetEtcdListener(nullptr);
  absl::MutexLock lock(&state_->mu);
  state_->cluster = nullptr;
}

void EtcdHealth::Apply(State& state) {
  absl::MutexLock lock(&state.mu);
  if (state.cluster == nullptr) return;
  state.health->SetServingStatus(v1::Scheduler::service_full_name(),
                                 state.cluster->etcd_reachable());
}

}  // namespace rollpack
