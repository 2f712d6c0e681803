#include "server/capture/record_budget.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace rollpack {

void RecordBudget::Acquire(int64_t bytes, std::function<void()> ready) {
  Grow(0, bytes, std::move(ready));
}

void RecordBudget::Grow(int64_t holding, int64_t bytes, std::function<void()> ready) {
  std::vector<std::function<void()>> admitted;
  {
    absl::MutexLock lock(&mu_);
    waiters_.push_back({holding, bytes, std::move(ready)});
    waiting_holding_ += holding;
    AdmitLocked(admitted);
  }
  for (auto& go : admitted) go();
}

void RecordBudget::Release(int64_t bytes) {
  std::vector<std::function<void()>> admitted;
  {
    absl::MutexLock lock(&mu_);
    held_ -= bytes;
    AdmitLocked(admitted);
  }
  for (auto& go : admitted) go();
}

void RecordBudget::AdmitLocked(std::vector<std::function<void()>>& admitted) {
  while (!waiters_.empty()) {
    auto next = waiters_.begin();
    if (!FitsLocked(next->bytes)) {
      // Bytes held by an answer being read or recorded come back by
      // themselves; only when the waiters hold them all is the wait for
      // good. The answer furthest along goes on (the first of equals).
      if (held_ == 0 || held_ != waiting_holding_) return;
      next = std::max_element(waiters_.begin(), waiters_.end(),
                              [](const Waiter& a, const Waiter& b) {
                                return a.holding < b.holding;
                              });
    }
    held_ += next->bytes;
    waiting_holding_ -= next->holding;
    admitted.push_back(std::move(next->ready));
    waiters_.erase(next);
  }
}

int64_t RecordBudget::held() const {
  absl::MutexLock lock(&mu_);
  return held_;
}

int64_t RecordBudget::waiting() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(waiters_.size());
}

}  // namespace rollpack
