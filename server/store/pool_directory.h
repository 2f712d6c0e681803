// Where pools are defined and answered for: the store itself on a single
// server (LocalPools, server/store/local_pools.h), the cluster on a member
// of one (server/cluster/cluster_pool_directory.h), whose pools are fixed
// in etcd for every member and whose samples are spread over the members
// that received them. The store asks it about pools it has not seen and
// about their fields (SampleStore::AttachPoolDirectory); the Rollouts
// service answers every whole-pool call through it.
//
// It does not include sample_store.h: the store includes it.
#ifndef ROLLPACK_SERVER_STORE_POOL_DIRECTORY_H_
#define ROLLPACK_SERVER_STORE_POOL_DIRECTORY_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "rollpack/v1/rollouts.pb.h"
#include "scheduler/model_spec.h"
#include "server/store/field_schema.h"
#include "server/store/pool_options.h"
#include "server/store/scalar_annotation.h"

namespace rollpack {

// What a pool holds wherever it is registered: its model and options.
struct PoolDefinition {
  ModelSpec model;
  PoolOptions options;
};

class PoolDirectory {
 public:
  virtual ~PoolDirectory() = default;

  // Registers `model` for `pool` (RegisterModel, rollpackd --capture-model):
  // in a cluster the pool's model and options are fixed cluster-wide first
  // (etcd), then here. OK(true) when the pool was created, OK(false) when it
  // already holds the same model; FAILED_PRECONDITION naming the pool when
  // it holds another model, or other `options` (nullopt: whatever options
  // it has, or the defaults for a new pool).
  virtual absl::StatusOr<bool> Register(const std::string& pool, const ModelSpec& model,
                                        const std::optional<PoolOptions>& options) = 0;
  // A pool the store has not seen: its definition where pools are fixed
  // outside the store (a cluster's, registered on another member); nullopt
  // when nobody registered it (on a single server, always).
  virtual absl::StatusOr<std::optional<PoolDefinition>> Resolve(const std::string& pool) = 0;

  // True when a pool's token fields are fixed outside the store, once for
  // every member, before the first batch the store takes for the pool
  // (FixSchema); false when the pool's first accepted sample fixes them in
  // the store itself (a single server), and FixSchema is never asked.
  virtual bool FixesSchemasBeforePut() const = 0;
  // Fixes a pool's fields where FixesSchemasBeforePut (`proposed`: the first
  // sample's of the first batch the store takes for the pool, or the
  // declared ones, and its ragged names) and returns the one that holds
  // (`proposed`, or the one fixed first elsewhere).
  virtual absl::StatusOr<std::map<std::string, FieldSchema>> FixSchema(
      const std::string& pool, const std::map<std::string, FieldSchema>& proposed) = 0;

  // Whether this process takes new samples: UNAVAILABLE naming it while it
  // is drained for maintenance (intake_check.h).
  virtual absl::Status AcceptsNewSamples() const = 0;

  // The whole pool, as GetPool answers without local_only. NOT_FOUND naming
  // the pool when it has no registered model.
  virtual absl::StatusOr<v1::PoolInfo> GetPool(const std::string& pool) = 0;
  // This process's own share of the pool, as GetPool answers with
  // local_only (on a single server, the whole pool; a cluster member's
  // carries its incomplete groups for the member summing them).
  virtual absl::StatusOr<v1::PoolInfo> GetPoolHere(const std::string& pool) const = 0;
  // Names of the pools with a registered model, sorted.
  virtual absl::StatusOr<std::vector<std::string>> PoolNames() = 0;

  // Adds scalars to stored samples (AnnotateSamples, lifecycle.md section 6),
  // all or nothing, wherever they are stored; the number annotated.
  virtual absl::StatusOr<int32_t> Annotate(const std::string& pool,
                                           std::vector<ScalarAnnotation> annotations) = 0;
  // Rollouts.DeletePool: the whole pool, or with `local_only` (a cluster
  // member asking its peer) this process's share only. With `force` its
  // live steps are released first, as ReleaseStep would.
  virtual absl::StatusOr<v1::DeletePoolResponse> DeletePool(
      const v1::DeletePoolRequest& request) = 0;
  // Rollouts.ListSamples: a page of the pool's samples, or with `local_only`
  // of this process's share.
  virtual absl::StatusOr<v1::ListSamplesResponse> ListSamples(
      const v1::ListSamplesRequest& request) = 0;
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_STORE_POOL_DIRECTORY_H_
