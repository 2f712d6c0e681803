#include "server/store/sample_store.h"

#include <algorithm>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "base/status_macros.h"
#include "server/store/convert.h"
#include "server/store/durable_log.h"
#include "server/store/log_records.h"
#include "server/store/names.h"
#include "server/store/ndarray.h"
#include "server/store/step_builder.h"
#include "server/store/step_metadata.h"
#include "server/store/step_request_validation.h"

namespace rollpack {
SampleStore::SampleStore(int64_t max_memory_bytes) : max_memory_bytes_(max_memory_bytes) {}

std::vector<std::string> SampleStore::PoolNames() const {
  absl::ReaderMutexLock lock(&mu_);
  std::vector<std::string> names;
  names.reserve(pools_.size());
  for (const auto& [name, pool] : pools_) names.push_back(name);
  return names;
}

void SampleStore::set_max_pool_bytes(int64_t bytes) {
  absl::MutexLock lock(&mu_);
  max_pool_bytes_ = bytes > 0 ? bytes : 0;
}

int64_t SampleStore::max_pool_bytes() const {
  absl::MutexLock lock(&mu_);
  return max_pool_bytes_;
}

absl::Status SampleStore::CheckPoolRoom(const std::string& pool) const {
  absl::ReaderMutexLock lock(&mu_);
  return PoolRoomLocked(pool);
}

absl::Status SampleStore::PoolRoomLocked(const std::string& pool) const {
  if (max_pools_ > 0 && pools_.count(pool) == 0 &&
      static_cast<int64_t>(pools_.size()) >= max_pools_) {
    return absl::ResourceExhaustedError(absl::StrCat("pool \"", pool, "\" would be pool ",
                                                     pools_.size() + 1,
                                                     " of this server; --max-pools is ", max_pools_));
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> SampleStore::RegisterModel(const std::string& pool_name,
                                                const ModelSpec& model,
                                                const std::optional<PoolOptions>& options) {
  RETURN_IF_ERROR(ValidateName("pool name", pool_name, kMaxPoolNameBytes));
  RETURN_IF_ERROR(ValidateModelSpec(model));
  int64_t ticket = 0;
  bool inserted = false;
  {
    absl::MutexLock lock(&mu_);
    // Each pool has its own metric series: the bound keeps /metrics bounded.
    RETURN_IF_ERROR(PoolRoomLocked(pool_name));
    auto emplaced = pools_.try_emplace(pool_name, model, options.value_or(PoolOptions{}));
    auto it = emplaced.first;
    inserted = emplaced.second;
    if (!inserted && it->second.model != model) {
      return absl::FailedPreconditionError(absl::StrCat(
          "pool \"", pool_name, "\" already holds model \"", it->second.model.name,
          "\" with another spec; a pool holds one model"));
    }
    if (!inserted && options.has_value() && it->second.options != *options) {
      return absl::FailedPreconditionError(absl::StrCat(
          "pool \"", pool_name, "\" was registered with other options (",
          ToProto(it->second.options).ShortDebugString(), "); a pool's options are fixed"));
    }
    if (log_ == nullptr) return inserted;
    if (inserted) {
      absl::StatusOr<int64_t> written = log_->Append(
          RecordType::kRegisterModel, EncodeRegisterModel(pool_name, model, it->second.options));
      if (!written.ok()) {
        pools_.erase(it);
        return written.status();
      }
      ticket = *written;
    } else {
      // An identical re-register is acknowledged once the first is durable.
      ticket = log_->written();
    }
  }
  RETURN_IF_ERROR(log_->Sync(ticket));
  return inserted;
}

absl::StatusOr<ModelSpec> SampleStore::GetModel(const std::string& pool) const {
  RETURN_IF_ERROR(ValidateName("pool name", pool, kMaxPoolNameBytes));
  absl::ReaderMutexLock lock(&mu_);
  auto it = pools_.find(pool);
  if (it == pools_.end()) {
    return absl::NotFoundError(absl::StrCat("pool \"", pool, "\" has no registered model"));
  }
  return it->second.model;
}

void SampleStore::set_max_pools(int64_t pools) {
  absl::MutexLock lock(&mu_);
  max_pools_ = pools;
}

absl::StatusOr<ModelSpec> SampleStore::GetOrAdoptModel(const std::string& pool) {
  absl::StatusOr<ModelSpec> model = GetModel(pool);
  if (model.ok() || !absl::IsNotFound(model.status()) || pool_directory_ == nullptr) {
    return model;
  }
  ASSIGN_OR_RETURN(std::optional<PoolDefinition> resolved, pool_directory_->Resolve(pool));
  if (!resolved.has_value()) return model;
  // Another caller may adopt it at the same time: the same model is a no-op.
  RETURN_IF_ERROR(RegisterModel(pool, resolved->model, resolved->options));
  return std::move(resolved->model);
}

absl::StatusOr<PutResult> SampleStore::Put(const std::string& pool_name,
                                           std::vector<StoredSample> samples) {
  RETURN_IF_ERROR(FixSchemaClusterWide(pool_name, samples));
  if (log_ == nullptr) {
    int64_t unused = 0;
    return PutLocked(pool_name, std::move(samples), std::string(), &unused);
  }
  // Encode outside the lock: the common batch is all new samples.
  // Default group sizes are applied under the lock: such a batch is
  // re-encoded there (PutLocked).
  const bool defaults_apply = std::any_of(samples.begin(), samples.end(), [](const StoredSample& s) {
    return s.group_size == 0 && !s.group_id.empty();
  });
  std::string encoded = samples.empty() || defaults_apply
                            ? std::string()
                            : EncodeSamples(pool_name, absl::MakeConstSpan(samples),
                                            SamplesRecordType(absl::MakeConstSpan(samples)));
  int64_t ticket = 0;
  absl::StatusOr<PutResult> result =
      PutLocked(pool_name, std::move(samples), std::move(encoded), &ticket);
  if (!result.ok()) return result;
  // Acknowledged only once durable (and a duplicate only once its first copy is).
  RETURN_IF_ERROR(log_->Sync(ticket));
  return result;
}

absl::StatusOr<PutResult> SampleStore::PutLocked(const std::string& pool_name,
                                                 std::vector<StoredSample> samples,
                                                 std::string encoded, int64_t* ticket) {
  absl::MutexLock lock(&mu_);
  auto pool_it = pools_.find(pool_name);
  if (pool_it == pools_.end()) {
    return absl::NotFoundError(absl::StrCat("pool \"", pool_name, "\" has no registered model"));
  }
  Pool& pool = pool_it->second;

  // The first sample of an empty pool fixes the fields for the batch too.
  BatchSchema batch_schema;
  if (!pool.schema_complete()) {
    batch_schema = Pool::ProposeSchema(samples);
  }

  PutResult result;
  std::vector<bool> is_new(samples.size(), false);
  std::vector<std::optional<OpenSamples::Plan>> piece_plans(samples.size());
  absl::flat_hash_map<std::string, size_t> batch_index;
  absl::flat_hash_map<std::string, int32_t> batch_group_counts;
  int64_t new_bytes = 0;
  // The largest sample the batch would store (a piece: its whole sample so far).
  std::string largest_id;
  int64_t largest_bytes = 0;
  auto note_largest = [&](const std::string& id, int64_t bytes) {
    if (bytes > largest_bytes) {
      largest_bytes = bytes;
      largest_id = id;
    }
  };
  for (size_t i = 0; i < samples.size(); ++i) {
    // A later piece's group fields only repeat piece 0's: no default there.
    const bool later_piece =
        samples[i].piece_message.has_value() && samples[i].piece_message->index > 0;
    if (samples[i].group_size == 0 && !samples[i].group_id.empty() && !later_piece) {
      samples[i].group_size = pool.options.default_group_size;
    }
    const StoredSample& sample = samples[i];
    if (!later_piece) RETURN_IF_ERROR(pool.CheckSchema(sample, batch_schema));
    if (OpenSamples::IsPieceOrOpen(sample)) {
      // Each piece is planned against the store as it is: two messages for
      // one sample in a request would need the first applied first.
      if (!batch_index.try_emplace(sample.sample_id, i).second) {
        return absl::InvalidArgumentError(absl::StrCat(
            "sample \"", sample.sample_id, "\" appears twice in one request; send the pieces of "
            "a sample in separate requests"));
      }
      ASSIGN_OR_RETURN(OpenSamples::Plan plan, PlanPiece(pool_name, pool, sample));
      if (plan.action == OpenSamples::Action::kDuplicate) {
        ++result.duplicates;
        continue;
      }
      if (plan.action != OpenSamples::Action::kExtend) {
        RETURN_IF_ERROR(pool.CheckGroup(sample, batch_group_counts));
        if (sample.grouped()) ++batch_group_counts[sample.group_id];
      }
      is_new[i] = true;
      new_bytes += plan.new_bytes;
      const StoredSample* open = pool.open.Find(sample.sample_id);
      note_largest(sample.sample_id, plan.new_bytes + (open == nullptr ? 0 : MemoryBytes(*open)));
      piece_plans[i] = plan;
      continue;
    }
    if (const StoredSample* open = pool.open.Find(sample.sample_id); open != nullptr) {
      return absl::AlreadyExistsError(absl::StrCat(
          "sample \"", sample.sample_id, "\" already exists in pool \"", pool_name,
          "\" as an open sample (", open->pieces.size(), " pieces stored); extend it with piece ",
          open->pieces.size()));
    }
    auto stored = pool.samples.find(sample.sample_id);
    if (stored != pool.samples.end()) {
      if (!SameAsPut(*stored->second, sample)) {
        return absl::AlreadyExistsError(absl::StrCat(
            "sample \"", sample.sample_id, "\" already exists in pool \"", pool_name,
            "\" with different content"));
      }
      ++result.duplicates;
      continue;
    }
    auto [it, inserted] = batch_index.try_emplace(sample.sample_id, i);
    if (!inserted) {
      if (!(samples[it->second] == sample)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "sample \"", sample.sample_id, "\" appears twice in one request with different content"));
      }
      ++result.duplicates;
      continue;
    }
    RETURN_IF_ERROR(pool.CheckGroup(sample, batch_group_counts));
    if (sample.grouped()) ++batch_group_counts[sample.group_id];
    is_new[i] = true;
    new_bytes += MemoryBytes(sample);
    note_largest(sample.sample_id, MemoryBytes(sample));
  }
  // What no release can make room for is refused with a code producers do
  // not retry.
  for (const auto& [limit, flag] : {std::make_pair(max_memory_bytes_, "--max-memory"),
                                    std::make_pair(max_pool_bytes_, "--max-pool-memory")}) {
    if (limit <= 0 || new_bytes <= limit) continue;
    if (largest_bytes > limit) {
      return absl::FailedPreconditionError(absl::StrCat(
          "sample \"", largest_id, "\" takes ", largest_bytes, " bytes, more than ", flag, " ",
          limit, ": it can never be stored (raise the limit, or send shorter rollouts)"));
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "a message of ", new_bytes, " bytes of new samples is more than ", flag, " ", limit,
        ": it can never be stored whole (send smaller messages)"));
  }
  if (stored_bytes_ + new_bytes > max_memory_bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "memory limit: storing ", new_bytes, " more bytes would exceed --max-memory ",
        max_memory_bytes_, " (", stored_bytes_,
        " held); retry after the trainer releases a step"));
  }
  if (max_pool_bytes_ > 0 && pool.stored_bytes + new_bytes > max_pool_bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "pool memory limit: storing ", new_bytes, " more bytes in pool \"", pool_name,
        "\" would exceed --max-pool-memory ", max_pool_bytes_, " (", pool.stored_bytes,
        " held by the pool); retry after the trainer releases a step"));
  }
  if (log_ != nullptr) {
    // Written under the lock so the log's order is the store's order.
    const bool all_new = std::find(is_new.begin(), is_new.end(), false) == is_new.end();
    std::vector<const StoredSample*> fresh;
    for (size_t i = 0; i < samples.size(); ++i) {
      if (is_new[i]) fresh.push_back(&samples[i]);
    }
    const RecordType type = SamplesRecordType(absl::MakeConstSpan(fresh));
    // Re-encoded when some are duplicates or Put could not encode them
    // (defaults applied here).
    if (!all_new || encoded.empty()) {
      encoded = fresh.empty() ? std::string()
                              : EncodeSamples(pool_name, absl::MakeConstSpan(fresh), type);
    }
    if (encoded.empty()) {
      *ticket = log_->written();
    } else {
      ASSIGN_OR_RETURN(int64_t written, log_->Append(type, encoded));
      *ticket = written;
    }
  }

  if (!samples.empty()) pool.FixSchema(std::move(batch_schema));
  const int64_t now_nanos = absl::GetCurrentTimeNanos();
  for (size_t i = 0; i < samples.size(); ++i) {
    if (!is_new[i]) continue;
    if (piece_plans[i].has_value()) {
      const int64_t added =
          pool.ApplyPiece(*piece_plans[i], std::move(samples[i]), now_nanos, &next_arrival_);
      stored_bytes_ += added;
      result.stored_bytes += added;
      continue;
    }
    const int64_t bytes = MemoryBytes(samples[i]);
    pool.AddSealed(std::move(samples[i]), next_arrival_++, now_nanos);
    pool.stored_bytes += bytes;
    stored_bytes_ += bytes;
    result.stored_bytes += bytes;
  }
  result.accepted = static_cast<int64_t>(samples.size());
  return result;
}

