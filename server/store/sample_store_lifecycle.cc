// SampleStore's sample lifecycle (../shared/spec/lifecycle.md) over its
// pools (pool.h): groups dropped for staying incomplete, samples sent in
// pieces, the trainer's policy version and stale samples, and reuse at
// release.
#include <algorithm>
#include <memory>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "server/store/convert.h"
#include "server/store/durable_log.h"
#include "server/store/log_records.h"
#include "server/store/names.h"
#include "server/store/sample_store.h"

namespace rollpack {

absl::StatusOr<PoolOptions> SampleStore::GetOptions(const std::string& pool_name) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = pools_.find(pool_name);
  if (it == pools_.end()) {
    return absl::NotFoundError(absl::StrCat("pool \"", pool_name, "\" has no registered model"));
  }
  return it->second.options;
}

absl::Status SampleStore::DropFreeLocked(const std::string& pool_name, Pool& pool,
                                         const std::vector<std::string>& ids, int reason,
                                         const std::vector<std::string>& groups,
                                         bool count_groups, int64_t* ticket,
                                         const std::vector<std::string>& open_ids) {
  if (ids.empty() && groups.empty() && open_ids.empty()) return absl::OkStatus();
  if (log_ != nullptr) {
    v1::DroppedSamplesRecord record;
    record.set_pool(pool_name);
    for (const std::string& id : ids) record.add_sample_ids(id);
    record.set_reason(static_cast<v1::DroppedSamplesRecord::Reason>(reason));
    record.set_num_groups(count_groups ? static_cast<int64_t>(groups.size()) : 0);
    for (const std::string& group : groups) record.add_group_ids(group);
    for (const std::string& id : open_ids) record.add_open_sample_ids(id);
    const std::string bytes = record.SerializeAsString();
    ASSIGN_OR_RETURN(*ticket, log_->Append(RecordType::kDropSamples, bytes));
    int64_t dead = LogRecordBytes(bytes.size());
    for (const std::string& id : ids) dead += LoggedSampleBytes(*pool.samples.at(id));
    for (const std::string& id : open_ids) dead += LoggedSampleBytes(*pool.open.Find(id));
    log_->AddDeadBytes(dead);
  }
  for (const std::string& id : ids) pool.free_by_arrival.erase(pool.arrival_of.at(id));
  EraseSamples(pool, ids);
  stored_bytes_ -= pool.EraseOpen(open_ids);
  if (reason == v1::DroppedSamplesRecord::STALE) {
    pool.stale_dropped += static_cast<int64_t>(ids.size());
  } else {
    if (count_groups) pool.incomplete_groups_dropped += static_cast<int64_t>(groups.size());
    pool.ExpireGroups(groups);
  }
  return absl::OkStatus();
}

absl::StatusOr<ReleaseResult> SampleStore::ReturnToFree(const std::string& pool_name, Pool& pool,
                                                        absl::Span<const std::string> ids,
                                                        bool log_drop) {
  std::vector<std::string> closed;
  for (const std::string& id : ids) {
    const StoredSample& s = *pool.samples.at(id);
    if (s.grouped()) {
      auto group = pool.groups.find(s.group_id);
      if (group != pool.groups.end() && group->second.expired) {
        closed.push_back(id);
        continue;
      }
    }
  }
  if (!closed.empty() && log_drop && log_ != nullptr) {
    v1::DroppedSamplesRecord record;
    record.set_pool(pool_name);
    for (const std::string& id : closed) record.add_sample_ids(id);
    record.set_reason(v1::DroppedSamplesRecord::INCOMPLETE_GROUP);
    const std::string bytes = record.SerializeAsString();
    if (log_->Append(RecordType::kDropSamples, bytes).ok()) {
      log_->AddDeadBytes(LogRecordBytes(bytes.size()));
    } else {
      // Not deleted without a record: they go back like the rest (and are
      // counted against memory until their group's id is reused or the
      // pool is compacted away; the log's error is counted by the log).
      closed.clear();
    }
  }
  ReleaseResult result;
  for (const std::string& id : ids) {
    pool.free_by_arrival.emplace(pool.arrival_of.at(id), pool.samples.at(id));
    result.returned_samples++;
  }
  if (closed.empty()) return result;
  for (const std::string& id : closed) {
    pool.free_by_arrival.erase(pool.arrival_of.at(id));
    if (log_ != nullptr) log_->AddDeadBytes(LoggedSampleBytes(*pool.samples.at(id)));
  }
  const ReleaseResult erased = EraseSamples(pool, closed);
  result.returned_samples -= erased.released_samples;
  result.released_samples = erased.released_samples;
  result.freed_bytes = erased.freed_bytes;
  return result;
}

