// Cancels a streaming call that stops making progress. A peer that accepts a
// call and then sends nothing (hung, or an attacker) would otherwise hold the
// caller until the call's whole deadline, which must be long enough for the
// largest pull; a stall is told from a slow pull by the time since the last
// message, not by the total.
#ifndef ROLLPACK_SERVER_CLUSTER_STALL_WATCH_H_
#define ROLLPACK_SERVER_CLUSTER_STALL_WATCH_H_

#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace rollpack {

class StallWatch {
 public:
  // Calls `cancel` (once, from the watch's thread) when `stall` passes
  // without a Progress() after construction or the last one.
  StallWatch(absl::Duration stall, std::function<void()> cancel)
      : stall_(stall), cancel_(std::move(cancel)), last_(absl::Now()) {
    thread_ = std::thread([this] { Watch(); });
  }
  ~StallWatch() {
    {
      absl::MutexLock lock(&mu_);
      done_ = true;
    }
    thread_.join();
  }
  StallWatch(const StallWatch&) = delete;
  StallWatch& operator=(const StallWatch&) = delete;

  void Progress() {
    absl::MutexLock lock(&mu_);
    last_ = absl::Now();
  }
  // Whether the watch cancelled the call.
  bool stalled() const {
    absl::MutexLock lock(&mu_);
    return stalled_;
  }

 private:
  void Watch() {
    absl::MutexLock lock(&mu_);
    while (!done_) {
      const absl::Time due = last_ + stall_;
      if (absl::Now() >= due) {
        stalled_ = true;
        mu_.Unlock();
        cancel_();
        mu_.Lock();
        return;
      }
      mu_.AwaitWithDeadline(absl::Condition(&done_), due);
    }
  }

  const absl::Duration stall_;
  const std::function<void()> cancel_;
  mutable absl::Mutex mu_;
  absl::Time last_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  bool stalled_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_CLUSTER_STALL_WATCH_H_
