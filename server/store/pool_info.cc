#include "server/store/pool_info.h"

#include <algorithm>
#include <map>

#include "server/store/convert.h"

namespace rollpack {

namespace {

void SetGroupShare(const GroupShareStats& group, v1::GroupShare* share) {
  share->set_group_id(group.group_id);
  share->set_group_size(group.group_size);
  share->set_num_sealed(group.num_sealed);
  share->set_first_sealed_unix_nanos(group.first_sealed_unix_nanos);
}

}  // namespace

v1::PoolInfo PoolInfoToProto(const PoolStats& stats, const StoreStats& store,
                             bool group_shares) {
  v1::PoolInfo info;
  info.set_pool(stats.pool);
  *info.mutable_model() = ToProto(stats.model);
  info.set_num_samples(stats.num_samples);
  info.set_num_free_samples(stats.num_free_samples);
  info.set_num_live_steps(stats.num_live_steps);
  info.set_stored_bytes(stats.stored_bytes);
  for (const auto& [name, field] : stats.token_fields) {
    (*info.mutable_token_field_dtypes())[name] = field.dtype;
  }
  for (const std::string& name : stats.ragged_fields) info.add_ragged_token_fields(name);
  info.set_server_stored_bytes(store.stored_bytes);
  info.set_server_max_memory_bytes(store.max_memory_bytes);
  info.set_num_complete_groups(stats.num_complete_groups);
  info.set_num_incomplete_groups(stats.num_incomplete_groups);
  info.set_num_open_samples(stats.num_open_samples);
  info.set_policy_version(stats.policy_version);
  info.set_num_stale_dropped(stats.num_stale_dropped);
  info.set_num_incomplete_groups_dropped(stats.num_incomplete_groups_dropped);
  info.set_num_stale_samples(stats.num_stale_samples);
  info.set_num_unannotated_samples(stats.num_unannotated_samples);
  *info.mutable_options() = ToProto(stats.options);
  if (group_shares) {
    for (const GroupShareStats& group : stats.incomplete_groups) {
      SetGroupShare(group, info.add_incomplete_group_shares());
    }
  }
  return info;
}

void AddCompleteGroupShares(const std::vector<GroupShareStats>& complete, v1::PoolInfo* info) {
  for (const GroupShareStats& group : complete) {
    SetGroupShare(group, info->add_complete_group_shares());
  }
}

void AddPoolShare(const std::string& member, const absl::StatusOr<v1::PoolInfo>& info,
                  v1::PoolInfo* total) {
  v1::MemberPoolInfo* share = total->add_members();
  share->set_member(member);
  if (absl::IsNotFound(info.status())) return;  // no sample of the pool there yet
  if (!info.ok()) {
    share->set_error(std::string(info.status().message()));
    return;
  }
  share->set_num_samples(info->num_samples());
  share->set_num_free_samples(info->num_free_samples());
  share->set_stored_bytes(info->stored_bytes());
  share->set_server_stored_bytes(info->server_stored_bytes());
  share->set_server_max_memory_bytes(info->server_max_memory_bytes());
  share->set_num_open_samples(info->num_open_samples());
  total->set_num_samples(total->num_samples() + info->num_samples());
  total->set_num_free_samples(total->num_free_samples() + info->num_free_samples());
  total->set_num_live_steps(total->num_live_steps() + info->num_live_steps());
  total->set_stored_bytes(total->stored_bytes() + info->stored_bytes());
  total->set_server_stored_bytes(total->server_stored_bytes() + info->server_stored_bytes());
  total->set_server_max_memory_bytes(total->server_max_memory_bytes() +
                                     info->server_max_memory_bytes());
  for (const auto& [name, dtype] : info->token_field_dtypes()) {
    (*total->mutable_token_field_dtypes())[name] = dtype;
  }
  // Fixed cluster-wide (etcd's schema record): any member that has them.
  if (total->ragged_token_fields_size() == 0) {
    *total->mutable_ragged_token_fields() = info->ragged_token_fields();
  }
  // Complete on one member is complete everywhere (a group never has more
  // than its size); incomplete ones are summed in FinishPoolShares.
  total->set_num_complete_groups(total->num_complete_groups() + info->num_complete_groups());
  total->set_num_open_samples(total->num_open_samples() + info->num_open_samples());
  total->set_policy_version(std::max(total->policy_version(), info->policy_version()));
  total->set_num_stale_dropped(total->num_stale_dropped() + info->num_stale_dropped());
  total->set_num_incomplete_groups_dropped(total->num_incomplete_groups_dropped() +
                                           info->num_incomplete_groups_dropped());
  total->set_num_stale_samples(total->num_stale_samples() + info->num_stale_samples());
  total->set_num_unannotated_samples(total->num_unannotated_samples() +
                                     info->num_unannotated_samples());
  *total->mutable_options() = info->options();
  for (const v1::GroupShare& group : info->incomplete_group_shares()) {
    *total->add_incomplete_group_shares() = group;
  }
}

namespace {

// Each group listed incomplete by some member: its size and the sealed
// samples summed over the members that listed it, by id (so the answer
// does not depend on the members' order).
std::map<std::string, std::pair<int32_t, int64_t>> SumIncompleteShares(const v1::PoolInfo& total) {
  std::map<std::string, std::pair<int32_t, int64_t>> groups;
  for (const v1::GroupShare& group : total.incomplete_group_shares()) {
    auto& [size, sealed] = groups[group.group_id()];
    size = group.group_size();
    sealed += group.num_sealed();
  }
  return groups;
}

}  // namespace

std::vector<std::string> GroupsToCheckForComplete(const v1::PoolInfo& total) {
  std::vector<std::string> ids;
  for (const auto& [id, size_sealed] : SumIncompleteShares(total)) {
    if (size_sealed.second <= size_sealed.first) ids.push_back(id);
  }
  return ids;
}

void FinishPoolShares(v1::PoolInfo* total,
                      const absl::flat_hash_map<std::string, int>& complete_holders) {
  // Complete when the cluster holds all of it. More samples than its size
  // (members check a group's size only against their own samples) is not
  // incomplete, and not complete either: selection never takes it
  // (docs/lifecycle.md, "Cluster mode"). A member holding it complete
  // counted it in num_complete_groups: taken back here.
  int64_t complete = 0;
  int64_t over_full = 0;
  int64_t counted_complete_elsewhere = 0;
  const auto groups = SumIncompleteShares(*total);
  for (const auto& [id, size_sealed] : groups) {
    const auto holders = complete_holders.find(id);
    if (holders != complete_holders.end() && holders->second > 0) {
      ++over_full;
      counted_complete_elsewhere += holders->second;
      continue;
    }
    if (size_sealed.second == size_sealed.first) ++complete;
    if (size_sealed.second > size_sealed.first) ++over_full;
  }
  total->set_num_complete_groups(
      std::max<int64_t>(0, total->num_complete_groups() + complete - counted_complete_elsewhere));
  total->set_num_incomplete_groups(static_cast<int64_t>(groups.size()) - complete - over_full);
  total->clear_incomplete_group_shares();
  total->clear_complete_group_shares();
}

}  // namespace rollpack
