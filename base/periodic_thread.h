// A thread that runs a function every `period` until it is destroyed (the
// store's upkeep on a single server: incomplete groups past their timeout).
#ifndef ROLLPACK_BASE_PERIODIC_THREAD_H_
#define ROLLPACK_BASE_PERIODIC_THREAD_H_

#include <functional>
#include <thread>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace rollpack {

class PeriodicThread {
 public:
  PeriodicThread(absl::Duration period, std::function<void()> fn)
      : period_(period), fn_(std::move(fn)), thread_([this] { Loop(); }) {}
  ~PeriodicThread() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    thread_.join();
  }
  PeriodicThread(const PeriodicThread&) = delete;
  PeriodicThread& operator=(const PeriodicThread&) = delete;

 private:
  void Loop() {
    while (true) {
      {
        absl::MutexLock lock(&mu_);
        if (mu_.AwaitWithTimeout(absl::Condition(&stop_), period_)) return;
      }
      fn_();
    }
  }

  const absl::Duration period_;
  const std::function<void()> fn_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // Last: started once everything it reads exists.
  std::thread thread_;
};

}  // namespace rollpack

#endif  // ROLLPACK_BASE_PERIODIC_THREAD_H_
