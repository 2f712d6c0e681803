#include "server/store/local_pools.h"

#include <set>
#include <string>
#include <vector>

#include "base/status_macros.h"
#include "server/store/pool_info.h"
#include "server/store/sample_pages.h"

namespace rollpack {

absl::StatusOr<v1::PoolInfo> LocalPools::GetPoolHere(const std::string& pool) const {
  ASSIGN_OR_RETURN(PoolStats stats, store_->GetPool(pool));
  return PoolInfoToProto(stats, store_->Stats(), /*group_shares=*/false);
}

absl::StatusOr<v1::DeletePoolResponse> LocalPools::DeletePool(
    const v1::DeletePoolRequest& request) {
  v1::DeletePoolResponse response;
  response.set_pool(request.pool());
  response.set_dry_run(request.dry_run());
  // Forced: the live steps are released as ReleaseStep would (their R2
  // stages give their memory back too); a step created meanwhile is ended
  // by the store with the pool, under the lock that deletes it.
  std::set<std::string> released;
  if (request.force() && !request.dry_run() && steps_ != nullptr) {
    absl::StatusOr<std::vector<LiveStep>> live = steps_->ListSteps(request.pool());
    for (const LiveStep& step : live.ok() ? *live : std::vector<LiveStep>()) {
      absl::StatusOr<ReleaseResult> r = steps_->ReleaseStep(step.step->step_id);
      if (!r.ok()) continue;
      released.insert(step.step->step_id);
      if (on_step_released_) on_step_released_(*r);
    }
  }
  ASSIGN_OR_RETURN(SampleStore::PoolDeletion deletion,
                   store_->DeletePool(request.pool(), request.force(), request.dry_run()));
  response.set_deleted_samples(deletion.samples);
  response.set_deleted_bytes(deletion.bytes);
  released.insert(deletion.ended_steps.begin(), deletion.ended_steps.end());
  for (const std::string& id : released) response.add_released_steps(id);
  return response;
}

absl::StatusOr<v1::ListSamplesResponse> LocalPools::ListSamples(
    const v1::ListSamplesRequest& request) {
  return ListLocalSamples(store_, request, /*member=*/"");
}

}  // namespace rollpack
