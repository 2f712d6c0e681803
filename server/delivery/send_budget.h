// Bounds the bytes of micro-batches encoded for trainer streams and not yet
// taken by the transport (rollpackd --stream-buffer-memory).
//
// Each FetchMicrobatches stream holds the micro-batch it is writing until the
// client has read it: 200 streams that never read, on 9.4 MB micro-batches,
// held 1.48 GB whatever --max-memory said. With a budget, a stream takes its
// micro-batch's bytes before encoding it and gives them back when the write
// completes; a stream that finds the budget spent waits, holding nothing, and
// is resumed in arrival order as bytes come back. One micro-batch larger
// than the whole budget is let through when nothing else is held, so every
// stream can make progress. Stalled clients keep their bytes until
// --stream-write-timeout ends their streams.
#ifndef ROLLPACK_SERVER_DELIVERY_SEND_BUDGET_H_
#define ROLLPACK_SERVER_DELIVERY_SEND_BUDGET_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace rollpack {

class SendBudget {
 public:
  // capacity <= 0: unbounded (Acquire always succeeds).
  explicit SendBudget(int64_t capacity) : capacity_(capacity) {}

  enum class Acquired {
    kNow,    // the bytes are the caller's
    kLater,  // `resume` will be called exactly once, unless Withdraw(id) first
    kNever,  // *cancelled was set: nothing taken, nothing queued
  };
  // Takes `bytes` for stream `id`, or queues it: `resume` is then called
  // with the bytes taken for it, on the thread of a later Release or
  // Withdraw (after the budget's lock is released). `cancelled` (may be
  // null) is read under the budget's lock: a stream whose cancellation sets
  // it before calling Withdraw(id) is either refused here or found queued
  // there, never left waiting.
  Acquired Acquire(int64_t id, int64_t bytes, const std::atomic<bool>* cancelled,
                   std::function<void()> resume);
  // True if stream `id` was waiting and is no longer: `resume` will not be
  // called and no bytes were taken for it.
  bool Withdraw(int64_t id);
  // Gives back bytes an Acquire took (or a resume was granted), and resumes
  // the waiters that fit now, first come first served.
  void Release(int64_t bytes);

  int64_t capacity() const { return capacity_; }
  int64_t in_use() const;
  int waiting() const;
  // Acquires that had to wait, since start.
  int64_t waits() const;

 private:
  struct Waiter {
    int64_t id;
    int64_t bytes;
    std::function<void()> resume;
  };
  bool FitsLocked(int64_t bytes) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int64_t capacity_;
  mutable absl::Mutex mu_;
  int64_t in_use_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t waits_ ABSL_GUARDED_BY(mu_) = 0;
  std::deque<Waiter> waiting_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_DELIVERY_SEND_BUDGET_H_
