#include "server/cluster/member_status.h"

#include "base/version.h"

namespace rollpack {

v1::ClusterMemberStatus LocalMemberStatus(const SampleStore& store, const std::string& member,
                                          bool draining) {
  v1::ClusterMemberStatus status;
  status.set_member(member);
  status.set_reachable(true);
  status.set_reports_draining(draining);
  status.set_version(kRollpackVersion);
  status.set_max_memory_bytes(store.Stats().max_memory_bytes);
  for (const std::string& pool : store.PoolNames()) {
    // A pool deleted between the two calls is left out.
    absl::StatusOr<PoolStats> stats = store.GetPool(pool);
    if (!stats.ok()) continue;
    v1::MemberPoolStatus* line = status.add_pools();
    line->set_pool(pool);
    line->set_num_samples(stats->num_samples);
    line->set_num_free_samples(stats->num_free_samples);
    line->set_stored_bytes(stats->stored_bytes);
    line->set_num_live_steps(stats->num_live_steps);
    line->set_num_open_samples(stats->num_open_samples);
    status.set_num_samples(status.num_samples() + stats->num_samples);
    status.set_num_free_samples(status.num_free_samples() + stats->num_free_samples);
    status.set_stored_bytes(status.stored_bytes() + stats->stored_bytes);
    status.set_num_live_steps(status.num_live_steps() + stats->num_live_steps);
  }
  return status;
}

}  // namespace rollpack
