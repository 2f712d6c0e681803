// SampleStore's whole-pool operations (sample_store.h, "Whole pools"):
// deleting a pool with everything it holds, listing its samples' metadata a
// page at a time, and fixing its fields (pool.h, "Schema") with the pool
// directory before its first batch here.
#include <algorithm>
#include <map>
#include <optional>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/status_macros.h"
#include "scheduler/sample_selection.h"
#include "server/store/durable_log.h"
#include "server/store/log_records.h"
#include "server/store/names.h"
#include "server/store/sample_store.h"

namespace rollpack {
namespace {

// "steps \"a\", \"b\" and 3 more": a refusal names a bounded number of ids.
std::string NameSteps(const std::vector<std::string>& ids) {
  constexpr size_t kNamed = 8;
  std::vector<std::string> named;
  for (size_t i = 0; i < ids.size() && i < kNamed; ++i) named.push_back(absl::StrCat("\"", ids[i], "\""));
  std::string out = absl::StrCat(ids.size() == 1 ? "step " : "steps ", absl::StrJoin(named, ", "));
  if (ids.size() > kNamed) absl::StrAppend(&out, " and ", ids.size() - kNamed, " more");
  return out;
}

}  // namespace

absl::StatusOr<SampleStore::PoolDeletion> SampleStore::DeletePool(const std::string& pool_name,
                                                                  bool force, bool dry_run) {
  RETURN_IF_ERROR(ValidateName("pool name", pool_name, kMaxPoolNameBytes));
  PoolDeletion deletion;
  int64_t ticket = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = pools_.find(pool_name);
    if (it == pools_.end()) {
      return absl::NotFoundError(absl::StrCat("pool \"", pool_name, "\" has no registered model"));
    }
    // A step being planned has taken samples out of the free set and comes
    // back for its pool when the plan is done: it must find it.
    for (const auto& [step_id, pool] : pending_steps_) {
      if (pool == pool_name) {
        return absl::AbortedError(absl::StrCat("pool \"", pool_name, "\": step \"", step_id,
                                               "\" is being created from it; retry"));
      }
    }
    std::vector<std::string> steps;
    for (const auto& [id, step] : steps_) {
      if (step->pool == pool_name) steps.push_back(id);
    }
    const std::vector<std::string> holds = holds_.Ids(pool_name);
    deletion.ended_steps = steps;
    deletion.ended_steps.insert(deletion.ended_steps.end(), holds.begin(), holds.end());
    std::sort(deletion.ended_steps.begin(), deletion.ended_steps.end());
    if (!force && !deletion.ended_steps.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "pool \"", pool_name, "\" has samples in live ", NameSteps(deletion.ended_steps),
          ": release them first, or delete with force (which releases them)"));
    }
    Pool& pool = it->second;
    deletion.samples = static_cast<int64_t>(pool.samples.size() + pool.open.size());
    deletion.bytes = pool.stored_bytes;
    if (dry_run) return deletion;
    if (log_ != nullptr) {
      const std::string record = EncodeDeletePool(pool_name);
      ASSIGN_OR_RETURN(ticket, log_->Append(RecordType::kDeletePool, record));
      // Everything the pool's records hold is dead once this one is written.
      int64_t dead = LogRecordBytes(record.size()) +
                     LogRecordBytes(EncodeRegisterModel(pool_name, pool.model, pool.options).size());
      for (const auto& [id, sample] : pool.samples) dead += LoggedSampleBytes(*sample);
      for (const auto& [id, open] : pool.open) dead += LoggedSampleBytes(open.sample);
      dead += pool.recompute_routing.LoggedBytes();
      for (const std::string& id : steps) {
        dead += LogRecordBytes(EncodeCreateStep(*steps_.at(id)).size());
      }
      log_->AddDeadBytes(dead);
    }
    // Ended, not released: their samples go with the pool, none returns.
    // A trainer stream already serving one keeps the samples it holds.
    for (const std::string& id : steps) {
      steps_.erase(id);
      step_created_unix_nanos_.erase(id);
    }
    for (const std::string& id : holds) holds_.Erase(id);
    for (auto ticket_it = annotation_tickets_.begin(); ticket_it != annotation_tickets_.end();) {
      if (ticket_it->second.pool == pool_name) {
        annotation_tickets_.erase(ticket_it++);
      } else {
        ++ticket_it;
      }
    }
    stored_bytes_ -= pool.stored_bytes;
    pools_.erase(it);
  }
  if (log_ != nullptr) RETURN_IF_ERROR(SyncRelease(ticket));
  return deletion;
}

