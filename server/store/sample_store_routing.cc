// SampleStore's side of R2 (docs/layout.md section 11): samples' committed
// recompute routing, its memory and its log records.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "rollpack/v1/member.pb.h"
#include "server/store/durable_log.h"
#include "scheduler/layout_scatter.h"
#include "server/store/sample_store.h"

namespace rollpack {

absl::Status SampleStore::ReserveMemory(int64_t bytes, const std::string& what) {
  absl::MutexLock lock(&mu_);
  if (stored_bytes_ + bytes > max_memory_bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, " needs ", bytes, " bytes; the store holds ", stored_bytes_, " of --max-memory ",
        max_memory_bytes_));
  }
  stored_bytes_ += bytes;
  return absl::OkStatus();
}

void SampleStore::ReleaseMemory(int64_t bytes) {
  absl::MutexLock lock(&mu_);
  stored_bytes_ -= bytes;
}

void SampleStore::StoreRecomputeRouting(Pool& pool, absl::Span<const std::string> sample_ids,
                                        std::vector<std::string> routing) {
  for (size_t i = 0; i < sample_ids.size(); ++i) {
    const RecomputeBook::Change change =
        pool.recompute_routing.Store(sample_ids[i], std::move(routing[i]));
    if (log_ != nullptr && change.dead_log_bytes > 0) log_->AddDeadBytes(change.dead_log_bytes);
    pool.stored_bytes += change.bytes;
    stored_bytes_ += change.bytes;
  }
}

absl::StatusOr<int64_t> SampleStore::SetRecomputeRouting(const std::shared_ptr<const Step>& step,
                                                         std::vector<std::string> routing) {
  const std::string& step_id = step->step_id;
  int64_t ticket = 0;
  int64_t total = 0;
  {
    absl::MutexLock lock(&mu_);
    auto step_it = steps_.find(step_id);
    if (step_it == steps_.end() || step_it->second != step) {
      return absl::FailedPreconditionError(absl::StrCat(
          "step \"", step_id, "\" was released (or released and created again) before its "
          "recorded routing was committed"));
    }
    ASSIGN_OR_RETURN(total, CommitRoutingLocked(step->pool, step_id, step->sample_ids,
                                                std::move(routing), &ticket));
  }
  if (log_ != nullptr) RETURN_IF_ERROR(log_->Sync(ticket));
  return total;
}

absl::StatusOr<int64_t> SampleStore::SetHeldRecomputeRouting(
    const std::string& step_id, int64_t attempt, absl::Span<const std::string> sample_ids,
    std::vector<std::string> routing) {
  int64_t ticket = 0;
  int64_t total = 0;
  {
    absl::MutexLock lock(&mu_);
    const StepHolds::Hold* hold = holds_.Find(step_id);
    if (hold == nullptr || hold->attempt != attempt) {
      return absl::FailedPreconditionError(absl::StrCat(
          "step \"", step_id, "\" was released (or released and created again) before its "
          "recorded routing was committed"));
    }
    const absl::flat_hash_set<absl::string_view> held(hold->sample_ids.begin(),
                                                      hold->sample_ids.end());
    for (const std::string& id : sample_ids) {
      if (!held.contains(id)) {
        return absl::InvalidArgumentError(
            absl::StrCat("step \"", step_id, "\" holds no sample \"", id, "\" here"));
      }
    }
    ASSIGN_OR_RETURN(total, CommitRoutingLocked(hold->pool, step_id, sample_ids,
                                                std::move(routing), &ticket));
  }
  if (log_ != nullptr) RETURN_IF_ERROR(log_->Sync(ticket));
  return total;
}