absl::StatusOr<DropResult> SampleStore::AdvanceVersionLocked(const std::string& pool_name,
                                                             Pool& pool, int64_t policy_version,
                                                             int64_t* ticket) {
  DropResult result;
  if (policy_version <= pool.policy_version) return result;
  if (log_ != nullptr) {
    ASSIGN_OR_RETURN(*ticket, log_->Append(RecordType::kSetPolicyVersion,
                                           EncodeSetPolicyVersion(pool_name, policy_version)));
  }
  pool.policy_version = policy_version;
  if (!pool.options.drop_stale || !pool.options.max_staleness.has_value()) return result;
  SelectionRequest staleness;
  staleness.policy_version = policy_version;
  staleness.max_staleness = pool.options.max_staleness;
  std::vector<std::string> stale;
  for (const auto& [arrival, sample] : pool.free_by_arrival) {
    if (IsStale(staleness, sample->policy_version)) stale.push_back(sample->sample_id);
  }
  RETURN_IF_ERROR(
      DropFreeLocked(pool_name, pool, stale, v1::DroppedSamplesRecord::STALE, {}, true, ticket));
  result.stale_samples = static_cast<int64_t>(stale.size());
  return result;
}

absl::StatusOr<PoolStats> SampleStore::SetPolicyVersion(const std::string& pool_name,
                                                        int64_t policy_version) {
  RETURN_IF_ERROR(ValidateName("pool name", pool_name, kMaxPoolNameBytes));
  if (policy_version < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("policy_version is ", policy_version, ", must be >= 0"));
  }
  int64_t ticket = 0;
  PoolStats stats;
  {
    absl::MutexLock lock(&mu_);
    auto it = pools_.find(pool_name);
    if (it == pools_.end()) {
      return absl::NotFoundError(absl::StrCat("pool \"", pool_name, "\" has no registered model"));
    }
    RETURN_IF_ERROR(AdvanceVersionLocked(pool_name, it->second, policy_version, &ticket).status());
    stats = it->second.Stats(pool_name);
  }
  if (log_ != nullptr && ticket > 0) RETURN_IF_ERROR(log_->Sync(ticket));
  return stats;
}

std::map<std::string, std::vector<std::string>> SampleStore::ExpiredGroups(
    absl::Time now) const {
  const int64_t now_nanos = absl::ToUnixNanos(now);
  std::map<std::string, std::vector<std::string>> expired;
  absl::ReaderMutexLock lock(&mu_);
  for (const auto& [name, pool] : pools_) {
    std::vector<std::string> groups = pool.ExpiredGroups(now_nanos);
    if (!groups.empty()) expired.emplace(name, std::move(groups));
  }
  return expired;
}

absl::StatusOr<DropResult> SampleStore::DropGroups(const std::string& pool_name,
                                                   const std::vector<std::string>& group_ids,
                                                   bool count) {
  DropResult result;
  int64_t ticket = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = pools_.find(pool_name);
    if (it == pools_.end()) return result;
    Pool& pool = it->second;
    const std::vector<std::string> groups = pool.StillIncomplete(group_ids);
    if (groups.empty()) return result;
    const absl::flat_hash_set<std::string> doomed(groups.begin(), groups.end());
    // Only free samples: one in a live step stays until its release.
    std::vector<std::string> ids;
    for (const auto& [arrival, sample] : pool.free_by_arrival) {
      const StoredSample& s = *sample;
      if (s.grouped() && doomed.contains(s.group_id)) ids.push_back(s.sample_id);
    }
    // Open samples of the group go too: it can never be complete again.
    std::vector<std::string> open_ids;
    for (const auto& [id, open] : pool.open) {
      if (open.sample.grouped() && doomed.contains(open.sample.group_id)) open_ids.push_back(id);
    }
    std::sort(open_ids.begin(), open_ids.end());
    RETURN_IF_ERROR(DropFreeLocked(pool_name, pool, ids, v1::DroppedSamplesRecord::INCOMPLETE_GROUP,
                                   groups, count, &ticket, open_ids));
    result.groups = static_cast<int64_t>(groups.size());
    result.group_samples = static_cast<int64_t>(ids.size() + open_ids.size());
  }
  if (log_ != nullptr && ticket > 0) RETURN_IF_ERROR(log_->Sync(ticket));
  return result;
}

absl::StatusOr<DropResult> SampleStore::DropExpiredGroups(absl::Time now) {
  DropResult total;
  for (const auto& [pool, groups] : ExpiredGroups(now)) {
    ASSIGN_OR_RETURN(DropResult dropped, DropGroups(pool, groups, /*count=*/true));
    total.groups += dropped.groups;
    total.group_samples += dropped.group_samples;
  }
  return total;
}

ReleaseResult SampleStore::ReleaseSamples(Pool& pool, absl::Span<const std::string> sample_ids,
                                          bool reuse) {
  if (!reuse) return EraseSamples(pool, sample_ids);
  std::vector<std::string> spent, again;
  for (const std::string& id : sample_ids) {
    const int32_t uses = ++pool.uses[id];
    if (pool.options.max_uses > 0 && uses >= pool.options.max_uses) {
      spent.push_back(id);
      // Its log bytes are dead now (a plain release counts them itself).
      if (log_ != nullptr) log_->AddDeadBytes(LoggedSampleBytes(*pool.samples.at(id)));
      continue;
    }
    again.push_back(id);
  }
  ReleaseResult result = EraseSamples(pool, spent);
  // The release record replays this deletion of closed groups' samples too.
  absl::StatusOr<ReleaseResult> back = ReturnToFree("", pool, again, /*log_drop=*/false);
  result.returned_samples = back->returned_samples;
  result.released_samples += back->released_samples;
  result.freed_bytes += back->freed_bytes;
  return result;
}