absl::StatusOr<SampleStore::SamplePage> SampleStore::ListSamplePage(
    const std::string& pool_name, const SamplePageRequest& request) const {
  RETURN_IF_ERROR(ValidateName("pool name", pool_name, kMaxPoolNameBytes));
  absl::ReaderMutexLock lock(&mu_);
  auto pool_it = pools_.find(pool_name);
  if (pool_it == pools_.end()) {
    return absl::NotFoundError(absl::StrCat("pool \"", pool_name, "\" has no registered model"));
  }
  const Pool& pool = pool_it->second;
  SelectionRequest staleness;
  staleness.policy_version = pool.policy_version;
  staleness.max_staleness = pool.options.max_staleness;
  const bool judge_staleness = staleness.max_staleness.has_value() && pool.policy_version > 0;
  // Which step holds each held sample, from the pool's steps and holds (a
  // few, against a whole pool to scan): one lookup per sample, none when
  // every sample is free. A step still being planned has taken samples that
  // are in neither yet: then the free list itself is asked.
  absl::flat_hash_map<absl::string_view, const std::string*> holder;
  const bool any_held = pool.free_by_arrival.size() != pool.samples.size();
  bool planning = false;
  if (any_held) {
    for (const auto& [step_id, step] : steps_) {
      if (step->pool != pool_name) continue;
      for (const std::string& id : step->sample_ids) holder.emplace(id, &step_id);
    }
    for (const auto& [step_id, hold] : holds_) {
      if (hold.pool != pool_name) continue;
      for (const std::string& id : hold.sample_ids) holder.emplace(id, &step_id);
    }
    for (const auto& [step_id, pending_pool] : pending_steps_) planning |= pending_pool == pool_name;
  }
  auto sealed_state = [&](const std::string& id, const StoredSample& sample) {
    if (any_held && (holder.contains(id) ||
                     (planning && pool.free_by_arrival.count(pool.arrival_of.at(id)) == 0))) {
      return v1::SAMPLE_STATE_HELD;
    }
    if (judge_staleness && IsStale(staleness, sample.policy_version)) {
      return v1::SAMPLE_STATE_STALE;
    }
    return v1::SAMPLE_STATE_FREE;
  };
  auto wanted = [&](const std::string& id, const StoredSample& sample, v1::SampleState state) {
    return (request.state == v1::SAMPLE_STATE_UNSPECIFIED || request.state == state) &&
           (request.group_id.empty() || request.group_id == sample.group_id);
  };
  // Every match after the token, then the page's first ids by partial
  // selection: a page costs one pass over the pool, not a sort of it.
  struct Match {
    const std::string* id;
    const StoredSample* sample;
    v1::SampleState state;
  };
  std::vector<Match> matches;
  for (const auto& [id, sample] : pool.samples) {
    if (id <= request.after) continue;
    const v1::SampleState state = sealed_state(id, *sample);
    if (wanted(id, *sample, state)) matches.push_back({&id, sample.get(), state});
  }
  for (const auto& [id, open] : pool.open) {
    if (id > request.after && wanted(id, open.sample, v1::SAMPLE_STATE_OPEN)) {
      matches.push_back({&id, &open.sample, v1::SAMPLE_STATE_OPEN});
    }
  }
  auto by_id = [](const Match& a, const Match& b) { return *a.id < *b.id; };
  const size_t limit = static_cast<size_t>(std::max(request.limit, 1));
  SamplePage page;
  if (matches.size() > limit) {
    std::nth_element(matches.begin(), matches.begin() + limit, matches.end(), by_id);
    matches.resize(limit);
    page.more = true;
  }
  std::sort(matches.begin(), matches.end(), by_id);

  page.samples.reserve(matches.size());
  for (const Match& m : matches) {
    const StoredSample& sample = *m.sample;
    v1::SampleInfo& info = page.samples.emplace_back();
    info.set_sample_id(*m.id);
    info.set_num_tokens(sample.num_tokens());
    info.set_group_id(sample.group_id);
    info.set_group_size(sample.group_size);
    info.set_policy_version(sample.policy_version);
    info.set_state(m.state);
    // A sample taken by a step still being planned has no holder yet.
    if (auto h = holder.find(*m.id); h != holder.end()) info.set_step_id(*h->second);
    info.mutable_scalars()->insert(sample.scalars.begin(), sample.scalars.end());
    if (const std::string* missing = pool.MissingScalar(sample); missing != nullptr) {
      info.set_missing_scalar(*missing);
    }
    info.set_stored_bytes(MemoryBytes(sample));
    if (auto arrival = pool.arrival_unix_nanos.find(*m.id);
        arrival != pool.arrival_unix_nanos.end()) {
      info.set_arrival_unix_nanos(arrival->second);
    }
    if (auto uses = pool.uses.find(*m.id); uses != pool.uses.end()) info.set_uses(uses->second);
  }
  return page;
}

