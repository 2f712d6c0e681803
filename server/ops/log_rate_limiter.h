// Bounds how many log lines one kind of event may write: a client retrying a
// refused call in a tight loop must not flood the log (or the disk) it is
// read from. Each key gets `lines_per_window` lines per window; the first
// line after a quiet spell says how many were dropped.
#ifndef ROLLPACK_SERVER_OPS_LOG_RATE_LIMITER_H_
#define ROLLPACK_SERVER_OPS_LOG_RATE_LIMITER_H_

#include <cstdint>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace rollpack {

class LogRateLimiter {
 public:
  // At most `max_keys` keys are tracked; past that, lines of new keys share
  // one budget (keys come from bounded sets: method x status code).
  LogRateLimiter(int lines_per_window, absl::Duration window, int max_keys = 1024);

  // Whether a line for `key` may be written at `now`. When it may,
  // *dropped_before is the number of lines of this key dropped since the
  // last one written (to be said in this line).
  bool Allow(const std::string& key, absl::Time now, int64_t* dropped_before);

 private:
  struct Budget {
    absl::Time window_start = absl::InfinitePast();
    int lines = 0;
    int64_t dropped = 0;
  };

  const int lines_per_window_;
  const absl::Duration window_;
  const size_t max_keys_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, Budget> budgets_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_OPS_LOG_RATE_LIMITER_H_
