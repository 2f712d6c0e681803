#include "server/store/pool.h"

#include <algorithm>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/store/ndarray.h"

namespace rollpack {
namespace {

bool ById(const GroupShareStats& a, const GroupShareStats& b) { return a.group_id < b.group_id; }

std::string ShapeString(const std::vector<int64_t>& trailing) {
  return absl::StrCat("[n", trailing.empty() ? "" : ", ", absl::StrJoin(trailing, ", "), "]");
}

std::string NameList(const std::set<std::string>& names) {
  return absl::StrCat("{", absl::StrJoin(names, ", "), "}");
}

// A group's sealed samples that count towards completeness (lifecycle.md
// section 6: those with every required scalar).
int32_t Counted(const Pool::Group& group) { return group.stored - group.unready; }

}  // namespace

Pool::Pool(ModelSpec model_spec, PoolOptions pool_options)
    : model(std::move(model_spec)), options(std::move(pool_options)) {
  if (options.token_fields.empty()) return;
  for (const DeclaredTokenField& f : options.token_fields) {
    schema[f.name] = FieldSchema{f.dtype, f.trailing_shape};
  }
  schema_fixed = true;
}

BatchSchema Pool::ProposeSchema(const std::vector<StoredSample>& samples) {
  BatchSchema batch;
  for (const StoredSample& s : samples) {
    if (s.piece_message.has_value() && s.piece_message->index > 0) continue;
    for (const auto& [name, field] : s.token_fields) {
      batch.token_fields[name] = FieldSchema{field.dtype, field.trailing_shape};
    }
    for (const auto& [name, field] : s.ragged_fields) batch.ragged.insert(name);
    break;
  }
  return batch;
}

void Pool::FixSchema(BatchSchema batch) {
  if (!schema_fixed) {
    schema = std::move(batch.token_fields);
    schema_fixed = true;
  }
  if (!ragged_schema.has_value()) ragged_schema = std::move(batch.ragged);
}

absl::Status Pool::CheckSchema(const StoredSample& sample, const BatchSchema& batch) const {
  const std::map<std::string, FieldSchema>& fields = schema_fixed ? schema : batch.token_fields;
  const std::string who = absl::StrCat("sample \"", sample.sample_id, "\": ");
  for (const auto& [name, field] : sample.token_fields) {
    auto it = fields.find(name);
    if (it == fields.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, "token_fields[\"", name, "\"] is not among the pool's fields {",
          absl::StrJoin(fields, ", ",
                        [](std::string* out, const auto& kv) { out->append(kv.first); }),
          "} (",
          options.token_fields.empty() ? "fixed by its first sample" : "declared at registration",
          ")"));
    }
    if (it->second.dtype != field.dtype || it->second.trailing_shape != field.trailing_shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, "token_fields[\"", name, "\"] is ", DTypeName(field.dtype), " ",
          ShapeString(field.trailing_shape), ", the pool's is ", DTypeName(it->second.dtype), " ",
          ShapeString(it->second.trailing_shape)));
    }
  }
  if (sample.token_fields.size() != fields.size()) {
    for (const auto& [name, unused] : fields) {
      if (!sample.token_fields.count(name)) {
        return absl::InvalidArgumentError(absl::StrCat(
            who, "token_fields[\"", name, "\"] is missing (every sample of the pool carries it)"));
      }
    }
  }
  const std::set<std::string>& ragged = ragged_schema.has_value() ? *ragged_schema : batch.ragged;
  for (const auto& [name, field] : sample.ragged_fields) {
    if (ragged.count(name) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, "ragged_token_fields[\"", name, "\"] is not among the pool's ragged fields ",
          NameList(ragged), " (fixed by its first sample)"));
    }
  }
  if (sample.ragged_fields.size() != ragged.size()) {
    for (const std::string& name : ragged) {
      if (!sample.ragged_fields.count(name)) {
        return absl::InvalidArgumentError(absl::StrCat(
            who, "ragged_token_fields[\"", name,
            "\"] is missing (every sample of the pool carries it)"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status Pool::CheckGroup(const StoredSample& sample,
                              const absl::flat_hash_map<std::string, int32_t>& batch_counts) const {
  if (!sample.grouped()) return absl::OkStatus();
  int32_t stored = 0;
  if (auto it = groups.find(sample.group_id); it != groups.end()) {
    if (it->second.expired) {
      // Its free samples are gone: it can never be complete again.
      return absl::InvalidArgumentError(absl::StrCat(
          "sample \"", sample.sample_id, "\": group \"", sample.group_id,
          "\" was dropped for staying incomplete past incomplete_group_timeout_ms (",
          options.incomplete_group_timeout_ms, " ms); ", it->second.stored,
          " of its samples are still in live steps"));
    }
    if (it->second.size != sample.group_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sample \"", sample.sample_id, "\": group \"", sample.group_id, "\" has group_size ",
          it->second.size, ", this sample declares ", sample.group_size));
    }
    stored = it->second.stored + it->second.open;
  }
  int32_t in_batch = 0;
  if (auto it = batch_counts.find(sample.group_id); it != batch_counts.end()) in_batch = it->second;
  if (stored + in_batch + 1 > sample.group_size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "sample \"", sample.sample_id, "\": group \"", sample.group_id, "\" already has ",
        stored + in_batch, " samples, its group_size is ", sample.group_size));
  }
  return absl::OkStatus();
}

std::vector<std::string> Pool::ExpiredGroups(int64_t now_nanos) const {
  std::vector<std::string> expired;
  const int64_t timeout_ms = options.incomplete_group_timeout_ms;
  // Past ~292 years in nanoseconds: never.
  if (timeout_ms <= 0 || timeout_ms > std::numeric_limits<int64_t>::max() / 1'000'000) {
    return expired;
  }
  const int64_t limit = timeout_ms * 1'000'000;
  for (const auto& [id, group] : groups) {
    // The clock starts at the group's first sealed sample.
    if (!group.expired && group.stored > 0 && Counted(group) < group.size &&
        now_nanos - group.first_sealed_unix_nanos >= limit) {
      expired.push_back(id);
    }
  }
  std::sort(expired.begin(), expired.end());
  return expired;
}

std::vector<std::string> Pool::StillIncomplete(const std::vector<std::string>& group_ids) const {
  std::vector<std::string> incomplete;
  for (const std::string& id : group_ids) {
    auto group = groups.find(id);
    if (group != groups.end() && !group->second.expired &&
        Counted(group->second) < group->second.size) {
      incomplete.push_back(id);
    }
  }
  return incomplete;
}

std::vector<GroupShareStats> Pool::CompleteGroups(const std::vector<std::string>& group_ids) const {
  std::vector<GroupShareStats> complete;
  for (const std::string& id : group_ids) {
    auto group = groups.find(id);
    if (group == groups.end() || group->second.expired) continue;
    const int32_t sealed = Counted(group->second);
    if (sealed != group->second.size) continue;
    complete.push_back({id, group->second.size, sealed, group->second.first_sealed_unix_nanos});
  }
  std::sort(complete.begin(), complete.end(), ById);
  // An id asked twice is one group.
  complete.erase(std::unique(complete.begin(), complete.end(),
                             [](const GroupShareStats& a, const GroupShareStats& b) {
                               return a.group_id == b.group_id;
                             }),
                 complete.end());
  return complete;
}

void Pool::ExpireGroups(absl::Span<const std::string> ids) {
  // A group with samples still in live steps stays known, marked, so that it
  // is neither counted nor dropped again and takes no late samples; it is
  // forgotten with its last sample.
  for (const std::string& id : ids) {
    auto it = groups.find(id);
    if (it == groups.end()) continue;
    if (it->second.stored == 0) {
      groups.erase(it);
    } else {
      it->second.expired = true;
    }
  }
}

void Pool::AddToGroup(const StoredSample& sample, int64_t now_nanos) {
  // Every sealed sample comes through here: one without a required scalar
  // is counted until AnnotateSamples gives it the last.
  const bool unready = MissingScalar(sample) != nullptr;
  if (unready) unannotated++;
  if (!sample.grouped()) return;
  Group& group = groups[sample.group_id];
  group.size = sample.group_size;
  if (unready) group.unready++;
  if (group.stored++ == 0) group.first_sealed_unix_nanos = now_nanos;
}

void Pool::AddSealed(StoredSample&& sample, uint64_t arrival, int64_t now_nanos) {
  std::string id = sample.sample_id;
  arrival_of.emplace(id, arrival);
  arrival_unix_nanos.emplace(id, now_nanos);
  AddToGroup(sample, now_nanos);
  auto stored = std::make_shared<const StoredSample>(std::move(sample));
  free_by_arrival.emplace(arrival, stored);
  samples.emplace(std::move(id), std::move(stored));
}

int64_t Pool::ApplyPiece(const OpenSamples::Plan& plan, StoredSample piece, int64_t now_nanos,
                         uint64_t* next_arrival) {
  const bool opens =
      plan.action == OpenSamples::Action::kOpen || plan.action == OpenSamples::Action::kRestoreOpen;
  if (opens && piece.grouped()) {
    Group& group = groups[piece.group_id];
    group.size = piece.group_size;
    group.open++;
  }
  OpenSamples::Applied applied = open.ApplyPiece(plan, std::move(piece), model);
  stored_bytes += applied.added_bytes;
  if (!applied.sealed.has_value()) return applied.added_bytes;
  // Sealed: from now on it is a sample like any other, free and selectable;
  // its ingest time is now.
  if (applied.sealed->grouped()) groups[applied.sealed->group_id].open--;
  AddSealed(*std::move(applied.sealed), (*next_arrival)++, now_nanos);
  return applied.added_bytes;
}

void Pool::ForgetAnnotations(const StoredSample& sample) {
  if (MissingScalar(sample) != nullptr) {
    unannotated--;
    if (sample.grouped()) {
      auto group = groups.find(sample.group_id);
      if (group != groups.end()) group->second.unready--;
    }
  }
  if (!ready_at.empty()) ready_at.erase(sample.sample_id);
  if (!reserved.empty()) reserved.erase(sample.sample_id);
}

void Pool::MarkReady(const StoredSample& sample, uint64_t seq, int64_t now_nanos) {
  unannotated--;
  if (sample.grouped()) {
    auto group = groups.find(sample.group_id);
    if (group != groups.end()) group->second.unready--;
  }
  ready_at[sample.sample_id] = Ready{seq, now_nanos};
}

Pool::Erased Pool::EraseSealed(const std::string& id) {
  auto it = samples.find(id);
  ForgetAnnotations(*it->second);
  Erased erased;
  erased.bytes = MemoryBytes(*it->second);
  if (!recompute_routing.empty()) {
    const RecomputeBook::Change routing = recompute_routing.Erase(id);
    erased.bytes -= routing.bytes;
    erased.dead_log_bytes = routing.dead_log_bytes;
  }
  if (it->second->grouped()) {
    auto group = groups.find(it->second->group_id);
    if (group != groups.end() && --group->second.stored == 0 && group->second.open == 0) {
      groups.erase(group);
    }
  }
  uses.erase(id);
  arrival_of.erase(id);
  arrival_unix_nanos.erase(id);
  samples.erase(it);
  stored_bytes -= erased.bytes;
  return erased;
}

int64_t Pool::EraseOpen(absl::Span<const std::string> ids) {
  int64_t freed = 0;
  for (const std::string& id : ids) {
    const StoredSample* sample = open.Find(id);
    if (sample == nullptr) continue;
    if (sample->grouped()) {
      auto group = groups.find(sample->group_id);
      if (group != groups.end() && --group->second.open == 0 && group->second.stored == 0) {
        groups.erase(group);
      }
    }
    reserved.erase(id);
    freed += open.Erase(id);
  }
  stored_bytes -= freed;
  return freed;
}

const std::string* Pool::MissingScalar(const StoredSample& sample) const {
  for (const std::string& name : options.required_scalars) {
    if (sample.scalars.count(name) == 0) return &name;
  }
  return nullptr;
}

SampleCandidate Pool::Candidate(const StoredSample& s, uint64_t arrival) const {
  SampleCandidate c;
  c.sample_id = s.sample_id;
  c.num_tokens = s.num_tokens();
  c.policy_version = s.policy_version;
  c.group_id = s.group_id;
  c.group_size = s.group_size;
  if (options.required_scalars.empty()) return c;
  if (const std::string* missing = MissingScalar(s)) c.missing_scalar = *missing;
  // On the arrival clock, so that a group an annotation completed sorts
  // after the samples sealed before it (+1: 0 means "not keyed").
  auto ready = ready_at.find(s.sample_id);
  c.ready_key = static_cast<int64_t>(ready == ready_at.end() ? arrival : ready->second.seq) + 1;
  return c;
}

std::vector<SampleCandidate> Pool::FreeCandidates(
    int64_t limit, std::vector<FreeSamples::const_iterator>* where) const {
  std::vector<SampleCandidate> candidates;
  const int64_t free = static_cast<int64_t>(free_by_arrival.size());
  const size_t size = static_cast<size_t>(limit < 0 ? free : std::min(limit, free));
  candidates.reserve(size);
  if (where != nullptr) {
    where->clear();
    where->reserve(size);
  }
  for (auto it = free_by_arrival.begin(); it != free_by_arrival.end() && candidates.size() < size;
       ++it) {
    candidates.push_back(Candidate(*it->second, it->first));
    if (where != nullptr) where->push_back(it);
  }
  return candidates;
}

SelectionRequest Pool::Effective(SelectionRequest selection) const {
  // Staleness is judged at the request's version (lifecycle.md: 0 = unknown,
  // no check), under its bound or else the pool's.
  if (!selection.max_staleness.has_value()) selection.max_staleness = options.max_staleness;
  return selection;
}

PoolStats Pool::Stats(const std::string& name) const {
  PoolStats stats;
  stats.pool = name;
  stats.model = model;
  stats.options = options;
  stats.num_samples = static_cast<int64_t>(samples.size());
  stats.num_open_samples = static_cast<int64_t>(open.size());
  stats.num_free_samples = static_cast<int64_t>(free_by_arrival.size());
  stats.num_live_steps = live_steps;
  stats.stored_bytes = stored_bytes;
  stats.token_fields = schema;
  if (ragged_schema.has_value()) {
    stats.ragged_fields.assign(ragged_schema->begin(), ragged_schema->end());
  }
  stats.policy_version = policy_version;
  stats.num_stale_dropped = stale_dropped;
  stats.num_incomplete_groups_dropped = incomplete_groups_dropped;
  stats.num_unannotated_samples = unannotated;
  for (const auto& [id, group] : groups) {
    if (group.expired) continue;  // counted as dropped
    // With required scalars, complete once every member has them.
    const int32_t sealed = Counted(group);
    if (sealed == group.size) {
      stats.num_complete_groups++;
      continue;
    }
    stats.num_incomplete_groups++;
    stats.incomplete_groups.push_back({id, group.size, sealed, group.first_sealed_unix_nanos});
  }
  std::sort(stats.incomplete_groups.begin(), stats.incomplete_groups.end(), ById);
  SelectionRequest staleness;
  staleness.policy_version = policy_version;
  staleness.max_staleness = options.max_staleness;
  if (staleness.max_staleness.has_value() && staleness.policy_version > 0) {
    for (const auto& [arrival, sample] : free_by_arrival) {
      if (IsStale(staleness, sample->policy_version)) stats.num_stale_samples++;
    }
  }
  return stats;
}

}  // namespace rollpack