std::vector<LiveStep> SampleStore::ListSteps(const std::string& pool) const {
  absl::ReaderMutexLock lock(&mu_);
  std::vector<LiveStep> live;
  for (const auto& [id, step] : steps_) {
    if (!pool.empty() && step->pool != pool) continue;
    auto created = step_created_unix_nanos_.find(id);
    LiveStep& entry = live.emplace_back();
    entry.step = step;
    entry.created_unix_nanos = created == step_created_unix_nanos_.end() ? 0 : created->second;
  }
  std::sort(live.begin(), live.end(), [](const LiveStep& a, const LiveStep& b) {
    return a.step->step_id < b.step->step_id;
  });
  return live;
}

int64_t SampleStore::StepCreatedUnixNanos(const std::string& step_id) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = step_created_unix_nanos_.find(step_id);
  return it == step_created_unix_nanos_.end() ? 0 : it->second;
}

absl::StatusOr<PoolStats> SampleStore::GetPool(const std::string& pool_name) const {
  RETURN_IF_ERROR(ValidateName("pool name", pool_name, kMaxPoolNameBytes));
  absl::ReaderMutexLock lock(&mu_);
  auto it = pools_.find(pool_name);
  if (it == pools_.end()) {
    return absl::NotFoundError(absl::StrCat("pool \"", pool_name, "\" has no registered model"));
  }
  return it->second.Stats(pool_name);
}

