#include "server/capture/record_budget.h"

#include <utility>
#include <vector>

namespace rollpack {

void RecordBudget::Acquire(int64_t bytes, std::function<void()> ready) {
  {
    absl::MutexLock lock(&mu_);
    if (!waiters_.empty() || !FitsLocked(bytes)) {
      waiters_.push_back({bytes, std::move(ready)});
      return;
    }
    held_ += bytes;
  }
  ready();
}

void RecordBudget::Release(int64_t bytes) {
  std::vector<std::function<void()>> admitted;
  {
    absl::MutexLock lock(&mu_);
    held_ -= bytes;
    while (!waiters_.empty() && FitsLocked(waiters_.front().bytes)) {
      held_ += waiters_.front().bytes;
      admitted.push_back(std::move(waiters_.front().ready));
      waiters_.pop_front();
    }
  }
  for (auto& ready : admitted) ready();
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
