#include "server/delivery/send_budget.h"

#include <utility>
#include <vector>

namespace rollpack {

bool SendBudget::FitsLocked(int64_t bytes) const {
  return capacity_ <= 0 || in_use_ == 0 || in_use_ + bytes <= capacity_;
}

SendBudget::Acquired SendBudget::Acquire(int64_t id, int64_t bytes,
                                         const std::atomic<bool>* cancelled,
                                         std::function<void()> resume) {
  absl::MutexLock lock(&mu_);
  if (cancelled != nullptr && cancelled->load()) return Acquired::kNever;
  // Nobody overtakes a waiter: a large micro-batch would otherwise wait
  // for ever behind a stream of small ones.
  if (waiting_.empty() && FitsLocked(bytes)) {
    in_use_ += bytes;
    return Acquired::kNow;
  }
  ++waits_;
  waiting_.push_back(Waiter{id, bytes, std::move(resume)});
  return Acquired::kLater;
}

bool SendBudget::Withdraw(int64_t id) {
  std::vector<std::function<void()>> resumes;
  bool withdrawn = false;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = waiting_.begin(); it != waiting_.end(); ++it) {
      if (it->id == id) {
        waiting_.erase(it);
        withdrawn = true;
        break;
      }
    }
    // The one withdrawn may have been what held the others back.
    while (withdrawn && !waiting_.empty() && FitsLocked(waiting_.front().bytes)) {
      in_use_ += waiting_.front().bytes;
      resumes.push_back(std::move(waiting_.front().resume));
      waiting_.pop_front();
    }
  }
  for (std::function<void()>& resume : resumes) resume();
  return withdrawn;
}

void SendBudget::Release(int64_t bytes) {
  std::vector<std::function<void()>> resumes;
  {
    absl::MutexLock lock(&mu_);
    in_use_ -= bytes;
    while (!waiting_.empty() && FitsLocked(waiting_.front().bytes)) {
      in_use_ += waiting_.front().bytes;
      resumes.push_back(std::move(waiting_.front().resume));
      waiting_.pop_front();
    }
  }
  for (std::function<void()>& resume : resumes) resume();
}

int64_t SendBudget::in_use() const {
  absl::MutexLock lock(&mu_);
  return in_use_;
}

int SendBudget::waiting() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(waiting_.size());
}

int64_t SendBudget::waits() const {
  absl::MutexLock lock(&mu_);
  return waits_;
}

}  // namespace rollpack
