// SampleStore's side of cluster steps (sample_store.h, "Cluster mode"): a
// member holds the samples it stores for a step another member planned.
#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "server/store/durable_log.h"
#include "server/store/log_records.h"
#include "server/store/names.h"
#include "server/store/sample_store.h"

namespace rollpack {

absl::StatusOr<SampleStore::SampleListing> SampleStore::ListSamples(
    const std::string& pool_name, absl::Span<const std::string> sample_ids, int limit) const {
  RETURN_IF_ERROR(ValidateName("pool name", pool_name, kMaxPoolNameBytes));
  absl::ReaderMutexLock lock(&mu_);
  auto pool_it = pools_.find(pool_name);
  if (pool_it == pools_.end()) {
    return absl::NotFoundError(absl::StrCat("pool \"", pool_name, "\" has no registered model"));
  }
  const Pool& pool = pool_it->second;
  SampleListing listing;
  auto add = [&](const StoredSample& sample, bool free) {
    const std::string& id = sample.sample_id;
    listing.sample_ids.push_back(id);
    listing.num_tokens.push_back(sample.num_tokens());
    listing.arrival_unix_nanos.push_back(pool.arrival_unix_nanos.at(id));
    listing.free.push_back(free);
    listing.group_ids.push_back(sample.group_id);
    listing.group_sizes.push_back(sample.group_size);
    listing.policy_versions.push_back(sample.policy_version);
    const std::string* missing = pool.MissingScalar(sample);
    listing.missing_scalars.push_back(missing == nullptr ? std::string() : *missing);
    auto ready = pool.ready_at.find(id);
    listing.ready_unix_nanos.push_back(ready == pool.ready_at.end()
                                           ? pool.arrival_unix_nanos.at(id)
                                           : ready->second.unix_nanos);
  };
  if (!sample_ids.empty()) {
    for (const std::string& id : sample_ids) {
      auto arrival = pool.arrival_of.find(id);
      if (arrival == pool.arrival_of.end()) {
        if (pool.open.contains(id)) listing.open_sample_ids.push_back(id);
        continue;
      }
      add(*pool.samples.at(id), pool.free_by_arrival.count(arrival->second) > 0);
    }
    return listing;
  }
  for (auto it = pool.free_by_arrival.begin();
       it != pool.free_by_arrival.end() &&
       (limit < 0 || static_cast<int>(listing.sample_ids.size()) < limit);
       ++it) {
    add(*it->second, true);
  }
  return listing;
}

absl::Status SampleStore::CheckFree(const Pool& pool, const std::string& pool_name,
                                    const std::string& step_id,
                                    absl::Span<const std::string> sample_ids) const {
  absl::flat_hash_set<absl::string_view> seen;
  for (const std::string& id : sample_ids) {
    if (!seen.insert(id).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("step \"", step_id, "\": sample \"", id, "\" is listed twice"));
    }
    auto arrival = pool.arrival_of.find(id);
    if (const StoredSample* open = pool.open.Find(id); open != nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "sample \"", id, "\" is open (", open->pieces.size(),
          " pieces stored, the last partial): it is selectable once a piece seals it"));
    }
    if (arrival == pool.arrival_of.end()) {
      return absl::NotFoundError(
          absl::StrCat("sample \"", id, "\" is not in pool \"", pool_name, "\""));
    }
    if (pool.free_by_arrival.count(arrival->second) == 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("sample \"", id, "\" is already in a live step"));
    }
  }
  // Samples a prepared annotation holds wait for its commit (lifecycle.md 6).
  if (pool.reserved.empty()) return absl::OkStatus();
  std::vector<SampleCandidate> candidates;
  std::vector<int32_t> all;
  for (const std::string& id : sample_ids) {
    candidates.emplace_back();
    candidates.back().sample_id = id;
    all.push_back(static_cast<int32_t>(all.size()));
  }
  return CheckUnreserved(pool, step_id, candidates, all);
}

absl::Status SampleStore::Hold(const std::string& step_id, const std::string& pool_name,
                               absl::Span<const std::string> sample_ids,
                               const std::string& coordinator, int64_t attempt,
                               bool reuse_samples, bool recompute) {
  RETURN_IF_ERROR(ValidateName("step_id", step_id, kMaxStepIdBytes));
  RETURN_IF_ERROR(ValidateName("pool name", pool_name, kMaxPoolNameBytes));
  int64_t ticket = 0;
  {
    absl::MutexLock lock(&mu_);
    if (steps_.contains(step_id) || pending_steps_.contains(step_id) || holds_.contains(step_id)) {
      return absl::AlreadyExistsError(absl::StrCat("step \"", step_id, "\" already exists"));
    }
    auto pool_it = pools_.find(pool_name);
    if (pool_it == pools_.end()) {
      return absl::NotFoundError(absl::StrCat("pool \"", pool_name, "\" has no registered model"));
    }
    Pool& pool = pool_it->second;
    RETURN_IF_ERROR(CheckFree(pool, pool_name, step_id, sample_ids));
    std::vector<std::shared_ptr<const std::string>> routing;
    if (recompute) {
      // R2: the routing each sample has now, shared (a later commit
      // replaces the store's, never this hold's).
      routing.reserve(sample_ids.size());
      for (const std::string& id : sample_ids) {
        std::shared_ptr<const std::string> ids = pool.recompute_routing.Find(id);
        if (ids == nullptr) {
          return absl::FailedPreconditionError(absl::StrCat(
              "replay_source RECOMPUTE: sample \"", id,
              "\" holds no recompute routing (upload and commit it from a step that contains "
              "it first: Trainer.UploadRouting, Trainer.CommitRouting)"));
        }
        routing.push_back(std::move(ids));
      }
    }
    if (log_ != nullptr) {
      ASSIGN_OR_RETURN(ticket, log_->Append(RecordType::kHoldSamples,
                                            EncodeHoldSamples(step_id, pool_name, sample_ids,
                                                              coordinator, attempt,
                                                              reuse_samples, recompute)));
    }
    for (const std::string& id : sample_ids) pool.free_by_arrival.erase(pool.arrival_of.at(id));
    pool.live_steps++;
    StepHolds::Hold hold;
    hold.pool = pool_name;
    hold.sample_ids.assign(sample_ids.begin(), sample_ids.end());
    hold.coordinator = coordinator;
    hold.attempt = attempt;
    hold.held_at = absl::Now();
    hold.reuse_samples = reuse_samples;
    hold.recompute = recompute;
    hold.recompute_routing = std::move(routing);
    holds_.Add(step_id, std::move(hold));
  }
  if (log_ != nullptr) RETURN_IF_ERROR(log_->Sync(ticket));
  return absl::OkStatus();
}

