#include "server/delivery/first_delivery_gate.h"

#include <utility>

namespace rollpack {

void FirstDeliveryGate::FirstWriteStarted() {
  absl::MutexLock lock(&mu_);
  ++pending_;
  ++generation_;
}

void FirstDeliveryGate::FirstWriteDone() {
  std::map<int64_t, std::function<void()>> resume;
  {
    absl::MutexLock lock(&mu_);
    if (--pending_ > 0) return;
    resume.swap(waiting_);
  }
  // In id order: streams that started earlier go first.
  for (auto& [id, fn] : resume) fn();
}

bool FirstDeliveryGate::WaitForFirstWrites(int64_t id, uint64_t* waited_generation,
                                           std::function<void()> resume) {
  absl::MutexLock lock(&mu_);
  if (pending_ == 0 || *waited_generation >= generation_) return true;
  *waited_generation = generation_;
  waiting_[id] = std::move(resume);
  return false;
}

bool FirstDeliveryGate::Withdraw(int64_t id) {
  absl::MutexLock lock(&mu_);
  return waiting_.erase(id) > 0;
}

int FirstDeliveryGate::pending_first_writes() const {
  absl::MutexLock lock(&mu_);
  return pending_;
}

int FirstDeliveryGate::waiting() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(waiting_.size());
}

}  // namespace rollpack
