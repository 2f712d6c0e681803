// SampleStore's annotations (../shared/spec/lifecycle.md section 6): scalars
// added to stored samples after the fact (a reward known once a verifier has
// run), all or nothing and durably, in one locked step on a single server or
// in two phases (prepare, commit) for a cluster; and required_scalars, which
// keeps a sealed sample out of selection until it has them.
//
// A sample's scalars are changed in place: the sample is free (in no step or
// hold) and held only by the pool's two indexes, so no reader can see it
// change; a released step still streaming keeps its own copy of the pointer,
// and then the sample is copied instead (use_count below).
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "server/store/durable_log.h"
#include "server/store/heap_bytes.h"
#include "server/store/log_records.h"
#include "server/store/names.h"
#include "server/store/sample_store.h"

namespace rollpack {
namespace {

// Committed tickets remembered for a commit's retry.
constexpr size_t kKeptCommits = 4096;
constexpr size_t kMaxTicketBytes = 256;

// The shortest text that reads back as the same double: both values of a
// conflict are told apart even when they differ in the 17th digit.
std::string ScalarText(double v) {
  char text[32];
  for (int precision = 6; precision <= 17; ++precision) {
    std::snprintf(text, sizeof(text), "%.*g", precision, v);
    const double back = std::strtod(text, nullptr);
    if (std::memcmp(&back, &v, sizeof(v)) == 0) break;
  }
  return text;
}

bool SameBits(double a, double b) { return std::memcmp(&a, &b, sizeof(a)) == 0; }

// What one more scalar named `name` costs a sample, near enough for the
// memory limit's check (MemoryBytes counts it exactly once it is there): a
// map node, the name in it and its copy among the later scalars.
int64_t ScalarBytes(const std::string& name) {
  return 96 + 2 * StringCopyHeapBytes(name);
}

absl::Status CheckRoom(int64_t bytes, int64_t stored, int64_t limit, int64_t pool_stored,
                       int64_t pool_limit, const std::string& pool_name) {
  if (stored + bytes > limit) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "memory limit: annotating adds about ", bytes, " bytes, past --max-memory ", limit, " (",
        stored, " held); retry after the trainer releases a step"));
  }
  if (pool_limit > 0 && pool_stored + bytes > pool_limit) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "pool memory limit: annotating adds about ", bytes, " bytes to pool \"", pool_name,
        "\", past --max-pool-memory ", pool_limit, " (", pool_stored,
        " held by the pool); retry after the trainer releases a step"));
  }
  return absl::OkStatus();
}

absl::Status ValidateAnnotationIds(absl::Span<const ScalarAnnotation> annotations) {
  for (const ScalarAnnotation& a : annotations) {
    RETURN_IF_ERROR(ValidateName("sample_id", a.sample_id, kMaxSampleIdBytes));
  }
  return absl::OkStatus();
}

}  // namespace

const SampleStore::AnnotationTicket* SampleStore::ReservationOf(
    const Pool& pool, absl::string_view id, absl::Time now,
    const ScalarAnnotation** entry) const {
  if (pool.reserved.empty()) return nullptr;
  auto reserved = pool.reserved.find(id);
  if (reserved == pool.reserved.end()) return nullptr;
  auto ticket = annotation_tickets_.find(reserved->second);
  if (ticket == annotation_tickets_.end() || ticket->second.expires <= now) return nullptr;
  if (entry != nullptr) {
    for (const ScalarAnnotation& a : ticket->second.annotations) {
      if (a.sample_id == id) *entry = &a;
    }
  }
  return &ticket->second;
}

absl::Status SampleStore::CheckUnreserved(const Pool& pool, const std::string& step_id,
                                          absl::Span<const SampleCandidate> candidates,
                                          absl::Span<const int32_t> chosen) const {
  if (pool.reserved.empty()) return absl::OkStatus();
  const absl::Time now = absl::Now();
  for (int32_t i : chosen) {
    const absl::string_view id = candidates[i].sample_id;
    if (ReservationOf(pool, id, now) != nullptr) {
      return absl::AbortedError(absl::StrCat(
          "step \"", step_id, "\": sample \"", id,
          "\" is being annotated (an AnnotateSamples over the cluster holds it until it commits "
          "or aborts, seconds at most); retry the step"));
    }
  }
  return absl::OkStatus();
}