absl::Status SampleStore::ConfirmHold(const std::string& step_id) {
  absl::MutexLock lock(&mu_);
  return holds_.Confirm(step_id);
}

int64_t SampleStore::HoldAttempt(const std::string& step_id) const {
  absl::ReaderMutexLock lock(&mu_);
  return holds_.Attempt(step_id);
}

absl::StatusOr<ReleaseResult> SampleStore::DropHold(const std::string& step_id,
                                                    int64_t attempt) {
  int64_t ticket = 0;
  ReleaseResult result;
  {
    absl::MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(const StepHolds::Hold* hold, holds_.Get(step_id, attempt));
    if (log_ != nullptr) {
      const std::string record = EncodeDropHold(step_id);
      ASSIGN_OR_RETURN(ticket, log_->Append(RecordType::kDropHold, record));
      log_->AddDeadBytes(LogRecordBytes(record.size()) +
                         LogRecordBytes(StepHolds::Record(step_id, *hold).size()));
    }
    Pool& pool = pools_.at(hold->pool);
    // The drop-hold record replays the deletion of closed groups' samples.
    absl::StatusOr<ReleaseResult> back =
        ReturnToFree(hold->pool, pool, hold->sample_ids, /*log_drop=*/false);
    result.released_samples = back->returned_samples;
    pool.live_steps--;
    holds_.Erase(step_id);
  }
  if (log_ != nullptr) RETURN_IF_ERROR(log_->Sync(ticket));
  return result;
}

absl::StatusOr<ReleaseResult> SampleStore::ReleaseHoldLocked(const std::string& step_id,
                                                             int64_t* ticket) {
  const StepHolds::Hold& hold = *holds_.Find(step_id);
  if (log_ != nullptr) {
    const std::string record = EncodeReleaseStep(step_id);
    ASSIGN_OR_RETURN(int64_t written, log_->Append(RecordType::kReleaseStep, record));
    *ticket = written;
    int64_t dead = LogRecordBytes(record.size()) +
                   LogRecordBytes(StepHolds::Record(step_id, hold).size());
    const Pool& pool = pools_.at(hold.pool);
    if (!hold.reuse_samples) {
      for (const std::string& id : hold.sample_ids) {
        dead += LoggedSampleBytes(*pool.samples.at(id));
      }
    }
    log_->AddDeadBytes(dead);
  }
  Pool& pool = pools_.at(hold.pool);
  pool.live_steps--;
  ReleaseResult result = ReleaseSamples(pool, hold.sample_ids, hold.reuse_samples);
  holds_.Erase(step_id);
  return result;
}

absl::StatusOr<std::vector<std::shared_ptr<const StoredSample>>> SampleStore::HeldSamples(
    const std::string& step_id, absl::Span<const std::string> sample_ids) const {
  absl::ReaderMutexLock lock(&mu_);
  ASSIGN_OR_RETURN(std::vector<size_t> positions, holds_.Positions(step_id, sample_ids));
  const StepHolds::Hold& hold = *holds_.Find(step_id);
  const Pool& pool = pools_.at(hold.pool);
  std::vector<std::shared_ptr<const StoredSample>> samples;
  samples.reserve(positions.size());
  for (size_t at : positions) samples.push_back(pool.samples.at(hold.sample_ids[at]));
  return samples;
}

absl::StatusOr<std::vector<std::shared_ptr<const std::string>>>
SampleStore::HeldRecomputeRouting(const std::string& step_id,
                                  absl::Span<const std::string> sample_ids) const {
  absl::ReaderMutexLock lock(&mu_);
  return holds_.RecomputeRouting(step_id, sample_ids);
}

std::vector<std::string> SampleStore::UnconfirmedHolds(absl::Duration age) const {
  const absl::Time cutoff = absl::Now() - age;
  absl::ReaderMutexLock lock(&mu_);
  return holds_.Unconfirmed(cutoff);
}

std::vector<std::string> SampleStore::HoldIds() const {
  absl::ReaderMutexLock lock(&mu_);
  return holds_.Ids();
}

absl::StatusOr<ReleaseResult> SampleStore::ReleaseHold(const std::string& step_id) {
  RETURN_IF_ERROR(ValidateName("step_id", step_id, kMaxStepIdBytes));
  int64_t ticket = 0;
  absl::StatusOr<ReleaseResult> released =
      ReleaseStepLocked(step_id, /*holds_only=*/true, &ticket);
  if (!released.ok()) return released;
  RETURN_IF_ERROR(SyncRelease(ticket));
  return released;
}

}  // namespace rollpack
