// Serves every trainer rank's first micro-batch before anyone's prefetch.
//
// When a step starts, all ranks open their streams at once; each wants its
// first micro-batch now (nothing runs until every rank has one), and each
// also prefetches the next ones. Left alone, ranks that got their first
// micro-batch early fill the link with prefetch while the last ranks are
// still waiting, and the step starts when the LAST rank is served. The gate
// holds a prefetch write while some stream's first write is in flight.
//
// A rank that never reads must not throttle the others: a stream waits at
// most once for each first write that started after its previous wait, and
// the caller bounds each wait with a timer (Withdraw).
#ifndef ROLLPACK_SERVER_DELIVERY_FIRST_DELIVERY_GATE_H_
#define ROLLPACK_SERVER_DELIVERY_FIRST_DELIVERY_GATE_H_

#include <cstdint>
#include <functional>
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace rollpack {

class FirstDeliveryGate {
 public:
  // A stream is about to write its first micro-batch.
  void FirstWriteStarted();
  // That write completed, failed, or the stream ended without it. Resumes
  // the waiting streams when it was the last first write in flight (their
  // `resume` runs on this thread, after the gate's lock is released).
  void FirstWriteDone();

  // Before a prefetch write. True: write now. False: the stream waits and
  // `resume` is called exactly once, later, unless Withdraw(id) returns true
  // first. `waited_generation` is the stream's own state, 0 initially.
  bool WaitForFirstWrites(int64_t id, uint64_t* waited_generation, std::function<void()> resume);
  // True if stream `id` was waiting and is no longer: its resume will not be
  // called, and the caller continues (or ends) the stream itself.
  bool Withdraw(int64_t id);

  int pending_first_writes() const;
  int waiting() const;

 private:
  mutable absl::Mutex mu_;
  int pending_ ABSL_GUARDED_BY(mu_) = 0;
  // Counts FirstWriteStarted calls.
  uint64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<int64_t, std::function<void()>> waiting_ ABSL_GUARDED_BY(mu_);
};

}  // namespace rollpack

#endif  // ROLLPACK_SERVER_DELIVERY_FIRST_DELIVERY_GATE_H_