void SampleStore::ExpireTicketsLocked(absl::Time now) {
  for (auto it = annotation_tickets_.begin(); it != annotation_tickets_.end();) {
    if (it->second.expires > now) {
      ++it;
      continue;
    }
    auto pool = pools_.find(it->second.pool);
    if (pool != pools_.end()) {
      for (const ScalarAnnotation& a : it->second.annotations) {
        auto reserved = pool->second.reserved.find(a.sample_id);
        if (reserved != pool->second.reserved.end() && reserved->second == it->first) {
          pool->second.reserved.erase(reserved);
        }
      }
    }
    annotation_tickets_.erase(it++);
  }
}

absl::Status SampleStore::CheckAnnotations(const std::string& pool_name, const Pool& pool,
                                           absl::Span<const ScalarAnnotation> annotations,
                                           const std::string& ticket, absl::Time now,
                                           int64_t* new_bytes) const {
  // What the request states outright first: an id twice.
  absl::flat_hash_set<absl::string_view> seen;
  for (const ScalarAnnotation& a : annotations) {
    if (!seen.insert(a.sample_id).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "sample \"", a.sample_id, "\" appears twice in one AnnotateSamples request; give each "
          "sample one entry with all its scalars"));
    }
  }
  // The step or hold a sealed sample that is not free is in (an error's
  // words only: a scan of the live steps).
  auto step_of = [&](const std::string& id) -> std::string {
    for (const auto& [step_id, step] : steps_) {
      if (step->pool != pool_name) continue;
      const auto& ids = step->sample_ids;
      if (std::find(ids.begin(), ids.end(), id) != ids.end()) return step_id;
    }
    return holds_.HolderOf(pool_name, id);
  };
  *new_bytes = 0;
  for (const ScalarAnnotation& a : annotations) {
    const std::string& id = a.sample_id;
    const StoredSample* sample = pool.open.Find(id);
    if (sample == nullptr) {
      auto sealed = pool.samples.find(id);
      if (sealed == pool.samples.end()) {
        return absl::NotFoundError(
            absl::StrCat("sample \"", id, "\" is not in pool \"", pool_name, "\""));
      }
      sample = sealed->second.get();
      if (pool.free_by_arrival.count(pool.arrival_of.at(id)) == 0) {
        const std::string step = step_of(id);
        return absl::FailedPreconditionError(absl::StrCat(
            "sample \"", id, "\" is in live step \"",
            step.empty() ? std::string("(being created)") : step,
            "\": a sample is annotated while it is in no step (before CreateStep takes it, or "
            "after ReleaseStep returns it to a reuse pool)"));
      }
    }
    if (const AnnotationTicket* other = ReservationOf(pool, id, now);
        other != nullptr && pool.reserved.at(id) != ticket) {
      return absl::AbortedError(absl::StrCat(
          "sample \"", id, "\": another AnnotateSamples call is annotating it (prepared over "
          "the cluster, seconds at most); retry"));
    }
    for (const auto& [name, value] : a.scalars) {
      auto it = sample->scalars.find(name);
      if (it == sample->scalars.end()) {
        *new_bytes += ScalarBytes(name);
        continue;
      }
      if (!SameBits(it->second, value)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "sample \"", id, "\": scalar \"", name, "\" is already ", ScalarText(it->second),
            ", this annotation sets ", ScalarText(value),
            " (a scalar, once set, keeps its value)"));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status SampleStore::ApplyAnnotations(const std::string& pool_name, Pool& pool,
                                           absl::Span<const ScalarAnnotation> annotations,
                                           bool log, int64_t* ticket) {
  // What changes: each sample's scalars it lacks (the rest are no-ops).
  std::vector<ScalarAnnotation> changes;
  for (const ScalarAnnotation& a : annotations) {
    const StoredSample* open = pool.open.Find(a.sample_id);
    const StoredSample& sample = open != nullptr ? *open : *pool.samples.at(a.sample_id);
    ScalarAnnotation change{a.sample_id, {}};
    for (const auto& [name, value] : a.scalars) {
      if (sample.scalars.count(name) == 0) change.scalars.emplace(name, value);
    }
    if (!change.scalars.empty()) changes.push_back(std::move(change));
  }
  int64_t record_bytes = 0;
  if (log && log_ != nullptr) {
    if (changes.empty()) {
      // Acknowledged once what made them no-ops is durable.
      *ticket = log_->written();
    } else {
      const std::string record = EncodeAnnotations(pool_name, changes);
      ASSIGN_OR_RETURN(*ticket, log_->Append(RecordType::kAnnotations, record));
      record_bytes = LogRecordBytes(record.size());
    }
  }
  const int64_t now_nanos = absl::GetCurrentTimeNanos();
  for (const ScalarAnnotation& change : changes) {
    const std::string& id = change.sample_id;
    // A sample's share of the record: dead once the sample is (samples sent
    // whole count their scalars' bytes themselves, EncodedSampleBytes).
    const int64_t logged = record_bytes / static_cast<int64_t>(changes.size());
    int64_t before = 0, after = 0;
    if (pool.open.contains(id)) {
      after = pool.open.AddScalars(id, change.scalars, logged);  // `before` stays 0
    } else {
      std::shared_ptr<const StoredSample>& slot = pool.samples.at(id);
      const bool was_unready = pool.MissingScalar(*slot) != nullptr;
      before = MemoryBytes(*slot);
      // Held by the pool's two indexes only: changed in place. Otherwise a
      // released step still streaming holds it too: copied.
      if (slot.use_count() > 2) {
        auto copy = std::make_shared<StoredSample>(*slot);
        pool.free_by_arrival.at(pool.arrival_of.at(id)) = copy;
        slot = std::move(copy);
      }
      StoredSample& sample = const_cast<StoredSample&>(*slot);
      AddLaterScalars(change.scalars, &sample);
      if (sample.logged_bytes > 0) sample.logged_bytes += logged;
      after = MemoryBytes(sample);
      if (was_unready && pool.MissingScalar(sample) == nullptr) {
        pool.MarkReady(sample, next_arrival_++, now_nanos);
      }
    }
    pool.stored_bytes += after - before;
    stored_bytes_ += after - before;
  }
  return absl::OkStatus();
}

absl::StatusOr<int32_t> SampleStore::AnnotateSamples(
    const std::string& pool_name, absl::Span<const ScalarAnnotation> annotations) {
  RETURN_IF_ERROR(ValidateName("pool name", pool_name, kMaxPoolNameBytes));
  RETURN_IF_ERROR(ValidateAnnotationIds(annotations));
  int64_t ticket = 0;
  {
    absl::MutexLock lock(&mu_);
    auto it = pools_.find(pool_name);
    if (it == pools_.end()) {
      return absl::NotFoundError(absl::StrCat("pool \"", pool_name, "\" has no registered model"));
    }
    Pool& pool = it->second;
    const absl::Time now = absl::Now();
    ExpireTicketsLocked(now);
    int64_t bytes = 0;
    RETURN_IF_ERROR(CheckAnnotations(pool_name, pool, annotations, "", now, &bytes));
    RETURN_IF_ERROR(
        CheckRoom(bytes, stored_bytes_, max_memory_bytes_, pool.stored_bytes, max_pool_bytes_,
                  pool_name));
    RETURN_IF_ERROR(ApplyAnnotations(pool_name, pool, annotations, /*log=*/true, &ticket));
  }
  if (log_ != nullptr) RETURN_IF_ERROR(log_->Sync(ticket));
  return static_cast<int32_t>(annotations.size());
}

absl::Status SampleStore::PrepareAnnotations(const std::string& pool_name,
                                             const std::string& ticket,
                                             std::vector<ScalarAnnotation> annotations,
                                             absl::Duration ttl) {
  RETURN_IF_ERROR(ValidateName("pool name", pool_name, kMaxPoolNameBytes));
  RETURN_IF_ERROR(ValidateName("annotation ticket", ticket, kMaxTicketBytes));
  if (ttl <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("annotation ticket \"", ticket,
                                                   "\": ttl is ", absl::FormatDuration(ttl),
                                                   ", must be > 0"));
  }
  RETURN_IF_ERROR(ValidateAnnotationIds(annotations));
  absl::MutexLock lock(&mu_);
  const absl::Time now = absl::Now();
  ExpireTicketsLocked(now);
  // A retry answers as the first did (it succeeded, or it is refused again
  // below).
  if (committed_tickets_.contains(ticket)) return absl::OkStatus();
  if (auto it = annotation_tickets_.find(ticket); it != annotation_tickets_.end()) {
    if (it->second.pool != pool_name) {
      return absl::InvalidArgumentError(absl::StrCat("annotation ticket \"", ticket,
                                                     "\" was prepared for pool \"",
                                                     it->second.pool, "\""));
    }
    return absl::OkStatus();
  }
  auto it = pools_.find(pool_name);
  if (it == pools_.end()) {
    return absl::NotFoundError(absl::StrCat("pool \"", pool_name, "\" has no registered model"));
  }
  Pool& pool = it->second;
  int64_t bytes = 0;
  RETURN_IF_ERROR(CheckAnnotations(pool_name, pool, annotations, ticket, now, &bytes));
  RETURN_IF_ERROR(CheckRoom(bytes, stored_bytes_, max_memory_bytes_, pool.stored_bytes,
                            max_pool_bytes_, pool_name));
  for (const ScalarAnnotation& a : annotations) pool.reserved[a.sample_id] = ticket;
  annotation_tickets_[ticket] = AnnotationTicket{pool_name, std::move(annotations), now + ttl};
  return absl::OkStatus();
}

