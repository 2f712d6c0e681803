// What this member has read from or written to etcd about pools: each
// pool's model, options and token-field schema. etcd fixes them once
// (create-if-absent) and no member changes them afterwards, so while etcd
// is unreachable a member answers from here for the pools it knows
// (RegisterModel of the same model, GetPool, a producer's first batch):
// docs/cluster.md, "When etcd is away". A fact etcd no longer holds (the
// pool deleted) is forgotten at the next read that finds it gone.
#ifndef ROLLPACK_SERVER_CLUSTER_POOL_FACTS_H_
#define ROLLPACK_SERVER_CLUSTER_POOL_FACTS_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "scheduler/model_spec.h"
#include "server/store/pool_options.h"
#include "server/store/sample_store.h"

namespace rollpack {

class PoolFacts {
 public:
  void SetModel(const std::string& pool, const ModelSpec& model);
  void SetOptions(const std::string& pool, const PoolOptions& options);
  void SetSchema(const std::string& pool, const std::map<std::string, FieldSchema>& schema);
  // etcd holds no such pool (any more): everything known about it goes.
  void Forget(const std::string& pool);

  std::optional<ModelSpec> Model(const std::string& pool) const;
  std::optional<PoolOptions> Options(const std::string& pool) const;
  std::optional<std::map<std::string, FieldSchema>> Schema(const std::string& pool) const;
  // Pools with a known model, sorted.
  std::vector<std::string> PoolNames() const;

 private:
  struct Facts {
    std::optional<ModelSpec> model;
    std::optional<PoolOptions> options;
    std::optional<std::map<std::string, FieldSchema>> schema;
  };
  mutable absl::Mutex mu_;
  std::map<std::string, Facts> pools_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_CLUSTER_POOL_FACTS_H_
