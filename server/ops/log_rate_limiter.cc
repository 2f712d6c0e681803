#include "server/ops/log_rate_limiter.h"

namespace rollpack {

namespace {
constexpr char kOverflowKey[] = "(other)";
}  // namespace

LogRateLimiter::LogRateLimiter(int lines_per_window, absl::Duration window, int max_keys)
    : lines_per_window_(lines_per_window), window_(window), max_keys_(max_keys) {}

bool LogRateLimiter::Allow(const std::string& key, absl::Time now, int64_t* dropped_before) {
  absl::MutexLock lock(&mu_);
  auto it = budgets_.find(key);
  if (it == budgets_.end()) {
    it = budgets_.size() < max_keys_ ? budgets_.try_emplace(key).first
                                     : budgets_.try_emplace(kOverflowKey).first;
  }
  Budget& budget = it->second;
  if (now - budget.window_start >= window_) {
    budget.window_start = now;
    budget.lines = 0;
  }
  if (budget.lines >= lines_per_window_) {
    ++budget.dropped;
    return false;
  }
  ++budget.lines;
  *dropped_before = budget.dropped;
  budget.dropped = 0;
  return true;
}

}  // namespace rollpack
