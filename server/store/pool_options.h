// A pool's lifecycle options (../shared/spec/lifecycle.md, PoolOptions).
#ifndef ROLLPACK_SERVER_STORE_POOL_OPTIONS_H_
#define ROLLPACK_SERVER_STORE_POOL_OPTIONS_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "rollpack/v1/ndarray.pb.h"

namespace rollpack {

// The durable log's codec keeps at most 16 dimensions after n.
inline constexpr int kMaxTokenFieldTrailingDims = 16;

// A token field declared at registration (PoolOptions.token_fields).
struct DeclaredTokenField {
  std::string name;
  v1::DType dtype = v1::DTYPE_UNSPECIFIED;
  std::vector<int64_t> trailing_shape;
  bool allow_narrowing = false;

  friend bool operator==(const DeclaredTokenField& a, const DeclaredTokenField& b) {
    return a.name == b.name && a.dtype == b.dtype && a.trailing_shape == b.trailing_shape &&
           a.allow_narrowing == b.allow_narrowing;
  }
};

struct PoolOptions {
  // Applied to samples with a group_id and group_size 0.
  int32_t default_group_size = 0;
  std::optional<int64_t> max_staleness;
  // With max_staleness: free stale samples are deleted when the trainer's
  // policy version advances.
  bool drop_stale = false;
  // Uses after which a reused sample is deleted at release; 0 = unlimited.
  int32_t max_uses = 0;
  // 0 = groups may stay incomplete forever.
  int64_t incomplete_group_timeout_ms = 0;
  // Sorted by name; empty = the first sample fixes the pool's fields.
  std::vector<DeclaredTokenField> token_fields;
  // Scalars a sealed sample must have to be selectable (lifecycle.md section
  // 6: put with it or added by AnnotateSamples). Sorted, distinct, non-empty.
  std::vector<std::string> required_scalars;

  // The declared field `name`, or null.
  const DeclaredTokenField* FindTokenField(const std::string& name) const {
    for (const DeclaredTokenField& f : token_fields) {
      if (f.name == name) return &f;
    }
    return nullptr;
  }

  friend bool operator==(const PoolOptions& a, const PoolOptions& b) {
    return a.default_group_size == b.default_group_size && a.max_staleness == b.max_staleness &&
           a.drop_stale == b.drop_stale && a.max_uses == b.max_uses &&
           a.incomplete_group_timeout_ms == b.incomplete_group_timeout_ms &&
           a.token_fields == b.token_fields && a.required_scalars == b.required_scalars;
  }
  friend bool operator!=(const PoolOptions& a, const PoolOptions& b) { return !(a == b); }
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_STORE_POOL_OPTIONS_H_
