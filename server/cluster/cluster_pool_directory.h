// A cluster member's pool directory (server/store/pool_directory.h): a
// pool's model, options and fields are fixed once in etcd for every member,
// and its samples are spread over the members that received them, so whole-
// pool calls ask every live member for its share (docs/cluster.md).
#ifndef ROLLPACK_SERVER_CLUSTER_CLUSTER_POOL_DIRECTORY_H_
#define ROLLPACK_SERVER_CLUSTER_CLUSTER_POOL_DIRECTORY_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/cluster/cluster.h"
#include "server/cluster/pool_admin.h"
#include "server/store/pool_directory.h"
#include "server/store/sample_store.h"
#include "server/store/step_directory.h"

namespace rollpack {

class ClusterPoolDirectory final : public PoolDirectory {
 public:
  // `steps`: the cluster's steps (a forced DeletePool releases the pool's).
  // `options.on_step_released` is told of each step that releases.
  ClusterPoolDirectory(SampleStore* store, StepDirectory* steps, ClusterPoolsOptions options = {})
      : store_(store), steps_(steps), options_(std::move(options)) {}

  // The cluster this member joined once its port was known; null again as
  // it leaves. Until then every call that needs it answers UNAVAILABLE (a
  // retryable code), and GetPoolHere alone answers.
  void Attach(Cluster* cluster) { cluster_.store(cluster); }
  // docs/cluster.md, "Counting steps": the cluster's live steps of a pool,
  // each once, which GetPool's total reports instead of the sum of the
  // members' holds. Set before Attach: GetPool reads it from then on.
  void CountLiveStepsWith(std::function<absl::StatusOr<int64_t>(const std::string& pool)> count) {
    live_steps_of_pool_ = std::move(count);
  }

  absl::StatusOr<bool> Register(const std::string& pool, const ModelSpec& model,
                                const std::optional<PoolOptions>& options) override;
  absl::StatusOr<std::optional<PoolDefinition>> Resolve(const std::string& pool) override;
  bool FixesSchemasBeforePut() const override { return true; }
  absl::StatusOr<std::map<std::string, FieldSchema>> FixSchema(
      const std::string& pool, const std::map<std::string, FieldSchema>& proposed) override;
  // Until the join has read this member's drain key, it may be drained.
  absl::Status AcceptsNewSamples() const override;
  // The pool summed over every live member's share (while etcd is away:
  // over the members this member last listed, said so in stale_membership).
  absl::StatusOr<v1::PoolInfo> GetPool(const std::string& pool) override;
  absl::StatusOr<v1::PoolInfo> GetPoolHere(const std::string& pool) const override;
  absl::StatusOr<std::vector<std::string>> PoolNames() override;
  // Any member takes it for samples on any member (cluster_annotations.h).
  absl::StatusOr<int32_t> Annotate(const std::string& pool,
                                   std::vector<ScalarAnnotation> annotations) override;
  // DeletePoolOverCluster; with local_only, this member's share
  // (DeleteLocalPool). Either forgets what this member remembers of the
  // pool's etcd facts.
  absl::StatusOr<v1::DeletePoolResponse> DeletePool(
      const v1::DeletePoolRequest& request) override;
  // ListSamplesOverCluster; with local_only, this member's share.
  absl::StatusOr<v1::ListSamplesResponse> ListSamples(
      const v1::ListSamplesRequest& request) override;

 private:
  // The attached cluster; UNAVAILABLE (`why`) before the join and after
  // leaving.
  absl::StatusOr<Cluster*> Joined(const char* why) const;

  SampleStore* const store_;
  StepDirectory* const steps_;
  const ClusterPoolsOptions options_;
  std::atomic<Cluster*> cluster_{nullptr};
  std::function<absl::StatusOr<int64_t>(const std::string& pool)> live_steps_of_pool_;
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_CLUSTER_CLUSTER_POOL_DIRECTORY_H_
