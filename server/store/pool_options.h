// A pool's lifecycle options (../shared/spec/lifecycle.md, PoolOptions).
#ifndef ROLLPACK_SERVER_STORE_POOL_OPTIONS_H_
#define ROLLPACK_SERVER_STORE_POOL_OPTIONS_H_

#include <cstdint>
#include <optional>

namespace rollpack {

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

  friend bool operator==(const PoolOptions& a, const PoolOptions& b) {
    return a.default_group_size == b.default_group_size && a.max_staleness == b.max_staleness &&
           a.drop_stale == b.drop_stale && a.max_uses == b.max_uses &&
           a.incomplete_group_timeout_ms == b.incomplete_group_timeout_ms;
  }
  friend bool operator!=(const PoolOptions& a, const PoolOptions& b) { return !(a == b); }
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_STORE_POOL_OPTIONS_H_
