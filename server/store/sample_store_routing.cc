// SampleStore's side of R2 (docs/layout.md section 11): samples' committed
// recompute routing, its memory and its log records.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "base/status_macros.h"
#include "rollpack/v1/member.pb.h"
#include "server/store/durable_log.h"
#include "scheduler/layout_scatter.h"
#include "server/store/sample_store.h"

namespace rollpack {
namespace {

// Records stay far below the log's 2 GiB limit and protobuf's.
constexpr int64_t kMaxRoutingRecordBytes = int64_t{256} << 20;

// `ids[i]`'s routing as records of at most kMaxRoutingRecordBytes (one
// sample larger than that gets a record of its own).
std::vector<std::string> EncodeRoutingRecords(const std::string& pool, const std::string& step_id,
                                              absl::Span<const std::string> ids,
                                              absl::Span<const std::string* const> routing) {
  std::vector<std::string> records;
  v1::RecomputeRoutingRecord record;
  int64_t bytes = 0;
  const auto flush = [&] {
    if (record.sample_ids().empty()) return;
    records.push_back(record.SerializeAsString());
    record.Clear();
    bytes = 0;
  };
  for (size_t i = 0; i < ids.size(); ++i) {
    if (bytes > 0 && bytes + static_cast<int64_t>(routing[i]->size()) > kMaxRoutingRecordBytes) {
      flush();
    }
    if (record.sample_ids().empty()) {
      record.set_pool(pool);
      record.set_step_id(step_id);
    }
    record.add_sample_ids(ids[i]);
    record.add_experts(*routing[i]);
    bytes += static_cast<int64_t>(routing[i]->size() + ids[i].size());
  }
  flush();
  return records;
}

// Bytes of the recompute routing of a sample of n tokens.
int64_t RoutingBytes(const ModelSpec& model, int64_t stored_layers, int64_t n) {
  return n * stored_layers * model.topk * model.stored_id_bytes();
}

}  // namespace

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
    auto shared = std::make_shared<const std::string>(std::move(routing[i]));
    const int64_t added = static_cast<int64_t>(shared->size());
    auto [it, inserted] = pool.recompute_routing.try_emplace(sample_ids[i], shared);
    int64_t removed = 0;
    if (!inserted) {
      removed = static_cast<int64_t>(it->second->size());
      it->second = std::move(shared);
    }
    pool.stored_bytes += added - removed;
    stored_bytes_ += added - removed;
  }
}

absl::StatusOr<int64_t> SampleStore::SetRecomputeRouting(const std::string& step_id,
                                                         std::vector<std::string> routing) {
  int64_t ticket = 0;
  int64_t total = 0;
  {
    absl::MutexLock lock(&mu_);
    auto step_it = steps_.find(step_id);
    if (step_it == steps_.end()) {
      return absl::NotFoundError(
          absl::StrCat("step \"", step_id, "\" does not exist or was released"));
    }
    const Step& step = *step_it->second;
    Pool& pool = pools_.at(step.pool);
    if (routing.size() != step.sample_ids.size()) {
      return absl::InvalidArgumentError(absl::StrCat("step \"", step_id, "\" has ",
                                                     step.sample_ids.size(), " samples, ",
                                                     routing.size(), " routings were given"));
    }
    const int64_t stored_layers = static_cast<int64_t>(StoredRoutingLayerIds(step.layout.pipeline()).size());
    int64_t growth = 0;
    for (size_t i = 0; i < routing.size(); ++i) {
      const int64_t n = step.layout.lengths()[i];
      const int64_t expected = RoutingBytes(step.model, stored_layers, n);
      if (static_cast<int64_t>(routing[i].size()) != expected) {
        return absl::InvalidArgumentError(absl::StrCat(
            "recompute routing of sample \"", step.sample_ids[i], "\" has ", routing[i].size(),
            " bytes; ", n, " tokens x ", stored_layers, " layers x topk ", step.model.topk,
            " need ", expected));
      }
      growth += expected;
      if (auto it = pool.recompute_routing.find(step.sample_ids[i]);
          it != pool.recompute_routing.end()) {
        growth -= static_cast<int64_t>(it->second->size());
      }
      total += expected;
    }
    if (growth > 0 && stored_bytes_ + growth > max_memory_bytes_) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "recompute routing of step \"", step_id, "\" needs ", growth,
          " more bytes; the store holds ", stored_bytes_, " of --max-memory ", max_memory_bytes_));
    }
    if (log_ != nullptr) {
      std::vector<const std::string*> parts;
      parts.reserve(routing.size());
      for (const std::string& r : routing) parts.push_back(&r);
      for (const std::string& record :
           EncodeRoutingRecords(step.pool, step_id, step.sample_ids, parts)) {
        ASSIGN_OR_RETURN(ticket, log_->Append(RecordType::kRecomputeRouting, record));
      }
    }
    StoreRecomputeRouting(pool, step.sample_ids, std::move(routing));
  }
  if (log_ != nullptr) RETURN_IF_ERROR(log_->Sync(ticket));
  return total;
}

absl::Status SampleStore::ReplayRecomputeRouting(const v1::RecomputeRoutingRecord& record) {
  absl::MutexLock lock(&mu_);
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
  std::vector<std::string> ids;
  std::vector<std::string> routing;
  for (int i = 0; i < record.sample_ids_size(); ++i) {
    // A sample released after the commit (a later record) is still here.
    if (!pool.samples.contains(record.sample_ids(i))) {
      return absl::DataLossError(absl::StrCat("recompute routing record for sample \"",
                                              record.sample_ids(i), "\", which is not stored"));
    }
    ids.push_back(record.sample_ids(i));
    routing.push_back(record.experts(i));
  }
  StoreRecomputeRouting(pool, ids, std::move(routing));
  return absl::OkStatus();
}

std::vector<std::string> SampleStore::EncodeRecomputeRouting(const std::string& name,
                                                             const Pool& pool) const {
  std::vector<std::string> ids;
  ids.reserve(pool.recompute_routing.size());
  for (const auto& [id, routing] : pool.recompute_routing) ids.push_back(id);
  // By id, so the same state compacts to the same bytes.
  std::sort(ids.begin(), ids.end());
  std::vector<const std::string*> parts;
  parts.reserve(ids.size());
  for (const std::string& id : ids) parts.push_back(pool.recompute_routing.at(id).get());
  return EncodeRoutingRecords(name, "", ids, parts);
}

}  // namespace rollpack
