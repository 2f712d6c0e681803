// Bytes of engine answers read whole and waiting to be recorded, all of the
// capture port's connections together: when the record workers fall behind
// (a busy host, 2,000 sessions answering at once), a connection waits
// before reading its next answer instead of piling answers up in memory;
// the engine's writes then wait in the kernel's socket buffers. An answer
// of known length is charged before it is read; one without a
// Content-Length (chunked) as it arrives.
#ifndef ROLLPACK_SERVER_CAPTURE_RECORD_BUDGET_H_
#define ROLLPACK_SERVER_CAPTURE_RECORD_BUDGET_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace rollpack {

class RecordBudget {
 public:
  // `limit_bytes` <= 0: no limit.
  explicit RecordBudget(int64_t limit_bytes) : limit_(limit_bytes) {}

  // Runs `ready` once `bytes` are held for the caller: at once (on this
  // thread) when they fit, else from a Release() that made room, in the
  // order asked. An answer larger than the whole budget is let through
  // when nothing else is held, so that it is never starved.
  // `ready` must not call Acquire or Release itself.
  void Acquire(int64_t bytes, std::function<void()> ready);

  // Acquire for `bytes` more of an answer read as it arrives that holds
  // `holding` already. When every byte held is held by answers waiting
  // here for more (none can finish and release without it), the one
  // holding the most goes on, over the budget if need be: growing answers
  // never wait on each other, and the budget is exceeded by at most the
  // answers that go on that way, one at a time.
  void Grow(int64_t holding, int64_t bytes, std::function<void()> ready);

  void Release(int64_t bytes);

  int64_t held() const;
  int64_t waiting() const;

 private:
  bool FitsLocked(int64_t bytes) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return limit_ <= 0 || held_ == 0 || held_ + bytes <= limit_;
  }

  // Moves the `ready` of every waiter that may go now to `admitted`, in
  // order, to be run once the lock is released.
  void AdmitLocked(std::vector<std::function<void()>>& admitted)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  struct Waiter {
    int64_t holding;
    int64_t bytes;
    std::function<void()> ready;
  };
  const int64_t limit_;
  mutable absl::Mutex mu_;
  int64_t held_ ABSL_GUARDED_BY(mu_) = 0;
  // The `holding` of the waiters, together.
  int64_t waiting_holding_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<Waiter> waiters_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_CAPTURE_RECORD_BUDGET_H_
