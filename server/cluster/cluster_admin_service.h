// gRPC adapter of ClusterAdmin (cluster_admin.proto): the operator's view of
// the cluster (etcd, every member and its pools) and draining a member
// before its maintenance (docs/cluster.md, "Maintenance: draining a
// member"). Served by every rollpackd: a single server reports itself and
// refuses a drain.
#ifndef ROLLPACK_SERVER_CLUSTER_CLUSTER_ADMIN_SERVICE_H_
#define ROLLPACK_SERVER_CLUSTER_CLUSTER_ADMIN_SERVICE_H_

#include <atomic>
#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "base/worker_pool.h"
#include "rollpack/v1/cluster_admin.grpc.pb.h"
#include "server/cluster/cluster.h"
#include "server/ops/auth.h"
#include "server/ops/metrics/scrape_registry.h"
#include "server/store/sample_store.h"

namespace rollpack {

class ClusterAdminService final : public v1::ClusterAdmin::CallbackService {
 public:
  // `self_address`: this server's address once it listens (a single
  // server's line). With `cluster_mode`, calls answer UNAVAILABLE until
  // AttachCluster. `auth` may be null (auth off). `registry` (may be null)
  // gets rollpack_cluster_member_draining: 1 while the attached cluster's
  // member (this one) is drained, else 0; the service outlives its scrapes.
  ClusterAdminService(const SampleStore* store, const Authorizer* auth, bool cluster_mode,
                      std::function<std::string()> self_address,
                      metrics::ScrapeRegistry* registry = nullptr);

  void AttachCluster(Cluster* cluster) { cluster_.store(cluster); }

  grpc::ServerUnaryReactor* GetClusterStatus(grpc::CallbackServerContext* context,
                                             const v1::GetClusterStatusRequest* request,
                                             v1::ClusterStatus* response) override;
  grpc::ServerUnaryReactor* DrainMember(grpc::CallbackServerContext* context,
                                        const v1::DrainMemberRequest* request,
                                        v1::DrainMemberResponse* response) override;
  grpc::ServerUnaryReactor* UndrainMember(grpc::CallbackServerContext* context,
                                          const v1::DrainMemberRequest* request,
                                          v1::DrainMemberResponse* response) override;

  // The status without the call (tests, benchmarks).
  absl::StatusOr<v1::ClusterStatus> Status();
  // Sets `member`'s drain in etcd, then has the member apply it now.
  absl::StatusOr<v1::DrainMemberResponse> SetDrained(const std::string& member, bool drained);

 private:
  absl::StatusOr<Cluster*> Joined() const;
  // `member`'s own line (LocalStatus), reading its drain key again first
  // when `reread_drain`; an unreachable member's line says why.
  v1::ClusterMemberStatus AskMember(Cluster* cluster, const ClusterMember& member,
                                    bool reread_drain);
  // Checks the caller's role, then runs `work` off gRPC's handler thread
  // (it waits on etcd and the members) and finishes with its status.
  grpc::ServerUnaryReactor* Serve(grpc::CallbackServerContext* context, const char* method,
                                  std::function<absl::Status()> work);

  const SampleStore* const store_;
  const Authorizer* const auth_;
  const bool cluster_mode_;
  const std::function<std::string()> self_address_;
  std::atomic<Cluster*> cluster_{nullptr};
  // One member's answer; a member that does not answer in time is listed
  // with its error.
  const absl::Duration member_timeout_ = absl::Seconds(3);
  WorkerPool calls_{2};
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_CLUSTER_CLUSTER_ADMIN_SERVICE_H_
