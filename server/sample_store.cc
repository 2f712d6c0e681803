#include "server/sample_store.h"

#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "scheduler/pipeline_layers.h"
#include "scheduler/plan.h"
#include "server/ndarray.h"

namespace rollpack {
namespace {

std::string ShapeString(const std::vector<int64_t>& trailing) {
  return absl::StrCat("[n", trailing.empty() ? "" : ", ", absl::StrJoin(trailing, ", "), "]");
}

// The longest sequence that fits on a CP group of size c under the budget.
int64_t LongestFitting(const Topology& topology, int c) {
  const int64_t a = SequenceAlignment(topology, c);
  return topology.max_tokens_per_rank * c / a * a;
}

}  // namespace

SampleStore::SampleStore(int64_t max_memory_bytes) : max_memory_bytes_(max_memory_bytes) {}

absl::StatusOr<bool> SampleStore::RegisterModel(const std::string& pool_name,
                                                const ModelSpec& model) {
  if (pool_name.empty()) return absl::InvalidArgumentError("pool name is empty");
  if (absl::Status s = ValidateModelSpec(model); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  auto [it, inserted] = pools_.try_emplace(pool_name);
  if (inserted) {
    it->second.model = model;
    return true;
  }
  if (it->second.model != model) {
    return absl::FailedPreconditionError(absl::StrCat(
        "pool \"", pool_name, "\" already holds model \"", it->second.model.name,
        "\" with another spec; a pool holds one model"));
  }
  return false;
}

absl::StatusOr<ModelSpec> SampleStore::GetModel(const std::string& pool) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = pools_.find(pool);
  if (it == pools_.end()) {
    return absl::NotFoundError(absl::StrCat("pool \"", pool, "\" has no registered model"));
  }
  return it->second.model;
}

absl::Status SampleStore::CheckSchema(
    const Pool& pool, const StoredSample& sample,
    const std::map<std::string, FieldSchema>* batch_schema) const {
  const std::map<std::string, FieldSchema>& schema =
      pool.schema_fixed ? pool.schema : *batch_schema;
  const std::string who = absl::StrCat("sample \"", sample.sample_id, "\": ");
  for (const auto& [name, field] : sample.token_fields) {
    auto it = schema.find(name);
    if (it == schema.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, "token_fields[\"", name, "\"] is not among the pool's fields {",
          absl::StrJoin(schema, ", ", [](std::string* out, const auto& kv) { out->append(kv.first); }),
          "} (fixed by its first sample)"));
    }
    if (it->second.dtype != field.dtype || it->second.trailing_shape != field.trailing_shape) {
      return absl::InvalidArgumentError(absl::StrCat(
          who, "token_fields[\"", name, "\"] is ", DTypeName(field.dtype), " ",
          ShapeString(field.trailing_shape), ", the pool's is ", DTypeName(it->second.dtype), " ",
          ShapeString(it->second.trailing_shape)));
    }
  }
  if (sample.token_fields.size() != schema.size()) {
    for (const auto& [name, unused] : schema) {
      if (!sample.token_fields.count(name)) {
        return absl::InvalidArgumentError(
            absl::StrCat(who, "token_fields[\"", name, "\"] is missing (every sample of the pool carries it)"));
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<PutResult> SampleStore::Put(const std::string& pool_name,
                                           std::vector<StoredSample> samples) {
  absl::MutexLock lock(&mu_);
  auto pool_it = pools_.find(pool_name);
  if (pool_it == pools_.end()) {
    return absl::NotFoundError(absl::StrCat("pool \"", pool_name, "\" has no registered model"));
  }
  Pool& pool = pool_it->second;

  // The first sample of an empty pool fixes the fields for the batch too.
  std::map<std::string, FieldSchema> batch_schema;
  if (!pool.schema_fixed && !samples.empty()) {
    for (const auto& [name, field] : samples.front().token_fields) {
      batch_schema[name] = FieldSchema{field.dtype, field.trailing_shape};
    }
  }

  PutResult result;
  std::vector<bool> is_new(samples.size(), false);
  absl::flat_hash_map<std::string, size_t> batch_index;
  int64_t new_bytes = 0;
  for (size_t i = 0; i < samples.size(); ++i) {
    const StoredSample& sample = samples[i];
    if (absl::Status s = CheckSchema(pool, sample, &batch_schema); !s.ok()) return s;
    auto stored = pool.samples.find(sample.sample_id);
    if (stored != pool.samples.end()) {
      if (!(*stored->second == sample)) {
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
    is_new[i] = true;
    new_bytes += sample.MemoryBytes();
  }
  if (stored_bytes_ + new_bytes > max_memory_bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "memory limit: storing ", new_bytes, " more bytes would exceed --max-memory ",
        max_memory_bytes_, " (", stored_bytes_,
        " held); retry after the trainer releases a step"));
  }

  if (!pool.schema_fixed && !samples.empty()) {
    pool.schema = std::move(batch_schema);
    pool.schema_fixed = true;
  }
  for (size_t i = 0; i < samples.size(); ++i) {
    if (!is_new[i]) continue;
    const uint64_t arrival = next_arrival_++;
    const int64_t bytes = samples[i].MemoryBytes();
    std::string id = samples[i].sample_id;
    pool.free_by_arrival.emplace(arrival, id);
    pool.arrival_of.emplace(id, arrival);
    pool.samples.emplace(std::move(id), std::make_shared<const StoredSample>(std::move(samples[i])));
    pool.stored_bytes += bytes;
    stored_bytes_ += bytes;
    result.stored_bytes += bytes;
  }
  result.accepted = static_cast<int64_t>(samples.size());
  return result;
}

absl::StatusOr<PoolStats> SampleStore::GetPool(const std::string& pool_name) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = pools_.find(pool_name);
  if (it == pools_.end()) {
    return absl::NotFoundError(absl::StrCat("pool \"", pool_name, "\" has no registered model"));
  }
  const Pool& pool = it->second;
  PoolStats stats;
  stats.pool = pool_name;
  stats.model = pool.model;
  stats.num_samples = static_cast<int64_t>(pool.samples.size());
  stats.num_free_samples = static_cast<int64_t>(pool.free_by_arrival.size());
  stats.num_live_steps = pool.live_steps;
  stats.stored_bytes = pool.stored_bytes;
  stats.token_fields = pool.schema;
  return stats;
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
  if (step_id.empty()) return absl::InvalidArgumentError("step_id is empty");
  if (sample_ids.empty() && num_samples <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step \"", step_id, "\": give sample_ids or num_samples > 0 (num_samples is ",
        num_samples, ")"));
  }
  if (absl::Status s = ValidateTopologySizes(topology); !s.ok()) return s;

  // Reserve the samples under the lock, plan without it.
  ModelSpec model;
  std::vector<std::shared_ptr<const StoredSample>> samples;
  std::vector<std::pair<uint64_t, std::string>> reserved;
  {
    absl::MutexLock lock(&mu_);
    if (steps_.contains(step_id) || pending_steps_.contains(step_id)) {
      return absl::AlreadyExistsError(absl::StrCat("step \"", step_id, "\" already exists"));
    }
    auto pool_it = pools_.find(pool_name);
    if (pool_it == pools_.end()) {
      return absl::NotFoundError(absl::StrCat("pool \"", pool_name, "\" has no registered model"));
    }
    Pool& pool = pool_it->second;
    model = pool.model;
    if (!sample_ids.empty()) {
      absl::flat_hash_set<std::string> seen;
      for (const std::string& id : sample_ids) {
        if (!seen.insert(id).second) {
          return absl::InvalidArgumentError(
              absl::StrCat("step \"", step_id, "\": sample \"", id, "\" is listed twice"));
        }
        auto it = pool.samples.find(id);
        if (it == pool.samples.end()) {
          return absl::NotFoundError(
              absl::StrCat("sample \"", id, "\" is not in pool \"", pool_name, "\""));
        }
        if (pool.free_by_arrival.count(pool.arrival_of.at(id)) == 0) {
          return absl::FailedPreconditionError(
              absl::StrCat("sample \"", id, "\" is already in a live step"));
        }
        samples.push_back(it->second);
      }
    } else {
      if (static_cast<int64_t>(pool.free_by_arrival.size()) < num_samples) {
        return absl::FailedPreconditionError(absl::StrCat(
            "step \"", step_id, "\": pool \"", pool_name, "\" has ", pool.free_by_arrival.size(),
            " free samples, ", num_samples, " requested"));
      }
      for (auto it = pool.free_by_arrival.begin();
           static_cast<int>(samples.size()) < num_samples; ++it) {
        samples.push_back(pool.samples.at(it->second));
      }
    }
    for (const auto& sample : samples) {
      const uint64_t arrival = pool.arrival_of.at(sample->sample_id);
      pool.free_by_arrival.erase(arrival);
      reserved.emplace_back(arrival, sample->sample_id);
    }
    pending_steps_[step_id] = true;
  }

  auto build = [&]() -> absl::StatusOr<std::shared_ptr<const Step>> {
    if (absl::StatusOr<PipelineLayers> layers = PipelineLayers::Create(model, topology);
        !layers.ok()) {
      return layers.status();
    }
    std::vector<int64_t> lengths;
    lengths.reserve(samples.size());
    const int largest = MaxCpGroupSize(topology);
    for (const auto& sample : samples) {
      const int64_t n = sample->num_tokens();
      if (MinCpGroupSizeFor(topology, n) == 0) {
        return absl::InvalidArgumentError(absl::StrCat(
            "sample \"", sample->sample_id, "\" has ", n,
            " tokens; the longest that fits on the largest CP group (", largest, " ranks x ",
            topology.max_tokens_per_rank, " max_tokens_per_rank) is ",
            LongestFitting(topology, largest)));
      }
      lengths.push_back(n);
    }
    absl::StatusOr<Plan> plan = ComputePlan(lengths, topology);
    if (!plan.ok()) return plan.status();
    absl::StatusOr<StepLayout> layout = StepLayout::Create(*plan, lengths, topology, model);
    if (!layout.ok()) return layout.status();
    return std::make_shared<const Step>(step_id, pool_name, model, topology, samples,
                                        *std::move(plan), *std::move(layout));
  };
  absl::StatusOr<std::shared_ptr<const Step>> step = build();

  absl::MutexLock lock(&mu_);
  pending_steps_.erase(step_id);
  auto pool_it = pools_.find(pool_name);
  if (!step.ok()) {
    for (auto& [arrival, id] : reserved) pool_it->second.free_by_arrival.emplace(arrival, id);
    return absl::Status(step.status().code(),
                        absl::StrCat("step \"", step_id, "\": ", step.status().message()));
  }
  pool_it->second.live_steps++;
  steps_[step_id] = *step;
  return step;
}

absl::StatusOr<std::shared_ptr<const Step>> SampleStore::GetStep(
    const std::string& step_id) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = steps_.find(step_id);
  if (it == steps_.end()) {
    return absl::NotFoundError(absl::StrCat("step \"", step_id, "\" does not exist or was released"));
  }
  return it->second;
}

absl::StatusOr<ReleaseResult> SampleStore::ReleaseStep(const std::string& step_id) {
  absl::MutexLock lock(&mu_);
  auto it = steps_.find(step_id);
  if (it == steps_.end()) {
    return absl::NotFoundError(absl::StrCat("step \"", step_id, "\" does not exist or was released"));
  }
  std::shared_ptr<const Step> step = std::move(it->second);
  steps_.erase(it);
  Pool& pool = pools_.at(step->pool);
  pool.live_steps--;
  ReleaseResult result;
  for (const auto& sample : step->samples) {
    const int64_t bytes = sample->MemoryBytes();
    pool.arrival_of.erase(sample->sample_id);
    pool.samples.erase(sample->sample_id);
    pool.stored_bytes -= bytes;
    stored_bytes_ -= bytes;
    result.freed_bytes += bytes;
    result.released_samples++;
  }
  return result;
}

}  // namespace rollpack