absl::Status SampleStore::ReplayPolicyVersion(const std::string& pool_name,
                                              int64_t policy_version) {
  absl::MutexLock lock(&mu_);
  auto it = pools_.find(pool_name);
  if (it == pools_.end()) {
    return absl::DataLossError(absl::StrCat("policy version of unknown pool \"", pool_name, "\""));
  }
  it->second.policy_version = std::max(it->second.policy_version, policy_version);
  return absl::OkStatus();
}

absl::Status SampleStore::ReplayDrop(const v1::DroppedSamplesRecord& record) {
  absl::MutexLock lock(&mu_);
  auto it = pools_.find(record.pool());
  if (it == pools_.end()) {
    return absl::DataLossError(absl::StrCat("drop in unknown pool \"", record.pool(), "\""));
  }
  Pool& pool = it->second;
  std::vector<std::string> ids(record.sample_ids().begin(), record.sample_ids().end());
  for (const std::string& id : ids) {
    auto arrival = pool.arrival_of.find(id);
    if (arrival == pool.arrival_of.end() || pool.free_by_arrival.count(arrival->second) == 0) {
      return absl::DataLossError(absl::StrCat("dropped sample \"", id, "\" is not free"));
    }
  }
  std::vector<std::string> open_ids(record.open_sample_ids().begin(),
                                    record.open_sample_ids().end());
  for (const std::string& id : open_ids) {
    if (!pool.open.contains(id)) {
      return absl::DataLossError(absl::StrCat("dropped open sample \"", id, "\" is not open"));
    }
  }
  for (const std::string& id : ids) pool.free_by_arrival.erase(pool.arrival_of.at(id));
  EraseSamples(pool, ids);
  stored_bytes_ -= pool.EraseOpen(open_ids);
  if (record.reason() == v1::DroppedSamplesRecord::STALE) {
    pool.stale_dropped += static_cast<int64_t>(ids.size()) + record.num_samples_counted();
  } else {
    pool.incomplete_groups_dropped += record.num_groups();
    std::vector<std::string> groups(record.group_ids().begin(), record.group_ids().end());
    pool.ExpireGroups(groups);
  }
  return absl::OkStatus();
}

absl::Status SampleStore::ReplayUses(const v1::SampleUsesRecord& record) {
  absl::MutexLock lock(&mu_);
  auto it = pools_.find(record.pool());
  if (it == pools_.end() || record.sample_ids_size() != record.uses_size()) {
    return absl::DataLossError(absl::StrCat("uses record of pool \"", record.pool(),
                                            "\" does not match the store"));
  }
  for (int i = 0; i < record.sample_ids_size(); ++i) {
    if (!it->second.samples.contains(record.sample_ids(i))) {
      return absl::DataLossError(absl::StrCat("uses of unknown sample \"", record.sample_ids(i), "\""));
    }
    it->second.uses[record.sample_ids(i)] = record.uses(i);
  }
  return absl::OkStatus();
}

// Samples sent in pieces (lifecycle.md section 5): the pool's OpenSamples
// keeps the pieces, the pool their groups and the free set
// (Pool::ApplyPiece); the store adds what only it knows, a prepared
// annotation of the sample.

absl::StatusOr<OpenSamples::Plan> SampleStore::PlanPiece(const std::string& pool_name,
                                                         const Pool& pool,
                                                         const StoredSample& piece) const {
  auto sealed = pool.samples.find(piece.sample_id);
  const ScalarAnnotation* pending = nullptr;
  if (!pool.reserved.empty()) ReservationOf(pool, piece.sample_id, absl::Now(), &pending);
  return pool.open.PlanPiece(pool_name, pool.model, piece,
                             sealed == pool.samples.end() ? nullptr : sealed->second.get(),
                             pending);
}

absl::StatusOr<SampleStore::OpenSampleState> SampleStore::GetOpenSample(
    const std::string& pool_name, const std::string& sample_id) const {
  absl::ReaderMutexLock lock(&mu_);
  auto pool = pools_.find(pool_name);
  if (pool == pools_.end()) {
    return absl::NotFoundError(absl::StrCat("pool \"", pool_name, "\" has no registered model"));
  }
  std::optional<OpenSampleState> state = pool->second.open.State(sample_id);
  if (!state.has_value()) {
    if (pool->second.samples.contains(sample_id)) {
      return absl::FailedPreconditionError(
          absl::StrCat("sample \"", sample_id, "\" of pool \"", pool_name, "\" is sealed"));
    }
    return absl::NotFoundError(
        absl::StrCat("pool \"", pool_name, "\" has no sample \"", sample_id, "\""));
  }
  return *std::move(state);
}

}  // namespace rollpack