StoreStats SampleStore::Stats() const {
  absl::ReaderMutexLock lock(&mu_);
  StoreStats stats;
  stats.stored_bytes = stored_bytes_;
  stats.max_memory_bytes = max_memory_bytes_;
  for (const auto& [name, pool] : pools_) stats.num_samples += pool.samples.size();
  stats.num_live_steps = static_cast<int64_t>(steps_.size());
  return stats;
}

absl::StatusOr<std::shared_ptr<const Step>> SampleStore::CreateStep(
    const std::string& step_id, const std::string& pool_name,
    absl::Span<const std::string> sample_ids, int num_samples, const Topology& topology) {
  StepRequest request;
  request.step_id = step_id;
  request.pool = pool_name;
  request.sample_ids.assign(sample_ids.begin(), sample_ids.end());
  request.selection.num_samples = num_samples;
  request.topology = topology;
  return CreateStep(request);
}

absl::StatusOr<std::shared_ptr<const Step>> SampleStore::CreateStep(const StepRequest& request) {
  // What the request states outright is refused before any sample is read.
  RETURN_IF_ERROR(ValidateStepRequest(request));
  const std::string step_name = absl::StrCat("step \"", request.step_id, "\"");
  const std::string& step_id = request.step_id;
  const std::string& pool_name = request.pool;
  // Reserve the samples under the lock, plan without it (step_builder.h).
  ModelSpec model;
  std::vector<std::shared_ptr<const StoredSample>> samples;
  // The samples taken, to give back if the step fails (`samples` moves
  // into the step). Out of the free set and in no step or hold, they stay
  // in the pool meanwhile: only free samples and those of a released step
  // or hold are ever erased (ReturnToFree relies on it too).
  std::vector<const StoredSample*> reserved;
  int32_t num_groups = 0;
  StepMetadata metadata;  // taken before any sample leaves the free set
  StepReplay replay;
  absl::Status replay_status;
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
    model = pool.model;
    const SelectionRequest selection = pool.Effective(request.selection);
    const std::string what = absl::StrCat("step \"", step_id, "\": pool \"", pool_name, "\"");
    if (!request.sample_ids.empty()) {
      RETURN_IF_ERROR(CheckFree(pool, pool_name, step_id, request.sample_ids));
      std::vector<SampleCandidate> chosen;
      for (const std::string& id : request.sample_ids) {
        samples.push_back(pool.samples.at(id));
        const StoredSample& s = *samples.back();
        chosen.push_back(pool.Candidate(s, pool.arrival_of.at(s.sample_id)));
      }
      if (request.replay) {
        num_groups = CountCompleteGroups(chosen);
      } else {
        ASSIGN_OR_RETURN(num_groups,
                         CheckExplicitSelection(chosen, selection,
                                                absl::StrCat("step \"", step_id, "\"")));
      }
      ASSIGN_OR_RETURN(metadata, MakeStepMetadata(samples, request.advantage, step_name));
      for (const std::string& id : request.sample_ids) {
        pool.free_by_arrival.erase(pool.arrival_of.at(id));
      }
    } else {
      // Oldest-first selections read a growing prefix of the free samples
      // until it decides them (sample_selection.h), so a step costs what it
      // takes, not what the pool holds; newest-first reads every one.
      const int64_t free = static_cast<int64_t>(pool.free_by_arrival.size());
      int64_t limit = selection.order == SelectionOrder::kOldest
                          ? std::max<int64_t>(selection.num_samples, 4096)
                          : free;
      std::vector<SampleCandidate> candidates;
      std::vector<Pool::FreeSamples::const_iterator> where;
      Selection chosen;
      while (true) {
        candidates = pool.FreeCandidates(std::min(limit, free), &where);
        const bool prefix = static_cast<int64_t>(candidates.size()) < free;
        ASSIGN_OR_RETURN(chosen, SelectSamples(candidates, selection, what, prefix));
        if (!chosen.needs_more) break;
        limit *= 4;
      }
      RETURN_IF_ERROR(CheckUnreserved(pool, step_id, candidates, chosen.chosen));
      // Taken out through the free map's own entries, with no lookup by
      // id (the chosen indices are distinct: each entry is taken once).
      samples.reserve(chosen.chosen.size());
      for (int32_t i : chosen.chosen) samples.push_back(where[i]->second);
      ASSIGN_OR_RETURN(metadata, MakeStepMetadata(samples, request.advantage, step_name));
      for (int32_t i : chosen.chosen) pool.free_by_arrival.erase(where[i]);
      num_groups = chosen.num_groups;
    }
    reserved.reserve(samples.size());
    for (const auto& sample : samples) reserved.push_back(sample.get());
    pending_steps_[step_id] = pool_name;
    replay.source = request.replay_source;
    if (request.replay_source == ReplaySourceKind::kRecompute) {
      // R2: the samples' committed routing, shared (a later commit
      // replaces the store's, never this step's).
      replay.recompute_routing.reserve(samples.size());
      for (const auto& sample : samples) {
        std::shared_ptr<const std::string> routing = pool.recompute_routing.Find(sample->sample_id);
        if (routing == nullptr) {
          replay_status = absl::FailedPreconditionError(absl::StrCat(
              "replay_source RECOMPUTE: sample \"", sample->sample_id,
              "\" holds no recompute routing (upload and commit it from a step that contains "
              "it first: Trainer.UploadRouting, Trainer.CommitRouting)"));
          break;
        }
        replay.recompute_routing.push_back(std::move(routing));
      }
    }
  }

  absl::StatusOr<std::shared_ptr<const Step>> step =
      replay_status.ok() ? BuildStep(step_id, pool_name, model, request.topology,
                                     std::move(samples), num_groups, request.reuse_samples,
                                     std::move(replay), std::move(metadata))
                         : absl::StatusOr<std::shared_ptr<const Step>>(replay_status);

  int64_t ticket = 0;
  {
    absl::MutexLock lock(&mu_);
    pending_steps_.erase(step_id);
    auto pool_it = pools_.find(pool_name);
    if (step.ok() && log_ != nullptr) {
      absl::StatusOr<int64_t> written =
          log_->Append(RecordType::kCreateStep, EncodeCreateStep(**step));
      if (written.ok()) {
        ticket = *written;
      } else {
        step = written.status();
      }
    }
    if (!step.ok()) {
      // No record says this step was tried: a sample of a group dropped
      // meanwhile gets a drop record of its own.
      std::vector<std::string> ids;
      ids.reserve(reserved.size());
      for (const StoredSample* sample : reserved) ids.push_back(sample->sample_id);
      absl::Status back = ReturnToFree(pool_name, pool_it->second, ids, /*log_drop=*/true).status();
      if (!back.ok()) return back;
      return absl::Status(step.status().code(),
                          absl::StrCat("step \"", step_id, "\": ", step.status().message()));
    }
    pool_it->second.live_steps++;
    steps_[step_id] = *step;
    step_created_unix_nanos_[step_id] = absl::GetCurrentTimeNanos();
  }
  if (log_ != nullptr) {
    RETURN_IF_ERROR(log_->Sync(ticket));
  }
  // The trainer's version, when it says one, is recorded once the step
  // exists (a refused CreateStep changes nothing), as SetPolicyVersion
  // would: with drop_stale, the free samples it makes stale go.
  if (request.selection.policy_version > 0 && !request.replay) {
    // The step stands whatever happens here: a version the log refused is
    // recorded by the trainer's next report (the log counts its failures).
    SetPolicyVersion(pool_name, request.selection.policy_version).IgnoreError();
  }
  return step;
}