absl::StatusOr<int32_t> SampleStore::CommitAnnotations(const std::string& pool_name,
                                                       const std::string& ticket) {
  int64_t log_ticket = 0;
  int32_t applied = 0;
  {
    absl::MutexLock lock(&mu_);
    ExpireTicketsLocked(absl::Now());
    if (auto done = committed_tickets_.find(ticket); done != committed_tickets_.end()) {
      return done->second;
    }
    auto it = annotation_tickets_.find(ticket);
    if (it == annotation_tickets_.end() || it->second.pool != pool_name) {
      return absl::FailedPreconditionError(absl::StrCat(
          "annotation ticket \"", ticket, "\" of pool \"", pool_name,
          "\" is not prepared here (unknown, expired, aborted, or this member restarted since): "
          "nothing was annotated; prepare it again"));
    }
    Pool& pool = pools_.at(pool_name);
    // Its samples could not change meanwhile (they were reserved), but some
    // may have been deleted (a dropped group): those drop out.
    std::vector<ScalarAnnotation> entries;
    for (ScalarAnnotation& a : it->second.annotations) {
      auto reserved = pool.reserved.find(a.sample_id);
      if (reserved == pool.reserved.end() || reserved->second != ticket) continue;
      entries.push_back(a);
    }
    RETURN_IF_ERROR(ApplyAnnotations(pool_name, pool, entries, /*log=*/true, &log_ticket));
    for (const ScalarAnnotation& a : entries) pool.reserved.erase(a.sample_id);
    annotation_tickets_.erase(it);
    applied = static_cast<int32_t>(entries.size());
    committed_tickets_[ticket] = applied;
    committed_order_.push_back(ticket);
    if (committed_order_.size() > kKeptCommits) {
      committed_tickets_.erase(committed_order_.front());
      committed_order_.pop_front();
    }
  }
  if (log_ != nullptr) RETURN_IF_ERROR(log_->Sync(log_ticket));
  return applied;
}