absl::StatusOr<std::vector<GroupShareStats>> SampleStore::CompleteGroups(
    const std::string& pool_name, const std::vector<std::string>& group_ids) const {
  RETURN_IF_ERROR(ValidateName("pool name", pool_name, kMaxPoolNameBytes));
  absl::ReaderMutexLock lock(&mu_);
  auto it = pools_.find(pool_name);
  if (it == pools_.end()) {
    return absl::NotFoundError(absl::StrCat("pool \"", pool_name, "\" has no registered model"));
  }
  return it->second.CompleteGroups(group_ids);
}

absl::Status SampleStore::FixSchemaClusterWide(const std::string& pool_name,
                                               const std::vector<StoredSample>& samples) {
  if (pool_directory_ == nullptr || !pool_directory_->FixesSchemasBeforePut() ||
      samples.empty()) {
    return absl::OkStatus();
  }
  std::optional<std::map<std::string, FieldSchema>> declared;
  {
    absl::ReaderMutexLock lock(&mu_);
    auto it = pools_.find(pool_name);
    // An unknown pool is refused by the put itself.
    if (it == pools_.end()) return absl::OkStatus();
    const Pool& pool = it->second;
    if (pool.schema_complete()) return absl::OkStatus();
    if (pool.schema_fixed) declared = pool.schema;
  }
  // A later piece carries no fields of its own to propose (and is refused
  // unless its piece 0 fixed the schema already).
  auto first = std::find_if(samples.begin(), samples.end(), [](const StoredSample& s) {
    return !s.piece_message.has_value() || s.piece_message->index == 0;
  });
  if (first == samples.end()) return absl::OkStatus();
  // A pool that declared its token fields proposes those (every member
  // holds the same), with its first sample's ragged names: one record in
  // etcd fixes both for the cluster.
  std::map<std::string, FieldSchema> proposed;
  if (declared.has_value()) {
    proposed = *std::move(declared);
  } else {
    for (const auto& [name, field] : first->token_fields) {
      proposed[name] = FieldSchema{field.dtype, field.trailing_shape};
    }
  }
  for (const auto& [name, field] : first->ragged_fields) {
    proposed[name] = FieldSchema{field.dtype, {}, /*ragged=*/true};
  }
  ASSIGN_OR_RETURN(auto fixed, pool_directory_->FixSchema(pool_name, proposed));
  // A schema fixed before ragged fields existed holds none.
  BatchSchema batch;
  for (auto& [name, field] : fixed) {
    if (field.ragged) {
      batch.ragged.insert(name);
    } else {
      batch.token_fields.emplace(name, std::move(field));
    }
  }
  absl::MutexLock lock(&mu_);
  pools_.at(pool_name).FixSchema(std::move(batch));
  return absl::OkStatus();
}

}  // namespace rollpack