absl::StatusOr<std::shared_ptr<const Step>> SampleStore::GetStep(
    const std::string& step_id) const {
  RETURN_IF_ERROR(ValidateName("step_id", step_id, kMaxStepIdBytes));
  absl::ReaderMutexLock lock(&mu_);
  auto it = steps_.find(step_id);
  if (it == steps_.end()) {
    return absl::NotFoundError(absl::StrCat("step \"", step_id, "\" does not exist or was released"));
  }
  return it->second;
}

absl::StatusOr<ReleaseResult> SampleStore::ReleaseStep(const std::string& step_id) {
  RETURN_IF_ERROR(ValidateName("step_id", step_id, kMaxStepIdBytes));
  int64_t ticket = 0;
  absl::StatusOr<ReleaseResult> released =
      ReleaseStepLocked(step_id, /*holds_only=*/false, &ticket);
  if (!released.ok()) return released;
  RETURN_IF_ERROR(SyncRelease(ticket));
  return released;
}

absl::StatusOr<ReleaseResult> SampleStore::ReleaseStepLocked(const std::string& step_id,
                                                             bool holds_only, int64_t* ticket) {
  absl::MutexLock lock(&mu_);
  auto it = holds_only ? steps_.end() : steps_.find(step_id);
  if (it == steps_.end()) {
    if (holds_.contains(step_id)) return ReleaseHoldLocked(step_id, ticket);
    return absl::NotFoundError(absl::StrCat("step \"", step_id, "\" does not exist or was released"));
  }
  if (log_ != nullptr) {
    const std::string record = EncodeReleaseStep(step_id);
    ASSIGN_OR_RETURN(int64_t written, log_->Append(RecordType::kReleaseStep, record));
    *ticket = written;
    int64_t dead =
        LogRecordBytes(record.size()) + LogRecordBytes(EncodeCreateStep(*it->second).size());
    if (!it->second->reuse_samples) {
      for (const auto& sample : it->second->samples) dead += LoggedSampleBytes(*sample);
    }
    log_->AddDeadBytes(dead);
  }
  std::shared_ptr<const Step> step = std::move(it->second);
  steps_.erase(it);
  step_created_unix_nanos_.erase(step_id);
  Pool& pool = pools_.at(step->pool);
  pool.live_steps--;
  return ReleaseSamples(pool, step->sample_ids, step->reuse_samples);
}

ReleaseResult SampleStore::EraseSamples(Pool& pool, absl::Span<const std::string> sample_ids) {
  ReleaseResult result;
  for (const std::string& id : sample_ids) {
    const Pool::Erased erased = pool.EraseSealed(id);
    if (log_ != nullptr && erased.dead_log_bytes > 0) log_->AddDeadBytes(erased.dead_log_bytes);
    stored_bytes_ -= erased.bytes;
    result.freed_bytes += erased.bytes;
    result.released_samples++;
  }
  return result;
}

}  // namespace rollpack
