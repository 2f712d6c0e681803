#include "server/cluster/pool_facts.h"

namespace rollpack {

void PoolFacts::SetModel(const std::string& pool, const ModelSpec& model) {
  absl::MutexLock lock(&mu_);
  pools_[pool].model = model;
}

void PoolFacts::SetOptions(const std::string& pool, const PoolOptions& options) {
  absl::MutexLock lock(&mu_);
  pools_[pool].options = options;
}

void PoolFacts::SetSchema(const std::string& pool,
                          const std::map<std::string, FieldSchema>& schema) {
  absl::MutexLock lock(&mu_);
  pools_[pool].schema = schema;
}

void PoolFacts::Forget(const std::string& pool) {
  absl::MutexLock lock(&mu_);
  pools_.erase(pool);
}

std::optional<ModelSpec> PoolFacts::Model(const std::string& pool) const {
  absl::MutexLock lock(&mu_);
  auto it = pools_.find(pool);
  return it == pools_.end() ? std::nullopt : it->second.model;
}

std::optional<PoolOptions> PoolFacts::Options(const std::string& pool) const {
  absl::MutexLock lock(&mu_);
  auto it = pools_.find(pool);
  return it == pools_.end() ? std::nullopt : it->second.options;
}

std::optional<std::map<std::string, FieldSchema>> PoolFacts::Schema(
    const std::string& pool) const {
  absl::MutexLock lock(&mu_);
  auto it = pools_.find(pool);
  return it == pools_.end() ? std::nullopt : it->second.schema;
}

std::vector<std::string> PoolFacts::PoolNames() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> names;
  for (const auto& [name, facts] : pools_) {
    if (facts.model.has_value()) names.push_back(name);
  }
  return names;
}

}  // namespace rollpack