absl::StatusOr<int64_t> SampleStore::CommitRoutingLocked(const std::string& pool_name,
                                                         const std::string& step_id,
                                                         absl::Span<const std::string> sample_ids,
                                                         std::vector<std::string> routing,
                                                         int64_t* ticket) {
  Pool& pool = pools_.at(pool_name);
  if (routing.size() != sample_ids.size()) {
    return absl::InvalidArgumentError(absl::StrCat("step \"", step_id, "\" has ",
                                                   sample_ids.size(), " samples, ",
                                                   routing.size(), " routings were given"));
  }
  const ModelSpec& model = pool.model;
  int64_t growth = 0;
  int64_t total = 0;
  for (size_t i = 0; i < routing.size(); ++i) {
    const int64_t n = pool.samples.at(sample_ids[i])->num_tokens();
    const int64_t expected =
        n * model.stored_layers() * model.topk * model.stored_id_bytes();
    if (static_cast<int64_t>(routing[i].size()) != expected) {
      return absl::InvalidArgumentError(absl::StrCat(
          "recompute routing of sample \"", sample_ids[i], "\" has ", routing[i].size(),
          " bytes; ", n, " tokens x ", model.stored_layers(), " layers x topk ", model.topk,
          " need ", expected));
    }
    growth += expected - pool.recompute_routing.BytesOf(sample_ids[i]);
    total += expected;
  }
  if (growth > 0 && stored_bytes_ + growth > max_memory_bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "recompute routing of step \"", step_id, "\" needs ", growth,
        " more bytes; the store holds ", stored_bytes_, " of --max-memory ", max_memory_bytes_));
  }
  if (growth > 0 && max_pool_bytes_ > 0 && pool.stored_bytes + growth > max_pool_bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "recompute routing of step \"", step_id, "\" needs ", growth, " more bytes; pool \"",
        pool_name, "\" holds ", pool.stored_bytes, " of --max-pool-memory ", max_pool_bytes_));
  }
  if (log_ != nullptr) {
    std::vector<const std::string*> parts;
    parts.reserve(routing.size());
    for (const std::string& r : routing) parts.push_back(&r);
    // Numbered parts: replay applies them only when every one is there,
    // so a failure between two appends leaves the log as if nothing was
    // committed (the parts written are dead).
    int64_t appended = 0;
    for (const std::string& record :
         RecomputeBook::EncodeCommit(pool_name, step_id, sample_ids, parts)) {
      absl::StatusOr<int64_t> written = log_->Append(RecordType::kRecomputeRouting, record);
      if (!written.ok()) {
        log_->AddDeadBytes(appended);
        return written.status();
      }
      appended += static_cast<int64_t>(record.size()) + kLogRecordHeaderBytes;
      *ticket = *written;
    }
  }
  StoreRecomputeRouting(pool, sample_ids, std::move(routing));
  return total;
}

absl::Status SampleStore::ReplayRecomputeRouting(const v1::RecomputeRoutingRecord& record) {
  absl::MutexLock lock(&mu_);
  if (record.parts() <= 1) return ApplyRoutingRecord(record);
  if (record.part() < 0 || record.part() >= record.parts()) {
    return absl::DataLossError(absl::StrCat("recompute routing record part ", record.part(),
                                            " of ", record.parts()));
  }
  std::vector<v1::RecomputeRoutingRecord>& pending = pending_routing_[record.step_id()];
  // A commit starts again at part 0 (an earlier attempt was cut short).
  if (record.part() == 0) pending.clear();
  if (static_cast<int>(pending.size()) != record.part()) {
    pending_routing_.erase(record.step_id());
    return absl::OkStatus();  // parts out of order: an attempt cut short
  }
  pending.push_back(record);
  if (static_cast<int>(pending.size()) < record.parts()) return absl::OkStatus();
  std::vector<v1::RecomputeRoutingRecord> complete = std::move(pending);
  pending_routing_.erase(record.step_id());
  for (const v1::RecomputeRoutingRecord& part : complete) {
    RETURN_IF_ERROR(ApplyRoutingRecord(part));
  }
  return absl::OkStatus();
}

absl::Status SampleStore::ApplyRoutingRecord(const v1::RecomputeRoutingRecord& record) {
  auto pool_it = pools_.find(record.pool());
  if (pool_it == pools_.end()) {
    return absl::DataLossError(
        absl::StrCat("recompute routing record for pool \"", record.pool(), "\" with no model"));
  }
  if (record.sample_ids_size() != record.experts_size()) {
    return absl::DataLossError(absl::StrCat("recompute routing record has ",
                                            record.sample_ids_size(), " sample ids and ",
                                            record.experts_size(), " routings"));
  }
  Pool& pool = pool_it->second;
  const ModelSpec& model = pool.model;
  const int64_t per_token =
      int64_t{model.stored_layers()} * model.topk * model.stored_id_bytes();
  std::vector<std::string> ids;
  std::vector<std::string> routing;
  for (int i = 0; i < record.sample_ids_size(); ++i) {
    // A sample released after the commit (a later record) is still here.
    auto sample = pool.samples.find(record.sample_ids(i));
    if (sample == pool.samples.end()) {
      return absl::DataLossError(absl::StrCat("recompute routing record for sample \"",
                                              record.sample_ids(i), "\", which is not stored"));
    }
    const int64_t expected = sample->second->num_tokens() * per_token;
    if (static_cast<int64_t>(record.experts(i).size()) != expected) {
      return absl::DataLossError(absl::StrCat(
          "recompute routing record for sample \"", record.sample_ids(i), "\" has ",
          record.experts(i).size(), " bytes; its ", sample->second->num_tokens(),
          " tokens need ", expected));
    }
    ids.push_back(record.sample_ids(i));
    routing.push_back(record.experts(i));
  }
  StoreRecomputeRouting(pool, ids, std::move(routing));
  return absl::OkStatus();
}

}  // namespace rollpack