absl::Status SampleStore::AbortAnnotations(const std::string& pool_name,
                                           const std::string& ticket) {
  absl::MutexLock lock(&mu_);
  auto it = annotation_tickets_.find(ticket);
  if (it == annotation_tickets_.end() || it->second.pool != pool_name) return absl::OkStatus();
  // Expired now: the sweep frees its samples.
  it->second.expires = absl::InfinitePast();
  ExpireTicketsLocked(absl::Now());
  return absl::OkStatus();
}

absl::Status SampleStore::ReplayAnnotations(const v1::AnnotationsRecord& record) {
  absl::MutexLock lock(&mu_);
  auto it = pools_.find(record.pool());
  if (it == pools_.end()) {
    return absl::DataLossError(absl::StrCat("annotations of unknown pool \"", record.pool(), "\""));
  }
  Pool& pool = it->second;
  std::vector<ScalarAnnotation> annotations;
  annotations.reserve(record.annotations_size());
  for (const v1::SampleAnnotation& a : record.annotations()) {
    const std::string& id = a.sample_id();
    const StoredSample* open = pool.open.Find(id);
    auto sealed = pool.samples.find(id);
    if (open == nullptr && sealed == pool.samples.end()) {
      return absl::DataLossError(absl::StrCat("annotation of unknown sample \"", id, "\""));
    }
    const StoredSample& sample = open != nullptr ? *open : *sealed->second;
    for (const auto& [name, value] : a.scalars()) {
      auto has = sample.scalars.find(name);
      if (has != sample.scalars.end() && !SameBits(has->second, value)) {
        return absl::DataLossError(absl::StrCat("annotation of sample \"", id, "\" sets \"",
                                                name, "\", which it has with another value"));
      }
    }
    annotations.push_back(
        ScalarAnnotation{id, std::map<std::string, double>(a.scalars().begin(), a.scalars().end())});
  }
  int64_t unused = 0;
  return ApplyAnnotations(record.pool(), pool, annotations, /*log=*/false, &unused);
}

}  // namespace rollpack
