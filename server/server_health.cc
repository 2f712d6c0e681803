// What rollpackd reports about its services and, in cluster mode, about
// etcd and the other members (docs/operations.md, "Health"; docs/cluster.md,
// "When etcd is away").
#include <string>

#include "grpcpp/health_check_service_interface.h"
#include "rollpack/v1/member.grpc.pb.h"
#include "rollpack/v1/rollouts.grpc.pb.h"
#include "rollpack/v1/scheduler.grpc.pb.h"
#include "rollpack/v1/trainer.grpc.pb.h"
#include "server/cluster/cluster.h"
#include "server/cluster/cluster_monitor.h"
#include "server/server.h"

namespace rollpack {

void RollpackServer::SetServiceHealth(bool cluster_mode) {
  grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
  if (health == nullptr) return;
  // The overall status ("") is gRPC's: SERVING until shutdown.
  health->SetServingStatus(v1::Rollouts::service_full_name(), true);
  health->SetServingStatus(v1::Trainer::service_full_name(), true);
  // A member creates steps only once it is in its cluster (ReportCluster).
  health->SetServingStatus(v1::Scheduler::service_full_name(), !cluster_mode);
  if (cluster_mode) health->SetServingStatus(v1::Member::service_full_name(), true);
}

void RollpackServer::ReportCluster() {
  Cluster* const cluster = cluster_.get();
  // Its pools were fixed in etcd when this member took them first: they
  // are known while etcd is away, as the pools it took since.
  for (const std::string& pool : store_->PoolNames()) {
    absl::StatusOr<ModelSpec> model = store_->GetModel(pool);
    absl::StatusOr<PoolOptions> options = store_->GetOptions(pool);
    if (model.ok() && options.ok()) cluster->RememberPool(pool, *model, *options);
  }
  // Read through the server: the cluster goes away at shutdown.
  AddClusterMetrics(*registry_, [this]() -> const Cluster* { return cluster_.get(); });
  if (grpc::HealthCheckServiceInterface* health = server_->GetHealthCheckService();
      health != nullptr) {
    etcd_health_ = std::make_unique<EtcdHealth>(cluster, health);
  }
}

}  // namespace rollpack
